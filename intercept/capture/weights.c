/* weights.c - weight fingerprints of interposed GEMMs (docs/gemm.md "Weights").
 *
 * In the first call (call index 0) of each scope component, operand A of
 * every decodable GEMM with transa=T and batch 1 (nn.Linear's weight: torch
 * passes it as A with transa=T; other GEMMs multiply activations) is copied once through the staging ring like a captured tensor
 * and hashed with XXH64 on the writer thread (a "hash only" job: no dataset
 * is written). The manifest key "weights" gives per component the operands
 * (GEMM index k, logical shape, dtype, XXH64) and a combined hash over
 * them, so probe-compare can tell whether two runs loaded the same weights.
 * PROBE_WEIGHTS=0 turns it off. Bounded: at most WEIGHTS_MAX operands. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/libprobe.h"
#include "base/json.h"
#include "base/shim.h"
#include "capture/cuda.h"
#include "capture/job.h"
#include "capture/weights.h"

#define WEIGHTS_MAX 8192

struct wop {
    char component[SHIM_NAME_MAX];
    int64_t k;
    int rank;
    int64_t shape[PROBE_MAX_RANK];
    probe_dtype dtype;
    size_t nbytes;
    uint64_t hash;
    int state; /* 0 pending, 1 hashed, 2 failed */
    int has_rounded;
    probe_rounded_fingerprint rounded;
};

struct wkey {
    char key[SHIM_NAME_MAX];
    int64_t call;
};

static struct wkey *keys;
static size_t nkeys, capkeys;
static struct wop *ops;
static size_t nops, capops;
static unsigned long long overflow;
static pthread_mutex_t wlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t wonce = PTHREAD_ONCE_INIT;
static int enabled = 1, rounded_enabled = 1;

static void config(void)
{
    const char *v = getenv("PROBE_WEIGHTS");
    enabled = !(v && strcmp(v, "0") == 0);
    rounded_enabled = enabled && !(v && strcmp(v, "hash") == 0);
}

int shim_weights_rounded_enabled(void)
{
    pthread_once(&wonce, config);
    return rounded_enabled;
}

int shim_weights_enabled(void)
{
    pthread_once(&wonce, config);
    return enabled;
}

size_t shim_weights_register(const char *component, int64_t k, int rank, const int64_t *shape,
                             probe_dtype dtype, size_t nbytes)
{
    pthread_mutex_lock(&wlock);
    if (nops == WEIGHTS_MAX) {
        ++overflow;
        pthread_mutex_unlock(&wlock);
        return SIZE_MAX;
    }
    if (nops == capops) {
        size_t nc = capops ? capops * 2 : 64;
        struct wop *n = realloc(ops, nc * sizeof *n);
        if (!n) {
            ++overflow;
            pthread_mutex_unlock(&wlock);
            return SIZE_MAX;
        }
        ops = n;
        capops = nc;
    }
    struct wop *w = &ops[nops];
    memset(w, 0, sizeof *w);
    snprintf(w->component, sizeof w->component, "%s", component);
    w->k = k;
    w->rank = rank;
    for (int i = 0; i < rank; ++i)
        w->shape[i] = shape[i];
    w->dtype = dtype;
    w->nbytes = nbytes;
    size_t slot = nops++;
    pthread_mutex_unlock(&wlock);
    return slot;
}

int shim_weights_first_call(const char *key, int64_t call)
{
    pthread_mutex_lock(&wlock);
    for (size_t i = nkeys; i-- > 0;)
        if (strcmp(keys[i].key, key) == 0) {
            int first = keys[i].call == call;
            pthread_mutex_unlock(&wlock);
            return first;
        }
    if (nkeys == capkeys) {
        size_t nc = capkeys ? 2 * capkeys : 64;
        struct wkey *n = realloc(keys, nc * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&wlock);
            return 0;
        }
        keys = n;
        capkeys = nc;
    }
    snprintf(keys[nkeys].key, sizeof keys[nkeys].key, "%s", key);
    keys[nkeys++].call = call;
    pthread_mutex_unlock(&wlock);
    return 1;
}

void shim_weights_hashed(size_t slot, uint64_t hash, int ok)
{
    pthread_mutex_lock(&wlock);
    if (slot < nops) {
        ops[slot].hash = hash;
        ops[slot].state = ok ? 1 : 2;
    }
    pthread_mutex_unlock(&wlock);
}

void shim_weights_rounded(size_t slot, const probe_rounded_fingerprint *fp)
{
    pthread_mutex_lock(&wlock);
    if (slot < nops && fp) {
        ops[slot].rounded = *fp;
        ops[slot].has_rounded = 1;
    }
    pthread_mutex_unlock(&wlock);
}

void shim_weights_failed(size_t slot)
{
    shim_weights_hashed(slot, 0, 0);
}

static int cmp_op(const void *x, const void *y)
{
    const struct wop *a = x, *b = y;
    int c = strcmp(a->component, b->component);
    if (c)
        return c;
    return a->k < b->k ? -1 : a->k > b->k;
}

/* Combined hash of one component: XXH64 of the little-endian records
 * (int64 k, int32 rank, int64 shape[rank], int32 dtype, uint64 xxh64) of its
 * operands in GEMM order (docs/gemm.md "Weights"). */
static uint64_t combine(const struct wop *w, size_t n)
{
    size_t cap = n * (8 + 4 + 8 * PROBE_MAX_RANK + 4 + 8), len = 0;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf || !shim_libprobe_api.capture_hash) {
        free(buf);
        return 0;
    }
#define PUT(v)                                                                                     \
    do {                                                                                           \
        memcpy(buf + len, &(v), sizeof(v));                                                        \
        len += sizeof(v);                                                                          \
    } while (0)
    for (size_t i = 0; i < n; ++i) {
        int32_t r = w[i].rank, dt = (int32_t)w[i].dtype;
        PUT(w[i].k);
        PUT(r);
        for (int d = 0; d < w[i].rank; ++d)
            PUT(w[i].shape[d]);
        PUT(dt);
        PUT(w[i].hash);
    }
#undef PUT
    uint64_t h = shim_libprobe_api.capture_hash(buf, len);
    free(buf);
    return h;
}

void shim_weights_json(struct shim_json *b)
{
    pthread_mutex_lock(&wlock);
    if (nops == 0) {
        pthread_mutex_unlock(&wlock);
        return;
    }
    struct wop *w = malloc(nops * sizeof *w);
    if (!w) {
        pthread_mutex_unlock(&wlock);
        b->oom = 1;
        return;
    }
    memcpy(w, ops, nops * sizeof *w);
    size_t n = nops;
    unsigned long long ovf = overflow;
    pthread_mutex_unlock(&wlock);
    qsort(w, n, sizeof *w, cmp_op);
    shim_json_printf(b, ",\"weights\":{\"overflow\":%llu,\"components\":{", ovf);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && strcmp(w[j].component, w[i].component) == 0)
            ++j;
        unsigned long long bytes = 0;
        int complete = 1;
        for (size_t x = i; x < j; ++x) {
            bytes += w[x].nbytes;
            complete &= w[x].state == 1;
        }
        if (i)
            shim_json_raw(b, ",");
        shim_json_string(b, w[i].component);
        shim_json_printf(b, ":{\"gemms\":%zu,\"bytes\":%llu,\"complete\":%s,\"dtypes\":[", j - i,
                         bytes, complete ? "true" : "false");
        int firstdt = 1;
        for (int dt = 1; dt < PROBE_DTYPE_COUNT_; ++dt) {
            int seen = 0;
            for (size_t x = i; x < j && !seen; ++x)
                seen = (int)w[x].dtype == dt;
            if (seen) {
                shim_json_printf(b, "%s\"%s\"", firstdt ? "" : ",", probe_dtype_name((probe_dtype)dt));
                firstdt = 0;
            }
        }
        if (complete)
            shim_json_printf(b, "],\"xxh64\":\"%016llx\",\"operands\":[",
                             (unsigned long long)combine(w + i, j - i));
        else
            shim_json_raw(b, "],\"xxh64\":null,\"operands\":[");
        for (size_t x = i; x < j; ++x) {
            shim_json_printf(b, "%s{\"k\":%lld,\"shape\":[", x > i ? "," : "", (long long)w[x].k);
            for (int d = 0; d < w[x].rank; ++d)
                shim_json_printf(b, "%s%lld", d ? "," : "", (long long)w[x].shape[d]);
            shim_json_printf(b, "],\"dtype\":\"%s\",", probe_dtype_name(w[x].dtype));
            if (w[x].state == 1)
                shim_json_printf(b, "\"xxh64\":\"%016llx\"", (unsigned long long)w[x].hash);
            else
                shim_json_raw(b, "\"xxh64\":null");
            if (w[x].state == 1 && w[x].has_rounded) {
                const probe_rounded_fingerprint *f = &w[x].rounded;
                if (f->levels >= 0)
                    shim_json_printf(b, ",\"levels\":%d", f->levels);
                else
                    shim_json_raw(b, ",\"levels\":null");
                if (isfinite(f->amax))
                    shim_json_printf(b, ",\"amax\":%.9g,\"rounded\":{", (double)f->amax);
                else
                    shim_json_raw(b, ",\"amax\":null,\"rounded\":{");
                int first = 1;
                for (int r = 0; r < PROBE_ROUNDING_COUNT_; ++r)
                    if (f->valid & (1u << r)) {
                        shim_json_printf(b, "%s\"%s\":\"%016llx\"", first ? "" : ",",
                                         probe_rounding_name((probe_rounding)r),
                                         (unsigned long long)f->xxh64[r]);
                        first = 0;
                    }
                shim_json_raw(b, "}");
                if (f->valid & (1u << PROBE_ROUNDING_E4M3FN_AMAX)) {
                    shim_json_raw(b, ",\"amax_variants\":[");
                    for (int c = 0; c < PROBE_AMAX_CONVENTIONS; ++c)
                        shim_json_printf(b, "%s\"%016llx\"", c ? "," : "",
                                         (unsigned long long)f->amax_variants[c]);
                    shim_json_raw(b, "]");
                }
            }
            shim_json_raw(b, "}");
        }
        shim_json_raw(b, "]}");
        i = j;
    }
    shim_json_raw(b, "}}");
    free(w);
}

void shim_weights_run_hash(struct shim_work *work)
{
    struct shim_job *j = (struct shim_job *)work;
    char reason[SHIM_REASON_MAX] = "";
    const void *src = NULL;
    int ok = shim_cuda_collect(j, &src, reason, sizeof reason) == PROBE_OK &&
             shim_libprobe_api.capture_hash;
    shim_weights_hashed(j->hash_slot, ok ? shim_libprobe_api.capture_hash(src, j->nbytes) : 0, ok);
    probe_rounded_fingerprint fp;
    if (ok && shim_weights_rounded_enabled() && shim_libprobe_api.rounded_fingerprint &&
        (j->dtype == PROBE_DTYPE_BFLOAT16 || j->dtype == PROBE_DTYPE_FLOAT16 ||
         j->dtype == PROBE_DTYPE_FLOAT32) &&
        shim_libprobe_api.rounded_fingerprint(j->dtype, src, j->nbytes / probe_dtype_size(j->dtype),
                                              &fp) == PROBE_OK)
        shim_weights_rounded(j->hash_slot, &fp);
    shim_cuda_finish(j);
}
