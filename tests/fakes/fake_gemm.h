/* fake_gemm.h - the arithmetic shared by the CPU stand-ins for cuBLAS and
 * cuBLASLt (fake_cublas.c, fake_cublaslt.c): a column-major GEMM on host
 * memory ("device memory" is host memory, as in mock_cudart.c)
 *   D = alpha * scale_a * scale_b * op(A) op(B) + beta * C + bias
 * accumulated in float (fp32) in l order, converted to D's type with
 * round-to-nearest-even. The result is written in stream order through the
 * mock runtime's mock_cuda_spin (one column at a time, so the gaps of a
 * leading dimension > rows stay untouched), so a copy of C enqueued on the
 * stream before the call still sees the old C.
 * Types: cudaDataType_t values of library_types.h. */
#ifndef PROBE_TESTS_FAKE_GEMM_H
#define PROBE_TESTS_FAKE_GEMM_H

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { F_R_32F = 0, F_R_64F = 1, F_R_16F = 2, F_R_16BF = 14, F_R_8F_E4M3 = 28 };

static size_t fg_size(int t)
{
    switch (t) {
    case F_R_32F: return 4;
    case F_R_64F: return 8;
    case F_R_16F: case F_R_16BF: return 2;
    case F_R_8F_E4M3: return 1;
    default: return 0;
    }
}

static float fg_half_to_f(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

static uint16_t fg_f_to_half(float f)
{
    /* exact for the small integers and halves the tests use; RNE otherwise */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t s = (x >> 16) & 0x8000;
    float a = fabsf(f);
    if (isnan(f))
        return s | 0x7e00;
    if (a >= 65520.0f)
        return s | 0x7c00;
    if (a < ldexpf(1, -14)) { /* subnormal */
        float q = a / ldexpf(1, -24);
        return s | (uint16_t)nearbyintf(q);
    }
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int mant = (int)nearbyintf((m * 2 - 1) * 1024);
    int ex = e - 1 + 15;
    if (mant == 1024) {
        mant = 0;
        ++ex;
    }
    return s | (uint16_t)(ex << 10) | (uint16_t)mant;
}

static float fg_bf16_to_f(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t fg_f_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if (isnan(f))
        return 0x7fc0;
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static float fg_e4m3_to_f(uint8_t v)
{
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7)
        r = NAN;
    else if (e == 0)
        r = ldexpf((float)m, -9);
    else
        r = ldexpf((float)(m + 8), e - 10);
    return s ? -r : r;
}

static float fg_load(int t, const void *p, size_t i)
{
    switch (t) {
    case F_R_32F: return ((const float *)p)[i];
    case F_R_64F: return (float)((const double *)p)[i];
    case F_R_16F: return fg_half_to_f(((const uint16_t *)p)[i]);
    case F_R_16BF: return fg_bf16_to_f(((const uint16_t *)p)[i]);
    case F_R_8F_E4M3: return fg_e4m3_to_f(((const uint8_t *)p)[i]);
    default: return NAN;
    }
}

static void fg_store(int t, void *p, size_t i, float v)
{
    switch (t) {
    case F_R_32F: ((float *)p)[i] = v; break;
    case F_R_64F: ((double *)p)[i] = v; break;
    case F_R_16F: ((uint16_t *)p)[i] = fg_f_to_half(v); break;
    case F_R_16BF: ((uint16_t *)p)[i] = fg_f_to_bf16(v); break;
    default: break;
    }
}

struct fg_mat {
    const void *p;
    int type;
    long long ld, stride;
};

/* 0, or 7 (CUBLAS_STATUS_INVALID_VALUE) for bad sizes/types. */
static int fg_gemm(void *stream, int transa, int transb, long long m, long long n, long long k,
                   float alpha, float beta, struct fg_mat a, struct fg_mat b, struct fg_mat c,
                   void *d, int dtype, long long ldd, long long strided, long long batch,
                   const void *bias, int bias_type, float scale)
{
    if (m < 0 || n < 0 || k < 0 || batch < 1 || !fg_size(a.type) || !fg_size(b.type) ||
        !fg_size(dtype) || ldd < m)
        return 7;
    static void (*spin)(void *, int, void *, const void *, size_t);
    static int looked; /* once: the mock runtime is loaded before any GEMM */
    if (!looked) {
        *(void **)&spin = dlsym(RTLD_DEFAULT, "mock_cuda_spin");
        looked = 1;
    }
    size_t es = fg_size(dtype);
    void *col = malloc((size_t)(m ? m : 1) * es);
    for (long long bi = 0; bi < batch; ++bi) {
        for (long long j = 0; j < n; ++j) {
            for (long long i = 0; i < m; ++i) {
                float acc = 0;
                for (long long l = 0; l < k; ++l) {
                    size_t ia = bi * a.stride + (transa ? l + i * a.ld : i + l * a.ld);
                    size_t ib = bi * b.stride + (transb ? j + l * b.ld : l + j * b.ld);
                    acc += fg_load(a.type, a.p, ia) * fg_load(b.type, b.p, ib);
                }
                float v = alpha * scale * acc;
                if (beta != 0)
                    v += beta * fg_load(c.type, c.p, bi * c.stride + i + j * c.ld);
                if (bias)
                    v += fg_load(bias_type, bias, i);
                fg_store(dtype, col, i, v);
            }
            char *dst = (char *)d + (size_t)(bi * strided + j * ldd) * es;
            if (spin)
                spin(stream, 0, dst, col, (size_t)m * es);
            else
                memcpy(dst, col, (size_t)m * es);
        }
    }
    free(col);
    return 0;
}

#endif
