/* probe/compare/weight_check.h - weight fingerprints of two runs side by side
 * (docs/gemm.md "Weights"): used by probe-compare. Internal to the build
 * tree (not installed). */
#ifndef PROBE_WEIGHTS_H
#define PROBE_WEIGHTS_H

#include <stddef.h>
#include "probe/status.h"

typedef struct probe_weights_verdict {
    /* "same": every component fingerprinted in both runs has the same
     * combined hash; "differ": a component has operands of the same shapes
     * and dtypes in both runs but different bytes (the runs loaded different
     * weights); "format_differs": no component differs, and at least one
     * has different operand shapes/dtypes (e.g. quantized weights, the
     * feature); "unknown": no component fingerprinted (completely) in both. */
    const char *status;
    /* One line for the user: "weights: same in both runs (N GEMM operands, B
     * bytes)", or what differs (component and first differing GEMM k). */
    char line[768];
    char *json; /* malloc'd JSON object for the compare JSON's "weights" key */
} probe_weights_verdict;

/* Compare the "weights" keys of two run manifests (JSON text, each may be
 * NULL or lack the key: "unknown"). Fills v (free with
 * probe_weights_verdict_free). Errors: PROBE_ENOMEM. A manifest that is not
 * JSON, or whose "weights" is malformed, counts as without fingerprints. */
probe_status probe_weights_check(const char *manifest_reference, const char *manifest_candidate,
                                 probe_weights_verdict *v);
void probe_weights_verdict_free(probe_weights_verdict *v);

/* Whether a pair with verdict v may be compared (and calibrated on) when the
 * feature expects `weights` ("same" or "quantized", probe_calibration_weights):
 * 1, or 0 when the runs loaded different weights (status "differ") and the
 * feature does not change them. probe-compare and probe-calibrate apply this
 * one rule. */
int probe_weights_accepts(const probe_weights_verdict *v, const char *weights);

#endif
