/* finish.h - docs/metrics.md's metrics from the fp64 sums and counts of a pass:
 * the one place where rel_l2, cosine, the norms, mean_abs and the counts are
 * derived, shared by the CPU engine (metrics.c) and libprobe_cuda
 * (metrics/cuda/metrics.cu, compiled as C++ by nvcc). Header-only. */
#ifndef PROBE_METRICS_FINISH_H
#define PROBE_METRICS_FINISH_H

#include <math.h>
#include <stdint.h>

#include "probe/metrics.h"

typedef struct probe_metrics_totals {
    uint64_t n, n_finite;
    /* fp64 sums over the finite indices, of values scaled by 2^kr, 2^kc,
     * 2^kd (all 0 unless a float64 input needed the rescale) */
    double srr, scc, sdd, src, sabs;
    int kr, kc, kd;
    uint64_t nan_ref, nan_cand, inf_ref, inf_cand, inf_mismatch, mismatch, not_identical;
    double max_abs;      /* < 0: no finite index */
    uint64_t max_abs_offset;
    double p99;
    /* the gain sums, of the same scaled values: sum d r, r^2 d^2, r^3 d, r^4 */
    double sdr, sr2d2, sr3d, sr4;
    uint64_t nan_ref_only;
    double mismatch_ulps_max; /* NaN: none */
    double max_abs_ulps_scale; /* NaN: not floating */
} probe_metrics_totals;

/* The relative gain error, its HC0 standard error and z (probe/metrics.h)
 * from the sums of scaled values (r scaled by 2^kr, d by 2^kd): alpha and
 * its standard error scale by 2^(kr - kd), z is invariant. */
static inline void probe_metrics_finish_gain(const probe_metrics_totals *t, probe_metrics *out)
{
    out->gain = out->gain_se = out->gain_z = 0.0;
    if (!(t->srr > 0.0))
        return;
    double a = t->sdr / t->srr;
    /* sum r^2 (d - a r)^2, expanded; rounding can leave it slightly below 0 */
    double e2 = t->sr2d2 - 2.0 * a * t->sr3d + a * a * t->sr4;
    double se = e2 > 0.0 ? sqrt(e2) / t->srr : 0.0;
    out->gain = ldexp(a, t->kr - t->kd);
    out->gain_se = ldexp(se, t->kr - t->kd);
    out->gain_z = a == 0.0 ? 0.0 : se > 0.0 ? a / se : copysign(INFINITY, a);
}

static inline void probe_metrics_finish(const probe_metrics_totals *t, probe_metrics *out)
{
    double srr = t->srr, scc = t->scc, sdd = t->sdd;
    double nr = sqrt(srr), nc = sqrt(scc), nd = sqrt(sdd);
    out->n = t->n;
    out->n_finite = t->n_finite;
    out->nan_ref = t->nan_ref;
    out->nan_cand = t->nan_cand;
    out->inf_ref = t->inf_ref;
    out->inf_cand = t->inf_cand;
    out->inf_mismatch = t->inf_mismatch;
    out->mismatch_count = t->mismatch;
    out->mismatch_fraction = t->n ? (double)t->mismatch / (double)t->n : 0.0;
    out->identical = t->not_identical == 0;
    out->zero_norm_reference = srr == 0.0;
    out->norm_ref = ldexp(nr, -t->kr);
    out->norm_cand = ldexp(nc, -t->kc);
    out->norm_diff = ldexp(nd, -t->kd);
    out->dot = ldexp(t->src, -(t->kr + t->kc));
    if (srr == 0.0)
        out->rel_l2 = sdd == 0.0 ? 0.0 : INFINITY;
    else
        out->rel_l2 = ldexp(nd / nr, t->kr - t->kd);
    /* sqrt(srr*scc) rather than nr*nc when the product is in range:
     * sqrt(x*x) == |x| exactly, so c = r gives exactly 1 */
    if (srr == 0.0 && scc == 0.0) {
        out->cosine = 1.0;
    } else if (srr == 0.0 || scc == 0.0) {
        out->cosine = 0.0;
    } else {
        double prod = srr * scc;
        double denom = isnormal(prod) ? sqrt(prod) : nr * nc;
        double cs = t->src / denom;
        out->cosine = cs > 1.0 ? 1.0 : (cs < -1.0 ? -1.0 : cs);
    }
    out->max_abs = t->max_abs < 0.0 ? 0.0 : t->max_abs;
    out->max_abs_offset = t->n_finite ? t->max_abs_offset : 0;
    out->mean_abs = t->n_finite ? ldexp(t->sabs / (double)t->n_finite, -t->kd) : NAN;
    out->p99_abs = t->p99;
    out->nan_ref_only = t->nan_ref_only;
    out->mismatch_ulps_max = t->mismatch_ulps_max;
    out->max_abs_ulps_scale = t->max_abs_ulps_scale;
    probe_metrics_finish_gain(t, out);
}

/* The per-channel results of probe_channel_shift (probe/metrics.h) from each
 * channel's count n_k, sum of d, and sums of squared deviations of r (m2_r)
 * and of d (m2_d): begin, then one call per channel in channel order, then
 * end. The optional arrays (NULL: not wanted) get shift_k, se_k and n_k. */
typedef struct probe_channel_finish {
    probe_channel_shift *shift;
    double *shift_out, *se_out, *n_out;
    double best, zbest;
} probe_channel_finish;

static inline void probe_channel_finish_begin(probe_channel_finish *f, probe_channel_shift *shift,
                                              uint64_t count, double *shift_out, double *se_out,
                                              double *n_out)
{
    f->shift = shift;
    f->shift_out = shift_out;
    f->se_out = se_out;
    f->n_out = n_out;
    f->best = f->zbest = -1.0;
    shift->count = count;
    shift->argmax = shift->z_argmax = 0;
    shift->max = shift->max_rel = shift->std_ref = NAN;
    shift->z_max = 0.0;
}

static inline void probe_channel_finish_one(probe_channel_finish *f, uint64_t k, double n,
                                            double sum_d, double m2_r, double m2_d)
{
    probe_channel_shift *sh = f->shift;
    double v = n > 0 ? sum_d / n : NAN;
    double se = n >= 2 ? sqrt(m2_d / (n - 1.0) / n) : NAN;
    double z = n < 2 || v == 0.0 ? 0.0 : se > 0.0 ? v / se : copysign(INFINITY, v);
    if (f->shift_out)
        f->shift_out[k] = v;
    if (f->se_out)
        f->se_out[k] = se;
    if (f->n_out)
        f->n_out[k] = n;
    if (n > 0 && fabs(v) > f->best) {
        f->best = fabs(v);
        sh->argmax = k;
        sh->max = v;
        sh->std_ref = sqrt(m2_r / n);
    }
    if (fabs(z) > f->zbest) {
        f->zbest = fabs(z);
        sh->z_argmax = k;
        sh->z_max = z;
    }
}

static inline void probe_channel_finish_end(probe_channel_finish *f)
{
    probe_channel_shift *sh = f->shift;
    if (f->best >= 0.0) {
        double sd = sh->std_ref;
        sh->max_rel = sh->max == 0.0 ? 0.0 : sd == 0.0 ? copysign(INFINITY, sh->max) : sh->max / sd;
    }
}

#endif
