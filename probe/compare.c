/* compare.c - match reference/candidate tensors by path, compute metrics,
 * apply gates, find the first failure in execution order (CONTRACT.md). */
#include "probe/compare.h"

#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int path_selected(const char *path, const char *const *only)
{
    if (!only || !only[0])
        return 1;
    for (size_t i = 0; only[i]; i++)
        if (fnmatch(only[i], path, 0) == 0)
            return 1;
    return 0;
}

static void add_reason(probe_gate_verdict *v, const char *fmt, const char *a, const char *b)
{
    if (v->nreasons >= PROBE_GATE_MAX_REASONS)
        return;
    /* A reason longer than the slot is cut: it is a one-line message. */
    if (snprintf(v->reasons[v->nreasons], sizeof v->reasons[0], fmt, a, b) < 0)
        v->reasons[v->nreasons][0] = 0;
    v->nreasons++;
}

static void shape_str(char *buf, size_t cap, int rank, const int64_t *shape)
{
    size_t len = 0;
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (int i = 0; i < rank && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < cap && snprintf(buf + len, cap - len, "]") < 0)
        buf[len] = 0;
}

static void offset_to_index(uint64_t off, int rank, const int64_t *shape, int64_t *idx)
{
    for (int d = rank - 1; d >= 0; d--) {
        uint64_t s = shape[d] > 0 ? (uint64_t)shape[d] : 1;
        idx[d] = (int64_t)(off % s);
        off /= s;
    }
}

/* Effective gate for one tensor: the requested gate, T2 thresholds looked up
 * per component/path, then the user's atol/rtol overrides. Returns 0 and fills
 * a failing verdict reason if T2 has no thresholds for it. */
static int tensor_gate(const probe_compare_opts *o, const probe_tensor_info *ti, probe_gate *g,
                       probe_gate_verdict *v)
{
    *g = o->gate;
    if (o->gate.kind == PROBE_GATE_T2) {
        if (!o->calibration ||
            probe_calibration_gate(o->calibration, ti->component, ti->path, g) != PROBE_OK) {
            add_reason(v, "no T2 thresholds for component '%s'%s in the calibration file",
                       ti->component, "");
            return 0;
        }
    }
    if (o->atol_set)
        g->atol = o->atol;
    if (o->rtol_set)
        g->rtol = o->rtol;
    return 1;
}

static probe_status compare_pair(probe_file *rf, size_t ri, probe_file *cf, size_t ci,
                                 const probe_compare_opts *o, probe_tensor_result *t)
{
    const probe_tensor_info *ct = probe_file_tensor(cf, ci);
    t->dtype_cand = ct->dtype;
    t->rank_cand = ct->rank;
    memcpy(t->shape_cand, ct->shape, sizeof t->shape_cand);
    t->verdict.pass = 1;
    t->verdict.nreasons = 0;

    int have_gate = tensor_gate(o, &t->ref, &t->gate, &t->verdict);

    int same_shape = t->ref.rank == ct->rank && t->ref.n == ct->n;
    for (int d = 0; same_shape && d < ct->rank; d++)
        same_shape = t->ref.shape[d] == ct->shape[d];
    if (!same_shape) {
        char a[256], b[256];
        shape_str(a, sizeof a, t->ref.rank, t->ref.shape);
        shape_str(b, sizeof b, ct->rank, ct->shape);
        t->verdict.pass = 0;
        add_reason(&t->verdict, "shape mismatch: reference %s, candidate %s", a, b);
        return PROBE_OK;
    }
    if ((t->ref.dtype == PROBE_DTYPE_BOOL) != (ct->dtype == PROBE_DTYPE_BOOL)) {
        t->verdict.pass = 0;
        add_reason(&t->verdict, "dtype mismatch: reference %s, candidate %s",
                   probe_dtype_name(t->ref.dtype), probe_dtype_name(ct->dtype));
        return PROBE_OK;
    }

    size_t n = (size_t)t->ref.n;
    double *r = NULL, *c = NULL;
    if (n) {
        if (n > SIZE_MAX / sizeof(double) / 2)
            return probe_set_error(PROBE_ENOMEM, "%s: %llu elements do not fit in memory",
                                   t->ref.path, (unsigned long long)n);
        r = malloc(n * sizeof *r);
        c = malloc(n * sizeof *c);
        if (!r || !c) {
            free(r);
            free(c);
            return probe_set_error(PROBE_ENOMEM, "%s: cannot allocate 2 x %zu doubles",
                                   t->ref.path, n);
        }
    }
    probe_status s = n ? probe_file_read_f64(rf, ri, r) : PROBE_OK;
    if (s == PROBE_OK && n)
        s = probe_file_read_f64(cf, ci, c);
    if (s == PROBE_OK) {
        probe_metrics_opts mo = {t->gate.atol, t->gate.rtol};
        s = probe_metrics_compute(r, c, n, &mo, &t->m);
    }
    if (s == PROBE_OK && o->want_stats) /* the report's data, while r and c are in memory */
        s = probe_tensor_stats_compute(r, c, n, t->ref.rank, t->ref.shape, &t->stats);
    free(r);
    free(c);
    if (s != PROBE_OK)
        return s;
    t->compared = 1;
    offset_to_index(t->m.max_abs_offset, t->ref.rank, t->ref.shape, t->max_abs_index);

    if (have_gate) {
        probe_gate_verdict gv;
        s = probe_gate_check(&t->gate, &t->m, &gv);
        if (s != PROBE_OK) {
            probe_tensor_stats_free(&t->stats);
            return s;
        }
        t->verdict = gv;
    } else {
        t->verdict.pass = 0;
    }
    return PROBE_OK;
}

static probe_status push_name(char (**arr)[512], size_t *n, const char *path)
{
    char (*p)[512] = realloc(*arr, (*n + 1) * sizeof **arr);
    if (!p)
        return probe_set_error(PROBE_ENOMEM, "out of memory listing missing tensors");
    *arr = p;
    snprintf(p[*n], sizeof p[*n], "%s", path);
    (*n)++;
    return PROBE_OK;
}

static probe_status collect_skips(probe_compare_result *res, const probe_file *f, const char *side)
{
    size_t k = probe_file_skip_count(f);
    if (!k)
        return PROBE_OK;
    probe_compare_skip *p = realloc(res->skipped, (res->nskipped + k) * sizeof *p);
    if (!p)
        return probe_set_error(PROBE_ENOMEM, "out of memory listing skipped captures");
    res->skipped = p;
    for (size_t i = 0; i < k; i++) {
        const probe_skip_info *si = probe_file_skip(f, i);
        probe_compare_skip *d = &res->skipped[res->nskipped++];
        snprintf(d->path, sizeof d->path, "%s", si->path);
        snprintf(d->side, sizeof d->side, "%s", side);
        snprintf(d->reason, sizeof d->reason, "%s", si->reason);
    }
    return PROBE_OK;
}

/* Run-level reasons (probe_compare_result.reasons): cut to one slot each. */
static void add_run_reason(probe_compare_result *res, const char *fmt, ...)
{
    if (res->nreasons >= PROBE_COMPARE_MAX_REASONS)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (vsnprintf(res->reasons[res->nreasons], sizeof res->reasons[0], fmt, ap) < 0)
        res->reasons[res->nreasons][0] = 0;
    va_end(ap);
    res->nreasons++;
}

static uint64_t tensor_bytes(const probe_tensor_info *ti)
{
    return (uint64_t)ti->n * (uint64_t)probe_dtype_size(ti->dtype);
}

probe_status probe_compare_files(const char *reference, const char *candidate,
                                 const probe_compare_opts *opts, probe_compare_result **out)
{
    if (!reference || !candidate || !opts || !out)
        return probe_set_error(PROBE_EINVAL, "probe_compare_files: NULL argument");
    if (opts->gate.kind == PROBE_GATE_T2 && !opts->calibration)
        return probe_set_error(PROBE_EINVAL, "gate T2 needs a calibration file");
    *out = NULL;

    probe_file *rf = NULL, *cf = NULL;
    probe_status s = probe_file_open(reference, &rf);
    if (s != PROBE_OK)
        return s;
    s = probe_file_open(candidate, &cf);
    if (s != PROBE_OK) {
        probe_file_close(rf);
        return s;
    }

    probe_compare_result *res = calloc(1, sizeof *res);
    size_t nref = probe_file_count(rf), ncand = probe_file_count(cf);
    if (!res || (nref && !(res->tensors = calloc(nref, sizeof *res->tensors)))) {
        s = probe_set_error(PROBE_ENOMEM, "out of memory");
        goto fail;
    }
    snprintf(res->reference, sizeof res->reference, "%s", reference);
    snprintf(res->candidate, sizeof res->candidate, "%s", candidate);
    res->gate = opts->gate;
    if (opts->atol_set)
        res->gate.atol = opts->atol;
    if (opts->rtol_set)
        res->gate.rtol = opts->rtol;
    res->first_failure = -1;
    res->pass = 1;
    res->expect_identical = opts->expect_identical != 0;

    size_t sel_total = 0, sel_done = 0, ndiffer = 0;
    char first_differ[512] = "";
    uint64_t bytes_total = 0, bytes_done = 0;
    for (size_t i = 0; opts->progress && i < nref; i++)
        if (path_selected(probe_file_tensor(rf, i)->path, opts->only)) {
            sel_total++;
            bytes_total += tensor_bytes(probe_file_tensor(rf, i));
        }
    for (size_t i = 0; i < nref; i++) {
        const probe_tensor_info *ti = probe_file_tensor(rf, i);
        if (!path_selected(ti->path, opts->only))
            continue;
        if (opts->progress && sel_done)
            opts->progress(opts->progress_ctx, sel_done, sel_total, bytes_done, bytes_total);
        sel_done++;
        bytes_done += tensor_bytes(ti);
        size_t ci;
        if (probe_file_find(cf, ti->path, &ci) != PROBE_OK) {
            if ((s = push_name(&res->missing_in_candidate, &res->nmissing_cand, ti->path)))
                goto fail;
            res->pass = 0;
            if (!res->first_failure_path[0])
                snprintf(res->first_failure_path, sizeof res->first_failure_path, "%s", ti->path);
            continue;
        }
        probe_tensor_result *t = &res->tensors[res->ntensors];
        t->ref = *ti;
        if ((s = compare_pair(rf, i, cf, ci, opts, t)) != PROBE_OK)
            goto fail;
        if (!t->compared || !t->m.identical) {
            res->feature_active = 1;
            if (!ndiffer++)
                snprintf(first_differ, sizeof first_differ, "%s", ti->path);
            if (opts->expect_identical) {
                t->verdict.pass = 0;
                add_reason(&t->verdict, "not identical: %s%s", "the pair is expected to be "
                           "bit-identical (--expect-identical)", "");
            }
        }
        if (!t->verdict.pass) {
            res->pass = 0;
            if (!res->first_failure_path[0]) {
                res->first_failure = (long)res->ntensors;
                snprintf(res->first_failure_path, sizeof res->first_failure_path, "%s", ti->path);
            }
        }
        res->ntensors++;
    }
    for (size_t i = 0; i < ncand; i++) {
        const probe_tensor_info *ti = probe_file_tensor(cf, i);
        size_t ri;
        if (!path_selected(ti->path, opts->only) || probe_file_find(rf, ti->path, &ri) == PROBE_OK)
            continue;
        if ((s = push_name(&res->missing_in_reference, &res->nmissing_ref, ti->path)))
            goto fail;
        res->pass = 0;
    }
    if ((s = collect_skips(res, rf, "reference")) || (s = collect_skips(res, cf, "candidate")))
        goto fail;
    res->ignored_ref = probe_file_ignored_count(rf);
    res->ignored_cand = probe_file_ignored_count(cf);
    if (res->ntensors == 0 && res->nmissing_cand == 0 && res->nmissing_ref == 0) {
        /* Nothing matched: a gate that checked nothing must not pass. */
        res->nothing_compared = 1;
        res->pass = 0;
        add_run_reason(res, "nothing compared: no dataset path is in both files");
    } else if (opts->expect_identical && ndiffer) {
        res->pass = 0;
        add_run_reason(res, "not identical: %zu of %zu compared tensors differ from the reference "
                       "(first: %s)", ndiffer, res->ntensors, first_differ);
    } else if (!opts->expect_identical && res->ntensors && !res->feature_active) {
        /* A candidate equal to the reference everywhere did not exercise the feature. */
        res->feature_not_active = 1;
        res->pass = 0;
        add_run_reason(res, "feature not active: the candidate is identical to the reference in "
                       "every compared tensor");
    }
    if (opts->progress && sel_done)
        opts->progress(opts->progress_ctx, sel_done, sel_total, bytes_done, bytes_total);

    probe_file_close(rf);
    probe_file_close(cf);
    *out = res;
    return PROBE_OK;
fail:
    probe_compare_result_free(res);
    probe_file_close(rf);
    probe_file_close(cf);
    return s;
}

void probe_compare_result_free(probe_compare_result *r)
{
    if (!r)
        return;
    for (size_t i = 0; r->tensors && i < r->ntensors; i++)
        probe_tensor_stats_free(&r->tensors[i].stats);
    free(r->tensors);
    free(r->missing_in_candidate);
    free(r->missing_in_reference);
    free(r->skipped);
    free(r);
}
