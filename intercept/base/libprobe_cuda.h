/* intercept/base/libprobe_cuda.h - libprobe_cuda.so loaded with dlopen on
 * demand: the tree-order summary of a device tensor, computed on the GPU
 * (include/probe/device.h, probe_cuda_summary_tree_enqueue / _result). */
#ifndef PROBE_INTERCEPT_BASE_LIBPROBE_CUDA_H
#define PROBE_INTERCEPT_BASE_LIBPROBE_CUDA_H

#include <stdint.h>

#include "probe/dtype.h"
#include "probe/metrics.h"
#include "probe/status.h"

/* The root node a device summary leaves in pinned memory (bytes). */
#define SHIM_DEVICE_SUMMARY_BYTES 72

struct shim_libprobe_cuda {
    /* probe_cuda_summary_tree_enqueue(dtype, x, n, stream, result) */
    probe_status (*summary_enqueue)(probe_dtype, const void *, uint64_t, void *, void *);
    /* probe_cuda_summary_tree_result(dtype, n, result, out, tree_hash) */
    probe_status (*summary_result)(probe_dtype, uint64_t, const void *, probe_summary *,
                                   uint64_t *);
};

/* Read PROBE_DEVICE_SUMMARY (constructor): "0" keeps every device summary on
 * the host (the staging copy); unset or "1" computes them on the GPU when
 * libprobe_cuda.so loads; anything else is taken as 1 with a warning. */
void shim_libprobe_cuda_config(void);

/* libprobe_cuda.so (next to libprobe.so, else the loader's search path),
 * loaded once (RTLD_NOW | RTLD_LOCAL) at the first call, and checked for
 * ABI version 1 and both functions. NULL when PROBE_DEVICE_SUMMARY=0 or it
 * cannot be loaded; then shim_libprobe_cuda_why() says why. Any thread. */
const struct shim_libprobe_cuda *shim_libprobe_cuda(void);
/* Why shim_libprobe_cuda() is NULL ("" while it was not asked or loaded). */
const char *shim_libprobe_cuda_why(void);

#endif
