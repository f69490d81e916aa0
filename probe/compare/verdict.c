/* verdict.c - the systematic-difference test and the oracle verdict of one
 * tensor (probe/verdict.h, docs/gates.md "Verdicts"). */
#include "probe/verdict.h"

#include <math.h>
#include <string.h>

double probe_systematic_limit(uint64_t k, double p)
{
    if (!(p > 0.0 && p < 1.0))
        return NAN;
    double q = p / (double)(k ? k : 1); /* P(|Z| > t) = erfc(t / sqrt 2) */
    double lo = 0.0, hi = 40.0;
    if (erfc(hi / M_SQRT2) >= q)
        return hi;
    for (int i = 0; i < 200 && hi - lo > 1e-13; i++) {
        double mid = 0.5 * (lo + hi);
        if (erfc(mid / M_SQRT2) > q)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

static double floor_of(double rel_l2_max)
{
    return isfinite(rel_l2_max) && rel_l2_max > 0 ? PROBE_SYSTEMATIC_FLOOR_OF_GATE * rel_l2_max
                                                  : PROBE_SYSTEMATIC_FLOOR_DEFAULT;
}

/* sqrt(n) |x| / norm: the rel_l2 of a constant x over n elements */
static double size_of(double n, double x, double norm)
{
    return norm > 0 ? sqrt(n) * fabs(x) / norm : (x != 0 ? INFINITY : 0.0);
}

static double z_of(double shift, double se)
{
    return shift == 0 ? 0.0 : se > 0 ? shift / se : copysign(INFINITY, shift);
}

probe_status probe_channel_z(const double *shift, const double *se, const double *nk,
                             uint64_t nchannels, double *z)
{
    if (nchannels && (!shift || !se || !nk || !z))
        return probe_set_error(PROBE_EINVAL, "probe_channel_z: NULL argument");
    for (uint64_t k = 0; k < nchannels; k++)
        z[k] = !(nk[k] >= 2) || isnan(shift[k]) ? NAN : z_of(shift[k], se[k]);
    return PROBE_OK;
}

probe_status probe_systematic_check(const probe_metrics *m, const double *shift, const double *se,
                                    const double *nk, uint64_t nchannels, double gate_rel_l2_max,
                                    probe_systematic *out)
{
    if (!m || !out || (nchannels && (!shift || !se || !nk)))
        return probe_set_error(PROBE_EINVAL, "probe_systematic_check: NULL argument");
    memset(out, 0, sizeof *out);
    out->floor_gate = out->floor = floor_of(gate_rel_l2_max);
    if (isfinite(m->rel_l2) && PROBE_SYSTEMATIC_SHARE * m->rel_l2 > out->floor)
        out->floor = PROBE_SYSTEMATIC_SHARE * m->rel_l2;
    out->gain_limit = probe_systematic_limit(1, PROBE_SYSTEMATIC_FALSE_ALARM);
    out->gain_fail = fabs(m->gain_z) > out->gain_limit && fabs(m->gain) >= out->floor;
    out->channels = nchannels;
    if (nchannels) {
        out->channel_limit = probe_systematic_limit(nchannels, PROBE_SYSTEMATIC_FALSE_ALARM);
        double best_any = -1, best_big = -1;
        uint64_t k_any = 0, k_big = 0;
        for (uint64_t k = 0; k < nchannels; k++) {
            if (!(nk[k] >= 2) || isnan(shift[k]))
                continue;
            double a = fabs(z_of(shift[k], se[k]));
            if (a > best_any) {
                best_any = a;
                k_any = k;
            }
            if (size_of(nk[k], shift[k], m->norm_ref) >= out->floor && a > best_big) {
                best_big = a;
                k_big = k;
            }
        }
        uint64_t k = best_big >= 0 ? k_big : k_any;
        if (best_any >= 0) {
            out->channel = k;
            out->channel_shift = shift[k];
            out->channel_z = z_of(shift[k], se[k]);
            out->channel_size = size_of(nk[k], shift[k], m->norm_ref);
            out->channel_fail = best_big > out->channel_limit;
        }
    }
    out->computed = 1;
    return PROBE_OK;
}

probe_status probe_oracle_check(const probe_metrics *oracle_ref, const probe_metrics *oracle_cand,
                                const probe_metrics *pair, const double *b_r, const double *b_c,
                                const double *se, const double *nk, uint64_t nchannels,
                                const probe_systematic *sys, double headroom,
                                probe_oracle_verdict *out)
{
    if (!oracle_ref || !oracle_cand || !pair || !sys || !out ||
        (nchannels && (!b_r || !b_c || !se || !nk)))
        return probe_set_error(PROBE_EINVAL, "probe_oracle_check: NULL argument");
    memset(out, 0, sizeof *out);
    double er = oracle_ref->rel_l2, ec = oracle_cand->rel_l2;
    out->err_reference = er;
    out->err_candidate = ec;
    out->ratio = er > 0 ? ec / er : (ec > 0 ? INFINITY : 1.0);
    if (!isfinite(er) || !isfinite(ec))
        out->ratio = NAN;
    double h = headroom > 0 ? headroom : PROBE_ORACLE_HEADROOM;
    double spread = pair->n_finite ? 1.0 + 4.0 / sqrt((double)pair->n_finite) : INFINITY;
    out->limit = h > spread ? h : spread;
    out->ratio_fail = !(out->ratio <= out->limit);

    out->gain_excess_size = fabs(oracle_cand->gain) - fabs(oracle_ref->gain);
    double gse = pair->gain_se;
    out->gain_excess = out->gain_excess_size == 0 ? 0.0
                       : gse > 0                  ? out->gain_excess_size / gse
                                                  : copysign(INFINITY, out->gain_excess_size);
    /* the added systematic error must be a share of the reference's own error */
    double floor = sys->floor_gate;
    if (isfinite(er) && PROBE_SYSTEMATIC_SHARE * er > floor)
        floor = PROBE_SYSTEMATIC_SHARE * er;
    out->floor = floor;
    out->gain_fail = out->gain_excess > sys->gain_limit && out->gain_excess_size >= floor;

    double best = -INFINITY;
    for (uint64_t k = 0; k < nchannels; k++) {
        if (!(nk[k] >= 2) || isnan(b_r[k]) || isnan(b_c[k]))
            continue;
        double dx = fabs(b_c[k]) - fabs(b_r[k]);
        double x = dx == 0 ? 0.0 : se[k] > 0 ? dx / se[k] : copysign(INFINITY, dx);
        double sz = pair->norm_ref > 0 ? sqrt(nk[k]) * dx / pair->norm_ref : 0.0;
        int fails = x > sys->channel_limit && sz >= floor;
        /* the channel reported: a failing one first, then the largest excess */
        if ((fails && !out->channel_fail) || (fails == out->channel_fail && x > best)) {
            best = x;
            out->channel = k;
            out->channel_excess = x;
            out->channel_excess_size = sz;
            out->channel_fail = fails;
        }
    }
    out->pass = !out->ratio_fail && !out->gain_fail && !out->channel_fail;
    out->computed = 1;
    return PROBE_OK;
}
