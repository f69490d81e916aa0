/* intercept/capture/stats.h - stats-only capture: a summary and a hash instead of the bytes. */
#ifndef PROBE_INTERCEPT_CAPTURE_STATS_H
#define PROBE_INTERCEPT_CAPTURE_STATS_H

struct shim_json;

#include <stddef.h>
#include "probe/capture.h"

/* Read PROBE_STATS_ONLY into shim_cfg.stats_only (constructor). */
void shim_stats_config(void);
/* Writer thread: write j's contiguous bytes (data, nbytes) as what the
 * configuration asks for: the tensor itself, or (stats-only) its summary
 * and hash. Returns the writer's status, as shim_libprobe_put. */
probe_status shim_stats_put(probe_writer *w, const probe_record *rec, const void *data,
                            size_t nbytes);
/* Append ,"stats_only":true and ,"capture_error":"..." to the manifest
 * being built, when they apply. */
void shim_stats_json(struct shim_json *b);

#endif
