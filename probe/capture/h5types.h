/* probe/capture/h5types.h - private: HDF5 element types of the capture file and the
 * HDF5 error text, shared by writer.c and reader.c. Not installed; the
 * functions are hidden (not exported from libprobe.so).
 *
 * Every function here calls HDF5 and must run inside H5E_BEGIN_TRY /
 * H5E_END_TRY in the caller, so that no HDF5 error stack is ever printed.
 */
#ifndef PROBE_H5TYPES_H
#define PROBE_H5TYPES_H

#include <hdf5.h>
#include <stddef.h>
#include "probe/dtype.h"

#define PROBE_HIDDEN __attribute__((visibility("hidden")))

/* The file (storage) datatype of a logical element type, little-endian:
 *   bool       enum over int8 {FALSE = 0, TRUE = 1} (h5py's numpy-bool type)
 *   int8..64, uint8..64   H5T_STD_[IU]{8,16,32,64}LE
 *   float16    2-byte IEEE binary16 (sign 15, exponent 10..14 bias 15,
 *              mantissa 0..9); HDF5 1.10 has no predefined F16 type
 *   bfloat16   2-byte float: sign 15, exponent 7..14 bias 127, mantissa 0..6
 *   float32/64 H5T_IEEE_F32LE / H5T_IEEE_F64LE
 *   float8_e4m3fn, float8_e5m2   H5T_STD_U8LE holding the raw encoding
 * Returns a new type id the caller closes, or H5I_INVALID_HID (negative) for
 * PROBE_DTYPE_INVALID / an unknown value or when HDF5 fails. */
PROBE_HIDDEN hid_t probe_h5_type_create(probe_dtype t);

/* The 2-byte float types above in the given byte order (H5T_ORDER_LE or
 * H5T_ORDER_BE). Built from a copy of H5T_IEEE_F32LE in the order HDF5
 * requires: fields (must fit the 32-bit precision), then precision 16, then
 * size 2, then exponent bias. Caller closes; negative on failure. */
PROBE_HIDDEN hid_t probe_h5_float16_create(H5T_order_t order);
PROBE_HIDDEN hid_t probe_h5_bfloat16_create(H5T_order_t order);

/* Classify a dataset's file datatype as a tensor element type.
 * attr_dtype is the dataset's probe.dtype attribute (PROBE_DTYPE_INVALID if
 * absent or unknown); it matters only for a 1-byte unsigned integer, where
 * float8_e4m3fn / float8_e5m2 select the FP8 reading of the raw bytes.
 * Recognised: IEEE-layout floats of 2 (binary16 or bfloat16 fields), 4 and 8
 * bytes and integers of 1/2/4/8 bytes, either byte order, full precision, no
 * bit offset; an enum over a 1-byte integer whose members are exactly
 * FALSE = 0 and TRUE = 1 (bool). On success returns the logical dtype and sets
 * *memtype to a new type id (caller closes) that H5Dread converts the data to:
 * the same class, size and fields in little-endian order, so the bytes read
 * are what probe_dtype_to_f64() expects. Returns PROBE_DTYPE_INVALID (and
 * *memtype < 0) for every other type: strings, compound, vlen, references,
 * opaque, arrays, bitfields, other float layouts or integer precisions. */
PROBE_HIDDEN probe_dtype probe_h5_classify(hid_t ftype, probe_dtype attr_dtype, hid_t *memtype);

/* Write into buf (size bytes, always NUL-terminated) the description of the
 * most specific error on the calling thread's HDF5 error stack (the function
 * where HDF5 first detected it), e.g. "truncated file: eof = 1024, ...", or
 * "unknown HDF5 error" if the stack is empty. Does not clear the stack. */
PROBE_HIDDEN void probe_h5_error_text(char *buf, size_t size);

#endif
