/* probe/compare/experiment.h (private to libprobe) - is the pair the same experiment?
 * Root-input check, injection status and the isolated run's provenance for the compare engine
 * (probe/compare/compare.c); see docs/inject.md. */
#ifndef PROBE_EXPERIMENT_H
#define PROBE_EXPERIMENT_H

#include "probe/compare.h"

/* Compare the root inputs of rf and cf (tensors of the root components,
 * opts->root_components or the built-in list; the manifests' "scheduler"
 * values) and fill res->roots, res->roots_checked, res->same_experiment.
 * A root that differs and matches no opts->allow_root_diff glob makes
 * same_experiment 0 (the caller fails the run). Reads tensor bytes only when
 * a side has no probe.hash. PROBE_ENOMEM, or a read error naming the file. */
probe_status probe_experiment_roots(probe_compare_result *res, probe_file *rf, probe_file *cf,
                                    const probe_compare_opts *opts);

/* 1 when the manifest says the run was started with injection and the
 * injection failed or did not finish ("inject": {"status" != "ok"}); the
 * error text (or the status) goes to why. 0 when the run was not injected
 * or the injection completed. */
int probe_experiment_inject_failed(const char *manifest, char *why, size_t cap);

/* How the run ended, from the manifest's "run_end" (probe-run records it
 * after the command exits; docs/file-format.md): 1 when it is present and
 * its "capture_complete" is not true, with how (e.g. "killed by signal
 * SIGSEGV; its writer did not close the capture") in how; 0 when the
 * capture completed or the manifest has no run_end (older captures, files
 * not made by probe-run). *run_end_json (when run_end_json is not NULL):
 * the run_end value as malloc'd compact JSON text, or NULL when absent. */
int probe_experiment_run_incomplete(const char *manifest, char *how, size_t cap,
                                    char **run_end_json);

/* Check that the isolated run completed (its run_end, when present) and
 * that its manifest records an injection that completed and took each
 * injected tensor from this reference (its "reference_hash" equals the
 * reference's probe.hash at that path). 0 when it did; otherwise 1 with the
 * reason in why. */
int probe_experiment_check_isolated(const char *iso_manifest, probe_file *rf, char *why,
                                    size_t cap);

/* 1 when the manifest records a replay (probe-run --replay): an injected tensor is an
 * input (slot "in.*") of a component that is not a root component (roots: NULL-terminated
 * names, NULL for the built-in list); else 0. */
int probe_experiment_is_replay(const char *manifest, const char *const *roots);

#endif
