/* queue.c - the job queue between tapping threads and the one writer thread
 * that owns the probe_writer (capture.h: one thread uses one writer).
 *
 * Tapping threads reserve bytes (back-pressure: wait while the queue holds
 * more than PROBE_QUEUE_MB), build a job, push it. The writer thread pops
 * jobs in order, waits for device copies (cudaEventSynchronize, on this
 * thread only), gathers, and calls probe_writer_put/skip/flush. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim.h"

static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_nonempty = PTHREAD_COND_INITIALIZER;
static pthread_cond_t q_space = PTHREAD_COND_INITIALIZER;
static pthread_cond_t q_done; /* CLOCK_MONOTONIC, set up by init_once */
static pthread_once_t q_once = PTHREAD_ONCE_INIT;

static struct shim_job *head, *tail;
static size_t queued_bytes;
static int started, stopping, exited, joined;
static atomic_int closing;
static uint64_t next_ticket, done_ticket;
static probe_status flush_status;
static pthread_t writer_thread;
static struct shim_job stop_job = {.kind = SHIM_JOB_STOP};

static void init_once(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&q_done, &a);
    pthread_condattr_destroy(&a);
}

void shim_job_record(const struct shim_job *j, probe_record *rec)
{
    memset(rec, 0, sizeof *rec);
    rec->path = j->path;
    rec->component = j->component;
    rec->slot = j->slot;
    rec->call = j->call;
    rec->step = j->step;
    rec->cfg_branch = j->cfg_branch;
    rec->timestep = j->timestep;
    rec->scope = j->scope;
    rec->device = j->device_name;
    rec->seq = j->seq;
    rec->dtype = j->dtype;
    rec->rank = j->rank;
    rec->shape = j->shape;
    rec->op = j->op;
    rec->parent = j->parent[0] ? j->parent : NULL;
    rec->block = j->block;
    rec->class_name = j->class_name[0] ? j->class_name : NULL;
    rec->module = j->module[0] ? j->module : NULL;
}

/* caller holds qlock */
static void append(struct shim_job *j)
{
    j->next = NULL;
    if (tail)
        tail->next = j;
    else
        head = j;
    tail = j;
    pthread_cond_signal(&q_nonempty);
}

int shim_queue_closing(void)
{
    return atomic_load(&closing);
}

/* ---- lost tensors ---------------------------------------------------------- */

static pthread_mutex_t lost_lock = PTHREAD_MUTEX_INITIALIZER;
static char **lost_paths;       /* the first SHIM_LOST_LIST_MAX, in the order lost */
static size_t nlost_paths;
static unsigned long long nlost, nrefused;
static char lost_first[SHIM_PATH_MAX]; /* the tensor whose write failed */

void shim_lost_note(const char *path, int refused)
{
    pthread_mutex_lock(&lost_lock);
    if (refused == 2 && !lost_first[0])
        snprintf(lost_first, sizeof lost_first, "%s", path);
    refused = refused == 1;
    ++nlost;
    if (refused)
        ++nrefused;
    if (nlost_paths < SHIM_LOST_LIST_MAX) {
        if (!lost_paths)
            lost_paths = calloc(SHIM_LOST_LIST_MAX, sizeof *lost_paths);
        char *p = lost_paths ? strdup(path) : NULL;
        if (p)
            lost_paths[nlost_paths++] = p;
    }
    pthread_mutex_unlock(&lost_lock);
}

void shim_lost_json(struct shim_json *b)
{
    pthread_mutex_lock(&lost_lock);
    if (nlost > 0) {
        shim_json_printf(b, ",\"lost\":{\"count\":%llu,\"refused\":%llu,\"listed\":%zu,\"first\":",
                         nlost, nrefused, nlost_paths);
        shim_json_string(b, lost_first[0] ? lost_first : nlost_paths ? lost_paths[0] : NULL);
        shim_json_raw(b, ",\"reason\":");
        shim_json_string(b, shim_fail_reason());
        shim_json_raw(b, "}");
    }
    pthread_mutex_unlock(&lost_lock);
}

size_t shim_lost_skips(probe_writer *w)
{
    size_t n = 0;
    pthread_mutex_lock(&lost_lock);
    for (; n < nlost_paths; ++n) {
        probe_record rec = {.path = lost_paths[n]};
        if (shim_w_skip(w, &rec, SHIM_LOST_REASON) != PROBE_OK)
            break;
    }
    pthread_mutex_unlock(&lost_lock);
    return n;
}

/* ---- the writer thread ------------------------------------------------------ */

static void skip_record(probe_writer *w, const struct shim_job *j, const char *reason)
{
    probe_record rec;
    shim_job_record(j, &rec);
    probe_status st = shim_w_skip(w, &rec, reason);
    if (st == PROBE_EIO) {
        shim_fail_io(shim_libprobe_error());
        shim_lost_note(j->path, 2);
    }
}

static void put_record(probe_writer *w, const struct shim_job *j, const void *data, size_t nbytes)
{
    probe_record rec;
    shim_job_record(j, &rec);
    probe_status st = shim_stats_put(w, &rec, data, nbytes); /* stats.c: bytes or summary */
    if (st == PROBE_OK)
        return;
    if (st == PROBE_EIO) {
        shim_fail_io(shim_libprobe_error());
        shim_lost_note(j->path, 2);
        return;
    }
    /* Not an I/O failure (the writer refused this tensor): keep capturing,
     * and leave a trace in probe.skips so the tensor is not silently absent. */
    atomic_fetch_add(&shim_stats.write_errors, 1);
    char reason[SHIM_REASON_MAX];
    snprintf(reason, sizeof reason, "writer rejected the tensor: %s", shim_libprobe_error());
    skip_record(w, j, reason);
}

static void process(struct shim_job *j)
{
    probe_writer *w = shim_writer();
    int live = !shim_disabled() && w;
    switch (j->kind) {
    case SHIM_JOB_HOST:
        if (live)
            put_record(w, j, j->data, j->nbytes);
        else
            shim_lost_note(j->path, 0);
        free(j->data);
        j->data = NULL;
        break;
    case SHIM_JOB_DEVICE: {
        char reason[SHIM_REASON_MAX] = "";
        const void *src = NULL;
        if (j->hash_only) { /* weight fingerprint (weights.c): no dataset */
            int ok = shim_cuda_collect(j, &src, reason, sizeof reason) == PROBE_OK &&
                     shim_lp.capture_hash;
            shim_weights_hashed(j->hash_slot, ok ? shim_lp.capture_hash(src, j->nbytes) : 0, ok);
        } else if (shim_cuda_collect(j, &src, reason, sizeof reason) == PROBE_OK) {
            if (live)
                put_record(w, j, src, j->nbytes);
            else
                shim_lost_note(j->path, 0);
        } else if (live) {
            atomic_fetch_add(&shim_stats.skipped, 1);
            skip_record(w, j, reason);
        } else {
            shim_lost_note(j->path, 0);
        }
        shim_cuda_finish(j);
        break;
    }
    case SHIM_JOB_SKIP:
        if (live)
            skip_record(w, j, j->reason);
        else
            shim_lost_note(j->path, 0);
        break;
    case SHIM_JOB_FLUSH: {
        probe_status st = PROBE_EIO;
        if (live) {
            st = shim_w_flush(w);
            if (st == PROBE_EIO)
                shim_fail_io(shim_libprobe_error());
        }
        pthread_mutex_lock(&qlock);
        flush_status = st;
        pthread_mutex_unlock(&qlock);
        break;
    }
    case SHIM_JOB_STOP:
        break;
    }
}

static void *writer_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&qlock);
        while (!head) {
            /* Idle: grow the pinned staging pool by a segment, off the
             * tapping threads (cuda.c); wait for work once it is complete. */
            pthread_mutex_unlock(&qlock);
            int grew = shim_cuda_grow_staging();
            pthread_mutex_lock(&qlock);
            if (!grew && !head)
                pthread_cond_wait(&q_nonempty, &qlock);
        }
        struct shim_job *j = head;
        head = j->next;
        if (!head)
            tail = NULL;
        pthread_mutex_unlock(&qlock);

        process(j);
        if (shim_cuda_staging_starved())
            shim_cuda_grow_staging(); /* a tapping thread waits for staging space */

        pthread_mutex_lock(&qlock);
        queued_bytes -= j->reserved;
        pthread_cond_broadcast(&q_space);
        if (j->kind == SHIM_JOB_FLUSH) {
            done_ticket = j->ticket;
            pthread_cond_broadcast(&q_done);
        }
        int stop = j->kind == SHIM_JOB_STOP;
        pthread_mutex_unlock(&qlock);
        if (stop)
            break;
        free(j->op);
        free(j);
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
        atomic_fetch_add(&shim_stats.queue_waits, 1);
        while (!stopping && !exited && queued_bytes > 0 &&
               (queued_bytes >= max || bytes > max - queued_bytes))
            pthread_cond_wait(&q_space, &qlock);
        atomic_fetch_add(&shim_stats.queue_wait_ns, shim_now_ns() - t0);
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

probe_status shim_queue_push(struct shim_job *j)
{
    pthread_mutex_lock(&qlock);
    if (!started || stopping) {
        pthread_mutex_unlock(&qlock);
        return probe_set_error(PROBE_ESTATE, "tap: the capture file is closed");
    }
    append(j);
    pthread_mutex_unlock(&qlock);
    return PROBE_OK;
}

probe_status shim_queue_flush(void)
{
    struct shim_job *j = calloc(1, sizeof *j);
    if (!j)
        return probe_set_error(PROBE_ENOMEM, "probe_tap_flush_v1: out of memory");
    j->kind = SHIM_JOB_FLUSH;
    pthread_mutex_lock(&qlock);
    if (!started || stopping) {
        pthread_mutex_unlock(&qlock);
        free(j);
        return probe_set_error(PROBE_ESTATE, "probe_tap_flush_v1: the capture file is closed");
    }
    uint64_t ticket = j->ticket = ++next_ticket;
    append(j);
    while (done_ticket < ticket && !exited)
        pthread_cond_wait(&q_done, &qlock);
    probe_status st = done_ticket >= ticket ? flush_status : PROBE_ESTATE;
    pthread_mutex_unlock(&qlock);
    if (st != PROBE_OK)
        return probe_set_error(st, "probe_tap_flush_v1: %s",
                               st == PROBE_EIO ? "capture disabled after a write error"
                                               : "the capture file is closed");
    return PROBE_OK;
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
        shim_cuda_close_staging(); /* a tap waiting for staging space gives up */
        append(&stop_job);
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
