/* probe/verdict.h - what a tensor's verdict reads beyond its gate: the
 * systematic-difference test (noise vs structure), the three-way comparison
 * against a high-precision oracle run, and which component call introduced a
 * difference (docs/gates.md "Verdicts", docs/metrics.md "Systematic
 * difference").
 *
 * The statistics come from probe/metrics.h: the relative gain error with its
 * HC0 standard error, and the per-channel mean shift of c - r with its
 * standard error. Model behind the thresholds: rounding noise is a sum of
 * many small independent differences of zero mean, so each z statistic is
 * approximately standard normal under it; a feature or bug that changes the
 * function (a scale, a bias, a wrong input) shows as a z far beyond what K
 * independent normal statistics reach.
 */
#ifndef PROBE_VERDICT_H
#define PROBE_VERDICT_H

#include <stddef.h>
#include <stdint.h>
#include "probe/metrics.h"
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Family-wise false-alarm probability of one systematic test (the gain test,
 * or the channel test over all K channels) on one tensor of pure rounding
 * noise, under the model above. */
#define PROBE_SYSTEMATIC_FALSE_ALARM 1e-6
/* A systematic difference is reported only when its size (in rel_l2 units,
 * see probe_systematic) is at least this fraction of the gate's rel_l2_max:
 * a structured difference a thousand times below the gate's own budget is a
 * rounding pattern, not a defect. */
#define PROBE_SYSTEMATIC_FLOOR_OF_GATE 1e-3
/* The floor when the gate checks no rel_l2 (T2 without a rel_l2 threshold). */
#define PROBE_SYSTEMATIC_FLOOR_DEFAULT 1e-5
/* A systematic part is also reported only when it is at least this share of the error
 * it belongs to: of the pair's difference (its size over rel_l2: the share of ||c - r||
 * the gain or the channel's shift explains), or, against an oracle, of the reference's
 * own error ||r - o||. A structured difference that is a few percent of a rounding
 * difference is itself rounding: a fused kernel that rounds a per-channel modulation
 * differently from eager (measured on the H200: 4 % of the reference's error in one
 * channel of a DiT block under torch.compile). */
#define PROBE_SYSTEMATIC_SHARE 0.1
/* Default headroom of the oracle error ratio (probe_oracle_verdict): the
 * candidate may be up to 5 % farther from the oracle than the reference. */
#define PROBE_ORACLE_HEADROOM 1.05

/* The z limit of a two-sided test over k independent standard normal
 * statistics at family-wise false-alarm probability p (Bonferroni):
 * t with P(|Z| > t) = p / k, i.e. erfc(t / sqrt 2) = p / k. k = 0 counts
 * as 1. p outside (0, 1): NaN. Accurate to 1e-12 (bisection on erfc). */
double probe_systematic_limit(uint64_t k, double p);

/* The systematic part of one tensor's difference, reference r, candidate c
 * (and, with an oracle o, how it moves the candidate relative to o). Sizes
 * are in rel_l2 units: the norm of the systematic part over ||r||. */
typedef struct probe_systematic {
    int computed;            /* 1 when the fields below are valid */
    double floor_gate;       /* the gate's floor (PROBE_SYSTEMATIC_FLOOR_OF_GATE) */
    double floor;            /* the size below which nothing is reported: max(floor_gate,
                                PROBE_SYSTEMATIC_SHARE x rel_l2 of the pair) */
    /* Gain: alpha = probe_metrics.gain, z = gain_z, size |alpha|. */
    double gain_limit;       /* probe_systematic_limit(1, p) */
    int gain_fail;           /* |gain_z| > gain_limit and |gain| >= floor */
    /* Channels (K > 0 when a channel axis is known): z_k, size_k =
     * sqrt(n_k) |shift_k| / ||r||. The channel reported is the one with the
     * largest |z_k| among those at or above the floor (or overall, when none
     * is). */
    uint64_t channels;       /* K; 0: no channel test */
    double channel_limit;    /* probe_systematic_limit(K, p) */
    uint64_t channel;        /* the channel reported */
    double channel_z, channel_shift, channel_size;
    int channel_fail;        /* some channel has |z_k| > channel_limit and size_k >= floor */
} probe_systematic;

/* Every channel's mean-shift z, as probe_channel_shift defines it: z[k] =
 * shift[k] / se[k], 0 when shift[k] = 0, +-inf when se[k] = 0 < |shift[k]|,
 * NaN when nk[k] < 2 or shift[k] is NaN. PROBE_EINVAL for NULL arrays with
 * nchannels > 0. */
probe_status probe_channel_z(const double *shift, const double *se, const double *nk,
                             uint64_t nchannels, double *z);

/* The systematic test of one pair: m its metrics (gain from probe_metrics);
 * per-channel mean shift[k], standard error se[k] and count nk[k] for k <
 * nchannels (NULL / 0: no channel test); floor from the gate (see
 * PROBE_SYSTEMATIC_FLOOR_OF_GATE; rel_l2_max +inf gives the default) and from the pair's
 * rel_l2 (PROBE_SYSTEMATIC_SHARE).
 * Fills *out. PROBE_EINVAL for NULL m or out, or arrays missing with
 * nchannels > 0. */
probe_status probe_systematic_check(const probe_metrics *m, const double *shift, const double *se,
                                    const double *nk, uint64_t nchannels, double gate_rel_l2_max,
                                    probe_systematic *out);

/* Three-way comparison of one tensor against an oracle o: a run of the same
 * experiment in higher precision (same weights, the reference's root
 * inputs). err_reference = ||r - o|| / ||o||, err_candidate = ||c - o|| /
 * ||o||, ratio = err_candidate / err_reference (1 when both are 0, +inf when
 * only the reference is exact). The candidate is "no less accurate than the
 * reference" when ratio <= limit, limit = max(headroom, 1 + 4 / sqrt(n)),
 * the second term covering the spread of the ratio of two equally accurate
 * results on n elements; and when it adds no systematic error: the gain and
 * channel excesses below do not exceed their limits.
 *   gain_excess = (|alpha(c, o)| - |alpha(r, o)|) / se(alpha(c, r)),
 *   channel_excess_k = (|b_k(c)| - |b_k(r)|) / se_k(c - r),
 * b_k(x) = mean_k(x - o): how far the candidate's systematic error against
 * the oracle exceeds the reference's, in units of the pair's own standard
 * error. An excess fails when it exceeds the z limit of sys and its size is
 * at least `floor`. A candidate closer to the oracle (a fused kernel that
 * rounds less) has a negative excess. */
typedef struct probe_oracle_verdict {
    int computed;
    double err_reference, err_candidate, ratio, limit;
    int ratio_fail;
    double floor;            /* max(sys->floor_gate, PROBE_SYSTEMATIC_SHARE x err_reference):
                                the size an excess must reach to count */
    double gain_excess, gain_excess_size;        /* size: |alpha(c,o)| - |alpha(r,o)| */
    int gain_fail;
    uint64_t channel;                            /* channel of the largest excess */
    double channel_excess, channel_excess_size;  /* size: sqrt(n_k)(|b_k(c)| - |b_k(r)|)/||r|| */
    int channel_fail;
    int pass;
} probe_oracle_verdict;

/* The oracle verdict of one tensor from the metrics of the pairs (o, r),
 * (o, c) (oracle as the reference side) and (r, c), the per-channel means
 * b_r[k] = mean_k(r - o), b_c[k] = mean_k(c - o), the pair's se[k] and nk[k]
 * (NULL / 0: no channel test), the floor and limits of sys (from
 * probe_systematic_check on the pair), and the headroom (<= 0: the default).
 * PROBE_EINVAL for NULL metrics, sys or out. */
probe_status probe_oracle_check(const probe_metrics *oracle_ref, const probe_metrics *oracle_cand,
                                const probe_metrics *pair, const double *b_r, const double *b_c,
                                const double *se, const double *nk, uint64_t nchannels,
                                const probe_systematic *sys, double headroom,
                                probe_oracle_verdict *out);

/* ---- attribution: which component call introduced a difference ----
 *
 * A component call is the group of tensors /<component>/<call>/<slot> of one
 * call: its inputs (slots "in.*") and outputs (every other slot). Calls are
 * ordered by execution (probe.seq); a call whose span of tensors lies inside
 * another's is nested in it (a DiT block inside a DiT step). Whether a tensor
 * "fails" is its headline verdict. */
typedef enum probe_call_status {
    PROBE_CALL_PASS = 0,        /* inputs and outputs pass */
    PROBE_CALL_INTRODUCED = 1,  /* an output fails while every input passes (or, with
                                   --isolated, its isolated output fails) */
    PROBE_CALL_INHERITED = 2,   /* an output fails and an input already fails (or the
                                   isolated output passes): the difference came from upstream */
    PROBE_CALL_INPUTS_DIFFER = 3, /* an input fails, every output passes */
    PROBE_CALL_INSIDE = 4       /* an output fails while the inputs pass, and a call nested
                                   in it introduced the difference (`via`) */
} probe_call_status;

/* "pass", "introduced", "inherited", "inputs-differ", "inside". */
const char *probe_call_status_name(probe_call_status s);

typedef struct probe_call_verdict {
    char component[128];
    int64_t call, step;
    int32_t cfg_branch;
    int64_t seq_first, seq_last;   /* execution span of its tensors (-1: unknown) */
    long parent;                   /* index of the enclosing call, -1 if none */
    long block;                    /* index among the parent's calls of the same component,
                                      -1 when not nested */
    probe_call_status status;
    const char *decided_by;        /* "inputs", "isolated" (a static string) */
    long first_failure;            /* tensor index of its first failing output, -1 if none */
    long via;                      /* INSIDE: the nested call that introduced it, else -1 */
} probe_call_verdict;

typedef enum probe_introduction_kind {
    PROBE_INTRODUCED_NONE = 0,     /* nothing fails in a call */
    PROBE_INTRODUCED_CALL = 1,     /* by a component call (`call`) */
    PROBE_INTRODUCED_BETWEEN = 2,  /* in pipeline code between captured calls: an input of
                                      `call` fails while every output that ran since that
                                      component's previous call passes (e.g. the CFG
                                      combination before scheduler.step) */
    PROBE_INTRODUCED_BEFORE = 3    /* an input of the first captured call already fails */
} probe_introduction_kind;

typedef struct probe_introduction {
    probe_introduction_kind kind;
    long call;              /* the call introduced at, or whose input shows the difference */
    long tensor;            /* the first failing tensor there (an output, or the input) */
    char after[128];        /* BETWEEN: component of the last call before (else "") */
    long after_call;        /* BETWEEN: that call's index, -1 otherwise */
    double amplification;   /* BETWEEN: rel_l2 of the input over the largest rel_l2 of
                               the outputs since (inf when those are identical); NaN else */
    size_t ninherited;      /* calls with status inherited after it */
} probe_introduction;

#ifdef __cplusplus
}
#endif
#endif
