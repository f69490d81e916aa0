/* shim_tap_device_mock.c - the shim's device path against a CPU mock of the
 * CUDA runtime (tests/fakes/mock_cudart.c, loaded RTLD_GLOBAL as
 * libcudart.so.13 the way torch's runtime is), so event ordering, the
 * private stream, pinned staging, strided spans, graph-capture skips, device
 * switching and the exit path are exercised without a GPU.
 *
 * usage: shim_tap_device_mock MOCK_LIB EXPECT_DIR main|exitpending|lateexit-notap|lateexit-host
 *   main         device tensors of several layouts/dtypes (base buffers and a
 *                JSON line per tap left in EXPECT_DIR, as shim_tap_host does),
 *                a tap behind a 300 ms "kernel", taps while a stream captures
 *                a graph, a device-1 tensor, 4 threads x 50 taps; then the
 *                mock's counters must show no forbidden call.
 *   exitpending  a device copy still queued behind a 2 s kernel when main
 *                returns and the runtime tears down first: it must be recorded
 *                as skipped, and the process must not wait for the kernel.
 *   chunked      run with PROBE_PINNED_MB=16 (4 MiB pieces): tensors larger than
 *                a piece and than the whole pool (contiguous, transposed,
 *                behind a kernel) and 4 threads tapping two-piece tensors at
 *                once; the test checks every byte and the manifest's staging.
 *   graph        a tap inside a stream capture, the graph ended, instantiated and
 *                launched 3 times through the interposed runtime calls, then a
 *                second graph without taps launched twice: every launch must
 *                reach the runtime; the test checks probe.skips.
 *   lateexit-*   the runtime is initialized but torn down before the shim's
 *                finalizer runs (no device tap was made): the shim must not
 *                call it at exit (the mock aborts if it does, in strict mode).
 * Prints "FAIL ..." for each broken expectation; exit 0 when there is none.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe/dtype.h"
#include "probe/tap.h"
#include "tap_client.h"

typedef int (*tap_fn)(const probe_tap_tensor_v1 *);
static tap_fn tap;
static void *(*tap_stream)(int32_t);
static int (*tap_flush)(void);
static int (*create_stream)(void **, unsigned);
static int (*set_device)(int);
static int (*get_device)(int *);
static void (*spin)(void *, int, void *, const void *, size_t);
static void (*capture)(void *, int);
static void (*mark_tapper)(void);
static int (*capture_mode)(void);
static void (*teardown)(void);
static void (*mock_stats)(long long *, int);

#define GETSYM(var, name) *(void **)&var = dlsym(RTLD_DEFAULT, name)

static const char *dir;
static FILE *cases;
static atomic_int failures;
static uint64_t rng = 12345;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL " __VA_ARGS__);                                                               \
        printf("\n");                                                                              \
        atomic_fetch_add(&failures, 1);                                                            \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static uint64_t next64(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t esize(int dt)
{
    switch (dt) {
    case PROBE_DTYPE_INT8: case PROBE_DTYPE_UINT8: case PROBE_DTYPE_BOOL: return 1;
    case PROBE_DTYPE_FLOAT16: case PROBE_DTYPE_BFLOAT16: return 2;
    case PROBE_DTYPE_FLOAT32: case PROBE_DTYPE_INT32: return 4;
    default: return 8;
    }
}

/* Finite values for float types (bits chosen so no exponent is all ones). */
static void fill(unsigned char *p, size_t n, int dt)
{
    for (size_t i = 0; i < n; ++i) {
        uint64_t r = next64();
        if (dt == PROBE_DTYPE_FLOAT32) {
            float f = (float)((int64_t)(r % 20001) - 10000) / 16.0f;
            memcpy(p + 4 * i, &f, 4);
        } else if (dt == PROBE_DTYPE_FLOAT64) {
            double d = (double)((int64_t)(r % 20001) - 10000) / 1024.0;
            memcpy(p + 8 * i, &d, 8);
        } else if (dt == PROBE_DTYPE_FLOAT16 || dt == PROBE_DTYPE_BFLOAT16) {
            uint16_t h = (uint16_t)(r & 0xBFFF); /* bit 14 clear: exponent never all ones */
            memcpy(p + 2 * i, &h, 2);
        } else {
            memcpy(p + esize(dt) * i, &r, esize(dt));
        }
    }
}

static void describe(const char *path, int dt, const char *bin, size_t offset, int rank,
                     const int64_t *shape, const int64_t *strides, int device)
{
    flockfile(cases); /* one whole line per case: threads describe concurrently */
    fprintf(cases, "{\"path\":\"%s\",\"dtype\":%d,\"bin\":\"%s\",\"offset\":%zu,\"device\":%d,\"shape\":[",
            path, dt, bin, offset, device);
    for (int k = 0; k < rank; ++k)
        fprintf(cases, "%s%lld", k ? "," : "", (long long)shape[k]);
    fprintf(cases, "],\"strides\":");
    if (strides) {
        fprintf(cases, "[");
        for (int k = 0; k < rank; ++k)
            fprintf(cases, "%s%lld", k ? "," : "", (long long)strides[k]);
        fprintf(cases, "]}\n");
    } else {
        fprintf(cases, "null}\n");
    }
    fflush(cases);
    funlockfile(cases);
}

static void save(const char *bin, const void *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, bin);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n)
        FAIL("cannot write %s", path);
    if (f)
        fclose(f);
}

static probe_tap_tensor_v1 desc(const char *component, long long call, int dt, int rank,
                                const int64_t *shape, const int64_t *strides, const void *data,
                                int device, void *stream)
{
    probe_tap_tensor_v1 t = tap_desc(component, call, device);
    t.dtype = dt;
    t.rank = rank;
    t.shape = shape;
    t.strides = strides;
    t.data = data;
    t.stream = stream;
    return t;
}

/* Keep "device" buffers alive until the copies are done (the record_stream
 * contract): freed after the flush. */
static void *keep[4096];
static atomic_int nkeep;

static void *dev_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    keep[atomic_fetch_add(&nkeep, 1)] = p;
    return p;
}

static void layout_case(const char *component, long long call, int dt, int rank, const int64_t *shape,
                        const int64_t *strides, size_t base_n, size_t offset, int device, void *stream)
{
    size_t es = esize(dt);
    unsigned char *base = dev_alloc(base_n * es);
    fill(base, base_n, dt);
    char bin[256], path[256];
    snprintf(bin, sizeof bin, "%s.%04lld.bin", component, call);
    snprintf(path, sizeof path, "/%s/%04lld/out", component, call);
    save(bin, base, base_n * es);
    probe_tap_tensor_v1 t = desc(component, call, dt, rank, shape, strides, base + offset * es, device, stream);
    int rc = tap(&t);
    if (rc != 0)
        FAIL("tap %s returned %d", path, rc);
    describe(path, dt, bin, offset, rank, shape, strides, device);
}

struct thread_arg {
    int t;
    void *stream;
};

static void *worker(void *p)
{
    struct thread_arg *a = p;
    mark_tapper();
    char comp[32];
    snprintf(comp, sizeof comp, "dthr%d", a->t);
    for (int i = 0; i < 50; ++i) {
        int64_t shape[2] = {3 + i % 5, 11};
        size_t n = (size_t)shape[0] * 11;
        int32_t *buf = dev_alloc(n * sizeof *buf);
        for (size_t k = 0; k < n; ++k)
            buf[k] = (int32_t)(a->t * 1000003 + i * 1009 + (int)k);
        probe_tap_tensor_v1 t = desc(comp, i, PROBE_DTYPE_INT32, 2, shape, NULL, buf, 0, a->stream);
        if (tap(&t) != 0)
            FAIL("thread %d tap %d", a->t, i);
    }
    return NULL;
}

static int run_main(void)
{
    mark_tapper();
    void *s = NULL, *s2 = NULL, *s1 = NULL;
    create_stream(&s, 0);
    create_stream(&s2, 0);

    /* layouts */
    int64_t c[2] = {64, 33};
    layout_case("dev", 0, PROBE_DTYPE_FLOAT32, 2, c, NULL, 64 * 33, 0, 0, s);
    int64_t tr[2] = {33, 64}, trs[2] = {1, 33};
    layout_case("dev", 1, PROBE_DTYPE_FLOAT32, 2, tr, trs, 64 * 33, 0, 0, s);
    int64_t sl[2] = {5, 4}, sls[2] = {12, 2};
    layout_case("dev", 2, PROBE_DTYPE_FLOAT64, 2, sl, sls, 120, 27, 0, s);
    int64_t cl[4] = {2, 3, 4, 5}, cls[4] = {60, 1, 15, 3};
    layout_case("dev", 3, PROBE_DTYPE_FLOAT16, 4, cl, cls, 120, 0, 0, s);
    int64_t bf[3] = {5, 7, 9};
    layout_case("dev", 4, PROBE_DTYPE_BFLOAT16, 3, bf, NULL, 315, 0, 0, s);
    layout_case("dev", 5, PROBE_DTYPE_FLOAT32, 0, NULL, NULL, 1, 0, 0, s);
    int64_t z[2] = {0, 4};
    layout_case("dev", 6, PROBE_DTYPE_FLOAT32, 2, z, NULL, 1, 0, 0, s);
    int64_t br[2] = {6, 5}, brs[2] = {0, 1};
    layout_case("dev", 7, PROBE_DTYPE_INT8, 2, br, brs, 5, 0, 0, s);
    layout_case("dev", 8, PROBE_DTYPE_FLOAT32, 2, c, NULL, 64 * 33, 0, 0, NULL); /* legacy stream */

    /* a tap behind a 300 ms kernel: the tap must not wait for it, and the
     * copy must see what the kernel wrote */
    size_t n = 1 << 16;
    float *buf = dev_alloc(n * sizeof *buf), *after = malloc(n * sizeof *after);
    fill((unsigned char *)buf, n, PROBE_DTYPE_FLOAT32);
    fill((unsigned char *)after, n, PROBE_DTYPE_FLOAT32);
    save("spin.0000.bin", after, n * sizeof *after);
    int64_t sp[1] = {(int64_t)n};
    spin(s, 300, buf, after, n * sizeof *after);
    double t0 = now_ms();
    probe_tap_tensor_v1 t = desc("spin", 0, PROBE_DTYPE_FLOAT32, 1, sp, NULL, buf, 0, s);
    int rc = tap(&t);
    double tap_ms = now_ms() - t0;
    describe("/spin/0000/out", PROBE_DTYPE_FLOAT32, "spin.0000.bin", 0, 1, sp, NULL, 0);
    printf("kernel 300 ms on the producer stream; probe_tap_v1 returned in %.3f ms\n", tap_ms);
    if (rc != 0 || tap_ms > 100.0)
        FAIL("tap behind a 300 ms kernel: rc=%d, %.3f ms", rc, tap_ms);
    free(after);

    /* graph capture on s2: nothing may be enqueued on it */
    float small[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t s8[1] = {8};
    float *d8 = dev_alloc(sizeof small);
    memcpy(d8, small, sizeof small);
    save("cap.0002.bin", small, sizeof small);
    save("cap.0003.bin", small, sizeof small);
    capture(s2, 1);
    t = desc("cap", 0, PROBE_DTYPE_FLOAT32, 1, s8, NULL, d8, 0, s2);
    if ((rc = tap(&t)) != 0)
        FAIL("tap on a capturing stream returned %d (want 0, recorded as skipped)", rc);
    t = desc("cap", 1, PROBE_DTYPE_FLOAT32, 1, s8, NULL, d8, 0, NULL);
    if ((rc = tap(&t)) != 0)
        FAIL("tap on the legacy stream during a capture returned %d", rc);
    t = desc("cap", 3, PROBE_DTYPE_FLOAT32, 1, s8, NULL, d8, 0, s); /* another stream: fine */
    if ((rc = tap(&t)) != 0)
        FAIL("tap on a non-capturing stream during a capture returned %d", rc);
    describe("/cap/0003/out", PROBE_DTYPE_FLOAT32, "cap.0003.bin", 0, 1, s8, NULL, 0);
    capture(s2, 0);
    t = desc("cap", 2, PROBE_DTYPE_FLOAT32, 1, s8, NULL, d8, 0, s2);
    if ((rc = tap(&t)) != 0)
        FAIL("tap after the capture ended returned %d", rc);
    describe("/cap/0002/out", PROBE_DTYPE_FLOAT32, "cap.0002.bin", 0, 1, s8, NULL, 0);

    /* device 1 from a thread whose current device is 0 */
    set_device(1);
    create_stream(&s1, 0);
    set_device(0);
    int64_t d1shape[2] = {9, 10};
    layout_case("dev1", 0, PROBE_DTYPE_FLOAT32, 2, d1shape, NULL, 90, 0, 1, s1);
    int cur = -1;
    get_device(&cur);
    if (cur != 0)
        FAIL("current device after a device-1 tap is %d, want 0", cur);
    void *p0 = tap_stream(0), *p1 = tap_stream(1);
    if (!p0 || !p1 || p0 == p1 || p0 == s || p1 == s1)
        FAIL("probe_tap_stream_v1: device 0 %p, device 1 %p", p0, p1);
    if (tap_stream(5) != NULL)
        FAIL("probe_tap_stream_v1(5) should be NULL");
    if (capture_mode() != 0)
        FAIL("capture mode of the tapping thread not restored: %d", capture_mode());

    /* threads, each on its own stream */
    pthread_t th[4];
    struct thread_arg args[4];
    for (int i = 0; i < 4; ++i) {
        args[i].t = i;
        create_stream(&args[i].stream, 1);
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    for (int i = 0; i < 4; ++i)
        pthread_join(th[i], NULL);

    if ((rc = tap_flush()) != 0)
        FAIL("flush returned %d", rc);

    /* steady state: with the writer keeping up, staging space and events
     * come from the pools (no new event; cudaHostAlloc only as the idle
     * writer adds the pool's 64 MiB segments, at most 16 for the default
     * 1 GiB pool) */
    long long before[15], st[15];
    mock_stats(before, 15);
    for (int i = 0; i < 20; ++i) {
        int64_t shape[2] = {64, 33};
        float *b = dev_alloc(64 * 33 * sizeof *b);
        char bin[64];
        fill((unsigned char *)b, 64 * 33, PROBE_DTYPE_FLOAT32);
        snprintf(bin, sizeof bin, "pool.%04d.bin", i);
        save(bin, b, 64 * 33 * sizeof *b);
        t = desc("pool", i, PROBE_DTYPE_FLOAT32, 2, shape, NULL, b, 0, s);
        if ((rc = tap(&t)) != 0 || (rc = tap_flush()) != 0)
            FAIL("pool tap %d: %d", i, rc);
        char path[64];
        snprintf(path, sizeof path, "/pool/%04d/out", i);
        describe(path, PROBE_DTYPE_FLOAT32, bin, 0, 2, shape, NULL, 0);
    }
    mock_stats(st, 15);
    if (st[0] > 16 || st[12] != before[12])
        FAIL("pools not reused: cudaHostAlloc %lld -> %lld, events %lld -> %lld over 20 sequential taps",
             before[0], st[0], before[12], st[12]);
    printf("mock: hostalloc=%lld freehost=%lld streamsync=%lld devicesync=%lld malloc=%lld "
           "memcpy_async=%lld event_sync=%lld violations=%lld sync_on_tapper=%lld exchange=%lld "
           "setdevice=%lld streams=%lld events=%lld records=%lld waits=%lld\n",
           st[0], st[1], st[2], st[3], st[4], st[5], st[6], st[7], st[8], st[9], st[10], st[11],
           st[12], st[13], st[14]);
    if (st[1] || st[2] || st[3] || st[4])
        FAIL("forbidden calls: cudaFreeHost %lld, cudaStreamSynchronize %lld, cudaDeviceSynchronize %lld, cudaMalloc %lld",
             st[1], st[2], st[3], st[4]);
    if (st[7])
        FAIL("%lld rule violations (work on a capturing stream, event/stream device mismatch, "
             "non-relaxed sync during capture)", st[7]);
    if (st[8])
        FAIL("cudaEventSynchronize called %lld times on a tapping thread", st[8]);
    /* 8 layouts + spin + 2 cap + dev1 + 200 thread taps + 20 pool = 232 copies
     * (the zero-size one needs none) */
    if (st[5] != 232)
        FAIL("cudaMemcpyAsync called %lld times, want 232", st[5]);
    if (st[11] != 7 + 2)
        FAIL("streams created: %lld (7 by the program + 2 private, one per device)", st[11]);
    for (int i = 0; i < atomic_load(&nkeep); ++i)
        free(keep[i]);
    printf("device mock taps done, failures=%d\n", atomic_load(&failures));
    return atomic_load(&failures) ? 1 : 0;
}

struct big_arg {
    int t;
    void *stream;
};

static void *big_worker(void *p)
{
    struct big_arg *a = p;
    mark_tapper();
    char comp[32];
    snprintf(comp, sizeof comp, "bthr%d", a->t);
    int64_t shape[2] = {1536, 1024}; /* 6 MiB of float32: two 4 MiB pieces */
    for (int i = 0; i < 6; ++i)
        layout_case(comp, i, PROBE_DTYPE_FLOAT32, 2, shape, NULL, 1536 * 1024, 0, 0, a->stream);
    return NULL;
}

static int run_chunked(void)
{
    mark_tapper();
    void *s = NULL;
    create_stream(&s, 0);
    /* 40 MiB contiguous: 10 pieces through a 16 MiB pool */
    int64_t big[2] = {10240, 1024};
    layout_case("big", 0, PROBE_DTYPE_FLOAT32, 2, big, NULL, 10240 * 1024, 0, 0, s);
    /* transposed 24 MiB float64 span, gathered after assembly */
    int64_t tr[2] = {1024, 3072}, trs[2] = {1, 1024};
    layout_case("big", 1, PROBE_DTYPE_FLOAT64, 2, tr, trs, 3072 * 1024, 0, 0, s);
    /* 20 MiB behind a 300 ms kernel: every piece sees what the kernel wrote */
    size_t n = 5 << 20;
    float *buf = dev_alloc(n * sizeof *buf), *after = malloc(n * sizeof *after);
    fill((unsigned char *)buf, n, PROBE_DTYPE_FLOAT32);
    fill((unsigned char *)after, n, PROBE_DTYPE_FLOAT32);
    save("bigspin.0000.bin", after, n * sizeof *after);
    spin(s, 300, buf, after, n * sizeof *after);
    int64_t sp[1] = {(int64_t)n};
    probe_tap_tensor_v1 t = desc("bigspin", 0, PROBE_DTYPE_FLOAT32, 1, sp, NULL, buf, 0, s);
    if (tap(&t) != 0)
        FAIL("bigspin tap");
    describe("/bigspin/0000/out", PROBE_DTYPE_FLOAT32, "bigspin.0000.bin", 0, 1, sp, NULL, 0);
    free(after);
    pthread_t th[4];
    struct big_arg args[4];
    for (int i = 0; i < 4; ++i) {
        args[i].t = i;
        create_stream(&args[i].stream, 0);
        pthread_create(&th[i], NULL, big_worker, &args[i]);
    }
    for (int i = 0; i < 4; ++i)
        pthread_join(th[i], NULL);
    if (tap_flush() != 0)
        FAIL("flush");
    long long st[16] = {0};
    mock_stats(st, 16);
    if (st[1] || st[2] || st[3] || st[4] || st[7] || st[8])
        FAIL("forbidden calls: freehost %lld streamsync %lld devsync %lld malloc %lld violations %lld "
             "event-sync-on-tapper %lld", st[1], st[2], st[3], st[4], st[7], st[8]);
    /* the pool: one allocation below 128 MiB, else 64 MiB segments (the
     * first at the first tap, the others by the writer while idle) */
    const char *mb = getenv("PROBE_PINNED_MB");
    long long segs = mb && atoll(mb) >= 128 ? atoll(mb) / 64 : 1;
    if (st[0] < 1 || st[0] > segs)
        FAIL("cudaHostAlloc called %lld times, want 1..%lld (the pool)", st[0], segs);
    for (int i = 0; i < atomic_load(&nkeep); ++i)
        free(keep[i]);
    printf("chunked taps done, failures=%d\n", atomic_load(&failures));
    return atomic_load(&failures) ? 1 : 0;
}

static int run_graph(void)
{
    int (*end)(void *, void **), (*inst)(void **, void *, unsigned long long);
    int (*launch)(void *, void *), (*xdestroy)(void *), (*gdestroy)(void *);
    unsigned long long (*launches)(void);
    GETSYM(end, "cudaStreamEndCapture");
    GETSYM(inst, "cudaGraphInstantiateWithFlags");
    GETSYM(launch, "cudaGraphLaunch");
    GETSYM(xdestroy, "cudaGraphExecDestroy");
    GETSYM(gdestroy, "cudaGraphDestroy");
    GETSYM(launches, "mock_cuda_graph_launches");
    if (!end || !inst || !launch || !xdestroy || !gdestroy || !launches) {
        FAIL("graph entry points not found");
        return 1;
    }
    mark_tapper();
    void *s = NULL;
    create_stream(&s, 0);
    float v[4] = {1, 2, 3, 4};
    int64_t s4[1] = {4};
    float *d = dev_alloc(sizeof v);
    memcpy(d, v, sizeof v);
    for (int g = 0; g < 2; ++g) {
        capture(s, 1);
        if (g == 0) {
            probe_tap_tensor_v1 t = desc("gdit", 0, PROBE_DTYPE_FLOAT32, 1, s4, NULL, d, 0, s);
            if (tap(&t) != 0)
                FAIL("tap during capture");
        }
        void *graph = NULL, *exec = NULL;
        if (end(s, &graph) != 0 || !graph)
            FAIL("cudaStreamEndCapture through the shim");
        if (inst(&exec, graph, 0) != 0 || !exec)
            FAIL("cudaGraphInstantiateWithFlags through the shim");
        for (int k = 0; k < 3 - g; ++k)
            if (launch(exec, s) != 0)
                FAIL("cudaGraphLaunch through the shim");
        if (xdestroy(exec) != 0 || gdestroy(graph) != 0)
            FAIL("destroy through the shim");
    }
    /* after the first tap (a host one), so the file is open in every mode */
    probe_tap_tensor_v1 t = desc("after", 0, PROBE_DTYPE_FLOAT32, 1, s4, NULL, v, -1, NULL);
    if (tap(&t) != 0)
        FAIL("host tap");
    if (launches() != 5)
        FAIL("the runtime saw %llu graph launches, want 5", launches());
    printf("graph: %llu launches forwarded, failures=%d\n", launches(), atomic_load(&failures));
    return atomic_load(&failures) ? 1 : 0;
}

static int run_exitpending(void)
{
    void *s = NULL;
    create_stream(&s, 0);
    float v[4] = {1, 2, 3, 4};
    int64_t s4[1] = {4};
    float *d = dev_alloc(sizeof v);
    memcpy(d, v, sizeof v);
    save("first.0000.bin", v, sizeof v);
    probe_tap_tensor_v1 t = desc("first", 0, PROBE_DTYPE_FLOAT32, 1, s4, NULL, d, 0, s);
    if (tap(&t) != 0)
        FAIL("first tap");
    describe("/first/0000/out", PROBE_DTYPE_FLOAT32, "first.0000.bin", 0, 1, s4, NULL, 0);
    if (tap_flush() != 0)
        FAIL("flush");
    /* registered after the shim's handler: runs first at exit, like a
     * runtime loaded after probe opened its file */
    atexit(teardown);
    spin(s, 2000, d, v, sizeof v);
    t = desc("pending", 0, PROBE_DTYPE_FLOAT32, 1, s4, NULL, d, 0, s);
    if (tap(&t) != 0)
        FAIL("pending tap");
    printf("exitpending: returning from main with a copy queued behind a 2 s kernel, failures=%d\n",
           atomic_load(&failures));
    return atomic_load(&failures) ? 1 : 0;
}

/* The CUDA runtime is loaded and initialized (as importing torch does) but
 * its exit teardown runs before the shim's finalizer, and the shim must not
 * call it then (with MOCK_CUDART_STRICT_TEARDOWN=1 any such call aborts).
 * host_taps: 0 = never tap (the file is created at exit), 1 = one host tap. */
static int run_lateexit(int host_taps)
{
    int (*count)(int *);
    *(void **)&count = dlsym(RTLD_DEFAULT, "cudaGetDeviceCount");
    int n = 0;
    if (!count || count(&n) != 0 || n != 2)
        FAIL("mock runtime not initialized");
    if (host_taps) {
        float v[3] = {1, 2, 3};
        int64_t s3[1] = {3};
        probe_tap_tensor_v1 t = desc("host", 0, PROBE_DTYPE_FLOAT32, 1, s3, NULL, v, -1, NULL);
        if (tap(&t) != 0)
            FAIL("host tap");
    }
    atexit(teardown); /* registered after the shim's handlers: runs before them */
    printf("lateexit(%d): returning, failures=%d\n", host_taps, atomic_load(&failures));
    return atomic_load(&failures) ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s MOCK_LIB EXPECT_DIR main|exitpending\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
        return 2;
    }
    dir = argv[2];
#define GET(var, name) *(void **)&var = dlsym(RTLD_DEFAULT, name)
    GET(tap, "probe_tap_v1");
    GET(tap_stream, "probe_tap_stream_v1");
    GET(tap_flush, "probe_tap_flush_v1");
    GET(create_stream, "cudaStreamCreateWithFlags");
    GET(set_device, "cudaSetDevice");
    GET(get_device, "cudaGetDevice");
    GET(spin, "mock_cuda_spin");
    GET(capture, "mock_cuda_capture");
    GET(mark_tapper, "mock_cuda_mark_tapper");
    GET(capture_mode, "mock_cuda_capture_mode");
    GET(teardown, "mock_cuda_teardown");
    GET(mock_stats, "mock_cuda_stats");
    if (!tap || !tap_stream || !tap_flush || !create_stream || !spin || !mock_stats) {
        fprintf(stderr, "tap ABI or mock runtime not found\n");
        return 2;
    }
    char p[1024];
    snprintf(p, sizeof p, "%s/cases.jsonl", dir);
    cases = fopen(p, "w");
    if (!cases)
        return 2;
    if (strcmp(argv[3], "main") == 0)
        return run_main();
    if (strcmp(argv[3], "graph") == 0)
        return run_graph();
    if (strcmp(argv[3], "chunked") == 0)
        return run_chunked();
    if (strcmp(argv[3], "exitpending") == 0)
        return run_exitpending();
    if (strcmp(argv[3], "lateexit-notap") == 0)
        return run_lateexit(0);
    if (strcmp(argv[3], "lateexit-host") == 0)
        return run_lateexit(1);
    return 2;
}
