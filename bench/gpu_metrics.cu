/* gpu_metrics.cu - benchmark of libprobe_cuda's passes (not a test).
 *
 *   gpu_metrics [N [fused|all [S]]]   default N = 268435456 (2^28) bfloat16 elements
 *                             per side; "fused": only the fused pass (for builds
 *                             with another -DPROBE_CUDA_GROUPS), "all": every
 *                             pass (the default); S: the candidate's spread
 *                             exponent (default 9, below)
 *
 * Builds the engine from source (#include of metrics/cuda/metrics.cu) so that
 * its passes can be timed one by one: the fused stats pass (+ its one-block
 * combine; with and without the p99's first histogram level), the p99 radix
 * select after it, the whole probe_cuda_metrics call, probe_cuda_summary of
 * one side, probe_cuda_metrics with a channel shift (16384 channels x 1024:
 * the row path; 1536 channels last: the column path), and a plain read of
 * both inputs and a device-to-device copy as the memory ceilings. Data: x ~ N(0,1) (sum of
 * four uniforms, scaled), r = bf16(x), c = bf16(x * (1 + 2^-S u)), u uniform
 * in [-1, 1): with S = 9, about the disagreement of a bf16 kernel swap (its
 * p99 is 2^-7, one ulp of [1, 2): a level-0 bin of its own, no select
 * pass); with S = 4 the p99 is not 2^e or 1.5 * 2^e (1.75 * 2^-4 in a numpy
 * model of this generator; the run prints it) and takes the select passes.
 * Times: median of 10 after 3 warm-ups, CUDA events. Link: -L build/lib -lprobe.
 */
#include "../metrics/cuda/metrics.cu"

#include <stdio.h>

__device__ static inline uint32_t hash32(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

__device__ static inline uint16_t to_bf16(float f)
{
    uint32_t b = __float_as_uint(f);
    b += 0x7FFFu + ((b >> 16) & 1u); /* round to nearest even (finite inputs) */
    return (uint16_t)(b >> 16);
}

__global__ void gen_kernel(uint16_t *r, uint16_t *c, uint64_t n, float spread)
{
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float s = 0;
        for (int k = 0; k < 4; k++)
            s += (float)hash32(i * 8 + k) * 2.3283064e-10f;
        float x = (s - 2.0f) * 1.7320508f;
        float u = (float)hash32(i * 8 + 5) * 2.3283064e-10f * 2.0f - 1.0f;
        r[i] = to_bf16(x);
        c[i] = to_bf16(x * (1.0f + u * spread));
    }
}

__global__ void read_kernel(const uint4 *a, const uint4 *b, uint64_t n16, unsigned *sink)
{
    unsigned acc = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint4 x = __ldg(a + i), y = __ldg(b + i);
        acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
    }
    if (acc == 0x12345678u)
        *sink = acc;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                            \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define REPS 10
#define WARM 3

int main(int argc, char **argv)
{
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (1ull << 28);
    uint16_t *r, *c;
    CK(cudaMalloc((void **)&r, n * 2));
    CK(cudaMalloc((void **)&c, n * 2));
    unsigned *sink;
    CK(cudaMalloc((void **)&sink, 4));
    int sexp = argc > 3 ? atoi(argv[3]) : 9;
    if (sexp < 1 || sexp > 30) {
        fprintf(stderr, "gpu_metrics: SPREAD is an exponent in 1..30\n");
        return 2;
    }
    gen_kernel<<<132 * 16, 256>>>(r, c, n, ldexpf(1.0f, -sexp));
    CK(cudaDeviceSynchronize());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float t[REPS];
    double bytes = 2.0 * 2.0 * (double)n;
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("gpu_metrics: %s, n = %llu bfloat16 per side (%.3f GB read for both)\n", prop.name,
           (unsigned long long)n, bytes / 1e9);

#define TIME(label, ...)                                                                           \
    do {                                                                                           \
        for (int it = 0; it < WARM + REPS; it++) {                                                 \
            cudaEventRecord(e0, st);                                                               \
            __VA_ARGS__;                                                                                \
            cudaEventRecord(e1, st);                                                               \
            cudaEventSynchronize(e1);                                                              \
            if (it >= WARM)                                                                        \
                cudaEventElapsedTime(&t[it - WARM], e0, e1);                                       \
        }                                                                                          \
        qsort(t, REPS, sizeof t[0], cmp_f);                                                        \
        float med = (t[REPS / 2 - 1] + t[REPS / 2]) / 2;                                           \
        printf("%-34s median %8.3f ms  (min %.3f, max %.3f)  %7.1f GB/s of input\n", label, med,   \
               t[0], t[REPS - 1], bytes / (med * 1e-3) / 1e9);                                     \
    } while (0)

    /* ceilings */
    TIME("ceiling: read both inputs", read_kernel<<<132 * 8, 512, 0, st>>>((const uint4 *)r,
                                                                          (const uint4 *)c, n * 2 / 16, sink));
    {
        uint16_t *tmp;
        CK(cudaMalloc((void **)&tmp, n * 2));
        for (int it = 0; it < WARM + REPS; it++) {
            cudaEventRecord(e0, st);
            cudaMemcpyAsync(tmp, r, n * 2, cudaMemcpyDeviceToDevice, st);
            cudaEventRecord(e1, st);
            cudaEventSynchronize(e1);
            if (it >= WARM)
                cudaEventElapsedTime(&t[it - WARM], e0, e1);
        }
        qsort(t, REPS, sizeof t[0], cmp_f);
        float med = (t[REPS / 2 - 1] + t[REPS / 2]) / 2;
        printf("%-34s median %8.3f ms  %7.1f GB/s (read + write)\n", "ceiling: cudaMemcpy d2d",
               med, 2.0 * 2.0 * (double)n / (med * 1e-3) / 1e9);
        cudaFree(tmp);
    }

    /* the passes, from the engine's own functions */
    cudaMemPool_t pool;
    CK(pool_for(0, &pool));
    ctx x = {"bench", st, pool, PROBE_OK};
    pair_dev pd = {(const unsigned char *)r, (const unsigned char *)c, PROBE_DTYPE_BFLOAT16,
                   PROBE_DTYPE_BFLOAT16, n, 1};
    unsigned grid = nblocks_for(n);
    fused_out fo;
    fo.part = (double *)dalloc(&x, (size_t)grid * P_COUNT * sizeof(double));
    fo.part_off = (unsigned long long *)dalloc(&x, (size_t)grid * sizeof(unsigned long long));
    fo.counts = (unsigned long long *)dalloc(&x, C_COUNT * sizeof(unsigned long long));
    fused_res *d_res = (fused_res *)dalloc(&x, sizeof(fused_res));
    unsigned long long *d_hist = (unsigned long long *)dalloc(&x, L0BINS * 8);
    unsigned long long *d_aux = (unsigned long long *)dalloc(&x, (4 + COLLECT_MAX) * 8);
    unsigned long long *d_hist0 = (unsigned long long *)dalloc(&x, L0BINS * 8);
    unsigned *d_track = (unsigned *)dalloc(&x, 4 * TBINS * sizeof(unsigned));
    fo.hist = d_hist0;
    probe_metrics_opts opts = {1e-3, 1e-3};
    int ulp_p, ulp_emin;
    ulp_params(PROBE_DTYPE_BFLOAT16, PROBE_DTYPE_BFLOAT16, &ulp_p, &ulp_emin);
    printf("  GROUPS %d\n", GROUPS);
    TIME("probe fused pass (+combine, p99 level 0)",
         cudaMemsetAsync(fo.counts, 0, C_COUNT * 8, st);
         cudaMemsetAsync(fo.hist, 0, L0BINS * 8, st);
         fused_kernel<BF, BF><<<grid, THREADS, 0, st>>>(pd.r, pd.rdt, pd.c, pd.cdt, n, 1, 1e-3, 1e-3, ulp_p, ulp_emin, fo);
         reduce_kernel<<<1, RED_THREADS, 0, st>>>(fo.part, fo.part_off, grid, d_res));
    fo.hist = NULL;
    TIME("probe fused pass without level 0",
         cudaMemsetAsync(fo.counts, 0, C_COUNT * 8, st);
         fused_kernel<BF, BF><<<grid, THREADS, 0, st>>>(pd.r, pd.rdt, pd.c, pd.cdt, n, 1, 1e-3, 1e-3, ulp_p, ulp_emin, fo);
         reduce_kernel<<<1, RED_THREADS, 0, st>>>(fo.part, fo.part_off, grid, d_res));
    TIME("probe fused pass, generic decode",
         cudaMemsetAsync(fo.counts, 0, C_COUNT * 8, st);
         fused_kernel<0, 0><<<grid, THREADS, 0, st>>>(pd.r, pd.rdt, pd.c, pd.cdt, n, 1, 1e-3, 1e-3, ulp_p, ulp_emin, fo);
         reduce_kernel<<<1, RED_THREADS, 0, st>>>(fo.part, fo.part_off, grid, d_res));
    fo.hist = d_hist0;
    if (argc > 2 && strcmp(argv[2], "fused") == 0) {
        printf("  (tile %d elements: %d groups of %d per thread)\n", TILE, GROUPS, VEC);
        return 0;
    }
    unsigned long long cn[C_COUNT];
    CK(cudaMemsetAsync(fo.counts, 0, C_COUNT * 8, st));
    CK(cudaMemsetAsync(fo.hist, 0, L0BINS * 8, st));
    fused_kernel<BF, BF><<<grid, THREADS, 0, st>>>(pd.r, pd.rdt, pd.c, pd.cdt, n, 1, 1e-3, 1e-3, ulp_p, ulp_emin, fo);
    CK(cudaMemcpyAsync(cn, fo.counts, sizeof cn, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    uint64_t nf = cn[C_NF];
    double xr = ceil(99.0 * (double)nf / 100.0);
    uint64_t rank = (uint64_t)xr;
    double p99 = 0;
    TIME("probe p99 radix select (after fused)",
         cudaMemcpyAsync(d_hist, d_hist0, L0BINS * 8, cudaMemcpyDeviceToDevice, st);
         p99 = p99_select(&x, &pd, cn[C_ZERO], rank, d_hist, d_aux, d_track));
    printf("  p99 = %.17g (rank %llu of %llu finite; %llu exact zeros)\n", p99,
           (unsigned long long)rank, (unsigned long long)nf, (unsigned long long)cn[C_ZERO]);
    probe_metrics m;
    TIME("probe_cuda_metrics (whole call)",
         probe_cuda_metrics(PROBE_DTYPE_BFLOAT16, r, PROBE_DTYPE_BFLOAT16, c, n, &opts, NULL, st, &m,
                            NULL));
    printf("  rel_l2 %.9g cosine %.12g max_abs %.9g @ %llu p99 %.9g mismatch %llu\n", m.rel_l2,
           m.cosine, m.max_abs, (unsigned long long)m.max_abs_offset, m.p99_abs,
           (unsigned long long)m.mismatch_count);
    probe_summary s;
    bytes /= 2; /* one side */
    TIME("probe_cuda_summary (one side)",
         probe_cuda_summary(PROBE_DTYPE_BFLOAT16, r, n, st, &s));
    bytes *= 2;
    printf("  summary: finite %llu min %g max %g sum %.9g sum_sq %.9g\n",
           (unsigned long long)s.n_finite, s.min, s.max, s.sum, s.sum_sq);
    /* a channel shift over [16, 16384] channels x 1024 inner (rows path) */
    probe_channel_spec ch = {16384, 1024};
    probe_channel_shift sh;
    if (n % (16384ull * 1024) == 0) {
        TIME("probe_cuda_metrics + channel shift",
             probe_cuda_metrics(PROBE_DTYPE_BFLOAT16, r, PROBE_DTYPE_BFLOAT16, c, n, &opts, &ch, st,
                                &m, &sh));
        printf("  channel shift: argmax %llu max %.6g (%.6g std)\n", (unsigned long long)sh.argmax,
               sh.max, sh.max_rel);
    }
    /* channels last: [n / 1536, 1536] x 1 inner (column path) */
    probe_channel_spec cl = {1536, 1};
    uint64_t nl = n - n % 1536;
    if (nl > 0) {
        bytes = 2.0 * 2.0 * (double)nl;
        TIME("probe_cuda_metrics + channels last",
             probe_cuda_metrics(PROBE_DTYPE_BFLOAT16, r, PROBE_DTYPE_BFLOAT16, c, nl, &opts, &cl, st,
                                &m, &sh));
        printf("  channels last (n = %llu): argmax %llu max %.6g (%.6g std)\n",
               (unsigned long long)nl, (unsigned long long)sh.argmax, sh.max, sh.max_rel);
    }
    return x.status == PROBE_OK ? 0 : 1;
}
