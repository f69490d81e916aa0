/* test_metrics_typed.c - probe_metrics_compute_typed (probe/metrics.h): the
 * metrics of tensors held in their own element types.
 *
 * Oracles: hand-derived values for small bfloat16/float16/int tensors (their
 * encodings written out bit by bit), and probe_metrics_compute on arrays
 * converted here element by element (memcmp of the whole struct: the typed
 * entry point must be exactly the double one); bad arguments.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "probe/metrics.h"

static const probe_metrics_opts T1_TOL = {1e-3, 1e-3};

Test(metrics_typed, bfloat16_vs_float32_hand_values)
{
    /* bfloat16 1.0 = 0x3F80, 2.0 = 0x4000, -3.0 = 0xC040, 0.5 = 0x3F00 */
    const uint16_t r[4] = {0x3F80, 0x4000, 0xC040, 0x3F00};
    const float c[4] = {1.0f, 2.0f, -3.0f, 1.5f}; /* last element off by 1 */
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_BFLOAT16, r, PROBE_DTYPE_FLOAT32, c, 4,
                                             &T1_TOL, &m), PROBE_OK, "%s", probe_last_error());
    /* ||r||^2 = 1 + 4 + 9 + 0.25 = 14.25; ||c - r|| = 1 */
    cr_assert_eq(m.n, 4);
    cr_assert_float_eq(m.rel_l2, 1.0 / sqrt(14.25), 1e-15);
    cr_assert_eq(m.max_abs, 1.0);
    cr_assert_eq(m.max_abs_offset, 3);
    cr_assert_eq(m.mismatch_count, 1);
    cr_assert_eq(m.mean_abs, 0.25);
    /* <r,c> = 1 + 4 + 9 + 0.75 = 14.75; ||c||^2 = 1 + 4 + 9 + 2.25 = 16.25 */
    cr_assert_float_eq(m.cosine, 14.75 / sqrt(14.25 * 16.25), 1e-15);
    cr_assert_eq(m.identical, 0);
}

Test(metrics_typed, float16_nan_and_inf)
{
    /* float16 1.0 = 0x3C00, +inf = 0x7C00, NaN = 0x7E00 */
    const uint16_t r[3] = {0x3C00, 0x7C00, 0x3C00};
    const uint16_t c[3] = {0x3C00, 0x7C00, 0x7E00};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT16, r, PROBE_DTYPE_FLOAT16, c, 3,
                                             &T1_TOL, &m), PROBE_OK);
    cr_assert_eq(m.nan_cand, 1);
    cr_assert_eq(m.inf_ref, 1);
    cr_assert_eq(m.inf_cand, 1);
    cr_assert_eq(m.n_finite, 1);
    cr_assert_eq(m.mismatch_count, 1); /* the NaN; the equal infinities match */
    cr_assert_eq(m.rel_l2, 0.0);
}

Test(metrics_typed, equals_double_path_bit_for_bit)
{
    enum { N = 1000 };
    static int32_t ri[N];
    static uint8_t cu[N];
    static double rd[N], cd[N];
    for (int i = 0; i < N; i++) {
        ri[i] = (int32_t)((i * 7919) % 2001) - 1000;
        cu[i] = (uint8_t)((i * 31) % 256);
        rd[i] = (double)ri[i];
        cd[i] = (double)cu[i];
    }
    probe_metrics a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    probe_metrics_opts o = {0.5, 0.01};
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_INT32, ri, PROBE_DTYPE_UINT8, cu, N, &o, &a),
                 PROBE_OK);
    cr_assert_eq(probe_metrics_compute(rd, cd, N, &o, &b), PROBE_OK);
    /* integers have no ulps; the float64 path measures its mismatches in
     * float64 ulps: every other field is the same bits */
    cr_assert(isnan(a.mismatch_ulps_max));
    cr_assert(b.mismatch_ulps_max > 0);
    cr_assert(isnan(a.max_abs_ulps_scale) && b.max_abs_ulps_scale > 0);
    b.mismatch_ulps_max = a.mismatch_ulps_max;
    b.max_abs_ulps_scale = a.max_abs_ulps_scale;
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0);
}

Test(metrics_typed, empty)
{
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, NULL, PROBE_DTYPE_FLOAT32, NULL, 0,
                                             &T1_TOL, &m), PROBE_OK);
    cr_assert_eq(m.n, 0);
    cr_assert_eq(m.identical, 1);
    cr_assert_eq(m.rel_l2, 0.0);
}

Test(metrics_typed, bad_arguments)
{
    const float x[2] = {1, 2};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_INVALID, x, PROBE_DTYPE_FLOAT32, x, 2,
                                             &T1_TOL, &m), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "reference element type") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, x, (probe_dtype)99, x, 2, &T1_TOL,
                                             &m), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "candidate element type 99") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, NULL, PROBE_DTYPE_FLOAT32, x, 2,
                                             &T1_TOL, &m), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "ref is NULL") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, NULL, 2,
                                             &T1_TOL, &m), PROBE_EINVAL);
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, x, 2, NULL,
                                             &m), PROBE_EINVAL);
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, x, 2,
                                             &T1_TOL, NULL), PROBE_EINVAL);
}
