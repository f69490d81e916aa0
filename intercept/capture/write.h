/* intercept/capture/write.h - what the writer thread does with a tensor job:
 * write its bytes (or stats-only summary), record a skip, and keep the list
 * of tensors lost after a write error. */
#ifndef PROBE_INTERCEPT_CAPTURE_WRITE_H
#define PROBE_INTERCEPT_CAPTURE_WRITE_H

#include <stddef.h>

#include "capture/queue.h"
#include "probe/capture.h"

struct shim_json;

/* The work callbacks of a tensor job (struct shim_job's work.run and
 * work.done): write it or record its skip; free it. */
void shim_write_run(struct shim_work *w);
void shim_write_done(struct shim_work *w);
/* Writer thread (shim_queue_barrier): flush the file. PROBE_OK, PROBE_EIO
 * once capture is disabled (a failing flush disables it). */
probe_status shim_write_flush(void);

/* Tensors this process tapped that never reach the file: a tensor whose
 * write failed (refused 2), jobs still queued when a write error disabled
 * capture (0), and taps refused after that (1). Recorded in the manifest's
 * "lost" key and, the first SHIM_WRITE_LOST_MAX paths, in probe.skips at
 * close. */
#define SHIM_WRITE_LOST_MAX 1000
#define SHIM_WRITE_LOST_REASON "lost: tapped, but not written: a write error disabled capture"
void shim_write_lost_note(const char *path, int refused);
/* ,"lost":{...} when a tensor was lost (a manifest section). */
void shim_write_lost_json(struct shim_json *b);
/* Append the lost paths to the writer's skips (at close, the writer thread
 * stopped): the number appended. */
size_t shim_write_lost_skips(probe_writer *w);

#endif
