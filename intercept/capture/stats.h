/* intercept/capture/stats.h - stats-only capture: a summary and a hash instead of the bytes. */
#ifndef PROBE_INTERCEPT_CAPTURE_STATS_H
#define PROBE_INTERCEPT_CAPTURE_STATS_H

struct shim_json;

#include <stddef.h>
#include <stdint.h>
#include "probe/capture.h"

/* Read PROBE_STATS_ONLY into shim_cfg.stats_only (constructor). */
void shim_stats_config(void);
/* 1 when the tensor at path (step, CFG branch, block index or -1) is to be
 * a stats-only record (PROBE_STATS_ONLY, or PROBE_STATS_ONLY_FOR selects it). */
int shim_stats_selected(const char *path, int64_t step, int32_t cfg_branch, int64_t block);
/* 1 when libprobe.so can write a record with only the tree hash (a device
 * summary's); call after the writer is open. */
int shim_stats_on_device(void);
/* Writer thread: the stats-only record of a device summary (tree hash only). */
probe_status shim_stats_put_device(probe_writer *w, const probe_record *rec,
                                   const probe_summary *sum, uint64_t tree_hash);
/* Writer thread: write j's contiguous bytes (data, nbytes) as what the
 * configuration asks for: the tensor itself, or (stats-only) its summary
 * and hash. Returns the writer's status, as shim_libprobe_put. */
probe_status shim_stats_put(probe_writer *w, const probe_record *rec, const void *data,
                            size_t nbytes);
/* Append ,"stats_only":true and ,"capture_error":"..." to the manifest
 * being built, when they apply. */
void shim_stats_json(struct shim_json *b);

#endif
