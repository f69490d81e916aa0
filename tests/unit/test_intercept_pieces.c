/* test_intercept_pieces.c - small pieces of the shim on their own: extents
 * and strided gather/scatter (intercept/base/gather.c) against hand-derived
 * layouts, tap descriptor validation (base/desc.c), the set of taken paths
 * (base/pathset.c), the real-symbol resolver (base/resolve.c) and the
 * selection grammar (capture/select.c). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "base/desc.h"
#include "base/gather.h"
#include "base/pathset.h"
#include "base/resolve.h"
#include "base/shim.h"
#include "capture/select.h"
#include "probe/dtype.h"

Test(intercept_gather, extents)
{
    struct shim_extent e;
    int64_t shape[2] = {2, 3}, tr[2] = {1, 2};
    cr_assert_eq(shim_gather_extent(2, shape, NULL, 4, &e), PROBE_OK);
    cr_assert(e.n == 6 && e.nbytes == 24 && e.span_bytes == 24 && e.contiguous);
    cr_assert_eq(shim_gather_extent(2, shape, tr, 4, &e), PROBE_OK);
    cr_assert(e.n == 6 && e.span_bytes == 24 && !e.contiguous, "a transpose spans the same bytes");
    int64_t bshape[2] = {4, 3}, bcast[2] = {0, 1};
    cr_assert_eq(shim_gather_extent(2, bshape, bcast, 2, &e), PROBE_OK);
    cr_assert(e.n == 12 && e.nbytes == 24 && e.span_bytes == 6, "a broadcast spans one row");
    int64_t huge[2] = {INT64_MAX / 2, 4};
    cr_assert_eq(shim_gather_extent(2, huge, NULL, 8, &e), PROBE_EINVAL, "overflow refused");
    int64_t neg[1] = {-1};
    cr_assert_eq(shim_gather_extent(1, neg, NULL, 4, &e), PROBE_EINVAL);
    int64_t zero[2] = {0, 5};
    cr_assert_eq(shim_gather_extent(2, zero, NULL, 4, &e), PROBE_OK);
    cr_assert(e.n == 0 && e.nbytes == 0 && e.span_bytes == 0);
}

Test(intercept_gather, transpose_gather_and_scatter)
{
    /* memory holds [[0,1,2],[3,4,5]] row-major; the view is its transpose
     * (shape 3x2, strides 1,3): row-major gather = 0,3,1,4,2,5 */
    float mem[6] = {0, 1, 2, 3, 4, 5}, out[6], back[6] = {0};
    int64_t shape[2] = {3, 2}, strides[2] = {1, 3};
    shim_gather(out, mem, 2, shape, strides, sizeof(float));
    const float want[6] = {0, 3, 1, 4, 2, 5};
    cr_assert_arr_eq(out, want, sizeof want);
    shim_gather_scatter(back, out, 2, shape, strides, sizeof(float));
    cr_assert_arr_eq(back, mem, sizeof mem, "scatter is the inverse");
}

static probe_tap_tensor_v1 good_desc(const int64_t *shape, const void *data)
{
    probe_tap_tensor_v1 t;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    t.abi_version = PROBE_TAP_ABI_VERSION;
    t.component = "dit.step";
    t.slot = "out";
    t.dtype = PROBE_DTYPE_FLOAT32;
    t.rank = 2;
    t.shape = shape;
    t.data = data;
    t.device = -1;
    t.step = -1;
    t.cfg_branch = -1;
    t.timestep = NAN;
    return t;
}

Test(intercept_desc, validation_names_the_field)
{
    int64_t shape[2] = {2, 2};
    float data[4] = {0};
    struct shim_extent e;
    probe_tap_tensor_v1 t = good_desc(shape, data);
    cr_assert_eq(shim_desc_validate(&t, &e), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(e.nbytes, 16);
    t.slot = "a/b";
    cr_assert_eq(shim_desc_validate(&t, &e), PROBE_EINVAL);
    cr_assert_not_null(strstr(probe_last_error(), "slot"), "%s", probe_last_error());
    t = good_desc(shape, data);
    t.dtype = 999;
    cr_assert_eq(shim_desc_validate(&t, &e), PROBE_EINVAL);
    cr_assert_not_null(strstr(probe_last_error(), "dtype"), "%s", probe_last_error());
    t = good_desc(shape, data);
    t.data = NULL;
    cr_assert_eq(shim_desc_validate(&t, &e), PROBE_EINVAL);
    cr_assert_not_null(strstr(probe_last_error(), "data"), "%s", probe_last_error());
    t = good_desc(shape, data);
    t.parent = "/transformer/0000";
    t.block = 3;
    cr_assert_eq(shim_desc_validate(&t, &e), PROBE_OK);
    cr_assert_str_eq(shim_desc_parent(&t), "/transformer/0000");
    cr_assert_eq(shim_desc_block(&t), 3);
    t.struct_size = PROBE_TAP_TENSOR_V1_BASE_SIZE; /* an adapter that predates parent */
    cr_assert_null(shim_desc_parent(&t), "fields past struct_size are not read");
    cr_assert_eq(shim_desc_block(&t), -1);
}

Test(intercept_pathset, insert_once)
{
    cr_assert_eq(shim_pathset_insert("/a/0000/x"), 1);
    cr_assert_eq(shim_pathset_insert("/a/0000/x"), 0, "already taken");
    shim_pathset_remove("/a/0000/x");
    cr_assert_eq(shim_pathset_insert("/a/0000/x"), 1, "free again after remove");
    for (int i = 0; i < 5000; ++i) {
        char p[64];
        snprintf(p, sizeof p, "/c/%04d/s", i);
        cr_assert_eq(shim_pathset_insert(p), 1);
    }
    cr_assert_eq(shim_pathset_insert("/c/4999/s"), 0, "found after the set grew");
}

Test(intercept_resolve, finds_what_is_loaded_and_nothing_else)
{
    cr_assert_eq(shim_resolve_next("getpid"), (void *)getpid, "libc's getpid after this object");
    cr_assert_not_null(shim_resolve_default("getpid"));
    static const char *const none[] = {"libprobe-not-a-library.so.9", NULL};
    cr_assert_null(shim_resolve_in("getpid", none, NULL), "never loads a library");
    cr_assert_null(shim_resolve("probe_no_such_symbol_anywhere", shim_resolve_cudart));
    cr_assert(shim_resolve_loaded("libc.so.6"));
    cr_assert(!shim_resolve_loaded("libprobe-not-a-library.so.9"));
    static const char *const libc[] = {"libprobe-not-a-library.so.9", "libc.so.6", NULL};
    const char *which = NULL;
    cr_assert_not_null(shim_resolve_in("getpid", libc, &which));
    cr_assert_str_eq(which, "libc.so.6", "names the library that had it");
}

Test(intercept_select, items_steps_and_interposed_operands)
{
    shim_cfg.mode = SHIM_OWNER;
    shim_select_config("/dit.step/*/out@step=1-2+5, vae/*, *gemm.*.out@block=0");
    cr_assert_null(shim_cfg.capture_error);
    cr_assert_eq(shim_cfg.nglobs, 3);
    cr_assert(shim_select_tap("/dit.step/0003/out", 1, 0, -1));
    cr_assert(shim_select_tap("/dit.step/0003/out", 5, 0, -1));
    cr_assert(!shim_select_tap("/dit.step/0003/out", 3, 0, -1), "step 3 is outside 1-2+5");
    cr_assert(!shim_select_tap("/dit.step/0003/out", -1, 0, -1), "an unknown step never matches");
    cr_assert(shim_select_tap("/vae/0000/out", -1, -1, -1), "a glob without '/' matches the path's tail");
    cr_assert(!shim_select_tap("/text_encoder/0000/out", 0, 0, -1));
    cr_assert(shim_select_interposed("/dit.block/0000/gemm.0003.out", 0, 0, 0, "gemm", 0));
    cr_assert(!shim_select_interposed("/dit.block/0000/gemm.0003.out", 0, 0, 1, "gemm", 0),
              "block 1 is outside @block=0");
    cr_assert(!shim_select_interposed("/dit.step/0003/out", 1, 0, -1, "nccl", 0),
              "only items naming the family select its operands");
    cr_assert_eq(shim_select_stats_for_count(), 0);
}

Test(intercept_select, bad_spec_selects_nothing)
{
    shim_cfg.mode = SHIM_OWNER;
    shim_select_config("/dit.step/*@step=3-1");
    cr_assert_not_null(shim_cfg.capture_error, "a reversed range is refused");
    cr_assert(!shim_select_tap("/dit.step/0000/out", 2, 0, -1), "nothing is captured");
    shim_select_stats_for_config("/dit.block/*@block=0-1");
    cr_assert_eq(shim_select_stats_for_count(), 1);
    cr_assert(shim_select_stats_for("/dit.block/0004/out", 0, 0, 1));
    cr_assert(!shim_select_stats_for("/dit.block/0004/out", 0, 0, 2));
}
