/* test_cuda_plugin.c - libprobe_cuda.so (probe/device.h) where it is built.
 *
 * Loaded with dlopen from the build tree as probe-compare would load it. On a
 * machine without a usable GPU (CI) every entry point must return
 * PROBE_EUNSUPPORTED with a message that names the CUDA call and its error,
 * and never crash; bad arguments are PROBE_EINVAL on any machine (checked
 * before the device is touched). On a machine with a GPU the call succeeds
 * and is compared with the CPU path (the full comparison is
 * tests/gpu/check_device_metrics.c). Skipped when PROBE_CUDA is off.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/device.h"

#ifdef PROBE_CUDA_BUILT
typedef probe_status (*metrics_fn)(probe_dtype, const void *, probe_dtype, const void *, uint64_t,
                                   const probe_metrics_opts *, const probe_channel_spec *, void *,
                                   probe_metrics *, probe_channel_shift *);
typedef probe_status (*source_fn)(int, const probe_pair_source *, const probe_metrics_opts *,
                                  const probe_channel_spec *, probe_metrics *,
                                  probe_channel_shift *);
typedef probe_status (*source_v2_fn)(int, const probe_pair_source *, const probe_metrics_opts *,
                                     const probe_stream_opts *, probe_metrics *,
                                     probe_channel_shift *);
typedef probe_status (*summary_fn)(probe_dtype, const void *, uint64_t, void *, probe_summary *);
typedef int (*abi_fn)(void);

static void *plugin(void)
{
    const char *b = getenv("PROBE_BUILD_DIR");
    cr_assert(b != NULL, "PROBE_BUILD_DIR is not set");
    char path[4096];
    snprintf(path, sizeof path, "%s/lib/libprobe_cuda.so", b);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h != NULL, "dlopen %s: %s", path, dlerror());
    return h;
}

static probe_status src_read(void *ctx, int side, uint64_t off, size_t cnt, void *dst)
{
    const float *x = ctx;
    (void)side;
    memcpy(dst, x + off, cnt * sizeof *x);
    return PROBE_OK;
}

Test(cuda_plugin, abi_and_symbols)
{
    void *h = plugin();
    abi_fn abi = (abi_fn)dlsym(h, "probe_cuda_abi_version");
    cr_assert(abi != NULL);
    cr_assert_eq(abi(), PROBE_CUDA_ABI_VERSION);
    cr_assert(dlsym(h, "probe_cuda_metrics") != NULL);
    cr_assert(dlsym(h, "probe_cuda_metrics_source") != NULL);
    cr_assert(dlsym(h, "probe_cuda_metrics_source_v2") != NULL);
    cr_assert(dlsym(h, "probe_cuda_summary") != NULL);
    /* nothing but the API is exported (no kernels, no CUDA runtime) */
    cr_assert(dlsym(h, "cudaMalloc") == NULL);
}

Test(cuda_plugin, bad_arguments_any_machine)
{
    void *h = plugin();
    metrics_fn m = (metrics_fn)dlsym(h, "probe_cuda_metrics");
    summary_fn su = (summary_fn)dlsym(h, "probe_cuda_summary");
    probe_metrics out;
    probe_metrics_opts o = {1e-3, 1e-3};
    float x[4] = {0};
    cr_assert_eq(m(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, x, 4, &o, NULL, NULL, NULL, NULL),
                 PROBE_EINVAL);
    cr_assert_eq(m(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, x, 4, NULL, NULL, NULL, &out, NULL),
                 PROBE_EINVAL);
    cr_assert_eq(m((probe_dtype)77, x, PROBE_DTYPE_FLOAT32, x, 4, &o, NULL, NULL, &out, NULL),
                 PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "reference element type 77") != NULL, "%s",
              probe_last_error());
    probe_metrics_opts bad = {-1, 0};
    cr_assert_eq(m(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, x, 4, &bad, NULL, NULL, &out, NULL),
                 PROBE_EINVAL);
    probe_channel_spec ch = {3, 1}; /* 3 does not divide 4 */
    cr_assert_eq(m(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, x, 4, &o, &ch, NULL, &out, NULL),
                 PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "do not divide") != NULL, "%s", probe_last_error());
    cr_assert_eq(m(PROBE_DTYPE_FLOAT32, (char *)x + 1, PROBE_DTYPE_FLOAT32, x, 2, &o, NULL, NULL,
                   &out, NULL), PROBE_EINVAL);
    probe_summary s;
    cr_assert_eq(su(PROBE_DTYPE_INVALID, x, 4, NULL, &s), PROBE_EINVAL);
    cr_assert_eq(su(PROBE_DTYPE_FLOAT32, NULL, 4, NULL, &s), PROBE_EINVAL);
    /* the source entry with the CPU engine's options: the same checks */
    source_v2_fn v2 = (source_v2_fn)dlsym(h, "probe_cuda_metrics_source_v2");
    probe_pair_source src = {4, {PROBE_DTYPE_FLOAT32, PROBE_DTYPE_FLOAT32}, src_read, x};
    probe_stream_opts so = {0, {3, 1}, NULL, NULL, NULL};
    probe_channel_shift sh;
    cr_assert_eq(v2(0, &src, &o, &so, &out, &sh), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "probe_cuda_metrics_source_v2: channels 3") != NULL, "%s",
              probe_last_error());
    cr_assert_eq(v2(0, &src, NULL, NULL, &out, NULL), PROBE_EINVAL);
    cr_assert_eq(v2(0, NULL, &o, NULL, &out, NULL), PROBE_EINVAL);
    cr_assert_eq(v2(0, &src, &o, NULL, NULL, NULL), PROBE_EINVAL);
}

/* Without a GPU: PROBE_EUNSUPPORTED and the CUDA message; with one, the
 * metrics of a small host-resident pair read through a source. */
Test(cuda_plugin, no_device_or_source_path)
{
    void *h = plugin();
    metrics_fn m = (metrics_fn)dlsym(h, "probe_cuda_metrics");
    source_fn so = (source_fn)dlsym(h, "probe_cuda_metrics_source");
    summary_fn su = (summary_fn)dlsym(h, "probe_cuda_summary");
    probe_metrics_opts o = {1e-3, 1e-3};
    float x[4] = {1, 2, 3, 4};
    probe_pair_source src = {4, {PROBE_DTYPE_FLOAT32, PROBE_DTYPE_FLOAT32}, src_read, x};
    probe_metrics out;
    probe_status s = so(0, &src, &o, NULL, &out, NULL);
    if (s == PROBE_EUNSUPPORTED) {
        const char *e = probe_last_error();
        cr_assert(strstr(e, "probe_cuda_metrics_source: no usable CUDA device: cudaGetDeviceCount") !=
                  NULL, "message: %s", e);
        fprintf(stderr, "no GPU here: %s\n", e);
        /* the device-pointer entry points say the same (x is not device memory,
         * but the device check comes first) */
        cr_assert_eq(m(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, x, 4, &o, NULL, NULL, &out, NULL),
                     PROBE_EUNSUPPORTED);
        cr_assert(strstr(probe_last_error(), "probe_cuda_metrics: no usable CUDA device") != NULL);
        probe_summary sm;
        cr_assert_eq(su(PROBE_DTYPE_FLOAT32, x, 4, NULL, &sm), PROBE_EUNSUPPORTED);
        cr_assert_eq(out.n, 0); /* outputs zeroed */
        source_v2_fn v2 = (source_v2_fn)dlsym(h, "probe_cuda_metrics_source_v2");
        probe_stream_opts sopt = {0, {2, 2}, NULL, NULL, NULL};
        probe_channel_shift sh = {7, 1, 1, 1, 1, 1, 1};
        cr_assert_eq(v2(0, &src, &o, &sopt, &out, &sh), PROBE_EUNSUPPORTED);
        cr_assert(strstr(probe_last_error(), "probe_cuda_metrics_source_v2: no usable CUDA "
                                             "device") != NULL, "%s", probe_last_error());
        cr_assert(out.n == 0 && sh.count == 0); /* outputs zeroed */
        return;
    }
    cr_assert_eq(s, PROBE_OK, "%s", probe_last_error());
    probe_metrics cpu;
    cr_assert_eq(probe_metrics_compute_typed(PROBE_DTYPE_FLOAT32, x, PROBE_DTYPE_FLOAT32, x, 4, &o,
                                             &cpu), PROBE_OK);
    cr_assert_eq(out.n, 4);
    cr_assert_eq(out.identical, 1);
    cr_assert_eq(out.cosine, 1.0);
    cr_assert_eq(out.p99_abs, 0.0);
    cr_assert_eq(out.norm_ref, cpu.norm_ref);
    /* the per-channel arrays of the v2 entry: channels {1, 2} and {3, 4} */
    source_v2_fn v2 = (source_v2_fn)dlsym(h, "probe_cuda_metrics_source_v2");
    double shift[2], se[2], nk[2];
    probe_stream_opts sopt = {0, {2, 2}, shift, se, nk};
    probe_channel_shift sh;
    cr_assert_eq(v2(0, &src, &o, &sopt, &out, &sh), PROBE_OK, "%s", probe_last_error());
    cr_assert(sh.count == 2 && nk[0] == 2 && nk[1] == 2 && shift[0] == 0 && se[1] == 0);
}
#else
Test(cuda_plugin, not_built)
{
    cr_skip_test("libprobe_cuda.so is not built (PROBE_CUDA=OFF or no CUDA compiler)");
}
#endif
