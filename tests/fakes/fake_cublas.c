/* fake_cublas.c - a CPU stand-in for libcublas.so.13, so the shim's GEMM
 * hooks (intercept/hooks/gemm.c) run and are checked without a GPU. Built by
 * tests/e2e/test_gemm_mock.py under the real soname and loaded RTLD_LOCAL
 * (as torch loads cuBLAS), so the shim must find it with
 * dlopen("libcublas.so.13", RTLD_NOLOAD). Arithmetic: fake_gemm.h. It
 * records the arguments of its last GEMM (fake_cublas_last) so the test can
 * check that the shim forwarded them untouched. Values: cublas_api.h. */
#include <stdint.h>
#include <stdlib.h>

#include "fake_gemm.h"

#define EXPORT __attribute__((visibility("default")))

struct handle {
    void *stream;
    int pointer_mode;
};

static __thread long long last[24];
static __thread int nlast;

static void remember(int n, const long long *v)
{
    nlast = n;
    for (int i = 0; i < n; ++i)
        last[i] = v[i];
}

/* The last GEMM's arguments on this thread, in the order of its prototype
 * (pointers as integers, the handle first); returns how many. */
EXPORT int fake_cublas_last(long long *out, int cap)
{
    for (int i = 0; i < nlast && i < cap; ++i)
        out[i] = last[i];
    return nlast;
}

EXPORT int cublasCreate_v2(void **h)
{
    *h = calloc(1, sizeof(struct handle));
    return 0;
}
EXPORT int cublasDestroy_v2(void *h)
{
    free(h);
    return 0;
}
EXPORT int cublasSetStream_v2(void *h, void *s)
{
    ((struct handle *)h)->stream = s;
    return 0;
}
EXPORT int cublasGetStream_v2(void *h, void **s)
{
    *s = ((struct handle *)h)->stream;
    return 0;
}
EXPORT int cublasSetPointerMode_v2(void *h, int m)
{
    ((struct handle *)h)->pointer_mode = m;
    return 0;
}
EXPORT int cublasGetPointerMode_v2(void *h, int *m)
{
    *m = ((struct handle *)h)->pointer_mode;
    return 0;
}

/* alpha/beta are read in the handle's pointer mode: host, or "device"
 * (host memory here too). */
static float scalar(int t, const void *p)
{
    return fg_load(t == 70 ? F_R_64F : t == 64 ? F_R_16F : F_R_32F, p, 0);
}

#define L(x) ((long long)(x))
#define P(x) ((long long)(intptr_t)(x))

EXPORT int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha,
                        const void *A, int At, int lda, const void *B, int Bt, int ldb,
                        const void *beta, void *C, int Ct, int ldc, int compute, int algo)
{
    long long v[] = {P(h), ta, tb, m, n, k, P(alpha), P(A), At, lda, P(B), Bt, ldb, P(beta), P(C),
                     Ct, ldc, compute, algo};
    remember(19, v);
    struct fg_mat a = {A, At, lda, 0}, b = {B, Bt, ldb, 0}, c = {C, Ct, ldc, 0};
    return fg_gemm(((struct handle *)h)->stream, ta, tb, m, n, k, scalar(compute, alpha),
                   scalar(compute, beta), a, b, c, C, Ct, ldc, 0, 1, NULL, 0, 1.0f);
}

EXPORT int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k,
                                      const void *alpha, const void *A, int At, int lda,
                                      long long sA, const void *B, int Bt, int ldb, long long sB,
                                      const void *beta, void *C, int Ct, int ldc, long long sC,
                                      int batch, int compute, int algo)
{
    long long v[] = {P(h), ta, tb, m, n, k, P(alpha), P(A), At, lda, sA, P(B), Bt, ldb, sB,
                     P(beta), P(C), Ct, ldc, sC, batch, compute, algo};
    remember(23, v);
    struct fg_mat a = {A, At, lda, sA}, b = {B, Bt, ldb, sB}, c = {C, Ct, ldc, sC};
    return fg_gemm(((struct handle *)h)->stream, ta, tb, m, n, k, scalar(compute, alpha),
                   scalar(compute, beta), a, b, c, C, Ct, ldc, sC, batch, NULL, 0, 1.0f);
}

#define TYPED(NAME, T, CT)                                                                     \
    EXPORT int NAME(void *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *A,  \
                    int lda, const T *B, int ldb, const T *beta, T *C, int ldc)               \
    {                                                                                          \
        long long v[] = {P(h), ta, tb, m, n, k, P(alpha), P(A), lda, P(B), ldb, P(beta), P(C),  \
                         ldc};                                                                 \
        remember(14, v);                                                                       \
        struct fg_mat a = {A, CT, lda, 0}, b = {B, CT, ldb, 0}, c = {C, CT, ldc, 0};           \
        return fg_gemm(((struct handle *)h)->stream, ta, tb, m, n, k, fg_load(CT, alpha, 0),   \
                       fg_load(CT, beta, 0), a, b, c, C, CT, ldc, 0, 1, NULL, 0, 1.0f);        \
    }
#define TYPED_SB(NAME, T, CT)                                                                  \
    EXPORT int NAME(void *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *A,  \
                    int lda, long long sA, const T *B, int ldb, long long sB, const T *beta,   \
                    T *C, int ldc, long long sC, int batch)                                    \
    {                                                                                          \
        long long v[] = {P(h), ta, tb, m, n, k, P(alpha), P(A), lda, sA, P(B), ldb, sB,         \
                         P(beta), P(C), ldc, sC, batch};                                       \
        remember(18, v);                                                                       \
        struct fg_mat a = {A, CT, lda, sA}, b = {B, CT, ldb, sB}, c = {C, CT, ldc, sC};        \
        return fg_gemm(((struct handle *)h)->stream, ta, tb, m, n, k, fg_load(CT, alpha, 0),   \
                       fg_load(CT, beta, 0), a, b, c, C, CT, ldc, sC, batch, NULL, 0, 1.0f);   \
    }

TYPED(cublasSgemm_v2, float, F_R_32F)
TYPED(cublasDgemm_v2, double, F_R_64F)
TYPED(cublasHgemm, uint16_t, F_R_16F)
TYPED_SB(cublasSgemmStridedBatched, float, F_R_32F)
TYPED_SB(cublasHgemmStridedBatched, uint16_t, F_R_16F)
