/* attribution.c - which component call introduced a difference, which ones
 * inherited it, and differences that appear in pipeline code between
 * captured calls (probe/verdict.h "attribution", docs/gates.md). */
#include "probe/compare.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *probe_call_status_name(probe_call_status s)
{
    switch (s) {
    case PROBE_CALL_PASS: return "pass";
    case PROBE_CALL_INTRODUCED: return "introduced";
    case PROBE_CALL_INHERITED: return "inherited";
    case PROBE_CALL_INPUTS_DIFFER: return "inputs-differ";
    case PROBE_CALL_INSIDE: return "inside";
    }
    return "?";
}

static int is_input(const probe_tensor_result *t)
{
    return strncmp(t->ref.slot, "in.", 3) == 0;
}

/* A library call's operand captured inside a component call (gemm.K.*, nccl.K.*): neither
 * an input nor an output of the component. */
static int is_operand(const probe_tensor_info *ti)
{
    return strncmp(ti->slot, "gemm.", 5) == 0 || strncmp(ti->slot, "nccl.", 5) == 0;
}

/* The execution position of tensor i: its probe.seq, else its place in the list. */
static int64_t seq_of(const probe_compare_result *r, size_t i)
{
    return r->tensors[i].ref.seq >= 0 ? r->tensors[i].ref.seq : (int64_t)i;
}

static int by_call(const void *a, const void *b, void *ctx)
{
    const probe_compare_result *r = ctx;
    const probe_tensor_info *x = &r->tensors[*(const size_t *)a].ref;
    const probe_tensor_info *y = &r->tensors[*(const size_t *)b].ref;
    int c = strcmp(x->component, y->component);
    if (c)
        return c;
    if (x->call != y->call)
        return x->call < y->call ? -1 : 1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

static int by_seq(const void *a, const void *b)
{
    const probe_call_verdict *x = a, *y = b;
    if (x->seq_first != y->seq_first)
        return x->seq_first < y->seq_first ? -1 : 1;
    return x->seq_last > y->seq_last ? -1 : x->seq_last < y->seq_last; /* outer first */
}

/* Per call: its tensors are members[first[c] .. first[c+1]). */
typedef struct {
    size_t *members;
    size_t *first;
} call_members;

/* A failing tensor, for attribution. A stats-only pair that differs
 * (compared 0: its metrics need the tensors) fails its verdict but proves
 * nothing about where a difference beyond rounding entered: attribution
 * leaves it out. */
/* A tensor that T2 failed only for want of thresholds, whose two sides are
 * identical, is no difference: not a failure here. */
static int fails(const probe_tensor_result *t)
{
    if (t->no_thresholds && t->compared && t->m.identical && t->verdict.nreasons <= 1)
        return 0;
    return !t->verdict.pass && !(t->stats_only && !t->compared);
}

/* 1 when call a encloses call b (b's span strictly inside a's). */
static int encloses(const probe_call_verdict *a, const probe_call_verdict *b)
{
    return a->seq_first < b->seq_first && b->seq_last < a->seq_last;
}

static int is_ancestor(const probe_call_verdict *calls, long a, long c)
{
    for (long p = calls[c].parent; p >= 0; p = calls[p].parent)
        if (p == a)
            return 1;
    return 0;
}

/* The isolated output is less accurate than the reference's against the oracle, or,
 * without an oracle, fails the tensor's own gate. */
static int isolated_fails(const probe_tensor_result *t)
{
    if (t->has_oracle_isolated)
        return !t->oracle_isolated.pass;
    probe_gate_verdict v;
    if (probe_gate_check(&t->gate, &t->m_isolated, &v) != PROBE_OK)
        return 1;
    return !v.pass;
}

typedef struct {
    int64_t seq;            /* where it shows */
    probe_introduction_kind kind;
    long call, tensor, after_call;
    double amplification;
} event;

/* An input of call c fails: is its difference inherited (an earlier output already
 * differs), or was it introduced between calls or before the first one? */
static void input_event(const probe_compare_result *r, const probe_call_verdict *calls, size_t ncalls,
                        const call_members *cm, long c, size_t x, event *ev)
{
    const probe_tensor_result *X = &r->tensors[x];
    const probe_call_verdict *C = &calls[c];
    ev->kind = PROBE_INTRODUCED_NONE;
    /* A hash link: an earlier output with the reference's very bytes feeds it. */
    if (X->ref.hash[0]) {
        long best = -1;
        size_t bt = 0;
        for (size_t d = 0; d < ncalls; d++) {
            if ((long)d == c || calls[d].seq_last >= C->seq_first || is_ancestor(calls, (long)d, c))
                continue;
            for (size_t k = cm->first[d]; k < cm->first[d + 1]; k++) {
                const probe_tensor_result *Y = &r->tensors[cm->members[k]];
                if (is_input(Y) || strcmp(Y->ref.hash, X->ref.hash) != 0 ||
                    Y->ref.dtype != X->ref.dtype)
                    continue;
                if (best < 0 || seq_of(r, cm->members[k]) > seq_of(r, bt)) {
                    best = (long)d;
                    bt = cm->members[k];
                }
            }
        }
        if (best >= 0) {
            if (fails(&r->tensors[bt]))
                return; /* inherited */
            ev->kind = PROBE_INTRODUCED_BETWEEN;
            ev->after_call = best;
            double a = r->tensors[bt].m.rel_l2, b = X->m.rel_l2;
            ev->amplification = a > 0 ? b / a : INFINITY;
            ev->call = c;
            ev->tensor = (long)x;
            ev->seq = seq_of(r, x);
            return;
        }
    }
    /* The outputs since this component's previous call (all earlier ones if none ran). */
    int64_t since = INT64_MIN;
    for (long d = c - 1; d >= 0; d--)
        if (strcmp(calls[d].component, C->component) == 0) {
            since = calls[d].seq_last;
            break;
        }
    for (int pass = 0; pass < 2; pass++) {
        double worst = -1;
        long last = -1;
        int any_fail = 0, any = 0;
        for (size_t d = 0; d < ncalls; d++) {
            const probe_call_verdict *D = &calls[d];
            if ((long)d == c || D->seq_last >= C->seq_first || D->seq_last <= since ||
                is_ancestor(calls, (long)d, c))
                continue;
            for (size_t k = cm->first[d]; k < cm->first[d + 1]; k++) {
                const probe_tensor_result *Y = &r->tensors[cm->members[k]];
                if (is_input(Y))
                    continue;
                any = 1;
                any_fail |= fails(Y);
                if (Y->compared && isfinite(Y->m.rel_l2) && Y->m.rel_l2 > worst)
                    worst = Y->m.rel_l2;
            }
            if (last < 0 || D->seq_last > calls[last].seq_last)
                last = (long)d;
        }
        if (!any) {
            if (since == INT64_MIN) { /* nothing ran before it */
                ev->kind = PROBE_INTRODUCED_BEFORE;
                ev->call = c;
                ev->tensor = (long)x;
                ev->after_call = -1;
                ev->amplification = NAN;
                ev->seq = seq_of(r, x);
                return;
            }
            since = INT64_MIN; /* the previous call ran just before: look at everything */
            continue;
        }
        if (any_fail)
            return; /* inherited */
        ev->kind = PROBE_INTRODUCED_BETWEEN;
        ev->call = c;
        ev->tensor = (long)x;
        ev->after_call = last;
        ev->amplification = worst > 0 ? X->m.rel_l2 / worst : INFINITY;
        ev->seq = seq_of(r, x);
        return;
    }
}

/* A call while the calls are built: its verdict and its group in the sorted index. */
typedef struct {
    probe_call_verdict v;   /* first: by_seq compares items as verdicts */
    size_t g0, g1;
} call_item;

static int same_call(const probe_tensor_info *a, const probe_tensor_info *b)
{
    return a->call == b->call && strcmp(a->component, b->component) == 0;
}

/* The calls of r in execution order, each with its tensors: *calls (ncalls),
 * cm->members / cm->first. PROBE_ENOMEM (nothing allocated then). */
static probe_status build_calls(const probe_compare_result *r, probe_call_verdict **calls_out,
                                size_t *ncalls_out, call_members *cm)
{
    size_t n = 0, ncalls = 0;
    size_t *idx = malloc((r->ntensors ? r->ntensors : 1) * sizeof *idx);
    call_item *it = NULL;
    probe_call_verdict *calls = NULL;
    cm->members = cm->first = NULL;
    if (!idx)
        goto oom;
    for (size_t i = 0; i < r->ntensors; i++)
        if (r->tensors[i].ref.call >= 0 && r->tensors[i].ref.component[0] &&
            !is_operand(&r->tensors[i].ref))
            idx[n++] = i;
    qsort_r(idx, n, sizeof *idx, by_call, (void *)r);
    for (size_t k = 0; k < n; k++)
        ncalls += k == 0 || !same_call(&r->tensors[idx[k - 1]].ref, &r->tensors[idx[k]].ref);
    it = calloc(ncalls ? ncalls : 1, sizeof *it);
    calls = calloc(ncalls ? ncalls : 1, sizeof *calls);
    cm->members = malloc((n ? n : 1) * sizeof *cm->members);
    cm->first = malloc((ncalls + 1) * sizeof *cm->first);
    if (!it || !calls || !cm->members || !cm->first)
        goto oom;
    size_t c = 0;
    for (size_t k = 0; k < n; k++) {
        const probe_tensor_info *ti = &r->tensors[idx[k]].ref;
        if (k == 0 || !same_call(&r->tensors[idx[k - 1]].ref, ti)) {
            probe_call_verdict *v = &it[c].v;
            snprintf(v->component, sizeof v->component, "%s", ti->component);
            v->call = ti->call;
            v->step = ti->step;
            v->cfg_branch = ti->cfg_branch;
            v->seq_first = INT64_MAX;
            v->seq_last = INT64_MIN;
            v->parent = v->via = v->first_failure = v->block = -1;
            v->decided_by = "inputs";
            it[c].g0 = k;
            c++;
        }
        probe_call_verdict *v = &it[c - 1].v;
        it[c - 1].g1 = k + 1;
        int64_t s = seq_of(r, idx[k]);
        v->seq_first = s < v->seq_first ? s : v->seq_first;
        v->seq_last = s > v->seq_last ? s : v->seq_last;
        if (v->step < 0)
            v->step = ti->step;
        if (v->cfg_branch < 0)
            v->cfg_branch = ti->cfg_branch;
    }
    qsort(it, ncalls, sizeof *it, by_seq);
    size_t m = 0;
    for (size_t k = 0; k < ncalls; k++) {
        calls[k] = it[k].v;
        cm->first[k] = m;
        for (size_t g = it[k].g0; g < it[k].g1; g++)
            cm->members[m++] = idx[g];
    }
    cm->first[ncalls] = m;
    free(it);
    free(idx);
    *calls_out = calls;
    *ncalls_out = ncalls;
    return PROBE_OK;
oom:
    free(idx);
    free(it);
    free(calls);
    free(cm->members);
    free(cm->first);
    cm->members = cm->first = NULL;
    return probe_set_error(PROBE_ENOMEM, "out of memory attributing differences");
}

probe_status probe_attribute(probe_compare_result *r)
{
    free(r->calls);
    r->calls = NULL;
    r->ncalls = 0;
    memset(&r->introduced, 0, sizeof r->introduced);
    r->introduced.call = r->introduced.tensor = r->introduced.after_call = -1;
    r->introduced.amplification = NAN;

    probe_call_verdict *calls = NULL;
    size_t ncalls = 0;
    call_members cm;
    probe_status st = build_calls(r, &calls, &ncalls, &cm);
    if (st != PROBE_OK)
        return st;
    size_t *first = cm.first, *members = cm.members;

    /* Nesting: a stack of open calls over the calls in execution order. */
    long *stack = malloc((ncalls ? ncalls : 1) * sizeof *stack);
    if (!stack) {
        free(calls);
        free(first);
        free(members);
        return probe_set_error(PROBE_ENOMEM, "out of memory attributing differences");
    }
    size_t top = 0;
    for (size_t k = 0; k < ncalls; k++) {
        while (top && calls[stack[top - 1]].seq_last < calls[k].seq_first)
            top--;
        if (top && encloses(&calls[stack[top - 1]], &calls[k]))
            calls[k].parent = stack[top - 1];
        stack[top++] = (long)k;
    }
    free(stack);
    for (size_t k = 0; k < ncalls; k++) {
        if (calls[k].parent < 0)
            continue;
        long b = 0;
        for (size_t j = 0; j < k; j++)
            b += calls[j].parent == calls[k].parent &&
                 strcmp(calls[j].component, calls[k].component) == 0;
        calls[k].block = b;
    }

    /* Status of each call. */
    for (size_t k = 0; k < ncalls; k++) {
        probe_call_verdict *v = &calls[k];
        int in_fail = 0, out_fail = 0, iso_known = 0, iso_fail = 0;
        for (size_t g = first[k]; g < first[k + 1]; g++) {
            const probe_tensor_result *t = &r->tensors[members[g]];
            if (is_input(t)) {
                in_fail |= fails(t);
                continue;
            }
            if (fails(t)) {
                out_fail = 1;
                if (v->first_failure < 0 || seq_of(r, members[g]) < seq_of(r, (size_t)v->first_failure))
                    v->first_failure = (long)members[g];
            }
            /* an isolated run whose inputs were converted (--replay --convert) carries their
             * rounding: it cannot decide, the inputs rule does */
            if (t->has_isolated && !t->isolated_inputs_converted) {
                iso_known = 1;
                iso_fail |= isolated_fails(t);
            }
        }
        if (!out_fail)
            v->status = in_fail ? PROBE_CALL_INPUTS_DIFFER : PROBE_CALL_PASS;
        else if (iso_known) {
            v->status = iso_fail ? PROBE_CALL_INTRODUCED : PROBE_CALL_INHERITED;
            v->decided_by = "isolated";
        } else
            v->status = in_fail ? PROBE_CALL_INHERITED : PROBE_CALL_INTRODUCED;
    }
    /* A call that introduced a difference a nested call had already introduced. */
    for (size_t k = ncalls; k-- > 0;) {
        probe_call_verdict *v = &calls[k];
        if (v->status != PROBE_CALL_INTRODUCED)
            continue;
        for (size_t j = k + 1; j < ncalls && calls[j].seq_first < v->seq_last; j++) {
            if (!is_ancestor(calls, (long)k, (long)j))
                continue;
            if (calls[j].status == PROBE_CALL_INTRODUCED || calls[j].status == PROBE_CALL_INSIDE) {
                v->status = PROBE_CALL_INSIDE;
                v->via = calls[j].status == PROBE_CALL_INSIDE ? calls[j].via : (long)j;
                break;
            }
        }
    }

    /* Where the difference shows first: an introducing call, or an input that
     * fails with nothing upstream to explain it. */
    event best = {INT64_MAX, PROBE_INTRODUCED_NONE, -1, -1, -1, NAN};
    for (size_t k = 0; k < ncalls; k++) {
        probe_call_verdict *v = &calls[k];
        if (v->status == PROBE_CALL_INTRODUCED && seq_of(r, (size_t)v->first_failure) < best.seq) {
            best.seq = seq_of(r, (size_t)v->first_failure);
            best.kind = PROBE_INTRODUCED_CALL;
            best.call = (long)k;
            best.tensor = v->first_failure;
            best.after_call = -1;
            best.amplification = NAN;
        }
        for (size_t g = first[k]; g < first[k + 1]; g++) {
            size_t x = members[g];
            if (!is_input(&r->tensors[x]) || !fails(&r->tensors[x]) || seq_of(r, x) >= best.seq)
                continue;
            event ev = {0, PROBE_INTRODUCED_NONE, -1, -1, -1, NAN};
            input_event(r, calls, ncalls, &cm, (long)k, x, &ev);
            if (ev.kind != PROBE_INTRODUCED_NONE && ev.seq < best.seq)
                best = ev;
            break; /* the first failing input speaks for the call */
        }
    }
    r->introduced.kind = best.kind;
    r->introduced.call = best.call;
    r->introduced.tensor = best.tensor;
    r->introduced.after_call = best.after_call;
    r->introduced.amplification = best.amplification;
    if (best.after_call >= 0)
        snprintf(r->introduced.after, sizeof r->introduced.after, "%s",
                 calls[best.after_call].component);
    for (size_t k = 0; k < ncalls; k++)
        r->introduced.ninherited += calls[k].status == PROBE_CALL_INHERITED;
    free(first);
    free(members);
    r->calls = calls;
    r->ncalls = ncalls;
    return PROBE_OK;
}
