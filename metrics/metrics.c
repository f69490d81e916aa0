/* metrics.c - error metrics between a reference r and a candidate c
 * (probe/metrics.h; definitions in CONTRACT.md "Metric definitions" and
 * docs/metrics.md).
 *
 * Summation: every sum (sum r^2, sum c^2, sum (c-r)^2, sum r*c, sum |c-r|) is
 * an fp64 Neumaier (improved Kahan-Babuska) compensated sum, so the
 * summation error is about eps relative to the sum of magnitudes, independent
 * of n (for n*eps << 1). Source: A. Neumaier, "Rundungsfehleranalyse einiger
 * Verfahren zur Summation endlicher Summen", ZAMM 54 (1974).
 *
 * Range: when the largest magnitude of r, c or c - r lies outside
 * [2^-300, 2^300] (possible only for float64 inputs), the squares could
 * overflow or underflow; the sums are then recomputed in a second pass on
 * values scaled by powers of two (exact), as LAPACK's dnrm2 does in spirit.
 *
 * p99: exact nearest-rank percentile by selection (introselect: quickselect
 * with median-of-3 pivot and 3-way partition, heapsort fallback after
 * 2*log2(n) rounds), on a scratch copy of the finite |c - r|.
 */
#include "probe/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- compensated sum ---- */

/* Running sum s plus the accumulated rounding errors c: Neumaier's improved
 * Kahan-Babuska summation (A. Neumaier, ZAMM 54, 1974). The branch picks the
 * larger operand so that (big - t) + small is the exact rounding error of
 * big + small (Fast2Sum; T. J. Dekker, Numer. Math. 18, 1971). */
typedef struct {
    double s, c;
} nsum;

static inline void nsum_add(nsum *a, double x)
{
    double t = a->s + x;
    if (fabs(a->s) >= fabs(x))
        a->c += (a->s - t) + x;
    else
        a->c += (x - t) + a->s;
    a->s = t;
}

static inline double nsum_get(const nsum *a)
{
    /* once the running sum is +-inf the compensation is NaN: report the inf */
    return isfinite(a->s) ? a->s + a->c : a->s;
}

/* ---- selection ---- */

static inline void swapd(double *a, double *b)
{
    double t = *a;
    *a = *b;
    *b = t;
}

static void sift_down(double *v, size_t root, size_t n)
{
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n)
            return;
        if (child + 1 < n && v[child] < v[child + 1])
            child++;
        if (!(v[root] < v[child]))
            return;
        swapd(&v[root], &v[child]);
        root = child;
    }
}

static void heapsort_d(double *v, size_t n)
{
    if (n < 2)
        return;
    for (size_t i = n / 2; i-- > 0;)
        sift_down(v, i, n);
    for (size_t end = n - 1; end > 0; end--) {
        swapd(&v[0], &v[end]);
        sift_down(v, 0, end);
    }
}

static void insertion_sort_d(double *v, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        double x = v[i];
        size_t j = i;
        while (j > 0 && x < v[j - 1]) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static double median3(double a, double b, double c)
{
    if (a < b) {
        if (b < c) return b;
        return a < c ? c : a;
    }
    if (a < c) return a;
    return b < c ? c : b;
}

/* The element of 0-based rank k (k < n) of v[0, n), reordering v. Terminates
 * for any input (NaNs compare equal to every pivot: the result is then
 * unspecified but the loop still shrinks, since the equal band holds the
 * pivot itself). O(n) on average, O(n log n) worst case. */
static double select_kth(double *v, size_t n, size_t k)
{
    size_t lo = 0, hi = n;
    int budget = 4;
    for (size_t m = n; m > 1; m >>= 1)
        budget += 2;
    while (hi - lo > 16) {
        if (budget-- == 0) {
            heapsort_d(v + lo, hi - lo);
            return v[k];
        }
        double p = median3(v[lo], v[lo + (hi - lo) / 2], v[hi - 1]);
        /* Dijkstra 3-way partition: [lo,lt) < p, [lt,gt) == p, [gt,hi) > p */
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            if (v[i] < p)
                swapd(&v[lt++], &v[i++]);
            else if (v[i] > p)
                swapd(&v[i], &v[--gt]);
            else
                i++;
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return p;
    }
    insertion_sort_d(v + lo, hi - lo);
    return v[k];
}

double probe_metrics_percentile_nearest_rank(double *v, size_t n, double q)
{
    if (n == 0 || v == NULL || !(q > 0.0 && q <= 100.0))
        return NAN;
    /* rank = ceil(q/100 * n), 1-based. q*n first: for integer q and
     * n < 2^46 the product is exact and the one rounding of /100 cannot
     * cross an integer, so the rank is exact (e.g. q = 99, n = 100 -> 99). */
    double x = ceil(q * (double)n / 100.0);
    size_t rank = x < 1.0 ? 1 : (x >= (double)n ? n : (size_t)x);
    return select_kth(v, n, rank - 1);
}

/* ---- metrics ---- */

/* Power-of-two exponent that brings a positive finite magnitude m into
 * [0.5, 1): m = f*2^e, return -e. 0 for m = 0. */
static int scale_exp(double m)
{
    int e = 0;
    if (m > 0.0 && isfinite(m))
        frexp(m, &e);
    return -e;
}

static int in_safe_range(double m)
{
    return m == 0.0 || (m >= 0x1p-300 && m <= 0x1p300);
}

probe_status probe_metrics_compute(const double *ref, const double *cand, size_t n,
                                   const probe_metrics_opts *opts, probe_metrics *out)
{
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_metrics_compute: out is NULL");
    memset(out, 0, sizeof *out);
    if (opts == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_metrics_compute: opts is NULL");
    if (n > 0 && (ref == NULL || cand == NULL))
        return probe_set_error(PROBE_EINVAL, "probe_metrics_compute: %s is NULL with n = %zu",
                               ref == NULL ? "ref" : "cand", n);
    if (!(opts->atol >= 0.0) || !(opts->rtol >= 0.0))
        return probe_set_error(PROBE_EINVAL,
                               "probe_metrics_compute: atol %g and rtol %g must be >= 0 (not NaN)",
                               opts->atol, opts->rtol);

    double *scratch = NULL;
    if (n > 0) {
        if (n > SIZE_MAX / sizeof(double) ||
            (scratch = malloc(n * sizeof(double))) == NULL)
            return probe_set_error(PROBE_ENOMEM,
                                   "probe_metrics_compute: cannot allocate scratch for the exact "
                                   "p99 of %zu elements", n);
    }

    const double atol = opts->atol, rtol = opts->rtol;
    nsum s_rr = {0, 0}, s_cc = {0, 0}, s_dd = {0, 0}, s_rc = {0, 0}, s_abs = {0, 0};
    double amax_r = 0.0, amax_c = 0.0, max_d = -1.0;
    size_t max_off = 0, nf = 0;
    uint64_t mismatch = 0, nan_r = 0, nan_c = 0, inf_r = 0, inf_c = 0, inf_mis = 0;
    int identical = 1;

    for (size_t i = 0; i < n; i++) {
        double r = ref[i], c = cand[i];
        if (isfinite(r) && isfinite(c)) {
            double diff = c - r, d = fabs(diff), ar = fabs(r), ac = fabs(c);
            scratch[nf++] = d;
            if (d > max_d) {
                max_d = d;
                max_off = i;
            }
            mismatch += d > atol + rtol * ar;
            identical &= r == c;
            amax_r = ar > amax_r ? ar : amax_r;
            amax_c = ac > amax_c ? ac : amax_c;
            nsum_add(&s_rr, r * r);
            nsum_add(&s_cc, c * c);
            nsum_add(&s_dd, diff * diff);
            nsum_add(&s_rc, r * c);
            nsum_add(&s_abs, d);
        } else {
            int rn = isnan(r), cn = isnan(c);
            nan_r += rn;
            nan_c += cn;
            inf_r += isinf(r) != 0;
            inf_c += isinf(c) != 0;
            if (!(r == c || (rn && cn))) {
                mismatch++;
                identical = 0;
                if (isinf(r) || isinf(c))
                    inf_mis++;
            }
        }
    }
    if (max_d < 0.0)
        max_d = 0.0; /* no finite index */

    /* Power-of-two scale exponents (0 = unscaled) for r, c and c - r. */
    int kr = 0, kc = 0, kd = 0, d_overflow = !isfinite(max_d);
    if (!in_safe_range(amax_r) || !in_safe_range(amax_c) || !in_safe_range(max_d)) {
        kr = scale_exp(amax_r);
        kc = scale_exp(amax_c);
        /* |c - r| <= 2 max(|r|, |c|): if it overflowed, scale before subtracting */
        kd = d_overflow ? scale_exp(fmax(amax_r, amax_c)) - 1 : scale_exp(max_d);
        s_rr = s_cc = s_dd = s_rc = s_abs = (nsum){0, 0};
        for (size_t i = 0; i < n; i++) {
            double r = ref[i], c = cand[i];
            if (!(isfinite(r) && isfinite(c)))
                continue;
            double rs = ldexp(r, kr), cs = ldexp(c, kc);
            double ds = d_overflow ? ldexp(c, kd) - ldexp(r, kd) : ldexp(c - r, kd);
            nsum_add(&s_rr, rs * rs);
            nsum_add(&s_cc, cs * cs);
            nsum_add(&s_dd, ds * ds);
            nsum_add(&s_rc, rs * cs);
            nsum_add(&s_abs, fabs(ds));
        }
    }

    double srr = nsum_get(&s_rr), scc = nsum_get(&s_cc), sdd = nsum_get(&s_dd);
    double src = nsum_get(&s_rc), sabs = nsum_get(&s_abs);
    double nr = sqrt(srr), nc = sqrt(scc), nd = sqrt(sdd);

    out->n = n;
    out->n_finite = nf;
    out->nan_ref = nan_r;
    out->nan_cand = nan_c;
    out->inf_ref = inf_r;
    out->inf_cand = inf_c;
    out->inf_mismatch = inf_mis;
    out->mismatch_count = mismatch;
    out->mismatch_fraction = n ? (double)mismatch / (double)n : 0.0;
    out->identical = identical;
    out->zero_norm_reference = srr == 0.0;
    out->norm_ref = ldexp(nr, -kr);
    out->norm_cand = ldexp(nc, -kc);
    out->norm_diff = ldexp(nd, -kd);
    out->dot = ldexp(src, -(kr + kc));

    /* rel_l2 = ||c-r|| / ||r|| */
    if (srr == 0.0)
        out->rel_l2 = sdd == 0.0 ? 0.0 : INFINITY;
    else
        out->rel_l2 = ldexp(nd / nr, kr - kd);

    /* cosine = <r,c> / (||r|| ||c||), clamped to [-1, 1]. sqrt(srr*scc) rather
     * than nr*nc when the product is in range: sqrt(x*x) == |x| exactly in
     * IEEE arithmetic, so c = r gives exactly 1. */
    if (srr == 0.0 && scc == 0.0) {
        out->cosine = 1.0;
    } else if (srr == 0.0 || scc == 0.0) {
        out->cosine = 0.0;
    } else {
        double prod = srr * scc;
        double denom = isnormal(prod) ? sqrt(prod) : nr * nc;
        double cos = src / denom;
        out->cosine = cos > 1.0 ? 1.0 : (cos < -1.0 ? -1.0 : cos);
    }

    out->max_abs = max_d;
    out->max_abs_offset = max_off;
    out->mean_abs = nf ? ldexp(sabs / (double)nf, -kd) : NAN;
    out->p99_abs = probe_metrics_percentile_nearest_rank(scratch, nf, 99.0);
    free(scratch);
    return PROBE_OK;
}
