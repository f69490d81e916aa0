/* interpose_overhead.c - what the preloaded shim adds to a cuBLAS call that
 * captures nothing (docs/gemm.md "Overhead"; goal: under 100 ns).
 *
 * usage: interpose_overhead FAKE_LIBCUBLAS [CALLS]   (run by
 * bench/interpose_overhead.sh under LD_PRELOAD=libprobe_intercept.so with
 * PROBE_OUT set and the default selection '*', which never selects GEMM
 * operands)
 *
 * The fake libcublas.so.13 (tests/fakes/fake_cublas.c) is loaded RTLD_LOCAL,
 * as torch loads cuBLAS. In the same process it times CALLS calls of
 * cublasSgemm_v2 with m = n = k = 0 (the fake does no arithmetic):
 *   direct   through the pointer dlsym(handle) returns (the library itself)
 *   shim     through dlsym(RTLD_DEFAULT), the preloaded shim's hook, which
 *            counts the call by signature, takes its GEMM index and forwards
 * alternating in 10 rounds, and prints the median ns per call of each, the
 * difference and the ratio. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*sgemm_fn)(void *, int, int, int, int, int, const float *, const float *, int,
                        const float *, int, const float *, float *, int);

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static double per_call(sgemm_fn f, void *h, long n)
{
    float a = 0, b = 0, c = 0, alpha = 1, beta = 0;
    double t0 = now_ns();
    for (long i = 0; i < n; ++i)
        if (f(h, 0, 0, 0, 0, 0, &alpha, &a, 1, &b, 1, &beta, &c, 1) != 0)
            return -1;
    return (now_ns() - t0) / (double)n;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FAKE_LIBCUBLAS [CALLS]\n", argv[0]);
        return 2;
    }
    long n = argc > 2 ? atol(argv[2]) : 1000000;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "interpose_overhead: %s\n", dlerror());
        return 2;
    }
    sgemm_fn direct = (sgemm_fn)dlsym(lib, "cublasSgemm_v2");
    sgemm_fn shim = (sgemm_fn)dlsym(RTLD_DEFAULT, "cublasSgemm_v2");
    int (*create)(void **) = (int (*)(void **))dlsym(lib, "cublasCreate_v2");
    if (!direct || !shim || !create || shim == direct) {
        fprintf(stderr, "interpose_overhead: the shim's cublasSgemm_v2 is not preloaded\n");
        return 2;
    }
    void *h;
    create(&h);
    per_call(direct, h, n / 10); /* warm up both paths (lazy resolution) */
    per_call(shim, h, n / 10);
    double d[10], s[10];
    for (int r = 0; r < 10; ++r) {
        d[r] = per_call(direct, h, n);
        s[r] = per_call(shim, h, n);
        if (d[r] < 0 || s[r] < 0) {
            fprintf(stderr, "interpose_overhead: a call failed\n");
            return 1;
        }
    }
    qsort(d, 10, sizeof *d, cmp);
    qsort(s, 10, sizeof *s, cmp);
    double dm = (d[4] + d[5]) / 2, sm = (s[4] + s[5]) / 2;
    printf("cublasSgemm_v2, nothing selected, %ld calls x 10 rounds (medians)\n", n);
    printf("  direct  %8.1f ns/call\n  shim    %8.1f ns/call\n", dm, sm);
    printf("  added   %8.1f ns/call (goal < 100)   ratio %.2f\n", sm - dm, sm / dm);
    return 0;
}
