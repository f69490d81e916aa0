/* shim_gemm.c - GEMM calls through the preloaded shim's cuBLAS/cuBLASLt hooks
 * (intercept/hooks/gemm.c) against CPU stand-ins: tests/fakes/mock_cudart.c (loaded
 * RTLD_GLOBAL, as torch's runtime is) and tests/fakes/fake_cublas.c /
 * fake_cublaslt.c (loaded RTLD_LOCAL under their real sonames, as torch
 * loads cuBLAS, so the shim must find them with RTLD_NOLOAD).
 *
 * usage: shim_gemm MOCK_CUDART FAKE_CUBLASLT FAKE_CUBLAS DIR main|fork|scope|last|blocks|threads
 *   main  the GEMMs listed in run_main (k0..k12) (outside any scope, so GEMM k is the
 *         k-th call of the process), each followed by a stream sync; for each
 *         operand a base buffer (DIR/<k>.<operand>.bin, saved when the shim
 *         reads it) and a JSON line in DIR/cases.jsonl that says where its
 *         capture must be and how to read the expected bytes (as
 *         shim_tap_device_mock does), plus one "gemm" line per call with what
 *         the numpy check needs. Checked here: each hook returned the fake's
 *         status and passed every argument through unchanged.
 *   fork  a forked child calls cublasSgemm_v2 under the shim: the call must
 *         be forwarded (right result) and the child must capture nothing.
 *   scope three calls of component dit.step (probe_scope_enter_v1, call c,
 *         step c, branch 0), each making a bf16 cublasLtMatmul with bias
 *         (W1: m=6, k=4), a bf16 cublasGemmEx (W2: m=5, k=6, transa T) and an
 *         fp32 cublasSgemm_v2 of two activations (transa N),
 *         then one cublasSgemm_v2 outside any scope. The weights' values
 *         depend on the environment variable SHIM_GEMM_SEED (default 0), so
 *         a test can make two runs load different weights.
 *   last  GEMMs in nested scopes for `gemm.last` selection (run_last).
 *   blocks GEMMs in nested scopes that carry a parent call and block index
 *         (probe_scope_v1.parent/.block), for `@block=` selection (run_blocks).
 * Prints "FAIL ..." for each broken expectation; exit 0 when there is none.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int failures;
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL " __VA_ARGS__);                                                               \
        printf("\n");                                                                              \
        ++failures;                                                                                \
    } while (0)

static const char *dir;
static FILE *cases;
static void *blas, *blaslt;

/* runtime */
static int (*create_stream)(void **, unsigned);
static int (*event_create)(void **, unsigned);
static int (*event_record)(void *, void *);
static int (*event_sync)(void *);
/* cuBLAS / cuBLASLt entry points as the process reaches them (the shim's
 * when preloaded) and helpers from the fake libraries */
static int (*gemm_ex)(void *, int, int, int, int, int, const void *, const void *, int, int,
                      const void *, int, int, const void *, void *, int, int, int, int);
static int (*gemm_sb_ex)(void *, int, int, int, int, int, const void *, const void *, int, int,
                         long long, const void *, int, int, long long, const void *, void *, int,
                         int, long long, int, int, int);
static int (*sgemm)(void *, int, int, int, int, int, const float *, const float *, int,
                    const float *, int, const float *, float *, int);
static int (*dgemm)(void *, int, int, int, int, int, const double *, const double *, int,
                    const double *, int, const double *, double *, int);
static int (*sgemm_sb)(void *, int, int, int, int, int, const float *, const float *, int,
                       long long, const float *, int, long long, const float *, float *, int,
                       long long, int);
static int (*lt_matmul)(void *, void *, const void *, const void *, void *, const void *, void *,
                        const void *, const void *, void *, void *, void *, const void *, void *,
                        size_t, void *);
static int (*blas_create)(void **);
static int (*blas_set_stream)(void *, void *);
static int (*blas_set_pointer_mode)(void *, int);
static int (*blas_last)(long long *, int);
static int (*lt_create)(void **);
static int (*lt_layout_create)(void **, int, uint64_t, uint64_t, int64_t);
static int (*lt_layout_set)(void *, int, const void *, size_t);
static int (*lt_desc_create)(void **, int, int);
static int (*lt_desc_set)(void *, int, const void *, size_t);
static int (*lt_last)(long long *, int);

static void *stream, *handle, *lthandle;

static void sync_stream(void)
{
    void *e;
    event_create(&e, 0);
    event_record(e, stream);
    event_sync(e);
}

static uint16_t bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static uint16_t half(float f) /* exact for the small values used here */
{
    if (f == 0)
        return 0;
    uint16_t s = f < 0 ? 0x8000 : 0;
    if (f < 0)
        f = -f;
    int e = 0;
    while (f >= 2) {
        f /= 2;
        ++e;
    }
    while (f < 1) {
        f *= 2;
        --e;
    }
    return s | (uint16_t)((e + 15) << 10) | (uint16_t)((f - 1) * 1024);
}

/* small exact values: (i * 7 + seed) % 9 - 4, halved */
static float val(int i, int seed)
{
    return (float)((i * 7 + seed * 3) % 9 - 4) * 0.5f;
}

static void *fill(int dtype, size_t n, int seed)
{
    size_t es = dtype == 13 ? 8 : dtype == 12 ? 4 : dtype == 14 ? 1 : 2;
    unsigned char *p = calloc(n ? n : 1, es);
    for (size_t i = 0; i < n; ++i) {
        float v = val((int)i, seed);
        switch (dtype) {
        case 11: ((uint16_t *)p)[i] = bf16(v); break;
        case 10: ((uint16_t *)p)[i] = half(v); break;
        case 12: ((float *)p)[i] = v; break;
        case 13: ((double *)p)[i] = v; break;
        case 14: { /* e4m3 of small multiples of 0.5: exact */
            float a = v < 0 ? -v : v;
            uint8_t s = v < 0 ? 0x80 : 0, code = 0;
            if (a > 0) {
                int e = 0;
                while (a >= 2) { a /= 2; ++e; }
                while (a < 1) { a *= 2; --e; }
                code = (uint8_t)(((e + 7) << 3) | (int)((a - 1) * 8));
            }
            p[i] = s | code;
            break;
        }
        }
    }
    return p;
}

static size_t esize(int dtype)
{
    return dtype == 13 ? 8 : dtype == 12 ? 4 : dtype == 14 ? 1 : 2;
}

/* Save n elements at p as DIR/<k>.<op>.bin and add the case line. */
static void add_case(int k, const char *op, int dtype, const void *p, size_t n, int rank,
                     const long long *shape, const long long *strides)
{
    char name[64], path[1024];
    snprintf(name, sizeof name, "%d.%s.bin", k, op);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, esize(dtype), n, f) != n)
        FAIL("cannot write %s", path);
    if (f)
        fclose(f);
    fprintf(cases, "{\"path\":\"/gemm/%04d/%s\",\"k\":%d,\"operand\":\"%s\",\"dtype\":%d,"
                   "\"bin\":\"%s\",\"offset\":0,\"shape\":[",
            k, op, k, op, dtype, name);
    for (int i = 0; i < rank; ++i)
        fprintf(cases, "%s%lld", i ? "," : "", shape[i]);
    fprintf(cases, "],\"strides\":[");
    for (int i = 0; i < rank; ++i)
        fprintf(cases, "%s%lld", i ? "," : "", strides[i]);
    fprintf(cases, "]}\n");
}

static void check_status(const char *what, int got, int want)
{
    if (got != want)
        FAIL("%s returned %d, the fake library returned %d", what, got, want);
}

static void check_args(const char *what, int (*last)(long long *, int), const long long *want,
                       int n)
{
    long long got[32];
    int m = last(got, 32);
    if (m < n) {
        FAIL("%s: the fake saw %d arguments", what, m);
        return;
    }
    for (int i = 0; i < n; ++i)
        if (got[i] != want[i])
            FAIL("%s: argument %d changed on the way (%lld -> %lld)", what, i, want[i], got[i]);
}

#define P(x) ((long long)(intptr_t)(x))

static int run_main(void)
{
    int k = 0;
    /* k0: nn.Linear-like bf16 cublasGemmEx: A = W stored k x m (transa T,
     * captured [m, k]), B = x stored k x n with ldb = k + 3 (captured [n, k],
     * strides [ldb, 1]), C m x n, beta 0. */
    {
        int m = 5, n = 4, kk = 6, lda = 6, ldb = 9, ldc = 5;
        void *A = fill(11, (size_t)lda * m, 1), *B = fill(11, (size_t)ldb * n, 2);
        void *C = fill(11, (size_t)ldc * n, 3);
        float alpha = 1.0f, beta = 0.0f;
        long long sa[] = {m, kk}, ta[] = {lda, 1}, sb[] = {n, kk}, tb[] = {ldb, 1};
        long long so[] = {n, m}, to[] = {ldc, 1};
        add_case(k, "a", 11, A, (size_t)lda * m, 2, sa, ta);
        add_case(k, "b", 11, B, (size_t)ldb * n, 2, sb, tb);
        int st = gemm_ex(handle, 1, 0, m, n, kk, &alpha, A, 14, lda, B, 14, ldb, &beta, C, 14, ldc,
                         68, -1);
        long long want[] = {P(handle), 1, 0, m, n, kk, P(&alpha), P(A), 14, lda, P(B), 14, ldb,
                            P(&beta), P(C), 14, ldc, 68, -1};
        check_status("cublasGemmEx", st, 0);
        check_args("cublasGemmEx", blas_last, want, 19);
        sync_stream();
        add_case(k, "out", 11, C, (size_t)ldc * n, 2, so, to);
        ++k;
    }
    /* k1: fp32 cublasSgemm_v2, transa N (A m x k, lda 4 > m), transb T
     * (B stored n x k), beta 0.5: C is read (captured before the call). */
    {
        int m = 3, n = 4, kk = 5, lda = 4, ldb = 4, ldc = 3;
        float *A = fill(12, (size_t)lda * kk, 4), *B = fill(12, (size_t)ldb * kk, 5);
        float *C = fill(12, (size_t)ldc * n, 6);
        float alpha = 2.0f, beta = 0.5f;
        long long sa[] = {kk, m}, ta[] = {lda, 1}, sb[] = {kk, n}, tb[] = {ldb, 1};
        long long so[] = {n, m}, to[] = {ldc, 1};
        add_case(k, "a", 12, A, (size_t)lda * kk, 2, sa, ta);
        add_case(k, "b", 12, B, (size_t)ldb * kk, 2, sb, tb);
        add_case(k, "c", 12, C, (size_t)ldc * n, 2, so, to);
        int st = sgemm(handle, 0, 1, m, n, kk, &alpha, A, lda, B, ldb, &beta, C, ldc);
        long long want[] = {P(handle), 0, 1, m, n, kk, P(&alpha), P(A), lda, P(B), ldb, P(&beta),
                            P(C), ldc};
        check_status("cublasSgemm_v2", st, 0);
        check_args("cublasSgemm_v2", blas_last, want, 14);
        sync_stream();
        add_case(k, "out", 12, C, (size_t)ldc * n, 2, so, to);
        ++k;
    }
    /* k2: fp16 cublasGemmStridedBatchedEx, batch 3, N/N, batch strides with
     * gaps. */
    {
        int m = 4, n = 2, kk = 3, lda = 4, ldb = 3, ldc = 4, bt = 3;
        long long sA = 14, sB = 7, sC = 9;
        void *A = fill(10, (size_t)sA * bt, 7), *B = fill(10, (size_t)sB * bt, 8);
        void *C = fill(10, (size_t)sC * bt, 9);
        float alpha = 1.0f, beta = 0.0f;
        long long sa[] = {bt, kk, m}, ta[] = {sA, lda, 1}, sb[] = {bt, n, kk}, tb[] = {sB, ldb, 1};
        long long so[] = {bt, n, m}, to[] = {sC, ldc, 1};
        add_case(k, "a", 10, A, (size_t)sA * bt, 3, sa, ta);
        add_case(k, "b", 10, B, (size_t)sB * bt, 3, sb, tb);
        int st = gemm_sb_ex(handle, 0, 0, m, n, kk, &alpha, A, 2, lda, sA, B, 2, ldb, sB, &beta, C,
                            2, ldc, sC, bt, 68, -1);
        check_status("cublasGemmStridedBatchedEx", st, 0);
        long long want[] = {P(handle), 0, 0, m, n, kk, P(&alpha), P(A), 2, lda, sA, P(B), 2, ldb,
                            sB, P(&beta), P(C), 2, ldc, sC, bt, 68, -1};
        check_args("cublasGemmStridedBatchedEx", blas_last, want, 23);
        sync_stream();
        add_case(k, "out", 10, C, (size_t)sC * bt, 3, so, to);
        ++k;
    }
    /* k3: bf16 cublasLtMatmul with the BIAS epilogue: A = W (transa T,
     * stored k x m), B = x (N, stored k x n), D m x n, bias [m]. */
    {
        int m = 6, n = 3, kk = 4;
        void *A = fill(11, (size_t)kk * m, 10), *B = fill(11, (size_t)kk * n, 11);
        void *D = fill(11, (size_t)m * n, 12), *bias = fill(11, (size_t)m, 13);
        float alpha = 1.0f, beta = 0.0f;
        void *desc, *Ad, *Bd, *Dd;
        lt_desc_create(&desc, 68, 0);
        int32_t t = 1, epi = 4;
        lt_desc_set(desc, 3, &t, 4);
        lt_desc_set(desc, 7, &epi, 4);
        lt_desc_set(desc, 8, &bias, sizeof bias);
        lt_layout_create(&Ad, 14, kk, m, kk);
        lt_layout_create(&Bd, 14, kk, n, kk);
        lt_layout_create(&Dd, 14, m, n, m);
        long long sa[] = {m, kk}, ta[] = {kk, 1}, sb[] = {n, kk}, tb[] = {kk, 1};
        long long so[] = {n, m}, to[] = {m, 1}, sbias[] = {m}, tbias[] = {1};
        add_case(k, "a", 11, A, (size_t)kk * m, 2, sa, ta);
        add_case(k, "b", 11, B, (size_t)kk * n, 2, sb, tb);
        add_case(k, "bias", 11, bias, (size_t)m, 1, sbias, tbias);
        int st = lt_matmul(lthandle, desc, &alpha, A, Ad, B, Bd, &beta, D, Dd, D, Dd, NULL, NULL,
                           0, stream);
        check_status("cublasLtMatmul", st, 0);
        long long want[] = {P(lthandle), P(desc), P(&alpha), P(A), P(Ad), P(B), P(Bd), P(&beta),
                            P(D), P(Dd), P(D), P(Dd), 0, 0, 0, P(stream)};
        check_args("cublasLtMatmul", lt_last, want, 16);
        sync_stream();
        add_case(k, "out", 11, D, (size_t)m * n, 2, so, to);
        ++k;
    }
    /* k4: FP8 e4m3 cublasLtMatmul (A transa T, B N) with A/B scale pointers
     * (float32 scalars in "device" memory) and a bf16 output. */
    {
        int m = 4, n = 2, kk = 8;
        void *A = fill(14, (size_t)kk * m, 14), *B = fill(14, (size_t)kk * n, 15);
        void *D = fill(11, (size_t)m * n, 16);
        float *sca = malloc(4), *scb = malloc(4);
        *sca = 0.5f, *scb = 2.0f;
        float alpha = 1.0f, beta = 0.0f;
        void *desc, *Ad, *Bd, *Dd;
        lt_desc_create(&desc, 68, 0);
        int32_t t = 1;
        lt_desc_set(desc, 3, &t, 4);
        lt_desc_set(desc, 17, &sca, sizeof sca);
        lt_desc_set(desc, 18, &scb, sizeof scb);
        lt_layout_create(&Ad, 28, kk, m, kk);
        lt_layout_create(&Bd, 28, kk, n, kk);
        lt_layout_create(&Dd, 14, m, n, m);
        long long sa[] = {m, kk}, ta[] = {kk, 1}, sb[] = {n, kk}, tb[] = {kk, 1};
        long long so[] = {n, m}, to[] = {m, 1}, s1[] = {1}, t1[] = {1};
        add_case(k, "a", 14, A, (size_t)kk * m, 2, sa, ta);
        add_case(k, "b", 14, B, (size_t)kk * n, 2, sb, tb);
        add_case(k, "scale_a", 12, sca, 1, 1, s1, t1);
        add_case(k, "scale_b", 12, scb, 1, 1, s1, t1);
        int st = lt_matmul(lthandle, desc, &alpha, A, Ad, B, Bd, &beta, D, Dd, D, Dd, NULL, NULL,
                           0, stream);
        check_status("cublasLtMatmul fp8", st, 0);
        sync_stream();
        add_case(k, "out", 11, D, (size_t)m * n, 2, so, to);
        ++k;
    }
    /* k5: fp32 cublasLtMatmul with BATCH_COUNT 2 and strided batches, ld > rows. */
    {
        int m = 3, n = 2, kk = 2, bt = 2;
        int64_t sA = 10, sB = 6, sD = 8;
        int64_t lda = 4, ldb = 3, ldd = 4;
        float *A = fill(12, (size_t)sA * bt, 17), *B = fill(12, (size_t)sB * bt, 18);
        float *D = fill(12, (size_t)sD * bt, 19);
        float alpha = 1.0f, beta = 0.0f;
        void *desc, *Ad, *Bd, *Dd;
        lt_desc_create(&desc, 68, 0);
        lt_layout_create(&Ad, 0, m, kk, lda);
        lt_layout_create(&Bd, 0, kk, n, ldb);
        lt_layout_create(&Dd, 0, m, n, ldd);
        int32_t b32 = bt;
        lt_layout_set(Ad, 5, &b32, 4);
        lt_layout_set(Bd, 5, &b32, 4);
        lt_layout_set(Dd, 5, &b32, 4);
        lt_layout_set(Ad, 6, &sA, 8);
        lt_layout_set(Bd, 6, &sB, 8);
        lt_layout_set(Dd, 6, &sD, 8);
        long long sa[] = {bt, kk, m}, ta[] = {sA, lda, 1}, sb[] = {bt, n, kk}, tb[] = {sB, ldb, 1};
        long long so[] = {bt, n, m}, to[] = {sD, ldd, 1};
        add_case(k, "a", 12, A, (size_t)sA * bt, 3, sa, ta);
        add_case(k, "b", 12, B, (size_t)sB * bt, 3, sb, tb);
        int st = lt_matmul(lthandle, desc, &alpha, A, Ad, B, Bd, &beta, D, Dd, D, Dd, NULL, NULL,
                           0, stream);
        check_status("cublasLtMatmul batched", st, 0);
        sync_stream();
        add_case(k, "out", 12, D, (size_t)sD * bt, 3, so, to);
        ++k;
    }
    /* k6: fp64 cublasDgemm_v2, T/T. */
    {
        int m = 2, n = 3, kk = 4, lda = 4, ldb = 3, ldc = 2;
        double *A = fill(13, (size_t)lda * m, 20), *B = fill(13, (size_t)ldb * kk, 21);
        double *C = fill(13, (size_t)ldc * n, 22);
        double alpha = 1.0, beta = 0.0;
        long long sa[] = {m, kk}, ta[] = {lda, 1}, sb[] = {kk, n}, tb[] = {ldb, 1};
        long long so[] = {n, m}, to[] = {ldc, 1};
        add_case(k, "a", 13, A, (size_t)lda * m, 2, sa, ta);
        add_case(k, "b", 13, B, (size_t)ldb * kk, 2, sb, tb);
        int st = dgemm(handle, 1, 1, m, n, kk, &alpha, A, lda, B, ldb, &beta, C, ldc);
        check_status("cublasDgemm_v2", st, 0);
        sync_stream();
        add_case(k, "out", 13, C, (size_t)ldc * n, 2, so, to);
        ++k;
    }
    /* k7: fp32 cublasSgemmStridedBatched, batch 2, N/N. */
    {
        int m = 2, n = 2, kk = 3, bt = 2;
        long long sA = 6, sB = 6, sC = 4;
        float *A = fill(12, (size_t)sA * bt, 23), *B = fill(12, (size_t)sB * bt, 24);
        float *C = fill(12, (size_t)sC * bt, 25);
        float alpha = 1.0f, beta = 0.0f;
        long long sa[] = {bt, kk, m}, ta[] = {sA, m, 1}, sb[] = {bt, n, kk}, tb[] = {sB, kk, 1};
        long long so[] = {bt, n, m}, to[] = {sC, m, 1};
        add_case(k, "a", 12, A, (size_t)sA * bt, 3, sa, ta);
        add_case(k, "b", 12, B, (size_t)sB * bt, 3, sb, tb);
        int st = sgemm_sb(handle, 0, 0, m, n, kk, &alpha, A, m, sA, B, kk, sB, &beta, C, m, sC, bt);
        check_status("cublasSgemmStridedBatched", st, 0);
        sync_stream();
        add_case(k, "out", 12, C, (size_t)sC * bt, 3, so, to);
        ++k;
    }
    /* k8: the output overwrites an input (C == A, in place): A must be
     * captured before the call. */
    {
        int m = 3, n = 3, kk = 3;
        float *A = fill(12, 9, 26), *B = fill(12, 9, 27);
        float alpha = 1.0f, beta = 0.0f;
        long long s2[] = {3, 3}, t2[] = {3, 1};
        add_case(k, "a", 12, A, 9, 2, s2, t2);
        add_case(k, "b", 12, B, 9, 2, s2, t2);
        int st = sgemm(handle, 0, 0, m, n, kk, &alpha, A, 3, B, 3, &beta, A, 3);
        check_status("cublasSgemm_v2 in place", st, 0);
        sync_stream();
        add_case(k, "out", 12, A, 9, 2, s2, t2);
        ++k;
    }
    /* k9: a bad call: the fake returns CUBLAS_STATUS_INVALID_VALUE (7) for
     * ldc < m; the hook must return it. Nothing is captured (status != 0). */
    {
        float A[4] = {0}, B[4] = {0}, C[4] = {0}, alpha = 1, beta = 0;
        int st = sgemm(handle, 0, 0, 2, 2, 2, &alpha, A, 2, B, 2, &beta, C, 1);
        check_status("cublasSgemm_v2 with ldc < m", st, 7);
        ++k;
    }
    /* k10, k11: cublasLtMatmul with ORDER ROW layouts: counted, not captured,
     * one warning for both; still forwarded. */
    for (int rep = 0; rep < 2; ++rep) {
        float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1}, D[4] = {0};
        float alpha = 1.0f, beta = 0.0f;
        void *desc, *Ad, *Bd, *Dd;
        lt_desc_create(&desc, 68, 0);
        lt_layout_create(&Ad, 0, 2, 2, 2);
        lt_layout_create(&Bd, 0, 2, 2, 2);
        lt_layout_create(&Dd, 0, 2, 2, 2);
        int32_t row = 1;
        lt_layout_set(Ad, 1, &row, 4);
        int st = lt_matmul(lthandle, desc, &alpha, A, Ad, B, Bd, &beta, D, Dd, D, Dd, NULL, NULL,
                           0, stream);
        check_status("cublasLtMatmul ORDER_ROW", st, 0);
        sync_stream();
        if (D[0] != 1 || D[3] != 4)
            FAIL("cublasLtMatmul ORDER_ROW was not computed (D = %g %g %g %g)", D[0], D[1], D[2],
                 D[3]);
        ++k;
    }
    /* k12: cublasSgemm_v2 in device pointer mode (alpha 1, beta 0 in
     * "device" memory): alpha/beta are not read (probe.op null), so C is
     * taken as read and captured before the call. */
    {
        int m = 2, n = 3, kk = 2;
        float *A = fill(12, 4, 50), *B = fill(12, 6, 51), *C = fill(12, 6, 52);
        float *dalpha = malloc(4), *dbeta = malloc(4);
        *dalpha = 1.0f, *dbeta = 0.0f;
        long long sa[] = {kk, m}, ta[] = {m, 1}, sb[] = {n, kk}, tb[] = {kk, 1};
        long long so[] = {n, m}, to[] = {m, 1};
        add_case(k, "a", 12, A, 4, 2, sa, ta);
        add_case(k, "b", 12, B, 6, 2, sb, tb);
        add_case(k, "c", 12, C, 6, 2, so, to);
        blas_set_pointer_mode(handle, 1);
        int st = sgemm(handle, 0, 0, m, n, kk, dalpha, A, m, B, kk, dbeta, C, m);
        blas_set_pointer_mode(handle, 0);
        check_status("cublasSgemm_v2 device pointer mode", st, 0);
        sync_stream();
        add_case(k, "out", 12, C, 6, 2, so, to);
        ++k;
    }
    fprintf(cases, "{\"total\":%d}\n", k);
    return failures ? 1 : 0;
}

static int run_fork(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        float A[4] = {1, 2, 3, 4}, B[4] = {2, 0, 0, 2}, C[4] = {0}, alpha = 1, beta = 0;
        int st = sgemm(handle, 0, 0, 2, 2, 2, &alpha, A, 2, B, 2, &beta, C, 2);
        /* no CUDA in the child: the fake wrote C through the mock's stream;
         * the mock's worker thread does not exist in the child, so the fake
         * result is checked via its status only */
        _exit(st == 0 ? 0 : 3);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        FAIL("forked child: GEMM under the shim failed (status %d)", ws);
    /* the parent still works and captures */
    float A[4] = {1, 2, 3, 4}, B[4] = {2, 0, 0, 2}, C[4] = {0}, alpha = 1, beta = 0;
    int st = sgemm(handle, 0, 0, 2, 2, 2, &alpha, A, 2, B, 2, &beta, C, 2);
    check_status("parent cublasSgemm_v2", st, 0);
    sync_stream();
    if (C[0] != 2 || C[1] != 4 || C[2] != 6 || C[3] != 8)
        FAIL("parent GEMM result %g %g %g %g", C[0], C[1], C[2], C[3]);
    return failures ? 1 : 0;
}

static int (*scope_enter)(const void *);
static int (*scope_exit)(void);

struct scope_desc { /* probe_scope_v1 (include/probe/tap.h) */
    uint32_t struct_size, abi_version;
    const char *component;
    int64_t call, step;
    int32_t cfg_branch;
};

static int run_scope(void)
{
    const char *e = getenv("SHIM_GEMM_SEED");
    int seed = e ? atoi(e) : 0;
    if (!scope_enter || !scope_exit) {
        FAIL("probe_scope_enter_v1 / probe_scope_exit_v1 not found (shim not preloaded?)");
        return 1;
    }
    void *W1 = fill(11, 24, 30 + seed), *W2 = fill(11, 30, 31 + seed), *bias = fill(11, 6, 32);
    for (int c = 0; c < 3; ++c) {
        struct scope_desc sd = {sizeof sd, 1, "dit.step", c, c, 0};
        if (scope_enter(&sd) != 0)
            FAIL("probe_scope_enter_v1 failed");
        void *x = fill(11, 12, 40 + c), *h = fill(11, 18, 0), *y = fill(11, 15, 0);
        float alpha = 1.0f, beta = 0.0f;
        void *desc, *Ad, *Bd, *Dd;
        lt_desc_create(&desc, 68, 0);
        int32_t t = 1, epi = 4;
        lt_desc_set(desc, 3, &t, 4);
        lt_desc_set(desc, 7, &epi, 4);
        lt_desc_set(desc, 8, &bias, sizeof bias);
        lt_layout_create(&Ad, 14, 4, 6, 4);
        lt_layout_create(&Bd, 14, 4, 3, 4);
        lt_layout_create(&Dd, 14, 6, 3, 6);
        check_status("scoped cublasLtMatmul",
                     lt_matmul(lthandle, desc, &alpha, W1, Ad, x, Bd, &beta, h, Dd, h, Dd, NULL,
                               NULL, 0, stream), 0);
        /* the fake reads its inputs when called, and writes its output in
         * stream order: let h arrive before the next GEMM reads it */
        sync_stream();
        check_status("scoped cublasGemmEx",
                     gemm_ex(handle, 1, 0, 5, 3, 6, &alpha, W2, 14, 6, h, 14, 6, &beta, y, 14, 5,
                             68, -1), 0);
        /* an activation product (transa N, different in every call): not a weight */
        float *P = fill(12, 6, 60 + c), *Q = fill(12, 6, 61 + c), *R = fill(12, 4, 0);
        check_status("scoped activation cublasSgemm_v2",
                     sgemm(handle, 0, 0, 2, 2, 3, &alpha, P, 2, Q, 3, &beta, R, 2), 0);
        sync_stream();
        scope_exit();
    }
    float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1}, C[4] = {0}, alpha = 1, beta = 0;
    check_status("unscoped cublasSgemm_v2", sgemm(handle, 0, 0, 2, 2, 2, &alpha, A, 2, B, 2, &beta, C, 2), 0);
    sync_stream();
    return failures ? 1 : 0;
}

/* last: one scope "dit.step" (call 0, step 0) holding a GEMM, five "dit.block"
 * instances (calls 0..4) and another GEMM; block c makes last_plan[c]
 * cublasSgemm_v2 (2x2x3, transa/transb N) whose operands come from seed
 * 100 + 10c + i, so each result says which call and GEMM made it.
 * DIR/last.<component>.<call>.<k>.out.bin: the result of GEMM k of that call. */
static const int last_plan[5] = {3, 3, 4, 3, 3};

static void last_gemm(const char *component, int call, int k, int seed)
{
    float *P = fill(12, 6, seed), *Q = fill(12, 6, seed + 1000), *R = calloc(4, sizeof(float));
    float alpha = 1.0f, beta = 0.0f;
    check_status("cublasSgemm_v2 (last)", sgemm(handle, 0, 0, 2, 2, 3, &alpha, P, 2, Q, 3, &beta, R, 2), 0);
    sync_stream();
    char path[1024];
    snprintf(path, sizeof path, "%s/last.%s.%d.%d.out.bin", dir, component, call, k);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(R, sizeof(float), 4, f) != 4)
        FAIL("cannot write %s", path);
    if (f)
        fclose(f);
}

static int run_last(void)
{
    if (!scope_enter || !scope_exit) {
        FAIL("probe_scope_enter_v1 / probe_scope_exit_v1 not found (shim not preloaded?)");
        return 1;
    }
    struct scope_desc step = {sizeof step, 1, "dit.step", 0, 0, 0};
    if (scope_enter(&step) != 0)
        FAIL("probe_scope_enter_v1 failed");
    last_gemm("dit.step", 0, 0, 90);
    for (int c = 0; c < 5; ++c) {
        struct scope_desc sd = {sizeof sd, 1, "dit.block", c, -1, -1};
        if (scope_enter(&sd) != 0)
            FAIL("probe_scope_enter_v1 failed");
        for (int i = 0; i < last_plan[c]; ++i)
            last_gemm("dit.block", c, i, 100 + 10 * c + i);
        scope_exit();
    }
    last_gemm("dit.step", 0, 1, 91);
    scope_exit();
    return failures ? 1 : 0;
}

/* blocks: one scope "dit.step" (call 0, step 2, branch 1) making one GEMM,
 * inside it three "dit.block" scopes (calls 0..2) described with the whole
 * probe_scope_v1 (parent "/dit.step/0000", block c, step and branch unknown,
 * so they take the dit.step's) and a fourth (call 3) with the first v1 size
 * (struct scope_desc: no parent, not nested); each block makes one
 * cublasSgemm_v2 from seed 200 + c (transa N) and one weight-like
 * cublasSgemm_v2 (transa T, A = W from seed 300 + c). */
struct scope_desc_nested { /* probe_scope_v1 with parent and block */
    struct scope_desc v1;
    const char *parent;
    int64_t block;
};

static int run_blocks(void)
{
    if (!scope_enter || !scope_exit) {
        FAIL("probe_scope_enter_v1 / probe_scope_exit_v1 not found (shim not preloaded?)");
        return 1;
    }
    struct scope_desc step = {sizeof step, 1, "dit.step", 0, 2, 1};
    if (scope_enter(&step) != 0)
        FAIL("probe_scope_enter_v1 failed");
    last_gemm("dit.step", 0, 0, 190);
    for (int c = 0; c < 4; ++c) {
        struct scope_desc_nested sd = {{sizeof sd, 1, "dit.block", c, -1, -1}, "/dit.step/0000", c};
        if (c == 3)
            sd.v1.struct_size = sizeof sd.v1;
        if (scope_enter(&sd) != 0)
            FAIL("probe_scope_enter_v1 failed");
        last_gemm("dit.block", c, 0, 200 + c);
        /* a weight-like GEMM (transa T): W from seed 300 + c */
        float *W = fill(12, 6, 300 + c), *X = fill(12, 6, 400 + c), *Y = calloc(4, sizeof(float));
        float alpha = 1.0f, beta = 0.0f;
        check_status("block weight cublasSgemm_v2",
                     sgemm(handle, 1, 0, 2, 2, 3, &alpha, W, 3, X, 3, &beta, Y, 2), 0);
        sync_stream();
        scope_exit();
    }
    scope_exit();
    return failures ? 1 : 0;
}

/* threads: 4 threads, each in its own scope "worker" call t (step t), each
 * making 100 cublasSgemm_v2 on its own handle and stream; thread t's
 * operands come from seed t, so every captured out says which thread made it.
 * DIR/thread<t>.out.bin: the result thread t computed. */
#define NTHREADS 4
#define NCALLS 100
static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    void *h, *s;
    blas_create(&h);
    create_stream(&s, 1);
    blas_set_stream(h, s);
    struct scope_desc sd = {sizeof sd, 1, "worker", t, t, -1};
    scope_enter(&sd);
    float *A = fill(12, 6, 70 + t), *B = fill(12, 6, 80 + t), *C = calloc(4, sizeof(float));
    float alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < NCALLS; ++i)
        if (sgemm(h, 0, 0, 2, 2, 3, &alpha, A, 2, B, 3, &beta, C, 2) != 0)
            FAIL("thread %d call %d failed", t, i);
    void *e;
    event_create(&e, 0);
    event_record(e, s);
    event_sync(e);
    scope_exit();
    char path[1024];
    snprintf(path, sizeof path, "%s/thread%d.out.bin", dir, t);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(C, sizeof(float), 4, f);
        fclose(f);
    }
    return NULL;
}

static int run_threads(void)
{
    if (!scope_enter || !scope_exit) {
        FAIL("probe_scope_enter_v1 / probe_scope_exit_v1 not found");
        return 1;
    }
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; ++t)
        pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < NTHREADS; ++t)
        pthread_join(th[t], NULL);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s MOCK_CUDART FAKE_CUBLASLT FAKE_CUBLAS DIR main|fork|scope|last|threads\n", argv[0]);
        return 2;
    }
    if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) || !(blaslt = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL)) ||
        !(blas = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL))) {
        fprintf(stderr, "cannot load: %s\n", dlerror());
        return 2;
    }
    dir = argv[4];
#define GET(var, name) *(void **)&var = dlsym(RTLD_DEFAULT, name)
#define HOOK(var, lib, name)                                                                       \
    do {                                                                                           \
        GET(var, name);                                                                            \
        if (!var)                                                                                  \
            *(void **)&var = dlsym(lib, name);                                                     \
    } while (0)
#define LIB(var, lib, name) *(void **)&var = dlsym(lib, name)
    GET(create_stream, "cudaStreamCreateWithFlags");
    GET(event_create, "cudaEventCreateWithFlags");
    GET(event_record, "cudaEventRecord");
    GET(event_sync, "cudaEventSynchronize");
    GET(scope_enter, "probe_scope_enter_v1");
    GET(scope_exit, "probe_scope_exit_v1");
    HOOK(gemm_ex, blas, "cublasGemmEx");
    HOOK(gemm_sb_ex, blas, "cublasGemmStridedBatchedEx");
    HOOK(sgemm, blas, "cublasSgemm_v2");
    HOOK(dgemm, blas, "cublasDgemm_v2");
    HOOK(sgemm_sb, blas, "cublasSgemmStridedBatched");
    HOOK(lt_matmul, blaslt, "cublasLtMatmul");
    LIB(blas_create, blas, "cublasCreate_v2");
    LIB(blas_set_stream, blas, "cublasSetStream_v2");
    LIB(blas_set_pointer_mode, blas, "cublasSetPointerMode_v2");
    LIB(blas_last, blas, "fake_cublas_last");
    LIB(lt_create, blaslt, "cublasLtCreate");
    LIB(lt_layout_create, blaslt, "cublasLtMatrixLayoutCreate");
    LIB(lt_layout_set, blaslt, "cublasLtMatrixLayoutSetAttribute");
    LIB(lt_desc_create, blaslt, "cublasLtMatmulDescCreate");
    LIB(lt_desc_set, blaslt, "cublasLtMatmulDescSetAttribute");
    LIB(lt_last, blaslt, "fake_cublaslt_last");
    if (!create_stream || !event_sync || !gemm_ex || !lt_matmul || !blas_create || !lt_desc_set ||
        !blas_set_pointer_mode ||
        !blas_last || !lt_last) {
        fprintf(stderr, "a runtime or cuBLAS entry point is missing\n");
        return 2;
    }
    create_stream(&stream, 1);
    blas_create(&handle);
    blas_set_stream(handle, stream);
    lt_create(&lthandle);
    char p[1024];
    snprintf(p, sizeof p, "%s/cases.jsonl", dir);
    cases = fopen(p, "w");
    if (!cases)
        return 2;
    int rc = 2;
    if (strcmp(argv[5], "main") == 0)
        rc = run_main();
    else if (strcmp(argv[5], "fork") == 0)
        rc = run_fork();
    else if (strcmp(argv[5], "scope") == 0)
        rc = run_scope();
    else if (strcmp(argv[5], "last") == 0)
        rc = run_last();
    else if (strcmp(argv[5], "blocks") == 0)
        rc = run_blocks();
    else if (strcmp(argv[5], "threads") == 0)
        rc = run_threads();
    fclose(cases);
    return rc;
}
