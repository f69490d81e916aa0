/* test_dtype.c - element types (probe/dtype.h) and the status/last-error
 * helpers (probe/status.h) they report through.
 *
 * Expected values are hand-derived from the bit layouts (IEEE 754 binary16,
 * bfloat16 = top half of binary32, OCP FP8 v1.0 E4M3FN / E5M2); the
 * exhaustive tests decode every bit pattern with an independent oracle
 * written with ldexp() on the integer significand, unlike the library, which
 * assembles the double's bit fields.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "probe/dtype.h"
#include "probe/status.h"

/* Same value, same sign of zero, or both NaN. */
static int same_double(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

static double conv1(probe_dtype t, const void *bytes)
{
    double d = -12345.0;
    cr_assert_eq(probe_dtype_to_f64(t, bytes, &d, 1), PROBE_OK, "%s", probe_last_error());
    return d;
}

static double f16(uint16_t b)
{
    unsigned char p[2] = {b & 0xFF, b >> 8};
    return conv1(PROBE_DTYPE_FLOAT16, p);
}
static double bf16(uint16_t b)
{
    unsigned char p[2] = {b & 0xFF, b >> 8};
    return conv1(PROBE_DTYPE_BFLOAT16, p);
}
static double e4m3(uint8_t b) { return conv1(PROBE_DTYPE_FLOAT8_E4M3FN, &b); }
static double e5m2(uint8_t b) { return conv1(PROBE_DTYPE_FLOAT8_E5M2, &b); }

/* ---- names and sizes ---- */

Test(dtype, sizes)
{
    const struct { probe_dtype t; size_t size; int is_float; } want[] = {
        {PROBE_DTYPE_BOOL, 1, 0},    {PROBE_DTYPE_INT8, 1, 0},     {PROBE_DTYPE_INT16, 2, 0},
        {PROBE_DTYPE_INT32, 4, 0},   {PROBE_DTYPE_INT64, 8, 0},    {PROBE_DTYPE_UINT8, 1, 0},
        {PROBE_DTYPE_UINT16, 2, 0},  {PROBE_DTYPE_UINT32, 4, 0},   {PROBE_DTYPE_UINT64, 8, 0},
        {PROBE_DTYPE_FLOAT16, 2, 1}, {PROBE_DTYPE_BFLOAT16, 2, 1}, {PROBE_DTYPE_FLOAT32, 4, 1},
        {PROBE_DTYPE_FLOAT64, 8, 1}, {PROBE_DTYPE_FLOAT8_E4M3FN, 1, 1},
        {PROBE_DTYPE_FLOAT8_E5M2, 1, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_assert_eq(probe_dtype_size(want[i].t), want[i].size, "size of %d", want[i].t);
        cr_assert_eq(probe_dtype_is_float(want[i].t), want[i].is_float, "is_float of %d", want[i].t);
    }
    cr_assert_eq(probe_dtype_size(PROBE_DTYPE_INVALID), 0);
    cr_assert_eq(probe_dtype_size(PROBE_DTYPE_COUNT_), 0);
    cr_assert_eq(probe_dtype_size((probe_dtype)-1), 0);
    cr_assert_eq(probe_dtype_is_float((probe_dtype)999), 0);
}

Test(dtype, names_round_trip)
{
    const char *names[] = {NULL, "bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                           "uint32", "uint64", "float16", "bfloat16", "float32", "float64",
                           "float8_e4m3fn", "float8_e5m2"};
    for (int t = 1; t < PROBE_DTYPE_COUNT_; t++) {
        cr_assert_str_eq(probe_dtype_name((probe_dtype)t), names[t]);
        cr_assert_eq(probe_dtype_from_name(names[t]), t, "%s", names[t]);
        char torch[64];
        snprintf(torch, sizeof torch, "torch.%s", names[t]);
        cr_assert_eq(probe_dtype_from_name(torch), t, "%s", torch);
    }
    cr_assert_str_eq(probe_dtype_name(PROBE_DTYPE_INVALID), "invalid");
    cr_assert_str_eq(probe_dtype_name((probe_dtype)77), "invalid");
}

Test(dtype, aliases_and_unknown_names)
{
    cr_assert_eq(probe_dtype_from_name("bf16"), PROBE_DTYPE_BFLOAT16);
    cr_assert_eq(probe_dtype_from_name("fp16"), PROBE_DTYPE_FLOAT16);
    cr_assert_eq(probe_dtype_from_name("torch.half"), PROBE_DTYPE_FLOAT16);
    cr_assert_eq(probe_dtype_from_name("fp32"), PROBE_DTYPE_FLOAT32);
    cr_assert_eq(probe_dtype_from_name("torch.float"), PROBE_DTYPE_FLOAT32);
    cr_assert_eq(probe_dtype_from_name("torch.double"), PROBE_DTYPE_FLOAT64);
    cr_assert_eq(probe_dtype_from_name("torch.long"), PROBE_DTYPE_INT64);
    cr_assert_eq(probe_dtype_from_name("torch.int"), PROBE_DTYPE_INT32);
    cr_assert_eq(probe_dtype_from_name(NULL), PROBE_DTYPE_INVALID);
    cr_assert_eq(probe_dtype_from_name(""), PROBE_DTYPE_INVALID);
    cr_assert_eq(probe_dtype_from_name("torch."), PROBE_DTYPE_INVALID);
    cr_assert_eq(probe_dtype_from_name("invalid"), PROBE_DTYPE_INVALID);
    cr_assert_eq(probe_dtype_from_name("float8_e4m3fnuz"), PROBE_DTYPE_INVALID);
    cr_assert_eq(probe_dtype_from_name("Float32"), PROBE_DTYPE_INVALID);
    cr_assert_eq(probe_dtype_from_name("numpy.float32"), PROBE_DTYPE_INVALID);
}

/* ---- hand-derived bit patterns ---- */

Test(dtype, float16_patterns)
{
    cr_assert(same_double(f16(0x3C00), 1.0));
    cr_assert(same_double(f16(0xBC00), -1.0));
    cr_assert(same_double(f16(0x4000), 2.0));
    cr_assert(same_double(f16(0x3555), 0x1.554p-2)); /* 0.333251953125 */
    cr_assert(same_double(f16(0x7BFF), 65504.0));    /* largest normal */
    cr_assert(same_double(f16(0x0400), 0x1p-14));    /* smallest normal */
    cr_assert(same_double(f16(0x0001), 0x1p-24));    /* smallest subnormal */
    cr_assert(same_double(f16(0x03FF), 1023 * 0x1p-24)); /* largest subnormal */
    cr_assert(same_double(f16(0x8001), -0x1p-24));
    cr_assert(same_double(f16(0x0000), 0.0));
    cr_assert(same_double(f16(0x8000), -0.0));
    cr_assert(same_double(f16(0x7C00), INFINITY));
    cr_assert(same_double(f16(0xFC00), -INFINITY));
    cr_assert(isnan(f16(0x7E00)));
    cr_assert(isnan(f16(0x7C01))); /* signalling pattern */
    cr_assert(isnan(f16(0xFE00)));
}

Test(dtype, bfloat16_patterns)
{
    cr_assert(same_double(bf16(0x3F80), 1.0));
    cr_assert(same_double(bf16(0xBF80), -1.0));
    cr_assert(same_double(bf16(0x4049), 3.140625)); /* pi in bf16 */
    cr_assert(same_double(bf16(0x7F7F), 0x1.FEp127)); /* largest finite */
    cr_assert(same_double(bf16(0x0080), 0x1p-126));   /* smallest normal */
    cr_assert(same_double(bf16(0x0001), 0x1p-133));   /* smallest subnormal */
    cr_assert(same_double(bf16(0x8000), -0.0));
    cr_assert(same_double(bf16(0x7F80), INFINITY));
    cr_assert(same_double(bf16(0xFF80), -INFINITY));
    cr_assert(isnan(bf16(0x7FC0)));
    cr_assert(isnan(bf16(0x7F81)));
}

Test(dtype, float8_e4m3fn_patterns)
{
    cr_assert(same_double(e4m3(0x38), 1.0));      /* 0 0111 000 */
    cr_assert(same_double(e4m3(0xB8), -1.0));
    cr_assert(same_double(e4m3(0x7E), 448.0));    /* 0 1111 110: max */
    cr_assert(same_double(e4m3(0xFE), -448.0));
    cr_assert(same_double(e4m3(0x78), 256.0));    /* 0 1111 000: exponent 15 is finite */
    cr_assert(same_double(e4m3(0x08), 0x1p-6));   /* smallest normal */
    cr_assert(same_double(e4m3(0x01), 0x1p-9));   /* smallest subnormal */
    cr_assert(same_double(e4m3(0x07), 7 * 0x1p-9));
    cr_assert(same_double(e4m3(0x00), 0.0));
    cr_assert(same_double(e4m3(0x80), -0.0));
    cr_assert(isnan(e4m3(0x7F)));                  /* S.1111.111 */
    cr_assert(isnan(e4m3(0xFF)));
}

Test(dtype, float8_e5m2_patterns)
{
    cr_assert(same_double(e5m2(0x3C), 1.0));      /* 0 01111 00 */
    cr_assert(same_double(e5m2(0xBC), -1.0));
    cr_assert(same_double(e5m2(0x7B), 57344.0));  /* 0 11110 11: max */
    cr_assert(same_double(e5m2(0x04), 0x1p-14));  /* smallest normal */
    cr_assert(same_double(e5m2(0x01), 0x1p-16));  /* smallest subnormal */
    cr_assert(same_double(e5m2(0x03), 3 * 0x1p-16));
    cr_assert(same_double(e5m2(0x80), -0.0));
    cr_assert(same_double(e5m2(0x7C), INFINITY));
    cr_assert(same_double(e5m2(0xFC), -INFINITY));
    cr_assert(isnan(e5m2(0x7D)));
    cr_assert(isnan(e5m2(0x7E)));
    cr_assert(isnan(e5m2(0x7F)));
    cr_assert(isnan(e5m2(0xFF)));
}

Test(dtype, float32_float64_patterns)
{
    const unsigned char one32[4] = {0x00, 0x00, 0x80, 0x3F};
    const unsigned char tiny32[4] = {0x01, 0x00, 0x00, 0x00};
    const unsigned char ninf32[4] = {0x00, 0x00, 0x80, 0xFF};
    const unsigned char nan32[4] = {0x00, 0x00, 0xC0, 0x7F};
    cr_assert(same_double(conv1(PROBE_DTYPE_FLOAT32, one32), 1.0));
    cr_assert(same_double(conv1(PROBE_DTYPE_FLOAT32, tiny32), 0x1p-149));
    cr_assert(same_double(conv1(PROBE_DTYPE_FLOAT32, ninf32), -INFINITY));
    cr_assert(isnan(conv1(PROBE_DTYPE_FLOAT32, nan32)));
    /* 0.1 as float64: 0x3FB999999999999A, little-endian */
    const unsigned char tenth64[8] = {0x9A, 0x99, 0x99, 0x99, 0x99, 0x99, 0xB9, 0x3F};
    const unsigned char tiny64[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    cr_assert(same_double(conv1(PROBE_DTYPE_FLOAT64, tenth64), 0.1));
    cr_assert(same_double(conv1(PROBE_DTYPE_FLOAT64, tiny64), 0x1p-1074));
}

Test(dtype, integers_and_bool)
{
    const uint8_t b[4] = {0, 1, 2, 255};
    double d[4];
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_BOOL, b, d, 4), PROBE_OK);
    cr_assert(d[0] == 0.0 && d[1] == 1.0 && d[2] == 1.0 && d[3] == 1.0);
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_INT8, b, d, 4), PROBE_OK);
    cr_assert(d[0] == 0.0 && d[1] == 1.0 && d[2] == 2.0 && d[3] == -1.0);
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_UINT8, b, d, 4), PROBE_OK);
    cr_assert(d[3] == 255.0);

    const unsigned char i16[4] = {0x00, 0x80, 0xFF, 0x7F}; /* -32768, 32767 */
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_INT16, i16, d, 2), PROBE_OK);
    cr_assert(d[0] == -32768.0 && d[1] == 32767.0);
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_UINT16, i16, d, 2), PROBE_OK);
    cr_assert(d[0] == 32768.0 && d[1] == 32767.0);

    const unsigned char i32[8] = {0x00, 0x00, 0x00, 0x80, 0xFF, 0xFF, 0xFF, 0xFF};
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_INT32, i32, d, 2), PROBE_OK);
    cr_assert(d[0] == -2147483648.0 && d[1] == -1.0);
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_UINT32, i32, d, 2), PROBE_OK);
    cr_assert(d[0] == 2147483648.0 && d[1] == 4294967295.0);

    /* int64: -2^63 exact; 2^53 + 1 rounds to nearest (even) 2^53; 2^53 + 3 -> 2^53 + 4 */
    const unsigned char i64[24] = {0, 0, 0, 0, 0, 0, 0, 0x80,
                                   1, 0, 0, 0, 0, 0, 0x20, 0,
                                   3, 0, 0, 0, 0, 0, 0x20, 0};
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_INT64, i64, d, 3), PROBE_OK);
    cr_assert(d[0] == -0x1p63);
    cr_assert(d[1] == 0x1p53);
    cr_assert(d[2] == 0x1p53 + 4.0);
    /* uint64: 0x8000000000000000 = 2^63; all ones rounds to 2^64 */
    const unsigned char u64[16] = {0, 0, 0, 0, 0, 0, 0, 0x80,
                                   0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_UINT64, u64, d, 2), PROBE_OK);
    cr_assert(d[0] == 0x1p63 && d[1] == 0x1p64);
}

Test(dtype, unaligned_little_endian_source)
{
    /* float32 1.5 (0x3FC00000) and float16 -2 (0xC000) at odd addresses */
    unsigned char buf[16] = {0};
    const unsigned char f32[4] = {0x00, 0x00, 0xC0, 0x3F};
    memcpy(buf + 1, f32, 4);
    memcpy(buf + 5, f32, 4);
    double d[2];
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_FLOAT32, buf + 1, d, 2), PROBE_OK);
    cr_assert(d[0] == 1.5 && d[1] == 1.5);
    buf[9] = 0x00;
    buf[10] = 0xC0;
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_FLOAT16, buf + 9, d, 1), PROBE_OK);
    cr_assert(d[0] == -2.0);
}

/* ---- exhaustive, against an ldexp oracle ---- */

/* Generic decode: 1 sign bit, ebits, mbits, bias; fn = no infinities and only
 * the all-ones code is NaN (E4M3FN). */
static double oracle(unsigned bits, int ebits, int mbits, int bias, int fn)
{
    unsigned emax = (1u << ebits) - 1, mmax = (1u << mbits) - 1;
    int sign = (bits >> (ebits + mbits)) & 1;
    unsigned e = (bits >> mbits) & emax, m = bits & mmax;
    double v;
    if (!fn && e == emax)
        v = m == 0 ? INFINITY : NAN;
    else if (fn && e == emax && m == mmax)
        v = NAN;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp((double)((1u << mbits) + m), (int)e - bias - mbits);
    return sign ? -v : v;
}

Test(dtype, float16_exhaustive)
{
    static unsigned char src[65536 * 2];
    static double dst[65536];
    for (unsigned i = 0; i < 65536; i++) {
        src[2 * i] = i & 0xFF;
        src[2 * i + 1] = i >> 8;
    }
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_FLOAT16, src, dst, 65536), PROBE_OK);
    unsigned nans = 0;
    for (unsigned i = 0; i < 65536; i++) {
        double want = oracle(i, 5, 10, 15, 0);
        cr_assert(same_double(dst[i], want), "float16 0x%04X: got %a want %a", i, dst[i], want);
        nans += isnan(dst[i]) != 0;
    }
    cr_assert_eq(nans, 2 * 1023);
}

Test(dtype, bfloat16_exhaustive)
{
    static unsigned char src[65536 * 2];
    static double dst[65536];
    for (unsigned i = 0; i < 65536; i++) {
        src[2 * i] = i & 0xFF;
        src[2 * i + 1] = i >> 8;
    }
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_BFLOAT16, src, dst, 65536), PROBE_OK);
    for (unsigned i = 0; i < 65536; i++) {
        double want = oracle(i, 8, 7, 127, 0);
        cr_assert(same_double(dst[i], want), "bfloat16 0x%04X: got %a want %a", i, dst[i], want);
    }
}

Test(dtype, float8_exhaustive)
{
    unsigned char src[256];
    double dst[256];
    for (unsigned i = 0; i < 256; i++)
        src[i] = (unsigned char)i;

    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_FLOAT8_E4M3FN, src, dst, 256), PROBE_OK);
    unsigned nans = 0, infs = 0;
    double vmax = 0;
    for (unsigned i = 0; i < 256; i++) {
        double want = oracle(i, 4, 3, 7, 1);
        cr_assert(same_double(dst[i], want), "e4m3fn 0x%02X: got %a want %a", i, dst[i], want);
        nans += isnan(dst[i]) != 0;
        infs += isinf(dst[i]) != 0;
        if (isfinite(dst[i]) && fabs(dst[i]) > vmax) vmax = fabs(dst[i]);
    }
    cr_assert_eq(nans, 2);
    cr_assert_eq(infs, 0);
    cr_assert(vmax == 448.0);

    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_FLOAT8_E5M2, src, dst, 256), PROBE_OK);
    nans = infs = 0;
    vmax = 0;
    for (unsigned i = 0; i < 256; i++) {
        double want = oracle(i, 5, 2, 15, 0);
        cr_assert(same_double(dst[i], want), "e5m2 0x%02X: got %a want %a", i, dst[i], want);
        nans += isnan(dst[i]) != 0;
        infs += isinf(dst[i]) != 0;
        if (isfinite(dst[i]) && fabs(dst[i]) > vmax) vmax = fabs(dst[i]);
    }
    cr_assert_eq(nans, 6);
    cr_assert_eq(infs, 2);
    cr_assert(vmax == 57344.0);
}

/* ---- bad input ---- */

Test(dtype, bad_input)
{
    unsigned char b[8] = {0};
    double d[1];
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_INVALID, b, d, 1), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "unknown element type 0") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_dtype_to_f64((probe_dtype)99, b, d, 1), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "99") != NULL);
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_FLOAT32, NULL, d, 1), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "src is NULL") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_FLOAT32, b, NULL, 1), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "dst is NULL") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_dtype_to_f64(PROBE_DTYPE_FLOAT32, NULL, NULL, 0), PROBE_OK);
}

/* ---- probe_dtype_convert: the rounding of probe-run --convert ---- */

static uint16_t f32_bits_to_bf16(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, 4);
    uint16_t out;
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT32, &f, PROBE_DTYPE_BFLOAT16, &out, 1),
                 PROBE_OK, "%s", probe_last_error());
    return out;
}

Test(dtype, convert_float32_to_bfloat16_round_to_nearest_even)
{
    cr_assert_eq(f32_bits_to_bf16(0x3f800000u), 0x3f80); /* 1.0 exact */
    cr_assert_eq(f32_bits_to_bf16(0x3f808000u), 0x3f80); /* tie, even below */
    cr_assert_eq(f32_bits_to_bf16(0x3f818000u), 0x3f82); /* tie, even above */
    cr_assert_eq(f32_bits_to_bf16(0x3f808001u), 0x3f81); /* above the tie */
    cr_assert_eq(f32_bits_to_bf16(0x3f807fffu), 0x3f80); /* below the tie */
    cr_assert_eq(f32_bits_to_bf16(0xbf818000u), 0xbf82); /* sign kept */
    cr_assert_eq(f32_bits_to_bf16(0x7f7fffffu), 0x7f80); /* max float rounds to +inf */
    cr_assert_eq(f32_bits_to_bf16(0x7f800000u), 0x7f80); /* +inf */
    cr_assert_eq(f32_bits_to_bf16(0xff800000u), 0xff80); /* -inf */
    cr_assert_eq(f32_bits_to_bf16(0x80000000u), 0x8000); /* -0 */
    cr_assert_eq(f32_bits_to_bf16(0x00000001u), 0x0000); /* smallest subnormal rounds to 0 */
    uint16_t n = f32_bits_to_bf16(0x7f800001u);           /* signalling NaN: stays a NaN, quiet */
    cr_assert((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0 && (n & 0x40), "0x%04x", n);
}

Test(dtype, convert_other_pairs)
{
    double d[3] = {1.0 + 0x1p-30, -3.0e39, 0.1};
    float f[3];
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT64, d, PROBE_DTYPE_FLOAT32, f, 3), PROBE_OK);
    cr_assert(f[0] == 1.0f && isinf(f[1]) && f[1] < 0 && f[2] == 0.1f);
    unsigned char h[2] = {0x00, 0x3c}; /* float16 1.0 */
    uint16_t b;
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT16, h, PROBE_DTYPE_BFLOAT16, &b, 1), PROBE_OK);
    cr_assert_eq(b, 0x3f80);
    uint16_t bb = 0x4049; /* bfloat16 3.140625 */
    double o;
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_BFLOAT16, &bb, PROBE_DTYPE_FLOAT64, &o, 1), PROBE_OK);
    cr_assert_eq(o, 3.140625);
    /* many elements: blocks of the conversion line up */
    enum { N = 1000 };
    static float src[N];
    static uint16_t dst[N];
    for (int i = 0; i < N; i++)
        src[i] = (float)i * 1.0009765625f;
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT32, src, PROBE_DTYPE_BFLOAT16, dst, N), PROBE_OK);
    for (int i = 0; i < N; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        cr_assert_eq(dst[i], f32_bits_to_bf16(u), "element %d", i);
    }
}

Test(dtype, convert_bad_input)
{
    float f = 1;
    uint16_t b;
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_INT32, &f, PROBE_DTYPE_FLOAT32, &b, 1), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "int32 is not a source type") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT8_E4M3FN, &f, PROBE_DTYPE_FLOAT32, &b, 1),
                 PROBE_EINVAL);
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT32, &f, PROBE_DTYPE_FLOAT16, &b, 1), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "float16 is not a target type") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT32, NULL, PROBE_DTYPE_BFLOAT16, &b, 1), PROBE_EINVAL);
    cr_assert_eq(probe_dtype_convert(PROBE_DTYPE_FLOAT32, NULL, PROBE_DTYPE_BFLOAT16, NULL, 0), PROBE_OK);
}

/* ---- status.h ---- */

Test(status, names)
{
    cr_assert_str_eq(probe_status_str(PROBE_OK), "ok");
    cr_assert_str_eq(probe_status_str(PROBE_EINVAL), "invalid argument");
    cr_assert_str_eq(probe_status_str(PROBE_ENOMEM), "out of memory");
    cr_assert_str_eq(probe_status_str(PROBE_ENOTFOUND), "not found");
    for (int s = 0; s <= PROBE_ESTATE; s++) {
        const char *str = probe_status_str((probe_status)s);
        cr_assert(str != NULL && str[0] != '\0' && strcmp(str, "unknown status") != 0);
    }
    cr_assert_str_eq(probe_status_str((probe_status)1234), "unknown status");
}

Test(status, last_error)
{
    cr_assert_eq(probe_set_error(PROBE_EIO, "file %s: %d", "a.h5", 7), PROBE_EIO);
    cr_assert_str_eq(probe_last_error(), "file a.h5: 7");
    /* wrapping the previous message into a new one is safe */
    probe_set_error(PROBE_EIO, "outer: %s", probe_last_error());
    cr_assert_str_eq(probe_last_error(), "outer: file a.h5: 7");
    /* over-long messages are truncated, marked with "..." */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    probe_set_error(PROBE_EINVAL, "%s", big);
    size_t len = strlen(probe_last_error());
    cr_assert_eq(len, 1023);
    cr_assert_str_eq(probe_last_error() + len - 3, "...");
}

static void *other_thread(void *arg)
{
    char *seen = arg;
    strcpy(seen, probe_last_error());
    probe_set_error(PROBE_EINVAL, "from the other thread");
    return NULL;
}

Test(status, last_error_is_per_thread)
{
    probe_set_error(PROBE_EIO, "main thread");
    char seen[64] = "untouched";
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, other_thread, seen), 0);
    pthread_join(th, NULL);
    cr_assert_str_eq(seen, "");
    cr_assert_str_eq(probe_last_error(), "main thread");
}
