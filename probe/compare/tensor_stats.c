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

/* ---- chunked reading of a pair source ---- */

enum { STATS_CHUNK = 1 << 16 };

typedef struct {
    const probe_pair_source *src;
    unsigned char *raw;
    double *r, *c;
} reader;

static probe_status reader_init(reader *rd, const probe_pair_source *src)
{
    rd->src = src;
    size_t es = probe_dtype_size(src->dtype[0]) > probe_dtype_size(src->dtype[1])
                    ? probe_dtype_size(src->dtype[0]) : probe_dtype_size(src->dtype[1]);
    rd->raw = malloc(STATS_CHUNK * (es ? es : 1));
    rd->r = malloc(STATS_CHUNK * sizeof(double));
    rd->c = malloc(STATS_CHUNK * sizeof(double));
    if (!rd->raw || !rd->r || !rd->c)
        return probe_set_error(PROBE_ENOMEM, "cannot allocate the report's read buffers");
    return PROBE_OK;
}

static void reader_free(reader *rd)
{
    free(rd->raw);
    free(rd->r);
    free(rd->c);
}

/* Elements [off, off + m) of both sides as doubles in rd->r, rd->c. */
static probe_status reader_get(reader *rd, uint64_t off, size_t m)
{
    double *dst[2] = {rd->r, rd->c};
    for (int side = 0; side < 2; side++) {
        probe_status s = rd->src->read(rd->src->ctx, side, off, m, rd->raw);
        if (s == PROBE_OK)
            s = probe_dtype_to_f64(rd->src->dtype[side], rd->raw, dst[side], m);
        if (s != PROBE_OK)
            return s;
    }
    return PROBE_OK;
}

/* ---- histogram and map ---- */

typedef struct {
    int rank;
    const int64_t *shape;
    /* map */
    int64_t nf, h, w;
    int mf, mh, mw;
    double *sum;
    uint64_t *cnt;
    int *fi, *yi, *xi;
} map_ctx;

/* cell[i] = floor(i * cells / len) for i in [0, len). */
static int *cell_index(int64_t len, int cells)
{
    int *a = malloc((size_t)len * sizeof *a);
    for (int64_t i = 0; a && i < len; i++)
        a[i] = (int)(i * cells / len);
    return a;
}

static probe_status map_init(map_ctx *mc, int rank, const int64_t *shape)
{
    memset(mc, 0, sizeof *mc);
    if (rank != 4 && rank != 5)
        return PROBE_OK;
    int64_t nb = shape[0], nc = shape[1];
    int64_t nf = rank == 5 ? shape[2] : 1, h = shape[rank - 2], w = shape[rank - 1];
    if (nb == 0 || nc == 0 || nf == 0 || h == 0 || w == 0)
        return PROBE_OK;
    mc->nf = nf;
    mc->h = h;
    mc->w = w;
    mc->mf = nf < PROBE_STATS_MAP_MAX_FRAMES ? (int)nf : PROBE_STATS_MAP_MAX_FRAMES;
    mc->mh = h < PROBE_STATS_MAP_MAX ? (int)h : PROBE_STATS_MAP_MAX;
    mc->mw = w < PROBE_STATS_MAP_MAX ? (int)w : PROBE_STATS_MAP_MAX;
    size_t cells = (size_t)mc->mf * (size_t)mc->mh * (size_t)mc->mw;
    mc->sum = calloc(cells, sizeof *mc->sum);
    mc->cnt = calloc(cells, sizeof *mc->cnt);
    mc->fi = cell_index(nf, mc->mf);
    mc->yi = cell_index(h, mc->mh);
    mc->xi = cell_index(w, mc->mw);
    if (!mc->sum || !mc->cnt || !mc->fi || !mc->yi || !mc->xi)
        return probe_set_error(PROBE_ENOMEM, "cannot allocate the spatial map (%zu cells)", cells);
    return PROBE_OK;
}

static void map_free(map_ctx *mc)
{
    free(mc->sum);
    free(mc->cnt);
    free(mc->fi);
    free(mc->yi);
    free(mc->xi);
}

/* Add elements [off, off + m) to the map: flat offset -> (frame, y, x). */
static void map_add(map_ctx *mc, const double *r, const double *c, uint64_t off, size_t m)
{
    uint64_t plane = (uint64_t)mc->h * (uint64_t)mc->w, vol = plane * (uint64_t)mc->nf;
    for (size_t i = 0; i < m; i++) {
        if (!isfinite(r[i]) || !isfinite(c[i]))
            continue;
        uint64_t o = off + i, in_vol = o % vol;
        uint64_t f = in_vol / plane, in_plane = in_vol % plane;
        uint64_t y = in_plane / (uint64_t)mc->w, x = in_plane % (uint64_t)mc->w;
        size_t cell = ((size_t)mc->fi[f] * (size_t)mc->mh + (size_t)mc->yi[y]) * (size_t)mc->mw +
                      (size_t)mc->xi[x];
        mc->sum[cell] += abs_diff(r[i], c[i]);
        mc->cnt[cell]++;
    }
}

/* Histogram and map from a source in two sequential passes (the range of
 * |d| first, then the bins); the map in the second. */
static probe_status hist_and_map(const probe_pair_source *src, int rank, const int64_t *shape,
                                 probe_tensor_stats *st)
{
    reader rd;
    map_ctx mc;
    probe_status s = reader_init(&rd, src);
    if (s == PROBE_OK)
        s = map_init(&mc, rank, shape);
    else
        memset(&mc, 0, sizeof mc);
    double lo = INFINITY, hi = 0;
    for (uint64_t off = 0; s == PROBE_OK && off < src->n; off += STATS_CHUNK) {
        size_t m = src->n - off < STATS_CHUNK ? (size_t)(src->n - off) : STATS_CHUNK;
        if ((s = reader_get(&rd, off, m)) != PROBE_OK)
            break;
        for (size_t i = 0; i < m; i++) {
            if (!isfinite(rd.r[i]) || !isfinite(rd.c[i])) {
                st->hist_nonfinite++;
                continue;
            }
            double d = abs_diff(rd.r[i], rd.c[i]);
            if (d == 0) {
                st->hist_zero++;
                continue;
            }
            lo = d < lo ? d : lo;
            hi = d > hi ? d : hi;
        }
    }
    int elo = 0, ehi = 0;
    if (s == PROBE_OK && hi > 0) {
        /* log10 of a positive finite double lies in [-324, 309]: the casts are safe. */
        elo = (int)floor(log10(lo));
        ehi = (int)ceil(log10(hi));
        if (ehi <= elo)
            ehi = elo + 1;
        st->hist_log10_lo = elo;
        st->hist_log10_hi = ehi;
    }
    double scale = PROBE_STATS_HIST_BINS / (double)(ehi > elo ? ehi - elo : 1);
    if (s == PROBE_OK && (hi > 0 || mc.sum))
        for (uint64_t off = 0; s == PROBE_OK && off < src->n; off += STATS_CHUNK) {
            size_t m = src->n - off < STATS_CHUNK ? (size_t)(src->n - off) : STATS_CHUNK;
            if ((s = reader_get(&rd, off, m)) != PROBE_OK)
                break;
            if (mc.sum)
                map_add(&mc, rd.r, rd.c, off, m);
            if (hi == 0)
                continue;
            for (size_t i = 0; i < m; i++) {
                if (!isfinite(rd.r[i]) || !isfinite(rd.c[i]))
                    continue;
                double d = abs_diff(rd.r[i], rd.c[i]);
                if (d == 0)
                    continue;
                double k = floor((log10(d) - elo) * scale);
                int b = k < 0 ? 0 : k >= PROBE_STATS_HIST_BINS ? PROBE_STATS_HIST_BINS - 1 : (int)k;
                st->hist[b]++;
            }
        }
    if (s == PROBE_OK && mc.sum) {
        size_t cells = (size_t)mc.mf * (size_t)mc.mh * (size_t)mc.mw;
        for (size_t k = 0; k < cells; k++)
            mc.sum[k] = mc.cnt[k] ? mc.sum[k] / (double)mc.cnt[k] : NAN;
        st->map = mc.sum;
        mc.sum = NULL;
        st->map_frames = mc.mf;
        st->map_h = mc.mh;
        st->map_w = mc.mw;
        st->frames = mc.nf;
        st->height = mc.h;
        st->width = mc.w;
    }
    map_free(&mc);
    reader_free(&rd);
    return s;
}

static probe_status check_shape(const char *fn, uint64_t n, int rank, const int64_t *shape)
{
    if (rank < 0 || rank > PROBE_MAX_RANK)
        return probe_set_error(PROBE_EINVAL, "%s: rank %d outside [0, %d]", fn, rank,
                               PROBE_MAX_RANK);
    if (rank > 0 && !shape)
        return probe_set_error(PROBE_EINVAL, "%s: NULL argument", fn);
    uint64_t prod = 1;
    for (int d = 0; d < rank; d++)
        if (shape[d] < 0 || __builtin_mul_overflow(prod, (uint64_t)shape[d], &prod))
            return probe_set_error(PROBE_EINVAL, "%s: bad shape", fn);
    if (prod != n)
        return probe_set_error(PROBE_EINVAL, "%s: shape holds %llu elements, n = %llu", fn,
                               (unsigned long long)prod, (unsigned long long)n);
    return PROBE_OK;
}

probe_status probe_tensor_stats_compute_source(const probe_pair_source *src, int rank,
                                               const int64_t *shape, probe_tensor_stats *st)
{
    if (!st)
        return probe_set_error(PROBE_EINVAL, "probe_tensor_stats_compute_source: NULL result");
    memset(st, 0, sizeof *st);
    if (!src || (src->n && !src->read))
        return probe_set_error(PROBE_EINVAL, "probe_tensor_stats_compute_source: NULL argument");
    probe_status s = check_shape("probe_tensor_stats_compute_source", src->n, rank, shape);
    if (s == PROBE_OK)
        s = hist_and_map(src, rank, shape, st);
    if (s != PROBE_OK) {
        probe_tensor_stats_free(st);
        return s;
    }
    st->computed = 1;
    return PROBE_OK;
}

int probe_channel_axis_by_layout(int rank)
{
    return rank == 4 || rank == 5 ? 1 : rank == 2 || rank == 3 ? rank - 1 : -1;
}

typedef struct {
    const double *p[2];
} f64_pair;

static probe_status f64_read(void *ctx, int side, uint64_t off, size_t m, void *dst)
{
    memcpy(dst, ((const f64_pair *)ctx)->p[side] + off, m * sizeof(double));
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
    probe_status s = check_shape("probe_tensor_stats_compute", n, rank, shape);
    if (s != PROBE_OK)
        return s;
    f64_pair fp = {{ref, cand}};
    probe_pair_source src = {n, {PROBE_DTYPE_FLOAT64, PROBE_DTYPE_FLOAT64}, f64_read, &fp};
    if ((s = probe_tensor_stats_compute_source(&src, rank, shape, st)) != PROBE_OK)
        return s;
    /* the channel shift of the layout rule, through the metrics engine */
    int axis = probe_channel_axis_by_layout(rank);
    if (axis < 0 || shape[axis] <= 0 || shape[axis] > PROBE_STATS_MAX_CHANNELS)
        return PROBE_OK;
    uint64_t inner = 1;
    for (int d = axis + 1; d < rank; d++)
        inner *= (uint64_t)shape[d];
    if (inner == 0)
        return PROBE_OK;
    double *shift = malloc((size_t)shape[axis] * sizeof *shift);
    if (!shift) {
        probe_tensor_stats_free(st);
        return probe_set_error(PROBE_ENOMEM, "cannot allocate the channel shift (%lld channels)",
                               (long long)shape[axis]);
    }
    probe_stream_opts so = {0, {(uint64_t)shape[axis], inner}, shift, NULL, NULL};
    probe_metrics_opts mo = {0, 0};
    probe_metrics m;
    probe_channel_shift cs;
    if ((s = probe_metrics_compute_source(&src, &mo, &so, &m, &cs)) != PROBE_OK) {
        free(shift);
        probe_tensor_stats_free(st);
        return s;
    }
    st->channel_axis = axis;
    st->nchannels = (int)shape[axis];
    st->channel_shift = shift;
    return PROBE_OK;
}
