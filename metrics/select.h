/* select.h - exact selection (select.c), used by the streaming engine (metrics.c). */
#ifndef PROBE_METRICS_SELECT_H
#define PROBE_METRICS_SELECT_H

#include <stddef.h>

/* The element of 0-based rank k (k < n) of v[0, n), reordering v:
 * introselect, O(n) on average, O(n log n) at worst. */
double probe_select_kth(double *v, size_t n, size_t k);

#endif
