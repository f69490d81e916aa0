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
#include "probe/verdict.h"
#include "probe/compare.h"

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

/* The file at path into buf (cap bytes, terminated; it must fit). */
static void read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    cr_assert(n < cap - 1, "%s does not fit in %zu bytes", path, cap);
    fclose(f);
    buf[n] = 0;
}

/* r's calibration file written to path. */
static void write_json(const probe_calibrate_result *r, const char *path)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(probe_calibrate_write_json(r, f), PROBE_OK);
    cr_assert_eq(fclose(f), 0);
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
    write_json(r, out);
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
    static char text[16384];
    read_text(out, text, sizeof text);
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

/* The held-out check on hand-derived drift: R = (3, 4, 0, 0), |R| = 5, for every pair;
 * C0 = (3, 4, 0.5, 0) rel_l2 0.1, C1 = (3, 4, 0, 0.25) rel_l2 0.05, C2 = (3, 4, 1.5, 0)
 * rel_l2 0.3. Headroom 2: pair 2 held out meets rel_l2_max 2 x 0.1 = 0.2 and fails;
 * pairs 0 and 1 held out meet 2 x 0.3 = 0.6 and pass. */
Test(calibrate, held_out)
{
    const char *refs[3] = {write4("hr0.h5", 3, 4, 0, 0, NULL), write4("hr1.h5", 3, 4, 0, 0, NULL),
                           write4("hr2.h5", 3, 4, 0, 0, NULL)};
    const char *cands[3] = {write4("hc0.h5", 3, 4, 0.5, 0, NULL),
                            write4("hc1.h5", 3, 4, 0, 0.25, NULL),
                            write4("hc2.h5", 3, 4, 1.5, 0, NULL)};
    probe_calibrate_opts o = opts_of(refs, 3, cands, 3);
    probe_calibrate_result *r = NULL;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());
    cr_assert_float_eq(r->components[0].rel_l2_max, 0.6, 1e-15, "the file: all three pairs");
    cr_assert_eq(r->nheld_out, 3, "3 feature pairs: run by default");
    cr_assert_eq(r->held_out_failed, 1);
    for (size_t i = 0; i < 3; i++) {
        const probe_calibrate_held_out *h = &r->held_out[i];
        cr_assert_eq(h->pair, i);
        cr_assert_eq(h->tensors, 1);
        cr_assert_eq(h->pass, i != 2, "pair %zu: %s", i, h->reason);
        cr_assert_eq(h->failed, i == 2);
    }
    const probe_calibrate_held_out *h = &r->held_out[2];
    cr_assert_str_eq(h->first_failure, "/dit.step/0000/out");
    cr_assert_not_null(strstr(h->reason, "rel_l2 0.3 > 0.2"), "%s", h->reason);

    /* written under evidence.held_out; the file still loads */
    const char *out = tmp("hcal.json");
    write_json(r, out);
    probe_calibration *cal = NULL;
    cr_assert_eq(probe_calibration_load(out, NULL, &cal), PROBE_OK, "%s", probe_last_error());
    probe_calibration_free(cal);
    static char text[65536];
    read_text(out, text, sizeof text);
    cr_assert_not_null(strstr(text, "\"pairs\": 3,\n   \"failed\": 1,"), "%s", text);
    cr_assert_not_null(strstr(text, "\"pair\": 2,\n     \"reference\": \"hr2.h5\",\n     "
                                    "\"candidate\": \"hc2.h5\",\n     \"verdict\": \"fail\""),
                       "%s", text);
    probe_calibrate_result_free(r);

    /* never; and with 2 pairs only when asked */
    o.held_out = -1;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(r->nheld_out, 0);
    probe_calibrate_result_free(r);
    o = opts_of(refs, 3, cands + 1, 2); /* C1, C2 against R0, R1 */
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(r->nheld_out, 0, "2 pairs: not by default");
    probe_calibrate_result_free(r);
    o.held_out = 1;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(r->nheld_out, 2);
    /* C1 held out meets 2 x 0.3; C2 held out meets 2 x 0.05 = 0.1 */
    cr_assert(r->held_out[0].pass && !r->held_out[1].pass);
    cr_assert_not_null(strstr(r->held_out[1].reason, "rel_l2 0.3 > 0.1"), "%s",
                       r->held_out[1].reason);
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

/* ---- structure: the per-channel shift z and the gain z ---- */

#define SROWS 256
#define SCH 8 /* [SROWS, SCH]: rank 2, channel axis the last (layout rule) */
#define SN (SROWS * SCH)
#define SBIAS_CH 3

/* Deterministic standard normal values (xorshift64*, Box-Muller). */
static void gaussian(uint64_t seed, double *v, size_t n)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i += 2) {
        double u[2];
        for (int k = 0; k < 2; k++) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            u[k] = ((double)((x * 0x2545F4914F6CDD1Dull) >> 11) + 0.5) / 9007199254740992.0;
        }
        double rad = sqrt(-2 * log(u[0]));
        v[i] = rad * cos(2 * M_PI * u[1]);
        if (i + 1 < n)
            v[i + 1] = rad * sin(2 * M_PI * u[1]);
    }
}

/* Two float64 tensors [SROWS, SCH] of dit.step: /dit.step/0000/out = a, /0001/out = b. */
static const char *write_pair(const char *name, const double *a, const double *b)
{
    static char keep[16][4200];
    static int k;
    k = (k + 1) % 16;
    snprintf(keep[k], sizeof keep[k], "%s", tmp(name));
    probe_writer *w = NULL;
    cr_assert_eq(probe_writer_open(keep[k], NULL, &w), PROBE_OK, "%s", probe_last_error());
    int64_t shape[2] = {SROWS, SCH};
    const char *paths[2] = {"/dit.step/0000/out", "/dit.step/0001/out"};
    const double *v[2] = {a, b};
    for (int t = 0; t < 2; t++) {
        probe_record r = {.path = paths[t], .component = "dit.step", .slot = "out", .call = t,
                          .step = t, .cfg_branch = -1, .timestep = NAN, .seq = t,
                          .dtype = PROBE_DTYPE_FLOAT64, .rank = 2, .shape = shape};
        cr_assert_eq(probe_writer_put(w, &r, v[t], SN * sizeof(double)), PROBE_OK, "%s",
                     probe_last_error());
    }
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    return keep[k];
}

/* c = r + sigma * N(seed), plus `bias` on every element of channel SBIAS_CH. */
static void feature(const double *r, uint64_t seed, double sigma, double bias, double *c)
{
    gaussian(seed, c, SN);
    for (size_t i = 0; i < SN; i++)
        c[i] = r[i] + sigma * c[i] + (i % SCH == SBIAS_CH ? bias : 0.0);
}

/* docs/metrics.md "Systematic difference": |z_k| of every channel,
 * z_k = mu_k / (s_k / sqrt(n_k)), s_k the sample standard deviation of d = c - r. */
static void channel_z_each(const double *r, const double *c, double *z)
{
    for (int k = 0; k < SCH; k++) {
        double mu = 0, ss = 0;
        for (int i = 0; i < SROWS; i++)
            mu += c[i * SCH + k] - r[i * SCH + k];
        mu /= SROWS;
        for (int i = 0; i < SROWS; i++) {
            double e = c[i * SCH + k] - r[i * SCH + k] - mu;
            ss += e * e;
        }
        z[k] = fabs(mu / (sqrt(ss / (SROWS - 1)) / sqrt((double)SROWS)));
    }
}

/* z_k with its sign. */
static void signed_z(const double *r, const double *c, double *z)
{
    for (int k = 0; k < SCH; k++) {
        double mu = 0;
        for (int i = 0; i < SROWS; i++)
            mu += c[i * SCH + k] - r[i * SCH + k];
        double zk[SCH];
        channel_z_each(r, c, zk);
        z[k] = mu < 0 ? -zk[k] : zk[k];
    }
}

/* The largest |z_k| over the channels, and its channel. */
static double channel_z_abs(const double *r, const double *c, int *argmax)
{
    double worst = 0, zk[SCH];
    channel_z_each(r, c, zk);
    for (int k = 0; k < SCH; k++) {
        double z = zk[k];
        if (z > worst) {
            worst = z;
            *argmax = k;
        }
    }
    return worst;
}

/* |alpha / se(alpha)|, alpha = <d, r> / <r, r>, se = sqrt(sum r^2 (d - alpha r)^2) / <r, r>. */
static double gain_z_signed(const double *r, const double *c)
{
    double dr = 0, rr = 0, s = 0;
    for (size_t i = 0; i < SN; i++) {
        dr += (c[i] - r[i]) * r[i];
        rr += r[i] * r[i];
    }
    double alpha = dr / rr;
    for (size_t i = 0; i < SN; i++) {
        double e = c[i] - r[i] - alpha * r[i];
        s += r[i] * r[i] * e * e;
    }
    return alpha / (sqrt(s) / rr);
}

#define REL_EQ(a, b, what) \
    cr_assert(fabs((a) - (b)) <= 1e-9 * fabs(b), "%s: %.17g, expected %.17g", what, a, b)

/* The feature adds a bias of 5e-4 to channel 3 of /dit.step/0000/out (n_k = 256,
 * noise sigma 1e-3 everywhere: z about 8); /dit.step/0001/out is noise only. */
Test(calibrate, structure_per_path)
{
    static double r0[SN], r1[SN], c0[3][SN], c1[3][SN];
    const double sigma = 1e-3, bias = 5e-4, h = 2.0;
    gaussian(1, r0, SN);
    gaussian(2, r1, SN);
    const char *refs[3], *cands[3];
    double worst_c[2] = {0, 0}, worst_g[2] = {0, 0}, worst_k[2][SCH] = {{0}}, zk[SCH];
    double zall[2][3][SCH]; /* z_k (signed) per path, pair and channel */
    double gall[2][3];      /* gain_z (signed) per path and pair */
    char name[32];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "sr%d.h5", i);
        refs[i] = write_pair(name, r0, r1); /* repeats: the floor pairs are identical */
        feature(r0, 10 + (uint64_t)i, sigma, bias, c0[i]);
        feature(r1, 20 + (uint64_t)i, sigma, 0.0, c1[i]);
        snprintf(name, sizeof name, "sc%d.h5", i);
        cands[i] = write_pair(name, c0[i], c1[i]);
        int k;
        worst_c[0] = fmax(worst_c[0], channel_z_abs(r0, c0[i], &k));
        worst_c[1] = fmax(worst_c[1], channel_z_abs(r1, c1[i], &k));
        gall[0][i] = gain_z_signed(r0, c0[i]);
        gall[1][i] = gain_z_signed(r1, c1[i]);
        worst_g[0] = fmax(worst_g[0], fabs(gall[0][i]));
        worst_g[1] = fmax(worst_g[1], fabs(gall[1][i]));
        for (int p = 0; p < 2; p++) {
            channel_z_each(p ? r1 : r0, p ? c1[i] : c0[i], zk);
            for (int k = 0; k < SCH; k++)
                worst_k[p][k] = fmax(worst_k[p][k], fabs(zk[k]));
            signed_z(p ? r1 : r0, p ? c1[i] : c0[i], zall[p][i]);
        }
    }
    cr_assert(worst_c[0] > 6 && worst_c[1] < 5, "inputs as described: %g %g", worst_c[0],
              worst_c[1]);
    probe_calibrate_opts o = opts_of(refs, 3, cands, 3);
    o.headroom = h;
    probe_calibrate_result *r = NULL;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());

    cr_assert_eq(r->npaths, 2);
    /* spreads of z_k (per path; pooled over both paths, the component's) and of gain_z
       (pooled over the component's paths), about the means over the 3 pairs */
    double ssp[2] = {0, 0}, gss = 0, gmean[2];
    for (int p = 0; p < 2; p++) {
        gmean[p] = (gall[p][0] + gall[p][1] + gall[p][2]) / 3;
        for (int i = 0; i < 3; i++)
            gss += (gall[p][i] - gmean[p]) * (gall[p][i] - gmean[p]);
        for (int k = 0; k < SCH; k++) {
            double m = (zall[p][0][k] + zall[p][1][k] + zall[p][2][k]) / 3;
            for (int i = 0; i < 3; i++)
                ssp[p] += (zall[p][i][k] - m) * (zall[p][i][k] - m);
        }
    }
    double comp_spread = sqrt((ssp[0] + ssp[1]) / (2 * SCH * 2)), gspread = sqrt(gss / (2 * 2));
    for (int p = 0; p < 2; p++) {
        const probe_calibrate_path *e = &r->paths[p];
        cr_assert_str_eq(e->path, p ? "/dit.step/0001/out" : "/dit.step/0000/out");
        cr_assert_str_eq(e->component, "dit.step");
        cr_assert_eq(e->pairs, 3);
        cr_assert_eq(e->floor_pairs, 2);
        cr_assert_eq(e->channel_z.n, 3);
        REL_EQ(e->channel_z.worst, worst_c[p], "worst |channel z|");
        REL_EQ(e->channel_z_max, h * worst_c[p], "channel_z_max");
        REL_EQ(e->gain_z.worst, worst_g[p], "worst |gain_z|");
        REL_EQ(e->gain_z_spread, gspread, "pooled gain spread");
        REL_EQ(e->gain_z_max, fmax(h * worst_g[p], fabs(gmean[p]) + probe_systematic_limit(1, 1e-6) *
                                                    gspread * sqrt(4.0 / 3)), "gain_z_max");
        cr_assert_eq(e->floor_channel_z.worst, 0.0, "identical floor pairs: z 0");
        cr_assert_eq(e->floor_gain_z.worst, 0.0);
        cr_assert_eq(e->nchannels, SCH);
        /* the prediction band: pooled spread of z_k about each channel's mean (3 pairs) */
        double mean[SCH];
        for (int k = 0; k < SCH; k++)
            mean[k] = (zall[p][0][k] + zall[p][1][k] + zall[p][2][k]) / 3;
        /* the path's own, or the component's where larger */
        double spread = fmax(sqrt(ssp[p] / (SCH * 2)), comp_spread);
        double tk = probe_systematic_limit(SCH, 1e-6);
        REL_EQ(e->channel_z_spread, spread, "pooled spread");
        REL_EQ(e->channel_t, tk, "t_K");
        for (int k = 0; k < SCH; k++) {
            double want = fmax(h * worst_k[p][k], fabs(mean[k]) + tk * spread * sqrt(4.0 / 3));
            /* no threshold lies within 1e-9 of a whole number for these inputs */
            cr_assert_eq(e->channel_z_max_by_channel[k], ceil(want),
                         "path %d channel %d: %g vs ceil(%g)", p, k,
                         e->channel_z_max_by_channel[k], want);
        }
    }
    const probe_calibrate_component *c = &r->components[0];
    REL_EQ(c->channel_z_max, h * fmax(worst_c[0], worst_c[1]), "component channel_z_max");
    REL_EQ(c->gain_z_max, h * fmax(worst_g[0], worst_g[1]), "component gain_z_max");
    cr_assert_eq(c->feature.channel_z.n, 6);
    /* three runs of one feature (same bias, fresh noise): each passes T2 calibrated on
       the other two (z about 8 against at least 2 x the worst of two) */
    cr_assert_eq(r->nheld_out, 3);
    for (int i = 0; i < 3; i++)
        cr_assert(r->held_out[i].pass, "pair %d: %s: %s", i, r->held_out[i].first_failure,
                  r->held_out[i].reason);

    const char *out = tmp("scal.json");
    write_json(r, out);
    probe_calibration *cal = NULL;
    cr_assert_eq(probe_calibration_load(out, NULL, &cal), PROBE_OK, "%s", probe_last_error());
    probe_gate g;
    cr_assert_eq(probe_calibration_gate(cal, "dit.step", "/dit.step/0000/out", &g), PROBE_OK);
    cr_assert_eq(g.channel_z_max, r->paths[0].channel_z_max, "the path's own, read back exactly");
    cr_assert_eq(g.channel_z_count, SCH);
    for (int k = 0; k < SCH; k++)
        cr_assert_eq(g.channel_z_max_by_channel[k], r->paths[0].channel_z_max_by_channel[k]);
    cr_assert_eq(g.gain_z_max, r->paths[0].gain_z_max);
    cr_assert_eq(g.headroom, h);
    cr_assert_eq(probe_calibration_gate(cal, "dit.step", "/dit.step/0001/out", &g), PROBE_OK);
    cr_assert_eq(g.channel_z_max, r->paths[1].channel_z_max);
    cr_assert_eq(probe_calibration_gate(cal, "dit.step", "/dit.step/0007/out", &g), PROBE_OK);
    cr_assert_eq(g.channel_z_max, c->channel_z_max, "no path entry: the component's");
    double limit = r->paths[0].channel_z_max;
    double limit3 = r->paths[0].channel_z_max_by_channel[SBIAS_CH];
    double rel_l2_max = c->rel_l2_max;

    probe_compare_opts co;
    memset(&co, 0, sizeof co);
    cr_assert_eq(probe_gate_parse("T2", &co.gate), PROBE_OK);
    co.calibration = cal;
    static double cb[SN], cn[SN];
    int k = -1;

    /* a bug: three times the feature's bias in that channel */
    feature(r0, 40, sigma, 3 * bias, cb);
    double zb = channel_z_abs(r0, cb, &k);
    cr_assert(zb > limit && k == SBIAS_CH, "the bug's z %g is above %g", zb, limit);
    cr_assert(limit3 <= ceil(limit), "channel 3 is the feature's worst: %g, %g", limit3, limit);
    feature(r1, 41, sigma, 0.0, cn);
    probe_compare_result *res = NULL;
    cr_assert_eq(probe_compare_files(refs[0], write_pair("sbug.h5", cb, cn), &co, &res), PROBE_OK,
                 "%s", probe_last_error());
    cr_assert_eq(res->ntensors, 2);
    const probe_tensor_result *t = &res->tensors[0];
    cr_assert_str_eq(t->ref.path, "/dit.step/0000/out");
    cr_assert(t->m.rel_l2 <= rel_l2_max, "rel_l2 %g hides the bug (max %g)", t->m.rel_l2,
              rel_l2_max);
    cr_assert(!t->verdict.pass && !t->gate_verdict.pass && !res->pass);
    cr_assert_eq(t->verdict.nreasons, 1, "only the structure: %s", t->verdict.reasons[0]);
    char want[256], vs[32], ls[32];
    snprintf(vs, sizeof vs, "%.4g", zb);
    snprintf(ls, sizeof ls, "%.4g", limit3);
    snprintf(want, sizeof want, "systematic shift of channel 3: |z| %s > %s (the feature's own "
             "in that channel, calibrated with headroom 2)", vs, ls);
    cr_assert_str_eq(t->verdict.reasons[0], want);
    cr_assert(res->tensors[1].verdict.pass, "%s", res->tensors[1].verdict.reasons[0]);
    probe_compare_result_free(res);

    /* a fresh run of the feature alone */
    feature(r0, 50, sigma, bias, cb);
    double zf = channel_z_abs(r0, cb, &k);
    cr_assert(zf <= limit, "the feature's z %g is within %g", zf, limit);
    cr_assert_eq(probe_compare_files(refs[0], write_pair("sfresh.h5", cb, cn), &co, &res),
                 PROBE_OK, "%s", probe_last_error());
    for (size_t i = 0; i < res->ntensors; i++)
        cr_assert(res->tensors[i].verdict.pass, "%s: %s", res->tensors[i].ref.path,
                  res->tensors[i].verdict.reasons[0]);
    cr_assert(res->pass);
    probe_compare_result_free(res);

    /* a bug in another channel, smaller than the feature's own bias in channel 3: below
       the largest |z| the feature reaches (channel_z_max), above channel 5's own */
    feature(r0, 60, sigma, bias, cb);
    for (size_t i = 0; i < SN; i++)
        cb[i] += i % SCH == 5 ? 0.75e-3 : 0.0;
    channel_z_each(r0, cb, zk);
    double l5 = r->paths[0].channel_z_max_by_channel[5];
    cr_assert(zk[5] < limit && zk[5] > l5 && zk[5] > 5.33, "z_5 %g: under %g, over %g", zk[5],
              limit, l5);
    cr_assert_eq(probe_compare_files(refs[0], write_pair("sother.h5", cb, cn), &co, &res),
                 PROBE_OK, "%s", probe_last_error());
    t = &res->tensors[0];
    cr_assert(!t->verdict.pass && t->verdict.nreasons == 1);
    cr_assert(strstr(t->verdict.reasons[0], "systematic shift of channel 5: |z| ") ==
              t->verdict.reasons[0], "%s", t->verdict.reasons[0]);
    cr_assert(res->tensors[1].verdict.pass, "%s", res->tensors[1].verdict.reasons[0]);
    probe_compare_result_free(res);
    probe_calibrate_result_free(r);
    probe_calibration_free(cal);
}

/* Records (probe-record JSON lines) instead of capture files: worst x headroom per
 * component, floor records for the T1 check, other features left out, the
 * file read back by probe_calibration_load. */
Test(calibrate, records)
{
    const char *path = tmp("r.jsonl");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"format\":\"probe-record\",\"version\":1,\"component\":\"dit.step\",\"feature\":\"fp8\","
          "\"kind\":\"feature\",\"arch\":\"sm_90\",\"stats\":{\"rel_l2\":0.02,\"cosine\":0.999,"
          "\"max_abs\":0.5,\"gain_z\":-4}}\n"
          "{\"format\":\"probe-record\",\"version\":1,\"component\":\"dit.step\",\"feature\":\"fp8\","
          "\"kind\":\"feature\",\"arch\":\"sm_100\",\"stats\":{\"rel_l2\":0.04,\"cosine\":0.9995,"
          "\"max_abs\":0.25}}\n"
          "{\"format\":\"probe-record\",\"version\":1,\"component\":\"dit.step\",\"feature\":\"bf16\","
          "\"kind\":\"feature\",\"stats\":{\"rel_l2\":0.9,\"cosine\":0.1,\"max_abs\":9}}\n"
          "{\"format\":\"probe-record\",\"version\":1,\"component\":\"dit.step\",\"feature\":\"fp8\","
          "\"kind\":\"floor\",\"stats\":{\"rel_l2\":1e-5,\"cosine\":1,\"max_abs\":1e-5}}\n",
          f);
    cr_assert_eq(fclose(f), 0);
    const char *recs[] = {path};
    const char *known[] = {"text_encoder", "dit.step", NULL};
    probe_calibrate_opts o = {.feature = "fp8", .headroom = 2, .atol = 1e-3, .rtol = 1e-3,
                              .records = recs, .nrecords = 1, .known_components = known};
    probe_calibrate_result *r = NULL;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_OK, "%s", probe_last_error());
    cr_assert(r->from_records && r->npairs == 2 && r->nfloor_pairs == 1 && r->nrecords_other == 1);
    cr_assert_eq(r->ncomponents, 1);
    const probe_calibrate_component *c = &r->components[0];
    cr_assert_str_eq(c->name, "dit.step");
    cr_assert_float_eq(c->rel_l2_max, 0.08, 1e-15);
    cr_assert_float_eq(c->cosine_min, 1 - 2 * (1 - 0.999), 1e-15);
    cr_assert_float_eq(c->max_abs_max, 1.0, 1e-15);
    cr_assert_float_eq(c->gain_z_max, 8.0, 1e-15);
    cr_assert(isnan(c->p99_abs_max) && isnan(c->channel_z_max), "not recorded: not written");
    cr_assert(c->t1_above_floor && r->t1_above_floor);
    cr_assert(r->narchs == 2 && !strcmp(r->archs[0], "sm_90") && !strcmp(r->archs[1], "sm_100"));
    const char *out = tmp("cal.json");
    FILE *w = fopen(out, "w");
    cr_assert_eq(probe_calibrate_write_json(r, w), PROBE_OK);
    cr_assert_eq(fclose(w), 0);
    probe_calibrate_result_free(r);
    probe_calibration *cal = NULL;
    cr_assert_eq(probe_calibration_load(out, known, &cal), PROBE_OK, "%s", probe_last_error());
    probe_gate g;
    cr_assert_eq(probe_calibration_gate(cal, "dit.step", NULL, &g), PROBE_OK);
    cr_assert_float_eq(g.rel_l2_max, 0.08, 1e-15);
    probe_calibration_free(cal);

    /* mixed with capture files, an unknown component, a bad line */
    o.references = recs;
    o.nreferences = 1;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "cannot be mixed"));
    o.references = NULL;
    o.nreferences = 0;
    const char *only_te[] = {"text_encoder", NULL};
    o.known_components = only_te;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "r.jsonl:1: unknown component 'dit.step'"), "%s",
              probe_last_error());
    f = fopen(path, "a");
    fputs("[1]\n", f);
    fclose(f);
    o.known_components = known;
    cr_assert_eq(probe_calibrate_run(&o, &r), PROBE_EFORMAT);
    cr_assert(strstr(probe_last_error(), "r.jsonl:5: not a JSON object"), "%s", probe_last_error());
    cr_assert_null(r);
    cleanup();
}
