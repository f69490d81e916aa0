/* typed.c - metrics on tensors held in their own element type
 * (probe_metrics_compute_typed, probe/metrics.h).
 *
 * Both sides are converted to double with probe_dtype_to_f64() (exact for
 * every float type probe knows) and handed to probe_metrics_compute(): there
 * is no second implementation of any metric. Used by the Python module
 * (probe.compare / probe.assert_parity) on in-memory tensors.
 */
#include "probe/metrics.h"

#include <stdint.h>
#include <stdlib.h>

probe_status probe_metrics_compute_typed(probe_dtype ref_dtype, const void *ref,
                                         probe_dtype cand_dtype, const void *cand, size_t n,
                                         const probe_metrics_opts *opts, probe_metrics *out)
{
    if (out == NULL || opts == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_metrics_compute_typed: %s is NULL",
                               out == NULL ? "out" : "opts");
    if (probe_dtype_size(ref_dtype) == 0)
        return probe_set_error(PROBE_EINVAL,
                               "probe_metrics_compute_typed: unknown reference element type %d",
                               (int)ref_dtype);
    if (probe_dtype_size(cand_dtype) == 0)
        return probe_set_error(PROBE_EINVAL,
                               "probe_metrics_compute_typed: unknown candidate element type %d",
                               (int)cand_dtype);
    if (n > 0 && (ref == NULL || cand == NULL))
        return probe_set_error(PROBE_EINVAL, "probe_metrics_compute_typed: %s is NULL with n = %zu",
                               ref == NULL ? "ref" : "cand", n);
    if (n == 0)
        return probe_metrics_compute(NULL, NULL, 0, opts, out);
    if (n > SIZE_MAX / sizeof(double) / 2)
        return probe_set_error(PROBE_ENOMEM,
                               "probe_metrics_compute_typed: %zu elements do not fit in memory", n);

    double *r = malloc(n * sizeof *r);
    double *c = malloc(n * sizeof *c);
    probe_status s;
    if (r == NULL || c == NULL) {
        s = probe_set_error(PROBE_ENOMEM, "probe_metrics_compute_typed: cannot allocate 2 x %zu doubles",
                            n);
    } else {
        s = probe_dtype_to_f64(ref_dtype, ref, r, n);
        if (s == PROBE_OK)
            s = probe_dtype_to_f64(cand_dtype, cand, c, n);
        if (s == PROBE_OK)
            s = probe_metrics_compute(r, c, n, opts, out);
    }
    free(r);
    free(c);
    return s;
}
