/* gate.c - T1 / T1-relaxed / T2 gates applied to probe_metrics (probe/gate.h,
 * docs/gates.md). T2 thresholds come from calibration_file.c.
 */
#include "probe/gate.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *const relaxed_causes[] = {
    "reduction-reordering", "backend-swap", "compile-fusion", "parallel-partial-sum", NULL,
};

#define VALID_GATES "T1, T1-relaxed:CAUSE, T2"
#define VALID_CAUSES "reduction-reordering, backend-swap, compile-fusion, parallel-partial-sum"

static void gate_unchecked(probe_gate *g)
{
    g->atol = 0.0;
    g->rtol = 0.0;
    g->mismatch_fraction_max = INFINITY;
    g->rel_l2_max = INFINITY;
    g->cosine_min = -INFINITY;
    g->max_abs_max = INFINITY;
    g->p99_abs_max = INFINITY;
    g->channel_z_max = INFINITY;
    g->gain_z_max = INFINITY;
    g->headroom = NAN;
}

size_t probe_struct_size(const char *name)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
        {"probe_gate", sizeof(probe_gate)},
        {"probe_gate_verdict", sizeof(probe_gate_verdict)},
        {"probe_metrics", sizeof(probe_metrics)},
        {"probe_metrics_opts", sizeof(probe_metrics_opts)},
        {"probe_channel_spec", sizeof(probe_channel_spec)},
        {"probe_channel_shift", sizeof(probe_channel_shift)},
        {"probe_pair_source", sizeof(probe_pair_source)},
        {"probe_stream_opts", sizeof(probe_stream_opts)},
    };
    for (size_t i = 0; name && i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(name, sizes[i].name) == 0)
            return sizes[i].size;
    return 0;
}

probe_status probe_gate_parse(const char *spec, probe_gate *out)
{
    if (spec == NULL || out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_gate_parse: %s is NULL",
                               spec == NULL ? "spec" : "out");
    probe_gate g;
    memset(&g, 0, sizeof g);
    gate_unchecked(&g);

    static const char relaxed[] = "T1-relaxed";
    const size_t rlen = sizeof relaxed - 1;

    if (strcasecmp(spec, "T1") == 0) {
        g.kind = PROBE_GATE_T1;
        strcpy(g.name, "T1");
        g.atol = g.rtol = 1e-3;
        g.mismatch_fraction_max = 0.0;
        g.rel_l2_max = 1e-2;
        g.cosine_min = 0.9999;
    } else if (strncasecmp(spec, relaxed, rlen) == 0 && (spec[rlen] == ':' || spec[rlen] == '\0')) {
        if (spec[rlen] == '\0' || spec[rlen + 1] == '\0')
            return probe_set_error(PROBE_EINVAL,
                                   "gate '%s' needs a cause: T1-relaxed:CAUSE with CAUSE one of %s",
                                   spec, VALID_CAUSES);
        const char *cause = spec + rlen + 1;
        const char *found = NULL;
        for (int i = 0; relaxed_causes[i] != NULL; i++)
            if (strcasecmp(cause, relaxed_causes[i]) == 0)
                found = relaxed_causes[i];
        if (found == NULL)
            return probe_set_error(PROBE_EINVAL,
                                   "gate '%s': unknown cause '%.64s' (valid causes: %s)",
                                   spec, cause, VALID_CAUSES);
        g.kind = PROBE_GATE_T1_RELAXED;
        snprintf(g.name, sizeof g.name, "T1-relaxed:%s", found);
        snprintf(g.cause, sizeof g.cause, "%s", found);
        g.atol = g.rtol = 1e-2;
        g.mismatch_fraction_max = 0.0;
        g.rel_l2_max = 5e-2;
        g.cosine_min = 0.999;
    } else if (strcasecmp(spec, "T2") == 0) {
        g.kind = PROBE_GATE_T2;
        strcpy(g.name, "T2");
    } else {
        return probe_set_error(PROBE_EINVAL, "unknown gate '%.200s' (valid gates: %s; causes: %s)",
                               spec, VALID_GATES, VALID_CAUSES);
    }
    *out = g;
    return PROBE_OK;
}

/* ---- check ---- */

typedef struct {
    probe_gate_verdict *v;
    int dropped;
} reasons;

static void add_reason(reasons *rs, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add_reason(reasons *rs, const char *fmt, ...)
{
    probe_gate_verdict *v = rs->v;
    v->pass = 0;
    if (v->nreasons >= PROBE_GATE_MAX_REASONS) {
        rs->dropped++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reasons[v->nreasons], sizeof v->reasons[0], fmt, ap);
    va_end(ap);
    v->nreasons++;
}

/* Print value and limit with the fewest significant digits (at least 4, as
 * %.4g) that make the two strings differ, so "cosine 0.99989 < 0.9999" never
 * reads "cosine 0.9999 < 0.9999". */
static void fmt_pair(double value, double limit, char *vs, char *ls, size_t size)
{
    for (int prec = 4; prec <= 17; prec++) {
        snprintf(vs, size, "%.*g", prec, value);
        snprintf(ls, size, "%.*g", prec, limit);
        if (strcmp(vs, ls) != 0)
            return;
    }
}

static void check_above(reasons *rs, const char *what, double value, double max)
{
    if (isfinite(value) && value > max) {
        char vs[32], ls[32];
        fmt_pair(value, max, vs, ls, sizeof vs);
        add_reason(rs, "%s %s > %s", what, vs, ls);
    }
}

static int threshold_bad(double x)
{
    return isnan(x);
}

probe_status probe_gate_check(const probe_gate *g, const probe_metrics *m, probe_gate_verdict *v)
{
    if (g == NULL || m == NULL || v == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_gate_check: %s is NULL",
                               g == NULL ? "gate" : (m == NULL ? "metrics" : "verdict"));
    memset(v, 0, sizeof *v);
    v->pass = 1;
    if (threshold_bad(g->atol) || threshold_bad(g->rtol) || threshold_bad(g->mismatch_fraction_max) ||
        threshold_bad(g->rel_l2_max) || threshold_bad(g->cosine_min) ||
        threshold_bad(g->max_abs_max) || threshold_bad(g->p99_abs_max))
        return probe_set_error(PROBE_EINVAL, "probe_gate_check: gate '%.64s' has a NaN threshold",
                               g->name);

    reasons rs = {v, 0};

    if (m->nan_cand > 0)
        add_reason(&rs, "NaN in candidate (%llu element%s)", (unsigned long long)m->nan_cand,
                   m->nan_cand == 1 ? "" : "s");
    if (m->nan_ref_only > 0)
        add_reason(&rs, "NaN in reference where the candidate is not NaN (%llu element%s)",
                   (unsigned long long)m->nan_ref_only, m->nan_ref_only == 1 ? "" : "s");
    if (m->inf_mismatch > 0)
        add_reason(&rs, "infinity mismatch (%llu element%s: not the same infinity on both sides)",
                   (unsigned long long)m->inf_mismatch, m->inf_mismatch == 1 ? "" : "s");

    /* Non-finite metrics. p99/mean are NaN by definition when no index is
     * finite on both sides (empty tensor, all-masked tensor): not a failure. */
    if (!isfinite(m->rel_l2)) {
        if (m->zero_norm_reference)
            add_reason(&rs, "rel_l2 not finite (reference norm is 0, candidate differs: norm %.4g)",
                       m->norm_diff);
        else
            add_reason(&rs, "rel_l2 not finite (%g)", m->rel_l2);
    }
    if (!isfinite(m->cosine))
        add_reason(&rs, "cosine not finite (%g)", m->cosine);
    if (m->n_finite > 0) {
        if (!isfinite(m->max_abs))
            add_reason(&rs, "max_abs not finite (%g)", m->max_abs);
        if (!isfinite(m->p99_abs))
            add_reason(&rs, "p99_abs not finite (%g)", m->p99_abs);
        if (!isfinite(m->mean_abs))
            add_reason(&rs, "mean_abs not finite (%g)", m->mean_abs);
    }

    if (m->mismatch_fraction > g->mismatch_fraction_max) {
        char vs[32], ls[32];
        fmt_pair(m->mismatch_fraction, g->mismatch_fraction_max, vs, ls, sizeof vs);
        char ulps[64] = "";
        double u = ceil(m->mismatch_ulps_max), us = ceil(m->max_abs_ulps_scale);
        if (u > 0 && u <= PROBE_GATE_FEW_ULPS)
            snprintf(ulps, sizeof ulps, "; each within %.0f ulp%s of the element", u,
                     u == 1 ? "" : "s");
        else if (us > 0 && us <= PROBE_GATE_FEW_ULPS)
            snprintf(ulps, sizeof ulps, "; all within %.0f ulp%s of the largest element", us,
                     us == 1 ? "" : "s");
        add_reason(&rs, "mismatch %llu of %llu elements (fraction %s > %s) at atol %.4g rtol %.4g%s",
                   (unsigned long long)m->mismatch_count, (unsigned long long)m->n, vs, ls,
                   g->atol, g->rtol, ulps);
    }
    check_above(&rs, "rel_l2", m->rel_l2, g->rel_l2_max);
    if (isfinite(m->cosine) && m->cosine < g->cosine_min) {
        char vs[32], ls[32];
        fmt_pair(m->cosine, g->cosine_min, vs, ls, sizeof vs);
        add_reason(&rs, "cosine %s < %s", vs, ls);
    }
    check_above(&rs, "max_abs", m->max_abs, g->max_abs_max);
    check_above(&rs, "p99_abs", m->p99_abs, g->p99_abs_max);

    if (rs.dropped > 0)
        snprintf(v->reasons[PROBE_GATE_MAX_REASONS - 1], sizeof v->reasons[0],
                 "... and %d more reason%s", rs.dropped + 1, rs.dropped + 1 == 1 ? "" : "s");
    return PROBE_OK;
}

/* "the feature's own[WHERE], calibrated[ with headroom H]" */
static void calibrated_note(const probe_gate *g, const char *where, char *buf, size_t size)
{
    if (isfinite(g->headroom))
        snprintf(buf, size, "the feature's own%s, calibrated with headroom %g", where, g->headroom);
    else
        snprintf(buf, size, "the feature's own%s, calibrated", where);
}

/* Fail `what` when |z| exceeds max(threshold, noise). */
static void check_z(reasons *rs, const probe_gate *g, const char *what, double z,
                    double threshold, double noise)
{
    double az = fabs(z);
    int by_noise = noise > threshold; /* NaN noise: false */
    double limit = by_noise ? noise : threshold;
    if (isnan(z) || !(az > limit))
        return;
    char note[96], vs[32], ls[32];
    calibrated_note(g, "", note, sizeof note);
    fmt_pair(az, limit, vs, ls, sizeof vs);
    if (by_noise)
        add_reason(rs, "%s: |z| %s > %s (the z limit of rounding noise; %s: %.4g)", what, vs, ls,
                   note, threshold);
    else
        add_reason(rs, "%s: |z| %s > %s (%s)", what, vs, ls, note);
}

probe_status probe_gate_check_structure(const probe_gate *g, const probe_metrics *m,
                                        const probe_channel_shift *shift, double channel_noise_z,
                                        double gain_noise_z, probe_gate_verdict *v)
{
    if (g == NULL || m == NULL || v == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_gate_check_structure: %s is NULL",
                               g == NULL ? "gate" : (m == NULL ? "metrics" : "verdict"));
    if (threshold_bad(g->channel_z_max) || threshold_bad(g->gain_z_max))
        return probe_set_error(PROBE_EINVAL,
                               "probe_gate_check_structure: gate '%.64s' has a NaN threshold",
                               g->name);
    reasons rs = {v, 0};
    char what[64];
    if (shift != NULL && shift->count > 0) {
        snprintf(what, sizeof what, "systematic shift of channel %llu",
                 (unsigned long long)shift->z_argmax);
        check_z(&rs, g, what, shift->z_max, g->channel_z_max, channel_noise_z);
    }
    snprintf(what, sizeof what, "systematic gain error %.3e", m->gain);
    check_z(&rs, g, what, m->gain_z, g->gain_z_max, gain_noise_z);
    return PROBE_OK;
}

probe_status probe_gate_check_channels(const probe_gate *g, const double *z, uint64_t count,
                                       double noise_z, probe_gate_verdict *v)
{
    if (g == NULL || v == NULL || (z == NULL && count > 0))
        return probe_set_error(PROBE_EINVAL, "probe_gate_check_channels: %s is NULL",
                               g == NULL ? "gate" : (v == NULL ? "verdict" : "z"));
    if (g->channel_z_max_by_channel == NULL || g->channel_z_count == 0)
        return PROBE_OK;
    reasons rs = {v, 0};
    if (count != g->channel_z_count) {
        add_reason(&rs, "per-channel structure: the tensor has %llu channels, the calibration %llu",
                   (unsigned long long)count, (unsigned long long)g->channel_z_count);
        return PROBE_OK;
    }
    uint64_t worst = 0, above = 0;
    double worst_ratio = -1.0, worst_limit = 0.0;
    for (uint64_t k = 0; k < count; k++) {
        double t = g->channel_z_max_by_channel[k], az = fabs(z[k]);
        if (isnan(t) || isnan(az))
            continue;
        double limit = noise_z > t ? noise_z : t; /* NaN noise: t */
        if (!(az > limit))
            continue;
        double ratio = limit > 0 ? az / limit : INFINITY;
        above++;
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            worst = k;
            worst_limit = limit;
        }
    }
    if (!above)
        return PROBE_OK;
    char note[96], vs[32], ls[32], more[48] = "";
    calibrated_note(g, " in that channel", note, sizeof note);
    fmt_pair(fabs(z[worst]), worst_limit, vs, ls, sizeof vs);
    if (above > 1)
        snprintf(more, sizeof more, "; %llu channels above theirs", (unsigned long long)above);
    add_reason(&rs, "systematic shift of channel %llu: |z| %s > %s (%s)%s",
               (unsigned long long)worst, vs, ls, note, more);
    return PROBE_OK;
}
