/* weight_check.c - compare the weight fingerprints of two runs (probe/compare/weight_check.h,
 * docs/gemm.md "Weights"). The fingerprints are written by the preloaded
 * shim (intercept/capture/weights.c) into the manifest key
 *   "weights": {"overflow": N, "components": {C: {"gemms", "bytes",
 *               "complete", "dtypes", "xxh64", "operands": [{"k", "shape",
 *               "dtype", "xxh64"[, "levels", "amax", "rounded": {F: hex},
 *               "amax_variants": [hex, ...]]},
 *               ...]}}}
 * ("levels", "amax", "rounded": the operand's probe_rounded_fingerprint,
 * include/probe/capture.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "probe/dtype.h"
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

static long long elements(json_t *shape)
{
    long long n = 1;
    for (size_t i = 0; i < json_array_size(shape); ++i)
        n *= json_integer_value(json_array_get(shape, i));
    return n;
}

static const char *str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* How operand y of the candidate stands to operand x of the reference (same
 * position): OP_SAME (same k, shape, dtype), OP_FP8 (same k and element
 * count, one of them stored as float8_e4m3fn, a float8 GEMM's operand, and
 * the other with rounded fingerprints), OP_FORMAT (anything else). */
enum { OP_SAME, OP_FP8, OP_FORMAT };

static int op_relation(json_t *x, json_t *y)
{
    if (!json_equal(json_object_get(x, "k"), json_object_get(y, "k")))
        return OP_FORMAT;
    const char *dx = str(x, "dtype"), *dy = str(y, "dtype");
    if (json_equal(json_object_get(x, "shape"), json_object_get(y, "shape")) && dx && dy &&
        !strcmp(dx, dy))
        return OP_SAME;
    int fx = dx && !strcmp(dx, "float8_e4m3fn"), fy = dy && !strcmp(dy, "float8_e4m3fn");
    if (fx != fy && elements(json_object_get(x, "shape")) == elements(json_object_get(y, "shape")) &&
        json_is_object(json_object_get(fx ? y : x, "rounded")))
        return OP_FP8;
    return OP_FORMAT;
}

/* The relative distance of the amax of a rounding of a tensor from the
 * tensor's own that the rounding allows: the plain cast rounds amax to the
 * nearest float8_e4m3fn value (3 fraction bits: within 2^-4); the amax scale
 * maps amax to 448 exactly, and the dequantized value is amax again up to
 * the compute type's rounding (bfloat16: 2^-8; 2^-7 allowed). */
static const double amax_tolerance[PROBE_ROUNDING_COUNT_] = {0.0625, 0.0078125};

/* 1 when hash h is one of operand o's codes hashes of rounding r: its
 * "rounded"[r], or for the amax rounding any of its "amax_variants" (the
 * scale conventions of include/probe/capture.h). */
static int has_codes(json_t *o, int r, const char *h)
{
    const char *own = str(json_object_get(o, "rounded"), probe_rounding_name((probe_rounding)r));
    if (!h)
        return 0;
    if (own && !strcmp(own, h))
        return 1;
    json_t *vars = json_object_get(o, "amax_variants");
    for (size_t i = 0; r == PROBE_ROUNDING_E4M3FN_AMAX && i < json_array_size(vars); ++i) {
        const char *v = json_string_value(json_array_get(vars, i));
        if (v && !strcmp(v, h))
            return 1;
    }
    return 0;
}

/* The roundings (bit r: probe_rounding r) that prove y is x rounded to float8
 * or x is y rounded (docs/gemm.md "Quantized from the same weights"):
 * - OP_SAME: the side with at most 256 levels (the rounded one) has its own
 *   "rounded"[F] among the other's codes of F (has_codes); both amax finite
 *   and within amax_tolerance[F] of each other;
 * - OP_FP8: the float8 side's xxh64 (the XXH64 of its bytes: its codes)
 *   is among the other side's codes of F.
 * 0 when none does, or the fingerprints are absent. */
static unsigned rounding_proof(json_t *x, json_t *y, int rel)
{
    unsigned mask = 0;
    for (int r = 0; r < PROBE_ROUNDING_COUNT_; ++r) {
        const char *name = probe_rounding_name((probe_rounding)r);
        if (rel == OP_FP8) {
            int fx = !strcmp(str(x, "dtype"), "float8_e4m3fn");
            if (has_codes(fx ? y : x, r, str(fx ? x : y, "xxh64")))
                mask |= 1u << r;
            continue;
        }
        const char *hx = str(json_object_get(x, "rounded"), name);
        const char *hy = str(json_object_get(y, "rounded"), name);
        json_t *lx = json_object_get(x, "levels"), *ly = json_object_get(y, "levels");
        json_t *ax = json_object_get(x, "amax"), *ay = json_object_get(y, "amax");
        /* the rounded side's own codes are among the other's (its scale conventions) */
        int codes = (json_is_integer(ly) && has_codes(x, r, hy)) ||
                    (json_is_integer(lx) && has_codes(y, r, hx));
        if (!hx || !hy || !codes || !json_is_number(ax) || !json_is_number(ay))
            continue;
        double a = json_number_value(ax), b = json_number_value(ay), m = fmax(fabs(a), fabs(b));
        if (isfinite(a) && isfinite(b) && fabs(a - b) <= amax_tolerance[r] * m)
            mask |= 1u << r;
    }
    return mask;
}

/* 1 when both operands of a differing OP_SAME pair carry rounded
 * fingerprints (an OP_FP8 pair always can be checked). */
static int rounding_known(json_t *x, json_t *y, int rel)
{
    return rel == OP_FP8 || (json_is_object(json_object_get(x, "rounded")) &&
                             json_is_object(json_object_get(y, "rounded")));
}

static const char *mask_name(unsigned mask)
{
    for (int r = 0; r < PROBE_ROUNDING_COUNT_; ++r)
        if (mask & (1u << r))
            return probe_rounding_name((probe_rounding)r);
    return NULL;
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

static void differ_text(char *buf, size_t cap, const char *name, json_t *x, int checked)
{
    char sh[160];
    shape_text(json_object_get(x, "shape"), sh, sizeof sh);
    const char *dt = str(x, "dtype");
    snprintf(buf, cap, "component %s, first differing GEMM k=%lld (weight %s %s)%s", name,
             (long long)json_integer_value(json_object_get(x, "k")), sh, dt ? dt : "?",
             checked ? ", not a float8_e4m3fn rounding of the reference's" : "");
}

/* The first float8 operand proven no rounding of the reference's weight. */
static void fp8_text(char *buf, size_t cap, const char *name, json_t *f8)
{
    char sh[160];
    shape_text(json_object_get(f8, "shape"), sh, sizeof sh);
    snprintf(buf, cap, "component %s, float8 GEMM k=%lld (weight %s float8_e4m3fn)", name,
             (long long)json_integer_value(json_object_get(f8, "k")), sh);
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
    size_t nsame = 0, ndiffer = 0, nformat = 0, nquant = 0;
    long long same_ops = 0, same_bytes = 0, quant_ops = 0;
    unsigned run_mask = (1u << PROBE_ROUNDING_COUNT_) - 1;
    char differ_line[512] = "", format_name[256] = "", fp8_line[320] = "";
    long long unproven_fp8 = 0;
    const char *name;
    json_t *rc;
    if (c[0] && c[1]) {
        json_object_foreach(c[0], name, rc) {
            json_t *cc = json_object_get(c[1], name);
            if (!cc || !valid_entry(rc) || !valid_entry(cc))
                continue; /* fingerprinted in one run only, or malformed: unknown */
            json_t *ro = json_object_get(rc, "operands"), *co = json_object_get(cc, "operands");
            json_t *rh = json_object_get(rc, "xxh64"), *ch = json_object_get(cc, "xxh64");
            size_t n = json_array_size(ro);
            int format = n != json_array_size(co), incomplete = 0;
            for (size_t i = 0; i < n && !format; ++i) {
                json_t *x = json_array_get(ro, i), *y = json_array_get(co, i);
                format = op_relation(x, y) == OP_FORMAT;
                incomplete |= !json_is_string(json_object_get(x, "xxh64")) ||
                              !json_is_string(json_object_get(y, "xxh64"));
            }
            const char *st;
            json_t *entry = json_object();
            if (format) {
                st = "format_differs";
                if (!nformat++)
                    snprintf(format_name, sizeof format_name, "%s", name);
            } else if (incomplete || !json_is_string(rh) || !json_is_string(ch)) {
                st = "unknown"; /* a hash did not complete in one of the runs */
            } else if (json_equal(rh, ch)) {
                st = "same";
                ++nsame;
                same_ops += (long long)n;
                same_bytes += json_integer_value(json_object_get(rc, "bytes"));
            } else {
                /* Every differing operand proven a float8 rounding in one common
                 * format: "quantized"; else "differ", naming the first that is not. */
                unsigned mask = (1u << PROBE_ROUNDING_COUNT_) - 1;
                long long nq = 0, first_k = -1, nfp8 = 0;
                json_t *first = NULL;
                int first_checked = 0;
                for (size_t i = 0; i < n; ++i) {
                    json_t *x = json_array_get(ro, i), *y = json_array_get(co, i);
                    int rel = op_relation(x, y);
                    if (rel == OP_SAME &&
                        json_equal(json_object_get(x, "xxh64"), json_object_get(y, "xxh64")))
                        continue;
                    unsigned p = rounding_proof(x, y, rel);
                    if (p && (mask & p)) {
                        mask &= p;
                        ++nq;
                        continue;
                    }
                    v->unproven += rounding_known(x, y, rel);
                    if (rel == OP_FP8) {
                        ++nfp8; /* another float8 recipe, or other weights: unproven */
                        if (!unproven_fp8++)
                            fp8_text(fp8_line, sizeof fp8_line, name,
                                     strcmp(str(x, "dtype"), "float8_e4m3fn") ? y : x);
                    } else if (!first) {
                        first = x;
                        first_k = json_integer_value(json_object_get(x, "k"));
                        first_checked = rounding_known(x, y, rel);
                    }
                }
                if (first || (!nq && !nfp8)) {
                    /* no operand differs, yet the combined hash does: the
                     * manifest contradicts itself; not proven anything */
                    st = "differ";
                    if (entry) {
                        json_object_set_new(entry, "first_differing_gemm", json_integer(first_k));
                        json_object_set_new(entry, "rounding_checked", json_boolean(first_checked));
                    }
                    if (ndiffer++ == 0) {
                        if (first)
                            differ_text(differ_line, sizeof differ_line, name, first, first_checked);
                        else
                            snprintf(differ_line, sizeof differ_line,
                                     "component %s, combined hash differs though no operand's does",
                                     name);
                    }
                } else if (nfp8) {
                    st = "format_differs";
                    if (!nformat++)
                        snprintf(format_name, sizeof format_name, "%s", name);
                    if (entry)
                        json_object_set_new(entry, "unproven_float8_gemms", json_integer(nfp8));
                } else {
                    st = "quantized";
                    ++nquant;
                    quant_ops += nq;
                    run_mask &= mask;
                    if (entry) {
                        json_object_set_new(entry, "rounding", json_string(mask_name(mask)));
                        json_object_set_new(entry, "quantized_gemms", json_integer(nq));
                    }
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
    if (nquant)
        v->rounding = run_mask ? mask_name(run_mask) : "mixed";
    if (ndiffer) {
        v->status = "differ";
        snprintf(v->line, sizeof v->line, "the runs loaded different weights: %s", differ_line);
    } else if (nquant) {
        v->status = "quantized";
        snprintf(v->line, sizeof v->line,
                 "weights: quantized from the reference's: %lld GEMM operands in %zu component%s "
                 "are its weights rounded to %s%s%s", quant_ops, nquant, nquant == 1 ? "" : "s",
                 v->rounding, nsame ? ", the others the same" : "",
                 nformat ? "; some components have operands of other shapes or dtypes" : "");
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
    if (!ndiffer && unproven_fp8) {
        size_t len = strlen(v->line);
        snprintf(v->line + len, sizeof v->line - len,
                 "; %lld float8 GEMM operand%s proven no rounding of the reference's weight, the "
                 "first %s", unproven_fp8, unproven_fp8 == 1 ? "" : "s", fp8_line);
    }
    json_object_set_new(out, "status", json_string(v->status));
    if (v->rounding)
        json_object_set_new(out, "rounding", json_string(v->rounding));
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

const char *probe_weights_refusal(const probe_weights_verdict *v, const char *weights,
                                  const char *rounding)
{
    int quantized = weights && !strcmp(weights, "quantized");
    int changed = !strcmp(v->status, "differ") || !strcmp(v->status, "quantized");
    if (changed && !quantized)
        return !strcmp(v->status, "differ")
                   ? "the feature does not change the weights"
                   : "the feature does not change the weights; these are the reference's rounded "
                     "to float8: compare a quantizing feature with --gate T2 and a calibration "
                     "made with --weights quantized";
    if (quantized && rounding && v->unproven)
        return "the calibration's feature rounds the weights to float8, and these are not the "
               "reference's weights so rounded";
    if (quantized && rounding && !strcmp(v->status, "quantized") && strcmp(rounding, v->rounding))
        return "the calibration's feature rounds the weights differently";
    return NULL;
}
