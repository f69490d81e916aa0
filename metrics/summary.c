/* summary.c - summary of one tensor (probe_summary_compute, probe/metrics.h):
 * what stats-only capture keeps of a tensor instead of its bytes.
 *
 * Over the finite elements: min, max, max |x| and the fp64 sums of x and x^2,
 * each a Neumaier compensated sum (A. Neumaier, ZAMM 54, 1974; as in
 * metrics.c), so the error is about one ulp of the sum of magnitudes,
 * independent of n. NaN and +-inf are counted and left out. min and max order
 * -0 before +0, so the result does not depend on the order of the elements
 * (probe_cuda_summary, which reduces in another order, gives the same bits
 * for min/max/abs_max and the counts).
 */
#include "probe/metrics.h"

#include <math.h>
#include <string.h>

#include "probe/dtype.h"
#include "nsum.h"

/* x before m in the order used for min: numeric, then -0 before +0 */
static int before_min(double x, double m)
{
    return x < m || (x == m && signbit(x) && !signbit(m));
}

static int after_max(double x, double m)
{
    return x > m || (x == m && !signbit(x) && signbit(m));
}

probe_status probe_summary_compute(probe_dtype dtype, const void *x, size_t n, probe_summary *out)
{
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_summary_compute: out is NULL");
    memset(out, 0, sizeof *out);
    size_t esz = probe_dtype_size(dtype);
    if (esz == 0)
        return probe_set_error(PROBE_EINVAL, "probe_summary_compute: unknown element type %d",
                               (int)dtype);
    if (n > 0 && x == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_summary_compute: x is NULL with n = %zu", n);

    nsum s = {0, 0}, sq = {0, 0};
    double mn = NAN, mx = NAN, am = NAN;
    uint64_t nf = 0, nan = 0, inf = 0;
    const unsigned char *p = x;
    double buf[512];
    for (size_t i = 0; i < n; i += 512) {
        size_t m = n - i < 512 ? n - i : 512;
        probe_status st = probe_dtype_to_f64(dtype, p + i * esz, buf, m);
        if (st != PROBE_OK)
            return st;
        for (size_t j = 0; j < m; j++) {
            double v = buf[j];
            if (isnan(v)) {
                nan++;
            } else if (isinf(v)) {
                inf++;
            } else {
                if (nf == 0) {
                    mn = mx = v;
                    am = fabs(v);
                } else {
                    if (before_min(v, mn))
                        mn = v;
                    if (after_max(v, mx))
                        mx = v;
                    if (fabs(v) > am)
                        am = fabs(v);
                }
                nf++;
                nsum_add(&s, v);
                nsum_add(&sq, v * v);
            }
        }
    }
    out->n = n;
    out->n_finite = nf;
    out->nan = nan;
    out->inf = inf;
    out->min = mn;
    out->max = mx;
    out->abs_max = am;
    out->sum = nsum_get(&s);
    out->sum_sq = nsum_get(&sq);
    return PROBE_OK;
}
