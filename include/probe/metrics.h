/* probe/metrics.h - error metrics between a reference r and a candidate c.
 *
 * Definitions are those of docs/metrics.md; every sum is
 * accumulated in fp64 (double). Elements are given as doubles: callers convert
 * with probe_dtype_to_f64(), which is exact for every float type probe stores.
 *
 * Non-finite elements: an index where r or c is NaN or +-inf is excluded from
 * the norms, the dot product, max/p99/mean absolute error and is counted in
 * nan_ref/nan_cand/inf_ref/inf_cand. Such an index counts as a mismatch
 * (mismatch_fraction) unless both sides hold the same infinity, or both are
 * NaN. A NaN in the candidate makes the tensor fail any gate (probe/gate.h).
 */
#ifndef PROBE_METRICS_H
#define PROBE_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element-wise tolerance: an index mismatches when |c - r| > atol + rtol*|r|. */
typedef struct probe_metrics_opts {
    double atol;
    double rtol;
} probe_metrics_opts;

typedef struct probe_metrics {
    uint64_t n;          /* elements compared (all of them) */
    uint64_t n_finite;   /* indices finite on both sides: the population of the norm metrics */
    double rel_l2;       /* ||c-r||2/||r||2; 0 if ||r||2 = 0 and c = r; +inf if ||r||2 = 0 and c != r */
    double cosine;       /* <r,c>/(||r|| ||c||) clamped to [-1,1]; both norms 0: 1; one norm 0: 0 */
    double max_abs;      /* max |c-r| over finite indices; 0 if n_finite = 0 */
    uint64_t max_abs_offset; /* row-major flat offset of the first index attaining max_abs */
    double p99_abs;      /* nearest-rank: sorted |c-r| ascending, element ceil(0.99*n_finite) (1-based); NaN if n_finite = 0 */
    double mean_abs;     /* sum |c-r| / n_finite; NaN if n_finite = 0 */
    uint64_t mismatch_count;  /* indices with |c-r| > atol + rtol*|r| (non-finite rule above) */
    double mismatch_fraction; /* mismatch_count / n; 0 if n = 0 */
    uint64_t nan_ref, nan_cand, inf_ref, inf_cand;
    int zero_norm_reference;  /* ||r||2 = 0 (over finite indices) */
    int identical;            /* the same element type on both sides and the same bytes at
                                 every index (so -0 and +0 differ, and float64 vs float32 is
                                 never identical) */
    double norm_ref, norm_cand, norm_diff, dot; /* the fp64 sums behind rel_l2 and cosine */
    uint64_t inf_mismatch;    /* indices where r or c is +-inf and r != c (gates fail on > 0) */
    /* Systematic difference (docs/metrics.md "Systematic difference"), over the
     * n_finite indices finite on both sides, d = c - r. Source of the standard
     * error: H. White, "A heteroskedasticity-consistent covariance matrix
     * estimator", Econometrica 48 (1980), the HC0 estimator. */
    double gain;              /* relative gain error alpha = <d, r> / <r, r>: the least-squares
                                 coefficient of d on r (c ~ (1 + alpha) r); 0 if ||r|| = 0 */
    double gain_se;           /* its standard error sqrt(sum r^2 (d - alpha r)^2) / <r, r>,
                                 valid for independent d_i of any variance; 0 if ||r|| = 0 */
    double gain_z;            /* gain / gain_se: 0 if gain = 0, +-inf if gain_se = 0 < |gain| */
    uint64_t nan_ref_only;    /* indices where r is NaN and c is not NaN (gates fail on > 0) */
    double mismatch_ulps_max; /* the largest |c - r| over the mismatching finite indices, in
                                 units of the spacing (ulp, probe_dtype_precision) of the
                                 coarser element type of the pair at max(|r|, |c|); NaN if no
                                 finite index mismatches or either type is not floating */
    double max_abs_ulps_scale; /* max_abs in units of the coarser type's spacing at the
                                 tensor's largest magnitude max(max |r|, max |c|): 1 means the
                                 largest difference is one ulp of the biggest element (an
                                 absolute error at the tensor's scale); NaN as above */
} probe_metrics;

/* Compute all metrics for n element pairs (ref[i], cand[i]), i in [0, n).
 * n = 0 is valid (every metric of an empty tensor: rel_l2 0, cosine 1,
 * identical 1, p99/mean NaN). Returns PROBE_EINVAL if ref, cand or out is NULL
 * with n > 0, or opts is NULL; PROBE_ENOMEM if the scratch for the exact
 * percentile cannot be allocated (n_finite doubles). */
probe_status probe_metrics_compute(const double *ref, const double *cand, size_t n,
                                   const probe_metrics_opts *opts, probe_metrics *out);

/* Exact nearest-rank percentile q in (0, 100] of the n values in v:
 * the ceil(q/100*n)-th smallest (1-based). v is reordered (selection, not a
 * full sort). Returns NaN if n = 0. Source: the nearest-rank definition
 * (numpy's method="inverted_cdf" gives the same value). */
double probe_metrics_percentile_nearest_rank(double *v, size_t n, double q);

/* probe_metrics_compute on two tensors held in their own element types: n
 * elements of ref_dtype at ref and n elements of cand_dtype at cand (packed,
 * little-endian, row-major; the two types may differ, e.g. a float32
 * reference and a bfloat16 candidate). Both are converted with
 * probe_dtype_to_f64() and the result is exactly probe_metrics_compute() on
 * the converted arrays (same definitions, fp64 accumulation). Memory: 2 x n
 * doubles of scratch plus the percentile's. Errors: PROBE_EINVAL for an
 * unknown element type or a NULL pointer (ref/cand with n > 0, opts, out),
 * PROBE_ENOMEM when the scratch cannot be allocated. Used by the Python
 * module (docs/packaging.md). */
#include "probe/dtype.h"
probe_status probe_metrics_compute_typed(probe_dtype ref_dtype, const void *ref,
                                         probe_dtype cand_dtype, const void *cand, size_t n,
                                         const probe_metrics_opts *opts, probe_metrics *out);


/* ---- streaming: tensors of any size in bounded memory ----
 *
 * probe_metrics_compute_source() computes exactly the metrics above (same
 * definitions, same fp64 accumulation) from a pair of element streams, in
 * memory bounded independently of n (docs/metrics.md "Memory"), using worker
 * threads. Its results do not depend on the number of threads: every sum is
 * formed per fixed-size block of elements and the blocks are combined in
 * element order. probe_metrics_compute() and probe_metrics_compute_typed()
 * are this function on in-memory arrays, so every path gives identical bits.
 */

/* Fill dst with the `count` elements [offset, offset + count) of one side of
 * the pair (side 0 = reference, 1 = candidate), packed, little-endian, in
 * that side's element type. Called only from the thread that called
 * probe_metrics_compute_source(), never concurrently; each pass reads [0, n)
 * in increasing order (one pass, or more when the exact p99 or the range of
 * float64 inputs needs it; docs/metrics.md). Return PROBE_OK, or an error
 * status with probe_set_error()'s message: the computation stops and returns
 * it. */
typedef probe_status (*probe_pair_read_fn)(void *ctx, int side, uint64_t offset, size_t count,
                                           void *dst);

typedef struct probe_pair_source {
    uint64_t n;              /* elements per side */
    probe_dtype dtype[2];    /* [0] reference, [1] candidate; may differ (compared in fp64) */
    probe_pair_read_fn read;
    void *ctx;
} probe_pair_source;

/* A channel axis for the per-channel mean shift. The element at row-major
 * flat offset i belongs to channel (i / inner) % count: for axis A of a
 * tensor of shape S, count = S[A] and inner = S[A+1] * ... * S[rank-1]
 * (1 for the last axis). */
typedef struct probe_channel_spec {
    uint64_t count;          /* channels, 1..PROBE_CHANNELS_MAX; 0 = no channel shift */
    uint64_t inner;          /* >= 1 */
} probe_channel_spec;

#define PROBE_CHANNELS_MAX 65536

/* Per-channel mean shift (quantization bias): for channel k over the n_k
 * indices finite on both sides, shift_k = mean(c - r) and std_k = the
 * population standard deviation (divisor n_k) of r. Its significance: the
 * standard error se_k = s_k / sqrt(n_k), s_k the sample standard deviation
 * (divisor n_k - 1) of c - r over the channel, and z_k = shift_k / se_k
 * (0 if shift_k = 0 or n_k < 2, +-inf if s_k = 0 < |shift_k|); under
 * independent zero-mean differences z_k is approximately standard normal. */
typedef struct probe_channel_shift {
    uint64_t count;          /* channels (0: not computed) */
    uint64_t argmax;         /* channel of the largest |shift_k| (the first on ties); channels
                                without a finite index are skipped */
    double max;              /* shift_argmax, signed; NaN if no channel has a finite index */
    double max_rel;          /* shift_argmax / std_argmax: 0 if both are 0, +-inf if only std is
                                0, NaN if no channel has a finite index */
    double std_ref;          /* std_argmax */
    uint64_t z_argmax;       /* channel of the largest |z_k| (the first on ties; 0 if none) */
    double z_max;            /* z_{z_argmax}, signed; 0 if no channel has n_k >= 2 */
} probe_channel_shift;

typedef struct probe_stream_opts {
    int threads;                  /* worker threads; 0 = the online CPUs, at most 8; at most 16 */
    probe_channel_spec channel;   /* count 0: no channel shift */
    double *channel_shift_out;    /* NULL, or channel.count doubles: every shift_k (NaN if none) */
    double *channel_se_out;       /* NULL, or channel.count doubles: every se_k (NaN if n_k < 2) */
    double *channel_n_out;        /* NULL, or channel.count doubles: every n_k */
} probe_stream_opts;

/* Metrics of the pair src (and, if shift is non-NULL and sopts->channel.count
 * > 0, its per-channel mean shift). sopts NULL: defaults (all CPUs, no
 * channel shift). Errors: PROBE_EINVAL (NULL src/read/opts/out, unknown
 * element type, atol/rtol < 0 or NaN, channel count above PROBE_CHANNELS_MAX,
 * inner 0, or count * inner not dividing n), PROBE_ENOMEM, or what src->read
 * returned. out is zeroed on error. */
probe_status probe_metrics_compute_source(const probe_pair_source *src,
                                          const probe_metrics_opts *opts,
                                          const probe_stream_opts *sopts, probe_metrics *out,
                                          probe_channel_shift *shift);


/* Summary of one tensor x (stats-only capture keeps it instead of the
 * bytes): counts, and over the finite elements min, max, max |x| (-0 before
 * +0 for min and max) and the fp64 sums of x and x^2 (NaN min/max/abs_max if
 * none is finite). The sums are added in the canonical tree order
 * (docs/file-format.md "Tree order"): within each 256-byte piece of the
 * bytes in element order, then pieces combined 32 at a time by a fixed
 * butterfly, each operation rounded to double and never fused; the error of
 * either sum is at most about (128 + 5 * levels) * 2^-53 of the sum of
 * magnitudes (Higham, "Accuracy and Stability of Numerical Algorithms",
 * 2nd ed., sec. 4.2: recursive summation within a piece, pairwise above).
 * Every path (this one, probe_file_summary, probe_cuda_summary_tree on a
 * GPU) gives the same bits for the same bytes. */
typedef struct probe_summary {
    uint64_t n, n_finite, nan, inf;
    double min, max, abs_max;
    double sum, sum_sq;
} probe_summary;

/* Summary of n elements of type dtype at x (packed, little-endian).
 * PROBE_EINVAL for an unknown type or NULL x with n > 0 or NULL out. */
probe_status probe_summary_compute(probe_dtype dtype, const void *x, size_t n, probe_summary *out);

/* The tree order's constants: a leaf is a piece of 256 bytes of the tensor
 * (no element straddles two), a node combines up to 32 children. */
#define PROBE_TREE_PIECE_BYTES 256
#define PROBE_TREE_FANOUT 32

/* probe_summary_compute, and, when tree_hash is not NULL, the tensor's tree
 * hash (probe_tree_hash below, of its bytes, bool as 0/1 bytes),
 * in the same pass. Errors as probe_summary_compute (*tree_hash 0), and
 * PROBE_ENOMEM. */
probe_status probe_summary_tree(probe_dtype dtype, const void *x, size_t n, probe_summary *out,
                                uint64_t *tree_hash);

/* The tree hash of nbytes bytes (docs/file-format.md "Tree order"): XXH64
 * (seed 0) of each 256-byte piece; then, level by level, XXH64 (seed = the
 * new level, 1, 2, ...) of up to 32 consecutive child hashes as little-endian
 * uint64, until one is left; the result is XXH64 (seed 0) of that root hash
 * and nbytes, 16 bytes little-endian. Unlike probe_capture_hash it can be
 * computed in parallel (probe_cuda_summary_tree computes it on a GPU): a
 * stats-only record made on the device carries it (probe.tree_hash). data
 * may be NULL when nbytes is 0. */
uint64_t probe_tree_hash(const void *data, size_t nbytes);

#ifdef __cplusplus
}
#endif
#endif
