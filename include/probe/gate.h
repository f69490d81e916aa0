/* probe/gate.h - pass/fail gates applied to probe_metrics (docs/gates.md "The gates").
 *
 *   T1                 atol = rtol = 1e-3 element-wise (no index may mismatch),
 *                      rel_l2 <= 1e-2, cosine >= 0.9999.
 *   T1-relaxed:CAUSE   CAUSE in {reduction-reordering, backend-swap,
 *                      compile-fusion, parallel-partial-sum}; rel_l2 <= 5e-2,
 *                      cosine >= 0.999, element-wise atol = rtol = 1e-2
 *                      (see docs/gates.md).
 *   T2                 thresholds per component from a calibration file
 *                      (docs/calibration.md), including the structure of the
 *                      difference: each channel's mean-shift |z| (or the largest)
 *                      and |gain_z|.
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
    double channel_z_max;   /* largest allowed |z| of the per-channel mean shift
                               (|probe_channel_shift.z_max|); +inf = unchecked */
    double gain_z_max;      /* largest allowed |gain_z|; +inf = unchecked */
    /* T2 per channel: channel_z_max_by_channel[k] is the largest allowed |z_k| of
     * channel k's mean shift (probe_channel_shift's z_k), k < channel_z_count: the
     * calibration's "channel_z_max_by_channel" of this exact tensor path, borrowed
     * from the loaded calibration (valid while it is loaded). NaN entries are
     * unchecked. NULL / 0: none (then channel_z_max applies to the largest |z|). */
    const double *channel_z_max_by_channel;
    uint64_t channel_z_count;
    double skipped_fraction_max; /* T2: the largest fraction of a component's reference
                               tensors the candidate may lack because the feature skips their
                               calls (a step cache); 0: none may be missing */
    double headroom;        /* T2: the calibration file's headroom, quoted in reasons;
                               NaN when the file gives none or the gate is not T2 */
} probe_gate;

/* The size in bytes of a public struct that a binding mirrors (ctypes, cffi), by its
 * C name: "probe_gate", "probe_gate_verdict", "probe_metrics", "probe_metrics_opts",
 * "probe_channel_spec", "probe_channel_shift", "probe_pair_source", "probe_stream_opts";
 * 0 for any other
 * name or NULL. A binding checks its layout against it when it loads the library. */
size_t probe_struct_size(const char *name);

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

/* Apply gate g to metrics m. Returns PROBE_EINVAL on NULL arguments. The
 * structure thresholds (channel_z_max, gain_z_max) are not applied here: see
 * probe_gate_check_structure. */
probe_status probe_gate_check(const probe_gate *g, const probe_metrics *m, probe_gate_verdict *v);

/* Apply g's structure thresholds, adding to v (pass set to 0 on a failure,
 * reasons appended after those already there). The limit applied is the
 * threshold, or the z limit of rounding noise when that is larger
 * (channel_noise_z, gain_noise_z: the systematic test's limits,
 * probe_systematic_limit; NaN or 0: none), so a z that noise alone reaches
 * never fails. |shift->z_max| above the channel limit fails with
 * "systematic shift of channel K: |z| Z > LIMIT (the feature's own,
 * calibrated with headroom H)", |m->gain_z| above the gain limit with
 * "systematic gain error G: |z| Z > LIMIT (...)"; when the noise limit is the
 * larger the note reads "(the z limit of rounding noise; the feature's own,
 * calibrated with headroom H: T)". A NaN z is not checked; an infinite one
 * fails. shift NULL or shift->count 0: no channel check. Returns PROBE_EINVAL
 * on NULL g, m or v, or a NaN threshold. */
probe_status probe_gate_check_structure(const probe_gate *g, const probe_metrics *m,
                                        const probe_channel_shift *shift, double channel_noise_z,
                                        double gain_noise_z, probe_gate_verdict *v);

/* Apply g's per-channel thresholds (channel_z_max_by_channel) to the per-channel
 * z of one tensor, adding to v (pass set to 0 on a failure, reasons appended).
 * z[k] = shift_k / se_k as probe_channel_shift defines it (probe_channel_z),
 * NaN where it is not defined (skipped). Channel k's limit is
 * max(channel_z_max_by_channel[k], noise_z), noise_z the z limit of rounding
 * noise over the tensor's channels (probe_systematic_limit; NaN or 0: none).
 * Of the channels above their limit, the one with the largest |z_k| / limit_k
 * is named: "systematic shift of channel K: |z| Z > LIMIT (the feature's own in
 * that channel, calibrated with headroom H)", followed by "; N channels above
 * theirs" when N > 1; an infinite |z_k| fails. A count other than
 * g->channel_z_count fails with "per-channel structure: the tensor has N
 * channels, the calibration M". A gate without per-channel thresholds checks
 * nothing. Returns PROBE_EINVAL on NULL g or v, or NULL z with count > 0. */
probe_status probe_gate_check_channels(const probe_gate *g, const double *z, uint64_t count,
                                       double noise_z, probe_gate_verdict *v);

#ifdef __cplusplus
}
#endif

#endif
