/* cuda.c - device tensors: the CUDA runtime is taken from the copy the
 * process already loaded (never linked: docs/intercept.md "What the shim links, and why"), and
 * only when a device tensor arrives.
 *
 * Per tap: event on the producer stream -> probe's private non-blocking
 * stream waits on it -> cudaMemcpyAsync D2H of the strided span, in pieces,
 * into the pinned staging ring (base/ring.c), an event after each piece ->
 * the producer stream waits on the last piece's event (later work on it
 * cannot change the bytes before they are read). The writer thread waits on
 * the piece events. Nothing here blocks the producer thread except a full
 * ring (back-pressure, counted), and nothing synchronizes a stream or the
 * device; a stream that is capturing a CUDA graph gets nothing enqueued
 * (the tensor is recorded as skipped). The staging pool is one
 * cudaHostAlloc at the first device tap (PROBE_PINNED_MB), never freed:
 * cudaFreeHost synchronizes the device. Injection (host-to-device) keeps a
 * small grow-only pool of its own.
 *
 * Types and constants are declared locally with the values of the CUDA
 * runtime API headers (cuda_runtime_api.h, driver_types.h, CUDA 12/13). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/cudart.h"
#include "base/gather.h"
#include "base/json.h"
#include "base/libprobe.h"
#include "base/libprobe_cuda.h"
#include "base/resolve.h"
#include "base/ring.h"
#include "base/shim.h"
#include "capture/cuda.h"
#include "capture/job.h"
#include "capture/queue.h"


static struct {
    cudaError_t (*GetDevice)(int *);
    cudaError_t (*SetDevice)(int);
    cudaError_t (*StreamCreateWithFlags)(cudaStream_t *, unsigned);
    cudaError_t (*EventCreateWithFlags)(cudaEvent_t *, unsigned);
    cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
    cudaError_t (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned);
    cudaError_t (*MemcpyAsync)(void *, const void *, size_t, int, cudaStream_t);
    cudaError_t (*EventSynchronize)(cudaEvent_t);
    cudaError_t (*EventQuery)(cudaEvent_t);
    cudaError_t (*HostAlloc)(void **, size_t, unsigned);
    cudaError_t (*StreamIsCapturing)(cudaStream_t, int *);
    const char *(*GetErrorString)(cudaError_t);
    cudaError_t (*DriverGetVersion)(int *);
    cudaError_t (*RuntimeGetVersion)(int *);
    cudaError_t (*GetDeviceCount)(int *);
    cudaError_t (*GetDeviceProperties)(void *, int);         /* optional */
    cudaError_t (*ThreadExchangeStreamCaptureMode)(int *);   /* optional */
} rt;

static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int rt_ready;
static void (*graph_skip_hook)(void *stream, const char *path);

void shim_cuda_set_graph_skip_hook(void (*note)(void *stream, const char *path))
{
    graph_skip_hook = note;
}

static const char *rt_soname; /* soname found with RTLD_NOLOAD, or NULL (global scope) */

/* In the loaded libcudart (its soname kept in rt_soname), else in the
 * global scope (an executable linking the runtime statically, a preload). */
static void *find_sym(const char *name)
{
    const char *so = NULL;
    void *p = shim_resolve_in(name, shim_resolve_cudart, &so);
    if (p && !rt_soname)
        rt_soname = so;
    return p ? p : shim_resolve_default(name);
}

/* 1 once every required runtime function is found. Retried on each call
 * until the runtime shows up (it is never loaded by probe). */
static int resolve(void)
{
    if (atomic_load_explicit(&rt_ready, memory_order_acquire))
        return 1;
    pthread_mutex_lock(&rt_lock);
    if (!atomic_load(&rt_ready)) {
#define SYM(field, name) *(void **)&rt.field = find_sym(name)
        SYM(GetDevice, "cudaGetDevice");
        SYM(SetDevice, "cudaSetDevice");
        SYM(StreamCreateWithFlags, "cudaStreamCreateWithFlags");
        SYM(EventCreateWithFlags, "cudaEventCreateWithFlags");
        SYM(EventRecord, "cudaEventRecord");
        SYM(StreamWaitEvent, "cudaStreamWaitEvent");
        SYM(MemcpyAsync, "cudaMemcpyAsync");
        SYM(EventSynchronize, "cudaEventSynchronize");
        SYM(EventQuery, "cudaEventQuery");
        SYM(HostAlloc, "cudaHostAlloc");
        SYM(StreamIsCapturing, "cudaStreamIsCapturing");
        SYM(GetErrorString, "cudaGetErrorString");
        SYM(DriverGetVersion, "cudaDriverGetVersion");
        SYM(RuntimeGetVersion, "cudaRuntimeGetVersion");
        SYM(GetDeviceCount, "cudaGetDeviceCount");
        SYM(GetDeviceProperties, "cudaGetDeviceProperties_v2");
        if (!rt.GetDeviceProperties)
            SYM(GetDeviceProperties, "cudaGetDeviceProperties");
        SYM(ThreadExchangeStreamCaptureMode, "cudaThreadExchangeStreamCaptureMode");
#undef SYM
        if (rt.GetDevice && rt.SetDevice && rt.StreamCreateWithFlags && rt.EventCreateWithFlags &&
            rt.EventRecord && rt.StreamWaitEvent && rt.MemcpyAsync && rt.EventSynchronize &&
            rt.EventQuery && rt.HostAlloc && rt.StreamIsCapturing && rt.GetErrorString &&
            rt.DriverGetVersion && rt.RuntimeGetVersion && rt.GetDeviceCount)
            atomic_store_explicit(&rt_ready, 1, memory_order_release);
        else
            rt_soname = NULL;
    }
    pthread_mutex_unlock(&rt_lock);
    return atomic_load(&rt_ready);
}

static const char *errstr(cudaError_t e)
{
    const char *s = rt.GetErrorString ? rt.GetErrorString(e) : NULL;
    return s ? s : "unknown CUDA error";
}

/* ---- private streams, events, pinned staging ---------------------------- */

static _Atomic(cudaStream_t) priv_stream[SHIM_MAX_DEVICES];
static pthread_mutex_t stream_lock = PTHREAD_MUTEX_INITIALIZER;

/* caller has made `device` current */
static cudaStream_t private_stream(int device, cudaError_t *err)
{
    cudaStream_t s = atomic_load(&priv_stream[device]);
    *err = cudaSuccess;
    if (s)
        return s;
    pthread_mutex_lock(&stream_lock);
    s = atomic_load(&priv_stream[device]);
    if (!s) {
        *err = rt.StreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (*err == cudaSuccess)
            atomic_store(&priv_stream[device], s);
        else
            s = NULL;
    }
    pthread_mutex_unlock(&stream_lock);
    return s;
}

struct stack {
    void **v;
    size_t n, cap;
};

static int stack_push(struct stack *s, void *p)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 16;
        void **nv = realloc(s->v, nc * sizeof *nv);
        if (!nv)
            return 0;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = p;
    return 1;
}

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stack event_pool[SHIM_MAX_DEVICES];
#define PIN_MIN_SHIFT 12
#define PIN_CLASSES 52
static struct stack pin_pool[PIN_CLASSES]; /* class k holds buffers of 2^k bytes */
/* Published pieces of device copies (shim_cuda_capture -> writer). */
static pthread_mutex_t pub_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pub_cond = PTHREAD_COND_INITIALIZER;

/* caller has made `device` current */
static cudaEvent_t event_get(int device, cudaError_t *err)
{
    cudaEvent_t ev = NULL;
    *err = cudaSuccess;
    pthread_mutex_lock(&pool_lock);
    if (event_pool[device].n)
        ev = event_pool[device].v[--event_pool[device].n];
    pthread_mutex_unlock(&pool_lock);
    if (!ev) {
        *err = rt.EventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (*err != cudaSuccess)
            ev = NULL;
    }
    return ev;
}

static void event_put(int device, cudaEvent_t ev)
{
    pthread_mutex_lock(&pool_lock);
    stack_push(&event_pool[device], ev); /* on failure the event is leaked, never destroyed */
    pthread_mutex_unlock(&pool_lock);
}

static int pin_class(size_t bytes)
{
    int k = PIN_MIN_SHIFT;
    while (k < PIN_CLASSES - 1 && ((size_t)1 << k) < bytes)
        ++k;
    return ((size_t)1 << k) >= bytes ? k : -1;
}

static void *pinned_get(size_t bytes, size_t *cap, cudaError_t *err)
{
    int k = pin_class(bytes);
    void *p = NULL;
    *err = cudaSuccess;
    if (k < 0) {
        *err = 2; /* cudaErrorMemoryAllocation */
        return NULL;
    }
    pthread_mutex_lock(&pool_lock);
    if (pin_pool[k].n)
        p = pin_pool[k].v[--pin_pool[k].n];
    pthread_mutex_unlock(&pool_lock);
    if (!p) {
        *err = rt.HostAlloc(&p, (size_t)1 << k, cudaHostAllocPortable);
        if (*err != cudaSuccess)
            return NULL;
        atomic_fetch_add(&shim_counts.pinned_bytes, (size_t)1 << k);
    }
    *cap = (size_t)1 << k;
    return p;
}

static void pinned_put(void *p, size_t cap)
{
    int k = pin_class(cap);
    pthread_mutex_lock(&pool_lock);
    if (k >= 0)
        stack_push(&pin_pool[k], p); /* on failure: leaked, never freed */
    pthread_mutex_unlock(&pool_lock);
}

/* ---- staging ring (pinned, allocated once) -------------------------------- */

#define DEFAULT_PINNED_MB 1024u
#define MIN_PINNED_BYTES ((size_t)16 << 20)

#define SEGMENT_BYTES ((size_t)64 << 20) /* pools of 128 MiB and more grow by this */

static struct shim_ring ring;
static unsigned char **ring_segs;    /* segment k is at ring_segs[k]; NULL before setup */
static size_t ring_nsegs, ring_maxsegs; /* allocated / wanted */
static int ring_device;              /* device current at setup: the writer allocates there */
static int ring_growth_failed;
static pthread_once_t ring_once = PTHREAD_ONCE_INIT;
static char ring_error[200];
/* 0 before ring_setup, 1 set up, 2 failed (ring_error says why): what the
 * writer thread reads (release/acquire), since ring_setup runs on a tapping
 * thread under pthread_once, which orders only the threads that call it. */
static atomic_int ring_state;
static double ring_alloc_s;          /* time of all cudaHostAlloc calls of the pool */
static size_t ring_asked;
/* Serializes device captures from the first piece to the last, so that
 * ring claims are taken in the order the writer consumes them. */
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_ullong chunked_tensors, device_tensors;
/* device copies in pieces written as they arrived (the streamed put) */
static atomic_ullong streamed_tensors;
/* Device summaries made, stats-only device tensors that took the staging copy. */
static atomic_ullong device_summaries, device_summary_fallbacks;
/* 0, or an enqueue failed and the host path is taken from then on: 1 while
 * device_summary_error is being written, 2 once it is (release). */
static atomic_int device_summary_broken;
static char device_summary_error[SHIM_REASON_MAX];

/* 1 when the pool is set up (any thread). */
static int ring_ready(void)
{
    return atomic_load_explicit(&ring_state, memory_order_acquire) == 1;
}

/* Host address of ring offset off (a claim never crosses a segment). */
static unsigned char *ring_addr(size_t off)
{
    return ring_segs[off / ring.seg] + off % ring.seg;
}

/* PROBE_PINNED_MB as a number of MiB, or 0 when unset or bad. */
static unsigned long long pinned_mb_env(int warn)
{
    const char *v = getenv("PROBE_PINNED_MB");
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    unsigned long long mb = strtoull(v, &end, 10);
    if (errno || *end || mb < 16 || mb > (1ull << 30) || v[0] == '-' || v[0] == '+' || v[0] == ' ') {
        if (warn)
            shim_warn_config("PROBE_PINNED_MB=%s is not a number of MiB >= 16; using %u", v,
                             DEFAULT_PINNED_MB);
        return 0;
    }
    return mb;
}

void shim_cuda_config(void)
{
    pinned_mb_env(1); /* the one warning, at start-up, for CPU runs too */
}

/* PROBE_PINNED_MB, default 1024 MiB, at most a quarter of physical memory. */
static size_t pinned_bytes_wanted(void)
{
    size_t want = (size_t)DEFAULT_PINNED_MB << 20;
    const char *v = getenv("PROBE_PINNED_MB");
    unsigned long long mb = pinned_mb_env(0);
    if (mb) {
        want = (size_t)mb << 20;
    } else if (v && *v) {
        /* a bad value: the default, warned at start-up */
    } else {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psz > 0 && (size_t)pages / 4 < want / (size_t)psz)
            want = (size_t)pages / 4 * (size_t)psz;
        if (want < MIN_PINNED_BYTES)
            want = MIN_PINNED_BYTES;
    }
    return want;
}

/* Runs once, at the first device tap, in relaxed capture mode, with the
 * tensor's device current: the pool is PROBE_PINNED_MB; below 128 MiB it is
 * one cudaHostAlloc, otherwise segments of 64 MiB of which only the first
 * is allocated here (about 25 ms on the H200) and the others by the writer
 * thread while it is idle (shim_cuda_grow_staging), so the tapping thread
 * does not pay for pinning the whole pool. A first allocation that fails is
 * halved down to 16 MiB (one segment, no growth). */
static void ring_setup(void)
{
    size_t want = pinned_bytes_wanted();
    ring_asked = want;
    size_t seg = want >= 2 * SEGMENT_BYTES ? SEGMENT_BYTES : want;
    size_t nsegs = want / seg;
    uint64_t t0 = shim_now_ns();
    cudaError_t e = cudaSuccess;
    ring_segs = calloc(nsegs, sizeof *ring_segs);
    if (!ring_segs) {
        snprintf(ring_error, sizeof ring_error, "out of host memory for the staging pool");
        atomic_store_explicit(&ring_state, 2, memory_order_release);
        return;
    }
    rt.GetDevice(&ring_device);
    for (size_t n = seg; n >= MIN_PINNED_BYTES; n /= 2) {
        void *p = NULL;
        e = rt.HostAlloc(&p, n, cudaHostAllocPortable);
        if (e == cudaSuccess && p) {
            if (shim_ring_init(&ring, n, n) != 0)
                break;
            ring_segs[0] = p;
            ring_nsegs = 1;
            ring_maxsegs = n == seg ? nsegs : 1;
            atomic_fetch_add(&shim_counts.pinned_bytes, n);
            ring_alloc_s = (double)(shim_now_ns() - t0) * 1e-9;
            atomic_store_explicit(&ring_state, 1, memory_order_release);
            return;
        }
    }
    free(ring_segs);
    ring_segs = NULL;
    snprintf(ring_error, sizeof ring_error,
             "cannot allocate the pinned staging pool (%zu bytes asked, down to %zu): %s", want,
             MIN_PINNED_BYTES, errstr(e));
    atomic_store_explicit(&ring_state, 2, memory_order_release);
}

int shim_cuda_staging_starved(void)
{
    return ring_ready() && atomic_load(&ring.waiting) > 0;
}

int shim_cuda_grow_staging(void)
{
    if (!ring_ready() || ring_growth_failed || ring_nsegs >= ring_maxsegs || shim_queue_closing())
        return 0;
    static __thread int relaxed;
    if (!relaxed && rt.ThreadExchangeStreamCaptureMode) {
        int mode = cudaStreamCaptureModeRelaxed;
        rt.ThreadExchangeStreamCaptureMode(&mode);
        relaxed = 1;
    }
    int cur = -1;
    if (rt.GetDevice(&cur) != cudaSuccess || (cur != ring_device && rt.SetDevice(ring_device) != cudaSuccess)) {
        ring_growth_failed = 1;
        return 0;
    }
    uint64_t t0 = shim_now_ns();
    void *p = NULL;
    cudaError_t e = rt.HostAlloc(&p, ring.seg, cudaHostAllocPortable);
    if (e != cudaSuccess || !p) {
        ring_growth_failed = 1; /* keep what there is */
        snprintf(ring_error, sizeof ring_error, "the staging pool stopped growing at %zu bytes: %s",
                 ring_nsegs * ring.seg, errstr(e));
        return 0;
    }
    ring_segs[ring_nsegs++] = p; /* published to tapping threads by the ring's lock */
    atomic_fetch_add(&shim_counts.pinned_bytes, ring.seg);
    ring_alloc_s += (double)(shim_now_ns() - t0) * 1e-9;
    shim_ring_grow(&ring);
    return 1;
}

static int ring_give_up(void)
{
    return shim_queue_closing() || shim_disabled();
}

void shim_cuda_close_staging(void)
{
    if (ring_ready())
        shim_ring_close(&ring);
}

/* ,"device_summary":{...} when a stats-only device tensor was seen. */
static void device_summary_json(struct shim_json *b)
{
    unsigned long long made = atomic_load(&device_summaries),
                       fell = atomic_load(&device_summary_fallbacks);
    int failed = atomic_load_explicit(&device_summary_broken, memory_order_acquire) == 2;
    const char *why = failed ? device_summary_error : shim_libprobe_cuda_why();
    if (made == 0 && fell == 0 && !failed)
        return;
    shim_json_printf(b, ",\"device_summary\":{\"tensors\":%llu,\"host_fallbacks\":%llu", made, fell);
    if (why && *why) {
        shim_json_raw(b, ",\"why_host\":");
        shim_json_string(b, why);
    }
    shim_json_raw(b, "}");
}

void shim_cuda_staging_json(struct shim_json *b)
{
    device_summary_json(b);
    int state = atomic_load_explicit(&ring_state, memory_order_acquire);
    if (state == 0)
        return;
    struct shim_ring_stats s = {0};
    if (state == 1)
        shim_ring_stats(&ring, &s);
    shim_json_printf(b,
                     ",\"staging\":{\"pool_bytes\":%zu,\"requested_bytes\":%zu,\"segment_bytes\":%zu,"
                     "\"piece_bytes\":%zu,"
                     "\"alloc_s\":%.6f,\"waits\":%llu,\"wait_s\":%.6f,\"peak_bytes\":%zu,"
                     "\"copied_bytes\":%llu,\"tensors\":%llu,\"chunked_tensors\":%llu,"
                     "\"streamed_tensors\":%llu",
                     s.cap, ring_asked, s.seg, s.piece, ring_alloc_s, s.waits, (double)s.wait_ns * 1e-9,
                     s.peak, s.bytes, (unsigned long long)atomic_load(&device_tensors),
                     (unsigned long long)atomic_load(&chunked_tensors),
                     (unsigned long long)atomic_load(&streamed_tensors));
    if (ring_error[0]) {
        shim_json_raw(b, ",\"error\":");
        shim_json_string(b, ring_error);
    }
    shim_json_raw(b, "}");
}

/* ---- entering a producer's stream (tapping thread) ---------------------- */

/* What enter_stream changed, for leave_stream to undo. */
struct stream_entry {
    int device, prev;   /* the device made current, the caller's */
    int mode, mode_set; /* this thread's stream capture mode before, when exchanged */
    int capturing;      /* the stream is capturing a CUDA graph */
};

/* The prologue of every enqueue on a producer's stream (a device copy, an
 * injection): the runtime resolved, `device` made current, the stream not
 * capturing a CUDA graph (a copy would become a graph node, or invalidate
 * the capture; a failed query, e.g. the legacy stream during another
 * stream's global capture, counts as capturing), and this thread in relaxed
 * capture mode (probe's own calls must neither fail nor invalidate a
 * global-mode capture on another thread). PROBE_OK: call leave_stream after.
 * Otherwise PROBE_EUNSUPPORTED or PROBE_EIO with why in probe_last_error(),
 * se->capturing set when a graph capture is the reason, and nothing left to
 * undo. */
static probe_status enter_stream(int device, void *stream, struct stream_entry *se)
{
    memset(se, 0, sizeof *se);
    se->device = device;
    se->prev = device;
    if (!resolve())
        return probe_set_error(PROBE_EUNSUPPORTED, "CUDA runtime is not loaded in this process "
                                                   "(libcudart.so.13/.12 not found)");
    if (device >= SHIM_MAX_DEVICES)
        return probe_set_error(PROBE_EUNSUPPORTED,
                               "device ordinal %d is beyond probe's limit of %d devices", device,
                               SHIM_MAX_DEVICES);
    int prev = -1;
    cudaError_t e = rt.GetDevice(&prev);
    if (e != cudaSuccess)
        return probe_set_error(PROBE_EIO, "cudaGetDevice failed: %s", errstr(e));
    if (prev != device && (e = rt.SetDevice(device)) != cudaSuccess)
        return probe_set_error(PROBE_EIO, "cudaSetDevice(%d) failed: %s", device, errstr(e));
    se->prev = prev;
    int cap_status = cudaStreamCaptureStatusNone;
    probe_status st = PROBE_OK;
    e = rt.StreamIsCapturing(stream, &cap_status);
    if (e != cudaSuccess)
        st = probe_set_error(PROBE_EIO,
                             "stream capture status unknown (%s); treated as capturing a CUDA graph",
                             errstr(e));
    else if (cap_status != cudaStreamCaptureStatusNone)
        st = probe_set_error(PROBE_EIO, "stream is capturing a CUDA graph");
    if (st != PROBE_OK) {
        se->capturing = e == cudaSuccess; /* a graph capture, not a failed query */
        if (prev != device)
            rt.SetDevice(prev);
        return st;
    }
    se->mode = cudaStreamCaptureModeRelaxed;
    if (rt.ThreadExchangeStreamCaptureMode &&
        rt.ThreadExchangeStreamCaptureMode(&se->mode) == cudaSuccess)
        se->mode_set = 1;
    return PROBE_OK;
}

static void leave_stream(struct stream_entry *se)
{
    if (se->mode_set)
        rt.ThreadExchangeStreamCaptureMode(&se->mode);
    if (se->prev != se->device)
        rt.SetDevice(se->prev);
}

/* Enqueue the copy of piece i of j's span (of j->dev.npieces) on probe's
 * stream ps: ring space, an event after the copy, and for the last piece the
 * producer stream's wait on it. NULL when enqueued; otherwise why (in buf, or
 * a static text), with pc->state 1 when a copy is in flight regardless. */
static const char *copy_piece(struct shim_job *j, size_t i, const void *data, cudaStream_t ps,
                              void *stream, char *buf, size_t cap)
{
    struct shim_piece *pc = &j->dev.pieces[i];
    size_t n = j->dev.npieces, piece = ring.piece, span_bytes = j->dev.span;
    int device = j->dev.device;
    cudaError_t e;
    pc->len = i + 1 < n ? piece : span_bytes - i * piece;
    pc->ring_off = shim_ring_alloc(&ring, pc->len, ring_give_up);
    const char *why = NULL;
    if (pc->ring_off == SIZE_MAX) {
        why = shim_queue_closing() ? "the process is exiting" : "no staging space";
        snprintf(buf, cap, "%s while copying piece %zu of %zu", why, i + 1, n);
    } else if (!(pc->event = event_get(device, &e))) {
        shim_ring_free(&ring, pc->ring_off);
        snprintf(buf, cap, "cudaEventCreateWithFlags failed: %s", errstr(e));
        why = buf;
    } else if ((e = rt.MemcpyAsync(ring_addr(pc->ring_off), (const char *)data + i * piece,
                                   pc->len, cudaMemcpyDeviceToHost, ps)) != cudaSuccess) {
        shim_ring_free(&ring, pc->ring_off);
        event_put(device, pc->event);
        pc->event = NULL;
        snprintf(buf, cap, "cudaMemcpyAsync of %zu bytes from %p failed: %s", pc->len,
                 (const void *)((const char *)data + i * piece), errstr(e));
        why = buf;
    } else if ((e = rt.EventRecord(pc->event, ps)) != cudaSuccess) {
        /* the copy is in flight: its ring space and event are abandoned */
        pc->state = 1;
        pc->event = NULL;
        snprintf(buf, cap, "cudaEventRecord on probe's stream failed: %s", errstr(e));
        why = buf;
    }
    if (!why && i + 1 == n && (e = rt.StreamWaitEvent(stream, pc->event, 0)) != cudaSuccess) {
        /* ordering lost: later work on the stream could change the span before it is read */
        pc->state = 1;
        snprintf(buf, cap, "cudaStreamWaitEvent on the producer stream failed: %s", errstr(e));
        why = buf;
    }
    return why;
}

/* ---- capture (tapping thread) ------------------------------------------- */

static void publish(struct shim_job *j, size_t n)
{
    pthread_mutex_lock(&pub_lock);
    atomic_store(&j->dev.published, n);
    pthread_cond_broadcast(&pub_cond);
    pthread_mutex_unlock(&pub_lock);
}

static void abort_job(struct shim_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void abort_job(struct shim_job *j, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&pub_lock);
    vsnprintf(j->reason, sizeof j->reason, fmt, ap);
    atomic_store(&j->dev.aborted, 1);
    pthread_cond_broadcast(&pub_cond);
    pthread_mutex_unlock(&pub_lock);
    va_end(ap);
}

probe_status shim_cuda_capture(struct shim_job *j, const void *data, size_t span_bytes, int device,
                               void *stream, int *queued)
{
    char *reason = j->reason;
    size_t rlen = sizeof j->reason;
    *queued = 0;
    j->kind = SHIM_JOB_SKIP;
    struct stream_entry se;
    if (enter_stream(device, stream, &se) != PROBE_OK) {
        snprintf(reason, rlen, "%s", probe_last_error()); /* a skip, recorded with its reason */
        if (se.capturing && graph_skip_hook)
            graph_skip_hook(stream, j->path);
        return PROBE_OK;
    }
    probe_status st = PROBE_OK;
    int locked = 0;
    cudaError_t e;
    pthread_once(&ring_once, ring_setup);
    if (!ring_segs) {
        snprintf(reason, rlen, "%s", ring_error);
        goto restore;
    }
    cudaStream_t ps = private_stream(device, &e);
    if (!ps) {
        snprintf(reason, rlen, "cannot create probe's copy stream on device %d: %s", device, errstr(e));
        goto restore;
    }
    size_t piece = ring.piece, n = (span_bytes + piece - 1) / piece;
    j->dev.pieces = calloc(n, sizeof *j->dev.pieces);
    if (!j->dev.pieces) {
        snprintf(reason, rlen, "out of host memory");
        goto restore;
    }
    j->dev.npieces = n;
    j->dev.span = span_bytes;
    j->dev.device = device;
    atomic_store(&j->dev.published, 0);
    atomic_store(&j->dev.aborted, 0);
    cudaEvent_t ready = event_get(device, &e);
    if (!ready) {
        snprintf(reason, rlen, "cudaEventCreateWithFlags failed: %s", errstr(e));
        goto restore;
    }
    if ((e = rt.EventRecord(ready, stream)) != cudaSuccess) {
        event_put(device, ready);
        snprintf(reason, rlen, "cudaEventRecord on the producer stream failed: %s", errstr(e));
        goto restore;
    }
    if ((e = rt.StreamWaitEvent(ps, ready, 0)) != cudaSuccess) {
        /* ready may still be pending on the producer: abandon it */
        snprintf(reason, rlen, "cudaStreamWaitEvent failed: %s", errstr(e));
        goto restore;
    }
    event_put(device, ready); /* the wait captured its state; it may be re-recorded */
    pthread_mutex_lock(&capture_lock);
    locked = 1;
    for (size_t i = 0; i < n; ++i) {
        struct shim_piece *pc = &j->dev.pieces[i];
        char buf[SHIM_REASON_MAX];
        const char *why = copy_piece(j, i, data, ps, stream, buf, sizeof buf);
        if (why) {
            if (i == 0 && pc->state == 0) {
                snprintf(reason, rlen, "%s", buf);
                goto unlock; /* nothing in flight: the caller queues the skip */
            }
            if (i == 0) {
                j->kind = SHIM_JOB_DEVICE;
                atomic_store(&j->dev.aborted, 1);
                snprintf(reason, rlen, "%s", buf);
                publish(j, 1);
                if ((st = shim_queue_push(&j->work)) == PROBE_OK)
                    *queued = 1;
                goto unlock;
            }
            abort_job(j, "%s", buf);
            goto unlock;
        }
        pc->state = 1;
        if (i == 0) {
            j->kind = SHIM_JOB_DEVICE;
            publish(j, 1);
            if ((st = shim_queue_push(&j->work)) != PROBE_OK) {
                /* closed under us: the copy is in flight; abandon its space */
                j->kind = SHIM_JOB_SKIP;
                goto unlock;
            }
            *queued = 1;
        } else {
            publish(j, i + 1);
        }
    }
    atomic_fetch_add(&device_tensors, 1);
    if (n > 1)
        atomic_fetch_add(&chunked_tensors, 1);
unlock:
    if (locked)
        pthread_mutex_unlock(&capture_lock);
restore:
    leave_stream(&se);
    return st;
}

/* ---- device summaries (tapping thread) ------------------------------------ */

/* Pinned slots of SLOT_BYTES for the tree's root, carved from slabs of
 * SLAB_SLOTS (one cudaHostAlloc each, never freed); at most MAX_SLABS. */
#define SLOT_BYTES 128
#define SLAB_SLOTS 512
#define MAX_SLABS 64
_Static_assert(SHIM_DEVICE_SUMMARY_BYTES <= SLOT_BYTES, "a root node fits a slot");
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static void *free_slots[SLAB_SLOTS * MAX_SLABS];
static size_t nfree_slots, nslabs;

/* A free slot (device made current by the caller), NULL when none is left
 * and no slab can be added. */
static void *slot_get(void)
{
    void *p = NULL;
    pthread_mutex_lock(&slot_lock);
    if (nfree_slots == 0 && nslabs < MAX_SLABS) {
        unsigned char *slab = NULL;
        if (rt.HostAlloc((void **)&slab, (size_t)SLOT_BYTES * SLAB_SLOTS, cudaHostAllocPortable) ==
                cudaSuccess && slab) {
            for (size_t k = 0; k < SLAB_SLOTS; ++k)
                free_slots[nfree_slots++] = slab + k * SLOT_BYTES;
            ++nslabs;
            atomic_fetch_add(&shim_counts.pinned_bytes, (size_t)SLOT_BYTES * SLAB_SLOTS);
        }
    }
    if (nfree_slots)
        p = free_slots[--nfree_slots];
    pthread_mutex_unlock(&slot_lock);
    return p;
}

static void slot_put(void *p)
{
    pthread_mutex_lock(&slot_lock);
    free_slots[nfree_slots++] = p;
    pthread_mutex_unlock(&slot_lock);
}

/* The enqueue failed: keep the first reason, stop asking the GPU. */
static void device_summary_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void device_summary_fail(const char *fmt, ...)
{
    if (atomic_exchange(&device_summary_broken, 1))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(device_summary_error, sizeof device_summary_error, fmt, ap);
    va_end(ap);
    atomic_store_explicit(&device_summary_broken, 2, memory_order_release);
    shim_warn("device summaries are off for the rest of the run (stats-only records of device "
              "tensors are made on the host, from the staging copy): %s", device_summary_error);
}

probe_status shim_cuda_summarize(struct shim_job *j, const void *data, uint64_t n, int device,
                                 void *stream, int *handled, int *queued)
{
    *handled = *queued = 0;
    const struct shim_libprobe_cuda *lc = shim_libprobe_cuda();
    if (!lc || atomic_load(&device_summary_broken)) {
        atomic_fetch_add(&device_summary_fallbacks, 1);
        return PROBE_OK;
    }
    struct stream_entry se;
    if (enter_stream(device, stream, &se) != PROBE_OK) {
        /* what shim_cuda_capture would record: a skip with its reason */
        j->kind = SHIM_JOB_SKIP;
        snprintf(j->reason, sizeof j->reason, "%s", probe_last_error());
        if (se.capturing && graph_skip_hook)
            graph_skip_hook(stream, j->path);
        *handled = 1;
        return PROBE_OK;
    }
    probe_status st = PROBE_OK;
    cudaError_t e;
    cudaEvent_t ready = NULL, done = NULL;
    void *slot = NULL;
    cudaStream_t ps = private_stream(device, &e);
    if (!ps || !(slot = slot_get()) || !(ready = event_get(device, &e)))
        goto fallback;
    if (rt.EventRecord(ready, stream) != cudaSuccess) {
        event_put(device, ready);
        goto fallback;
    }
    if (rt.StreamWaitEvent(ps, ready, 0) != cudaSuccess)
        goto fallback; /* ready may still be pending on the producer: abandoned */
    event_put(device, ready);
    if (!(done = event_get(device, &e)))
        goto fallback; /* ps waits for the producer and does nothing more: harmless */
    ++shim_own_gpu_work;
    probe_status es = lc->summary_enqueue(j->dtype, data, n, ps, slot);
    --shim_own_gpu_work;
    if (es != PROBE_OK) {
        device_summary_fail("probe_cuda_summary_tree_enqueue: %s", shim_libprobe_error());
        event_put(device, done);
        slot = NULL; /* a kernel may be in flight: the slot is abandoned, never reused */
        goto fallback;
    }
    if ((e = rt.EventRecord(done, ps)) != cudaSuccess) {
        j->kind = SHIM_JOB_SKIP; /* the summary runs on, unobserved: slot and event abandoned */
        snprintf(j->reason, sizeof j->reason,
                 "cudaEventRecord after the device summary failed: %s", errstr(e));
        *handled = 1;
        goto out;
    }
    if ((e = rt.StreamWaitEvent(stream, done, 0)) != cudaSuccess) {
        /* ordering lost: later work on the stream could change the bytes
         * before the summary reads them */
        j->kind = SHIM_JOB_SKIP;
        snprintf(j->reason, sizeof j->reason,
                 "cudaStreamWaitEvent on the producer stream failed: %s", errstr(e));
        *handled = 1;
        goto out;
    }
    j->kind = SHIM_JOB_DEVICE_SUMMARY;
    j->dev.device = device;
    j->dev.summary = slot;
    j->dev.done.event = done;
    j->dev.done.state = 1;
    *handled = 1;
    if ((st = shim_queue_push(&j->work)) != PROBE_OK) {
        j->kind = SHIM_JOB_SKIP; /* closed under us: the summary is in flight; abandoned */
        j->dev.summary = NULL;
        goto out;
    }
    *queued = 1;
    atomic_fetch_add(&device_summaries, 1);
    goto out;
fallback:
    if (slot)
        slot_put(slot);
    atomic_fetch_add(&device_summary_fallbacks, 1);
out:
    leave_stream(&se);
    return st;
}

/* ---- injection (tapping thread) ----------------------------------------- */

/* Pinned buffers of injections whose host-to-device copy may still run: each
 * goes back to the pool once its completion event is reached. */
struct inject_pending {
    struct inject_pending *next;
    void *buf;
    size_t cap;
    int device;
    cudaEvent_t done;
};
static struct inject_pending *inject_list;
static pthread_mutex_t inject_lock = PTHREAD_MUTEX_INITIALIZER;

/* Return the buffers of completed injection copies to the pool (never waits). */
static void inject_reap(void)
{
    pthread_mutex_lock(&inject_lock);
    struct inject_pending **pp = &inject_list;
    while (*pp) {
        struct inject_pending *p = *pp;
        if (rt.EventQuery(p->done) == cudaSuccess) {
            *pp = p->next;
            pinned_put(p->buf, p->cap);
            event_put(p->device, p->done);
            free(p);
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_unlock(&inject_lock);
}

probe_status shim_cuda_inject(void *dst, const void *src, size_t nbytes, int device, void *stream)
{
    struct stream_entry se;
    probe_status st = enter_stream(device, stream, &se);
    if (st != PROBE_OK)
        return st;
    inject_reap();
    st = PROBE_EIO;
    cudaError_t e;
    struct inject_pending *p = calloc(1, sizeof *p);
    if (!p) {
        st = probe_set_error(PROBE_ENOMEM, "out of memory");
        goto restore;
    }
    p->device = device;
    p->buf = pinned_get(nbytes, &p->cap, &e);
    if (!p->buf) {
        st = probe_set_error(PROBE_EIO, "cannot allocate %zu bytes of pinned memory: %s", nbytes, errstr(e));
        free(p);
        goto restore;
    }
    p->done = event_get(device, &e);
    if (!p->done) {
        st = probe_set_error(PROBE_EIO, "cudaEventCreateWithFlags failed: %s", errstr(e));
        pinned_put(p->buf, p->cap);
        free(p);
        goto restore;
    }
    memcpy(p->buf, src, nbytes);
    if ((e = rt.MemcpyAsync(dst, p->buf, nbytes, cudaMemcpyHostToDevice, stream)) != cudaSuccess) {
        st = probe_set_error(PROBE_EIO, "cudaMemcpyAsync host-to-device of %zu bytes to %p failed: %s",
                 nbytes, dst, errstr(e));
        pinned_put(p->buf, p->cap);
        event_put(device, p->done);
        free(p);
        goto restore;
    }
    if ((e = rt.EventRecord(p->done, stream)) != cudaSuccess) {
        /* the copy is in flight: abandon the buffer (never reused) */
        st = probe_set_error(PROBE_EIO, "cudaEventRecord on the producer stream failed: %s", errstr(e));
        event_put(device, p->done);
        free(p);
        goto restore;
    }
    pthread_mutex_lock(&inject_lock);
    p->next = inject_list;
    inject_list = p;
    pthread_mutex_unlock(&inject_lock);
    st = PROBE_OK;
restore:
    leave_stream(&se);
    return st;
}

/* ---- writer thread ------------------------------------------------------ */

static int cudart_still_mapped(void)
{
    if (!rt_soname)
        return 1; /* found in the global scope: part of the executable or a preload */
    return shim_resolve_loaded(rt_soname);
}

static const char exited_reason[] = "process exited before the device copy completed";

/* Wait for one piece's copy. 0 when complete; -1 with reason otherwise. */
static int piece_wait(struct shim_piece *pc, char *reason, size_t rlen)
{
    static __thread int relaxed;
    if (!relaxed && rt.ThreadExchangeStreamCaptureMode) {
        int mode = cudaStreamCaptureModeRelaxed;
        rt.ThreadExchangeStreamCaptureMode(&mode);
        relaxed = 1;
    }
    if (pc->state >= 2)
        return 0;
    if (pc->state != 1 || !pc->event) {
        snprintf(reason, rlen, "device copy was not enqueued");
        return -1;
    }
    cudaError_t e;
    if (!shim_queue_closing()) {
        e = rt.EventSynchronize(pc->event);
        if (e == cudaSuccess) {
            pc->state = 2;
            return 0;
        }
        snprintf(reason, rlen, "device copy failed: %s", errstr(e));
        return -1;
    }
    /* Process exit: call CUDA only when the finalizer runs before the
     * runtime's teardown (shim_exit_after_cuda); then only poll, and only
     * while the runtime is mapped and answers. */
    if (!shim_cuda_alive_at_exit() || !cudart_still_mapped()) {
        snprintf(reason, rlen, "%s", exited_reason);
        return -1;
    }
    uint64_t deadline = shim_now_ns() + 5000000000ull;
    for (;;) {
        e = rt.EventQuery(pc->event);
        if (e == cudaSuccess) {
            pc->state = 2;
            return 0;
        }
        if (e != cudaErrorNotReady || shim_now_ns() > deadline) {
            snprintf(reason, rlen, "%s", exited_reason);
            return -1;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Give a completed piece's ring space and event back. */
static void piece_return(struct shim_job *j, struct shim_piece *pc)
{
    if (pc->state != 2)
        return;
    shim_ring_free(&ring, pc->ring_off);
    event_put(j->dev.device, pc->event);
    pc->event = NULL;
    pc->state = 3;
}

/* Wait until piece i is enqueued or the submitter gave up. 1 if enqueued. */
static int piece_published(struct shim_job *j, size_t i)
{
    pthread_mutex_lock(&pub_lock);
    while (atomic_load(&j->dev.published) <= i && !atomic_load(&j->dev.aborted))
        pthread_cond_wait(&pub_cond, &pub_lock);
    int ok = atomic_load(&j->dev.published) > i;
    pthread_mutex_unlock(&pub_lock);
    return ok;
}

probe_status shim_cuda_collect(struct shim_job *j, const void **data, char *reason, size_t rlen)
{
    size_t n = j->dev.npieces;
    *data = NULL;
    if (n > 1 && !(j->dev.assembled = malloc(j->dev.span))) {
        snprintf(reason, rlen, "out of host memory for the %zu-byte device copy", j->dev.span);
        return PROBE_EIO;
    }
    for (size_t i = 0; i < n; ++i) {
        struct shim_piece *pc = &j->dev.pieces[i];
        if (!piece_published(j, i) || atomic_load(&j->dev.aborted)) {
            pthread_mutex_lock(&pub_lock);
            snprintf(reason, rlen, "%s", j->reason);
            pthread_mutex_unlock(&pub_lock);
            return PROBE_EIO;
        }
        if (piece_wait(pc, reason, rlen) != 0)
            return PROBE_EIO;
        if (n > 1) {
            memcpy((char *)j->dev.assembled + i * ring.piece, ring_addr(pc->ring_off), pc->len);
            piece_return(j, pc);
            /* a tapping thread waits for space: a bigger pool is the cure */
            if (atomic_load(&ring.waiting))
                shim_cuda_grow_staging();
        }
    }
    const void *span = n > 1 ? j->dev.assembled : ring_addr(j->dev.pieces[0].ring_off);
    if (j->dev.has_strides) {
        if (!(j->dev.gathered = malloc(j->nbytes ? j->nbytes : 1))) {
            snprintf(reason, rlen, "out of host memory while gathering the device copy");
            return PROBE_EIO;
        }
        shim_gather(j->dev.gathered, span, j->rank, j->shape, j->dev.strides,
                    probe_dtype_size(j->dtype));
        span = j->dev.gathered;
    }
    *data = span;
    return PROBE_OK;
}

int shim_cuda_streams(const struct shim_job *j)
{
    return j->dev.npieces > 1 && !j->dev.has_strides;
}

probe_status shim_cuda_each_piece(struct shim_job *j, shim_piece_fn *fn, void *ctx, char *reason,
                                  size_t rlen)
{
    for (size_t i = 0; i < j->dev.npieces; ++i) {
        struct shim_piece *pc = &j->dev.pieces[i];
        if (!piece_published(j, i) || atomic_load(&j->dev.aborted)) {
            pthread_mutex_lock(&pub_lock);
            snprintf(reason, rlen, "%s", j->reason);
            pthread_mutex_unlock(&pub_lock);
            return PROBE_EIO;
        }
        if (piece_wait(pc, reason, rlen) != 0)
            return PROBE_EIO;
        probe_status st = fn(ctx, ring_addr(pc->ring_off), pc->len);
        if (st == PROBE_OK && i + 1 == j->dev.npieces)
            atomic_fetch_add(&streamed_tensors, 1);
        piece_return(j, pc);
        if (atomic_load(&ring.waiting))
            shim_cuda_grow_staging();
        if (st != PROBE_OK)
            return st;
    }
    return PROBE_OK;
}

probe_status shim_cuda_summary_collect(struct shim_job *j, probe_summary *sum, uint64_t *tree,
                                       char *reason, size_t rlen)
{
    if (piece_wait(&j->dev.done, reason, rlen) != 0)
        return PROBE_EIO;
    size_t esize = probe_dtype_size(j->dtype);
    uint64_t n = esize ? j->nbytes / esize : 0;
    const struct shim_libprobe_cuda *lc = shim_libprobe_cuda();
    if (!lc || lc->summary_result(j->dtype, n, j->dev.summary, sum, tree) != PROBE_OK) {
        snprintf(reason, rlen, "device summary unusable: %s",
                 lc ? shim_libprobe_error() : shim_libprobe_cuda_why());
        return PROBE_EIO;
    }
    return PROBE_OK;
}

void shim_cuda_summary_finish(struct shim_job *j)
{
    char ignored[SHIM_REASON_MAX];
    if (j->dev.done.state == 1 && piece_wait(&j->dev.done, ignored, sizeof ignored) != 0)
        return; /* still in flight when CUDA went away: abandoned, never reused */
    if (j->dev.done.state == 2) {
        slot_put(j->dev.summary);
        event_put(j->dev.device, j->dev.done.event);
    }
    j->dev.summary = NULL;
    j->dev.done.event = NULL;
    j->dev.done.state = 3;
}

void shim_cuda_finish(struct shim_job *j)
{
    size_t n = j->dev.npieces;
    for (size_t i = 0; i < n; ++i) {
        struct shim_piece *pc = &j->dev.pieces[i];
        if (pc->state == 0 && !piece_published(j, i))
            break; /* the submitter stopped before this piece: nothing later either */
        char ignored[SHIM_REASON_MAX];
        if (pc->state == 1 && piece_wait(pc, ignored, sizeof ignored) != 0)
            continue; /* still in flight when CUDA went away: abandoned, never reused */
        piece_return(j, pc);
    }
    free(j->dev.assembled);
    free(j->dev.gathered);
    free(j->dev.pieces);
    j->dev.assembled = j->dev.gathered = NULL;
    j->dev.pieces = NULL;
    j->dev.npieces = 0;
}

/* ---- probe_tap_stream_v1 ------------------------------------------------ */

/* probe's private copy stream on `device` (cudaStream_t), NULL when none was
 * created yet (no device tensor tapped on that device) or device is out of
 * range 0..63. */
SHIM_EXPORT void *probe_tap_stream_v1(int32_t device)
{
    if (device < 0 || device >= SHIM_MAX_DEVICES)
        return NULL;
    return atomic_load(&priv_stream[device]);
}

/* ---- versions and device names for the manifest ------------------------- */

static pthread_mutex_t info_lock = PTHREAD_MUTEX_INITIALIZER;
static int info_known, info_driver, info_runtime, info_ndev;
static char info_names[SHIM_MAX_DEVICES][256];

void shim_cuda_info_refresh(void)
{
    if (!resolve())
        return;
    pthread_mutex_lock(&info_lock);
    if (!info_known) {
        int drv = 0, run = 0, n = 0;
        if (rt.DriverGetVersion(&drv) == cudaSuccess && rt.RuntimeGetVersion(&run) == cudaSuccess &&
            rt.GetDeviceCount(&n) == cudaSuccess) {
            if (n > SHIM_MAX_DEVICES)
                n = SHIM_MAX_DEVICES;
            /* cudaDeviceProp starts with char name[256]; the struct grows
             * between releases, so give it ample room. */
            void *prop = rt.GetDeviceProperties ? calloc(1, 1 << 16) : NULL;
            for (int d = 0; d < n; ++d) {
                info_names[d][0] = '\0';
                if (prop && rt.GetDeviceProperties(prop, d) == cudaSuccess)
                    snprintf(info_names[d], sizeof info_names[d], "%.255s", (const char *)prop);
            }
            free(prop);
            info_driver = drv;
            info_runtime = run;
            info_ndev = n;
            info_known = 1;
        }
    }
    pthread_mutex_unlock(&info_lock);
}

void shim_cuda_info_json(struct shim_json *b)
{
    pthread_mutex_lock(&info_lock);
    if (info_known) {
        shim_json_printf(b, ",\"cuda\":{\"runtime_version\":%d,\"driver_version\":%d,\"devices\":[",
                         info_runtime, info_driver);
        for (int d = 0; d < info_ndev; ++d) {
            if (d)
                shim_json_raw(b, ",");
            shim_json_string(b, info_names[d]);
        }
        shim_json_printf(b, "],\"runtime_library\":");
        shim_json_string(b, rt_soname ? rt_soname : "global scope");
        shim_json_raw(b, "}");
    }
    pthread_mutex_unlock(&info_lock);
}
