/* intercept/capture/queue.h - the work queue between the threads that tap
 * and the one writer thread that owns the probe_writer (probe/capture.h:
 * one thread uses one writer). The queue knows nothing of the work: each
 * item carries its own callbacks (the pattern of libuv's uv__work_submit). */
#ifndef PROBE_INTERCEPT_CAPTURE_QUEUE_H
#define PROBE_INTERCEPT_CAPTURE_QUEUE_H

#include <stddef.h>

#include "probe/status.h"

/* One item of work, embedded as the first member of the submitter's own
 * struct (capture/job.h). */
struct shim_work {
    struct shim_work *next;            /* the queue's */
    size_t reserved;                   /* bytes counted against PROBE_QUEUE_MB (shim_queue_reserve),
                                          returned once the item is done */
    void (*run)(struct shim_work *w);  /* on the writer thread, in queue order */
    void (*done)(struct shim_work *w); /* after run, on the writer thread: releases w (NULL: nothing) */
};

/* What the writer thread does besides the items (life.c sets them, before
 * the queue starts; each may be NULL): idle() while the queue is empty
 * (1: it did something, ask again; 0: wait for work), after an item when
 * starved() says a tapping thread waits for something idle() provides, and
 * stopping() once when the queue is asked to stop. */
void shim_queue_set_hooks(int (*idle)(void), int (*starved)(void), void (*stopping)(void));

/* Start the writer thread (after the file is open). PROBE_OK, or PROBE_EIO
 * (message: why) if pthread_create fails. */
probe_status shim_queue_start(void);

/* Count bytes against PROBE_QUEUE_MB, waiting while the queue holds other
 * work and bytes would exceed the limit (each wait is counted in
 * shim_counts). PROBE_ESTATE once the queue is stopping. */
probe_status shim_queue_reserve(size_t bytes);
void shim_queue_unreserve(size_t bytes);

/* Append an item (ownership passes to the queue). PROBE_ESTATE, item not
 * taken, once the queue is stopping or was never started. */
probe_status shim_queue_push(struct shim_work *w);

/* Wait until every item queued before this call has run, then run at() on
 * the writer thread and return its status. PROBE_ESTATE when the queue is
 * stopping or was never started, PROBE_ENOMEM. */
probe_status shim_queue_barrier(probe_status (*at)(void));

/* Ask the writer thread to finish the queue and exit, waiting at most
 * timeout_ms: 1 if it finished (the writer may then be closed), 0 if not. */
int shim_queue_stop(unsigned timeout_ms);

/* 1 once the queue was asked to stop (the writer is draining for exit). */
int shim_queue_closing(void);

#endif
