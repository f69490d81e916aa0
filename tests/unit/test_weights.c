/* Unit tests for probe_weights_check (probe/compare/weight_check.c): the verdict on two
 * runs' weight fingerprints (docs/gemm.md "Weights"). Manifests are written
 * here by hand; expected verdicts and lines follow the documented table. */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../../probe/compare/weight_check.h"

/* A manifest with component C fingerprinted: operands k 0 [4, 2] and k 1
 * [3, 4] of dtype dt with hashes h0, h1 and combined hash hc (JSON null
 * when hc is NULL). */
static void manifest(char *buf, size_t cap, const char *c, const char *dt, const char *h0,
                     const char *h1, const char *hc)
{
    char hcq[40];
    snprintf(hcq, sizeof hcq, hc ? "\"%s\"" : "null", hc);
    snprintf(buf, cap,
             "{\"probe_version\":\"t\",\"weights\":{\"overflow\":0,\"components\":{\"%s\":{"
             "\"gemms\":2,\"bytes\":40,\"complete\":true,\"dtypes\":[\"%s\"],\"xxh64\":%s,"
             "\"operands\":[{\"k\":0,\"shape\":[4,2],\"dtype\":\"%s\",\"xxh64\":\"%s\"},"
             "{\"k\":1,\"shape\":[3,4],\"dtype\":\"%s\",\"xxh64\":\"%s\"}]}}}}",
             c, dt, hcq, dt, h0, dt, h1);
}

static json_t *verdict_json(const probe_weights_verdict *v)
{
    json_t *j = json_loads(v->json, 0, NULL);
    cr_assert_not_null(j, "verdict JSON parses: %s", v->json);
    return j;
}

Test(weights, same_hashes)
{
    char a[1024], b[1024];
    manifest(a, sizeof a, "dit.step", "bfloat16", "00000000000000a0", "00000000000000a1", "00000000000000aa");
    manifest(b, sizeof b, "dit.step", "bfloat16", "00000000000000a0", "00000000000000a1", "00000000000000aa");
    probe_weights_verdict v;
    cr_assert_eq(probe_weights_check(a, b, &v), PROBE_OK);
    cr_assert_str_eq(v.status, "same");
    cr_assert_str_eq(v.line, "weights: same in both runs (2 GEMM operands, 40 bytes)");
    json_t *j = verdict_json(&v);
    cr_assert_str_eq(json_string_value(json_object_get(j, "status")), "same");
    json_t *c = json_object_get(json_object_get(j, "components"), "dit.step");
    cr_assert_str_eq(json_string_value(json_object_get(c, "status")), "same");
    cr_assert_eq(json_integer_value(json_object_get(c, "gemms")), 2);
    json_decref(j);
    probe_weights_verdict_free(&v);
}

Test(weights, different_bytes_names_first_gemm)
{
    char a[1024], b[1024];
    manifest(a, sizeof a, "dit.step", "bfloat16", "00000000000000a0", "00000000000000a1", "00000000000000aa");
    manifest(b, sizeof b, "dit.step", "bfloat16", "00000000000000a0", "00000000000000ff", "00000000000000bb");
    probe_weights_verdict v;
    cr_assert_eq(probe_weights_check(a, b, &v), PROBE_OK);
    cr_assert_str_eq(v.status, "differ");
    cr_assert_str_eq(v.line, "the runs loaded different weights: component dit.step, first differing "
                             "GEMM k=1 (weight [3, 4] bfloat16)");
    json_t *j = verdict_json(&v);
    json_t *c = json_object_get(json_object_get(j, "components"), "dit.step");
    cr_assert_eq(json_integer_value(json_object_get(c, "first_differing_gemm")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(c, "reference_xxh64")), "00000000000000aa");
    cr_assert_str_eq(json_string_value(json_object_get(c, "candidate_xxh64")), "00000000000000bb");
    json_decref(j);
    probe_weights_verdict_free(&v);
}

Test(weights, different_dtypes_is_format_differs)
{
    char a[1024], b[1024];
    manifest(a, sizeof a, "dit.step", "bfloat16", "00000000000000a0", "00000000000000a1", "00000000000000aa");
    manifest(b, sizeof b, "dit.step", "float8_e4m3fn", "0000000000000010", "0000000000000011", "00000000000000cc");
    probe_weights_verdict v;
    cr_assert_eq(probe_weights_check(a, b, &v), PROBE_OK);
    cr_assert_str_eq(v.status, "format_differs");
    cr_assert(strstr(v.line, "dit.step (and 0 other components) has GEMM weights of different shapes") != NULL,
              "%s", v.line);
    probe_weights_verdict_free(&v);
}

Test(weights, missing_incomplete_malformed_are_unknown)
{
    char a[1024], b[1024];
    manifest(a, sizeof a, "dit.step", "bfloat16", "00000000000000a0", "00000000000000a1", "00000000000000aa");
    probe_weights_verdict v;
    /* neither run: unknown, nothing to say */
    cr_assert_eq(probe_weights_check(NULL, NULL, &v), PROBE_OK);
    cr_assert_str_eq(v.status, "unknown");
    cr_assert_str_eq(v.line, "");
    probe_weights_verdict_free(&v);
    /* candidate without fingerprints */
    cr_assert_eq(probe_weights_check(a, "{\"probe_version\":\"t\"}", &v), PROBE_OK);
    cr_assert_str_eq(v.status, "unknown");
    cr_assert_str_eq(v.line, "weights: unknown (the candidate run has no weight fingerprints)");
    probe_weights_verdict_free(&v);
    /* not JSON at all */
    cr_assert_eq(probe_weights_check("not json", a, &v), PROBE_OK);
    cr_assert_str_eq(v.status, "unknown");
    cr_assert_str_eq(v.line, "weights: unknown (the reference run has no weight fingerprints)");
    probe_weights_verdict_free(&v);
    /* a hash that did not complete */
    manifest(b, sizeof b, "dit.step", "bfloat16", "00000000000000a0", "00000000000000a1", NULL);
    cr_assert_eq(probe_weights_check(a, b, &v), PROBE_OK);
    cr_assert_str_eq(v.status, "unknown");
    probe_weights_verdict_free(&v);
    /* the same component fingerprinted in one run only */
    manifest(b, sizeof b, "vae.decode", "bfloat16", "00000000000000a0", "00000000000000a1", "00000000000000aa");
    cr_assert_eq(probe_weights_check(a, b, &v), PROBE_OK);
    cr_assert_str_eq(v.status, "unknown");
    probe_weights_verdict_free(&v);
    /* malformed operands (k is a string, weights not an object) */
    const char *bad[] = {
        "{\"weights\":{\"components\":{\"dit.step\":{\"xxh64\":\"1\",\"operands\":[{\"k\":\"0\","
        "\"shape\":[4,2],\"dtype\":\"bfloat16\",\"xxh64\":\"2\"}]}}}}",
        "{\"weights\":[1,2]}", "{\"weights\":{\"components\":7}}", "[]", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        cr_assert_eq(probe_weights_check(a, bad[i], &v), PROBE_OK);
        cr_assert_str_eq(v.status, "unknown", "malformed %zu", i);
        probe_weights_verdict_free(&v);
    }
}

Test(weights, differ_wins_over_same_in_other_components)
{
    /* two components: one the same, one different -> differ */
    const char *a = "{\"weights\":{\"components\":{"
                    "\"te\":{\"xxh64\":\"01\",\"bytes\":8,\"operands\":[{\"k\":0,\"shape\":[2,2],\"dtype\":\"float16\",\"xxh64\":\"0a\"}]},"
                    "\"dit.step\":{\"xxh64\":\"02\",\"bytes\":8,\"operands\":[{\"k\":0,\"shape\":[2,2],\"dtype\":\"float16\",\"xxh64\":\"0b\"}]}}}}";
    const char *b = "{\"weights\":{\"components\":{"
                    "\"te\":{\"xxh64\":\"01\",\"bytes\":8,\"operands\":[{\"k\":0,\"shape\":[2,2],\"dtype\":\"float16\",\"xxh64\":\"0a\"}]},"
                    "\"dit.step\":{\"xxh64\":\"03\",\"bytes\":8,\"operands\":[{\"k\":0,\"shape\":[2,2],\"dtype\":\"float16\",\"xxh64\":\"0c\"}]}}}}";
    probe_weights_verdict v;
    cr_assert_eq(probe_weights_check(a, b, &v), PROBE_OK);
    cr_assert_str_eq(v.status, "differ");
    cr_assert(strstr(v.line, "component dit.step, first differing GEMM k=0 (weight [2, 2] float16)") != NULL,
              "%s", v.line);
    json_t *j = verdict_json(&v);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(j, "components"), "te"),
                                                       "status")), "same");
    json_decref(j);
    probe_weights_verdict_free(&v);
}
