/* Unit tests for the capture file: probe/capture/writer.c, probe/capture/reader.c,
 * probe/capture/h5types.c (include/probe/capture.h, docs/file-format.md).
 *
 * Expected values are derived independently of the code under test: by hand
 * (commented), by the small fp64 decoders below written from the format
 * definitions (IEEE 754 binary16, bfloat16 = the top half of binary32, OCP
 * FP8 E4M3FN/E5M2), by published XXH64 test vectors, and by reading the files
 * back through the raw HDF5 C API. Foreign files (big-endian, h5py-style
 * bool, strings, compounds, links, ...) are made with the raw HDF5 API. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe/capture.h"

/* --- fixtures and helpers --- */

#define TMPDIR_PREFIX "probe-capture"
#include "tmpdir_fixture.h"

TestSuite(capture, .init = setup, .fini = teardown);

/* A path in this test's directory (4 rotating buffers). */
static const char *tmp(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static probe_record rec_of(const char *path, probe_dtype t, int rank, const int64_t *shape, uint64_t seq)
{
    probe_record r = {.path = path, .component = NULL, .slot = NULL, .call = -1, .step = -1,
                      .cfg_branch = -1, .timestep = NAN, .scope = NULL, .device = NULL,
                      .seq = seq, .dtype = t, .rank = rank, .shape = shape};
    return r;
}

static void put_ok(probe_writer *w, const probe_record *r, const void *data, size_t nbytes)
{
    probe_status s = probe_writer_put(w, r, data, nbytes);
    cr_assert_eq(s, PROBE_OK, "put %s: %s", r->path, probe_last_error());
}

static probe_file *open_ok(const char *path)
{
    probe_file *f = NULL;
    probe_status s = probe_file_open(path, &f);
    cr_assert_eq(s, PROBE_OK, "open %s: %s", path, probe_last_error());
    cr_assert_not_null(f);
    return f;
}

static const probe_tensor_info *find_ok(probe_file *f, const char *path, size_t *index)
{
    size_t i = (size_t)-1;
    probe_status s = probe_file_find(f, path, &i);
    cr_assert_eq(s, PROBE_OK, "find %s: %s", path, probe_last_error());
    if (index != NULL)
        *index = i;
    return probe_file_tensor(f, i);
}

/* Both NaN, or equal with the same sign (so -0 != +0). */
static int same(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

static void assert_values(probe_file *f, size_t i, const double *want, size_t n)
{
    const probe_tensor_info *t = probe_file_tensor(f, i);
    cr_assert_eq(t->n, n, "%s: n = %llu, want %zu", t->path, (unsigned long long)t->n, n);
    double *got = malloc((n ? n : 1) * sizeof *got);
    cr_assert_not_null(got);
    cr_assert_eq(probe_file_read_f64(f, i, got), PROBE_OK, "%s", probe_last_error());
    for (size_t k = 0; k < n; k++)
        cr_assert(same(got[k], want[k]), "%s[%zu] = %.17g, want %.17g", t->path, k, got[k], want[k]);
    free(got);
}

/* Element decoders written from the format definitions (the fp64 oracle). */
static double oracle_f16(uint16_t h) /* IEEE 754 binary16: 1-5-10, bias 15 */
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static double oracle_bf16(uint16_t h) /* bfloat16: 1-8-7, bias 127 */
{
    int e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
    return (h & 0x8000) ? -v : v;
}

static double oracle_e4m3fn(uint8_t b) /* OCP FP8 E4M3: 1-4-3, bias 7, S.1111.111 NaN, no inf */
{
    int e = (b >> 3) & 15, m = b & 7;
    double v = (e == 15 && m == 7) ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (b & 0x80) ? -v : v;
}

static double oracle_e5m2(uint8_t b) /* OCP FP8 E5M2: 1-5-2, bias 15, IEEE-like */
{
    int e = (b >> 2) & 31, m = b & 3;
    double v = e == 0 ? ldexp(m, -16) : e == 31 ? (m ? NAN : INFINITY) : ldexp(4 + m, e - 17);
    return (b & 0x80) ? -v : v;
}

static void hex16(uint64_t h, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

/* --- the oracles themselves, against hand-derived values --- */

Test(capture, oracles_match_hand_derived_values)
{
    cr_assert(same(oracle_f16(0x3c00), 1.0));
    cr_assert(same(oracle_f16(0x7bff), 65504.0));          /* (2 - 2^-10) * 2^15 */
    cr_assert(same(oracle_f16(0x0001), 5.9604644775390625e-08)); /* 2^-24 */
    cr_assert(same(oracle_bf16(0x4049), 3.140625));         /* 1.1001001b * 2 */
    cr_assert(same(oracle_bf16(0x0001), ldexp(1, -133)));
    cr_assert(same(oracle_bf16(0x7f7f), 3.3895313892515355e+38)); /* (2 - 2^-7) * 2^127 */
    cr_assert(same(oracle_e4m3fn(0x7e), 448.0));             /* 1.75 * 2^8, the largest */
    cr_assert(same(oracle_e4m3fn(0x38), 1.0));
    cr_assert(same(oracle_e4m3fn(0x01), 0.001953125));       /* 2^-9 */
    cr_assert(isnan(oracle_e4m3fn(0xff)));
    cr_assert(same(oracle_e5m2(0x7b), 57344.0));             /* 1.75 * 2^15 */
    cr_assert(same(oracle_e5m2(0x3c), 1.0));
    cr_assert(same(oracle_e5m2(0x7c), INFINITY));
    cr_assert(same(oracle_e5m2(0x01), 1.52587890625e-05));   /* 2^-16 */
}

/* --- hash --- */

Test(capture, hash_is_xxh64_seed_0)
{
    /* Published XXH64 test vectors (seed 0). */
    cr_assert_eq(probe_capture_hash("", 0), 0xef46db3751d8e999ull);
    cr_assert_eq(probe_capture_hash(NULL, 0), 0xef46db3751d8e999ull);
    cr_assert_eq(probe_capture_hash("a", 1), 0xd24ec4f1a98c6e5bull);
    cr_assert_eq(probe_capture_hash("abc", 3), 0x44bc2cf5ad770999ull);
}

/* --- round trip of every element type --- */

struct case_ {
    const char *slot;
    probe_dtype dtype;
    int rank;
    int64_t shape[2];
    const void *data;
    size_t nbytes;
    double want[256];
};

static const uint32_t k_f32[6] = {0x3f800000u, 0xc0200000u, 0x40490fdbu, 0x00000001u, 0x7f800000u, 0xffc00000u};
static const uint64_t k_f64[6] = {0x3fb999999999999aull, 0xfe37e43c8800759cull, 0x1ull, 0x8000000000000000ull,
                                  0xfff0000000000000ull, 0x7ff8000000000000ull};
static const uint16_t k_f16[8] = {0x3c00, 0xc100, 0x0001, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x8000};
static const uint16_t k_bf16[10] = {0x3f80, 0xc020, 0x4049, 0x7e96, 0x0001, 0x7f80, 0xff80, 0x7fc0, 0x8000, 0x7f7f};
static const int8_t k_i8[5] = {INT8_MIN, -1, 0, 1, INT8_MAX};
static const int16_t k_i16[5] = {INT16_MIN, -1, 0, 1, INT16_MAX};
static const int32_t k_i32[5] = {INT32_MIN, -1, 0, 1, INT32_MAX};
static const int64_t k_i64[5] = {INT64_MIN, -1, 0, 1, (1ll << 53) + 1};
static const uint8_t k_u8[5] = {0, 1, 127, 128, UINT8_MAX};
static const uint16_t k_u16[5] = {0, 1, 32767, 32768, UINT16_MAX};
static const uint32_t k_u32[5] = {0, 1, 2147483647u, 2147483648u, UINT32_MAX};
static const uint64_t k_u64[5] = {0, 1, 1ull << 53, 1ull << 63, UINT64_MAX};
static const uint8_t k_bool[5] = {1, 0, 2, 255, 0};
static uint8_t k_fp8[256];
static const float k_scalar = 42.5f;

static void fill_cases(struct case_ *c, size_t *n)
{
    for (int i = 0; i < 256; i++)
        k_fp8[i] = (uint8_t)i;
    struct case_ cs[] = {
        /* 1, -2.5, float(pi), smallest subnormal 2^-149, inf, -nan */
        {"float32", PROBE_DTYPE_FLOAT32, 2, {2, 3}, k_f32, sizeof k_f32,
         {1.0, -2.5, 3.1415927410125732, 1.4012984643248171e-45, INFINITY, NAN}},
        {"float64", PROBE_DTYPE_FLOAT64, 1, {6}, k_f64, sizeof k_f64,
         {0.1, -1e300, 4.9406564584124654e-324, -0.0, -INFINITY, NAN}},
        {"float16", PROBE_DTYPE_FLOAT16, 2, {2, 4}, k_f16, sizeof k_f16,
         {1.0, -2.5, 5.9604644775390625e-08, 65504.0, INFINITY, -INFINITY, NAN, -0.0}},
        /* 1, -2.5, 3.140625, 0x7e96 = 1.171875 * 2^126, 2^-133, inf, -inf, nan, -0, max */
        {"bfloat16", PROBE_DTYPE_BFLOAT16, 1, {10}, k_bf16, sizeof k_bf16,
         {1.0, -2.5, 3.140625, 9.969209968386869e+37, 9.1835496157991212e-41, INFINITY, -INFINITY, NAN,
          -0.0, 3.3895313892515355e+38}},
        {"int8", PROBE_DTYPE_INT8, 1, {5}, k_i8, sizeof k_i8, {-128, -1, 0, 1, 127}},
        {"int16", PROBE_DTYPE_INT16, 1, {5}, k_i16, sizeof k_i16, {-32768, -1, 0, 1, 32767}},
        {"int32", PROBE_DTYPE_INT32, 1, {5}, k_i32, sizeof k_i32, {-2147483648.0, -1, 0, 1, 2147483647.0}},
        /* 2^53 + 1 rounds to nearest even: 2^53 */
        {"int64", PROBE_DTYPE_INT64, 1, {5}, k_i64, sizeof k_i64,
         {-9223372036854775808.0, -1, 0, 1, 9007199254740992.0}},
        {"uint8", PROBE_DTYPE_UINT8, 1, {5}, k_u8, sizeof k_u8, {0, 1, 127, 128, 255}},
        {"uint16", PROBE_DTYPE_UINT16, 1, {5}, k_u16, sizeof k_u16, {0, 1, 32767, 32768, 65535}},
        {"uint32", PROBE_DTYPE_UINT32, 1, {5}, k_u32, sizeof k_u32, {0, 1, 2147483647.0, 2147483648.0, 4294967295.0}},
        /* 2^64 - 1 rounds to 2^64 */
        {"uint64", PROBE_DTYPE_UINT64, 1, {5}, k_u64, sizeof k_u64,
         {0, 1, 9007199254740992.0, 9223372036854775808.0, 18446744073709551616.0}},
        {"bool", PROBE_DTYPE_BOOL, 1, {5}, k_bool, sizeof k_bool, {1, 0, 1, 1, 0}},
        {"float8_e4m3fn", PROBE_DTYPE_FLOAT8_E4M3FN, 2, {16, 16}, k_fp8, sizeof k_fp8, {0}},
        {"float8_e5m2", PROBE_DTYPE_FLOAT8_E5M2, 2, {16, 16}, k_fp8, sizeof k_fp8, {0}},
        {"scalar", PROBE_DTYPE_FLOAT32, 0, {0}, &k_scalar, sizeof k_scalar, {42.5}},
        {"empty", PROBE_DTYPE_FLOAT32, 2, {0, 3}, NULL, 0, {0}},
    };
    *n = sizeof cs / sizeof cs[0];
    memcpy(c, cs, sizeof cs);
    for (size_t i = 0; i < *n; i++) {
        if (c[i].dtype == PROBE_DTYPE_FLOAT8_E4M3FN)
            for (int k = 0; k < 256; k++)
                c[i].want[k] = oracle_e4m3fn((uint8_t)k);
        if (c[i].dtype == PROBE_DTYPE_FLOAT8_E5M2)
            for (int k = 0; k < 256; k++)
                c[i].want[k] = oracle_e5m2((uint8_t)k);
    }
}

static uint64_t elements(const struct case_ *c)
{
    uint64_t n = 1;
    for (int k = 0; k < c->rank; k++)
        n *= (uint64_t)c->shape[k];
    return n;
}

Test(capture, round_trip_every_dtype_bit_exact)
{
    static struct case_ cs[32];
    size_t nc;
    fill_cases(cs, &nc);
    const char *file = tmp("all.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{\"label\":\"rt\"}", &w), PROBE_OK, "%s", probe_last_error());
    char paths[32][64];
    for (size_t i = 0; i < nc; i++) {
        snprintf(paths[i], sizeof paths[i], "/dit.step/%04zu/%s", i, cs[i].slot);
        probe_record r = rec_of(paths[i], cs[i].dtype, cs[i].rank, cs[i].shape, 100 + i);
        r.component = "dit.step";
        r.slot = cs[i].slot;
        r.call = (int64_t)i;
        r.step = 7;
        r.cfg_branch = 1;
        r.timestep = 999.5;
        r.scope = "pipeline/denoise";
        r.device = "cuda:0";
        put_ok(w, &r, cs[i].data, cs[i].nbytes);
    }
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());

    probe_file *f = open_ok(file);
    cr_assert_eq(probe_file_count(f), nc);
    cr_assert_eq(probe_file_ignored_count(f), 0);
    cr_assert_str_eq(probe_file_path(f), file);
    for (size_t i = 0; i < nc; i++) {
        const probe_tensor_info *t = probe_file_tensor(f, i); /* seq order = write order */
        cr_assert_str_eq(t->path, paths[i]);
        cr_assert_eq(t->dtype, cs[i].dtype, "%s: dtype %d", t->path, t->dtype);
        cr_assert_eq(t->rank, cs[i].rank);
        for (int k = 0; k < t->rank; k++)
            cr_assert_eq(t->shape[k], cs[i].shape[k]);
        cr_assert_eq(t->n, elements(&cs[i]));
        cr_assert_eq(t->seq, (int64_t)(100 + i));
        cr_assert_eq(t->call, (int64_t)i);
        cr_assert_eq(t->step, 7);
        cr_assert_eq(t->cfg_branch, 1);
        cr_assert(same(t->timestep, 999.5));
        cr_assert_str_eq(t->component, "dit.step");
        cr_assert_str_eq(t->slot, cs[i].slot);
        cr_assert_str_eq(t->scope, "pipeline/denoise");

        /* raw bytes: bit-exact, except bool normalised to 0/1 */
        size_t nb = cs[i].nbytes;
        unsigned char *raw = malloc(nb ? nb : 1);
        cr_assert_eq(probe_file_read_raw(f, i, raw, nb), PROBE_OK, "%s", probe_last_error());
        if (cs[i].dtype == PROBE_DTYPE_BOOL) {
            static const uint8_t norm[5] = {1, 0, 1, 1, 0};
            cr_assert_arr_eq(raw, norm, 5);
        } else if (nb > 0) {
            cr_assert_arr_eq(raw, cs[i].data, nb, "%s: raw bytes differ", t->path);
        }
        char h[17];
        hex16(probe_capture_hash(raw, nb), h);
        cr_assert_str_eq(t->hash, h, "%s: hash", t->path);
        free(raw);
        assert_values(f, i, cs[i].want, (size_t)elements(&cs[i]));
    }
    cr_assert_str_eq(probe_file_manifest(f), "{\"label\":\"rt\"}");
    probe_file_close(f);
}

/* float16 and bfloat16 over all 65536 encodings and every read size used by
 * the in-place conversion of probe_file_read_f64 (element sizes 1, 2, 4, 8,
 * more elements than one conversion block). */
Test(capture, every_16bit_encoding_and_large_tensors)
{
    static uint16_t all16[65536];
    static double want[65536];
    for (int i = 0; i < 65536; i++)
        all16[i] = (uint16_t)i;
    const char *file = tmp("big.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK);
    int64_t n16[1] = {65536}, n3k[1] = {3001};
    probe_record r = rec_of("/f16", PROBE_DTYPE_FLOAT16, 1, n16, 0);
    put_ok(w, &r, all16, sizeof all16);
    r = rec_of("/bf16", PROBE_DTYPE_BFLOAT16, 1, n16, 1);
    put_ok(w, &r, all16, sizeof all16);
    static int8_t i8[3001];
    static double f64[3001];
    static float f32[3001];
    for (int i = 0; i < 3001; i++) {
        i8[i] = (int8_t)(i % 256 - 128);
        f64[i] = i * 0.25 - 100;
        f32[i] = (float)(i * 0.5 - 7);
    }
    r = rec_of("/i8", PROBE_DTYPE_INT8, 1, n3k, 2);
    put_ok(w, &r, i8, sizeof i8);
    r = rec_of("/f64", PROBE_DTYPE_FLOAT64, 1, n3k, 3);
    put_ok(w, &r, f64, sizeof f64);
    r = rec_of("/f32", PROBE_DTYPE_FLOAT32, 1, n3k, 4);
    put_ok(w, &r, f32, sizeof f32);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);

    probe_file *f = open_ok(file);
    size_t i;
    find_ok(f, "/f16", &i);
    for (int k = 0; k < 65536; k++)
        want[k] = oracle_f16((uint16_t)k);
    assert_values(f, i, want, 65536);
    find_ok(f, "/bf16", &i);
    for (int k = 0; k < 65536; k++)
        want[k] = oracle_bf16((uint16_t)k);
    assert_values(f, i, want, 65536);
    find_ok(f, "/i8", &i);
    for (int k = 0; k < 3001; k++)
        want[k] = k % 256 - 128;
    assert_values(f, i, want, 3001);
    find_ok(f, "/f64", &i);
    for (int k = 0; k < 3001; k++)
        want[k] = k * 0.25 - 100;
    assert_values(f, i, want, 3001);
    find_ok(f, "/f32", &i);
    for (int k = 0; k < 3001; k++)
        want[k] = k * 0.5 - 7;
    assert_values(f, i, want, 3001);
    probe_file_close(f);
}

/* --- attributes, read back with the raw HDF5 API --- */

static char *raw_str_attr(hid_t obj, const char *name)
{
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    cr_assert_geq(a, 0, "attribute %s missing", name);
    hid_t t = H5Aget_type(a);
    cr_assert_eq(H5Tget_class(t), H5T_STRING, "%s is not a string", name);
    cr_assert_gt(H5Tis_variable_str(t), 0, "%s is not variable-length", name);
    cr_assert_eq(H5Tget_cset(t), H5T_CSET_UTF8, "%s is not UTF-8", name);
    hid_t sp = H5Aget_space(a);
    cr_assert_eq(H5Sget_simple_extent_type(sp), H5S_SCALAR, "%s is not scalar", name);
    char *v = NULL;
    cr_assert_geq(H5Aread(a, t, &v), 0);
    char *copy = strdup(v);
    H5free_memory(v);
    H5Sclose(sp);
    H5Tclose(t);
    H5Aclose(a);
    return copy;
}

static int64_t raw_i64_attr(hid_t obj, const char *name, hid_t want_type)
{
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    cr_assert_geq(a, 0, "attribute %s missing", name);
    hid_t t = H5Aget_type(a);
    cr_assert_gt(H5Tequal(t, want_type), 0, "%s has an unexpected type", name);
    int64_t v = 0;
    cr_assert_geq(H5Aread(a, H5T_NATIVE_INT64, &v), 0);
    H5Tclose(t);
    H5Aclose(a);
    return v;
}

Test(capture, attributes_as_documented)
{
    const char *file = tmp("attrs.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{\"argv\":[\"python\",\"gen.py\"]}", &w), PROBE_OK);
    int64_t shape[3] = {1, 2, 3};
    float data[6] = {1, 2, 3, 4, 5, 6};
    probe_record r = rec_of("/text_encoder/0000/out", PROBE_DTYPE_FLOAT32, 3, shape, 5);
    r.component = "text_encoder";
    r.slot = "out";
    r.call = 0;
    r.step = 2;
    r.cfg_branch = 0;
    r.timestep = 0.25;
    r.scope = "";
    r.device = "cpu";
    put_ok(w, &r, data, sizeof data);
    float one = 1.0f;
    probe_record bare = rec_of("/x", PROBE_DTYPE_FLOAT32, 0, NULL, 6);
    put_ok(w, &bare, &one, sizeof one);
    probe_record sk = rec_of("/vae.decode/0000/out", PROBE_DTYPE_FLOAT32, 0, NULL, 0);
    cr_assert_eq(probe_writer_skip(w, &sk, "stream capturing a CUDA graph"), PROBE_OK);
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());

    hid_t fid = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(fid, 0);
    char *s = raw_str_attr(fid, "probe.format");
    cr_assert_str_eq(s, "probe-capture");
    free(s);
    cr_assert_eq(raw_i64_attr(fid, "probe.version", H5T_STD_I64LE), 1);
    s = raw_str_attr(fid, "probe.manifest");
    cr_assert_str_eq(s, "{\"argv\":[\"python\",\"gen.py\"]}");
    free(s);
    s = raw_str_attr(fid, "probe.skips");
    cr_assert_str_eq(s, "[{\"path\":\"/vae.decode/0000/out\",\"reason\":\"stream capturing a CUDA graph\"}]");
    free(s);

    hid_t d = H5Dopen2(fid, "/text_encoder/0000/out", H5P_DEFAULT);
    cr_assert_geq(d, 0);
    hid_t dt = H5Dget_type(d);
    cr_assert_gt(H5Tequal(dt, H5T_IEEE_F32LE), 0);
    H5Tclose(dt);
    hid_t dcpl = H5Dget_create_plist(d);
    cr_assert_eq(H5Pget_layout(dcpl), H5D_CONTIGUOUS);
    H5Pclose(dcpl);
    s = raw_str_attr(d, "probe.dtype");
    cr_assert_str_eq(s, "float32");
    free(s);
    s = raw_str_attr(d, "probe.component");
    cr_assert_str_eq(s, "text_encoder");
    free(s);
    s = raw_str_attr(d, "probe.slot");
    cr_assert_str_eq(s, "out");
    free(s);
    s = raw_str_attr(d, "probe.scope");
    cr_assert_str_eq(s, "");
    free(s);
    s = raw_str_attr(d, "probe.device");
    cr_assert_str_eq(s, "cpu");
    free(s);
    char h[17];
    hex16(probe_capture_hash(data, sizeof data), h);
    s = raw_str_attr(d, "probe.hash");
    cr_assert_str_eq(s, h);
    free(s);
    cr_assert_eq(raw_i64_attr(d, "probe.call", H5T_STD_I64LE), 0);
    cr_assert_eq(raw_i64_attr(d, "probe.step", H5T_STD_I64LE), 2);
    cr_assert_eq(raw_i64_attr(d, "probe.cfg_branch", H5T_STD_I32LE), 0);
    cr_assert_eq(raw_i64_attr(d, "probe.seq", H5T_STD_U64LE), 5);
    double ts = 0;
    hid_t a = H5Aopen(d, "probe.timestep", H5P_DEFAULT);
    cr_assert_geq(H5Aread(a, H5T_NATIVE_DOUBLE, &ts), 0);
    H5Aclose(a);
    cr_assert_eq(ts, 0.25);
    a = H5Aopen(d, "probe.shape", H5P_DEFAULT);
    hid_t sp = H5Aget_space(a);
    hsize_t n = 0;
    cr_assert_eq(H5Sget_simple_extent_ndims(sp), 1);
    H5Sget_simple_extent_dims(sp, &n, NULL);
    cr_assert_eq(n, 3);
    int64_t got[3];
    cr_assert_geq(H5Aread(a, H5T_NATIVE_INT64, got), 0);
    cr_assert_eq(got[0], 1);
    cr_assert_eq(got[1], 2);
    cr_assert_eq(got[2], 3);
    H5Sclose(sp);
    H5Aclose(a);
    H5Dclose(d);

    /* Unknown fields are absent; rank 0 has an empty probe.shape. */
    d = H5Dopen2(fid, "/x", H5P_DEFAULT);
    cr_assert_eq(H5Aexists(d, "probe.call"), 0);
    cr_assert_eq(H5Aexists(d, "probe.step"), 0);
    cr_assert_eq(H5Aexists(d, "probe.cfg_branch"), 0);
    cr_assert_eq(H5Aexists(d, "probe.timestep"), 0);
    cr_assert_eq(H5Aexists(d, "probe.component"), 0);
    cr_assert_eq(H5Aexists(d, "probe.scope"), 0);
    cr_assert_gt(H5Aexists(d, "probe.hash"), 0);
    sp = H5Dget_space(d);
    cr_assert_eq(H5Sget_simple_extent_type(sp), H5S_SCALAR);
    H5Sclose(sp);
    a = H5Aopen(d, "probe.shape", H5P_DEFAULT);
    sp = H5Aget_space(a);
    H5Sget_simple_extent_dims(sp, &n, NULL);
    cr_assert_eq(n, 0);
    H5Sclose(sp);
    H5Aclose(a);
    H5Dclose(d);
    H5Fclose(fid);

    /* The reader's defaults for absent fields. */
    probe_file *f = open_ok(file);
    const probe_tensor_info *t = find_ok(f, "/x", NULL);
    cr_assert_str_eq(t->component, "x"); /* first path element */
    cr_assert_str_eq(t->slot, "x");      /* last path element */
    cr_assert_str_eq(t->scope, "");
    cr_assert_eq(t->call, -1);
    cr_assert_eq(t->step, -1);
    cr_assert_eq(t->cfg_branch, -1);
    cr_assert(isnan(t->timestep));
    cr_assert_eq(t->rank, 0);
    cr_assert_eq(t->n, 1);
    cr_assert_eq(probe_file_skip_count(f), 1);
    cr_assert_str_eq(probe_file_skip(f, 0)->path, "/vae.decode/0000/out");
    cr_assert_str_eq(probe_file_skip(f, 0)->reason, "stream capturing a CUDA graph");
    cr_assert_null(probe_file_skip(f, 1));
    probe_file_close(f);
}

/* probe.parent / probe.block / probe.class (docs/file-format.md): written
 * for a nested call, read back into probe_tensor_info; absent otherwise,
 * and block is absent without a parent. */
Test(capture, nesting_and_class_attributes)
{
    const char *file = tmp("nest.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK);
    float v[2] = {1, 2};
    int64_t shape[1] = {2};
    probe_record r = rec_of("/dit.block/0005/out", PROBE_DTYPE_FLOAT32, 1, shape, 0);
    r.parent = "/dit.step/0002";
    r.block = 1;
    r.class_name = "diffusers.models.transformers.transformer_wan.WanTransformerBlock";
    r.module = "transformer.blocks.1";
    put_ok(w, &r, v, sizeof v);
    probe_record c = rec_of("/dit.step/0002/out", PROBE_DTYPE_FLOAT32, 1, shape, 1);
    c.class_name = "toy.ToyDiTDenoiser"; /* a class, not nested */
    c.block = 7;                          /* ignored without a parent */
    put_ok(w, &c, v, sizeof v);
    probe_record e = rec_of("/a/0000/out", PROBE_DTYPE_FLOAT32, 1, shape, 2);
    e.parent = "";
    e.class_name = "";
    put_ok(w, &e, v, sizeof v);
    /* a zero-initialised record: not nested, no class */
    probe_record z = {.path = "/z/0000/out", .dtype = PROBE_DTYPE_FLOAT32, .rank = 1, .shape = shape,
                      .seq = 3};
    put_ok(w, &z, v, sizeof v);
    /* a nested call needs a block index >= 0 */
    probe_record bad = rec_of("/dit.block/0006/out", PROBE_DTYPE_FLOAT32, 1, shape, 4);
    bad.parent = "/dit.step/0002";
    bad.block = -1;
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "block -1") != NULL, "%s", probe_last_error());
    bad.block = 0;
    bad.parent = "/dit.step/\xff";
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "parent is not valid UTF-8") != NULL, "%s", probe_last_error());
    bad.parent = "/dit.step/0002";
    bad.class_name = "m.\xc3";
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "class_name is not valid UTF-8") != NULL, "%s",
              probe_last_error());
    bad.class_name = NULL;
    bad.module = "transformer.\xc3";
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "module is not valid UTF-8") != NULL, "%s",
              probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());

    hid_t fid = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(fid, 0);
    hid_t d = H5Dopen2(fid, "/dit.block/0005/out", H5P_DEFAULT);
    char *s = raw_str_attr(d, "probe.parent");
    cr_assert_str_eq(s, "/dit.step/0002");
    free(s);
    cr_assert_eq(raw_i64_attr(d, "probe.block", H5T_STD_I64LE), 1);
    s = raw_str_attr(d, "probe.class");
    cr_assert_str_eq(s, "diffusers.models.transformers.transformer_wan.WanTransformerBlock");
    free(s);
    s = raw_str_attr(d, "probe.module");
    cr_assert_str_eq(s, "transformer.blocks.1");
    free(s);
    H5Dclose(d);
    d = H5Dopen2(fid, "/dit.step/0002/out", H5P_DEFAULT);
    cr_assert_eq(H5Aexists(d, "probe.parent"), 0);
    cr_assert_eq(H5Aexists(d, "probe.block"), 0);
    s = raw_str_attr(d, "probe.class");
    cr_assert_str_eq(s, "toy.ToyDiTDenoiser");
    free(s);
    H5Dclose(d);
    for (int k = 0; k < 2; k++) {
        d = H5Dopen2(fid, k ? "/z/0000/out" : "/a/0000/out", H5P_DEFAULT);
        cr_assert_eq(H5Aexists(d, "probe.parent"), 0);
        cr_assert_eq(H5Aexists(d, "probe.block"), 0);
        cr_assert_eq(H5Aexists(d, "probe.class"), 0);
        cr_assert_eq(H5Aexists(d, "probe.module"), 0);
        H5Dclose(d);
    }
    cr_assert_eq(H5Lexists(fid, "/dit.block/0006", H5P_DEFAULT), 0);
    H5Fclose(fid);

    probe_file *f = open_ok(file);
    cr_assert_eq(probe_file_count(f), 4);
    const probe_tensor_info *t = find_ok(f, "/dit.block/0005/out", NULL);
    cr_assert_str_eq(t->parent, "/dit.step/0002");
    cr_assert_eq(t->block, 1);
    cr_assert_str_eq(t->class_name, "diffusers.models.transformers.transformer_wan.WanTransformerBlock");
    cr_assert_str_eq(t->module, "transformer.blocks.1");
    t = find_ok(f, "/dit.step/0002/out", NULL);
    cr_assert_str_eq(t->module, "");
    cr_assert_str_eq(t->parent, "");
    cr_assert_eq(t->block, -1);
    cr_assert_str_eq(t->class_name, "toy.ToyDiTDenoiser");
    t = find_ok(f, "/z/0000/out", NULL);
    cr_assert_str_eq(t->parent, "");
    cr_assert_eq(t->block, -1);
    cr_assert_str_eq(t->class_name, "");
    probe_file_close(f);
}

/* Foreign files: a probe.block without probe.parent is ignored, a class
 * name longer than the field is cut, attributes of another type are absent. */
Test(capture, nesting_attributes_of_foreign_files)
{
    const char *file = tmp("nest-foreign.h5");
    hid_t fid = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(fid, 0);
    hsize_t dim = 2;
    hid_t sp = H5Screate_simple(1, &dim, NULL), sc = H5Screate(H5S_SCALAR);
    float v[2] = {3, 4};
    char longname[400];
    memset(longname, 'k', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    for (int k = 0; k < 2; k++) {
        hid_t d = H5Dcreate2(fid, k ? "/b" : "/a", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT);
        cr_assert_geq(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
        int64_t blk = 3;
        hid_t a = H5Acreate2(d, "probe.block", H5T_STD_I64LE, sc, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_INT64, &blk);
        H5Aclose(a);
        hid_t st = H5Tcopy(H5T_C_S1);
        H5Tset_size(st, H5T_VARIABLE);
        const char *cls = longname, *par = "/dit.step/0001";
        a = H5Acreate2(d, "probe.class", st, sc, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, st, &cls);
        H5Aclose(a);
        if (k) {
            a = H5Acreate2(d, "probe.parent", st, sc, H5P_DEFAULT, H5P_DEFAULT);
            H5Awrite(a, st, &par);
            H5Aclose(a);
        }
        H5Tclose(st);
        H5Dclose(d);
    }
    H5Sclose(sp);
    H5Sclose(sc);
    H5Fclose(fid);
    probe_file *f = open_ok(file);
    const probe_tensor_info *t = find_ok(f, "/a", NULL);
    cr_assert_str_eq(t->parent, "");
    cr_assert_eq(t->block, -1, "probe.block without probe.parent: %lld", (long long)t->block);
    cr_assert_eq(strlen(t->class_name), sizeof t->class_name - 1);
    t = find_ok(f, "/b", NULL);
    cr_assert_str_eq(t->parent, "/dit.step/0001");
    cr_assert_eq(t->block, 3);
    probe_file_close(f);
}

Test(capture, utf8_strings_round_trip)
{
    const char *file = tmp("utf8.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{\"label\":\"caf\xc3\xa9\"}", &w), PROBE_OK);
    float v = 2;
    probe_record r = rec_of("/d\xc3\xaft/0000/out", PROBE_DTYPE_FLOAT32, 0, NULL, 0);
    r.component = "d\xc3\xaft";
    r.scope = "\xe2\x86\x92range";
    put_ok(w, &r, &v, sizeof v);
    probe_record bad = rec_of("/bad", PROBE_DTYPE_FLOAT32, 0, NULL, 1);
    bad.component = "\xff\xfe";
    cr_assert_eq(probe_writer_put(w, &bad, &v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "UTF-8") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_skip(w, &r, "bad \xc3"), PROBE_EINVAL);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    probe_file *f = open_ok(file);
    cr_assert_eq(probe_file_count(f), 1);
    const probe_tensor_info *t = probe_file_tensor(f, 0);
    cr_assert_str_eq(t->path, "/d\xc3\xaft/0000/out");
    cr_assert_str_eq(t->component, "d\xc3\xaft");
    cr_assert_str_eq(t->scope, "\xe2\x86\x92range");
    cr_assert_str_eq(probe_file_manifest(f), "{\"label\":\"caf\xc3\xa9\"}");
    probe_file_close(f);
}

/* --- order --- */

Test(capture, execution_order_by_seq)
{
    const char *file = tmp("order.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK);
    /* written in path order, executed in another order */
    const char *paths[4] = {"/a/0000/out", "/b/0000/out", "/c/0000/out", "/d/0000/out"};
    const uint64_t seqs[4] = {30, 0, 20, 10};
    float v = 1;
    for (int i = 0; i < 4; i++) {
        probe_record r = rec_of(paths[i], PROBE_DTYPE_FLOAT32, 0, NULL, seqs[i]);
        put_ok(w, &r, &v, sizeof v);
    }
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    probe_file *f = open_ok(file);
    const char *want[4] = {"/b/0000/out", "/d/0000/out", "/c/0000/out", "/a/0000/out"};
    for (size_t i = 0; i < 4; i++)
        cr_assert_str_eq(probe_file_tensor(f, i)->path, want[i]);
    size_t idx;
    for (size_t i = 0; i < 4; i++) {
        find_ok(f, want[i], &idx);
        cr_assert_eq(idx, i);
    }
    cr_assert_eq(probe_file_find(f, "/e", &idx), PROBE_ENOTFOUND);
    cr_assert(strstr(probe_last_error(), "/e") != NULL);
    cr_assert_null(probe_file_tensor(f, 4));
    probe_file_close(f);

    /* One tensor without probe.seq: every tensor falls back to path order. */
    hid_t fid = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(H5Adelete_by_name(fid, "/c/0000/out", "probe.seq", H5P_DEFAULT), 0);
    H5Fclose(fid);
    f = open_ok(file);
    for (size_t i = 0; i < 4; i++)
        cr_assert_str_eq(probe_file_tensor(f, i)->path, paths[i]);
    cr_assert_eq(find_ok(f, "/c/0000/out", NULL)->seq, -1);
    probe_file_close(f);
}

/* --- skips and manifest --- */

Test(capture, skips_and_manifest_rewritten_at_flush_and_close)
{
    const char *file = tmp("skips.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{\"v\":1}", &w), PROBE_OK);
    probe_record s1 = rec_of("/dit.step/0000/out", PROBE_DTYPE_BFLOAT16, 0, NULL, 0);
    cr_assert_eq(probe_writer_skip(w, &s1, "stream capturing a CUDA graph"), PROBE_OK);
    cr_assert_eq(probe_writer_set_manifest(w, "{\"v\":2}"), PROBE_OK);
    cr_assert_eq(probe_writer_flush(w), PROBE_OK, "%s", probe_last_error());

    /* flushed: visible to a reader while the writer is still open */
    probe_file *f = open_ok(file);
    cr_assert_eq(probe_file_skip_count(f), 1);
    cr_assert_str_eq(probe_file_manifest(f), "{\"v\":2}");
    probe_file_close(f);

    char path[64], reason[64];
    for (int i = 1; i < 3000; i++) { /* > 64 KiB of JSON: the attribute has no size limit */
        snprintf(path, sizeof path, "/dit.step/%04d/out", i);
        snprintf(reason, sizeof reason, "reason \"%d\"\n", i);
        probe_record r = rec_of(path, PROBE_DTYPE_BFLOAT16, 0, NULL, 0);
        cr_assert_eq(probe_writer_skip(w, &r, reason), PROBE_OK);
    }
    static char big[200001];
    memset(big, 'x', sizeof big - 1);
    big[0] = '"';
    big[sizeof big - 2] = '"';
    cr_assert_eq(probe_writer_set_manifest(w, big), PROBE_OK);
    cr_assert_eq(probe_writer_set_manifest(w, "{bad json"), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "not valid JSON") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());

    f = open_ok(file);
    cr_assert_eq(probe_file_skip_count(f), 3000);
    cr_assert_str_eq(probe_file_skip(f, 0)->path, "/dit.step/0000/out");
    cr_assert_str_eq(probe_file_skip(f, 0)->reason, "stream capturing a CUDA graph");
    cr_assert_str_eq(probe_file_skip(f, 2999)->path, "/dit.step/2999/out");
    cr_assert_str_eq(probe_file_skip(f, 2999)->reason, "reason \"2999\"\n");
    cr_assert_eq(strlen(probe_file_manifest(f)), 200000);
    cr_assert_eq(probe_file_count(f), 0);
    probe_file_close(f);

    /* A NULL manifest removes the attribute. */
    cr_assert_eq(probe_writer_open(file, "{}", &w), PROBE_OK);
    cr_assert_eq(probe_writer_set_manifest(w, NULL), PROBE_OK);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    f = open_ok(file);
    cr_assert_null(probe_file_manifest(f));
    cr_assert_eq(probe_file_skip_count(f), 0);
    probe_file_close(f);
}

/* --- writer errors --- */

Test(capture, writer_errors_are_clear_and_harmless)
{
    cr_redirect_stderr();
    probe_writer *w = (probe_writer *)1;
    const char *missing = tmp("no/such/dir/x.h5");
    cr_assert_eq(probe_writer_open(missing, NULL, &w), PROBE_EIO);
    cr_assert_null(w);
    cr_assert(strstr(probe_last_error(), missing) != NULL, "%s", probe_last_error());
    cr_assert(strstr(probe_last_error(), "No such file or directory") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_open(g_dir, NULL, &w), PROBE_EIO); /* a directory */
    cr_assert(strstr(probe_last_error(), "Is a directory") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_open(NULL, NULL, &w), PROBE_EINVAL);
    cr_assert_eq(probe_writer_open(tmp("x.h5"), NULL, NULL), PROBE_EINVAL);
    cr_assert_eq(probe_writer_open(tmp("x.h5"), "{\"unterminated\": ", &w), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "manifest is not valid JSON") != NULL);

    const char *file = tmp("errors.h5");
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK);
    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t s23[2] = {2, 3}, neg[2] = {2, -3};
    int64_t s17[17];
    for (int i = 0; i < 17; i++)
        s17[i] = 1;

    probe_record r = rec_of("/a/0000/out", PROBE_DTYPE_FLOAT32, 2, s23, 0);
    cr_assert_eq(probe_writer_put(w, &r, v, 20), PROBE_EINVAL); /* nbytes mismatch */
    cr_assert(strstr(probe_last_error(), "/a/0000/out") != NULL && strstr(probe_last_error(), "24 bytes") != NULL,
              "%s", probe_last_error());
    put_ok(w, &r, v, sizeof v);
    float w2[6] = {9, 9, 9, 9, 9, 9};
    cr_assert_eq(probe_writer_put(w, &r, w2, sizeof w2), PROBE_EINVAL); /* duplicate */
    cr_assert(strstr(probe_last_error(), "already written") != NULL, "%s", probe_last_error());

    probe_record bad = rec_of("/b", PROBE_DTYPE_FLOAT32, 17, s17, 1);
    cr_assert_eq(probe_writer_put(w, &bad, v, 4), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "rank 17") != NULL, "%s", probe_last_error());
    bad = rec_of("/b", PROBE_DTYPE_FLOAT32, -1, s23, 1);
    cr_assert_eq(probe_writer_put(w, &bad, v, 4), PROBE_EINVAL);
    bad = rec_of("/b", PROBE_DTYPE_FLOAT32, 2, neg, 1);
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "negative") != NULL, "%s", probe_last_error());
    bad = rec_of("/b", PROBE_DTYPE_FLOAT32, 2, NULL, 1);
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    bad = rec_of("/b", PROBE_DTYPE_INVALID, 2, s23, 1);
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    bad = rec_of("/b", (probe_dtype)99, 2, s23, 1);
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    bad = rec_of("/b", PROBE_DTYPE_FLOAT32, 2, s23, 1);
    cr_assert_eq(probe_writer_put(w, &bad, NULL, sizeof v), PROBE_EINVAL);
    int64_t huge[3] = {INT64_MAX, INT64_MAX, 2};
    bad = rec_of("/b", PROBE_DTYPE_FLOAT32, 3, huge, 1);
    cr_assert_eq(probe_writer_put(w, &bad, v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "overflow") != NULL, "%s", probe_last_error());
    const char *bad_paths[] = {"relative", "/", "/x//y", "/x/", "/x/./y", "/x/../y", "/a/0000/out/deeper"};
    for (size_t i = 0; i < sizeof bad_paths / sizeof bad_paths[0]; i++) {
        bad = rec_of(bad_paths[i], PROBE_DTYPE_FLOAT32, 0, NULL, 1);
        cr_assert_eq(probe_writer_put(w, &bad, v, 4), PROBE_EINVAL, "path %s accepted", bad_paths[i]);
        cr_assert(strstr(probe_last_error(), bad_paths[i]) != NULL, "%s", probe_last_error());
    }
    cr_assert_eq(probe_writer_put(NULL, &r, v, sizeof v), PROBE_EINVAL);
    cr_assert_eq(probe_writer_put(w, NULL, v, sizeof v), PROBE_EINVAL);
    bad = rec_of(NULL, PROBE_DTYPE_FLOAT32, 0, NULL, 1);
    cr_assert_eq(probe_writer_put(w, &bad, v, 4), PROBE_EINVAL);
    cr_assert_eq(probe_writer_skip(w, &r, NULL), PROBE_EINVAL);
    cr_assert_eq(probe_writer_skip(NULL, &r, "x"), PROBE_EINVAL);
    cr_assert_eq(probe_writer_flush(NULL), PROBE_EINVAL);
    cr_assert_eq(probe_writer_set_manifest(NULL, "{}"), PROBE_EINVAL);

    /* The writer is still usable after every refusal. */
    probe_record ok = rec_of("/c/0000/out", PROBE_DTYPE_FLOAT32, 2, s23, 2);
    put_ok(w, &ok, w2, sizeof w2);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    cr_assert_eq(probe_writer_close(NULL), PROBE_OK);

    probe_file *f = open_ok(file);
    cr_assert_eq(probe_file_count(f), 2);
    const double want_a[6] = {1, 2, 3, 4, 5, 6}, want_c[6] = {9, 9, 9, 9, 9, 9};
    size_t i;
    find_ok(f, "/a/0000/out", &i);
    assert_values(f, i, want_a, 6); /* the duplicate did not overwrite it */
    find_ok(f, "/c/0000/out", &i);
    assert_values(f, i, want_c, 6);
    probe_file_close(f);
    fflush(stderr);
    cr_assert_stderr_eq_str("", "the library printed on stderr");
}

/* --- reader errors --- */

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp);
    if (n > 0)
        cr_assert_eq(fwrite(data, 1, n, fp), n);
    fclose(fp);
}

static void expect_open_error(const char *path, probe_status want, const char *text)
{
    probe_file *f = (probe_file *)1;
    probe_status s = probe_file_open(path, &f);
    cr_assert_eq(s, want, "%s: status %d, want %d (%s)", path, s, want, probe_last_error());
    cr_assert_null(f);
    char prefix[1100];
    snprintf(prefix, sizeof prefix, "%s: %s", path, text);
    cr_assert(strncmp(probe_last_error(), prefix, strlen(prefix)) == 0, "message '%s', want it to start with '%s'",
              probe_last_error(), prefix);
}

Test(capture, reader_errors_are_clear)
{
    cr_redirect_stderr();
    expect_open_error(tmp("missing.h5"), PROBE_ENOTFOUND, "No such file or directory");
    expect_open_error(tmp("missing-dir/x.h5"), PROBE_ENOTFOUND, "No such file or directory");
    write_file(tmp("empty.h5"), "", 0);
    expect_open_error(tmp("empty.h5"), PROBE_EFORMAT, "not an HDF5 file");
    const char *text = "this is a text file, not HDF5\n";
    write_file(tmp("text.h5"), text, strlen(text));
    expect_open_error(tmp("text.h5"), PROBE_EFORMAT, "not an HDF5 file");
    expect_open_error(g_dir, PROBE_EFORMAT, "not an HDF5 file");

    /* a real capture file cut to half its size */
    const char *file = tmp("cut.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{}", &w), PROBE_OK);
    static float v[4096];
    int64_t shape[1] = {4096};
    for (int i = 0; i < 3; i++) {
        char p[32];
        snprintf(p, sizeof p, "/t/%04d/out", i);
        probe_record r = rec_of(p, PROBE_DTYPE_FLOAT32, 1, shape, (uint64_t)i);
        put_ok(w, &r, v, sizeof v);
    }
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    struct stat st;
    cr_assert_eq(stat(file, &st), 0);
    cr_assert_eq(truncate(file, st.st_size / 2), 0);
    expect_open_error(file, PROBE_EFORMAT, "truncated or corrupt HDF5 file (");

    probe_file *f = (probe_file *)1;
    cr_assert_eq(probe_file_open(NULL, &f), PROBE_EINVAL);
    cr_assert_eq(probe_file_open(file, NULL), PROBE_EINVAL);
    probe_file_close(NULL);
    cr_assert_eq(probe_file_count(NULL), 0);
    cr_assert_null(probe_file_tensor(NULL, 0));
    cr_assert_null(probe_file_manifest(NULL));
    fflush(stderr);
    cr_assert_stderr_eq_str("", "the library printed on stderr");
}

Test(capture, reader_refuses_fifo_and_a_file_being_written)
{
    const char *fifo = tmp("fifo.h5");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    expect_open_error(fifo, PROBE_EFORMAT, "not an HDF5 file"); /* and no hang */

    /* Another process holds the writer's lock (HDF5 file locking). */
    const char *file = tmp("busy.h5");
    int up[2], down[2];
    cr_assert_eq(pipe(up), 0);
    cr_assert_eq(pipe(down), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        probe_writer *w;
        char c = probe_writer_open(file, NULL, &w) == PROBE_OK ? 'y' : 'n';
        if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(3);
        _exit(probe_writer_close(w) == PROBE_OK ? 0 : 4);
    }
    char c = 0;
    cr_assert_eq(read(up[0], &c, 1), 1);
    cr_assert_eq(c, 'y');
    probe_file *f = (probe_file *)1;
    probe_status s = probe_file_open(file, &f);
    cr_assert_eq(write(down[1], "x", 1), 1);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    const char *locking = getenv("HDF5_USE_FILE_LOCKING"); /* FALSE turns HDF5's locks off */
    if (locking == NULL || (strcmp(locking, "FALSE") != 0 && strcmp(locking, "0") != 0)) {
        cr_assert_eq(s, PROBE_EIO, "status %d: %s", s, probe_last_error());
        cr_assert(strstr(probe_last_error(), "another process") != NULL, "%s", probe_last_error());
    } else if (s == PROBE_OK) {
        probe_file_close(f);
    }
    f = open_ok(file); /* closed now */
    probe_file_close(f);
}

Test(capture, reader_argument_errors)
{
    const char *file = tmp("args.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK);
    int64_t shape[1] = {3}, zero[1] = {0};
    float v[3] = {1, 2, 3};
    probe_record r = rec_of("/t", PROBE_DTYPE_FLOAT32, 1, shape, 0);
    put_ok(w, &r, v, sizeof v);
    r = rec_of("/z", PROBE_DTYPE_FLOAT32, 1, zero, 1);
    put_ok(w, &r, NULL, 0);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    probe_file *f = open_ok(file);
    double d[3];
    float raw[3];
    cr_assert_eq(probe_file_read_f64(f, 2, d), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "out of range") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_file_read_f64(NULL, 0, d), PROBE_EINVAL);
    cr_assert_eq(probe_file_read_f64(f, 0, NULL), PROBE_EINVAL);
    cr_assert_eq(probe_file_read_raw(f, 0, raw, 8), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "/t") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_file_read_raw(f, 0, raw, sizeof raw), PROBE_OK);
    cr_assert_eq(raw[2], 3.0f);
    size_t i;
    find_ok(f, "/z", &i);
    cr_assert_eq(probe_file_tensor(f, i)->n, 0);
    cr_assert_eq(probe_file_tensor(f, i)->rank, 1);
    cr_assert_eq(probe_file_tensor(f, i)->shape[0], 0);
    cr_assert_eq(probe_file_read_f64(f, i, NULL), PROBE_OK); /* n = 0: nothing to read */
    cr_assert_eq(probe_file_read_raw(f, i, NULL, 0), PROBE_OK);
    cr_assert_eq(probe_file_find(f, NULL, &i), PROBE_EINVAL);
    cr_assert_eq(probe_file_find(f, "/t", NULL), PROBE_EINVAL);
    probe_file_close(f);
}

static void set_root_attr_str(const char *file, const char *name, const char *value)
{
    hid_t fid = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(fid, 0);
    H5Adelete(fid, name);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(fid, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(H5Awrite(a, t, &value), 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(fid);
}

Test(capture, reader_rejects_newer_version_and_bad_skips)
{
    const char *file = tmp("v.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    set_root_attr_str(file, "probe.skips", "{");
    expect_open_error(file, PROBE_EFORMAT, "root attribute probe.skips");
    set_root_attr_str(file, "probe.skips", "[{\"path\": 1}]");
    expect_open_error(file, PROBE_EFORMAT, "root attribute probe.skips");
    set_root_attr_str(file, "probe.skips", "[]");
    probe_file *f = open_ok(file);
    probe_file_close(f);

    hid_t fid = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(fid, "probe.version", H5P_DEFAULT);
    int64_t two = 2;
    cr_assert_geq(H5Awrite(a, H5T_NATIVE_INT64, &two), 0);
    H5Aclose(a);
    H5Fclose(fid);
    expect_open_error(file, PROBE_EUNSUPPORTED, "capture format version 2 is newer");
}

/* --- foreign HDF5 files (as h5py or other tools write them) --- */

static void raw_dataset(hid_t fid, const char *path, hid_t ftype, hid_t mtype, int rank, const hsize_t *dims,
                        const void *data)
{
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t sp = rank < 0 ? H5Screate(H5S_NULL) : rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, NULL);
    hid_t d = H5Dcreate2(fid, path, ftype, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(d, 0, "create %s", path);
    if (data != NULL)
        cr_assert_geq(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0, "write %s", path);
    H5Dclose(d);
    H5Sclose(sp);
    H5Pclose(lcpl);
}

static hid_t float2_type(hid_t base, size_t epos, size_t esize, size_t msize, size_t bias)
{
    hid_t t = H5Tcopy(base);
    cr_assert_geq(H5Tset_fields(t, 15, epos, esize, 0, msize), 0);
    cr_assert_geq(H5Tset_precision(t, 16), 0);
    cr_assert_geq(H5Tset_size(t, 2), 0);
    cr_assert_geq(H5Tset_ebias(t, bias), 0);
    return t;
}

Test(capture, foreign_files_types_links_and_ignored_datasets)
{
    cr_redirect_stderr();
    const char *file = tmp("foreign.h5");
    hid_t fid = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(fid, 0);
    hsize_t d4[1] = {4}, d3[1] = {3}, d2[1] = {2};

    float f32[4] = {1.5f, -2.25f, 1e-40f, INFINITY};
    raw_dataset(fid, "/be/f32", H5T_IEEE_F32BE, H5T_NATIVE_FLOAT, 1, d4, f32);
    double f64[4] = {0.1, -3e300, 5e-324, -0.0};
    raw_dataset(fid, "/be/f64", H5T_IEEE_F64BE, H5T_NATIVE_DOUBLE, 1, d4, f64);
    int16_t i16[4] = {-32768, -2, 7, 32767};
    raw_dataset(fid, "/be/i16", H5T_STD_I16BE, H5T_NATIVE_INT16, 1, d4, i16);
    uint32_t u32[4] = {0, 1, 4000000000u, UINT32_MAX};
    raw_dataset(fid, "/be/u32", H5T_STD_U32BE, H5T_NATIVE_UINT32, 1, d4, u32);
    int64_t i64[4] = {INT64_MIN, -5, (1ll << 53) + 2, INT64_MAX};
    raw_dataset(fid, "/be/i64", H5T_STD_I64BE, H5T_NATIVE_INT64, 1, d4, i64);
    /* 2-byte floats in big-endian byte order, bytes given as stored */
    hid_t f16be = float2_type(H5T_IEEE_F32BE, 10, 5, 10, 15);
    const uint8_t f16bytes[4] = {0x3c, 0x00, 0xc1, 0x00}; /* 1.0, -2.5 */
    raw_dataset(fid, "/be/f16", f16be, f16be, 1, d2, f16bytes);
    hid_t bf16be = float2_type(H5T_IEEE_F32BE, 7, 8, 7, 127);
    const uint8_t bf16bytes[4] = {0x40, 0x49, 0xff, 0x80}; /* 3.140625, -inf */
    raw_dataset(fid, "/be/bf16", bf16be, bf16be, 1, d2, bf16bytes);
    /* little-endian bf16 without a probe.dtype attribute: known by its fields */
    hid_t bf16le = float2_type(H5T_IEEE_F32LE, 7, 8, 7, 127);
    const uint16_t bf16v[2] = {0x3f80, 0x0001}; /* 1.0, 2^-133 */
    raw_dataset(fid, "/le/bf16", bf16le, bf16le, 1, d2, bf16v);

    /* h5py's bool: enum over int8 with FALSE = 0, TRUE = 1 */
    hid_t hb = H5Tenum_create(H5T_NATIVE_INT8);
    int8_t e0 = 0, e1 = 1, e2 = 2;
    H5Tenum_insert(hb, "FALSE", &e0);
    H5Tenum_insert(hb, "TRUE", &e1);
    const int8_t bools[3] = {1, 0, 1};
    raw_dataset(fid, "/h5py/bool", hb, hb, 1, d3, bools);

    /* chunked + deflate */
    hsize_t n1000[1] = {1000}, chunk[1] = {128};
    static float gz[1000];
    for (int i = 0; i < 1000; i++)
        gz[i] = i * 0.5f;
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    H5Pset_deflate(dcpl, 6);
    hid_t sp = H5Screate_simple(1, n1000, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t d = H5Dcreate2(fid, "/chunked/gz", H5T_IEEE_F32LE, sp, lcpl, dcpl, H5P_DEFAULT);
    cr_assert_geq(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, gz), 0);
    /* fp8 named by a fixed-length string probe.dtype attribute */
    H5Dclose(d);
    const uint8_t fp8[3] = {0x3c, 0x7c, 0x01};
    raw_dataset(fid, "/fp8/raw", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, d3, fp8);
    d = H5Dopen2(fid, "/fp8/raw", H5P_DEFAULT);
    hid_t fs = H5Tcopy(H5T_C_S1);
    H5Tset_size(fs, 11);
    hid_t scalar = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, "probe.dtype", fs, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, fs, "float8_e5m2");
    H5Aclose(a);
    H5Dclose(d);
    /* storage wins over a probe.dtype that does not match it */
    float mm[2] = {0.5f, 2.0f};
    raw_dataset(fid, "/mismatch/f32", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, d2, mm);
    d = H5Dopen2(fid, "/mismatch/f32", H5P_DEFAULT);
    H5Tset_size(fs, 8);
    a = H5Acreate2(d, "probe.dtype", fs, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, fs, "bfloat16");
    H5Aclose(a);
    H5Dclose(d);
    const uint8_t u8[2] = {200, 3};
    raw_dataset(fid, "/u8plain", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, d2, u8);

    /* not tensors */
    hid_t color = H5Tenum_create(H5T_NATIVE_INT8);
    H5Tenum_insert(color, "RED", &e0);
    H5Tenum_insert(color, "GREEN", &e1);
    raw_dataset(fid, "/ignored/color", color, color, 1, d3, bools);
    hid_t tri = H5Tenum_create(H5T_NATIVE_INT8);
    H5Tenum_insert(tri, "FALSE", &e0);
    H5Tenum_insert(tri, "TRUE", &e1);
    H5Tenum_insert(tri, "MAYBE", &e2);
    raw_dataset(fid, "/ignored/bool3", tri, tri, 1, d3, bools);
    H5Tset_size(fs, 4);
    raw_dataset(fid, "/ignored/str", fs, fs, 1, d2, "abcdefgh");
    hid_t cmp = H5Tcreate(H5T_COMPOUND, 16);
    H5Tinsert(cmp, "a", 0, H5T_NATIVE_INT32);
    H5Tinsert(cmp, "b", 8, H5T_NATIVE_DOUBLE);
    raw_dataset(fid, "/ignored/compound", cmp, cmp, 1, d2, NULL);
    hid_t vl = H5Tvlen_create(H5T_NATIVE_INT32);
    raw_dataset(fid, "/ignored/vlen", vl, vl, 1, d2, NULL);
    hsize_t three[1] = {3};
    hid_t arr = H5Tarray_create2(H5T_NATIVE_INT32, 1, three);
    raw_dataset(fid, "/ignored/array", arr, arr, 1, d2, NULL);
    hid_t opq = H5Tcreate(H5T_OPAQUE, 4);
    H5Tset_tag(opq, "blob");
    raw_dataset(fid, "/ignored/opaque", opq, opq, 1, d2, NULL);
    hsize_t d17[17];
    for (int i = 0; i < 17; i++)
        d17[i] = 1;
    raw_dataset(fid, "/ignored/rank17", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 17, d17, f32);
    raw_dataset(fid, "/ignored/null", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, -1, NULL, NULL);
    raw_dataset(fid, "/ignored/ldouble", H5T_NATIVE_LDOUBLE, H5T_NATIVE_LDOUBLE, 1, d2, NULL);
    hid_t i12 = H5Tcopy(H5T_STD_I16LE);
    H5Tset_precision(i12, 12);
    raw_dataset(fid, "/ignored/i12", i12, i12, 1, d2, NULL);
    raw_dataset(fid, "/ignored/bitfield", H5T_STD_B8LE, H5T_STD_B8LE, 1, d2, NULL);
    /* element counts past 2^64, and byte sizes past size_t (chunked, so
     * HDF5 allocates nothing) */
    hsize_t hdims[3] = {1ull << 32, 1ull << 32, 4}, hchunk[3] = {1, 1, 4}, hdims1[1] = {1ull << 62},
            hchunk1[1] = {1024};
    hid_t hcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(hcpl, 3, hchunk);
    hid_t hsp = H5Screate_simple(3, hdims, NULL);
    hid_t hd = H5Dcreate2(fid, "/ignored/count_overflow", H5T_IEEE_F32LE, hsp, H5P_DEFAULT, hcpl, H5P_DEFAULT);
    cr_assert_geq(hd, 0);
    H5Dclose(hd);
    H5Sclose(hsp);
    H5Pset_chunk(hcpl, 1, hchunk1);
    hsp = H5Screate_simple(1, hdims1, NULL);
    hd = H5Dcreate2(fid, "/ignored/bytes_overflow", H5T_IEEE_F32LE, hsp, H5P_DEFAULT, hcpl, H5P_DEFAULT);
    cr_assert_geq(hd, 0);
    H5Dclose(hd);
    H5Sclose(hsp);
    H5Pclose(hcpl);
    raw_dataset(fid, "/ignored/ref", H5T_STD_REF_OBJ, H5T_STD_REF_OBJ, 1, d2, NULL);

    /* links: a hard alias is a tensor under its own path; soft and external
     * links are not followed (their targets are indexed by their hard links,
     * or are in another file) */
    cr_assert_geq(H5Lcreate_hard(fid, "/be/f32", fid, "/alias", H5P_DEFAULT, H5P_DEFAULT), 0);
    cr_assert_geq(H5Lcreate_soft("/chunked/gz", fid, "/soft", H5P_DEFAULT, H5P_DEFAULT), 0);
    cr_assert_geq(H5Lcreate_soft("/nowhere", fid, "/dangling", H5P_DEFAULT, H5P_DEFAULT), 0);
    cr_assert_geq(H5Lcreate_external("other.h5", "/x", fid, "/ext", H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Tclose(f16be);
    H5Tclose(bf16be);
    H5Tclose(bf16le);
    H5Tclose(hb);
    H5Tclose(color);
    H5Tclose(tri);
    H5Tclose(fs);
    H5Tclose(cmp);
    H5Tclose(vl);
    H5Tclose(arr);
    H5Tclose(opq);
    H5Tclose(i12);
    H5Sclose(sp);
    H5Sclose(scalar);
    H5Pclose(dcpl);
    H5Pclose(lcpl);
    cr_assert_geq(H5Fclose(fid), 0);

    probe_file *f = open_ok(file);
    const char *want_paths[] = {"/alias",   "/be/bf16",  "/be/f16",       "/be/f32", "/be/f64",
                                "/be/i16",  "/be/i64",   "/be/u32",       "/chunked/gz", "/fp8/raw",
                                "/h5py/bool", "/le/bf16", "/mismatch/f32", "/u8plain"};
    size_t nwant = sizeof want_paths / sizeof want_paths[0];
    cr_assert_eq(probe_file_count(f), nwant, "count %zu", probe_file_count(f));
    for (size_t i = 0; i < nwant; i++) /* no probe.seq: path order */
        cr_assert_str_eq(probe_file_tensor(f, i)->path, want_paths[i]);
    cr_assert_eq(probe_file_ignored_count(f), 15, "ignored %zu", probe_file_ignored_count(f));
    cr_assert_null(probe_file_manifest(f));
    cr_assert_eq(probe_file_skip_count(f), 0);

    struct {
        const char *path;
        probe_dtype dtype;
        size_t n;
        double want[4];
    } exp[] = {
        {"/alias", PROBE_DTYPE_FLOAT32, 4, {1.5, -2.25, (double)1e-40f, INFINITY}},
        {"/be/f32", PROBE_DTYPE_FLOAT32, 4, {1.5, -2.25, (double)1e-40f, INFINITY}},
        {"/be/f64", PROBE_DTYPE_FLOAT64, 4, {0.1, -3e300, 5e-324, -0.0}},
        {"/be/i16", PROBE_DTYPE_INT16, 4, {-32768, -2, 7, 32767}},
        {"/be/u32", PROBE_DTYPE_UINT32, 4, {0, 1, 4000000000.0, 4294967295.0}},
        {"/be/i64", PROBE_DTYPE_INT64, 4, {-9223372036854775808.0, -5, 9007199254740994.0, 9223372036854775808.0}},
        {"/be/f16", PROBE_DTYPE_FLOAT16, 2, {1.0, -2.5}},
        {"/be/bf16", PROBE_DTYPE_BFLOAT16, 2, {3.140625, -INFINITY}},
        {"/le/bf16", PROBE_DTYPE_BFLOAT16, 2, {1.0, 9.1835496157991212e-41}},
        {"/h5py/bool", PROBE_DTYPE_BOOL, 3, {1, 0, 1}},
        {"/fp8/raw", PROBE_DTYPE_FLOAT8_E5M2, 3, {1.0, INFINITY, 1.52587890625e-05}},
        {"/mismatch/f32", PROBE_DTYPE_FLOAT32, 2, {0.5, 2.0}},
        {"/u8plain", PROBE_DTYPE_UINT8, 2, {200, 3}},
    };
    for (size_t k = 0; k < sizeof exp / sizeof exp[0]; k++) {
        size_t i;
        const probe_tensor_info *t = find_ok(f, exp[k].path, &i);
        cr_assert_eq(t->dtype, exp[k].dtype, "%s: dtype %s", exp[k].path, probe_dtype_name(t->dtype));
        cr_assert_eq(t->seq, -1);
        cr_assert_str_eq(t->hash, "");
        assert_values(f, i, exp[k].want, exp[k].n);
    }
    /* read_raw gives little-endian bytes of the logical type */
    size_t i;
    find_ok(f, "/be/bf16", &i);
    uint16_t bf[2];
    cr_assert_eq(probe_file_read_raw(f, i, bf, sizeof bf), PROBE_OK);
    cr_assert_eq(bf[0], 0x4049);
    cr_assert_eq(bf[1], 0xff80);
    find_ok(f, "/be/i16", &i);
    int16_t s16[4];
    cr_assert_eq(probe_file_read_raw(f, i, s16, sizeof s16), PROBE_OK);
    cr_assert_eq(s16[0], -32768);
    cr_assert_eq(s16[3], 32767);
    find_ok(f, "/chunked/gz", &i);
    static double gzw[1000];
    for (int k = 0; k < 1000; k++)
        gzw[k] = k * 0.5;
    assert_values(f, i, gzw, 1000);
    cr_assert_eq(probe_file_find(f, "/soft", &i), PROBE_ENOTFOUND);
    cr_assert_eq(probe_file_find(f, "/ext", &i), PROBE_ENOTFOUND);
    probe_file_close(f);
    fflush(stderr);
    cr_assert_stderr_eq_str("", "the library printed on stderr");
}

/* --- fault injection: the file size limit stands in for a full disk --- */

Test(capture, full_disk_fails_cleanly_and_keeps_earlier_tensors)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &rl), 0);
    rl.rlim_cur = 4u << 20; /* 4 MiB; the hard limit stays as it was */
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < rl.rlim_cur)
        rl.rlim_cur = rl.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);

    const char *file = tmp("full.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{}", &w), PROBE_OK, "%s", probe_last_error());
    static float v[25000]; /* 100 kB per tensor */
    int64_t shape[1] = {25000};
    int written = 0;
    probe_status s = PROBE_OK;
    for (int i = 0; i < 100 && s == PROBE_OK; i++) {
        for (int k = 0; k < 25000; k++)
            v[k] = (float)(i * 25000 + k);
        char p[32];
        snprintf(p, sizeof p, "/t/%04d/out", i);
        probe_record r = rec_of(p, PROBE_DTYPE_FLOAT32, 1, shape, (uint64_t)i);
        s = probe_writer_put(w, &r, v, sizeof v);
        if (s == PROBE_OK)
            written++;
    }
    cr_assert_eq(s, PROBE_EIO, "the limit was never hit");
    cr_assert(strstr(probe_last_error(), file) != NULL, "%s", probe_last_error());
    cr_assert(strstr(probe_last_error(), "File too large") != NULL, "%s", probe_last_error());
    cr_assert_gt(written, 10);
    cr_assert_lt(written, 40); /* 4 MiB / 100 kB */
    /* refused again, nothing half-written; skips and close still work */
    probe_record r = rec_of("/t/9999/out", PROBE_DTYPE_FLOAT32, 1, shape, 9999);
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_EIO);
    cr_assert_eq(probe_writer_skip(w, &r, "disk full"), PROBE_OK);
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());

    probe_file *f = open_ok(file);
    cr_assert_eq(probe_file_count(f), (size_t)written);
    cr_assert_eq(probe_file_skip_count(f), 1);
    static double got[25000];
    for (int i = 0; i < written; i++) {
        cr_assert_eq(probe_file_read_f64(f, (size_t)i, got), PROBE_OK, "%s", probe_last_error());
        for (int k = 0; k < 25000; k += 997)
            cr_assert_eq(got[k], (double)(i * 25000 + k));
    }
    probe_file_close(f);
}

Test(capture, open_without_room_is_refused_and_leaves_no_file)
{
    cr_redirect_stderr();
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &rl), 0);
    rl.rlim_cur = 256u << 10; /* less than the 1 MiB the writer keeps free */
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    const char *file = tmp("small.h5");
    probe_writer *w = (probe_writer *)1;
    cr_assert_eq(probe_writer_open(file, "{}", &w), PROBE_EIO);
    cr_assert_null(w);
    cr_assert(strstr(probe_last_error(), file) != NULL && strstr(probe_last_error(), "RLIMIT_FSIZE") != NULL,
              "%s", probe_last_error());
    struct stat st;
    cr_assert_neq(stat(file, &st), 0, "a refused open left a file");
    fflush(stderr);
    cr_assert_stderr_eq_str("", "something printed on stderr");
}
