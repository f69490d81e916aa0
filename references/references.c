/* references/references.c - fp64 oracles for L1 operations
 * (include/probe/references.h, docs/oracle.md). Depends on libc/libm only. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "probe/references.h"

#include "../metrics/nsum.h" /* Neumaier's compensated sum */

/* a * b without overflow of the size_t product; 0 on overflow */
static int mul_ok(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

double probe_ref_gamma(double k, double u)
{
    double ku = k * u;
    return ku >= 1.0 ? INFINITY : ku / (1.0 - ku);
}

probe_status probe_ref_gemm(const probe_ref_gemm_args *g, double *out, double *abs_out)
{
    if (g == NULL || g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 1 ||
        g->epilogue < PROBE_REF_EPI_NONE || g->epilogue > PROBE_REF_EPI_GELU_TANH)
        return PROBE_EINVAL;
    size_t m = (size_t)g->m, n = (size_t)g->n, k = (size_t)g->k, nb = (size_t)g->batch;
    size_t mk, kn, mn, total;
    if (!mul_ok(m, k, &mk) || !mul_ok(k, n, &kn) || !mul_ok(m, n, &mn) || !mul_ok(mn, nb, &total) ||
        !mul_ok(mk, nb, &(size_t){0}) || !mul_ok(kn, nb, &(size_t){0}) ||
        total > SIZE_MAX / sizeof(double))
        return PROBE_EINVAL;
    if (total > 0 && out == NULL)
        return PROBE_EINVAL;
    if (total > 0 && k > 0 && (g->a == NULL || g->b == NULL))
        return PROBE_EINVAL;
    double as = g->alpha * g->scale_a * g->scale_b;
    for (size_t bi = 0; bi < nb; bi++) {
        const double *A = g->a ? g->a + (g->a_batched ? bi * mk : 0) : NULL;
        const double *B = g->b ? g->b + (g->b_batched ? bi * kn : 0) : NULL;
        for (size_t j = 0; j < n; j++) {
            for (size_t i = 0; i < m; i++) {
                nsum s = {0, 0}, sa = {0, 0};
                for (size_t l = 0; l < k; l++) {
                    double x = g->transa ? A[i * k + l] : A[l * m + i];
                    double y = g->transb ? B[l * n + j] : B[j * k + l];
                    nsum_add(&s, x * y);
                    if (abs_out)
                        nsum_add(&sa, fabs(x) * fabs(y));
                }
                size_t o = bi * mn + j * m + i;
                nsum pre = {0, 0};
                nsum_add(&pre, as * nsum_get(&s));
                if (g->c != NULL && g->beta != 0.0)
                    nsum_add(&pre, g->beta * g->c[o]);
                if (g->bias != NULL)
                    nsum_add(&pre, g->bias[i]);
                double v = nsum_get(&pre);
                if (g->epilogue == PROBE_REF_EPI_RELU)
                    v = v > 0 ? v : 0.0;
                else if (g->epilogue == PROBE_REF_EPI_GELU_TANH)
                    probe_ref_gelu(&v, 1, PROBE_REF_GELU_TANH, &v, NULL);
                out[o] = v;
                if (abs_out)
                    abs_out[o] = nsum_get(&sa);
            }
        }
    }
    return PROBE_OK;
}

double probe_ref_gemm_bound(const probe_ref_gemm_precision *p, int64_t k, double ref, double S,
                            double abs_alpha_scales, double abs_beta_c, double abs_bias)
{
    double g_in = p->u_in > 0 ? probe_ref_gamma(2, p->u_in) : 0.0;
    double g_acc = probe_ref_gamma((double)k, p->u_acc);
    double E = abs_alpha_scales * (g_in + g_acc * (1.0 + g_in)) * S +
               probe_ref_gamma(3, p->u_epi) * (abs_alpha_scales * S + abs_beta_c + abs_bias);
    double lip = p->lip > 0 ? p->lip : 1.0;
    return p->u_out * fabs(ref) + (1.0 + p->u_out) * lip * E + p->eta_out;
}

static int rows_ok(const double *x, int64_t rows, int64_t d, const void *out, size_t *total)
{
    if (rows < 0 || d < 0 || !mul_ok((size_t)rows, (size_t)d, total))
        return 0;
    return *total == 0 || (x != NULL && out != NULL);
}

probe_status probe_ref_rmsnorm(const double *x, int64_t rows, int64_t d, const double *weight,
                               double eps, double *out)
{
    size_t total;
    if (!rows_ok(x, rows, d, out, &total) || !(eps >= 0))
        return PROBE_EINVAL;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + (size_t)r * (size_t)d;
        nsum ss = {0, 0};
        for (int64_t i = 0; i < d; i++)
            nsum_add(&ss, xr[i] * xr[i]);
        double inv = 1.0 / sqrt(nsum_get(&ss) / (double)(d > 0 ? d : 1) + eps);
        for (int64_t i = 0; i < d; i++)
            out[(size_t)r * (size_t)d + (size_t)i] = xr[i] * inv * (weight ? weight[i] : 1.0);
    }
    return PROBE_OK;
}

probe_status probe_ref_layernorm(const double *x, int64_t rows, int64_t d, const double *weight,
                                 const double *bias, double eps, double *out, double *mean_out,
                                 double *rstd_out)
{
    size_t total;
    if (!rows_ok(x, rows, d, out, &total) || !(eps >= 0))
        return PROBE_EINVAL;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + (size_t)r * (size_t)d;
        nsum s = {0, 0};
        for (int64_t i = 0; i < d; i++)
            nsum_add(&s, xr[i]);
        double mean = d > 0 ? nsum_get(&s) / (double)d : 0.0;
        nsum v = {0, 0};
        for (int64_t i = 0; i < d; i++)
            nsum_add(&v, (xr[i] - mean) * (xr[i] - mean));
        double rstd = 1.0 / sqrt((d > 0 ? nsum_get(&v) / (double)d : 0.0) + eps);
        for (int64_t i = 0; i < d; i++)
            out[(size_t)r * (size_t)d + (size_t)i] =
                (xr[i] - mean) * rstd * (weight ? weight[i] : 1.0) + (bias ? bias[i] : 0.0);
        if (mean_out)
            mean_out[r] = mean;
        if (rstd_out)
            rstd_out[r] = rstd;
    }
    return PROBE_OK;
}

probe_status probe_ref_rope(const double *x, const double *cos, const double *sin, int64_t rows,
                            int64_t d, probe_ref_rope_convention conv, double *out, double *rot_out)
{
    size_t total;
    if (!rows_ok(x, rows, d, out, &total) || d % 2 != 0 ||
        (conv != PROBE_REF_ROPE_INTERLEAVED && conv != PROBE_REF_ROPE_HALF) ||
        (total > 0 && (cos == NULL || sin == NULL)))
        return PROBE_EINVAL;
    size_t h = (size_t)d / 2;
    for (size_t r = 0; r < (size_t)rows; r++) {
        const double *xr = x + r * (size_t)d;
        for (size_t i = 0; i < (size_t)d; i++) {
            double rot;
            if (conv == PROBE_REF_ROPE_INTERLEAVED)
                rot = i % 2 == 0 ? -xr[i + 1] : xr[i - 1];
            else
                rot = i < h ? -xr[i + h] : xr[i - h];
            size_t o = r * (size_t)d + i;
            out[o] = xr[i] * cos[o] + rot * sin[o];
            if (rot_out)
                rot_out[o] = rot;
        }
    }
    return PROBE_OK;
}

probe_status probe_ref_attention(const double *q, const double *k, const double *v,
                                 int64_t heads, int64_t sq, int64_t sk, int64_t d, int64_t dv,
                                 double scale, int causal, const double *mask, double u,
                                 double *out, double *bound_out)
{
    size_t nq, nk, nv, no, t;
    if (heads < 0 || sq < 0 || sk < 0 || d < 0 || dv < 0 || !isfinite(scale) ||
        !mul_ok((size_t)heads, (size_t)sq, &t) || !mul_ok(t, (size_t)d, &nq) ||
        !mul_ok(t, (size_t)dv, &no) || !mul_ok((size_t)heads, (size_t)sk, &t) ||
        !mul_ok(t, (size_t)d, &nk) || !mul_ok(t, (size_t)dv, &nv))
        return PROBE_EINVAL;
    if ((nq && q == NULL) || (nk && k == NULL) || (nv && v == NULL) || (no && out == NULL) ||
        (size_t)sk > SIZE_MAX / (3 * sizeof(double)))
        return PROBE_EINVAL;
    if (no == 0)
        return PROBE_OK;
    double *s = malloc(3 * (sk > 0 ? (size_t)sk : 1) * sizeof(double));
    if (s == NULL)
        return PROBE_ENOMEM;
    double *qk = s + (sk > 0 ? sk : 1), *p = qk + (sk > 0 ? sk : 1);
    double g_dot = probe_ref_gamma((double)d + 2, u), g_sum = probe_ref_gamma((double)sk, u);
    for (int64_t hh = 0; hh < heads; hh++) {
        const double *Q = q + (size_t)hh * (size_t)sq * (size_t)d;
        const double *K = k + (size_t)hh * (size_t)sk * (size_t)d;
        const double *V = v + (size_t)hh * (size_t)sk * (size_t)dv;
        for (int64_t i = 0; i < sq; i++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < sk; j++) {
                nsum a = {0, 0}, aa = {0, 0};
                for (int64_t l = 0; l < d; l++) {
                    double x = Q[i * d + l], y = K[j * d + l];
                    nsum_add(&a, x * y);
                    nsum_add(&aa, fabs(x) * fabs(y));
                }
                double val = nsum_get(&a) * scale;
                if (mask)
                    val += mask[i * sk + j];
                if (causal && j > i)
                    val = -INFINITY;
                s[j] = val;
                qk[j] = nsum_get(&aa) * fabs(scale);
                if (val > mx)
                    mx = val;
            }
            nsum z = {0, 0};
            for (int64_t j = 0; j < sk; j++) {
                p[j] = mx == -INFINITY ? NAN : exp(s[j] - mx);
                nsum_add(&z, p[j]);
            }
            double Z = nsum_get(&z);
            double pd = 0.0; /* sum_l p_l delta_l */
            for (int64_t j = 0; j < sk; j++) {
                p[j] /= Z;
                /* delta_j: the error of logit j (first order), p_j > 0 only */
                qk[j] = p[j] > 0 ? g_dot * qk[j] + 2 * u * fabs(s[j] - mx) + 2 * u : 0.0;
                pd += p[j] * qk[j];
            }
            for (int64_t c = 0; c < dv; c++) {
                nsum o = {0, 0};
                double pv = 0.0, pdv = 0.0;
                for (int64_t j = 0; j < sk; j++) {
                    double vv = V[j * dv + c];
                    nsum_add(&o, p[j] * vv);
                    pv += p[j] * fabs(vv);
                    pdv += p[j] * qk[j] * fabs(vv);
                }
                size_t idx = ((size_t)hh * (size_t)sq + (size_t)i) * (size_t)dv + (size_t)c;
                out[idx] = nsum_get(&o);
                if (bound_out && u > 0)
                    bound_out[idx] = pdv + pd * pv + (g_sum + 4 * u) * pv;
            }
        }
    }
    free(s);
    return PROBE_OK;
}

probe_status probe_ref_silu(const double *x, size_t n, double *out)
{
    if (n > 0 && (x == NULL || out == NULL))
        return PROBE_EINVAL;
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] / (1.0 + exp(-x[i]));
    return PROBE_OK;
}

probe_status probe_ref_gelu(const double *x, size_t n, probe_ref_gelu_approx approx, double *out,
                            double *mag_out)
{
    if ((n > 0 && (x == NULL || out == NULL)) ||
        (approx != PROBE_REF_GELU_ERF && approx != PROBE_REF_GELU_TANH))
        return PROBE_EINVAL;
    const double c = sqrt(2.0 / M_PI);
    for (size_t i = 0; i < n; i++) {
        double xi = x[i];
        double t = approx == PROBE_REF_GELU_ERF ? erf(xi / M_SQRT2)
                                                : tanh(c * (xi + 0.044715 * xi * xi * xi));
        if (mag_out)
            mag_out[i] = 0.5 * fabs(xi) * (1.0 + fabs(t));
        out[i] = 0.5 * xi * (1.0 + t);
    }
    return PROBE_OK;
}
