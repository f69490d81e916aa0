/* shim_tap_bad.c - bad input to every tap ABI function must come back as a
 * status (PROBE_EINVAL = 1), never a crash, and must leave nothing in the
 * file; good calls around them must still work.
 *
 * Prints one line per case ("ok"/"FAIL name rc=.. want=.."); exit 0 when
 * every return value is the expected one. tests/e2e/test_shim_bad.py then
 * checks the file: only the valid tensors, the device tensor recorded as
 * skipped (no CUDA runtime in this process), and the manifest keys.
 */
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/dtype.h"
#include "probe/status.h"
#include "probe/tap.h"
#include "tap_client.h"

typedef int (*tap_fn)(const probe_tap_tensor_v1 *);
typedef int (*enabled_fn)(void);
typedef int (*manifest_fn)(const char *, const char *);
typedef void *(*stream_fn)(int32_t);
typedef int (*flush_fn)(void);

static int failures;

static void expect(const char *name, int rc, int want)
{
    if (rc == want) {
        printf("ok %s\n", name);
    } else {
        printf("FAIL %s rc=%d want=%d\n", name, rc, want);
        ++failures;
    }
}

static float data[64];
static int64_t shape2[2] = {4, 4};

static probe_tap_tensor_v1 good(const char *component, long long call)
{
    probe_tap_tensor_v1 t = tap_desc(component, call, -1);
    t.dtype = PROBE_DTYPE_FLOAT32;
    t.rank = 2;
    t.shape = shape2;
    t.data = data;
    return t;
}

/* A caller compiled against a later ABI: v1 fields, then more. */
struct tensor_v9 {
    probe_tap_tensor_v1 v1;
    int64_t future_a;
    double future_b;
};

int main(void)
{
    tap_fn tap = (tap_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_v1");
    enabled_fn enabled = (enabled_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_enabled_v1");
    manifest_fn manifest = (manifest_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_manifest_v1");
    stream_fn stream = (stream_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_stream_v1");
    flush_fn flush = (flush_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_flush_v1");
    if (!tap || !enabled || !manifest || !stream || !flush) {
        fprintf(stderr, "tap ABI not found: is libprobe_intercept.so preloaded?\n");
        return 2;
    }
    for (int i = 0; i < 64; ++i)
        data[i] = (float)i * 0.5f;
    probe_tap_tensor_v1 t;
    char longname[200];
    memset(longname, 'c', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';

    expect("enabled", enabled(), 1);
    expect("NULL descriptor", tap(NULL), PROBE_EINVAL);
    t = good("bad", 0); t.struct_size = PROBE_TAP_TENSOR_V1_BASE_SIZE - 8;
    expect("struct_size too small", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.struct_size = 0;
    expect("struct_size 0", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.abi_version = 2;
    expect("abi_version 2", tap(&t), PROBE_EINVAL);
    t = good(NULL, 0);
    expect("component NULL", tap(&t), PROBE_EINVAL);
    t = good("", 0);
    expect("component empty", tap(&t), PROBE_EINVAL);
    t = good("a/b", 0);
    expect("component with /", tap(&t), PROBE_EINVAL);
    t = good(".", 0);
    expect("component .", tap(&t), PROBE_EINVAL);
    t = good("..", 0);
    expect("component ..", tap(&t), PROBE_EINVAL);
    t = good(longname, 0);
    expect("component 199 bytes", tap(&t), PROBE_EINVAL);
    t = good("a\tb", 0);
    expect("component with a tab", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.slot = NULL;
    expect("slot NULL", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.slot = "";
    expect("slot empty", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.slot = "in/x";
    expect("slot with /", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.call = -1;
    expect("call -1", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.rank = -1;
    expect("rank -1", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.rank = 17;
    expect("rank 17", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.dtype = 0;
    expect("dtype 0 (invalid)", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.dtype = PROBE_DTYPE_COUNT_;
    expect("dtype 16", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.dtype = -3;
    expect("dtype -3", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.device = -2;
    expect("device -2", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.shape = NULL;
    expect("shape NULL, rank 2", tap(&t), PROBE_EINVAL);
    int64_t neg[2] = {4, -1};
    t = good("bad", 0); t.shape = neg;
    expect("negative dim", tap(&t), PROBE_EINVAL);
    int64_t negst[2] = {4, -1};
    t = good("bad", 0); t.strides = negst;
    expect("negative stride", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.data = NULL;
    expect("data NULL with 16 elements", tap(&t), PROBE_EINVAL);
    int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
    t = good("bad", 0); t.shape = huge;
    expect("element count overflow", tap(&t), PROBE_EINVAL);
    int64_t big3[1] = {(int64_t)1 << 62};
    t = good("bad", 0); t.rank = 1; t.shape = big3;
    expect("byte size overflow", tap(&t), PROBE_EINVAL);
    int64_t bigst[2] = {(int64_t)1 << 62, 1};
    t = good("bad", 0); t.strides = bigst;
    expect("strided span overflow", tap(&t), PROBE_EINVAL);
    char longparent[300];
    longparent[0] = '/';
    memset(longparent + 1, 'p', sizeof longparent - 2);
    longparent[sizeof longparent - 1] = '\0';
    t = good("bad", 0); t.parent = "/dit.step/0003"; t.block = -1;
    expect("nested call with block -1", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.parent = "dit.step/0003"; t.block = 0;
    expect("parent without a leading /", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.parent = longparent; t.block = 0;
    expect("parent 299 bytes", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.parent = "/dit.step/\n0003"; t.block = 0;
    expect("parent with a newline", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.class_name = longparent + 1;
    expect("class_name 298 bytes", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.class_name = "mod.\x01Block";
    expect("class_name with a control character", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.module = longparent + 1;
    expect("module 298 bytes", tap(&t), PROBE_EINVAL);
    t = good("bad", 0); t.module = "transformer.\nblocks.0";
    expect("module with a newline", tap(&t), PROBE_EINVAL);

    /* valid ones */
    t = good("good", 0);
    expect("valid tensor", tap(&t), PROBE_OK);
    t = good("good", 0);
    expect("same path again", tap(&t), PROBE_EINVAL);
    t = good("good", 1); t.slot = "in.hidden_states";
    expect("slot with dots", tap(&t), PROBE_OK);
    struct tensor_v9 t9;
    memset(&t9, 0, sizeof t9);
    t9.v1 = good("good", 2);
    t9.v1.struct_size = sizeof t9;
    t9.future_a = 42;
    expect("larger struct_size from a newer caller", tap(&t9.v1), PROBE_OK);
    t = good("good", 3); t.device = 0; t.data = (void *)(uintptr_t)0x1000;
    expect("device tensor without CUDA: recorded as skipped", tap(&t), PROBE_OK);
    /* a caller compiled before parent/block/class_name: its struct ends at
     * timestep, and what lies after it in memory is not read */
    t = good("good", 4); t.struct_size = PROBE_TAP_TENSOR_V1_BASE_SIZE;
    t.parent = "/not/read"; t.block = -5; t.class_name = "\x01not read";
    expect("struct_size of the first v1 descriptor (no parent/block/class_name)", tap(&t), PROBE_OK);
    t = good("good", 5); t.parent = "/dit.step/0003"; t.block = 1; t.class_name = "toy.ToyDiTBlock";
    t.module = "transformer.blocks.1";
    expect("nested call with its class and module path", tap(&t), PROBE_OK);
    t = good("good", 6); t.parent = ""; t.block = -1;
    expect("empty parent: not nested, block ignored", tap(&t), PROBE_OK);
    /* a struct_size that ends inside class_name: parent and block known, class not */
    t = good("good", 7); t.parent = "/dit.step/0000"; t.block = 0; t.class_name = "\x01not read";
    t.module = "\x01not read";
    t.struct_size = (uint32_t)offsetof(probe_tap_tensor_v1, class_name);
    expect("struct_size up to block", tap(&t), PROBE_OK);

    expect("stream_v1(0) without CUDA is NULL", stream(0) == NULL, 1);
    expect("stream_v1(-1) is NULL", stream(-1) == NULL, 1);
    expect("stream_v1(1000) is NULL", stream(1000) == NULL, 1);

    expect("manifest key NULL", manifest(NULL, "1"), PROBE_EINVAL);
    expect("manifest key empty", manifest("", "1"), PROBE_EINVAL);
    expect("manifest key with space", manifest("bad key", "1"), PROBE_EINVAL);
    expect("manifest key with quote", manifest("a\"b", "1"), PROBE_EINVAL);
    expect("manifest key 65 chars", manifest("kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk", "1"),
           PROBE_EINVAL);
    expect("manifest key format reserved", manifest("format", "\"x\""), PROBE_EINVAL);
    expect("manifest key version reserved", manifest("version", "2"), PROBE_EINVAL);
    expect("manifest value NULL", manifest("torch", NULL), PROBE_EINVAL);
    expect("manifest value truncated object", manifest("torch", "{\"a\":"), PROBE_EINVAL);
    expect("manifest value two values", manifest("torch", "1 2"), PROBE_EINVAL);
    expect("manifest value bare word", manifest("torch", "nan"), PROBE_EINVAL);
    expect("manifest value raw newline in string", manifest("torch", "\"a\nb\""), PROBE_EINVAL);
    expect("manifest value bad escape", manifest("torch", "\"\\x\""), PROBE_EINVAL);
    expect("manifest value leading zero", manifest("torch", "01"), PROBE_EINVAL);
    char deep[300];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    deep[200] = '\0';
    expect("manifest value nested 100 deep", manifest("torch", deep), PROBE_EINVAL);
    expect("manifest value invalid UTF-8", manifest("torch", "\"\xff\""), PROBE_EINVAL);
    expect("manifest torch", manifest("torch", "{\"version\":\"0.0\"}"), PROBE_OK);
    expect("manifest torch replaced",
           manifest("torch", " {\"version\": \"1.13.0\", \"cuda\": null, \"x\": [1, -2.5e3, true, false, \"\\u00e9\"]} "),
           PROBE_OK);
    expect("manifest label overrides the built-in", manifest("label", "\"overridden\""), PROBE_OK);
    expect("manifest pipeline.name", manifest("pipeline.name", "\"toy\""), PROBE_OK);
    expect("flush", flush(), PROBE_OK);
    expect("enabled after all that", enabled(), 1);
    printf("bad-input cases done, failures=%d\n", failures);
    return failures ? 1 : 0;
}
