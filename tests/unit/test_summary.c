/* test_summary.c - probe_summary_compute (probe/metrics.h): the summary of
 * one tensor kept by stats-only capture.
 *
 * Oracles: hand values on small tensors written bit by bit (bfloat16,
 * float16, FP8, int); a long double evaluation of the sums on 10^5 random
 * float64 elements (relative 1e-13); the order rule for -0/+0; bad
 * arguments.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "probe/metrics.h"

Test(summary, float32_hand_values)
{
    const float x[6] = {1.0f, -2.0f, 3.5f, NAN, INFINITY, -0.5f};
    probe_summary s;
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT32, x, 6, &s), PROBE_OK, "%s",
                 probe_last_error());
    cr_assert_eq(s.n, 6);
    cr_assert_eq(s.n_finite, 4);
    cr_assert_eq(s.nan, 1);
    cr_assert_eq(s.inf, 1);
    cr_assert_eq(s.min, -2.0);
    cr_assert_eq(s.max, 3.5);
    cr_assert_eq(s.abs_max, 3.5);
    cr_assert_eq(s.sum, 2.0);              /* 1 - 2 + 3.5 - 0.5 */
    cr_assert_eq(s.sum_sq, 1 + 4 + 12.25 + 0.25);
}

Test(summary, bfloat16_float16_fp8_int)
{
    /* bfloat16 1.0 = 0x3F80, -3.0 = 0xC040, -inf = 0xFF80 */
    const uint16_t b[3] = {0x3F80, 0xC040, 0xFF80};
    probe_summary s;
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_BFLOAT16, b, 3, &s), PROBE_OK);
    cr_assert_eq(s.n_finite, 2);
    cr_assert_eq(s.inf, 1);
    cr_assert_eq(s.min, -3.0);
    cr_assert_eq(s.abs_max, 3.0);
    cr_assert_eq(s.sum, -2.0);
    /* float16: smallest subnormal 0x0001 = 2^-24, NaN 0x7E00 */
    const uint16_t h[2] = {0x0001, 0x7E00};
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT16, h, 2, &s), PROBE_OK);
    cr_assert_eq(s.n_finite, 1);
    cr_assert_eq(s.nan, 1);
    cr_assert_eq(s.max, ldexp(1.0, -24));
    cr_assert_eq(s.sum_sq, ldexp(1.0, -48));
    /* e4m3fn: 0x7E = 448 (max), 0x7F and 0xFF = NaN (no infinities) */
    const uint8_t e4[3] = {0x7E, 0x7F, 0xFF};
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT8_E4M3FN, e4, 3, &s), PROBE_OK);
    cr_assert_eq(s.n_finite, 1);
    cr_assert_eq(s.nan, 2);
    cr_assert_eq(s.inf, 0);
    cr_assert_eq(s.max, 448.0);
    /* e5m2: 0x7C = +inf, 0x7D..0x7F = NaN, 0x7B = 57344 */
    const uint8_t e5[5] = {0x7C, 0x7D, 0x7E, 0x7F, 0x7B};
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT8_E5M2, e5, 5, &s), PROBE_OK);
    cr_assert_eq(s.inf, 1);
    cr_assert_eq(s.nan, 3);
    cr_assert_eq(s.max, 57344.0);
    const int64_t iv[3] = {-5, 7, 0};
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_INT64, iv, 3, &s), PROBE_OK);
    cr_assert_eq(s.min, -5.0);
    cr_assert_eq(s.max, 7.0);
    cr_assert_eq(s.abs_max, 7.0);
    cr_assert_eq(s.sum_sq, 74.0);
}

Test(summary, signed_zero_order)
{
    const double a[2] = {0.0, -0.0}, b[2] = {-0.0, 0.0};
    probe_summary s, t;
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT64, a, 2, &s), PROBE_OK);
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT64, b, 2, &t), PROBE_OK);
    cr_assert(signbit(s.min) && !signbit(s.max));
    cr_assert(signbit(t.min) && !signbit(t.max));
}

Test(summary, empty_and_all_nonfinite)
{
    probe_summary s;
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT32, NULL, 0, &s), PROBE_OK);
    cr_assert_eq(s.n, 0);
    cr_assert(isnan(s.min) && isnan(s.max) && isnan(s.abs_max));
    cr_assert_eq(s.sum, 0.0);
    const double x[2] = {NAN, -INFINITY};
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT64, x, 2, &s), PROBE_OK);
    cr_assert_eq(s.n_finite, 0);
    cr_assert(isnan(s.min) && isnan(s.abs_max));
}

Test(summary, compensated_sums_vs_long_double)
{
    enum { N = 100000 };
    static double x[N];
    uint64_t st = 12345;
    long double ls = 0, lq = 0, mag = 0, magq = 0;
    for (int i = 0; i < N; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(st >> 11) / 9007199254740992.0;     /* [0,1) */
        x[i] = (u - 0.5) * pow(10.0, (double)(i % 17) - 8.0) + 1e3; /* offset, wide range */
        ls += x[i];
        lq += (long double)x[i] * x[i];
        mag += fabsl((long double)x[i]);
        magq += (long double)x[i] * x[i];
    }
    probe_summary s;
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT64, x, N, &s), PROBE_OK);
    cr_assert(fabsl((long double)s.sum - ls) <= 1e-13L * mag, "sum %.17g vs %.17Lg", s.sum, ls);
    cr_assert(fabsl((long double)s.sum_sq - lq) <= 1e-13L * magq, "sum_sq %.17g vs %.17Lg",
              s.sum_sq, lq);
    cr_assert_eq(s.n_finite, N);
}

Test(summary, bad_arguments)
{
    const float x[1] = {1};
    probe_summary s;
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT32, x, 1, NULL), PROBE_EINVAL);
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_INVALID, x, 1, &s), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "unknown element type") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT32, NULL, 1, &s), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "x is NULL") != NULL, "%s", probe_last_error());
}
