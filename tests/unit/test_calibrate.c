/* test_calibrate.c - probe_calibrate_run / probe_calibrate_write_json
 * (probe/calibrate.h) on small capture files whose drift is worked out by
 * hand, the written file read back with probe_calibration_load, and bad
 * options. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "probe/calibrate.h"
#include "probe/capture.h"
#include "probe/gate.h"
#include "probe/calibration_file.h"

static char dir[4096];

static const char *tmp(const char *name)
{
    static char buf[8][4200];
    static int k;
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/probe-test-calibrate-XXXXXX", base ? base : "/tmp");
        cr_assert_not_null(mkdtemp(dir));
    }
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void cleanup(void)
{
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    dir[0] = 0;
}

/* One float64 tensor /dit.step/0000/out of 4 elements. */
static const char *write4(const char *name, double a, double b, double c, double d,
                          const char *manifest)
{
    const char *path = tmp(name);
    static char keep[8][4200];
    static int k;
    k = (k + 1) % 8;
    snprintf(keep[k], sizeof keep[k], "%s", path);
    probe_writer *w = NULL;
    cr_assert_eq(probe_writer_open(keep[k], manifest, &w), PROBE_OK, "%s", probe_last_error());
    int64_t shape[1] = {4};
    double v[4] = {a, b, c, d};
    probe_record r = {.path = "/dit.step/0000/out", .component = "dit.step", .slot = "out",
                      .call = 0, .step = 0, .cfg_branch = -1, .timestep = NAN, .seq = 0,
                      .dtype = PROBE_DTYPE_FLOAT64, .rank = 1, .shape = shape};
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    return keep[k];
}

static probe_calibrate_opts opts_of(const char **refs, size_t nr, const char **cands, size_t nc)
{
    probe_calibrate_opts o;
    memset(&o, 0, sizeof o);
    o.feature = "fp8";
    o.headroom = 2.0;
    o.atol = o.rtol = 1e-3;
    o.references = refs;
    o.nreferences = nr;
    o.candidates = cands;
    o.ncandidates = nc;
    return o;
}

TestSuite(calibrate, .fini = cleanup);

/* R0 = R1 = (3, 4, 0, 0), |R| = 5. C0 = (3, 4, 0.5, 0): rel_l2 0.5/5 = 0.1,
 * cosine 25/(5 sqrt(25.25)), max_abs = p99 (rank ceil(3.96) = 4 of 4) = 0.5,
 * 1 mismatch of 4. C1 = (3, 4, 0, 0.25): rel_l2 0.05, max_abs 0.25. Headroom 2. */
Test(calibrate, thresholds_by_hand)
{
    const char *refs[2] = {write4("r0.h5", 3, 4, 0, 0,
                                  "{\"label\":\"r0\",\"host\":\"h1\",\"torch\":\"2.5\","
                                  "\"cuda\":{\"devices\":[\"NVIDIA H200\",\"NVIDIA H200\"]}}"),
                           write4("r1.h5", 3, 4, 0, 0,
                                  "{\"label\":\"r1\",\"cuda\":{\"devices\":[\"NVIDIA B200\"]}}")};
    const char *cands[2] = {write4("c0.h5", 3, 4, 0.5, 0, NULL), write4("c1.h5", 3, 4, 0, 0.25, NULL)};
    probe_calibrate_opts o = opts_of(refs, 2, cands, 2);
    static const char *const known[] = {"text_encoder", "dit.step", NULL};
    o.known_components = known;
    probe_calibrate_result *r = NULL;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(r->ncomponents, 1);
    const probe_calibrate_component *c = &r->components[0];
    cr_assert_str_eq(c->name, "dit.step");
    double cos0 = 25.0 / (5.0 * sqrt(25.25));
    cr_assert_float_eq(c->feature.rel_l2.worst, 0.1, 1e-15);
    cr_assert_float_eq(c->feature.rel_l2.mean, 0.075, 1e-15);
    cr_assert_float_eq(c->feature.one_minus_cosine.worst, 1 - cos0, 1e-15);
    cr_assert_float_eq(c->feature.max_abs.worst, 0.5, 0);
    cr_assert_float_eq(c->feature.p99_abs.mean, 0.375, 0);
    cr_assert_float_eq(c->feature.mismatch_fraction.worst, 0.25, 0);
    cr_assert_eq(c->feature.pairs, 2);
    cr_assert_eq(c->feature.tensors, 2);
    cr_assert_float_eq(c->rel_l2_max, 0.2, 1e-15);
    cr_assert_float_eq(c->cosine_min, 1 - 2 * (1 - cos0), 1e-15);
    cr_assert_float_eq(c->max_abs_max, 1.0, 0);
    cr_assert_float_eq(c->p99_abs_max, 1.0, 0);
    cr_assert_float_eq(c->mismatch_fraction_max, 0.5, 0);
    /* floor: R0 vs R1, identical */
    cr_assert_eq(c->floor.pairs, 1);
    cr_assert_float_eq(c->floor.rel_l2.worst, 0, 0);
    cr_assert(c->t1_above_floor && r->t1_above_floor);
    cr_assert_eq(r->npairs, 2);
    cr_assert_eq(r->nfloor_pairs, 1);

    /* written, then read back by the T2 loader */
    const char *out = tmp("cal.json");
    FILE *f = fopen(out, "w");
    cr_assert_not_null(f);
    cr_assert_eq(probe_calibrate_write_json(r, f), PROBE_OK);
    fclose(f);
    probe_calibrate_result_free(r);
    probe_calibration *cal = NULL;
    cr_assert_eq(probe_calibration_load(out, known, &cal), PROBE_OK, "%s", probe_last_error());
    probe_gate g;
    cr_assert_eq(probe_gate_parse("T2", &g), PROBE_OK);
    cr_assert_eq(probe_calibration_gate(cal, "dit.step", "/dit.step/0000/out", &g), PROBE_OK);
    cr_assert_eq(g.rel_l2_max, 0.2);
    cr_assert_eq(g.cosine_min, 1 - 2 * (1 - cos0));
    cr_assert_eq(g.max_abs_max, 1.0);
    cr_assert_eq(g.mismatch_fraction_max, 0.5);
    cr_assert_eq(g.atol, 1e-3);
    cr_assert_eq(probe_calibration_gate(cal, "vae.decode", "/vae.decode/0000/out", &g),
                 PROBE_ENOTFOUND, "only calibrated components get thresholds");
    probe_calibration_free(cal);

    /* evidence: distinct GPU names, hosts */
    f = fopen(out, "r");
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cr_assert_not_null(strstr(text, "\"architectures\": [\n   \"NVIDIA H200\",\n   \"NVIDIA B200\"\n  ]"),
                       "%s", text);
    cr_assert_not_null(strstr(text, "\"machine\": [\n   \"h1\"\n  ]"));
}

/* A floor of rel_l2 0.02 (R1 = (3, 4, 0.1, 0)): 2 x 0.02 = 0.04 >= 1e-2. */
Test(calibrate, floor_above_t1)
{
    const char *refs[2] = {write4("r0.h5", 3, 4, 0, 0, NULL), write4("r1.h5", 3, 4, 0.1, 0, NULL)};
    const char *cands[1] = {write4("c0.h5", 3, 4, 0.5, 0, NULL)};
    probe_calibrate_opts o = opts_of(refs, 2, cands, 1);
    probe_calibrate_result *r = NULL;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());
    cr_assert_float_eq(r->components[0].floor_rel_l2_x_headroom, 0.04, 1e-15);
    cr_assert_eq(r->components[0].t1_rel_l2_max, 1e-2);
    cr_assert(!r->components[0].t1_above_floor && !r->t1_above_floor);
    probe_calibrate_result_free(r);

    /* the same reference as its own repeat: floor 0 */
    o.references_differ = 1;
    o.repeats = refs;
    o.nrepeats = 1;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(r->nfloor_pairs, 1);
    cr_assert(r->t1_above_floor);
    probe_calibrate_result_free(r);
}

Test(calibrate, bad_options)
{
    const char *refs[2] = {write4("r0.h5", 3, 4, 0, 0, NULL), write4("r1.h5", 3, 4, 0, 0, NULL)};
    const char *cands[3] = {write4("c0.h5", 3, 4, 0.5, 0, NULL), refs[0], refs[1]};
    probe_calibrate_result *r = (probe_calibrate_result *)1;
    probe_calibrate_opts o = opts_of(refs, 2, cands, 1);
    cr_assert_eq(probe_calibrate_run(NULL, &r), PROBE_EINVAL);
    cr_assert_null(r);
    cr_assert_eq(probe_calibrate_run(&o, NULL), PROBE_EINVAL);
    o.headroom = 0.5;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    cr_assert_not_null(strstr(probe_last_error(), "headroom"));
    o.headroom = NAN;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    o = opts_of(refs, 2, cands, 3);
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    cr_assert_not_null(strstr(probe_last_error(), "3 candidates but 2 references"));
    o = opts_of(refs, 1, cands, 1);
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    cr_assert_not_null(strstr(probe_last_error(), "determinism floor"));
    o = opts_of(refs, 2, cands, 1);
    o.feature = "";
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    o = opts_of(refs, 2, cands, 1);
    o.atol = -1;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    o = opts_of(refs, 2, cands, 1);
    static const char *const known[] = {"vae.decode", NULL};
    o.known_components = known;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    cr_assert_not_null(strstr(probe_last_error(), "unknown component 'dit.step'"), "%s",
                       probe_last_error());
    const char *missing[1] = {tmp("nope.h5")};
    o = opts_of(refs, 2, missing, 1);
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_ENOTFOUND);
    cr_assert_not_null(strstr(probe_last_error(), "nope.h5"));
    cr_assert_null(r);
    /* a candidate identical to its reference: the feature did not run */
    o = opts_of(refs, 2, refs + 1, 1);
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EMISMATCH);
    cr_assert_not_null(strstr(probe_last_error(), "feature not active"), "%s", probe_last_error());
    cr_assert_eq(probe_calibrate_write_json(NULL, stdout), PROBE_EINVAL);
}
