/* capture_write_all FILE - write one tensor of every probe element type with
 * known values (plus a scalar, an empty tensor, a manifest and a skip) through
 * the probe writer. tests/e2e/test_h5py_interop.py reads the file with h5py
 * and h5dump and checks every value and attribute against its own copy of the
 * table below (docs/file-format.md). Exit 0 on success, 2 on error with the
 * probe message on stderr. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "probe/capture.h"

static probe_writer *w;
static uint64_t seq;

static int put(const char *slot, probe_dtype t, int rank, const int64_t *shape, const void *data,
               size_t nbytes)
{
    char path[128];
    snprintf(path, sizeof path, "/all/0000/%s", slot);
    probe_record r = {.path = path, .component = "all", .slot = slot, .call = 0, .step = 3,
                      .cfg_branch = 1, .timestep = 999.5, .scope = "outer/inner", .device = "cpu",
                      .seq = seq++, .dtype = t, .rank = rank, .shape = shape};
    if (probe_writer_put(w, &r, data, nbytes) != PROBE_OK) {
        fprintf(stderr, "capture_write_all: %s\n", probe_last_error());
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: capture_write_all FILE\n");
        return 2;
    }
    if (probe_writer_open(argv[1], "{\"label\": \"all\", \"argv\": [\"capture_write_all\"]}", &w) != PROBE_OK) {
        fprintf(stderr, "capture_write_all: %s\n", probe_last_error());
        return 2;
    }
    static const uint32_t f32[6] = {0x3f800000u, 0xc0200000u, 0x40490fdbu, 0x00000001u, 0x7f800000u, 0x7fc00000u};
    static const uint64_t f64[6] = {0x3fb999999999999aull, 0xfe37e43c8800759cull /* -1e300 */, 0x1ull, 0x8000000000000000ull,
                                    0x7ff0000000000000ull, 0x7ff8000000000000ull};
    static const uint16_t f16[8] = {0x3c00, 0xc100, 0x0001, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x8000};
    static const uint16_t bf16[10] = {0x3f80, 0xc020, 0x4049, 0x7e96, 0x0001, 0x7f80, 0xff80, 0x7fc0, 0x8000, 0x7f7f};
    static const int8_t i8[5] = {INT8_MIN, -1, 0, 1, INT8_MAX};
    static const int16_t i16[5] = {INT16_MIN, -1, 0, 1, INT16_MAX};
    static const int32_t i32[5] = {INT32_MIN, -1, 0, 1, INT32_MAX};
    static const int64_t i64[5] = {INT64_MIN, -1, 0, 1, INT64_MAX};
    static const uint8_t u8[5] = {0, 1, 127, 128, UINT8_MAX};
    static const uint16_t u16[5] = {0, 1, 32767, 32768, UINT16_MAX};
    static const uint32_t u32[5] = {0, 1, 2147483647u, 2147483648u, UINT32_MAX};
    static const uint64_t u64[5] = {0, 1, (1ull << 53) + 1, 1ull << 63, UINT64_MAX};
    static const uint8_t b[5] = {1, 0, 2, 255, 0}; /* nonzero is true: stored as 1 */
    uint8_t fp8[256];
    for (int i = 0; i < 256; i++)
        fp8[i] = (uint8_t)i;
    const float scalar = 42.5f;

    int64_t s23[2] = {2, 3}, s6[1] = {6}, s24[2] = {2, 4}, s10[1] = {10}, s5[1] = {5}, s16x16[2] = {16, 16},
            s03[2] = {0, 3};
    int rc = 0;
    rc |= put("float32", PROBE_DTYPE_FLOAT32, 2, s23, f32, sizeof f32);
    rc |= put("float64", PROBE_DTYPE_FLOAT64, 1, s6, f64, sizeof f64);
    rc |= put("float16", PROBE_DTYPE_FLOAT16, 2, s24, f16, sizeof f16);
    rc |= put("bfloat16", PROBE_DTYPE_BFLOAT16, 1, s10, bf16, sizeof bf16);
    rc |= put("float8_e4m3fn", PROBE_DTYPE_FLOAT8_E4M3FN, 2, s16x16, fp8, sizeof fp8);
    rc |= put("float8_e5m2", PROBE_DTYPE_FLOAT8_E5M2, 2, s16x16, fp8, sizeof fp8);
    rc |= put("int8", PROBE_DTYPE_INT8, 1, s5, i8, sizeof i8);
    rc |= put("int16", PROBE_DTYPE_INT16, 1, s5, i16, sizeof i16);
    rc |= put("int32", PROBE_DTYPE_INT32, 1, s5, i32, sizeof i32);
    rc |= put("int64", PROBE_DTYPE_INT64, 1, s5, i64, sizeof i64);
    rc |= put("uint8", PROBE_DTYPE_UINT8, 1, s5, u8, sizeof u8);
    rc |= put("uint16", PROBE_DTYPE_UINT16, 1, s5, u16, sizeof u16);
    rc |= put("uint32", PROBE_DTYPE_UINT32, 1, s5, u32, sizeof u32);
    rc |= put("uint64", PROBE_DTYPE_UINT64, 1, s5, u64, sizeof u64);
    rc |= put("bool", PROBE_DTYPE_BOOL, 1, s5, b, sizeof b);
    rc |= put("scalar", PROBE_DTYPE_FLOAT32, 0, NULL, &scalar, sizeof scalar);
    rc |= put("empty", PROBE_DTYPE_FLOAT32, 2, s03, NULL, 0);
    probe_record sk = {.path = "/all/0000/skipped", .call = -1, .step = -1, .cfg_branch = -1,
                       .timestep = NAN};
    if (rc == 0 && probe_writer_skip(w, &sk, "stream capturing a CUDA graph") != PROBE_OK) {
        fprintf(stderr, "capture_write_all: %s\n", probe_last_error());
        rc = -1;
    }
    if (probe_writer_close(w) != PROBE_OK) {
        fprintf(stderr, "capture_write_all: %s\n", probe_last_error());
        rc = -1;
    }
    return rc == 0 ? 0 : 2;
}
