/* dtype.c - element types: sizes, names, exact conversion to double, and
 * the floating conversion of injection (probe/dtype.h).
 *
 * Also compiled into the preloaded shim (intercept/), so it must link only
 * against libc: no libm (doubles are assembled from their bit fields).
 *
 * Sources: IEEE 754-2008 (binary16/32/64); bfloat16 = the upper 16 bits of
 * binary32; "OCP 8-bit Floating Point Specification (OFP8)", revision 1.0,
 * 2023 (E4M3: bias 7, no infinities, S.1111.111 = NaN, max 448;
 * E5M2: bias 15, IEEE-like infinities and NaNs, max 57344).
 */
#include "probe/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
    int is_float;
    int precision;  /* significand bits, the implicit one included (floats) */
    int min_exp;    /* exponent of the smallest normal number (floats) */
} dtype_table[PROBE_DTYPE_COUNT_] = {
    [PROBE_DTYPE_INVALID]       = {"invalid", 0, 0, 0, 0},
    [PROBE_DTYPE_BOOL]          = {"bool", 1, 0, 0, 0},
    [PROBE_DTYPE_INT8]          = {"int8", 1, 0, 0, 0},
    [PROBE_DTYPE_INT16]         = {"int16", 2, 0, 0, 0},
    [PROBE_DTYPE_INT32]         = {"int32", 4, 0, 0, 0},
    [PROBE_DTYPE_INT64]         = {"int64", 8, 0, 0, 0},
    [PROBE_DTYPE_UINT8]         = {"uint8", 1, 0, 0, 0},
    [PROBE_DTYPE_UINT16]        = {"uint16", 2, 0, 0, 0},
    [PROBE_DTYPE_UINT32]        = {"uint32", 4, 0, 0, 0},
    [PROBE_DTYPE_UINT64]        = {"uint64", 8, 0, 0, 0},
    [PROBE_DTYPE_FLOAT16]       = {"float16", 2, 1, 11, -14},
    [PROBE_DTYPE_BFLOAT16]      = {"bfloat16", 2, 1, 8, -126},
    [PROBE_DTYPE_FLOAT32]       = {"float32", 4, 1, 24, -126},
    [PROBE_DTYPE_FLOAT64]       = {"float64", 8, 1, 53, -1022},
    [PROBE_DTYPE_FLOAT8_E4M3FN] = {"float8_e4m3fn", 1, 1, 4, -6},
    [PROBE_DTYPE_FLOAT8_E5M2]   = {"float8_e5m2", 1, 1, 3, -14},
};

/* Aliases accepted by probe_dtype_from_name (torch's own aliases such as
 * torch.half / torch.long, and common short forms). */
static const struct {
    const char *alias;
    probe_dtype t;
} dtype_aliases[] = {
    {"half", PROBE_DTYPE_FLOAT16},   {"fp16", PROBE_DTYPE_FLOAT16},
    {"bf16", PROBE_DTYPE_BFLOAT16},
    {"float", PROBE_DTYPE_FLOAT32},  {"fp32", PROBE_DTYPE_FLOAT32},
    {"double", PROBE_DTYPE_FLOAT64}, {"fp64", PROBE_DTYPE_FLOAT64},
    {"short", PROBE_DTYPE_INT16},    {"int", PROBE_DTYPE_INT32},
    {"long", PROBE_DTYPE_INT64},
};

static int dtype_valid(probe_dtype t)
{
    return (int)t > (int)PROBE_DTYPE_INVALID && (int)t < (int)PROBE_DTYPE_COUNT_;
}

size_t probe_dtype_size(probe_dtype t)
{
    return dtype_valid(t) ? dtype_table[t].size : 0;
}

const char *probe_dtype_name(probe_dtype t)
{
    return dtype_valid(t) ? dtype_table[t].name : "invalid";
}

probe_dtype probe_dtype_from_name(const char *name)
{
    if (name == NULL)
        return PROBE_DTYPE_INVALID;
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    for (int t = PROBE_DTYPE_INVALID + 1; t < PROBE_DTYPE_COUNT_; t++)
        if (strcmp(name, dtype_table[t].name) == 0)
            return (probe_dtype)t;
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++)
        if (strcmp(name, dtype_aliases[i].alias) == 0)
            return dtype_aliases[i].t;
    return PROBE_DTYPE_INVALID;
}

int probe_dtype_is_float(probe_dtype t)
{
    return dtype_valid(t) ? dtype_table[t].is_float : 0;
}

int probe_dtype_precision(probe_dtype t, int *min_exp)
{
    int ok = dtype_valid(t) && dtype_table[t].is_float;
    if (min_exp)
        *min_exp = ok ? dtype_table[t].min_exp : 0;
    return ok ? dtype_table[t].precision : 0;
}

/* ---- bit-level helpers (little-endian byte order, independent of the host's) ---- */

static uint16_t load_u16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t load_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t load_u64(const unsigned char *p)
{
    return (uint64_t)load_u32(p) | ((uint64_t)load_u32(p + 4) << 32);
}

static double double_from_bits(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

/* 2^k for -1022 <= k <= 1023 (a normal double), built from its bits. */
static double pow2(int k)
{
    return double_from_bits((uint64_t)(k + 1023) << 52);
}

/* Decode a small binary floating-point format with 1 sign bit, `ebits`
 * exponent bits, `mbits` mantissa bits and exponent `bias`, held in the low
 * bits of `bits`. `nan_rule` says which all-ones-exponent codes are special:
 *   IEEE_LIKE  exponent all ones: mantissa 0 = infinity, else NaN (binary16, E5M2)
 *   FN         only exponent and mantissa all ones = NaN; no infinities (E4M3FN)
 * Every value of these formats is exactly representable as a double. */
enum nan_rule { IEEE_LIKE, FN };

static double decode_minifloat(unsigned bits, int ebits, int mbits, int bias, enum nan_rule rule)
{
    unsigned emax = (1u << ebits) - 1;
    unsigned mmax = (1u << mbits) - 1;
    unsigned sign = (bits >> (ebits + mbits)) & 1u;
    unsigned e = (bits >> mbits) & emax;
    unsigned m = bits & mmax;
    uint64_t sbit = (uint64_t)sign << 63;

    if (e == emax && (rule == IEEE_LIKE || m == mmax)) {
        if (rule == IEEE_LIKE && m == 0)
            return double_from_bits(sbit | 0x7FF0000000000000ull); /* +-inf */
        /* NaN: quiet, keep the sign and the payload's top bits. */
        return double_from_bits(sbit | 0x7FF8000000000000ull | ((uint64_t)m << (52 - mbits)));
    }
    if (e == 0) {
        /* zero or subnormal: m * 2^(1 - bias - mbits), exact (m < 2^mbits) */
        double v = (double)m * pow2(1 - bias - mbits);
        return sign ? -v : v;
    }
    /* normal: (1 + m/2^mbits) * 2^(e - bias) */
    return double_from_bits(sbit | ((uint64_t)((int)e - bias + 1023) << 52) |
                            ((uint64_t)m << (52 - mbits)));
}

probe_status probe_dtype_to_f64(probe_dtype t, const void *src, double *dst, size_t n)
{
    if (!dtype_valid(t))
        return probe_set_error(PROBE_EINVAL, "probe_dtype_to_f64: unknown element type %d", (int)t);
    if (n == 0)
        return PROBE_OK;
    if (src == NULL || dst == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_dtype_to_f64: %s is NULL with n = %zu",
                               src == NULL ? "src" : "dst", n);

    const unsigned char *p = src;
    switch (t) {
    case PROBE_DTYPE_BOOL:
        for (size_t i = 0; i < n; i++) dst[i] = p[i] ? 1.0 : 0.0;
        break;
    case PROBE_DTYPE_INT8:
        for (size_t i = 0; i < n; i++) dst[i] = (double)(int8_t)p[i];
        break;
    case PROBE_DTYPE_UINT8:
        for (size_t i = 0; i < n; i++) dst[i] = (double)p[i];
        break;
    case PROBE_DTYPE_INT16:
        for (size_t i = 0; i < n; i++) dst[i] = (double)(int16_t)load_u16(p + 2 * i);
        break;
    case PROBE_DTYPE_UINT16:
        for (size_t i = 0; i < n; i++) dst[i] = (double)load_u16(p + 2 * i);
        break;
    case PROBE_DTYPE_INT32:
        for (size_t i = 0; i < n; i++) dst[i] = (double)(int32_t)load_u32(p + 4 * i);
        break;
    case PROBE_DTYPE_UINT32:
        for (size_t i = 0; i < n; i++) dst[i] = (double)load_u32(p + 4 * i);
        break;
    case PROBE_DTYPE_INT64: /* rounded to nearest beyond 2^53 */
        for (size_t i = 0; i < n; i++) dst[i] = (double)(int64_t)load_u64(p + 8 * i);
        break;
    case PROBE_DTYPE_UINT64:
        for (size_t i = 0; i < n; i++) dst[i] = (double)load_u64(p + 8 * i);
        break;
    case PROBE_DTYPE_FLOAT16:
        for (size_t i = 0; i < n; i++)
            dst[i] = decode_minifloat(load_u16(p + 2 * i), 5, 10, 15, IEEE_LIKE);
        break;
    case PROBE_DTYPE_BFLOAT16:
        for (size_t i = 0; i < n; i++) {
            uint32_t b = (uint32_t)load_u16(p + 2 * i) << 16;
            float f;
            memcpy(&f, &b, sizeof f);
            dst[i] = (double)f;
        }
        break;
    case PROBE_DTYPE_FLOAT32:
        for (size_t i = 0; i < n; i++) {
            uint32_t b = load_u32(p + 4 * i);
            float f;
            memcpy(&f, &b, sizeof f);
            dst[i] = (double)f;
        }
        break;
    case PROBE_DTYPE_FLOAT64:
        for (size_t i = 0; i < n; i++) dst[i] = double_from_bits(load_u64(p + 8 * i));
        break;
    case PROBE_DTYPE_FLOAT8_E4M3FN:
        for (size_t i = 0; i < n; i++) dst[i] = decode_minifloat(p[i], 4, 3, 7, FN);
        break;
    case PROBE_DTYPE_FLOAT8_E5M2:
        for (size_t i = 0; i < n; i++) dst[i] = decode_minifloat(p[i], 5, 2, 15, IEEE_LIKE);
        break;
    default:
        return probe_set_error(PROBE_EINVAL, "probe_dtype_to_f64: unknown element type %d", (int)t);
    }
    return PROBE_OK;
}

/* float -> bfloat16, round to nearest even (as torch's .to(torch.bfloat16));
 * NaN stays a (quiet) NaN. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

probe_status probe_dtype_convert(probe_dtype from, const void *src, probe_dtype to, void *dst,
                                 size_t n)
{
    if (!dtype_valid(from) || !dtype_table[from].is_float || from == PROBE_DTYPE_FLOAT8_E4M3FN ||
        from == PROBE_DTYPE_FLOAT8_E5M2)
        return probe_set_error(PROBE_EINVAL, "probe_dtype_convert: %s is not a source type "
                               "(float16, bfloat16, float32, float64)", probe_dtype_name(from));
    if (to != PROBE_DTYPE_FLOAT32 && to != PROBE_DTYPE_FLOAT64 && to != PROBE_DTYPE_BFLOAT16)
        return probe_set_error(PROBE_EINVAL, "probe_dtype_convert: %s is not a target type "
                               "(float32, float64, bfloat16)", probe_dtype_name(to));
    if (n > 0 && (!src || !dst))
        return probe_set_error(PROBE_EINVAL, "probe_dtype_convert: NULL buffer");
    enum { BLOCK = 256 };
    double tmp[BLOCK];
    const unsigned char *s = src;
    unsigned char *d = dst;
    size_t es = dtype_table[from].size, et = dtype_table[to].size;
    for (size_t at = 0; at < n; at += BLOCK) {
        size_t m = n - at < BLOCK ? n - at : BLOCK;
        probe_dtype_to_f64(from, s + at * es, tmp, m);
        for (size_t i = 0; i < m; i++) {
            unsigned char *o = d + (at + i) * et;
            if (to == PROBE_DTYPE_FLOAT64) {
                memcpy(o, &tmp[i], 8);
                continue;
            }
            float f = (float)tmp[i];
            if (to == PROBE_DTYPE_FLOAT32) {
                memcpy(o, &f, 4);
            } else {
                uint16_t b = f32_to_bf16(f);
                memcpy(o, &b, 2);
            }
        }
    }
    return PROBE_OK;
}

const char *probe_rounding_name(probe_rounding r)
{
    switch (r) {
    case PROBE_ROUNDING_E4M3FN:
        return "float8_e4m3fn";
    case PROBE_ROUNDING_E4M3FN_AMAX:
        return "float8_e4m3fn/amax";
    default:
        return NULL;
    }
}
