/* test_gate.c - gate parsing and checking (probe/gate.h, docs/gates.md).
 *
 * Thresholds are the numbers of docs/gates.md "The gates" and the gate.h comment;
 * verdicts are checked on hand-built metrics and on metrics computed from
 * small hand-derived tensors.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "probe/gate.h"

static probe_gate parse(const char *spec)
{
    probe_gate g;
    cr_assert_eq(probe_gate_parse(spec, &g), PROBE_OK, "%s: %s", spec, probe_last_error());
    return g;
}

/* metrics of a tensor that passes everything */
static probe_metrics clean_metrics(void)
{
    probe_metrics m;
    memset(&m, 0, sizeof m);
    m.n = m.n_finite = 1000;
    m.cosine = 1.0;
    m.identical = 1;
    m.norm_ref = m.norm_cand = 10.0;
    return m;
}

static probe_gate_verdict check(const probe_gate *g, const probe_metrics *m)
{
    probe_gate_verdict v;
    cr_assert_eq(probe_gate_check(g, m, &v), PROBE_OK, "%s", probe_last_error());
    cr_assert(v.pass == (v.nreasons == 0), "pass %d with %d reasons", v.pass, v.nreasons);
    return v;
}

static int has_reason(const probe_gate_verdict *v, const char *text)
{
    for (int i = 0; i < v->nreasons; i++)
        if (strcmp(v->reasons[i], text) == 0)
            return 1;
    return 0;
}

static void dump(const probe_gate_verdict *v)
{
    for (int i = 0; i < v->nreasons; i++)
        cr_log_info("reason %d: %s", i, v->reasons[i]);
}

/* ---- parse ---- */

Test(gate_parse, t1)
{
    probe_gate g = parse("T1");
    cr_assert_eq(g.kind, PROBE_GATE_T1);
    cr_assert_str_eq(g.name, "T1");
    cr_assert_str_eq(g.cause, "");
    cr_assert(g.atol == 1e-3 && g.rtol == 1e-3);
    cr_assert(g.mismatch_fraction_max == 0.0);
    cr_assert(g.rel_l2_max == 1e-2);
    cr_assert(g.cosine_min == 0.9999);
    cr_assert(isinf(g.max_abs_max) && g.max_abs_max > 0);
    cr_assert(isinf(g.p99_abs_max) && g.p99_abs_max > 0);
    g = parse("t1"); /* gate names are case-insensitive, stored canonically */
    cr_assert_str_eq(g.name, "T1");
}

Test(gate_parse, t1_relaxed_every_cause)
{
    const char *causes[] = {"reduction-reordering", "backend-swap", "compile-fusion",
                            "parallel-partial-sum"};
    for (int i = 0; i < 4; i++) {
        char spec[64], name[64];
        snprintf(spec, sizeof spec, "T1-relaxed:%s", causes[i]);
        probe_gate g = parse(spec);
        snprintf(name, sizeof name, "T1-relaxed:%s", causes[i]);
        cr_assert_eq(g.kind, PROBE_GATE_T1_RELAXED);
        cr_assert_str_eq(g.name, name);
        cr_assert_str_eq(g.cause, causes[i]);
        cr_assert(g.atol == 1e-2 && g.rtol == 1e-2);
        cr_assert(g.mismatch_fraction_max == 0.0);
        cr_assert(g.rel_l2_max == 5e-2);
        cr_assert(g.cosine_min == 0.999);
        cr_assert(isinf(g.max_abs_max) && isinf(g.p99_abs_max));
    }
    probe_gate g = parse("T1-RELAXED:Backend-Swap");
    cr_assert_str_eq(g.name, "T1-relaxed:backend-swap");
}

Test(gate_parse, t2_unchecked)
{
    probe_gate g = parse("T2");
    cr_assert_eq(g.kind, PROBE_GATE_T2);
    cr_assert_str_eq(g.name, "T2");
    cr_assert(g.atol == 0.0 && g.rtol == 0.0);
    cr_assert(isinf(g.mismatch_fraction_max) && g.mismatch_fraction_max > 0);
    cr_assert(isinf(g.rel_l2_max) && g.rel_l2_max > 0);
    cr_assert(isinf(g.cosine_min) && g.cosine_min < 0);
    cr_assert(isinf(g.max_abs_max) && isinf(g.p99_abs_max));
}

Test(gate_parse, errors_name_the_spec_and_list_valid_ones)
{
    probe_gate g;
    memset(&g, 0x5A, sizeof g);
    probe_gate before = g;
    cr_assert_eq(probe_gate_parse("T3", &g), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "'T3'") != NULL, "%s", probe_last_error());
    cr_assert(strstr(probe_last_error(), "T1-relaxed:CAUSE") != NULL);
    cr_assert(strstr(probe_last_error(), "parallel-partial-sum") != NULL);
    cr_assert(memcmp(&g, &before, sizeof g) == 0, "output untouched on error");

    cr_assert_eq(probe_gate_parse("T1-relaxed:fast-math", &g), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "unknown cause 'fast-math'") != NULL, "%s",
              probe_last_error());
    cr_assert(strstr(probe_last_error(), "reduction-reordering, backend-swap, compile-fusion, "
                                         "parallel-partial-sum") != NULL);
    cr_assert_eq(probe_gate_parse("T1-relaxed", &g), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "needs a cause") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_gate_parse("T1-relaxed:", &g), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "needs a cause") != NULL);
    cr_assert_eq(probe_gate_parse("T1-relaxedx", &g), PROBE_EINVAL);
    cr_assert_eq(probe_gate_parse("T1 ", &g), PROBE_EINVAL);
    cr_assert_eq(probe_gate_parse("", &g), PROBE_EINVAL);
    cr_assert_eq(probe_gate_parse("T2:bf16", &g), PROBE_EINVAL);
    cr_assert_eq(probe_gate_parse(NULL, &g), PROBE_EINVAL);
    cr_assert_eq(probe_gate_parse("T1", NULL), PROBE_EINVAL);
}

/* ---- check: hand-built metrics ---- */

Test(gate_check, clean_passes_every_gate)
{
    probe_metrics m = clean_metrics();
    const char *specs[] = {"T1", "T1-relaxed:compile-fusion", "T2"};
    for (int i = 0; i < 3; i++) {
        probe_gate g = parse(specs[i]);
        probe_gate_verdict v = check(&g, &m);
        cr_assert_eq(v.pass, 1, "%s", specs[i]);
        cr_assert_eq(v.nreasons, 0);
    }
}

Test(gate_check, nan_in_candidate_fails_every_gate)
{
    probe_metrics m = clean_metrics();
    m.nan_cand = 1;
    const char *specs[] = {"T1", "T1-relaxed:backend-swap", "T2"};
    for (int i = 0; i < 3; i++) {
        probe_gate g = parse(specs[i]);
        probe_gate_verdict v = check(&g, &m);
        cr_assert_eq(v.pass, 0, "%s", specs[i]);
        cr_assert(has_reason(&v, "NaN in candidate (1 element)"), "%s", v.reasons[0]);
    }
    m.nan_cand = 12;
    probe_gate g = parse("T2");
    probe_gate_verdict v = check(&g, &m);
    cr_assert(has_reason(&v, "NaN in candidate (12 elements)"), "%s", v.reasons[0]);
}

Test(gate_check, infinity_mismatch_fails_t2)
{
    probe_metrics m = clean_metrics();
    m.inf_cand = 3;
    m.inf_ref = 3;
    m.inf_mismatch = 2;
    probe_gate g = parse("T2");
    probe_gate_verdict v = check(&g, &m);
    cr_assert_eq(v.pass, 0);
    cr_assert(strstr(v.reasons[0], "infinity mismatch (2 elements") == v.reasons[0], "%s",
              v.reasons[0]);
    m.inf_mismatch = 0; /* same infinities on both sides: fine */
    v = check(&g, &m);
    cr_assert_eq(v.pass, 1);
}

Test(gate_check, threshold_reasons_with_numbers)
{
    probe_metrics m = clean_metrics();
    m.rel_l2 = 0.0312;
    m.cosine = 0.99989;
    m.mismatch_count = 3;
    m.mismatch_fraction = 0.003;
    probe_gate g = parse("T1");
    probe_gate_verdict v = check(&g, &m);
    dump(&v);
    cr_assert_eq(v.pass, 0);
    cr_assert_eq(v.nreasons, 3);
    cr_assert(has_reason(&v, "rel_l2 0.0312 > 0.01"));
    /* %.4g would print both as 0.9999: the digits grow until they differ */
    cr_assert(has_reason(&v, "cosine 0.99989 < 0.9999"));
    cr_assert(has_reason(&v, "mismatch 3 of 1000 elements (fraction 0.003 > 0) at atol 0.001 rtol 0.001"));
}

Test(gate_check, boundaries_are_inclusive)
{
    probe_metrics m = clean_metrics();
    probe_gate g = parse("T1");
    m.rel_l2 = 1e-2;      /* rel_l2 <= 1e-2 passes */
    m.cosine = 0.9999;    /* cosine >= 0.9999 passes */
    cr_assert_eq(check(&g, &m).pass, 1);
    m.rel_l2 = nextafter(1e-2, 1);
    cr_assert_eq(check(&g, &m).pass, 0);
    m.rel_l2 = 1e-2;
    m.cosine = nextafter(0.9999, 0);
    probe_gate_verdict v = check(&g, &m);
    cr_assert_eq(v.pass, 0);
    cr_assert(has_reason(&v, "cosine 0.99989999999999990 < 0.99990000000000001") ||
              strstr(v.reasons[0], "cosine 0.9998999") == v.reasons[0], "%s", v.reasons[0]);
}

Test(gate_check, relaxed_bounds)
{
    probe_metrics m = clean_metrics();
    m.rel_l2 = 0.03;
    m.cosine = 0.9995;
    probe_gate t1 = parse("T1"), rx = parse("T1-relaxed:parallel-partial-sum");
    cr_assert_eq(check(&t1, &m).pass, 0);
    cr_assert_eq(check(&rx, &m).pass, 1);
    m.rel_l2 = 0.06;
    probe_gate_verdict v = check(&rx, &m);
    cr_assert_eq(v.pass, 0);
    cr_assert(has_reason(&v, "rel_l2 0.06 > 0.05"));
}

Test(gate_check, max_abs_and_p99_limits)
{
    probe_metrics m = clean_metrics();
    m.max_abs = 0.75;
    m.p99_abs = 0.125;
    probe_gate g = parse("T2");
    g.max_abs_max = 0.5;
    g.p99_abs_max = 0.1;
    probe_gate_verdict v = check(&g, &m);
    cr_assert_eq(v.nreasons, 2);
    cr_assert(has_reason(&v, "max_abs 0.75 > 0.5"));
    cr_assert(has_reason(&v, "p99_abs 0.125 > 0.1"));
}

Test(gate_check, zero_norm_reference_with_different_candidate)
{
    probe_metrics m = clean_metrics();
    m.zero_norm_reference = 1;
    m.rel_l2 = INFINITY;
    m.cosine = 0.0;
    m.norm_ref = 0.0;
    m.norm_diff = 2.0;
    probe_gate g = parse("T2"); /* even with nothing else checked */
    probe_gate_verdict v = check(&g, &m);
    dump(&v);
    cr_assert_eq(v.pass, 0);
    cr_assert_eq(v.nreasons, 1);
    cr_assert(strstr(v.reasons[0], "rel_l2 not finite (reference norm is 0") == v.reasons[0],
              "%s", v.reasons[0]);
}

Test(gate_check, nan_percentiles_of_an_empty_population_do_not_fail)
{
    probe_metrics m = clean_metrics();
    m.n_finite = 0;
    m.p99_abs = NAN;
    m.mean_abs = NAN;
    probe_gate g = parse("T1");
    cr_assert_eq(check(&g, &m).pass, 1);
    m.n_finite = 10; /* but with a population they must be finite */
    probe_gate_verdict v = check(&g, &m);
    cr_assert_eq(v.pass, 0);
    cr_assert(has_reason(&v, "p99_abs not finite (nan)"));
}

Test(gate_check, worst_case_fits_the_reason_slots)
{
    /* NaN, infinity mismatch, mismatch fraction, and one reason for each of
     * rel_l2, cosine, max_abs, p99_abs, mean_abs: 8 = PROBE_GATE_MAX_REASONS */
    probe_metrics m = clean_metrics();
    m.nan_cand = 1;
    m.inf_mismatch = 1;
    m.rel_l2 = INFINITY;
    m.cosine = NAN;
    m.max_abs = INFINITY;
    m.p99_abs = INFINITY;
    m.mean_abs = INFINITY;
    m.mismatch_count = 5;
    m.mismatch_fraction = 0.005;
    probe_gate g = parse("T1");
    probe_gate_verdict v = check(&g, &m);
    dump(&v);
    cr_assert_eq(v.pass, 0);
    cr_assert_eq(v.nreasons, PROBE_GATE_MAX_REASONS);
    cr_assert(has_reason(&v, "NaN in candidate (1 element)"));
    cr_assert(has_reason(&v, "rel_l2 not finite (inf)"));
    cr_assert(has_reason(&v, "cosine not finite (nan)"));
    cr_assert(has_reason(&v, "max_abs not finite (inf)"));
    cr_assert(has_reason(&v, "p99_abs not finite (inf)"));
    cr_assert(has_reason(&v, "mean_abs not finite (inf)"));
    for (int i = 0; i < v.nreasons; i++)
        cr_assert(strlen(v.reasons[i]) < sizeof v.reasons[i] - 1, "reason %d truncated", i);
}

Test(gate_check, bad_input)
{
    probe_metrics m = clean_metrics();
    probe_gate g = parse("T1");
    probe_gate_verdict v;
    cr_assert_eq(probe_gate_check(NULL, &m, &v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "gate is NULL") != NULL);
    cr_assert_eq(probe_gate_check(&g, NULL, &v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "metrics is NULL") != NULL);
    cr_assert_eq(probe_gate_check(&g, &m, NULL), PROBE_EINVAL);
    g.rel_l2_max = NAN;
    cr_assert_eq(probe_gate_check(&g, &m, &v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "NaN threshold") != NULL, "%s", probe_last_error());
}

/* ---- check: metrics computed from tensors ---- */

static probe_gate_verdict check_tensors(const char *spec, const double *r, const double *c,
                                        size_t n)
{
    probe_gate g = parse(spec);
    probe_metrics_opts o = {g.atol, g.rtol};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(r, c, n, &o, &m), PROBE_OK);
    return check(&g, &m);
}

Test(gate_tensors, t1_end_to_end)
{
    /* |c - r| = 5e-4 everywhere, tolerance 1e-3 + 1e-3 * 1 = 2e-3: no
     * mismatch; rel_l2 = 5e-4; cosine ~ 1 - 1.25e-7 */
    const double r[] = {1, 1, 1, 1}, c[] = {1.0005, 1.0005, 1.0005, 1.0005};
    probe_gate_verdict v = check_tensors("T1", r, c, 4);
    cr_assert_eq(v.pass, 1);
    /* one element off by 3e-3 > 2e-3: a single mismatch fails T1 */
    const double c2[] = {1.0005, 1.003, 1.0005, 1.0005};
    v = check_tensors("T1", r, c2, 4);
    dump(&v);
    cr_assert_eq(v.pass, 0);
    cr_assert_eq(v.nreasons, 1);
    cr_assert(strstr(v.reasons[0], "mismatch 1 of 4 elements (fraction 0.25 > 0)") == v.reasons[0],
              "%s", v.reasons[0]);
    /* the relaxed gate's 1e-2 tolerance accepts it */
    v = check_tensors("T1-relaxed:reduction-reordering", r, c2, 4);
    cr_assert_eq(v.pass, 1);
}

Test(gate_tensors, masks_of_equal_infinity_pass)
{
    const double r[] = {-INFINITY, -INFINITY, 0.5}, c[] = {-INFINITY, -INFINITY, 0.5};
    cr_assert_eq(check_tensors("T1", r, c, 3).pass, 1);
    const double all[] = {-INFINITY, -INFINITY};
    cr_assert_eq(check_tensors("T1", all, all, 2).pass, 1);
    cr_assert_eq(check_tensors("T1", NULL, NULL, 0).pass, 1);
}

Test(gate_tensors, opposite_infinity_and_zero_reference_fail)
{
    const double r[] = {INFINITY, 1}, c[] = {-INFINITY, 1};
    probe_gate_verdict v = check_tensors("T2", r, c, 2);
    cr_assert_eq(v.pass, 0);
    cr_assert(strstr(v.reasons[0], "infinity mismatch (1 element") == v.reasons[0]);
    const double z[] = {0, 0}, nz[] = {0, 1e-9};
    v = check_tensors("T2", z, nz, 2);
    cr_assert_eq(v.pass, 0);
    cr_assert(strstr(v.reasons[0], "rel_l2 not finite") == v.reasons[0], "%s", v.reasons[0]);
}

/* ---- structure thresholds ---- */

Test(gate_parse, structure_unchecked_in_every_gate)
{
    static const char *const specs[] = {"T1", "T1-relaxed:backend-swap", "T2", NULL};
    for (int i = 0; specs[i]; i++) {
        probe_gate g = parse(specs[i]);
        cr_assert(isinf(g.channel_z_max) && g.channel_z_max > 0, "%s", specs[i]);
        cr_assert(isinf(g.gain_z_max) && g.gain_z_max > 0, "%s", specs[i]);
        cr_assert(isnan(g.headroom), "%s", specs[i]);
    }
}

Test(gate_check, structure_reasons)
{
    probe_gate g = parse("T2");
    g.channel_z_max = 176;
    g.gain_z_max = 30;
    g.headroom = 1.5;
    probe_metrics m;
    memset(&m, 0, sizeof m);
    m.gain = -2.5e-3;
    m.gain_z = -45;
    probe_channel_shift sh = {.count = 64, .z_argmax = 17, .z_max = -230};
    probe_gate_verdict v = {.pass = 1};
    cr_assert_eq(probe_gate_check_structure(&g, &m, &sh, 5.9, 4.9, &v), PROBE_OK);
    cr_assert(!v.pass);
    cr_assert_eq(v.nreasons, 2);
    cr_assert_str_eq(v.reasons[0], "systematic shift of channel 17: |z| 230 > 176 (the feature's "
                     "own, calibrated with headroom 1.5)");
    cr_assert_str_eq(v.reasons[1], "systematic gain error -2.500e-03: |z| 45 > 30 (the feature's "
                     "own, calibrated with headroom 1.5)");

    /* at the threshold: pass; no channel axis: no channel check */
    sh.z_max = 176;
    m.gain_z = 30;
    v = (probe_gate_verdict){.pass = 1};
    cr_assert_eq(probe_gate_check_structure(&g, &m, &sh, NAN, NAN, &v), PROBE_OK);
    cr_assert(v.pass && v.nreasons == 0);
    sh.z_max = 1e9;
    sh.count = 0;
    cr_assert_eq(probe_gate_check_structure(&g, &m, &sh, NAN, NAN, &v), PROBE_OK);
    cr_assert(v.pass);
    cr_assert_eq(probe_gate_check_structure(&g, &m, NULL, NAN, NAN, &v), PROBE_OK);
    cr_assert(v.pass);

    /* an infinite z fails; a NaN one is not checked */
    m.gain_z = INFINITY;
    cr_assert_eq(probe_gate_check_structure(&g, &m, NULL, NAN, NAN, &v), PROBE_OK);
    cr_assert(!v.pass);
    cr_assert_str_eq(v.reasons[0], "systematic gain error -2.500e-03: |z| inf > 30 (the "
                     "feature's own, calibrated with headroom 1.5)");
    v = (probe_gate_verdict){.pass = 1};
    m.gain_z = NAN;
    cr_assert_eq(probe_gate_check_structure(&g, &m, NULL, NAN, NAN, &v), PROBE_OK);
    cr_assert(v.pass);
}

/* A threshold below what rounding noise reaches is raised to the noise's z limit. */
Test(gate_check, structure_never_below_the_noise_limit)
{
    probe_gate g = parse("T2");
    g.gain_z_max = 1.45;
    probe_metrics m;
    memset(&m, 0, sizeof m);
    m.gain = 3e-4;
    m.gain_z = 1.557;
    probe_gate_verdict v = {.pass = 1};
    cr_assert_eq(probe_gate_check_structure(&g, &m, NULL, NAN, 4.89, &v), PROBE_OK);
    cr_assert(v.pass, "%s", v.reasons[0]);
    m.gain_z = 6;
    cr_assert_eq(probe_gate_check_structure(&g, &m, NULL, NAN, 4.89, &v), PROBE_OK);
    cr_assert(!v.pass);
    cr_assert_str_eq(v.reasons[0], "systematic gain error 3.000e-04: |z| 6 > 4.89 (the z limit "
                     "of rounding noise; the feature's own, calibrated: 1.45)");
    g.gain_z_max = NAN;
    cr_assert_eq(probe_gate_check_structure(&g, &m, NULL, NAN, NAN, &v), PROBE_EINVAL);
    cr_assert_eq(probe_gate_check_structure(NULL, &m, NULL, NAN, NAN, &v), PROBE_EINVAL);
}

Test(gate_check, per_channel_reasons)
{
    probe_gate g = parse("T2");
    double limits[5] = {40, 10, NAN, 2, 120};
    g.channel_z_max_by_channel = limits;
    g.channel_z_count = 5;
    g.channel_z_max = 1; /* not this function's */
    g.headroom = 1.5;
    /* channel 0 within 40; 1 above 10 (ratio 3); 2 unchecked; 3 above the noise limit 4.5
       (ratio 2, below 1's); 4 within */
    double z[5] = {-39.9, 30, 1e9, -9, 119};
    probe_gate_verdict v = {.pass = 1};
    cr_assert_eq(probe_gate_check_channels(&g, z, 5, 4.5, &v), PROBE_OK);
    cr_assert(!v.pass);
    cr_assert_eq(v.nreasons, 1);
    cr_assert_str_eq(v.reasons[0], "systematic shift of channel 1: |z| 30 > 10 (the feature's own "
                     "in that channel, calibrated with headroom 1.5); 2 channels above theirs");

    /* the noise limit lifts a small threshold: channel 3 at 4.4 passes under noise 4.5 */
    z[1] = 10;
    z[3] = 4.4;
    v = (probe_gate_verdict){.pass = 1};
    cr_assert_eq(probe_gate_check_channels(&g, z, 5, 4.5, &v), PROBE_OK);
    cr_assert(v.pass && v.nreasons == 0);
    /* without a noise limit it fails; NaN z is skipped, an infinite one fails */
    z[2] = NAN;
    cr_assert_eq(probe_gate_check_channels(&g, z, 5, NAN, &v), PROBE_OK);
    cr_assert(!v.pass);
    cr_assert_str_eq(v.reasons[0], "systematic shift of channel 3: |z| 4.4 > 2 (the feature's own "
                     "in that channel, calibrated with headroom 1.5)");
    z[3] = 0;
    z[0] = -INFINITY;
    v = (probe_gate_verdict){.pass = 1};
    cr_assert_eq(probe_gate_check_channels(&g, z, 5, NAN, &v), PROBE_OK);
    cr_assert(!v.pass);
    cr_assert_str_eq(v.reasons[0], "systematic shift of channel 0: |z| inf > 40 (the feature's own "
                     "in that channel, calibrated with headroom 1.5)");

    /* another channel count fails; no thresholds check nothing; bad arguments */
    v = (probe_gate_verdict){.pass = 1};
    cr_assert_eq(probe_gate_check_channels(&g, z, 4, NAN, &v), PROBE_OK);
    cr_assert(!v.pass);
    cr_assert_str_eq(v.reasons[0], "per-channel structure: the tensor has 4 channels, the "
                     "calibration 5");
    probe_gate none = parse("T2");
    v = (probe_gate_verdict){.pass = 1};
    cr_assert_eq(probe_gate_check_channels(&none, z, 5, NAN, &v), PROBE_OK);
    cr_assert(v.pass);
    cr_assert_eq(probe_gate_check_channels(&g, NULL, 5, NAN, &v), PROBE_EINVAL);
    cr_assert_eq(probe_gate_check_channels(NULL, z, 5, NAN, &v), PROBE_EINVAL);
    cr_assert_eq(probe_gate_check_channels(&g, z, 5, NAN, NULL), PROBE_EINVAL);
}
