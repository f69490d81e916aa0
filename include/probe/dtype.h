/* probe/dtype.h - logical element types of captured tensors.
 *
 * The numeric values are part of the tap ABI (probe/tap.h) and never change;
 * new types are appended. Names are those written into capture files as the
 * `probe.dtype` attribute and into JSON (`"dtype"`), and match torch's
 * spelling without the "torch." prefix.
 */
#ifndef PROBE_DTYPE_H
#define PROBE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum probe_dtype {
    PROBE_DTYPE_INVALID = 0,
    PROBE_DTYPE_BOOL = 1,      /* 1 byte, 0 = false, anything else = true */
    PROBE_DTYPE_INT8 = 2,
    PROBE_DTYPE_INT16 = 3,
    PROBE_DTYPE_INT32 = 4,
    PROBE_DTYPE_INT64 = 5,
    PROBE_DTYPE_UINT8 = 6,
    PROBE_DTYPE_UINT16 = 7,
    PROBE_DTYPE_UINT32 = 8,
    PROBE_DTYPE_UINT64 = 9,
    PROBE_DTYPE_FLOAT16 = 10,  /* IEEE 754 binary16 */
    PROBE_DTYPE_BFLOAT16 = 11, /* upper 16 bits of IEEE binary32 */
    PROBE_DTYPE_FLOAT32 = 12,
    PROBE_DTYPE_FLOAT64 = 13,
    PROBE_DTYPE_FLOAT8_E4M3FN = 14, /* OCP FP8 E4M3: no inf, S.1111.111 = NaN */
    PROBE_DTYPE_FLOAT8_E5M2 = 15,   /* OCP FP8 E5M2: IEEE-like, has inf/NaN */
    PROBE_DTYPE_COUNT_ = 16
} probe_dtype;

/* Bytes per element; 0 for PROBE_DTYPE_INVALID or an unknown value. */
size_t probe_dtype_size(probe_dtype t);

/* "float32", "bfloat16", "float8_e4m3fn", ...; "invalid" for unknown values. */
const char *probe_dtype_name(probe_dtype t);

/* Inverse of probe_dtype_name (also accepts a "torch." prefix); returns
 * PROBE_DTYPE_INVALID for an unknown name. */
probe_dtype probe_dtype_from_name(const char *name);

/* 1 for the floating types (float16/bfloat16/float32/float64/fp8), else 0. */
int probe_dtype_is_float(probe_dtype t);

/* Precision of a floating type: the number of significand bits p, the
 * implicit leading one included (bfloat16 8, float16 11, float32 24, float64
 * 53, float8_e4m3fn 4, float8_e5m2 3), and in *min_exp (may be NULL) the
 * exponent of its smallest normal number (bfloat16 and float32 -126, float16
 * -14, float64 -1022, e4m3fn -6, e5m2 -14). The spacing of the type at a
 * value x (one unit in the last place) is 2^(max(e, min_exp) - p + 1) where
 * 2^e <= |x| < 2^(e+1). Returns 0 (and *min_exp 0) for integer, bool and
 * unknown types. Source: IEEE 754-2008 section 3.3; OCP OFP8 v1.0. */
int probe_dtype_precision(probe_dtype t, int *min_exp);

/* Convert n elements of type t at src (little-endian, packed) to double.
 * Exact for every type except int64/uint64 beyond 2^53 (rounded to nearest).
 * NaN and infinities are preserved (FP8 encodings per the OCP 8-bit floating
 * point specification v1.0). Returns PROBE_EINVAL for an unknown type. */
probe_status probe_dtype_to_f64(probe_dtype t, const void *src, double *dst, size_t n);

/* Convert n elements of type `from` at src into type `to` at dst (both
 * little-endian, packed), exactly as probe-run --convert injects a reference
 * tensor into a tensor of another floating type (docs/inject.md): each
 * element is converted exactly to double (probe_dtype_to_f64), then
 *   to float64:  stored as is;
 *   to float32:  rounded to nearest even (C's double -> float conversion);
 *   to bfloat16: rounded to float32 as above, then to bfloat16 by round to
 *                nearest even on the upper 16 bits (torch's
 *                .to(torch.bfloat16)); a NaN stays a quiet NaN.
 * From float16, bfloat16 and float32 the double holds a float32 value, so
 * the only rounding is the last one; from float64 to bfloat16 it rounds
 * twice (to float32, then to bfloat16), as the injection does.
 * `from`: float16, bfloat16, float32 or float64; `to`: float32, float64 or
 * bfloat16. Returns PROBE_EINVAL for other types or NULL buffers with n > 0;
 * allocates nothing. */
probe_status probe_dtype_convert(probe_dtype from, const void *src, probe_dtype to, void *dst,
                                 size_t n);

/* --- float8 roundings of a wider tensor (probe/capture.h
 * probe_rounded_fingerprint_compute; docs/gemm.md "Quantized from the same
 * weights") --- */
typedef enum probe_rounding {
    /* "float8_e4m3fn": each element x cast to float8_e4m3fn as torch's
     * Tensor.to(torch.float8_e4m3fn) casts it (c10 Float8_e4m3fn: x as float32,
     * round to nearest even, subnormals kept, |x| >= 480 and NaN/inf -> NaN). */
    PROBE_ROUNDING_E4M3FN = 0,
    /* "float8_e4m3fn/amax": x / s cast as above, with one per-tensor scale
     * s = amax / 448 (amax = max |x| as float32; float32 division, as torchao
     * and TensorRT's per-tensor FP8 recipe compute it); s = 1 when amax is
     * 0; not defined when amax is not finite. */
    PROBE_ROUNDING_E4M3FN_AMAX = 1,
    PROBE_ROUNDING_COUNT_
} probe_rounding;

/* "float8_e4m3fn", "float8_e4m3fn/amax"; NULL for other values. */
const char *probe_rounding_name(probe_rounding r);


#ifdef __cplusplus
}
#endif
#endif
