// tap_device.cu - the shim's device path on a real GPU (run by
// scripts/gpu-selftest under LD_PRELOAD=libprobe_intercept.so, PROBE_OUT set).
//
// Like a user's process, it does not link probe: probe_tap_v1 is found with
// dlsym. Build: nvcc -arch=sm_90 -cudart shared (the shim takes the CUDA
// runtime from the process: a statically linked cudart is invisible to it).
//
// usage: tap_device OUT_DIR
// On a non-default stream, kernels fill device tensors; they are tapped as
// contiguous fp32, bf16, a transposed and a sliced fp32 view, and fp16
// channels-last. Then:
//  (a) a tap issued while a ~200 ms kernel runs on the producer stream must
//      return in well under 200 ms (the producer is not synchronized), and
//      capture what that kernel wrote (both times printed);
//  (b) taps on a stream inside cudaStreamBeginCapture (global mode) are
//      recorded as skipped; a tap on another stream and on the legacy stream
//      during that capture must not disturb it; the user's capture ends,
//      instantiates and replays 3 times with the right result.
// After probe_tap_flush_v1 the device buffers are copied back and saved as
// OUT_DIR/<name>.bin with one line per tap in OUT_DIR/cases.txt:
//   path dtype offset rank shape... strides...|- binfile
// for tests/gpu/check_capture (libprobe's reader) to compare bit for bit.
// One line "PASS|FAIL <check>" per check here; exit 0 when none failed.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#include "probe/dtype.h"
#include "probe/tap.h"
#include "../programs/tap_client.h"

typedef int (*tap_fn)(const probe_tap_tensor_v1 *);
static tap_fn tap;
static int (*tap_flush)(void);
static void *(*tap_stream)(int32_t);
static int failures;
static const char *out_dir;
static FILE *cases;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("FAIL %s: %s\n", #call, cudaGetErrorString(e_));                                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void result(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok)
        ++failures;
}

static double now_ms()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

__device__ uint32_t hash32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

__global__ void fill_f32(float *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)((int)(hash32((uint32_t)i ^ seed) % 20001u) - 10000) / 16.0f;
}

// finite fp16 / bf16 bit patterns: bit 14 clear, so the exponent is never all ones
__global__ void fill_16(uint16_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint16_t)(hash32((uint32_t)i ^ seed) & 0xBFFFu);
}

__device__ unsigned long long global_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// one block: spin for ns nanoseconds, then overwrite the buffer
__global__ void spin_then_fill(float *p, size_t n, uint32_t seed, unsigned long long ns)
{
    if (threadIdx.x == 0) {
        unsigned long long t0 = global_ns();
        while (global_ns() - t0 < ns) {
        }
    }
    __syncthreads();
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        p[i] = (float)((int)(hash32((uint32_t)i ^ seed) % 20001u) - 10000) / 16.0f;
}

__global__ void add_one(float *p, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += 1.0f;
}

struct Buffer {
    std::string name;
    void *dev;
    size_t bytes;
};
static std::vector<Buffer> buffers;

static void *dev_buffer(const char *name, size_t bytes)
{
    void *p = nullptr;
    CK(cudaMalloc(&p, bytes));
    buffers.push_back({name, p, bytes});
    return p;
}

static int do_tap(const char *component, long long call, int dtype, int rank, const int64_t *shape,
                  const int64_t *strides, const void *data, cudaStream_t stream)
{
    probe_tap_tensor_v1 t = tap_desc(component, call, 0);
    t.dtype = dtype;
    t.rank = rank;
    t.shape = shape;
    t.strides = strides;
    t.data = data;
    t.stream = (void *)stream;
    t.timestep = 0.0;
    return tap(&t);
}

// Tap a view of buffer `buf` (element offset `offset`) and describe it.
static void tap_view(const char *component, long long call, int dtype, size_t esize, int rank,
                     const int64_t *shape, const int64_t *strides, const char *buf, size_t offset,
                     cudaStream_t stream)
{
    const Buffer *b = nullptr;
    for (auto &x : buffers)
        if (x.name == buf)
            b = &x;
    int rc = do_tap(component, call, dtype, rank, shape, strides, (const char *)b->dev + offset * esize, stream);
    result(rc == 0, "tap /%s/%04lld/out returned %d", component, call, rc);
    fprintf(cases, "/%s/%04lld/out %d %zu %d", component, call, dtype, offset, rank);
    for (int k = 0; k < rank; ++k)
        fprintf(cases, " %lld", (long long)shape[k]);
    if (strides) {
        for (int k = 0; k < rank; ++k)
            fprintf(cases, " %lld", (long long)strides[k]);
    } else {
        fprintf(cases, " -");
    }
    fprintf(cases, " %s.bin\n", buf);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    tap = (tap_fn)dlsym(RTLD_DEFAULT, "probe_tap_v1");
    tap_flush = (int (*)(void))dlsym(RTLD_DEFAULT, "probe_tap_flush_v1");
    tap_stream = (void *(*)(int32_t))dlsym(RTLD_DEFAULT, "probe_tap_stream_v1");
    if (!tap || !tap_flush || !tap_stream) {
        printf("FAIL probe_tap_v1 not found: run under LD_PRELOAD=libprobe_intercept.so\n");
        return 2;
    }
    std::string cpath = std::string(out_dir) + "/cases.txt";
    cases = fopen(cpath.c_str(), "w");
    if (!cases)
        return 2;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s\n", prop.name);

    cudaStream_t s, s2;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

    // layouts
    float *c = (float *)dev_buffer("contig_f32", 256 * 384 * 4);
    fill_f32<<<256, 256, 0, s>>>(c, 256 * 384, 1);
    int64_t sc[2] = {256, 384};
    tap_view("gpu", 0, PROBE_DTYPE_FLOAT32, 4, 2, sc, nullptr, "contig_f32", 0, s);

    uint16_t *bf = (uint16_t *)dev_buffer("bf16", 4 * 77 * 129 * 2);
    fill_16<<<256, 256, 0, s>>>(bf, 4 * 77 * 129, 2);
    int64_t sbf[3] = {4, 77, 129};
    tap_view("gpu", 1, PROBE_DTYPE_BFLOAT16, 2, 3, sbf, nullptr, "bf16", 0, s);

    float *tr = (float *)dev_buffer("transposed_f32", 384 * 256 * 4);
    fill_f32<<<256, 256, 0, s>>>(tr, 384 * 256, 3);
    int64_t str_[2] = {256, 384}, sttr[2] = {1, 256}; // base [384, 256] viewed as its transpose
    tap_view("gpu", 2, PROBE_DTYPE_FLOAT32, 4, 2, str_, sttr, "transposed_f32", 0, s);

    float *sl = (float *)dev_buffer("sliced_f32", 100 * 200 * 4);
    fill_f32<<<256, 256, 0, s>>>(sl, 100 * 200, 4);
    int64_t ssl[2] = {80, 64}, stsl[2] = {200, 3}; // base [100, 200], view [10:90, 5:197:3]
    tap_view("gpu", 3, PROBE_DTYPE_FLOAT32, 4, 2, ssl, stsl, "sliced_f32", 10 * 200 + 5, s);

    uint16_t *cl = (uint16_t *)dev_buffer("channels_last_f16", 2 * 16 * 24 * 40 * 2);
    fill_16<<<256, 256, 0, s>>>(cl, 2 * 16 * 24 * 40, 5);
    int64_t scl[4] = {2, 16, 24, 40}, stcl[4] = {24 * 40 * 16, 1, 40 * 16, 16}; // NCHW logical, NHWC memory
    tap_view("gpu", 4, PROBE_DTYPE_FLOAT16, 2, 4, scl, stcl, "channels_last_f16", 0, s);

    void *ps = tap_stream(0);
    result(ps != nullptr && ps != (void *)s, "probe_tap_stream_v1(0) is probe's own stream (%p)", ps);

    // (a) tap while a ~200 ms kernel runs on the producer stream
    const size_t nspin = 1 << 16;
    float *sp = (float *)dev_buffer("spin_f32", nspin * 4);
    fill_f32<<<64, 256, 0, s>>>(sp, nspin, 6);
    CK(cudaStreamSynchronize(s));
    cudaEvent_t k0, k1;
    CK(cudaEventCreate(&k0));
    CK(cudaEventCreate(&k1));
    CK(cudaEventRecord(k0, s));
    spin_then_fill<<<1, 1024, 0, s>>>(sp, nspin, 7, 200ull * 1000 * 1000);
    CK(cudaEventRecord(k1, s));
    int64_t ssp[1] = {(int64_t)nspin};
    double t0 = now_ms();
    int rc = do_tap("spin", 0, PROBE_DTYPE_FLOAT32, 1, ssp, nullptr, sp, s);
    double tap_ms = now_ms() - t0;
    fprintf(cases, "/spin/0000/out %d 0 1 %lld - spin_f32.bin\n", PROBE_DTYPE_FLOAT32, (long long)nspin);
    cudaError_t q = cudaStreamQuery(s);
    CK(cudaEventSynchronize(k1));
    float kernel_ms = 0;
    CK(cudaEventElapsedTime(&kernel_ms, k0, k1));
    printf("spin kernel %.1f ms on the producer stream; probe_tap_v1 returned in %.3f ms "
           "(stream still busy after the tap: %s)\n",
           kernel_ms, tap_ms, q == cudaErrorNotReady ? "yes" : "no");
    result(rc == 0 && kernel_ms >= 150 && tap_ms < 0.25 * kernel_ms && q == cudaErrorNotReady,
           "(a) tap during a %.0f ms kernel returned in %.3f ms without synchronizing the producer",
           kernel_ms, tap_ms);

    // (b) graph capture in global mode on s2
    const size_t ng = 4096;
    float *g = (float *)dev_buffer("graph_f32", ng * 4);
    float *other = (float *)dev_buffer("during_capture_f32", ng * 4);
    fill_f32<<<16, 256, 0, s2>>>(g, ng, 8);
    fill_f32<<<16, 256, 0, s>>>(other, ng, 9);
    CK(cudaDeviceSynchronize());
    std::vector<float> g0(ng), g3(ng);
    CK(cudaMemcpy(g0.data(), g, ng * 4, cudaMemcpyDeviceToHost));
    int64_t sg[1] = {(int64_t)ng};
    CK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
    add_one<<<(ng + 255) / 256, 256, 0, s2>>>(g, ng);
    int rc_cap = do_tap("graph", 0, PROBE_DTYPE_FLOAT32, 1, sg, nullptr, g, s2);
    int rc_other = do_tap("graph", 1, PROBE_DTYPE_FLOAT32, 1, sg, nullptr, other, s);
    fprintf(cases, "/graph/0001/out %d 0 1 %lld - during_capture_f32.bin\n", PROBE_DTYPE_FLOAT32, (long long)ng);
    int rc_legacy = do_tap("graph", 2, PROBE_DTYPE_FLOAT32, 1, sg, nullptr, other, 0);
    cudaGraph_t graph = nullptr;
    cudaError_t e_end = cudaStreamEndCapture(s2, &graph);
    result(rc_cap == 0, "(b) tap on the capturing stream returned %d (recorded as skipped)", rc_cap);
    result(rc_other == 0, "(b) tap on another stream during the capture returned %d", rc_other);
    result(rc_legacy == 0, "(b) tap on the legacy stream during the capture returned %d", rc_legacy);
    result(e_end == cudaSuccess && graph != nullptr, "(b) the user's capture ended: %s", cudaGetErrorString(e_end));
    if (e_end == cudaSuccess) {
        cudaGraphExec_t exec = nullptr;
        cudaError_t e_inst = cudaGraphInstantiate(&exec, graph, 0);
        result(e_inst == cudaSuccess, "(b) the captured graph instantiates: %s", cudaGetErrorString(e_inst));
        size_t nodes = 0;
        CK(cudaGraphGetNodes(graph, nullptr, &nodes));
        result(nodes == 1, "(b) the graph holds only the user's kernel (%zu node(s); a probe copy would add one)", nodes);
        if (e_inst == cudaSuccess) {
            for (int i = 0; i < 3; ++i)
                CK(cudaGraphLaunch(exec, s2));
            CK(cudaStreamSynchronize(s2));
            CK(cudaMemcpy(g3.data(), g, ng * 4, cudaMemcpyDeviceToHost));
            bool ok = true;
            for (size_t i = 0; i < ng; ++i)
                ok = ok && g3[i] == g0[i] + 3.0f;
            result(ok, "(b) 3 replays added exactly 3 to every element");
        }
    }
    CK(cudaGetLastError());

    rc = tap_flush();
    result(rc == 0, "probe_tap_flush_v1 returned %d", rc);
    CK(cudaDeviceSynchronize());
    for (auto &b : buffers) {
        std::vector<char> h(b.bytes);
        CK(cudaMemcpy(h.data(), b.dev, b.bytes, cudaMemcpyDeviceToHost));
        std::string p = std::string(out_dir) + "/" + b.name + ".bin";
        FILE *f = fopen(p.c_str(), "wb");
        if (!f || fwrite(h.data(), 1, b.bytes, f) != b.bytes)
            result(false, "write %s", p.c_str());
        if (f)
            fclose(f);
    }
    fclose(cases);
    printf("tap_device: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
