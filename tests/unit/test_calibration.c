/* test_calibration.c - T2 calibration files (probe/gate.h, docs/calibration.md).
 *
 * The valid fixture is tests/data/calibration/valid.json (found through
 * PROBE_SOURCE_DIR, set by tests/CMakeLists.txt); each bad file is written by
 * the test itself so the defect is visible next to the assertion.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "probe/gate.h"
#include "probe/calibration_file.h"

static const char *const KNOWN[] = {"text_encoder", "dit.step", "scheduler.step", "vae.encode",
                                    "vae.decode", NULL};

static char fixture[4096];
static char tmpdir[4096];

static const char *valid_path(void)
{
    const char *src = getenv("PROBE_SOURCE_DIR");
    if (src != NULL) {
        snprintf(fixture, sizeof fixture, "%s/tests/data/calibration/valid.json", src);
    } else { /* run by hand: the source tree this file was compiled from */
        snprintf(fixture, sizeof fixture, "%s", __FILE__);
        char *p = strstr(fixture, "tests/unit/test_calibration.c");
        cr_assert_not_null(p, "set PROBE_SOURCE_DIR");
        strcpy(p, "tests/data/calibration/valid.json");
    }
    return fixture;
}

/* Write `text` to a fresh file in a per-test temporary directory. */
static const char *write_tmp(const char *name, const char *text)
{
    if (tmpdir[0] == '\0') {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/probe-test-cal-XXXXXX", base ? base : "/tmp");
        cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp %s", tmpdir);
    }
    static char path[4200];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    return path;
}

static void cleanup_tmp(void)
{
    if (tmpdir[0] == '\0')
        return;
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
    tmpdir[0] = '\0';
}

TestSuite(calibration, .fini = cleanup_tmp);

static probe_calibration *load_ok(const char *path, const char *const *known)
{
    probe_calibration *c = NULL;
    cr_assert_eq(probe_calibration_load(path, known, &c), PROBE_OK, "%s", probe_last_error());
    cr_assert_not_null(c);
    return c;
}

static probe_gate gate_for(const probe_calibration *c, const char *component, const char *path)
{
    probe_gate g;
    cr_assert_eq(probe_calibration_gate(c, component, path, &g), PROBE_OK, "%s",
                 probe_last_error());
    cr_assert_eq(g.kind, PROBE_GATE_T2);
    cr_assert_str_eq(g.name, "T2");
    return g;
}

/* Load a file made of `body` and expect status `want` with `needle` in the
 * message (which must also name the file). */
static void expect_error(const char *name, const char *body, probe_status want, const char *needle)
{
    const char *path = write_tmp(name, body);
    probe_calibration *c = (probe_calibration *)0x1;
    probe_status st = probe_calibration_load(path, KNOWN, &c);
    cr_assert_eq(st, want, "%s: status %d (%s), want %d", name, st, probe_last_error(), want);
    cr_assert_null(c, "%s: *out must be NULL on error", name);
    cr_assert(strstr(probe_last_error(), path) != NULL, "%s: message does not name the file: %s",
              name, probe_last_error());
    cr_assert(strstr(probe_last_error(), needle) != NULL, "%s: '%s' not in: %s", name, needle,
              probe_last_error());
}

#define HEAD "{\"format\": \"probe-calibration\", \"version\": 1, "

/* ---- valid file ---- */

Test(calibration, valid_file_component_thresholds)
{
    probe_calibration *c = load_ok(valid_path(), KNOWN);
    probe_gate g = gate_for(c, "dit.step", "/dit.step/0012/out");
    cr_assert(g.rel_l2_max == 0.03);
    cr_assert(g.cosine_min == 0.999);
    cr_assert(g.atol == 0.05 && g.rtol == 0.05);
    cr_assert(g.mismatch_fraction_max == 0.01);
    cr_assert(g.p99_abs_max == 0.1);
    cr_assert(g.max_abs_max == 0.5);

    /* absent keys: unchecked; atol/rtol 0 */
    g = gate_for(c, "vae.decode", "/vae.decode/0000/in.z");
    cr_assert(g.rel_l2_max == 0.02);
    cr_assert(isinf(g.cosine_min) && g.cosine_min < 0);
    cr_assert(g.atol == 0.0 && g.rtol == 0.0);
    cr_assert(isinf(g.mismatch_fraction_max) && isinf(g.p99_abs_max) && isinf(g.max_abs_max));

    /* integers are numbers */
    g = gate_for(c, "text_encoder", "/text_encoder/0000/out");
    cr_assert(g.atol == 1.0 && g.mismatch_fraction_max == 0.0 && g.cosine_min == 0.9995);

    /* component NULL: only globs; path NULL: only the component */
    g = gate_for(c, NULL, "/vae.decode/0003/out");
    cr_assert(g.rel_l2_max == 0.04);
    g = gate_for(c, "dit.step", NULL);
    cr_assert(g.rel_l2_max == 0.03);
    probe_calibration_free(c);
}

Test(calibration, tensor_glob_wins_first_match_in_file_order)
{
    probe_calibration *c = load_ok(valid_path(), KNOWN);
    // glob "/vae.decode/*/out" replaces the whole component entry
    probe_gate g = gate_for(c, "vae.decode", "/vae.decode/0001/out");
    cr_assert(g.rel_l2_max == 0.04 && g.cosine_min == 0.99);
    /* without FNM_PATHNAME, '*' also crosses '/' */
    g = gate_for(c, "vae.decode", "/vae.decode/0001/sub/out");
    cr_assert(g.rel_l2_max == 0.04);
    // both "/dit.step/0000/*" and "/dit.step/000*/out" match: the first listed wins
    g = gate_for(c, "dit.step", "/dit.step/0000/out");
    cr_assert(g.rel_l2_max == 0.08, "got %g", g.rel_l2_max);
    cr_assert(isinf(g.cosine_min), "the tensor entry replaces, it does not merge");
    cr_assert(g.atol == 0.0);
    /* only the second matches */
    g = gate_for(c, "dit.step", "/dit.step/0001/out");
    cr_assert(g.rel_l2_max == 0.06 && g.cosine_min == -0.5);
    /* neither: the component entry */
    g = gate_for(c, "dit.step", "/dit.step/0010/out");
    cr_assert(g.rel_l2_max == 0.03);
    probe_calibration_free(c);
}

Test(calibration, no_entry_is_not_found)
{
    probe_calibration *c = load_ok(valid_path(), KNOWN);
    probe_gate g;
    cr_assert_eq(probe_calibration_gate(c, "scheduler.step", "/scheduler.step/0000/out", &g),
                 PROBE_ENOTFOUND);
    cr_assert(strstr(probe_last_error(), "scheduler.step") != NULL, "%s", probe_last_error());
    cr_assert(strstr(probe_last_error(), "valid.json") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_calibration_gate(c, NULL, NULL, &g), PROBE_ENOTFOUND);
    cr_assert_eq(probe_calibration_gate(NULL, "dit.step", NULL, &g), PROBE_EINVAL);
    cr_assert_eq(probe_calibration_gate(c, "dit.step", NULL, NULL), PROBE_EINVAL);
    probe_calibration_free(c);
    probe_calibration_free(NULL);
}

Test(calibration, calibrated_gate_checks_metrics)
{
    probe_calibration *c = load_ok(valid_path(), KNOWN);
    probe_gate g = gate_for(c, "dit.step", "/dit.step/0012/out");
    /* r = (1, 2, 3, 4), c = r + (0, 0, 0, 0.2): |d| = 0.2 <= 0.05 + 0.05*4 = 0.25,
     * so no mismatch; rel_l2 = 0.2/sqrt(30) = 0.03651 > 0.03 fails, and so does
     * p99 (rank ceil(3.96) = 4 of (0, 0, 0, 0.2)) = 0.2 > 0.1; max_abs 0.2 <= 0.5 */
    const double r[] = {1, 2, 3, 4}, cd[] = {1, 2, 3, 4.2};
    probe_metrics_opts o = {g.atol, g.rtol};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(r, cd, 4, &o, &m), PROBE_OK);
    cr_assert_eq(m.mismatch_count, 0);
    probe_gate_verdict v;
    cr_assert_eq(probe_gate_check(&g, &m, &v), PROBE_OK);
    cr_assert_eq(v.pass, 0);
    cr_assert_eq(v.nreasons, 2);
    cr_assert_str_eq(v.reasons[0], "rel_l2 0.03651 > 0.03");
    cr_assert_str_eq(v.reasons[1], "p99_abs 0.2 > 0.1");
    probe_calibration_free(c);
}

Test(calibration, null_known_accepts_any_component)
{
    const char *path = write_tmp("any.json", HEAD "\"components\": {\"my.block\": {\"rel_l2_max\": 1}}}");
    probe_calibration *c = load_ok(path, NULL);
    probe_gate g = gate_for(c, "my.block", "/my.block/0000/out");
    cr_assert(g.rel_l2_max == 1.0);
    probe_calibration_free(c);
}

Test(calibration, tensors_only_file)
{
    const char *path = write_tmp("t.json", HEAD "\"tensors\": {\"/x/*\": {\"p99_abs_max\": 0.5}}}");
    probe_calibration *c = load_ok(path, KNOWN);
    probe_gate g = gate_for(c, "dit.step", "/x/0000/out");
    cr_assert(g.p99_abs_max == 0.5);
    probe_gate h;
    cr_assert_eq(probe_calibration_gate(c, "dit.step", "/y/0000/out", &h), PROBE_ENOTFOUND);
    probe_calibration_free(c);
}

Test(calibration, weights_rule_defaults_to_same)
{
    const char *path = write_tmp("w0.json", HEAD "\"tensors\": {\"/x/*\": {\"p99_abs_max\": 0.5}}}");
    probe_calibration *c = load_ok(path, KNOWN);
    cr_assert_str_eq(probe_calibration_weights(c), "same", "a file without \"weights\"");
    probe_calibration_free(c);
    path = write_tmp("w1.json", HEAD "\"weights\": \"quantized\", "
                                     "\"tensors\": {\"/x/*\": {\"p99_abs_max\": 0.5}}}");
    c = load_ok(path, KNOWN);
    cr_assert_str_eq(probe_calibration_weights(c), "quantized");
    probe_calibration_free(c);
    cr_assert_str_eq(probe_calibration_weights(NULL), "same", "no calibration: same");
    const char *bad[] = {"\"maybe\"", "1", "null", "[\"quantized\"]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, HEAD "\"weights\": %s, \"tensors\": {\"/x/*\": {\"p99_abs_max\": 0.5}}}",
                 bad[i]);
        path = write_tmp("wb.json", text);
        probe_calibration *b = NULL;
        cr_assert_eq(probe_calibration_load(path, KNOWN, &b), PROBE_EFORMAT, "weights %s", bad[i]);
        cr_assert_null(b);
        cr_assert_not_null(strstr(probe_last_error(), "\"weights\" must be"), "%s", probe_last_error());
    }
}

/* ---- errors ---- */

Test(calibration, missing_file)
{
    probe_calibration *c = (probe_calibration *)0x1;
    cr_assert_eq(probe_calibration_load("no/such/dir/cal.json", KNOWN, &c), PROBE_ENOTFOUND);
    cr_assert_null(c);
    cr_assert(strstr(probe_last_error(), "calibration no/such/dir/cal.json: cannot open") != NULL,
              "%s", probe_last_error());
    /* a directory opens but cannot be read */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", valid_path());
    *strrchr(dir, '/') = '\0';
    cr_assert_eq(probe_calibration_load(dir, KNOWN, &c), PROBE_EIO);
    cr_assert(strstr(probe_last_error(), "cannot read") != NULL, "%s", probe_last_error());
}

Test(calibration, bad_arguments)
{
    probe_calibration *c;
    cr_assert_eq(probe_calibration_load(NULL, KNOWN, &c), PROBE_EINVAL);
    cr_assert_eq(probe_calibration_load(valid_path(), KNOWN, NULL), PROBE_EINVAL);
    c = (probe_calibration *)1;
    cr_assert_eq(probe_calibration_load_stream(NULL, "x", KNOWN, &c), PROBE_EINVAL);
    cr_assert_null(c);
    FILE *f = fopen(valid_path(), "rb");
    cr_assert_not_null(f);
    cr_assert_eq(probe_calibration_load_stream(f, NULL, KNOWN, &c), PROBE_EINVAL);
    cr_assert_eq(probe_calibration_load_stream(f, "x", KNOWN, NULL), PROBE_EINVAL);
    fclose(f);
}

/* A stream loads as the file does; its name stands for the file in messages. */
Test(calibration, stream_as_file)
{
    FILE *f = fopen(valid_path(), "rb");
    cr_assert_not_null(f);
    probe_calibration *c = NULL;
    cr_assert_eq(probe_calibration_load_stream(f, "(in memory)", KNOWN, &c), PROBE_OK, "%s",
                 probe_last_error());
    fclose(f);
    probe_gate g;
    cr_assert_eq(probe_calibration_gate(c, "dit.step", "/dit.step/0012/out", &g), PROBE_OK);
    probe_calibration *d = NULL;
    cr_assert_eq(probe_calibration_load(valid_path(), KNOWN, &d), PROBE_OK);
    probe_gate h;
    cr_assert_eq(probe_calibration_gate(d, "dit.step", "/dit.step/0012/out", &h), PROBE_OK);
    cr_assert_eq(g.rel_l2_max, h.rel_l2_max);
    cr_assert_eq(g.cosine_min, h.cosine_min);
    probe_calibration_free(c);
    probe_calibration_free(d);
    f = tmpfile();
    cr_assert_not_null(f);
    fputs("[1]", f);
    rewind(f);
    cr_assert_eq(probe_calibration_load_stream(f, "(in memory)", KNOWN, &c), PROBE_EFORMAT);
    cr_assert_str_eq(probe_last_error(), "calibration (in memory): top level must be a JSON "
                                         "object, not an array");
    fclose(f);
}

Test(calibration, not_json)
{
    expect_error("garbage.json", "rel_l2_max = 0.03\n", PROBE_EFORMAT, "not valid JSON (line 1");
    expect_error("empty.json", "", PROBE_EFORMAT, "not valid JSON");
    expect_error("truncated.json", HEAD "\"components\": {", PROBE_EFORMAT, "not valid JSON");
    expect_error("array.json", "[1, 2]", PROBE_EFORMAT, "top level must be a JSON object");
    expect_error("dup.json", HEAD "\"components\": {\"dit.step\": {\"rel_l2_max\": 1, \"rel_l2_max\": 2}}}",
                 PROBE_EFORMAT, "duplicate");
}

Test(calibration, wrong_format_or_version)
{
    expect_error("fmt.json", "{\"format\": \"probe-compare\", \"version\": 1, \"components\": {}}",
                 PROBE_EFORMAT, "\"format\" must be \"probe-calibration\" (got \"probe-compare\")");
    expect_error("nofmt.json", "{\"version\": 1}", PROBE_EFORMAT, "(got nothing)");
    expect_error("ver2.json", "{\"format\": \"probe-calibration\", \"version\": 2}", PROBE_EFORMAT,
                 "unsupported version 2 (this build reads 1)");
    expect_error("verstr.json", "{\"format\": \"probe-calibration\", \"version\": \"1\"}",
                 PROBE_EFORMAT, "\"version\" must be the integer 1 (got a string)");
    expect_error("feature.json", HEAD "\"feature\": 3, \"components\": {\"dit.step\": {}}}",
                 PROBE_EFORMAT, "\"feature\" must be a string");
    expect_error("headroom.json", HEAD "\"headroom\": -1, \"components\": {\"dit.step\": {}}}",
                 PROBE_EFORMAT, "\"headroom\" must be a positive number");
    expect_error("topkey.json", HEAD "\"component\": {\"dit.step\": {}}}", PROBE_EFORMAT,
                 "unknown key 'component'");
    expect_error("nothing.json", HEAD "\"components\": {}}", PROBE_EFORMAT, "no thresholds");
    expect_error("compsarray.json", HEAD "\"components\": [1]}", PROBE_EFORMAT,
                 "\"components\" must be an object, not an array");
}

Test(calibration, unknown_component)
{
    expect_error("unk.json", HEAD "\"components\": {\"dit.step\": {}, \"foo\": {\"rel_l2_max\": 1}}}",
                 PROBE_EINVAL,
                 "unknown component 'foo' (known: text_encoder, dit.step, scheduler.step, "
                 "vae.encode, vae.decode)");
}

Test(calibration, threshold_types_and_ranges)
{
    expect_error("str.json", HEAD "\"components\": {\"dit.step\": {\"rel_l2_max\": \"0.03\"}}}",
                 PROBE_EFORMAT, "components 'dit.step': rel_l2_max must be a number, not a string");
    expect_error("bool.json", HEAD "\"components\": {\"dit.step\": {\"atol\": true}}}",
                 PROBE_EFORMAT, "atol must be a number, not a boolean");
    expect_error("null.json", HEAD "\"tensors\": {\"/a/*\": {\"rtol\": null}}}", PROBE_EFORMAT,
                 "tensors '/a/*': rtol must be a number, not null");
    expect_error("neg.json", HEAD "\"components\": {\"dit.step\": {\"p99_abs_max\": -0.1}}}",
                 PROBE_EFORMAT, "p99_abs_max -0.1 is negative");
    expect_error("negatol.json", HEAD "\"components\": {\"vae.decode\": {\"atol\": -1}}}",
                 PROBE_EFORMAT, "atol -1 is negative");
    expect_error("cos.json", HEAD "\"components\": {\"dit.step\": {\"cosine_min\": 1.5}}}",
                 PROBE_EFORMAT, "cosine_min 1.5 is outside [-1, 1]");
    expect_error("frac.json", HEAD "\"components\": {\"dit.step\": {\"mismatch_fraction_max\": 5}}}",
                 PROBE_EFORMAT, "mismatch_fraction_max 5 is a fraction");
    expect_error("key.json", HEAD "\"components\": {\"dit.step\": {\"rel_l2\": 0.03}}}",
                 PROBE_EFORMAT, "unknown key 'rel_l2'");
    expect_error("entry.json", HEAD "\"components\": {\"dit.step\": 0.03}}", PROBE_EFORMAT,
                 "components 'dit.step' must be an object, not a number");
    expect_error("emptyglob.json", HEAD "\"tensors\": {\"\": {}}}", PROBE_EFORMAT, "empty name");
}

Test(calibration, extension_and_observed_keys_accepted)
{
    const char *path = write_tmp("ext.json", HEAD
        "\"components\": {\"dit.step\": {\"cosine_min\": -1, \"x-why\": [1, \"two\"],"
        " \"observed\": \"anything\"}}, \"x-tool\": {\"name\": \"calibrate\"}}");
    probe_calibration *c = load_ok(path, KNOWN);
    probe_gate g = gate_for(c, "dit.step", NULL);
    cr_assert(g.cosine_min == -1.0);
    probe_calibration_free(c);
}

/* ---- structure thresholds (channel_z_max, gain_z_max) ---- */

Test(calibration, old_file_leaves_structure_unchecked)
{
    probe_calibration *c = load_ok(valid_path(), KNOWN);
    probe_gate g = gate_for(c, "dit.step", "/dit.step/0005/out");
    cr_assert(isinf(g.channel_z_max) && g.channel_z_max > 0);
    cr_assert(isinf(g.gain_z_max) && g.gain_z_max > 0);
    cr_assert_eq(g.rel_l2_max, 0.06, "the rest as before");
    cr_assert_eq(g.headroom, 1.5);
    probe_metrics m;
    memset(&m, 0, sizeof m);
    m.gain = 1e-3;
    m.gain_z = 1e6;
    probe_channel_shift sh = {.count = 8, .z_argmax = 2, .z_max = -1e6};
    probe_gate_verdict v = {.pass = 1};
    cr_assert_eq(probe_gate_check_structure(&g, &m, &sh, NAN, NAN, &v), PROBE_OK);
    cr_assert(v.pass && v.nreasons == 0, "unchecked: %s", v.reasons[0]);
    probe_calibration_free(c);
}

Test(calibration, structure_section_per_path_over_the_entry)
{
    const char *path = write_tmp("structure.json", HEAD "\"headroom\": 1.5, "
        "\"components\": {\"dit.step\": {\"rel_l2_max\": 0.1, \"channel_z_max\": 100, "
        "\"gain_z_max\": 50}},"
        " \"tensors\": {\"/dit.step/0009/*\": {\"rel_l2_max\": 0.2}},"
        " \"structure\": {\"/dit.step/0002/out\": {\"channel_z_max\": 300, \"observed\": {}},"
        " \"/dit.step/0009/out\": {\"gain_z_max\": 7, \"x-n\": 1},"
        " \"/dit.step/0001/out\": {\"channel_z_max\": 0, \"gain_z_max\": 0}}}");
    probe_calibration *c = load_ok(path, KNOWN);
    probe_gate g = gate_for(c, "dit.step", "/dit.step/0002/out");
    cr_assert_eq(g.channel_z_max, 300, "the path's");
    cr_assert_eq(g.gain_z_max, 50, "key by key: the component's");
    cr_assert_eq(g.rel_l2_max, 0.1);
    g = gate_for(c, "dit.step", "/dit.step/0003/out");
    cr_assert_eq(g.channel_z_max, 100);
    cr_assert_eq(g.gain_z_max, 50);
    g = gate_for(c, "dit.step", "/dit.step/0001/out");
    cr_assert_eq(g.channel_z_max, 0);
    cr_assert_eq(g.gain_z_max, 0);
    g = gate_for(c, "dit.step", "/dit.step/0009/out"); /* the tensors entry replaces the component's */
    cr_assert(isinf(g.channel_z_max));
    cr_assert_eq(g.gain_z_max, 7);
    cr_assert_eq(g.rel_l2_max, 0.2);
    g = gate_for(c, "dit.step", "/dit.step/0002/out.sample");
    cr_assert_eq(g.channel_z_max, 100, "exact path, not a prefix");
    g = gate_for(c, "dit.step", NULL);
    cr_assert_eq(g.channel_z_max, 100);
    probe_calibration_free(c);
}

Test(calibration, structure_per_channel)
{
    const char *path = write_tmp("bychannel.json", HEAD "\"headroom\": 1.5, "
        "\"components\": {\"dit.block\": {\"rel_l2_max\": 0.1, \"channel_z_max\": 100}},"
        " \"structure\": {\"/dit.block/0002/out\": {\"channel_z_max\": 90,"
        " \"channel_z_max_by_channel\": [12, 0, null, 176.5]}}}");
    probe_calibration *c = load_ok(path, NULL);
    probe_gate g = gate_for(c, "dit.block", "/dit.block/0002/out");
    cr_assert_eq(g.channel_z_count, 4);
    cr_assert_not_null(g.channel_z_max_by_channel);
    cr_assert_eq(g.channel_z_max_by_channel[0], 12);
    cr_assert_eq(g.channel_z_max_by_channel[1], 0);
    cr_assert(isnan(g.channel_z_max_by_channel[2]), "null: unchecked");
    cr_assert_eq(g.channel_z_max_by_channel[3], 176.5);
    cr_assert_eq(g.channel_z_max, 90);
    g = gate_for(c, "dit.block", "/dit.block/0003/out");
    cr_assert_eq(g.channel_z_count, 0, "another path has none");
    cr_assert_null(g.channel_z_max_by_channel);
    probe_calibration_free(c);

    expect_error("bcstr.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/a\": {\"channel_z_max_by_channel\": \"1,2\"}}}", PROBE_EFORMAT,
                 "structure '/a': channel_z_max_by_channel must be an array, not a string");
    expect_error("bcempty.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/a\": {\"channel_z_max_by_channel\": []}}}", PROBE_EFORMAT,
                 "structure '/a': channel_z_max_by_channel has 0 entries (1 to 65536)");
    expect_error("bcneg.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/a\": {\"channel_z_max_by_channel\": [1, -2]}}}", PROBE_EFORMAT,
                 "structure '/a': channel_z_max_by_channel[1] must be a finite number >= 0 or "
                 "null, not a negative number");
    expect_error("bcbool.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/a\": {\"channel_z_max_by_channel\": [1, 2, true]}}}", PROBE_EFORMAT,
                 "channel_z_max_by_channel[2] must be a finite number >= 0 or null, not a boolean");
    expect_error("bccomp.json", HEAD "\"components\": {\"dit.step\": "
                 "{\"channel_z_max_by_channel\": [1]}}}", PROBE_EFORMAT,
                 "components 'dit.step': unknown key 'channel_z_max_by_channel'");
    /* a later entry fails after an earlier one holds a vector: nothing leaks (ASan) */
    expect_error("bclate.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/a\": {\"channel_z_max_by_channel\": [1]}, \"/b\": "
                 "{\"channel_z_max_by_channel\": [1], \"gain_z_max\": -1}}}", PROBE_EFORMAT,
                 "structure '/b': gain_z_max -1 is negative");
}

Test(calibration, structure_bad_values)
{
    expect_error("czstr.json", HEAD "\"components\": {\"dit.step\": {\"channel_z_max\": \"9\"}}}",
                 PROBE_EFORMAT, "components 'dit.step': channel_z_max must be a number, not a string");
    expect_error("gzneg.json", HEAD "\"components\": {\"dit.step\": {\"gain_z_max\": -1}}}",
                 PROBE_EFORMAT, "components 'dit.step': gain_z_max -1 is negative");
    expect_error("tzbool.json", HEAD "\"tensors\": {\"/a/*\": {\"gain_z_max\": false}}}",
                 PROBE_EFORMAT, "tensors '/a/*': gain_z_max must be a number, not a boolean");
    expect_error("snull.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/dit.step/0002/out\": {\"channel_z_max\": null}}}", PROBE_EFORMAT,
                 "structure '/dit.step/0002/out': channel_z_max must be a number, not null");
    expect_error("sneg.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/dit.step/0002/out\": {\"gain_z_max\": -0.5}}}", PROBE_EFORMAT,
                 "structure '/dit.step/0002/out': gain_z_max -0.5 is negative");
    expect_error("skey.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/dit.step/0002/out\": {\"rel_l2_max\": 0.1}}}", PROBE_EFORMAT,
                 "structure '/dit.step/0002/out': unknown key 'rel_l2_max' (known: channel_z_max, "
                 "gain_z_max, channel_z_max_by_channel, observed, x-*)");
    expect_error("sentry.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": "
                 "{\"/dit.step/0002/out\": 5}}", PROBE_EFORMAT,
                 "structure '/dit.step/0002/out' must be an object, not a number");
    expect_error("ssection.json", HEAD "\"components\": {\"dit.step\": {}}, \"structure\": []}",
                 PROBE_EFORMAT, "\"structure\" must be an object, not an array");
    expect_error("sonly.json", HEAD "\"structure\": {\"/a\": {\"channel_z_max\": 1}}}",
                 PROBE_EFORMAT, "no thresholds");
}
