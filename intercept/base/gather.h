/* intercept/base/gather.h - element counts and spans with overflow checks; strided gather and scatter. */
#ifndef PROBE_INTERCEPT_BASE_GATHER_H
#define PROBE_INTERCEPT_BASE_GATHER_H

#include <stddef.h>
#include <stdint.h>
#include "probe/status.h"

struct shim_extent {
    uint64_t n;        /* elements: prod(shape), 1 for rank 0 */
    size_t nbytes;     /* n * element size */
    size_t span_bytes; /* bytes from the lowest to one past the highest byte the strides reach */
    int contiguous;    /* 1 if the strided layout equals row-major contiguous */
};

/* Compute the extent of a tensor. shape: rank entries >= 0; strides: rank
 * entries >= 0 in elements, or NULL for row-major contiguous; esize: bytes
 * per element (1..8). PROBE_EINVAL (message names the field) on a negative
 * entry or when n, nbytes or span_bytes overflow size_t. For n == 0 every
 * size is 0. */
probe_status shim_gather_extent(int rank, const int64_t *shape, const int64_t *strides, size_t esize,
                            struct shim_extent *out);

/* Copy the n elements of a strided tensor whose element [0,...,0] is at base
 * into dst in row-major order. Element (i_0..i_{r-1}) is read at
 * base + esize * sum_k i_k * strides[k] (strides NULL = contiguous). dst
 * holds n * esize bytes. Overlapping (stride 0) and arbitrary orders are
 * allowed; src and dst must not overlap. */
void shim_gather(void *dst, const void *base, int rank, const int64_t *shape,
                 const int64_t *strides, size_t esize);

/* Write the n elements of src (contiguous, row-major) into a strided tensor
 * whose element [0,...,0] is at base: the inverse of shim_gather, same
 * arguments. With overlapping strides (stride 0) the last write wins. */
void shim_gather_scatter(void *base, const void *src, int rank, const int64_t *shape,
                  const int64_t *strides, size_t esize);

#endif
