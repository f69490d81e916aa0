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
     * feature); "quantized": no component differs otherwise, and in at
     * least one every differing operand is proven the other run's weight
     * rounded to float8 (docs/gemm.md "Quantized from the same weights";
     * rounding names the format); "unknown": no component fingerprinted
     * (completely) in both. Precedence: differ, quantized, format_differs,
     * same, unknown. */
    const char *status;
    /* "quantized": the probe_rounding_name common to every quantized
     * component, or "mixed"; NULL otherwise. */
    const char *rounding;
    /* Differing operands that carried the fingerprints to check a rounding
     * (rounded fingerprints in both runs, or float8 in one) and are proven
     * none: their component is "differ", or "format_differs" for a float8
     * operand (another scaling recipe, or other weights). */
    size_t unproven;
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

/* Why a pair with verdict v may not be compared (and calibrated on) when the
 * feature expects `weights` ("same" or "quantized", probe_calibration_weights)
 * and, for "quantized", rounds them to `rounding` (the calibration's
 * "weights_rounding", NULL when it names none); NULL when it may:
 * - "differ", "quantized": refused under "same";
 * - under "quantized" with rounding named: refused when v->unproven (a
 *   differing operand checked and proven no rounding), and when the status
 *   is "quantized" in another rounding than `rounding`;
 * - otherwise not refused ("format_differs", "same", "unknown" never under
 *   "same"; anything under "quantized" with no rounding named).
 * probe-compare and probe-calibrate apply this one rule. */
const char *probe_weights_refusal(const probe_weights_verdict *v, const char *weights,
                                  const char *rounding);

#endif
