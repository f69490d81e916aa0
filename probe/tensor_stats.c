/* tensor_stats.c - what the HTML report draws per tensor beyond the metrics:
 * the histogram of |c - r|, the per-channel mean shift of c - r and the
 * spatial map of mean |c - r| per frame (definitions in probe/compare.h). */
#include "probe/compare.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void probe_tensor_stats_free(probe_tensor_stats *st)
{
    if (!st)
        return;
    free(st->channel_shift);
    free(st->map);
    memset(st, 0, sizeof *st);
}

/* |c - r| of a pair finite on both sides; a difference that overflows is
 * DBL_MAX (the top of any scale). */
static double abs_diff(double r, double c)
{
    double d = fabs(c - r);
    return isfinite(d) ? d : DBL_MAX;
}

static void histogram(const double *r, const double *c, size_t n, probe_tensor_stats *st)
{
    double lo = INFINITY, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(r[i]) || !isfinite(c[i])) {
            st->hist_nonfinite++;
            continue;
        }
        double d = abs_diff(r[i], c[i]);
        if (d == 0) {
            st->hist_zero++;
            continue;
        }
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
    }
    if (hi == 0)
        return; /* no |d| > 0: every count is in hist_zero / hist_nonfinite */
    /* log10 of a positive finite double lies in [-324, 309]: the casts are safe. */
    int elo = (int)floor(log10(lo)), ehi = (int)ceil(log10(hi));
    if (ehi <= elo)
        ehi = elo + 1;
    st->hist_log10_lo = elo;
    st->hist_log10_hi = ehi;
    double scale = PROBE_STATS_HIST_BINS / (double)(ehi - elo);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(r[i]) || !isfinite(c[i]))
            continue;
        double d = abs_diff(r[i], c[i]);
        if (d == 0)
            continue;
        double k = floor((log10(d) - elo) * scale);
        int b = k < 0 ? 0 : k >= PROBE_STATS_HIST_BINS ? PROBE_STATS_HIST_BINS - 1 : (int)k;
        st->hist[b]++;
    }
}

static probe_status channel_shift(const double *r, const double *c, size_t n, int rank,
                                  const int64_t *shape, probe_tensor_stats *st)
{
    int axis = rank == 4 || rank == 5 ? 1 : rank == 2 || rank == 3 ? rank - 1 : -1;
    if (axis < 0 || shape[axis] <= 0 || shape[axis] > PROBE_STATS_MAX_CHANNELS)
        return PROBE_OK;
    size_t nch = (size_t)shape[axis], inner = 1;
    for (int d = axis + 1; d < rank; d++)
        inner *= (size_t)shape[d];
    double *sum = calloc(nch, sizeof *sum);
    uint64_t *cnt = calloc(nch, sizeof *cnt);
    if (!sum || !cnt) {
        free(sum);
        free(cnt);
        return probe_set_error(PROBE_ENOMEM, "cannot allocate the channel shift (%zu channels)", nch);
    }
    size_t outer = inner ? n / (nch * inner) : 0, i = 0;
    for (size_t o = 0; o < outer; o++)
        for (size_t k = 0; k < nch; k++)
            for (size_t j = 0; j < inner; j++, i++)
                if (isfinite(r[i]) && isfinite(c[i])) {
                    sum[k] += c[i] - r[i];
                    cnt[k]++;
                }
    for (size_t k = 0; k < nch; k++)
        sum[k] = cnt[k] ? sum[k] / (double)cnt[k] : NAN;
    free(cnt);
    st->channel_axis = axis;
    st->nchannels = (int)nch;
    st->channel_shift = sum;
    return PROBE_OK;
}

/* cell[i] = floor(i * cells / len) for i in [0, len). */
static int *cell_index(int64_t len, int cells)
{
    int *a = malloc((size_t)len * sizeof *a);
    for (int64_t i = 0; a && i < len; i++)
        a[i] = (int)(i * cells / len);
    return a;
}

static probe_status spatial_map(const double *r, const double *c, int rank, const int64_t *shape,
                                probe_tensor_stats *st)
{
    if (rank != 4 && rank != 5)
        return PROBE_OK;
    int64_t nb = shape[0], nc = shape[1];
    int64_t nf = rank == 5 ? shape[2] : 1, h = shape[rank - 2], w = shape[rank - 1];
    if (nb == 0 || nc == 0 || nf == 0 || h == 0 || w == 0)
        return PROBE_OK;
    int mf = nf < PROBE_STATS_MAP_MAX_FRAMES ? (int)nf : PROBE_STATS_MAP_MAX_FRAMES;
    int mh = h < PROBE_STATS_MAP_MAX ? (int)h : PROBE_STATS_MAP_MAX;
    int mw = w < PROBE_STATS_MAP_MAX ? (int)w : PROBE_STATS_MAP_MAX;
    size_t cells = (size_t)mf * (size_t)mh * (size_t)mw;
    double *sum = calloc(cells, sizeof *sum);
    uint64_t *cnt = calloc(cells, sizeof *cnt);
    int *fi = cell_index(nf, mf), *yi = cell_index(h, mh), *xi = cell_index(w, mw);
    if (!sum || !cnt || !fi || !yi || !xi) {
        free(sum);
        free(cnt);
        free(fi);
        free(yi);
        free(xi);
        return probe_set_error(PROBE_ENOMEM, "cannot allocate the spatial map (%zu cells)", cells);
    }
    size_t i = 0;
    for (int64_t b = 0; b < nb * nc; b++)
        for (int64_t f = 0; f < nf; f++)
            for (int64_t y = 0; y < h; y++) {
                size_t row = ((size_t)fi[f] * (size_t)mh + (size_t)yi[y]) * (size_t)mw;
                for (int64_t x = 0; x < w; x++, i++)
                    if (isfinite(r[i]) && isfinite(c[i])) {
                        sum[row + (size_t)xi[x]] += abs_diff(r[i], c[i]);
                        cnt[row + (size_t)xi[x]]++;
                    }
            }
    for (size_t k = 0; k < cells; k++)
        sum[k] = cnt[k] ? sum[k] / (double)cnt[k] : NAN;
    free(cnt);
    free(fi);
    free(yi);
    free(xi);
    st->map = sum;
    st->map_frames = mf;
    st->map_h = mh;
    st->map_w = mw;
    st->frames = nf;
    st->height = h;
    st->width = w;
    return PROBE_OK;
}

probe_status probe_tensor_stats_compute(const double *ref, const double *cand, size_t n, int rank,
                                        const int64_t *shape, probe_tensor_stats *st)
{
    if (!st)
        return probe_set_error(PROBE_EINVAL, "probe_tensor_stats_compute: NULL result");
    memset(st, 0, sizeof *st);
    if ((n && (!ref || !cand)) || (rank > 0 && !shape))
        return probe_set_error(PROBE_EINVAL, "probe_tensor_stats_compute: NULL argument");
    if (rank < 0 || rank > PROBE_MAX_RANK)
        return probe_set_error(PROBE_EINVAL, "probe_tensor_stats_compute: rank %d outside [0, %d]",
                               rank, PROBE_MAX_RANK);
    uint64_t prod = 1;
    for (int d = 0; d < rank; d++)
        if (shape[d] < 0 || __builtin_mul_overflow(prod, (uint64_t)shape[d], &prod))
            return probe_set_error(PROBE_EINVAL, "probe_tensor_stats_compute: bad shape");
    if (prod != (uint64_t)n)
        return probe_set_error(PROBE_EINVAL,
                               "probe_tensor_stats_compute: shape holds %llu elements, n = %zu",
                               (unsigned long long)prod, n);
    histogram(ref, cand, n, st);
    probe_status s = channel_shift(ref, cand, n, rank, shape, st);
    if (s == PROBE_OK)
        s = spatial_map(ref, cand, rank, shape, st);
    if (s != PROBE_OK) {
        probe_tensor_stats_free(st);
        return s;
    }
    st->computed = 1;
    return PROBE_OK;
}
