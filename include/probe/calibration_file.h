/* probe/calibration_file.h - load a T2 calibration file (JSON,
 * docs/calibration.md: the per-component thresholds probe-calibrate writes)
 * and read the gate of one tensor from it. Code: metrics/calibration_file.c.
 * Building such a file from repeated runs is probe/calibrate.h. */
#ifndef PROBE_CALIBRATION_FILE_H
#define PROBE_CALIBRATION_FILE_H

#include <stdio.h>

#include "probe/gate.h" /* probe_gate */
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct probe_calibration probe_calibration;

/* Load and validate a calibration file. Errors: PROBE_ENOTFOUND (cannot open),
 * PROBE_EFORMAT (not JSON, wrong "format"/"version", a threshold that is not
 * a number or out of range, in any section: "components", "tensors", "structure"), PROBE_EINVAL (a component name not in known_components, a
 * NULL-terminated list; NULL accepts any name). */
probe_status probe_calibration_load(const char *path, const char *const *known_components,
                                    probe_calibration **out);
/* The same from an open stream (read to its end, not closed); name stands for the
 * file in messages. PROBE_EINVAL for a NULL argument; the rest as above. */
probe_status probe_calibration_load_stream(FILE *f, const char *name,
                                           const char *const *known_components,
                                           probe_calibration **out);
void probe_calibration_free(probe_calibration *c);

/* Fill *g (kind T2) with the thresholds for a tensor of `component` at
 * dataset `path`: a "tensors" entry whose glob matches path wins over the
 * component entry. channel_z_max and gain_z_max come from the "structure"
 * entry of exactly `path` where it gives them, else from that entry; g->headroom
 * is the file's "headroom" (NaN when absent). Returns PROBE_ENOTFOUND if the
 * file has neither a tensors nor a component entry for the tensor. */
probe_status probe_calibration_gate(const probe_calibration *c, const char *component,
                                    const char *path, probe_gate *g);

/* What the calibrated feature expects of the weights (the file's top-level
 * "weights", docs/calibration.md): "same" (the default: both runs load the same
 * weights) or "quantized" (the feature changes the values the GEMMs read, as
 * FP8 weight storage does: weight fingerprints that differ at the same shapes
 * are the feature's). c NULL: "same". */
const char *probe_calibration_weights(const probe_calibration *c);

/* How the calibrated feature rounds the weights (the file's top-level
 * "weights_rounding", only with "weights": "quantized"): a probe_rounding_name
 * (probe/dtype.h), e.g. "float8_e4m3fn/amax"; NULL when the file names none
 * (any change of the weights is the feature's) or c is NULL. */
const char *probe_calibration_weights_rounding(const probe_calibration *c);

/* The name c was loaded from: the path given to probe_calibration_load, or
 * the name given to probe_calibration_load_stream. NULL when c is NULL. */
const char *probe_calibration_path(const probe_calibration *c);

#ifdef __cplusplus
}
#endif
#endif
