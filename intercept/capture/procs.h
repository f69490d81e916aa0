/* intercept/capture/procs.h - the processes of a run other than the file's owner: per-process files, early close, the missing-adapter line. */
#ifndef PROBE_INTERCEPT_CAPTURE_PROCS_H
#define PROBE_INTERCEPT_CAPTURE_PROCS_H

struct shim_json;


/* 1 when this process writes a per-process file (probe_tap_sidecar_v1). */
int shim_procs_sidecar(void);
/* The claim of the run's file was lost: switch shim_cfg.out_path to the
 * per-process file named by probe_tap_sidecar_if_taken_v1 (1), or 0 when
 * none was named or it was taken already. Runs under the open lock. */
int shim_procs_take_fallback(void);
/* A tap ABI function was called: the adapter (or another caller) is here. */
void shim_procs_abi_used(void);
/* Append ,"process":{...} (a per-process file) or ,"processes":[...] (the
 * per-process files next to this one) to the manifest being built. */
void shim_procs_json(struct shim_json *b);
/* At exit: the one line of a Python process that never loaded the adapter. */
void shim_procs_exit_check(void);

#endif
