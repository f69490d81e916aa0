/* intercept/capture/file.h - the capture file of this process: its path
 * (PROBE_OUT, the rank's file, a per-process file), its claim, its lazy
 * open at the first tap, its close, and what a forked child does with it. */
#ifndef PROBE_INTERCEPT_CAPTURE_FILE_H
#define PROBE_INTERCEPT_CAPTURE_FILE_H

#include "probe/status.h"

struct shim_json;

/* Constructor: shim_cfg.out_path from PROBE_OUT `out` (made absolute), or,
 * when the environment names a rank R of a world larger than 1,
 * <stem>.rank<R><ext>, whose first process is that file's root. */
void shim_file_config(const char *out);

/* Claim the capture file at this process's first tap (idempotent): an
 * exclusive flock on an empty regular file; the claim state is in
 * base/shim.h (shim_claim_state). */
void shim_file_claim(void);
/* Why the claim was lost ("" if it was not). */
const char *shim_file_claim_lost_reason(void);
/* Open the capture file if not yet done (first caller does the work, others
 * wait). PROBE_OK; PROBE_ESTATE when another process holds the claim;
 * PROBE_EIO when capture is disabled (the one warning line was printed). */
probe_status shim_file_open(void);
/* Point this process at another capture file before it claimed one (0), -1
 * when too late; takes ownership of path on success (capture/procs.c). */
int shim_file_set_out_path(char *path);
/* When the claim is lost: take(), if set, may switch shim_cfg.out_path to
 * this process's own file (1: claim that one instead). Runs under the open
 * lock (capture/procs.c sets it). */
void shim_file_set_fallback(int (*take)(void));

/* At exit (life.c): open the file if the root must write it though nothing
 * was tapped (an index capture when no rank file is this process's); 1 when
 * the file is open. */
int shim_file_open_at_exit(void);
/* At exit, the writer thread stopped: write the final manifest, the lost
 * paths after a write error, and close the writer. */
void shim_file_close(void);

/* Fork, child side: 1 when the parent neither claimed nor opened a file. */
int shim_file_untouched(void);
/* The child of an untouched parent is a fresh process: it claims anew. */
void shim_file_fork_fresh(void);
/* Any other child: point the capture file's descriptors at /dev/null. */
void shim_file_fork_detach(void);

/* Manifest section: ,"rank"/"world_size" (when they came from a fallback
 * pair), ,"rank_source", and in an index capture (the root never tapped
 * and rank files <stem>.rank<R><ext> exist next to PROBE_OUT)
 * ,"ranks":[basenames sorted by rank]. */
void shim_file_ranks_json(struct shim_json *b);

#endif
