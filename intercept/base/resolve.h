/* intercept/base/resolve.h - the one real-symbol resolver: the definition of
 * a function the process already loaded (the CUDA runtime, cuBLAS, NCCL, the
 * C library's own), found without loading any library and without going
 * through the shim's exported dlsym (hooks/dlsym_x86_64.S). */
#ifndef PROBE_INTERCEPT_BASE_RESOLVE_H
#define PROBE_INTERCEPT_BASE_RESOLVE_H

/* Sonames, each list NULL-terminated, newest first. */
extern const char *const shim_resolve_cudart[];   /* libcudart.so.13, .so.12 */
extern const char *const shim_resolve_cublas[];   /* libcublas.so.13, .so.12, .so */
extern const char *const shim_resolve_cublaslt[]; /* libcublasLt.so.13, .so.12, .so */
extern const char *const shim_resolve_nccl[];     /* libnccl.so.2 */
extern const char *const shim_resolve_driver[];   /* libcuda.so.1 */
extern const char *const shim_resolve_libstdcxx[]; /* libstdc++.so.6 */

/* 1 while the library soname is loaded (dlopen with RTLD_NOLOAD). */
int shim_resolve_loaded(const char *soname);

/* The next definition of name after the shim (dlsym(RTLD_NEXT)), else the
 * one in the first library of sonames (NULL: none) that is already loaded
 * (dlopen with RTLD_NOLOAD: it also finds a library that torch loaded
 * RTLD_LOCAL, which RTLD_NEXT does not see). NULL when neither has it. */
void *shim_resolve(const char *name, const char *const *sonames);
/* Only the first library of sonames that is loaded and defines name;
 * *soname (when not NULL) gets that library's soname. NULL if none. */
void *shim_resolve_in(const char *name, const char *const *sonames, const char **soname);
/* dlsym(RTLD_NEXT, name) relative to the shim. */
void *shim_resolve_next(const char *name);
/* dlsym(RTLD_DEFAULT, name): the global scope (also an executable that
 * links a library statically). */
void *shim_resolve_default(const char *name);
/* dlsym(handle, name) on a handle the caller opened. */
void *shim_resolve_handle(void *handle, const char *name);

/* The C library's dlsym (the definition after the shim's own exported one),
 * never NULL (a stub returning NULL when glibc has neither version). Safe
 * before any initialization: no sanitizer instrumentation, no libc string
 * call. */
typedef void *(*shim_dlsym_fn)(void *, const char *);
shim_dlsym_fn shim_resolve_real_dlsym(void);

#endif
