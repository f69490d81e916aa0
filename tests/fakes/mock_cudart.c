/* mock_cudart.c - a CPU stand-in for the CUDA runtime, so the shim's device
 * path (intercept/capture/cuda.c) runs and is checked on machines without a GPU.
 * Built by tests/e2e/test_shim_cuda_mock.py as libcudart.so.13 (same soname
 * as the real one, so the shim's dlopen("libcudart.so.13", RTLD_NOLOAD)
 * finds it) and loaded RTLD_GLOBAL by tests/programs/shim_tap_device_mock.
 *
 * Model: "device memory" is host memory; every stream feeds one FIFO that a
 * worker thread executes in order (a serialized device), so an event
 * recorded on a stream completes after everything enqueued before it, and a
 * copy on probe's stream after a wait on that event sees the producer's
 * earlier writes. mock_cuda_spin() enqueues a long "kernel" that writes the
 * buffer when it finishes.
 *
 * Copies of either direction (device-to-host captures, host-to-device
 * injections) are executed by the worker in stream order.
 *
 * It also polices the rules the shim promises (docs/intercept.md): nothing
 * enqueued on a capturing stream, no cudaEventSynchronize on a tapping
 * thread, no cudaFreeHost / cudaStreamSynchronize / cudaDeviceSynchronize /
 * cudaMalloc, events recorded on streams of their own device. Violations
 * are counted and reported by mock_cuda_stats().
 *
 * Values of errors and enums: cuda_runtime_api.h / driver_types.h.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int cudaError_t;
#define EXPORT __attribute__((visibility("default")))

enum {
    S_HOSTALLOC, S_FREEHOST, S_STREAMSYNC, S_DEVICESYNC, S_MALLOC, S_MEMCPY_ASYNC,
    S_EVENT_SYNC, S_VIOLATION, S_SYNC_ON_TAPPER, S_EXCHANGE, S_SETDEVICE, S_STREAMS,
    S_EVENTS, S_RECORD, S_WAIT, S_COUNT
};
static atomic_llong stats[S_COUNT];

struct mstream {
    unsigned magic;
    int device;
    unsigned flags;
    atomic_int capturing;
};
struct mevent {
    unsigned magic;
    int device;
    /* guarded by lock: the latest record's number and the highest completed
     * one; as in CUDA, the event stands for its most recent record */
    unsigned long long recorded, completed;
};

enum opkind { OP_COPY, OP_RECORD, OP_SPIN };
struct op {
    struct op *next;
    enum opkind kind;
    void *dst;
    const void *src;
    void *owned; /* OP_SPIN: copy of the data written at the end */
    size_t n;
    int ms;
    struct mevent *ev;
    unsigned long long gen;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct op *head, *tail;
static pthread_t worker;
static int started;
static atomic_int unloading;
static atomic_int strict_teardown; /* MOCK_CUDART_STRICT_TEARDOWN=1: a call after teardown aborts */
static atomic_int ncapturing;
static __thread int cur_device;
static __thread int capture_mode; /* 0 global, 1 thread-local, 2 relaxed */
static __thread int is_tapper;

static void *work(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!head)
            pthread_cond_wait(&cond, &lock);
        struct op *o = head;
        head = o->next;
        if (!head)
            tail = NULL;
        pthread_mutex_unlock(&lock);
        if (o->kind == OP_SPIN) {
            struct timespec ts = {o->ms / 1000, (long)(o->ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            memcpy(o->dst, o->owned, o->n);
            free(o->owned);
        } else if (o->kind == OP_COPY) {
            struct timespec ts = {0, 200000}; /* a copy takes a while */
            nanosleep(&ts, NULL);
            memcpy(o->dst, o->src, o->n);
        }
        pthread_mutex_lock(&lock);
        if (o->kind == OP_RECORD && o->gen > o->ev->completed)
            o->ev->completed = o->gen;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
        free(o);
    }
    return NULL;
}

/* fork: a forked child that calls into the mock must not inherit `lock`
 * held by the worker thread nor `cond` with the parent's waiters (either
 * waits forever: a glibc condition variable's broadcast waits for its
 * recorded waiters); it starts with an empty queue and no worker (one is
 * created at its first enqueue). */
static void fork_prepare(void)
{
    pthread_mutex_lock(&lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

static void fork_child(void)
{
    head = tail = NULL;
    started = 0;
    /* fresh primitives: the condition variable's state counts the parent's
     * waiters (its worker), which do not exist here, and a broadcast would
     * wait for them forever */
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&cond, NULL);
}

__attribute__((constructor)) static void mock_atfork(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void enqueue(struct op *o)
{
    pthread_mutex_lock(&lock);
    if (!started) {
        pthread_create(&worker, NULL, work, NULL);
        pthread_detach(worker);
        started = 1;
    }
    o->next = NULL;
    if (tail)
        tail->next = o;
    else
        head = o;
    tail = o;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

static int capturing(void *s)
{
    struct mstream *ms = s;
    return ms && atomic_load(&ms->capturing);
}

/* 1 once the runtime is torn down; in strict mode any call then aborts, as
 * a real runtime may crash when called from a late exit handler. */
static int gone(void)
{
    if (!atomic_load(&unloading))
        return 0;
    if (atomic_load(&strict_teardown)) {
        static const char msg[] = "mock cudart: called after its teardown\n";
        fwrite(msg, 1, sizeof msg - 1, stderr);
        abort();
    }
    return 1;
}

/* ---- runtime API subset --------------------------------------------------- */

EXPORT cudaError_t cudaGetDevice(int *d)
{
    if (gone())
        return 4; /* cudaErrorCudartUnloading */
    *d = cur_device;
    return 0;
}

EXPORT cudaError_t cudaSetDevice(int d)
{
    if (gone())
        return 4;
    if (d < 0 || d > 1)
        return 101; /* cudaErrorInvalidDevice */
    atomic_fetch_add(&stats[S_SETDEVICE], 1);
    cur_device = d;
    return 0;
}

EXPORT cudaError_t cudaGetDeviceCount(int *n)
{
    if (gone())
        return 4;
    *n = 2;
    return 0;
}

EXPORT cudaError_t cudaGetDeviceProperties_v2(void *prop, int d)
{
    if (gone())
        return 4;
    snprintf(prop, 256, "Mock GPU %d", d);
    return 0;
}

EXPORT cudaError_t cudaDriverGetVersion(int *v)
{
    if (gone())
        return 4;
    *v = 13000;
    return 0;
}

EXPORT cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (gone())
        return 4;
    *v = 13000;
    return 0;
}

EXPORT const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case 4: return "mock: driver shutting down (cudaErrorCudartUnloading)";
    case 600: return "mock: not ready";
    case 906: return "mock: operation would make the legacy stream depend on a capturing blocking stream";
    default: return "mock: error";
    }
}

EXPORT cudaError_t cudaStreamCreateWithFlags(void **s, unsigned flags)
{
    if (gone())
        return 4;
    struct mstream *m = calloc(1, sizeof *m);
    m->magic = 0x5354524d;
    m->device = cur_device;
    m->flags = flags;
    *s = m;
    atomic_fetch_add(&stats[S_STREAMS], 1);
    return 0;
}

EXPORT cudaError_t cudaEventCreateWithFlags(void **e, unsigned flags)
{
    if (gone())
        return 4;
    (void)flags;
    struct mevent *m = calloc(1, sizeof *m);
    m->magic = 0x4556454d;
    m->device = cur_device;
    *e = m;
    atomic_fetch_add(&stats[S_EVENTS], 1);
    return 0;
}

EXPORT cudaError_t cudaStreamIsCapturing(void *s, int *status)
{
    if (gone())
        return 4;
    if (!s && atomic_load(&ncapturing) > 0)
        return 906; /* cudaErrorStreamCaptureImplicit */
    *status = capturing(s) ? 1 : 0;
    return 0;
}

EXPORT cudaError_t cudaEventRecord(void *e, void *s)
{
    struct mevent *ev = e;
    struct mstream *ms = s;
    if (gone())
        return 4;
    atomic_fetch_add(&stats[S_RECORD], 1);
    if (capturing(s) || (!s && atomic_load(&ncapturing) > 0)) {
        atomic_fetch_add(&stats[S_VIOLATION], 1);
        return 900; /* cudaErrorStreamCaptureUnsupported */
    }
    if ((ms ? ms->device : cur_device) != ev->device) {
        atomic_fetch_add(&stats[S_VIOLATION], 1);
        return 400; /* cudaErrorInvalidResourceHandle */
    }
    struct op *o = calloc(1, sizeof *o);
    o->kind = OP_RECORD;
    o->ev = ev;
    pthread_mutex_lock(&lock);
    o->gen = ++ev->recorded;
    pthread_mutex_unlock(&lock);
    enqueue(o);
    return 0;
}

EXPORT cudaError_t cudaStreamWaitEvent(void *s, void *e, unsigned flags)
{
    if (gone())
        return 4;
    (void)e;
    (void)flags;
    atomic_fetch_add(&stats[S_WAIT], 1);
    if (capturing(s))
        atomic_fetch_add(&stats[S_VIOLATION], 1);
    return 0; /* one FIFO: the order is already kept */
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s)
{
    if (gone())
        return 4;
    atomic_fetch_add(&stats[S_MEMCPY_ASYNC], 1);
    /* probe copies device-to-host (2) on its own streams, never the legacy
     * one; injection copies host-to-device (1) on the producer's stream,
     * which may be the legacy stream (NULL). */
    if ((kind != 1 && kind != 2) || capturing(s) || (kind == 2 && !s))
        atomic_fetch_add(&stats[S_VIOLATION], 1);
    struct op *o = calloc(1, sizeof *o);
    o->kind = OP_COPY;
    o->dst = dst;
    o->src = src;
    o->n = n;
    enqueue(o);
    return 0;
}

EXPORT cudaError_t cudaEventSynchronize(void *e)
{
    struct mevent *ev = e;
    if (gone())
        return 4;
    atomic_fetch_add(&stats[S_EVENT_SYNC], 1);
    if (is_tapper)
        atomic_fetch_add(&stats[S_SYNC_ON_TAPPER], 1);
    if (atomic_load(&ncapturing) > 0 && capture_mode != 2)
        atomic_fetch_add(&stats[S_VIOLATION], 1); /* would invalidate a global capture */
    pthread_mutex_lock(&lock);
    unsigned long long want = ev->recorded;
    while (ev->completed < want && !atomic_load(&unloading))
        pthread_cond_wait(&cond, &lock);
    int done = ev->completed >= want;
    pthread_mutex_unlock(&lock);
    return done ? 0 : 4;
}

EXPORT cudaError_t cudaEventQuery(void *e)
{
    struct mevent *ev = e;
    if (gone())
        return 4;
    pthread_mutex_lock(&lock);
    int done = ev->completed >= ev->recorded;
    pthread_mutex_unlock(&lock);
    return done ? 0 : 600;
}

EXPORT cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    if (gone())
        return 4;
    (void)flags;
    atomic_fetch_add(&stats[S_HOSTALLOC], 1);
    if (atomic_load(&ncapturing) > 0 && capture_mode != 2)
        atomic_fetch_add(&stats[S_VIOLATION], 1);
    *p = malloc(n ? n : 1);
    return *p ? 0 : 2;
}

EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode)
{
    if (gone())
        return 4;
    atomic_fetch_add(&stats[S_EXCHANGE], 1);
    int old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return 0;
}

/* Calls the shim must never make. */
EXPORT cudaError_t cudaFreeHost(void *p)
{
    atomic_fetch_add(&stats[S_FREEHOST], 1);
    free(p);
    return 0;
}

EXPORT cudaError_t cudaStreamSynchronize(void *s)
{
    (void)s;
    atomic_fetch_add(&stats[S_STREAMSYNC], 1);
    return 0;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    atomic_fetch_add(&stats[S_DEVICESYNC], 1);
    return 0;
}

EXPORT cudaError_t cudaMalloc(void **p, size_t n)
{
    atomic_fetch_add(&stats[S_MALLOC], 1);
    *p = malloc(n);
    return 0;
}

/* ---- control for the test program ---------------------------------------- */

/* Enqueue a "kernel" on s that runs ms milliseconds, then writes n bytes
 * (copied now from src) to dst. */
EXPORT void mock_cuda_spin(void *s, int ms, void *dst, const void *src, size_t n)
{
    (void)s;
    struct op *o = calloc(1, sizeof *o);
    o->kind = OP_SPIN;
    o->ms = ms;
    o->dst = dst;
    o->owned = malloc(n);
    memcpy(o->owned, src, n);
    o->n = n;
    enqueue(o);
}

EXPORT void mock_cuda_capture(void *s, int on)
{
    struct mstream *ms = s;
    int was = atomic_exchange(&ms->capturing, on);
    atomic_fetch_add(&ncapturing, on - was);
}

/* Graphs: a capture on a stream has an id (the stream's capture count);
 * cudaStreamEndCapture ends it and returns a graph handle; graphs and
 * executable graphs are opaque tokens; launches are counted. */
static atomic_ullong capture_ids, graph_launches;

EXPORT cudaError_t cudaStreamGetCaptureInfo(void *s, int *status, unsigned long long *id, void *g,
                                            void *deps, void *edges, void *ndeps)
{
    (void)g, (void)deps, (void)edges, (void)ndeps;
    if (gone())
        return 4;
    struct mstream *ms = s;
    *status = ms && atomic_load(&ms->capturing) ? 1 : 0;
    if (id)
        *id = *status ? (unsigned long long)(uintptr_t)ms ^ atomic_load(&capture_ids) : 0;
    return 0;
}

EXPORT cudaError_t cudaStreamEndCapture(void *s, void **graph)
{
    struct mstream *ms = s;
    if (!ms || !atomic_load(&ms->capturing))
        return 901; /* cudaErrorStreamCaptureUnmatched */
    mock_cuda_capture(s, 0);
    atomic_fetch_add(&capture_ids, 1);
    *graph = malloc(16);
    return 0;
}

EXPORT cudaError_t cudaGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags)
{
    (void)flags;
    if (!graph)
        return 1;
    *exec = malloc(16);
    return 0;
}

EXPORT cudaError_t cudaGraphLaunch(void *exec, void *s)
{
    (void)s;
    if (!exec)
        return 1;
    atomic_fetch_add(&graph_launches, 1);
    return 0;
}

EXPORT cudaError_t cudaGraphExecDestroy(void *exec)
{
    free(exec);
    return 0;
}

EXPORT cudaError_t cudaGraphDestroy(void *graph)
{
    free(graph);
    return 0;
}

EXPORT unsigned long long mock_cuda_graph_launches(void)
{
    return atomic_load(&graph_launches);
}

EXPORT void mock_cuda_mark_tapper(void)
{
    is_tapper = 1;
}

EXPORT int mock_cuda_capture_mode(void)
{
    return capture_mode;
}

/* What cudart's own exit handler does: every later call fails. */
EXPORT void mock_cuda_teardown(void)
{
    const char *strict = getenv("MOCK_CUDART_STRICT_TEARDOWN");
    atomic_store(&strict_teardown, strict && strict[0] == '1');
    atomic_store(&unloading, 1);
    pthread_mutex_lock(&lock);
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

EXPORT void mock_cuda_stats(long long *out, int n)
{
    for (int i = 0; i < n && i < S_COUNT; ++i)
        out[i] = atomic_load(&stats[i]);
}

/* ---- kernel launches (tests/e2e/test_kernels.py) -------------------------
 * Launches are counted per function pointer; cudaFuncGetName answers the
 * names set with mock_cuda_set_kernel_name and fails (cudaErrorInvalid-
 * DeviceFunction, 98, left as the last error as the real runtime does) for
 * any other pointer. Like the real runtime, a launch goes on to the driver:
 * when a libcuda.so.1 is loaded, the mock fetches cuGetProcAddress_v2 from
 * it with dlsym and cuLaunchKernel / cuLaunchKernelEx through it, and calls
 * them with the same pointer as the CUfunction (the shim must count such a
 * launch once). */
#include <dlfcn.h>

#define MOCK_KERNELS 64
static struct {
    const void *func;
    char name[256];
} knames[MOCK_KERNELS];
static int nknames;
static atomic_llong klaunches;
static __thread cudaError_t last_error;

EXPORT void mock_cuda_set_kernel_name(const void *func, const char *name)
{
    pthread_mutex_lock(&lock);
    if (nknames < MOCK_KERNELS) {
        knames[nknames].func = func;
        snprintf(knames[nknames].name, sizeof knames[nknames].name, "%s", name);
        nknames++;
    }
    pthread_mutex_unlock(&lock);
}

EXPORT void mock_cuda_set_last_error(cudaError_t e)
{
    last_error = e;
}

EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = 0;
    return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

static atomic_llong kname_queries;

/* cudaFuncGetName calls so far. */
EXPORT long long mock_cuda_name_queries(void)
{
    return kname_queries;
}

EXPORT cudaError_t cudaFuncGetName(const char **name, const void *func)
{
    kname_queries++;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nknames; i++)
        if (knames[i].func == func) {
            *name = knames[i].name;
            pthread_mutex_unlock(&lock);
            return 0;
        }
    pthread_mutex_unlock(&lock);
    last_error = 98;
    return 98;
}

typedef int (*mock_gpa2_fn)(const char *, void **, int, unsigned long long, void *);
typedef int (*mock_launch_fn)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, void *, void **, void **);
typedef int (*mock_launch_ex_fn)(const void *, const void *, void **, void **);

/* The driver's launch entry point, fetched once like cudart does. */
static void *driver_entry(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return NULL;
    mock_gpa2_fn gpa = (mock_gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
    void *p = NULL;
    if (!gpa || gpa(name, &p, 13000, 0, NULL) != 0)
        p = NULL;
    dlclose(h);
    return p;
}

struct mdim3 {
    unsigned x, y, z;
};

static cudaError_t mock_launch(const void *func, struct mdim3 g, struct mdim3 b, void **args,
                               size_t shmem, void *stream)
{
    klaunches++;
    static _Atomic(void *) launch;
    static atomic_int tried; /* looked up once, at the first launch (like cudart's init) */
    void *l = atomic_load(&launch);
    if (!l && !atomic_exchange(&tried, 1)) {
        l = driver_entry("cuLaunchKernel");
        atomic_store(&launch, l);
    }
    if (l)
        return ((mock_launch_fn)l)(func, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shmem, stream,
                                   args, NULL) ? 1 : 0;
    return 0;
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, struct mdim3 g, struct mdim3 b, void **args,
                                    size_t shmem, void *stream)
{
    return mock_launch(func, g, b, args, shmem, stream);
}

EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, struct mdim3 g, struct mdim3 b,
                                         void **args, size_t shmem, void *stream)
{
    return mock_launch(func, g, b, args, shmem, stream);
}

EXPORT cudaError_t __cudaLaunchKernel(void *kernel, struct mdim3 g, struct mdim3 b, void **args,
                                      size_t shmem, void *stream)
{
    return mock_launch(kernel, g, b, args, shmem, stream);
}

EXPORT cudaError_t __cudaLaunchKernel_ptsz(void *kernel, struct mdim3 g, struct mdim3 b,
                                           void **args, size_t shmem, void *stream)
{
    return mock_launch(kernel, g, b, args, shmem, stream);
}

EXPORT cudaError_t cudaLaunchKernelExC(const void *config, const void *func, void **args)
{
    klaunches++;
    static _Atomic(void *) launch;
    void *l = atomic_load(&launch);
    if (!l) {
        l = driver_entry("cuLaunchKernelEx");
        atomic_store(&launch, l);
    }
    if (l)
        return ((mock_launch_ex_fn)l)(config, func, args, NULL) ? 1 : 0;
    return 0;
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **pfn, unsigned ver,
                                                    unsigned long long flags, void *status)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return 3;
    mock_gpa2_fn gpa = (mock_gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
    int r = gpa ? gpa(sym, pfn, (int)ver, flags, status) : 1;
    dlclose(h);
    return r ? 500 : 0;
}

/* Launches that reached this runtime. */
EXPORT long long mock_cuda_kernel_launches(void)
{
    return klaunches;
}
