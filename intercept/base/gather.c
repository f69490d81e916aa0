/* gather.c - tensor extents (overflow-checked) and the strided gather that
 * turns any non-negative-strided layout into row-major contiguous bytes. */
#include <string.h>

#include "base/gather.h"
#include "probe/capture.h"

_Static_assert(sizeof(size_t) == 8, "probe needs a 64-bit size_t");

static int mul_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static int add_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

probe_status shim_gather_extent(int rank, const int64_t *shape, const int64_t *strides, size_t esize,
                            struct shim_extent *out)
{
    size_t n = 1, reach = 0; /* reach: highest element offset the strides address */
    int zero = 0;
    memset(out, 0, sizeof *out);
    for (int k = 0; k < rank; ++k) {
        if (shape[k] < 0)
            return probe_set_error(PROBE_EINVAL, "tap: shape[%d] = %lld is negative", k,
                                   (long long)shape[k]);
        if (strides && strides[k] < 0)
            return probe_set_error(PROBE_EINVAL, "tap: strides[%d] = %lld is negative", k,
                                   (long long)strides[k]);
        if (shape[k] == 0)
            zero = 1;
    }
    if (zero)
        return PROBE_OK; /* no elements: nothing is read, sizes stay 0 */
    for (int k = 0; k < rank; ++k) {
        size_t dim = (size_t)shape[k], term;
        if (!mul_ok(n, dim, &n))
            return probe_set_error(PROBE_EINVAL, "tap: element count overflows at shape[%d]", k);
        if (strides) {
            if (!mul_ok(dim - 1, (size_t)strides[k], &term) ||
                !add_ok(reach, term, &reach))
                return probe_set_error(PROBE_EINVAL, "tap: strided span overflows at strides[%d]", k);
        }
    }
    size_t nbytes, span;
    if (!mul_ok(n, esize, &nbytes))
        return probe_set_error(PROBE_EINVAL, "tap: byte size overflows (%zu elements)", n);
    if (strides) {
        if (!add_ok(reach, 1, &reach) || !mul_ok(reach, esize, &span))
            return probe_set_error(PROBE_EINVAL, "tap: strided span overflows");
    } else {
        span = nbytes;
    }
    int contiguous = 1;
    if (strides) {
        size_t expect = 1;
        for (int k = rank - 1; k >= 0; --k) {
            if (shape[k] != 1 && (size_t)strides[k] != expect) {
                contiguous = 0;
                break;
            }
            expect *= (size_t)shape[k];
        }
    }
    out->n = n;
    out->nbytes = nbytes;
    out->span_bytes = span;
    out->contiguous = contiguous;
    return PROBE_OK;
}

static void copy_elem(unsigned char *d, const unsigned char *s, size_t esize)
{
    switch (esize) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, esize); break;
    }
}

void shim_gather(void *dst, const void *base, int rank, const int64_t *shape,
                 const int64_t *strides, size_t esize)
{
    size_t size[PROBE_MAX_RANK], stride[PROBE_MAX_RANK];
    int r = 0;
    size_t n = 1;
    for (int k = 0; k < rank; ++k)
        n *= (size_t)shape[k];
    if (n == 0)
        return;
    if (!strides) {
        memcpy(dst, base, n * esize);
        return;
    }
    /* Drop size-1 dimensions, then merge a dimension into the previous one
     * when the previous stride equals size * stride (they walk memory as one). */
    for (int k = 0; k < rank; ++k) {
        if (shape[k] == 1)
            continue;
        size_t sz = (size_t)shape[k], st = (size_t)strides[k];
        if (r > 0 && stride[r - 1] == sz * st) {
            size[r - 1] *= sz;
            stride[r - 1] = st;
        } else {
            size[r] = sz;
            stride[r] = st;
            ++r;
        }
    }
    const unsigned char *src = base;
    unsigned char *out = dst;
    if (r == 0) {
        memcpy(out, src, esize);
        return;
    }
    if (r == 1 && stride[0] == 1) {
        memcpy(out, src, size[0] * esize);
        return;
    }
    /* Inner dimension copied as a row (stride 1) or element by element;
     * outer dimensions walked with an odometer. */
    size_t inner = size[r - 1], istride = stride[r - 1] * esize;
    size_t idx[PROBE_MAX_RANK] = {0};
    size_t rows = n / inner;
    size_t off = 0; /* byte offset of the current row start */
    for (size_t row = 0; row < rows; ++row) {
        const unsigned char *p = src + off;
        if (stride[r - 1] == 1) {
            memcpy(out, p, inner * esize);
            out += inner * esize;
        } else {
            for (size_t i = 0; i < inner; ++i, p += istride, out += esize)
                copy_elem(out, p, esize);
        }
        for (int k = r - 2; k >= 0; --k) {
            if (++idx[k] < size[k]) {
                off += stride[k] * esize;
                break;
            }
            off -= (size[k] - 1) * stride[k] * esize;
            idx[k] = 0;
        }
    }
}

void shim_gather_scatter(void *base, const void *src, int rank, const int64_t *shape,
                  const int64_t *strides, size_t esize)
{
    size_t n = 1;
    for (int k = 0; k < rank; ++k)
        n *= (size_t)shape[k];
    if (n == 0)
        return;
    int contiguous = !strides;
    if (strides) {
        size_t expect = 1;
        contiguous = 1;
        for (int k = rank - 1; k >= 0; --k) {
            if (shape[k] != 1 && (size_t)strides[k] != expect) {
                contiguous = 0;
                break;
            }
            expect *= (size_t)shape[k];
        }
    }
    if (contiguous) {
        memcpy(base, src, n * esize);
        return;
    }
    /* Odometer over the row-major index; element i goes to
     * base + esize * sum_k idx[k] * strides[k]. */
    size_t idx[PROBE_MAX_RANK] = {0};
    size_t off = 0; /* element offset of idx */
    const unsigned char *s = src;
    unsigned char *b = base;
    for (size_t i = 0; i < n; ++i, s += esize) {
        copy_elem(b + off * esize, s, esize);
        for (int k = rank - 1; k >= 0; --k) {
            if (++idx[k] < (size_t)shape[k]) {
                off += (size_t)strides[k];
                break;
            }
            off -= (size_t)(shape[k] - 1) * (size_t)strides[k];
            idx[k] = 0;
        }
    }
}
