/* graphs.c - CUDA graph replays of tapped components.
 *
 * A tap on a stream that is capturing a CUDA graph is recorded as skipped
 * (cuda.c); what the graph then does on each replay happens without any
 * tap. So that those replays are not silently absent from the file, the
 * shim interposes the runtime calls that turn a capture into launches:
 *
 *   cudaStreamEndCapture            capture id of the skipped taps -> graph
 *   cudaGraphInstantiate[WithFlags|WithParams]   graph -> executable graph
 *   cudaGraphLaunch                 each launch of such an executable graph
 *                                   records every skipped path once more in
 *                                   probe.skips, with the replay number
 *   cudaGraphExecDestroy, cudaGraphDestroy   forget the handle
 *
 * Every hook forwards its arguments untouched to the runtime the process
 * loaded (dlsym(RTLD_NEXT), else the libcudart.so.13/.12 already mapped) and
 * returns its result; bookkeeping happens only in a process that captures
 * and only for graphs that contain skipped taps. Per-thread-default-stream
 * builds (the _ptsz entry points) are not interposed.
 *
 * Types and values: cuda_runtime_api.h (CUDA 12/13). cudaGraphInstantiate is
 * forwarded with five integer arguments so that the CUDA 11 form
 * (exec, graph, errorNode, logBuffer, bufferSize) passes through intact too.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cudart.h"
#include "base/resolve.h"
#include "base/shim.h"
#include "capture/taps.h"
#include "hooks/graphs.h"


struct paths {
    char **v;
    size_t n;
};

struct entry {
    struct entry *next;
    int kind;                 /* 0 capture id, 1 graph, 2 executable graph */
    unsigned long long id;    /* kind 0 */
    void *handle;             /* kind 1, 2 */
    unsigned long long replays;
    struct paths p;
};

static pthread_mutex_t glock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *entries;
static atomic_int have_entries; /* fast path: nothing to look up */
static __thread int in_hook;

static void *cudart_sym(const char *name)
{
    return shim_resolve(name, shim_resolve_cudart);
}

#define REAL(var, name)                                                                            \
    static _Atomic(void *) var##_p;                                                                \
    void *var##_v = atomic_load(&var##_p);                                                         \
    if (!var##_v) {                                                                                \
        var##_v = cudart_sym(name);                                                                  \
        atomic_store(&var##_p, var##_v);                                                           \
    }

/* caller holds glock */
static struct entry *find(int kind, unsigned long long id, const void *handle)
{
    for (struct entry *e = entries; e; e = e->next)
        if (e->kind == kind && (kind == 0 ? e->id == id : e->handle == handle))
            return e;
    return NULL;
}

/* caller holds glock; the entry (created if absent) for kind/id/handle */
static struct entry *get(int kind, unsigned long long id, void *handle)
{
    struct entry *e = find(kind, id, handle);
    if (e)
        return e;
    e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->kind = kind;
    e->id = id;
    e->handle = handle;
    e->next = entries;
    entries = e;
    atomic_store(&have_entries, 1);
    return e;
}

static void paths_add(struct paths *p, const char *path)
{
    for (size_t i = 0; i < p->n; ++i)
        if (strcmp(p->v[i], path) == 0)
            return;
    char **nv = realloc(p->v, (p->n + 1) * sizeof *nv);
    if (!nv)
        return;
    p->v = nv;
    if ((p->v[p->n] = strdup(path)))
        p->n++;
}

static void paths_copy(struct paths *dst, const struct paths *src)
{
    for (size_t i = 0; i < src->n; ++i)
        paths_add(dst, src->v[i]);
}

/* caller holds glock */
static void drop(int kind, const void *handle)
{
    for (struct entry **pp = &entries; *pp; pp = &(*pp)->next) {
        struct entry *e = *pp;
        if (e->kind == kind && e->handle == handle) {
            *pp = e->next;
            for (size_t i = 0; i < e->p.n; ++i)
                free(e->p.v[i]);
            free(e->p.v);
            free(e);
            return;
        }
    }
}

/* The capture id of a capturing stream, 0 if unknown. cudaStreamGetCaptureInfo
 * has 6 arguments in CUDA 12 and 7 in CUDA 13; only the first three are
 * used and the rest are NULL, which both accept. */
static unsigned long long capture_id(void *stream)
{
    typedef cudaError_t (*fn)(void *, int *, unsigned long long *, void *, void *, void *, void *);
    REAL(info, "cudaStreamGetCaptureInfo");
    int status = 0;
    unsigned long long id = 0;
    if (!info_v || ((fn)info_v)(stream, &status, &id, NULL, NULL, NULL, NULL) != cudaSuccess ||
        status == 0)
        return 0;
    return id;
}

void shim_graphs_note_skip(void *stream, const char *path)
{
    unsigned long long id = capture_id(stream);
    if (!id)
        return;
    pthread_mutex_lock(&glock);
    struct entry *e = get(0, id, NULL);
    if (e)
        paths_add(&e->p, path);
    pthread_mutex_unlock(&glock);
}

SHIM_EXPORT cudaError_t cudaStreamEndCapture(void *stream, void **graph)
{
    typedef cudaError_t (*fn)(void *, void **);
    REAL(end, "cudaStreamEndCapture");
    if (!end_v)
        return cudaErrorUnknown;
    unsigned long long id = 0;
    if (atomic_load(&have_entries) && !in_hook) {
        in_hook = 1;
        id = capture_id(stream);
        in_hook = 0;
    }
    cudaError_t r = ((fn)end_v)(stream, graph);
    if (id && r == cudaSuccess && graph && *graph) {
        pthread_mutex_lock(&glock);
        struct entry *c = find(0, id, NULL);
        if (c && c->p.n) {
            struct entry *g = get(1, 0, *graph);
            if (g)
                paths_copy(&g->p, &c->p);
        }
        pthread_mutex_unlock(&glock);
    }
    return r;
}

static void note_instantiate(cudaError_t r, void **exec, void *graph)
{
    if (r != cudaSuccess || !exec || !*exec || !atomic_load(&have_entries))
        return;
    pthread_mutex_lock(&glock);
    struct entry *g = find(1, 0, graph);
    if (g && g->p.n) {
        drop(2, *exec); /* a handle reused after destruction */
        struct entry *x = get(2, 0, *exec);
        if (x)
            paths_copy(&x->p, &g->p);
    }
    pthread_mutex_unlock(&glock);
}

SHIM_EXPORT cudaError_t cudaGraphInstantiate(void **exec, void *graph, void *a2, void *a3, void *a4)
{
    typedef cudaError_t (*fn)(void **, void *, void *, void *, void *);
    REAL(inst, "cudaGraphInstantiate");
    if (!inst_v)
        return cudaErrorUnknown;
    cudaError_t r = ((fn)inst_v)(exec, graph, a2, a3, a4);
    note_instantiate(r, exec, graph);
    return r;
}

SHIM_EXPORT cudaError_t cudaGraphInstantiateWithFlags(void **exec, void *graph,
                                                      unsigned long long flags)
{
    typedef cudaError_t (*fn)(void **, void *, unsigned long long);
    REAL(inst, "cudaGraphInstantiateWithFlags");
    if (!inst_v)
        return cudaErrorUnknown;
    cudaError_t r = ((fn)inst_v)(exec, graph, flags);
    note_instantiate(r, exec, graph);
    return r;
}

SHIM_EXPORT cudaError_t cudaGraphInstantiateWithParams(void **exec, void *graph, void *params)
{
    typedef cudaError_t (*fn)(void **, void *, void *);
    REAL(inst, "cudaGraphInstantiateWithParams");
    if (!inst_v)
        return cudaErrorUnknown;
    cudaError_t r = ((fn)inst_v)(exec, graph, params);
    note_instantiate(r, exec, graph);
    return r;
}

SHIM_EXPORT cudaError_t cudaGraphLaunch(void *exec, void *stream)
{
    typedef cudaError_t (*fn)(void *, void *);
    REAL(launch, "cudaGraphLaunch");
    if (!launch_v)
        return cudaErrorUnknown;
    cudaError_t r = ((fn)launch_v)(exec, stream);
    if (r != cudaSuccess || !atomic_load(&have_entries) || in_hook)
        return r;
    in_hook = 1;
    struct paths todo = {0};
    unsigned long long n = 0;
    pthread_mutex_lock(&glock);
    struct entry *x = find(2, 0, exec);
    if (x) {
        n = ++x->replays;
        paths_copy(&todo, &x->p);
    }
    pthread_mutex_unlock(&glock);
    for (size_t i = 0; i < todo.n; ++i) {
        char reason[SHIM_REASON_MAX];
        snprintf(reason, sizeof reason,
                 "replay %llu by cudaGraphLaunch of the CUDA graph captured with this tap inside: "
                 "not captured", n);
        shim_tap_skip_path(todo.v[i], reason);
        free(todo.v[i]);
    }
    free(todo.v);
    atomic_fetch_add(&shim_counts.graph_replays, n ? 1 : 0);
    in_hook = 0;
    return r;
}

SHIM_EXPORT cudaError_t cudaGraphExecDestroy(void *exec)
{
    typedef cudaError_t (*fn)(void *);
    REAL(destroy, "cudaGraphExecDestroy");
    if (!destroy_v)
        return cudaErrorUnknown;
    if (atomic_load(&have_entries)) {
        pthread_mutex_lock(&glock);
        drop(2, exec);
        pthread_mutex_unlock(&glock);
    }
    return ((fn)destroy_v)(exec);
}

SHIM_EXPORT cudaError_t cudaGraphDestroy(void *graph)
{
    typedef cudaError_t (*fn)(void *);
    REAL(destroy, "cudaGraphDestroy");
    if (!destroy_v)
        return cudaErrorUnknown;
    if (atomic_load(&have_entries)) {
        pthread_mutex_lock(&glock);
        drop(1, graph);
        pthread_mutex_unlock(&glock);
    }
    return ((fn)destroy_v)(graph);
}
