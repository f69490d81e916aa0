/* metrics.cu - the metrics of probe/metrics.h on a CUDA device
 * (probe/device.h; definitions in docs/metrics.md; the
 * algorithm and its memory are described in docs/device.md).
 *
 * CUDA C: C-style code; templates only to specialise the hot kernels on the
 * element types of the pair (a few common pairs, plus one generic version
 * that switches on the type at run time).
 *
 * Passes over the pair (r = reference, c = candidate, d = c - r in fp64; for
 * an integer pair with a 64-bit side d is formed exactly from the two
 * integers and rounded once to double, as metrics/metrics.c does):
 *  1. fused: decode both sides exactly as metrics/vocab/dtype.c, then per element
 *     the counts (finite/NaN/Inf, NaN in the reference only, mismatch, inf
 *     mismatch), the nine sums r^2, c^2, d^2, r*c, |d| and, for the gain
 *     error, d*r, r^2 d^2, r^3 d, r^4 (plain fp64 per thread over at most
 *     256 elements, a fixed tree in the block), max |r|, max |c|, max |d|
 *     with its first offset (a 32-bit in-tile position per thread), the
 *     largest |d| of a mismatching index in ulps of the coarser floating
 *     type at max(|r|, |c|), the number of exact zeros |d| = 0 and the p99's
 *     first level (a histogram of the top 12 bits of bits(|d|) |d| != 0, two
 *     bins per prefix: hist0_bin); per
 *     group of 8 elements, when both sides have one element type, the
 *     elements whose bytes differ (bool: whose truth values differ). Per-block
 *     partials, combined by one block in a fixed order with Neumaier's
 *     compensated summation: the same input gives the same bits every run.
 *     Counters use integer atomics only.
 *  2. (float64 inputs with |x| outside [2^-250, 2^250] only: the fourth
 *     powers of the gain sums) the sums again on power-of-two scaled values,
 *     with the exponents of metrics/metrics.c.
 *  3. p99: radix select on the bit patterns of |d| (non-negative doubles
 *     order like their bits as uint64). The fused pass's histogram of the
 *     top 12 bits of the nonzero keys gives the 12-bit prefix holding rank
 *     k = ceil(0.99 n_finite) (zeros: the fused pass's count), or the value
 *     itself when k falls on the prefix followed by zeros; each further
 *     pass re-reads the pair and histograms the next 10 bits of the elements
 *     under the prefix, with per bin the min/max of the next 32 bits and the
 *     OR/AND of the rest (when they agree for the chosen bin, its keys are
 *     all equal and the value is known); once at most 4096 candidates remain
 *     they are collected and sorted on the host. Shortcuts: k <= number of exact zeros -> 0;
 *     k = n_finite -> max |d|.
 *  4. channels (when a channel spec is given): per segment (a piece of a row
 *     of `inner` elements over one or more rows of the channel, or a run of
 *     up to 64 rows of one column) partials (count, mean and M2 of r, mean
 *     and M2 of d, compensated sum of d) from per-thread shifted sums about a
 *     pivot, combined per channel in a fixed order with Chan's formula
 *     (T. F. Chan, G. H. Golub, R. J. LeVeque, "Algorithms for computing the
 *     sample variance", 1983); then per channel shift_k, se_k, z_k on the
 *     host (probe/metrics.h).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "probe/device.h"
#include "../finish.h"

#define THREADS 256
#define VEC 8                          /* elements per thread per group */
#ifndef PROBE_CUDA_GROUPS
#define PROBE_CUDA_GROUPS 32
#endif
#define GROUPS PROBE_CUDA_GROUPS       /* groups per thread per tile */
#define TILE (THREADS * VEC * GROUPS)  /* 65536 elements per block (default) */
#define ABS_MASK 0x7FFFFFFFFFFFFFFFull
#define INF_BITS 0x7FF0000000000000ull
#define HBITS 12
#define HBINS (1 << HBITS)
#define LEVEL0_SHIFT 51                /* 63 - 12: |d| bits are < 2^63 */
#define L0BINS (2 * HBINS)             /* level 0: each 12-bit prefix, split in two (hist0_bin) */
#define COLLECT_MAX 4096
#define TBITS 10                       /* bits per p99 level after the first */
#define TBINS (1 << TBITS)
#define RED_THREADS 256
#define CH_SEG 2048                    /* channels: longest row piece of one warp */
#define CH_J 64                        /* channels: rows of one column run */
#define CH_U 8                         /* channels: rows of a column run loaded at a time */
#define CH_WARP_ELEMS 16384            /* channels: elements a warp takes at least, rows allowing */
#define CHUNK_BYTES (64u << 20)        /* probe_cuda_metrics_source: per read */
/* The library is built with -fvisibility=hidden: only probe/device.h is exported. */
#define PROBE_CUDA_API extern "C" __attribute__((visibility("default")))

/* ---- element decoding (bit for bit as metrics/vocab/dtype.c) ---- */

__host__ __device__ static inline int dt_size(int t)
{
    switch (t) {
    case PROBE_DTYPE_BOOL: case PROBE_DTYPE_INT8: case PROBE_DTYPE_UINT8:
    case PROBE_DTYPE_FLOAT8_E4M3FN: case PROBE_DTYPE_FLOAT8_E5M2:
        return 1;
    case PROBE_DTYPE_INT16: case PROBE_DTYPE_UINT16: case PROBE_DTYPE_FLOAT16:
    case PROBE_DTYPE_BFLOAT16:
        return 2;
    case PROBE_DTYPE_INT32: case PROBE_DTYPE_UINT32: case PROBE_DTYPE_FLOAT32:
        return 4;
    case PROBE_DTYPE_INT64: case PROBE_DTYPE_UINT64: case PROBE_DTYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

__device__ static inline double bits_d(uint64_t b)
{
    return __longlong_as_double((long long)b);
}

__device__ static inline uint64_t d_bits(double x)
{
    return (uint64_t)__double_as_longlong(x);
}

/* The decoder of metrics/vocab/dtype.c (decode_minifloat): 1 sign bit, ebits
 * exponent bits, mbits mantissa bits; ieee: all-ones exponent is inf (m = 0)
 * or NaN, else (E4M3FN) only S.1111.111 is NaN. */
__device__ static inline double dec_mini(unsigned bits, int ebits, int mbits, int bias, int ieee)
{
    unsigned emax = (1u << ebits) - 1, mmax = (1u << mbits) - 1;
    unsigned sign = (bits >> (ebits + mbits)) & 1u;
    unsigned e = (bits >> mbits) & emax, m = bits & mmax;
    uint64_t sbit = (uint64_t)sign << 63;
    if (e == emax && (ieee || m == mmax)) {
        if (ieee && m == 0)
            return bits_d(sbit | 0x7FF0000000000000ull);
        return bits_d(sbit | 0x7FF8000000000000ull | ((uint64_t)m << (52 - mbits)));
    }
    if (e == 0) {
        double v = (double)m * bits_d((uint64_t)(1 - bias - mbits + 1023) << 52);
        return sign ? -v : v;
    }
    return bits_d(sbit | ((uint64_t)((int)e - bias + 1023) << 52) | ((uint64_t)m << (52 - mbits)));
}

__device__ static inline double dec(int t, uint64_t b)
{
    switch (t) {
    case PROBE_DTYPE_BOOL: return (b & 0xFFu) ? 1.0 : 0.0;
    case PROBE_DTYPE_INT8: return (double)(int8_t)(uint8_t)b;
    case PROBE_DTYPE_UINT8: return (double)(uint8_t)b;
    case PROBE_DTYPE_INT16: return (double)(int16_t)(uint16_t)b;
    case PROBE_DTYPE_UINT16: return (double)(uint16_t)b;
    case PROBE_DTYPE_INT32: return (double)(int32_t)(uint32_t)b;
    case PROBE_DTYPE_UINT32: return (double)(uint32_t)b;
    case PROBE_DTYPE_INT64: return (double)(long long)b;
    case PROBE_DTYPE_UINT64: return (double)(unsigned long long)b;
    case PROBE_DTYPE_FLOAT16: return dec_mini((unsigned)(b & 0xFFFFu), 5, 10, 15, 1);
    case PROBE_DTYPE_BFLOAT16: return (double)__uint_as_float((unsigned)(b & 0xFFFFu) << 16);
    case PROBE_DTYPE_FLOAT32: return (double)__uint_as_float((unsigned)b);
    case PROBE_DTYPE_FLOAT64: return bits_d(b);
    case PROBE_DTYPE_FLOAT8_E4M3FN: return dec_mini((unsigned)(b & 0xFFu), 4, 3, 7, 0);
    case PROBE_DTYPE_FLOAT8_E5M2: return dec_mini((unsigned)(b & 0xFFu), 5, 2, 15, 1);
    default: return 0.0;
    }
}

/* A bfloat16 or float16 element (bits w, at most 16) as a double: exact, as dec(). */
template <int D>
__device__ static inline double dec16(unsigned w)
{
    if (D == PROBE_DTYPE_BFLOAT16)
        return (double)__uint_as_float(w << 16);
    return (double)__half2float(__ushort_as_half((unsigned short)w));
}

__device__ static inline uint64_t ld_raw(const unsigned char *p, int sz, uint64_t i)
{
    switch (sz) {
    case 1: return p[i];
    case 2: return ((const uint16_t *)p)[i];
    case 4: return ((const uint32_t *)p)[i];
    default: return ((const unsigned long long *)p)[i];
    }
}

/* The raw bits of VEC consecutive elements, kept packed (2 to 16 words) so
 * that a group costs few registers; decoded one element at a time. */
typedef struct {
    unsigned w[16];
} rawgrp;

__device__ static inline uint64_t get_elem(const rawgrp *g, int sz, int j)
{
    switch (sz) {
    case 1: return (g->w[j >> 2] >> (8 * (j & 3))) & 0xFFu;
    case 2: return (g->w[j >> 1] >> (16 * (j & 1))) & 0xFFFFu;
    case 4: return g->w[j];
    default: return (uint64_t)g->w[2 * j] | ((uint64_t)g->w[2 * j + 1] << 32);
    }
}

__device__ static inline void set_elem(rawgrp *g, int sz, int j, uint64_t v)
{
    switch (sz) {
    case 1: {
        unsigned sh = 8 * (j & 3);
        g->w[j >> 2] = (g->w[j >> 2] & ~(0xFFu << sh)) | ((unsigned)v << sh);
        break;
    }
    case 2: {
        unsigned sh = 16 * (j & 1);
        g->w[j >> 1] = (g->w[j >> 1] & ~(0xFFFFu << sh)) | ((unsigned)v << sh);
        break;
    }
    case 4: g->w[j] = (unsigned)v; break;
    default:
        g->w[2 * j] = (unsigned)v;
        g->w[2 * j + 1] = (unsigned)(v >> 32);
    }
}

/* Load elements [base, base + VEC) of p (type D, or t when D = 0) into g;
 * elements at or beyond n read as 0. vec: p is 16-byte aligned, so a full
 * group is one 8-byte or one to four 16-byte loads. */
template <int D>
__device__ static inline void load_raw(const unsigned char *p, int t, uint64_t base, uint64_t n,
                                       int vec, rawgrp *g)
{
    const int sz = dt_size(D ? D : t);
    if (vec && base + VEC <= n) {
        if (sz == 1) {
            uint2 a = __ldg((const uint2 *)(p + base));
            g->w[0] = a.x;
            g->w[1] = a.y;
        } else {
            const uint4 *q = (const uint4 *)(p + (size_t)sz * base);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (k < sz / 2) {
                    uint4 a = __ldg(q + k);
                    g->w[4 * k] = a.x;
                    g->w[4 * k + 1] = a.y;
                    g->w[4 * k + 2] = a.z;
                    g->w[4 * k + 3] = a.w;
                }
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++)
            set_elem(g, sz, j, base + j < n ? ld_raw(p, sz, base + j) : 0);
    }
}

/* 1 when every element of a full group is finite, checked on the raw bits
 * (0 = not known: take the checked path). Integer types are always finite. */
template <int D>
__device__ static inline int group_finite(const rawgrp *g)
{
    int ok = 1;
    switch (D) {
    case PROBE_DTYPE_BFLOAT16: {
        /* two elements per word: an exponent field of all ones (0x7F80)
         * carries into bit 15 of its half when 0x0080 is added */
        unsigned t = 0;
#pragma unroll
        for (int k = 0; k < VEC / 2; k++)
            t |= (g->w[k] & 0x7F807F80u) + 0x00800080u;
        return (t & 0x80008000u) == 0;
    }
    case PROBE_DTYPE_FLOAT16:
#pragma unroll
        for (int j = 0; j < VEC; j++)
            ok &= ((g->w[j >> 1] >> (16 * (j & 1))) & 0x7C00u) != 0x7C00u;
        return ok;
    case PROBE_DTYPE_FLOAT32:
#pragma unroll
        for (int j = 0; j < VEC; j++)
            ok &= (g->w[j] & 0x7F800000u) != 0x7F800000u;
        return ok;
    case PROBE_DTYPE_FLOAT64:
#pragma unroll
        for (int j = 0; j < VEC; j++)
            ok &= (g->w[2 * j + 1] & 0x7FF00000u) != 0x7FF00000u;
        return ok;
    default:
        return 0;
    }
}

/* Decoded elements of a group, for the kernels that are not hot. */
template <int D>
__device__ static inline void load_group(const unsigned char *p, int t, uint64_t base, uint64_t n,
                                         int vec, double *v)
{
    const int tt = D ? D : t;
    rawgrp g;
    load_raw<D>(p, t, base, n, vec, &g);
#pragma unroll
    for (int j = 0; j < VEC; j++)
        v[j] = dec(tt, get_elem(&g, dt_size(tt), j));
}

/* finite / NaN / inf from the bits (independent of compiler flags) */
__device__ static inline int is_fin(double x)
{
    return (d_bits(x) & 0x7FFFFFFFFFFFFFFFull) < 0x7FF0000000000000ull;
}

/* ---- exact integer differences, ulps, byte identity ---- */

__host__ __device__ static inline int dt_is_int(int t)
{
    return t == PROBE_DTYPE_BOOL || (t >= PROBE_DTYPE_INT8 && t <= PROBE_DTYPE_UINT64);
}

/* Both sides integer (or bool) and one of them 64-bit: d is formed exactly
 * (converting each side to double first would round values beyond 2^53). */
__host__ __device__ static inline int dt_wide_int_pair(int rt, int ct)
{
    return dt_is_int(rt) && dt_is_int(ct) && (dt_size(rt) == 8 || dt_size(ct) == 8);
}

/* An integer element (raw bits b of type t) as a 128-bit two's complement
 * number hi:lo. */
__device__ static inline void int_wide(int t, uint64_t b, long long *hi, uint64_t *lo)
{
    long long v;
    switch (t) {
    case PROBE_DTYPE_BOOL: v = (b & 0xFFu) != 0; break;
    case PROBE_DTYPE_INT8: v = (int8_t)(uint8_t)b; break;
    case PROBE_DTYPE_INT16: v = (int16_t)(uint16_t)b; break;
    case PROBE_DTYPE_INT32: v = (int32_t)(uint32_t)b; break;
    case PROBE_DTYPE_INT64: v = (long long)b; break;
    case PROBE_DTYPE_UINT64:
        *hi = 0;
        *lo = b;
        return;
    default: v = (long long)b; break; /* uint8/16/32: b holds the zero-extended value */
    }
    *hi = v < 0 ? -1 : 0;
    *lo = (uint64_t)v;
}

/* c - r of two integer elements, exact in 128 bits (|c - r| < 2^65), then
 * rounded once to the nearest double (ties to even): the value of
 * (double)((__int128)c - r) of metrics/metrics.c. */
__device__ static inline double int_diff(int rt, uint64_t rb, int ct, uint64_t cb)
{
    long long rh, ch;
    uint64_t rl, cl;
    int_wide(rt, rb, &rh, &rl);
    int_wide(ct, cb, &ch, &cl);
    uint64_t lo = cl - rl;
    long long hi = ch - rh - (cl < rl);
    int neg = hi < 0;
    if (neg) {
        lo = ~lo + 1;
        hi = ~hi + (lo == 0);
    }
    double m;
    if (hi == 0) {
        m = __ull2double_rn(lo);
    } else {
        /* 2^64 + lo: one bit shifted out, kept as a sticky bit below the
         * rounding position (bit 11 of the 64-bit significand), so that the
         * one rounding to 53 bits is that of the 65-bit value */
        m = 2.0 * __ull2double_rn((lo >> 1) | (1ull << 63) | (lo & 1u));
    }
    return neg ? -m : m;
}

/* d of one element pair: exact from the raw bits for a wide integer pair
 * (only the generic kernel can see one), else c - r in fp64. */
template <int RD, int CD>
__device__ static inline double pair_diff(int wide, int rt, uint64_t rb, int ct, uint64_t cb,
                                          double r, double c)
{
    if (RD == 0 && CD == 0 && wide)
        return int_diff(rt, rb, ct, cb);
    return c - r;
}

/* a * 2^k for -1021 <= k <= 1074 (a >= 0, a < 2^(55 - k)), rounded once as
 * ldexp rounds: the product is exact unless it is subnormal. */
__device__ static inline double mul_pow2(double a, int k)
{
    if (k > 1023) { /* then a < 2^-968: a * 2^(k - 600) is 0 or a normal double, exact */
        a = __dmul_rn(a, bits_d((uint64_t)(k - 600 + 1023) << 52));
        k = 600;
    }
    return __dmul_rn(a, bits_d((uint64_t)(k + 1023) << 52));
}

/* a = |d| in units of the spacing of a floating type of precision p and
 * smallest normal exponent emin at x (xb: the bits of x >= 0, finite):
 * a * 2^(p - 1 - max(e, emin)), 2^e <= x < 2^(e+1) (metrics/metrics.c
 * in_ulps; a subnormal or zero x has e < emin). */
__device__ static inline double in_ulps(int p, int emin, uint64_t xb, double a)
{
    int e = (int)(xb >> 52) - 1023;
    e = e < emin ? emin : e;
    return mul_pow2(a, p - 1 - e);
}

/* Elements of a group (VEC elements of one type of size sz on both sides)
 * whose bytes differ; for bool, whose truth values differ. Elements past n
 * are 0 on both sides. */
__device__ static inline unsigned group_differ(const rawgrp *a, const rawgrp *b, int sz, int is_bool)
{
    unsigned k = 0;
    if (is_bool) {
#pragma unroll
        for (int j = 0; j < VEC; j++)
            k += (get_elem(a, 1, j) != 0) != (get_elem(b, 1, j) != 0);
        return k;
    }
    switch (sz) {
    case 1:
#pragma unroll
        for (int w = 0; w < VEC / 4; w++) {
            unsigned x = a->w[w] ^ b->w[w];
            k += ((x & 0xFFu) != 0) + ((x & 0xFF00u) != 0) + ((x & 0xFF0000u) != 0) + ((x >> 24) != 0);
        }
        break;
    case 2:
#pragma unroll
        for (int w = 0; w < VEC / 2; w++) {
            unsigned x = a->w[w] ^ b->w[w];
            k += ((x & 0xFFFFu) != 0) + ((x >> 16) != 0);
        }
        break;
    case 4:
#pragma unroll
        for (int w = 0; w < VEC; w++)
            k += a->w[w] != b->w[w];
        break;
    default:
#pragma unroll
        for (int j = 0; j < VEC; j++)
            k += ((a->w[2 * j] ^ b->w[2 * j]) | (a->w[2 * j + 1] ^ b->w[2 * j + 1])) != 0;
    }
    return k;
}

/* ---- Neumaier compensated sum (as metrics/metrics.c) ---- */

typedef struct {
    double s, c;
} nsum;

__host__ __device__ static inline void nsum_add(nsum *a, double x)
{
    double t = a->s + x;
    if (fabs(a->s) >= fabs(x))
        a->c += (a->s - t) + x;
    else
        a->c += (x - t) + a->s;
    a->s = t;
}

__host__ __device__ static inline void nsum_merge(nsum *a, const nsum *b)
{
    nsum_add(a, b->s);
    a->c += b->c;
}

__host__ __device__ static inline double nsum_get(const nsum *a)
{
    return (a->s - a->s == 0.0) ? a->s + a->c : a->s; /* inf/NaN: the running sum */
}

/* ---- block reductions (fixed order: the same bits every run) ---- */

__device__ static inline double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* Sum over the block; the result is valid in thread 0. sh: THREADS/32 doubles. */
__device__ static double block_sum(double v, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int i = 0; i < THREADS / 32; i++)
            t += sh[i];
    return t;
}

__device__ static unsigned long long block_sum_u(unsigned long long v, unsigned long long *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    unsigned long long t = 0;
    if (threadIdx.x == 0)
        for (int i = 0; i < THREADS / 32; i++)
            t += sh[i];
    return t;
}

/* (value, offset) max: larger value, then smaller offset. Values are >= 0 or
 * -1 (none). */
__device__ static inline void vo_max(double *v, uint64_t *o, double v2, uint64_t o2)
{
    if (v2 > *v || (v2 == *v && o2 < *o)) {
        *v = v2;
        *o = o2;
    }
}

__device__ static void block_max_off(double *v, uint64_t *o, double *shv, uint64_t *sho)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int s = 16; s > 0; s >>= 1) {
        double v2 = __shfl_down_sync(0xFFFFFFFFu, *v, s);
        uint64_t o2 = __shfl_down_sync(0xFFFFFFFFu, *o, s);
        vo_max(v, o, v2, o2);
    }
    __syncthreads();
    if (lane == 0) {
        shv[w] = *v;
        sho[w] = *o;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < THREADS / 32; i++)
            vo_max(v, o, shv[i], sho[i]);
}

__device__ static double block_max(double v, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int s = 16; s > 0; s >>= 1)
        v = fmax(v, __shfl_down_sync(0xFFFFFFFFu, v, s));
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < THREADS / 32; i++)
            v = fmax(v, sh[i]);
    return v;
}

/* ---- the fused pass ---- */

enum {
    C_NF, C_NAN_R, C_NAN_C, C_INF_R, C_INF_C, C_MIS, C_INF_MIS, C_NAN_R_ONLY, C_DIFFER, C_ZERO,
    C_COUNT
};
/* The sums of metrics/metrics.c over the finite indices: r^2, c^2, d^2, r c,
 * |d| and the gain sums d r, r^2 d^2, r^3 d, r^4; then the block's maxima. */
enum { P_RR, P_CC, P_DD, P_RC, P_AD, P_DR, P_R2D2, P_R3D, P_R4, NSUMS };
enum { P_AMAX_R = NSUMS, P_AMAX_C, P_MAXD, P_ULPS, P_COUNT };

typedef struct {
    double *part;                  /* [blocks][P_COUNT] */
    unsigned long long *part_off;  /* [blocks] offset of the block's max |d| */
    unsigned long long *counts;    /* [C_COUNT] */
    unsigned long long *hist;      /* [L0BINS]: the p99's first level, the nonzero keys
                                      bits(|d|) by hist0_bin (added to); NULL: not kept */
} fused_out;

/* The fused kernel's block reduction: this block's sums, maxima (with the
 * offset of its max |d|) into o.part / o.part_off, its counts added into
 * o.counts. Every thread of the block calls it. */
__device__ __forceinline__ void fused_block_result(const double *sums, double amax_r, double amax_c,
                                                   double ulps, double maxd, uint64_t maxoff,
                                                   const unsigned *cnt, fused_out o, double *shd,
                                                   uint64_t *sho, unsigned long long *shu)
{
    double *P = o.part + (size_t)blockIdx.x * P_COUNT;
    double v;
#pragma unroll
    for (int i = 0; i < NSUMS; i++) {
        v = block_sum(sums[i], shd);
        if (threadIdx.x == 0)
            P[i] = v;
    }
    v = block_max(amax_r, shd); if (threadIdx.x == 0) P[P_AMAX_R] = v;
    v = block_max(amax_c, shd); if (threadIdx.x == 0) P[P_AMAX_C] = v;
    v = block_max(ulps, shd); if (threadIdx.x == 0) P[P_ULPS] = v;
    block_max_off(&maxd, &maxoff, shd, sho);
    if (threadIdx.x == 0) {
        P[P_MAXD] = maxd;
        o.part_off[blockIdx.x] = maxoff;
    }
    for (int i = 0; i < C_COUNT; i++) {
        unsigned long long t = block_sum_u(cnt[i], shu);
        if (threadIdx.x == 0 && t)
            atomicAdd(&o.counts[i], t);
    }
}

/* One element not finite on both sides: its NaN/infinity counts, and a
 * mismatch unless both hold the same value (or both a NaN). */
__device__ __forceinline__ void count_nonfinite(double r, double c, uint64_t rb, uint64_t cb,
                                                unsigned *cnt)
{
    int rn = rb > INF_BITS, cn = cb > INF_BITS, ri = rb == INF_BITS, ci = cb == INF_BITS;
    cnt[C_NAN_R] += rn;
    cnt[C_NAN_C] += cn;
    cnt[C_NAN_R_ONLY] += rn && !cn;
    cnt[C_INF_R] += ri;
    cnt[C_INF_C] += ci;
    if (!(r == c || (rn && cn))) {
        cnt[C_MIS]++;
        cnt[C_INF_MIS] += (ri || ci);
    }
}

/* Shared level-0 histogram: L0BINS bins, then one spare bin per lane of a
 * warp (HIST0_SPARE), never flushed. */
#define HIST0_SPARE 32
#define HIST0_SHARED (L0BINS + HIST0_SPARE)

/* The level-0 bin of a nonzero |d| = ad: 2p for the value p * 2^51 itself
 * (the bits below the 12-bit prefix p all zero: 2^e or 1.5 * 2^e, the
 * smallest key under p), 2p + 1 for the rest of p. Bins in this order are
 * the keys in order, and a rank that falls in an even bin has that value
 * without a further pass (p99_select). */
__device__ __forceinline__ unsigned hist0_bin(double ad)
{
    unsigned hi = (unsigned)__double2hiint(ad), lo = (unsigned)__double2loint(ad);
    unsigned below = (hi & ((1u << (LEVEL0_SHIFT - 32)) - 1u)) | lo;
    return ((hi >> (LEVEL0_SHIFT - 32)) << 1) | (below != 0u);
}

/* Blocks of THREADS per SM the fused kernel is compiled for: 3 for the
 * pairs of 2-byte floats (at most 80 registers; ptxas spills 4 bytes there,
 * and on the H200 this ran faster than 2 blocks or no bound), else 0: no
 * bound (other pairs would spill more at 80). */
#ifndef PROBE_CUDA_FUSED_MIN_BLOCKS
#define PROBE_CUDA_FUSED_MIN_BLOCKS 3
#endif
#define FUSED_MIN_BLOCKS(RD, CD)                                                                   \
    (((RD) == PROBE_DTYPE_BFLOAT16 && (CD) == PROBE_DTYPE_BFLOAT16) ||                             \
             ((RD) == PROBE_DTYPE_FLOAT16 && (CD) == PROBE_DTYPE_FLOAT16)                          \
         ? PROBE_CUDA_FUSED_MIN_BLOCKS                                                             \
         : 0)

/* ulp_p, ulp_emin: precision and smallest normal exponent of the coarser
 * floating type of the pair (probe_dtype_precision), ulp_p 0 when a side is
 * not floating (no ulps). */
template <int RD, int CD>
__global__ void __launch_bounds__(THREADS, FUSED_MIN_BLOCKS(RD, CD))
fused_kernel(const unsigned char *ref, int rdt, const unsigned char *cand, int cdt, uint64_t n,
             int vec, double atol, double rtol, int ulp_p, int ulp_emin, fused_out o)
{
    __shared__ double shd[THREADS / 32];
    __shared__ uint64_t sho[THREADS / 32];
    __shared__ unsigned long long shu[THREADS / 32];
    __shared__ unsigned shh[HIST0_SHARED];
    const int keep_hist = o.hist != NULL;
    if (keep_hist) {
        for (int i = threadIdx.x; i < HIST0_SHARED; i += THREADS)
            shh[i] = 0;
        __syncthreads();
    }

    double s_rr = 0, s_cc = 0, s_dd = 0, s_rc = 0, s_ad = 0;
    double s_dr = 0, s_r2d2 = 0, s_r3d = 0, s_r4 = 0;
    /* max |r|, max |c| on the bit patterns (|x| orders like its bits);
     * maxd: max |d|, -1 = no finite index yet, maxpos: its first position in
     * the block's tile (32 bits; the flat offset is formed at the block
     * reduction); umax: the mismatches' largest |d| in ulps, -1 = none.
     * fast16: a pair of one 2-byte float type, whose full finite groups take
     * the 16-bit path below; amax16: its largest magnitude (the 15 low bits
     * of an element, which order like |x|) */
    uint64_t amax_rb = 0, amax_cb = 0;
    double maxd = -1.0, umax = -1.0;
    unsigned maxpos = 0;
    const int fast16 = RD == CD && (RD == PROBE_DTYPE_BFLOAT16 || RD == PROBE_DTYPE_FLOAT16);
    unsigned amax16 = 0;
    unsigned cnt[C_COUNT];
    for (int i = 0; i < C_COUNT; i++)
        cnt[i] = 0;
    const int rt = RD ? RD : rdt, ct = CD ? CD : cdt;
    const int rsz = dt_size(rt), csz = dt_size(ct);
    /* the specialised pairs are floating types of one size per side */
    const int do_ulps = (RD && CD) ? 1 : ulp_p != 0;
    /* max |r| and max |c| decide the power-of-two rescale, which only
     * float64 values can need (every other type's nonzero magnitudes and
     * their differences lie in [2^-149, 2^129], 64-bit integers' below
     * 2^65); without a float64 side only max(max |r|, max |c|) is needed
     * (the tensor's scale for max_abs in ulps), kept in amax_rb and given
     * for both */
    const int split_amax = rt == PROBE_DTYPE_FLOAT64 || ct == PROBE_DTYPE_FLOAT64;
    const int wide = (RD == 0 && CD == 0) && dt_wide_int_pair(rt, ct);
    /* bytes are compared only between sides of one element type */
    const int same = (RD && CD) ? RD == CD : rt == ct;
    const int is_bool = rt == PROBE_DTYPE_BOOL;

    /* each thread: groups of VEC elements THREADS*VEC apart; the next group's
     * loads are issued before the current group is computed */
    const uint64_t tile0 = (uint64_t)blockIdx.x * TILE;
    unsigned pos = threadIdx.x * VEC; /* in-tile position of the group */
    uint64_t base = tile0 + pos;
    rawgrp gr, gc;
    if (base < n) {
        load_raw<RD>(ref, rdt, base, n, vec, &gr);
        load_raw<CD>(cand, cdt, base, n, vec, &gc);
    }
    /* one element finite on both sides (no fused multiply-add in the
     * tolerance: the same rounding as the CPU). The sums take each last
     * product in a fused multiply-add, written out whatever the compiler
     * contracts: equal operands give equal sums, so c = r gives a cosine of
     * exactly 1 and c = 2r (d = r) a gain of exactly 1 with a residual sum of
     * exactly 0. The histogram of |d| for the p99 is the p99 pass's own first
     * pass (p99_select). */
#define FINITE_SUMS(r, c, d, ad)                                                                   \
    do {                                                                                           \
        double rr = r * r;                                                                         \
        s_rr = fma(r, r, s_rr);                                                                    \
        s_cc = fma(c, c, s_cc);                                                                    \
        s_dd = fma(d, d, s_dd);                                                                    \
        s_rc = fma(r, c, s_rc);                                                                    \
        s_ad += ad;                                                                                \
        s_dr = fma(d, r, s_dr);                                                                    \
        s_r2d2 = fma(rr, d * d, s_r2d2);                                                           \
        s_r3d = fma(rr, r * d, s_r3d);                                                             \
        s_r4 = fma(rr, rr, s_r4);                                                                  \
        cnt[C_ZERO] += ad == 0.0;                                                                  \
        if (keep_hist)                                                                             \
            /* every element adds 1 (no predicate): a zero |d| to its lane's spare */              \
            atomicAdd(&shh[ad != 0.0 ? hist0_bin(ad) : L0BINS + (threadIdx.x & 31)], 1u);          \
    } while (0)
/* max |d| and its first position p */
#define ELEM_MAXD(ad, p)                                                                           \
    do {                                                                                           \
        if (ad > maxd) {                                                                           \
            maxd = ad;                                                                             \
            maxpos = p;                                                                            \
        }                                                                                          \
    } while (0)
#define FINITE_ELEM(r, c, d, rb, cb, p)                                                            \
    do {                                                                                           \
        double ad = fabs(d);                                                                       \
        ELEM_MAXD(ad, p);                                                                          \
        int mis = ad > __dadd_rn(atol, __dmul_rn(rtol, fabs(r)));                                  \
        cnt[C_MIS] += mis;                                                                         \
        if (split_amax) {                                                                          \
            amax_rb = rb > amax_rb ? rb : amax_rb;                                                 \
            amax_cb = cb > amax_cb ? cb : amax_cb;                                                 \
        }                                                                                          \
        if (do_ulps) {                                                                             \
            uint64_t xb = rb > cb ? rb : cb;                                                       \
            if (!split_amax)                                                                       \
                amax_rb = xb > amax_rb ? xb : amax_rb;                                             \
            if (mis)                                                                               \
                umax = fmax(umax, in_ulps(ulp_p, ulp_emin, xb, ad));                               \
        }                                                                                          \
        FINITE_SUMS(r, c, d, ad);                                                                  \
    } while (0)
    /* The same for an element of a fast16 pair, from its 16 bits rw, cw: the
     * magnitude max(|r|, |c|) and its exponent come from the bits (MB mantissa
     * bits, bias BIAS), and |d| in ulps is |d| * 2^k with k = p - 1 -
     * max(e, emin) added to the exponent field of |d|: a mismatching |d| is
     * at least the type's smallest subnormal (2^-133, 2^-24) and at most
     * 2^9 ulps, so both |d| and the result are normal doubles and the product
     * is exact, the value of in_ulps. */
#define FAST16_ELEM(rw, cw, p)                                                                     \
    do {                                                                                           \
        const int MB = RD == PROBE_DTYPE_BFLOAT16 ? 7 : 10;                                        \
        const int BIAS = RD == PROBE_DTYPE_BFLOAT16 ? 127 : 15;                                    \
        double r = dec16<RD>(rw), c = dec16<RD>(cw);                                               \
        double d = c - r, ad = fabs(d);                                                            \
        ELEM_MAXD(ad, p);                                                                          \
        int mis = ad > __dadd_rn(atol, __dmul_rn(rtol, fabs(r)));                                  \
        cnt[C_MIS] += mis;                                                                         \
        unsigned xm = max((rw) & 0x7FFFu, (cw) & 0x7FFFu);                                         \
        amax16 = max(amax16, xm);                                                                  \
        int k = MB + BIAS - max((int)(xm >> MB), 1);                                               \
        double u = __hiloint2double(__double2hiint(ad) + (k << 20), __double2loint(ad));           \
        umax = fmax(umax, mis ? u : -1.0);                                                         \
        FINITE_SUMS(r, c, d, ad);                                                                  \
    } while (0)

#pragma unroll 1
    for (int g = 0; g < GROUPS; g++) {
        if (base >= n)
            break;
        uint64_t nb = base + (uint64_t)THREADS * VEC;
        rawgrp nr = gr, nc = gc;
        if (g + 1 < GROUPS && nb < n) {
            load_raw<RD>(ref, rdt, nb, n, vec, &nr);
            load_raw<CD>(cand, cdt, nb, n, vec, &nc);
        }
        if (same)
            cnt[C_DIFFER] += group_differ(&gr, &gc, rsz, is_bool);
        if (base + VEC <= n && group_finite<RD>(&gr) && group_finite<CD>(&gc)) {
            /* the common case: a full group, every element finite */
            cnt[C_NF] += VEC;
            if (fast16) {
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    unsigned rw = (gr.w[j >> 1] >> (16 * (j & 1))) & 0xFFFFu;
                    unsigned cw = (gc.w[j >> 1] >> (16 * (j & 1))) & 0xFFFFu;
                    FAST16_ELEM(rw, cw, pos + j);
                }
            } else {
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    uint64_t rw = get_elem(&gr, rsz, j), cw = get_elem(&gc, csz, j);
                    double r = dec(rt, rw), c = dec(ct, cw);
                    double d = pair_diff<RD, CD>(wide, rt, rw, ct, cw, r, c);
                    uint64_t rb = d_bits(r) & ABS_MASK, cb = d_bits(c) & ABS_MASK;
                    FINITE_ELEM(r, c, d, rb, cb, pos + j);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                if (base + j >= n)
                    break;
                uint64_t rw = get_elem(&gr, rsz, j), cw = get_elem(&gc, csz, j);
                double r = dec(rt, rw), c = dec(ct, cw);
                uint64_t rb = d_bits(r) & ABS_MASK, cb = d_bits(c) & ABS_MASK;
                if (rb < INF_BITS && cb < INF_BITS) {
                    cnt[C_NF]++;
                    double d = pair_diff<RD, CD>(wide, rt, rw, ct, cw, r, c);
                    FINITE_ELEM(r, c, d, rb, cb, pos + j);
                } else {
                    count_nonfinite(r, c, rb, cb, cnt);
                }
            }
        }
        gr = nr;
        gc = nc;
        base = nb;
        pos += THREADS * VEC;
    }
#undef FINITE_ELEM
#undef FAST16_ELEM
#undef ELEM_MAXD
#undef FINITE_SUMS
    if (fast16) {
        uint64_t b16 = d_bits(dec16<RD>(amax16));
        amax_rb = b16 > amax_rb ? b16 : amax_rb;
    }
    const double sums[NSUMS] = {s_rr, s_cc, s_dd, s_rc, s_ad, s_dr, s_r2d2, s_r3d, s_r4};
    fused_block_result(sums, bits_d(amax_rb), bits_d(split_amax ? amax_cb : amax_rb), umax, maxd,
                       tile0 + maxpos, cnt, o, shd, sho, shu);
    if (keep_hist) {
        __syncthreads();
        for (int i = threadIdx.x; i < L0BINS; i += THREADS)
            if (shh[i])
                atomicAdd(&o.hist[i], (unsigned long long)shh[i]);
    }
}

/* The sums again on r*2^kr, c*2^kc, d*2^kd (metrics/metrics.c: the range of
 * float64 inputs). Only a pair with a float64 side gets here, never an
 * integer pair: d = c - r. */
__global__ void __launch_bounds__(THREADS)
scaled_kernel(const unsigned char *ref, int rdt, const unsigned char *cand, int cdt, uint64_t n,
              int kr, int kc, int kd, int d_overflow, double *part)
{
    __shared__ double shd[THREADS / 32];
    double s[NSUMS];
    for (int i = 0; i < NSUMS; i++)
        s[i] = 0.0;
    const uint64_t tile = (uint64_t)blockIdx.x * TILE;
    for (int g = 0; g < GROUPS; g++) {
        uint64_t base = tile + ((uint64_t)g * THREADS + threadIdx.x) * VEC;
        if (base >= n)
            break;
        double rv[VEC], cv[VEC];
        load_group<0>(ref, rdt, base, n, 0, rv);
        load_group<0>(cand, cdt, base, n, 0, cv);
        for (int j = 0; j < VEC && base + j < n; j++) {
            double r = rv[j], c = cv[j];
            if (!(is_fin(r) && is_fin(c)))
                continue;
            double rs = scalbn(r, kr), cs = scalbn(c, kc);
            double ds = d_overflow ? scalbn(c, kd) - scalbn(r, kd) : scalbn(c - r, kd);
            double rr = rs * rs;
            s[P_RR] = fma(rs, rs, s[P_RR]);
            s[P_CC] = fma(cs, cs, s[P_CC]);
            s[P_DD] = fma(ds, ds, s[P_DD]);
            s[P_RC] = fma(rs, cs, s[P_RC]);
            s[P_AD] += fabs(ds);
            s[P_DR] = fma(ds, rs, s[P_DR]);
            s[P_R2D2] = fma(rr, ds * ds, s[P_R2D2]);
            s[P_R3D] = fma(rr, rs * ds, s[P_R3D]);
            s[P_R4] = fma(rr, rr, s[P_R4]);
        }
    }
    double *P = part + (size_t)blockIdx.x * P_COUNT;
#pragma unroll
    for (int i = 0; i < NSUMS; i++) {
        double v = block_sum(s[i], shd);
        if (threadIdx.x == 0)
            P[i] = v;
    }
}

/* One block combines the block partials in a fixed order: thread t takes
 * blocks t, t + RED_THREADS, ... (Neumaier), then a fixed tree. res: the
 * NSUMS sums, max |r|, max |c|, max |d| (res_off: its offset), the largest
 * mismatch in ulps (< 0: none). */
typedef struct {
    double sum[NSUMS];
    double amax_r, amax_c, maxd, ulps;
    unsigned long long maxoff;
} fused_res;

__global__ void __launch_bounds__(RED_THREADS)
reduce_kernel(const double *part, const unsigned long long *part_off, unsigned nblocks,
              fused_res *res)
{
    __shared__ nsum sh_s[NSUMS][RED_THREADS];
    __shared__ double sh_m[4][RED_THREADS];
    __shared__ unsigned long long sh_o[RED_THREADS];
    nsum s[NSUMS];
    for (int i = 0; i < NSUMS; i++)
        s[i].s = s[i].c = 0.0;
    double ar = 0, ac = 0, md = -1.0, mu = -1.0;
    uint64_t mo = 0;
    for (unsigned b = threadIdx.x; b < nblocks; b += RED_THREADS) {
        const double *P = part + (size_t)b * P_COUNT;
        for (int i = 0; i < NSUMS; i++)
            nsum_add(&s[i], P[i]);
        ar = fmax(ar, P[P_AMAX_R]);
        ac = fmax(ac, P[P_AMAX_C]);
        mu = fmax(mu, P[P_ULPS]);
        vo_max(&md, &mo, P[P_MAXD], part_off[b]);
    }
    int t = threadIdx.x;
    for (int i = 0; i < NSUMS; i++)
        sh_s[i][t] = s[i];
    sh_m[0][t] = ar;
    sh_m[1][t] = ac;
    sh_m[2][t] = md;
    sh_m[3][t] = mu;
    sh_o[t] = mo;
    __syncthreads();
    for (int stride = RED_THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) {
            for (int i = 0; i < NSUMS; i++)
                nsum_merge(&sh_s[i][t], &sh_s[i][t + stride]);
            sh_m[0][t] = fmax(sh_m[0][t], sh_m[0][t + stride]);
            sh_m[1][t] = fmax(sh_m[1][t], sh_m[1][t + stride]);
            sh_m[3][t] = fmax(sh_m[3][t], sh_m[3][t + stride]);
            double v = sh_m[2][t];
            uint64_t off = sh_o[t];
            vo_max(&v, &off, sh_m[2][t + stride], sh_o[t + stride]);
            sh_m[2][t] = v;
            sh_o[t] = off;
        }
        __syncthreads();
    }
    if (t == 0) {
        for (int i = 0; i < NSUMS; i++)
            res->sum[i] = nsum_get(&sh_s[i][0]);
        res->amax_r = sh_m[0][0];
        res->amax_c = sh_m[1][0];
        res->maxd = sh_m[2][0];
        res->ulps = sh_m[3][0];
        res->maxoff = sh_o[0];
    }
}

/* ---- p99: passes under a prefix of the |d| bit pattern ---- */

enum { MODE_HIST = 0, MODE_COLLECT = 1 };

/* The p99's levels after the first (which the fused pass histograms): the
 * elements with finite r and c whose key = bits(|c - r|) has key >> shift ==
 * prefix. MODE_HIST histograms the next `width` (<= TBITS) bits into hist[]
 * and, per bin, into track[] the min and max of the top 32 of the bits below
 * the bin and the OR and AND of the rest (every key of a bin is equal when
 * min == max and OR == AND); MODE_COLLECT appends the keys to buf (counter
 * *cnt; at most COLLECT_MAX are stored). */
template <int RD, int CD>
__global__ void __launch_bounds__(THREADS)
select_kernel(const unsigned char *ref, int rdt, const unsigned char *cand, int cdt, uint64_t n,
              int vec, uint64_t prefix, int shift, int width, int mode, unsigned long long *hist,
              unsigned *track, unsigned long long *buf, unsigned long long *cnt)
{
    __shared__ unsigned int sh[TBINS];
    __shared__ unsigned int sht[4][TBINS];
    if (mode == MODE_HIST) {
        for (int i = threadIdx.x; i < TBINS; i += THREADS) {
            sh[i] = 0;
            sht[0][i] = ~0u;
            sht[1][i] = 0;
            sht[2][i] = 0;
            sht[3][i] = ~0u;
        }
        __syncthreads();
    }
    const int dshift = shift - width;
    const uint64_t dmask = ((uint64_t)1 << width) - 1;
    const int lowbits = dshift > 32 ? dshift - 32 : 0;
    const int rt = RD ? RD : rdt, ct = CD ? CD : cdt;
    const int rsz = dt_size(rt), csz = dt_size(ct);
    const int wide = (RD == 0 && CD == 0) && dt_wide_int_pair(rt, ct);
    uint64_t base = (uint64_t)blockIdx.x * TILE + (uint64_t)threadIdx.x * VEC;
    rawgrp gr, gc;
    if (base < n) {
        load_raw<RD>(ref, rdt, base, n, vec, &gr);
        load_raw<CD>(cand, cdt, base, n, vec, &gc);
    }
#pragma unroll 1
    for (int g = 0; g < GROUPS; g++) {
        if (base >= n)
            break;
        uint64_t nb = base + (uint64_t)THREADS * VEC;
        rawgrp nr = gr, nc = gc;
        if (g + 1 < GROUPS && nb < n) {
            load_raw<RD>(ref, rdt, nb, n, vec, &nr);
            load_raw<CD>(cand, cdt, nb, n, vec, &nc);
        }
        /* one element finite on both sides, d = c - r */
#define SELECT_ELEM(d)                                                                             \
    do {                                                                                           \
        uint64_t key = d_bits(d) & ABS_MASK;                                                       \
        if ((key >> shift) == prefix) {                                                            \
            if (mode == MODE_HIST) {                                                               \
                unsigned bin = (unsigned)((key >> dshift) & dmask);                                \
                uint64_t rest = key & (((uint64_t)1 << dshift) - 1);                               \
                unsigned top = (unsigned)(rest >> lowbits);                                        \
                unsigned low = (unsigned)(rest & ((1ull << lowbits) - 1));                         \
                atomicAdd(&sh[bin], 1u);                                                           \
                atomicMin(&sht[0][bin], top);                                                      \
                atomicMax(&sht[1][bin], top);                                                      \
                atomicOr(&sht[2][bin], low);                                                       \
                atomicAnd(&sht[3][bin], low);                                                      \
            } else {                                                                               \
                unsigned long long at = atomicAdd(cnt, 1ull);                                      \
                if (at < COLLECT_MAX)                                                              \
                    buf[at] = key;                                                                 \
            }                                                                                      \
        }                                                                                          \
    } while (0)
        if (base + VEC <= n && group_finite<RD>(&gr) && group_finite<CD>(&gc)) {
            /* a full group finite on both sides: no per-element tests */
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                uint64_t rw = get_elem(&gr, rsz, j), cw = get_elem(&gc, csz, j);
                double r = dec(rt, rw), c = dec(ct, cw);
                double d = pair_diff<RD, CD>(wide, rt, rw, ct, cw, r, c);
                SELECT_ELEM(d);
            }
        } else {
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                if (base + j >= n)
                    break;
                uint64_t rw = get_elem(&gr, rsz, j), cw = get_elem(&gc, csz, j);
                double r = dec(rt, rw), c = dec(ct, cw);
                if ((d_bits(r) & ABS_MASK) < INF_BITS && (d_bits(c) & ABS_MASK) < INF_BITS) {
                    double d = pair_diff<RD, CD>(wide, rt, rw, ct, cw, r, c);
                    SELECT_ELEM(d);
                }
            }
        }
#undef SELECT_ELEM
        gr = nr;
        gc = nc;
        base = nb;
    }
    if (mode != MODE_HIST)
        return;
    __syncthreads();
    for (int i = threadIdx.x; i < TBINS; i += THREADS)
        if (sh[i]) {
            atomicAdd(&hist[i], (unsigned long long)sh[i]);
            {
                atomicMin(&track[i], sht[0][i]);
                atomicMax(&track[TBINS + i], sht[1][i]);
                atomicOr(&track[2 * TBINS + i], sht[2][i]);
                atomicAnd(&track[3 * TBINS + i], sht[3][i]);
            }
        }
}

/* ---- per-channel mean shift ---- */

/* The partial of one segment of one channel over its finite indices: the
 * count, mean and M2 of r and of d, and the compensated sum of d (the shift
 * is sum d / n, as metrics/metrics.c); made from a thread's shifted sums
 * (acc_part) and combined with Chan's formula (chan_merge). */
typedef struct {
    double n, mean, m2, mean_d, m2_d;
    nsum sd;
} chan_part;

__host__ __device__ static inline void chan_merge(chan_part *a, const chan_part *b)
{
    if (b->n == 0.0)
        return;
    if (a->n == 0.0) {
        *a = *b;
        return;
    }
    double n = a->n + b->n, delta = b->mean - a->mean, dd = b->mean_d - a->mean_d;
    double w = a->n * b->n / n;
    a->mean += delta * (b->n / n);
    a->m2 += b->m2 + delta * delta * w;
    a->mean_d += dd * (b->n / n);
    a->m2_d += b->m2_d + dd * dd * w;
    a->n = n;
    nsum_merge(&a->sd, &b->sd);
}

/* One thread's share of a segment: shifted sums about a pivot (pr, pd), the
 * thread's first element when it is finite on both sides, else 0 (the
 * "shifted data" algorithm of Chan, Golub, LeVeque 1983, whose error is small
 * when the pivot is near the mean): the count, sum and sum of squares of
 * r - pr and d - pd, and the plain sum of d (at most CH_SEG / 32 or CH_J
 * terms). */
typedef struct {
    unsigned n;
    double pr, pd, s1r, s2r, s1d, s2d, sd;
} chan_acc;

/* 1 when element bits w of type t (RD or CD: t is known at compile time, else
 * decoded) hold a finite value. */
template <int D>
__device__ static inline int elem_finite(int t, uint64_t w)
{
    switch (D) {
    case PROBE_DTYPE_BFLOAT16: return (w & 0x7F80u) != 0x7F80u;
    case PROBE_DTYPE_FLOAT16: return (w & 0x7C00u) != 0x7C00u;
    case PROBE_DTYPE_FLOAT32: return (w & 0x7F800000u) != 0x7F800000u;
    case PROBE_DTYPE_FLOAT64: return (w & INF_BITS) != INF_BITS;
    default: return is_fin(dec(t, w));
    }
}

/* The pivot of a: element i of the pair when it is finite on both sides. */
template <int RD, int CD>
__device__ static inline void acc_pivot(chan_acc *a, const unsigned char *ref, int rdt,
                                        const unsigned char *cand, int cdt, int wide, uint64_t i)
{
    const int rt = RD ? RD : rdt, ct = CD ? CD : cdt;
    uint64_t rw = ld_raw(ref, dt_size(rt), i), cw = ld_raw(cand, dt_size(ct), i);
    if (elem_finite<RD>(rt, rw) && elem_finite<CD>(ct, cw)) {
        double r = dec(rt, rw), c = dec(ct, cw);
        a->pr = r;
        a->pd = pair_diff<RD, CD>(wide, rt, rw, ct, cw, r, c);
    }
}

__device__ static inline void acc_add(chan_acc *a, double r, double d)
{
    double x = r - a->pr, y = d - a->pd;
    a->n++;
    a->s1r += x;
    a->s2r = fma(x, x, a->s2r);
    a->s1d += y;
    a->s2d = fma(y, y, a->s2d);
    a->sd += d;
}

/* The accumulator as a partial: mean = pivot + S1 / n, M2 = S2 - S1^2 / n
 * (not below 0). */
__device__ static inline chan_part acc_part(const chan_acc *a)
{
    chan_part p = {0, 0, 0, 0, 0, {0, 0}};
    if (a->n == 0)
        return p;
    double n = (double)a->n, mr = a->s1r / n, md = a->s1d / n;
    p.n = n;
    p.mean = a->pr + mr;
    p.m2 = fmax(0.0, a->s2r - a->s1r * mr);
    p.mean_d = a->pd + md;
    p.m2_d = fmax(0.0, a->s2d - a->s1d * md);
    p.sd.s = a->sd;
    return p;
}

/* Elements [0, m) of a loaded group pair into a: those finite on both sides. */
template <int RD, int CD>
__device__ static inline void acc_group(chan_acc *a, const rawgrp *gr, int rdt, const rawgrp *gc,
                                        int cdt, int wide, int m)
{
    const int rt = RD ? RD : rdt, ct = CD ? CD : cdt;
    const int rsz = dt_size(rt), csz = dt_size(ct);
    if (m == VEC && group_finite<RD>(gr) && group_finite<CD>(gc)) {
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            uint64_t rw = get_elem(gr, rsz, j), cw = get_elem(gc, csz, j);
            double r = dec(rt, rw), c = dec(ct, cw);
            acc_add(a, r, pair_diff<RD, CD>(wide, rt, rw, ct, cw, r, c));
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        if (j >= m)
            break;
        uint64_t rw = get_elem(gr, rsz, j), cw = get_elem(gc, csz, j);
        if (elem_finite<RD>(rt, rw) && elem_finite<CD>(ct, cw)) {
            double r = dec(rt, rw), c = dec(ct, cw);
            acc_add(a, r, pair_diff<RD, CD>(wide, rt, rw, ct, cw, r, c));
        }
    }
}

/* Row segments: the tensor as [outer][count][inner]; row (o, k) is cut into
 * nseg pieces of seg elements, and one warp takes piece s of the rows (o, k)
 * for o in [ob * R, ob * R + R) (R rows of one channel, so that a warp has
 * enough elements when rows are short), each lane taking groups of VEC
 * consecutive elements 32 * VEC apart (vector loads when vec and the piece
 * starts on a multiple of VEC), then a fixed shuffle tree.
 * part[(ob * count + k) * nseg + s]. */
template <int RD, int CD>
__global__ void __launch_bounds__(THREADS)
chan_rows_kernel(const unsigned char *ref, int rdt, const unsigned char *cand, int cdt, int wide,
                 uint64_t outer, uint64_t count, uint64_t inner, uint64_t R, uint64_t seg,
                 uint64_t nseg, int vec, chan_part *part)
{
    uint64_t wid = ((uint64_t)blockIdx.x * THREADS + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    uint64_t nob = (outer + R - 1) / R;
    if (wid >= nob * count * nseg)
        return;
    uint64_t s = wid % nseg, t = wid / nseg, k = t % count, ob = t / count;
    uint64_t o1 = (ob + 1) * R < outer ? (ob + 1) * R : outer;
    uint64_t off = s * seg, len = (s + 1) * seg < inner ? seg : inner - s * seg;
    chan_acc acc = {0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t first = (ob * R * count + k) * inner + off;
    if ((uint64_t)lane * VEC < len)
        acc_pivot<RD, CD>(&acc, ref, rdt, cand, cdt, wide, first + (uint64_t)lane * VEC);
    for (uint64_t o = ob * R; o < o1; o++) {
        uint64_t lo = (o * count + k) * inner + off, hi = lo + len;
        int v = vec && lo % VEC == 0;
        for (uint64_t i = lo + (uint64_t)lane * VEC; i < hi; i += 32 * VEC) {
            rawgrp gr, gc;
            load_raw<RD>(ref, rdt, i, hi, v, &gr);
            load_raw<CD>(cand, cdt, i, hi, v, &gc);
            acc_group<RD, CD>(&acc, &gr, rdt, &gc, cdt, wide, hi - i < VEC ? (int)(hi - i) : VEC);
        }
    }
    chan_part a = acc_part(&acc);
    for (int o = 16; o > 0; o >>= 1) {
        chan_part b;
        b.n = __shfl_down_sync(0xFFFFFFFFu, a.n, o);
        b.mean = __shfl_down_sync(0xFFFFFFFFu, a.mean, o);
        b.m2 = __shfl_down_sync(0xFFFFFFFFu, a.m2, o);
        b.mean_d = __shfl_down_sync(0xFFFFFFFFu, a.mean_d, o);
        b.m2_d = __shfl_down_sync(0xFFFFFFFFu, a.m2_d, o);
        b.sd.s = __shfl_down_sync(0xFFFFFFFFu, a.sd.s, o);
        b.sd.c = __shfl_down_sync(0xFFFFFFFFu, a.sd.c, o);
        if (lane < o)
            chan_merge(&a, &b);
    }
    if (lane == 0)
        part[wid] = a;
}

/* Column runs: the tensor as [outer][C] (C = count * inner); thread
 * (p, col) takes rows p*J .. p*J + J - 1 of column col. part[p * C + col]. */
template <int RD, int CD>
__global__ void __launch_bounds__(THREADS)
chan_cols_kernel(const unsigned char *ref, int rdt, const unsigned char *cand, int cdt, int wide,
                 uint64_t outer, uint64_t C, uint64_t J, uint64_t P, chan_part *part)
{
    uint64_t id = (uint64_t)blockIdx.x * THREADS + threadIdx.x;
    if (id >= P * C)
        return;
    uint64_t p = id / C, col = id % C;
    uint64_t j1 = (p + 1) * J < outer ? (p + 1) * J : outer;
    const int rt = RD ? RD : rdt, ct = CD ? CD : cdt;
    const int rsz = dt_size(rt), csz = dt_size(ct);
    chan_acc acc = {0, 0, 0, 0, 0, 0, 0, 0};
    if (p * J < j1)
        acc_pivot<RD, CD>(&acc, ref, rdt, cand, cdt, wide, p * J * C + col);
    /* CH_U rows at a time: their loads are issued before any is used */
    uint64_t j = p * J, i = p * J * C + col;
    for (; j < j1; j += CH_U, i += CH_U * C) {
        uint64_t rw[CH_U], cw[CH_U];
#pragma unroll
        for (int u = 0; u < CH_U; u++) {
            int in = j + u < j1;
            rw[u] = in ? ld_raw(ref, rsz, i + u * C) : 0;
            cw[u] = in ? ld_raw(cand, csz, i + u * C) : 0;
        }
#pragma unroll
        for (int u = 0; u < CH_U; u++) {
            if (j + u < j1 && elem_finite<RD>(rt, rw[u]) && elem_finite<CD>(ct, cw[u])) {
                double r = dec(rt, rw[u]), c = dec(ct, cw[u]);
                acc_add(&acc, r, pair_diff<RD, CD>(wide, rt, rw[u], ct, cw[u], r, c));
            }
        }
    }
    part[id] = acc_part(&acc);
}

/* One block per channel k: its items m in [0, items) are
 * part[(m / L) * (count * L) + k * L + m % L], combined thread-strided then by
 * a fixed tree. out[k] = the channel's partial. */
__global__ void __launch_bounds__(RED_THREADS)
chan_combine_kernel(const chan_part *part, uint64_t count, uint64_t L, uint64_t items,
                    chan_part *out)
{
    __shared__ chan_part sh[RED_THREADS];
    uint64_t k = blockIdx.x;
    chan_part a = {0, 0, 0, 0, 0, {0, 0}};
    for (uint64_t m = threadIdx.x; m < items; m += RED_THREADS)
        chan_merge(&a, &part[(m / L) * (count * L) + k * L + m % L]);
    sh[threadIdx.x] = a;
    __syncthreads();
    for (int s = RED_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            chan_merge(&sh[threadIdx.x], &sh[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[k] = sh[0];
}

/* ---- summary of one tensor: the canonical tree (docs/file-format.md "Tree
 * order") ----
 *
 * The bytes are cut into 256-byte pieces (PROBE_TREE_PIECE_BYTES); a piece is
 * one lane's work: XXH64 of its bytes (seed 0) and its elements' counts,
 * min, max, max |x| and the sums s = s + x, q = q + x * x in element order,
 * each operation rounded to double (__dadd_rn/__dmul_rn: never contracted to
 * an FMA). A node of level k + 1 combines up to 32 children
 * (PROBE_TREE_FANOUT): XXH64 (seed k + 1) of their hashes as little-endian
 * uint64, and the sums by the butterfly v[i] = v[i] + v[i + off] for off =
 * 16, 8, 4, 2, 1 (missing children +0.0), which a warp's __shfl_down_sync
 * computes exactly. The root is the first level with one node; the tree hash
 * is XXH64 (seed 0) of the root's hash and the byte count. The host's
 * probe_summary_tree (metrics/tree.c) follows the same definition, so both
 * give the same bits. */

typedef struct {
    unsigned long long hash, nf, nan, inf;
    double mn, mx, am, s, q;
} tree_node;
static_assert(sizeof(tree_node) == PROBE_CUDA_TREE_RESULT_BYTES, "the root is the result slot");

#define TREE_PIECE 256
#define TREE_WARPS (THREADS / 32)
#define XP1 0x9E3779B185EBCA87ull
#define XP2 0xC2B2AE3D27D4EB4Full
#define XP3 0x165667B19E3779F9ull
#define XP4 0x85EBCA77C2B2AE63ull
#define XP5 0x27D4EB2F165667C5ull

/* min/max with -0 < +0, so that the result does not depend on the order */
__host__ __device__ static inline int before_min(double x, double m)
{
    return x < m || (x == m && signbit(x) && !signbit(m));
}
__host__ __device__ static inline int after_max(double x, double m)
{
    return x > m || (x == m && !signbit(x) && signbit(m));
}

/* XXH64 (Y. Collet, xxHash specification, "XXH64 algorithm description") */
__host__ __device__ static inline uint64_t rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}
__host__ __device__ static inline uint64_t xx_round(uint64_t acc, uint64_t in)
{
    return rotl64(acc + in * XP2, 31) * XP1;
}
__host__ __device__ static inline uint64_t xx_merge(uint64_t h, uint64_t v)
{
    return (h ^ xx_round(0, v)) * XP1 + XP4;
}
__host__ __device__ static inline uint64_t xx_converge(uint64_t v1, uint64_t v2, uint64_t v3,
                                                       uint64_t v4)
{
    uint64_t h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
    return xx_merge(xx_merge(xx_merge(xx_merge(h, v1), v2), v3), v4);
}
__host__ __device__ static inline uint64_t xx_word(uint64_t h, uint64_t w)
{
    return rotl64(h ^ xx_round(0, w), 27) * XP1 + XP4;
}
__host__ __device__ static inline uint64_t xx_avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= XP2;
    h ^= h >> 29;
    h *= XP3;
    return h ^ (h >> 32);
}

/* XXH64 of count little-endian uint64 words */
__host__ __device__ static uint64_t xx_words(const uint64_t *w, unsigned count, uint64_t seed)
{
    uint64_t h;
    unsigned i = 0;
    if (count >= 4) {
        uint64_t v1 = seed + XP1 + XP2, v2 = seed + XP2, v3 = seed, v4 = seed - XP1;
        for (; i + 4 <= count; i += 4) {
            v1 = xx_round(v1, w[i]);
            v2 = xx_round(v2, w[i + 1]);
            v3 = xx_round(v3, w[i + 2]);
            v4 = xx_round(v4, w[i + 3]);
        }
        h = xx_converge(v1, v2, v3, v4);
    } else {
        h = seed + XP5;
    }
    h += (uint64_t)count * 8;
    for (; i < count; i++)
        h = xx_word(h, w[i]);
    return xx_avalanche(h);
}

/* byte i of a piece as the file stores it (bool: 0 or 1) */
__device__ static inline unsigned piece_byte(const unsigned char *p, unsigned i, int is_bool)
{
    unsigned b = p[i];
    return is_bool ? b != 0 : b;
}

__device__ static inline uint64_t le64(const unsigned char *p, unsigned o, int is_bool)
{
    uint64_t r = 0;
    for (int b = 7; b >= 0; b--)
        r = (r << 8) | piece_byte(p, o + b, is_bool);
    return r;
}

/* XXH64 (seed 0) of len < 2^32 bytes read one at a time: the last piece, an
 * unaligned tensor, bool */
__device__ static uint64_t xx_bytes(const unsigned char *p, unsigned len, int is_bool)
{
    uint64_t h;
    unsigned i = 0;
    if (len >= 32) {
        uint64_t v1 = XP1 + XP2, v2 = XP2, v3 = 0, v4 = 0 - XP1;
        for (; i + 32 <= len; i += 32) {
            v1 = xx_round(v1, le64(p, i, is_bool));
            v2 = xx_round(v2, le64(p, i + 8, is_bool));
            v3 = xx_round(v3, le64(p, i + 16, is_bool));
            v4 = xx_round(v4, le64(p, i + 24, is_bool));
        }
        h = xx_converge(v1, v2, v3, v4);
    } else {
        h = XP5;
    }
    h += len;
    for (; i + 8 <= len; i += 8)
        h = xx_word(h, le64(p, i, is_bool));
    if (i + 4 <= len) {
        uint64_t k = 0;
        for (int b = 3; b >= 0; b--)
            k = (k << 8) | piece_byte(p, i + b, is_bool);
        h = rotl64(h ^ (k * XP1), 23) * XP2 + XP3;
        i += 4;
    }
    for (; i < len; i++)
        h = rotl64(h ^ (piece_byte(p, i, is_bool) * XP5), 11) * XP1;
    return xx_avalanche(h);
}

__device__ static inline void node_empty(tree_node *a)
{
    a->hash = 0;
    a->nf = a->nan = a->inf = 0;
    a->mn = INFINITY;
    a->mx = -INFINITY;
    a->am = 0.0;
    a->s = a->q = 0.0;
}

__device__ static inline void node_add(tree_node *a, double e)
{
    uint64_t ab = d_bits(e) & ABS_MASK;
    if (ab < INF_BITS) {
        a->nf++;
        a->s = __dadd_rn(a->s, e);
        a->q = __dadd_rn(a->q, __dmul_rn(e, e));
        if (before_min(e, a->mn))
            a->mn = e;
        if (after_max(e, a->mx))
            a->mx = e;
        a->am = fmax(a->am, fabs(e));
    } else {
        a->nan += ab > INF_BITS;
        a->inf += ab == INF_BITS;
    }
}

/* The elements of one 16-byte word, in order (type D, or t when D = 0). */
template <int D>
__device__ static inline void node_add_word(tree_node *a, int t, uint4 v)
{
    unsigned w[4] = {v.x, v.y, v.z, v.w};
    if (D == PROBE_DTYPE_BFLOAT16 || D == PROBE_DTYPE_FLOAT16) {
#pragma unroll
        for (int k = 0; k < 8; k++)
            node_add(a, dec16<D>((w[k >> 1] >> (16 * (k & 1))) & 0xFFFFu));
    } else if (D == PROBE_DTYPE_FLOAT32) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            node_add(a, (double)__uint_as_float(w[k]));
    } else if (D == PROBE_DTYPE_FLOAT64) {
        node_add(a, bits_d((uint64_t)w[0] | ((uint64_t)w[1] << 32)));
        node_add(a, bits_d((uint64_t)w[2] | ((uint64_t)w[3] << 32)));
    } else {
        const int sz = dt_size(t);
        rawgrp g;
        for (int k = 0; k < 4; k++)
            g.w[k] = w[k];
        for (int k = 0; k < 16 / sz; k++)
            node_add(a, dec(t, get_elem(&g, sz, k)));
    }
}

/* A warp's 32 nodes (lane = child; lanes at or past count are missing)
 * combined into one, in lane 0: the butterfly of the sums, and XXH64 (seed)
 * of the children's hashes, gathered in sh (32 words of this warp). */
__device__ static void warp_combine(tree_node *a, unsigned count, uint64_t seed, uint64_t *sh)
{
    const unsigned full = 0xFFFFFFFFu, lane = threadIdx.x & 31;
    sh[lane] = a->hash;
    __syncwarp();
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        double s = __shfl_down_sync(full, a->s, off), q = __shfl_down_sync(full, a->q, off);
        double mn = __shfl_down_sync(full, a->mn, off), mx = __shfl_down_sync(full, a->mx, off);
        double am = __shfl_down_sync(full, a->am, off);
        unsigned long long nf = __shfl_down_sync(full, a->nf, off),
                           nn = __shfl_down_sync(full, a->nan, off),
                           ni = __shfl_down_sync(full, a->inf, off);
        if (lane < (unsigned)off) {
            a->s = __dadd_rn(a->s, s);
            a->q = __dadd_rn(a->q, q);
            if (before_min(mn, a->mn))
                a->mn = mn;
            if (after_max(mx, a->mx))
                a->mx = mx;
            a->am = fmax(a->am, am);
            a->nf += nf;
            a->nan += nn;
            a->inf += ni;
        }
    }
    if (lane == 0)
        a->hash = xx_words(sh, count, seed);
    __syncwarp();
}

/* Level 0 and 1: warp g takes pieces 32g .. 32g + 31 of the nbytes at x and
 * writes level-1 node g to out; with one piece in all (root_is_piece), that
 * piece's own node. vec: x is 16-byte aligned. */
template <int D>
__global__ void __launch_bounds__(THREADS)
tree_leaf_kernel(const unsigned char *x, int t, uint64_t nbytes, int vec, int root_is_piece,
                 tree_node *out)
{
    __shared__ uint64_t sh[TREE_WARPS][32];
    const unsigned lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const uint64_t g = (uint64_t)blockIdx.x * TREE_WARPS + wid;
    const uint64_t npieces = (nbytes + TREE_PIECE - 1) / TREE_PIECE;
    if (g * 32 >= npieces)
        return; /* the whole warp */
    const uint64_t piece = g * 32 + lane, off = piece * TREE_PIECE;
    const int tt = D ? D : t;
    tree_node a;
    node_empty(&a);
    if (piece < npieces) {
        const unsigned len = (unsigned)(nbytes - off < TREE_PIECE ? nbytes - off : TREE_PIECE);
        const unsigned char *p = x + off;
        if (vec && len == TREE_PIECE && tt != PROBE_DTYPE_BOOL) {
            const uint4 *pv = (const uint4 *)p;
            uint64_t v1 = XP1 + XP2, v2 = XP2, v3 = 0, v4 = 0 - XP1;
#pragma unroll 2
            for (int h = 0; h < 2; h++) {
                uint4 w[8];
#pragma unroll
                for (int k = 0; k < 8; k++)
                    w[k] = __ldg(pv + 8 * h + k);
#pragma unroll
                for (int k = 0; k < 8; k += 2) {
                    v1 = xx_round(v1, (uint64_t)w[k].x | ((uint64_t)w[k].y << 32));
                    v2 = xx_round(v2, (uint64_t)w[k].z | ((uint64_t)w[k].w << 32));
                    v3 = xx_round(v3, (uint64_t)w[k + 1].x | ((uint64_t)w[k + 1].y << 32));
                    v4 = xx_round(v4, (uint64_t)w[k + 1].z | ((uint64_t)w[k + 1].w << 32));
                }
#pragma unroll
                for (int k = 0; k < 8; k++)
                    node_add_word<D>(&a, tt, w[k]);
            }
            a.hash = xx_avalanche(xx_converge(v1, v2, v3, v4) + TREE_PIECE);
        } else {
            const int sz = dt_size(tt);
            for (unsigned i = 0; i < len; i += sz)
                node_add(&a, dec(tt, ld_raw(p + i, sz, 0)));
            a.hash = xx_bytes(p, len, tt == PROBE_DTYPE_BOOL);
        }
    }
    if (root_is_piece) {
        if (lane == 0)
            out[0] = a;
        return;
    }
    const uint64_t left = npieces - g * 32;
    warp_combine(&a, left < 32 ? (unsigned)left : 32u, 1, sh[wid]);
    if (lane == 0)
        out[g] = a;
}

/* The root of no bytes: XXH64 of nothing (seed 0), no elements. */
__global__ void tree_empty_kernel(tree_node *out)
{
    tree_node a;
    node_empty(&a);
    a.hash = xx_words(NULL, 0, 0);
    out[0] = a;
}

/* Level k + 1 (seed k + 1) from the m nodes of level k in in. */
__global__ void __launch_bounds__(THREADS)
tree_combine_kernel(const tree_node *in, uint64_t m, uint64_t seed, tree_node *out)
{
    __shared__ uint64_t sh[TREE_WARPS][32];
    const unsigned lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const uint64_t g = (uint64_t)blockIdx.x * TREE_WARPS + wid;
    if (g * 32 >= m)
        return;
    tree_node a;
    if (g * 32 + lane < m)
        a = in[g * 32 + lane];
    else
        node_empty(&a);
    const uint64_t left = m - g * 32;
    warp_combine(&a, left < 32 ? (unsigned)left : 32u, seed, sh[wid]);
    if (lane == 0)
        out[g] = a;
}

/* ================= host side ================= */

/* Scratch comes from one memory pool per device owned by this library, with a
 * release threshold, so repeated calls do not map and unmap device memory. */
#define MAX_DEVICES 64
#define POOL_KEEP_BYTES (256ull << 20)
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static cudaMemPool_t pools[MAX_DEVICES];

static cudaError_t pool_for(int dev, cudaMemPool_t *out)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return cudaErrorInvalidDevice;
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&pool_lock);
    if (pools[dev] == NULL) {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        e = cudaMemPoolCreate(&pools[dev], &props);
        if (e == cudaSuccess) {
            unsigned long long keep = POOL_KEEP_BYTES;
            cudaMemPoolSetAttribute(pools[dev], cudaMemPoolAttrReleaseThreshold, &keep);
        } else {
            pools[dev] = NULL;
        }
    }
    *out = pools[dev];
    pthread_mutex_unlock(&pool_lock);
    return e;
}

typedef struct {
    const char *fn;
    cudaStream_t st;
    cudaMemPool_t pool;
    probe_status status;
} ctx;

/* Record the first CUDA error (PROBE_EIO, named) and return nonzero. */
static int failed(ctx *x, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return x->status != PROBE_OK;
    if (x->status == PROBE_OK)
        x->status = probe_set_error(PROBE_EIO, "%s: %s: %s (%s)", x->fn, what, cudaGetErrorName(e),
                                    cudaGetErrorString(e));
    return 1;
}

static void *dalloc(ctx *x, size_t bytes)
{
    void *p = NULL;
    if (bytes == 0)
        bytes = 8;
    if (failed(x, cudaMallocFromPoolAsync(&p, bytes, x->pool, x->st), "device scratch allocation"))
        return NULL;
    return p;
}

static void dfree(ctx *x, void *p)
{
    if (p)
        cudaFreeAsync(p, x->st);
}

/* A usable device: PROBE_EUNSUPPORTED (with the CUDA message) when there is
 * none. Sets *cur to the calling thread's current device. */
static probe_status device_ready(const char *fn, int *cur)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return probe_set_error(PROBE_EUNSUPPORTED,
                               "%s: no usable CUDA device: cudaGetDeviceCount: %s (%s)", fn,
                               cudaGetErrorName(e), cudaGetErrorString(e));
    }
    if (count == 0)
        return probe_set_error(PROBE_EUNSUPPORTED, "%s: no usable CUDA device: none found", fn);
    e = cudaGetDevice(cur);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return probe_set_error(PROBE_EUNSUPPORTED, "%s: no usable CUDA device: cudaGetDevice: %s (%s)",
                               fn, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return PROBE_OK;
}

static unsigned nblocks_for(uint64_t n)
{
    return (unsigned)((n + TILE - 1) / TILE);
}

/* Kernel specialisations: pairs of common element types, else generic. */
#define BF PROBE_DTYPE_BFLOAT16
#define F16 PROBE_DTYPE_FLOAT16
#define F32 PROBE_DTYPE_FLOAT32
#define F64 PROBE_DTYPE_FLOAT64
#define DISPATCH(KERNEL, rd, cd, grid, st, ...)                                                    \
    do {                                                                                           \
        if (rd == BF && cd == BF) KERNEL<BF, BF><<<grid, THREADS, 0, st>>>(__VA_ARGS__);            \
        else if (rd == F16 && cd == F16) KERNEL<F16, F16><<<grid, THREADS, 0, st>>>(__VA_ARGS__);   \
        else if (rd == F32 && cd == F32) KERNEL<F32, F32><<<grid, THREADS, 0, st>>>(__VA_ARGS__);   \
        else if (rd == F32 && cd == BF) KERNEL<F32, BF><<<grid, THREADS, 0, st>>>(__VA_ARGS__);     \
        else if (rd == BF && cd == F32) KERNEL<BF, F32><<<grid, THREADS, 0, st>>>(__VA_ARGS__);     \
        else if (rd == F64 && cd == F64) KERNEL<F64, F64><<<grid, THREADS, 0, st>>>(__VA_ARGS__);   \
        else KERNEL<0, 0><<<grid, THREADS, 0, st>>>(__VA_ARGS__);                                   \
    } while (0)

typedef struct {
    const unsigned char *r, *c;
    int rdt, cdt;
    uint64_t n;
    int vec;
} pair_dev;

/* Power-of-two exponent bringing m into [0.5, 1) (metrics/metrics.c). */
static int scale_exp(double m)
{
    int e = 0;
    if (m > 0.0 && isfinite(m))
        frexp(m, &e);
    return -e;
}

/* The sums hold fourth powers (r^4, r^2 d^2): magnitudes in [2^-250, 2^250]
 * keep them in range (metrics/metrics.c). */
static int in_safe_range(double m)
{
    return m == 0.0 || (m >= 0x1p-250 && m <= 0x1p250);
}

/* Precision and smallest normal exponent of the coarser floating type of the
 * pair: fewer significand bits, then the higher minimum (metrics/metrics.c);
 * *p = 0 when a side is not floating. */
static void ulp_params(int rdt, int cdt, int *p, int *emin)
{
    int e0 = 0, e1 = 0;
    int p0 = probe_dtype_precision((probe_dtype)rdt, &e0);
    int p1 = probe_dtype_precision((probe_dtype)cdt, &e1);
    *p = 0;
    *emin = 0;
    if (p0 && p1) {
        *p = p0 < p1 ? p0 : p1;
        *emin = p0 < p1 ? e0 : p1 < p0 ? e1 : (e0 > e1 ? e0 : e1);
    }
}

/* a in units of the spacing of a type of precision p and smallest normal
 * exponent emin at x (metrics/metrics.c in_ulps). */
static double host_in_ulps(int p, int emin, double x, double a)
{
    int e = 0;
    (void)frexp(x, &e);
    e -= 1;
    if (x == 0.0 || e < emin)
        e = emin;
    return ldexp(a, p - 1 - e);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double u64_as_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

/* Exact p99 (rank k, 1-based, among the finite |d|) by radix select; zeros:
 * the count of |d| = 0 and d_hist the level-0 histogram of the nonzero keys
 * (hist0_bin), both from the fused pass (d_hist is reused by the later
 * levels). */
static double p99_select(ctx *x, const pair_dev *pd, uint64_t zeros, uint64_t k,
                         unsigned long long *d_hist, unsigned long long *d_aux, unsigned *d_track)
{
    if (k <= zeros)
        return 0.0;
    unsigned long long *hh = (unsigned long long *)malloc(L0BINS * sizeof *hh);
    unsigned long long *keys = (unsigned long long *)malloc(COLLECT_MAX * sizeof *keys);
    unsigned *ht = (unsigned *)malloc(4 * TBINS * sizeof *ht);
    double result = NAN;
    unsigned grid = nblocks_for(pd->n);
    /* d_aux: [0] the collect counter, then the collected keys */
    unsigned long long *ccount = d_aux, *buf = d_aux + 1;
    if (hh == NULL || keys == NULL || ht == NULL) {
        x->status = probe_set_error(PROBE_ENOMEM, "%s: host scratch for the p99", x->fn);
        goto done;
    }
    if (failed(x, cudaMemcpyAsync(hh, d_hist, L0BINS * sizeof *hh, cudaMemcpyDeviceToHost, x->st),
               "copy of the p99 histogram") ||
        failed(x, cudaStreamSynchronize(x->st), "p99 histogram"))
        goto done;
    {
        /* level 0: the 12-bit prefix p holding rank k (hist0_bin: its key
         * p * 2^51, then the rest of p); when k falls on p * 2^51 that is the
         * value, else the search goes on under p, over both bins */
        uint64_t kr = k, below = 0, cnt = 0, prefix = 0;
        int shift = LEVEL0_SHIFT;
        for (int p = 0; p < HBINS; p++) {
            uint64_t exact = hh[2 * p] + (p == 0 ? zeros : 0), c = exact + hh[2 * p + 1];
            if (below + c >= kr) {
                prefix = (uint64_t)p;
                cnt = c;
                if (below + exact >= kr) {
                    result = u64_as_double(prefix << LEVEL0_SHIFT);
                    goto done;
                }
                break;
            }
            below += c;
        }
        kr -= below;
        for (;;) {
            if (shift == 0) {
                result = u64_as_double(prefix);
                break;
            }
            if (cnt <= COLLECT_MAX) {
                if (failed(x, cudaMemsetAsync(ccount, 0, sizeof *ccount, x->st), "memset"))
                    break;
                DISPATCH(select_kernel, pd->rdt, pd->cdt, grid, x->st, pd->r, pd->rdt, pd->c, pd->cdt,
                         pd->n, pd->vec, prefix, shift, 0, MODE_COLLECT, d_hist, (unsigned *)NULL,
                         buf, ccount);
                if (failed(x, cudaGetLastError(), "p99 collect kernel") ||
                    failed(x, cudaMemcpyAsync(keys, buf, cnt * sizeof *keys, cudaMemcpyDeviceToHost,
                                              x->st), "copy of the p99 candidates") ||
                    failed(x, cudaStreamSynchronize(x->st), "p99 collect"))
                    break;
                qsort(keys, cnt, sizeof *keys, cmp_u64);
                result = u64_as_double(keys[kr - 1]);
                break;
            }
            int width = shift < TBITS ? shift : TBITS;
            for (int b = 0; b < TBINS; b++) {
                ht[b] = ~0u;
                ht[TBINS + b] = 0;
                ht[2 * TBINS + b] = 0;
                ht[3 * TBINS + b] = ~0u;
            }
            if (failed(x, cudaMemsetAsync(d_hist, 0, TBINS * sizeof *d_hist, x->st), "memset") ||
                failed(x, cudaMemcpyAsync(d_track, ht, 4 * TBINS * sizeof *ht,
                                          cudaMemcpyHostToDevice, x->st), "copy"))
                break;
            DISPATCH(select_kernel, pd->rdt, pd->cdt, grid, x->st, pd->r, pd->rdt, pd->c, pd->cdt,
                     pd->n, pd->vec, prefix, shift, width, MODE_HIST, d_hist, d_track, buf,
                     ccount);
            if (failed(x, cudaGetLastError(), "p99 histogram kernel") ||
                failed(x, cudaMemcpyAsync(hh, d_hist, TBINS * sizeof *hh, cudaMemcpyDeviceToHost,
                                          x->st), "copy of the p99 histogram") ||
                failed(x, cudaMemcpyAsync(ht, d_track, 4 * TBINS * sizeof *ht,
                                          cudaMemcpyDeviceToHost, x->st), "copy") ||
                failed(x, cudaStreamSynchronize(x->st), "p99 histogram"))
                break;
            below = 0;
            int bins = 1 << width, chosen = 0;
            for (int b = 0; b < bins; b++) {
                if (below + hh[b] >= kr) {
                    chosen = b;
                    prefix = (prefix << width) | (uint64_t)b;
                    cnt = hh[b];
                    break;
                }
                below += hh[b];
            }
            kr -= below;
            shift -= width;
            if (ht[chosen] == ht[TBINS + chosen] && ht[2 * TBINS + chosen] == ht[3 * TBINS + chosen]) {
                /* every key of the chosen bin is equal: that is the value */
                int lowbits = shift > 32 ? shift - 32 : 0;
                uint64_t rest = ((uint64_t)ht[chosen] << lowbits) | ht[2 * TBINS + chosen];
                result = u64_as_double((prefix << shift) | rest);
                break;
            }
        }
    }
done:
    free(hh);
    free(keys);
    free(ht);
    return result;
}

static probe_status check_channel(const char *fn, const probe_channel_spec *ch, uint64_t n)
{
    if (ch == NULL || ch->count == 0)
        return PROBE_OK;
    if (ch->count > PROBE_CHANNELS_MAX)
        return probe_set_error(PROBE_EINVAL, "%s: %llu channels, more than %d", fn,
                               (unsigned long long)ch->count, PROBE_CHANNELS_MAX);
    if (ch->inner == 0)
        return probe_set_error(PROBE_EINVAL, "%s: channel inner size 0", fn);
    if (ch->inner > UINT64_MAX / ch->count || n % (ch->count * ch->inner) != 0)
        return probe_set_error(PROBE_EINVAL,
                               "%s: channels %llu x inner %llu do not divide n = %llu", fn,
                               (unsigned long long)ch->count, (unsigned long long)ch->inner,
                               (unsigned long long)n);
    return PROBE_OK;
}


/* The per-channel arrays a caller asked for (probe_stream_opts): each NULL
 * or count doubles. */
typedef struct {
    double *shift, *se, *n;
} chan_arrays;

/* Per-channel partials -> probe_channel_shift and the arrays, with the rules
 * and the order of metrics/metrics.c (probe/metrics.h). */
static void channel_finish(const chan_part *h_ch, uint64_t count, const chan_arrays *co,
                           probe_channel_shift *shift)
{
    probe_channel_finish f;
    probe_channel_finish_begin(&f, shift, count, co ? co->shift : NULL, co ? co->se : NULL,
                               co ? co->n : NULL);
    for (uint64_t k = 0; k < count; k++) {
        const chan_part *a = &h_ch[k];
        probe_channel_finish_one(&f, k, a->n, nsum_get(&a->sd), a->m2, a->m2_d);
    }
    probe_channel_finish_end(&f);
}

/* The per-channel statistics of the pair (channel spec ch, count > 0). */
static void channel_compute(ctx *x, const pair_dev *pd, const probe_channel_spec *ch,
                            const chan_arrays *co, probe_channel_shift *shift)
{
    uint64_t count = ch->count, inner = ch->inner, n = pd->n;
    chan_part *d_part = NULL, *d_ch = NULL;
    chan_part *h_ch = (chan_part *)calloc(count, sizeof(chan_part));
    if (h_ch == NULL) {
        x->status = probe_set_error(PROBE_ENOMEM, "%s: host memory for %llu channels", x->fn,
                                    (unsigned long long)count);
        return;
    }
    if (n > 0) {
        uint64_t outer = n / (count * inner);
        uint64_t rows = outer * count;
        uint64_t nseg = (inner + CH_SEG - 1) / CH_SEG;
        uint64_t C = count * inner, P = (outer + CH_J - 1) / CH_J;
        /* rows of at least a warp's groups are batched R to a warp */
        uint64_t piece = inner < CH_SEG ? inner : CH_SEG;
        uint64_t R = piece >= 32 * VEC ? (CH_WARP_ELEMS + piece - 1) / piece : 1;
        R = R > outer ? outer : R;
        uint64_t nob = (outer + R - 1) / R;
        uint64_t parts_rows = rows * nseg, parts_cols = P * C;
        int use_rows = parts_rows <= parts_cols;
        uint64_t nparts = use_rows ? nob * count * nseg : parts_cols;
        int wide = dt_wide_int_pair(pd->rdt, pd->cdt);
        d_part = (chan_part *)dalloc(x, nparts * sizeof(chan_part));
        d_ch = (chan_part *)dalloc(x, count * sizeof(chan_part));
        if (x->status != PROBE_OK)
            goto done;
        if (use_rows) {
            uint64_t threads = nob * count * nseg * 32;
            unsigned grid = (unsigned)((threads + THREADS - 1) / THREADS);
            DISPATCH(chan_rows_kernel, pd->rdt, pd->cdt, grid, x->st, pd->r, pd->rdt, pd->c, pd->cdt,
                     wide, outer, count, inner, R, CH_SEG, nseg, pd->vec, d_part);
            chan_combine_kernel<<<(unsigned)count, RED_THREADS, 0, x->st>>>(d_part, count, nseg,
                                                                             nob * nseg, d_ch);
        } else {
            unsigned grid = (unsigned)((parts_cols + THREADS - 1) / THREADS);
            DISPATCH(chan_cols_kernel, pd->rdt, pd->cdt, grid, x->st, pd->r, pd->rdt, pd->c, pd->cdt,
                     wide, outer, C, CH_J, P, d_part);
            chan_combine_kernel<<<(unsigned)count, RED_THREADS, 0, x->st>>>(d_part, count, inner,
                                                                             P * inner, d_ch);
        }
        if (failed(x, cudaGetLastError(), "channel kernels") ||
            failed(x, cudaMemcpyAsync(h_ch, d_ch, count * sizeof(chan_part),
                                      cudaMemcpyDeviceToHost, x->st),
                   "copy of the channel partials") ||
            failed(x, cudaStreamSynchronize(x->st), "channel kernels"))
            goto done;
    }
    channel_finish(h_ch, count, co, shift);
done:
    dfree(x, d_part);
    dfree(x, d_ch);
    free(h_ch);
}

/* Fill out from the fused pass's counts and maxima (fr) and the sums (of the
 * scaled pass when kr, kc, kd are not 0): the CPU engine's own derivation
 * (metrics/finish.h). Identical: the same element type and no element whose
 * bytes differ. */
static void finish_metrics(const pair_dev *pd, const unsigned long long *cn, const fused_res *fr,
                           const double *sum, int kr, int kc, int kd, double p99,
                           probe_metrics *out)
{
    int ulp_p, ulp_emin;
    ulp_params(pd->rdt, pd->cdt, &ulp_p, &ulp_emin);
    uint64_t n = pd->n;
    double maxd = fr->maxd < 0.0 ? 0.0 : fr->maxd;
    probe_metrics_totals t = {
        n, cn[C_NF],
        sum[P_RR], sum[P_CC], sum[P_DD], sum[P_RC], sum[P_AD],
        kr, kc, kd,
        cn[C_NAN_R], cn[C_NAN_C], cn[C_INF_R], cn[C_INF_C], cn[C_INF_MIS], cn[C_MIS],
        pd->rdt == pd->cdt ? (uint64_t)cn[C_DIFFER] : n + 1,
        fr->maxd, fr->maxoff, p99,
        sum[P_DR], sum[P_R2D2], sum[P_R3D], sum[P_R4],
        cn[C_NAN_R_ONLY], fr->ulps < 0.0 ? NAN : fr->ulps,
        ulp_p && cn[C_NF] ? host_in_ulps(ulp_p, ulp_emin, fmax(fr->amax_r, fr->amax_c), maxd)
                          : NAN,
    };
    probe_metrics_finish(&t, out);
}

/* The computation on the current device, in stream x->st. ch NULL or count
 * 0: no channels; co: the per-channel arrays wanted (NULL: none). */
static void metrics_on_device(ctx *x, const pair_dev *pd, const probe_metrics_opts *opts,
                              const probe_channel_spec *ch, const chan_arrays *co,
                              probe_metrics *out, probe_channel_shift *shift)
{
    uint64_t n = pd->n;
    unsigned grid = nblocks_for(n);
    int want_channels = shift != NULL && ch != NULL && ch->count > 0;
    fused_out fo;
    fused_res fr, fs, *d_res = NULL;
    unsigned long long cn[C_COUNT], *d_hist = NULL, *d_aux = NULL;
    unsigned *d_track = NULL;
    memset(&fo, 0, sizeof fo);
    if (n == 0) {
        memset(&fr, 0, sizeof fr);
        fr.maxd = -1.0;
        fr.ulps = -1.0;
        memset(cn, 0, sizeof cn);
        finish_metrics(pd, cn, &fr, fr.sum, 0, 0, 0, NAN, out);
        if (want_channels)
            channel_compute(x, pd, ch, co, shift);
        return;
    }
    int ulp_p, ulp_emin;
    ulp_params(pd->rdt, pd->cdt, &ulp_p, &ulp_emin);
    fo.part = (double *)dalloc(x, (size_t)grid * P_COUNT * sizeof(double));
    fo.part_off = (unsigned long long *)dalloc(x, (size_t)grid * sizeof(unsigned long long));
    fo.counts = (unsigned long long *)dalloc(x, C_COUNT * sizeof(unsigned long long));
    d_res = (fused_res *)dalloc(x, sizeof(fused_res));
    d_hist = (unsigned long long *)dalloc(x, L0BINS * sizeof(unsigned long long));
    d_aux = (unsigned long long *)dalloc(x, (1 + COLLECT_MAX) * sizeof(unsigned long long));
    d_track = (unsigned *)dalloc(x, 4 * TBINS * sizeof(unsigned));
    fo.hist = d_hist;
    if (x->status != PROBE_OK)
        goto done;
    if (failed(x, cudaMemsetAsync(fo.counts, 0, C_COUNT * sizeof(unsigned long long), x->st),
               "memset") ||
        failed(x, cudaMemsetAsync(d_hist, 0, L0BINS * sizeof(unsigned long long), x->st), "memset"))
        goto done;
    DISPATCH(fused_kernel, pd->rdt, pd->cdt, grid, x->st, pd->r, pd->rdt, pd->c, pd->cdt, n,
             pd->vec, opts->atol, opts->rtol, ulp_p, ulp_emin, fo);
    reduce_kernel<<<1, RED_THREADS, 0, x->st>>>(fo.part, fo.part_off, grid, d_res);
    if (failed(x, cudaGetLastError(), "fused metrics kernel") ||
        failed(x, cudaMemcpyAsync(&fr, d_res, sizeof fr, cudaMemcpyDeviceToHost, x->st), "copy") ||
        failed(x, cudaMemcpyAsync(cn, fo.counts, sizeof cn, cudaMemcpyDeviceToHost, x->st), "copy") ||
        failed(x, cudaStreamSynchronize(x->st), "fused metrics"))
        goto done;
    fs = fr;
    {
        double maxd = fr.maxd < 0.0 ? 0.0 : fr.maxd;
        int kr = 0, kc = 0, kd = 0, d_overflow = !isfinite(maxd);
        if (!in_safe_range(fr.amax_r) || !in_safe_range(fr.amax_c) || !in_safe_range(maxd)) {
            kr = scale_exp(fr.amax_r);
            kc = scale_exp(fr.amax_c);
            kd = d_overflow ? scale_exp(fmax(fr.amax_r, fr.amax_c)) - 1 : scale_exp(maxd);
            scaled_kernel<<<grid, THREADS, 0, x->st>>>(pd->r, pd->rdt, pd->c, pd->cdt, n, kr, kc, kd,
                                                      d_overflow, fo.part);
            reduce_kernel<<<1, RED_THREADS, 0, x->st>>>(fo.part, fo.part_off, grid, d_res);
            if (failed(x, cudaGetLastError(), "scaled sums kernel") ||
                failed(x, cudaMemcpyAsync(&fs, d_res, sizeof fs, cudaMemcpyDeviceToHost, x->st),
                       "copy") ||
                failed(x, cudaStreamSynchronize(x->st), "scaled sums"))
                goto done;
        }
        uint64_t nf = cn[C_NF];
        double p99 = NAN;
        if (nf > 0) {
            double xr = ceil(99.0 * (double)nf / 100.0);
            uint64_t rank = xr < 1.0 ? 1 : (xr >= (double)nf ? nf : (uint64_t)xr);
            if (rank == nf)
                p99 = maxd;
            else
                p99 = p99_select(x, pd, cn[C_ZERO], rank, d_hist, d_aux, d_track);
            if (x->status != PROBE_OK)
                goto done;
        }
        finish_metrics(pd, cn, &fr, fs.sum, kr, kc, kd, p99, out);
        if (want_channels)
            channel_compute(x, pd, ch, co, shift);
    }
done:
    dfree(x, fo.part);
    dfree(x, fo.part_off);
    dfree(x, fo.counts);
    dfree(x, d_res);
    dfree(x, d_hist);
    dfree(x, d_aux);
    dfree(x, d_track);
}

static probe_status check_args(const char *fn, probe_dtype rdt, const void *ref, probe_dtype cdt,
                               const void *cand, uint64_t n, const probe_metrics_opts *opts,
                               const probe_channel_spec *ch)
{
    if (opts == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: opts is NULL", fn);
    if (!(opts->atol >= 0.0) || !(opts->rtol >= 0.0))
        return probe_set_error(PROBE_EINVAL, "%s: atol %g and rtol %g must be >= 0 (not NaN)", fn,
                               opts->atol, opts->rtol);
    if (dt_size(rdt) == 0)
        return probe_set_error(PROBE_EINVAL, "%s: unknown reference element type %d", fn, (int)rdt);
    if (dt_size(cdt) == 0)
        return probe_set_error(PROBE_EINVAL, "%s: unknown candidate element type %d", fn, (int)cdt);
    if (n > 0 && (ref == NULL || cand == NULL))
        return probe_set_error(PROBE_EINVAL, "%s: %s is NULL with n = %llu", fn,
                               ref == NULL ? "ref" : "cand", (unsigned long long)n);
    if (((uintptr_t)ref % dt_size(rdt)) || ((uintptr_t)cand % dt_size(cdt)))
        return probe_set_error(PROBE_EINVAL, "%s: %s is not aligned to its element size", fn,
                               ((uintptr_t)ref % dt_size(rdt)) ? "ref" : "cand");
    return check_channel(fn, ch, n);
}

static void clear_outputs(probe_metrics *out, probe_channel_shift *shift)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (shift)
        memset(shift, 0, sizeof *shift);
}

PROBE_CUDA_API probe_status probe_cuda_metrics(probe_dtype ref_dtype, const void *ref,
                                           probe_dtype cand_dtype, const void *cand, uint64_t n,
                                           const probe_metrics_opts *opts,
                                           const probe_channel_spec *channel, void *stream,
                                           probe_metrics *out, probe_channel_shift *shift)
{
    static const char fn[] = "probe_cuda_metrics";
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: out is NULL", fn);
    clear_outputs(out, shift);
    probe_status s = check_args(fn, ref_dtype, ref, cand_dtype, cand, n, opts, channel);
    if (s != PROBE_OK)
        return s;
    int dev;
    if ((s = device_ready(fn, &dev)) != PROBE_OK)
        return s;
    ctx x = {fn, (cudaStream_t)stream, NULL, PROBE_OK};
    if (failed(&x, pool_for(dev, &x.pool), "memory pool"))
        return x.status;
    pair_dev pd = {(const unsigned char *)ref, (const unsigned char *)cand, (int)ref_dtype,
                   (int)cand_dtype, n, ((uintptr_t)ref % 16 == 0) && ((uintptr_t)cand % 16 == 0)};
    metrics_on_device(&x, &pd, opts, channel, NULL, out, shift);
    if (x.status == PROBE_OK)
        failed(&x, cudaStreamSynchronize(x.st), "synchronize");
    if (x.status != PROBE_OK)
        clear_outputs(out, shift);
    return x.status;
}

/* probe_cuda_metrics_source and _v2 (named fn in messages); co: the
 * per-channel arrays wanted (NULL: none). */
static probe_status source_metrics(const char *fn, int device, const probe_pair_source *src,
                                   const probe_metrics_opts *opts,
                                   const probe_channel_spec *channel, const chan_arrays *co,
                                   probe_metrics *out, probe_channel_shift *shift)
{
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: out is NULL", fn);
    clear_outputs(out, shift);
    if (src == NULL || (src->n > 0 && src->read == NULL))
        return probe_set_error(PROBE_EINVAL, "%s: %s is NULL", fn, src == NULL ? "src" : "src->read");
    probe_status s = check_args(fn, src->dtype[0], NULL, src->dtype[1], NULL, 0, opts, NULL);
    if (s != PROBE_OK)
        return s;
    if ((s = check_channel(fn, channel, src->n)) != PROBE_OK)
        return s;
    int prev;
    if ((s = device_ready(fn, &prev)) != PROBE_OK)
        return s;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return probe_set_error(PROBE_EUNSUPPORTED, "%s: cudaSetDevice(%d): %s (%s)", fn, device,
                               cudaGetErrorName(e), cudaGetErrorString(e));
    }
    ctx x = {fn, NULL, NULL, PROBE_OK};
    unsigned char *dside[2] = {NULL, NULL};
    unsigned char *host[2] = {NULL, NULL};
    cudaEvent_t ev[2] = {NULL, NULL};
    uint64_t n = src->n;
    size_t esz[2] = {probe_dtype_size(src->dtype[0]), probe_dtype_size(src->dtype[1])};
    if (failed(&x, cudaStreamCreateWithFlags(&x.st, cudaStreamNonBlocking), "stream") ||
        failed(&x, pool_for(device, &x.pool), "memory pool") ||
        failed(&x, cudaMallocHost((void **)&host[0], CHUNK_BYTES), "pinned host buffer") ||
        failed(&x, cudaMallocHost((void **)&host[1], CHUNK_BYTES), "pinned host buffer") ||
        failed(&x, cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming), "event") ||
        failed(&x, cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming), "event"))
        goto done;
    for (int side = 0; side < 2 && x.status == PROBE_OK; side++) {
        dside[side] = (unsigned char *)dalloc(&x, n * esz[side]);
        if (x.status != PROBE_OK)
            break;
        uint64_t per = CHUNK_BYTES / esz[side];
        int buf = 0;
        int used[2] = {0, 0};
        for (uint64_t off = 0; off < n; off += per) {
            size_t cnt = (size_t)(n - off < per ? n - off : per);
            /* wait until the copy out of this buffer (two chunks ago) is done */
            if (used[buf] && failed(&x, cudaEventSynchronize(ev[buf]), "H2D copy"))
                break;
            probe_status rs = src->read(src->ctx, side, off, cnt, host[buf]);
            if (rs != PROBE_OK) {
                x.status = rs;
                break;
            }
            if (failed(&x, cudaMemcpyAsync(dside[side] + off * esz[side], host[buf], cnt * esz[side],
                                           cudaMemcpyHostToDevice, x.st), "H2D copy") ||
                failed(&x, cudaEventRecord(ev[buf], x.st), "event"))
                break;
            used[buf] = 1;
            buf ^= 1;
        }
    }
    if (x.status == PROBE_OK) {
        pair_dev pd = {dside[0], dside[1], (int)src->dtype[0], (int)src->dtype[1], n, 1};
        metrics_on_device(&x, &pd, opts, channel, co, out, shift);
    }
    if (x.status == PROBE_OK)
        failed(&x, cudaStreamSynchronize(x.st), "synchronize");
done:
    if (x.st) {
        dfree(&x, dside[0]);
        dfree(&x, dside[1]);
        cudaStreamSynchronize(x.st);
        cudaStreamDestroy(x.st);
    }
    for (int i = 0; i < 2; i++) {
        if (host[i])
            cudaFreeHost(host[i]);
        if (ev[i])
            cudaEventDestroy(ev[i]);
    }
    cudaSetDevice(prev);
    if (x.status != PROBE_OK)
        clear_outputs(out, shift);
    return x.status;
}

PROBE_CUDA_API probe_status probe_cuda_metrics_source(int device, const probe_pair_source *src,
                                                  const probe_metrics_opts *opts,
                                                  const probe_channel_spec *channel,
                                                  probe_metrics *out, probe_channel_shift *shift)
{
    return source_metrics("probe_cuda_metrics_source", device, src, opts, channel, NULL, out,
                          shift);
}

PROBE_CUDA_API probe_status probe_cuda_metrics_source_v2(int device, const probe_pair_source *src,
                                                     const probe_metrics_opts *opts,
                                                     const probe_stream_opts *sopts,
                                                     probe_metrics *out,
                                                     probe_channel_shift *shift)
{
    chan_arrays co = {NULL, NULL, NULL};
    if (sopts) {
        co.shift = sopts->channel_shift_out;
        co.se = sopts->channel_se_out;
        co.n = sopts->channel_n_out;
    }
    return source_metrics("probe_cuda_metrics_source_v2", device, src, opts,
                          sopts ? &sopts->channel : NULL, &co, out, shift);
}

static probe_status tree_args(const char *fn, probe_dtype dtype, const void *xp, uint64_t n)
{
    const int sz = dt_size(dtype);
    if (sz == 0)
        return probe_set_error(PROBE_EINVAL, "%s: unknown element type %d", fn, (int)dtype);
    if (n > 0 && xp == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: x is NULL with n = %llu", fn,
                               (unsigned long long)n);
    if ((uintptr_t)xp % sz)
        return probe_set_error(PROBE_EINVAL, "%s: x is not aligned to its element size", fn);
    if (n > UINT64_MAX / (uint64_t)sz)
        return probe_set_error(PROBE_EINVAL, "%s: n = %llu elements overflow a byte count", fn,
                               (unsigned long long)n);
    return PROBE_OK;
}

/* The tree's kernels on x->st, then the root node copied to result (any
 * memory cudaMemcpyAsync reaches); scratch from the pool, freed in stream
 * order. Nothing waits on the host. */
static void tree_enqueue(ctx *x, int dev, probe_dtype dtype, const unsigned char *xb,
                         uint64_t n, void *result)
{
    const uint64_t nbytes = n * (uint64_t)dt_size(dtype);
    if (failed(x, pool_for(dev, &x->pool), "memory pool"))
        return;
    const uint64_t npieces = (nbytes + TREE_PIECE - 1) / TREE_PIECE;
    uint64_t m = (npieces + 31) / 32; /* nodes of level 1 */
    tree_node *a = (tree_node *)dalloc(x, (size_t)(m ? m : 1) * sizeof(tree_node));
    tree_node *b = (tree_node *)dalloc(x, (size_t)((m + 31) / 32) * sizeof(tree_node));
    if (x->status == PROBE_OK && n == 0) {
        tree_empty_kernel<<<1, 1, 0, x->st>>>(a);
    } else if (x->status == PROBE_OK) {
        const int vec = (uintptr_t)xb % 16 == 0, one = npieces == 1;
        const unsigned grid = (unsigned)((m + TREE_WARPS - 1) / TREE_WARPS);
        const int t = (int)dtype;
        switch (dtype) {
        case BF: tree_leaf_kernel<BF><<<grid, THREADS, 0, x->st>>>(xb, t, nbytes, vec, one, a); break;
        case F16: tree_leaf_kernel<F16><<<grid, THREADS, 0, x->st>>>(xb, t, nbytes, vec, one, a); break;
        case F32: tree_leaf_kernel<F32><<<grid, THREADS, 0, x->st>>>(xb, t, nbytes, vec, one, a); break;
        case F64: tree_leaf_kernel<F64><<<grid, THREADS, 0, x->st>>>(xb, t, nbytes, vec, one, a); break;
        default: tree_leaf_kernel<0><<<grid, THREADS, 0, x->st>>>(xb, t, nbytes, vec, one, a);
        }
        /* levels 2, 3, ... until one node is left */
        for (uint64_t seed = 2; m > 1 && !failed(x, cudaGetLastError(), "tree kernel"); seed++) {
            const uint64_t next = (m + 31) / 32;
            const unsigned g2 = (unsigned)((next + TREE_WARPS - 1) / TREE_WARPS);
            tree_combine_kernel<<<g2, THREADS, 0, x->st>>>(a, m, seed, b);
            tree_node *tmp = a;
            a = b;
            b = tmp;
            m = next;
        }
    }
    if (x->status == PROBE_OK && !failed(x, cudaGetLastError(), "tree kernel"))
        (void)failed(x, cudaMemcpyAsync(result, a, sizeof(tree_node), cudaMemcpyDefault, x->st),
                     "copy");
    dfree(x, a);
    dfree(x, b);
}

PROBE_CUDA_API probe_status probe_cuda_summary_tree_enqueue(probe_dtype dtype, const void *xp,
                                                        uint64_t n, void *stream, void *result)
{
    static const char fn[] = "probe_cuda_summary_tree_enqueue";
    if (result == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: result is NULL", fn);
    probe_status s = tree_args(fn, dtype, xp, n);
    int dev;
    if (s != PROBE_OK || (s = device_ready(fn, &dev)) != PROBE_OK)
        return s;
    ctx x = {fn, (cudaStream_t)stream, NULL, PROBE_OK};
    tree_enqueue(&x, dev, dtype, (const unsigned char *)xp, n, result);
    return x.status;
}

PROBE_CUDA_API probe_status probe_cuda_summary_tree_result(probe_dtype dtype, uint64_t n,
                                                       const void *result, probe_summary *out,
                                                       uint64_t *tree_hash)
{
    static const char fn[] = "probe_cuda_summary_tree_result";
    if (out == NULL || result == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: %s is NULL", fn, out ? "result" : "out");
    memset(out, 0, sizeof *out);
    const int sz = dt_size(dtype);
    if (sz == 0)
        return probe_set_error(PROBE_EINVAL, "%s: unknown element type %d", fn, (int)dtype);
    tree_node root;
    memcpy(&root, result, sizeof root);
    if (root.nf + root.nan + root.inf != n)
        return probe_set_error(PROBE_EINVAL,
                               "%s: the result counts %llu elements, not n = %llu (not the "
                               "result of this tensor, or read before its stream reached it)",
                               fn, (unsigned long long)(root.nf + root.nan + root.inf),
                               (unsigned long long)n);
    out->n = n;
    out->n_finite = root.nf;
    out->nan = root.nan;
    out->inf = root.inf;
    out->sum = root.s;
    out->sum_sq = root.q;
    out->min = out->max = out->abs_max = NAN;
    if (root.nf > 0) {
        out->min = root.mn;
        out->max = root.mx;
        out->abs_max = root.am;
    }
    if (tree_hash) {
        const uint64_t w[2] = {root.hash, n * (uint64_t)sz};
        *tree_hash = xx_words(w, 2, 0);
    }
    return PROBE_OK;
}

PROBE_CUDA_API probe_status probe_cuda_summary_tree(probe_dtype dtype, const void *xp, uint64_t n,
                                                void *stream, probe_summary *out,
                                                uint64_t *tree_hash)
{
    static const char fn[] = "probe_cuda_summary_tree";
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: out is NULL", fn);
    memset(out, 0, sizeof *out);
    if (tree_hash)
        *tree_hash = 0;
    probe_status s = tree_args(fn, dtype, xp, n);
    int dev;
    if (s != PROBE_OK || (s = device_ready(fn, &dev)) != PROBE_OK)
        return s;
    ctx x = {fn, (cudaStream_t)stream, NULL, PROBE_OK};
    tree_node root;
    memset(&root, 0, sizeof root);
    tree_enqueue(&x, dev, dtype, (const unsigned char *)xp, n, &root);
    if (x.status == PROBE_OK)
        (void)failed(&x, cudaStreamSynchronize(x.st), "summary");
    else
        cudaStreamSynchronize(x.st);
    if (x.status != PROBE_OK)
        return x.status;
    return probe_cuda_summary_tree_result(dtype, n, &root, out, tree_hash);
}

PROBE_CUDA_API probe_status probe_cuda_summary(probe_dtype dtype, const void *xp, uint64_t n,
                                           void *stream, probe_summary *out)
{
    return probe_cuda_summary_tree(dtype, xp, n, stream, out, NULL);
}

PROBE_CUDA_API int probe_cuda_abi_version(void)
{
    return PROBE_CUDA_ABI_VERSION;
}
