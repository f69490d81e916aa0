/* intercept/capture/cuda.h - device tensors: the CUDA runtime resolved lazily, probe's streams and events, device copies into the staging ring, injection copies. */
#ifndef PROBE_INTERCEPT_CAPTURE_CUDA_H
#define PROBE_INTERCEPT_CAPTURE_CUDA_H

#include <stddef.h>
#include "probe/metrics.h"
#include "probe/status.h"
#include "capture/job.h"

struct shim_json;

/* Capture a device tensor whose strided span (span_bytes at data) lives on
 * `device` and is produced on `stream`. Makes `device` current (the
 * caller's is restored) and checks that `stream` is not capturing a CUDA
 * graph; if it is (or the query fails, or CUDA or the staging pool is
 * unavailable) it sets j->kind = SHIM_JOB_SKIP with j->reason and queues
 * nothing (*queued = 0: the caller queues the skip). Otherwise: an event on
 * `stream`; probe's private non-blocking stream waits on it; the span is
 * copied device-to-host into the pinned staging ring in pieces of at most
 * ring.piece bytes (cudaMemcpyAsync, an event after each); the job is queued
 * once its first piece is enqueued (*queued = 1) so the writer consumes
 * pieces while later ones wait for ring space (the only wait on the tapping
 * thread: back-pressure, counted); finally `stream` waits on the last
 * piece's event, so work the program enqueues later on `stream` cannot
 * change the bytes before they are copied (in-place updates, CUDA graph
 * replays, memory reuse). Nothing synchronizes. A failure after the job was
 * queued marks it aborted with the reason (the writer records the skip).
 * PROBE_OK, or PROBE_ESTATE when the queue is closed (nothing queued). */
probe_status shim_cuda_capture(struct shim_job *j, const void *data, size_t span_bytes, int device,
                               void *stream, int *queued);

/* Writer thread: wait for every piece of j (cudaEventSynchronize; while
 * closing, poll with cudaEventQuery and give up when CUDA no longer answers)
 * and point *data at the tensor's j->nbytes row-major bytes (in the ring, or
 * assembled/gathered in host memory), valid until shim_cuda_finish. PROBE_OK,
 * or PROBE_EIO with why in reason. */
probe_status shim_cuda_collect(struct shim_job *j, const void **data, char *reason, size_t rlen);

/* 1 when j's bytes may be written piece by piece as they arrive
 * (shim_cuda_each_piece): more than one piece, row-major (no gather). */
int shim_cuda_streams(const struct shim_job *j);

/* Writer thread, instead of shim_cuda_collect for a job shim_cuda_streams
 * accepts: for each piece in order, wait for its copy, call fn(ctx, its
 * bytes in the ring, their length) and give its ring space back at once.
 * PROBE_OK; fn's status when it is not PROBE_OK (the later pieces are left
 * to shim_cuda_finish); PROBE_EIO with why in reason when a copy failed or
 * the submitter stopped. shim_cuda_finish follows in every case. */
typedef probe_status shim_piece_fn(void *ctx, const void *data, size_t len);
probe_status shim_cuda_each_piece(struct shim_job *j, shim_piece_fn *fn, void *ctx, char *reason,
                                  size_t rlen);

/* A stats-only record of a contiguous device tensor (n elements of
 * j->dtype at data, on `device`, produced on `stream`), summarized on the GPU
 * (libprobe_cuda.so: probe_cuda_summary_tree_enqueue). Makes `device`
 * current (the caller's is restored). An event on `stream`; probe's private
 * stream waits on it, runs the tree's kernels and copies the root into a
 * pinned slot; an event after that; `stream` waits on it, so later work
 * cannot change the bytes before the summary reads them. Only the root
 * crosses to the host; nothing synchronizes. *handled = 0: not done
 * (libprobe_cuda.so not loaded, PROBE_DEVICE_SUMMARY=0, an earlier enqueue
 * failed, no pinned slot or event): the caller takes the staging copy
 * (shim_cuda_capture) and the host summary. *handled = 1: j was queued as
 * SHIM_JOB_DEVICE_SUMMARY (*queued = 1), or j->kind is SHIM_JOB_SKIP with
 * j->reason (the stream is capturing a CUDA graph, a failed event), for the
 * caller to queue. PROBE_OK, or PROBE_ESTATE when the queue is closed. */
probe_status shim_cuda_summarize(struct shim_job *j, const void *data, uint64_t n, int device,
                                 void *stream, int *handled, int *queued);

/* Writer thread: wait for j's device summary (as a piece's copy) and decode
 * the root into *sum and *tree (the tree hash). PROBE_OK, or PROBE_EIO with
 * why in reason. */
probe_status shim_cuda_summary_collect(struct shim_job *j, probe_summary *sum, uint64_t *tree,
                                       char *reason, size_t rlen);

/* Writer thread, after summary_collect: return the slot and the event (or
 * abandon them when the summary is still in flight as CUDA goes away). */
void shim_cuda_summary_finish(struct shim_job *j);

/* Writer thread, after collect (whatever it returned): wait for copies
 * still in flight (or abandon their ring space and events when CUDA is gone
 * at exit), return the ring space and events, free host buffers. */
void shim_cuda_finish(struct shim_job *j);

/* Writer thread, while idle or starved: allocate the next 64 MiB segment of the
 * staging pool (device of the first tap current, relaxed capture mode).
 * 1 if it grew, 0 if there is nothing to do (no pool yet, complete, a
 * failed allocation, or closing). */
int shim_cuda_grow_staging(void);

/* 1 while a tapping thread waits for staging space (the writer then grows
 * the pool between jobs and between pieces, not only when idle). */
int shim_cuda_staging_starved(void);

/* Release the ring at exit: waiting submitters give up. */
void shim_cuda_close_staging(void);

/* Append ,"staging":{...} to the manifest being built (pool size, piece
 * size, waits, peak, bytes copied). */
void shim_cuda_staging_json(struct shim_json *b);

/* Injection into device memory: copy nbytes from host src into a pinned
 * buffer and cudaMemcpyAsync it host-to-device to dst on `stream` (device
 * made current, the caller's restored), then record a completion event on
 * `stream`; the buffer returns to the pool once a later call sees the event
 * completed (cudaEventQuery, never a wait). Nothing synchronizes. PROBE_OK,
 * or PROBE_EIO / PROBE_EUNSUPPORTED / PROBE_ENOMEM with why in
 * probe_last_error() (CUDA absent, stream capturing a CUDA graph, a failed
 * CUDA call). */
probe_status shim_cuda_inject(void *dst, const void *src, size_t nbytes, int device, void *stream);

/* Query versions and device names while CUDA is usable (cached). */
void shim_cuda_info_refresh(void);
/* Append ,"cuda":{...} to the manifest being built when known. */
void shim_cuda_info_json(struct shim_json *b);
/* Check PROBE_PINNED_MB at start-up: one line when it is bad. */
void shim_cuda_config(void);
/* A tap was skipped because its stream is capturing a CUDA graph:
 * note(stream, path) remembers it (hooks/graphs.c; set by life.c). */
void shim_cuda_set_graph_skip_hook(void (*note)(void *stream, const char *path));

#endif
