/* probe/gate.h - pass/fail gates applied to probe_metrics (docs/gates.md "The gates").
 *
 *   T1                 atol = rtol = 1e-3 element-wise (no index may mismatch),
 *                      rel_l2 <= 1e-2, cosine >= 0.9999.
 *   T1-relaxed:CAUSE   CAUSE in {reduction-reordering, backend-swap,
 *                      compile-fusion, parallel-partial-sum}; rel_l2 <= 5e-2,
 *                      cosine >= 0.999, element-wise atol = rtol = 1e-2
 *                      (see docs/gates.md).
 *   T2                 thresholds per component from a calibration file
 *                      (docs/calibration.md).
 * Every gate fails a tensor with a NaN in the candidate, a NaN in the reference
 * where the candidate is not NaN, an infinity that the reference does not hold
 * at the same index, or a non-finite metric.
 */
#ifndef PROBE_GATE_H
#define PROBE_GATE_H

#include "probe/metrics.h"
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum probe_gate_kind {
    PROBE_GATE_T1 = 1,
    PROBE_GATE_T1_RELAXED = 2,
    PROBE_GATE_T2 = 3
} probe_gate_kind;

typedef struct probe_gate {
    probe_gate_kind kind;
    char name[64];          /* "T1", "T1-relaxed:backend-swap", "T2" */
    char cause[32];         /* T1-relaxed only, else "" */
    double atol, rtol;      /* element-wise tolerance */
    double mismatch_fraction_max; /* largest allowed mismatch_fraction (T1: 0) */
    double rel_l2_max;      /* +inf = unchecked */
    double cosine_min;      /* -inf = unchecked */
    double max_abs_max;     /* +inf = unchecked */
    double p99_abs_max;     /* +inf = unchecked */
} probe_gate;

/* Parse "T1", "T1-relaxed:CAUSE" or "T2" into *out with that gate's default
 * thresholds (T2's thresholds are unchecked until probe_calibration_gate()
 * fills them). Returns PROBE_EINVAL with a message naming the spec for an
 * unknown gate or cause. */
probe_status probe_gate_parse(const char *spec, probe_gate *out);

#define PROBE_GATE_MAX_REASONS 8
/* A mismatch reason says "each within N ulps of the element" when every
 * mismatching index is within this many ulps of its own value
 * (probe_metrics.mismatch_ulps_max: the tolerance is below what the element
 * type resolves there), else "all within N ulps of the largest element" when
 * max_abs is within this many ulps at the tensor's largest magnitude
 * (max_abs_ulps_scale: absolute rounding at the tensor's scale). */
#define PROBE_GATE_FEW_ULPS 4.0
typedef struct probe_gate_verdict {
    int pass;                 /* 1 pass, 0 fail */
    int nreasons;
    char reasons[PROBE_GATE_MAX_REASONS][160]; /* one line each, e.g. "rel_l2 0.0312 > 0.01" */
} probe_gate_verdict;

/* Apply gate g to metrics m. Returns PROBE_EINVAL on NULL arguments. */
probe_status probe_gate_check(const probe_gate *g, const probe_metrics *m, probe_gate_verdict *v);

#ifdef __cplusplus
}
#endif

#endif
