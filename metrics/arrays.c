/* arrays.c - error metrics between a reference r and a candidate c held in memory
 * (probe/metrics.h; definitions in docs/metrics.md).
 *
 * The computation itself is metrics.c's (probe_metrics_compute_source): the
 * in-memory entry points below hand it their arrays, so every path gives the
 * same bits. Summation: fp64 lanes per block of 1024 elements, blocks added
 * with Neumaier's compensated summation (metrics.c gives the error bound).
 *
 * Range: when the largest magnitude of r, c or c - r lies outside
 * [2^-250, 2^250] (possible only for float64 inputs; the sums hold fourth powers), the squares could
 * overflow or underflow; the sums are then recomputed in a second pass on
 * values scaled by powers of two (exact), as LAPACK's dnrm2 does in spirit.
 *
 * p99: exact nearest-rank percentile by selection (probe_select_kth,
 * select.c), on the finite |c - r| or, for large n, on the elements of one
 * radix bucket (metrics.c).
 */
#include "probe/metrics.h"

#include "select.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double probe_metrics_percentile_nearest_rank(double *v, size_t n, double q)
{
    if (n == 0 || v == NULL || !(q > 0.0 && q <= 100.0))
        return NAN;
    /* rank = ceil(q/100 * n), 1-based. q*n first: for integer q and
     * n < 2^46 the product is exact and the one rounding of /100 cannot
     * cross an integer, so the rank is exact (e.g. q = 99, n = 100 -> 99). */
    double x = ceil(q * (double)n / 100.0);
    size_t rank = x < 1.0 ? 1 : (x >= (double)n ? n : (size_t)x);
    return probe_select_kth(v, n, rank - 1);
}

/* ---- in-memory pairs ---- */

typedef struct {
    const void *p[2];
    size_t esize[2];
} mem_pair;

static probe_status mem_read(void *ctx, int side, uint64_t offset, size_t count, void *dst)
{
    const mem_pair *m = ctx;
    memcpy(dst, (const unsigned char *)m->p[side] + offset * m->esize[side], count * m->esize[side]);
    return PROBE_OK;
}

static probe_status compute_mem(const char *fn, probe_dtype rt, const void *ref, probe_dtype ct,
                                const void *cand, size_t n, const probe_metrics_opts *opts,
                                probe_metrics *out)
{
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: out is NULL", fn);
    memset(out, 0, sizeof *out);
    if (opts == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: opts is NULL", fn);
    if (probe_dtype_size(rt) == 0 || probe_dtype_size(ct) == 0)
        return probe_set_error(PROBE_EINVAL, "%s: unknown %s element type %d", fn,
                               probe_dtype_size(rt) ? "candidate" : "reference",
                               (int)(probe_dtype_size(rt) ? ct : rt));
    if (n > 0 && (ref == NULL || cand == NULL))
        return probe_set_error(PROBE_EINVAL, "%s: %s is NULL with n = %zu", fn,
                               ref == NULL ? "ref" : "cand", n);
    mem_pair m = {{ref, cand}, {probe_dtype_size(rt), probe_dtype_size(ct)}};
    probe_pair_source src = {n, {rt, ct}, mem_read, &m};
    return probe_metrics_compute_source(&src, opts, NULL, out, NULL);
}

probe_status probe_metrics_compute(const double *ref, const double *cand, size_t n,
                                   const probe_metrics_opts *opts, probe_metrics *out)
{
    return compute_mem("probe_metrics_compute", PROBE_DTYPE_FLOAT64, ref, PROBE_DTYPE_FLOAT64,
                       cand, n, opts, out);
}

probe_status probe_metrics_compute_typed(probe_dtype ref_dtype, const void *ref,
                                         probe_dtype cand_dtype, const void *cand, size_t n,
                                         const probe_metrics_opts *opts, probe_metrics *out)
{
    return compute_mem("probe_metrics_compute_typed", ref_dtype, ref, cand_dtype, cand, n, opts,
                       out);
}
