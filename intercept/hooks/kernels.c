/* kernels.c - kernel-path evidence: every kernel launch, by name and count,
 * per component scope (docs/kernels.md).
 *
 * Runtime launches: the exported hooks __cudaLaunchKernel[_ptsz] (what nvcc
 * 13 host code calls, with a cudaKernel_t), cudaLaunchKernel[_ptsz] and
 * cudaLaunchKernelExC[_ptsz] (signatures: crt/device_functions.h and
 * cuda_runtime_api.h, CUDA 13) count the launch and forward every argument
 * to the runtime the process loaded (dlsym(RTLD_NEXT), else the
 * libcudart.so.13/.12 already mapped). The name comes from cudaFuncGetName.
 *
 * Driver launches (cuLaunchKernel[Ex][_ptsz], cuLaunchCooperativeKernel
 * [_ptsz]: cuBLASLt, Triton, NVRTC/jiterator) are never called through a
 * PLT: libraries fetch them with dlsym (from libcuda.so.1) or with
 * cuGetProcAddress, which cudart itself fetches with dlsym. So the shim
 * exports dlsym (dlsym_x86_64.S: a trampoline that keeps RTLD_NEXT exact)
 * and wraps the results for cuGetProcAddress[_v2] and the launch names; the
 * wrapped cuGetProcAddress wraps the launch entry points it returns, and the
 * runtime's cudaGetDriverEntryPoint[ByVersion][_ptsz] are hooked the same
 * way. A wrapper for a driver function is one of SLOTS fixed functions per
 * signature, each bound to one real pointer (different versions/flags can
 * return different real functions); when the slots are used up the real
 * pointer is returned unwrapped (one warning). The name comes from
 * cuFuncGetName (libcuda.so.1, CUDA >= 12.3). When the runtime's or the
 * driver's function query refuses the handle, it is a CUkernel (nvcc 13's
 * __cudaLaunchKernel passes one; cuLaunchKernel accepts one) and
 * cuKernelGetName names it.
 *
 * A runtime launch reaches the driver hook too (cudart launches through its
 * cuGetProcAddress table): a thread-local depth counts it once. Nothing is
 * counted, and CUDA is never called, in a process that does not capture
 * (PROBE_OUT unset, a forked child, another process owns the file) or with
 * PROBE_KERNELS=0.
 *
 * Cost of a launch: the thread's scope (shim_scope_current), a per-thread
 * cache of the component's index, and one lookup in a read-mostly open-
 * addressing table of atomic counters keyed by (component, function); the
 * first launch of a function takes a mutex (never held across a CUDA call)
 * and queries its name once. bench/launch_overhead.c measures it.
 *
 * Bounds: COMPONENTS_MAX components (later ones count as "(other)"),
 * PER_COMPONENT_MAX functions per component and COUNTERS_MAX in all; the
 * launches beyond them are counted per component as "unnamed_launches".
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cudart.h"
#include "base/json.h"
#include "base/resolve.h"
#include "base/shim.h"
#include "capture/scope.h"
#include "hooks/kernels.h"

struct kdim3 {
    unsigned x, y, z;
};

#define COMPONENTS_MAX 256
#define PER_COMPONENT_MAX 2048
#define COUNTERS_BITS 15
#define COUNTERS_MAX (1u << COUNTERS_BITS)
#define NAMES_BITS 14
#define NAMES_MAX (1u << NAMES_BITS)
#define SLOTS 8

enum { ROUTE_RUNTIME = 1, ROUTE_DRIVER = 2 };

/* ---- configuration --------------------------------------------------------- */

static atomic_int k_enabled = -1; /* -1 not read yet, 0 off, 1 on */

/* 1 when kernel logging is asked for: PROBE_OUT set and PROBE_KERNELS not
 * "0". Read from the environment (not shim_cfg) because dlsym may be called
 * before the shim's constructor ran. */
static int kernels_enabled(void)
{
    int e = atomic_load_explicit(&k_enabled, memory_order_relaxed);
    if (e >= 0)
        return e;
    const char *out = getenv("PROBE_OUT"), *k = getenv("PROBE_KERNELS");
    e = out && *out && !(k && strcmp(k, "0") == 0);
    atomic_store(&k_enabled, e);
    return e;
}

/* 1 when this launch is counted: logging on and this process captures. */
static int counting(void)
{
    return kernels_enabled() && shim_cfg.mode == SHIM_OWNER && !shim_is_foreign_process();
}

/* ---- components ------------------------------------------------------------ */

static pthread_mutex_t k_lock = PTHREAD_MUTEX_INITIALIZER;
static char comp_names[COMPONENTS_MAX][SHIM_NAME_MAX];
static atomic_uint ncomps;
static atomic_uint comp_funcs[COMPONENTS_MAX];      /* distinct functions counted */
static atomic_ullong comp_unnamed[COMPONENTS_MAX];  /* launches beyond the bounds */

static __thread char tls_comp[SHIM_NAME_MAX];
static __thread unsigned tls_comp_id;
static __thread int tls_comp_valid;

int shim_kernels_recorded(void)
{
    return atomic_load(&ncomps) > 0;
}

/* Index of component name (interned on first use). */
static unsigned comp_id(const char *name)
{
    if (tls_comp_valid && strcmp(tls_comp, name) == 0)
        return tls_comp_id;
    unsigned n = atomic_load_explicit(&ncomps, memory_order_acquire), id = COMPONENTS_MAX;
    for (unsigned i = 0; i < n; ++i)
        if (strcmp(comp_names[i], name) == 0) {
            id = i;
            break;
        }
    if (id == COMPONENTS_MAX) {
        pthread_mutex_lock(&k_lock);
        n = atomic_load(&ncomps);
        for (unsigned i = 0; i < n && id == COMPONENTS_MAX; ++i)
            if (strcmp(comp_names[i], name) == 0)
                id = i;
        if (id == COMPONENTS_MAX) {
            if (n < COMPONENTS_MAX - 1) {
                snprintf(comp_names[n], SHIM_NAME_MAX, "%s", name);
                id = n;
                atomic_store_explicit(&ncomps, n + 1, memory_order_release);
            } else {
                /* the last index is "(other)" */
                if (n == COMPONENTS_MAX - 1) {
                    snprintf(comp_names[n], SHIM_NAME_MAX, "(other)");
                    atomic_store_explicit(&ncomps, COMPONENTS_MAX, memory_order_release);
                }
                id = COMPONENTS_MAX - 1;
            }
        }
        pthread_mutex_unlock(&k_lock);
    }
    snprintf(tls_comp, sizeof tls_comp, "%s", name);
    tls_comp_id = id;
    tls_comp_valid = 1;
    return id;
}

/* ---- names: (route, function) -> name ------------------------------------- */

struct name_slot {
    atomic_int ready;
    int route;
    const void *func;
    char *name; /* malloc'd mangled name */
};
static struct name_slot names[NAMES_MAX];
static unsigned nnames;

struct counter_slot {
    atomic_int ready;
    unsigned comp;
    int route;
    const void *func;
    unsigned name; /* index into names */
    atomic_ullong count;
};
static struct counter_slot counters[COUNTERS_MAX];
static unsigned ncounters;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Probe for (route, func); returns the slot index, or the first empty one
 * with *found = 0. NAMES_MAX when full. */
static unsigned name_find(int route, const void *func, int *found)
{
    unsigned h = (unsigned)mix((uintptr_t)func * 4 + (unsigned)route) & (NAMES_MAX - 1);
    for (unsigned i = 0; i < NAMES_MAX; ++i, h = (h + 1) & (NAMES_MAX - 1)) {
        struct name_slot *s = &names[h];
        if (!atomic_load_explicit(&s->ready, memory_order_acquire)) {
            *found = 0;
            return h;
        }
        if (s->func == func && s->route == route) {
            *found = 1;
            return h;
        }
    }
    *found = 0;
    return NAMES_MAX;
}

static unsigned counter_find(unsigned comp, int route, const void *func, int *found)
{
    unsigned h = (unsigned)mix(((uintptr_t)func * 4 + (unsigned)route) ^ ((uint64_t)comp << 48)) &
                 (COUNTERS_MAX - 1);
    for (unsigned i = 0; i < COUNTERS_MAX; ++i, h = (h + 1) & (COUNTERS_MAX - 1)) {
        struct counter_slot *s = &counters[h];
        if (!atomic_load_explicit(&s->ready, memory_order_acquire)) {
            *found = 0;
            return h;
        }
        if (s->func == func && s->comp == comp && s->route == route) {
            *found = 1;
            return h;
        }
    }
    *found = 0;
    return COUNTERS_MAX;
}

static void *cudart_sym(const char *name)
{
    return shim_resolve(name, shim_resolve_cudart);
}

/* ---- name queries (the only CUDA calls made here) ---------------------------- */

static void *driver_sym(const char *name)
{
    return shim_resolve_in(name, shim_resolve_driver, NULL);
}

#define LAZY(var, resolver, name)                                                                  \
    static _Atomic(void *) var##_p;                                                                \
    void *var = atomic_load_explicit(&var##_p, memory_order_acquire);                              \
    if (!var) {                                                                                    \
        var = resolver(name);                                                                      \
        atomic_store_explicit(&var##_p, var, memory_order_release);                                \
    }

/* The mangled name of func (malloc'd), or NULL with *retry = 1 when it
 * cannot be asked now (an earlier error is pending: asked again at the next
 * launch) or *retry = 0 when the query failed (the function stays unnamed,
 * never asked again). A runtime query never leaves an error
 * behind: it is skipped while an earlier error is pending
 * (cudaPeekAtLastError), and its own failure is popped with
 * cudaGetLastError, so the program's next cudaGetLastError sees what it
 * would have seen without probe. */
static char *query_name(int route, const void *func, int *retry)
{
    const char *n = NULL;
    *retry = 0;
    if (route == ROUTE_RUNTIME) {
        LAZY(get_name, cudart_sym, "cudaFuncGetName");
        LAZY(peek, cudart_sym, "cudaPeekAtLastError");
        LAZY(pop, cudart_sym, "cudaGetLastError");
        if (!get_name || !peek || !pop)
            return NULL;
        if (((cudaError_t (*)(void))peek)() != 0) {
            *retry = 1;
            return NULL;
        }
        if (((cudaError_t (*)(const char **, const void *))get_name)(&n, func) != 0) {
            ((cudaError_t (*)(void))pop)();
            n = NULL;
        }
    } else {
        LAZY(get_name, driver_sym, "cuFuncGetName");
        if (get_name && ((CUresult (*)(const char **, const void *))get_name)(&n, func) != 0)
            n = NULL;
    }
    if (!n) {
        /* A CUkernel (cudaKernel_t: what nvcc 13's __cudaLaunchKernel passes,
         * and what cuLaunchKernel also accepts since CUDA 12.0) is not a
         * CUfunction: cuFuncGetName/cudaFuncGetName refuse it, cuKernelGetName
         * (CUDA >= 12.3) names it. The driver's calls leave no error state. */
        LAZY(kernel_name, driver_sym, "cuKernelGetName");
        if (!kernel_name || ((CUresult (*)(const char **, const void *))kernel_name)(&n, func) != 0)
            return NULL;
    }
    char *copy = n ? strdup(n) : NULL;
    *retry = n && !copy; /* out of memory: ask again later */
    return copy;
}

/* ---- counting ---------------------------------------------------------------- */

static __thread int in_launch; /* depth of launch hooks on this thread */

/* Count one launch of func (route says which name query applies). */
static void count_launch(int route, const void *func)
{
    struct shim_scope sc;
    shim_scope_current(&sc);
    unsigned comp = comp_id(sc.component[0] ? sc.component : "(none)");
    int found;
    unsigned c = counter_find(comp, route, func, &found);
    if (found) {
        atomic_fetch_add_explicit(&counters[c].count, 1, memory_order_relaxed);
        return;
    }
    /* First launch of func in this component. */
    unsigned ni = name_find(route, func, &found);
    if (!found) {
        int retry;
        char *name = query_name(route, func, &retry); /* outside the lock */
        if (!name && retry) {
            atomic_fetch_add(&comp_unnamed[comp], 1);
            return;
        }
        /* a failed query is kept as a NULL name: counted unnamed, never asked again */
        pthread_mutex_lock(&k_lock);
        ni = name_find(route, func, &found);
        if (!found && ni < NAMES_MAX && nnames < NAMES_MAX * 3 / 4) {
            names[ni].route = route;
            names[ni].func = func;
            names[ni].name = name;
            name = NULL;
            ++nnames;
            atomic_store_explicit(&names[ni].ready, 1, memory_order_release);
            found = 1;
        }
        pthread_mutex_unlock(&k_lock);
        free(name);
        if (!found) {
            atomic_fetch_add(&comp_unnamed[comp], 1);
            return;
        }
    }
    if (!names[ni].name) {
        atomic_fetch_add(&comp_unnamed[comp], 1);
        return;
    }
    pthread_mutex_lock(&k_lock);
    c = counter_find(comp, route, func, &found);
    if (!found && c < COUNTERS_MAX && ncounters < COUNTERS_MAX * 3 / 4 &&
        atomic_load(&comp_funcs[comp]) < PER_COMPONENT_MAX) {
        counters[c].comp = comp;
        counters[c].route = route;
        counters[c].func = func;
        counters[c].name = ni;
        atomic_store(&counters[c].count, 0);
        ++ncounters;
        atomic_fetch_add(&comp_funcs[comp], 1);
        atomic_store_explicit(&counters[c].ready, 1, memory_order_release);
        found = 1;
    }
    if (found)
        atomic_fetch_add_explicit(&counters[c].count, 1, memory_order_relaxed);
    else
        atomic_fetch_add(&comp_unnamed[comp], 1);
    pthread_mutex_unlock(&k_lock);
}

/* Enter a launch hook: 1 when this launch is to be counted (outermost hook,
 * logging on); the caller then calls leave(). */
static void enter(int route, const void *func)
{
    if (in_launch++ == 0 && !shim_own_gpu_work && counting())
        count_launch(route, func);
}

static void leave(void)
{
    --in_launch;
}

/* ---- runtime hooks ------------------------------------------------------------- */

#define RUNTIME_LAUNCH(hook, first_t)                                                              \
    SHIM_EXPORT cudaError_t hook(first_t func, struct kdim3 grid, struct kdim3 block, void **args,  \
                                 size_t shmem, void *stream)                                       \
    {                                                                                              \
        LAZY(real, cudart_sym, #hook);                                                            \
        if (!real)                                                                                 \
            return 999; /* cudaErrorUnknown: no runtime loaded */                                  \
        enter(ROUTE_RUNTIME, (const void *)func);                                                  \
        cudaError_t r = ((cudaError_t (*)(first_t, struct kdim3, struct kdim3, void **, size_t,     \
                                          void *))real)(func, grid, block, args, shmem, stream);   \
        leave();                                                                                   \
        return r;                                                                                  \
    }

RUNTIME_LAUNCH(__cudaLaunchKernel, void *)
RUNTIME_LAUNCH(__cudaLaunchKernel_ptsz, void *)
RUNTIME_LAUNCH(cudaLaunchKernel, const void *)
RUNTIME_LAUNCH(cudaLaunchKernel_ptsz, const void *)

#define RUNTIME_LAUNCH_EX(hook)                                                                    \
    SHIM_EXPORT cudaError_t hook(const void *config, const void *func, void **args)                \
    {                                                                                              \
        LAZY(real, cudart_sym, #hook);                                                            \
        if (!real)                                                                                 \
            return 999;                                                                            \
        enter(ROUTE_RUNTIME, func);                                                                \
        cudaError_t r =                                                                            \
            ((cudaError_t (*)(const void *, const void *, void **))real)(config, func, args);      \
        leave();                                                                                   \
        return r;                                                                                  \
    }

RUNTIME_LAUNCH_EX(cudaLaunchKernelExC)
RUNTIME_LAUNCH_EX(cudaLaunchKernelExC_ptsz)

/* ---- driver wrappers -------------------------------------------------------------- */

enum kind { K_LAUNCH, K_LAUNCH_EX, K_COOP, K_GPA, K_GPA2, K_NKINDS };

static _Atomic(void *) real_of[K_NKINDS][SLOTS];
static atomic_int slots_full_warned;

typedef CUresult (*launch_fn)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, void *, void **, void **);
typedef CUresult (*launch_ex_fn)(const void *, const void *, void **, void **);
typedef CUresult (*coop_fn)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, void *, void **);
typedef CUresult (*gpa_fn)(const char *, void **, int, unsigned long long);
typedef CUresult (*gpa2_fn)(const char *, void **, int, unsigned long long, void *);

static void *wrap(enum kind k, void *real);
static void *wrap_symbol(const char *symbol, void *real, int version);

/* A driver launch (the CUfunction is the first argument, or the second of
 * cuLaunchKernelEx). */
static void driver_enter(const void *f)
{
    enter(ROUTE_DRIVER, f);
}

#define DEF_SLOT(i)                                                                                \
    static CUresult launch_##i(const void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,  \
                               unsigned by, unsigned bz, unsigned sh, void *st, void **p, void **e) \
    {                                                                                              \
        launch_fn real = (launch_fn)atomic_load(&real_of[K_LAUNCH][i]);                             \
        driver_enter(f);                                                                           \
        CUresult r = real(f, gx, gy, gz, bx, by, bz, sh, st, p, e);                                \
        leave();                                                                                   \
        return r;                                                                                  \
    }                                                                                              \
    static CUresult launch_ex_##i(const void *cfg, const void *f, void **p, void **e)              \
    {                                                                                              \
        launch_ex_fn real = (launch_ex_fn)atomic_load(&real_of[K_LAUNCH_EX][i]);                    \
        driver_enter(f);                                                                           \
        CUresult r = real(cfg, f, p, e);                                                           \
        leave();                                                                                   \
        return r;                                                                                  \
    }                                                                                              \
    static CUresult coop_##i(const void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,    \
                             unsigned by, unsigned bz, unsigned sh, void *st, void **p)            \
    {                                                                                              \
        coop_fn real = (coop_fn)atomic_load(&real_of[K_COOP][i]);                                   \
        driver_enter(f);                                                                           \
        CUresult r = real(f, gx, gy, gz, bx, by, bz, sh, st, p);                                   \
        leave();                                                                                   \
        return r;                                                                                  \
    }                                                                                              \
    static CUresult gpa_##i(const char *sym, void **pfn, int ver, unsigned long long flags)        \
    {                                                                                              \
        gpa_fn real = (gpa_fn)atomic_load(&real_of[K_GPA][i]);                                      \
        CUresult r = real(sym, pfn, ver, flags);                                                   \
        if (r == 0 && pfn && *pfn && sym)                                                          \
            *pfn = wrap_symbol(sym, *pfn, ver);                                                    \
        return r;                                                                                  \
    }                                                                                              \
    static CUresult gpa2_##i(const char *sym, void **pfn, int ver, unsigned long long flags,       \
                             void *status)                                                         \
    {                                                                                              \
        gpa2_fn real = (gpa2_fn)atomic_load(&real_of[K_GPA2][i]);                                   \
        CUresult r = real(sym, pfn, ver, flags, status);                                           \
        if (r == 0 && pfn && *pfn && sym)                                                          \
            *pfn = wrap_symbol(sym, *pfn, ver);                                                    \
        return r;                                                                                  \
    }

DEF_SLOT(0)
DEF_SLOT(1)
DEF_SLOT(2)
DEF_SLOT(3)
DEF_SLOT(4)
DEF_SLOT(5)
DEF_SLOT(6)
DEF_SLOT(7)

#define ROW(name) {(void *)name##_0, (void *)name##_1, (void *)name##_2, (void *)name##_3,            \
                   (void *)name##_4, (void *)name##_5, (void *)name##_6, (void *)name##_7}
static void *const wrappers[K_NKINDS][SLOTS] = {ROW(launch), ROW(launch_ex), ROW(coop), ROW(gpa),
                                                ROW(gpa2)};

/* The wrapper bound to real (binding a free slot), real itself when it is
 * already a wrapper, or when every slot of that kind is taken (one warning). */
static void *wrap(enum kind k, void *real)
{
    for (int j = 0; j < K_NKINDS; ++j)
        for (int i = 0; i < SLOTS; ++i)
            if (wrappers[j][i] == real)
                return real;
    for (int i = 0; i < SLOTS; ++i) {
        void *cur = atomic_load(&real_of[k][i]);
        if (cur == real)
            return wrappers[k][i];
        if (!cur) {
            void *expected = NULL;
            if (atomic_compare_exchange_strong(&real_of[k][i], &expected, real))
                return wrappers[k][i];
            if (expected == real)
                return wrappers[k][i];
        }
    }
    if (!atomic_exchange(&slots_full_warned, 1))
        shim_warn("kernel log: more than %d distinct driver entry points of one kind; later ones "
                  "are not counted", SLOTS);
    return real;
}

/* Which wrapper kind a driver symbol name needs (-1: not wrapped). version:
 * the cudaVersion asked of cuGetProcAddress (decides whether
 * "cuGetProcAddress" is the 4- or 5-argument form), or -1 for dlsym's exact
 * exported names. */
static int kind_of(const char *s, int version)
{
    if (!strcmp(s, "cuLaunchKernel") || !strcmp(s, "cuLaunchKernel_ptsz"))
        return K_LAUNCH;
    if (!strcmp(s, "cuLaunchKernelEx") || !strcmp(s, "cuLaunchKernelEx_ptsz"))
        return K_LAUNCH_EX;
    if (!strcmp(s, "cuLaunchCooperativeKernel") || !strcmp(s, "cuLaunchCooperativeKernel_ptsz"))
        return K_COOP;
    if (!strcmp(s, "cuGetProcAddress_v2"))
        return K_GPA2;
    if (!strcmp(s, "cuGetProcAddress"))
        return version >= 12000 ? K_GPA2 : K_GPA;
    return -1;
}

static void *wrap_symbol(const char *symbol, void *real, int version)
{
    int k = kind_of(symbol, version);
    if (k < 0 || !kernels_enabled())
        return real;
    return wrap((enum kind)k, real);
}

/* ---- dlsym ------------------------------------------------------------------------ */

#define NO_SAN __attribute__((no_sanitize("address", "undefined", "thread")))

/* dlsym for the names probe wraps (any handle but RTLD_NEXT). */
void *shim_dlsym_wrap(void *handle, const char *name);
void *shim_dlsym_wrap(void *handle, const char *name)
{
    void *p = shim_resolve_real_dlsym()(handle, name);
    if (p)
        p = wrap_symbol(name, p, -1);
    return p;
}

NO_SAN static int eq(const char *a, const char *b)
{
    while (*a && *a == *b)
        ++a, ++b;
    return *a == *b;
}

/* Where the exported dlsym (dlsym_x86_64.S) jumps: the real dlsym, or
 * shim_dlsym_wrap for the driver entry points probe wraps. Runs before
 * anything is initialized (no sanitizer instrumentation, no libc string
 * calls). */
void *shim_dlsym_route(void *handle, const char *name);
NO_SAN void *shim_dlsym_route(void *handle, const char *name)
{
    if (handle != RTLD_NEXT && name && name[0] == 'c' && name[1] == 'u' &&
        (name[2] == 'L' || name[2] == 'G') &&
        (eq(name, "cuGetProcAddress") || eq(name, "cuGetProcAddress_v2") ||
         eq(name, "cuLaunchKernel") || eq(name, "cuLaunchKernel_ptsz") ||
         eq(name, "cuLaunchKernelEx") || eq(name, "cuLaunchKernelEx_ptsz") ||
         eq(name, "cuLaunchCooperativeKernel") || eq(name, "cuLaunchCooperativeKernel_ptsz")))
        return (void *)shim_dlsym_wrap;
    return (void *)shim_resolve_real_dlsym();
}

/* ---- runtime driver entry points ------------------------------------------------ */

#define ENTRY_POINT(hook)                                                                          \
    SHIM_EXPORT cudaError_t hook(const char *sym, void **pfn, unsigned long long flags,            \
                                 void *status)                                                     \
    {                                                                                              \
        LAZY(real, cudart_sym, #hook);                                                            \
        if (!real)                                                                                 \
            return 999;                                                                            \
        cudaError_t r = ((cudaError_t (*)(const char *, void **, unsigned long long, void *))real)( \
            sym, pfn, flags, status);                                                              \
        if (r == 0 && sym && pfn && *pfn)                                                          \
            *pfn = wrap_symbol(sym, *pfn, 12000);                                                  \
        return r;                                                                                  \
    }

ENTRY_POINT(cudaGetDriverEntryPoint)
ENTRY_POINT(cudaGetDriverEntryPoint_ptsz)

#define ENTRY_POINT_V(hook)                                                                        \
    SHIM_EXPORT cudaError_t hook(const char *sym, void **pfn, unsigned ver,                        \
                                 unsigned long long flags, void *status)                           \
    {                                                                                              \
        LAZY(real, cudart_sym, #hook);                                                            \
        if (!real)                                                                                 \
            return 999;                                                                            \
        cudaError_t r = ((cudaError_t (*)(const char *, void **, unsigned, unsigned long long,      \
                                          void *))real)(sym, pfn, ver, flags, status);             \
        if (r == 0 && sym && pfn && *pfn)                                                          \
            *pfn = wrap_symbol(sym, *pfn, (int)ver);                                               \
        return r;                                                                                  \
    }

ENTRY_POINT_V(cudaGetDriverEntryPointByVersion)
ENTRY_POINT_V(cudaGetDriverEntryPointByVersion_ptsz)

/* ---- manifest ------------------------------------------------------------------- */

struct named {
    char *name; /* demangled (malloc'd) or the mangled one (borrowed) */
    int owned;
    unsigned long long count;
};

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

/* Append ,"kernels":{COMPONENT:{"launches":N,"by_name":{NAME:COUNT,...},
 * "unnamed_launches":U},...} when kernel logging is on in this process.
 * Names are demangled with the process's __cxa_demangle when one is loaded
 * (libstdc++, in the global scope or as a library's local dependency, as in
 * a python process that imported torch; looked up now), else kept mangled; functions with the same
 * name add up. Components and names are sorted by name. */
void shim_kernels_json(struct shim_json *b)
{
    if (!counting())
        return;
    typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);
    demangle_fn demangle = (demangle_fn)shim_resolve_default("__cxa_demangle");
    if (!demangle) /* python loads torch's libstdc++ as a local dependency */
        demangle = (demangle_fn)shim_resolve_in("__cxa_demangle", shim_resolve_libstdcxx, NULL);
    shim_json_raw(b, ",\"kernels\":{");
    pthread_mutex_lock(&k_lock);
    unsigned nc = atomic_load(&ncomps);
    /* components in name order */
    unsigned order[COMPONENTS_MAX];
    for (unsigned i = 0; i < nc; ++i)
        order[i] = i;
    for (unsigned i = 1; i < nc; ++i)
        for (unsigned j = i; j > 0 && strcmp(comp_names[order[j - 1]], comp_names[order[j]]) > 0; --j) {
            unsigned t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    struct named *list = malloc(sizeof *list * (PER_COMPONENT_MAX + 1));
    int first = 1;
    for (unsigned oi = 0; oi < nc && list; ++oi) {
        unsigned ci = order[oi];
        size_t n = 0;
        unsigned long long total = atomic_load(&comp_unnamed[ci]);
        for (unsigned s = 0; s < COUNTERS_MAX && n < PER_COMPONENT_MAX; ++s) {
            struct counter_slot *c = &counters[s];
            if (!atomic_load(&c->ready) || c->comp != ci)
                continue;
            const char *mangled = names[c->name].name;
            list[n].name = (char *)mangled;
            list[n].owned = 0;
            int st = -1;
            if (demangle && mangled[0] == '_' && mangled[1] == 'Z') {
                char *d = demangle(mangled, NULL, NULL, &st);
                if (d && st == 0) {
                    list[n].name = d;
                    list[n].owned = 1;
                } else {
                    free(d);
                }
            }
            list[n].count = atomic_load(&c->count);
            total += list[n].count;
            ++n;
        }
        qsort(list, n, sizeof *list, by_name);
        if (!first)
            shim_json_raw(b, ",");
        first = 0;
        shim_json_string(b, comp_names[ci]);
        shim_json_printf(b, ":{\"launches\":%llu,\"by_name\":{", total);
        for (size_t i = 0; i < n;) {
            size_t j = i + 1;
            unsigned long long sum = list[i].count;
            while (j < n && strcmp(list[j].name, list[i].name) == 0)
                sum += list[j++].count;
            if (i)
                shim_json_raw(b, ",");
            shim_json_string(b, list[i].name);
            shim_json_printf(b, ":%llu", sum);
            i = j;
        }
        shim_json_printf(b, "},\"unnamed_launches\":%llu}",
                         (unsigned long long)atomic_load(&comp_unnamed[ci]));
        for (size_t i = 0; i < n; ++i)
            if (list[i].owned)
                free(list[i].name);
    }
    if (!list)
        b->oom = 1;
    free(list);
    pthread_mutex_unlock(&k_lock);
    shim_json_raw(b, "}");
}
