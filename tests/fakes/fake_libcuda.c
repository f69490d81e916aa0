/* fake_libcuda.c - a CPU stand-in for the CUDA driver's launch entry points,
 * built by tests/e2e/test_kernels.py as libcuda.so.1 (the real soname, so
 * the shim's dlopen("libcuda.so.1", RTLD_NOLOAD) finds it) and loaded by
 * tests/programs/shim_kernels.c the way cudart and Triton load the driver.
 *
 * CUfunction values are any pointers: cuFuncGetName answers the names set
 * with fake_cuda_set_name and fails (CUDA_ERROR_INVALID_HANDLE, 400) for
 * others; cuKernelGetName answers those set with fake_cuda_set_kernel_name
 * (CUkernel handles) and fails for others (fake_cuda_name_queries counts
 * cuFuncGetName calls only). cuGetProcAddress[_v2] returns the entry points below for
 * "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
 * "cuGetProcAddress" and "cuFuncGetName" (with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2 in flags: the _ptsz
 * launches, which are distinct functions, as in the real driver).
 * Signatures and values: cuda.h (CUDA 13). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
typedef int CUresult;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const void *f;
    char name[256];
} names[64];
static int nnames;
static atomic_llong launches[4]; /* legacy, ptsz, ex, cooperative */
static atomic_llong name_queries;

/* cuFuncGetName calls so far. */
EXPORT long long fake_cuda_name_queries(void)
{
    return name_queries;
}

EXPORT void fake_cuda_set_name(const void *f, const char *name)
{
    pthread_mutex_lock(&lock);
    if (nnames < 64) {
        names[nnames].f = f;
        snprintf(names[nnames].name, sizeof names[nnames].name, "%s", name);
        nnames++;
    }
    pthread_mutex_unlock(&lock);
}

EXPORT long long fake_cuda_launches(int which)
{
    return which >= 0 && which < 4 ? launches[which] : -1;
}

EXPORT CUresult cuFuncGetName(const char **name, const void *f)
{
    CUresult r = 400;
    name_queries++;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nnames; i++)
        if (names[i].f == f) {
            *name = names[i].name;
            r = 0;
        }
    pthread_mutex_unlock(&lock);
    return r;
}

/* CUkernel handles (a CUDA library's kernels: what nvcc 13's
 * __cudaLaunchKernel passes and cuLaunchKernel accepts): named by
 * cuKernelGetName only; cuFuncGetName refuses them, as the real driver does. */
static struct {
    const void *k;
    char name[256];
} knames[16];
static int nknames;

EXPORT void fake_cuda_set_kernel_name(const void *k, const char *name)
{
    pthread_mutex_lock(&lock);
    if (nknames < 16) {
        knames[nknames].k = k;
        snprintf(knames[nknames].name, sizeof knames[nknames].name, "%s", name);
        nknames++;
    }
    pthread_mutex_unlock(&lock);
}

EXPORT CUresult cuKernelGetName(const char **name, const void *k)
{
    CUresult r = 400;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nknames; i++)
        if (knames[i].k == k) {
            *name = knames[i].name;
            r = 0;
        }
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT CUresult cuLaunchKernel(const void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned sh, void *st, void **p, void **e)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)sh, (void)st;
    (void)p, (void)e;
    launches[0]++;
    return gx == 0 ? 1 : 0; /* CUDA_ERROR_INVALID_VALUE for an empty grid: results pass through */
}

EXPORT CUresult cuLaunchKernel_ptsz(const void *f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned sh, void *st,
                                    void **p, void **e)
{
    (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)sh, (void)st, (void)p, (void)e;
    launches[1]++;
    return gx == 0 ? 1 : 0;
}

EXPORT CUresult cuLaunchKernelEx(const void *cfg, const void *f, void **p, void **e)
{
    (void)f, (void)p, (void)e;
    launches[2]++;
    return cfg ? 0 : 1;
}

EXPORT CUresult cuLaunchCooperativeKernel(const void *f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned sh,
                                          void *st, void **p)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)sh, (void)st, (void)p;
    launches[3]++;
    return 0;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags,
                                    int *status);

/* The real cuLaunchKernel, not through dlsym (bench/launch_overhead.c). */
EXPORT void *fake_cuda_launch_entry(void)
{
    return (void *)cuLaunchKernel;
}

static void *lookup(const char *sym, unsigned long long flags)
{
    int ptsz = (flags & 2) != 0;
    if (!strcmp(sym, "cuLaunchKernel"))
        return ptsz ? (void *)cuLaunchKernel_ptsz : (void *)cuLaunchKernel;
    if (!strcmp(sym, "cuLaunchKernelEx"))
        return (void *)cuLaunchKernelEx;
    if (!strcmp(sym, "cuLaunchCooperativeKernel"))
        return (void *)cuLaunchCooperativeKernel;
    if (!strcmp(sym, "cuGetProcAddress"))
        return (void *)cuGetProcAddress_v2;
    if (!strcmp(sym, "cuFuncGetName"))
        return (void *)cuFuncGetName;
    return NULL;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags,
                                    int *status)
{
    (void)ver;
    *pfn = lookup(sym, flags);
    if (status)
        *status = *pfn ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / _SYMBOL_NOT_FOUND */
    return *pfn ? 0 : 500;      /* CUDA_ERROR_NOT_FOUND */
}

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags)
{
    (void)ver;
    *pfn = lookup(sym, flags);
    return *pfn ? 0 : 500;
}
