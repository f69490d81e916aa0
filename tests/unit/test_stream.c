/* test_stream.c - probe_metrics_compute_source (probe/metrics.h): the
 * streaming engine's radix-select p99 at every level (values derived by
 * counting), results independent of the thread count, the fp64 range
 * rescale on the radix path, the per-channel mean shift against a direct
 * fp64 loop, a bf16 candidate against an fp32 reference, errors from the
 * source, and bad arguments.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "probe/metrics.h"

static const probe_metrics_opts TOL = {1e-3, 1e-3};

typedef struct {
    const void *p[2];
    size_t es[2];
    uint64_t fail_at; /* read of an offset >= this fails (UINT64_MAX: never) */
    int reads;
} mem_src;

static probe_status mem_read(void *ctx, int side, uint64_t off, size_t n, void *dst)
{
    mem_src *m = ctx;
    m->reads++;
    if (off + n > m->fail_at)
        return probe_set_error(PROBE_EIO, "disk on fire at element %llu", (unsigned long long)off);
    memcpy(dst, (const char *)m->p[side] + off * m->es[side], n * m->es[side]);
    return PROBE_OK;
}

static probe_pair_source f64_source(mem_src *m, const double *r, const double *c, uint64_t n)
{
    m->p[0] = r;
    m->p[1] = c;
    m->es[0] = m->es[1] = sizeof(double);
    m->fail_at = UINT64_MAX;
    m->reads = 0;
    probe_pair_source s = {n, {PROBE_DTYPE_FLOAT64, PROBE_DTYPE_FLOAT64}, mem_read, m};
    return s;
}

/* nearest rank of q=99 among n: ceil(0.99 n), 1-based */
static uint64_t rank99(uint64_t n)
{
    return (uint64_t)ceil(99.0 * (double)n / 100.0);
}

/* r = 0, c[i] = base + (i % K) * step: the p99 is the value whose class
 * holds the rank, counted exactly. */
static double p99_by_count(uint64_t n, int K, double base, double step)
{
    uint64_t want = rank99(n), below = 0;
    for (int k = 0; k < K; k++) {
        uint64_t cnt = n / (uint64_t)K + ((uint64_t)k < n % (uint64_t)K);
        if (below + cnt >= want)
            return base + k * step;
        below += cnt;
    }
    return NAN;
}

static void radix_case(uint64_t n, int K, double base, double step)
{
    double *r = calloc(n, sizeof *r), *c = malloc(n * sizeof *c);
    cr_assert(r && c);
    for (uint64_t i = 0; i < n; i++)
        c[i] = base + (double)(i % (uint64_t)K) * step;
    mem_src ms;
    probe_pair_source src = f64_source(&ms, r, c, n);
    probe_metrics m;
    probe_stream_opts so = {2, {0, 0}, NULL, NULL, NULL};
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &m, NULL), PROBE_OK, "%s",
                 probe_last_error());
    double want = p99_by_count(n, K, base, step);
    cr_assert_eq(m.p99_abs, want, "p99 %.17g, want %.17g (n %llu, K %d)", m.p99_abs, want,
                 (unsigned long long)n, K);
    cr_assert_eq(m.max_abs, base + (K - 1) * step);
    cr_assert_eq(m.max_abs_offset, (uint64_t)(K - 1));
    cr_assert_eq(m.n_finite, n);
    free(r);
    free(c);
}

Test(stream, radix_p99_one_bucket_to_the_last_digit, .timeout = 120)
{
    /* 9M values 1 + k 2^-40: all share the top 48 bits, the bucket of the
     * rank exceeds the candidate limit at levels 1-3, the 4th digit decides */
    radix_case(9000000, 7, 1.0, 0x1p-40);
}

Test(stream, radix_p99_collects_after_the_second_digit, .timeout = 120)
{
    /* 1 + k 2^-30, k < 1000: one top-16-bit bucket of 9M, split by digit 2 */
    radix_case(9000000, 1000, 1.0, 0x1p-30);
}

Test(stream, radix_p99_spread_values, .timeout = 120)
{
    /* 2^-20 k, k < 1000: many buckets at level 1 */
    radix_case((1u << 23) + 77, 1000, 0.0, 0x1p-20);
}

Test(stream, radix_all_equal_and_zero_p99, .timeout = 120)
{
    uint64_t n = (1u << 23) + 5;
    double *r = malloc(n * sizeof *r);
    cr_assert(r);
    for (uint64_t i = 0; i < n; i++)
        r[i] = (double)(i % 11) - 5.0;
    mem_src ms;
    probe_pair_source src = f64_source(&ms, r, r, n);
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, NULL, &m, NULL), PROBE_OK);
    cr_assert_eq(m.cosine, 1.0);
    cr_assert_eq(m.p99_abs, 0.0);
    cr_assert_eq(m.rel_l2, 0.0);
    cr_assert(m.identical);
    /* all equal: one pass only (p99 = 0 from the count of zero differences) */
    cr_assert_eq(ms.reads, 2 * (int)((n + 131071) / 131072), "reads %d", ms.reads);
    free(r);
}

static void random_pair(double *r, double *c, size_t n, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        r[i] = (rand() / (double)RAND_MAX - 0.5) * 8.0;
        c[i] = r[i] + (rand() / (double)RAND_MAX - 0.5) * 1e-3;
    }
    r[17] = NAN;
    c[1000] = INFINITY;
    r[2000] = c[2000] = -INFINITY;
}

Test(stream, same_bits_for_any_thread_count, .timeout = 120)
{
    size_t n = 1000006; /* 7 x 142858 */
    double *r = malloc(n * sizeof *r), *c = malloc(n * sizeof *c);
    cr_assert(r && c);
    random_pair(r, c, n, 7);
    double shift0[7], shift1[7];
    probe_metrics m0, m1;
    probe_channel_shift s0, s1;
    for (int th = 1; th <= 8; th++) {
        mem_src ms;
        probe_pair_source src = f64_source(&ms, r, c, n);
        probe_stream_opts so = {th, {7, 1}, th == 1 ? shift0 : shift1, NULL, NULL};
        probe_metrics *m = th == 1 ? &m0 : &m1;
        probe_channel_shift *s = th == 1 ? &s0 : &s1;
        cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, m, s), PROBE_OK);
        if (th > 1) {
            cr_assert_eq(memcmp(&m0, &m1, sizeof m0), 0, "metrics differ with %d threads", th);
            cr_assert_eq(memcmp(&s0, &s1, sizeof s0), 0, "channel shift differs with %d threads", th);
            cr_assert_eq(memcmp(shift0, shift1, sizeof shift0), 0);
        }
    }
    /* and the in-memory entry point is the same computation */
    probe_metrics mm;
    cr_assert_eq(probe_metrics_compute(r, c, n, &TOL, &mm), PROBE_OK);
    cr_assert_eq(memcmp(&m0, &mm, sizeof mm), 0);
    free(r);
    free(c);
}

Test(stream, channel_shift_against_direct_loop, .timeout = 60)
{
    /* shape [3, 5, 100003]: axis 1 (count 5, inner 100003): channel runs
     * straddle the 131072-element chunks */
    const uint64_t B = 3, C = 5, I = 100003, n = B * C * I;
    double *r = malloc(n * sizeof *r), *c = malloc(n * sizeof *c);
    cr_assert(r && c);
    random_pair(r, c, n, 11);
    for (uint64_t i = 0; i < n; i++)
        if ((i / I) % C == 3)
            c[i] += 0.01; /* bias on channel 3 */
    double shift[5];
    probe_stream_opts so = {2, {C, I}, shift, NULL, NULL};
    probe_channel_shift cs;
    probe_metrics m;
    mem_src ms;
    probe_pair_source src = f64_source(&ms, r, c, n);
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &m, &cs), PROBE_OK);
    /* direct two-pass fp64 loop, long double sums */
    for (uint64_t k = 0; k < C; k++) {
        long double sd = 0, sr = 0, q = 0;
        uint64_t cnt = 0;
        for (uint64_t b = 0; b < B; b++)
            for (uint64_t j = 0; j < I; j++) {
                uint64_t i = (b * C + k) * I + j;
                if (isfinite(r[i]) && isfinite(c[i])) {
                    sd += (long double)c[i] - r[i];
                    sr += r[i];
                    cnt++;
                }
            }
        long double mean = sr / cnt;
        for (uint64_t b = 0; b < B; b++)
            for (uint64_t j = 0; j < I; j++) {
                uint64_t i = (b * C + k) * I + j;
                if (isfinite(r[i]) && isfinite(c[i]))
                    q += (r[i] - mean) * (r[i] - mean);
            }
        double want = (double)(sd / cnt);
        cr_assert(fabs(shift[k] - want) <= 1e-12 * fabs(want) + 1e-18, "channel %llu: %.17g vs %.17g",
                  (unsigned long long)k, shift[k], want);
        if (k == 3) {
            double sd_r = (double)sqrtl(q / cnt);
            cr_assert_eq(cs.argmax, 3);
            cr_assert(fabs(cs.max - want) <= 1e-12 * fabs(want));
            cr_assert(fabs(cs.std_ref - sd_r) <= 1e-12 * sd_r, "%.17g vs %.17g", cs.std_ref, sd_r);
            cr_assert(fabs(cs.max_rel - want / sd_r) <= 1e-12 * fabs(want / sd_r));
        }
    }
    cr_assert_eq(cs.count, C);
    free(r);
    free(c);
}

Test(stream, channel_shift_by_hand)
{
    /* [2 channels, 2]: channel 0: d = (1, 1) over r = (0, 2): shift 1, std 1;
     * channel 1: d = (0, -3) over r = (5, 5): shift -1.5, std 0 -> rel -inf */
    double r[4] = {0, 2, 5, 5}, c[4] = {1, 3, 5, 2};
    mem_src ms;
    probe_pair_source src = f64_source(&ms, r, c, 4);
    probe_stream_opts so = {1, {2, 2}, NULL, NULL, NULL};
    probe_channel_shift cs;
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &m, &cs), PROBE_OK);
    cr_assert_eq(cs.argmax, 1);
    cr_assert_eq(cs.max, -1.5);
    cr_assert_eq(cs.std_ref, 0.0);
    cr_assert(isinf(cs.max_rel) && cs.max_rel < 0);
    /* identical channels: shift 0, rel 0 */
    src = f64_source(&ms, r, r, 4);
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &m, &cs), PROBE_OK);
    cr_assert_eq(cs.max, 0.0);
    cr_assert_eq(cs.max_rel, 0.0);
    cr_assert_eq(cs.argmax, 0);
}

Test(stream, extreme_float64_on_the_radix_path, .timeout = 120)
{
    /* x and 2^900 x give the same rel_l2 and cosine (exact power-of-two
     * scaling), max/p99 scaled by 2^900 */
    uint64_t n = (1u << 23) + 3;
    double *r = malloc(n * sizeof *r), *c = malloc(n * sizeof *c);
    double *R = malloc(n * sizeof *R), *C = malloc(n * sizeof *C);
    cr_assert(r && c && R && C);
    random_pair(r, c, n, 5);
    for (uint64_t i = 0; i < n; i++) {
        R[i] = ldexp(r[i], 900);
        C[i] = ldexp(c[i], 900);
    }
    probe_metrics a, b;
    mem_src ms;
    probe_pair_source src = f64_source(&ms, r, c, n);
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, NULL, &a, NULL), PROBE_OK);
    src = f64_source(&ms, R, C, n);
    probe_metrics_opts big = {ldexp(1e-3, 900), 1e-3};
    cr_assert_eq(probe_metrics_compute_source(&src, &big, NULL, &b, NULL), PROBE_OK);
    cr_assert(isfinite(b.rel_l2) && fabs(b.rel_l2 - a.rel_l2) <= 1e-15 * a.rel_l2,
              "%.17g vs %.17g", b.rel_l2, a.rel_l2);
    cr_assert(fabs(b.cosine - a.cosine) <= 1e-15);
    cr_assert_eq(b.max_abs, ldexp(a.max_abs, 900));
    cr_assert_eq(b.p99_abs, ldexp(a.p99_abs, 900));
    cr_assert_eq(b.max_abs_offset, a.max_abs_offset);
    cr_assert(fabs(b.norm_ref - ldexp(a.norm_ref, 900)) <= 1e-15 * b.norm_ref);
    free(r);
    free(c);
    free(R);
    free(C);
}

Test(stream, subnormal_float64)
{
    /* r = k 2^-1070, c = r + 2^-1074 (subnormals): sums rescaled, exact here */
    enum { N = 64 };
    double r[N], c[N];
    for (int i = 0; i < N; i++) {
        r[i] = ldexp((double)(i + 1), -1070);
        c[i] = r[i] + ldexp(1.0, -1074);
    }
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(r, c, N, &TOL, &m), PROBE_OK);
    /* ||d|| = 2^-1074 sqrt(64) = 2^-1071; ||r|| = 2^-1070 sqrt(sum k^2, k=1..64) */
    double want = 0.5 / sqrt(64.0 * 65 * 129 / 6); /* no subnormal intermediate */
    cr_assert(fabs(m.rel_l2 - want) <= 1e-15 * want, "%.17g vs %.17g", m.rel_l2, want);
    cr_assert_eq(m.p99_abs, ldexp(1.0, -1074));
    cr_assert(!m.zero_norm_reference);
}

Test(stream, bf16_candidate_against_fp32_reference)
{
    /* r = 1 + k/1024 in fp32; c = r rounded to bf16 (truncation toward
     * zero for these values: 1 + k/1024 has 7 mantissa bits kept when
     * k % 8 == 0); the difference by hand */
    enum { N = 1024 };
    float r[N];
    uint16_t c[N];
    double rd[N], cd[N];
    for (int k = 0; k < N; k++) {
        r[k] = 1.0f + (float)k / 1024.0f;
        uint32_t b;
        memcpy(&b, &r[k], 4);
        c[k] = (uint16_t)(b >> 16); /* truncate */
        uint32_t cb = (uint32_t)c[k] << 16;
        float cf;
        memcpy(&cf, &cb, 4);
        rd[k] = r[k];
        cd[k] = cf;
    }
    probe_metrics a, b;
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, r, PROBE_DTYPE_BFLOAT16, c, N,
                                             &TOL, &a), PROBE_OK);
    cr_assert_eq(probe_metrics_compute(rd, cd, N, &TOL, &b), PROBE_OK);
    /* The fields of the element types: the largest mismatch in bfloat16 ulps
     * (spacing 2^-7 on [1, 2): |d| = 7/1024 is 7/8 ulp), and float64 vs
     * float64 has its own; float32 vs bfloat16 is never identical. */
    cr_assert_eq(a.mismatch_ulps_max, 0.875);
    cr_assert_eq(b.mismatch_ulps_max, 7.0 / 1024.0 * 0x1p52);
    cr_assert_eq(a.identical, 0);
    b.mismatch_ulps_max = a.mismatch_ulps_max;
    cr_assert_eq(a.max_abs_ulps_scale, 7.0 / 1024.0 / 0x1p-7); /* the largest element is < 2 */
    b.max_abs_ulps_scale = a.max_abs_ulps_scale;
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0);
    /* 1 + k/1024 truncated to 7 mantissa bits: |d| = (k % 8)/1024 for k < 1024 */
    cr_assert_eq(a.max_abs, 7.0 / 1024.0);
    cr_assert_eq(a.max_abs_offset, 7);
    cr_assert_eq(a.p99_abs, 7.0 / 1024.0);
}

Test(stream, n_one)
{
    double r = 2.0, c = 2.5;
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(&r, &c, 1, &TOL, &m), PROBE_OK);
    cr_assert_eq(m.p99_abs, 0.5);
    cr_assert_eq(m.rel_l2, 0.25);
    cr_assert_eq(m.cosine, 1.0);
}

Test(stream, source_error_stops_with_its_message, .timeout = 60)
{
    size_t n = 1000000;
    double *r = calloc(n, sizeof *r);
    cr_assert(r);
    for (int th = 1; th <= 3; th++) {
        mem_src ms;
        probe_pair_source src = f64_source(&ms, r, r, n);
        ms.fail_at = 400000;
        probe_metrics m;
        probe_stream_opts so = {th, {0, 0}, NULL, NULL, NULL};
        cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &m, NULL), PROBE_EIO);
        cr_assert(strstr(probe_last_error(), "disk on fire") != NULL, "%s", probe_last_error());
        cr_assert_eq(m.n, 0, "out is zeroed on error");
    }
    free(r);
}

Test(stream, bad_arguments)
{
    double r[6] = {0};
    mem_src ms;
    probe_pair_source src = f64_source(&ms, r, r, 6);
    probe_metrics m;
    probe_channel_shift cs;
    cr_assert_eq(probe_metrics_compute_source(NULL, &TOL, NULL, &m, NULL), PROBE_EINVAL);
    cr_assert_eq(probe_metrics_compute_source(&src, NULL, NULL, &m, NULL), PROBE_EINVAL);
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, NULL, NULL, NULL), PROBE_EINVAL);
    probe_pair_source bad = src;
    bad.read = NULL;
    cr_assert_eq(probe_metrics_compute_source(&bad, &TOL, NULL, &m, NULL), PROBE_EINVAL);
    bad = src;
    bad.dtype[1] = (probe_dtype)77;
    cr_assert_eq(probe_metrics_compute_source(&bad, &TOL, NULL, &m, NULL), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "77") != NULL, "%s", probe_last_error());
    probe_stream_opts so = {0, {4, 1}, NULL, NULL, NULL}; /* 4 channels do not tile 6 */
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &m, &cs), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "channel") != NULL, "%s", probe_last_error());
    so.channel = (probe_channel_spec){3, 0};
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &m, &cs), PROBE_EINVAL);
    so.channel = (probe_channel_spec){PROBE_CHANNELS_MAX + 1, 1};
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &m, &cs), PROBE_EINVAL);
    probe_metrics_opts neg = {-1, 0};
    cr_assert_eq(probe_metrics_compute_source(&src, &neg, NULL, &m, NULL), PROBE_EINVAL);
}

Test(stream, fp8_nan_and_inf_encodings)
{
    /* OCP FP8: e4m3fn has no infinity, S.1111.111 (0x7F, 0xFF) is NaN;
     * e5m2 is IEEE-like: 0x7C = +inf, 0xFC = -inf, 0x7D..0x7F NaN.
     * reference e4m3fn: 1.0 (0x38), 2.0 (0x40), NaN (0x7F), NaN (0xFF), 0.5 (0x30)
     * candidate e5m2:   1.0 (0x3C), +inf (0x7C), NaN (0x7E), 1.5 (0x3E), -inf (0xFC) */
    const uint8_t r[5] = {0x38, 0x40, 0x7F, 0xFF, 0x30};
    const uint8_t c[5] = {0x3C, 0x7C, 0x7E, 0x3E, 0xFC};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT8_E4M3FN, r, PROBE_DTYPE_FLOAT8_E5M2, c,
                                             5, &TOL, &m), PROBE_OK);
    cr_assert_eq(m.nan_ref, 2);
    cr_assert_eq(m.nan_cand, 1);
    cr_assert_eq(m.inf_ref, 0);
    cr_assert_eq(m.inf_cand, 2);
    cr_assert_eq(m.n_finite, 1, "only index 0 is finite on both sides");
    cr_assert_eq(m.max_abs, 0.0);
    cr_assert_eq(m.p99_abs, 0.0);
    /* 1: 2 vs +inf, 3: NaN vs 1.5, 4: 0.5 vs -inf; NaN vs NaN (2) is no mismatch */
    cr_assert_eq(m.mismatch_count, 3);
    cr_assert_eq(m.inf_mismatch, 2);
    cr_assert(!m.identical);
}
