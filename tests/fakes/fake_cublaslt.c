/* fake_cublaslt.c - a CPU stand-in for libcublasLt.so.13 (see
 * fake_cublas.c): matmul and matrix-layout descriptors with the attributes
 * the shim decodes (values and sizes: cublasLt.h), and cublasLtMatmul doing
 * the GEMM of fake_gemm.h with the BIAS epilogue and the A/B scale
 * pointers. Matrix ORDER is stored but ignored by the arithmetic. */
#include <stdint.h>
#include <stdlib.h>

#include "fake_gemm.h"

#define EXPORT __attribute__((visibility("default")))

struct layout {
    int64_t v[9]; /* TYPE, ORDER, ROWS, COLS, LD, BATCH_COUNT, STRIDED_BATCH_OFFSET, ... */
};
struct desc {
    int64_t v[40];
};

/* attribute sizes in bytes (cublasLt.h) */
static size_t layout_size(int a)
{
    static const size_t s[] = {4, 4, 8, 8, 8, 4, 8, 8, 4};
    return a >= 0 && a < 9 ? s[a] : 0;
}
static size_t desc_size(int a)
{
    switch (a) {
    case 0: case 1: case 2: case 3: case 4: case 26: case 31: case 32: return 4;
    case 7: return 4;
    case 8: case 17: case 18: return sizeof(void *);
    default: return 0;
    }
}

static int set(int64_t *slot, size_t want, const void *buf, size_t n)
{
    if (!want || n != want)
        return 7;
    int64_t x = 0;
    if (n == 4) {
        int32_t i;
        memcpy(&i, buf, 4);
        x = i;
    } else {
        memcpy(&x, buf, 8);
    }
    *slot = x;
    return 0;
}
static int get(const int64_t *slot, size_t want, void *buf, size_t n, size_t *w)
{
    if (!want)
        return 7;
    if (w)
        *w = want;
    if (n != want)
        return 7;
    if (n == 4) {
        int32_t i = (int32_t)*slot;
        memcpy(buf, &i, 4);
    } else {
        memcpy(buf, slot, 8);
    }
    return 0;
}

EXPORT int cublasLtCreate(void **h)
{
    *h = calloc(1, 8);
    return 0;
}
EXPORT int cublasLtDestroy(void *h)
{
    free(h);
    return 0;
}
EXPORT int cublasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld)
{
    struct layout *x = calloc(1, sizeof *x);
    x->v[0] = type, x->v[2] = (int64_t)rows, x->v[3] = (int64_t)cols, x->v[4] = ld, x->v[5] = 1;
    *l = x;
    return 0;
}
EXPORT int cublasLtMatrixLayoutDestroy(void *l)
{
    free(l);
    return 0;
}
EXPORT int cublasLtMatrixLayoutSetAttribute(void *l, int a, const void *buf, size_t n)
{
    return set(&((struct layout *)l)->v[a < 0 || a > 8 ? 0 : a], layout_size(a), buf, n);
}
EXPORT int cublasLtMatrixLayoutGetAttribute(void *l, int a, void *buf, size_t n, size_t *w)
{
    return get(&((struct layout *)l)->v[a < 0 || a > 8 ? 0 : a], layout_size(a), buf, n, w);
}
EXPORT int cublasLtMatmulDescCreate(void **d, int compute, int scale)
{
    struct desc *x = calloc(1, sizeof *x);
    x->v[0] = compute, x->v[1] = scale, x->v[7] = 1 /* DEFAULT */, x->v[26] = -1;
    *d = x;
    return 0;
}
EXPORT int cublasLtMatmulDescDestroy(void *d)
{
    free(d);
    return 0;
}
EXPORT int cublasLtMatmulDescSetAttribute(void *d, int a, const void *buf, size_t n)
{
    return set(&((struct desc *)d)->v[a < 0 || a >= 40 ? 0 : a], desc_size(a), buf, n);
}
EXPORT int cublasLtMatmulDescGetAttribute(void *d, int a, void *buf, size_t n, size_t *w)
{
    return get(&((struct desc *)d)->v[a < 0 || a >= 40 ? 0 : a], desc_size(a), buf, n, w);
}

static __thread long long last[16];
EXPORT int fake_cublaslt_last(long long *out, int cap)
{
    for (int i = 0; i < 16 && i < cap; ++i)
        out[i] = last[i];
    return 16;
}

#define P(x) ((long long)(intptr_t)(x))

EXPORT int cublasLtMatmul(void *h, void *dsc, const void *alpha, const void *A, void *Ad,
                          const void *B, void *Bd, const void *beta, const void *C, void *Cd,
                          void *D, void *Dd, const void *algo, void *ws, size_t wss, void *stream)
{
    long long v[] = {P(h), P(dsc), P(alpha), P(A), P(Ad), P(B), P(Bd), P(beta), P(C), P(Cd),
                     P(D), P(Dd), P(algo), P(ws), (long long)wss, P(stream)};
    memcpy(last, v, sizeof v);
    const struct desc *x = dsc;
    const struct layout *a = Ad, *b = Bd, *c = Cd, *d = Dd;
    if (!x || !a || !b || !c || !d || x->v[2] != 0)
        return 7; /* host pointer mode only */
    int ta = (int)x->v[3], tb = (int)x->v[4];
    long long m = d->v[2], n = d->v[3], k = ta ? a->v[2] : a->v[3];
    float al = fg_load(F_R_32F, alpha, 0), be = fg_load(F_R_32F, beta, 0);
    float scale = 1.0f;
    const float *sa = (const float *)(intptr_t)x->v[17], *sb = (const float *)(intptr_t)x->v[18];
    if (sa)
        scale *= *sa;
    if (sb)
        scale *= *sb;
    const void *bias = (x->v[7] & 4) ? (const void *)(intptr_t)x->v[8] : NULL;
    int bias_type = x->v[26] >= 0 ? (int)x->v[26] : (int)d->v[0];
    struct fg_mat fa = {A, (int)a->v[0], a->v[4], a->v[6]}, fb = {B, (int)b->v[0], b->v[4], b->v[6]},
                  fc = {C, (int)c->v[0], c->v[4], c->v[6]};
    return fg_gemm(stream, ta, tb, m, n, k, al, be, fa, fb, fc, D, (int)d->v[0], d->v[4], d->v[6],
                   d->v[5], bias, bias_type, scale);
}
