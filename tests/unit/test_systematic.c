/* test_systematic.c - the systematic-difference statistics of
 * probe/metrics.h (relative gain error with its HC0 standard error and z,
 * per-channel mean shift z), NaN in the reference only, identity by element
 * type and bytes, exact differences of 64-bit integers, and mismatches in
 * ulps: each against a direct long double computation or a hand-derived
 * value, on one and several threads and across chunk boundaries.
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
} mem_src;

static probe_status mem_read(void *ctx, int side, uint64_t off, size_t n, void *dst)
{
    mem_src *m = ctx;
    memcpy(dst, (const char *)m->p[side] + off * m->es[side], n * m->es[side]);
    return PROBE_OK;
}

static probe_metrics run(probe_dtype rt, const void *r, probe_dtype ct, const void *c, uint64_t n,
                         int threads, probe_channel_spec ch, probe_channel_shift *shift,
                         double *mean_out, double *se_out, double *n_out)
{
    mem_src m = {{r, c}, {probe_dtype_size(rt), probe_dtype_size(ct)}};
    probe_pair_source src = {n, {rt, ct}, mem_read, &m};
    probe_stream_opts so = {threads, ch, mean_out, se_out, n_out};
    probe_metrics out;
    probe_channel_shift tmp;
    cr_assert_eq(probe_metrics_compute_source(&src, &TOL, &so, &out, shift ? shift : &tmp),
                 PROBE_OK, "%s", probe_last_error());
    return out;
}

/* A deterministic pseudo-random sequence in [-1, 1). */
static double rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 4503599627370496.0 - 1.0;
}

/* The gain error the direct way: alpha first, then the residuals. */
static void gain_oracle(const double *r, const double *c, size_t n, long double *a,
                        long double *se)
{
    long double dr = 0, rr = 0;
    for (size_t i = 0; i < n; i++) {
        long double d = (long double)c[i] - r[i];
        dr += d * r[i];
        rr += (long double)r[i] * r[i];
    }
    *a = dr / rr;
    long double q = 0;
    for (size_t i = 0; i < n; i++) {
        long double e = ((long double)c[i] - r[i]) - *a * r[i];
        q += (long double)r[i] * r[i] * e * e;
    }
    *se = sqrtl(q) / rr;
}

static int close_rel(double x, long double want, double tol)
{
    return fabsl((long double)x - want) <= tol * fabsl(want);
}

Test(systematic, gain_against_direct_computation)
{
    enum { N = 300000 }; /* more than two chunks of 131072 */
    double *r = malloc(N * sizeof *r), *c = malloc(N * sizeof *c);
    uint64_t s = 7;
    for (size_t i = 0; i < N; i++) {
        r[i] = rnd(&s) * 3.0;
        /* noise whose variance grows with |r| (heteroscedastic), plus a 1e-3 gain */
        c[i] = r[i] * (1.0 + 1e-3) + 1e-2 * fabs(r[i]) * rnd(&s);
    }
    long double a, se;
    gain_oracle(r, c, N, &a, &se);
    probe_channel_spec none = {0, 0};
    probe_metrics m1 = run(PROBE_DTYPE_FLOAT64, r, PROBE_DTYPE_FLOAT64, c, N, 1, none, NULL, NULL,
                           NULL, NULL);
    probe_metrics m4 = run(PROBE_DTYPE_FLOAT64, r, PROBE_DTYPE_FLOAT64, c, N, 4, none, NULL, NULL,
                           NULL, NULL);
    cr_assert(close_rel(m1.gain, a, 1e-10), "gain %.17g want %.17Lg", m1.gain, a);
    cr_assert(close_rel(m1.gain_se, se, 1e-8), "se %.17g want %.17Lg", m1.gain_se, se);
    cr_assert(close_rel(m1.gain_z, a / se, 1e-8), "z %.17g", m1.gain_z);
    cr_assert(m1.gain_z > 10, "a 1e-3 gain under 1e-2 noise on 3e5 elements is significant");
    /* the same bits on any number of threads */
    cr_assert_eq(memcmp(&m1, &m4, sizeof m1), 0);
    free(r);
    free(c);
}

Test(systematic, gain_hand_derived)
{
    /* d = (0.5, -0.5, 0.25, 0) on r = (1, 2, 2, 4): <d,r> = 0.5 - 1 + 0.5 = 0,
     * so alpha = 0; residuals e = d; sum r^2 e^2 = 0.25 + 1 + 0.25 = 1.5,
     * <r,r> = 25: se = sqrt(1.5) / 25; z = 0 */
    const double r[4] = {1, 2, 2, 4}, c[4] = {1.5, 1.5, 2.25, 4};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(r, c, 4, &TOL, &m), PROBE_OK);
    cr_assert_eq(m.gain, 0.0);
    cr_assert(fabs(m.gain_se - sqrt(1.5) / 25.0) < 1e-16);
    cr_assert_eq(m.gain_z, 0.0);
    /* c = 2 r exactly: alpha = 1, no residual: z infinite */
    const double c2[4] = {2, 4, 4, 8};
    cr_assert_eq(probe_metrics_compute(r, c2, 4, &TOL, &m), PROBE_OK);
    cr_assert_eq(m.gain, 1.0);
    cr_assert_eq(m.gain_se, 0.0);
    cr_assert(isinf(m.gain_z) && m.gain_z > 0);
    /* a zero reference: no gain is defined */
    const double z[3] = {0, 0, 0}, c3[3] = {1, 0, 0};
    cr_assert_eq(probe_metrics_compute(z, c3, 3, &TOL, &m), PROBE_OK);
    cr_assert(m.gain == 0.0 && m.gain_se == 0.0 && m.gain_z == 0.0);
}

Test(systematic, gain_extreme_float64_range)
{
    /* values near 2^280 need the scaled pass (fourth powers overflow):
     * alpha and z equal those of the same pair scaled down by 2^280 */
    enum { N = 1000 };
    double r[N], c[N], rs[N], cs[N];
    uint64_t s = 3;
    for (int i = 0; i < N; i++) {
        rs[i] = rnd(&s);
        cs[i] = rs[i] * 1.01 + 0.01 * rnd(&s);
        r[i] = ldexp(rs[i], 280);
        c[i] = ldexp(cs[i], 280);
    }
    probe_metrics big, small;
    cr_assert_eq(probe_metrics_compute(r, c, N, &TOL, &big), PROBE_OK);
    cr_assert_eq(probe_metrics_compute(rs, cs, N, &TOL, &small), PROBE_OK);
    cr_assert(isfinite(big.gain_z) && isfinite(big.gain_se));
    cr_assert(fabs(big.gain - small.gain) <= 1e-13 * fabs(small.gain), "%.17g %.17g", big.gain,
              small.gain);
    cr_assert(fabs(big.gain_z - small.gain_z) <= 1e-12 * fabs(small.gain_z));
}

Test(systematic, channel_z_against_direct_computation)
{
    /* [3, 50000]: channel 0 noise, channel 1 noise + a shift of 0.05 of its
     * sd, channel 2 no difference at all; inner 50000 crosses chunks */
    enum { C = 3, I = 50000, N = C * I };
    double *r = malloc(N * sizeof *r), *c = malloc(N * sizeof *c);
    uint64_t s = 11;
    for (int k = 0; k < C; k++)
        for (int i = 0; i < I; i++) {
            size_t j = (size_t)k * I + i;
            r[j] = rnd(&s);
            c[j] = k == 2 ? r[j] : r[j] + 1e-2 * rnd(&s) + (k == 1 ? 0.05 * 1e-2 / sqrt(3.0) : 0);
        }
    probe_channel_spec ch = {C, I};
    double mean[C], se[C], nk[C];
    probe_channel_shift sh1, sh3;
    probe_metrics m1 = run(PROBE_DTYPE_FLOAT64, r, PROBE_DTYPE_FLOAT64, c, N, 1, ch, &sh1, mean, se,
                           nk);
    probe_metrics m3 = run(PROBE_DTYPE_FLOAT64, r, PROBE_DTYPE_FLOAT64, c, N, 3, ch, &sh3, NULL,
                           NULL, NULL);
    cr_assert_eq(memcmp(&m1, &m3, sizeof m1), 0);
    cr_assert_eq(memcmp(&sh1, &sh3, sizeof sh1), 0);
    for (int k = 0; k < C; k++) {
        long double sum = 0, q = 0;
        for (int i = 0; i < I; i++)
            sum += (long double)c[(size_t)k * I + i] - r[(size_t)k * I + i];
        long double mu = sum / I;
        for (int i = 0; i < I; i++) {
            long double e = ((long double)c[(size_t)k * I + i] - r[(size_t)k * I + i]) - mu;
            q += e * e;
        }
        long double want_se = sqrtl(q / (I - 1) / I);
        cr_assert_eq(nk[k], (double)I);
        cr_assert(fabsl(mean[k] - mu) <= 1e-12L * fabsl(mu) + 1e-19L, "mean %d", k);
        if (k == 2)
            cr_assert(mean[k] == 0 && se[k] == 0);
        else
            cr_assert(close_rel(se[k], want_se, 1e-10), "se %d %.17g %.17Lg", k, se[k], want_se);
    }
    /* channel 1 carries the shift: z about 0.05 * sqrt(50000) / 1 = 11 */
    cr_assert_eq(sh1.z_argmax, 1);
    cr_assert(close_rel(sh1.z_max, (long double)mean[1] / se[1], 1e-15));
    cr_assert(sh1.z_max > 6 && sh1.z_max < 20, "z %g", sh1.z_max);
    free(r);
    free(c);
}

Test(systematic, channel_z_degenerate_channels)
{
    /* channel 0: d = 0 everywhere (z 0); channel 1: a constant shift with no
     * spread (z infinite); channel 2: one element (n < 2: se NaN, z 0) */
    const double r[5] = {1, 2, 3, 4, 5}, c[5] = {1, 2, 3.5, 4.5, 5};
    double mean[3], se[3], nk[3];
    probe_channel_shift sh;
    probe_channel_spec ch5 = {5, 1};
    double mean5[5], se5[5], n5[5];
    run(PROBE_DTYPE_FLOAT64, r, PROBE_DTYPE_FLOAT64, c, 5, 1, ch5, &sh, mean5, se5, n5);
    for (int k = 0; k < 5; k++)
        cr_assert(isnan(se5[k]) && n5[k] == 1.0);
    cr_assert_eq(sh.z_max, 0.0);
    const double r6[6] = {1, 1, 2, 2, 3, 3}, c6[6] = {1, 1, 2.5, 2.5, 3, 3.5};
    probe_channel_spec ch3 = {3, 2};
    run(PROBE_DTYPE_FLOAT64, r6, PROBE_DTYPE_FLOAT64, c6, 6, 1, ch3, &sh, mean, se, nk);
    cr_assert(mean[0] == 0 && se[0] == 0);
    cr_assert(mean[1] == 0.5 && se[1] == 0);
    cr_assert(mean[2] == 0.25 && fabs(se[2] - 0.25) < 1e-16); /* s = sqrt(0.125), se = s/sqrt(2) */
    cr_assert_eq(sh.z_argmax, 1);
    cr_assert(isinf(sh.z_max) && sh.z_max > 0);
}

Test(systematic, nan_in_reference_only)
{
    const double r[4] = {NAN, NAN, 1, INFINITY}, c[4] = {1, NAN, 1, 2};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(r, c, 4, &TOL, &m), PROBE_OK);
    cr_assert_eq(m.nan_ref_only, 1); /* index 0; index 1 is NaN on both sides */
    cr_assert_eq(m.inf_mismatch, 1);
    /* an all-NaN reference against a finite candidate */
    const double rn[3] = {NAN, NAN, NAN}, cf[3] = {1, 2, 3};
    cr_assert_eq(probe_metrics_compute(rn, cf, 3, &TOL, &m), PROBE_OK);
    cr_assert_eq(m.nan_ref_only, 3);
    cr_assert_eq(m.identical, 0);
}

Test(systematic, identity_is_element_type_and_bytes)
{
    /* int64 beyond 2^53: 2^62+1 vs 2^62+2 round to the same double */
    const int64_t a[2] = {((int64_t)1 << 62) + 1, 5}, b[2] = {((int64_t)1 << 62) + 2, 5};
    probe_metrics m;
    probe_metrics_opts exact = {0, 0};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_INT64, a, PROBE_DTYPE_INT64, b, 2, &exact,
                                             &m), PROBE_OK);
    cr_assert_eq(m.identical, 0);
    cr_assert_eq(m.max_abs, 1.0); /* the difference is formed exactly */
    cr_assert_eq(m.max_abs_offset, 0);
    cr_assert_eq(m.mismatch_count, 1);
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_INT64, a, PROBE_DTYPE_INT64, a, 2, &exact,
                                             &m), PROBE_OK);
    cr_assert_eq(m.identical, 1);
    /* uint64 extremes: 2^64-1 vs 0 */
    const uint64_t u0[1] = {UINT64_MAX}, u1[1] = {0};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_UINT64, u0, PROBE_DTYPE_UINT64, u1, 1,
                                             &exact, &m), PROBE_OK);
    cr_assert_eq(m.max_abs, 18446744073709551615.0);
    /* the same values in two element types are never identical */
    const double d2[2] = {1.5, -2};
    const float f2[2] = {1.5f, -2};
    const int32_t i2[2] = {1, 2};
    const float fi2[2] = {1, 2};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT64, d2, PROBE_DTYPE_FLOAT32, f2, 2,
                                             &TOL, &m), PROBE_OK);
    cr_assert(m.identical == 0 && m.rel_l2 == 0.0);
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_INT32, i2, PROBE_DTYPE_FLOAT32, fi2, 2,
                                             &TOL, &m), PROBE_OK);
    cr_assert(m.identical == 0 && m.rel_l2 == 0.0);
    /* NaN payloads are bytes too; bool compares truth values */
    const uint32_t n0[1] = {0x7FC00000u}, n1[1] = {0x7FC00001u};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, n0, PROBE_DTYPE_FLOAT32, n1, 1,
                                             &TOL, &m), PROBE_OK);
    cr_assert_eq(m.identical, 0);
    const uint8_t t1[2] = {1, 0}, t2[2] = {2, 0};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_BOOL, t1, PROBE_DTYPE_BOOL, t2, 2, &TOL,
                                             &m), PROBE_OK);
    cr_assert_eq(m.identical, 1);
}

Test(systematic, mismatch_in_ulps)
{
    /* bfloat16: 1.0 = 0x3F80 (spacing 2^-7), 0.5 = 0x3F00 (spacing 2^-8),
     * the smallest subnormal 0x0001 = 2^-133 (spacing 2^-133) */
    const uint16_t r[3] = {0x3F80, 0x3F00, 0x0001}, c[3] = {0x3F82, 0x3F01, 0x0002};
    probe_metrics_opts exact = {0, 0};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_BFLOAT16, r, PROBE_DTYPE_BFLOAT16, c, 3,
                                             &exact, &m), PROBE_OK);
    cr_assert_eq(m.mismatch_count, 3);
    cr_assert_eq(m.mismatch_ulps_max, 2.0); /* 1.0 vs 1.0 + 2^-6: 2 ulps */
    /* max_abs 2^-6 against the spacing 2^-7 at the largest magnitude (1 + 2^-6) */
    cr_assert_eq(m.max_abs_ulps_scale, 2.0);
    /* 0.5 vs 0.5 + 2^-8 next to a 1.0: one ulp of its own, half an ulp of the largest */
    const uint16_t r2[2] = {0x3F80, 0x3F00}, c2[2] = {0x3F80, 0x3F01};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_BFLOAT16, r2, PROBE_DTYPE_BFLOAT16, c2, 2,
                                             &exact, &m), PROBE_OK);
    cr_assert(m.mismatch_ulps_max == 1.0 && m.max_abs_ulps_scale == 0.5);
    /* float32 reference, bfloat16 candidate: measured in bfloat16 ulps */
    const float rf[1] = {1.0f};
    const uint16_t cb[1] = {0x3F81};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, rf, PROBE_DTYPE_BFLOAT16, cb, 1,
                                             &exact, &m), PROBE_OK);
    cr_assert_eq(m.mismatch_ulps_max, 1.0);
    /* no mismatch, or integers: NaN */
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_BFLOAT16, r, PROBE_DTYPE_BFLOAT16, r, 3,
                                             &exact, &m), PROBE_OK);
    cr_assert(isnan(m.mismatch_ulps_max));
    const int32_t i0[1] = {1}, i1[1] = {3};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_INT32, i0, PROBE_DTYPE_INT32, i1, 1,
                                             &exact, &m), PROBE_OK);
    cr_assert(m.mismatch_count == 1 && isnan(m.mismatch_ulps_max));
}

/* probe_channel_z: z = shift / se, with its degenerate cases, hand-derived */
#include "probe/verdict.h"
Test(systematic, channel_z_of_arrays)
{
    double shift[6] = {0.3, -0.3, 0.0, 0.5, NAN, 0.2};
    double se[6] = {0.1, 0.2, 0.0, 0.0, 0.1, 0.1};
    double nk[6] = {10, 10, 10, 10, 10, 1};
    double z[6];
    cr_assert_eq(probe_channel_z(shift, se, nk, 6, z), PROBE_OK);
    cr_assert_float_eq(z[0], 3.0, 1e-15);
    cr_assert_float_eq(z[1], -1.5, 1e-15);
    cr_assert_eq(z[2], 0.0, "no shift: 0 even with se 0");
    cr_assert(isinf(z[3]) && z[3] > 0, "se 0 < |shift|: +inf");
    cr_assert(isnan(z[4]), "NaN shift: not defined");
    cr_assert(isnan(z[5]), "n_k < 2: not defined");
    cr_assert_eq(probe_channel_z(NULL, se, nk, 6, z), PROBE_EINVAL);
    cr_assert_eq(probe_channel_z(NULL, NULL, NULL, 0, NULL), PROBE_OK);
}
