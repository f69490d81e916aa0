/* probe/compare.h - the compare engine behind probe-compare.
 *
 * Matches the tensors of a reference capture (feature off) and a candidate
 * capture (feature on) by full HDF5 dataset path, computes the metrics of
 * probe/metrics.h for every matched pair in fp64, applies a gate
 * (probe/gate.h) and finds the first failure in execution order. Definitions
 * and the JSON layout are docs/metrics.md's and docs/compare-json.md's.
 */
#ifndef PROBE_COMPARE_H
#define PROBE_COMPARE_H

#include <stdio.h>
#include "probe/capture.h"
#include "probe/calibration_file.h"
#include "probe/gate.h"
#include "probe/metrics.h"
#include "probe/status.h"
#include "probe/verdict.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct probe_compare_opts {
    probe_gate gate;                        /* from probe_gate_parse(); T2 needs calibration */
    const probe_calibration *calibration;   /* T2 thresholds; NULL otherwise */
    int atol_set, rtol_set;                 /* override the gate's element-wise tolerance */
    double atol, rtol;
    const char *const *only;                /* NULL-terminated fnmatch globs on paths; NULL = every tensor */
    /* Zero in any field below is the default behaviour. */
    int expect_identical;   /* 1: the pair must be bit-identical (determinism floor, reference
                               vs reference): identical passes, any difference fails with
                               "not identical". 0: a candidate identical to the reference in
                               every compared tensor fails as "feature not active". */
    /* Called after each compared or missing tensor of the reference (NULL: none):
     * done/total tensors selected in the reference, and the bytes of reference
     * data (elements x element size) behind them. Never called from another thread. */
    void (*progress)(void *ctx, size_t done, size_t total, uint64_t bytes_done,
                     uint64_t bytes_total);
    void *progress_ctx;
    int want_stats;         /* 1: fill each tensor's `stats` (histogram, channel shift, spatial
                               map) for the HTML report; 0: leave them empty (saves a pass
                               over the data and the maps' memory) */
    int threads;            /* metric worker threads; 0: the online CPUs, at most 8 (max 16) */
    /* Channel axis of the per-channel mean shift, first rule that applies:
     * channel_axis_set: channel_axis for every tensor of rank > the axis
     * (negative counts from the last axis); else the component table's axis
     * (axis_components[i] / axis_values[i] for tensors of rank axis_ranks[i],
     * from probe_component_axes_load; NULL: none), where the first of the
     * row's per-class axes (class_axes, n_class_axes: probe_component_class_axes_load;
     * NULL: none) whose component, class glob (against probe.class) and rank
     * match the tensor comes before the row's axis; else the layout rule:
     * axis 1 for rank 4 and 5 ([B, C, H, W], [B, C, F, H, W]), the last axis
     * for rank 2 and 3 ([T, D], [B, T, D]). No shift above PROBE_CHANNELS_MAX
     * channels. */
    int channel_axis_set, channel_axis;
    char *const *axis_components;
    const int *axis_values, *axis_ranks;
    int use_cuda;           /* 1: compute on CUDA device cuda_device (libprobe_cuda.so) */
    int cuda_device;
    /* Root-input check (docs/inject.md). 1: the root inputs of both runs (tensors of the
       root components, and the manifest's "scheduler" configuration) must be equal, else
       the run fails as "not the same experiment"; 0: not checked (library default). */
    int check_roots;
    const char *const *root_components; /* NULL-terminated component names; NULL: the
                                           built-in "latents.init", "timesteps", "prompt_embeds" */
    const char *const *allow_root_diff; /* NULL-terminated fnmatch globs: a root input whose
                                           path (or component name; "scheduler" for the
                                           manifest's scheduler configuration) matches one may
                                           differ (the feature is expected to change it) */
    /* Isolation (docs/inject.md): the candidate run again under probe-run --replay REF
       (every component fed the reference's recorded inputs). NULL: none. Each compared
       tensor gets the metrics of reference vs isolated run and the amplification. */
    const char *isolated;
    /* Oracle (docs/gates.md "Verdicts"): a run of the same experiment in higher precision
       (the reference's weights and root inputs, e.g. float32 for a bfloat16 reference).
       NULL: none. Each compared tensor the oracle holds with the reference's shape gets
       the error of the reference and of the candidate against it, and the tensor's
       verdict becomes the oracle verdict (probe_oracle_verdict): no less accurate than
       the reference. oracle_headroom: the ratio's headroom (<= 0: PROBE_ORACLE_HEADROOM). */
    const char *oracle;
    double oracle_headroom;
    /* The table's per-class channel axes (see channel_axis above). */
    const struct probe_class_axis *class_axes;
    size_t n_class_axes;
    int keep_channel_z;     /* 1: keep every channel's z in each tensor's channel_z (what
                               probe-calibrate records per channel); 0: only where a T2
                               gate has per-channel thresholds, and freed after the verdict */
} probe_compare_opts;

#define PROBE_COMPARE_MAX_REASONS 8

/* What the HTML report shows per tensor beyond the metrics: the error
 * histogram, the per-channel mean shift and a spatial map of the error.
 * Computed by probe_tensor_stats_compute() from the fp64 arrays while they
 * are in memory (probe/compare/tensor_stats.c). d = c - r over the indices finite on
 * both sides; non-finite indices are only counted (hist_nonfinite). */
#define PROBE_STATS_HIST_BINS 32      /* log-spaced bins of |d| > 0 */
#define PROBE_STATS_MAX_CHANNELS 4096 /* more channels: no channel shift */
#define PROBE_STATS_MAP_MAX 64        /* spatial map at most 64 x 64 cells per frame */
#define PROBE_STATS_MAP_MAX_FRAMES 32 /* more frames are averaged in groups */
typedef struct probe_tensor_stats {
    int computed;               /* 1 when the fields below are valid */
    /* Histogram of |d|: hist_zero counts |d| = 0, hist_nonfinite the indices
     * not finite on one side; every other index falls in bin
     * k = floor((log10|d| - hist_log10_lo) / (hist_log10_hi - hist_log10_lo) * BINS),
     * clamped to [0, BINS-1]; hist_log10_lo = floor(log10 min|d|>0),
     * hist_log10_hi = ceil(log10 max|d|) (> lo). The counts sum to n. */
    uint64_t hist_zero, hist_nonfinite;
    int hist_log10_lo, hist_log10_hi; /* both 0 when no |d| > 0 */
    uint64_t hist[PROBE_STATS_HIST_BINS];
    /* Per-channel mean shift: channel_shift[k] = mean of d over the finite
     * indices of channel k (NaN if none). Channel axis: 1 for rank 4/5
     * ([B,C,H,W], [B,C,F,H,W]), the last axis for rank 2/3 ([T,D], [B,T,D]);
     * nchannels = 0 for other ranks or more than PROBE_STATS_MAX_CHANNELS. */
    int channel_axis, nchannels;
    double *channel_shift;      /* malloc'd, nchannels entries */
    /* Spatial map (rank 4 [B,C,H,W]: 1 frame; rank 5 [B,C,F,H,W]: F frames):
     * map[(f*map_h + y)*map_w + x] = mean |d| over B, C and the pixels of
     * cell (y, x): rows [y*H/map_h, (y+1)*H/map_h), likewise columns, and the
     * frames of group f (frames [f*F/map_frames, (f+1)*F/map_frames)); NaN
     * if the cell has no finite index. map_h = min(H, 64), map_w = min(W, 64),
     * map_frames = min(F, 32); all 0 and map NULL for other ranks. */
    int map_frames, map_h, map_w;
    int64_t frames, height, width;  /* F (1 for rank 4), H, W of the tensor */
    double *map;                /* malloc'd */
} probe_tensor_stats;

/* Fill st from n reference/candidate element pairs of a row-major tensor of
 * the given rank and shape (prod(shape) = n). The histogram is computed for
 * every rank, the channel shift and the map as stated above. Frees nothing:
 * st is overwritten (call probe_tensor_stats_free first to reuse one).
 * Errors: PROBE_EINVAL (NULL pointer with n > 0, rank outside [0, 16],
 * prod(shape) != n), PROBE_ENOMEM (st holds nothing allocated then). */
probe_status probe_tensor_stats_compute(const double *ref, const double *cand, size_t n, int rank,
                                        const int64_t *shape, probe_tensor_stats *st);
/* The histogram and the spatial map of a pair given as a source (in
 * bounded memory: two sequential passes in chunks); the channel shift is
 * left empty (the compare engine fills it from the metrics of the tensor's
 * channel axis). Errors as probe_tensor_stats_compute, plus what src->read
 * returns. */
probe_status probe_tensor_stats_compute_source(const probe_pair_source *src, int rank,
                                               const int64_t *shape, probe_tensor_stats *st);
/* The layout rule's channel axis: 1 for rank 4 and 5, rank - 1 for rank 2
 * and 3, -1 otherwise. */
int probe_channel_axis_by_layout(int rank);
/* Free what st holds and zero it. st may be NULL. */
void probe_tensor_stats_free(probe_tensor_stats *st);

typedef struct probe_tensor_result {
    probe_tensor_info ref;      /* reference side (shape, dtype, component, seq, ...) */
    probe_dtype dtype_cand;     /* candidate's logical element type */
    int64_t shape_cand[PROBE_MAX_RANK];
    int rank_cand;
    int compared;               /* 1 if metrics were computed (shapes matched, both readable) */
    probe_metrics m;            /* valid when compared */
    int64_t max_abs_index[PROBE_MAX_RANK]; /* m.max_abs_offset as a row-major index of ref.shape */
    probe_gate gate;            /* the gate applied to this tensor (T2: per component/path) */
    probe_gate_verdict verdict; /* pass/fail and reasons (also "shape mismatch ...") */
    probe_tensor_stats stats;   /* histogram, channel shift, spatial map; freed
                                   by probe_compare_result_free */
    int channel_axis;           /* axis of `shift` (>= 0), -1 when none was computed */
    const char *channel_axis_from; /* "option", "table" or "layout"; NULL when none */
    probe_channel_shift shift;  /* per-channel mean shift (shift.count 0: none) */
    double *channel_z;          /* opts->keep_channel_z: shift.count entries, every channel's z
                                   (probe_channel_z; NaN where n_k < 2); else NULL. Freed with
                                   the result */
    /* isolation, when opts->isolated is set and the isolated run holds this path
     * with the reference's shape: m_isolated = metrics of reference vs isolated run (the
     * error this component introduces itself); amplification = m.rel_l2 / m_isolated.rel_l2
     * (as run over isolated), NaN when either is not finite or the isolated one is 0. */
    int has_isolated;
    probe_metrics m_isolated;
    double amplification;
    /* stats-only capture (docs/compare-json.md "Stats-only pairs"): either side
     * is a stats-only record. Both summaries are filled (a full side's is computed from
     * its elements). When the two sides have the same dtype, shape and probe.hash the
     * pair is identical: compared = 1 and m holds the exact metrics of identical
     * tensors (rel_l2 0, cosine 1, max/p99/mean 0). Otherwise compared = 0 (the
     * element-wise metrics need the tensors) and the verdict fails, with
     * rel_l2_lower_bound = | ||c|| - ||r|| | / ||r|| (triangle inequality, ||.||
     * = sqrt(sum_sq)): +inf when ||r|| = 0 < ||c||, 0 when both are 0, NaN when either
     * side holds a NaN or an infinity (the contract's norms leave out indices that are
     * not finite on both sides, which the summaries cannot locate); and mean_shift =
     * sum_c / n_finite_c - sum_r / n_finite_r (NaN if a side has no finite element). */
    int stats_only;
    probe_summary summary_ref, summary_cand;
    double rel_l2_lower_bound;
    double mean_shift;
    /* rank sets (probe_compare_sets, docs/nccl.md "Comparing rank sets").
     * rank_tag: the rank when the two rank sets are compared rank by rank, else -1.
     * ranks: how many rank files the (candidate's, else the reference's) logical tensor
     * was taken from (0: a plain file; a joined tensor: W); shard_axis: the axis its
     * pieces were joined along, -1 when not joined. replica_mismatch_ranks: the ranks
     * whose copy of a replicated tensor differs from rank 0's (malloc'd, freed with the
     * result); ranks_present: the ranks that hold a tensor that only some ranks hold
     * (malloc'd; 0 entries when every rank holds it). */
    int rank_tag;
    int ranks;
    int shard_axis;
    int nreplica_mismatch;
    int *replica_mismatch_ranks;
    int nranks_present;
    int *ranks_present;
    /* The verdict of the gate alone, exactly as docs/gates.md defines it. `verdict` above
     * is the tensor's headline verdict: the gate's plus the systematic test (T1 and
     * T1-relaxed; not T2, not --expect-identical), or, with an oracle, the oracle
     * verdict plus the failures every gate has (NaN, infinity mismatch, shape). */
    probe_gate_verdict gate_verdict;
    probe_systematic sys;       /* the systematic test of the pair (sys.computed 0: none) */
    int has_oracle;             /* the oracle holds this path with the reference's shape, and
                                   not the reference's very bytes */
    int oracle_same;            /* the oracle holds the reference's very bytes (same element
                                   type): it computed this tensor as the reference did, so it
                                   cannot judge it; the gate and the systematic test do */
    probe_metrics m_oracle_ref, m_oracle_cand; /* oracle as reference side: (o, r), (o, c) */
    probe_oracle_verdict oracle;
    /* With an oracle and --isolated, for outputs: the isolated output (the candidate's
     * component on the reference's inputs) against the oracle, read as `oracle` is;
     * attribution then decides "introduced" by it instead of by the gate. */
    int has_oracle_isolated;
    probe_metrics m_oracle_isolated;   /* (o, isolated) */
    probe_oracle_verdict oracle_isolated;
    /* The inputs of the isolated run (docs/inject.md "Replay and isolation"):
     * for an output tensor ("out*" slot) with has_isolated, the isolated run's inputs of the
     * same call (the datasets "in.*" of /<component>/<call>/ in both the reference and the
     * isolated run) compared with the reference's. isolated_inputs_compared: how many;
     * isolated_inputs_converted: how many of them are not the reference's bytes in the
     * reference's dtype (probe-run --replay --convert converted them: the isolated error
     * then includes the rounding of the inputs); isolated_inputs_rel_l2: the largest
     * rel_l2 of those against the reference (NaN when none is converted or it is not
     * finite), isolated_inputs_worst: that input's slot ("" when none). */
    int isolated_inputs_compared;
    int isolated_inputs_converted;
    double isolated_inputs_rel_l2;
    char isolated_inputs_worst[128];
    /* Identity (docs/compare-json.md "Identity: class and module path"):
     * cand_path, the candidate path this reference path was paired with when the calls of
     * its component were paired by module path and the two differ ("" otherwise);
     * class_cand and module_cand, the candidate call's probe.class and probe.module
     * ("" when absent; the reference's are ref.class_name and ref.module);
     * class_mismatch: both classes are known and differ. */
    char cand_path[512];
    char class_cand[256];
    char module_cand[256];
    int class_mismatch;
    /* CFG split pair (docs/compare-json.md "CFG-split pairs"): the candidate
     * batched both CFG branches into one dit.step call (manifest "cfg_batch") and the
     * reference made one call per branch. cfg_half: which half along axis 0 of the
     * candidate's tensor cfg_candidate was compared with this reference tensor (0 or 1;
     * -1, and cfg_candidate "": not a split pair, matched by path); cfg_branch_name: that half's
     * branch, "cond" or "uncond". A candidate tensor of the batched call whose axis 0 is
     * not twice the reference's is compared whole. */
    int cfg_half;
    char cfg_candidate[512];
    char cfg_branch_name[8];
    /* no_thresholds: 1 under T2 when the calibration holds no thresholds for this
     * tensor (neither its component nor its path): the verdict fails with the reason
     * "no T2 thresholds ...", whatever the metrics. Attribution (probe_introduction)
     * does not count such a tensor as a failure when the two sides are identical, and
     * names the reason when it does. 0 otherwise. */
    int no_thresholds;
} probe_tensor_result;

/* A collective output that must be equal on every rank of one run
 * (the "out" of all_gather, all_reduce, broadcast) and is not. */
typedef struct probe_collective_divergence {
    char side[16];          /* "reference" or "candidate" */
    char path[512];
    int nranks;             /* ranks that differ from rank 0 (rank 0 when it is the odd one) */
    int ranks[8];           /* the first 8 of them */
} probe_collective_divergence;

/* One root input of the root-input check: a tensor of a root component, or the
 * manifest's scheduler configuration (path "manifest:scheduler", component "scheduler"). */
typedef struct probe_root_input {
    char path[512];
    char component[128];
    int in_reference, in_candidate;     /* present on each side */
    char hash_reference[17], hash_candidate[17]; /* probe.hash ("" if absent or not a tensor) */
    int same;                           /* equal dtype, shape and bytes (config: equal JSON) */
    int allowed;                        /* differs, but --allow-root-diff matches it */
    char why[160];                      /* how it differs ("" if same; for a converted one
                                           "converted from the reference (A -> B)") */
    int converted;                      /* same because the candidate holds exactly
                                           the reference's values converted to its dtype by
                                           probe-run --inject --convert (its manifest records
                                           the conversion from this reference) */
    int incomplete;                     /* missing on a side whose capture is incomplete
                                           (probe_compare_result.incomplete_*): not known to
                                           differ, so it does not make the runs "not the same
                                           experiment" */
} probe_root_input;

typedef struct probe_compare_skip {
    char path[512];
    char side[16];              /* "reference" or "candidate" */
    char reason[256];
} probe_compare_skip;

typedef struct probe_compare_result {
    char reference[1024], candidate[1024];  /* file names as given */
    probe_gate gate;                        /* the gate asked for (with overrides) */
    size_t ntensors;
    probe_tensor_result *tensors;           /* execution order of the reference (path order if it has none) */
    size_t nmissing_cand, nmissing_ref;
    char (*missing_in_candidate)[512];      /* in reference order */
    char (*missing_in_reference)[512];      /* in candidate order */
    size_t nskipped;
    probe_compare_skip *skipped;            /* captures skipped at run time (probe.skips) */
    /* T2 whose calibration says the feature skips calls of a component
     * (skipped_fraction_max > 0): reference tensors of it the candidate lacks, which are
     * then not in missing_in_candidate; the run fails when a component's lacking
     * fraction is above its skipped_fraction_max (a run reason names it). */
    size_t nskipped_by_feature;
    char (*skipped_by_feature)[512];        /* in reference order */
    int pass;                               /* every matched tensor passes and nothing is missing */
    long first_failure;                     /* index into tensors, -1 if none */
    char first_failure_path[512];           /* "" if none; may name a tensor missing in the candidate */
    int feature_active;                     /* 1 if any matched tensor is not identical */
    int nothing_compared;                   /* no tensor matched (empty captures, a glob that
                                               selects nothing): the result fails, never a vacuous pass */
    size_t ignored_ref, ignored_cand;       /* non-numeric datasets (strings, compound, complex, ...) */
    int expect_identical;                   /* opts->expect_identical */
    int feature_not_active;                 /* the candidate equals the reference in every compared
                                               tensor, nothing is missing in either file, neither
                                               capture is incomplete, and identity was not
                                               expected: the run fails */
    int nreasons;                           /* run-level reasons the verdict is "fail" beyond the
                                               per-tensor ones ("incomplete capture: ...",
                                               "feature not active: ...", "not identical: ...",
                                               "nothing compared: ...", ...) */
    char reasons[PROBE_COMPARE_MAX_REASONS][256];
    /* the run manifests (probe.manifest JSON text, NULL if absent), shown side
     * by side by the CLI, the JSON ("manifests") and the HTML report. */
    char *manifest_reference, *manifest_candidate;
    /* root-input check (opts->check_roots). */
    int roots_checked;                  /* 1 when the check ran */
    int same_experiment;                /* 1 unless a root input differs and is not allowed */
    size_t nroots;
    probe_root_input *roots;            /* reference order, then candidate-only ones, then the
                                           scheduler configuration */
    /* injection status of each side (manifest "inject"): 1 when that run was
     * started with --inject/--replay and its injection failed or did not finish (the run
     * then fails: a partial injection is never compared as if complete). */
    int inject_failed_reference, inject_failed_candidate;
    /* isolation (opts->isolated). */
    char isolated[1024];                /* "" when none */
    char *manifest_isolated;
    size_t nisolated;                   /* tensors with has_isolated */
    /* rank sets: [0] reference, [1] candidate. world: 0 for a plain file, W
     * for W per-rank files; files: their paths by rank (world entries); index: the
     * index file they were found from ("" if given one by one). per_rank: both are
     * rank sets of the same W and were compared rank r against rank r. */
    int world[2];
    char **files[2];
    char index[2][1024];
    int per_rank;
    /* collectives_left_out[side][r]: collective operands of rank r that have no
     * counterpart (the other side is not a rank set of the same world size): not
     * compared and not counted as missing (NULL when world is 0). */
    uint64_t *collectives_left_out[2];
    size_t ndivergent;
    probe_collective_divergence *divergent;
    /* The headline rule of the verdict: PROBE_HEADLINE_GATE (the gate alone: T2 or
     * --expect-identical), PROBE_HEADLINE_SYSTEMATIC (the gate and the systematic test),
     * PROBE_HEADLINE_ORACLE (the oracle verdict). gate_pass: every compared tensor passes
     * the gate alone (nothing else is counted in it). */
    int headline;
    int gate_pass;
    /* Oracle (opts->oracle). */
    char oracle[1024];                  /* "" when none */
    char *manifest_oracle;
    size_t noracle;                     /* tensors with has_oracle */
    size_t noracle_missing;             /* compared tensors the oracle does not hold */
    size_t noracle_same;                /* tensors where the oracle holds the reference's bytes */
    int incomplete_oracle;              /* the oracle's run_end says its run did not complete */
    /* Attribution (probe/verdict.h probe_attribute): the component calls in execution
     * order with what each did to the difference, and where it was introduced. */
    size_t ncalls;
    probe_call_verdict *calls;
    probe_introduction introduced;
    /* How each run ended (the manifest key "run_end" that probe-run records
     * after the command exits; docs/file-format.md): incomplete_*: 1 when that run's
     * run_end says the capture did not complete (the command exited with a nonzero
     * status or was killed by a signal, or its writer did not close the file); the
     * run then fails with the run-level reason "incomplete capture: ...". 0 when
     * complete or when the file has no run_end (older captures, files made by h5py).
     * run_end_*: the run_end object as JSON text (of the first incomplete file of a rank
     * set, else of its first file), NULL when absent. */
    int incomplete_reference, incomplete_candidate;
    char *run_end_reference, *run_end_candidate, *run_end_isolated;
    /* With opts->isolated: 1 when the isolated run is a complete replay of
     * the reference (its injection completed from this reference, and its run_end, if
     * any, says it completed); only then are the tensors' isolated metrics computed.
     * 0 without --isolated or when it is not (a run-level reason says why). */
    int isolated_complete;
    /* Identity: calls_by_module, the reference calls paired with a candidate
     * call of another index because their component's calls were paired by module path
     * (probe/compare/identity.h), calls_unpaired_by_module, those whose module has no counterpart
     * call, by_module_component the first such component ("" none); class_mismatches, the
     * compared tensors whose two calls have different known classes, and
     * first_class_mismatch the first of them ("" none). Neither fails the run by itself. */
    size_t calls_by_module, calls_unpaired_by_module;
    char by_module_component[128];
    int by_nesting;          /* 1: by_module_component's calls were paired by (parent call,
                                block index), a feature that skips nested calls; 0: by
                                module path */
    size_t class_mismatches;
    char first_class_mismatch[512];
    /* The calibration file T2 took its thresholds from (probe_calibration_path of
     * opts->calibration), "" when none was given. */
    char calibration[1024];
} probe_compare_result;

#define PROBE_HEADLINE_GATE 0
#define PROBE_HEADLINE_SYSTEMATIC 1
#define PROBE_HEADLINE_ORACLE 2

/* The lower bound on rel_l2 that two summaries prove (see
 * probe_tensor_result.rel_l2_lower_bound for the definition and the NaN /
 * infinity cases). Source: the triangle inequality,
 * ||c - r|| >= | ||c|| - ||r|| |. Rounding: the norms come from fp64 sums
 * in the tree order (docs/file-format.md "Tree order"), so the value is
 * exact up to a relative error of about (128 + 5 * levels) units of 2^-53. */
double probe_summary_rel_l2_lower_bound(const probe_summary *ref, const probe_summary *cand);

/* Compare two capture files. Errors (no result is returned): a file that
 * cannot be opened or read (PROBE_ENOTFOUND / PROBE_EFORMAT / PROBE_EIO, the
 * message names the file), PROBE_ENOMEM, PROBE_EINVAL for bad options. A tensor
 * pair that cannot be compared (shape mismatch) is not an error: it fails in
 * the result with a reason. */
probe_status probe_compare_files(const char *reference, const char *candidate,
                                 const probe_compare_opts *opts, probe_compare_result **out);
void probe_compare_result_free(probe_compare_result *r);

/* Compare two captures each given as one file, an index file of a per-rank
 * run, or nref/ncand per-rank files (probe/rankset.h; docs/nccl.md
 * "Comparing rank sets"): a rank set against a plain file is joined (sharded
 * tensors reassembled along the manifest's "shard" axes, replicated ones
 * checked for identical copies, collective operands listed as unmatched);
 * two rank sets of the same world size are compared rank by rank; of
 * different sizes, both are joined. With one file on each side that is not an
 * index, exactly probe_compare_files. Errors as probe_compare_files, and
 * PROBE_EINVAL for a bad rank set (a file without rank/world_size, a rank
 * twice or missing, world sizes that differ; the message names the file),
 * or --isolated with a reference that is a rank set. */
probe_status probe_compare_sets(const char *const *reference, size_t nref,
                                const char *const *candidate, size_t ncand,
                                const probe_compare_opts *opts, probe_compare_result **out);

/* Fill r->calls, r->ncalls and r->introduced from r's tensors (probe/verdict.h
 * "attribution"): group the compared tensors into component calls, give each call its
 * status, find nested calls and the place the difference was introduced. Tensors without
 * a call index (files not written by probe) take no part. Called by probe_compare_sets;
 * may be called again (it replaces what is there). PROBE_ENOMEM. */
probe_status probe_attribute(probe_compare_result *r);

/* Write the result as probe-compare's JSON version 1 (docs/compare-json.md).
 * PROBE_EIO if the stream fails. */
probe_status probe_compare_write_json(const probe_compare_result *r, FILE *f);

/* Write the result as JUnit XML: one <testsuite name="probe-compare">, one
 * <testcase classname="COMPONENT" name="PATH"> per compared tensor (a
 * <failure message="first reason"> with every reason and the metrics as text
 * when it fails), one failing test case per tensor missing in either file,
 * one <skipped/> test case per capture skipped at run time, and a failing
 * test case classname="probe-compare" name="verdict" when the run fails for a
 * run-level reason (r->reasons). Text is XML-escaped; bytes that XML 1.0
 * cannot carry are written as '?'. PROBE_EIO if the stream fails. */
probe_status probe_compare_write_junit(const probe_compare_result *r, FILE *f);

/* Write a self-contained HTML report (docs/report.md): no network; the JSON
 * of probe_compare_write_json inline in <script id="probe-data">, the
 * per-tensor stats (histogram, channel shift, spatial map; 6 significant
 * digits) in <script id="probe-stats">; a script renders the verdict, the
 * step x component heatmap of rel_l2 and the selected tensor's charts.
 * PROBE_EIO if the stream fails, PROBE_ENOMEM. */
probe_status probe_compare_write_html(const probe_compare_result *r, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
