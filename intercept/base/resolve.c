/* resolve.c - the one real-symbol resolver (base/resolve.h). Every lookup
 * goes through the C library's own dlsym, taken once with dlvsym, so no
 * lookup of the shim passes its exported dlsym and RTLD_NEXT is relative to
 * the shim. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>

#include "base/resolve.h"

const char *const shim_resolve_cudart[] = {"libcudart.so.13", "libcudart.so.12", NULL};
const char *const shim_resolve_cublas[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                                           NULL};
const char *const shim_resolve_cublaslt[] = {"libcublasLt.so.13", "libcublasLt.so.12",
                                             "libcublasLt.so", NULL};
const char *const shim_resolve_nccl[] = {"libnccl.so.2", NULL};
const char *const shim_resolve_driver[] = {"libcuda.so.1", NULL};
const char *const shim_resolve_libstdcxx[] = {"libstdc++.so.6", NULL};

#define NO_SAN __attribute__((no_sanitize("address", "undefined", "thread")))

static _Atomic(shim_dlsym_fn) real_dlsym_p;

static void *dlsym_null(void *h, const char *n)
{
    (void)h;
    (void)n;
    return NULL;
}

NO_SAN shim_dlsym_fn shim_resolve_real_dlsym(void)
{
    shim_dlsym_fn f = atomic_load_explicit(&real_dlsym_p, memory_order_acquire);
    if (f)
        return f;
    f = (shim_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f)
        f = (shim_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!f)
        f = dlsym_null;
    atomic_store_explicit(&real_dlsym_p, f, memory_order_release);
    return f;
}

void *shim_resolve_next(const char *name)
{
    return shim_resolve_real_dlsym()(RTLD_NEXT, name);
}

void *shim_resolve_default(const char *name)
{
    return shim_resolve_real_dlsym()(RTLD_DEFAULT, name);
}

void *shim_resolve_handle(void *handle, const char *name)
{
    return shim_resolve_real_dlsym()(handle, name);
}

void *shim_resolve_in(const char *name, const char *const *sonames, const char **soname)
{
    for (size_t i = 0; sonames && sonames[i]; ++i) {
        void *h = dlopen(sonames[i], RTLD_NOLOAD | RTLD_LAZY);
        if (!h)
            continue;
        void *p = shim_resolve_real_dlsym()(h, name);
        dlclose(h); /* NOLOAD took a reference: drop it, the library stays */
        if (p) {
            if (soname)
                *soname = sonames[i];
            return p;
        }
    }
    return NULL;
}

int shim_resolve_loaded(const char *soname)
{
    void *h = dlopen(soname, RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return 0;
    dlclose(h);
    return 1;
}

void *shim_resolve(const char *name, const char *const *sonames)
{
    void *p = shim_resolve_next(name);
    return p ? p : shim_resolve_in(name, sonames, NULL);
}
