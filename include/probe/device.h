/* probe/device.h - the metrics of probe/metrics.h on a CUDA device.
 *
 * Provided by libprobe_cuda.so (built when the CUDA toolkit is found; it
 * links the CUDA runtime statically and libprobe). probe-compare loads it
 * on demand (`--device cuda[:N]`); the capture path can call it on device
 * pointers (stats-only capture of tensors too large to copy out).
 *
 * Definitions are exactly docs/metrics.md's (see probe/metrics.h): the counts
 * (nan_ref_only included), max_abs, max_abs_offset, p99_abs (exact
 * nearest-rank, by radix select on the bit patterns of |c - r| in fp64),
 * mismatch_count, mismatch_ulps_max, max_abs_ulps_scale, identical (element
 * type and bytes), zero_norm_reference and the per-channel counts are
 * bit-equal to the CPU path; the fp64 sums (norms, dot, mean_abs, the gain
 * sums and what derives from them: rel_l2, cosine, gain, gain_se, gain_z,
 * channel shift, std, se and z) are summed in another order and agree with
 * the CPU path to a relative 1e-12 of the sum of magnitudes (docs/device.md,
 * "CPU and GPU agreement"). The same input gives the same bits every run.
 *
 * Errors: PROBE_EUNSUPPORTED when there is no usable CUDA device (the
 * message says what cudaGetDeviceCount/cudaSetDevice returned); PROBE_EIO
 * for any other CUDA error (out of device memory, a failed launch; named in
 * the message); PROBE_EINVAL for bad arguments, as on the CPU path (checked
 * before the device is touched). Outputs are zeroed on error. No function
 * leaves the calling thread's current device changed.
 */
#ifndef PROBE_DEVICE_H
#define PROBE_DEVICE_H

#include <stdint.h>
#include "probe/dtype.h"
#include "probe/metrics.h"
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metrics of n element pairs held in device memory of the current device:
 * ref (ref_dtype) and cand (cand_dtype), packed row-major, each aligned to
 * its element size (PROBE_EINVAL otherwise). Work is enqueued on `stream`
 * (a cudaStream_t; NULL = the legacy default stream) after what is already
 * there; the call returns when the result is on the host (it synchronizes
 * `stream` only). shift / channel as in probe_metrics_compute_source (NULL /
 * count 0: none; shift->count 0 when not computed). Scratch device memory
 * (a pool of the library's, kept up to 256 MiB between calls): 112 bytes per
 * 32768 elements plus 128 KiB; with channels 56 bytes per segment (at most
 * about n/32) and per channel (docs/device.md). */
probe_status probe_cuda_metrics(probe_dtype ref_dtype, const void *ref, probe_dtype cand_dtype,
                                const void *cand, uint64_t n, const probe_metrics_opts *opts,
                                const probe_channel_spec *channel, void *stream,
                                probe_metrics *out, probe_channel_shift *shift);

/* The same for a pair given as a probe_pair_source (e.g. two datasets of
 * capture files): the elements are read in chunks into pinned host memory,
 * copied to device `device` (ordinal), and computed there. Host memory stays
 * bounded (two pinned chunks of 64 MiB: the read of one overlaps the copy of
 * the other); device memory holds both tensors. Each side is read once, in
 * increasing offsets, side 0 first. */
probe_status probe_cuda_metrics_source(int device, const probe_pair_source *src,
                                       const probe_metrics_opts *opts,
                                       const probe_channel_spec *channel, probe_metrics *out,
                                       probe_channel_shift *shift);

/* probe_cuda_metrics_source with the options of probe_metrics_compute_source
 * (probe/metrics.h): sopts->channel is the channel spec, and when shift is
 * non-NULL and the spec has channels, each of sopts->channel_shift_out,
 * channel_se_out and channel_n_out that is not NULL receives channel.count
 * doubles (shift_k, NaN if n_k = 0; se_k, NaN if n_k < 2; n_k), as on the
 * CPU. sopts->threads is ignored; sopts NULL: no channels. Errors as
 * probe_cuda_metrics_source; the arrays are not written on error. */
probe_status probe_cuda_metrics_source_v2(int device, const probe_pair_source *src,
                                          const probe_metrics_opts *opts,
                                          const probe_stream_opts *sopts, probe_metrics *out,
                                          probe_channel_shift *shift);

/* probe_summary_tree (probe/metrics.h) of n elements of dtype in device
 * memory at x (aligned to the element size): the summary that stats-only
 * capture keeps of a tensor too large to copy out, and, when tree_hash is
 * not NULL, its tree hash (probe_tree_hash of the n * size bytes; bool as
 * 0/1 bytes). Both are computed in the canonical tree order
 * (docs/file-format.md "Tree order") and so are bit-equal to the host's
 * probe_summary_tree of the same bytes, every field. Scratch: 72 bytes per
 * 8 KiB of input, from the library's pool. Same stream rule as
 * probe_cuda_metrics (the call returns when the result is on the host).
 * Errors: PROBE_EINVAL (out NULL, unknown dtype, x NULL with n > 0, x
 * misaligned, n * size overflows), PROBE_EUNSUPPORTED, PROBE_EIO. */
probe_status probe_cuda_summary_tree(probe_dtype dtype, const void *x, uint64_t n, void *stream,
                                     probe_summary *out, uint64_t *tree_hash);

/* probe_cuda_summary_tree in two halves, for a caller that must not wait
 * (the capture path): _enqueue puts the tree's kernels on stream, then a copy
 * of the tree's root (PROBE_CUDA_TREE_RESULT_BYTES) to result, which may be
 * pinned host or device memory; nothing synchronizes, and scratch is
 * allocated and freed in stream order. Once the stream has passed the copy
 * (an event recorded after _enqueue), _result turns the root into the
 * summary and tree hash, on the host, without CUDA calls. Errors of
 * _enqueue: those of probe_cuda_summary_tree, and result NULL; of _result:
 * PROBE_EINVAL for NULL pointers, an unknown dtype, or a result whose counts
 * do not add up to n (not this tensor's, or read too early). */
#define PROBE_CUDA_TREE_RESULT_BYTES 72
probe_status probe_cuda_summary_tree_enqueue(probe_dtype dtype, const void *x, uint64_t n,
                                             void *stream, void *result);
probe_status probe_cuda_summary_tree_result(probe_dtype dtype, uint64_t n, const void *result,
                                            probe_summary *out, uint64_t *tree_hash);

/* probe_cuda_summary_tree without the tree hash. */
probe_status probe_cuda_summary(probe_dtype dtype, const void *x, uint64_t n, void *stream,
                                probe_summary *out);

/* Version of the plugin interface; probe-compare refuses another. */
#define PROBE_CUDA_ABI_VERSION 1
int probe_cuda_abi_version(void);

#ifdef __cplusplus
}
#endif
#endif
