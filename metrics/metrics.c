/* metrics.c - the metrics of probe/metrics.h over a pair of element streams (the engine),
 * in bounded memory, on worker threads (docs/metrics.md "Memory" and
 * "Summation").
 *
 * Passes. Pass 1 reads the pair once and computes every sum, count, the
 * maximum and (per channel) the channel shift; the exact p99 either comes
 * from the |c - r| values kept in memory (n <= INMEM_MAX) or, for larger n,
 * from a radix select over the bit patterns of |c - r| (a non-negative
 * double orders like its bits read as an unsigned integer): pass 1 counts
 * the top 20 bits (sign, exponent and 8 mantissa bits: buckets 2^-8 wide
 * relative to their values), and each further pass either counts the next
 * digit (16, 16, then 12 bits) of the elements in the one bucket that holds
 * the wanted rank or, once that bucket holds at most CAND_MAX elements,
 * collects them for a selection. A pass also notes the smallest and largest
 * element of the bucket: when they are equal (ties) that is the answer.
 * After the 4th digit every bit of the answer is known. A float64
 * pair whose magnitudes leave [2^-300, 2^300] also needs the sums again on
 * power-of-two scaled values (arrays.c explains why); that is done in the
 * same extra pass.
 *
 * Summation and determinism. Elements are grouped in blocks of BLOCK
 * consecutive elements at fixed offsets (k*BLOCK). Within a block each sum
 * is accumulated in 8 fp64 lanes (lane l takes the elements l, l+8, ...) that
 * are added pairwise in a fixed order; the block sums are then added with
 * Neumaier's compensated summation in block order (chunk by chunk, chunks in
 * order). The error of a block sum is at most about (BLOCK/8 + 3) eps times
 * the sum of the block's |terms| (Higham, "Accuracy and Stability of
 * Numerical Algorithms", 2nd ed., section 4.2); the compensated sum of the
 * blocks adds about 2 eps of the total (Neumaier 1974). The grouping depends
 * only on n, never on the number of threads or the reading chunk, so the
 * result is the same bits on every run and every machine with IEEE doubles.
 *
 * Threads. The calling thread reads (the source need not be thread-safe);
 * workers convert and compute chunks of CHUNK elements in any order; results
 * are folded in chunk order. At most NSLOT(threads) chunks are in flight.
 */
#include "probe/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "finish.h"
#include "nsum.h"
#include "select.h"

enum {
    BLOCK = 1024,                 /* summation block (elements) */
    CHUNK = 128 * BLOCK,          /* reading/work unit (elements) */
    LANES = 8,
    MAX_THREADS = 16,
    DEFAULT_MAX_THREADS = 8,      /* the reader is one thread: more workers rarely help */
    HBINS = 1 << 20,              /* buckets of the widest radix digit */
};
/* radix digit widths, top first: 20 + 16 + 16 + 12 = 64 bits */
static const int DIGIT_BITS[4] = {20, 16, 16, 12};
static const int KNOWN_BITS[5] = {0, 20, 36, 52, 64}; /* bits known after each level */
#define INMEM_MAX ((uint64_t)1 << 23) /* keep |c - r| in memory up to this n (64 MiB) */
#define CAND_MAX ((uint64_t)1 << 23)  /* collect a bucket of at most this many (64 MiB) */

static inline uint64_t bits_of(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline double from_bits(uint64_t b)
{
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* ---- per-chunk results ---- */

/* the sums over the finite indices: r^2, c^2, d^2, r c, |d|, and for the gain
 * error d r, r^2 d^2, r^3 d, r^4 */
enum { S_RR, S_CC, S_DD, S_RC, S_ABS, S_DR, S_R2D2, S_R3D, S_R4, NSUMS };

typedef struct {
    double n;      /* finite elements of the channel in this chunk (or so far) */
    nsum sum_d;    /* sum of c - r */
    double mean_r; /* mean of r */
    double m2_r;   /* sum of (r - mean_r)^2 */
    double mean_d; /* mean of c - r */
    double m2_d;   /* sum of (d - mean_d)^2 */
} chan_acc;

typedef struct {
    nsum sum[NSUMS];
    double amax_r, amax_c, max_d;  /* max_d < 0: no finite index yet */
    uint64_t max_off;
    uint64_t nf, zeros, mismatch, nan_r, nan_c, inf_r, inf_c, inf_mis, nan_r_only;
    uint64_t bytes_differ;         /* indices whose bytes differ (same element type) */
    double max_ulps;               /* mismatches' largest |d| in ulps; < 0: none */
    chan_acc *chan;                /* spec.count entries, or NULL */
    uint64_t chan_k0, chan_span;   /* the channels this part touched: k0, k0+1, ... (mod count) */
} part;

/* ---- the job ---- */

typedef struct job job;

typedef struct {
    int state;            /* SLOT_FREE, SLOT_FILLED, SLOT_DONE */
    uint64_t chunk;
    size_t m;             /* elements in this chunk */
    unsigned char *raw[2];
    part p;
    probe_status err;
    char errmsg[256];
} slot;
enum { SLOT_FREE, SLOT_FILLED, SLOT_DONE };

typedef struct {
    double *r, *c;        /* CHUNK converted elements */
    double *d;            /* CHUNK exact c - r of an integer pair, or NULL */
    uint32_t *hist;       /* HBINS counts (radix passes), flushed to job.hist_total */
    uint64_t hist_n;      /* elements counted in hist since its last flush */
    double pmin, pmax;    /* extra passes: range of the elements in the prefix bucket */
    double *cand_buf;     /* CHUNK candidates before they are appended */
} worker_mem;

enum pass_kind { PASS_MAIN, PASS_EXTRA };

struct job {
    const probe_pair_source *src;
    double atol, rtol;
    probe_channel_spec ch;
    size_t esize[2];
    int int_pair;          /* both sides integer types: d = c - r is formed exactly */
    int ulp_p, ulp_emin;   /* precision of the coarser floating type (0: no ulps) */
    uint64_t n, nchunks;
    int nthreads, nslots;
    enum pass_kind pass;

    /* pass 1 p99 modes */
    double *inmem;         /* n entries (n <= INMEM_MAX): |c - r|, -1 for a non-finite index */
    int radix;             /* 1: histogram the top digit in pass 1 */
    /* extra pass */
    int scaled;            /* recompute the sums on scaled values */
    int kr, kc, kd, d_overflow;
    int level;             /* radix: digits known (1..3) when counting the next one; 0 = none */
    int collect;           /* collect the bucket's elements instead of counting */
    uint64_t prefix;       /* the known top KNOWN_BITS[level] bits */
    uint64_t *hist_total;  /* HBINS: the workers' counts, merged */
    double *cand;          /* cand_cap candidates */
    uint64_t cand_cap;
    nsum scaled_sum[NSUMS];/* the sums of the scaled pass */
    int have_scaled;
    _Atomic uint64_t ncand;

    slot *slots;
    worker_mem *wm;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int stop;
    uint64_t next_fold;
    part total;
};

/* The online CPU count, asked once per process: glibc's sysconf reads
 * /sys/devices/system/cpu/online on every call, which is a measurable share
 * of a metrics call on a small tensor. */
static int default_threads(void)
{
    static atomic_int cached;
    int n = atomic_load_explicit(&cached, memory_order_relaxed);
    if (n > 0)
        return n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    if (c < 1)
        c = 1;
    n = c > DEFAULT_MAX_THREADS ? DEFAULT_MAX_THREADS : (int)c;
    atomic_store_explicit(&cached, n, memory_order_relaxed);
    return n;
}

/* ---- chunk computation ---- */

/* Zero p, keeping its channel array (whose entries are zeroed when used). */
static void part_init(part *p, chan_acc *chan)
{
    memset(p, 0, sizeof *p);
    p->max_d = -1.0;
    p->max_ulps = -1.0;
    p->chan = chan;
}

static inline int finite2(double r, double c)
{
    /* both exponents below all-ones; '&' on ints, not '&&': no branch (clang
     * warns about '&' on the comparisons themselves) */
    return (int)((bits_of(r) & 0x7FF0000000000000ull) != 0x7FF0000000000000ull) &
           (int)((bits_of(c) & 0x7FF0000000000000ull) != 0x7FF0000000000000ull);
}

/* a in units of the spacing of a type of precision prec and smallest normal
 * exponent emin at x: 2^(max(e, emin) - prec + 1) with 2^e <= x < 2^(e+1). */
static inline double in_ulps(int prec, int emin, double x, double a)
{
    int e = 0;
    (void)frexp(x, &e); /* x = f 2^e with f in [0.5, 1) */
    e -= 1;
    if (x == 0.0 || e < emin)
        e = emin;
    return ldexp(a, prec - 1 - e);
}

/* A mismatching finite index: |d| = a in units of the coarser type's spacing
 * at max(|r|, |c|). */
static inline void note_ulps(const job *jb, part *p, double fr, double fc, double a)
{
    double u = in_ulps(jb->ulp_p, jb->ulp_emin, fr > fc ? fr : fc, a);
    if (u > p->max_ulps)
        p->max_ulps = u;
}

/* Sums of one block of m <= BLOCK elements, all finite on both sides:
 * lane-wise fp64, then pairwise over the lanes in a fixed order. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
/* AVX2 when the CPU has it (4 doubles per vector instead of 2); the lanes
 * are explicit and floating-point contraction is off for this file, so both
 * versions give the same bits. Not under TSan: the clones' ifunc resolver
 * runs during relocation, before the TSan runtime is up, and is instrumented
 * (every program linking libprobe crashed at start). */
__attribute__((target_clones("avx2", "default")))
#endif
static void block_finite(const job *jb, const double *R, const double *C, const double *D,
                         size_t m, part *p, uint64_t base, double *ad_out)
{
    double s[NSUMS][LANES] = {{0}};
    double mx[LANES] = {0}, ar[LANES] = {0}, ac[LANES] = {0};
    uint64_t mis = 0, zer = 0;
    const double atol = jb->atol, rtol = jb->rtol;
    /* A tail of fewer than LANES elements goes through the same loop body,
     * padded with zero pairs: they add exact +0 to every lane (a lane is
     * never -0) and count only as zero differences, taken back below. */
    double rp[LANES], cp[LANES], dp[LANES], ap[LANES];
    size_t pad = 0;
    for (size_t i = 0; i < m; i += LANES) {
        const double *Ri = R + i, *Ci = C + i, *Di = D ? D + i : NULL;
        double *Ai = ad_out + i;
        if (m - i < LANES) {
            pad = LANES - (m - i);
            memset(rp, 0, sizeof rp);
            memset(cp, 0, sizeof cp);
            memset(dp, 0, sizeof dp);
            memcpy(rp, Ri, (m - i) * sizeof *rp);
            memcpy(cp, Ci, (m - i) * sizeof *cp);
            if (Di) {
                memcpy(dp, Di, (m - i) * sizeof *dp);
                Di = dp;
            }
            Ri = rp;
            Ci = cp;
            Ai = ap;
        }
        for (int l = 0; l < LANES; l++) {
            double r = Ri[l], c = Ci[l], d = Di ? Di[l] : c - r, a = fabs(d);
            double fr = fabs(r), fc = fabs(c), rr = r * r;
            s[S_RR][l] += rr;
            s[S_CC][l] += c * c;
            s[S_DD][l] += d * d;
            s[S_RC][l] += r * c;
            s[S_ABS][l] += a;
            s[S_DR][l] += d * r;
            s[S_R2D2][l] += rr * (d * d);
            s[S_R3D][l] += rr * (r * d);
            s[S_R4][l] += rr * rr;
            mx[l] = a > mx[l] ? a : mx[l];
            ar[l] = fr > ar[l] ? fr : ar[l];
            ac[l] = fc > ac[l] ? fc : ac[l];
            mis += a > atol + rtol * fr;
            zer += a == 0.0;
            Ai[l] = a;
        }
        if (Ai == ap)
            memcpy(ad_out + i, ap, (m - i) * sizeof *ap);
    }
    zer -= pad;
    if (mis && jb->ulp_p)
        for (size_t i = 0; i < m; i++)
            if (ad_out[i] > atol + rtol * fabs(R[i]))
                note_ulps(jb, p, fabs(R[i]), fabs(C[i]), ad_out[i]);
    for (int k = 0; k < NSUMS; k++) {
        double *v = s[k];
        double t = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
        nsum_add(&p->sum[k], t);
    }
    double bmax = 0.0, bar = 0.0, bac = 0.0;
    for (int l = 0; l < LANES; l++) {
        bmax = mx[l] > bmax ? mx[l] : bmax;
        bar = ar[l] > bar ? ar[l] : bar;
        bac = ac[l] > bac ? ac[l] : bac;
    }
    p->amax_r = bar > p->amax_r ? bar : p->amax_r;
    p->amax_c = bac > p->amax_c ? bac : p->amax_c;
    if (m && bmax > p->max_d) {
        size_t j = 0;
        while (ad_out[j] != bmax)
            j++;
        p->max_d = bmax;
        p->max_off = base + j;
    }
    p->nf += m;
    p->mismatch += mis;
    p->zeros += zer;
}

/* The same for a block with a non-finite index somewhere: element by element,
 * the NaN/Inf rule of docs/metrics.md. ad_out[i] = -1 marks a non-finite index. */
static void block_mixed(const job *jb, const double *R, const double *C, const double *D,
                        size_t m, part *p, uint64_t base, double *ad_out)
{
    double s[NSUMS] = {0};
    for (size_t i = 0; i < m; i++) {
        double r = R[i], c = C[i];
        if (finite2(r, c)) {
            double d = D ? D[i] : c - r, a = fabs(d), fr = fabs(r), fc = fabs(c), rr = r * r;
            s[S_RR] += rr;
            s[S_CC] += c * c;
            s[S_DD] += d * d;
            s[S_RC] += r * c;
            s[S_ABS] += a;
            s[S_DR] += d * r;
            s[S_R2D2] += rr * (d * d);
            s[S_R3D] += rr * (r * d);
            s[S_R4] += rr * rr;
            if (a > p->max_d) {
                p->max_d = a;
                p->max_off = base + i;
            }
            p->amax_r = fr > p->amax_r ? fr : p->amax_r;
            p->amax_c = fc > p->amax_c ? fc : p->amax_c;
            if (a > jb->atol + jb->rtol * fr) {
                p->mismatch++;
                if (jb->ulp_p)
                    note_ulps(jb, p, fr, fc, a);
            }
            p->zeros += a == 0.0;
            p->nf++;
            ad_out[i] = a;
        } else {
            int rn = isnan(r), cn = isnan(c);
            p->nan_r += rn;
            p->nan_c += cn;
            p->nan_r_only += rn && !cn;
            p->inf_r += isinf(r) != 0;
            p->inf_c += isinf(c) != 0;
            if (!(r == c || (rn && cn))) {
                p->mismatch++;
                if (isinf(r) || isinf(c))
                    p->inf_mis++;
            }
            ad_out[i] = -1.0;
        }
    }
    for (int k = 0; k < NSUMS; k++)
        nsum_add(&p->sum[k], s[k]);
}

/* Channel partials of a chunk [base, base + m): two passes over the chunk
 * (counts/sums, then the sums of squared deviations of r and of d from the
 * chunk's channel means), the channels visited run by run. D: the exact
 * differences of an integer pair, else NULL (d = c - r). */
static void chunk_channels(const job *jb, const double *R, const double *C, const double *D,
                           size_t m, uint64_t base, part *p)
{
    chan_acc *ca = p->chan;
    const uint64_t inner = jb->ch.inner, count = jb->ch.count;
    uint64_t k0 = (base / inner) % count;
    uint64_t span = (base + m - 1) / inner - base / inner + 1;
    if (span > count)
        span = count;
    for (uint64_t t = 0; t < span; t++)
        memset(&ca[(k0 + t) % count], 0, sizeof *ca);
    p->chan_k0 = k0;
    p->chan_span = span;
    for (int sweep = 0; sweep < 2; sweep++) {
        size_t i = 0;
        while (i < m) {
            uint64_t off = base + i;
            uint64_t k = (off / inner) % count;
            size_t run = (size_t)(inner - off % inner);
            if (run > m - i)
                run = m - i;
            chan_acc *a = &ca[k];
            if (sweep == 0) {
                double nk = 0, sd = 0, sr = 0;
                for (size_t j = i; j < i + run; j++)
                    if (finite2(R[j], C[j])) {
                        nk += 1.0;
                        sd += D ? D[j] : C[j] - R[j];
                        sr += R[j];
                    }
                a->n += nk;
                nsum_add(&a->sum_d, sd);
                a->mean_r += sr; /* the sum for now; made a mean below */
            } else {
                double mu = a->mean_r, md = a->mean_d, q = 0, qd = 0;
                for (size_t j = i; j < i + run; j++)
                    if (finite2(R[j], C[j])) {
                        double e = R[j] - mu, f = (D ? D[j] : C[j] - R[j]) - md;
                        q += e * e;
                        qd += f * f;
                    }
                a->m2_r += q;
                a->m2_d += qd;
            }
            i += run;
        }
        if (sweep == 0) {
            /* sums -> means, for the channels this chunk touched (all if it wrapped) */
            for (uint64_t t = 0; t < span; t++) {
                chan_acc *a = &ca[(k0 + t) % count];
                a->mean_r = a->n > 0 ? a->mean_r / a->n : 0.0;
                a->mean_d = a->n > 0 ? nsum_get(&a->sum_d) / a->n : 0.0;
            }
        }
    }
}

/* Chan, Golub and LeVeque's pairwise update of (n, mean, M2) ("Algorithms
 * for computing the sample variance", The American Statistician 37, 1983). */
static void chan_merge(chan_acc *a, const chan_acc *b)
{
    if (b->n == 0)
        return;
    nsum_merge(&a->sum_d, &b->sum_d);
    if (a->n == 0) {
        a->n = b->n;
        a->mean_r = b->mean_r;
        a->m2_r = b->m2_r;
        a->mean_d = b->mean_d;
        a->m2_d = b->m2_d;
        return;
    }
    double n = a->n + b->n, delta = b->mean_r - a->mean_r, dd = b->mean_d - a->mean_d;
    double w = a->n * b->n / n;
    a->m2_r += b->m2_r + delta * delta * w;
    a->mean_r += delta * (b->n / n);
    a->m2_d += b->m2_d + dd * dd * w;
    a->mean_d += dd * (b->n / n);
    a->n = n;
}

/* Elements of a and b (m each of type t, es bytes) whose bytes differ; for
 * bool, whose truth values differ (any nonzero byte is true). */
static uint64_t bytes_differ(probe_dtype t, const unsigned char *a, const unsigned char *b,
                             size_t m, size_t es)
{
    if (memcmp(a, b, m * es) == 0)
        return 0;
    uint64_t k = 0;
    if (t == PROBE_DTYPE_BOOL) {
        for (size_t i = 0; i < m; i++)
            k += (a[i] != 0) != (b[i] != 0);
        return k;
    }
    for (size_t i = 0; i < m; i++)
        k += memcmp(a + i * es, b + i * es, es) != 0;
    return k;
}

static int is_int_type(probe_dtype t)
{
    return t == PROBE_DTYPE_BOOL || (t >= PROBE_DTYPE_INT8 && t <= PROBE_DTYPE_UINT64);
}

#ifdef __SIZEOF_INT128__
typedef __int128 wide_int;
#else
typedef long double wide_int; /* exact up to 2^64 on x86 (64-bit significand) */
#endif

/* Element i of an integer type, exactly. */
static wide_int int_at(probe_dtype t, const unsigned char *p, size_t i)
{
    switch (t) {
    case PROBE_DTYPE_INT8: { int8_t v; memcpy(&v, p + i, 1); return v; }
    case PROBE_DTYPE_INT16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case PROBE_DTYPE_INT32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case PROBE_DTYPE_INT64: { int64_t v; memcpy(&v, p + 8 * i, 8); return v; }
    case PROBE_DTYPE_UINT8: return p[i];
    case PROBE_DTYPE_UINT16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case PROBE_DTYPE_UINT32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case PROBE_DTYPE_UINT64: { uint64_t v; memcpy(&v, p + 8 * i, 8); return v; }
    default: return p[i] != 0; /* bool */
    }
}

/* d[i] = c_i - r_i of an integer pair, formed exactly and then rounded once
 * to double (converting each side first would round values beyond 2^53). */
static void int_differences(const job *jb, const unsigned char *r, const unsigned char *c,
                            double *d, size_t m)
{
    probe_dtype tr = jb->src->dtype[0], tc = jb->src->dtype[1];
    for (size_t i = 0; i < m; i++)
        d[i] = (double)(int_at(tc, c, i) - int_at(tr, r, i));
}

static probe_status convert(const job *jb, int side, const void *raw, double *dst, size_t m)
{
    if (jb->src->dtype[side] == PROBE_DTYPE_FLOAT64) {
        memcpy(dst, raw, m * sizeof(double)); /* little-endian hosts only (CMake checks) */
        return PROBE_OK;
    }
    return probe_dtype_to_f64(jb->src->dtype[side], raw, dst, m);
}

/* Radix digit `level` (0 = the top 20 bits) of a non-negative double. */
static inline unsigned digit(double a, int level)
{
    return (unsigned)(bits_of(a) >> (64 - KNOWN_BITS[level + 1])) &
           ((1u << DIGIT_BITS[level]) - 1);
}

/* Move a worker's 32-bit counts into the job's 64-bit ones (under jb->mu
 * when workers run) before they could overflow. */
static void hist_flush(job *jb, worker_mem *w)
{
    for (size_t b = 0; b < HBINS; b++)
        jb->hist_total[b] += w->hist[b];
    memset(w->hist, 0, HBINS * sizeof *w->hist);
    w->hist_n = 0;
}

static void hist_maybe_flush(job *jb, worker_mem *w)
{
    if (w->hist_n < 0xF0000000u)
        return;
    pthread_mutex_lock(&jb->mu);
    hist_flush(jb, w);
    pthread_mutex_unlock(&jb->mu);
}

static void extra_block(job *jb, const double *R, const double *C, const double *D, size_t m,
                        part *p, worker_mem *w, size_t *ncb)
{
    double s[NSUMS] = {0};
    const uint64_t pmask = jb->level ? ~0ull << (64 - KNOWN_BITS[jb->level]) : 0;
    double pmin = w->pmin, pmax = w->pmax;
    uint64_t counted = 0;
    for (size_t i = 0; i < m; i++) {
        double r = R[i], c = C[i];
        if (!finite2(r, c))
            continue;
        if (jb->scaled) {
            double rs = ldexp(r, jb->kr), cs = ldexp(c, jb->kc);
            double ds = jb->d_overflow ? ldexp(c, jb->kd) - ldexp(r, jb->kd) : ldexp(c - r, jb->kd);
            double rr = rs * rs;
            s[S_RR] += rr;
            s[S_CC] += cs * cs;
            s[S_DD] += ds * ds;
            s[S_RC] += rs * cs;
            s[S_ABS] += fabs(ds);
            s[S_DR] += ds * rs;
            s[S_R2D2] += rr * (ds * ds);
            s[S_R3D] += rr * (rs * ds);
            s[S_R4] += rr * rr;
        }
        if (jb->level) {
            double a = fabs(D ? D[i] : c - r);
            if ((bits_of(a) & pmask) != jb->prefix)
                continue;
            pmin = a < pmin ? a : pmin;
            pmax = a > pmax ? a : pmax;
            if (jb->collect) {
                w->cand_buf[(*ncb)++] = a;
            } else {
                w->hist[digit(a, jb->level)]++;
                counted++;
            }
        }
    }
    w->pmin = pmin;
    w->pmax = pmax;
    w->hist_n += counted;
    if (jb->scaled)
        for (int k = 0; k < NSUMS; k++)
            nsum_add(&p->sum[k], s[k]);
}

static void compute_chunk(job *jb, slot *sl, worker_mem *w)
{
    size_t m = sl->m;
    uint64_t base = sl->chunk * (uint64_t)CHUNK;
    part_init(&sl->p, sl->p.chan);
    probe_status s = convert(jb, 0, sl->raw[0], w->r, m);
    if (s == PROBE_OK)
        s = convert(jb, 1, sl->raw[1], w->c, m);
    if (s != PROBE_OK) {
        sl->err = s;
        snprintf(sl->errmsg, sizeof sl->errmsg, "%s", probe_last_error());
        return;
    }
    if (w->d)
        int_differences(jb, sl->raw[0], sl->raw[1], w->d, m);
    if (jb->pass == PASS_EXTRA) {
        size_t ncb = 0;
        for (size_t b = 0; b < m; b += BLOCK) {
            size_t bm = m - b < BLOCK ? m - b : BLOCK;
            extra_block(jb, w->r + b, w->c + b, w->d ? w->d + b : NULL, bm, &sl->p, w, &ncb);
        }
        hist_maybe_flush(jb, w);
        if (ncb) {
            uint64_t at = atomic_fetch_add(&jb->ncand, ncb);
            if (at + ncb <= jb->cand_cap)
                memcpy(jb->cand + at, w->cand_buf, ncb * sizeof(double));
        }
        return;
    }
    /* |c - r| per element goes to the in-memory store, or to cand_buf as scratch */
    double *ad = jb->inmem ? jb->inmem + base : w->cand_buf;
    for (size_t b = 0; b < m; b += BLOCK) {
        size_t bm = m - b < BLOCK ? m - b : BLOCK;
        const double *R = w->r + b, *C = w->c + b, *D = w->d ? w->d + b : NULL;
        int ok = 1;
        for (size_t i = 0; i < bm; i++)
            ok &= finite2(R[i], C[i]);
        if (ok)
            block_finite(jb, R, C, D, bm, &sl->p, base + b, ad + b);
        else
            block_mixed(jb, R, C, D, bm, &sl->p, base + b, ad + b);
    }
    if (jb->src->dtype[0] == jb->src->dtype[1])
        sl->p.bytes_differ =
            bytes_differ(jb->src->dtype[0], sl->raw[0], sl->raw[1], m, jb->esize[0]);
    if (jb->radix) {
        for (size_t i = 0; i < m; i++)
            if (ad[i] >= 0.0)
                w->hist[digit(ad[i], 0)]++;
        w->hist_n += m;
        hist_maybe_flush(jb, w);
    }
    if (jb->ch.count)
        chunk_channels(jb, w->r, w->c, w->d, m, base, &sl->p);
}

/* ---- folding in chunk order ---- */

static void fold(job *jb, const part *p)
{
    part *t = &jb->total;
    for (int k = 0; k < NSUMS; k++)
        nsum_merge(&t->sum[k], &p->sum[k]);
    if (jb->pass == PASS_EXTRA)
        return;
    t->amax_r = p->amax_r > t->amax_r ? p->amax_r : t->amax_r;
    t->amax_c = p->amax_c > t->amax_c ? p->amax_c : t->amax_c;
    if (p->max_d > t->max_d) {
        t->max_d = p->max_d;
        t->max_off = p->max_off;
    }
    t->nf += p->nf;
    t->zeros += p->zeros;
    t->mismatch += p->mismatch;
    t->nan_r += p->nan_r;
    t->nan_c += p->nan_c;
    t->inf_r += p->inf_r;
    t->inf_c += p->inf_c;
    t->inf_mis += p->inf_mis;
    t->nan_r_only += p->nan_r_only;
    t->bytes_differ += p->bytes_differ;
    t->max_ulps = p->max_ulps > t->max_ulps ? p->max_ulps : t->max_ulps;
    if (t->chan)
        for (uint64_t i = 0; i < p->chan_span; i++) {
            uint64_t k = (p->chan_k0 + i) % jb->ch.count;
            chan_merge(&t->chan[k], &p->chan[k]);
        }
}

/* ---- the pass driver ---- */

static void *worker_main(void *arg)
{
    job *jb = ((void **)arg)[0];
    worker_mem *w = ((void **)arg)[1];
    pthread_mutex_lock(&jb->mu);
    for (;;) {
        slot *pick = NULL;
        for (int i = 0; i < jb->nslots; i++) {
            slot *sl = &jb->slots[i];
            if (sl->state == SLOT_FILLED && (!pick || sl->chunk < pick->chunk))
                pick = sl;
        }
        if (!pick) {
            if (jb->stop)
                break;
            pthread_cond_wait(&jb->work_cv, &jb->mu);
            continue;
        }
        pick->state = -1; /* taken */
        pthread_mutex_unlock(&jb->mu);
        compute_chunk(jb, pick, w);
        pthread_mutex_lock(&jb->mu);
        pick->state = SLOT_DONE;
        pthread_cond_broadcast(&jb->done_cv);
    }
    pthread_mutex_unlock(&jb->mu);
    return NULL;
}

/* Fold every finished chunk that is next in order; called with mu held.
 * Returns the first worker error met. */
static probe_status fold_ready(job *jb)
{
    for (;;) {
        slot *hit = NULL;
        for (int i = 0; i < jb->nslots; i++)
            if (jb->slots[i].state == SLOT_DONE && jb->slots[i].chunk == jb->next_fold)
                hit = &jb->slots[i];
        if (!hit)
            return PROBE_OK;
        if (hit->err != PROBE_OK)
            return probe_set_error(hit->err, "%s", hit->errmsg);
        fold(jb, &hit->p);
        hit->state = SLOT_FREE;
        jb->next_fold++;
    }
}

static probe_status read_chunk(job *jb, slot *sl, uint64_t chunk)
{
    uint64_t off = chunk * (uint64_t)CHUNK;
    size_t m = (size_t)(jb->n - off < CHUNK ? jb->n - off : CHUNK);
    sl->chunk = chunk;
    sl->m = m;
    sl->err = PROBE_OK;
    for (int side = 0; side < 2; side++) {
        probe_status s = jb->src->read(jb->src->ctx, side, off, m, sl->raw[side]);
        if (s != PROBE_OK)
            return s;
    }
    return PROBE_OK;
}

/* One pass over the pair: inline when there is one chunk or one thread,
 * otherwise the calling thread reads while the workers compute. */
static probe_status run_pass_(job *jb, enum pass_kind kind)
{
    jb->pass = kind;
    jb->next_fold = 0;
    part_init(&jb->total, jb->total.chan);
    if (kind == PASS_MAIN && jb->total.chan)
        memset(jb->total.chan, 0, (size_t)jb->ch.count * sizeof(chan_acc));
    probe_status s = PROBE_OK;

    if (jb->nthreads <= 1 || jb->nchunks <= 1) {
        slot *sl = &jb->slots[0];
        for (uint64_t k = 0; k < jb->nchunks && s == PROBE_OK; k++) {
            if ((s = read_chunk(jb, sl, k)) != PROBE_OK)
                break;
            compute_chunk(jb, sl, &jb->wm[0]);
            if (sl->err != PROBE_OK)
                return probe_set_error(sl->err, "%s", sl->errmsg);
            fold(jb, &sl->p);
        }
        return s;
    }

    pthread_t th[MAX_THREADS];
    void *args[MAX_THREADS][2];
    int started = 0;
    jb->stop = 0;
    for (int i = 0; i < jb->nslots; i++)
        jb->slots[i].state = SLOT_FREE;
    for (; started < jb->nthreads; started++) {
        args[started][0] = jb;
        args[started][1] = &jb->wm[started];
        if (pthread_create(&th[started], NULL, worker_main, args[started]) != 0)
            break;
    }
    if (started == 0) {
        s = probe_set_error(PROBE_ENOMEM, "cannot start a metrics worker thread");
        goto join;
    }
    for (uint64_t k = 0; k < jb->nchunks; k++) {
        slot *sl = NULL;
        pthread_mutex_lock(&jb->mu);
        for (;;) {
            if ((s = fold_ready(jb)) != PROBE_OK)
                break;
            for (int i = 0; i < jb->nslots && !sl; i++)
                if (jb->slots[i].state == SLOT_FREE)
                    sl = &jb->slots[i];
            if (sl)
                break;
            pthread_cond_wait(&jb->done_cv, &jb->mu);
        }
        if (sl)
            sl->state = -2; /* being filled */
        pthread_mutex_unlock(&jb->mu);
        if (s != PROBE_OK)
            goto join;
        s = read_chunk(jb, sl, k);
        pthread_mutex_lock(&jb->mu);
        sl->state = s == PROBE_OK ? SLOT_FILLED : SLOT_FREE;
        pthread_cond_signal(&jb->work_cv);
        pthread_mutex_unlock(&jb->mu);
        if (s != PROBE_OK)
            goto join;
    }
    pthread_mutex_lock(&jb->mu);
    while (s == PROBE_OK && jb->next_fold < jb->nchunks) {
        if ((s = fold_ready(jb)) != PROBE_OK || jb->next_fold == jb->nchunks)
            break;
        pthread_cond_wait(&jb->done_cv, &jb->mu);
    }
    pthread_mutex_unlock(&jb->mu);
join:
    pthread_mutex_lock(&jb->mu);
    jb->stop = 1;
    pthread_cond_broadcast(&jb->work_cv);
    pthread_mutex_unlock(&jb->mu);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    return s;
}

static probe_status run_pass(job *jb, enum pass_kind kind)
{
    probe_status s = run_pass_(jb, kind);
    if (s == PROBE_OK && kind == PASS_EXTRA && jb->scaled) {
        memcpy(jb->scaled_sum, jb->total.sum, sizeof jb->scaled_sum);
        jb->have_scaled = 1;
    }
    return s;
}

/* ---- setup, result ---- */

static int scale_exp(double m)
{
    int e = 0;
    if (m > 0.0 && isfinite(m))
        frexp(m, &e);
    return -e;
}

/* The sums hold fourth powers (r^4, r^2 d^2): magnitudes in [2^-250, 2^250]
 * keep them in range. */
static int in_safe_range(double m)
{
    return m == 0.0 || (m >= 0x1p-250 && m <= 0x1p250);
}

static void job_free(job *jb)
{
    if (jb->slots)
        for (int i = 0; i < jb->nslots; i++) {
            free(jb->slots[i].raw[0]);
            free(jb->slots[i].raw[1]);
            free(jb->slots[i].p.chan);
        }
    if (jb->wm)
        for (int i = 0; i < jb->nthreads; i++) {
            free(jb->wm[i].r);
            free(jb->wm[i].c);
            free(jb->wm[i].d);
            free(jb->wm[i].hist);
            free(jb->wm[i].cand_buf);
        }
    free(jb->slots);
    free(jb->wm);
    free(jb->inmem);
    free(jb->cand);
    free(jb->hist_total);
    free(jb->total.chan);
    pthread_mutex_destroy(&jb->mu);
    pthread_cond_destroy(&jb->work_cv);
    pthread_cond_destroy(&jb->done_cv);
}

static probe_status job_alloc(job *jb)
{
    size_t ch = (size_t)jb->ch.count;
    jb->slots = calloc((size_t)jb->nslots, sizeof *jb->slots);
    jb->wm = calloc((size_t)jb->nthreads, sizeof *jb->wm);
    if (!jb->slots || !jb->wm)
        return PROBE_ENOMEM;
    size_t per = jb->nchunks == 1 ? (size_t)jb->n : CHUNK;
    if (per == 0)
        per = 1;
    for (int i = 0; i < jb->nslots; i++) {
        slot *sl = &jb->slots[i];
        sl->raw[0] = malloc(per * jb->esize[0]);
        sl->raw[1] = malloc(per * jb->esize[1]);
        if (!sl->raw[0] || !sl->raw[1])
            return PROBE_ENOMEM;
        if (ch && !(sl->p.chan = malloc(ch * sizeof(chan_acc))))
            return PROBE_ENOMEM;
    }
    for (int i = 0; i < jb->nthreads; i++) {
        worker_mem *w = &jb->wm[i];
        w->r = malloc(per * sizeof(double));
        w->c = malloc(per * sizeof(double));
        w->cand_buf = malloc(per * sizeof(double));
        w->pmin = INFINITY;
        w->pmax = -INFINITY;
        if (!w->r || !w->c || !w->cand_buf)
            return PROBE_ENOMEM;
        if (jb->int_pair && !(w->d = malloc(per * sizeof(double))))
            return PROBE_ENOMEM;
        if (jb->radix && !(w->hist = calloc(HBINS, sizeof *w->hist)))
            return PROBE_ENOMEM;
    }
    if (jb->radix && !(jb->hist_total = calloc(HBINS, sizeof *jb->hist_total)))
        return PROBE_ENOMEM;
    if (ch && !(jb->total.chan = calloc(ch, sizeof(chan_acc))))
        return PROBE_ENOMEM;
    if (!jb->radix && jb->n && !(jb->inmem = malloc((size_t)jb->n * sizeof(double))))
        return PROBE_ENOMEM;
    return PROBE_OK;
}

/* The workers' counts of the last pass, merged into jb->hist_total (then
 * the workers' are zero), and the merged range of the prefix bucket. */
static uint64_t *merged_hist(job *jb, double *pmin, double *pmax)
{
    *pmin = INFINITY;
    *pmax = -INFINITY;
    for (int i = 0; i < jb->nthreads; i++) {
        worker_mem *w = &jb->wm[i];
        hist_flush(jb, w);
        *pmin = w->pmin < *pmin ? w->pmin : *pmin;
        *pmax = w->pmax > *pmax ? w->pmax : *pmax;
        w->pmin = INFINITY;
        w->pmax = -INFINITY;
    }
    return jb->hist_total;
}

/* In the merged histogram h, the bucket holding 1-based rank *k; *k becomes
 * the rank within that bucket. */
static unsigned bucket_of(const uint64_t *h, uint64_t *k)
{
    unsigned b = 0;
    while (h[b] < *k) {
        *k -= h[b];
        b++;
    }
    return b;
}

/* Exact nearest-rank p99 of the finite |c - r| when pass 1 kept no copy of
 * them: radix levels over extra passes. need_scaled: do the rescaled sums in
 * the first extra pass. */
static probe_status radix_p99(job *jb, uint64_t k, int need_scaled, double *p99)
{
    double pmin, pmax;
    uint64_t *h = merged_hist(jb, &pmin, &pmax);
    unsigned b = bucket_of(h, &k);
    uint64_t cnt = h[b];
    jb->prefix = (uint64_t)b << (64 - KNOWN_BITS[1]);
    jb->level = 1;
    probe_status s = PROBE_OK;
    for (;;) {
        jb->collect = cnt <= CAND_MAX;
        if (jb->level == 4) { /* every bit is known */
            *p99 = from_bits(jb->prefix);
            break;
        }
        memset(jb->hist_total, 0, HBINS * sizeof *jb->hist_total);
        if (jb->collect) {
            if (!(jb->cand = malloc((size_t)(cnt ? cnt : 1) * sizeof(double))))
                return probe_set_error(PROBE_ENOMEM, "cannot allocate %llu p99 candidates",
                                       (unsigned long long)cnt);
            jb->cand_cap = cnt;
        }
        atomic_store(&jb->ncand, 0);
        jb->scaled = need_scaled;
        s = run_pass(jb, PASS_EXTRA);
        need_scaled = 0;
        jb->scaled = 0;
        if (s != PROBE_OK)
            return s;
        h = merged_hist(jb, &pmin, &pmax);
        if (jb->collect) {
            uint64_t got = atomic_load(&jb->ncand);
            if (got != cnt)
                return probe_set_error(PROBE_EIO, "the data changed between passes (%llu of %llu "
                                       "p99 candidates found)", (unsigned long long)got,
                                       (unsigned long long)cnt);
            *p99 = probe_select_kth(jb->cand, (size_t)cnt, (size_t)(k - 1));
            break;
        }
        if (pmin == pmax) { /* the bucket holds one value (ties) */
            *p99 = pmin;
            break;
        }
        b = bucket_of(h, &k);
        cnt = h[b];
        jb->prefix |= (uint64_t)b << (64 - KNOWN_BITS[jb->level + 1]);
        jb->level++;
    }
    jb->level = 0;
    if (need_scaled) {
        jb->scaled = 1;
        s = run_pass(jb, PASS_EXTRA);
        jb->scaled = 0;
    }
    return s;
}

/* The arguments of probe_metrics_compute_source checked; *so is sopts (or all
 * zero) and es0/es1 the element sizes. */
static probe_status check_args(const probe_pair_source *src, const probe_metrics_opts *opts,
                               const probe_stream_opts *sopts, probe_stream_opts *so,
                               size_t *es0, size_t *es1)
{
    if (src == NULL || opts == NULL || (src->n > 0 && src->read == NULL))
        return probe_set_error(PROBE_EINVAL, "probe_metrics_compute_source: %s is NULL",
                               src == NULL ? "src" : opts == NULL ? "opts" : "src->read");
    if (!(opts->atol >= 0.0) || !(opts->rtol >= 0.0))
        return probe_set_error(PROBE_EINVAL,
                               "probe_metrics: atol %g and rtol %g must be >= 0 (not NaN)",
                               opts->atol, opts->rtol);
    *es0 = probe_dtype_size(src->dtype[0]);
    *es1 = probe_dtype_size(src->dtype[1]);
    if (!*es0 || !*es1)
        return probe_set_error(PROBE_EINVAL, "probe_metrics: unknown element type %d",
                               (int)(*es0 ? src->dtype[1] : src->dtype[0]));
    memset(so, 0, sizeof *so);
    if (sopts)
        *so = *sopts;
    if (so->channel.count) {
        if (so->channel.count > PROBE_CHANNELS_MAX || so->channel.inner == 0 ||
            so->channel.inner > UINT64_MAX / so->channel.count ||
            src->n % (so->channel.count * so->channel.inner) != 0)
            return probe_set_error(PROBE_EINVAL,
                                   "probe_metrics: channel axis of %llu channels x %llu elements "
                                   "does not tile %llu elements (at most %d channels)",
                                   (unsigned long long)so->channel.count,
                                   (unsigned long long)so->channel.inner,
                                   (unsigned long long)src->n, PROBE_CHANNELS_MAX);
    }
    return PROBE_OK;
}

/* jb set up for src (its synchronisation, tolerances, element types, ULP
 * type, chunks and threads), before job_alloc. */
static void job_init(job *jb, const probe_pair_source *src, const probe_metrics_opts *opts,
                     const probe_stream_opts *so, size_t es0, size_t es1)
{
    memset(jb, 0, sizeof *jb);
    pthread_mutex_init(&jb->mu, NULL);
    pthread_cond_init(&jb->work_cv, NULL);
    pthread_cond_init(&jb->done_cv, NULL);
    jb->src = src;
    jb->atol = opts->atol;
    jb->rtol = opts->rtol;
    jb->ch = so->channel;
    jb->esize[0] = es0;
    jb->esize[1] = es1;
    jb->int_pair = is_int_type(src->dtype[0]) && is_int_type(src->dtype[1]) && (es0 == 8 || es1 == 8);
    {
        int e0 = 0, e1 = 0;
        int p0 = probe_dtype_precision(src->dtype[0], &e0);
        int p1 = probe_dtype_precision(src->dtype[1], &e1);
        if (p0 && p1) { /* the coarser type: fewer significand bits, then the higher minimum */
            jb->ulp_p = p0 < p1 ? p0 : p1;
            jb->ulp_emin = p0 < p1 ? e0 : p1 < p0 ? e1 : (e0 > e1 ? e0 : e1);
        }
    }
    jb->n = src->n;
    jb->nchunks = (src->n + CHUNK - 1) / CHUNK;
    int th = so->threads > 0 ? so->threads : default_threads();
    if (th > MAX_THREADS)
        th = MAX_THREADS;
    if ((uint64_t)th > jb->nchunks)
        th = jb->nchunks ? (int)jb->nchunks : 1;
    jb->nthreads = th;
    jb->nslots = th > 1 ? 2 * th + 1 : 1;
    jb->radix = src->n > INMEM_MAX;
}

/* The exact p99 of |c - r| after the main pass (t: its totals): rank
 * ceil(0.99 n_finite) (see probe_metrics_percentile_nearest_rank), NAN when
 * no pair is finite. In memory it selects among the kept differences; past
 * INMEM_MAX it runs radix_p99's extra passes (with the scaled sums when
 * need_scaled). */
static probe_status exact_p99(job *jb, const part *t, int need_scaled, double *p99)
{
    uint64_t nf = t->nf;
    *p99 = NAN;
    if (!nf)
        return PROBE_OK;
    double x = ceil(99.0 * (double)nf / 100.0);
    uint64_t rank = x < 1.0 ? 1 : (x >= (double)nf ? nf : (uint64_t)x);
    if (rank <= t->zeros) {
        *p99 = 0.0;
        return PROBE_OK;
    }
    if (jb->radix)
        return radix_p99(jb, rank, need_scaled, p99);
    /* compact the kept |c - r| (non-finite indices hold -1) and select */
    size_t w = 0;
    for (size_t i = 0; i < (size_t)jb->n; i++)
        if (jb->inmem[i] >= 0.0)
            jb->inmem[w++] = jb->inmem[i];
    *p99 = probe_select_kth(jb->inmem, w, (size_t)(rank - 1));
    return PROBE_OK;
}

/* The per-channel shift of jb's totals into shift (so: where its arrays go). */
static void finish_channels(const job *jb, const probe_stream_opts *so, probe_channel_shift *shift)
{
    probe_channel_finish f;
    probe_channel_finish_begin(&f, shift, jb->ch.count, so->channel_shift_out, so->channel_se_out,
                               so->channel_n_out);
    for (uint64_t k = 0; k < jb->ch.count; k++) {
        const chan_acc *a = &jb->total.chan[k];
        probe_channel_finish_one(&f, k, a->n, nsum_get(&a->sum_d), a->m2_r, a->m2_d);
    }
    probe_channel_finish_end(&f);
}

probe_status probe_metrics_compute_source(const probe_pair_source *src,
                                          const probe_metrics_opts *opts,
                                          const probe_stream_opts *sopts, probe_metrics *out,
                                          probe_channel_shift *shift)
{
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_metrics_compute_source: out is NULL");
    memset(out, 0, sizeof *out);
    if (shift)
        memset(shift, 0, sizeof *shift);
    probe_stream_opts so;
    size_t es0 = 0, es1 = 0;
    probe_status s = check_args(src, opts, sopts, &so, &es0, &es1);
    if (s != PROBE_OK)
        return s;
    if (!shift)
        so.channel.count = 0;

    job jb;
    job_init(&jb, src, opts, &so, es0, es1);
    s = job_alloc(&jb);
    if (s == PROBE_ENOMEM)
        s = probe_set_error(PROBE_ENOMEM, "probe_metrics: cannot allocate the working memory for "
                            "%llu elements", (unsigned long long)src->n);
    if (s == PROBE_OK)
        s = run_pass(&jb, PASS_MAIN);
    if (s != PROBE_OK) {
        job_free(&jb);
        return s;
    }

    part *t = &jb.total;
    double max_d = t->max_d < 0.0 ? 0.0 : t->max_d;
    nsum sums[NSUMS];
    memcpy(sums, t->sum, sizeof sums);
    int kr = 0, kc = 0, kd = 0, d_overflow = !isfinite(max_d);
    int need_scaled = !in_safe_range(t->amax_r) || !in_safe_range(t->amax_c) ||
                      !in_safe_range(max_d);
    if (need_scaled) {
        kr = scale_exp(t->amax_r);
        kc = scale_exp(t->amax_c);
        kd = d_overflow ? scale_exp(fmax(t->amax_r, t->amax_c)) - 1 : scale_exp(max_d);
        jb.kr = kr;
        jb.kc = kc;
        jb.kd = kd;
        jb.d_overflow = d_overflow;
    }

    uint64_t nf = t->nf;
    double p99 = NAN;
    part main_total = *t; /* extra passes reuse jb.total */
    s = exact_p99(&jb, t, need_scaled, &p99);
    if (s == PROBE_OK && need_scaled && !jb.have_scaled) {
        jb.scaled = 1;
        jb.level = 0;
        s = run_pass(&jb, PASS_EXTRA);
        jb.scaled = 0;
    }
    if (s == PROBE_OK && need_scaled)
        memcpy(sums, jb.scaled_sum, sizeof sums);
    if (s != PROBE_OK) {
        job_free(&jb);
        memset(out, 0, sizeof *out);
        return s;
    }
    t = &main_total;

    /* identical: the same element type and the same bytes everywhere */
    uint64_t not_identical = src->dtype[0] == src->dtype[1] ? t->bytes_differ : src->n + 1;
    probe_metrics_totals tot = {
        src->n, nf,
        nsum_get(&sums[S_RR]), nsum_get(&sums[S_CC]), nsum_get(&sums[S_DD]),
        nsum_get(&sums[S_RC]), nsum_get(&sums[S_ABS]),
        kr, kc, kd,
        t->nan_r, t->nan_c, t->inf_r, t->inf_c, t->inf_mis, t->mismatch, not_identical,
        t->max_d, t->max_off, p99,
        nsum_get(&sums[S_DR]), nsum_get(&sums[S_R2D2]), nsum_get(&sums[S_R3D]),
        nsum_get(&sums[S_R4]),
        t->nan_r_only, t->max_ulps < 0.0 ? NAN : t->max_ulps,
        jb.ulp_p && nf ? in_ulps(jb.ulp_p, jb.ulp_emin, fmax(t->amax_r, t->amax_c), max_d) : NAN,
    };
    probe_metrics_finish(&tot, out);

    if (shift && jb.ch.count)
        finish_channels(&jb, &so, shift);
    job_free(&jb);
    return PROBE_OK;
}
