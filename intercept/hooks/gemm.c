/* gemm.c - interposed cuBLAS / cuBLASLt GEMM calls (docs/gemm.md).
 *
 * Hooked (exported, intercept/exports.map): cublasGemmEx,
 * cublasGemmStridedBatchedEx, cublasSgemm_v2, cublasDgemm_v2, cublasHgemm,
 * cublasSgemmStridedBatched, cublasHgemmStridedBatched, cublasLtMatmul.
 * Each hook resolves the real function once (RTLD_NEXT, then the already
 * loaded libcublas(Lt).so.13 / .so.12 with RTLD_NOLOAD), and under a
 * thread-local re-entry guard:
 *   1. decodes the call (shapes, transposes, leading dimensions, batch
 *      strides, types; for cublasLt the descriptors, which torch destroys
 *      right after the call) -- nothing is changed;
 *   2. counts it as an event under its signature (manifest key "gemm") and
 *      takes its index k in the current scope (shim_scope_next);
 *   3. asks PROBE_CAPTURE which operands are selected (only items whose glob
 *      contains "gemm": shim_select_interposed);
 *   4. captures C (when beta may be non-zero), and A/B/bias when the output
 *      overlaps them, before forwarding; forwards every argument untouched;
 *      then captures the rest on the call's stream, so `out` holds the result.
 * The real result is always returned; a decode failure only disables the
 * capture of that call (one warning per kind).
 *
 * Enum values: cublas_api.h, cublasLt.h, library_types.h (CUDA 13.0).
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/resolve.h"
#include "base/shim.h"
#include "capture/file.h"
#include "capture/scope.h"
#include "capture/select.h"
#include "capture/taps.h"
#include "capture/weights.h"
#include "hooks/gemm.h"

/* ---- cuBLAS / cuBLASLt types (ABI values from the CUDA headers) ---------- */
typedef int cublasStatus_t;
typedef void *cublasHandle_t;
typedef void *cublasLtHandle_t;
typedef void *cublasLtMatmulDesc_t;
typedef void *cublasLtMatrixLayout_t;
#define CUBLAS_STATUS_NOT_INITIALIZED 1

enum { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_8I = 3, CUDA_R_8U = 8, CUDA_R_32I = 10,
       CUDA_R_16BF = 14, CUDA_R_8F_E4M3 = 28, CUDA_R_8F_E5M2 = 29 };
enum { LAYOUT_TYPE = 0, LAYOUT_ORDER = 1, LAYOUT_ROWS = 2, LAYOUT_COLS = 3, LAYOUT_LD = 4,
       LAYOUT_BATCH_COUNT = 5, LAYOUT_STRIDED_BATCH_OFFSET = 6 };
enum { DESC_COMPUTE_TYPE = 0, DESC_SCALE_TYPE = 1, DESC_POINTER_MODE = 2, DESC_TRANSA = 3,
       DESC_TRANSB = 4, DESC_EPILOGUE = 7, DESC_BIAS_POINTER = 8, DESC_A_SCALE_POINTER = 17,
       DESC_B_SCALE_POINTER = 18, DESC_BIAS_DATA_TYPE = 26, DESC_A_SCALE_MODE = 31,
       DESC_B_SCALE_MODE = 32 };
#define EPI_BIAS 4u
#define EPI_BGRAD 16u

/* ---- real functions ---------------------------------------------------------- */

static void *resolve(const char *name, int lt)
{
    return shim_resolve(name, lt ? shim_resolve_cublaslt : shim_resolve_cublas);
}

/* Lazily resolved pointer; NULL (and one warning) when absent. */
static void *real_fn(_Atomic(void *) *slot, const char *name, int lt)
{
    void *f = atomic_load_explicit(slot, memory_order_acquire);
    if (f)
        return f;
    f = resolve(name, lt);
    if (f)
        atomic_store_explicit(slot, f, memory_order_release);
    else
        shim_warn("cannot find the real %s (libcublas%s not loaded?); returning "
                  "CUBLAS_STATUS_NOT_INITIALIZED", name, lt ? "Lt" : "");
    return f;
}

#define REAL(var, type, name, lt)                                                            \
    static _Atomic(void *) var##_slot;                                                       \
    type var = (type)real_fn(&var##_slot, name, lt);

static __thread int in_hook; /* cuBLAS calls cublasLt inside: the nested call only forwards */

/* Optional helpers of the libraries and of the CUDA runtime. */
static int (*p_get_stream)(cublasHandle_t, void **);
static int (*p_get_pointer_mode)(cublasHandle_t, int *);
static int (*p_layout_get)(cublasLtMatrixLayout_t, int, void *, size_t, size_t *);
static int (*p_desc_get)(cublasLtMatmulDesc_t, int, void *, size_t, size_t *);
static int (*p_get_device)(int *);
static pthread_once_t helpers_once = PTHREAD_ONCE_INIT;

static void helpers_resolve(void)
{
    *(void **)&p_get_stream = resolve("cublasGetStream_v2", 0);
    *(void **)&p_get_pointer_mode = resolve("cublasGetPointerMode_v2", 0);
    *(void **)&p_layout_get = resolve("cublasLtMatrixLayoutGetAttribute", 1);
    *(void **)&p_desc_get = resolve("cublasLtMatmulDescGetAttribute", 1);
    *(void **)&p_get_device = shim_resolve("cudaGetDevice", shim_resolve_cudart);
}

/* ---- configuration ----------------------------------------------------------- */

static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static int any_gemm_glob; /* an item of PROBE_CAPTURE names "gemm" */

static void cfg_init(void)
{
    for (size_t i = 0; i < shim_cfg.nglobs; ++i)
        if (strstr(shim_cfg.globs[i], "gemm"))
            any_gemm_glob = 1;
}

/* ---- decoded call --------------------------------------------------------------- */

struct gmat {
    const void *ptr;
    int ctype;            /* cudaDataType_t, -1 unknown */
    int64_t rows, cols, ld, batch, bstride;
};

struct gcall {
    const char *api;
    int transa, transb;   /* 0 N, 1 T, 2 C */
    int64_t m, n, k, batch;
    int compute;          /* cublasComputeType_t, or -1 when given by name */
    const char *compute_name;
    int scale_type;       /* cudaDataType_t of alpha/beta */
    int pointer_mode;     /* 0 host, 1 device, -1 unknown */
    const void *alpha, *beta;
    uint32_t epilogue;    /* cublasLtEpilogue_t; 1 (DEFAULT) for cuBLAS */
    struct gmat a, b, c, d;
    const void *bias;
    int bias_type;
    const void *scale_a, *scale_b;
    void *stream;
    cublasHandle_t handle; /* cuBLAS: stream and pointer mode are read from it when needed */
    int decodable;        /* 0: event only (why in undecodable) */
    int warned;           /* the reason was already reported (ORDER) */
    const char *undecodable;
};

static probe_dtype dtype_of(int ctype)
{
    switch (ctype) {
    case CUDA_R_32F: return PROBE_DTYPE_FLOAT32;
    case CUDA_R_64F: return PROBE_DTYPE_FLOAT64;
    case CUDA_R_16F: return PROBE_DTYPE_FLOAT16;
    case CUDA_R_16BF: return PROBE_DTYPE_BFLOAT16;
    case CUDA_R_8I: return PROBE_DTYPE_INT8;
    case CUDA_R_8U: return PROBE_DTYPE_UINT8;
    case CUDA_R_32I: return PROBE_DTYPE_INT32;
    case CUDA_R_8F_E4M3: return PROBE_DTYPE_FLOAT8_E4M3FN;
    case CUDA_R_8F_E5M2: return PROBE_DTYPE_FLOAT8_E5M2;
    default: return PROBE_DTYPE_INVALID;
    }
}

static const char *ctype_name(int t, char *buf, size_t cap)
{
    switch (t) {
    case CUDA_R_32F: return "32F";
    case CUDA_R_64F: return "64F";
    case CUDA_R_16F: return "16F";
    case CUDA_R_16BF: return "16BF";
    case CUDA_R_8I: return "8I";
    case CUDA_R_8U: return "8U";
    case CUDA_R_32I: return "32I";
    case CUDA_R_8F_E4M3: return "8F_E4M3";
    case CUDA_R_8F_E5M2: return "8F_E5M2";
    default: snprintf(buf, cap, "TYPE_%d", t); return buf;
    }
}

static const char *compute_name(int c, char *buf, size_t cap)
{
    switch (c) {
    case 64: return "16F";
    case 65: return "16F_PEDANTIC";
    case 68: return "32F";
    case 69: return "32F_PEDANTIC";
    case 70: return "64F";
    case 71: return "64F_PEDANTIC";
    case 72: return "32I";
    case 73: return "32I_PEDANTIC";
    case 74: return "32F_FAST_16F";
    case 75: return "32F_FAST_16BF";
    case 77: return "32F_FAST_TF32";
    case 78: return "32F_EMULATED_16BFX9";
    case 79: return "64F_EMULATED_FIXEDPOINT";
    default: snprintf(buf, cap, "COMPUTE_%d", c); return buf;
    }
}

/* alpha/beta type of a cuBLAS *Ex call from its compute type (cublas docs,
 * cublasGemmEx: 16F -> half, 32I -> int32, 64F -> double, else float). */
static int scale_of_compute(int c)
{
    if (c == 64 || c == 65)
        return CUDA_R_16F;
    if (c == 70 || c == 71 || c == 79)
        return CUDA_R_64F;
    if (c == 72 || c == 73)
        return CUDA_R_32I;
    return CUDA_R_32F;
}

static const char *epilogue_name(uint32_t e, char *buf, size_t cap)
{
    switch (e) {
    case 1: return "DEFAULT";
    case 2: return "RELU";
    case 4: return "BIAS";
    case 6: return "RELU_BIAS";
    case 32: return "GELU";
    case 36: return "GELU_BIAS";
    case 130: return "RELU_AUX";
    case 134: return "RELU_AUX_BIAS";
    case 160: return "GELU_AUX";
    case 164: return "GELU_AUX_BIAS";
    default: snprintf(buf, cap, "EPILOGUE_%u", e); return buf;
    }
}

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Host scalar of type t at p as double; 0 when the type is not a scalar type. */
static int read_scalar(const void *p, int t, double *out)
{
    if (!p)
        return 0;
    switch (t) {
    case CUDA_R_32F: { float f; memcpy(&f, p, 4); *out = f; return 1; }
    case CUDA_R_64F: { double d; memcpy(&d, p, 8); *out = d; return 1; }
    case CUDA_R_16F: { uint16_t h; memcpy(&h, p, 2); *out = half_to_double(h); return 1; }
    case CUDA_R_32I: { int32_t i; memcpy(&i, p, 4); *out = i; return 1; }
    default: return 0;
    }
}

static void set_dims(struct gcall *g)
{
    /* column-major stored shapes (docs/gemm.md "Shapes") */
    g->a.rows = g->transa == 0 ? g->m : g->k;
    g->a.cols = g->transa == 0 ? g->k : g->m;
    g->b.rows = g->transb == 0 ? g->k : g->n;
    g->b.cols = g->transb == 0 ? g->n : g->k;
    g->c.rows = g->d.rows = g->m;
    g->c.cols = g->d.cols = g->n;
}

/* ---- signatures (manifest "gemm") --------------------------------------------- */

#define SIG_CAP 1024
/* Open addressing; an entry's key is written once, under sig_lock, before
 * `used` is set with release order, and never changes: lookups of known
 * signatures take no lock (the per-call cost of a call that captures
 * nothing, docs/gemm.md "Overhead"). */
struct sig {
    atomic_int used;
    char component[SHIM_NAME_MAX];
    const char *api;
    int64_t m, n, k, batch;
    int ta, tb, at, bt, dt;
    uint32_t epilogue;
    int compute;
    uint64_t hash;
    atomic_ullong count;
    int64_t first_call, first_k;
};
static struct sig sigs[SIG_CAP];
static size_t nsigs;
static atomic_ullong sig_total, sig_overflow;
static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static int sig_match(const struct sig *e, uint64_t h, const struct gcall *g, const char *comp)
{
    return e->hash == h && e->api == g->api && e->m == g->m && e->n == g->n && e->k == g->k &&
           e->batch == g->batch && e->ta == g->transa && e->tb == g->transb &&
           e->at == g->a.ctype && e->bt == g->b.ctype && e->dt == g->d.ctype &&
           e->epilogue == g->epilogue && e->compute == g->compute && strcmp(e->component, comp) == 0;
}

static void sig_count(const struct gcall *g, const struct shim_scope *sc, int64_t k)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = sc->component; *c; ++c)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h = mix(h, (uintptr_t)g->api);
    h = mix(h, (uint64_t)g->m);
    h = mix(h, (uint64_t)g->n);
    h = mix(h, (uint64_t)g->k);
    h = mix(h, (uint64_t)g->batch);
    h = mix(h, (uint64_t)(g->transa | g->transb << 2) | (uint64_t)g->epilogue << 8);
    h = mix(h, (uint64_t)(uint32_t)g->a.ctype << 32 | (uint32_t)g->d.ctype);
    h = mix(h, (uint64_t)(uint32_t)g->b.ctype << 32 | (uint32_t)g->compute);
    atomic_fetch_add_explicit(&sig_total, 1, memory_order_relaxed);
    size_t s0 = h % SIG_CAP;
    /* lock-free: a signature seen before */
    for (size_t i = 0, s = s0; i < SIG_CAP; ++i, s = (s + 1) % SIG_CAP) {
        struct sig *e = &sigs[s];
        if (!atomic_load_explicit(&e->used, memory_order_acquire))
            break;
        if (sig_match(e, h, g, sc->component)) {
            atomic_fetch_add_explicit(&e->count, 1, memory_order_relaxed);
            return;
        }
    }
    pthread_mutex_lock(&sig_lock);
    for (size_t i = 0, s = s0; i < SIG_CAP; ++i, s = (s + 1) % SIG_CAP) {
        struct sig *e = &sigs[s];
        if (!atomic_load_explicit(&e->used, memory_order_relaxed)) {
            if (nsigs >= SIG_CAP * 3 / 4)
                break; /* table full enough: count as overflow */
            snprintf(e->component, sizeof e->component, "%s", sc->component);
            e->api = g->api;
            e->m = g->m, e->n = g->n, e->k = g->k, e->batch = g->batch;
            e->ta = g->transa, e->tb = g->transb;
            e->at = g->a.ctype, e->bt = g->b.ctype, e->dt = g->d.ctype;
            e->epilogue = g->epilogue;
            e->compute = g->compute;
            e->hash = h;
            atomic_store_explicit(&e->count, 1, memory_order_relaxed);
            e->first_call = sc->call;
            e->first_k = k;
            ++nsigs;
            atomic_store_explicit(&e->used, 1, memory_order_release);
            pthread_mutex_unlock(&sig_lock);
            return;
        }
        if (sig_match(e, h, g, sc->component)) { /* inserted by another thread meanwhile */
            atomic_fetch_add_explicit(&e->count, 1, memory_order_relaxed);
            pthread_mutex_unlock(&sig_lock);
            return;
        }
    }
    atomic_fetch_add_explicit(&sig_overflow, 1, memory_order_relaxed);
    pthread_mutex_unlock(&sig_lock);
}

static const char *trans_name(int t)
{
    return t == 0 ? "N" : t == 1 ? "T" : "C";
}

static int cmp_sig(const void *x, const void *y)
{
    const struct sig *a = *(const struct sig *const *)x, *b = *(const struct sig *const *)y;
    int c = strcmp(a->component, b->component);
    if (c)
        return c;
    return a->first_k < b->first_k ? -1 : a->first_k > b->first_k;
}

void shim_gemm_json(struct shim_json *b)
{
    pthread_mutex_lock(&sig_lock);
    if (atomic_load(&sig_total) == 0) {
        pthread_mutex_unlock(&sig_lock);
        return;
    }
    const struct sig **list = malloc((nsigs ? nsigs : 1) * sizeof *list);
    if (!list) {
        pthread_mutex_unlock(&sig_lock);
        b->oom = 1;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < SIG_CAP; ++i)
        if (atomic_load(&sigs[i].used))
            list[n++] = &sigs[i];
    qsort(list, n, sizeof *list, cmp_sig);
    shim_json_printf(b, ",\"gemm\":{\"total\":%llu,\"overflow\":%llu,\"components\":{",
                     (unsigned long long)atomic_load(&sig_total),
                     (unsigned long long)atomic_load(&sig_overflow));
    for (size_t i = 0; i < n; ++i) {
        const struct sig *e = list[i];
        int first = i == 0 || strcmp(list[i - 1]->component, e->component) != 0;
        if (first) {
            if (i)
                shim_json_raw(b, "],");
            shim_json_string(b, *e->component ? e->component : "gemm");
            shim_json_raw(b, ":[");
        } else {
            shim_json_raw(b, ",");
        }
        char t1[24], t2[24], t3[24], t4[24], t5[24];
        shim_json_printf(b,
                         "{\"api\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"batch\":%lld,"
                         "\"transa\":\"%s\",\"transb\":\"%s\",\"a\":\"%s\",\"b\":\"%s\",\"d\":\"%s\","
                         "\"compute\":\"%s\",\"epilogue\":\"%s\",\"count\":%llu,"
                         "\"first_call\":%lld,\"first_k\":%lld}",
                         e->api, (long long)e->m, (long long)e->n, (long long)e->k,
                         (long long)e->batch, trans_name(e->ta), trans_name(e->tb),
                         ctype_name(e->at, t1, sizeof t1), ctype_name(e->bt, t2, sizeof t2),
                         ctype_name(e->dt, t3, sizeof t3), compute_name(e->compute, t4, sizeof t4),
                         epilogue_name(e->epilogue, t5, sizeof t5), (unsigned long long)atomic_load(&e->count),
                         (long long)e->first_call, (long long)e->first_k);
    }
    shim_json_raw(b, n ? "]}}" : "}}");
    pthread_mutex_unlock(&sig_lock);
    free(list);
}

/* ---- capture ------------------------------------------------------------------ */

enum { OP_A, OP_B, OP_C, OP_BIAS, OP_SCALE_A, OP_SCALE_B, OP_OUT, NOPS };
static const char *const op_names[NOPS] = {"a", "b", "c", "bias", "scale_a", "scale_b", "out"};

struct operand {
    int present;
    probe_dtype dtype;
    int rank;
    int64_t shape[3], strides[3];
    const void *data;
    size_t span;      /* bytes from data to one past the last byte */
};

static void warn_once(atomic_int *flag, const char *fmt, const char *what)
{
    if (atomic_exchange(flag, 1) == 0)
        shim_warn(fmt, what);
}

/* The logical row-major tensor of stored matrix m: [C, R] strides [ld, 1],
 * with a leading [B] axis (stride bstride) when batch > 1. 0 when it cannot
 * be described (unknown type, ld < rows, negative sizes). */
static int mat_operand(const struct gmat *m, struct operand *o)
{
    memset(o, 0, sizeof *o);
    if (!m->ptr)
        return 0;
    o->dtype = dtype_of(m->ctype);
    size_t es = probe_dtype_size(o->dtype);
    if (!es || m->rows < 0 || m->cols < 0 || m->ld < (m->rows ? m->rows : 1) || m->batch < 1 ||
        m->bstride < 0)
        return 0;
    int r = 0;
    if (m->batch > 1) {
        o->shape[r] = m->batch;
        o->strides[r++] = m->bstride;
    }
    o->shape[r] = m->cols;
    o->strides[r++] = m->ld;
    o->shape[r] = m->rows;
    o->strides[r++] = 1;
    o->rank = r;
    o->data = m->ptr;
    uint64_t last = 0; /* highest element offset */
    for (int i = 0; i < r; ++i)
        if (o->shape[i] == 0)
            return 0;
    for (int i = 0; i < r; ++i)
        last += (uint64_t)(o->shape[i] - 1) * (uint64_t)o->strides[i];
    o->span = (size_t)((last + 1) * es);
    o->present = 1;
    return 1;
}

static int overlaps(const struct operand *x, const struct operand *y)
{
    if (!x->present || !y->present)
        return 0;
    uintptr_t a0 = (uintptr_t)x->data, a1 = a0 + x->span;
    uintptr_t b0 = (uintptr_t)y->data, b1 = b0 + y->span;
    return a0 < b1 && b0 < a1;
}

static atomic_int warned_device, warned_tap, warned_decode, warned_order;

static void capture_one(const struct operand *o, const struct shim_scope *sc,
                        const char *slot_comp, int64_t call, const char *slot, int device,
                        void *stream, const char *op_json)
{
    probe_tap_tensor_v1 t;
    shim_tap_operand(&t, slot_comp, slot, call, sc->step, sc->cfg_branch, device, o->dtype, o->rank,
                     o->shape, o->strides, o->data, stream);
    shim_tap_operand_nesting(&t, sc);
    probe_status st = shim_tap_capture(&t, op_json, 0);
    if (st != PROBE_OK && atomic_exchange(&warned_tap, 1) == 0)
        shim_warn("GEMM operand capture failed: %s (the call itself ran normally)",
                  probe_last_error());
}

struct plan {
    struct shim_scope sc;
    int64_t k;
    int selected[NOPS];
    struct operand ops[NOPS];
    char comp[SHIM_NAME_MAX];
    int64_t call;
    char slots[NOPS][SHIM_NAME_MAX];
    char *json;
    int device;
    int early[NOPS]; /* captured before forwarding */
    int active;
    size_t wslot;    /* weights.c slot of operand A, SIZE_MAX: not fingerprinted */
    struct operand wop;
};

static void build_json(struct plan *p, const struct gcall *g)
{
    struct shim_json b;
    shim_json_init(&b);
    char t1[24], t2[24];
    shim_json_printf(&b,
                     "{\"op\":\"gemm\",\"api\":\"%s\",\"transa\":\"%s\",\"transb\":\"%s\","
                     "\"m\":%lld,\"n\":%lld,\"k\":%lld,\"batch\":%lld,",
                     g->api, trans_name(g->transa), trans_name(g->transb), (long long)g->m,
                     (long long)g->n, (long long)g->k, (long long)g->batch);
    double v;
    int host = g->pointer_mode == 0;
    if (host && read_scalar(g->alpha, g->scale_type, &v) && isfinite(v))
        shim_json_printf(&b, "\"alpha\":%.17g,", v);
    else
        shim_json_raw(&b, "\"alpha\":null,");
    if (host && read_scalar(g->beta, g->scale_type, &v) && isfinite(v))
        shim_json_printf(&b, "\"beta\":%.17g,", v);
    else
        shim_json_raw(&b, "\"beta\":null,");
    shim_json_printf(&b, "\"compute\":\"%s\",\"scale_type\":\"%s\",\"epilogue\":\"%s\",",
                     g->compute_name ? g->compute_name : compute_name(g->compute, t1, sizeof t1),
                     ctype_name(g->scale_type, t2, sizeof t2),
                     epilogue_name(g->epilogue, t1, sizeof t1));
    shim_json_raw(&b, "\"operands\":{");
    int first = 1;
    for (int i = 0; i < NOPS; ++i) {
        if (!p->selected[i])
            continue;
        shim_json_printf(&b, "%s\"%s\":", first ? "" : ",", op_names[i]);
        shim_json_string(&b, p->slots[i]);
        first = 0;
    }
    shim_json_raw(&b, "}}");
    p->json = b.oom ? NULL : b.p;
    if (b.oom)
        shim_json_free(&b);
}

static void legacy_finish(struct gcall *g);

/* 1 when an adapter scope's parent is the first call of its component
 * ("/dit.step/0000"). */
static int parent_is_first_call(const char *parent)
{
    const char *slash = strrchr(parent, '/');
    return slash && slash != parent && strcmp(slash, "/0000") == 0;
}

/* Weight fingerprint (weights.c): operand A of each weight-like GEMM
 * (transa T, batch 1) is hashed once, after the call, in stream order, in
 * call 0 of a scope component (manifest key: the component), and for a
 * block B > 0 inside the first call of its parent, in that block's first
 * call (key "<component>@block=B"): every block's weights, not only the
 * first's. */
static void weights_pre(struct gcall *g, struct plan *p)
{
    p->wslot = SIZE_MAX;
    /* Only the nn.Linear / F.linear pattern (A = W with transa T, not batched):
     * operand A of other GEMMs (mm of activations, attention's bmm) is data,
     * and a feature that changes activations must not read as other weights. */
    if (p->sc.component[0] == '\0' || !g->decodable || g->transa != 1 || g->batch != 1 ||
        !shim_weights_enabled())
        return;
    char key[SHIM_NAME_MAX];
    if (p->sc.call == 0)
        snprintf(key, sizeof key, "%s", p->sc.component);
    else if (p->sc.block > 0 && parent_is_first_call(p->sc.parent)) {
        int n = snprintf(key, sizeof key, "%s@block=%lld", p->sc.component, (long long)p->sc.block);
        if (n < 0 || (size_t)n >= sizeof key)
            return; /* a component name too long for a key: that block is not fingerprinted */
    } else {
        return;
    }
    if (!shim_weights_first_call(key, p->sc.call))
        return;
    if (!mat_operand(&g->a, &p->wop))
        return;
    pthread_once(&helpers_once, helpers_resolve);
    if (!p_get_device || p_get_device(&p->device) != 0)
        return;
    legacy_finish(g);
    size_t nbytes = probe_dtype_size(p->wop.dtype);
    for (int i = 0; i < p->wop.rank; ++i)
        nbytes *= (size_t)p->wop.shape[i];
    p->wslot = shim_weights_register(key, p->k, p->wop.rank, p->wop.shape, p->wop.dtype, nbytes);
}

static void weights_post(const struct gcall *g, struct plan *p, int status)
{
    if (p->wslot == SIZE_MAX)
        return;
    if (status != 0) {
        shim_weights_failed(p->wslot);
        return;
    }
    char slot[SHIM_NAME_MAX];
    snprintf(slot, sizeof slot, "gemm.%04lld.a", (long long)p->k);
    probe_tap_tensor_v1 t;
    shim_tap_operand(&t, p->sc.component, slot, 0, p->sc.step, p->sc.cfg_branch, p->device,
                     p->wop.dtype, p->wop.rank, p->wop.shape, p->wop.strides, p->wop.data,
                     g->stream);
    if (shim_tap_hash_device(&t, p->wslot) != PROBE_OK)
        shim_weights_failed(p->wslot);
}

/* Before forwarding: count, index, select, capture what must be read first. */
static void gemm_pre(struct gcall *g, struct plan *p)
{
    p->active = 0;
    p->json = NULL;
    shim_scope_current(&p->sc);
    p->k = shim_scope_next(SHIM_COUNT_GEMM);
    sig_count(g, &p->sc, p->k);
    weights_pre(g, p);
    pthread_once(&cfg_once, cfg_init);
    if (!any_gemm_glob || shim_closed() || shim_disabled())
        return;
    if (!g->decodable) {
        if (!g->warned)
            warn_once(&warned_decode, "GEMM not captured (counted only): %s", g->undecodable);
        return;
    }
    legacy_finish(g); /* stream, pointer mode (beta == 0 decides whether C is read) */
    memset(p->selected, 0, sizeof p->selected);
    memset(p->early, 0, sizeof p->early);
    memset(p->ops, 0, sizeof p->ops);
    int inside = p->sc.component[0] != '\0';
    if (inside) {
        snprintf(p->comp, sizeof p->comp, "%s", p->sc.component);
        p->call = p->sc.call;
    } else {
        snprintf(p->comp, sizeof p->comp, "gemm");
        p->call = p->k;
    }
    /* operands */
    mat_operand(&g->a, &p->ops[OP_A]);
    mat_operand(&g->b, &p->ops[OP_B]);
    mat_operand(&g->d, &p->ops[OP_OUT]);
    double beta = 0;
    int beta_zero = g->pointer_mode == 0 && read_scalar(g->beta, g->scale_type, &beta) && beta == 0;
    if (!beta_zero)
        mat_operand(&g->c, &p->ops[OP_C]);
    if (g->bias && (g->epilogue & EPI_BIAS) && !(g->epilogue & EPI_BGRAD)) {
        struct operand *o = &p->ops[OP_BIAS];
        o->dtype = dtype_of(g->bias_type);
        if (probe_dtype_size(o->dtype) && g->m > 0) {
            o->present = 1;
            o->rank = 1;
            o->shape[0] = g->m;
            o->strides[0] = 1;
            o->data = g->bias;
            o->span = (size_t)g->m * probe_dtype_size(o->dtype);
        }
    }
    const void *sp[2] = {g->scale_a, g->scale_b};
    for (int i = 0; i < 2; ++i) {
        if (!sp[i])
            continue;
        struct operand *o = &p->ops[OP_SCALE_A + i];
        o->present = 1;
        o->dtype = PROBE_DTYPE_FLOAT32;
        o->rank = 1;
        o->shape[0] = 1;
        o->strides[0] = 1;
        o->data = sp[i];
        o->span = 4;
    }
    int any = 0;
    int may_be_last = shim_scope_may_be_last(&p->sc, SHIM_COUNT_GEMM, p->k);
    for (int i = 0; i < NOPS; ++i) {
        if (!p->ops[i].present)
            continue;
        if (inside)
            snprintf(p->slots[i], sizeof p->slots[i], "gemm.%04lld.%s", (long long)p->k, op_names[i]);
        else
            snprintf(p->slots[i], sizeof p->slots[i], "%s", op_names[i]);
        char path[SHIM_PATH_MAX];
        snprintf(path, sizeof path, "/%s/%04lld/%s", p->comp, (long long)p->call, p->slots[i]);
        p->selected[i] = shim_select_interposed(path, p->sc.step, p->sc.cfg_branch,
                                                      p->sc.block, "gemm", may_be_last);
        any |= p->selected[i];
    }
    if (!any)
        return;
    pthread_once(&helpers_once, helpers_resolve);
    if (!p_get_device || p_get_device(&p->device) != 0) {
        warn_once(&warned_device, "GEMM operands not captured: %s",
                  "cudaGetDevice is not available in this process");
        return;
    }
    build_json(p, g);
    p->active = 1;
    /* C is read by the call and may be D: take it first. Inputs the output
     * overlaps would be overwritten: take them first too. */
    for (int i = 0; i < NOPS; ++i) {
        if (!p->selected[i] || i == OP_OUT)
            continue;
        if (i == OP_C || overlaps(&p->ops[i], &p->ops[OP_OUT])) {
            p->early[i] = 1;
            capture_one(&p->ops[i], &p->sc, p->comp, p->call, p->slots[i], p->device,
                        g->stream, p->json);
        }
    }
}

/* After forwarding: the rest, in stream order after the GEMM. */
static void gemm_post(const struct gcall *g, struct plan *p, int status)
{
    if (p->active && status == 0) {
        for (int i = 0; i < NOPS; ++i)
            if (p->selected[i] && !p->early[i])
                capture_one(&p->ops[i], &p->sc, p->comp, p->call, p->slots[i], p->device,
                            g->stream, p->json);
    }
    free(p->json);
    weights_post(g, p, status);
}

/* 1 when the hook does its work (the process captures, not nested). */
static int hook_active(void)
{
    if (in_hook || shim_cfg.mode == SHIM_INACTIVE)
        return 0;
    shim_file_claim(); /* idempotent; a forked child only forwards, without a warning */
    return !shim_is_foreign_process();
}

static void *handle_stream(cublasHandle_t h)
{
    pthread_once(&helpers_once, helpers_resolve);
    void *s = NULL;
    if (p_get_stream && p_get_stream(h, &s) != 0)
        s = NULL;
    return s;
}

static int handle_pointer_mode(cublasHandle_t h)
{
    pthread_once(&helpers_once, helpers_resolve);
    int m = -1;
    if (!p_get_pointer_mode || p_get_pointer_mode(h, &m) != 0)
        return -1;
    return m;
}

static void legacy_call(struct gcall *g, const char *api, cublasHandle_t h, int ta, int tb,
                        int64_t m, int64_t n, int64_t k, const void *alpha, const void *beta,
                        int atype, int btype, int ctype, int scale, int compute,
                        const char *cname)
{
    memset(g, 0, sizeof *g);
    g->api = api;
    g->transa = ta;
    g->transb = tb;
    g->m = m, g->n = n, g->k = k;
    g->batch = 1;
    g->alpha = alpha;
    g->beta = beta;
    g->a.ctype = atype;
    g->b.ctype = btype;
    g->c.ctype = g->d.ctype = ctype;
    g->scale_type = scale;
    g->compute = compute;
    g->compute_name = cname;
    g->epilogue = 1;
    g->decodable = 1;
    g->pointer_mode = -1;
    g->a.batch = g->b.batch = g->c.batch = g->d.batch = 1;
    set_dims(g);
    g->handle = h;
    if (ta > 1 || tb > 1) {
        g->decodable = 0;
        g->undecodable = "conjugate transpose (CUBLAS_OP_C) is not decoded";
    }
}

/* stream and pointer mode are needed only when something is captured */
static void legacy_finish(struct gcall *g)
{
    if (!g->handle)
        return;
    g->stream = handle_stream(g->handle);
    g->pointer_mode = handle_pointer_mode(g->handle);
    g->handle = NULL;
}

#define SET_MAT(mat, p, ld_, stride_, batch_)                                                     \
    do {                                                                                          \
        g.mat.ptr = (p);                                                                          \
        g.mat.ld = (ld_);                                                                         \
        g.mat.bstride = (stride_);                                                                \
        g.mat.batch = (batch_);                                                                   \
    } while (0)


/* ---- cuBLAS hooks ----------------------------------------------------------------- */

typedef cublasStatus_t (*gemmex_fn)(cublasHandle_t, int, int, int, int, int, const void *,
                                    const void *, int, int, const void *, int, int, const void *,
                                    void *, int, int, int, int);

SHIM_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, int transa, int transb, int m, int n,
                                        int k, const void *alpha, const void *A, int Atype, int lda,
                                        const void *B, int Btype, int ldb, const void *beta,
                                        void *C, int Ctype, int ldc, int computeType, int algo)
{
    REAL(real, gemmex_fn, "cublasGemmEx", 0)
    if (!real)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!hook_active())
        return real(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
                    Ctype, ldc, computeType, algo);
    in_hook = 1;
    struct gcall g;
    legacy_call(&g, "cublasGemmEx", handle, transa, transb, m, n, k, alpha, beta, Atype, Btype,
                Ctype, scale_of_compute(computeType), computeType, NULL);
    SET_MAT(a, A, lda, 0, 1);
    SET_MAT(b, B, ldb, 0, 1);
    SET_MAT(c, C, ldc, 0, 1);
    SET_MAT(d, C, ldc, 0, 1);
    struct plan p;
    gemm_pre(&g, &p);
    cublasStatus_t st = real(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,
                             beta, C, Ctype, ldc, computeType, algo);
    gemm_post(&g, &p, st);
    in_hook = 0;
    return st;
}

typedef cublasStatus_t (*gemmsbex_fn)(cublasHandle_t, int, int, int, int, int, const void *,
                                      const void *, int, int, long long, const void *, int, int,
                                      long long, const void *, void *, int, int, long long, int,
                                      int, int);

SHIM_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, int transa, int transb, int m, int n, int k, const void *alpha,
    const void *A, int Atype, int lda, long long strideA, const void *B, int Btype, int ldb,
    long long strideB, const void *beta, void *C, int Ctype, int ldc, long long strideC,
    int batchCount, int computeType, int algo)
{
    REAL(real, gemmsbex_fn, "cublasGemmStridedBatchedEx", 0)
    if (!real)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!hook_active())
        return real(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                    strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
    in_hook = 1;
    struct gcall g;
    legacy_call(&g, "cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, beta,
                Atype, Btype, Ctype, scale_of_compute(computeType), computeType, NULL);
    g.batch = batchCount;
    SET_MAT(a, A, lda, strideA, batchCount);
    SET_MAT(b, B, ldb, strideB, batchCount);
    SET_MAT(c, C, ldc, strideC, batchCount);
    SET_MAT(d, C, ldc, strideC, batchCount);
    struct plan p;
    gemm_pre(&g, &p);
    cublasStatus_t st = real(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                             Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                             computeType, algo);
    gemm_post(&g, &p, st);
    in_hook = 0;
    return st;
}

/* Typed GEMMs: one body for S/D/H (same argument list, element type T). */
#define TYPED_GEMM(NAME, T, CT, COMPUTE, CNAME)                                                     \
    typedef cublasStatus_t (*NAME##_fn)(cublasHandle_t, int, int, int, int, int, const T *,         \
                                        const T *, int, const T *, int, const T *, T *, int);       \
    SHIM_EXPORT cublasStatus_t NAME(cublasHandle_t handle, int transa, int transb, int m, int n,    \
                                    int k, const T *alpha, const T *A, int lda, const T *B,         \
                                    int ldb, const T *beta, T *C, int ldc)                          \
    {                                                                                               \
        REAL(real, NAME##_fn, #NAME, 0)                                                             \
        if (!real)                                                                                  \
            return CUBLAS_STATUS_NOT_INITIALIZED;                                                   \
        if (!hook_active())                                                                         \
            return real(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);      \
        in_hook = 1;                                                                                \
        struct gcall g;                                                                             \
        legacy_call(&g, #NAME, handle, transa, transb, m, n, k, alpha, beta, CT, CT, CT, CT,        \
                    COMPUTE, CNAME);                                                                \
        SET_MAT(a, A, lda, 0, 1);                                                                   \
        SET_MAT(b, B, ldb, 0, 1);                                                                   \
        SET_MAT(c, C, ldc, 0, 1);                                                                   \
        SET_MAT(d, C, ldc, 0, 1);                                                                   \
        struct plan p;                                                                              \
        gemm_pre(&g, &p);                                                                           \
        cublasStatus_t st = real(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C,   \
                                 ldc);                                                              \
        gemm_post(&g, &p, st);                                                                      \
        in_hook = 0;                                                                                \
        return st;                                                                                  \
    }

#define TYPED_GEMM_SB(NAME, T, CT, COMPUTE, CNAME)                                                  \
    typedef cublasStatus_t (*NAME##_fn)(cublasHandle_t, int, int, int, int, int, const T *,         \
                                        const T *, int, long long, const T *, int, long long,       \
                                        const T *, T *, int, long long, int);                       \
    SHIM_EXPORT cublasStatus_t NAME(cublasHandle_t handle, int transa, int transb, int m, int n,    \
                                    int k, const T *alpha, const T *A, int lda, long long strideA,  \
                                    const T *B, int ldb, long long strideB, const T *beta, T *C,    \
                                    int ldc, long long strideC, int batchCount)                     \
    {                                                                                               \
        REAL(real, NAME##_fn, #NAME, 0)                                                             \
        if (!real)                                                                                  \
            return CUBLAS_STATUS_NOT_INITIALIZED;                                                   \
        if (!hook_active())                                                                         \
            return real(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB,   \
                        beta, C, ldc, strideC, batchCount);                                         \
        in_hook = 1;                                                                                \
        struct gcall g;                                                                             \
        legacy_call(&g, #NAME, handle, transa, transb, m, n, k, alpha, beta, CT, CT, CT, CT,        \
                    COMPUTE, CNAME);                                                                \
        g.batch = batchCount;                                                                       \
        SET_MAT(a, A, lda, strideA, batchCount);                                                    \
        SET_MAT(b, B, ldb, strideB, batchCount);                                                    \
        SET_MAT(c, C, ldc, strideC, batchCount);                                                    \
        SET_MAT(d, C, ldc, strideC, batchCount);                                                    \
        struct plan p;                                                                              \
        gemm_pre(&g, &p);                                                                           \
        cublasStatus_t st = real(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb,   \
                                 strideB, beta, C, ldc, strideC, batchCount);                       \
        gemm_post(&g, &p, st);                                                                      \
        in_hook = 0;                                                                                \
        return st;                                                                                  \
    }

typedef uint16_t shim_half; /* __half's bits */
TYPED_GEMM(cublasSgemm_v2, float, CUDA_R_32F, 68, "32F")
TYPED_GEMM(cublasDgemm_v2, double, CUDA_R_64F, 70, "64F")
TYPED_GEMM(cublasHgemm, shim_half, CUDA_R_16F, 64, "16F")
TYPED_GEMM_SB(cublasSgemmStridedBatched, float, CUDA_R_32F, 68, "32F")
TYPED_GEMM_SB(cublasHgemmStridedBatched, shim_half, CUDA_R_16F, 64, "16F")

/* ---- cuBLASLt ---------------------------------------------------------------------- */

static int layout_get(cublasLtMatrixLayout_t l, int attr, void *buf, size_t n)
{
    size_t w = 0;
    memset(buf, 0, n);
    return p_layout_get && p_layout_get(l, attr, buf, n, &w) == 0;
}

static int desc_get(cublasLtMatmulDesc_t d, int attr, void *buf, size_t n)
{
    size_t w = 0;
    memset(buf, 0, n);
    return p_desc_get && p_desc_get(d, attr, buf, n, &w) == 0;
}

static void undecodable(struct gcall *g, const char *why)
{
    if (g->decodable) {
        g->decodable = 0;
        g->undecodable = why;
    }
}

static void decode_layout(struct gcall *g, struct gmat *m, cublasLtMatrixLayout_t l, const void *p)
{
    m->ptr = p;
    m->ctype = -1;
    m->batch = 1;
    if (!l) {
        undecodable(g, "a matrix layout descriptor is NULL");
        return;
    }
    uint32_t type = 0;
    int32_t order = 0, batch = 1;
    uint64_t rows = 0, cols = 0;
    int64_t ld = 0, stride = 0;
    if (!layout_get(l, LAYOUT_TYPE, &type, sizeof type) ||
        !layout_get(l, LAYOUT_ROWS, &rows, sizeof rows) ||
        !layout_get(l, LAYOUT_COLS, &cols, sizeof cols) ||
        !layout_get(l, LAYOUT_LD, &ld, sizeof ld)) {
        undecodable(g, "cublasLtMatrixLayoutGetAttribute failed");
        return;
    }
    if (!layout_get(l, LAYOUT_ORDER, &order, sizeof order))
        order = 0;
    if (!layout_get(l, LAYOUT_BATCH_COUNT, &batch, sizeof batch))
        batch = 1;
    if (!layout_get(l, LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride))
        stride = 0;
    m->ctype = (int)type;
    m->rows = (int64_t)rows;
    m->cols = (int64_t)cols;
    m->ld = ld;
    m->batch = batch < 1 ? 1 : batch;
    m->bstride = stride;
    if (order != 0) {
        undecodable(g, "a cublasLt matrix layout has an ORDER other than CUBLASLT_ORDER_COL");
        g->warned = 1;
        if (atomic_exchange(&warned_order, 1) == 0)
            shim_warn("cublasLtMatmul with matrix ORDER %d (not COL): counted, operands not "
                      "captured", (int)order);
    }
}

typedef cublasStatus_t (*ltmatmul_fn)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *,
                                      const void *, cublasLtMatrixLayout_t, const void *,
                                      cublasLtMatrixLayout_t, const void *, const void *,
                                      cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                                      const void *, void *, size_t, void *);

SHIM_EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle,
                                          cublasLtMatmulDesc_t computeDesc, const void *alpha,
                                          const void *A, cublasLtMatrixLayout_t Adesc,
                                          const void *B, cublasLtMatrixLayout_t Bdesc,
                                          const void *beta, const void *C,
                                          cublasLtMatrixLayout_t Cdesc, void *D,
                                          cublasLtMatrixLayout_t Ddesc, const void *algo,
                                          void *workspace, size_t workspaceSizeInBytes,
                                          void *stream)
{
    REAL(real, ltmatmul_fn, "cublasLtMatmul", 1)
    if (!real)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!hook_active())
        return real(lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc,
                    algo, workspace, workspaceSizeInBytes, stream);
    in_hook = 1;
    pthread_once(&helpers_once, helpers_resolve);
    /* Decode before forwarding: torch destroys the descriptors right after. */
    struct gcall g;
    memset(&g, 0, sizeof g);
    g.api = "cublasLtMatmul";
    g.decodable = 1;
    g.alpha = alpha;
    g.beta = beta;
    g.stream = stream;
    int32_t i32;
    uint32_t u32;
    const void *ptr;
    g.compute = desc_get(computeDesc, DESC_COMPUTE_TYPE, &i32, sizeof i32) ? i32 : -1;
    if (g.compute < 0)
        undecodable(&g, "cublasLtMatmulDescGetAttribute failed");
    g.scale_type = desc_get(computeDesc, DESC_SCALE_TYPE, &i32, sizeof i32) ? i32 : CUDA_R_32F;
    g.pointer_mode = desc_get(computeDesc, DESC_POINTER_MODE, &i32, sizeof i32) ? i32 : 0;
    g.transa = desc_get(computeDesc, DESC_TRANSA, &i32, sizeof i32) ? i32 : 0;
    g.transb = desc_get(computeDesc, DESC_TRANSB, &i32, sizeof i32) ? i32 : 0;
    g.epilogue = desc_get(computeDesc, DESC_EPILOGUE, &u32, sizeof u32) ? u32 : 1;
    g.bias = desc_get(computeDesc, DESC_BIAS_POINTER, &ptr, sizeof ptr) ? ptr : NULL;
    decode_layout(&g, &g.a, Adesc, A);
    decode_layout(&g, &g.b, Bdesc, B);
    decode_layout(&g, &g.c, Cdesc, C);
    decode_layout(&g, &g.d, Ddesc, D);
    g.bias_type = desc_get(computeDesc, DESC_BIAS_DATA_TYPE, &i32, sizeof i32) && i32 >= 0
                      ? i32
                      : g.d.ctype;
    int32_t mode_a = 0, mode_b = 0;
    desc_get(computeDesc, DESC_A_SCALE_MODE, &mode_a, sizeof mode_a);
    desc_get(computeDesc, DESC_B_SCALE_MODE, &mode_b, sizeof mode_b);
    if (desc_get(computeDesc, DESC_A_SCALE_POINTER, &ptr, sizeof ptr) && mode_a == 0)
        g.scale_a = ptr;
    if (desc_get(computeDesc, DESC_B_SCALE_POINTER, &ptr, sizeof ptr) && mode_b == 0)
        g.scale_b = ptr;
    /* m, n, k from the layouts: D is m x n; op(A) is m x k */
    g.m = g.d.rows;
    g.n = g.d.cols;
    g.k = g.transa == 0 ? g.a.cols : g.a.rows;
    g.batch = g.d.batch;
    if (g.decodable && (g.transa > 1 || g.transb > 1))
        undecodable(&g, "conjugate transpose is not decoded");
    if (g.decodable) {
        int64_t ar = g.transa == 0 ? g.m : g.k, br = g.transb == 0 ? g.k : g.n;
        if (g.a.rows != ar || g.b.rows != br || g.c.rows != g.m || g.c.cols != g.n)
            undecodable(&g, "cublasLt layouts disagree on m, n, k");
    }
    struct plan p;
    gemm_pre(&g, &p);
    cublasStatus_t st = real(lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D,
                             Ddesc, algo, workspace, workspaceSizeInBytes, stream);
    gemm_post(&g, &p, st);
    in_hook = 0;
    return st;
}
