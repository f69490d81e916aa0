/* intercept/capture/shard.h - PROBE_SHARD: which captured tensors are shards of a gathered tensor, and along which axis. */
#ifndef PROBE_INTERCEPT_CAPTURE_SHARD_H
#define PROBE_INTERCEPT_CAPTURE_SHARD_H

struct shim_json;

#include <stddef.h>
#include "probe/status.h"

struct shim_shard_item {
    char *glob; /* as given (a PROBE_CAPTURE-style glob) */
    int axis;   /* 0..PROBE_MAX_RANK-1 */
};
/* Parse PROBE_SHARD's grammar (shard.c): GLOB=AXIS items joined by ','.
 * PROBE_OK with a malloc'd array (NULL, 0 for a blank spec); PROBE_EINVAL
 * naming the bad item; PROBE_ENOMEM. */
probe_status shim_shard_parse(const char *spec, struct shim_shard_item **out, size_t *nout);
/* Read PROBE_SHARD (constructor); a bad spec: one `probe:` line, no key. */
void shim_shard_config(void);
/* Append ,"shard":[{"glob":G,"axis":A},...] (or ,"shard_error":"...") when set. */
void shim_shard_json(struct shim_json *b);

#endif
