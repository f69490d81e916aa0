/* queue.c - the work queue between tapping threads and the one writer
 * thread (capture/queue.h). Tapping threads reserve bytes (back-pressure:
 * wait while the queue holds more than PROBE_QUEUE_MB), then push an item
 * that carries its own callbacks; the writer thread runs them in order. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/shim.h"
#include "capture/queue.h"

static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_nonempty = PTHREAD_COND_INITIALIZER;
static pthread_cond_t q_space = PTHREAD_COND_INITIALIZER;
static pthread_cond_t q_done; /* CLOCK_MONOTONIC, set up by init_once */
static pthread_once_t q_once = PTHREAD_ONCE_INIT;

static struct shim_work *head, *tail;
static size_t queued_bytes;
static int started, stopping, exited, joined;
static atomic_int closing;
static pthread_t writer_thread;
static uint64_t next_ticket, done_ticket;
static int (*hook_idle)(void), (*hook_starved)(void);
static void (*hook_stopping)(void);

/* A barrier (shim_queue_barrier): its ticket, what to run, its status. */
struct barrier {
    struct shim_work work;
    uint64_t ticket;
    probe_status (*at)(void);
    probe_status status;
};
static struct shim_work stop_item;

static void init_once(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&q_done, &a);
    pthread_condattr_destroy(&a);
}

void shim_queue_set_hooks(int (*idle)(void), int (*starved)(void), void (*stopping_fn)(void))
{
    hook_idle = idle;
    hook_starved = starved;
    hook_stopping = stopping_fn;
}

/* caller holds qlock */
static void append(struct shim_work *w)
{
    w->next = NULL;
    if (tail)
        tail->next = w;
    else
        head = w;
    tail = w;
    pthread_cond_signal(&q_nonempty);
}

int shim_queue_closing(void)
{
    return atomic_load(&closing);
}

/* ---- the writer thread ------------------------------------------------------ */

static void run_barrier(struct shim_work *w)
{
    struct barrier *b = (struct barrier *)w;
    b->status = b->at();
}

static void *writer_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&qlock);
        while (!head) {
            /* Idle: the idle hook's work (growing the pinned staging pool,
             * off the tapping threads); wait for work once it has none. */
            pthread_mutex_unlock(&qlock);
            int more = hook_idle && hook_idle();
            pthread_mutex_lock(&qlock);
            if (!more && !head)
                pthread_cond_wait(&q_nonempty, &qlock);
        }
        struct shim_work *w = head;
        head = w->next;
        if (!head)
            tail = NULL;
        pthread_mutex_unlock(&qlock);

        int stop = w == &stop_item, barrier = !stop && w->run == run_barrier;
        void (*done)(struct shim_work *) = w->done;
        if (!stop)
            w->run(w);
        if (hook_starved && hook_idle && hook_starved())
            hook_idle(); /* a tapping thread waits for what the idle hook provides */

        pthread_mutex_lock(&qlock);
        queued_bytes -= w->reserved;
        pthread_cond_broadcast(&q_space);
        if (barrier) {
            done_ticket = ((struct barrier *)w)->ticket;
            pthread_cond_broadcast(&q_done); /* the barrier's caller frees it: w is gone */
        }
        pthread_mutex_unlock(&qlock);
        if (stop)
            break;
        if (!barrier && done)
            done(w);
    }
    pthread_mutex_lock(&qlock);
    exited = 1;
    pthread_cond_broadcast(&q_done);
    pthread_cond_broadcast(&q_space);
    pthread_mutex_unlock(&qlock);
    return NULL;
}

probe_status shim_queue_start(void)
{
    pthread_once(&q_once, init_once);
    pthread_mutex_lock(&qlock);
    if (started) {
        pthread_mutex_unlock(&qlock);
        return PROBE_OK;
    }
    /* The writer thread takes no signals: the user's handlers stay on the
     * user's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&writer_thread, NULL, writer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        started = 1;
    pthread_mutex_unlock(&qlock);
    if (rc != 0)
        return probe_set_error(PROBE_EIO, "cannot start the writer thread: %s", strerror(rc));
    return PROBE_OK;
}

probe_status shim_queue_reserve(size_t bytes)
{
    size_t max = shim_cfg.queue_max_bytes;
    pthread_mutex_lock(&qlock);
    if (!started || stopping) {
        pthread_mutex_unlock(&qlock);
        return probe_set_error(PROBE_ESTATE, "tap: the capture file is closed");
    }
    if (queued_bytes > 0 && (queued_bytes >= max || bytes > max - queued_bytes)) {
        uint64_t t0 = shim_now_ns();
        atomic_fetch_add(&shim_counts.queue_waits, 1);
        while (!stopping && !exited && queued_bytes > 0 &&
               (queued_bytes >= max || bytes > max - queued_bytes))
            pthread_cond_wait(&q_space, &qlock);
        atomic_fetch_add(&shim_counts.queue_wait_ns, shim_now_ns() - t0);
        if (stopping || exited) {
            pthread_mutex_unlock(&qlock);
            return probe_set_error(PROBE_ESTATE, "tap: the capture file is closed");
        }
    }
    queued_bytes += bytes;
    pthread_mutex_unlock(&qlock);
    return PROBE_OK;
}

void shim_queue_unreserve(size_t bytes)
{
    pthread_mutex_lock(&qlock);
    queued_bytes -= bytes;
    pthread_cond_broadcast(&q_space);
    pthread_mutex_unlock(&qlock);
}

probe_status shim_queue_push(struct shim_work *w)
{
    pthread_mutex_lock(&qlock);
    if (!started || stopping) {
        pthread_mutex_unlock(&qlock);
        return probe_set_error(PROBE_ESTATE, "tap: the capture file is closed");
    }
    append(w);
    pthread_mutex_unlock(&qlock);
    return PROBE_OK;
}

probe_status shim_queue_barrier(probe_status (*at)(void))
{
    struct barrier *b = calloc(1, sizeof *b);
    if (!b)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    b->work.run = run_barrier;
    b->at = at;
    pthread_mutex_lock(&qlock);
    if (!started || stopping) {
        pthread_mutex_unlock(&qlock);
        free(b);
        return probe_set_error(PROBE_ESTATE, "the capture file is closed");
    }
    uint64_t ticket = b->ticket = ++next_ticket;
    append(&b->work);
    while (done_ticket < ticket && !exited)
        pthread_cond_wait(&q_done, &qlock);
    probe_status st = PROBE_ESTATE;
    if (done_ticket >= ticket) {
        st = b->status;
        free(b);
    } /* else the writer thread ended first: b stays in the dead queue */
    pthread_mutex_unlock(&qlock);
    if (st == PROBE_ESTATE)
        return probe_set_error(PROBE_ESTATE, "the capture file is closed");
    return st;
}

int shim_queue_stop(unsigned timeout_ms)
{
    pthread_mutex_lock(&qlock);
    if (!started) {
        pthread_mutex_unlock(&qlock);
        return 1;
    }
    if (!stopping) {
        stopping = 1;
        atomic_store(&closing, 1);
        if (hook_stopping)
            hook_stopping(); /* e.g. a tap waiting for staging space gives up */
        append(&stop_item);
        pthread_cond_broadcast(&q_space);
    }
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec += 1;
        dl.tv_nsec -= 1000000000L;
    }
    while (!exited) {
        if (pthread_cond_timedwait(&q_done, &qlock, &dl) == ETIMEDOUT)
            break;
    }
    int done = exited, join = exited && !joined;
    if (join)
        joined = 1;
    pthread_mutex_unlock(&qlock);
    if (join)
        pthread_join(writer_thread, NULL);
    return done;
}
