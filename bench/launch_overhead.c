/* launch_overhead.c - what the kernel log (intercept/hooks/kernels.c) adds to one
 * kernel launch, measured in one process against a direct call into the
 * same library.
 *
 * build:  cc -O2 -std=c11 -D_GNU_SOURCE -o launch_overhead bench/launch_overhead.c -ldl -lpthread
 * run:    probe-run --out /tmp/lo.h5 -- ./launch_overhead CUDART [CUDA] [N]
 *   CUDART: a libcudart.so.13 (tests/fakes/mock_cudart.c built as in
 *   tests/e2e/test_kernels.py: its launch only counts, so the difference is
 *   the hook's cost alone); CUDA: a libcuda.so.1 (tests/fakes/
 *   fake_libcuda.c), or "-" for none.
 *
 * Runtime route: cudaLaunchKernel through the global scope (the shim's hook
 * under probe-run) vs the library's own cudaLaunchKernel (dlsym on its
 * handle, which the shim does not wrap for runtime names; with CUDA given
 * the mock runtime goes on to the driver's cuLaunchKernel, as cudart does,
 * through the shim's wrapper, which must not count it again). Driver route:
 * cuLaunchKernel from dlsym on libcuda's handle (the shim's wrapper under
 * probe-run) vs the real entry point (fake_cuda_launch_entry). N launches
 * each (default 2,000,000), best of 5 rounds, one function, outside any
 * scope. Prints ns/launch for each and the difference. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dim3 {
    unsigned x, y, z;
};
typedef int (*rt_fn)(const void *, struct dim3, struct dim3, void **, size_t, void *);
typedef int (*drv_fn)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                      unsigned, void *, void **, void **);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static char kernel;

static double time_rt(rt_fn f, long n)
{
    struct dim3 g = {1, 1, 1}, b = {32, 1, 1};
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (long i = 0; i < n; i++)
            f(&kernel, g, b, NULL, 0, NULL);
        double dt = (now() - t0) / (double)n;
        best = dt < best ? dt : best;
    }
    return best;
}

static double time_drv(drv_fn f, long n)
{
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (long i = 0; i < n; i++)
            f(&kernel, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        double dt = (now() - t0) / (double)n;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: launch_overhead CUDART [CUDA|-] [N]\n");
        return 2;
    }
    long n = argc > 3 ? atol(argv[3]) : 2000000;
    /* the driver first: the mock runtime launches through it, as cudart does */
    void *drv = argc > 2 && strcmp(argv[2], "-") ? dlopen(argv[2], RTLD_NOW | RTLD_LOCAL) : NULL;
    if (argc > 2 && strcmp(argv[2], "-") && !drv) {
        fprintf(stderr, "launch_overhead: %s\n", dlerror());
        return 2;
    }
    void *rt = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!rt) {
        fprintf(stderr, "launch_overhead: %s\n", dlerror());
        return 2;
    }
    void (*set_name)(const void *, const char *) =
        (void (*)(const void *, const char *))dlsym(rt, "mock_cuda_set_kernel_name");
    if (set_name)
        set_name(&kernel, "_Z6benchv");
    rt_fn hooked = (rt_fn)dlsym(RTLD_DEFAULT, "cudaLaunchKernel");
    rt_fn direct = (rt_fn)dlsym(rt, "cudaLaunchKernel");
    printf("runtime: hooked %s\n", hooked == direct ? "no (not under probe-run)" : "yes");
    double h = time_rt(hooked, n), d = time_rt(direct, n);
    printf("runtime cudaLaunchKernel: %.1f ns/launch through the hook, %.1f direct, +%.1f ns\n", h,
           d, h - d);
    if (drv) {
        void (*set_drv)(const void *, const char *) =
            (void (*)(const void *, const char *))dlsym(drv, "fake_cuda_set_name");
        if (set_drv)
            set_drv(&kernel, "_Z6benchv");
        drv_fn wrapped = (drv_fn)dlsym(drv, "cuLaunchKernel");
        void *(*entry)(void) = (void *(*)(void))dlsym(drv, "fake_cuda_launch_entry");
        drv_fn real = entry ? (drv_fn)entry() : wrapped;
        printf("driver: wrapped %s\n", wrapped == real ? "no" : "yes");
        double hw = time_drv(wrapped, n), dr = time_drv(real, n);
        printf("driver cuLaunchKernel: %.1f ns/launch through the wrapper, %.1f direct, +%.1f ns\n",
               hw, dr, hw - dr);
    }
    return 0;
}
