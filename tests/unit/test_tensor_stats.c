/* test_tensor_stats.c - probe_tensor_stats_compute (probe/compare.h): the
 * |c - r| histogram, the per-channel mean shift and the spatial map behind
 * the HTML report, against hand-derived values, and its bad input.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "probe/compare.h"

static uint64_t hist_total(const probe_tensor_stats *st)
{
    uint64_t s = st->hist_zero + st->hist_nonfinite;
    for (int k = 0; k < PROBE_STATS_HIST_BINS; k++)
        s += st->hist[k];
    return s;
}

Test(tensor_stats, histogram_bins_by_hand)
{
    /* |d| = 0, 2^-10, 2^-7, 0.5, 1 (exact) and one NaN. log10: -3.0103,
     * -2.1072, -0.30103, 0: range 1e-4 .. 1e0 (4 decades, 32 bins: bin =
     * floor((log10|d| + 4) * 8)): 7.92 -> 7, 15.14 -> 15, 29.59 -> 29,
     * 32 -> clamped to 31. */
    double r[6] = {0, 0, 0, 0, 0, 0};
    double c[6] = {0, 0x1p-10, 0x1p-7, 0.5, 1.0, NAN};
    int64_t shape[1] = {6};
    probe_tensor_stats st;
    cr_assert_eq(probe_tensor_stats_compute(r, c, 6, 1, shape, &st), PROBE_OK);
    cr_assert(st.computed);
    cr_assert_eq(st.hist_zero, 1);
    cr_assert_eq(st.hist_nonfinite, 1);
    cr_assert_eq(st.hist_log10_lo, -4);
    cr_assert_eq(st.hist_log10_hi, 0);
    cr_assert_eq(st.hist[7], 1);
    cr_assert_eq(st.hist[15], 1);
    cr_assert_eq(st.hist[29], 1);
    cr_assert_eq(st.hist[31], 1);
    cr_assert_eq(hist_total(&st), 6);
    cr_assert_eq(st.nchannels, 0, "rank 1 has no channel axis");
    cr_assert_null(st.map);
    probe_tensor_stats_free(&st);
    cr_assert_eq(st.computed, 0);
}

Test(tensor_stats, one_value_and_no_difference)
{
    double r[3] = {0, 0, 0}, c[3] = {0, 100, 0};
    int64_t shape[1] = {3};
    probe_tensor_stats st;
    cr_assert_eq(probe_tensor_stats_compute(r, c, 3, 1, shape, &st), PROBE_OK);
    /* |d| = 100 exactly: floor = ceil = 2, widened to [2, 3); bin 0. */
    cr_assert_eq(st.hist_log10_lo, 2);
    cr_assert_eq(st.hist_log10_hi, 3);
    cr_assert_eq(st.hist[0], 1);
    cr_assert_eq(st.hist_zero, 2);
    probe_tensor_stats_free(&st);

    cr_assert_eq(probe_tensor_stats_compute(r, r, 3, 1, shape, &st), PROBE_OK);
    cr_assert_eq(st.hist_zero, 3);
    cr_assert_eq(st.hist_log10_lo, 0);
    cr_assert_eq(st.hist_log10_hi, 0);
    probe_tensor_stats_free(&st);
}

Test(tensor_stats, overflowing_difference_is_top_of_scale)
{
    double r[2] = {-DBL_MAX, 0}, c[2] = {DBL_MAX, 0x1p-996}; /* log10: 308.25, -299.83 */
    int64_t shape[1] = {2};
    probe_tensor_stats st;
    cr_assert_eq(probe_tensor_stats_compute(r, c, 2, 1, shape, &st), PROBE_OK);
    cr_assert_eq(st.hist_log10_lo, -300);
    cr_assert_eq(st.hist_log10_hi, 309);
    cr_assert_eq(st.hist[0], 1);
    cr_assert_eq(st.hist[PROBE_STATS_HIST_BINS - 1], 1);
    cr_assert_eq(hist_total(&st), 2);
    probe_tensor_stats_free(&st);
}

Test(tensor_stats, channel_shift_rank3_last_axis_and_rank4_axis1)
{
    /* [1, 2, 3]: channels on the last axis; d = c - r = channel index + 1,
     * except one inf in channel 2 (excluded). */
    double r[6] = {0}, c[6] = {1, 2, 3, 1, 2, INFINITY};
    int64_t s3[3] = {1, 2, 3};
    probe_tensor_stats st;
    cr_assert_eq(probe_tensor_stats_compute(r, c, 6, 3, s3, &st), PROBE_OK);
    cr_assert_eq(st.channel_axis, 2);
    cr_assert_eq(st.nchannels, 3);
    cr_assert_float_eq(st.channel_shift[0], 1.0, 0);
    cr_assert_float_eq(st.channel_shift[1], 2.0, 0);
    cr_assert_float_eq(st.channel_shift[2], 3.0, 0);
    cr_assert_eq(st.hist_nonfinite, 1);
    probe_tensor_stats_free(&st);

    /* [2, 2, 1, 2] (B, C, H, W): d in channel k of batch b is -(b*10 + k + 1). */
    double r4[8] = {0}, c4[8];
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 2; k++)
            for (int w = 0; w < 2; w++)
                c4[(b * 2 + k) * 2 + w] = -(b * 10 + k + 1);
    int64_t s4[4] = {2, 2, 1, 2};
    cr_assert_eq(probe_tensor_stats_compute(r4, c4, 8, 4, s4, &st), PROBE_OK);
    cr_assert_eq(st.channel_axis, 1);
    cr_assert_eq(st.nchannels, 2);
    cr_assert_float_eq(st.channel_shift[0], -(1 + 11) / 2.0, 1e-15);
    cr_assert_float_eq(st.channel_shift[1], -(2 + 12) / 2.0, 1e-15);
    /* map: 1 frame, 1 x 2 cells; cell x = mean over b, k of |d| = (1+2+11+12)/4 */
    cr_assert_eq(st.map_frames, 1);
    cr_assert_eq(st.map_h, 1);
    cr_assert_eq(st.map_w, 2);
    cr_assert_float_eq(st.map[0], 6.5, 1e-15);
    cr_assert_float_eq(st.map[1], 6.5, 1e-15);
    probe_tensor_stats_free(&st);
}

Test(tensor_stats, map_downsampled_rank5)
{
    /* [1, 1, 40, 130, 3]: 40 frames -> 32 groups, 130 rows -> 64 cells, 3 columns.
     * One error of 1 at frame 39, row 129, column 2, and one map cell whose
     * 6 pixels are all NaN in the candidate (a cell without finite index: NaN). */
    const int64_t F = 40, H = 130, W = 3;
    size_t n = (size_t)(F * H * W);
    double *r = calloc(n, sizeof *r), *c = calloc(n, sizeof *c);
    cr_assert(r && c);
    c[((39 * H) + 129) * W + 2] = 1.0;
    /* Map cell (group 0, row-cell 0, column 0) holds frames 0, 1
     * (floor(f*32/40) = 0) and rows 0..2 (floor(y*64/130) = 0): all NaN. */
    for (int f = 0; f < 2; f++)
        for (int y = 0; y < 3; y++)
            c[((size_t)(f * H + y)) * W] = NAN;
    int64_t shape[5] = {1, 1, F, H, W};
    probe_tensor_stats st;
    cr_assert_eq(probe_tensor_stats_compute(r, c, n, 5, shape, &st), PROBE_OK);
    cr_assert_eq(st.map_frames, 32);
    cr_assert_eq(st.map_h, 64);
    cr_assert_eq(st.map_w, 3);
    cr_assert_eq(st.frames, 40);
    cr_assert_eq(st.height, 130);
    /* frame 39 -> group floor(39*32/40) = 31, which holds frame 39 only (38 ->
     * 30); row 129 -> cell 63 (rows 128, 129); column 2: mean over 1 frame x
     * 2 rows = 1/2. */
    size_t hot = ((size_t)31 * 64 + 63) * 3 + 2;
    cr_assert_float_eq(st.map[hot], 0.5, 1e-15);
    cr_assert(isnan(st.map[0]));
    size_t cells = (size_t)32 * 64 * 3;
    for (size_t k = 1; k < cells; k++)
        if (k != hot)
            cr_assert_float_eq(st.map[k], 0.0, 0, "cell %zu", k);
    cr_assert_eq(st.nchannels, 1);
    cr_assert_float_eq(st.channel_shift[0], 1.0 / (double)(n - 6), 1e-18);
    probe_tensor_stats_free(&st);
    free(r);
    free(c);
}

Test(tensor_stats, empty_and_bad_input)
{
    probe_tensor_stats st;
    int64_t zero[4] = {1, 4, 0, 8};
    cr_assert_eq(probe_tensor_stats_compute(NULL, NULL, 0, 4, zero, &st), PROBE_OK);
    cr_assert(st.computed);
    cr_assert_eq(hist_total(&st), 0);
    cr_assert_null(st.map, "an empty image has no map");
    probe_tensor_stats_free(&st);

    double r[4] = {0}, c[4] = {0};
    int64_t shape[2] = {2, 2}, bad[2] = {2, 3}, neg[2] = {-2, -2};
    cr_assert_eq(probe_tensor_stats_compute(r, c, 4, 2, bad, &st), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "n = 4"), "%s", probe_last_error());
    cr_assert_eq(st.computed, 0);
    cr_assert_eq(probe_tensor_stats_compute(r, c, 4, 2, neg, &st), PROBE_EINVAL);
    cr_assert_eq(probe_tensor_stats_compute(NULL, c, 4, 2, shape, &st), PROBE_EINVAL);
    cr_assert_eq(probe_tensor_stats_compute(r, c, 4, 2, NULL, &st), PROBE_EINVAL);
    cr_assert_eq(probe_tensor_stats_compute(r, c, 4, -1, shape, &st), PROBE_EINVAL);
    cr_assert_eq(probe_tensor_stats_compute(r, c, 4, PROBE_MAX_RANK + 1, shape, &st), PROBE_EINVAL);
    cr_assert_eq(probe_tensor_stats_compute(r, c, 4, 2, shape, NULL), PROBE_EINVAL);
    probe_tensor_stats_free(NULL);
}
