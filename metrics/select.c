/* select.c - the k-th smallest of an array of doubles (select.h):
 * introselect, quickselect with a median-of-3 pivot and a 3-way partition,
 * falling back to heapsort after 2*log2(n) rounds; small ranges by insertion
 * sort. Used for the exact nearest-rank p99 (metrics.c). */
#include "select.h"

#include <math.h>
#include <stddef.h>

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
double probe_select_kth(double *v, size_t n, size_t k)
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
