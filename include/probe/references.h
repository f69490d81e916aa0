/* probe/references.h - fp64 oracles for L1 operations (docs/oracle.md).
 *
 * Every function takes fp64 inputs and writes fp64 outputs, all arrays
 * row-major and contiguous. Sums of more than a few terms use Neumaier's
 * compensated summation (Neumaier 1974; Higham, "Accuracy and Stability of
 * Numerical Algorithms", 2nd ed., sec. 4.3), so a reference value is the
 * exactly rounded fp64 result in all but pathological cases: products of
 * the inputs probe captures (fp8/bf16/fp16/fp32) are exact in fp64, and the
 * compensated sum has error <= 2u|sum| + O(n u^2) sum|x_i| (u = 2^-53).
 *
 * Errors: PROBE_EINVAL (a NULL array with a non-zero size, a size < 0 or
 * one that overflows, an unknown convention/epilogue), PROBE_ENOMEM. These
 * functions set no message (the library depends on nothing of probe's; the
 * caller names the op); they never print.
 */
#ifndef PROBE_REFERENCES_H
#define PROBE_REFERENCES_H

#include <stddef.h>
#include <stdint.h>
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- GEMM (cuBLAS / cuBLASLt semantics, captured row-major) ----
 *
 * cuBLAS computes, column-major, D = alpha*op(A)op(B) + beta*C (+ bias),
 * op(A) m x k, op(B) k x n, D m x n. A capture stores each column-major
 * matrix with R rows and C columns as the row-major tensor [C, R]
 * (docs/oracle.md "Shapes"), so, per batch entry b:
 *   a: [k, m] when transa = 0 (N), [m, k] when transa = 1 (T)
 *   b: [n, k] when transb = 0 (N), [k, n] when transb = 1 (T)
 *   c, out: [n, m];  bias: [m]
 * and, with opA(i,l) = transa ? a[i][l] : a[l][i],
 *           opB(l,j) = transb ? b[l][j] : b[j][l],
 *   acc[b][j][i] = sum_l opA(i,l) * opB(l,j)                 (compensated)
 *   pre[b][j][i] = alpha*scale_a*scale_b*acc + beta*c[b][j][i] + bias[i]
 *   out[b][j][i] = epilogue(pre)
 * For nn.Linear (y = x W^T + bias): a = W [out_f, in_f] (transa = T),
 * b = x [tokens, in_f] (transb = N), out [tokens, out_f]. */
typedef enum probe_ref_epilogue {
    PROBE_REF_EPI_NONE = 0,      /* cuBLASLt DEFAULT / BIAS */
    PROBE_REF_EPI_RELU = 1,      /* RELU / RELU_BIAS: max(pre, 0) */
    PROBE_REF_EPI_GELU_TANH = 2  /* GELU / GELU_BIAS: cuBLASLt's GELU is the tanh form */
} probe_ref_epilogue;

typedef struct probe_ref_gemm_args {
    int transa, transb;          /* 0 = N, 1 = T */
    int64_t m, n, k, batch;      /* >= 0; batch >= 1 */
    double alpha, beta;
    double scale_a, scale_b;     /* FP8 per-tensor scales; 1.0 when there are none */
    const double *a;             /* batch (a_batched) or 1 matrices of m*k elements */
    int a_batched;
    const double *b;             /* batch (b_batched) or 1 matrices of k*n elements */
    int b_batched;
    const double *c;             /* NULL (read as 0), or batch*n*m elements */
    const double *bias;          /* NULL (none), or m elements */
    probe_ref_epilogue epilogue;
} probe_ref_gemm_args;

/* out (batch*n*m doubles) = the formula above. abs_out (NULL or batch*n*m
 * doubles) = sum_l |opA(i,l)| * |opB(l,j)| per output element: the
 * magnitude behind a dot product's rounding-error bound (Higham eq. 3.5).
 * Work: 2*batch*m*n*k flops. */
probe_status probe_ref_gemm(const probe_ref_gemm_args *g, double *out, double *abs_out);

/* ---- normalizations over the last axis: x is [rows, d] ---- */

/* RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"):
 * y = x / sqrt(mean(x^2) + eps) * weight; weight NULL = 1 ([d]). */
probe_status probe_ref_rmsnorm(const double *x, int64_t rows, int64_t d, const double *weight,
                               double eps, double *out);

/* LayerNorm (Ba, Kiros & Hinton 2016; torch.nn.functional.layer_norm):
 * y = (x - mean) / sqrt(var + eps) * weight + bias, var the biased
 * (divisor d) variance, two-pass; weight/bias NULL = 1 / 0 ([d]).
 * mean_out, rstd_out: NULL or rows doubles (1/sqrt(var + eps)). */
probe_status probe_ref_layernorm(const double *x, int64_t rows, int64_t d, const double *weight,
                                 const double *bias, double eps, double *out, double *mean_out,
                                 double *rstd_out);

/* ---- rotary position embedding (Su et al. 2021, "RoFormer") ----
 * x, cos, sin, out: [rows, d], d even; cos/sin are the full-width tables
 * (already broadcast to x's rows). out = x*cos + rot(x)*sin with
 *   PROBE_REF_ROPE_INTERLEAVED (GPT-J): pairs (2i, 2i+1),
 *       rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i]
 *   PROBE_REF_ROPE_HALF (GPT-NeoX, Llama's rotate_half): pairs (i, i+d/2),
 *       rot(x)[i] = -x[i+d/2], rot(x)[i+d/2] = x[i]
 * rot_out: NULL or [rows, d], rot(x) (for the error bound). */
typedef enum probe_ref_rope_convention {
    PROBE_REF_ROPE_INTERLEAVED = 0,
    PROBE_REF_ROPE_HALF = 1
} probe_ref_rope_convention;
probe_status probe_ref_rope(const double *x, const double *cos, const double *sin, int64_t rows,
                            int64_t d, probe_ref_rope_convention conv, double *out,
                            double *rot_out);

/* ---- softmax attention (Vaswani et al. 2017; torch's
 * scaled_dot_product_attention) ----
 * For each of `heads` independent problems (leading axes flattened):
 * q [sq, d], k [sk, d], v [sk, dv], out [sq, dv]:
 *   s = q k^T * scale + mask;  causal: s[i][j] = -inf for j > i
 *   (top-left aligned, torch's is_causal);
 *   p = softmax(s) row-wise computed as exp(s - max_j s) / sum (stable);
 *   out = p v.
 * mask: NULL or [sq, sk] additive (shared by all heads). A row whose
 * logits are all -inf gives NaN (as torch). bound_out: NULL or [heads, sq,
 * dv]: the first-order rounding-error bound of docs/oracle.md for a
 * computation with unit roundoff u (logit error gamma_{d+2}(u)*scale*|q||k|
 * + 2u|s - max| + 2u propagated through softmax, plus gamma_{sk}(u) + 4u
 * for the weighted sum), written only when u > 0. */
probe_status probe_ref_attention(const double *q, const double *k, const double *v,
                                 int64_t heads, int64_t sq, int64_t sk, int64_t d, int64_t dv,
                                 double scale, int causal, const double *mask, double u,
                                 double *out, double *bound_out);

/* ---- activations, element-wise over n values ---- */

/* SiLU (Elfwing et al. 2018; torch.nn.functional.silu): x * sigmoid(x). */
probe_status probe_ref_silu(const double *x, size_t n, double *out);

/* GELU (Hendrycks & Gimpel 2016; torch.nn.functional.gelu):
 *   PROBE_REF_GELU_ERF:  0.5 x (1 + erf(x / sqrt 2))
 *   PROBE_REF_GELU_TANH: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * mag_out: NULL or n doubles, 0.5 |x| (1 + |erf(.)| or |tanh(.)|): the
 * magnitude of the terms, for the error bound of docs/oracle.md. */
typedef enum probe_ref_gelu_approx {
    PROBE_REF_GELU_ERF = 0,
    PROBE_REF_GELU_TANH = 1
} probe_ref_gelu_approx;
probe_status probe_ref_gelu(const double *x, size_t n, probe_ref_gelu_approx approx, double *out,
                            double *mag_out);

/* ---- error model (docs/oracle.md "The bound") ---- */

/* Higham's gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability of
 * Numerical Algorithms, 2nd ed., eq. 3.8); +inf when k u >= 1. */
double probe_ref_gamma(double k, double u);

/* Bound on |computed - ref| for one GEMM output element (docs/oracle.md):
 *   E = |alpha*scale_a*scale_b| * (gamma_2(u_in) + gamma_k(u_acc)(1 + gamma_2(u_in))) * S
 *     + gamma_3(u_epi) * (|alpha*scale_a*scale_b| S + |beta c| + |bias|)
 *   bound = u_out |ref| + (1 + u_out) * lip * E + eta_out
 * S = sum_l |opA(i,l)||opB(l,j)| (probe_ref_gemm's abs_out), u_in the unit
 * roundoff the inputs are rounded to inside the GEMM (0: none; TF32 2^-11),
 * u_acc the accumulation's, u_epi the epilogue arithmetic's (fp32: 2^-24),
 * u_out and eta_out the output type's unit roundoff and half its smallest
 * subnormal, lip the epilogue's Lipschitz constant (1 none/ReLU, 1.13 GELU)
 * and the epilogue's own evaluation error folded into u_epi. */
typedef struct probe_ref_gemm_precision {
    double u_in, u_acc, u_epi, u_out, eta_out, lip;
} probe_ref_gemm_precision;
double probe_ref_gemm_bound(const probe_ref_gemm_precision *p, int64_t k, double ref, double S,
                            double abs_alpha_scales, double abs_beta_c, double abs_bias);

#ifdef __cplusplus
}
#endif
#endif
