/* check_device_metrics.c - libprobe_cuda (probe/device.h) against the CPU
 * path of libprobe on a real GPU.
 *
 *   check_device_metrics [--quick | --small]
 *
 * --quick: the large cases smaller; --small: every case at most ~10^6
 * elements (for compute-sanitizer, which runs kernels far slower).
 *
 * Each case builds a pair on the host (element bit patterns written
 * directly: every probe dtype, NaN/Inf at known places, subnormals, the FP8
 * NaN encodings, n = 1, n > 2^24, ...), copies it to the device, runs
 * probe_cuda_metrics, and compares with probe_metrics_compute_typed on the
 * host:
 *   - bit-equal: n, n_finite, the NaN/Inf counts, inf_mismatch,
 *     mismatch_count/fraction, identical, zero_norm_reference, max_abs,
 *     max_abs_offset, p99_abs;
 *   - within tolerance: the fp64 sums, summed in another order. Both sides
 *     sum with an error of a few ulps of the sum of magnitudes (CPU: one
 *     Neumaier sum; GPU: <= 64-term plain sums per thread, an 8-level tree
 *     per block, Neumaier across blocks: about (64 + 8 + 2) * 2^-53 = 8e-15
 *     relative to the sum of magnitudes). We allow 1e-12 of the sum of
 *     magnitudes: norm_* and mean_abs relative 1e-12, dot 1e-12 * ||r|| ||c||
 *     (Cauchy-Schwarz bounds sum |r c|), rel_l2 relative 2e-12, cosine
 *     absolute 2e-12. Non-finite values must match exactly.
 * Channel shifts are compared with a long double two-pass oracle here
 * (relative 1e-10: std is a square root of a difference), summaries with
 * probe_summary_compute, the source path with the device-pointer path
 * (bit-equal), and a second run with the first (bit-equal: determinism).
 * Prints one PASS/FAIL line per case; exit 0 when all pass, 1 otherwise,
 * 2 when no GPU is usable.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/device.h"
#include "probe/metrics.h"

static int failures, passes;

/* ---- random numbers (splitmix64) ---- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* float layout of a dtype: exponent bits, mantissa bits, bias (0: integer) */
typedef struct {
    int ebits, mbits, bias;
} flayout;

static flayout layout(probe_dtype t)
{
    switch (t) {
    case PROBE_DTYPE_FLOAT16: return (flayout){5, 10, 15};
    case PROBE_DTYPE_BFLOAT16: return (flayout){8, 7, 127};
    case PROBE_DTYPE_FLOAT32: return (flayout){8, 23, 127};
    case PROBE_DTYPE_FLOAT64: return (flayout){11, 52, 1023};
    case PROBE_DTYPE_FLOAT8_E4M3FN: return (flayout){4, 3, 7};
    case PROBE_DTYPE_FLOAT8_E5M2: return (flayout){5, 2, 15};
    default: return (flayout){0, 0, 0};
    }
}

static void put(probe_dtype t, void *buf, size_t i, uint64_t bits)
{
    size_t sz = probe_dtype_size(t);
    memcpy((unsigned char *)buf + i * sz, &bits, sz); /* little-endian host */
}

static uint64_t get(probe_dtype t, const void *buf, size_t i)
{
    uint64_t b = 0;
    memcpy(&b, (const unsigned char *)buf + i * probe_dtype_size(t), probe_dtype_size(t));
    return b;
}

/* A random finite value of t near magnitude 2^0 (+-spread binades), or a
 * random integer. */
static uint64_t gen_val(probe_dtype t, int spread)
{
    flayout L = layout(t);
    if (L.ebits) {
        int emax = (1 << L.ebits) - 1;
        int e = L.bias + (int)(rnd() % (uint64_t)(2 * spread + 1)) - spread;
        if (e < 1) e = 1;
        if (e > emax - 1) e = emax - 1;
        uint64_t m = rnd() & ((1ull << L.mbits) - 1);
        uint64_t s = rnd() & 1;
        return (s << (L.ebits + L.mbits)) | ((uint64_t)e << L.mbits) | m;
    }
    switch (t) {
    case PROBE_DTYPE_BOOL: return rnd() % 3;
    case PROBE_DTYPE_INT64: return (uint64_t)((int64_t)(rnd() >> 4) - (int64_t)(1ull << 59));
    case PROBE_DTYPE_UINT64: return rnd() >> 3;
    default: return rnd();
    }
}

/* A value next to v: a few ulps away (floats; never into the all-ones
 * exponent), or +-2 (integers). */
static uint64_t near_val(probe_dtype t, uint64_t v)
{
    flayout L = layout(t);
    int64_t k = (int64_t)(rnd() % 5) - 2;
    if (rnd() % 4 == 0)
        k = 0;
    if (L.ebits) {
        uint64_t mask = (L.ebits + L.mbits + 1 == 64) ? ~0ull : ((1ull << (L.ebits + L.mbits + 1)) - 1);
        uint64_t w = (v + (uint64_t)k) & mask;
        uint64_t e = (w >> L.mbits) & ((1ull << L.ebits) - 1);
        if (e == (1ull << L.ebits) - 1 || e == 0)
            return v;
        return w;
    }
    if (t == PROBE_DTYPE_BOOL)
        return (rnd() % 8 == 0) ? !v : v;
    return v + (uint64_t)k;
}

/* NaN / +inf / -inf encodings (FP8 E4M3FN has no infinity: its NaN is returned) */
static uint64_t enc_nan(probe_dtype t)
{
    flayout L = layout(t);
    if (t == PROBE_DTYPE_FLOAT8_E4M3FN)
        return 0x7F;
    return (((1ull << L.ebits) - 1) << L.mbits) | (1ull << (L.mbits - 1));
}

static uint64_t enc_inf(probe_dtype t, int neg)
{
    flayout L = layout(t);
    if (t == PROBE_DTYPE_FLOAT8_E4M3FN)
        return neg ? 0xFF : 0x7F;
    return ((uint64_t)neg << (L.ebits + L.mbits)) | (((1ull << L.ebits) - 1) << L.mbits);
}

/* ---- comparison ---- */

static int same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

static int close_rel(double a, double b, double tol, double scale)
{
    if (!isfinite(a) || !isfinite(b))
        return same_bits(a, b) || a == b;
    return fabs(a - b) <= tol * scale;
}

static char why[1024];

static int compare(const probe_metrics *g, const probe_metrics *c)
{
    why[0] = 0;
#define EXACT_U(f) if (g->f != c->f) { snprintf(why, sizeof why, #f " gpu %llu cpu %llu", (unsigned long long)g->f, (unsigned long long)c->f); return 0; }
#define EXACT_D(f) if (!same_bits(g->f, c->f)) { snprintf(why, sizeof why, #f " gpu %.17g cpu %.17g", g->f, c->f); return 0; }
#define NEAR(f, tol, scale) if (!close_rel(g->f, c->f, tol, scale)) { snprintf(why, sizeof why, #f " gpu %.17g cpu %.17g (tol %g x %g)", g->f, c->f, tol, (double)(scale)); return 0; }
    EXACT_U(n) EXACT_U(n_finite) EXACT_U(nan_ref) EXACT_U(nan_cand) EXACT_U(inf_ref)
    EXACT_U(inf_cand) EXACT_U(inf_mismatch) EXACT_U(mismatch_count) EXACT_U(identical)
    EXACT_U(zero_norm_reference) EXACT_U(max_abs_offset)
    EXACT_D(mismatch_fraction) EXACT_D(max_abs) EXACT_D(p99_abs)
    NEAR(norm_ref, 1e-12, fabs(c->norm_ref))
    NEAR(norm_cand, 1e-12, fabs(c->norm_cand))
    NEAR(norm_diff, 1e-12, fabs(c->norm_diff))
    NEAR(dot, 1e-12, c->norm_ref * c->norm_cand)
    NEAR(mean_abs, 1e-12, fabs(c->mean_abs))
    NEAR(rel_l2, 2e-12, fabs(c->rel_l2))
    NEAR(cosine, 2e-12, 1.0)
    return 1;
}

static void report(int ok, const char *name, const char *detail)
{
    if (ok) {
        passes++;
        printf("PASS %s%s%s\n", name, detail[0] ? ": " : "", detail);
    } else {
        failures++;
        printf("FAIL %s: %s\n", name, detail);
    }
    fflush(stdout);
}

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("FAIL cuda: %s: %s\n", #call, cudaGetErrorString(e_));                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- channel oracle (long double, two passes) ---- */

static void channel_oracle(probe_dtype rt, const void *r, probe_dtype ct, const void *c, size_t n,
                           const probe_channel_spec *ch, probe_channel_shift *o)
{
    double *rd = malloc(n * sizeof *rd), *cd = malloc(n * sizeof *cd);
    long double *s1 = calloc(ch->count, sizeof *s1), *sr = calloc(ch->count, sizeof *sr),
                *m2 = calloc(ch->count, sizeof *m2);
    uint64_t *cnt = calloc(ch->count, sizeof *cnt);
    probe_dtype_to_f64(rt, r, rd, n);
    probe_dtype_to_f64(ct, c, cd, n);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(rd[i]) || !isfinite(cd[i]))
            continue;
        uint64_t k = (i / ch->inner) % ch->count;
        cnt[k]++;
        s1[k] += (long double)cd[i] - rd[i];
        sr[k] += rd[i];
    }
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(rd[i]) || !isfinite(cd[i]))
            continue;
        uint64_t k = (i / ch->inner) % ch->count;
        long double dv = rd[i] - sr[k] / cnt[k];
        m2[k] += dv * dv;
    }
    int found = 0;
    memset(o, 0, sizeof *o);
    o->count = ch->count;
    for (uint64_t k = 0; k < ch->count; k++) {
        if (!cnt[k])
            continue;
        double sh = (double)(s1[k] / cnt[k]), sd = (double)sqrtl(m2[k] / cnt[k]);
        if (!found || fabs(sh) > fabs(o->max)) {
            found = 1;
            o->argmax = k;
            o->max = sh;
            o->std_ref = sd;
        }
    }
    if (!found) {
        o->max = o->max_rel = o->std_ref = NAN;
    } else {
        o->max_rel = o->std_ref == 0 ? (o->max == 0 ? 0 : (o->max > 0 ? INFINITY : -INFINITY))
                                     : o->max / o->std_ref;
    }
    free(rd); free(cd); free(s1); free(sr); free(m2); free(cnt);
}

/* ---- one case ---- */

typedef struct {
    const char *name;
    probe_dtype rt, ct;
    size_t n;
    void *r, *c;                /* host */
    probe_metrics_opts opts;
    probe_channel_spec ch;      /* count 0: none */
    size_t r_off_elems;         /* misalign the device reference by this many elements */
} pair_case;

static probe_status run_gpu(const pair_case *pc, probe_metrics *g, probe_channel_shift *sh)
{
    size_t rs = probe_dtype_size(pc->rt), cs = probe_dtype_size(pc->ct);
    unsigned char *dr = NULL, *dc = NULL;
    CUDA_OK(cudaMalloc((void **)&dr, (pc->n + pc->r_off_elems) * rs + 16));
    CUDA_OK(cudaMalloc((void **)&dc, pc->n * cs + 16));
    if (pc->n) {
        CUDA_OK(cudaMemcpy(dr + pc->r_off_elems * rs, pc->r, pc->n * rs, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dc, pc->c, pc->n * cs, cudaMemcpyHostToDevice));
    }
    probe_status s = probe_cuda_metrics(pc->rt, dr + pc->r_off_elems * rs, pc->ct, dc, pc->n,
                                        &pc->opts, pc->ch.count ? &pc->ch : NULL, NULL, g, sh);
    cudaFree(dr);
    cudaFree(dc);
    return s;
}

static void check_pair(const pair_case *pc)
{
    probe_metrics g, c;
    probe_channel_shift gs, os;
    probe_status s = run_gpu(pc, &g, &gs);
    if (s != PROBE_OK) {
        report(0, pc->name, probe_last_error());
        return;
    }
    if (probe_metrics_compute_typed(pc->rt, pc->r, pc->ct, pc->c, pc->n, &pc->opts, &c) != PROBE_OK) {
        report(0, pc->name, probe_last_error());
        return;
    }
    char detail[512];
    if (!compare(&g, &c)) {
        report(0, pc->name, why);
        return;
    }
    snprintf(detail, sizeof detail, "n %zu %s/%s finite %llu mism %llu max %.6g@%llu p99 %.6g rel_l2 %.6g cos %.17g",
             pc->n, probe_dtype_name(pc->rt), probe_dtype_name(pc->ct),
             (unsigned long long)g.n_finite, (unsigned long long)g.mismatch_count, g.max_abs,
             (unsigned long long)g.max_abs_offset, g.p99_abs, g.rel_l2, g.cosine);
    if (pc->ch.count) {
        channel_oracle(pc->rt, pc->r, pc->ct, pc->c, pc->n, &pc->ch, &os);
        int ok = gs.count == os.count && gs.argmax == os.argmax &&
                 close_rel(gs.max, os.max, 1e-10, fabs(os.max)) &&
                 close_rel(gs.std_ref, os.std_ref, 1e-10, fabs(os.std_ref)) &&
                 close_rel(gs.max_rel, os.max_rel, 1e-10, fabs(os.max_rel));
        if (!ok) {
            snprintf(why, sizeof why, "channel shift gpu (count %llu argmax %llu max %.17g std %.17g rel %.17g) oracle (%llu %llu %.17g %.17g %.17g)",
                     (unsigned long long)gs.count, (unsigned long long)gs.argmax, gs.max, gs.std_ref, gs.max_rel,
                     (unsigned long long)os.count, (unsigned long long)os.argmax, os.max, os.std_ref, os.max_rel);
            report(0, pc->name, why);
            return;
        }
        size_t l = strlen(detail);
        snprintf(detail + l, sizeof detail - l, " shift[%llu] %.6g (%.6g std)",
                 (unsigned long long)gs.argmax, gs.max, gs.max_rel);
    }
    report(1, pc->name, detail);
}

static void *alloc_pair(probe_dtype t, size_t n)
{
    void *p = malloc(n * probe_dtype_size(t) + 8);
    if (!p) {
        printf("FAIL host allocation of %zu elements\n", n);
        exit(1);
    }
    return p;
}

/* r random (spread binades), c next to r (same dtype) or independent. */
static pair_case make_near(const char *name, probe_dtype t, size_t n, int spread)
{
    pair_case pc = {name, t, t, n, alloc_pair(t, n), alloc_pair(t, n), {1e-3, 1e-3}, {0, 0}, 0};
    for (size_t i = 0; i < n; i++) {
        uint64_t v = gen_val(t, spread);
        put(t, pc.r, i, v);
        put(t, pc.c, i, near_val(t, v));
    }
    return pc;
}

static void free_case(pair_case *pc)
{
    free(pc->r);
    free(pc->c);
}

/* ---- summary ---- */

static void check_summary(const char *name, probe_dtype t, const void *x, size_t n)
{
    size_t sz = probe_dtype_size(t);
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, n * sz + 16));
    CUDA_OK(cudaMemcpy(d, x, n * sz, cudaMemcpyHostToDevice));
    probe_summary g, c;
    probe_status s = probe_cuda_summary(t, d, n, NULL, &g);
    cudaFree(d);
    if (s != PROBE_OK) {
        report(0, name, probe_last_error());
        return;
    }
    probe_summary_compute(t, x, n, &c);
    int ok = g.n == c.n && g.n_finite == c.n_finite && g.nan == c.nan && g.inf == c.inf &&
             same_bits(g.min, c.min) && same_bits(g.max, c.max) && same_bits(g.abs_max, c.abs_max) &&
             close_rel(g.sum_sq, c.sum_sq, 1e-12, c.sum_sq) &&
             close_rel(g.sum, c.sum, 1e-12, sqrt(c.sum_sq * (double)c.n_finite));
    char detail[512];
    snprintf(detail, sizeof detail, "n %zu finite %llu nan %llu inf %llu min %.17g/%.17g max %.17g/%.17g sum %.17g/%.17g sq %.17g/%.17g",
             n, (unsigned long long)g.n_finite, (unsigned long long)g.nan, (unsigned long long)g.inf,
             g.min, c.min, g.max, c.max, g.sum, c.sum, g.sum_sq, c.sum_sq);
    report(ok, name, detail);
}

/* ---- source path ---- */

typedef struct {
    const void *side[2];
    size_t esz[2];
    int reads;
} host_src;

static probe_status src_read(void *ctx, int side, uint64_t off, size_t count, void *dst)
{
    host_src *h = ctx;
    memcpy(dst, (const unsigned char *)h->side[side] + off * h->esz[side], count * h->esz[side]);
    h->reads++;
    return PROBE_OK;
}

static probe_status src_fail(void *ctx, int side, uint64_t off, size_t count, void *dst)
{
    (void)ctx; (void)count; (void)dst;
    if (off > 0 || side == 1)
        return probe_set_error(PROBE_EIO, "test source: planted read error (side %d, offset %llu)",
                               side, (unsigned long long)off);
    return PROBE_OK;
}

int main(int argc, char **argv)
{
    int small = argc > 1 && strcmp(argv[1], "--small") == 0;
    int quick = small || (argc > 1 && strcmp(argv[1], "--quick") == 0);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("check_device_metrics: no CUDA device\n");
        return 2;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("check_device_metrics: device 0 %s, %d SMs\n", prop.name, prop.multiProcessorCount);

    /* 1. every dtype with itself, near values, several sizes */
    static const probe_dtype all[] = {
        PROBE_DTYPE_BOOL, PROBE_DTYPE_INT8, PROBE_DTYPE_INT16, PROBE_DTYPE_INT32,
        PROBE_DTYPE_INT64, PROBE_DTYPE_UINT8, PROBE_DTYPE_UINT16, PROBE_DTYPE_UINT32,
        PROBE_DTYPE_UINT64, PROBE_DTYPE_FLOAT16, PROBE_DTYPE_BFLOAT16, PROBE_DTYPE_FLOAT32,
        PROBE_DTYPE_FLOAT64, PROBE_DTYPE_FLOAT8_E4M3FN, PROBE_DTYPE_FLOAT8_E5M2};
    const size_t sizes[] = {1, 7, 100, 101, 16384, 16385, 100003};
    for (size_t ti = 0; ti < sizeof all / sizeof all[0]; ti++) {
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            char name[128];
            snprintf(name, sizeof name, "near.%s.n%zu", probe_dtype_name(all[ti]), sizes[si]);
            pair_case pc = make_near(name, all[ti], sizes[si], 6);
            pc.name = name;
            check_pair(&pc);
            free_case(&pc);
        }
    }

    /* 2. random pairs of different dtypes (independent values) */
    for (int k = 0; k < 30; k++) {
        probe_dtype a = all[rnd() % 15], b = all[rnd() % 15];
        size_t n = 1 + rnd() % 50000;
        char name[128];
        snprintf(name, sizeof name, "mixed.%s-%s.n%zu", probe_dtype_name(a), probe_dtype_name(b), n);
        pair_case pc = {name, a, b, n, alloc_pair(a, n), alloc_pair(b, n), {1e-2, 1e-2}, {0, 0}, 0};
        for (size_t i = 0; i < n; i++) {
            put(a, pc.r, i, gen_val(a, 3));
            put(b, pc.c, i, gen_val(b, 3));
        }
        check_pair(&pc);
        free_case(&pc);
    }

    /* 3. bf16 reference vs fp32 candidate (the candidate's low bits added) */
    {
        size_t n = 1000003;
        pair_case pc = {"bf16-vs-fp32", PROBE_DTYPE_BFLOAT16, PROBE_DTYPE_FLOAT32, n,
                        alloc_pair(PROBE_DTYPE_BFLOAT16, n), alloc_pair(PROBE_DTYPE_FLOAT32, n),
                        {1e-3, 1e-3}, {0, 0}, 0};
        for (size_t i = 0; i < n; i++) {
            uint64_t v = gen_val(PROBE_DTYPE_BFLOAT16, 8);
            put(PROBE_DTYPE_BFLOAT16, pc.r, i, v);
            put(PROBE_DTYPE_FLOAT32, pc.c, i, (v << 16) | (rnd() & 0xFFFF));
        }
        check_pair(&pc);
        pair_case sw = pc;
        sw.name = "fp32-vs-bf16";
        sw.rt = PROBE_DTYPE_FLOAT32;
        sw.ct = PROBE_DTYPE_BFLOAT16;
        sw.r = pc.c;
        sw.c = pc.r;
        check_pair(&sw);
        free_case(&pc);
    }

    /* 4. all equal: cosine exactly 1, p99 exactly 0, identical */
    {
        pair_case pc = make_near("all-equal.float32", PROBE_DTYPE_FLOAT32, 300000, 10);
        memcpy(pc.c, pc.r, pc.n * 4);
        probe_metrics g;
        probe_channel_shift sh;
        check_pair(&pc);
        int ok = run_gpu(&pc, &g, &sh) == PROBE_OK && g.cosine == 1.0 && g.p99_abs == 0.0 &&
                 g.identical == 1 && g.max_abs == 0.0 && g.rel_l2 == 0.0;
        report(ok, "all-equal.exact-values", ok ? "cosine 1, p99 0, rel_l2 0, identical" : "not exact");
        free_case(&pc);
    }

    /* 5. zero-norm reference */
    {
        pair_case pc = make_near("zero-norm-reference", PROBE_DTYPE_FLOAT16, 5000, 3);
        memset(pc.r, 0, pc.n * 2);
        check_pair(&pc);
        memset(pc.c, 0, pc.n * 2);
        put(PROBE_DTYPE_FLOAT16, pc.c, 17, 0x8000); /* -0 vs +0: equal */
        pc.name = "zero-both";
        check_pair(&pc);
        free_case(&pc);
    }

    /* 6. NaN / Inf at known places, every float type */
    static const probe_dtype floats[] = {PROBE_DTYPE_FLOAT16, PROBE_DTYPE_BFLOAT16,
                                         PROBE_DTYPE_FLOAT32, PROBE_DTYPE_FLOAT64,
                                         PROBE_DTYPE_FLOAT8_E4M3FN, PROBE_DTYPE_FLOAT8_E5M2};
    for (size_t fi = 0; fi < 6; fi++) {
        probe_dtype t = floats[fi];
        char name[128];
        snprintf(name, sizeof name, "nonfinite.%s", probe_dtype_name(t));
        pair_case pc = make_near(name, t, 40000, 4);
        pc.name = name;
        put(t, pc.c, 5, enc_nan(t));                                     /* NaN in cand */
        put(t, pc.r, 7, enc_inf(t, 0)); put(t, pc.c, 7, enc_inf(t, 0));  /* same inf */
        put(t, pc.r, 9, enc_inf(t, 0));                                  /* inf ref only */
        put(t, pc.r, 11, enc_inf(t, 1)); put(t, pc.c, 11, enc_inf(t, 0)); /* -inf vs +inf */
        put(t, pc.r, 13, enc_nan(t)); put(t, pc.c, 13, enc_nan(t));      /* NaN both */
        put(t, pc.r, 39999, enc_nan(t));
        put(t, pc.c, 20000, enc_inf(t, 1));
        check_pair(&pc);
        free_case(&pc);
    }

    /* 7. FP8 every code against every code (all NaN encodings: e4m3fn 0x7F/0xFF,
     * e5m2 0x7D..0x7F / 0xFD..0xFF, infinities 0x7C/0xFC) */
    for (int k = 0; k < 2; k++) {
        probe_dtype t = k ? PROBE_DTYPE_FLOAT8_E5M2 : PROBE_DTYPE_FLOAT8_E4M3FN;
        char name[128];
        snprintf(name, sizeof name, "fp8-all-codes.%s", probe_dtype_name(t));
        pair_case pc = {name, t, t, 65536, alloc_pair(t, 65536), alloc_pair(t, 65536), {1e-3, 1e-3}, {0, 0}, 0};
        for (size_t i = 0; i < 65536; i++) {
            ((uint8_t *)pc.r)[i] = (uint8_t)(i >> 8);
            ((uint8_t *)pc.c)[i] = (uint8_t)i;
        }
        check_pair(&pc);
        free_case(&pc);
    }

    /* 8. subnormals: float16 subnormal codes; float64 subnormals (the scaled
     * second pass) and huge values, and a difference that overflows */
    {
        pair_case pc = {"subnormal.float16", PROBE_DTYPE_FLOAT16, PROBE_DTYPE_FLOAT16, 20000,
                        alloc_pair(PROBE_DTYPE_FLOAT16, 20000), alloc_pair(PROBE_DTYPE_FLOAT16, 20000),
                        {0, 0}, {0, 0}, 0};
        for (size_t i = 0; i < pc.n; i++) {
            put(PROBE_DTYPE_FLOAT16, pc.r, i, rnd() & 0x83FF);
            put(PROBE_DTYPE_FLOAT16, pc.c, i, rnd() & 0x83FF);
        }
        check_pair(&pc);
        free_case(&pc);
        const double scales[3] = {0x1p-1060, 0x1p700, 0x1p-400};
        for (int k = 0; k < 3; k++) {
            char name[64];
            snprintf(name, sizeof name, "extreme.float64.2^%d", (int)log2(scales[k]));
            pair_case q = make_near(name, PROBE_DTYPE_FLOAT64, 50000, 3);
            q.name = name;
            for (size_t i = 0; i < q.n; i++) {
                double a, b;
                uint64_t ra = get(PROBE_DTYPE_FLOAT64, q.r, i), cb = get(PROBE_DTYPE_FLOAT64, q.c, i);
                memcpy(&a, &ra, 8); memcpy(&b, &cb, 8);
                a *= scales[k]; b *= scales[k];
                memcpy(&ra, &a, 8); memcpy(&cb, &b, 8);
                put(PROBE_DTYPE_FLOAT64, q.r, i, ra);
                put(PROBE_DTYPE_FLOAT64, q.c, i, cb);
            }
            check_pair(&q);
            free_case(&q);
        }
        /* the generic kernel (float64 vs float32) must see the range too */
        {
            size_t n = 30000;
            pair_case g = {"extreme.float64-vs-float32", PROBE_DTYPE_FLOAT64, PROBE_DTYPE_FLOAT32, n,
                           alloc_pair(PROBE_DTYPE_FLOAT64, n), alloc_pair(PROBE_DTYPE_FLOAT32, n),
                           {1e-3, 1e-3}, {0, 0}, 0};
            for (size_t i = 0; i < n; i++) {
                uint64_t v = gen_val(PROBE_DTYPE_FLOAT64, 3);
                double a;
                memcpy(&a, &v, 8);
                a = ldexp(a, i % 2 ? 700 : -700);
                memcpy(&v, &a, 8);
                put(PROBE_DTYPE_FLOAT64, g.r, i, v);
                put(PROBE_DTYPE_FLOAT32, g.c, i, gen_val(PROBE_DTYPE_FLOAT32, 3));
            }
            check_pair(&g);
            free_case(&g);
        }
        pair_case o = make_near("overflowing-difference.float64", PROBE_DTYPE_FLOAT64, 1000, 2);
        double big = 1.5e308, mbig = -1.5e308;
        uint64_t bb, mb;
        memcpy(&bb, &big, 8); memcpy(&mb, &mbig, 8);
        put(PROBE_DTYPE_FLOAT64, o.r, 500, mb);
        put(PROBE_DTYPE_FLOAT64, o.c, 500, bb);
        check_pair(&o);
        free_case(&o);
    }

    /* 9. heavy ties (p99 inside a run of equal values) and rank edges */
    {
        const size_t ns[] = {100, 101, 199, 200, 1000, 123457};
        for (size_t k = 0; k < 6; k++) {
            char name[64];
            snprintf(name, sizeof name, "ties.int8.n%zu", ns[k]);
            pair_case pc = {name, PROBE_DTYPE_INT8, PROBE_DTYPE_INT8, ns[k], alloc_pair(PROBE_DTYPE_INT8, ns[k]),
                            alloc_pair(PROBE_DTYPE_INT8, ns[k]), {0, 0}, {0, 0}, 0};
            for (size_t i = 0; i < ns[k]; i++) {
                ((int8_t *)pc.r)[i] = (int8_t)(rnd() % 5);
                ((int8_t *)pc.c)[i] = (int8_t)(rnd() % 5);
            }
            check_pair(&pc);
            free_case(&pc);
        }
        /* all differences equal and non-zero (every candidate ties) */
        pair_case pc = make_near("ties.all-same-difference.float32", PROBE_DTYPE_FLOAT32, 200000, 0);
        for (size_t i = 0; i < pc.n; i++) {
            float a = (float)(i % 1000), b = a + 0.25f;
            uint32_t ab, bb2;
            memcpy(&ab, &a, 4); memcpy(&bb2, &b, 4);
            put(PROBE_DTYPE_FLOAT32, pc.r, i, ab);
            put(PROBE_DTYPE_FLOAT32, pc.c, i, bb2);
        }
        check_pair(&pc);
        free_case(&pc);
        /* continuous float64 data: the radix select walks all levels */
        pair_case f = make_near("radix-levels.float64", PROBE_DTYPE_FLOAT64, quick ? 300000 : 3000000, 2);
        for (size_t i = 0; i < f.n; i++)
            put(PROBE_DTYPE_FLOAT64, f.c, i, gen_val(PROBE_DTYPE_FLOAT64, 2));
        check_pair(&f);
        free_case(&f);
    }

    /* 10. misaligned reference (not 16-byte aligned: the scalar load path) */
    {
        pair_case pc = make_near("misaligned.bfloat16", PROBE_DTYPE_BFLOAT16, 99999, 5);
        pc.r_off_elems = 3;
        check_pair(&pc);
        free_case(&pc);
    }

    /* 11. channel shifts: row segments, column runs, long rows, NaNs inside */
    {
        struct { const char *name; size_t outer, count, inner; probe_dtype t; } cs[] = {
            {"channels.rows.bf16[4,64,33]ax1", 4, 64, 33, PROBE_DTYPE_BFLOAT16},
            {"channels.cols.f32[2048,16]ax1", 2048, 16, 1, PROBE_DTYPE_FLOAT32},
            {"channels.longrows.f16[2,8,10000]ax1", 2, 8, 10000, PROBE_DTYPE_FLOAT16},
            {"channels.one.f32[100000]", 1, 1, 100000, PROBE_DTYPE_FLOAT32},
            {"channels.many.bf16[3,65536,1]", 3, 65536, 1, PROBE_DTYPE_BFLOAT16},
        };
        for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
            size_t n = cs[k].outer * cs[k].count * cs[k].inner;
            pair_case pc = make_near(cs[k].name, cs[k].t, n, 3);
            pc.ch.count = cs[k].count;
            pc.ch.inner = cs[k].inner;
            /* a biased channel: +ulps on channel count/2 */
            for (size_t i = 0; i < n; i++)
                if ((i / cs[k].inner) % cs[k].count == cs[k].count / 2)
                    put(cs[k].t, pc.c, i, get(cs[k].t, pc.r, i) + 3);
            put(cs[k].t, pc.c, n / 3, enc_nan(cs[k].t));
            check_pair(&pc);
            free_case(&pc);
        }
    }

    /* 12. determinism and n > 2^24; the source path on the same pair */
    {
        size_t n = small ? 1000003 : quick ? ((1u << 24) + 4099) : ((1u << 25) + 12345);
        pair_case pc = make_near("large.bfloat16.n>2^24", PROBE_DTYPE_BFLOAT16, n, 8);
        check_pair(&pc);
        probe_metrics a, b;
        probe_channel_shift sa, sb;
        int ok = run_gpu(&pc, &a, &sa) == PROBE_OK && run_gpu(&pc, &b, &sb) == PROBE_OK &&
                 memcmp(&a, &b, sizeof a) == 0;
        report(ok, "determinism.bfloat16", ok ? "two runs, same bits" : "two runs differ");
        free_case(&pc);

        size_t m = small ? 1000000 : 20000000; /* 80 MB per side: two 64 MiB chunks */
        pair_case fc = make_near("source.float32", PROBE_DTYPE_FLOAT32, m, 6);
        host_src hs = {{fc.r, fc.c}, {4, 4}, 0};
        probe_pair_source src = {m, {PROBE_DTYPE_FLOAT32, PROBE_DTYPE_FLOAT32}, src_read, &hs};
        probe_metrics sm, dm;
        probe_channel_shift ss;
        probe_status s1 = probe_cuda_metrics_source(0, &src, &fc.opts, NULL, &sm, &ss);
        probe_status s2 = run_gpu(&fc, &dm, &ss);
        ok = s1 == PROBE_OK && s2 == PROBE_OK && memcmp(&sm, &dm, sizeof sm) == 0 &&
             hs.reads == (small ? 2 : 4);
        char d[256];
        snprintf(d, sizeof d, "status %d/%d, %d reads, %s", (int)s1, (int)s2, hs.reads,
                 memcmp(&sm, &dm, sizeof sm) == 0 ? "same bits as the device-pointer path" : "DIFFERENT");
        report(ok, small ? "source.float32.n1e6" : "source.float32.n2e7", d);
        int cur = -1;
        cudaGetDevice(&cur);
        report(cur == 0, "source.restores-device", cur == 0 ? "device 0" : "changed");
        src.read = src_fail;
        probe_status s3 = probe_cuda_metrics_source(0, &src, &fc.opts, NULL, &sm, NULL);
        ok = s3 == PROBE_EIO && strstr(probe_last_error(), "planted read error") != NULL && sm.n == 0;
        report(ok, "source.read-error", probe_last_error());
        free_case(&fc);
    }

    /* 13. summaries */
    for (size_t fi = 0; fi < 6; fi++) {
        probe_dtype t = floats[fi];
        char name[64];
        snprintf(name, sizeof name, "summary.%s", probe_dtype_name(t));
        pair_case pc = make_near(name, t, 300001, 6);
        put(t, pc.r, 3, enc_nan(t));
        put(t, pc.r, 4, enc_inf(t, 1));
        put(t, pc.r, 5, 0);
        check_summary(name, t, pc.r, pc.n);
        free_case(&pc);
    }
    {
        int32_t x[5] = {-7, 0, 3, 2147483647, -2147483647 - 1};
        check_summary("summary.int32", PROBE_DTYPE_INT32, x, 5);
    }

    /* 14. errors: a bad stream argument is a CUDA error (EIO), nothing crashes */
    {
        probe_metrics m;
        float *d = NULL;
        CUDA_OK(cudaMalloc((void **)&d, 64));
        CUDA_OK(cudaMemset(d, 0, 64));
        probe_status s = probe_cuda_metrics(PROBE_DTYPE_FLOAT32, d, PROBE_DTYPE_FLOAT32, d, 16,
                                            &(probe_metrics_opts){0, 0}, NULL, NULL, &m, NULL);
        report(s == PROBE_OK && m.identical && m.p99_abs == 0.0, "zeros.default-stream",
               s == PROBE_OK ? "" : probe_last_error());
        cudaFree(d);
    }

    printf("check_device_metrics: %d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
