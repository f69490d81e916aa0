/* intercept/capture/select.h - PROBE_CAPTURE and PROBE_STATS_ONLY_FOR: the
 * grammar of selection items (docs/intercept.md "Selection"), which tensors
 * an item selects, and the per-item counts of the manifest. */
#ifndef PROBE_INTERCEPT_CAPTURE_SELECT_H
#define PROBE_INTERCEPT_CAPTURE_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "base/shim.h"

struct shim_json;

/* Parse spec (PROBE_CAPTURE, "*" when unset) into shim_cfg.globs/sel/nglobs.
 * A bad spec sets shim_cfg.capture_error, prints one `probe:` line and
 * selects nothing. Constructor only. */
void shim_select_config(const char *spec);
/* 1 when an item of PROBE_CAPTURE selects the adapter tap at path with this
 * step, CFG branch and block index (-1 unknown); counts the item's hits. */
int shim_select_tap(const char *path, int64_t step, int64_t branch, int64_t block);
/* Selection of a tensor of an interposed library call (docs/gemm.md
 * "Selection"): 1 if an item of PROBE_CAPTURE whose glob contains the text
 * `family` ("gemm" or "nccl") matches path with its step/branch/block
 * selectors (block -1: not nested), else 0. The default "*" therefore never
 * selects library-call operands. An item naming `<family>.last` is matched,
 * only when may_be_last (shim_scope_may_be_last), against path with the
 * index of its last component's `<family>.<k>.` written `<family>.last.`. */
int shim_select_interposed(const char *path, int64_t step, int64_t branch, int64_t block,
                           const char *family, int may_be_last);

/* Parse spec (PROBE_STATS_ONLY_FOR; NULL or "" none), the same grammar: the
 * tensors an item selects are written as stats-only records. A bad spec
 * prints one `probe:` line and makes every tensor stats-only. Constructor only. */
void shim_select_stats_for_config(const char *spec);
/* 1 when an item of PROBE_STATS_ONLY_FOR selects the tensor at path with this
 * step, CFG branch and block index (-1 unknown). */
int shim_select_stats_for(const char *path, int64_t step, int64_t branch, int64_t block);
/* The number of items of PROBE_STATS_ONLY_FOR. */
int shim_select_stats_for_count(void);

/* Manifest section (at close): ,"capture_items":[{"item":TEXT,"matched":N},...]
 * when PROBE_CAPTURE was given, and one `probe:` line per item that matched
 * no tensor although this process evaluated selections of its kind (an item
 * naming `gemm` / `nccl`: that library's operands; any other: adapter taps).
 * Such an item is almost always a typo in a path or a @step= outside the
 * run's steps. */
void shim_select_items_json(struct shim_json *b);

#endif
