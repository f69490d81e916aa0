/* test_intercept_json.c - the shim's JSON builder and the manifest assembled
 * from registered sections (intercept/base/json.c, base/manifest.c), against
 * hand-derived text (RFC 8259 section 7 escapes). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/manifest.h"
#include "base/shim.h"
#include "probe/tap.h"

static char *as_json(const char *s)
{
    struct shim_json b;
    shim_json_init(&b);
    shim_json_string(&b, s);
    cr_assert_eq(b.oom, 0);
    return b.p;
}

Test(intercept_json, string_escapes)
{
    const struct {
        const char *in, *out;
    } cases[] = {
        {"plain", "\"plain\""},
        {"a\"b\\c", "\"a\\\"b\\\\c\""},
        {"\b\f\n\r\t", "\"\\b\\f\\n\\r\\t\""},
        {"\x01\x1f", "\"\\u0001\\u001f\""},
        {"caf\xc3\xa9", "\"caf\xc3\xa9\""},           /* valid UTF-8 kept */
        {"bad\xff" "end", "\"bad\xef\xbf\xbd" "end\""}, /* invalid byte: U+FFFD */
        {"\xe2\x82", "\"\xef\xbf\xbd\xef\xbf\xbd\""},   /* truncated sequence: one each */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        char *j = as_json(cases[i].in);
        cr_assert_str_eq(j, cases[i].out, "case %zu", i);
        cr_assert(shim_json_valid(j), "case %zu is valid JSON", i);
        free(j);
    }
    char *n = as_json(NULL);
    cr_assert_str_eq(n, "null");
    free(n);
}

Test(intercept_json, validity)
{
    const char *good[] = {"0", "-1.5e3", "\"x\"", "[]", "{}", "[1,{\"a\":[true,false,null]}]",
                          " {\"k\" : \"\\u00e9\"} "};
    const char *bad[] = {"", "01", "[1,]", "{\"a\"}", "\"\\x\"", "tru", "[1] 2", "{'a':1}",
                         "\"\x01\""};
    for (size_t i = 0; i < sizeof good / sizeof *good; ++i)
        cr_assert(shim_json_valid(good[i]), "accepts %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i)
        cr_assert(!shim_json_valid(bad[i]), "refuses %s", bad[i]);
    char deep[200] = "";
    for (int i = 0; i < 65; ++i)
        strcat(deep, "[");
    for (int i = 0; i < 65; ++i)
        strcat(deep, "]");
    cr_assert(!shim_json_valid(deep), "nesting deeper than 64 is refused");
}

static void section_a(struct shim_json *b)
{
    shim_json_raw(b, ",\"a\":1");
}

static void section_b(struct shim_json *b)
{
    shim_json_raw(b, ",\"b\":2");
}

static void section_final(struct shim_json *b)
{
    shim_json_raw(b, ",\"at_close\":true");
}

Test(intercept_json, manifest_sections_in_order_and_replaced_by_adapter_keys)
{
    shim_manifest_add("a", 0, section_a);
    shim_manifest_add(NULL, 1, section_final);
    shim_manifest_add("b", 0, section_b);
    char *m = shim_manifest_build(0);
    cr_assert_not_null(m);
    cr_assert(shim_json_valid(m), "%s", m);
    const char *a = strstr(m, "\"a\":1"), *bb = strstr(m, "\"b\":2");
    cr_assert(a && bb && a < bb, "sections in registration order: %s", m);
    cr_assert_null(strstr(m, "at_close"), "a final-only section is not in the first manifest");
    free(m);
    cr_assert_eq(probe_tap_manifest_v1("a", "\"mine\""), PROBE_OK);
    m = shim_manifest_build(1);
    cr_assert(shim_json_valid(m), "%s", m);
    cr_assert_null(strstr(m, "\"a\":1"), "an adapter key replaces the section that writes it");
    cr_assert_not_null(strstr(m, "\"a\":\"mine\""));
    cr_assert_not_null(strstr(m, "\"at_close\":true"));
    cr_assert_not_null(strstr(m, "\"b\":2"));
    free(m);
    cr_assert_eq(probe_tap_manifest_v1("format", "1"), PROBE_EINVAL, "reserved key");
    cr_assert_eq(probe_tap_manifest_v1("k", "{"), PROBE_EINVAL, "not one JSON value");
}
