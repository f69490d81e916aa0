/* intercept/capture/scope.h - component scopes of interposed library calls: adapter calls and NVTX ranges. */
#ifndef PROBE_INTERCEPT_CAPTURE_SCOPE_H
#define PROBE_INTERCEPT_CAPTURE_SCOPE_H

struct shim_json;

#include <stdint.h>
#include "base/shim.h"

/* Counters kept per scope instance (shim_scope_next). */
enum { SHIM_COUNT_GEMM = 0, SHIM_COUNT_NCCL = 1, SHIM_COUNT_KINDS = 4 };

struct shim_scope {
    char component[SHIM_NAME_MAX]; /* "" outside any scope */
    int64_t call, step;            /* -1 unknown */
    int32_t cfg_branch;            /* -1 unknown */
    char parent[SHIM_PARENT_MAX];  /* the enclosing component call of an adapter scope, "" none */
    int64_t block;                 /* with parent: the block index (probe_scope_v1.block), else -1 */
    /* per kind, when PROBE_CAPTURE names `<family>.last` (shim_cfg.last_kinds):
     * the number of calls the component's previous completed instance made,
     * -1 while no instance has completed */
    int64_t last_n[SHIM_COUNT_KINDS];
};

/* Read PROBE_NVTX_SCOPES (constructor): COMPONENT=GLOB items, comma-
 * separated; unset: TensorRT-LLM VisualGen's ranges; "" or "0": none. A bad
 * spec: one `probe:` line and no NVTX range becomes a scope. */
void shim_scope_config(void);
/* The calling thread's innermost scope: a component call announced by the
 * adapter (probe_scope_enter_v1/exit_v1) or an NVTX range mapped to a
 * component. Returns 1 and fills out; 0 outside any (out->component "",
 * call/step/cfg_branch -1). */
int shim_scope_current(struct shim_scope *out);
/* Next index (0, 1, ...) of counter `kind` (SHIM_COUNT_*) inside the calling
 * thread's innermost scope instance; outside any scope a process-wide
 * counter per kind. -1 for a bad kind. */
int64_t shim_scope_next(int kind);
/* 1 when call k (of counter `kind`) of the scope instance sc may be the
 * instance's last such call, so a `<family>.last` item applies to it: k is
 * the previous completed instance's count - 1, or no instance of sc's
 * component has completed yet (the first instance: every k, docs/gemm.md
 * "Selection"). 0 outside any scope, for other k, or when no item names
 * `.last`. */
int shim_scope_may_be_last(const struct shim_scope *sc, int kind, int64_t k);
/* The components the adapter opened scopes for, in first-seen order,
 * ", "-separated into buf (truncated to cap - 1 bytes). */
void shim_scope_names(char *buf, size_t cap);
/* nvtx.c: a push/pop range named range_name opened on this thread. Returns
 * a token (!= 0) when it matches PROBE_NVTX_SCOPES and a scope was opened
 * (component from the item; call = that component's count of such ranges;
 * step = the name's trailing number, else -1), else 0. */
unsigned shim_scope_nvtx_enter(const char *range_name);
/* nvtx.c: the range that returned token closed (0: nothing to do). */
void shim_scope_nvtx_exit(unsigned token);
/* Append ,"nvtx_scopes":{spec, error, calls per component} and
 * ,"scopes":{component: adapter scopes opened} to the manifest. */
void shim_scope_json(struct shim_json *b);

#endif
