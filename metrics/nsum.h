/* nsum.h - Neumaier's compensated summation (Higham, "Accuracy and Stability
 * of Numerical Algorithms", 2nd ed., sec. 4.3, "Kahan-Babuska"): the fp64
 * accumulator of the metrics engine (metrics.c) and the fp64 oracles
 * (references/). Internal header. */
#ifndef PROBE_METRICS_NSUM_H
#define PROBE_METRICS_NSUM_H

#include <math.h>

typedef struct {
    double s, c; /* running sum, accumulated rounding errors */
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

/* Fold b into a: its running sum, then its compensation. */
static inline void nsum_merge(nsum *a, const nsum *b)
{
    nsum_add(a, b->s);
    a->c += b->c;
}

/* The compensated sum; an infinite or NaN running sum as it is (its
 * compensation is then meaningless). */
static inline double nsum_get(const nsum *a)
{
    return isfinite(a->s) ? a->s + a->c : a->s;
}

#endif
