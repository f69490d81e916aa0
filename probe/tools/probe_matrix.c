/* probe-matrix: merge several probe-compare JSON results (one per feature)
 * and the cells that pytest runs proved (--tests, the probe-pytest-cells JSON
 * of probe's pytest plugin) into one components x features matrix. Format:
 * docs/matrix.md.
 *   exit 0  no cell failed or inherited a failure (with --cells: every requested cell
 *           passed or was skipped)
 *   exit 1  a cell failed or inherited a failure (with --cells: a requested cell did, or
 *           has no data)
 *   exit 2  bad arguments, an unreadable or invalid input, an unknown cell id
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../metrics/vocab/textsafe.h"

#define MAX_FEATURES 256
#define MAX_CELL_REASONS 3
#define MAX_TEST_FILES 64

enum { ST_ABSENT, ST_PASSED, ST_SKIPPED, ST_INHERITED, ST_FAILED, ST_COUNT };
static const char *const st_name[] = {"absent", "passed", "skipped", "inherited", "failed"};
static const char *const st_short[] = {"-", "pass", "skip", "inh", "FAIL"};

typedef struct cell {
    size_t tensors, passed, failed, missing, skipped;
    size_t inherited;         /* failing tensors of calls that only inherited the difference */
    int nreasons;
    char reasons[MAX_CELL_REASONS][400];
    int status;
    size_t tests_passed, tests_failed, tests_skipped; /* pytest outcomes (--tests) */
    int test_status;          /* worst of them, ST_ABSENT when no test proved the cell */
} cell;

typedef struct feature {
    const char *name, *source; /* source: the compare JSON, else the first --tests file */
    json_t *doc;
    int from_tests;           /* the feature came from --tests only (no compare JSON) */
    int pass;
    int run_failed;           /* run-level reasons: every cell of the feature fails */
    char run_reason[300];
} feature;

typedef struct matrix {
    feature feat[MAX_FEATURES];
    size_t nfeat;
    char **comp;              /* component names, in order of first appearance */
    size_t ncomp, capcomp;
    cell *cells;              /* [comp][feat], grown with comp */
    json_t *tests[MAX_TEST_FILES]; /* the --tests documents */
    const char *tests_path[MAX_TEST_FILES];
    size_t ntests;
} matrix;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: probe-matrix [options] [FEATURE=COMPARE.json ...] [--tests CELLS.json]...\n"
            "Merge probe-compare JSON results (one per feature) into one components x features\n"
            "matrix; cell ids are COMPONENT/FEATURE. A cell fails if a tensor of that component\n"
            "failed or is missing (or the feature's run failed, e.g. feature not active); it\n"
            "is inherited when its only failing tensors belong to calls that inherited the\n"
            "difference from upstream (the result's \"calls\"); skipped if all its captures\n"
            "were skipped; else it passes. A cell that pytest tests proved (--tests) takes\n"
            "the worse of the two: failed > inherited > skipped > passed.\n\n"
            "  --tests FILE     merge the cells of a pytest run (probe-pytest-cells JSON, written\n"
            "                   by pytest --probe-matrix-out; repeatable); a feature it names\n"
            "                   that no FEATURE=COMPARE.json gives becomes a column\n"
            "  --out FILE       write the matrix as JSON (docs/matrix.md); '-' for stdout\n"
            "  --html FILE      write a self-contained HTML page of the matrix\n"
            "  --cells ID,...   ask for these cells (repeatable; also --cell ID): an unknown\n"
            "                   component or feature is an error; the exit status then\n"
            "                   covers only these cells, and one without data fails\n"
            "  --quiet          print only the summary line\n"
            "  --help (-h), --version\n\n"
            "exit status: 0 no cell failed or inherited, 1 a cell failed or inherited,\n"
            "2 bad arguments or input\n");
}

static long comp_index(const matrix *m, const char *name)
{
    for (size_t i = 0; i < m->ncomp; i++)
        if (!strcmp(m->comp[i], name))
            return (long)i;
    return -1;
}

static cell *cell_at(matrix *m, size_t c, size_t f)
{
    return &m->cells[c * MAX_FEATURES + f];
}

/* The component's row, added on first sight. NULL when out of memory. */
static cell *row_cell(matrix *m, const char *comp, size_t f)
{
    long i = comp_index(m, comp);
    if (i < 0) {
        if (m->ncomp == m->capcomp) {
            size_t cap = m->capcomp ? 2 * m->capcomp : 16;
            char **cn = realloc(m->comp, cap * sizeof *cn);
            if (!cn)
                return NULL;
            m->comp = cn;
            cell *cc = realloc(m->cells, cap * MAX_FEATURES * sizeof *cc);
            if (!cc)
                return NULL;
            memset(cc + m->capcomp * MAX_FEATURES, 0,
                   (cap - m->capcomp) * MAX_FEATURES * sizeof *cc);
            m->cells = cc;
            m->capcomp = cap;
        }
        if (!(m->comp[m->ncomp] = strdup(comp)))
            return NULL;
        i = (long)m->ncomp++;
    }
    return cell_at(m, (size_t)i, f);
}

static void cell_reason(cell *c, const char *path, const char *why)
{
    if (c->nreasons < MAX_CELL_REASONS)
        snprintf(c->reasons[c->nreasons++], sizeof c->reasons[0], "%s: %s", path, why);
}

/* The component of a dataset path /<component>/...: its first element. */
static void path_component(char *buf, size_t cap, const char *path)
{
    const char *p = path[0] == '/' ? path + 1 : path, *slash = strchr(p, '/');
    snprintf(buf, cap, "%.*s", slash ? (int)(slash - p) : (int)strlen(p), p);
}

/* The attribution status of the call that tensor `path` belongs to (/<component>/<call>/...)
 * in the result's "calls", or NULL when the result has none for it. */
static const char *call_status(json_t *calls, const char *path)
{
    const char *slash = strchr(path + (path[0] == '/'), '/');
    if (!slash || !(slash = strchr(slash + 1, '/')))
        return NULL;
    size_t len = (size_t)(slash - path), i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        const char *id = json_string_value(json_object_get(c, "call"));
        if (id && strlen(id) == len && !strncmp(id, path, len))
            return json_string_value(json_object_get(c, "status"));
    }
    return NULL;
}

/* Read one FEATURE=FILE result into the matrix; prints the error and returns -1. */
static int load_feature(matrix *m, size_t fi)
{
    feature *ft = &m->feat[fi];
    FILE *fp = fopen(ft->source, "r");
    if (!fp) {
        fprintf(stderr, "probe-matrix: cannot read %s: %s\n", probe_tesc(ft->source), strerror(errno));
        return -1;
    }
    json_error_t err;
    json_t *doc = json_loadf(fp, 0, &err);
    fclose(fp);
    if (!doc) {
        fprintf(stderr, "probe-matrix: %s: not valid JSON (line %d, column %d): %s\n",
                probe_tesc(ft->source), err.line, err.column, probe_tesc(err.text));
        return -1;
    }
    ft->doc = doc;
    const char *format = json_string_value(json_object_get(doc, "format"));
    json_t *ver = json_object_get(doc, "version");
    if (!format || strcmp(format, "probe-compare") || !json_is_integer(ver)) {
        fprintf(stderr, "probe-matrix: %s: not a probe-compare JSON result (no \"format\": "
                        "\"probe-compare\" and integer \"version\")\n", probe_tesc(ft->source));
        return -1;
    }
    if (json_integer_value(ver) != 1) {
        fprintf(stderr, "probe-matrix: %s: probe-compare JSON version %lld is not supported "
                        "(version 1)\n", probe_tesc(ft->source), (long long)json_integer_value(ver));
        return -1;
    }
    json_t *tensors = json_object_get(doc, "tensors");
    json_t *mc = json_object_get(doc, "missing_in_candidate");
    json_t *mr = json_object_get(doc, "missing_in_reference");
    const char *verdict = json_string_value(json_object_get(doc, "verdict"));
    if (!json_is_array(tensors) || !json_is_array(mc) || !json_is_array(mr) || !verdict ||
        (strcmp(verdict, "pass") && strcmp(verdict, "fail"))) {
        fprintf(stderr, "probe-matrix: %s: a probe-compare result needs \"tensors\", "
                        "\"missing_in_candidate\", \"missing_in_reference\" lists and a "
                        "\"verdict\" of pass or fail\n", probe_tesc(ft->source));
        return -1;
    }
    ft->pass = !strcmp(verdict, "pass");
    char comp[512];
    size_t i;
    json_t *t;
    json_array_foreach(tensors, i, t) {
        const char *path = json_string_value(json_object_get(t, "path"));
        const char *tc = json_string_value(json_object_get(t, "component"));
        const char *tv = json_string_value(json_object_get(t, "verdict"));
        if (!path || !tv) {
            fprintf(stderr, "probe-matrix: %s: tensors[%zu] lacks a string \"path\" or "
                            "\"verdict\"\n", probe_tesc(ft->source), i);
            return -1;
        }
        if (!tc || !*tc)
            path_component(comp, sizeof comp, path);
        else
            snprintf(comp, sizeof comp, "%s", tc);
        cell *c = row_cell(m, comp, fi);
        if (!c)
            goto oom;
        c->tensors++;
        if (!strcmp(tv, "pass")) {
            c->passed++;
        } else {
            const char *st = call_status(json_object_get(doc, "calls"), path);
            int inh = st && (!strcmp(st, "inherited") || !strcmp(st, "inputs-differ"));
            if (inh)
                c->inherited++;
            else
                c->failed++;
            const char *why = json_string_value(json_array_get(json_object_get(t, "reasons"), 0));
            if (!inh || !c->failed)
                cell_reason(c, path, inh ? "inherited from upstream" : why ? why : "failed");
        }
    }
    for (int side = 0; side < 2; side++) {
        json_array_foreach(side ? mr : mc, i, t) {
            const char *path = json_string_value(t);
            if (!path) {
                fprintf(stderr, "probe-matrix: %s: %s[%zu] is not a string\n", probe_tesc(ft->source),
                        side ? "missing_in_reference" : "missing_in_candidate", i);
                return -1;
            }
            path_component(comp, sizeof comp, path);
            cell *c = row_cell(m, comp, fi);
            if (!c)
                goto oom;
            c->missing++;
            cell_reason(c, path, side ? "missing in reference" : "missing in candidate");
        }
    }
    json_array_foreach(json_object_get(doc, "skipped"), i, t) {
        const char *path = json_string_value(json_object_get(t, "path"));
        if (!path) {
            fprintf(stderr, "probe-matrix: %s: skipped[%zu] lacks a string \"path\"\n",
                    probe_tesc(ft->source), i);
            return -1;
        }
        path_component(comp, sizeof comp, path);
        cell *c = row_cell(m, comp, fi);
        if (!c)
            goto oom;
        c->skipped++;
    }
    /* Run-level failures (feature not active, nothing compared, ...) fail every cell. */
    json_t *reasons = json_object_get(doc, "reasons");
    const char *r0 = json_string_value(json_array_get(reasons, 0));
    if (r0) {
        ft->run_failed = 1;
        snprintf(ft->run_reason, sizeof ft->run_reason, "%s", r0);
    } else if (json_is_true(json_object_get(doc, "feature_not_active"))) {
        ft->run_failed = 1;
        snprintf(ft->run_reason, sizeof ft->run_reason, "feature not active");
    } else if (json_is_true(json_object_get(doc, "nothing_compared"))) {
        ft->run_failed = 1;
        snprintf(ft->run_reason, sizeof ft->run_reason, "nothing compared");
    }
    return 0;
oom:
    fprintf(stderr, "probe-matrix: out of memory\n");
    return -1;
}

static void classify(matrix *m)
{
    for (size_t c = 0; c < m->ncomp; c++)
        for (size_t f = 0; f < m->nfeat; f++) {
            cell *x = cell_at(m, c, f);
            if (m->feat[f].run_failed) {
                x->status = ST_FAILED;
                if (x->nreasons < MAX_CELL_REASONS)
                    snprintf(x->reasons[x->nreasons++], sizeof x->reasons[0], "%s",
                             m->feat[f].run_reason);
            } else if (x->failed || x->missing) {
                x->status = ST_FAILED;
            } else if (x->inherited) {
                x->status = ST_INHERITED;
            } else if (x->tensors) {
                x->status = ST_PASSED;
            } else if (x->skipped) {
                x->status = ST_SKIPPED;
            } else {
                x->status = ST_ABSENT;
            }
            /* pytest's outcome for the cell: the worse of the two wins */
            if (x->test_status > x->status)
                x->status = x->test_status;
        }
}

/* --- pytest cells (--tests) --- */

static long feature_index(const matrix *m, const char *name)
{
    for (size_t f = 0; f < m->nfeat; f++)
        if (!strcmp(m->feat[f].name, name))
            return (long)f;
    return -1;
}

static int bad_name(const char *s)
{
    if (!*s)
        return 1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == '/' || *p == ',')
            return 1;
    return 0;
}

/* Read one --tests file (format "probe-pytest-cells", version 1) into the
 * matrix: each cell's pytest outcome and counts; a feature no compare result
 * gives becomes a column. Prints the error and returns -1. */
static int load_tests(matrix *m, const char *path)
{
    const char *tp = probe_tesc(path);
    if (m->ntests == MAX_TEST_FILES) {
        fprintf(stderr, "probe-matrix: at most %d --tests files\n", MAX_TEST_FILES);
        return -1;
    }
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "probe-matrix: cannot read %s: %s\n", tp, strerror(errno));
        return -1;
    }
    json_error_t err;
    json_t *doc = json_loadf(fp, 0, &err);
    fclose(fp);
    if (!doc) {
        fprintf(stderr, "probe-matrix: %s: not valid JSON (line %d, column %d): %s\n", tp,
                err.line, err.column, probe_tesc(err.text));
        return -1;
    }
    m->tests[m->ntests] = doc;
    m->tests_path[m->ntests++] = path;
    const char *format = json_string_value(json_object_get(doc, "format"));
    json_t *ver = json_object_get(doc, "version");
    if (!format || strcmp(format, "probe-pytest-cells") || !json_is_integer(ver)) {
        fprintf(stderr, "probe-matrix: %s: not a probe-pytest-cells JSON (no \"format\": "
                        "\"probe-pytest-cells\" and integer \"version\"; pytest "
                        "--probe-matrix-out writes it)\n", tp);
        return -1;
    }
    if (json_integer_value(ver) != 1) {
        fprintf(stderr, "probe-matrix: %s: probe-pytest-cells version %lld is not supported "
                        "(version 1)\n", tp, (long long)json_integer_value(ver));
        return -1;
    }
    json_t *cells = json_object_get(doc, "cells");
    if (!json_is_array(cells)) {
        fprintf(stderr, "probe-matrix: %s: \"cells\" must be a list\n", tp);
        return -1;
    }
    size_t i;
    json_t *c;
    json_array_foreach(cells, i, c) {
        const char *comp = json_string_value(json_object_get(c, "component"));
        const char *feat = json_string_value(json_object_get(c, "feature"));
        const char *st = json_string_value(json_object_get(c, "status"));
        if (!comp || !feat || !st) {
            fprintf(stderr, "probe-matrix: %s: cells[%zu] lacks a string \"component\", "
                            "\"feature\" or \"status\"\n", tp, i);
            return -1;
        }
        if (bad_name(comp) || bad_name(feat)) {
            fprintf(stderr, "probe-matrix: %s: cells[%zu]: component '%s' / feature '%s': a name "
                            "must be non-empty, without '/', ',' or control characters\n", tp,
                    i, probe_tesc(comp), probe_tesc(feat));
            return -1;
        }
        int status = !strcmp(st, "passed")    ? ST_PASSED
                     : !strcmp(st, "skipped") ? ST_SKIPPED
                     : !strcmp(st, "failed")  ? ST_FAILED
                                              : -1;
        if (status < 0) {
            fprintf(stderr, "probe-matrix: %s: cells[%zu]: status '%s' is not passed, skipped "
                            "or failed\n", tp, i, probe_tesc(st));
            return -1;
        }
        long f = feature_index(m, feat);
        if (f < 0) {
            if (m->nfeat == MAX_FEATURES) {
                fprintf(stderr, "probe-matrix: at most %d features\n", MAX_FEATURES);
                return -1;
            }
            f = (long)m->nfeat++;
            m->feat[f].name = feat;
            m->feat[f].source = path;
            m->feat[f].from_tests = 1;
            m->feat[f].pass = 1;
        }
        cell *x = row_cell(m, comp, (size_t)f);
        if (!x) {
            fprintf(stderr, "probe-matrix: out of memory\n");
            return -1;
        }
        json_t *counts = json_object_get(c, "tests");
        x->tests_passed += (size_t)json_integer_value(json_object_get(counts, "passed"));
        x->tests_failed += (size_t)json_integer_value(json_object_get(counts, "failed"));
        x->tests_skipped += (size_t)json_integer_value(json_object_get(counts, "skipped"));
        if (status > x->test_status)
            x->test_status = status;
        if (status == ST_FAILED && m->feat[f].from_tests)
            m->feat[f].pass = 0;
        size_t k;
        json_t *r;
        json_array_foreach(json_object_get(c, "reasons"), k, r) {
            if (json_is_string(r) && x->nreasons < MAX_CELL_REASONS)
                snprintf(x->reasons[x->nreasons++], sizeof x->reasons[0], "test %s",
                         json_string_value(r));
        }
        if (status == ST_FAILED && !json_array_size(json_object_get(c, "reasons")) &&
            x->nreasons < MAX_CELL_REASONS)
            snprintf(x->reasons[x->nreasons++], sizeof x->reasons[0], "a test failed (%s)", path);
    }
    return 0;
}

/* --- requested cells --- */

typedef struct req {
    size_t comp, feat;
    char id[600];
} req;

/* Parse one id COMPONENT/FEATURE; prints the error and returns -1. */
static int parse_cell(const matrix *m, const char *id, req *out)
{
    const char *slash = strchr(id, '/');
    if (!slash || slash == id || !slash[1]) {
        fprintf(stderr, "probe-matrix: cell id '%s' is not COMPONENT/FEATURE\n", probe_tesc(id));
        return -1;
    }
    char comp[512];
    snprintf(comp, sizeof comp, "%.*s", (int)(slash - id), id);
    long ci = comp_index(m, comp);
    if (ci < 0) {
        fprintf(stderr, "probe-matrix: cell id '%s': unknown component '%s' (known:", probe_tesc(id),
                probe_tesc(comp));
        for (size_t i = 0; i < m->ncomp; i++)
            fprintf(stderr, "%s %s", i ? "," : "", probe_tesc(m->comp[i]));
        fprintf(stderr, ")\n");
        return -1;
    }
    for (size_t f = 0; f < m->nfeat; f++)
        if (!strcmp(m->feat[f].name, slash + 1)) {
            out->comp = (size_t)ci;
            out->feat = f;
            snprintf(out->id, sizeof out->id, "%s", id);
            return 0;
        }
    fprintf(stderr, "probe-matrix: cell id '%s': unknown feature '%s' (known:", probe_tesc(id),
            probe_tesc(slash + 1));
    for (size_t f = 0; f < m->nfeat; f++)
        fprintf(stderr, "%s %s", f ? "," : "", probe_tesc(m->feat[f].name));
    fprintf(stderr, ")\n");
    return -1;
}

/* --- output --- */

static json_t *matrix_json(matrix *m, const req *reqs, size_t nreq, int pass)
{
    json_t *o = json_object(), *fs = json_array(), *cs = json_array(), *cells = json_array();
    json_object_set_new(o, "format", json_string("probe-matrix"));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "verdict", json_string(pass ? "pass" : "fail"));
    for (size_t f = 0; f < m->nfeat; f++) {
        json_t *fo = json_object();
        json_object_set_new(fo, "name", json_string(m->feat[f].name));
        json_object_set_new(fo, "source", json_string(m->feat[f].source));
        json_object_set_new(fo, "verdict", json_string(m->feat[f].pass ? "pass" : "fail"));
        json_object_set_new(fo, "run_failure", m->feat[f].run_failed
                                                   ? json_string(m->feat[f].run_reason)
                                                   : json_null());
        json_object_set_new(fo, "from_tests", json_boolean(m->feat[f].from_tests));
        json_array_append_new(fs, fo);
    }
    for (size_t c = 0; c < m->ncomp; c++)
        json_array_append_new(cs, json_string(m->comp[c]));
    size_t count[ST_COUNT] = {0};
    for (size_t c = 0; c < m->ncomp; c++)
        for (size_t f = 0; f < m->nfeat; f++) {
            cell *x = cell_at(m, c, f);
            count[x->status]++;
            char id[600];
            snprintf(id, sizeof id, "%s/%s", m->comp[c], m->feat[f].name);
            json_t *r = json_array();
            for (int k = 0; k < x->nreasons; k++)
                json_array_append_new(r, json_string(x->reasons[k]));
            json_t *pt = x->test_status == ST_ABSENT
                             ? json_null()
                             : json_pack("{s:s,s:I,s:I,s:I}", "status", st_name[x->test_status],
                                         "passed", (json_int_t)x->tests_passed, "failed",
                                         (json_int_t)x->tests_failed, "skipped",
                                         (json_int_t)x->tests_skipped);
            json_array_append_new(
                cells, json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o}", "id", id,
                                 "component", m->comp[c], "feature", m->feat[f].name, "status",
                                 st_name[x->status], "tensors", (json_int_t)x->tensors, "passed",
                                 (json_int_t)x->passed, "failed", (json_int_t)x->failed,
                                 "inherited", (json_int_t)x->inherited,
                                 "missing", (json_int_t)x->missing, "skipped",
                                 (json_int_t)x->skipped, "reasons", r, "pytest", pt));
        }
    json_object_set_new(o, "features", fs);
    json_object_set_new(o, "components", cs);
    json_object_set_new(o, "cells", cells);
    json_t *rq = nreq ? json_array() : json_null();
    for (size_t i = 0; i < nreq; i++)
        json_array_append_new(
            rq, json_pack("{s:s,s:s}", "id", reqs[i].id, "status",
                          st_name[cell_at(m, reqs[i].comp, reqs[i].feat)->status]));
    json_object_set_new(o, "requested", rq);
    json_t *tf = json_array();
    for (size_t i = 0; i < m->ntests; i++)
        json_array_append_new(tf, json_string(m->tests_path[i]));
    json_object_set_new(o, "tests", tf);
    json_object_set_new(o, "summary",
                        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "cells",
                                  (json_int_t)(m->ncomp * m->nfeat), "passed",
                                  (json_int_t)count[ST_PASSED], "failed",
                                  (json_int_t)count[ST_FAILED], "inherited",
                                  (json_int_t)count[ST_INHERITED], "skipped",
                                  (json_int_t)count[ST_SKIPPED], "absent",
                                  (json_int_t)count[ST_ABSENT]));
    return o;
}

static void html_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static int write_html(FILE *f, matrix *m, json_t *doc)
{
    static const char *const cls[] = {"absent", "pass", "skip", "inh", "fail"};
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>probe-matrix</title>\n"
          "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:3px 8px}td.pass{background:#dfd}"
          "td.fail{background:#fbb}td.inh{background:#fed}td.skip{background:#eee}"
          "td.absent{color:#999}"
          "th.c{text-align:left;font-family:monospace}</style></head><body>\n<h1>probe-matrix: ",
          f);
    fputs(strcmp(json_string_value(json_object_get(doc, "verdict")), "pass") ? "FAIL" : "PASS",
          f);
    fputs("</h1>\n<table id=\"matrix\"><tr><th>component</th>", f);
    for (size_t j = 0; j < m->nfeat; j++) {
        fputs("<th>", f);
        html_text(f, m->feat[j].name);
        fputs("</th>", f);
    }
    fputs("</tr>\n", f);
    for (size_t c = 0; c < m->ncomp; c++) {
        fputs("<tr><th class=\"c\">", f);
        html_text(f, m->comp[c]);
        fputs("</th>", f);
        for (size_t j = 0; j < m->nfeat; j++) {
            cell *x = cell_at(m, c, j);
            fprintf(f, "<td class=\"%s\" data-id=\"", cls[x->status]);
            html_text(f, m->comp[c]);
            fputc('/', f);
            html_text(f, m->feat[j].name);
            fputs("\" title=\"", f);
            for (int k = 0; k < x->nreasons; k++) {
                html_text(f, x->reasons[k]);
                fputs("&#10;", f);
            }
            fprintf(f, "\">%s</td>", st_name[x->status]);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n<script type=\"application/json\" id=\"probe-matrix-data\">", f);
    char *text = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text)
        return -1;
    /* "</" inside the inline JSON would end the script element. */
    for (const char *p = text; *p; p++) {
        if (p[0] == '<' && p[1] == '/')
            fputs("<\\", f);
        else
            fputc(*p, f);
    }
    free(text);
    fputs("</script>\n</body></html>\n", f);
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

static int write_out(const char *path, matrix *m, json_t *doc, int html)
{
    probe_outfile o;
    if (probe_outfile_open(&o, path) != 0) {
        fprintf(stderr, "probe-matrix: %s\n", o.err);
        return -1;
    }
    int rc = html ? write_html(o.f, m, doc)
                  : json_dumpf(doc, o.f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0 &&
                            fputc('\n', o.f) != EOF
                        ? 0
                        : -1;
    if (rc != 0) {
        int e = errno, kept = o.tmp != NULL;
        probe_outfile_abort(&o);
        fprintf(stderr, "probe-matrix: cannot write %s: %s%s\n", probe_tesc(path),
                strerror(e ? e : EIO), kept ? " (the file is unchanged)" : "");
        return -1;
    }
    if (probe_outfile_commit(&o) != 0) {
        fprintf(stderr, "probe-matrix: %s\n", o.err);
        return -1;
    }
    return 0;
}

static void print_table(FILE *out, matrix *m)
{
    int w = 9;
    for (size_t c = 0; c < m->ncomp; c++)
        if ((int)strlen(probe_tesc(m->comp[c])) > w)
            w = (int)strlen(probe_tesc(m->comp[c]));
    fprintf(out, "%-*s", w, "component");
    for (size_t f = 0; f < m->nfeat; f++) {
        const char *name = probe_tesc(m->feat[f].name);
        int fw = (int)strlen(name);
        fprintf(out, "  %-*s", fw < 4 ? 4 : fw, name);
    }
    fputc('\n', out);
    for (size_t c = 0; c < m->ncomp; c++) {
        fprintf(out, "%-*s", w, probe_tesc(m->comp[c]));
        for (size_t f = 0; f < m->nfeat; f++) {
            int fw = (int)strlen(probe_tesc(m->feat[f].name));
            fprintf(out, "  %-*s", fw < 4 ? 4 : fw, st_short[cell_at(m, c, f)->status]);
        }
        fputc('\n', out);
    }
    for (size_t c = 0; c < m->ncomp; c++)
        for (size_t f = 0; f < m->nfeat; f++) {
            cell *x = cell_at(m, c, f);
            if (x->status == ST_FAILED || x->status == ST_INHERITED)
                fprintf(out, "%s/%s: %s: %s\n", probe_tesc(m->comp[c]),
                        probe_tesc(m->feat[f].name), x->status == ST_FAILED ? "FAIL" : "inherited",
                        probe_tesc(x->nreasons ? x->reasons[0] : "failed"));
        }
}

/* The command line, parsed. */
typedef struct cli {
    const char *out_path, *html_path;
    const char **cell_args; /* the --cells lists */
    size_t ncell_args;
    const char **test_args; /* the --tests files */
    size_t ntest_args;
    int quiet;
} cli;

/* -1 to go on, else the exit status (0 after --help or --version, 2 after one line). */
static int parse_cli(cli *a, int argc, char **argv)
{
    enum { OPT_OUT = 256, OPT_HTML, OPT_CELLS, OPT_QUIET, OPT_HELP, OPT_VERSION, OPT_TESTS };
    static const struct option longopts[] = {
        {"out", required_argument, 0, OPT_OUT},     {"html", required_argument, 0, OPT_HTML},
        {"cells", required_argument, 0, OPT_CELLS}, {"cell", required_argument, 0, OPT_CELLS},
        {"quiet", no_argument, 0, OPT_QUIET},       {"help", no_argument, 0, OPT_HELP},
        {"version", no_argument, 0, OPT_VERSION},   {"tests", required_argument, 0, OPT_TESTS},
        {0, 0, 0, 0}};
    int c;
    if (!(a->cell_args = calloc((size_t)argc + 1, sizeof *a->cell_args)) ||
        !(a->test_args = calloc((size_t)argc + 1, sizeof *a->test_args))) {
        fprintf(stderr, "probe-matrix: out of memory\n");
        return 2;
    }
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_OUT: a->out_path = optarg; break;
        case OPT_HTML: a->html_path = optarg; break;
        case OPT_CELLS: a->cell_args[a->ncell_args++] = optarg; break;
        case OPT_TESTS: a->test_args[a->ntest_args++] = optarg; break;
        case OPT_QUIET: a->quiet = 1; break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        case OPT_VERSION: printf("probe-matrix %s\n", PROBE_VERSION); return 0;
        default:
            if (optopt)
                fprintf(stderr, "probe-matrix: option needs an argument or is unknown: %s\n",
                        argv[optind - 1]);
            else
                fprintf(stderr, "probe-matrix: unknown option '%s'\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind == argc && !a->ntest_args) {
        fprintf(stderr, "probe-matrix: expected FEATURE=COMPARE.json arguments or --tests "
                        "FILE, got none (--help for more)\n");
        return 2;
    }
    if (a->out_path && a->html_path && !strcmp(a->out_path, "-") && !strcmp(a->html_path, "-")) {
        fprintf(stderr, "probe-matrix: --out - and --html - cannot both write to stdout\n");
        return 2;
    }
    return -1;
}

/* Every FEATURE=COMPARE.json argument loaded into m, then classified. 0, or 2
 * after one line. */
static int load_features(matrix *m, const cli *a, int argc, char **argv)
{
    for (int i = optind; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq || eq == argv[i] || !eq[1]) {
            fprintf(stderr, "probe-matrix: '%s' is not FEATURE=COMPARE.json\n", argv[i]);
            return 2;
        }
        *eq = 0;
        if (strpbrk(argv[i], "/,")) {
            fprintf(stderr, "probe-matrix: feature name '%s' may not contain '/' or ','\n",
                    argv[i]);
            return 2;
        }
        for (size_t f = 0; f < m->nfeat; f++)
            if (!strcmp(m->feat[f].name, argv[i])) {
                fprintf(stderr, "probe-matrix: feature '%s' given twice\n", argv[i]);
                return 2;
            }
        if (m->nfeat == MAX_FEATURES) {
            fprintf(stderr, "probe-matrix: at most %d features\n", MAX_FEATURES);
            return 2;
        }
        m->feat[m->nfeat].name = argv[i];
        m->feat[m->nfeat].source = eq + 1;
        if (load_feature(m, m->nfeat))
            return 2;
        m->nfeat++;
    }
    for (size_t i = 0; i < a->ntest_args; i++)
        if (load_tests(m, a->test_args[i]))
            return 2;
    classify(m);
    return 0;
}

/* The requested cells (--cells lists): every id must name a known component
 * and feature. 0, or 2 after one line. */
static int parse_requests(const matrix *m, const cli *a, req **reqs, size_t *nreq)
{
    size_t capreq = 0;
    for (size_t k = 0; k < a->ncell_args; k++) {
        char *list = strdup(a->cell_args[k]), *save = NULL;
        if (!list) {
            fprintf(stderr, "probe-matrix: out of memory\n");
            return 2;
        }
        if (!list[strspn(list, ",")]) {
            fprintf(stderr, "probe-matrix: --cells '%s': empty list\n", probe_tesc(list));
            free(list);
            return 2;
        }
        if (list[0] == ',' || list[strlen(list) - 1] == ',' || strstr(list, ",,")) {
            fprintf(stderr, "probe-matrix: --cells '%s': empty cell id\n", probe_tesc(list));
            free(list);
            return 2;
        }
        for (char *id = strtok_r(list, ",", &save); id; id = strtok_r(NULL, ",", &save)) {
            if (*nreq == capreq) {
                capreq = capreq ? 2 * capreq : 16;
                req *r = realloc(*reqs, capreq * sizeof *r);
                if (!r) {
                    fprintf(stderr, "probe-matrix: out of memory\n");
                    free(list);
                    return 2;
                }
                *reqs = r;
            }
            if (parse_cell(m, id, &(*reqs)[*nreq])) {
                free(list);
                return 2;
            }
            (*nreq)++;
        }
        free(list);
    }
    return 0;
}

/* 1 when the requested cells (or, with none, every cell) pass. */
static int matrix_pass(matrix *m, const req *reqs, size_t nreq)
{
    int pass = 1;
    if (nreq) {
        for (size_t i = 0; i < nreq; i++) {
            int st = cell_at(m, reqs[i].comp, reqs[i].feat)->status;
            if (st == ST_FAILED || st == ST_INHERITED || st == ST_ABSENT)
                pass = 0;
        }
    } else {
        for (size_t ci = 0; ci < m->ncomp; ci++)
            for (size_t f = 0; f < m->nfeat; f++)
                if (cell_at(m, ci, f)->status >= ST_INHERITED)
                    pass = 0;
    }
    return pass;
}

/* The table, the requested cells and the summary line on human. */
static void print_summary(FILE *human, const cli *a, matrix *m, const req *reqs,
                          size_t nreq, json_t *doc, int pass)
{
    if (!a->quiet)
        print_table(human, m);
    for (size_t i = 0; i < nreq; i++) {
        const cell *x = cell_at(m, reqs[i].comp, reqs[i].feat);
        fprintf(human, "requested %s: %s%s%s\n", probe_tesc(reqs[i].id), st_name[x->status],
                x->nreasons ? ": " : "", probe_tesc(x->nreasons ? x->reasons[0] : ""));
    }
    json_t *sum = json_object_get(doc, "summary");
    fprintf(human, "%s: %zu components x %zu features: %lld passed, %lld failed, %lld inherited, "
                   "%lld skipped, %lld absent%s\n",
            pass ? "PASS" : "FAIL", m->ncomp, m->nfeat,
            (long long)json_integer_value(json_object_get(sum, "passed")),
            (long long)json_integer_value(json_object_get(sum, "failed")),
            (long long)json_integer_value(json_object_get(sum, "inherited")),
            (long long)json_integer_value(json_object_get(sum, "skipped")),
            (long long)json_integer_value(json_object_get(sum, "absent")),
            nreq ? " (exit status from the requested cells)" : "");
}

int main(int argc, char **argv)
{
    /* past RLIMIT_FSIZE a write fails with EFBIG (one line, the earlier output kept)
     * instead of the signal killing the tool */
    signal(SIGXFSZ, SIG_IGN);
    static matrix m;
    cli a = {0};
    req *reqs = NULL;
    size_t nreq = 0;
    json_t *doc = NULL;
    int rc = parse_cli(&a, argc, argv);
    if (rc >= 0)
        goto done;
    if ((rc = load_features(&m, &a, argc, argv)) || (rc = parse_requests(&m, &a, &reqs, &nreq)))
        goto done;
    int pass = matrix_pass(&m, reqs, nreq);
    doc = matrix_json(&m, reqs, nreq, pass);
    FILE *human = a.out_path && !strcmp(a.out_path, "-") ? stderr : stdout;
    if (a.html_path && !strcmp(a.html_path, "-"))
        human = stderr;
    print_summary(human, &a, &m, reqs, nreq, doc, pass);
    rc = pass ? 0 : 1;
    if (a.out_path && write_out(a.out_path, &m, doc, 0))
        rc = 2;
    if (a.html_path && write_out(a.html_path, &m, doc, 1))
        rc = 2;
done:
    json_decref(doc);
    for (size_t f = 0; f < m.nfeat; f++)
        json_decref(m.feat[f].doc);
    for (size_t i = 0; i < m.ntests; i++)
        json_decref(m.tests[i]);
    for (size_t i = 0; i < m.ncomp; i++)
        free(m.comp[i]);
    free(m.comp);
    free(m.cells);
    free(reqs);
    free(a.cell_args);
    free(a.test_args);
    return rc;
}
