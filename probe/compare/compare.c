/* compare.c - match reference/candidate tensors by path, compute metrics,
 * apply gates, find the first failure in execution order (docs/compare-json.md). */
#include "probe/compare.h"
#include "experiment.h"
#include "identity.h"

#include "device_loader.h"
#include "engine.h"
#include "probe/components.h"
#include "probe/rankset.h"
#include "probe/calibration_file.h"

#include <fnmatch.h>
#include <jansson.h>
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

/* The table name of a tapped component: a call on a thread other than the
 * main one is "<component>@<thread>" (docs/components.md, threads), judged as
 * <component>. */
static const char *table_component(const char *component, char *buf, size_t n)
{
    const char *at = strchr(component, '@');
    if (!at)
        return component;
    snprintf(buf, n, "%.*s", (int)(at - component), component);
    return buf;
}

/* Effective gate for one tensor: the requested gate, T2 thresholds looked up
 * per component/path, then the user's atol/rtol overrides. Returns 0 and fills
 * a failing verdict reason if T2 has no thresholds for it. */
static int tensor_gate(const probe_compare_opts *o, const probe_tensor_info *ti, probe_gate *g,
                       probe_gate_verdict *v)
{
    char base[sizeof ti->component];
    *g = o->gate;
    if (o->gate.kind == PROBE_GATE_T2) {
        if (!o->calibration ||
            probe_calibration_gate(o->calibration,
                                   table_component(ti->component, base, sizeof base), ti->path,
                                   g) != PROBE_OK) {
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

typedef struct {
    probe_file *f[2];
    size_t idx[2];
} file_pair;

static probe_status file_pair_read(void *ctx, int side, uint64_t offset, size_t count, void *dst)
{
    file_pair *fp = ctx;
    return probe_file_read_range(fp->f[side], fp->idx[side], offset, count, dst);
}

/* Both sides as logical tensors of rank sets (a plain file is a set of one):
 * a joined tensor is read from its pieces block by block (rankset.c). */
typedef struct {
    probe_rankset *s[2];
    size_t idx[2];
    uint64_t off[2]; /* element offset of the compared part (a CFG half: h * its size) */
} set_pair;

static probe_status set_pair_read(void *ctx, int side, uint64_t offset, size_t count, void *dst)
{
    set_pair *sp = ctx;
    return probe_rankset_read_range(sp->s[side], sp->idx[side], sp->off[side] + offset, count, dst);
}

/* The manifest key "cfg_batch" of a capture (docs/components.md "Steps and CFG
 * branches"): the dit.step calls whose inputs and outputs hold both CFG branches
 * along axis 0, and the branch of each half. n 0: none (or a malformed key). */
typedef struct {
    size_t n;
    int64_t *calls;
    char order[2][8];
} cfg_batch;

static probe_status cfg_batch_parse(const char *manifest, cfg_batch *cb)
{
    memset(cb, 0, sizeof *cb);
    json_t *root = manifest ? json_loads(manifest, 0, NULL) : NULL;
    json_t *k = root ? json_object_get(root, "cfg_batch") : NULL;
    json_t *calls = k ? json_object_get(k, "calls") : NULL;
    json_t *order = k ? json_object_get(k, "order") : NULL;
    probe_status s = PROBE_OK;
    if (json_is_array(calls) && json_array_size(calls) && json_is_array(order) &&
        json_array_size(order) == 2) {
        int ok = 1;
        for (int h = 0; h < 2; h++) {
            const char *r = json_string_value(json_array_get(order, (size_t)h));
            if (!r || (strcmp(r, "cond") && strcmp(r, "uncond")))
                ok = 0;
            else
                snprintf(cb->order[h], sizeof cb->order[h], "%s", r);
        }
        if (ok && !strcmp(cb->order[0], cb->order[1]))
            ok = 0;
        size_t n = json_array_size(calls);
        if (ok && !(cb->calls = malloc(n * sizeof *cb->calls)))
            s = probe_set_error(PROBE_ENOMEM, "out of memory reading the manifest's cfg_batch");
        for (size_t i = 0; ok && cb->calls && i < n; i++) {
            json_t *c = json_array_get(calls, i);
            if (!json_is_integer(c) || json_integer_value(c) < 0)
                ok = 0;
            else
                cb->calls[cb->n++] = json_integer_value(c);
        }
        if (!ok) {
            free(cb->calls);
            cb->calls = NULL;
            cb->n = 0;
        }
    }
    json_decref(root);
    return s;
}

static int cfg_batch_has(const cfg_batch *cb, int64_t call)
{
    for (size_t i = 0; i < cb->n; i++)
        if (cb->calls[i] == call)
            return 1;
    return 0;
}

/* The dit.step call a tensor belongs to (its own, or its parent's when it is
 * nested in one), or -1. */
static int64_t dit_call_of(const probe_tensor_info *ti)
{
    if (ti->parent[0]) {
        const char *p = ti->parent;
        if (strncmp(p, "/dit.step/", 10) || !p[10])
            return -1;
        char *end;
        long long c = strtoll(p + 10, &end, 10);
        return *end || c < 0 ? -1 : c;
    }
    return strcmp(ti->component, "dit.step") ? -1 : ti->call;
}

/* A split pair for reference tensor ti of a two-call capture (branch 0 cond,
 * 1 uncond: diffusers' order): the candidate tensor of the batched call of the
 * same step with the same component, block and slot, and the half that holds
 * ti's branch. 1 when found. */
static int cfg_split_find(const probe_rankset *cset, const cfg_batch *cb,
                          const probe_tensor_info *ti, size_t *ci, int *half)
{
    if (dit_call_of(ti) < 0 || ti->step < 0 || (ti->cfg_branch != 0 && ti->cfg_branch != 1))
        return 0;
    const char *role = ti->cfg_branch == 0 ? "cond" : "uncond";
    *half = strcmp(cb->order[0], role) ? 1 : 0;
    size_t n = probe_rankset_count(cset);
    for (size_t j = 0; j < n; j++) {
        const probe_tensor_info *c = &probe_rankset_entry_at(cset, j)->info;
        if (c->step == ti->step && c->block == ti->block && !strcmp(c->slot, ti->slot) &&
            !strcmp(c->component, ti->component) && cfg_batch_has(cb, dit_call_of(c))) {
            *ci = j;
            return 1;
        }
    }
    return 0;
}

/* The channel axis of tensor ti (compare.h: option, table, layout rule) as a
 * spec; t->channel_axis/-_from say which. spec->count stays 0 when none. */
static void channel_axis_of(const probe_compare_opts *o, const probe_tensor_info *ti,
                            probe_tensor_result *t, probe_channel_spec *spec)
{
    int axis = PROBE_NO_CHANNEL_AXIS;
    const char *from = NULL;
    if (o->channel_axis_set) {
        axis = o->channel_axis;
        from = "option";
    } else {
        char base[sizeof ti->component];
        const char *comp = table_component(ti->component, base, sizeof base);
        for (size_t i = 0; o->class_axes && i < o->n_class_axes && ti->class_name[0]; i++) {
            const probe_class_axis *ca = &o->class_axes[i];
            if (ca->rank == ti->rank && strcmp(ca->component, comp) == 0 &&
                fnmatch(ca->class_glob, ti->class_name, 0) == 0) {
                axis = ca->axis;
                from = "table";
                break;
            }
        }
        for (size_t i = 0; !from && o->axis_components && o->axis_components[i]; i++)
            if (strcmp(o->axis_components[i], comp) == 0) {
                if (o->axis_values[i] != PROBE_NO_CHANNEL_AXIS && o->axis_ranks[i] == ti->rank) {
                    axis = o->axis_values[i];
                    from = "table";
                }
                break;
            }
        if (!from && probe_channel_axis_by_layout(ti->rank) >= 0) {
            axis = probe_channel_axis_by_layout(ti->rank);
            from = "layout";
        }
    }
    t->channel_axis = -1;
    t->channel_axis_from = NULL;
    if (!from)
        return;
    if (axis < 0 && axis != PROBE_NO_CHANNEL_AXIS)
        axis += ti->rank;
    if (axis < 0 || axis >= ti->rank || ti->shape[axis] <= 0 ||
        (uint64_t)ti->shape[axis] > PROBE_CHANNELS_MAX)
        return;
    uint64_t inner = 1;
    for (int d = axis + 1; d < ti->rank; d++)
        inner *= (uint64_t)ti->shape[d];
    if (inner == 0)
        return;
    spec->count = (uint64_t)ti->shape[axis];
    spec->inner = inner;
    t->channel_axis = axis;
    t->channel_axis_from = from;
}

double probe_summary_rel_l2_lower_bound(const probe_summary *ref, const probe_summary *cand)
{
    if (!ref || !cand || ref->nan || ref->inf || cand->nan || cand->inf)
        return NAN;
    double nr = sqrt(ref->sum_sq), nc = sqrt(cand->sum_sq);
    if (nr == 0)
        return nc == 0 ? 0.0 : INFINITY;
    return fabs(nc - nr) / nr;
}

/* A pair of which at least one side is a stats-only record: identical by
 * dtype, shape and hash, or else only the bounds the summaries prove
 * (compare.h, docs/compare-json.md "Stats-only pairs"). Called after the
 * shape check; have_gate as in compare_pair. */
static probe_status compare_stats_only(probe_file *rf, size_t ri, probe_file *cf, size_t ci,
                                       int have_gate, probe_tensor_result *t)
{
    const probe_tensor_info *ct = probe_file_tensor(cf, ci);
    probe_summary *sr = &t->summary_ref, *sc = &t->summary_cand;
    probe_status s;
    if ((s = probe_file_summary(rf, ri, sr)) != PROBE_OK ||
        (s = probe_file_summary(cf, ci, sc)) != PROBE_OK)
        return s;
    int same_hash;
    if ((s = probe_file_hash_match(rf, ri, cf, ci, &same_hash)) != PROBE_OK)
        return s;
    t->stats_only = 1;
    t->rel_l2_lower_bound = probe_summary_rel_l2_lower_bound(sr, sc);
    t->mean_shift = sr->n_finite && sc->n_finite
                        ? sc->sum / (double)sc->n_finite - sr->sum / (double)sr->n_finite
                        : NAN;
    if (t->ref.dtype == ct->dtype && same_hash) {
        /* Same bytes: every metric of identical tensors is exact. */
        probe_metrics *m = &t->m;
        memset(m, 0, sizeof *m);
        m->n = t->ref.n;
        m->n_finite = sr->n_finite;
        m->rel_l2 = 0;
        m->cosine = 1;
        m->p99_abs = m->mean_abs = sr->n_finite ? 0.0 : NAN;
        m->nan_ref = m->nan_cand = sr->nan;
        m->inf_ref = m->inf_cand = sr->inf;
        m->zero_norm_reference = sr->sum_sq == 0;
        m->identical = 1;
        m->mismatch_ulps_max = m->max_abs_ulps_scale = NAN;
        m->norm_ref = m->norm_cand = sqrt(sr->sum_sq);
        m->dot = sr->sum_sq;
        t->compared = 1;
        t->channel_axis = -1;
        if (have_gate) {
            probe_gate_verdict gv;
            if ((s = probe_gate_check(&t->gate, m, &gv)) != PROBE_OK)
                return s;
            t->verdict = gv;
        } else {
            t->verdict.pass = 0;
        }
        return PROBE_OK;
    }
    t->verdict.pass = 0;
    t->channel_axis = -1;
    char b[64] = "", lim[64];
    if (isnan(t->rel_l2_lower_bound))
        snprintf(b, sizeof b, "unknown: a side holds NaN or Inf");
    else
        snprintf(b, sizeof b, "%.6g", t->rel_l2_lower_bound);
    if (sc->nan) {
        snprintf(lim, sizeof lim, "%llu", (unsigned long long)sc->nan);
        add_reason(&t->verdict, "NaN in candidate: %s element%s", lim, sc->nan == 1 ? "" : "s");
    }
    if (have_gate && t->rel_l2_lower_bound > t->gate.rel_l2_max) {
        snprintf(lim, sizeof lim, "%.6g", t->gate.rel_l2_max);
        add_reason(&t->verdict, "stats-only: rel_l2 >= %s exceeds rel_l2_max %s (lower bound from "
                   "the norms)", b, lim);
    } else if (have_gate && !sc->nan) {
        add_reason(&t->verdict, "stats-only: not identical, the gate needs the tensors (rel_l2 >= "
                   "%s)%s", b, "");
    }
    return PROBE_OK;
}

/* One side of a pair: a logical tensor of a rank set, or a tensor of a plain file. */
typedef struct {
    probe_rankset *s;
    probe_file *f;
    size_t idx;
} tensor_side;

typedef struct {
    tensor_side side[2];
} any_pair;

static probe_status any_pair_read(void *ctx, int side, uint64_t offset, size_t count, void *dst)
{
    const tensor_side *x = &((any_pair *)ctx)->side[side];
    return x->s ? probe_rankset_read_range(x->s, x->idx, offset, count, dst)
                : probe_file_read_range(x->f, x->idx, offset, count, dst);
}

/* Metrics of one pair on the device the options name, with the channel spec (count 0:
 * none) and the per-channel arrays (NULL: not wanted). */
static probe_status pair_metrics(const probe_compare_opts *o, const probe_pair_source *src,
                                 const probe_metrics_opts *mo, probe_channel_spec spec,
                                 double *shift_out, double *se_out, double *n_out,
                                 probe_metrics *m, probe_channel_shift *shift)
{
    probe_stream_opts so = {o->threads, spec, shift_out, se_out, n_out};
    if (o->use_cuda) {
        probe_cuda_source_v2_fn fn;
        probe_status s = probe_cuda_load_v2(&fn);
        if (s == PROBE_OK)
            s = fn(o->cuda_device, src, mo, &so, m, shift);
        return s;
    }
    return probe_metrics_compute_source(src, mo, &so, m, shift);
}

/* Per-channel arrays of one pair (shift, standard error, count), or all NULL. */
typedef struct {
    double *shift, *se, *n;
} chan_arrays;

static probe_status chan_alloc(chan_arrays *a, uint64_t count, const char *path)
{
    a->shift = a->se = a->n = NULL;
    if (!count)
        return PROBE_OK;
    a->shift = malloc((size_t)count * sizeof(double));
    a->se = malloc((size_t)count * sizeof(double));
    a->n = malloc((size_t)count * sizeof(double));
    if (a->shift && a->se && a->n)
        return PROBE_OK;
    free(a->shift);
    free(a->se);
    free(a->n);
    a->shift = a->se = a->n = NULL;
    return probe_set_error(PROBE_ENOMEM, "%s: cannot allocate the channel statistics", path);
}

static void chan_free(chan_arrays *a)
{
    free(a->shift);
    free(a->se);
    free(a->n);
}

/* The index of t's path in f when f holds it in full with t's reference shape, else -1. */
static long same_shaped(probe_file *f, const probe_tensor_result *t)
{
    size_t i;
    if (!f || probe_file_find(f, t->ref.path, &i) != PROBE_OK)
        return -1;
    const probe_tensor_info *x = probe_file_tensor(f, i);
    int same = !x->stats_only && x->rank == t->ref.rank && x->n == t->ref.n &&
               (x->dtype == PROBE_DTYPE_BOOL) == (t->ref.dtype == PROBE_DTYPE_BOOL);
    for (int d = 0; same && d < x->rank; d++)
        same = x->shape[d] == t->ref.shape[d];
    return same ? (long)i : -1;
}

/* The oracle verdict of candidate side cs (element type cd) for tensor t: metrics of
 * (o, r) and (o, cs) with the channel spec, read against the pair (r, cs) whose
 * metrics and per-channel arrays are pair / pc (pc->shift NULL: no channel test). */
static probe_status oracle_verdict_of(const probe_compare_opts *o, probe_file *of, size_t oi,
                                      tensor_side rs, tensor_side cs, probe_dtype cd,
                                      probe_channel_spec spec, const probe_metrics *pair,
                                      const chan_arrays *pc, const probe_tensor_result *t,
                                      probe_metrics *m_or, probe_metrics *m_oc,
                                      probe_oracle_verdict *v)
{
    tensor_side os = {NULL, of, oi};
    probe_dtype od = probe_file_tensor(of, oi)->dtype;
    probe_metrics_opts mo = {t->gate.atol, t->gate.rtol};
    double *b[2] = {NULL, NULL};
    uint64_t nch = pc->shift ? spec.count : 0;
    probe_status s = PROBE_OK;
    for (int k = 0; k < 2 && nch; k++)
        if (!(b[k] = malloc((size_t)nch * sizeof(double))))
            s = probe_set_error(PROBE_ENOMEM, "%s: cannot allocate the channel statistics",
                                t->ref.path);
    probe_channel_shift sh;
    for (int k = 0; k < 2 && s == PROBE_OK; k++) {
        any_pair ap = {{os, k ? cs : rs}};
        probe_pair_source src = {t->ref.n, {od, k ? cd : t->ref.dtype}, any_pair_read, &ap};
        s = pair_metrics(o, &src, &mo, nch ? spec : (probe_channel_spec){0, 0}, b[k], NULL, NULL,
                         k ? m_oc : m_or, &sh);
    }
    if (s == PROBE_OK)
        s = probe_oracle_check(m_or, m_oc, pair, b[0], b[1], pc->se, pc->n, nch, &t->sys,
                               o->oracle_headroom, v);
    free(b[0]);
    free(b[1]);
    return s;
}

/* The oracle's view of a compared tensor (as run): has_oracle 0 when the oracle does not
 * hold the path with the reference's shape. */
static probe_status oracle_pair(const probe_compare_opts *o, probe_file *of, tensor_side rs,
                                tensor_side cs, probe_channel_spec spec, const chan_arrays *pc,
                                probe_tensor_result *t)
{
    long oi = same_shaped(of, t);
    if (oi < 0)
        return PROBE_OK;
    probe_status s = oracle_verdict_of(o, of, (size_t)oi, rs, cs, t->dtype_cand, spec, &t->m, pc,
                                       t, &t->m_oracle_ref, &t->m_oracle_cand, &t->oracle);
    /* an oracle that holds the reference's very bytes here computed this tensor as the
     * reference did (no higher precision): it cannot judge it */
    t->oracle_same = s == PROBE_OK && t->m_oracle_ref.identical;
    t->has_oracle = s == PROBE_OK && !t->oracle_same;
    return s;
}

/* With an oracle and an isolated run: the oracle verdict of the isolated output (the
 * candidate component on the reference's inputs) against the reference's, which decides
 * in attribution whether the component introduced a difference. Outputs only. */
static probe_status isolate_oracle(probe_file *rf, size_t ri, probe_file *isof, probe_file *of,
                                   const probe_compare_opts *o, probe_tensor_result *t)
{
    long ii = same_shaped(isof, t), oi = same_shaped(of, t);
    if (!t->has_isolated || !t->has_oracle || ii < 0 || oi < 0 ||
        !strncmp(t->ref.slot, "in.", 3))
        return PROBE_OK;
    probe_channel_spec spec = {0, 0};
    channel_axis_of(o, &t->ref, &(probe_tensor_result){.channel_axis = -1}, &spec);
    chan_arrays pc;
    probe_status s = chan_alloc(&pc, o->use_cuda ? 0 : spec.count, t->ref.path);
    tensor_side rs = {NULL, rf, ri}, is = {NULL, isof, (size_t)ii};
    probe_dtype idt = probe_file_tensor(isof, (size_t)ii)->dtype;
    probe_metrics pair, m_or;
    probe_channel_shift sh;
    if (s == PROBE_OK) {
        any_pair ap = {{rs, is}};
        probe_pair_source src = {t->ref.n, {t->ref.dtype, idt}, any_pair_read, &ap};
        probe_metrics_opts mo = {t->gate.atol, t->gate.rtol};
        s = pair_metrics(o, &src, &mo, pc.shift ? spec : (probe_channel_spec){0, 0}, pc.shift,
                         pc.se, pc.n, &pair, &sh);
    }
    if (s == PROBE_OK)
        s = oracle_verdict_of(o, of, (size_t)oi, rs, is, idt, spec, &pair, &pc, t, &m_or,
                              &t->m_oracle_isolated, &t->oracle_isolated);
    t->has_oracle_isolated = s == PROBE_OK;
    chan_free(&pc);
    return s;
}

static void reason_f(probe_gate_verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reason_f(probe_gate_verdict *v, const char *fmt, ...)
{
    v->pass = 0;
    if (v->nreasons >= PROBE_GATE_MAX_REASONS)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (vsnprintf(v->reasons[v->nreasons], sizeof v->reasons[0], fmt, ap) < 0)
        v->reasons[v->nreasons][0] = 0;
    va_end(ap);
    v->nreasons++;
}

/* The tensor's headline verdict from its gate verdict (already in t->verdict), the
 * systematic test and the oracle verdict (compare.h probe_tensor_result.verdict). */
static probe_status headline_verdict(const probe_compare_opts *o, probe_tensor_result *t)
{
    /* T2's structure thresholds belong to the gate (docs/gates.md "T2") */
    if (t->compared && t->gate.kind == PROBE_GATE_T2) {
        const probe_systematic *sy = &t->sys;
        double channel_noise = sy->computed && sy->channels ? sy->channel_limit : NAN;
        /* per-channel thresholds, where the path has them, stand in for the largest |z|'s */
        int by_channel = t->gate.channel_z_count && t->channel_z;
        probe_status s = probe_gate_check_structure(
            &t->gate, &t->m, t->shift.count && !by_channel ? &t->shift : NULL, channel_noise,
            sy->computed ? sy->gain_limit : NAN, &t->verdict);
        if (s == PROBE_OK && by_channel)
            s = probe_gate_check_channels(&t->gate, t->channel_z, t->shift.count, channel_noise,
                                          &t->verdict);
        if (s != PROBE_OK)
            return s;
    }
    t->gate_verdict = t->verdict;
    if (!t->compared)
        return PROBE_OK;
    if (t->has_oracle) {
        probe_gate unchecked;
        probe_status s = probe_gate_parse("T2", &unchecked);
        if (s == PROBE_OK)
            s = probe_gate_check(&unchecked, &t->m, &t->verdict);
        if (s != PROBE_OK)
            return s;
        const probe_oracle_verdict *ov = &t->oracle;
        if (ov->ratio_fail)
            reason_f(&t->verdict, "less accurate than the reference: error against the oracle "
                     "%.3g x the reference's (limit %.3g; %.3e vs %.3e)", ov->ratio, ov->limit,
                     ov->err_candidate, ov->err_reference);
        if (ov->gain_fail)
            reason_f(&t->verdict, "gain error farther from the oracle than the reference's: "
                     "excess %.3g (z limit %.3g), alpha %.3e vs %.3e", ov->gain_excess,
                     t->sys.gain_limit, t->m_oracle_cand.gain, t->m_oracle_ref.gain);
        if (ov->channel_fail)
            reason_f(&t->verdict, "channel %llu farther from the oracle than the reference: "
                     "excess %.3g (z limit %.3g), size %.2e of ||r||",
                     (unsigned long long)ov->channel, ov->channel_excess, t->sys.channel_limit,
                     ov->channel_excess_size);
        return PROBE_OK;
    }
    if (o->gate.kind == PROBE_GATE_T2 || o->expect_identical || !t->sys.computed)
        return PROBE_OK;
    if (t->sys.gain_fail)
        reason_f(&t->verdict, "systematic gain error %.3e (z %.3g > %.3g): c ~ (1 %+.3e) r, beyond "
                 "rounding noise", t->m.gain, t->m.gain_z, t->sys.gain_limit, t->m.gain);
    if (t->sys.channel_fail)
        reason_f(&t->verdict, "systematic shift of channel %llu: %.3e (z %.3g > %.3g, size %.2e of "
                 "||r||), beyond rounding noise", (unsigned long long)t->sys.channel,
                 t->sys.channel_shift, t->sys.channel_z, t->sys.channel_limit, t->sys.channel_size);
    return PROBE_OK;
}

static probe_status compare_pair(probe_rankset *rset, size_t ri, probe_rankset *cset, size_t ci,
                                 probe_file *of, const probe_compare_opts *o,
                                 probe_tensor_result *t)
{
    const probe_rankset_entry *re = probe_rankset_entry_at(rset, ri);
    const probe_rankset_entry *ce = probe_rankset_entry_at(cset, ci);
    const probe_tensor_info *ct = &ce->info;
    probe_tensor_info half_info;
    uint64_t cand_off = 0;
    if (t->cfg_half >= 0 && ct->rank >= 1 && t->ref.rank == ct->rank &&
        ct->shape[0] == 2 * t->ref.shape[0]) {
        half_info = *ct;
        half_info.shape[0] = ct->shape[0] / 2;
        half_info.n = ct->n / 2;
        cand_off = (uint64_t)t->cfg_half * half_info.n;
        ct = &half_info;
    }
    if (t->cfg_half >= 0)
        of = NULL; /* the oracle holds the reference's calls, not the batched one */
    t->dtype_cand = ct->dtype;
    t->rank_cand = ct->rank;
    memcpy(t->shape_cand, ct->shape, sizeof t->shape_cand);
    t->verdict.pass = 1;
    t->verdict.nreasons = 0;

    int have_gate = tensor_gate(o, &t->ref, &t->gate, &t->verdict);
    t->no_thresholds = !have_gate;

    for (int k = 0; k < 2; k++) {
        const probe_rankset_entry *e = k ? ce : re;
        if (e->error[0]) {
            t->verdict.pass = 0;
            add_reason(&t->verdict, "%s: %s", k ? "candidate" : "reference", e->error);
            return PROBE_OK;
        }
    }
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

    t->rel_l2_lower_bound = t->mean_shift = NAN;
    if ((t->ref.stats_only || ct->stats_only) && t->cfg_half >= 0) {
        t->verdict.pass = 0;
        add_reason(&t->verdict, "stats-only: a CFG half of a batched call has no summary%s%s", "", "");
        return PROBE_OK;
    }
    if (t->ref.stats_only || ct->stats_only) {
        probe_file *rf, *cf;
        size_t rfi, cfi;
        if (probe_rankset_single(rset, ri, &rf, &rfi) && probe_rankset_single(cset, ci, &cf, &cfi))
            return compare_stats_only(rf, rfi, cf, cfi, have_gate, t);
        t->verdict.pass = 0;
        add_reason(&t->verdict, "stats-only: a joined tensor has no stats-only summary%s%s", "", "");
        return PROBE_OK;
    }

    set_pair fp = {{rset, cset}, {ri, ci}, {0, cand_off}};
    probe_pair_source src = {t->ref.n, {t->ref.dtype, ct->dtype}, set_pair_read, &fp};
    probe_metrics_opts mo = {t->gate.atol, t->gate.rtol};
    probe_channel_spec spec = {0, 0};
    channel_axis_of(o, &t->ref, t, &spec);
    chan_arrays pc;
    probe_status s = chan_alloc(&pc, spec.count, t->ref.path);
    if (s != PROBE_OK)
        return s;
    s = pair_metrics(o, &src, &mo, spec, pc.shift, pc.se, pc.n, &t->m, &t->shift);
    if (s == PROBE_OK)
        s = probe_systematic_check(&t->m, pc.shift, pc.se, pc.n, pc.shift ? spec.count : 0,
                                   t->gate.rel_l2_max, &t->sys);
    if (s == PROBE_OK && of)
        s = oracle_pair(o, of, (tensor_side){rset, NULL, ri}, (tensor_side){cset, NULL, ci}, spec,
                        &pc, t);
    double *z = NULL; /* every channel's z: kept for calibration, or for per-channel T2 */
    if (s == PROBE_OK && pc.shift && t->shift.count &&
        (o->keep_channel_z || (t->gate.kind == PROBE_GATE_T2 && t->gate.channel_z_count))) {
        if (!(z = malloc((size_t)spec.count * sizeof *z)))
            s = probe_set_error(PROBE_ENOMEM, "%s: cannot allocate the channel statistics",
                                t->ref.path);
        else
            s = probe_channel_z(pc.shift, pc.se, pc.n, spec.count, z);
    }
    if (s == PROBE_OK && o->want_stats) { /* the report's data: a second, sequential read */
        s = probe_tensor_stats_compute_source(&src, t->ref.rank, t->ref.shape, &t->stats);
        if (s == PROBE_OK && pc.shift && t->shift.count && spec.count <= PROBE_STATS_MAX_CHANNELS) {
            t->stats.channel_axis = t->channel_axis;
            t->stats.nchannels = (int)spec.count;
            t->stats.channel_shift = pc.shift;
            pc.shift = NULL;
        }
    }
    chan_free(&pc);
    if (s != PROBE_OK) {
        free(z);
        probe_tensor_stats_free(&t->stats);
        return s;
    }
    t->channel_z = z;
    if (!t->shift.count) {
        t->channel_axis = -1;
        t->channel_axis_from = NULL;
    }
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
        t->gate_verdict = t->verdict;
        return PROBE_OK;
    }
    s = headline_verdict(o, t);
    if (!o->keep_channel_z) {
        free(t->channel_z);
        t->channel_z = NULL;
    }
    return s;
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

static probe_status copy_manifest(char **dst, const probe_file *f)
{
    const char *m = probe_file_manifest(f);
    if (m && !(*dst = strdup(m)))
        return probe_set_error(PROBE_ENOMEM, "out of memory copying the manifest of %s",
                               probe_file_path(f));
    return PROBE_OK;
}

/* The isolated run's metrics for a compared tensor (same path and shape):
 * the reference against the isolated run, streamed like the pair itself
 * (bounded memory, the same bits as the as-run metrics' path), and the
 * amplification = rel_l2 as run / rel_l2 isolated (NaN when undefined). */
static probe_status isolate(probe_file *rf, size_t ri, probe_file *isof,
                            const probe_compare_opts *o, probe_tensor_result *t)
{
    size_t ii;
    if (!t->compared || t->stats_only || probe_file_find(isof, t->ref.path, &ii) != PROBE_OK)
        return PROBE_OK;
    if (probe_file_tensor(isof, ii)->stats_only)
        return PROBE_OK; /* no elements to measure the isolated error with */
    const probe_tensor_info *it = probe_file_tensor(isof, ii);
    int same = it->rank == t->ref.rank && it->n == t->ref.n;
    for (int d = 0; same && d < it->rank; d++)
        same = it->shape[d] == t->ref.shape[d];
    if (!same || (it->dtype == PROBE_DTYPE_BOOL) != (t->ref.dtype == PROBE_DTYPE_BOOL))
        return PROBE_OK;
    file_pair fp = {{rf, isof}, {ri, ii}};
    probe_pair_source src = {t->ref.n, {t->ref.dtype, it->dtype}, file_pair_read, &fp};
    probe_metrics_opts mo = {t->gate.atol, t->gate.rtol};
    probe_stream_opts so = {o->threads, {0, 0}, NULL, NULL, NULL};
    probe_status s = probe_metrics_compute_source(&src, &mo, &so, &t->m_isolated, NULL);
    if (s != PROBE_OK)
        return s;
    t->has_isolated = 1;
    double a = t->m.rel_l2, b = t->m_isolated.rel_l2;
    t->amplification = isfinite(a) && isfinite(b) && b > 0 ? a / b : NAN;
    return PROBE_OK;
}

static uint64_t tensor_bytes(const probe_tensor_info *ti)
{
    return (uint64_t)ti->n * (uint64_t)probe_dtype_size(ti->dtype);
}

/* "PATH" or, compared rank by rank, "PATH (rank R)": the names of the missing lists. */
static void tagged_name(char *buf, size_t cap, const char *path, int tag)
{
    int n = tag >= 0 ? snprintf(buf, cap, "%s (rank %d)", path, tag) : snprintf(buf, cap, "%s", path);
    if (n < 0 && cap)
        buf[0] = 0;
}

/* Rank-set facts of a compared tensor (compare.h): the logical tensor's ranks, shard axis,
 * replicated copies that differ (the tensor fails), and the ranks holding a partial path. */
static probe_status rank_keys(const probe_rankset *rset, size_t ri, const probe_rankset *cset,
                              size_t ci, probe_tensor_result *t)
{
    const probe_rankset *set = probe_rankset_world(cset) ? cset : rset;
    const probe_rankset_entry *e = probe_rankset_entry_at(set, set == cset ? ci : ri);
    int W = probe_rankset_world(set);
    t->rank_tag = e->tag;
    t->shard_axis = e->shard_axis;
    t->ranks = W ? e->nholders : 0;
    if (!W || e->tag >= 0)
        return PROBE_OK;
    if (e->nholders < W && e->shard_axis < 0) {
        if (!(t->ranks_present = malloc((size_t)e->nholders * sizeof(int))))
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        memcpy(t->ranks_present, e->holders, (size_t)e->nholders * sizeof(int));
        t->nranks_present = e->nholders;
    }
    for (int side = 0; side < 2; side++) {
        const probe_rankset_entry *x = probe_rankset_entry_at(side ? cset : rset, side ? ci : ri);
        if (!x->nmismatch)
            continue;
        int *m = realloc(t->replica_mismatch_ranks,
                         (size_t)(t->nreplica_mismatch + x->nmismatch) * sizeof(int));
        if (!m)
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        t->replica_mismatch_ranks = m;
        char list[200] = "";
        size_t len = 0;
        for (int k = 0; k < x->nmismatch; k++) {
            m[t->nreplica_mismatch++] = x->mismatch[k];
            if (len < sizeof list)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", k ? ", " : "",
                                        x->mismatch[k]);
        }
        char from[64];
        snprintf(from, sizeof from, " (from rank %d)%s", x->mismatch[0] == x->holders[0] &&
                 x->nholders > 1 ? x->holders[1] : x->holders[0],
                 side ? "" : " in the reference");
        t->verdict.pass = 0;
        add_reason(&t->verdict, "replicated tensor differs on rank %s%s", list, from);
    }
    return PROBE_OK;
}

static probe_status collect_set_skips(probe_compare_result *res, const probe_rankset *set,
                                      const char *side)
{
    int nf = probe_rankset_world(set) ? probe_rankset_world(set) : 1;
    probe_status s = PROBE_OK;
    for (int r = 0; r < nf && s == PROBE_OK; r++)
        s = collect_skips(res, probe_rankset_file(set, r), side);
    return s;
}

static size_t set_ignored(const probe_rankset *set)
{
    int nf = probe_rankset_world(set) ? probe_rankset_world(set) : 1;
    size_t n = 0;
    for (int r = 0; r < nf; r++)
        n += probe_file_ignored_count(probe_rankset_file(set, r));
    return n;
}

/* The result's record of a side: world, files, index, left-out collectives and outputs of
 * collectives that differ across the ranks (the run fails). */
static probe_status record_set(probe_compare_result *res, int side, const probe_rankset *set,
                               const char *const *given, size_t ngiven)
{
    char *name = side ? res->candidate : res->reference;
    size_t cap = sizeof res->reference, len = 0;
    name[0] = 0;
    for (size_t i = 0; i < ngiven && len < cap; i++)
        len += (size_t)snprintf(name + len, cap - len, "%s%s", i ? " " : "", given[i]);
    int W = probe_rankset_world(set);
    res->world[side] = W;
    if (!W)
        return PROBE_OK;
    if (probe_rankset_index(set))
        snprintf(res->index[side], sizeof res->index[side], "%s", probe_rankset_index(set));
    if (!(res->files[side] = calloc((size_t)W, sizeof(char *))) ||
        !(res->collectives_left_out[side] = calloc((size_t)W, sizeof(uint64_t))))
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    for (int r = 0; r < W; r++) {
        if (!(res->files[side][r] = strdup(probe_rankset_file_path(set, r))))
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        res->collectives_left_out[side][r] = probe_rankset_collectives_left_out(set, r);
    }
    size_t nd = probe_rankset_divergence_count(set);
    if (!nd)
        return PROBE_OK;
    probe_collective_divergence *d = realloc(res->divergent, (res->ndivergent + nd) * sizeof *d);
    if (!d)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    res->divergent = d;
    for (size_t i = 0; i < nd; i++) {
        const probe_rankset_divergence *x = probe_rankset_divergence_at(set, i);
        probe_collective_divergence *y = &res->divergent[res->ndivergent++];
        snprintf(y->side, sizeof y->side, "%s", side ? "candidate" : "reference");
        snprintf(y->path, sizeof y->path, "%s", x->path);
        y->nranks = x->nranks;
        memcpy(y->ranks, x->ranks, sizeof y->ranks);
        if (i == 0) {
            res->pass = 0;
            add_run_reason(res, "collective output differs across the ranks of the %s run: %s on "
                           "rank %d (from rank 0)%s", y->side, y->path, y->ranks[0],
                           nd > 1 ? " and more" : "");
        }
    }
    return PROBE_OK;
}

/* 1 in *same when logical tensors i of a and j of b hold the same bytes (same dtype and n
 * checked by the caller), read in chunks. */
static probe_status same_logical(probe_rankset *a, size_t i, probe_rankset *b, size_t j,
                                 uint64_t n, size_t es, int *same)
{
    enum { CHUNK = 1 << 16 };
    unsigned char *x = malloc((size_t)CHUNK * es), *y = malloc((size_t)CHUNK * es);
    probe_status s = PROBE_OK;
    *same = 1;
    if (!x || !y)
        s = probe_set_error(PROBE_ENOMEM, "out of memory comparing root inputs");
    for (uint64_t off = 0; s == PROBE_OK && *same && off < n; off += CHUNK) {
        size_t m = n - off < CHUNK ? (size_t)(n - off) : CHUNK;
        if ((s = probe_rankset_read_range(a, i, off, m, x)) == PROBE_OK &&
            (s = probe_rankset_read_range(b, j, off, m, y)) == PROBE_OK)
            *same = memcmp(x, y, m * es) == 0;
    }
    free(x);
    free(y);
    return s;
}

/* The root-input check reads rank 0's file of a rank set (experiment.c); a root input that
 * a joined rank set shards is checked again here as the joined tensor, and the verdict
 * same_experiment recomputed (the --allow-root-diff rule of experiment.c). */
static probe_status rank_roots(probe_compare_result *res, probe_rankset *rset,
                               probe_rankset *cset, const probe_compare_opts *o)
{
    if (res->per_rank || (!res->world[0] && !res->world[1]))
        return PROBE_OK;
    for (size_t k = 0; k < res->nroots; k++) {
        probe_root_input *ri = &res->roots[k];
        size_t i, j;
        if (!ri->in_reference || !ri->in_candidate ||
            probe_rankset_find(rset, ri->path, -1, &i) != PROBE_OK ||
            probe_rankset_find(cset, ri->path, -1, &j) != PROBE_OK)
            continue;
        const probe_rankset_entry *a = probe_rankset_entry_at(rset, i);
        const probe_rankset_entry *b = probe_rankset_entry_at(cset, j);
        if (a->shard_axis < 0 && b->shard_axis < 0)
            continue;
        ri->same = ri->allowed = 0;
        ri->why[0] = 0;
        if (a->shard_axis >= 0)
            ri->hash_reference[0] = 0;
        if (b->shard_axis >= 0)
            ri->hash_candidate[0] = 0;
        int same_shape = a->info.rank == b->info.rank;
        for (int d = 0; same_shape && d < a->info.rank; d++)
            same_shape = a->info.shape[d] == b->info.shape[d];
        if (a->error[0] || b->error[0]) {
            if (snprintf(ri->why, sizeof ri->why, "%s", a->error[0] ? a->error : b->error) < 0)
                ri->why[0] = 0;
        } else if (a->info.dtype != b->info.dtype || a->info.stats_only || b->info.stats_only) {
            snprintf(ri->why, sizeof ri->why, "dtype %s vs %s", probe_dtype_name(a->info.dtype),
                     probe_dtype_name(b->info.dtype));
        } else if (!same_shape) {
            char x[64], y[64];
            shape_str(x, sizeof x, a->info.rank, a->info.shape);
            shape_str(y, sizeof y, b->info.rank, b->info.shape);
            if (snprintf(ri->why, sizeof ri->why, "shape %s vs %s (joined)", x, y) < 0)
                ri->why[0] = 0;
        } else {
            probe_status s = same_logical(rset, i, cset, j, a->info.n,
                                          probe_dtype_size(a->info.dtype), &ri->same);
            if (s != PROBE_OK)
                return s;
            if (!ri->same)
                snprintf(ri->why, sizeof ri->why, "contents differ (joined rank pieces)");
        }
    }
    res->same_experiment = 1;
    for (size_t k = 0; k < res->nroots; k++) {
        probe_root_input *ri = &res->roots[k];
        if (ri->same)
            continue;
        ri->allowed = 0;
        for (size_t g = 0; o->allow_root_diff && o->allow_root_diff[g]; g++) {
            const char *gl = o->allow_root_diff[g];
            if (fnmatch(gl, ri->path, 0) == 0 || fnmatch(gl, ri->component, 0) == 0 ||
                (gl[0] != '/' && ri->path[0] == '/' && fnmatch(gl, ri->path + 1, 0) == 0))
                ri->allowed = 1;
        }
        if (!ri->allowed && !ri->incomplete)
            res->same_experiment = 0;
    }
    return PROBE_OK;
}

/* Run-level checks of the oracle: it is the same experiment as the reference (its root
 * inputs are the reference's, converted to its element types at most), its injection did
 * not fail, and it is not the reference itself (an oracle equal to the reference in
 * every tensor it holds is not a higher-precision run). Each failure fails the run. */
static probe_status oracle_run_checks(probe_compare_result *res, probe_file *rf, probe_file *of,
                                      const probe_compare_opts *opts)
{
    char why[256], how[256];
    char *run_end = NULL;
    int incomplete = probe_experiment_run_incomplete(res->manifest_oracle, how, sizeof how,
                                                     &run_end);
    free(run_end);
    if (incomplete) {
        res->pass = 0;
        res->incomplete_oracle = 1;
        add_run_reason(res, "incomplete capture: the oracle run did not complete (%s): it lacks %zu "
                       "of the compared tensors", how, res->noracle_missing);
        return PROBE_OK;
    }
    if (probe_experiment_inject_failed(res->manifest_oracle, why, sizeof why)) {
        res->pass = 0;
        add_run_reason(res, "injection failed in the oracle run: %s", why);
        return PROBE_OK;
    }
    if (!res->noracle && res->noracle_same) {
        res->pass = 0;
        add_run_reason(res, "the oracle %s is identical to the reference in every tensor it "
                       "holds: it is not a higher-precision run", res->oracle);
    } else if (!res->noracle && res->ntensors) {
        res->pass = 0;
        add_run_reason(res, "the oracle %s holds none of the compared tensors in full (with the "
                       "reference's shape; a stats-only record cannot be judged)", res->oracle);
    }
    if (!opts->check_roots)
        return PROBE_OK;
    probe_compare_result tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.same_experiment = 1;
    probe_status s = probe_experiment_roots(&tmp, rf, of, opts);
    if (s == PROBE_OK && !tmp.same_experiment) {
        for (size_t i = 0; i < tmp.nroots; i++)
            if (!tmp.roots[i].same && !tmp.roots[i].allowed) {
                res->pass = 0;
                add_run_reason(res, "the oracle is not the same experiment as the reference: "
                               "root input %s differs (%s)", tmp.roots[i].path, tmp.roots[i].why);
                break;
            }
    }
    free(tmp.roots);
    return s;
}

/* How a side's run ended (the manifests' "run_end", experiment.c): the first file of the
 * set whose run_end says it did not complete makes the side incomplete; how gets the
 * reason's parenthesis. */
static void side_run_end(probe_compare_result *res, int side, const probe_rankset *set,
                         char *how, size_t cap)
{
    int W = probe_rankset_world(set), nf = W ? W : 1;
    char **dst = side ? &res->run_end_candidate : &res->run_end_reference;
    int *inc = side ? &res->incomplete_candidate : &res->incomplete_reference;
    for (int r = 0; r < nf; r++) {
        char *j = NULL, h[256];
        int bad = probe_experiment_run_incomplete(probe_file_manifest(probe_rankset_file(set, r)),
                                                  h, sizeof h, &j);
        if (bad && !*inc) {
            free(*dst);
            *dst = j;
            *inc = 1;
            if (W)
                snprintf(how, cap, "%s; in rank %d's file %s", h, r,
                         probe_rankset_file_path(set, r));
            else
                snprintf(how, cap, "%s", h);
        } else if (!*dst) {
            *dst = j;
        } else {
            free(j);
        }
    }
}

typedef struct {
    const char *path;
    const char *converted_from; /* the manifest's "converted_from", or NULL */
} injected_input;

static int cmp_injected(const void *a, const void *b)
{
    return strcmp(((const injected_input *)a)->path, ((const injected_input *)b)->path);
}

/* The inputs of the isolated run (compare.h, isolated_inputs_*): for every output tensor
 * with isolated metrics, the inputs of its call that the isolated run's manifest lists as
 * injected ("inject"."tensors", paths /<component>/<call>/in.*) are compared with the
 * reference's; one that is not the reference's bytes in the reference's dtype was
 * converted (probe-run --convert), and the largest rel_l2 of those is kept. Computed once
 * per call. */
static probe_status isolate_inputs(probe_compare_result *res, probe_file *rf, probe_file *isof,
                                   const probe_compare_opts *o)
{
    json_t *m = res->manifest_isolated ? json_loads(res->manifest_isolated, 0, NULL) : NULL;
    json_t *list = m ? json_object_get(json_object_get(m, "inject"), "tensors") : NULL, *e;
    size_t nin = 0, k;
    injected_input *in = json_array_size(list) ? calloc(json_array_size(list), sizeof *in) : NULL;
    if (json_array_size(list) && !in) {
        json_decref(m);
        return probe_set_error(PROBE_ENOMEM, "out of memory listing the isolated run's inputs");
    }
    json_array_foreach(list, k, e) {
        const char *p = json_string_value(json_object_get(e, "path"));
        const char *slash = p ? strrchr(p, '/') : NULL;
        if (slash && strncmp(slash + 1, "in.", 3) == 0) {
            in[nin].path = p;
            in[nin++].converted_from = json_string_value(json_object_get(e, "converted_from"));
        }
    }
    if (nin > 1)
        qsort(in, nin, sizeof *in, cmp_injected);
    probe_status s = PROBE_OK;
    char last[512] = "";
    probe_tensor_result cache;
    memset(&cache, 0, sizeof cache);
    for (size_t i = 0; s == PROBE_OK && i < res->ntensors; i++) {
        probe_tensor_result *t = &res->tensors[i];
        const char *slash = strrchr(t->ref.path, '/');
        if (!t->has_isolated || !slash || strncmp(slash + 1, "out", 3) != 0)
            continue;
        size_t plen = (size_t)(slash - t->ref.path) + 1;
        if (plen >= sizeof last)
            continue;
        if (strlen(last) != plen || strncmp(last, t->ref.path, plen) != 0) {
            memcpy(last, t->ref.path, plen);
            last[plen] = 0;
            cache.isolated_inputs_compared = cache.isolated_inputs_converted = 0;
            cache.isolated_inputs_worst[0] = 0;
            double worst = -1;
            /* the first injected input of this call: the lower bound of the prefix */
            size_t lo = 0, hi = nin;
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (strcmp(in[mid].path, last) < 0)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            for (size_t j = lo; s == PROBE_OK && j < nin && strncmp(in[j].path, last, plen) == 0;
                 j++) {
                size_t ri, ii;
                if (strchr(in[j].path + plen, '/') || probe_file_find(rf, in[j].path, &ri) ||
                    probe_file_find(isof, in[j].path, &ii))
                    continue;
                const probe_tensor_info *a = probe_file_tensor(rf, ri);
                const probe_tensor_info *b = probe_file_tensor(isof, ii);
                int same = a->rank == b->rank && a->n == b->n && !a->stats_only && !b->stats_only &&
                           (a->dtype == PROBE_DTYPE_BOOL) == (b->dtype == PROBE_DTYPE_BOOL);
                for (int d = 0; same && d < a->rank; d++)
                    same = a->shape[d] == b->shape[d];
                if (!same)
                    continue;
                cache.isolated_inputs_compared++;
                if (a->dtype == b->dtype && !in[j].converted_from && a->hash[0] && b->hash[0] &&
                    strcmp(a->hash, b->hash) == 0)
                    continue; /* the reference's bytes */
                file_pair fp = {{rf, isof}, {ri, ii}};
                probe_pair_source src = {a->n, {a->dtype, b->dtype}, file_pair_read, &fp};
                probe_metrics_opts mo = {o->gate.atol, o->gate.rtol};
                probe_stream_opts so = {o->threads, {0, 0}, NULL, NULL, NULL};
                probe_metrics mi;
                if ((s = probe_metrics_compute_source(&src, &mo, &so, &mi, NULL)) != PROBE_OK)
                    break;
                if (a->dtype == b->dtype && !in[j].converted_from && mi.identical)
                    continue;
                cache.isolated_inputs_converted++;
                double key = isfinite(mi.rel_l2) ? mi.rel_l2 : INFINITY;
                if (key > worst) {
                    worst = key;
                    snprintf(cache.isolated_inputs_worst, sizeof cache.isolated_inputs_worst, "%s",
                             in[j].path + plen);
                }
            }
            cache.isolated_inputs_rel_l2 = worst >= 0 && isfinite(worst) ? worst : NAN;
        }
        t->isolated_inputs_compared = cache.isolated_inputs_compared;
        t->isolated_inputs_converted = cache.isolated_inputs_converted;
        t->isolated_inputs_rel_l2 = cache.isolated_inputs_rel_l2;
        memcpy(t->isolated_inputs_worst, cache.isolated_inputs_worst,
               sizeof t->isolated_inputs_worst);
    }
    free(in);
    json_decref(m);
    return s;
}

/* The candidate side's identity of the pair t (cand: the candidate tensor's info). */
static void identity_of(probe_compare_result *res, probe_tensor_result *t,
                        const probe_tensor_info *cand)
{
    if (t->cfg_half < 0 && strcmp(cand->path, t->ref.path) != 0) /* (a CFG half: cfg_candidate) */
        snprintf(t->cand_path, sizeof t->cand_path, "%s", cand->path);
    snprintf(t->class_cand, sizeof t->class_cand, "%s", cand->class_name);
    snprintf(t->module_cand, sizeof t->module_cand, "%s", cand->module);
    t->class_mismatch = t->ref.class_name[0] && cand->class_name[0] &&
                        strcmp(t->ref.class_name, cand->class_name) != 0;
    if (t->class_mismatch && !res->class_mismatches++)
        snprintf(res->first_class_mismatch, sizeof res->first_class_mismatch, "%s", t->ref.path);
}

probe_status probe_compare_files(const char *reference, const char *candidate,
                                 const probe_compare_opts *opts, probe_compare_result **out)
{
    if (!reference || !candidate || !opts || !out)
        return probe_set_error(PROBE_EINVAL, "probe_compare_files: NULL argument");
    return probe_compare_sets(&reference, 1, &candidate, 1, opts, out);
}

/* One comparison in progress: the two sides, the extra runs, what pairs
 * tensors across them, and the result being filled. */
typedef struct compare_run {
    const probe_compare_opts *opts;
    probe_rankset *rset, *cset; /* the caller's */
    probe_file *rf, *cf;        /* rank 0's file of each side */
    probe_file *isof, *of;      /* --isolated and --oracle, opened here */
    probe_call_map *cmap;
    cfg_batch cfg_cand, cfg_ref;
    unsigned char *cfg_used;
    int cfg_split;
    char iso_why[256];
    char how[2][320];
    size_t ndiffer;
    char first_differ[512];
    size_t sel_total, sel_done;
    uint64_t bytes_total, bytes_done;
    probe_compare_result *res;
    /* T2: per component the feature may skip, its skipped tensors and the calibrated limit */
    struct feature_skip {
        char component[128];
        size_t skipped;
        double limit;
    } *fskip;
    size_t nfskip;
} compare_run;

/* Build both sides' logical tensor lists and, for two plain files, the call
 * map that pairs calls by module path. */
static probe_status run_build_sides(compare_run *cr)
{
    int wr = probe_rankset_world(cr->rset), wc = probe_rankset_world(cr->cset);
    int per_rank = wr && wr == wc;
    probe_status s;
    /* Collectives have a counterpart only in a rank set of the same size. */
    if ((s = probe_rankset_build(cr->rset, per_rank ? PROBE_RANKSET_PER_RANK : PROBE_RANKSET_JOIN,
                                 !per_rank)) != PROBE_OK ||
        (s = probe_rankset_build(cr->cset, per_rank ? PROBE_RANKSET_PER_RANK : PROBE_RANKSET_JOIN,
                                 !per_rank)) != PROBE_OK)
        return s;
    cr->rf = probe_rankset_file(cr->rset, 0);
    cr->cf = probe_rankset_file(cr->cset, 0);
    if (!wr && !wc && (s = probe_call_map_build(cr->rset, cr->cset, &cr->cmap)) != PROBE_OK)
        return s;
    return PROBE_OK;
}

/* The result before any tensor is compared: gate, headline, both sides'
 * records and manifests, and the CFG batching of each side. */
static probe_status run_start_result(compare_run *cr, const char *const *reference, size_t nrefs,
                                     const char *const *candidate, size_t ncands)
{
    const probe_compare_opts *opts = cr->opts;
    int wr = probe_rankset_world(cr->rset), wc = probe_rankset_world(cr->cset);
    probe_compare_result *res = cr->res = calloc(1, sizeof *res);
    size_t nref = probe_rankset_count(cr->rset);
    if (!res || (nref && !(res->tensors = calloc(nref, sizeof *res->tensors))))
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    res->gate = opts->gate;
    if (opts->atol_set)
        res->gate.atol = opts->atol;
    if (opts->rtol_set)
        res->gate.rtol = opts->rtol;
    res->first_failure = -1;
    res->pass = 1;
    res->gate_pass = 1;
    res->headline = opts->oracle ? PROBE_HEADLINE_ORACLE
                    : opts->gate.kind == PROBE_GATE_T2 || opts->expect_identical
                        ? PROBE_HEADLINE_GATE
                        : PROBE_HEADLINE_SYSTEMATIC;
    res->expect_identical = opts->expect_identical != 0;
    res->same_experiment = 1;
    res->per_rank = wr && wr == wc;
    probe_status s;
    if ((s = record_set(res, 0, cr->rset, reference, nrefs)) ||
        (s = record_set(res, 1, cr->cset, candidate, ncands)))
        return s;
    if ((s = copy_manifest(&res->manifest_reference, cr->rf)) ||
        (s = copy_manifest(&res->manifest_candidate, cr->cf)))
        return s;
    /* A candidate that batched the CFG branches against a reference that did not:
     * each two-call reference tensor of the denoiser is paired with its half. */
    if ((s = cfg_batch_parse(res->manifest_candidate, &cr->cfg_cand)) ||
        (s = cfg_batch_parse(res->manifest_reference, &cr->cfg_ref)))
        return s;
    cr->cfg_split = cr->cfg_cand.n && !cr->cfg_ref.n;
    if (cr->cfg_split && !(cr->cfg_used = calloc(probe_rankset_count(cr->cset) + 1, 1)))
        return probe_set_error(PROBE_ENOMEM, "out of memory pairing CFG halves");
    return PROBE_OK;
}

/* Open the --isolated and --oracle runs, and read how both sides' runs ended. */
static probe_status run_open_extra(compare_run *cr)
{
    const probe_compare_opts *opts = cr->opts;
    probe_compare_result *res = cr->res;
    probe_status s;
    if (opts->isolated) {
        if (probe_rankset_world(cr->rset))
            return probe_set_error(PROBE_EINVAL, "--isolated %s: the reference must be one file, "
                                   "not a rank set", opts->isolated);
        if ((s = probe_file_open(opts->isolated, &cr->isof)) != PROBE_OK)
            return s;
        snprintf(res->isolated, sizeof res->isolated, "%s", opts->isolated);
        if ((s = copy_manifest(&res->manifest_isolated, cr->isof)))
            return s;
        res->isolated_complete = !probe_experiment_check_isolated(res->manifest_isolated, cr->rf,
                                                                   cr->iso_why, sizeof cr->iso_why);
        char *j = NULL;
        probe_experiment_run_incomplete(res->manifest_isolated, NULL, 0, &j);
        res->run_end_isolated = j;
    }
    side_run_end(res, 0, cr->rset, cr->how[0], sizeof cr->how[0]);
    side_run_end(res, 1, cr->cset, cr->how[1], sizeof cr->how[1]);

    if (opts->calibration && probe_calibration_path(opts->calibration))
        snprintf(res->calibration, sizeof res->calibration, "%s",
                 probe_calibration_path(opts->calibration));
    if (opts->oracle) {
        if ((s = probe_file_open(opts->oracle, &cr->of)) != PROBE_OK)
            return s;
        snprintf(res->oracle, sizeof res->oracle, "%s", opts->oracle);
        if ((s = copy_manifest(&res->manifest_oracle, cr->of)))
            return s;
        if (probe_experiment_is_replay(res->manifest_oracle, opts->root_components))
            return probe_set_error(PROBE_EINVAL, "--oracle %s was recorded with probe-run --replay "
                                   "(each component on the reference's recorded inputs): it cannot "
                                   "judge the inputs of a run or the code between components; record "
                                   "the oracle with probe-run --inject REF.h5 --convert (docs/gates.md)",
                                   opts->oracle);
    }
    return PROBE_OK;
}

/* The candidate tensor paired with reference tensor i: 1 and *ci (and the CFG
 * half in *half, -1 when not split), or 0 when the candidate has none. */
static int run_find_pair(compare_run *cr, const probe_rankset_entry *re, size_t *ci, int *half,
                         int *split)
{
    const probe_tensor_info *ti = &re->info;
    char paired[512];
    const char *cpath = probe_call_map_other(cr->cmap, 0, ti, paired, sizeof paired) ? paired
                                                                                    : ti->path;
    *half = -1;
    *split = cr->cfg_split && dit_call_of(ti) >= 0;
    return *split ? cfg_split_find(cr->cset, &cr->cfg_cand, ti, ci, half)
                  : cpath[0] && probe_rankset_find(cr->cset, cpath, re->tag, ci) == PROBE_OK;
}

/* What one compared pair adds to the run: feature activity, --expect-identical,
 * the gate verdict of failures found after the headline, the first failure. */
static void run_judge_pair(compare_run *cr, probe_tensor_result *t, int nbefore)
{
    const probe_compare_opts *opts = cr->opts;
    probe_compare_result *res = cr->res;
    if (!t->compared || !t->m.identical) {
        res->feature_active = 1;
        if (!cr->ndiffer++)
            snprintf(cr->first_differ, sizeof cr->first_differ, "%s", t->ref.path);
        if (opts->expect_identical) {
            t->verdict.pass = 0;
            add_reason(&t->verdict, "not identical: %s%s", "the pair is expected to be "
                       "bit-identical (--expect-identical)", "");
        }
    }
    /* failures found after the headline (replicas, identity) are the gate's too */
    for (int k = nbefore; k < t->verdict.nreasons; k++) {
        t->gate_verdict.pass = 0;
        if (t->gate_verdict.nreasons < PROBE_GATE_MAX_REASONS)
            memcpy(t->gate_verdict.reasons[t->gate_verdict.nreasons++], t->verdict.reasons[k],
                   sizeof t->verdict.reasons[k]);
    }
    if (!t->gate_verdict.pass)
        res->gate_pass = 0;
    if (!t->verdict.pass) {
        res->pass = 0;
        if (!res->first_failure_path[0]) {
            res->first_failure = (long)(res->ntensors - 1);
            snprintf(res->first_failure_path, sizeof res->first_failure_path, "%s", t->ref.path);
        }
    }
}

/* Under T2, whether the calibration lets the feature skip reference tensor ti's call
 * (its gate's skipped_fraction_max > 0); counted per component. -1: out of memory. */
static int run_skipped_by_feature(compare_run *cr, const probe_tensor_info *ti)
{
    const probe_compare_opts *o = cr->opts;
    probe_gate g;
    probe_gate_verdict v = {0};
    if (o->gate.kind != PROBE_GATE_T2 || !o->calibration || !tensor_gate(o, ti, &g, &v) ||
        !(g.skipped_fraction_max > 0))
        return 0;
    size_t k = 0;
    while (k < cr->nfskip && strcmp(cr->fskip[k].component, ti->component) != 0)
        k++;
    if (k == cr->nfskip) {
        struct feature_skip *grown = realloc(cr->fskip, (k + 1) * sizeof *grown);
        if (!grown)
            return -1;
        cr->fskip = grown;
        snprintf(grown[k].component, sizeof grown[k].component, "%s", ti->component);
        grown[k].skipped = 0;
        grown[k].limit = g.skipped_fraction_max;
        cr->nfskip++;
    }
    cr->fskip[k].skipped++;
    return 1;
}

/* Each component's skipped fraction against the feature's own. */
static void run_check_skipped(compare_run *cr)
{
    probe_compare_result *res = cr->res;
    for (size_t k = 0; k < cr->nfskip; k++) {
        const struct feature_skip *f = &cr->fskip[k];
        size_t compared = 0;
        for (size_t i = 0; i < res->ntensors; i++)
            compared += strcmp(res->tensors[i].ref.component, f->component) == 0;
        double frac = (double)f->skipped / (double)(compared + f->skipped);
        if (frac > f->limit) {
            res->pass = 0;
            res->gate_pass = 0;
            add_run_reason(res, "%s: the candidate skipped %zu of %zu tensors (fraction %.4g > "
                           "%.4g, the feature's own, calibrated)", f->component, f->skipped,
                           compared + f->skipped, frac, f->limit);
        }
    }
}

/* Reference tensor i (selected by --only): compared with its counterpart, or
 * listed as missing in the candidate. */
static probe_status run_compare_one(compare_run *cr, size_t i)
{
    const probe_compare_opts *opts = cr->opts;
    probe_compare_result *res = cr->res;
    const probe_rankset_entry *re = probe_rankset_entry_at(cr->rset, i);
    const probe_tensor_info *ti = &re->info;
    probe_status s;
    size_t ci;
    int half, split;
    if (!run_find_pair(cr, re, &ci, &half, &split)) {
        char name[512];
        tagged_name(name, sizeof name, ti->path, re->tag);
        int skip = run_skipped_by_feature(cr, ti);
        if (skip < 0)
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        if (skip)
            return push_name(&res->skipped_by_feature, &res->nskipped_by_feature, name);
        if ((s = push_name(&res->missing_in_candidate, &res->nmissing_cand, name)))
            return s;
        res->pass = 0;
        if (!res->first_failure_path[0])
            snprintf(res->first_failure_path, sizeof res->first_failure_path, "%s", ti->path);
        return PROBE_OK;
    }
    probe_tensor_result *t = &res->tensors[res->ntensors];
    t->ref = *ti;
    t->cfg_half = half;
    if (split) {
        cr->cfg_used[ci] = 1;
        snprintf(t->cfg_candidate, sizeof t->cfg_candidate, "%s",
                 probe_rankset_entry_at(cr->cset, ci)->info.path);
        snprintf(t->cfg_branch_name, sizeof t->cfg_branch_name, "%s", cr->cfg_cand.order[half]);
    }
    if ((s = compare_pair(cr->rset, i, cr->cset, ci, cr->of, opts, t)) != PROBE_OK)
        return s;
    identity_of(res, t, &probe_rankset_entry_at(cr->cset, ci)->info);
    res->ntensors++; /* from here on the result owns what t holds */
    if (!t->sys.computed)
        t->gate_verdict = t->verdict;
    res->noracle += t->has_oracle != 0;
    res->noracle_same += t->oracle_same != 0;
    res->noracle_missing += cr->of && t->compared && !t->stats_only && !t->has_oracle &&
                            !t->oracle_same;
    int nbefore = t->verdict.nreasons;
    if ((s = rank_keys(cr->rset, i, cr->cset, ci, t)) != PROBE_OK)
        return s;
    t->amplification = NAN;
    probe_file *irf;
    size_t iri;
    if (cr->isof && res->isolated_complete && probe_rankset_single(cr->rset, i, &irf, &iri) &&
        (s = isolate(irf, iri, cr->isof, opts, t)) != PROBE_OK)
        return s;
    if (cr->isof && cr->of && (s = isolate_oracle(irf, iri, cr->isof, cr->of, opts, t)) != PROBE_OK)
        return s;
    res->nisolated += t->has_isolated != 0;
    run_judge_pair(cr, t, nbefore);
    return PROBE_OK;
}

/* Every selected reference tensor against its counterpart (with progress),
 * then the candidate tensors without one. */
static probe_status run_compare_all(compare_run *cr)
{
    const probe_compare_opts *opts = cr->opts;
    probe_compare_result *res = cr->res;
    size_t nref = probe_rankset_count(cr->rset), ncand = probe_rankset_count(cr->cset);
    probe_status s;
    for (size_t i = 0; opts->progress && i < nref; i++)
        if (path_selected(probe_rankset_entry_at(cr->rset, i)->info.path, opts->only)) {
            cr->sel_total++;
            cr->bytes_total += tensor_bytes(&probe_rankset_entry_at(cr->rset, i)->info);
        }
    for (size_t i = 0; i < nref; i++) {
        const probe_tensor_info *ti = &probe_rankset_entry_at(cr->rset, i)->info;
        if (!path_selected(ti->path, opts->only))
            continue;
        if (opts->progress && cr->sel_done)
            opts->progress(opts->progress_ctx, cr->sel_done, cr->sel_total, cr->bytes_done,
                           cr->bytes_total);
        cr->sel_done++;
        cr->bytes_done += tensor_bytes(ti);
        if ((s = run_compare_one(cr, i)) != PROBE_OK)
            return s;
    }
    for (size_t i = 0; i < ncand; i++) {
        const probe_rankset_entry *ce = probe_rankset_entry_at(cr->cset, i);
        size_t ri;
        char paired[512], name[512];
        const char *rpath = probe_call_map_other(cr->cmap, 1, &ce->info, paired, sizeof paired)
                                ? paired
                                : ce->info.path;
        int batched = cr->cfg_split && cfg_batch_has(&cr->cfg_cand, dit_call_of(&ce->info));
        if (!path_selected(ce->info.path, opts->only) || (batched && cr->cfg_used[i]) ||
            (!batched && rpath[0] &&
             probe_rankset_find(cr->rset, rpath, ce->tag, &ri) == PROBE_OK))
            continue;
        tagged_name(name, sizeof name, ce->info.path, ce->tag);
        if ((s = push_name(&res->missing_in_reference, &res->nmissing_ref, name)))
            return s;
        res->pass = 0;
    }
    return PROBE_OK;
}

/* The run-level reasons after the pairs: skipped and ignored tensors, the
 * isolated run's inputs, runs that did not complete, nothing compared, not
 * identical, feature not active. */
static probe_status run_completeness(compare_run *cr)
{
    const probe_compare_opts *opts = cr->opts;
    probe_compare_result *res = cr->res;
    probe_status s;
    if ((s = collect_set_skips(res, cr->rset, "reference")) ||
        (s = collect_set_skips(res, cr->cset, "candidate")))
        return s;
    res->ignored_ref = set_ignored(cr->rset);
    res->ignored_cand = set_ignored(cr->cset);
    if (cr->isof && res->isolated_complete &&
        (s = isolate_inputs(res, cr->rf, cr->isof, opts)) != PROBE_OK)
        return s;
    /* A run that did not complete: its missing tensors are not the feature's doing. */
    for (int side = 0; side < 2; side++) {
        if (!(side ? res->incomplete_candidate : res->incomplete_reference))
            continue;
        size_t lacks = side ? res->nmissing_cand : res->nmissing_ref;
        res->pass = 0;
        add_run_reason(res, "incomplete capture: the %s run did not complete (%s): it lacks %zu of "
                       "the %s's %zu tensors", side ? "candidate" : "reference", cr->how[side],
                       lacks, side ? "reference" : "candidate", res->ntensors + lacks);
    }
    if (cr->isof && !res->isolated_complete) {
        res->pass = 0;
        add_run_reason(res, "isolated run %s is not a complete replay of the reference: %s",
                       opts->isolated, cr->iso_why);
    }
    run_check_skipped(cr);
    int whole = !res->nmissing_cand && !res->nmissing_ref && !res->incomplete_reference &&
                !res->incomplete_candidate;
    if (res->ntensors == 0 && res->nmissing_cand == 0 && res->nmissing_ref == 0) {
        /* Nothing matched: a gate that checked nothing must not pass. */
        res->nothing_compared = 1;
        res->pass = 0;
        add_run_reason(res, "nothing compared: no dataset path is in both files");
    } else if (opts->expect_identical && cr->ndiffer) {
        res->pass = 0;
        add_run_reason(res, "not identical: %zu of %zu compared tensors differ from the reference "
                       "(first: %s)", cr->ndiffer, res->ntensors, cr->first_differ);
    } else if (!opts->expect_identical && res->ntensors && !res->feature_active && whole) {
        /* A candidate equal to the reference in every tensor of both complete captures
         * did not exercise the feature (with tensors missing or a run that did not
         * complete, the identical ones prove nothing about the rest). */
        res->feature_not_active = 1;
        res->pass = 0;
        add_run_reason(res, "feature not active: the candidate is identical to the reference in "
                       "every compared tensor");
    }
    if (opts->progress && cr->sel_done)
        opts->progress(opts->progress_ctx, cr->sel_done, cr->sel_total, cr->bytes_done,
                       cr->bytes_total);
    return PROBE_OK;
}

/* The experiment-level checks: failed injections, root inputs, the oracle's
 * run checks, then attribution (where the difference was introduced). */
static probe_status run_experiment(compare_run *cr)
{
    const probe_compare_opts *opts = cr->opts;
    probe_compare_result *res = cr->res;
    probe_status s;
    /* A run whose injection failed is not the experiment it claims to be. */
    char why[256];
    /* (an injection still "running" in a run that did not complete is that same fact, said
     * once by the incomplete-capture reason) */
    if ((res->inject_failed_reference =
             probe_experiment_inject_failed(res->manifest_reference, why, sizeof why))) {
        res->pass = 0;
        if (!res->incomplete_reference || !strstr(why, "\"running\""))
            add_run_reason(res, "injection failed in the reference run: %s", why);
    }
    if ((res->inject_failed_candidate =
             probe_experiment_inject_failed(res->manifest_candidate, why, sizeof why))) {
        res->pass = 0;
        if (!res->incomplete_candidate || !strstr(why, "\"running\""))
            add_run_reason(res, "injection failed in the candidate run: %s", why);
    }
    if (opts->check_roots) {
        if ((s = probe_experiment_roots(res, cr->rf, cr->cf, opts)) != PROBE_OK ||
            (s = rank_roots(res, cr->rset, cr->cset, opts)) != PROBE_OK)
            return s;
        if (!res->same_experiment) {
            size_t ndiff = 0, first = 0;
            for (size_t i = 0; i < res->nroots; i++)
                if (!res->roots[i].same && !res->roots[i].allowed && !res->roots[i].incomplete &&
                    !ndiff++)
                    first = i;
            res->pass = 0;
            add_run_reason(res, "not the same experiment: root input %s differs (%s)%s",
                           res->roots[first].path, res->roots[first].why,
                           ndiff > 1 ? " and more" : "");
        }
    }

    if (cr->of && (s = oracle_run_checks(res, cr->rf, cr->of, opts)) != PROBE_OK)
        return s;
    res->calls_by_module = probe_call_map_moved(cr->cmap);
    res->calls_unpaired_by_module = probe_call_map_unpaired(cr->cmap);
    snprintf(res->by_module_component, sizeof res->by_module_component, "%s",
             probe_call_map_first_component(cr->cmap));
    res->by_nesting = probe_call_map_first_nested(cr->cmap);
    if ((s = probe_attribute(res)) != PROBE_OK)
        return s;
    /* with an oracle that stops half-way, the tensors after it fall back to the gate: no
     * place of introduction can be read from such a mix */
    if (res->incomplete_oracle)
        res->introduced.kind = PROBE_INTRODUCED_NONE;
    return PROBE_OK;
}

static probe_status check_args(const char *const *reference, size_t nrefs,
                               const char *const *candidate, size_t ncands,
                               const probe_compare_opts *opts, probe_compare_result **out)
{
    if (!reference || !candidate || !nrefs || !ncands || !opts || !out)
        return probe_set_error(PROBE_EINVAL, "probe_compare_sets: NULL argument");
    for (size_t i = 0; i < nrefs + ncands; i++)
        if (!(i < nrefs ? reference[i] : candidate[i - nrefs]))
            return probe_set_error(PROBE_EINVAL, "probe_compare_sets: NULL file name");
    if (opts->gate.kind == PROBE_GATE_T2 && !opts->calibration)
        return probe_set_error(PROBE_EINVAL, "gate T2 needs a calibration file");
    *out = NULL;
    return PROBE_OK;
}

probe_status probe_compare_ranksets(probe_rankset *rset, const char *const *reference,
                                    size_t nrefs, probe_rankset *cset,
                                    const char *const *candidate, size_t ncands,
                                    const probe_compare_opts *opts, probe_compare_result **out)
{
    probe_status s = check_args(reference, nrefs, candidate, ncands, opts, out);
    if (s != PROBE_OK)
        return s;
    if (!rset || !cset)
        return probe_set_error(PROBE_EINVAL, "probe_compare_ranksets: NULL rank set");
    compare_run cr;
    memset(&cr, 0, sizeof cr);
    cr.opts = opts;
    cr.rset = rset;
    cr.cset = cset;
    if ((s = run_build_sides(&cr)) == PROBE_OK &&
        (s = run_start_result(&cr, reference, nrefs, candidate, ncands)) == PROBE_OK &&
        (s = run_open_extra(&cr)) == PROBE_OK && (s = run_compare_all(&cr)) == PROBE_OK &&
        (s = run_completeness(&cr)) == PROBE_OK)
        s = run_experiment(&cr);
    probe_call_map_free(cr.cmap);
    free(cr.fskip);
    free(cr.cfg_cand.calls);
    free(cr.cfg_ref.calls);
    free(cr.cfg_used);
    probe_file_close(cr.isof);
    probe_file_close(cr.of);
    if (s != PROBE_OK) {
        probe_compare_result_free(cr.res);
        return s;
    }
    *out = cr.res;
    return PROBE_OK;
}

probe_status probe_compare_sets(const char *const *reference, size_t nrefs,
                                const char *const *candidate, size_t ncands,
                                const probe_compare_opts *opts, probe_compare_result **out)
{
    probe_status s = check_args(reference, nrefs, candidate, ncands, opts, out);
    if (s != PROBE_OK)
        return s;
    probe_rankset *rset = NULL, *cset = NULL;
    if ((s = probe_rankset_open(reference, nrefs, &rset)) != PROBE_OK)
        return s;
    if ((s = probe_rankset_open(candidate, ncands, &cset)) != PROBE_OK) {
        probe_rankset_close(rset);
        return s;
    }
    s = probe_compare_ranksets(rset, reference, nrefs, cset, candidate, ncands, opts, out);
    probe_rankset_close(rset);
    probe_rankset_close(cset);
    return s;
}

void probe_compare_result_free(probe_compare_result *r)
{
    if (!r)
        return;
    for (size_t i = 0; r->tensors && i < r->ntensors; i++) {
        probe_tensor_stats_free(&r->tensors[i].stats);
        free(r->tensors[i].channel_z);
        free(r->tensors[i].replica_mismatch_ranks);
        free(r->tensors[i].ranks_present);
    }
    for (int side = 0; side < 2; side++) {
        for (int k = 0; r->files[side] && k < r->world[side]; k++)
            free(r->files[side][k]);
        free(r->files[side]);
        free(r->collectives_left_out[side]);
    }
    free(r->divergent);
    free(r->tensors);
    free(r->missing_in_candidate);
    free(r->skipped_by_feature);
    free(r->missing_in_reference);
    free(r->skipped);
    free(r->manifest_reference);
    free(r->manifest_candidate);
    free(r->manifest_isolated);
    free(r->manifest_oracle);
    free(r->run_end_reference);
    free(r->run_end_candidate);
    free(r->run_end_isolated);
    free(r->roots);
    free(r->calls);
    free(r);
}
