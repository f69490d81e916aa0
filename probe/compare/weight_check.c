/* weight_check.c - compare the weight fingerprints of two runs (probe/compare/weight_check.h,
 * docs/gemm.md "Weights"). The fingerprints are written by the preloaded
 * shim (intercept/capture/weights.c) into the manifest key
 *   "weights": {"overflow": N, "components": {C: {"gemms", "bytes",
 *               "complete", "dtypes", "xxh64", "operands": [{"k", "shape",
 *               "dtype", "xxh64"}, ...]}}} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "weight_check.h"

static json_t *components(json_t *m)
{
    json_t *w = m ? json_object_get(m, "weights") : NULL;
    json_t *c = w ? json_object_get(w, "components") : NULL;
    return json_is_object(c) ? c : NULL;
}

/* 1 when a component entry has the documented form: "operands" an array of
 * objects with integer k, array shape, string dtype, and string or null
 * xxh64; "xxh64" string or null. */
static int valid_entry(json_t *e)
{
    json_t *o = json_object_get(e, "operands"), *h = json_object_get(e, "xxh64");
    if (!json_is_array(o) || !(json_is_string(h) || json_is_null(h)))
        return 0;
    for (size_t i = 0; i < json_array_size(o); ++i) {
        json_t *x = json_array_get(o, i), *xh = json_object_get(x, "xxh64");
        if (!json_is_integer(json_object_get(x, "k")) || !json_is_array(json_object_get(x, "shape")) ||
            !json_is_string(json_object_get(x, "dtype")) || !(json_is_string(xh) || json_is_null(xh)))
            return 0;
    }
    return 1;
}

/* 1 when the operands of a and b have the same k, shape and dtype, in order. */
static int same_format(json_t *a, json_t *b)
{
    if (!json_is_array(a) || !json_is_array(b) || json_array_size(a) != json_array_size(b))
        return 0;
    for (size_t i = 0; i < json_array_size(a); ++i) {
        json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
        if (!json_equal(json_object_get(x, "k"), json_object_get(y, "k")) ||
            !json_equal(json_object_get(x, "shape"), json_object_get(y, "shape")) ||
            !json_equal(json_object_get(x, "dtype"), json_object_get(y, "dtype")))
            return 0;
    }
    return 1;
}

static void shape_text(json_t *shape, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (size_t i = 0; i < json_array_size(shape) && len < cap; ++i)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "",
                                (long long)json_integer_value(json_array_get(shape, i)));
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

probe_status probe_weights_check(const char *mr, const char *mc, probe_weights_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->status = "unknown";
    json_t *m[2] = {mr ? json_loads(mr, 0, NULL) : NULL, mc ? json_loads(mc, 0, NULL) : NULL};
    json_t *c[2] = {components(m[0]), components(m[1])};
    json_t *out = json_object(), *per = json_object();
    if (!out || !per) {
        json_decref(out);
        json_decref(per);
        json_decref(m[0]);
        json_decref(m[1]);
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    }
    size_t nsame = 0, ndiffer = 0, nformat = 0;
    long long same_ops = 0, same_bytes = 0;
    char differ_line[512] = "", format_name[256] = "";
    const char *name;
    json_t *rc;
    if (c[0] && c[1]) {
        json_object_foreach(c[0], name, rc) {
            json_t *cc = json_object_get(c[1], name);
            if (!cc || !valid_entry(rc) || !valid_entry(cc))
                continue; /* fingerprinted in one run only, or malformed: unknown */
            json_t *ro = json_object_get(rc, "operands"), *co = json_object_get(cc, "operands");
            json_t *rh = json_object_get(rc, "xxh64"), *ch = json_object_get(cc, "xxh64");
            const char *st;
            json_t *entry = json_object();
            if (!same_format(ro, co)) {
                st = "format_differs";
                if (!nformat++)
                    snprintf(format_name, sizeof format_name, "%s", name);
            } else if (!json_is_string(rh) || !json_is_string(ch)) {
                st = "unknown"; /* a hash did not complete in one of the runs */
            } else if (json_equal(rh, ch)) {
                st = "same";
                ++nsame;
                same_ops += (long long)json_array_size(ro);
                same_bytes += json_integer_value(json_object_get(rc, "bytes"));
            } else {
                st = "differ";
                long long k = -1;
                json_t *shape = NULL, *dtype = NULL;
                for (size_t i = 0; i < json_array_size(ro); ++i) {
                    json_t *x = json_array_get(ro, i), *y = json_array_get(co, i);
                    if (!json_equal(json_object_get(x, "xxh64"), json_object_get(y, "xxh64"))) {
                        k = json_integer_value(json_object_get(x, "k"));
                        shape = json_object_get(x, "shape");
                        dtype = json_object_get(x, "dtype");
                        break;
                    }
                }
                if (entry)
                    json_object_set_new(entry, "first_differing_gemm", json_integer(k));
                if (!ndiffer++) {
                    char sh[160];
                    shape_text(shape, sh, sizeof sh);
                    snprintf(differ_line, sizeof differ_line,
                             "component %s, first differing GEMM k=%lld (weight %s %s)", name, k, sh,
                             json_is_string(dtype) ? json_string_value(dtype) : "?");
                }
            }
            if (entry) {
                json_object_set_new(entry, "status", json_string(st));
                json_object_set(entry, "reference_xxh64", rh ? rh : json_null());
                json_object_set(entry, "candidate_xxh64", ch ? ch : json_null());
                json_object_set(entry, "gemms", json_object_get(rc, "gemms"));
                json_object_set(entry, "bytes", json_object_get(rc, "bytes"));
                json_object_set_new(per, name, entry);
            }
        }
    }
    if (ndiffer) {
        v->status = "differ";
        snprintf(v->line, sizeof v->line, "the runs loaded different weights: %s", differ_line);
    } else if (nformat) {
        v->status = "format_differs";
        snprintf(v->line, sizeof v->line,
                 "weights: %s (and %zu other component%s) has GEMM weights of different shapes or "
                 "dtypes in the two runs (e.g. quantized): not compared",
                 format_name, nformat - 1, nformat == 2 ? "" : "s");
    } else if (nsame) {
        v->status = "same";
        snprintf(v->line, sizeof v->line,
                 "weights: same in both runs (%lld GEMM operands, %lld bytes)", same_ops, same_bytes);
    } else if (c[0] || c[1]) {
        snprintf(v->line, sizeof v->line, "weights: unknown (%s)",
                 !c[0] ? "the reference run has no weight fingerprints"
                 : !c[1] ? "the candidate run has no weight fingerprints"
                         : "no component was fingerprinted completely in both runs");
    }
    json_object_set_new(out, "status", json_string(v->status));
    json_object_set_new(out, "components", per);
    v->json = json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(out);
    json_decref(m[0]);
    json_decref(m[1]);
    if (!v->json)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    return PROBE_OK;
}

void probe_weights_verdict_free(probe_weights_verdict *v)
{
    if (v) {
        free(v->json);
        v->json = NULL;
    }
}

int probe_weights_accepts(const probe_weights_verdict *v, const char *weights)
{
    return strcmp(v->status, "differ") != 0 || (weights && strcmp(weights, "quantized") == 0);
}
