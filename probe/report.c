/* report.c - compare results as CONTRACT.md's JSON (version 1) and as a
 * self-contained HTML page. */
#include "probe/compare.h"

#include <jansson.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

static json_t *num_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *shape_json(int rank, const int64_t *shape)
{
    json_t *a = json_array();
    for (int i = 0; i < rank; i++)
        json_array_append_new(a, json_integer((json_int_t)shape[i]));
    return a;
}

static json_t *gate_json(const probe_gate *g)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(g->name));
    json_object_set_new(o, "atol", json_real(g->atol));
    json_object_set_new(o, "rtol", json_real(g->rtol));
    json_object_set_new(o, "rel_l2_max", num_or_null(g->rel_l2_max));
    json_object_set_new(o, "cosine_min", num_or_null(g->cosine_min));
    json_object_set_new(o, "mismatch_fraction_max", num_or_null(g->mismatch_fraction_max));
    json_object_set_new(o, "max_abs_max", num_or_null(g->max_abs_max));
    json_object_set_new(o, "p99_abs_max", num_or_null(g->p99_abs_max));
    return o;
}

/* Explain each metric that is written as null (CONTRACT.md: "its reason is
 * given in reasons"). */
static void null_reasons(const probe_tensor_result *t, json_t *reasons)
{
    const probe_metrics *m = &t->m;
    if (!isfinite(m->rel_l2))
        json_array_append_new(reasons, json_string(
            "rel_l2 is not finite: the reference norm is 0 and the candidate differs"));
    if (m->n_finite == 0 && m->n > 0)
        json_array_append_new(reasons, json_string(
            "max_abs, p99_abs, mean_abs are null: no index is finite on both sides"));
}

static json_t *tensor_json(const probe_tensor_result *t)
{
    json_t *o = json_object();
    const probe_metrics *m = &t->m;
    json_object_set_new(o, "path", json_string(t->ref.path));
    json_object_set_new(o, "component", json_string(t->ref.component));
    json_object_set_new(o, "dtype", json_string(probe_dtype_name(t->ref.dtype)));
    json_object_set_new(o, "dtype_candidate", json_string(probe_dtype_name(t->dtype_cand)));
    json_object_set_new(o, "shape", shape_json(t->ref.rank, t->ref.shape));
    if (t->rank_cand != t->ref.rank || memcmp(t->shape_cand, t->ref.shape,
                                              sizeof(int64_t) * (size_t)t->ref.rank))
        json_object_set_new(o, "shape_candidate", shape_json(t->rank_cand, t->shape_cand));
    json_object_set_new(o, "n", json_integer((json_int_t)t->ref.n));
    json_t *reasons = json_array();
    if (t->compared) {
        int any = m->n_finite > 0;
        json_object_set_new(o, "rel_l2", num_or_null(m->rel_l2));
        json_object_set_new(o, "cosine", num_or_null(m->cosine));
        json_object_set_new(o, "max_abs", any ? num_or_null(m->max_abs) : json_null());
        json_object_set_new(o, "max_abs_index",
                            any ? shape_json(t->ref.rank, t->max_abs_index) : json_null());
        json_object_set_new(o, "p99_abs", any ? num_or_null(m->p99_abs) : json_null());
        json_object_set_new(o, "mean_abs", any ? num_or_null(m->mean_abs) : json_null());
        json_object_set_new(o, "mismatch_fraction", json_real(m->mismatch_fraction));
        json_object_set_new(o, "nan_ref", json_integer((json_int_t)m->nan_ref));
        json_object_set_new(o, "nan_cand", json_integer((json_int_t)m->nan_cand));
        json_object_set_new(o, "inf_ref", json_integer((json_int_t)m->inf_ref));
        json_object_set_new(o, "inf_cand", json_integer((json_int_t)m->inf_cand));
        json_object_set_new(o, "zero_norm_reference", json_boolean(m->zero_norm_reference));
        json_object_set_new(o, "identical", json_boolean(m->identical));
        json_object_set_new(o, "mismatch_count", json_integer((json_int_t)m->mismatch_count));
        null_reasons(t, reasons);
    } else {
        static const char *keys[] = {"rel_l2", "cosine", "max_abs", "max_abs_index", "p99_abs",
                                     "mean_abs", "mismatch_fraction", "nan_ref", "nan_cand",
                                     "inf_ref", "inf_cand"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            json_object_set_new(o, keys[k], json_null());
        json_object_set_new(o, "zero_norm_reference", json_false());
        json_object_set_new(o, "identical", json_false());
    }
    json_object_set_new(o, "verdict", json_string(t->verdict.pass ? "pass" : "fail"));
    for (int i = 0; i < t->verdict.nreasons; i++)
        json_array_append_new(reasons, json_string(t->verdict.reasons[i]));
    json_object_set_new(o, "reasons", reasons);
    if (t->ref.step >= 0)
        json_object_set_new(o, "step", json_integer(t->ref.step));
    if (t->ref.seq >= 0)
        json_object_set_new(o, "seq", json_integer(t->ref.seq));
    if (t->gate.kind == PROBE_GATE_T2)
        json_object_set_new(o, "gate", gate_json(&t->gate));
    return o;
}

static json_t *result_json(const probe_compare_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string("probe-compare"));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "reference", json_string(r->reference));
    json_object_set_new(o, "candidate", json_string(r->candidate));
    json_object_set_new(o, "gate", gate_json(&r->gate));
    json_object_set_new(o, "verdict", json_string(r->pass ? "pass" : "fail"));
    json_object_set_new(o, "first_failure",
                        r->first_failure_path[0] ? json_string(r->first_failure_path) : json_null());
    json_object_set_new(o, "feature_active", json_boolean(r->feature_active));
    json_object_set_new(o, "feature_not_active", json_boolean(r->feature_not_active));
    json_object_set_new(o, "expect_identical", json_boolean(r->expect_identical));
    json_t *why = json_array();
    for (int i = 0; i < r->nreasons; i++)
        json_array_append_new(why, json_string(r->reasons[i]));
    json_object_set_new(o, "reasons", why);
    json_t *mc = json_array(), *mr = json_array(), *sk = json_array(), *ts = json_array();
    for (size_t i = 0; i < r->nmissing_cand; i++)
        json_array_append_new(mc, json_string(r->missing_in_candidate[i]));
    for (size_t i = 0; i < r->nmissing_ref; i++)
        json_array_append_new(mr, json_string(r->missing_in_reference[i]));
    for (size_t i = 0; i < r->nskipped; i++)
        json_array_append_new(sk, json_pack("{s:s,s:s,s:s}", "path", r->skipped[i].path, "side",
                                            r->skipped[i].side, "reason", r->skipped[i].reason));
    size_t npass = 0;
    for (size_t i = 0; i < r->ntensors; i++) {
        json_array_append_new(ts, tensor_json(&r->tensors[i]));
        npass += r->tensors[i].verdict.pass != 0;
    }
    json_object_set_new(o, "missing_in_candidate", mc);
    json_object_set_new(o, "missing_in_reference", mr);
    json_object_set_new(o, "skipped", sk);
    json_object_set_new(o, "nothing_compared", json_boolean(r->nothing_compared));
    json_object_set_new(o, "ignored_datasets", json_pack("{s:I,s:I}", "reference",
                                                         (json_int_t)r->ignored_ref, "candidate",
                                                         (json_int_t)r->ignored_cand));
    json_object_set_new(o, "summary",
                        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "tensors", (json_int_t)r->ntensors,
                                  "passed", (json_int_t)npass, "failed",
                                  (json_int_t)(r->ntensors - npass), "missing_in_candidate",
                                  (json_int_t)r->nmissing_cand, "missing_in_reference",
                                  (json_int_t)r->nmissing_ref, "skipped", (json_int_t)r->nskipped));
    json_object_set_new(o, "tensors", ts);
    return o;
}

probe_status probe_compare_write_json(const probe_compare_result *r, FILE *f)
{
    if (!r || !f)
        return probe_set_error(PROBE_EINVAL, "probe_compare_write_json: NULL argument");
    json_t *o = result_json(r);
    if (!o)
        return probe_set_error(PROBE_ENOMEM, "out of memory building JSON");
    int rc = json_dumpf(o, f, JSON_INDENT(1) | JSON_REAL_PRECISION(17) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (rc != 0 || fputc('\n', f) == EOF || fflush(f) != 0)
        return probe_set_error(PROBE_EIO, "cannot write JSON output");
    return PROBE_OK;
}

/* The page: a summary, one row per tensor, the data inline as JSON. The
 * script only formats the inline data; the page needs no network. */
static const char html_head[] =
    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>probe-compare</title>\n"
    "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;"
    "font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
    "td:first-child{text-align:left;font-family:monospace}.fail{background:#fdd}"
    ".pass{background:#dfd}</style></head><body>\n<h1>probe-compare</h1>\n"
    "<p id=\"summary\"></p>\n<table id=\"tensors\"><thead><tr><th>path</th><th>dtype</th>"
    "<th>n</th><th>rel_l2</th><th>cosine</th><th>max_abs</th><th>p99_abs</th>"
    "<th>mismatch</th><th>verdict</th><th>reasons</th></tr></thead><tbody></tbody></table>\n"
    "<script type=\"application/json\" id=\"probe-data\">";
static const char html_tail[] =
    "</script>\n<script>\n"
    "const d=JSON.parse(document.getElementById('probe-data').textContent);\n"
    "const f=x=>x===null?'null':(typeof x==='number'?x.toPrecision(4):String(x));\n"
    "const fc=x=>x===null?'null':x.toFixed(8);\n"
    "document.getElementById('summary').textContent='reference '+d.reference+', candidate '+"
    "d.candidate+', gate '+d.gate.name+': '+d.verdict.toUpperCase()+(d.first_failure?"
    "', first failure '+d.first_failure:'')+'; missing in candidate: '+"
    "d.missing_in_candidate.length+', missing in reference: '+d.missing_in_reference.length;\n"
    "const tb=document.querySelector('#tensors tbody');\n"
    "for(const t of d.tensors){const tr=document.createElement('tr');tr.className=t.verdict;"
    "for(const v of [t.path,t.dtype,t.n,f(t.rel_l2),fc(t.cosine),f(t.max_abs),f(t.p99_abs),"
    "f(t.mismatch_fraction),t.verdict,t.reasons.join('; ')]){const td=document.createElement"
    "('td');td.textContent=v;tr.appendChild(td);}tb.appendChild(tr);}\n"
    "</script></body></html>\n";

probe_status probe_compare_write_html(const probe_compare_result *r, FILE *f)
{
    if (!r || !f)
        return probe_set_error(PROBE_EINVAL, "probe_compare_write_html: NULL argument");
    json_t *o = result_json(r);
    if (!o)
        return probe_set_error(PROBE_ENOMEM, "out of memory building JSON");
    char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text)
        return probe_set_error(PROBE_ENOMEM, "out of memory building JSON");
    int ok = fputs(html_head, f) != EOF;
    /* "</" inside a script element would end it: write it as "<\/". */
    for (const char *p = text; ok && *p; p++) {
        if (p[0] == '<' && p[1] == '/')
            ok = fputs("<\\", f) != EOF;
        else
            ok = fputc(*p, f) != EOF;
    }
    free(text);
    ok = ok && fputs(html_tail, f) != EOF && fflush(f) == 0;
    return ok ? PROBE_OK : probe_set_error(PROBE_EIO, "cannot write HTML output");
}
