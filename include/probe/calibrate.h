/* probe/calibrate.h - derive T2 thresholds (docs/calibration.md) from
 * repeated runs, and measure the determinism floor.
 *
 * Inputs are capture files: N reference runs R_0..R_{N-1} (feature off) and
 * M <= N candidate runs C_0..C_{M-1} (feature on), where C_i was run on the
 * same inputs (seed, prompt, config) as R_i. Every pair is compared with the
 * compare engine (probe_compare_files, probe/compare.h), so each statistic is
 * one of probe/metrics.h's metrics: no metric is computed here.
 *
 *   feature drift   (R_i, C_i) for i < M
 *   floor           (R_0, R_i) for 1 <= i < N, unless references_differ
 *                   (the references were run on different inputs), and
 *                   (R_k, repeats[k]) for every repeat given
 *
 * Per component (the tensor's probe.component, else the first path element),
 * over every compared tensor of every pair (one sample per tensor per pair):
 * worst and mean of rel_l2, 1 - cosine, p99_abs, max_abs and
 * mismatch_fraction (at the stated atol/rtol). Thresholds, with headroom h:
 *   rel_l2_max = h * worst rel_l2          p99_abs_max = h * worst p99_abs
 *   max_abs_max = h * worst max_abs        cosine_min = max(-1, 1 - h * worst(1 - cosine))
 *   mismatch_fraction_max = min(1, h * worst mismatch_fraction), with atol/rtol as given.
 * The structure of the difference, per component and per tensor path (one
 * sample per tensor per pair): worst and mean of |channel z|
 * (|probe_channel_shift.z_max| of the compare result, tensors with a channel
 * axis only) and of |gain_z|; thresholds channel_z_max = h * worst |channel
 * z|, gain_z_max = h * worst |gain_z| over the feature pairs (not written when
 * not finite or not observed); and per path, for every channel k of the path's
 * channel axis, channel_z_max_by_channel[k] = ceil(max(h * worst |z_k|,
 * |mean z_k| + t_K * spread * sqrt(1 + 1/N))) over the N feature pairs (z_k of
 * probe_channel_z; null when never finite), spread the pooled standard deviation
 * of z_k about its channel's mean over all channels and pairs, t_K the z limit of
 * the systematic test over the K channels: a prediction band for a new seed's
 * z_k, since the feature's own per-channel z varies from input to input.
 * Instead of capture files, the statistics may come from records (opts.records:
 * JSON-lines files of "probe-record" version 1, written by probe's pytest
 * plugin, docs/calibration.md "Records from tests"): each record of the
 * calibrated feature is one sample of its component, kind "feature" a
 * feature sample and kind "floor" a floor sample; the statistics, thresholds
 * and T1 check are the same (records carry no tensor path: no per-path
 * structure entries).
 * T1 sits above the floor for a component when, with T1's thresholds from
 * probe_gate_parse("T1") (docs/gates.md "Determinism floor"):
 *   h * floor worst rel_l2 < T1 rel_l2_max (1e-2) and
 *   h * floor worst (1 - cosine) < 1 - T1 cosine_min (1e-4).
 * Held-out check (opts.held_out; capture files only): for every feature pair i,
 * the thresholds are computed again from the other feature pairs alone (same
 * headroom and rules), and pair i is compared under T2 with them, as
 * probe-compare --gate T2 would compare it. A pair that fails says the
 * calibration does not cover the feature's run-to-run variation: a new run of the
 * same feature would fail as that pair does. It is leave-one-out cross-validation
 * (Stone 1974), conservative by one pair: each check calibrates on M - 1 pairs,
 * the file on M.
 */
#ifndef PROBE_CALIBRATE_H
#define PROBE_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct probe_calibrate_opts {
    const char *feature;                 /* name of the calibrated feature; required, non-empty */
    double headroom;                     /* factor on the worst observed drift; finite, >= 1 */
    double atol, rtol;                   /* tolerance of mismatch_fraction; finite, >= 0 */
    const char *const *references;       /* R_0..R_{N-1}, N = nreferences >= 1 */
    size_t nreferences;
    const char *const *candidates;       /* C_0..C_{M-1}, 1 <= M <= N */
    size_t ncandidates;
    const char *const *repeats;          /* repeats[k]: a second run of references[k]; may be NULL */
    size_t nrepeats;                     /* <= nreferences */
    int references_differ;               /* 1: the references ran on different inputs, so only
                                            repeats give the floor */
    const char *const *known_components; /* NULL-terminated; NULL accepts any component */
    /* The component table's channel axes, as in probe_compare_opts (probe/compare.h), so
     * that the channel z is measured on the axis probe-compare uses; NULL / 0: the
     * layout rule. */
    char *const *axis_components;
    const int *axis_values, *axis_ranks;
    const struct probe_class_axis *class_axes;
    size_t n_class_axes;
    /* What the feature expects of the weights: "same" (NULL: the default) or "quantized"
     * (it changes the values the GEMMs read, e.g. FP8 weight storage). A feature pair whose
     * weight fingerprints differ at the same shapes is refused under "same", as
     * probe-compare refuses it; a floor pair's must always agree. Written into the file
     * as "weights", which probe-compare --gate T2 then applies. */
    const char *weights;
    /* 1: the feature skips calls (a step cache such as First Block Cache runs only the
     * first DiT block of a cached step), so a feature pair's candidate may lack tensors
     * of the reference; per component the fraction it lacks is a statistic
     * (skipped_fraction) with threshold skipped_fraction_max = min(1, h * worst). 0: a
     * missing tensor is an error. Floor pairs must always hold the same tensors. */
    int skips_calls;
    /* Records instead of capture files (references, candidates and repeats then empty):
     * the paths of JSON-lines files of "probe-record" version 1. Records of other features
     * are left out; atol/rtol are those the records' mismatch_fraction was measured at
     * when they give them (they must agree), else the options'. */
    const char *const *records;
    size_t nrecords;
    /* The held-out check: 0 with at least 3 feature pairs, -1 never, 1 with at least 2
     * (with fewer it is not run). Not run on records. */
    int held_out;
} probe_calibrate_opts;

/* One feature pair judged by T2 calibrated on the other feature pairs. */
typedef struct probe_calibrate_held_out {
    size_t pair;              /* i: references[i] vs candidates[i] */
    int pass;                 /* 1: passes (probe_compare_result.pass) */
    size_t tensors, failed;   /* compared tensors; those failing the gate */
    char first_failure[512];  /* tensor path of the first failure; "" when it passes or
                                 only the run fails */
    char reason[256];         /* that tensor's first reason, else the run's first; "" pass */
} probe_calibrate_held_out;

/* One statistic over n samples (a sample is one tensor of one pair). NaN
 * samples (p99_abs of an empty tensor) are left out; with none left, worst
 * and mean are NaN. */
typedef struct probe_calibrate_stat {
    double worst;   /* max (for 1 - cosine: the largest, i.e. the smallest cosine) */
    double mean;    /* arithmetic mean */
    size_t n;       /* samples taken */
} probe_calibrate_stat;

typedef struct probe_calibrate_drift {
    size_t pairs;   /* file pairs that had this component */
    size_t tensors; /* samples: tensors x pairs */
    probe_calibrate_stat rel_l2, one_minus_cosine, p99_abs, max_abs, mismatch_fraction;
    probe_calibrate_stat channel_z; /* |probe_channel_shift.z_max|: tensors with a channel axis */
    probe_calibrate_stat gain_z;    /* |probe_metrics.gain_z| */
    probe_calibrate_stat skipped_fraction; /* skips_calls: tensors of the component the
                                              candidate lacks / the reference's, per pair */
} probe_calibrate_drift;

typedef struct probe_calibrate_component {
    char name[128];
    probe_calibrate_drift feature;  /* candidate vs its reference */
    probe_calibrate_drift floor;    /* reference vs reference; floor.tensors = 0: not measured */
    /* thresholds written to the file (NaN: not written, e.g. p99 of empty tensors only) */
    double rel_l2_max, cosine_min, p99_abs_max, max_abs_max, mismatch_fraction_max;
    double channel_z_max, gain_z_max; /* h * feature worst |channel z|, |gain_z| */
    double skipped_fraction_max;      /* min(1, h * worst skipped fraction); NaN: none skipped */
    /* T1 check: h * floor worst, and T1's limits */
    double floor_rel_l2_x_headroom, floor_one_minus_cosine_x_headroom;
    double t1_rel_l2_max, t1_one_minus_cosine_max;
    int t1_above_floor;             /* 1 above, 0 not (also when the floor was not measured) */
} probe_calibrate_component;

/* The structure statistics of one tensor path (a dataset path such as
 * /dit.block/0002/out: the runs share the schedule, so every pair holds it). */
typedef struct probe_calibrate_path {
    char path[512];
    char component[128];
    size_t pairs, floor_pairs;          /* feature / floor pairs that held the path */
    probe_calibrate_stat channel_z, gain_z;             /* over the feature pairs */
    probe_calibrate_stat floor_channel_z, floor_gain_z; /* over the floor pairs */
    double channel_z_max, gain_z_max;   /* h * feature worst; NaN: not written */
    /* Per channel k < nchannels (tensors with a channel axis; NULL / 0 otherwise), over
     * the N_k feature pairs with a finite z_k: ceil(max(h * worst |z_k|, |mean z_k| +
     * channel_t * channel_z_spread * sqrt(1 + 1/N_k))); NaN where N_k = 0. gain_z_max
     * likewise: max(h * worst |gain_z|, |mean gain_z| + t_1 * gain_z_spread * sqrt(1 +
     * 1/N)), t_1 = probe_systematic_limit(1, ...). */
    double *channel_z_max_by_channel;
    uint64_t nchannels;
    double channel_z_spread; /* pooled standard deviation of z_k about its channel's mean,
                                over the channels and feature pairs, or the same over every
                                path of the component where that is larger or the path has
                                no degree of freedom (one pair held it); NaN: neither */
    double channel_t;        /* probe_systematic_limit(nchannels, PROBE_SYSTEMATIC_FALSE_ALARM) */
    double gain_z_spread;    /* pooled standard deviation of gain_z about each path's mean, over
                                the component's paths and feature pairs (NaN: none) */
} probe_calibrate_path;

typedef struct probe_calibrate_file {
    char path[1024];   /* as given */
    char role[16];     /* "reference", "candidate", "repeat" */
    int index;         /* i of R_i / C_i, k of repeats[k] */
    char *manifest;    /* probe.manifest JSON text, NULL if the file has none */
} probe_calibrate_file;

typedef struct probe_calibrate_result {
    char feature[256];
    double headroom, atol, rtol;
    char date[32];                        /* UTC, ISO 8601, when the result was computed */
    size_t npairs, nfloor_pairs;
    size_t ncomponents;
    probe_calibrate_component *components; /* in first-seen execution order */
    size_t npaths;
    probe_calibrate_path *paths;          /* paths of the feature pairs, first-seen order */
    size_t nfiles;
    probe_calibrate_file *files;          /* references, candidates, repeats in that order */
    int t1_above_floor;                   /* every component's t1_above_floor */
    char weights[16];                     /* "same" or "quantized", as the options said */
    char weights_line[768];               /* what differs in the first feature pair whose weights
                                             differ ("" none; probe/compare/weight_check.c) */
    char weights_rounding[32];            /* "quantized": the float8 rounding every feature pair's
                                             weights were proven to be (probe_rounding_name,
                                             written as "weights_rounding"); "" when a pair was
                                             not proven, or the weights are "same" */
    /* With records: npairs / nfloor_pairs count the feature / floor records used */
    int from_records;
    size_t nrecords_other;                /* records of other features, left out */
    char **archs;                         /* the records' distinct "arch" values */
    size_t narchs;
    size_t nheld_out;                     /* feature pairs checked held out; 0: not run */
    size_t held_out_failed;               /* those that fail */
    probe_calibrate_held_out *held_out;   /* in pair order */
} probe_calibrate_result;

/* Compare every pair and compute the statistics, thresholds and floor check.
 * Errors (no result): PROBE_EINVAL for bad options (no feature, headroom < 1,
 * M > N, more repeats than references, no floor pair at all) and for a tensor
 * whose component is not in known_components (the message names the file
 * and the component); any error of probe_compare_files (a file that cannot
 * be opened or read, the message names it); PROBE_EMISMATCH when a pair
 * cannot be calibrated on: a tensor missing on one side, a shape mismatch,
 * nothing compared, a NaN in the candidate or a non-finite metric (the
 * message names the pair and the tensor), or a feature pair whose candidate
 * is identical to its reference in every tensor (feature not active);
 * PROBE_ENOMEM. With records: PROBE_ENOTFOUND / PROBE_EIO for a file that
 * cannot be opened or read, PROBE_EFORMAT for a line that is not a valid
 * record (the message names FILE:LINE), PROBE_EINVAL for records mixed with
 * capture files, an unknown component, records whose atol/rtol differ, no
 * record of the feature; PROBE_EMISMATCH when every feature record has
 * max_abs 0 (feature not active). */
probe_status probe_calibrate_run(const probe_calibrate_opts *opts, probe_calibrate_result **out);
void probe_calibrate_result_free(probe_calibrate_result *r);

/* Write the calibration file (docs/calibration.md, version 1: the thresholds
 * per component; the statistics, floor and T1 check under each entry's
 * "observed"; the per-path structure thresholds under "structure"; files,
 * manifests, architectures under "evidence"). It loads
 * with probe_calibration_load(). PROBE_EIO if the stream fails, PROBE_ENOMEM. */
probe_status probe_calibrate_write_json(const probe_calibrate_result *r, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
