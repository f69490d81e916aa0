/* oracle_check.c - recompute the captured ops of a capture file in fp64
 * (references/) and gate each captured output against the rounding-error
 * bound its precision implies (probe/oracle/oracle_check.h, docs/oracle.md).
 * probe-oracle (tools/probe_oracle.c) is its command line. */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "oracle_check.h"
#include "probe/gate.h"
#include "probe/references.h"
#include "../../metrics/vocab/textsafe.h"

#define MAX_OPERANDS 16

/* ---- one op's result ---- */

typedef probe_oracle_op op_result;

/* ---- helpers ---- */

static double unit_roundoff(probe_dtype t, double *eta)
{
    /* u = 2^-p (p = significand bits incl. the implicit one), eta = half the
     * smallest positive subnormal: the absolute error of rounding a value
     * below the normal range. */
    switch (t) {
    case PROBE_DTYPE_FLOAT64: *eta = ldexp(1, -1075); return ldexp(1, -53);
    case PROBE_DTYPE_FLOAT32: *eta = ldexp(1, -150); return ldexp(1, -24);
    case PROBE_DTYPE_FLOAT16: *eta = ldexp(1, -25); return ldexp(1, -11);
    case PROBE_DTYPE_BFLOAT16: *eta = ldexp(1, -134); return ldexp(1, -8);
    case PROBE_DTYPE_FLOAT8_E4M3FN: *eta = ldexp(1, -10); return ldexp(1, -4);
    case PROBE_DTYPE_FLOAT8_E5M2: *eta = ldexp(1, -17); return ldexp(1, -3);
    default: *eta = 0; return -1;
    }
}

/* a non-GEMM op's compute precision ("compute" key; default 32F) */
static double compute_u(const char *c)
{
    if (c == NULL || !strcmp(c, "32F"))
        return ldexp(1, -24);
    if (!strcmp(c, "64F"))
        return ldexp(1, -53);
    if (!strcmp(c, "16F") || !strcmp(c, "32F_FAST_TF32"))
        return ldexp(1, -11);
    if (!strcmp(c, "16BF"))
        return ldexp(1, -8);
    return -1;
}

static void flat_to_index(const probe_tensor_info *t, uint64_t off, int64_t *idx)
{
    for (int d = t->rank - 1; d >= 0; d--) {
        uint64_t s = t->shape[d] > 0 ? (uint64_t)t->shape[d] : 1;
        idx[d] = (int64_t)(off % s);
        off /= s;
    }
}

static void format_index(const int64_t *idx, int rank, char *buf, size_t size)
{
    size_t o = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < rank && o < size; d++)
        o += (size_t)snprintf(buf + o, size - o, "%s%lld", d ? ", " : "", (long long)idx[d]);
    if (o < size)
        snprintf(buf + o, size - o, "]");
}

void probe_oracle_format_shape(const probe_oracle_op *r, char *buf, size_t size)
{
    format_index(r->shape, r->rank, buf, size);
}

/* ---- the operands of one record ---- */

typedef struct operand {
    char slot[32];
    char path[512];
    size_t index;
    const probe_tensor_info *t;
    double *v;          /* read on demand */
} operand;

typedef struct op_record {
    json_t *j;
    const char *name;
    char dir[512];
    operand ops[MAX_OPERANDS];
    int nops;
    probe_file *f;
    const char *file;   /* the capture file's name, for messages */
    double max_flops;   /* --max-flops */
} op_record;

static operand *rec_operand(op_record *r, const char *slot)
{
    for (int i = 0; i < r->nops; i++)
        if (!strcmp(r->ops[i].slot, slot))
            return &r->ops[i];
    return NULL;
}

/* Read the operand's values (fp64); PROBE_EUNSUPPORTED for a stats-only
 * record, whose elements are not in the file. */
static probe_status rec_read(op_record *r, operand *o)
{
    if (o->v != NULL)
        return PROBE_OK;
    if (o->t->stats_only)
        return PROBE_EUNSUPPORTED;
    if (o->t->n > SIZE_MAX / sizeof(double))
        return PROBE_ENOMEM;
    o->v = malloc((o->t->n > 0 ? (size_t)o->t->n : 1) * sizeof(double));
    if (o->v == NULL)
        return PROBE_ENOMEM;
    probe_status s = probe_file_read_f64(r->f, o->index, o->v);
    if (s != PROBE_OK) {
        free(o->v);
        o->v = NULL;
    }
    return s;
}

static void rec_free(op_record *r)
{
    for (int i = 0; i < r->nops; i++)
        free(r->ops[i].v);
    json_decref(r->j);
}

/* bad input: one line naming file and path */
static int bad(const op_record *r, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(const op_record *r, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "probe-oracle: %s: %s: ", probe_tesc(r->file), probe_tesc(path));
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

static int nc(op_result *res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int nc(op_result *res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->reason, sizeof res->reason, fmt, ap);
    va_end(ap);
    res->v = PROBE_ORACLE_NOT_CHECKABLE;
    return 0;
}

/* required slots present (else not checkable) and readable (stats-only:
 * not checkable; a read error: bad input, exit 2) */
static int need(op_record *r, op_result *res, const char *const *slots, int *err)
{
    *err = 0;
    for (int i = 0; slots[i]; i++) {
        operand *o = rec_operand(r, slots[i]);
        if (o == NULL) {
            nc(res, "operand '%s' was not captured", slots[i]);
            return 0;
        }
        if (o->t->stats_only) {
            nc(res, "operand '%s' (%s) is a stats-only record", slots[i], o->path);
            return 0;
        }
        if (!probe_dtype_is_float(o->t->dtype)) {
            nc(res, "operand '%s' (%s) is %s, not a floating type", slots[i], o->path,
               probe_dtype_name(o->t->dtype));
            return 0;
        }
        probe_status s = rec_read(r, o);
        if (s == PROBE_ENOMEM) {
            nc(res, "operand '%s' (%s): out of memory", slots[i], o->path);
            return 0;
        }
        if (s != PROBE_OK) {
            *err = bad(r, o->path, "%s", probe_last_error());
            return 0;
        }
    }
    return 1;
}

static int json_num(json_t *j, const char *key, double def, double *out)
{
    json_t *v = json_object_get(j, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return 1;
    }
    if (!json_is_number(v))
        return 0;
    *out = json_number_value(v);
    return isfinite(*out);
}

static int json_int(json_t *j, const char *key, int64_t def, int64_t *out)
{
    json_t *v = json_object_get(j, key);
    if (v == NULL) {
        if (def < 0)
            return 0;
        *out = def;
        return 1;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = json_integer_value(v);
    return 1;
}

static const char *json_str(json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* ---- gating: cand vs ref with a per-element bound ---- */

static void gate(op_result *res, const probe_tensor_info *out, const double *cand,
                 const double *ref, const double *bound)
{
    uint64_t n = out->n;
    res->max_ratio = 0;
    res->violations = 0;
    uint64_t worst = 0;
    int have_worst = 0;
    for (uint64_t i = 0; i < n; i++) {
        double c = cand[i], r = ref[i], ratio;
        double err = fabs(c - r);
        if (!isfinite(c) || !isfinite(r)) {
            int same = (isnan(c) && isnan(r)) || c == r;
            ratio = same ? 0 : INFINITY;
            err = same ? 0 : INFINITY;
        } else if (bound[i] > 0) {
            ratio = err / bound[i];
        } else {
            ratio = err == 0 ? 0 : INFINITY;
        }
        if (ratio > 1)
            res->violations++;
        if (!have_worst || ratio > res->max_ratio) {
            have_worst = 1;
            res->max_ratio = ratio;
            worst = i;
            res->worst_err = err;
            res->worst_bound = bound[i];
            res->worst_ref = r;
            res->worst_cand = c;
        }
    }
    flat_to_index(out, worst, res->worst_index);
    res->v = res->violations == 0 ? PROBE_ORACLE_PASS : PROBE_ORACLE_FAIL;
    if (res->v == PROBE_ORACLE_FAIL) {
        char idx[256];
        format_index(res->worst_index, out->rank, idx, sizeof idx);
        snprintf(res->reason, sizeof res->reason,
                 "%llu of %llu elements outside the bound; worst %s: captured %.9g, fp64 %.9g, "
                 "|err| %.3g > bound %.3g",
                 (unsigned long long)res->violations, (unsigned long long)n, idx, res->worst_cand,
                 res->worst_ref, res->worst_err, res->worst_bound);
    }
    probe_metrics_opts mo = {1e-3, 1e-3};
    if (probe_metrics_compute(ref, cand, (size_t)n, &mo, &res->m) == PROBE_OK) {
        probe_gate g;
        res->have_metrics = probe_gate_parse("T1", &g) == PROBE_OK &&
                            probe_gate_check(&g, &res->m, &res->t1) == PROBE_OK;
    }
}

static void set_out(op_result *res, const operand *out)
{
    snprintf(res->dtype, sizeof res->dtype, "%s", probe_dtype_name(out->t->dtype));
    res->rank = out->t->rank;
    memcpy(res->shape, out->t->shape, sizeof res->shape);
    res->n = out->t->n;
}

/* ---- GEMM ---- */

/* The precision model of a GEMM's compute type and epilogue: 1, or 0 when
 * either is not modelled (res is then not checkable). */
static int gemm_model(op_result *res, const char *compute, const char *epi,
                      probe_ref_gemm_precision *p, probe_ref_epilogue *e, int *want_bias)
{
    memset(p, 0, sizeof *p);
    p->lip = 1.0;
    if (!strncmp(compute, "32F", 3) && (compute[3] == '\0' || !strcmp(compute + 3, "_PEDANTIC") ||
                                        !strncmp(compute + 3, "_FAST", 5))) {
        /* fp32 accumulation; tensor cores align and truncate (Fasi et al.
         * 2021): one more bit than round-to-nearest's 2^-24 */
        p->u_acc = ldexp(1, -23);
        p->u_epi = ldexp(1, -24);
        if (!strcmp(compute, "32F_FAST_TF32"))
            p->u_in = ldexp(1, -11);
        else if (!strcmp(compute, "32F_FAST_16F"))
            p->u_in = ldexp(1, -11);
        else if (!strcmp(compute, "32F_FAST_16BF"))
            p->u_in = ldexp(1, -8);
        else if (compute[3] != '\0' && strcmp(compute, "32F_PEDANTIC"))
            return nc(res, "compute type %s is not modelled", compute);
    } else if (!strcmp(compute, "16F") || !strcmp(compute, "16F_PEDANTIC")) {
        p->u_acc = p->u_epi = ldexp(1, -11);
    } else if (!strcmp(compute, "64F") || !strcmp(compute, "64F_PEDANTIC")) {
        p->u_acc = p->u_epi = ldexp(1, -53);
    } else {
        return nc(res, "compute type %s is not modelled", compute);
    }
    *want_bias = strstr(epi, "BIAS") != NULL;
    if (!strcmp(epi, "DEFAULT") || !strcmp(epi, "BIAS")) {
        *e = PROBE_REF_EPI_NONE;
    } else if (!strcmp(epi, "RELU") || !strcmp(epi, "RELU_BIAS")) {
        *e = PROBE_REF_EPI_RELU;
    } else if (!strcmp(epi, "GELU") || !strcmp(epi, "GELU_BIAS")) {
        *e = PROBE_REF_EPI_GELU_TANH;
        p->lip = 1.13;          /* max |d gelu/dx| = 1.1289... */
        p->u_epi *= 16;         /* tanh/exp evaluated in the epilogue */
    } else {
        return nc(res, "epilogue %s is not modelled", epi);
    }
    return 1;
}

/* The operands' element counts against m, n, k and batch. 0, or 2 after one
 * line (bad input). */
static int gemm_check_sizes(op_record *r, const operand *oa, const operand *ob, const operand *oo,
                            const operand *oc, const operand *obias, int64_t m, int64_t n,
                            int64_t k, int64_t batch)
{
    /* element counts against m, n, k, batch (products checked for overflow
     * in double: the counts of a real file are far below 2^53) */
    double mk = (double)m * (double)k, kn = (double)k * (double)n, mn = (double)m * (double)n;
    double B = (double)batch;
    if ((double)oa->t->n != mk && (double)oa->t->n != mk * B)
        return bad(r, oa->path, "probe.op: a holds %llu elements; m*k = %.0f (batch %lld)",
                   (unsigned long long)oa->t->n, mk, (long long)batch);
    if ((double)ob->t->n != kn && (double)ob->t->n != kn * B)
        return bad(r, ob->path, "probe.op: b holds %llu elements; k*n = %.0f (batch %lld)",
                   (unsigned long long)ob->t->n, kn, (long long)batch);
    if ((double)oo->t->n != mn * B)
        return bad(r, oo->path, "probe.op: out holds %llu elements; batch*n*m = %.0f",
                   (unsigned long long)oo->t->n, mn * B);
    if (oc && (double)oc->t->n != mn * B)
        return bad(r, oc->path, "probe.op: c holds %llu elements; batch*n*m = %.0f",
                   (unsigned long long)oc->t->n, mn * B);
    if (obias && (double)obias->t->n != (double)m)
        return bad(r, obias->path, "probe.op: bias holds %llu elements; m = %lld",
                   (unsigned long long)obias->t->n, (long long)m);
    if (oo->t->rank >= 2 && (oo->t->shape[oo->t->rank - 1] != m || oo->t->shape[oo->t->rank - 2] != n))
        return bad(r, oo->path, "probe.op: out's last two axes are not [n, m] = [%lld, %lld]",
                   (long long)n, (long long)m);
    return 0;
}

static int check_gemm(op_record *r, op_result *res)
{
    json_t *j = r->j;
    const char *path = r->ops[0].path;
    const char *ta = json_str(j, "transa"), *tb = json_str(j, "transb");
    int64_t m, n, k, batch;
    double alpha, beta;
    if (ta == NULL || tb == NULL || strlen(ta) != 1 || strlen(tb) != 1 || !strchr("NTC", ta[0]) ||
        !strchr("NTC", tb[0]))
        return bad(r, path, "probe.op: gemm needs \"transa\" and \"transb\" of \"N\" or \"T\"");
    if (!json_int(j, "m", -1, &m) || !json_int(j, "n", -1, &n) || !json_int(j, "k", -1, &k) ||
        !json_int(j, "batch", 1, &batch) || batch < 1)
        return bad(r, path, "probe.op: gemm needs non-negative integers \"m\", \"n\", \"k\" (and "
                         "\"batch\" >= 1 when given)");
    if (!json_num(j, "alpha", 1.0, &alpha) || !json_num(j, "beta", 0.0, &beta))
        return bad(r, path, "probe.op: gemm \"alpha\"/\"beta\" must be finite numbers");
    const char *api = json_str(j, "api");
    snprintf(res->api, sizeof res->api, "%s", api ? api : "");
    const char *compute = json_str(j, "compute");
    const char *epi = json_str(j, "epilogue");
    if (compute == NULL)
        compute = "32F";
    if (epi == NULL)
        epi = "DEFAULT";

    probe_ref_gemm_precision p = {0};
    probe_ref_epilogue e = PROBE_REF_EPI_NONE;
    int want_bias = 0;
    if (!gemm_model(res, compute, epi, &p, &e, &want_bias))
        return 0;

    const char *req[] = {"a", "b", "out", NULL};
    int err;
    if (!need(r, res, req, &err))
        return err;
    if (beta != 0.0) {
        const char *rc[] = {"c", NULL};
        if (!need(r, res, rc, &err))
            return err;
    }
    if (want_bias) {
        const char *rb[] = {"bias", NULL};
        if (!need(r, res, rb, &err))
            return err;
    }
    operand *oa = rec_operand(r, "a"), *ob = rec_operand(r, "b"), *oo = rec_operand(r, "out");
    operand *oc = beta != 0.0 ? rec_operand(r, "c") : NULL;
    operand *obias = want_bias ? rec_operand(r, "bias") : NULL;
    set_out(res, oo);
    double scales[2] = {1.0, 1.0};
    const char *sn[2] = {"scale_a", "scale_b"};
    for (int s = 0; s < 2; s++) {
        operand *os = rec_operand(r, sn[s]);
        if (os == NULL)
            continue;
        const char *rs[] = {sn[s], NULL};
        if (!need(r, res, rs, &err))
            return err;
        if (os->t->n != 1)
            return bad(r, os->path, "probe.op: %s must hold one element, it holds %llu", sn[s],
                       (unsigned long long)os->t->n);
        scales[s] = os->v[0];
    }
    double mk = (double)m * (double)k, kn = (double)k * (double)n, mn = (double)m * (double)n;
    double B = (double)batch;
    if ((err = gemm_check_sizes(r, oa, ob, oo, oc, obias, m, n, k, batch)))
        return err;
    double flops = 2.0 * B * mn * (double)k;
    if (flops > r->max_flops)
        return nc(res, "fp64 work %.3g flops is above --max-flops %.3g", flops, r->max_flops);

    /* FP8 operands: Hopper's FP8 tensor cores keep about 14 bits in the
     * accumulator (DeepSeek-V3 technical report, sec. 3.3.2) */
    if (oa->t->dtype == PROBE_DTYPE_FLOAT8_E4M3FN || oa->t->dtype == PROBE_DTYPE_FLOAT8_E5M2 ||
        ob->t->dtype == PROBE_DTYPE_FLOAT8_E4M3FN || ob->t->dtype == PROBE_DTYPE_FLOAT8_E5M2)
        if (p.u_acc < ldexp(1, -13))
            p.u_acc = ldexp(1, -13);
    p.u_out = unit_roundoff(oo->t->dtype, &p.eta_out);
    res->u_acc = p.u_acc;
    res->u_out = p.u_out;

    size_t total = (size_t)oo->t->n;
    double *ref = malloc((total ? total : 1) * sizeof(double));
    double *S = malloc((total ? total : 1) * sizeof(double));
    if (ref == NULL || S == NULL) {
        free(ref);
        free(S);
        return nc(res, "out of memory for %zu output elements", total);
    }
    probe_ref_gemm_args g = {
        .transa = ta[0] != 'N', .transb = tb[0] != 'N', .m = m, .n = n, .k = k, .batch = batch,
        .alpha = alpha, .beta = beta, .scale_a = scales[0], .scale_b = scales[1],
        .a = oa->v, .a_batched = (double)oa->t->n != mk || batch == 1,
        .b = ob->v, .b_batched = (double)ob->t->n != kn || batch == 1,
        .c = oc ? oc->v : NULL, .bias = obias ? obias->v : NULL, .epilogue = e};
    if (probe_ref_gemm(&g, ref, S) != PROBE_OK) {
        free(ref);
        free(S);
        return bad(r, oo->path, "probe.op: gemm arguments rejected by the fp64 reference");
    }
    double aas = fabs(alpha * scales[0] * scales[1]);
    size_t mm = (size_t)m;
    for (size_t o = 0; o < total; o++) {
        double bc = oc ? fabs(beta * oc->v[o]) : 0.0;
        double bb = obias ? fabs(obias->v[o % mm]) : 0.0;
        S[o] = probe_ref_gemm_bound(&p, k, ref[o], S[o], aas, bc, bb);
    }
    gate(res, oo->t, oo->v, ref, S);
    free(ref);
    free(S);
    return 0;
}

/* ---- non-GEMM ops ---- */

/* common: compute precision, output type */
static int common_prec(op_record *r, op_result *res, operand *out, double *u)
{
    const char *c = json_str(r->j, "compute");
    *u = compute_u(c);
    if (*u < 0)
        return nc(res, "compute type %s is not modelled", c), 0;
    res->u_acc = *u;
    set_out(res, out);
    return 1;
}

/* last-axis length of x; rows = n / d */
static int last_axis(const probe_tensor_info *t, int64_t *d, int64_t *rows)
{
    if (t->rank < 1 || t->shape[t->rank - 1] == 0)
        return 0;
    *d = t->shape[t->rank - 1];
    *rows = (int64_t)(t->n / (uint64_t)*d);
    return 1;
}

static int same_shape(const probe_tensor_info *a, const probe_tensor_info *b)
{
    return a->rank == b->rank && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank);
}

/* Expand t (numpy broadcasting, right-aligned) to x's shape: out[x.n] */
static int broadcast(const probe_tensor_info *x, const probe_tensor_info *t, const double *tv,
                     double *out)
{
    if (t->rank > x->rank)
        return 0;
    int64_t stride[PROBE_MAX_RANK] = {0};
    int64_t s = 1;
    for (int d = x->rank - 1, e = t->rank - 1; d >= 0; d--, e--) {
        if (e < 0) {
            stride[d] = 0;
            continue;
        }
        if (t->shape[e] == x->shape[d])
            stride[d] = s;
        else if (t->shape[e] == 1)
            stride[d] = 0;
        else
            return 0;
        s *= t->shape[e];
    }
    int64_t idx[PROBE_MAX_RANK] = {0};
    for (uint64_t i = 0; i < x->n; i++) {
        int64_t o = 0;
        for (int d = 0; d < x->rank; d++)
            o += idx[d] * stride[d];
        out[i] = tv[o];
        for (int d = x->rank - 1; d >= 0; d--) {
            if (++idx[d] < x->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return 1;
}

static int check_pointwise(op_record *r, op_result *res)
{
    const char *req[] = {"x", "out", NULL};
    int err;
    if (!need(r, res, req, &err))
        return err;
    operand *ox = rec_operand(r, "x"), *oo = rec_operand(r, "out");
    double u;
    if (!common_prec(r, res, oo, &u))
        return 0;
    if (!same_shape(ox->t, oo->t))
        return bad(r, oo->path, "probe.op: %s: out's shape differs from x's", r->name);
    probe_ref_gelu_approx approx = PROBE_REF_GELU_ERF;
    int is_gelu = !strcmp(r->name, "gelu");
    if (is_gelu) {
        const char *a = json_str(r->j, "approximate");
        if (a == NULL || !strcmp(a, "none"))
            approx = PROBE_REF_GELU_ERF;
        else if (!strcmp(a, "tanh"))
            approx = PROBE_REF_GELU_TANH;
        else
            return bad(r, oo->path, "probe.op: gelu \"approximate\" must be \"none\" or \"tanh\"");
    }
    size_t n = (size_t)ox->t->n;
    double *ref = malloc((n ? n : 1) * sizeof(double)), *mag = malloc((n ? n : 1) * sizeof(double));
    if (ref == NULL || mag == NULL) {
        free(ref);
        free(mag);
        return nc(res, "out of memory");
    }
    if (is_gelu) {
        probe_ref_gelu(ox->v, n, approx, ref, mag);
    } else {
        probe_ref_silu(ox->v, n, ref);
        for (size_t i = 0; i < n; i++)
            mag[i] = fabs(ref[i]);
    }
    double eta;
    res->u_out = unit_roundoff(oo->t->dtype, &eta);
    for (size_t i = 0; i < n; i++)
        mag[i] = 2 * res->u_out * fabs(ref[i]) + 16 * u * mag[i] + eta;
    gate(res, oo->t, oo->v, ref, mag);
    free(ref);
    free(mag);
    return 0;
}

static int check_norm(op_record *r, op_result *res, int layer)
{
    const char *req[] = {"x", "out", NULL};
    int err;
    if (!need(r, res, req, &err))
        return err;
    operand *ox = rec_operand(r, "x"), *oo = rec_operand(r, "out");
    operand *ow = rec_operand(r, "weight"), *ob = layer ? rec_operand(r, "bias") : NULL;
    if (ow) {
        const char *w[] = {"weight", NULL};
        if (!need(r, res, w, &err))
            return err;
    }
    if (ob) {
        const char *b[] = {"bias", NULL};
        if (!need(r, res, b, &err))
            return err;
    }
    double u, eps;
    if (!common_prec(r, res, oo, &u))
        return 0;
    if (!json_num(r->j, "eps", layer ? 1e-5 : 1e-6, &eps) || eps < 0)
        return bad(r, oo->path, "probe.op: %s \"eps\" must be a finite number >= 0", r->name);
    int64_t d, rows;
    if (!same_shape(ox->t, oo->t) || !last_axis(ox->t, &d, &rows))
        return bad(r, oo->path, "probe.op: %s: out's shape differs from x's or x has no last axis",
                   r->name);
    if ((ow && ow->t->n != (uint64_t)d) || (ob && ob->t->n != (uint64_t)d))
        return bad(r, oo->path, "probe.op: %s: weight/bias must hold %lld elements (x's last axis)",
                   r->name, (long long)d);
    size_t n = (size_t)ox->t->n;
    double *ref = malloc((n ? n : 1) * sizeof(double)), *bound = malloc((n ? n : 1) * sizeof(double));
    double *mean = malloc((size_t)(rows ? rows : 1) * sizeof(double));
    double *rstd = malloc((size_t)(rows ? rows : 1) * sizeof(double));
    if (!ref || !bound || !mean || !rstd) {
        free(ref), free(bound), free(mean), free(rstd);
        return nc(res, "out of memory");
    }
    double eta;
    res->u_out = unit_roundoff(oo->t->dtype, &eta);
    double gd = probe_ref_gamma((double)d, u) + 8 * u;
    if (layer) {
        probe_ref_layernorm(ox->v, rows, d, ow ? ow->v : NULL, ob ? ob->v : NULL, eps, ref, mean,
                            rstd);
        for (int64_t rr = 0; rr < rows; rr++) {
            const double *x = ox->v + rr * d;
            double ma = 0;
            for (int64_t i = 0; i < d; i++)
                ma += fabs(x[i]);
            ma /= (double)d;
            for (int64_t i = 0; i < d; i++) {
                size_t o = (size_t)(rr * d + i);
                double w = ow ? fabs(ow->v[i]) : 1.0, b = ob ? fabs(ob->v[i]) : 0.0;
                double E = gd * (w * (fabs(x[i]) + ma + fabs(x[i] - mean[rr])) * rstd[rr] + b);
                bound[o] = 2 * res->u_out * fabs(ref[o]) + E + eta;
            }
        }
    } else {
        probe_ref_rmsnorm(ox->v, rows, d, ow ? ow->v : NULL, eps, ref);
        for (size_t o = 0; o < n; o++)
            bound[o] = 2 * res->u_out * fabs(ref[o]) + (0.5 * gd + 8 * u) * fabs(ref[o]) + eta;
    }
    gate(res, oo->t, oo->v, ref, bound);
    free(ref), free(bound), free(mean), free(rstd);
    return 0;
}

static int check_rope(op_record *r, op_result *res)
{
    const char *req[] = {"x", "cos", "sin", "out", NULL};
    int err;
    if (!need(r, res, req, &err))
        return err;
    operand *ox = rec_operand(r, "x"), *oc = rec_operand(r, "cos"), *os = rec_operand(r, "sin"),
            *oo = rec_operand(r, "out");
    double u;
    if (!common_prec(r, res, oo, &u))
        return 0;
    const char *conv = json_str(r->j, "convention");
    probe_ref_rope_convention cv;
    if (conv && !strcmp(conv, "interleaved"))
        cv = PROBE_REF_ROPE_INTERLEAVED;
    else if (conv && !strcmp(conv, "half"))
        cv = PROBE_REF_ROPE_HALF;
    else
        return bad(r, oo->path, "probe.op: rope needs \"convention\": \"interleaved\" or \"half\"");
    int64_t d, rows;
    if (!same_shape(ox->t, oo->t) || !last_axis(ox->t, &d, &rows) || d % 2)
        return bad(r, oo->path, "probe.op: rope: out's shape differs from x's or x's last axis is odd");
    size_t n = (size_t)ox->t->n;
    double *buf = malloc(4 * (n ? n : 1) * sizeof(double));
    if (buf == NULL)
        return nc(res, "out of memory");
    double *cs = buf, *sn = buf + n, *ref = buf + 2 * n, *rot = buf + 3 * n;
    if (!broadcast(ox->t, oc->t, oc->v, cs) || !broadcast(ox->t, os->t, os->v, sn)) {
        free(buf);
        return bad(r, oo->path, "probe.op: rope: cos/sin do not broadcast to x's shape");
    }
    probe_ref_rope(ox->v, cs, sn, rows, d, cv, ref, rot);
    double eta;
    res->u_out = unit_roundoff(oo->t->dtype, &eta);
    for (size_t i = 0; i < n; i++) /* reuse cs for the bound */
        cs[i] = 2 * res->u_out * fabs(ref[i]) +
                4 * u * (fabs(ox->v[i] * cs[i]) + fabs(rot[i] * sn[i])) + eta;
    gate(res, oo->t, oo->v, ref, cs);
    free(buf);
    return 0;
}

static int check_attention(op_record *r, op_result *res)
{
    const char *req[] = {"q", "k", "v", "out", NULL};
    int err;
    if (!need(r, res, req, &err))
        return err;
    operand *oq = rec_operand(r, "q"), *ok = rec_operand(r, "k"), *ov = rec_operand(r, "v"),
            *oo = rec_operand(r, "out"), *om = rec_operand(r, "mask");
    if (om) {
        const char *mk[] = {"mask", NULL};
        if (!need(r, res, mk, &err))
            return err;
    }
    double u;
    if (!common_prec(r, res, oo, &u))
        return 0;
    const probe_tensor_info *q = oq->t, *k = ok->t, *v = ov->t, *o = oo->t;
    if (q->rank < 2 || k->rank != q->rank || v->rank != q->rank || o->rank != q->rank)
        return bad(r, oo->path, "probe.op: attention: q, k, v, out must have the same rank >= 2");
    int R = q->rank;
    int64_t sq = q->shape[R - 2], d = q->shape[R - 1], sk = k->shape[R - 2], dv = v->shape[R - 1];
    int64_t heads = 1;
    for (int i = 0; i < R - 2; i++) {
        if (k->shape[i] != q->shape[i] || v->shape[i] != q->shape[i] || o->shape[i] != q->shape[i])
            return bad(r, oo->path, "probe.op: attention: leading axes of q, k, v, out differ");
        heads *= q->shape[i];
    }
    if (k->shape[R - 1] != d || v->shape[R - 2] != sk || o->shape[R - 2] != sq ||
        o->shape[R - 1] != dv)
        return bad(r, oo->path, "probe.op: attention: shapes must be q [.., Sq, D], k [.., Sk, D], "
                             "v [.., Sk, Dv], out [.., Sq, Dv]");
    if (om && om->t->n != (uint64_t)(sq * sk))
        return bad(r, om->path, "probe.op: attention: mask must hold Sq*Sk = %lld elements",
                   (long long)(sq * sk));
    double scale;
    if (!json_num(r->j, "scale", d > 0 ? 1.0 / sqrt((double)d) : 1.0, &scale))
        return bad(r, oo->path, "probe.op: attention \"scale\" must be a finite number");
    json_t *cj = json_object_get(r->j, "causal");
    if (cj != NULL && !json_is_boolean(cj))
        return bad(r, oo->path, "probe.op: attention \"causal\" must be true or false");
    int causal = cj != NULL && json_is_true(cj);
    double flops = 2.0 * (double)heads * (double)sq * (double)sk * (double)(d + dv);
    if (flops > r->max_flops)
        return nc(res, "fp64 work %.3g flops is above --max-flops %.3g", flops, r->max_flops);
    size_t n = (size_t)o->n;
    double *ref = malloc((n ? n : 1) * sizeof(double)), *bound = malloc((n ? n : 1) * sizeof(double));
    if (!ref || !bound) {
        free(ref), free(bound);
        return nc(res, "out of memory");
    }
    probe_status s = probe_ref_attention(oq->v, ok->v, ov->v, heads, sq, sk, d, dv, scale, causal,
                                         om ? om->v : NULL, u, ref, bound);
    if (s != PROBE_OK) {
        free(ref), free(bound);
        return s == PROBE_ENOMEM ? nc(res, "out of memory")
                                 : bad(r, oo->path, "probe.op: attention arguments rejected");
    }
    double eta;
    res->u_out = unit_roundoff(o->dtype, &eta);
    for (size_t i = 0; i < n; i++)
        bound[i] += 2 * res->u_out * fabs(ref[i]) + eta;
    gate(res, o, oo->v, ref, bound);
    free(ref), free(bound);
    return 0;
}

/* ---- the driver ---- */

static int only_match(const char *const *only, int nonly, const char *path)
{
    if (nonly == 0)
        return 1;
    for (int i = 0; i < nonly; i++)
        if (fnmatch(only[i], path, 0) == 0)
            return 1;
    return 0;
}

/* Parse the record of tensor i into r; 2 = bad input (printed) */
static int parse_record(probe_file *f, size_t i, const char *text,
                        const probe_oracle_opts *opts, const char *file, op_record *r)
{
    const probe_tensor_info *t = probe_file_tensor(f, i);
    memset(r, 0, sizeof *r);
    r->f = f;
    r->file = file;
    r->max_flops = opts->max_flops;
    json_error_t je;
    r->j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (r->j == NULL)
        return bad(r, t->path, "probe.op is not valid JSON (line %d: %s)", je.line, je.text);
    if (!json_is_object(r->j) || !json_is_string(json_object_get(r->j, "op")))
        return bad(r, t->path, "probe.op is not a JSON object with a string \"op\"");
    r->name = json_string_value(json_object_get(r->j, "op"));
    json_t *ops = json_object_get(r->j, "operands");
    if (!json_is_object(ops))
        return bad(r, t->path, "probe.op has no \"operands\" object");
    snprintf(r->dir, sizeof r->dir, "%s", t->path);
    char *slash = strrchr(r->dir, '/');
    if (slash)
        slash[1] = '\0';
    const char *key;
    json_t *val;
    json_object_foreach(ops, key, val) {
        if (!json_is_string(val) || strlen(key) >= sizeof r->ops[0].slot)
            return bad(r, t->path, "probe.op: operand \"%s\" is not a dataset name", key);
        if (r->nops == MAX_OPERANDS)
            return bad(r, t->path, "probe.op: more than %d operands", MAX_OPERANDS);
        operand *o = &r->ops[r->nops];
        const char *name = json_string_value(val);
        int w = name[0] == '/' ? snprintf(o->path, sizeof o->path, "%s", name)
                               : snprintf(o->path, sizeof o->path, "%s%s", r->dir, name);
        if (w < 0 || (size_t)w >= sizeof o->path)
            return bad(r, t->path, "probe.op: operand \"%s\": path too long", key);
        snprintf(o->slot, sizeof o->slot, "%s", key);
        if (probe_file_find(f, o->path, &o->index) != PROBE_OK)
            return bad(r, t->path, "probe.op names operand %s = %s, which is not in the file", key,
                       o->path);
        o->t = probe_file_tensor(f, o->index);
        r->nops++;
    }
    return 0;
}

static json_t *result_json(const op_result *r)
{
    static const char *const vs[] = {"pass", "fail", "not-checkable"};
    json_t *o = json_object();
    json_object_set_new(o, "path", json_string(r->path));
    json_object_set_new(o, "op", json_string(r->op));
    if (r->api[0])
        json_object_set_new(o, "api", json_string(r->api));
    json_object_set_new(o, "verdict", json_string(vs[r->v]));
    json_object_set_new(o, "reason", r->reason[0] ? json_string(r->reason) : json_null());
    if (r->v == PROBE_ORACLE_NOT_CHECKABLE)
        return o;
    json_object_set_new(o, "dtype", json_string(r->dtype));
    json_t *sh = json_array(), *wi = json_array();
    for (int d = 0; d < r->rank; d++) {
        json_array_append_new(sh, json_integer(r->shape[d]));
        json_array_append_new(wi, json_integer(r->worst_index[d]));
    }
    json_object_set_new(o, "shape", sh);
    json_object_set_new(o, "n", json_integer((json_int_t)r->n));
#define NUM(x) (isfinite(x) ? json_real(x) : json_null())
    json_object_set_new(o, "u_compute", NUM(r->u_acc));
    json_object_set_new(o, "u_out", NUM(r->u_out));
    json_object_set_new(o, "max_ratio", NUM(r->max_ratio));
    json_object_set_new(o, "max_ratio_index", wi);
    json_object_set_new(o, "max_ratio_err", NUM(r->worst_err));
    json_object_set_new(o, "max_ratio_bound", NUM(r->worst_bound));
    json_object_set_new(o, "max_ratio_reference", NUM(r->worst_ref));
    json_object_set_new(o, "max_ratio_captured", NUM(r->worst_cand));
    json_object_set_new(o, "violations", json_integer((json_int_t)r->violations));
    if (r->have_metrics) {
        json_object_set_new(o, "rel_l2", NUM(r->m.rel_l2));
        json_object_set_new(o, "cosine", NUM(r->m.cosine));
        json_object_set_new(o, "max_abs", NUM(r->m.max_abs));
        json_object_set_new(o, "p99_abs", NUM(r->m.p99_abs));
        json_t *t1 = json_object(), *rs = json_array();
        json_object_set_new(t1, "verdict", json_string(r->t1.pass ? "pass" : "fail"));
        for (int i = 0; i < r->t1.nreasons; i++)
            json_array_append_new(rs, json_string(r->t1.reasons[i]));
        json_object_set_new(t1, "reasons", rs);
        json_object_set_new(o, "t1", t1);
    }
#undef NUM
    return o;
}

/* Check the record r of one op into x. 0, or 2 after one line (bad input). */
static int check_op(op_record *r, op_result *x)
{
    operand *out = rec_operand(r, "out");
    int rc;
    if (out == NULL)
        rc = nc(x, "output 'out' was not captured");
    else if (!strcmp(r->name, "gemm"))
        rc = check_gemm(r, x);
    else if (!strcmp(r->name, "rmsnorm"))
        rc = check_norm(r, x, 0);
    else if (!strcmp(r->name, "layernorm"))
        rc = check_norm(r, x, 1);
    else if (!strcmp(r->name, "rope"))
        rc = check_rope(r, x);
    else if (!strcmp(r->name, "attention"))
        rc = check_attention(r, x);
    else if (!strcmp(r->name, "silu") || !strcmp(r->name, "gelu"))
        rc = check_pointwise(r, x);
    else
        rc = nc(x, "op \"%s\" is not known to probe-oracle", r->name);
    if (rc == 0 && out != NULL && x->v != PROBE_ORACLE_NOT_CHECKABLE && out->t->stats_only)
        rc = nc(x, "output is a stats-only record");
    return rc;
}

/* The ops already checked: each op's probe.op text, and which op owns each tensor. */
typedef struct op_owners {
    char **seen;   /* each op's probe.op text */
    size_t *owner; /* 1 + the op owning tensor i; 0 none */
    size_t nseen;
} op_owners;

/* Tensor i's probe.op record, checked unless an op already checked owns it.
 * 0, or 2 after one line on stderr. */
static int check_tensor(probe_file *f, size_t i, const probe_oracle_opts *opts, const char *file,
                        op_owners *ow, probe_oracle_report *out)
{
    char *text = NULL;
    probe_status s = probe_file_tensor_attr(f, i, "probe.op", &text);
    if (s == PROBE_ENOTFOUND)
        return 0;
    if (s != PROBE_OK) {
        fprintf(stderr, "probe-oracle: %s\n", probe_tesc(probe_last_error()));
        return 2;
    }
    /* Every operand of one op carries the same text: the op is checked
     * once, from the first of its datasets; its operands are then owned
     * by it and skipped when they carry the same text. */
    const probe_tensor_info *t = probe_file_tensor(f, i);
    if (ow->owner[i] != 0 && strcmp(ow->seen[ow->owner[i] - 1], text) == 0) {
        free(text);
        return 0;
    }
    op_record r;
    int rc = parse_record(f, i, text, opts, file, &r);
    if (rc != 0) {
        free(text);
        rec_free(&r);
        return rc;
    }
    ow->seen[ow->nseen++] = text;
    ow->owner[i] = ow->nseen;
    for (int q = 0; q < r.nops; q++)
        if (ow->owner[r.ops[q].index] == 0)
            ow->owner[r.ops[q].index] = ow->nseen;
    operand *o = rec_operand(&r, "out");
    op_result *x = &out->ops[out->nops];
    memset(x, 0, sizeof *x);
    snprintf(x->path, sizeof x->path, "%s", o ? o->path : t->path);
    snprintf(x->op, sizeof x->op, "%s", r.name);
    if (!only_match(opts->only, opts->nonly, x->path)) {
        rec_free(&r);
        return 0;
    }
    out->nops++;
    rc = check_op(&r, x);
    rec_free(&r);
    return rc;
}

int probe_oracle_check_file(probe_file *f, const char *file, const probe_oracle_opts *opts,
                            probe_oracle_report *out)
{
    memset(out, 0, sizeof *out);
    size_t nt = probe_file_count(f);
    op_owners ow = {calloc(nt ? nt : 1, sizeof(char *)), calloc(nt ? nt : 1, sizeof(size_t)), 0};
    out->ops = calloc(nt ? nt : 1, sizeof *out->ops);
    int rc = 0;
    if (out->ops == NULL || ow.seen == NULL || ow.owner == NULL) {
        fprintf(stderr, "probe-oracle: out of memory\n");
        rc = 2;
    }
    for (size_t i = 0; i < nt && rc == 0; i++)
        rc = check_tensor(f, i, opts, file, &ow, out);
    for (size_t i = 0; i < out->nops; i++) {
        out->npass += out->ops[i].v == PROBE_ORACLE_PASS;
        out->nfail += out->ops[i].v == PROBE_ORACLE_FAIL;
        out->nnot_checkable += out->ops[i].v == PROBE_ORACLE_NOT_CHECKABLE;
    }
    for (size_t i = 0; i < ow.nseen; i++)
        free(ow.seen[i]);
    free(ow.seen);
    free(ow.owner);
    return rc;
}

void probe_oracle_report_free(probe_oracle_report *r)
{
    free(r->ops);
    r->ops = NULL;
    r->nops = 0;
}

json_t *probe_oracle_report_json(const probe_oracle_report *rep, const char *file)
{
    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "format", json_string("probe-oracle"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "file", json_string(file));
    json_object_set_new(root, "verdict", json_string(rep->nfail ? "fail" : "pass"));
    json_object_set_new(root, "checked", json_integer((json_int_t)(rep->npass + rep->nfail)));
    json_object_set_new(root, "passed", json_integer((json_int_t)rep->npass));
    json_object_set_new(root, "failed", json_integer((json_int_t)rep->nfail));
    json_object_set_new(root, "not_checkable", json_integer((json_int_t)rep->nnot_checkable));
    for (size_t i = 0; i < rep->nops; i++)
        json_array_append_new(arr, result_json(&rep->ops[i]));
    json_object_set_new(root, "ops", arr);
    return root;
}
