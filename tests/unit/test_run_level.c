/* test_run_level.c - the compare engine's run-level verdicts (probe/compare/compare.c,
 * probe/compare/experiment.c) on files written by probe's writer: "feature not
 * active" only for complete captures with nothing missing, incomplete
 * captures from the manifests' run_end (reason text, counts, rank of
 * reasons), an isolated run that is not a complete replay (no isolated
 * metrics), isolated inputs converted by --replay --convert (the largest
 * rel_l2, computed here independently), and root inputs converted by
 * --inject --convert (same only for the exact conversion). */
#include <criterion/criterion.h>

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "probe/capture.h"
#include "probe/compare.h"
#include "probe/dtype.h"
#include "probe/gate.h"

#define TMPDIR_PREFIX "probe-runlevel"
#include "tmpdir_fixture.h"

TestSuite(run_level, .init = setup, .fini = teardown, .timeout = 60);

#define N 24

typedef struct {
    const char *path;
    probe_dtype dtype;
    const void *data;
} tensor;

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

/* A capture of n tensors of N elements (shape [4, 6]) with manifest m. */
static void write_file(const char *name, const tensor *t, int n, const char *m)
{
    char p[600];
    path_of(p, sizeof p, name);
    probe_writer *w;
    cr_assert_eq(probe_writer_open(p, m, &w), PROBE_OK, "%s", probe_last_error());
    int64_t shape[2] = {4, 6};
    for (int i = 0; i < n; i++) {
        const char *slot = strrchr(t[i].path, '/') + 1;
        probe_record rec = {.path = t[i].path, .slot = slot, .call = 0, .step = -1, .cfg_branch = -1,
                            .seq = (uint64_t)i, .dtype = t[i].dtype, .rank = 2, .shape = shape};
        cr_assert_eq(probe_writer_put(w, &rec, t[i].data, N * probe_dtype_size(t[i].dtype)),
                     PROBE_OK, "%s", probe_last_error());
    }
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
}

static probe_compare_result *compare(const char *ref, const char *cand, const char *iso)
{
    char a[600], b[600], c[600];
    path_of(a, sizeof a, ref);
    path_of(b, sizeof b, cand);
    probe_compare_opts o;
    memset(&o, 0, sizeof o);
    cr_assert_eq(probe_gate_parse("T1", &o.gate), PROBE_OK);
    o.threads = 1;
    o.check_roots = 1;
    if (iso) {
        path_of(c, sizeof c, iso);
        o.isolated = c;
    }
    probe_compare_result *r = NULL;
    cr_assert_eq(probe_compare_files(a, b, &o, &r), PROBE_OK, "%s", probe_last_error());
    return r;
}

static int has_reason(const probe_compare_result *r, const char *text)
{
    for (int i = 0; i < r->nreasons; i++)
        if (strcmp(r->reasons[i], text) == 0)
            return 1;
    return 0;
}

static float A[N], B[N], C[N];

static void fill(void)
{
    for (int i = 0; i < N; i++) {
        A[i] = (float)i * 0.37f - 3.0f;
        B[i] = (float)(i * i) * 0.011f + 0.5f;
        C[i] = 1.0f / (float)(i + 1);
    }
}

#define COMPLETE "{\"run_end\":{\"exit_status\":0,\"signal\":null,\"capture\":\"closed\"," \
                 "\"capture_complete\":true,\"end_time\":\"2026-01-01T00:00:00Z\"}}"
#define KILLED "{\"run_end\":{\"exit_status\":null,\"signal\":\"SIGSEGV\",\"capture\":\"journal\"," \
               "\"capture_complete\":false,\"end_time\":\"2026-01-01T00:00:00Z\"}}"

Test(run_level, identical_but_missing_is_not_feature_not_active)
{
    fill();
    tensor r[3] = {{"/a/0000/out", PROBE_DTYPE_FLOAT32, A}, {"/b/0000/out", PROBE_DTYPE_FLOAT32, B},
                   {"/c/0000/out", PROBE_DTYPE_FLOAT32, C}};
    write_file("ref.h5", r, 3, NULL);
    write_file("cand.h5", r, 2, NULL);
    probe_compare_result *x = compare("ref.h5", "cand.h5", NULL);
    cr_assert_eq(x->pass, 0);
    cr_assert_eq(x->ntensors, 2);
    cr_assert_eq(x->nmissing_cand, 1);
    cr_assert_eq(x->feature_active, 0);
    cr_assert_eq(x->feature_not_active, 0, "identical compared tensors with one missing");
    cr_assert_eq(x->nreasons, 0, "%s", x->reasons[0]);
    cr_assert_str_eq(x->first_failure_path, "/c/0000/out");
    cr_assert_eq(x->incomplete_candidate, 0);
    cr_assert_null(x->run_end_candidate);
    probe_compare_result_free(x);
    /* missing in the reference instead */
    x = compare("cand.h5", "ref.h5", NULL);
    cr_assert_eq(x->nmissing_ref, 1);
    cr_assert_eq(x->feature_not_active, 0);
    probe_compare_result_free(x);
    /* complete and identical: still feature not active */
    write_file("ref2.h5", r, 3, COMPLETE);
    write_file("cand2.h5", r, 3, COMPLETE);
    x = compare("ref2.h5", "cand2.h5", NULL);
    cr_assert_eq(x->feature_not_active, 1);
    cr_assert_eq(x->incomplete_reference + x->incomplete_candidate, 0);
    cr_assert(has_reason(x, "feature not active: the candidate is identical to the reference in "
                            "every compared tensor"));
    cr_assert_not_null(x->run_end_reference);
    cr_assert_not_null(strstr(x->run_end_reference, "\"capture_complete\":true"), "%s",
                       x->run_end_reference);
    probe_compare_result_free(x);
}

Test(run_level, incomplete_candidate_names_side_how_and_count)
{
    fill();
    tensor r[3] = {{"/a/0000/out", PROBE_DTYPE_FLOAT32, A}, {"/b/0000/out", PROBE_DTYPE_FLOAT32, B},
                   {"/c/0000/out", PROBE_DTYPE_FLOAT32, C}};
    write_file("ref.h5", r, 3, COMPLETE);
    write_file("cand.h5", r, 1, KILLED);
    probe_compare_result *x = compare("ref.h5", "cand.h5", NULL);
    cr_assert_eq(x->pass, 0);
    cr_assert_eq(x->incomplete_candidate, 1);
    cr_assert_eq(x->incomplete_reference, 0);
    cr_assert_eq(x->feature_not_active, 0);
    cr_assert_eq(x->nreasons, 1);
    cr_assert_str_eq(x->reasons[0], "incomplete capture: the candidate run did not complete (killed by "
                                    "signal SIGSEGV; its writer did not close the capture): it lacks 2 "
                                    "of the reference's 3 tensors");
    cr_assert_not_null(strstr(x->run_end_candidate, "\"signal\":\"SIGSEGV\""), "%s", x->run_end_candidate);
    probe_compare_result_free(x);
    /* the same capture as the reference, exit status 3 and nothing missing */
    write_file("exit3.h5", r, 3, "{\"run_end\":{\"exit_status\":3,\"signal\":null,\"capture\":\"closed\","
                                  "\"capture_complete\":false}}");
    x = compare("exit3.h5", "ref.h5", NULL);
    cr_assert_eq(x->incomplete_reference, 1);
    cr_assert_str_eq(x->reasons[0], "incomplete capture: the reference run did not complete (exit "
                                    "status 3): it lacks 0 of the candidate's 3 tensors");
    cr_assert_eq(x->feature_not_active, 0);
    probe_compare_result_free(x);
    /* both incomplete: reference first */
    write_file("never.h5", r, 0, "{\"run_end\":{\"exit_status\":null,\"signal\":\"SIGKILL\","
                                 "\"capture\":\"not written\",\"capture_complete\":false}}");
    x = compare("exit3.h5", "never.h5", NULL);
    cr_assert_eq(x->nreasons, 2);
    cr_assert(strstr(x->reasons[0], "the reference run did not complete (exit status 3)") != NULL);
    cr_assert_str_eq(x->reasons[1], "incomplete capture: the candidate run did not complete (killed by "
                                    "signal SIGKILL; no process of the run wrote the capture): it lacks 3 "
                                    "of the reference's 3 tensors");
    cr_assert_eq(x->nothing_compared, 0);
    probe_compare_result_free(x);
}

/* The reference's probe.hash of path (16 hex digits). */
static void hash_of(const char *name, const char *path, char out[17])
{
    char p[600];
    path_of(p, sizeof p, name);
    probe_file *f;
    size_t i;
    cr_assert_eq(probe_file_open(p, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_find(f, path, &i), PROBE_OK);
    snprintf(out, 17, "%s", probe_file_tensor(f, i)->hash);
    probe_file_close(f);
}

static double rel_l2_f32_bf16(const float *r, const uint16_t *c)
{
    double d = 0, n = 0;
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)c[i] << 16;
        float cf;
        memcpy(&cf, &u, 4);
        d += ((double)cf - r[i]) * ((double)cf - r[i]);
        n += (double)r[i] * r[i];
    }
    return sqrt(d) / sqrt(n);
}

Test(run_level, isolation_needs_a_complete_replay_and_marks_converted_inputs)
{
    fill();
    uint16_t xb[N], ob[N];
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT32, A, PROBE_DTYPE_BFLOAT16, xb, N), PROBE_OK);
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT32, B, PROBE_DTYPE_BFLOAT16, ob, N), PROBE_OK);
    tensor r[2] = {{"/dit.step/0000/in.x", PROBE_DTYPE_FLOAT32, A},
                   {"/dit.step/0000/out", PROBE_DTYPE_FLOAT32, B}};
    write_file("ref.h5", r, 2, NULL);
    tensor c[2] = {{"/dit.step/0000/in.x", PROBE_DTYPE_FLOAT32, A},
                   {"/dit.step/0000/out", PROBE_DTYPE_FLOAT32, C}};
    write_file("cand.h5", c, 2, NULL);
    char h[17], m[1024];
    hash_of("ref.h5", "/dit.step/0000/in.x", h);
    tensor iso[2] = {{"/dit.step/0000/in.x", PROBE_DTYPE_BFLOAT16, xb},
                     {"/dit.step/0000/out", PROBE_DTYPE_BFLOAT16, ob}};
    snprintf(m, sizeof m, "{\"inject\":{\"status\":\"ok\",\"convert\":true,\"tensors\":[{\"path\":"
             "\"/dit.step/0000/in.x\",\"reference_hash\":\"%s\",\"converted_from\":\"float32\"}]}}", h);
    write_file("iso.h5", iso, 2, m);
    probe_compare_result *x = compare("ref.h5", "cand.h5", "iso.h5");
    cr_assert_eq(x->isolated_complete, 1);
    cr_assert_eq(x->nisolated, 2);
    const probe_tensor_result *o = &x->tensors[1];
    cr_assert_str_eq(o->ref.path, "/dit.step/0000/out");
    cr_assert_eq(o->has_isolated, 1);
    cr_assert_eq(o->isolated_inputs_compared, 1);
    cr_assert_eq(o->isolated_inputs_converted, 1);
    cr_assert_str_eq(o->isolated_inputs_worst, "in.x");
    double want = rel_l2_f32_bf16(A, xb);
    cr_assert(want > 0 && fabs(o->isolated_inputs_rel_l2 - want) <= 1e-12 * want, "%.17g vs %.17g",
              o->isolated_inputs_rel_l2, want);
    cr_assert_eq(x->tensors[0].isolated_inputs_converted, 0, "an input tensor carries no input marks");
    probe_compare_result_free(x);

    /* a replay whose injection failed: no isolated metrics at all */
    snprintf(m, sizeof m, "{\"inject\":{\"status\":\"failed\",\"error\":\"/dit.step/0000/in.x: dtype "
             "mismatch\",\"tensors\":[]}}");
    write_file("isofail.h5", iso, 2, m);
    x = compare("ref.h5", "cand.h5", "isofail.h5");
    cr_assert_eq(x->isolated_complete, 0);
    cr_assert_eq(x->nisolated, 0);
    for (size_t i = 0; i < x->ntensors; i++)
        cr_assert_eq(x->tensors[i].has_isolated, 0);
    char want_r[1400];
    snprintf(want_r, sizeof want_r, "isolated run %s/isofail.h5 is not a complete replay of the "
             "reference: /dit.step/0000/in.x: dtype mismatch", g_dir);
    cr_assert(has_reason(x, want_r), "%s", x->reasons[0]);
    probe_compare_result_free(x);

    /* a replay whose run did not complete, its injection record otherwise fine */
    snprintf(m, sizeof m, "{\"inject\":{\"status\":\"ok\",\"convert\":true,\"tensors\":[{\"path\":"
             "\"/dit.step/0000/in.x\",\"reference_hash\":\"%s\",\"converted_from\":\"float32\"}]},"
             "\"run_end\":{\"exit_status\":1,\"signal\":null,\"capture\":\"closed\","
             "\"capture_complete\":false}}", h);
    write_file("isoexit.h5", iso, 2, m);
    x = compare("ref.h5", "cand.h5", "isoexit.h5");
    cr_assert_eq(x->isolated_complete, 0);
    cr_assert_eq(x->nisolated, 0);
    snprintf(want_r, sizeof want_r, "isolated run %s/isoexit.h5 is not a complete replay of the "
             "reference: the run did not complete (exit status 1)", g_dir);
    cr_assert(has_reason(x, want_r), "%s", x->reasons[0]);
    cr_assert_not_null(x->run_end_isolated);
    probe_compare_result_free(x);
}

Test(run_level, converted_roots_are_the_same_experiment_only_when_exact)
{
    fill();
    uint16_t lb[N];
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT32, A, PROBE_DTYPE_BFLOAT16, lb, N), PROBE_OK);
    tensor r[1] = {{"/latents.init/0000/out", PROBE_DTYPE_FLOAT32, A}};
    write_file("ref.h5", r, 1, NULL);
    char h[17], m[1024];
    hash_of("ref.h5", "/latents.init/0000/out", h);
    snprintf(m, sizeof m, "{\"inject\":{\"status\":\"ok\",\"convert\":true,\"tensors\":[{\"path\":"
             "\"/latents.init/0000/out\",\"reference_hash\":\"%s\",\"converted_from\":\"float32\"}]}}", h);
    tensor c[1] = {{"/latents.init/0000/out", PROBE_DTYPE_BFLOAT16, lb}};
    write_file("cand.h5", c, 1, m);
    probe_compare_result *x = compare("ref.h5", "cand.h5", NULL);
    cr_assert_eq(x->same_experiment, 1);
    cr_assert_eq(x->nroots, 1);
    cr_assert_eq(x->roots[0].same, 1);
    cr_assert_eq(x->roots[0].converted, 1);
    cr_assert_str_eq(x->roots[0].why, "converted from the reference (float32 -> bfloat16)");
    probe_compare_result_free(x);
    /* one bit off */
    lb[7] ^= 1;
    write_file("off.h5", c, 1, m);
    x = compare("ref.h5", "off.h5", NULL);
    cr_assert_eq(x->same_experiment, 0);
    cr_assert_eq(x->roots[0].same, 0);
    cr_assert_eq(x->roots[0].converted, 0);
    cr_assert_str_eq(x->roots[0].why, "dtype float32 vs bfloat16 (injected with conversion, but the "
                                      "values are not the reference's converted to bfloat16)");
    cr_assert(has_reason(x, "not the same experiment: root input /latents.init/0000/out differs (dtype "
                            "float32 vs bfloat16 (injected with conversion, but the values are not the "
                            "reference's converted to bfloat16))"), "%s", x->reasons[0]);
    probe_compare_result_free(x);
    /* exact values, but the record is of another reference, or says no conversion */
    lb[7] ^= 1;
    write_file("other.h5", c, 1, "{\"inject\":{\"status\":\"ok\",\"convert\":true,\"tensors\":[{\"path\":"
                                 "\"/latents.init/0000/out\",\"reference_hash\":\"0000000000000000\","
                                 "\"converted_from\":\"float32\"}]}}");
    x = compare("ref.h5", "other.h5", NULL);
    cr_assert_eq(x->roots[0].same, 0);
    cr_assert_str_eq(x->roots[0].why, "dtype float32 vs bfloat16");
    probe_compare_result_free(x);
    write_file("plain.h5", c, 1, NULL);
    x = compare("ref.h5", "plain.h5", NULL);
    cr_assert_eq(x->roots[0].same, 0);
    cr_assert_str_eq(x->roots[0].why, "dtype float32 vs bfloat16");
    probe_compare_result_free(x);
}
