/* rounded.c - rounded-weight fingerprints (include/probe/capture.h,
 * docs/gemm.md "Quantized from the same weights").
 *
 * The float32 -> float8_e4m3fn cast is c10's fp8e4m3fn_from_fp32_value
 * (PyTorch c10/util/Float8_e4m3fn.h), so a code here is the byte torch's
 * Tensor.to(torch.float8_e4m3fn) stores. 16-bit inputs go through tables over
 * all 65536 bit patterns; float32 inputs are converted element by element.
 * A 16-bit tensor of PARALLEL elements or more is fingerprinted by several
 * threads: the bit patterns present over slices of the tensor, then one
 * thread per hash stream; the hashes are the same as one thread's. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "probe/capture.h"

#define BLOCK 4096
#define SMALL 16384 /* below this many 16-bit elements, no tables */
#define PARALLEL ((size_t)1 << 22) /* from this many 16-bit elements, threads */

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 -> float8_e4m3fn, round to nearest even; |x| >= 480, inf and NaN
 * -> NaN (0x7f with the sign), as c10's fp8e4m3fn_from_fp32_value. */
static uint8_t e4m3fn_from_f32(float f)
{
    const uint32_t fp8_max = UINT32_C(1087) << 20;    /* 480.0f */
    const uint32_t denorm_mask = UINT32_C(141) << 23; /* 2^14 */
    uint32_t u = bits_of(f);
    const uint32_t sign = u & UINT32_C(0x80000000);
    uint8_t r;
    u ^= sign;
    if (u >= fp8_max) {
        r = 0x7f;
    } else if (u < (UINT32_C(121) << 23)) { /* below 2^-6, the smallest normal */
        /* adding 2^14 rounds to a multiple of 2^-9 (the subnormal step) */
        volatile float t = float_of(u) + float_of(denorm_mask);
        r = (uint8_t)(bits_of(t) - denorm_mask);
    } else {
        uint32_t odd = (u >> 20) & 1u;
        u += ((uint32_t)(7 - 127) << 23) + UINT32_C(0x7FFFF);
        u += odd;
        r = (uint8_t)(u >> 20);
    }
    return (uint8_t)(r | (uint8_t)(sign >> 24));
}

static float half_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return float_of(sign | 0x7f800000u | (m << 13));
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float32 */
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

static float value_16(probe_dtype t, uint16_t b)
{
    return t == PROBE_DTYPE_BFLOAT16 ? float_of((uint32_t)b << 16) : half_to_f32(b);
}

static uint16_t load16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t load32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The scale conventions of the amax rounding (include/probe/capture.h
 * probe_rounded_fingerprint.amax_variants), float32 throughout:
 *   0: x / s,  s = amax / 448              (the definition)
 *   1: x / s,  s = amax * fl(1 / 448)      (torch on CUDA: a tensor divided by a Python number)
 *   2: x * r,  r = 448 / amax              (the scale as max / amax, one division)
 *   3: x * r,  r = fl(1 / amax) * 448      (torch eager `448.0 / amax`: reciprocal, then
 *                                           multiply; torchao's amax_to_scale)
 *   4: x * r,  r = 1 / s of 0              (x divided by the definition's scale as a number)
 * amax 0: every convention is the cast (s = r = 1). */
struct amax_scales {
    int defined; /* amax finite */
    float s0, s1, r2, r3, r4;
};

static struct amax_scales amax_scales(float amax)
{
    struct amax_scales a = {0, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    if (!isfinite(amax))
        return a;
    a.defined = 1;
    if (amax != 0.0f) {
        volatile float inv448 = 1.0f / 448.0f, inv_amax = 1.0f / amax;
        a.s0 = amax / 448.0f;
        a.s1 = amax * inv448;
        a.r2 = 448.0f / amax;
        a.r3 = inv_amax * 448.0f;
        a.r4 = 1.0f / a.s0;
    }
    return a;
}

static void amax_codes(const struct amax_scales *a, float v, uint8_t c[PROBE_AMAX_CONVENTIONS])
{
    volatile float q0 = v / a->s0, q1 = v / a->s1, q2 = v * a->r2, q3 = v * a->r3, q4 = v * a->r4;
    c[0] = e4m3fn_from_f32(q0);
    c[1] = e4m3fn_from_f32(q1);
    c[2] = e4m3fn_from_f32(q2);
    c[3] = e4m3fn_from_f32(q3);
    c[4] = e4m3fn_from_f32(q4);
}

/* Hash streams: 0 the cast, 1 + c amax convention c. */
#define NSTREAMS (1 + PROBE_AMAX_CONVENTIONS)

struct hashes {
    XXH64_state_t *h[NSTREAMS];
    unsigned char buf[NSTREAMS][BLOCK];
};

static probe_status hashes_open(struct hashes *hs)
{
    for (int r = 0; r < NSTREAMS; ++r)
        if ((hs->h[r] = XXH64_createState()) == NULL || XXH64_reset(hs->h[r], 0) != XXH_OK)
            return probe_set_error(PROBE_ENOMEM, "rounded fingerprint: out of memory");
    return PROBE_OK;
}

static void hashes_close(struct hashes *hs, probe_rounded_fingerprint *out)
{
    for (int r = 0; r < NSTREAMS; ++r) {
        if (hs->h[r] && out) {
            uint64_t d = (uint64_t)XXH64_digest(hs->h[r]);
            if (r == 0)
                out->xxh64[PROBE_ROUNDING_E4M3FN] = d;
            else
                out->amax_variants[r - 1] = d;
        }
        XXH64_freeState(hs->h[r]);
    }
    if (out)
        out->xxh64[PROBE_ROUNDING_E4M3FN_AMAX] = out->amax_variants[0];
}

static void hashes_update(struct hashes *hs, size_t m, int with_amax)
{
    for (int r = 0; r < (with_amax ? NSTREAMS : 1); ++r)
        XXH64_update(hs->h[r], hs->buf[r], m);
}

/* Pass 1 of a 16-bit tensor: the bit patterns present in elements [lo, hi). */
struct seen_job {
    const unsigned char *p;
    size_t lo, hi;
    uint64_t seen[65536 / 64];
};

static void *seen_run(void *arg)
{
    struct seen_job *j = arg;
    for (size_t i = j->lo; i < j->hi; ++i) {
        uint16_t b = load16(j->p + 2 * i);
        j->seen[b >> 6] |= UINT64_C(1) << (b & 63);
    }
    return NULL;
}

/* Pass 2 of a 16-bit tensor: hash stream r, every element mapped through
 * its code table. */
struct stream_job {
    const unsigned char *p;
    size_t n;
    const uint8_t *tab;
    unsigned char *buf; /* BLOCK bytes */
    XXH64_state_t *h;
};

static void *stream_run(void *arg)
{
    struct stream_job *j = arg;
    for (size_t at = 0; at < j->n; at += BLOCK) {
        size_t m = j->n - at < BLOCK ? j->n - at : BLOCK;
        const unsigned char *src = j->p + 2 * at;
        for (size_t i = 0; i < m; ++i)
            j->buf[i] = j->tab[load16(src + 2 * i)];
        XXH64_update(j->h, j->buf, m);
    }
    return NULL;
}

/* Run fn over jobs[0..k) (each size bytes apart): jobs 1.. on threads where
 * they can be started, the rest and job 0 on the calling thread. */
static void run_jobs(void *(*fn)(void *), void *jobs, size_t size, int k)
{
    pthread_t th[NSTREAMS];
    int started[NSTREAMS] = {0};
    for (int i = 1; i < k; ++i)
        started[i] = pthread_create(&th[i], NULL, fn, (char *)jobs + (size_t)i * size) == 0;
    fn(jobs);
    for (int i = 1; i < k; ++i) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            fn((char *)jobs + (size_t)i * size);
    }
}

/* 16-bit types: pass 1 marks the bit patterns present (levels, amax), pass 2
 * maps each element through the code tables of the patterns. */
static probe_status fingerprint_16(probe_dtype t, const unsigned char *p, size_t n,
                                   probe_rounded_fingerprint *out, struct hashes *hs)
{
    int k = n >= PARALLEL ? NSTREAMS : 1;
    struct seen_job *sj = calloc((size_t)k, sizeof *sj);
    uint8_t *codes = malloc((size_t)NSTREAMS * 65536);
    if (!sj || !codes) {
        free(sj);
        free(codes);
        return probe_set_error(PROBE_ENOMEM, "rounded fingerprint: out of memory");
    }
    for (int i = 0; i < k; ++i)
        sj[i] = (struct seen_job){.p = p, .lo = n / (size_t)k * (size_t)i,
                                  .hi = i == k - 1 ? n : n / (size_t)k * (size_t)(i + 1)};
    run_jobs(seen_run, sj, sizeof *sj, k);
    uint64_t *seen = sj[0].seen;
    for (int i = 1; i < k; ++i)
        for (size_t w = 0; w < 65536 / 64; ++w)
            seen[w] |= sj[i].seen[w];
    int levels = 0;
    float amax = 0.0f;
    for (unsigned b = 0; b < 65536; ++b)
        if (seen[b >> 6] >> (b & 63) & 1) {
            ++levels;
            float a = fabsf(value_16(t, (uint16_t)b));
            if (isnan(a) || isnan(amax))
                amax = NAN;
            else if (a > amax)
                amax = a;
        }
    out->levels = levels <= 256 ? levels : -1;
    out->amax = amax;
    struct amax_scales sc = amax_scales(amax);
    for (unsigned b = 0; b < 65536; ++b)
        if (seen[b >> 6] >> (b & 63) & 1) {
            float v = value_16(t, (uint16_t)b);
            uint8_t c[PROBE_AMAX_CONVENTIONS] = {0};
            if (sc.defined)
                amax_codes(&sc, v, c);
            codes[b] = e4m3fn_from_f32(v);
            for (int r = 0; r < PROBE_AMAX_CONVENTIONS; ++r)
                codes[(size_t)(1 + r) * 65536 + b] = c[r];
        }
    free(sj);
    int streams = sc.defined ? NSTREAMS : 1;
    struct stream_job jobs[NSTREAMS];
    for (int r = 0; r < streams; ++r)
        jobs[r] = (struct stream_job){p, n, codes + (size_t)r * 65536, hs->buf[r], hs->h[r]};
    if (k > 1) {
        run_jobs(stream_run, jobs, sizeof jobs[0], streams);
    } else {
        /* one thread: the streams block by block, each block read while cached */
        for (size_t at = 0; at < n; at += BLOCK) {
            size_t m = n - at < BLOCK ? n - at : BLOCK;
            for (int r = 0; r < streams; ++r) {
                struct stream_job one = {p + 2 * at, m, jobs[r].tab, jobs[r].buf, jobs[r].h};
                stream_run(&one);
            }
        }
    }
    out->valid = 1u << PROBE_ROUNDING_E4M3FN | (sc.defined ? 1u << PROBE_ROUNDING_E4M3FN_AMAX : 0u);
    free(codes);
    return PROBE_OK;
}

/* Small 16-bit tensors and float32: element by element; levels counted in
 * an open-addressing set of bit patterns that stops at 257. */
static probe_status fingerprint_direct(probe_dtype t, const unsigned char *p, size_t n,
                                       probe_rounded_fingerprint *out, struct hashes *hs)
{
    size_t es = t == PROBE_DTYPE_FLOAT32 ? 4 : 2;
    enum { SET = 1024 };
    uint32_t set[SET];
    unsigned char used[SET];
    memset(used, 0, sizeof used);
    int levels = 0;
    float amax = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        uint32_t b = es == 4 ? load32(p + 4 * i) : load16(p + 2 * i);
        float v = es == 4 ? float_of(b) : value_16(t, (uint16_t)b);
        float a = fabsf(v);
        if (isnan(a) || isnan(amax))
            amax = NAN;
        else if (a > amax)
            amax = a;
        if (levels > 256)
            continue;
        size_t k = (size_t)(b * UINT32_C(2654435761)) & (SET - 1);
        while (used[k] && set[k] != b)
            k = (k + 1) & (SET - 1);
        if (!used[k]) {
            used[k] = 1;
            set[k] = b;
            ++levels;
        }
    }
    out->levels = levels <= 256 ? levels : -1;
    out->amax = amax;
    struct amax_scales sc = amax_scales(amax);
    for (size_t at = 0; at < n; at += BLOCK) {
        size_t m = n - at < BLOCK ? n - at : BLOCK;
        for (size_t i = 0; i < m; ++i) {
            const unsigned char *q = p + es * (at + i);
            float v = es == 4 ? float_of(load32(q)) : value_16(t, load16(q));
            uint8_t c[PROBE_AMAX_CONVENTIONS] = {0};
            if (sc.defined)
                amax_codes(&sc, v, c);
            hs->buf[0][i] = e4m3fn_from_f32(v);
            for (int k = 0; k < PROBE_AMAX_CONVENTIONS; ++k)
                hs->buf[1 + k][i] = c[k];
        }
        hashes_update(hs, m, sc.defined);
    }
    out->valid = 1u << PROBE_ROUNDING_E4M3FN | (sc.defined ? 1u << PROBE_ROUNDING_E4M3FN_AMAX : 0u);
    return PROBE_OK;
}

probe_status probe_rounded_fingerprint_compute(probe_dtype dtype, const void *data, size_t count,
                                               probe_rounded_fingerprint *out)
{
    if (!out)
        return probe_set_error(PROBE_EINVAL, "rounded fingerprint: out is NULL");
    memset(out, 0, sizeof *out);
    if (dtype != PROBE_DTYPE_BFLOAT16 && dtype != PROBE_DTYPE_FLOAT16 &&
        dtype != PROBE_DTYPE_FLOAT32)
        return probe_set_error(PROBE_EINVAL, "rounded fingerprint: %s is not bfloat16, float16 "
                               "or float32", probe_dtype_name(dtype));
    if (count > 0 && !data)
        return probe_set_error(PROBE_EINVAL, "rounded fingerprint: data is NULL with %zu "
                               "elements", count);
    struct hashes *hs = calloc(1, sizeof *hs);
    if (!hs)
        return probe_set_error(PROBE_ENOMEM, "rounded fingerprint: out of memory");
    probe_status s = hashes_open(hs);
    if (s == PROBE_OK)
        s = dtype != PROBE_DTYPE_FLOAT32 && count >= SMALL
                ? fingerprint_16(dtype, data, count, out, hs)
                : fingerprint_direct(dtype, data, count, out, hs);
    hashes_close(hs, s == PROBE_OK ? out : NULL);
    free(hs);
    if (s != PROBE_OK)
        memset(out, 0, sizeof *out);
    return s;
}
