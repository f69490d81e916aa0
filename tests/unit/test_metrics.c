/* test_metrics.c - probe_metrics_compute and the nearest-rank percentile
 * (probe/metrics.h, docs/metrics.md).
 *
 * Oracles: hand-derived values for small cases; a sort-based nearest-rank
 * percentile (rank computed with integer arithmetic); numpy
 * percentile(method="inverted_cdf") values copied in as constants; a
 * straightforward long double (x87 80-bit) evaluation of every formula for
 * random data, including data whose squares overflow/underflow a double.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/metrics.h"

static const probe_metrics_opts T1_TOL = {1e-3, 1e-3};

static probe_metrics compute(const double *r, const double *c, size_t n, probe_metrics_opts o)
{
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(r, c, n, &o, &m), PROBE_OK, "%s", probe_last_error());
    return m;
}

/* deterministic generator (splitmix64) */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_uniform(void) /* [0, 1) */
{
    return (double)(rng_next() >> 11) * 0x1p-53;
}
static double rng_normal(void)
{
    double u = rng_uniform(), v = rng_uniform();
    return sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * M_PI * v);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* rank = ceil(99 n / 100), in integers */
static double p99_oracle(const double *v, size_t n)
{
    double *s = malloc(n * sizeof *s);
    memcpy(s, v, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_double);
    size_t rank = (99 * n + 99) / 100;
    double x = s[rank - 1];
    free(s);
    return x;
}

static void assert_rel(double got, double want, double tol, const char *what)
{
    double err = fabs(got - want) / (fabs(want) > 0 ? fabs(want) : 1.0);
    cr_assert(err <= tol, "%s: got %.17g want %.17g (relative error %.3g > %.3g)", what, got, want,
              err, tol);
}

/* ---- hand-derived ---- */

Test(metrics, hand_derived_pair)
{
    /* r = (3, 4), c = (3, 4.5): c - r = (0, 0.5); ||r|| = 5, ||c - r|| = 0.5,
     * ||c|| = sqrt(9 + 20.25) = sqrt(117)/2, <r, c> = 9 + 18 = 27,
     * cosine = 27 / (5 sqrt(117)/2) = 54 / (5 sqrt(117)). */
    const double r[] = {3, 4}, c[] = {3, 4.5};
    probe_metrics m = compute(r, c, 2, T1_TOL);
    cr_assert_eq(m.n, 2);
    cr_assert_eq(m.n_finite, 2);
    cr_assert(m.rel_l2 == 0.1, "rel_l2 %.17g", m.rel_l2);
    assert_rel(m.cosine, 54.0 / (5.0 * sqrt(117.0)), 2 * DBL_EPSILON, "cosine");
    cr_assert(m.max_abs == 0.5);
    cr_assert_eq(m.max_abs_offset, 1);
    cr_assert(m.p99_abs == 0.5, "p99: rank ceil(1.98) = 2 of (0, 0.5)");
    cr_assert(m.mean_abs == 0.25);
    cr_assert_eq(m.mismatch_count, 1); /* 0.5 > 1e-3 + 1e-3 * 4 */
    cr_assert(m.mismatch_fraction == 0.5);
    cr_assert(m.norm_ref == 5.0 && m.norm_diff == 0.5 && m.dot == 27.0);
    assert_rel(m.norm_cand, sqrt(117.0) / 2, DBL_EPSILON, "norm_cand");
    cr_assert_eq(m.zero_norm_reference, 0);
    cr_assert_eq(m.identical, 0);
    cr_assert_eq(m.nan_ref + m.nan_cand + m.inf_ref + m.inf_cand + m.inf_mismatch, 0);
}

Test(metrics, mismatch_is_strict_and_uses_abs_ref)
{
    /* tolerance atol + rtol|r| = 0.25 + 0.25 * 1 = 0.5, all exact in binary */
    probe_metrics_opts o = {0.25, 0.25};
    const double r[] = {1.0, -1.0, 1.0, 0.0};
    const double c[] = {1.5, -1.5, nextafter(1.5, 2.0), 0.25};
    probe_metrics m = compute(r, c, 4, o);
    /* |d| = 0.5 (not > 0.5), 0.5 (|r| = 1), 0.5 + ulp (>), 0.25 (= atol, not >) */
    cr_assert_eq(m.mismatch_count, 1);
    cr_assert(m.mismatch_fraction == 0.25);
    probe_metrics_opts zero = {0, 0};
    const double r2[] = {1, 2, 3}, c2[] = {1, 2, 3};
    cr_assert_eq(compute(r2, c2, 3, zero).mismatch_count, 0);
}

Test(metrics, identical_tensors)
{
    const double r[] = {1.5, -2.0, 0.0, 1e-30, 7.25};
    probe_metrics m = compute(r, r, 5, T1_TOL);
    cr_assert_eq(m.identical, 1);
    cr_assert(m.rel_l2 == 0.0 && m.cosine == 1.0 && m.max_abs == 0.0 && m.p99_abs == 0.0 &&
              m.mean_abs == 0.0);
    cr_assert_eq(m.max_abs_offset, 0); /* first index attaining 0 */
    cr_assert_eq(m.mismatch_count, 0);
    /* -0 and +0 are the same value, not the same bytes: every metric 0, not identical */
    const double a[] = {0.0, 1.0}, b[] = {-0.0, 1.0};
    probe_metrics z = compute(a, b, 2, T1_TOL);
    cr_assert_eq(z.identical, 0);
    cr_assert(z.rel_l2 == 0.0 && z.max_abs == 0.0 && z.mismatch_count == 0);
}

Test(metrics, zero_norm_reference)
{
    const double z[] = {0, 0, 0}, c[] = {0, 1, 0}, r[] = {1, 2, 2};
    probe_metrics m = compute(z, z, 3, T1_TOL);
    cr_assert(m.zero_norm_reference && m.rel_l2 == 0.0 && m.cosine == 1.0 && m.identical);

    m = compute(z, c, 3, T1_TOL); /* reference zero, candidate not */
    cr_assert_eq(m.zero_norm_reference, 1);
    cr_assert(isinf(m.rel_l2) && m.rel_l2 > 0);
    cr_assert(m.cosine == 0.0);
    cr_assert(m.norm_diff == 1.0);
    cr_assert_eq(m.identical, 0);

    m = compute(r, z, 3, T1_TOL); /* candidate zero: ||0 - r|| / ||r|| = 1 */
    cr_assert_eq(m.zero_norm_reference, 0);
    cr_assert(m.rel_l2 == 1.0 && m.cosine == 0.0 && m.norm_ref == 3.0);
}

Test(metrics, nan_inf_rules)
{
    const double r[] = {1, NAN, INFINITY, INFINITY, -INFINITY, 2};
    const double c[] = {NAN, NAN, INFINITY, -INFINITY, 5, 2};
    probe_metrics m = compute(r, c, 6, T1_TOL);
    cr_assert_eq(m.n, 6);
    cr_assert_eq(m.n_finite, 1);
    cr_assert_eq(m.nan_ref, 1);
    cr_assert_eq(m.nan_cand, 2);
    cr_assert_eq(m.inf_ref, 3);
    cr_assert_eq(m.inf_cand, 2);
    /* mismatches: 1 vs NaN, +inf vs -inf, -inf vs 5; not NaN/NaN, not +inf/+inf */
    cr_assert_eq(m.mismatch_count, 3);
    cr_assert(m.mismatch_fraction == 0.5);
    cr_assert_eq(m.inf_mismatch, 2);
    cr_assert_eq(m.identical, 0);
    /* norm metrics see only index 5 (2 vs 2) */
    cr_assert(m.rel_l2 == 0.0 && m.cosine == 1.0 && m.max_abs == 0.0 && m.p99_abs == 0.0 &&
              m.mean_abs == 0.0);
    cr_assert_eq(m.max_abs_offset, 5);
    cr_assert(m.norm_ref == 2.0);
}

Test(metrics, nan_in_candidate_excluded_from_norms)
{
    const double r[] = {3, 4, 1}, c[] = {3, 4.5, NAN};
    probe_metrics m = compute(r, c, 3, T1_TOL);
    cr_assert_eq(m.n_finite, 2);
    cr_assert_eq(m.nan_cand, 1);
    cr_assert(m.rel_l2 == 0.1 && m.max_abs == 0.5 && m.mean_abs == 0.25 && m.p99_abs == 0.5);
    cr_assert_eq(m.mismatch_count, 2);
    cr_assert_eq(m.inf_mismatch, 0);
}

Test(metrics, same_nonfinite_both_sides_is_identical)
{
    const double r[] = {1, INFINITY, -INFINITY, NAN}, c[] = {1, INFINITY, -INFINITY, NAN};
    probe_metrics m = compute(r, c, 4, T1_TOL);
    cr_assert_eq(m.identical, 1);
    cr_assert_eq(m.mismatch_count, 0);
    cr_assert_eq(m.inf_mismatch, 0);
    cr_assert_eq(m.nan_cand, 1);
    cr_assert_eq(m.n_finite, 1);
}

Test(metrics, finite_vs_infinity_is_inf_mismatch)
{
    const double r[] = {INFINITY, 1}, c[] = {1, INFINITY};
    probe_metrics m = compute(r, c, 2, T1_TOL);
    cr_assert_eq(m.inf_mismatch, 2);
    cr_assert_eq(m.mismatch_count, 2);
    cr_assert_eq(m.n_finite, 0);
    cr_assert(m.max_abs == 0.0 && isnan(m.p99_abs) && isnan(m.mean_abs));
    cr_assert(m.rel_l2 == 0.0 && m.cosine == 1.0);
}

Test(metrics, all_masked_same_infinity)
{
    const double r[] = {-INFINITY, -INFINITY, -INFINITY};
    probe_metrics m = compute(r, r, 3, T1_TOL);
    cr_assert_eq(m.n_finite, 0);
    cr_assert_eq(m.identical, 1);
    cr_assert_eq(m.mismatch_count, 0);
    cr_assert_eq(m.inf_ref, 3);
    cr_assert(isnan(m.p99_abs) && isnan(m.mean_abs));
}

Test(metrics, empty_tensor)
{
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(NULL, NULL, 0, &T1_TOL, &m), PROBE_OK);
    cr_assert_eq(m.n, 0);
    cr_assert_eq(m.n_finite, 0);
    cr_assert(m.rel_l2 == 0.0 && m.cosine == 1.0 && m.identical == 1);
    cr_assert(isnan(m.p99_abs) && isnan(m.mean_abs));
    cr_assert(m.max_abs == 0.0 && m.mismatch_fraction == 0.0);
}

Test(metrics, max_abs_first_occurrence)
{
    const double r[] = {0, 0, 0, 0, 5}, c[] = {1, -2, 2, -2, 3};
    probe_metrics m = compute(r, c, 5, T1_TOL);
    cr_assert(m.max_abs == 2.0);
    cr_assert_eq(m.max_abs_offset, 1);
}

Test(metrics, cosine_clamped_and_exact_for_parallel_vectors)
{
    enum { N = 1000 };
    static double r[N], c[N], neg[N];
    for (int trial = 0; trial < 50; trial++) {
        for (int i = 0; i < N; i++) {
            r[i] = rng_normal() * (1 + trial);
            c[i] = 3.0 * r[i];
            neg[i] = -r[i];
        }
        probe_metrics m = compute(r, r, N, T1_TOL);
        cr_assert(m.cosine == 1.0, "c = r: %.17g", m.cosine);
        m = compute(r, neg, N, T1_TOL);
        cr_assert(m.cosine == -1.0, "c = -r: %.17g", m.cosine);
        m = compute(r, c, N, T1_TOL);
        cr_assert(m.cosine <= 1.0 && m.cosine >= 1.0 - 4 * DBL_EPSILON, "c = 3r: %.17g", m.cosine);
        assert_rel(m.rel_l2, 2.0, 4 * DBL_EPSILON, "rel_l2 of c = 3r");
    }
}

Test(metrics, bad_input)
{
    const double r[] = {1}, c[] = {1};
    probe_metrics m;
    cr_assert_eq(probe_metrics_compute(r, c, 1, &T1_TOL, NULL), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "out is NULL") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_metrics_compute(r, c, 1, NULL, &m), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "opts is NULL") != NULL);
    cr_assert_eq(probe_metrics_compute(NULL, c, 1, &T1_TOL, &m), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "ref is NULL") != NULL);
    cr_assert_eq(probe_metrics_compute(r, NULL, 1, &T1_TOL, &m), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "cand is NULL") != NULL);
    probe_metrics_opts neg = {-1e-3, 0}, nan = {0, NAN};
    cr_assert_eq(probe_metrics_compute(r, c, 1, &neg, &m), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "atol") != NULL);
    cr_assert_eq(probe_metrics_compute(r, c, 1, &nan, &m), PROBE_EINVAL);
    /* (memory does not grow with n: tests/unit/test_stream.c) */
}

/* ---- percentile ---- */

Test(percentile, matches_numpy_inverted_cdf)
{
    /* numpy 1.24: np.percentile(v, q, method="inverted_cdf") */
    const double v0[] = {0.5, 3.0, 1.25, 7.0, 2.0, 0.0, 9.5, 4.0, 6.0, 8.25, 1.0};
    const struct { double q, want; } cases[] = {
        {99, 9.5}, {50, 3.0}, {90, 8.25}, {10, 0.5}, {100, 9.5}, {1, 0.0}, {25, 1.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double v[11];
        memcpy(v, v0, sizeof v);
        double got = probe_metrics_percentile_nearest_rank(v, 11, cases[i].q);
        cr_assert(got == cases[i].want, "q=%g: got %g want %g", cases[i].q, got, cases[i].want);
    }
    double w[200];
    for (int i = 0; i < 200; i++)
        w[i] = 200 - i; /* 200..1 */
    cr_assert(probe_metrics_percentile_nearest_rank(w, 200, 99) == 198.0);
    cr_assert(probe_metrics_percentile_nearest_rank(w, 200, 99.5) == 199.0);
}

Test(percentile, edge_arguments)
{
    double v[3] = {3, 1, 2};
    cr_assert(isnan(probe_metrics_percentile_nearest_rank(v, 0, 99)));
    cr_assert(isnan(probe_metrics_percentile_nearest_rank(NULL, 3, 99)));
    cr_assert(isnan(probe_metrics_percentile_nearest_rank(v, 3, 0)));
    cr_assert(isnan(probe_metrics_percentile_nearest_rank(v, 3, 100.5)));
    cr_assert(isnan(probe_metrics_percentile_nearest_rank(v, 3, NAN)));
    cr_assert(probe_metrics_percentile_nearest_rank(v, 3, 100) == 3.0);
    cr_assert(probe_metrics_percentile_nearest_rank(v, 3, 1e-9) == 1.0);
    double one = 42;
    cr_assert(probe_metrics_percentile_nearest_rank(&one, 1, 99) == 42.0);
}

static void check_p99_random(size_t n, int distinct)
{
    double *v = malloc(n * sizeof *v), *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++)
        v[i] = distinct ? rng_uniform() : (double)(rng_next() % 3);
    memcpy(w, v, n * sizeof *v);
    double want = p99_oracle(v, n);
    double got = probe_metrics_percentile_nearest_rank(w, n, 99);
    cr_assert(got == want, "n=%zu: got %.17g want %.17g", n, got, want);
    /* and via probe_metrics_compute: r = 0, c = v gives |c - r| = v */
    double *z = calloc(n, sizeof *z);
    probe_metrics m = compute(z, v, n, T1_TOL);
    cr_assert(m.p99_abs == want, "metrics n=%zu: got %.17g want %.17g", n, m.p99_abs, want);
    free(z);
    free(v);
    free(w);
}

Test(percentile, random_against_sort)
{
    const size_t sizes[] = {1, 2, 3, 17, 99, 100, 101, 199, 1000, 1001, 12345, 100000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int rep = 0; rep < 5; rep++) {
            check_p99_random(sizes[i], 1);
            check_p99_random(sizes[i], 0); /* many ties */
        }
    }
}

Test(percentile, every_rank_small_n)
{
    /* every q = 1..100 for n = 1..60 on shuffled distinct values 1..n:
     * the answer is the rank itself, ceil(q n / 100) */
    for (size_t n = 1; n <= 60; n++) {
        for (int q = 1; q <= 100; q++) {
            double v[60];
            for (size_t i = 0; i < n; i++)
                v[i] = (double)(i + 1);
            for (size_t i = n; i > 1; i--) { /* Fisher-Yates */
                size_t j = rng_next() % i;
                double t = v[i - 1]; v[i - 1] = v[j]; v[j] = t;
            }
            double want = (double)((q * n + 99) / 100);
            double got = probe_metrics_percentile_nearest_rank(v, n, q);
            cr_assert(got == want, "n=%zu q=%d: got %g want %g", n, q, got, want);
        }
    }
}

Test(percentile, adversarial_orders_are_fast_and_right, .timeout = 20)
{
    const size_t n = 1000000;
    double *v = malloc(n * sizeof *v);
    /* all equal: a 2-way partition would be quadratic */
    for (size_t i = 0; i < n; i++) v[i] = 0.0;
    cr_assert(probe_metrics_percentile_nearest_rank(v, n, 99) == 0.0);
    /* sorted, reverse sorted, organ pipe, sawtooth */
    for (size_t i = 0; i < n; i++) v[i] = (double)i;
    cr_assert(probe_metrics_percentile_nearest_rank(v, n, 99) == 989999.0);
    for (size_t i = 0; i < n; i++) v[i] = (double)(n - 1 - i);
    cr_assert(probe_metrics_percentile_nearest_rank(v, n, 99) == 989999.0);
    for (size_t i = 0; i < n; i++) v[i] = (double)(i < n / 2 ? i : n - 1 - i);
    /* values 0..499999 each twice: rank 990000 -> value 494999 */
    cr_assert(probe_metrics_percentile_nearest_rank(v, n, 99) == 494999.0);
    for (size_t i = 0; i < n; i++) v[i] = (double)(i % 1000);
    /* each of 0..999 appears 1000 times: rank 990000 -> 989 */
    cr_assert(probe_metrics_percentile_nearest_rank(v, n, 99) == 989.0);
    free(v);
}

/* ---- random data against a long double oracle ---- */

typedef struct {
    long double rel_l2, cosine, mean_abs, norm_ref;
    double max_abs;
    size_t max_off;
} ld_oracle;

static ld_oracle oracle(const double *r, const double *c, size_t n)
{
    long double rr = 0, cc = 0, dd = 0, rc = 0, sa = 0;
    double mx = -1;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        long double a = r[i], b = c[i], d = b - a;
        rr += a * a;
        cc += b * b;
        dd += d * d;
        rc += a * b;
        sa += fabsl(d);
        double e = fabs(c[i] - r[i]);
        if (e > mx) {
            mx = e;
            off = i;
        }
    }
    ld_oracle o = {sqrtl(dd) / sqrtl(rr), rc / sqrtl(rr * cc), sa / n, sqrtl(rr), mx, off};
    return o;
}

static void check_against_oracle(const double *r, const double *c, size_t n, const char *what)
{
    probe_metrics m = compute(r, c, n, T1_TOL);
    ld_oracle o = oracle(r, c, n);
    assert_rel(m.rel_l2, (double)o.rel_l2, 1e-12, what);
    assert_rel(m.cosine, (double)o.cosine, 1e-12, what);
    assert_rel(m.mean_abs, (double)o.mean_abs, 1e-12, what);
    assert_rel(m.norm_ref, (double)o.norm_ref, 1e-12, what);
    cr_assert(m.max_abs == o.max_abs, "%s: max_abs %.17g want %.17g", what, m.max_abs, o.max_abs);
    cr_assert_eq(m.max_abs_offset, o.max_off, "%s", what);
    cr_assert_eq(m.zero_norm_reference, 0, "%s", what);
}

Test(metrics, random_1e5_against_long_double)
{
    enum { N = 100000 };
    static double r[N], c[N];
    for (int i = 0; i < N; i++) {
        r[i] = rng_normal();
        c[i] = r[i] + 1e-3 * rng_normal();
    }
    check_against_oracle(r, c, N, "normal + 1e-3 noise");
    /* wide dynamic range: magnitudes 1e-8 .. 1e8 */
    for (int i = 0; i < N; i++) {
        r[i] = rng_normal() * pow(10.0, -8.0 + 16.0 * rng_uniform());
        c[i] = r[i] * (1.0 + 1e-2 * rng_normal());
    }
    check_against_oracle(r, c, N, "wide range");
    /* large offset: cancellation-prone dot product */
    for (int i = 0; i < N; i++) {
        r[i] = 1e6 + rng_normal();
        c[i] = -1e6 + rng_normal();
    }
    check_against_oracle(r, c, N, "offset");
}

Test(metrics, extreme_magnitudes_use_scaled_sums)
{
    enum { N = 10000 };
    static double r[N], c[N];
    const double scales[] = {1e250, 1e-250, 1e-310 /* subnormal */, 1e154};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        for (int i = 0; i < N; i++) {
            r[i] = rng_normal() * scales[s];
            c[i] = r[i] + 1e-2 * rng_normal() * scales[s];
        }
        char what[64];
        snprintf(what, sizeof what, "scale %g", scales[s]);
        /* subnormals carry fewer bits: the inputs are what they are, but the
         * metrics must still match the oracle on those inputs */
        check_against_oracle(r, c, N, what);
    }
    /* hand case: (1, 2) vs (1, 3) times 1e200 and times 1e-200:
     * rel_l2 = 1/sqrt(5), cosine = 7/sqrt(50) */
    const double k[] = {1e200, 1e-200};
    for (int i = 0; i < 2; i++) {
        double rr[] = {1 * k[i], 2 * k[i]}, cc[] = {1 * k[i], 3 * k[i]};
        probe_metrics m = compute(rr, cc, 2, T1_TOL);
        assert_rel(m.rel_l2, 1 / sqrt(5.0), 4 * DBL_EPSILON, "rel_l2 scaled");
        assert_rel(m.cosine, 7 / sqrt(50.0), 4 * DBL_EPSILON, "cosine scaled");
        assert_rel(m.norm_ref, sqrt(5.0) * k[i], 4 * DBL_EPSILON, "norm_ref scaled");
        cr_assert_eq(m.zero_norm_reference, 0);
    }
}

Test(metrics, difference_overflowing_double)
{
    /* c - r = 2e308 > DBL_MAX: max_abs is +inf, rel_l2 = 2, cosine = -1 */
    const double r[] = {-1e308, 0}, c[] = {1e308, 0};
    probe_metrics m = compute(r, c, 2, T1_TOL);
    cr_assert(isinf(m.max_abs));
    cr_assert_eq(m.max_abs_offset, 0);
    assert_rel(m.rel_l2, 2.0, 4 * DBL_EPSILON, "rel_l2");
    cr_assert(m.cosine == -1.0);
    cr_assert_eq(m.mismatch_count, 1);
    cr_assert(isinf(m.p99_abs));
    cr_assert_eq(m.inf_mismatch, 0);
    cr_assert_eq(m.n_finite, 2);
}
