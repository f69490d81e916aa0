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
 * probe_cuda_metrics, and compares with the CPU engine
 * (probe_metrics_compute_source) on the host:
 *   - bit-equal: n, n_finite, the NaN/Inf counts, nan_ref_only,
 *     inf_mismatch, mismatch_count/fraction, identical (element type and
 *     bytes), zero_norm_reference, max_abs, max_abs_offset, p99_abs,
 *     mismatch_ulps_max, max_abs_ulps_scale;
 *   - within tolerance: the fp64 sums, summed in another order. Both sides
 *     sum with an error of a few ulps of the sum of magnitudes (CPU: 8-lane
 *     blocks and a Neumaier sum; GPU: <= 128-term plain sums per thread, an
 *     8-level tree per block, Neumaier across blocks: about
 *     (128 + 8 + 2) * 2^-53 = 1.6e-14 relative to the sum of magnitudes).
 *     We allow 1e-12 of the sum of magnitudes: norm_* and mean_abs relative
 *     1e-12, dot 1e-12 * ||r|| ||c|| (Cauchy-Schwarz bounds sum |r c|),
 *     rel_l2 relative 2e-12, cosine absolute 2e-12; gain, gain_se and gain_z
 *     within the bounds that 1e-12 of their sums' magnitudes gives
 *     (gain_agrees). Non-finite values must match exactly.
 * With a channel spec, the per-channel arrays (shift_k, se_k, n_k) of
 * probe_cuda_metrics_source_v2 are compared with the CPU engine's (n_k
 * exact, shift_k within 1e-12 of the channel's mean |d|, se_k relative
 * 1e-10), z_argmax/z_max with the CPU's z at that channel (a near-tie may
 * pick another channel), that entry's metrics with probe_cuda_metrics
 * (bit-equal), and the channel shift with a long double two-pass oracle
 * (relative 1e-10: std is a square root of a difference). The cases of
 * tests/unit/test_systematic.c (gain and channel z against long double,
 * the float64 range of the fourth powers, degenerate channels, NaN in the
 * reference only, identity, ulps) add a line with their expected values.
 * Summaries are compared with probe_summary_compute, the source path with
 * the device-pointer path (bit-equal), and a second run with the first
 * (bit-equal: determinism).
 * Prints one PASS/FAIL line per check; exit 0 when all pass, 1 otherwise,
 * 2 when no GPU is usable.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "probe/device.h"
#include "probe/capture.h"
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

/* The fp64 sums of the two paths agree to EPS of the sum of the magnitudes
 * of their terms (docs/device.md, "CPU and GPU agreement"). */
#define EPS 1e-12L

/* Sums over the indices finite on both sides, in long double, of the
 * decoded values (d = c - r): the magnitudes the tolerances of the gain
 * fields are made of. */
typedef struct {
    long double rr, dd, r2d2, r4;
} gain_sums;

/* z = A / S for some A in [a - da, a + da] and S in [se - dse, se + dse],
 * S >= 0, where A / 0 is +-inf and 0 / S is 0 (metrics.h gain_z). */
static int z_possible(double z, long double a, long double da, long double se, long double dse)
{
    da += 1e-15L * fabsl(a); /* the rounding of the quotient itself */
    long double alo = a - da, ahi = a + da, slo = se - dse, shi = se + dse;
    if (slo < 0)
        slo = 0;
    if (isnan(z))
        return 0;
    if (z == 0)
        return alo <= 0 && ahi >= 0;
    if (isinf(z))
        return slo == 0 && (z > 0 ? ahi > 0 : alo < 0);
    long double p = (long double)z * slo, q = (long double)z * shi;
    long double lo = p < q ? p : q, hi = p < q ? q : p;
    return hi >= alo && lo <= ahi;
}

/* gain, gain_se and gain_z of the GPU (g) against the CPU (c). From sums
 * that agree to EPS of their magnitudes: the gain's numerator sum d r
 * within EPS sqrt(dd rr) (Cauchy-Schwarz) and rr within EPS rr, so
 * |d gain| <= EPS (sqrt(dd / rr) + |gain|); the residual sum e2 = sum r^2 d^2
 * - 2 a sum r^3 d + a^2 sum r^4 within EPS (sqrt(r2d2) + |a| sqrt(r4))^2
 * (|sum r^3 d| <= sqrt(r4 r2d2)) plus 2 sqrt(r4 e2) |d gain| from the other
 * path's own a (d e2 / d a = -2 sum r^3 (d - a r)), and
 * |sqrt(x) - sqrt(y)| <= min(|x - y| / sqrt(x), sqrt(|x - y|)); z must be a
 * quotient of values in those ranges. */
static int gain_agrees(const probe_metrics *g, const probe_metrics *c, const gain_sums *s)
{
    if (!(s->rr > 0) || !isfinite(c->gain) || !isfinite(c->gain_se)) {
        if (same_bits(g->gain, c->gain) && same_bits(g->gain_se, c->gain_se) &&
            same_bits(g->gain_z, c->gain_z))
            return 1;
        snprintf(why, sizeof why, "gain/se/z gpu %.17g %.17g %.17g cpu %.17g %.17g %.17g (exact)",
                 g->gain, g->gain_se, g->gain_z, c->gain, c->gain_se, c->gain_z);
        return 0;
    }
    long double a = c->gain, se = c->gain_se;
    long double da = EPS * (sqrtl(s->dd / s->rr) + fabsl(a));
    long double b = sqrtl(s->r2d2) + fabsl(a) * sqrtl(s->r4);
    long double e2 = se * s->rr;
    e2 *= e2;
    long double de2 = EPS * b * b + 2 * sqrtl(s->r4 * e2) * da + da * da * s->r4;
    long double dq = sqrtl(de2);
    if (e2 > 0 && de2 / sqrtl(e2) < dq)
        dq = de2 / sqrtl(e2);
    long double dse = dq / s->rr + 2 * EPS * se;
    if (!(fabsl(g->gain - a) <= da)) {
        snprintf(why, sizeof why, "gain gpu %.17g cpu %.17g (tol %.3Lg)", g->gain, c->gain, da);
        return 0;
    }
    if (!(fabsl(g->gain_se - se) <= dse)) {
        snprintf(why, sizeof why, "gain_se gpu %.17g cpu %.17g (tol %.3Lg)", g->gain_se,
                 c->gain_se, dse);
        return 0;
    }
    if (!z_possible(g->gain_z, a, da, se, dse)) {
        snprintf(why, sizeof why, "gain_z gpu %.17g cpu %.17g (gain %.17g +- %.3Lg, se %.17g +- "
                 "%.3Lg)", g->gain_z, c->gain_z, c->gain, da, c->gain_se, dse);
        return 0;
    }
    return 1;
}

static int compare(const probe_metrics *g, const probe_metrics *c, const gain_sums *s)
{
    why[0] = 0;
#define EXACT_U(f) if (g->f != c->f) { snprintf(why, sizeof why, #f " gpu %llu cpu %llu", (unsigned long long)g->f, (unsigned long long)c->f); return 0; }
#define EXACT_D(f) if (!same_bits(g->f, c->f)) { snprintf(why, sizeof why, #f " gpu %.17g cpu %.17g", g->f, c->f); return 0; }
#define NEAR(f, tol, scale) if (!close_rel(g->f, c->f, tol, scale)) { snprintf(why, sizeof why, #f " gpu %.17g cpu %.17g (tol %g x %g)", g->f, c->f, tol, (double)(scale)); return 0; }
    EXACT_U(n) EXACT_U(n_finite) EXACT_U(nan_ref) EXACT_U(nan_cand) EXACT_U(inf_ref)
    EXACT_U(inf_cand) EXACT_U(inf_mismatch) EXACT_U(mismatch_count) EXACT_U(identical)
    EXACT_U(zero_norm_reference) EXACT_U(max_abs_offset) EXACT_U(nan_ref_only)
    EXACT_D(mismatch_fraction) EXACT_D(max_abs) EXACT_D(p99_abs)
    EXACT_D(mismatch_ulps_max) EXACT_D(max_abs_ulps_scale)
    NEAR(norm_ref, 1e-12, fabs(c->norm_ref))
    NEAR(norm_cand, 1e-12, fabs(c->norm_cand))
    NEAR(norm_diff, 1e-12, fabs(c->norm_diff))
    NEAR(dot, 1e-12, c->norm_ref * c->norm_cand)
    NEAR(mean_abs, 1e-12, fabs(c->mean_abs))
    NEAR(rel_l2, 2e-12, fabs(c->rel_l2))
    NEAR(cosine, 2e-12, 1.0)
    return gain_agrees(g, c, s);
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

/* ---- exact differences ---- */

static int is_int_type(probe_dtype t)
{
    return t == PROBE_DTYPE_BOOL || (t >= PROBE_DTYPE_INT8 && t <= PROBE_DTYPE_UINT64);
}

/* Element i of an integer type, exactly. */
static __int128 int_at(probe_dtype t, const void *p, size_t i)
{
    uint64_t b = get(t, p, i);
    switch (t) {
    case PROBE_DTYPE_BOOL: return b != 0;
    case PROBE_DTYPE_INT8: return (int8_t)b;
    case PROBE_DTYPE_INT16: return (int16_t)b;
    case PROBE_DTYPE_INT32: return (int32_t)b;
    case PROBE_DTYPE_INT64: return (int64_t)b;
    default: return b; /* unsigned */
    }
}

/* d[j] = c - r at indices [off, off + m) in long double: exact for an
 * integer pair (the CPU engine forms a 64-bit pair's difference exactly),
 * else the difference of the decoded values rd, cd. */
static void diff_part(probe_dtype rt, const void *r, probe_dtype ct, const void *c, size_t off,
                      size_t m, const double *rd, const double *cd, long double *d)
{
    int ints = is_int_type(rt) && is_int_type(ct);
    for (size_t j = 0; j < m; j++)
        d[j] = ints ? (long double)(int_at(ct, c, off + j) - int_at(rt, r, off + j))
                    : (long double)cd[j] - rd[j];
}

/* ---- channel oracle (long double, two passes) ---- */

static void channel_oracle(probe_dtype rt, const void *r, probe_dtype ct, const void *c, size_t n,
                           const probe_channel_spec *ch, probe_channel_shift *o)
{
    double *rd = malloc(n * sizeof *rd), *cd = malloc(n * sizeof *cd);
    long double *s1 = calloc(ch->count, sizeof *s1), *sr = calloc(ch->count, sizeof *sr),
                *m2 = calloc(ch->count, sizeof *m2);
    uint64_t *cnt = calloc(ch->count, sizeof *cnt);
    long double *dd = malloc(n * sizeof *dd);
    probe_dtype_to_f64(rt, r, rd, n);
    probe_dtype_to_f64(ct, c, cd, n);
    diff_part(rt, r, ct, c, 0, n, rd, cd, dd);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(rd[i]) || !isfinite(cd[i]))
            continue;
        uint64_t k = (i / ch->inner) % ch->count;
        cnt[k]++;
        s1[k] += dd[i];
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
    free(rd); free(cd); free(dd); free(s1); free(sr); free(m2); free(cnt);
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

/* The pair's decoded elements [off, off + m) into r and c, and (when d is
 * not NULL) their differences (diff_part). */
static void decode_part(const pair_case *pc, size_t off, size_t m, double *r, double *c,
                        long double *d)
{
    probe_dtype_to_f64(pc->rt, (const unsigned char *)pc->r + off * probe_dtype_size(pc->rt), r, m);
    probe_dtype_to_f64(pc->ct, (const unsigned char *)pc->c + off * probe_dtype_size(pc->ct), c, m);
    if (d)
        diff_part(pc->rt, pc->r, pc->ct, pc->c, off, m, r, c, d);
}

#define PART 65536

static void gain_sums_of(const pair_case *pc, gain_sums *s)
{
    static double r[PART], c[PART];
    static long double dv[PART];
    memset(s, 0, sizeof *s);
    for (size_t off = 0; off < pc->n; off += PART) {
        size_t m = pc->n - off < PART ? pc->n - off : PART;
        decode_part(pc, off, m, r, c, dv);
        for (size_t i = 0; i < m; i++) {
            if (!isfinite(r[i]) || !isfinite(c[i]))
                continue;
            long double x = r[i], d = dv[i], xx = x * x;
            s->rr += xx;
            s->dd += d * d;
            s->r2d2 += xx * d * d;
            s->r4 += xx * xx;
        }
    }
}

/* Per channel: the sum of |d| over the finite indices (count entries). */
static long double *channel_abs_sums(const pair_case *pc)
{
    static double r[PART], c[PART];
    static long double dv[PART];
    long double *a = calloc(pc->ch.count, sizeof *a);
    for (size_t off = 0; off < pc->n; off += PART) {
        size_t m = pc->n - off < PART ? pc->n - off : PART;
        decode_part(pc, off, m, r, c, dv);
        for (size_t i = 0; i < m; i++)
            if (isfinite(r[i]) && isfinite(c[i]))
                a[((off + i) / pc->ch.inner) % pc->ch.count] += fabsl(dv[i]);
    }
    return a;
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

/* Both paths on one pair: g/gs the GPU through device pointers, c/cs the
 * CPU engine (probe_metrics_compute_source); with channels also the GPU
 * through probe_cuda_metrics_source_v2, whose per-channel arrays are ga and
 * the CPU's ca (each shift, se, n: 3 x count doubles). */
typedef struct {
    probe_metrics g, c;
    probe_channel_shift gs, cs;
    double *ga, *ca;
} pair_result;

static void free_result(pair_result *pr)
{
    free(pr->ga);
    free(pr->ca);
    pr->ga = pr->ca = NULL;
}

/* 0 with why set when a call fails. */
static int run_both(const pair_case *pc, pair_result *pr)
{
    memset(pr, 0, sizeof *pr);
    probe_status s = run_gpu(pc, &pr->g, &pr->gs);
    if (s != PROBE_OK) {
        snprintf(why, sizeof why, "probe_cuda_metrics: %s", probe_last_error());
        return 0;
    }
    uint64_t K = pc->ch.count;
    if (K) {
        pr->ga = malloc(3 * K * sizeof(double));
        pr->ca = malloc(3 * K * sizeof(double));
    }
    host_src hs = {{pc->r, pc->c}, {probe_dtype_size(pc->rt), probe_dtype_size(pc->ct)}, 0};
    probe_pair_source src = {pc->n, {pc->rt, pc->ct}, src_read, &hs};
    probe_stream_opts so = {0, pc->ch, K ? pr->ca : NULL, K ? pr->ca + K : NULL,
                            K ? pr->ca + 2 * K : NULL};
    s = probe_metrics_compute_source(&src, &pc->opts, &so, &pr->c, K ? &pr->cs : NULL);
    if (s != PROBE_OK) {
        snprintf(why, sizeof why, "probe_metrics_compute_source: %s", probe_last_error());
        return 0;
    }
    if (K) {
        probe_metrics g2;
        probe_channel_shift gs2;
        probe_stream_opts sg = {0, pc->ch, pr->ga, pr->ga + K, pr->ga + 2 * K};
        s = probe_cuda_metrics_source_v2(0, &src, &pc->opts, &sg, &g2, &gs2);
        if (s != PROBE_OK) {
            snprintf(why, sizeof why, "probe_cuda_metrics_source_v2: %s", probe_last_error());
            return 0;
        }
        if (memcmp(&g2, &pr->g, sizeof g2) != 0 || memcmp(&gs2, &pr->gs, sizeof gs2) != 0) {
            snprintf(why, sizeof why, "probe_cuda_metrics_source_v2 differs from probe_cuda_metrics "
                     "(z_argmax %llu/%llu z_max %.17g/%.17g)", (unsigned long long)gs2.z_argmax,
                     (unsigned long long)pr->gs.z_argmax, gs2.z_max, pr->gs.z_max);
            return 0;
        }
    }
    return 1;
}

/* z_k from shift_k, se_k, n_k (probe/metrics.h) */
static double z_of(double v, double se, double n)
{
    return n < 2 || v == 0.0 ? 0.0 : se > 0.0 ? v / se : copysign(INFINITY, v);
}

/* The per-channel arrays and z of the GPU against the CPU's: n_k exact;
 * shift_k within EPS of the mean |d| of the channel (a sum of d over the sum
 * of its magnitudes); se_k relative 1e-10 (the square root of a sum of
 * squared deviations: no cancellation); z_max within what those allow, at
 * the same channel or, when the GPU picked another one, at a channel whose
 * CPU |z| ties the CPU's maximum within the same tolerance. */
static int channels_agree(const pair_case *pc, const pair_result *pr)
{
    uint64_t K = pc->ch.count;
    const double *gv = pr->ga, *gse = pr->ga + K, *gn = pr->ga + 2 * K;
    const double *cv = pr->ca, *cse = pr->ca + K, *cn = pr->ca + 2 * K;
    long double *sabs = channel_abs_sums(pc);
    int ok = 1;
    for (uint64_t k = 0; k < K && ok; k++) {
        double tv = (double)(EPS * (cn[k] > 0 ? sabs[k] / cn[k] : 0));
        if (gn[k] != cn[k]) {
            snprintf(why, sizeof why, "n[%llu] gpu %.17g cpu %.17g", (unsigned long long)k, gn[k],
                     cn[k]);
            ok = 0;
        } else if (!(isnan(gv[k]) && isnan(cv[k])) && !(fabs(gv[k] - cv[k]) <= tv)) {
            snprintf(why, sizeof why, "shift[%llu] gpu %.17g cpu %.17g (tol %.3g)",
                     (unsigned long long)k, gv[k], cv[k], tv);
            ok = 0;
        } else if (!close_rel(gse[k], cse[k], 1e-10, fabs(cse[k]))) {
            snprintf(why, sizeof why, "se[%llu] gpu %.17g cpu %.17g", (unsigned long long)k, gse[k],
                     cse[k]);
            ok = 0;
        }
    }
    uint64_t gk = pr->gs.z_argmax, ck = pr->cs.z_argmax;
    if (ok && (gk >= K || pr->gs.count != pr->cs.count)) {
        snprintf(why, sizeof why, "z_argmax %llu of %llu channels (cpu %llu of %llu)",
                 (unsigned long long)gk, (unsigned long long)pr->gs.count, (unsigned long long)ck,
                 (unsigned long long)pr->cs.count);
        ok = 0;
    }
    if (ok) {
        /* tolerance of the CPU's z at channel k */
        double ztol[2];
        uint64_t ks[2] = {gk, ck};
        for (int i = 0; i < 2; i++) {
            uint64_t k = ks[i];
            double z = z_of(cv[k], cse[k], cn[k]);
            double tv = (double)(EPS * (cn[k] > 0 ? sabs[k] / cn[k] : 0));
            ztol[i] = isfinite(z) && cse[k] > 0 ? 2e-10 * fabs(z) + tv / cse[k] : 0.0;
        }
        double zg = z_of(cv[gk], cse[gk], cn[gk]); /* the CPU's z at the GPU's channel */
        int tie = gk == ck || (isfinite(zg) && isfinite(pr->cs.z_max)
                                   ? fabs(fabs(zg) - fabs(pr->cs.z_max)) <= ztol[0] + ztol[1]
                                   : same_bits(fabs(zg), fabs(pr->cs.z_max)));
        if (!tie || !close_rel(pr->gs.z_max, zg, 1.0, ztol[0])) {
            snprintf(why, sizeof why, "z gpu channel %llu z %.17g, cpu channel %llu z %.17g (cpu z "
                     "at %llu: %.17g, tol %.3g)", (unsigned long long)gk, pr->gs.z_max,
                     (unsigned long long)ck, pr->cs.z_max, (unsigned long long)gk, zg, ztol[0]);
            ok = 0;
        }
    }
    free(sabs);
    return ok;
}

/* Every metric of the pair on both paths (see the top of this file); reports
 * one line. Returns 1 when all agree; pr (when not NULL) keeps the results
 * (free_result). */
static int check_pair_r(const pair_case *pc, pair_result *pr_out)
{
    pair_result pr;
    probe_channel_shift os;
    gain_sums gsum;
    char detail[768];
    int ok = run_both(pc, &pr);
    if (ok) {
        gain_sums_of(pc, &gsum);
        ok = compare(&pr.g, &pr.c, &gsum);
    }
    if (ok && pc->ch.count) {
        const probe_channel_shift *gs = &pr.gs;
        channel_oracle(pc->rt, pc->r, pc->ct, pc->c, pc->n, &pc->ch, &os);
        ok = gs->count == os.count && gs->argmax == os.argmax &&
             close_rel(gs->max, os.max, 1e-10, fabs(os.max)) &&
             close_rel(gs->std_ref, os.std_ref, 1e-10, fabs(os.std_ref)) &&
             close_rel(gs->max_rel, os.max_rel, 1e-10, fabs(os.max_rel));
        if (!ok)
            snprintf(why, sizeof why, "channel shift gpu (count %llu argmax %llu max %.17g std %.17g rel %.17g) oracle (%llu %llu %.17g %.17g %.17g)",
                     (unsigned long long)gs->count, (unsigned long long)gs->argmax, gs->max, gs->std_ref, gs->max_rel,
                     (unsigned long long)os.count, (unsigned long long)os.argmax, os.max, os.std_ref, os.max_rel);
        else
            ok = channels_agree(pc, &pr);
    }
    if (!ok) {
        report(0, pc->name, why);
    } else {
        const probe_metrics *g = &pr.g;
        snprintf(detail, sizeof detail, "n %zu %s/%s finite %llu mism %llu max %.6g@%llu p99 %.6g rel_l2 %.6g cos %.17g gain %.6g z %.4g ulps %.4g/%.4g%s",
                 pc->n, probe_dtype_name(pc->rt), probe_dtype_name(pc->ct),
                 (unsigned long long)g->n_finite, (unsigned long long)g->mismatch_count, g->max_abs,
                 (unsigned long long)g->max_abs_offset, g->p99_abs, g->rel_l2, g->cosine, g->gain,
                 g->gain_z, g->mismatch_ulps_max, g->max_abs_ulps_scale,
                 g->identical ? " identical" : "");
        if (pc->ch.count) {
            size_t l = strlen(detail);
            snprintf(detail + l, sizeof detail - l, " shift[%llu] %.6g (%.6g std) z[%llu] %.4g",
                     (unsigned long long)pr.gs.argmax, pr.gs.max, pr.gs.max_rel,
                     (unsigned long long)pr.gs.z_argmax, pr.gs.z_max);
        }
        report(1, pc->name, detail);
    }
    if (pr_out)
        *pr_out = pr;
    else
        free_result(&pr);
    return ok;
}

static void check_pair(const pair_case *pc)
{
    check_pair_r(pc, NULL);
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

/* A case holding copies of n elements of r (type rt) and c (type ct). */
static pair_case make_from(const char *name, probe_dtype rt, const void *r, probe_dtype ct,
                           const void *c, size_t n, probe_metrics_opts tol)
{
    pair_case pc = {name, rt, ct, n, alloc_pair(rt, n), alloc_pair(ct, n), tol, {0, 0}, 0};
    memcpy(pc.r, r, n * probe_dtype_size(rt));
    memcpy(pc.c, c, n * probe_dtype_size(ct));
    return pc;
}

static void free_case(pair_case *pc)
{
    free(pc->r);
    free(pc->c);
}

/* ---- summary ---- */

/* probe_cuda_summary_tree of the n elements at x, copied to device memory
 * at byte offset off of an allocation, against the host's
 * probe_summary_tree and probe_tree_hash of the same bytes: every field and
 * the tree hash bit for bit (the canonical tree order of both). */
static void check_summary_at(const char *name, probe_dtype t, const void *x, size_t n, size_t off)
{
    size_t sz = probe_dtype_size(t);
    unsigned char *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, n * sz + off + 16));
    CUDA_OK(cudaMemcpy(d + off, x, n * sz, cudaMemcpyHostToDevice));
    probe_summary g, c;
    uint64_t gh = 1, ch = 2;
    probe_status s = probe_cuda_summary_tree(t, d + off, n, NULL, &g, &gh);
    probe_summary g2;
    probe_status s2 = probe_cuda_summary(t, d + off, n, NULL, &g2);
    cudaFree(d);
    if (s != PROBE_OK || s2 != PROBE_OK) {
        report(0, name, probe_last_error());
        return;
    }
    probe_status hs = probe_summary_tree(t, x, n, &c, &ch);
    /* the hash of the bytes as a full capture stores them: bool as 0/1 */
    uint64_t bh;
    if (t == PROBE_DTYPE_BOOL) {
        unsigned char *b = malloc(n ? n : 1);
        for (size_t k = 0; k < n; k++)
            b[k] = ((const unsigned char *)x)[k] != 0;
        bh = probe_tree_hash(b, n);
        free(b);
    } else {
        bh = probe_tree_hash(x, n * sz);
    }
    int ok = hs == PROBE_OK && g.n == c.n && g.n_finite == c.n_finite && g.nan == c.nan &&
             g.inf == c.inf && same_bits(g.min, c.min) && same_bits(g.max, c.max) &&
             same_bits(g.abs_max, c.abs_max) && same_bits(g.sum, c.sum) &&
             same_bits(g.sum_sq, c.sum_sq) && gh == ch && ch == bh &&
             memcmp(&g, &g2, sizeof g) == 0;
    char detail[600];
    snprintf(detail, sizeof detail,
             "n %zu at +%zu: finite %llu nan %llu inf %llu min %.17g/%.17g max %.17g/%.17g "
             "sum %a/%a sq %a/%a tree hash %016llx/%016llx/%016llx",
             n, off, (unsigned long long)g.n_finite, (unsigned long long)g.nan,
             (unsigned long long)g.inf, g.min, c.min, g.max, c.max, g.sum, c.sum, g.sum_sq,
             c.sum_sq, (unsigned long long)gh, (unsigned long long)ch, (unsigned long long)bh);
    report(ok, name, detail);
}

static void check_summary(const char *name, probe_dtype t, const void *x, size_t n)
{
    check_summary_at(name, t, x, n, 0);
}

/* A host function that holds its stream until *arg is set (at most 10 s). */
static void CUDART_CB hold_stream(void *arg)
{
    volatile int *go = (volatile int *)arg;
    for (int k = 0; k < 10000 && !*go; k++)
        usleep(1000);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* probe_cuda_summary_tree_enqueue behind a stream that a host function
 * holds: it returns while the stream is held (nothing waits on the host),
 * and once the stream has run, _result gives probe_cuda_summary_tree's bits;
 * _result refuses a slot whose counts are not n. */
static void check_summary_enqueue(probe_dtype t, const void *x, size_t n)
{
    size_t sz = probe_dtype_size(t);
    unsigned char *d = NULL;
    void *slot = NULL;
    cudaStream_t st;
    static volatile int go;
    go = 0;
    CUDA_OK(cudaMalloc((void **)&d, n * sz));
    CUDA_OK(cudaMemcpy(d, x, n * sz, cudaMemcpyHostToDevice));
    CUDA_OK(cudaHostAlloc(&slot, PROBE_CUDA_TREE_RESULT_BYTES, cudaHostAllocDefault));
    memset(slot, 0, PROBE_CUDA_TREE_RESULT_BYTES);
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaLaunchHostFunc(st, hold_stream, (void *)&go));
    double t0 = now_s();
    probe_status s = probe_cuda_summary_tree_enqueue(t, d, n, st, slot);
    double took = now_s() - t0;
    int held = cudaStreamQuery(st) == cudaErrorNotReady;
    go = 1;
    CUDA_OK(cudaStreamSynchronize(st));
    probe_summary a, b;
    uint64_t ha = 0, hb = 1;
    probe_status s2 = probe_cuda_summary_tree_result(t, n, slot, &a, &ha);
    probe_status s3 = probe_cuda_summary_tree(t, d, n, st, &b, &hb);
    probe_summary h, e;
    uint64_t hh = 2, he = 3;
    probe_status s4 = probe_cuda_summary_tree_result(t, n + 1, slot, &e, &he);
    probe_status s5 = probe_summary_tree(t, x, n, &h, &hh);
    int same_a = memcmp(&a, &h, sizeof a) == 0 && ha == hh;
    int same_b = memcmp(&b, &h, sizeof b) == 0 && hb == hh;
    int ok = s == PROBE_OK && held && took < 1.0 && s2 == PROBE_OK && s3 == PROBE_OK &&
             s5 == PROBE_OK && same_a && same_b && s4 == PROBE_EINVAL;
    char detail[512];
    snprintf(detail, sizeof detail,
             "enqueue %.3f ms while held %d; result %d, equal to the host's: enqueued %d, "
             "synchronous %d; n+1 refused %d; finite %llu/%llu/%llu sum %a/%a/%a sq %a/%a/%a "
             "min %a/%a/%a max %a/%a/%a hash %016llx/%016llx/%016llx",
             took * 1e3, held, (int)s2, same_a, same_b, s4 == PROBE_EINVAL,
             (unsigned long long)a.n_finite, (unsigned long long)b.n_finite,
             (unsigned long long)h.n_finite, a.sum, b.sum, h.sum, a.sum_sq, b.sum_sq, h.sum_sq,
             a.min, b.min, h.min, a.max, b.max, h.max, (unsigned long long)ha,
             (unsigned long long)hb, (unsigned long long)hh);
    report(ok, "summary.tree.enqueue", detail);
    cudaStreamDestroy(st);
    cudaFreeHost(slot);
    cudaFree(d);
}

/* ---- the systematic-statistics cases (tests/unit/test_systematic.c) ---- */

static const probe_metrics_opts TOL = {1e-3, 1e-3};

/* The deterministic sequence of test_systematic.c, in [-1, 1). */
static double lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 4503599627370496.0 - 1.0;
}

/* x (finite) to bfloat16, rounded to nearest even through float. */
static uint16_t to_bf16(double x)
{
    float f = (float)x;
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7FFFu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

static double bf16_value(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* The pair against the CPU engine, then the GPU's gain, gain_se and gain_z
 * against a direct long double computation on the decoded values (alpha
 * first, then the residuals; every element finite): relative 1e-10, 1e-8,
 * 1e-8, and z above zmin. */
static void check_gain_oracle(const pair_case *pc, double zmin)
{
    pair_result pr;
    check_pair_r(pc, &pr);
    double *r = malloc(pc->n * sizeof *r), *c = malloc(pc->n * sizeof *c);
    decode_part(pc, 0, pc->n, r, c, NULL);
    long double dr = 0, rr = 0, q = 0;
    for (size_t i = 0; i < pc->n; i++) {
        long double d = (long double)c[i] - r[i];
        dr += d * r[i];
        rr += (long double)r[i] * r[i];
    }
    long double a = dr / rr;
    for (size_t i = 0; i < pc->n; i++) {
        long double e = ((long double)c[i] - r[i]) - a * r[i];
        q += (long double)r[i] * r[i] * e * e;
    }
    long double se = sqrtl(q) / rr, z = a / se;
    const probe_metrics *g = &pr.g;
    int ok = fabsl(g->gain - a) <= 1e-10L * fabsl(a) && fabsl(g->gain_se - se) <= 1e-8L * se &&
             fabsl(g->gain_z - z) <= 1e-8L * fabsl(z) && g->gain_z > zmin;
    char name[160], d[256];
    snprintf(name, sizeof name, "%s.oracle", pc->name);
    snprintf(d, sizeof d, "gpu gain %.17g se %.17g z %.17g; long double %.17Lg %.17Lg %.17Lg",
             g->gain, g->gain_se, g->gain_z, a, se, z);
    report(ok, name, d);
    free(r);
    free(c);
    free_result(&pr);
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

    /* 7b. the p99 at the level-0 bins (bfloat16, hand-derived values; the
     * values at random places). Each key p * 2^51 (2^e, 1.5 * 2^e) has a bin
     * of its own, before the rest of its 12-bit prefix p:
     *   - rank k in such a bin: its value, no select pass (3 * 2^-7 = 1.5 * 2^-6;
     *     also k at the bin's last element);
     *   - rank k in the rest of a prefix that also holds p * 2^51: the search
     *     under p counts those keys too (|d| = 2^-7 and 1.25 * 2^-7, of r =
     *     0.25, c = 0.25 + 4 or 5 * 2^-9); 3000 keys under p: the collect path,
     *     30000: a histogram level. */
    {
        static const struct {
            const char *name;
            size_t n, n_a, n_b;       /* elements; with |d| = a; with |d| = b (the rest 0) */
            uint16_t r, ca, cb;       /* reference; candidate where |d| = a, = b */
            double p99;
        } L0[] = {
            {"p99-level0.exact-bin", 100000, 2000, 0, 0x3F80, 0x3F83, 0x3F80, 0x1.8p-6},
            {"p99-level0.exact-bin-last", 100000, 1000, 1000, 0x3F80, 0x3F83, 0x3F84, 0x1.8p-6},
            {"p99-level0.rest-collect", 100000, 1500, 1500, 0x3E80, 0x3E84, 0x3E85, 0x1.4p-7},
            {"p99-level0.rest-histogram", 1000000, 15000, 15000, 0x3E80, 0x3E84, 0x3E85, 0x1.4p-7},
        };
        for (size_t li = 0; li < sizeof L0 / sizeof L0[0]; li++) {
            const probe_dtype t = PROBE_DTYPE_BFLOAT16;
            size_t n = L0[li].n;
            pair_case pc = {L0[li].name, t, t, n, alloc_pair(t, n), alloc_pair(t, n), {1e-3, 1e-3},
                            {0, 0}, 0};
            for (size_t i = 0; i < n; i++) {
                put(t, pc.r, i, L0[li].r);
                put(t, pc.c, i, i < L0[li].n_a ? L0[li].ca : i < L0[li].n_a + L0[li].n_b ? L0[li].cb : L0[li].r);
            }
            for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates over the candidate */
                size_t j = (size_t)(rnd() % (i + 1));
                uint64_t a = get(t, pc.c, i), b = get(t, pc.c, j);
                put(t, pc.c, i, b);
                put(t, pc.c, j, a);
            }
            pair_result pr;
            int ran = check_pair_r(&pc, &pr); /* 0: a failed run, already reported */
            char detail[128], nm[96];
            snprintf(detail, sizeof detail, "p99 %.17g, hand-derived %.17g", pr.g.p99_abs, L0[li].p99);
            snprintf(nm, sizeof nm, "%s.value", L0[li].name);
            report(ran && pr.g.p99_abs == L0[li].p99, nm, detail);
            free_result(&pr);
            free_case(&pc);
        }
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
            {"channels.int64[64,8,16]ax1", 64, 8, 16, PROBE_DTYPE_INT64},
            {"channels.int64-cols[4096,4]ax1", 4096, 4, 1, PROBE_DTYPE_INT64},
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
            if (probe_dtype_is_float(cs[k].t))
                put(cs[k].t, pc.c, n / 3, enc_nan(cs[k].t));
            check_pair(&pc);
            free_case(&pc);
        }
    }

    /* 11b. the systematic statistics and the other new fields on the cases
     * of tests/unit/test_systematic.c (each: the GPU against the CPU engine,
     * then a line with the expected values) */
    {
        /* relative gain error against a direct long double computation:
         * heteroscedastic noise and a 1e-3 gain on more than two CPU chunks */
        enum { N = 300000 };
        double *r = malloc(N * sizeof *r), *c = malloc(N * sizeof *c);
        uint64_t s = 7;
        for (size_t i = 0; i < N; i++) {
            r[i] = lcg(&s) * 3.0;
            c[i] = r[i] * (1.0 + 1e-3) + 1e-2 * fabs(r[i]) * lcg(&s);
        }
        pair_case pc = make_from("systematic.gain.float64", PROBE_DTYPE_FLOAT64, r,
                                 PROBE_DTYPE_FLOAT64, c, N, TOL);
        check_gain_oracle(&pc, 10.0);
        free_case(&pc);
        /* the same in bfloat16 (a specialised kernel): a gain of 2^-6 */
        uint16_t *rb = malloc(N * 2), *cb = malloc(N * 2);
        for (size_t i = 0; i < N; i++) {
            rb[i] = to_bf16(lcg(&s) * 3.0);
            double x = bf16_value(rb[i]);
            cb[i] = to_bf16(x * (1.0 + 0x1p-6) + 1e-2 * fabs(x) * lcg(&s));
        }
        pc = make_from("systematic.gain.bfloat16", PROBE_DTYPE_BFLOAT16, rb, PROBE_DTYPE_BFLOAT16,
                       cb, N, TOL);
        check_gain_oracle(&pc, 10.0);
        free_case(&pc);
        free(rb);
        free(cb);

        /* values near 2^+-280 and 2^+-260 need the scaled pass (fourth powers
         * leave the range of double beyond 2^+-250): the gain and z of the
         * pair equal those of the same pair scaled to 1 */
        enum { M = 1000 };
        uint64_t s3 = 3;
        for (size_t i = 0; i < M; i++) {
            r[i] = lcg(&s3);
            c[i] = r[i] * 1.01 + 0.01 * lcg(&s3);
        }
        pair_case unit = make_from("systematic.gain.unscaled", PROBE_DTYPE_FLOAT64, r,
                                   PROBE_DTYPE_FLOAT64, c, M, TOL);
        pair_result ur;
        check_pair_r(&unit, &ur);
        const int exps[4] = {280, -280, 260, -260};
        for (int k = 0; k < 4; k++) {
            char name[64];
            snprintf(name, sizeof name, "systematic.gain.float64.2^%d", exps[k]);
            pair_case big = make_from(name, PROBE_DTYPE_FLOAT64, r, PROBE_DTYPE_FLOAT64, c, M, TOL);
            for (size_t i = 0; i < M; i++) {
                ((double *)big.r)[i] = ldexp(r[i], exps[k]);
                ((double *)big.c)[i] = ldexp(c[i], exps[k]);
            }
            pair_result br;
            check_pair_r(&big, &br);
            int ok = isfinite(br.g.gain_z) && isfinite(br.g.gain_se) &&
                     fabs(br.g.gain - ur.g.gain) <= 1e-12 * fabs(ur.g.gain) &&
                     fabs(br.g.gain_z - ur.g.gain_z) <= 1e-12 * fabs(ur.g.gain_z) &&
                     fabs(br.g.gain_se - ur.g.gain_se) <= 1e-12 * ur.g.gain_se;
            char d[256];
            snprintf(d, sizeof d, "gpu gain %.17g z %.17g, of the pair at 2^0 %.17g %.17g",
                     br.g.gain, br.g.gain_z, ur.g.gain, ur.g.gain_z);
            snprintf(name, sizeof name, "systematic.gain.float64.2^%d.scale-free", exps[k]);
            report(ok, name, d);
            free_result(&br);
            free_case(&big);
        }
        free_result(&ur);
        free_case(&unit);
        free(r);
        free(c);
    }
    {
        /* hand-derived: d = (0.5, -0.5, 0.25, 0) on r = (1, 2, 2, 4): alpha 0,
         * se sqrt(1.5)/25, z 0; c = 2r: alpha 1, se 0, z +inf; r = 0: all 0 */
        const double r[4] = {1, 2, 2, 4}, c[4] = {1.5, 1.5, 2.25, 4}, c2[4] = {2, 4, 4, 8};
        const double z[3] = {0, 0, 0}, c3[3] = {1, 0, 0};
        pair_result pr;
        pair_case pc = make_from("systematic.gain.hand.zero", PROBE_DTYPE_FLOAT64, r,
                                 PROBE_DTYPE_FLOAT64, c, 4, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.gain == 0.0 && fabs(pr.g.gain_se - sqrt(1.5) / 25.0) < 1e-16 &&
                   pr.g.gain_z == 0.0,
               "systematic.gain.hand.zero.values", "gain 0, se sqrt(1.5)/25, z 0");
        free_result(&pr);
        free_case(&pc);
        pc = make_from("systematic.gain.hand.double", PROBE_DTYPE_FLOAT64, r, PROBE_DTYPE_FLOAT64,
                       c2, 4, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.gain == 1.0 && pr.g.gain_se == 0.0 && isinf(pr.g.gain_z) && pr.g.gain_z > 0,
               "systematic.gain.hand.double.values", "c = 2r: gain 1, se 0, z +inf");
        free_result(&pr);
        free_case(&pc);
        pc = make_from("systematic.gain.hand.zero-reference", PROBE_DTYPE_FLOAT64, z,
                       PROBE_DTYPE_FLOAT64, c3, 3, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.gain == 0.0 && pr.g.gain_se == 0.0 && pr.g.gain_z == 0.0,
               "systematic.gain.hand.zero-reference.values", "gain, se, z 0");
        free_result(&pr);
        free_case(&pc);
    }
    {
        /* channel z against a direct computation: [3, 50000], channel 1
         * shifted by 0.05 of its noise sd, channel 2 without any difference */
        enum { C = 3, I = 50000, N = C * I };
        double *r = malloc(N * sizeof *r), *c = malloc(N * sizeof *c);
        uint64_t s = 11;
        for (int k = 0; k < C; k++)
            for (int i = 0; i < I; i++) {
                size_t j = (size_t)k * I + i;
                r[j] = lcg(&s);
                c[j] = k == 2 ? r[j] : r[j] + 1e-2 * lcg(&s) + (k == 1 ? 0.05 * 1e-2 / sqrt(3.0) : 0);
            }
        pair_case pc = make_from("systematic.channel-z.float64[3,50000]", PROBE_DTYPE_FLOAT64, r,
                                 PROBE_DTYPE_FLOAT64, c, N, TOL);
        pc.ch = (probe_channel_spec){C, I};
        pair_result pr;
        int ok = check_pair_r(&pc, &pr);
        char d[512] = "";
        for (int k = 0; k < C && ok; k++) {
            long double sum = 0, q = 0;
            for (int i = 0; i < I; i++)
                sum += (long double)c[(size_t)k * I + i] - r[(size_t)k * I + i];
            long double mu = sum / I;
            for (int i = 0; i < I; i++) {
                long double e = ((long double)c[(size_t)k * I + i] - r[(size_t)k * I + i]) - mu;
                q += e * e;
            }
            long double want_se = sqrtl(q / (I - 1) / I);
            double v = pr.ga[k], se = pr.ga[C + k], nk = pr.ga[2 * C + k];
            ok = nk == I && fabsl(v - mu) <= 1e-12L * fabsl(mu) + 1e-19L &&
                 (k == 2 ? v == 0 && se == 0 : fabsl(se - want_se) <= 1e-10L * want_se);
            if (!ok)
                snprintf(d, sizeof d, "channel %d: n %.17g shift %.17g (want %.17Lg) se %.17g (want "
                         "%.17Lg)", k, nk, v, mu, se, want_se);
        }
        if (ok) {
            double z1 = pr.ga[1] / pr.ga[C + 1];
            ok = pr.gs.z_argmax == 1 && fabs(pr.gs.z_max - z1) <= 1e-15 * fabs(z1) &&
                 pr.gs.z_max > 6 && pr.gs.z_max < 20;
            snprintf(d, sizeof d, "z_argmax %llu z_max %.17g (shift/se of channel 1: %.17g)",
                     (unsigned long long)pr.gs.z_argmax, pr.gs.z_max, z1);
        }
        report(ok, "systematic.channel-z.float64[3,50000].oracle", d);
        free_result(&pr);
        free_case(&pc);
        free(r);
        free(c);
    }
    {
        /* degenerate channels: one element each (se NaN, z 0); d = 0 (z 0),
         * a constant shift (se 0, z +inf), two elements (se 0.25) */
        const double r[5] = {1, 2, 3, 4, 5}, c[5] = {1, 2, 3.5, 4.5, 5};
        pair_case pc = make_from("systematic.channel-z.singletons", PROBE_DTYPE_FLOAT64, r,
                                 PROBE_DTYPE_FLOAT64, c, 5, TOL);
        pc.ch = (probe_channel_spec){5, 1};
        pair_result pr;
        int ok = check_pair_r(&pc, &pr);
        for (int k = 0; k < 5 && ok; k++)
            ok = isnan(pr.ga[5 + k]) && pr.ga[10 + k] == 1.0;
        report(ok && pr.gs.z_max == 0.0 && pr.gs.z_argmax == 0,
               "systematic.channel-z.singletons.values", "se NaN, n 1, z_max 0 at channel 0");
        free_result(&pr);
        free_case(&pc);
        const double r6[6] = {1, 1, 2, 2, 3, 3}, c6[6] = {1, 1, 2.5, 2.5, 3, 3.5};
        pc = make_from("systematic.channel-z.degenerate", PROBE_DTYPE_FLOAT64, r6,
                       PROBE_DTYPE_FLOAT64, c6, 6, TOL);
        pc.ch = (probe_channel_spec){3, 2};
        ok = check_pair_r(&pc, &pr);
        const double *v = pr.ga, *se = ok ? pr.ga + 3 : NULL;
        ok = ok && v[0] == 0 && se[0] == 0 && v[1] == 0.5 && se[1] == 0 && v[2] == 0.25 &&
             fabs(se[2] - 0.25) < 1e-16 && pr.gs.z_argmax == 1 && isinf(pr.gs.z_max) &&
             pr.gs.z_max > 0;
        report(ok, "systematic.channel-z.degenerate.values",
               "shift 0/0.5/0.25, se 0/0/0.25, z_max +inf at channel 1");
        free_result(&pr);
        free_case(&pc);
    }
    {
        /* NaN in the reference only, in float64 and in each specialised type */
        const double r[4] = {NAN, NAN, 1, INFINITY}, c[4] = {1, NAN, 1, 2};
        pair_result pr;
        pair_case pc = make_from("systematic.nan-ref-only.float64", PROBE_DTYPE_FLOAT64, r,
                                 PROBE_DTYPE_FLOAT64, c, 4, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.nan_ref_only == 1 && pr.g.inf_mismatch == 1,
               "systematic.nan-ref-only.float64.values", "nan_ref_only 1, inf_mismatch 1");
        free_result(&pr);
        free_case(&pc);
        const double rn[3] = {NAN, NAN, NAN}, cf[3] = {1, 2, 3};
        pc = make_from("systematic.nan-ref-only.all", PROBE_DTYPE_FLOAT64, rn, PROBE_DTYPE_FLOAT64,
                       cf, 3, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.nan_ref_only == 3 && pr.g.identical == 0,
               "systematic.nan-ref-only.all.values", "nan_ref_only 3, not identical");
        free_result(&pr);
        free_case(&pc);
        static const probe_dtype ts[] = {PROBE_DTYPE_BFLOAT16, PROBE_DTYPE_FLOAT16,
                                         PROBE_DTYPE_FLOAT32};
        for (int k = 0; k < 3; k++) {
            char name[64];
            snprintf(name, sizeof name, "systematic.nan-ref-only.%s", probe_dtype_name(ts[k]));
            pc = make_near(name, ts[k], 5000, 2);
            pc.name = name;
            for (size_t i = 0; i < 5000; i += 97)
                put(ts[k], pc.r, i, enc_nan(ts[k]));
            put(ts[k], pc.c, 97, enc_nan(ts[k])); /* NaN on both sides: not counted */
            check_pair_r(&pc, &pr);
            char d[64];
            snprintf(d, sizeof d, "nan_ref_only %llu (want 51)",
                     (unsigned long long)pr.g.nan_ref_only);
            snprintf(name, sizeof name, "systematic.nan-ref-only.%s.values",
                     probe_dtype_name(ts[k]));
            report(pr.g.nan_ref_only == 51, name, d);
            free_result(&pr);
            free_case(&pc);
        }
    }
    {
        /* identity is element type and bytes; 64-bit integer differences exact */
        probe_metrics_opts exact = {0, 0};
        pair_result pr;
        const int64_t a[2] = {((int64_t)1 << 62) + 1, 5}, b[2] = {((int64_t)1 << 62) + 2, 5};
        pair_case pc = make_from("identity.int64.2^62+1-vs-2^62+2", PROBE_DTYPE_INT64, a,
                                 PROBE_DTYPE_INT64, b, 2, exact);
        check_pair_r(&pc, &pr);
        report(pr.g.identical == 0 && pr.g.max_abs == 1.0 && pr.g.max_abs_offset == 0 &&
                   pr.g.mismatch_count == 1,
               "identity.int64.2^62+1-vs-2^62+2.values", "not identical, max_abs 1 at 0, 1 mismatch");
        free_result(&pr);
        free_case(&pc);
        pc = make_from("identity.int64.same", PROBE_DTYPE_INT64, a, PROBE_DTYPE_INT64, a, 2, exact);
        check_pair_r(&pc, &pr);
        report(pr.g.identical == 1, "identity.int64.same.values", "identical");
        free_result(&pr);
        free_case(&pc);
        const uint64_t u0[1] = {UINT64_MAX}, u1[1] = {0};
        pc = make_from("identity.uint64.max-vs-0", PROBE_DTYPE_UINT64, u0, PROBE_DTYPE_UINT64, u1, 1,
                       exact);
        check_pair_r(&pc, &pr);
        report(pr.g.max_abs == 18446744073709551615.0, "identity.uint64.max-vs-0.values",
               "max_abs 2^64 - 1 rounded");
        free_result(&pr);
        free_case(&pc);
        /* the widest differences: int64 min / max against uint64 max / 0, and
         * values beyond 2^53 in different integer types (the generic kernel) */
        const int64_t ie[6] = {INT64_MIN, INT64_MAX, -1, ((int64_t)1 << 53) + 1, 0, -3};
        const uint64_t ue[6] = {UINT64_MAX, 0, UINT64_MAX, ((uint64_t)1 << 53), 1, 0x8000000000000001ull};
        pc = make_from("identity.int64-vs-uint64.edges", PROBE_DTYPE_INT64, ie, PROBE_DTYPE_UINT64,
                       ue, 6, exact);
        check_pair_r(&pc, &pr);
        /* 2^64 - 1 - (-2^63) = 1.5 * 2^64 - 1, rounded once: 1.5 * 2^64 */
        report(pr.g.max_abs == 0x1.8p64 && pr.g.max_abs_offset == 0 && pr.g.identical == 0,
               "identity.int64-vs-uint64.edges.values", "max_abs 1.5 * 2^64 at 0");
        free_result(&pr);
        free_case(&pc);
        const int32_t i32[3] = {1 << 30, -7, 0};
        const int64_t i64[3] = {((int64_t)1 << 60) + 3, -7, 1};
        pc = make_from("identity.int32-vs-int64", PROBE_DTYPE_INT32, i32, PROBE_DTYPE_INT64, i64, 3,
                       exact);
        check_pair(&pc);
        free_case(&pc);
        /* the same values in two element types are never identical */
        const double d2[2] = {1.5, -2};
        const float f2[2] = {1.5f, -2};
        const int32_t i2[2] = {1, 2};
        const float fi2[2] = {1, 2};
        pc = make_from("identity.float64-vs-float32", PROBE_DTYPE_FLOAT64, d2, PROBE_DTYPE_FLOAT32,
                       f2, 2, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.identical == 0 && pr.g.rel_l2 == 0.0, "identity.float64-vs-float32.values",
               "not identical, rel_l2 0");
        free_result(&pr);
        free_case(&pc);
        pc = make_from("identity.int32-vs-float32", PROBE_DTYPE_INT32, i2, PROBE_DTYPE_FLOAT32, fi2,
                       2, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.identical == 0 && pr.g.rel_l2 == 0.0, "identity.int32-vs-float32.values",
               "not identical, rel_l2 0");
        free_result(&pr);
        free_case(&pc);
        pc = make_from("identity.empty.float64-vs-float32", PROBE_DTYPE_FLOAT64, d2,
                       PROBE_DTYPE_FLOAT32, f2, 0, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.identical == 0, "identity.empty.float64-vs-float32.values", "not identical");
        free_result(&pr);
        free_case(&pc);
        /* NaN payloads are bytes too; bool compares truth values */
        const uint32_t n0[1] = {0x7FC00000u}, n1[1] = {0x7FC00001u};
        pc = make_from("identity.float32.nan-payloads", PROBE_DTYPE_FLOAT32, n0, PROBE_DTYPE_FLOAT32,
                       n1, 1, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.identical == 0, "identity.float32.nan-payloads.values", "not identical");
        free_result(&pr);
        free_case(&pc);
        const uint8_t t1[2] = {1, 0}, t2[2] = {2, 0};
        pc = make_from("identity.bool.1-vs-2", PROBE_DTYPE_BOOL, t1, PROBE_DTYPE_BOOL, t2, 2, TOL);
        check_pair_r(&pc, &pr);
        report(pr.g.identical == 1, "identity.bool.1-vs-2.values", "identical");
        free_result(&pr);
        free_case(&pc);
        /* -0 against +0 in every float type, inside a full group and in a
         * tail, in pairs long enough for the vector loads */
        for (size_t fi = 0; fi < 6; fi++) {
            probe_dtype t = floats[fi];
            flayout L = layout(t);
            char name[64];
            snprintf(name, sizeof name, "identity.signed-zero.%s", probe_dtype_name(t));
            pc = make_near(name, t, 4099, 2);
            pc.name = name;
            memcpy(pc.c, pc.r, pc.n * probe_dtype_size(t));
            put(t, pc.r, 9, 0);
            put(t, pc.c, 9, 1ull << (L.ebits + L.mbits));
            check_pair_r(&pc, &pr);
            int ok = pr.g.identical == 0 && pr.g.max_abs == 0.0;
            put(t, pc.c, 9, 0);
            pair_result pr2;
            snprintf(name, sizeof name, "identity.signed-zero.%s.same", probe_dtype_name(t));
            check_pair_r(&pc, &pr2);
            ok = ok && pr2.g.identical == 1;
            snprintf(name, sizeof name, "identity.signed-zero.%s.values", probe_dtype_name(t));
            report(ok, name, "-0 vs +0 not identical (max_abs 0); the same bytes identical");
            free_result(&pr);
            free_result(&pr2);
            free_case(&pc);
        }
    }
    {
        /* mismatches in ulps. bfloat16: 1.0 = 0x3F80 (spacing 2^-7), 0.5 =
         * 0x3F00 (2^-8), the smallest subnormal 0x0001 = 2^-133 (2^-133) */
        probe_metrics_opts exact = {0, 0};
        pair_result pr;
        const uint16_t r[3] = {0x3F80, 0x3F00, 0x0001}, c[3] = {0x3F82, 0x3F01, 0x0002};
        pair_case pc = make_from("ulps.bfloat16", PROBE_DTYPE_BFLOAT16, r, PROBE_DTYPE_BFLOAT16, c,
                                 3, exact);
        check_pair_r(&pc, &pr);
        report(pr.g.mismatch_count == 3 && pr.g.mismatch_ulps_max == 2.0 &&
                   pr.g.max_abs_ulps_scale == 2.0,
               "ulps.bfloat16.values", "3 mismatches, 2 ulps, max_abs 2 ulps of the largest");
        free_result(&pr);
        free_case(&pc);
        const uint16_t r2[2] = {0x3F80, 0x3F00}, c2[2] = {0x3F80, 0x3F01};
        pc = make_from("ulps.bfloat16.beside-1", PROBE_DTYPE_BFLOAT16, r2, PROBE_DTYPE_BFLOAT16, c2,
                       2, exact);
        check_pair_r(&pc, &pr);
        report(pr.g.mismatch_ulps_max == 1.0 && pr.g.max_abs_ulps_scale == 0.5,
               "ulps.bfloat16.beside-1.values", "1 ulp of its own, half an ulp of the largest");
        free_result(&pr);
        free_case(&pc);
        const float rf[1] = {1.0f};
        const uint16_t cb[1] = {0x3F81};
        pc = make_from("ulps.float32-vs-bfloat16", PROBE_DTYPE_FLOAT32, rf, PROBE_DTYPE_BFLOAT16, cb,
                       1, exact);
        check_pair_r(&pc, &pr);
        report(pr.g.mismatch_ulps_max == 1.0, "ulps.float32-vs-bfloat16.values",
               "1 ulp of bfloat16");
        free_result(&pr);
        free_case(&pc);
        pc = make_from("ulps.no-mismatch", PROBE_DTYPE_BFLOAT16, r, PROBE_DTYPE_BFLOAT16, r, 3,
                       exact);
        check_pair_r(&pc, &pr);
        report(isnan(pr.g.mismatch_ulps_max) && pr.g.max_abs_ulps_scale == 0.0,
               "ulps.no-mismatch.values", "NaN; max_abs 0 ulps");
        free_result(&pr);
        free_case(&pc);
        const int32_t i0[1] = {1}, i1[1] = {3};
        pc = make_from("ulps.int32", PROBE_DTYPE_INT32, i0, PROBE_DTYPE_INT32, i1, 1, exact);
        check_pair_r(&pc, &pr);
        report(pr.g.mismatch_count == 1 && isnan(pr.g.mismatch_ulps_max) &&
                   isnan(pr.g.max_abs_ulps_scale),
               "ulps.int32.values", "integers: NaN");
        free_result(&pr);
        free_case(&pc);
        /* subnormals: spacing 2^-1074 (float64) and 2^-149 (float32) */
        const double sd_r[2] = {0x3p-1074, 1e-300}, sd_c[2] = {0x5p-1074, 1e-300};
        pc = make_from("ulps.float64.subnormal", PROBE_DTYPE_FLOAT64, sd_r, PROBE_DTYPE_FLOAT64,
                       sd_c, 2, exact);
        check_pair_r(&pc, &pr);
        report(pr.g.mismatch_ulps_max == 2.0, "ulps.float64.subnormal.values", "2 ulps");
        free_result(&pr);
        free_case(&pc);
        const uint32_t sf_r[2] = {0x00000003u, 0x00800000u}, sf_c[2] = {0x00000001u, 0x00800000u};
        pc = make_from("ulps.float32.subnormal", PROBE_DTYPE_FLOAT32, sf_r, PROBE_DTYPE_FLOAT32,
                       sf_c, 2, exact);
        check_pair_r(&pc, &pr);
        report(pr.g.mismatch_ulps_max == 2.0 && pr.g.max_abs_ulps_scale == 2.0,
               "ulps.float32.subnormal.values", "2 ulps (2 ulps of 2^-126 too)");
        free_result(&pr);
        free_case(&pc);
        /* every pair of floating types at tolerance 0 (ulps of the coarser) */
        for (size_t a = 0; a < 6; a++)
            for (size_t b = 0; b < 6; b++) {
                char name[96];
                snprintf(name, sizeof name, "ulps.%s-vs-%s", probe_dtype_name(floats[a]),
                         probe_dtype_name(floats[b]));
                size_t n = 3001;
                pc = (pair_case){name, floats[a], floats[b], n, alloc_pair(floats[a], n),
                                 alloc_pair(floats[b], n), exact, {0, 0}, 0};
                for (size_t i = 0; i < n; i++) {
                    put(floats[a], pc.r, i, gen_val(floats[a], 4));
                    put(floats[b], pc.c, i, gen_val(floats[b], 4));
                }
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
    /* the tree's edges: no bytes, a part of a piece, one piece, one more
     * byte, 32 and 33 pieces, 32 * 32 + 1 pieces (three levels), a large
     * tensor (five levels); at an offset that is not 16-byte aligned; every
     * element type; bool bytes other than 0 and 1 */
    {
        const size_t bytes[] = {0, 2, 100, 256, 258, 8192, 8194, 32 * 32 * 256 + 256,
                                (size_t)3 << 26};
        unsigned char *buf = malloc(bytes[8]);
        uint64_t st = 12345;
        for (size_t k = 0; k < bytes[8]; k++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            buf[k] = (unsigned char)(st >> 56);
        }
        for (size_t bi = 0; bi < sizeof bytes / sizeof bytes[0]; bi++) {
            for (int dt = 0; dt < PROBE_DTYPE_COUNT_; dt++) {
                size_t sz = probe_dtype_size((probe_dtype)dt);
                if (sz == 0 || (bi == 8 && dt != PROBE_DTYPE_BFLOAT16 && dt != PROBE_DTYPE_FLOAT32))
                    continue;
                char name[96];
                snprintf(name, sizeof name, "summary.tree.%s.%zu", probe_dtype_name((probe_dtype)dt),
                         bytes[bi]);
                check_summary_at(name, (probe_dtype)dt, buf, bytes[bi] / sz, 0);
                if (bi == 6 || bi == 7) {
                    snprintf(name, sizeof name, "summary.tree.%s.%zu.unaligned",
                             probe_dtype_name((probe_dtype)dt), bytes[bi]);
                    check_summary_at(name, (probe_dtype)dt, buf, bytes[bi] / sz, sz < 8 ? 8 : 8 + sz);
                }
            }
        }
        check_summary_enqueue(PROBE_DTYPE_BFLOAT16, buf, bytes[7] / 2);
        free(buf);
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
