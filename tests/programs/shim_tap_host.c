/* shim_tap_host.c - taps host tensors of every dtype and many layouts
 * through probe_tap_v1 (found with dlsym, as a user's process would) and
 * leaves, for an independent check, each tensor's whole base buffer as a raw
 * .bin file plus one JSON line describing the view (dtype, shape, strides in
 * elements, offset in elements). The checker (tests/e2e/test_shim_host.py)
 * rebuilds every expected tensor with numpy's as_strided and compares the
 * captured bytes bit for bit.
 *
 * After each tap the base buffer is overwritten, so a shim that read host
 * memory after probe_tap_v1 returned would be caught.
 *
 * usage: shim_tap_host EXPECT_DIR     (exit 0: every tap returned 0)
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/dtype.h"
#include "probe/tap.h"

typedef int (*tap_fn)(const probe_tap_tensor_v1 *);

static tap_fn tap;
static const char *dir;
static FILE *cases;
static int failures;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next64(void) /* splitmix64 */
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t esize_of(int dt)
{
    switch (dt) {
    case PROBE_DTYPE_BOOL: case PROBE_DTYPE_INT8: case PROBE_DTYPE_UINT8:
    case PROBE_DTYPE_FLOAT8_E4M3FN: case PROBE_DTYPE_FLOAT8_E5M2: return 1;
    case PROBE_DTYPE_INT16: case PROBE_DTYPE_UINT16: case PROBE_DTYPE_FLOAT16:
    case PROBE_DTYPE_BFLOAT16: return 2;
    case PROBE_DTYPE_INT32: case PROBE_DTYPE_UINT32: case PROBE_DTYPE_FLOAT32: return 4;
    default: return 8;
    }
}

/* Deterministic element values: finite for the IEEE-style float types (so
 * no conversion can touch NaN payloads), 0/1 for bool, raw bits otherwise. */
static void fill(void *buf, size_t n, int dt)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < n; ++i) {
        uint64_t r = next64();
        switch (dt) {
        case PROBE_DTYPE_BOOL: p[i] = (unsigned char)(r & 1); break;
        case PROBE_DTYPE_FLOAT16: {
            uint16_t h = (uint16_t)r;
            if (((h >> 10) & 0x1f) == 0x1f)
                h &= (uint16_t)~0x4000;
            memcpy(p + 2 * i, &h, 2);
            break;
        }
        case PROBE_DTYPE_BFLOAT16: {
            uint16_t b = (uint16_t)r;
            if (((b >> 7) & 0xff) == 0xff)
                b &= (uint16_t)~0x4000;
            memcpy(p + 2 * i, &b, 2);
            break;
        }
        case PROBE_DTYPE_FLOAT32: {
            float f = (float)((int64_t)(r % 200001) - 100000) / 64.0f;
            memcpy(p + 4 * i, &f, 4);
            break;
        }
        case PROBE_DTYPE_FLOAT64: {
            double d = (double)((int64_t)(r % 2000000001) - 1000000000) / 1024.0;
            memcpy(p + 8 * i, &d, 8);
            break;
        }
        default:
            memcpy(p + esize_of(dt) * i, &r, esize_of(dt));
            break;
        }
    }
}

/* Tap a view of a fresh base buffer of base_n elements. strides may be NULL. */
static void tap_case(const char *component, long long call, const char *slot, int dt, int rank,
                     const int64_t *shape, const int64_t *strides, size_t base_n, size_t offset,
                     int null_data)
{
    size_t es = esize_of(dt);
    unsigned char *base = malloc(base_n * es + 1);
    fill(base, base_n, dt);
    char name[256], path[512];
    snprintf(name, sizeof name, "%s.%04lld.%s.bin", component, call, slot);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(base, es, base_n, f) != base_n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);

    probe_tap_tensor_v1 t;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    t.abi_version = PROBE_TAP_ABI_VERSION;
    t.component = component;
    t.slot = slot;
    t.call = call;
    t.step = call % 5;
    t.cfg_branch = (int32_t)(call % 2);
    t.device = -1;
    t.dtype = dt;
    t.rank = rank;
    t.shape = shape;
    t.strides = strides;
    t.data = null_data ? NULL : base + offset * es;
    t.timestep = 999.0 - (double)call;
    int rc = tap(&t);
    if (rc != 0) {
        fprintf(stderr, "tap %s/%lld/%s returned %d\n", component, call, slot, rc);
        ++failures;
    }
    memset(base, 0xA5, base_n * es); /* the shim must have copied already */
    free(base);

    fprintf(cases, "{\"path\":\"/%s/%04lld/%s\",\"dtype\":%d,\"bin\":\"%s\",\"offset\":%zu,"
                   "\"shape\":[", component, call, slot, dt, name, offset);
    for (int k = 0; k < rank; ++k)
        fprintf(cases, "%s%lld", k ? "," : "", (long long)shape[k]);
    fprintf(cases, "],\"strides\":");
    if (strides) {
        fprintf(cases, "[");
        for (int k = 0; k < rank; ++k)
            fprintf(cases, "%s%lld", k ? "," : "", (long long)strides[k]);
        fprintf(cases, "]");
    } else {
        fprintf(cases, "null");
    }
    fprintf(cases, ",\"step\":%lld,\"cfg_branch\":%d,\"timestep\":%.1f}\n", call % 5,
            (int)(call % 2), 999.0 - (double)call);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s EXPECT_DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    tap = (tap_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_v1");
    if (!tap) {
        fprintf(stderr, "probe_tap_v1 not found: is libprobe_intercept.so preloaded?\n");
        return 2;
    }
    char p[512];
    snprintf(p, sizeof p, "%s/cases.jsonl", dir);
    cases = fopen(p, "w");
    if (!cases)
        return 2;

    /* contiguous, strides NULL and explicit */
    int64_t s345[] = {3, 4, 5}, st345[] = {20, 5, 1};
    tap_case("layout", 0, "contiguous", PROBE_DTYPE_FLOAT32, 3, s345, NULL, 60, 0, 0);
    tap_case("layout", 1, "contiguous_strided", PROBE_DTYPE_FLOAT32, 3, s345, st345, 60, 0, 0);
    /* transposed: base [4, 6] viewed as [6, 4] */
    int64_t s64[] = {6, 4}, st64[] = {1, 6};
    tap_case("layout", 2, "transposed", PROBE_DTYPE_FLOAT32, 2, s64, st64, 24, 0, 0);
    /* sliced with offset: base [10, 12] float64, view [2:7, 3:11:2] */
    int64_t s54[] = {5, 4}, st54[] = {12, 2};
    tap_case("layout", 3, "sliced", PROBE_DTYPE_FLOAT64, 2, s54, st54, 120, 2 * 12 + 3, 0);
    /* channels-last: logical NCHW [2, 3, 4, 5] stored NHWC */
    int64_t snchw[] = {2, 3, 4, 5}, stnhwc[] = {60, 1, 15, 3};
    tap_case("layout", 4, "channels_last", PROBE_DTYPE_FLOAT16, 4, snchw, stnhwc, 120, 0, 0);
    /* rank 0 */
    tap_case("layout", 5, "scalar", PROBE_DTYPE_FLOAT32, 0, NULL, NULL, 1, 0, 0);
    tap_case("layout", 6, "scalar_i64", PROBE_DTYPE_INT64, 0, NULL, NULL, 3, 2, 0);
    /* zero-size, with and without a data pointer */
    int64_t s302[] = {3, 0, 2};
    tap_case("layout", 7, "empty", PROBE_DTYPE_FLOAT32, 3, s302, NULL, 1, 0, 0);
    tap_case("layout", 8, "empty_null", PROBE_DTYPE_BFLOAT16, 3, s302, NULL, 1, 0, 1);
    /* broadcast (stride 0), and size-1 dims with arbitrary strides */
    int64_t s43[] = {4, 3}, st43[] = {0, 1};
    tap_case("layout", 9, "broadcast", PROBE_DTYPE_INT32, 2, s43, st43, 3, 0, 0);
    int64_t s151[] = {1, 5, 1}, st151[] = {999, 2, 77};
    tap_case("layout", 10, "unit_dims", PROBE_DTYPE_UINT16, 3, s151, st151, 9, 0, 0);
    /* a larger transposed tensor: [512, 384] viewed from base [384, 512] */
    int64_t sbig[] = {512, 384}, stbig[] = {1, 512};
    tap_case("layout", 11, "big_transposed", PROBE_DTYPE_FLOAT32, 2, sbig, stbig, 512 * 384, 0, 0);
    /* 5-D video latent, permuted: logical [1, 16, 5, 8, 8] from [1, 5, 16, 8, 8] */
    int64_t s5[] = {1, 16, 5, 8, 8}, st5[] = {5120, 64, 1024, 8, 1};
    tap_case("layout", 12, "permuted_5d", PROBE_DTYPE_BFLOAT16, 5, s5, st5, 5120, 0, 0);
    /* every dtype, contiguous and transposed */
    for (int dt = 1; dt < PROBE_DTYPE_COUNT_; ++dt) {
        int64_t s73[] = {7, 3}, s37[] = {3, 7}, st37[] = {1, 3};
        tap_case("dtype", dt, "contiguous", dt, 2, s73, NULL, 21, 0, 0);
        tap_case("dtype", dt, "transposed", dt, 2, s37, st37, 21, 0, 0);
    }
    fclose(cases);
    printf("tapped, failures=%d\n", failures);
    return failures ? 1 : 0;
}
