/* write.c - what the writer thread does with a tensor job (capture/job.h):
 * the bytes of a host tensor or of a completed device copy written as a
 * dataset (or, stats-only, as its summary and hash), a skip recorded with
 * its reason, and the tensors lost after a write error. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/libprobe.h"
#include "base/shim.h"
#include "capture/cuda.h"
#include "capture/job.h"
#include "capture/queue.h"
#include "capture/stats.h"
#include "capture/write.h"

/* ---- lost tensors ---------------------------------------------------------- */

static pthread_mutex_t lost_lock = PTHREAD_MUTEX_INITIALIZER;
static char **lost_paths;       /* the first SHIM_WRITE_LOST_MAX, in the order lost */
static size_t nlost_paths;
static unsigned long long nlost, nrefused;
static char lost_first[SHIM_PATH_MAX]; /* the tensor whose write failed */

void shim_write_lost_note(const char *path, int refused)
{
    pthread_mutex_lock(&lost_lock);
    if (refused == 2 && !lost_first[0])
        snprintf(lost_first, sizeof lost_first, "%s", path);
    refused = refused == 1;
    ++nlost;
    if (refused)
        ++nrefused;
    if (nlost_paths < SHIM_WRITE_LOST_MAX) {
        if (!lost_paths)
            lost_paths = calloc(SHIM_WRITE_LOST_MAX, sizeof *lost_paths);
        char *p = lost_paths ? strdup(path) : NULL;
        if (p)
            lost_paths[nlost_paths++] = p;
    }
    pthread_mutex_unlock(&lost_lock);
}

void shim_write_lost_json(struct shim_json *b)
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

size_t shim_write_lost_skips(probe_writer *w)
{
    size_t n = 0;
    pthread_mutex_lock(&lost_lock);
    for (; n < nlost_paths; ++n) {
        probe_record rec = {.path = lost_paths[n]};
        if (shim_libprobe_skip(w, &rec, SHIM_WRITE_LOST_REASON) != PROBE_OK)
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
    probe_status st = shim_libprobe_skip(w, &rec, reason);
    if (st == PROBE_EIO) {
        shim_fail_io(shim_libprobe_error());
        shim_write_lost_note(j->path, 2);
    }
}

/* What put_record and put_summary do with the writer's status. */
static void put_done(probe_writer *w, const struct shim_job *j, probe_status st)
{
    if (st == PROBE_OK)
        return;
    if (st == PROBE_EIO) {
        shim_fail_io(shim_libprobe_error());
        shim_write_lost_note(j->path, 2);
        return;
    }
    /* Not an I/O failure (the writer refused this tensor): keep capturing,
     * and leave a trace in probe.skips so the tensor is not silently absent. */
    atomic_fetch_add(&shim_counts.write_errors, 1);
    char reason[SHIM_REASON_MAX];
    snprintf(reason, sizeof reason, "writer rejected the tensor: %s", shim_libprobe_error());
    skip_record(w, j, reason);
}

static void put_record(probe_writer *w, const struct shim_job *j, const void *data, size_t nbytes)
{
    probe_record rec;
    shim_job_record(j, &rec);
    put_done(w, j, shim_stats_put(w, &rec, data, nbytes)); /* the bytes, or (stats-only) a summary */
}

static void put_summary(probe_writer *w, const struct shim_job *j, const probe_summary *sum,
                        uint64_t tree)
{
    probe_record rec;
    shim_job_record(j, &rec);
    put_done(w, j, shim_stats_put_device(w, &rec, sum, tree));
}

/* A device copy in pieces written as they arrive (the streamed put), when
 * the job is a full tensor larger than a packed one and libprobe.so has the
 * streamed put; 0 when it was not tried (the caller collects and puts). */
static void not_put(probe_writer *w, const struct shim_job *j, int live, int collected,
                    const char *reason);

struct stream_ctx {
    probe_put *put;
    probe_status writer; /* the writer's status of the last part */
};

static probe_status stream_part(void *ctx, const void *data, size_t len)
{
    struct stream_ctx *c = ctx;
    c->writer = shim_libprobe_put_part(c->put, data, len);
    return c->writer;
}

static int put_streamed(probe_writer *w, struct shim_job *j, char *reason, size_t rlen)
{
    probe_record rec;
    shim_job_record(j, &rec);
    if (!shim_cuda_streams(j) || j->nbytes <= shim_cfg.pack_small ||
        shim_stats_selected(rec.path, rec.step, rec.cfg_branch,
                            rec.parent && rec.parent[0] ? rec.block : -1))
        return 0;
    struct stream_ctx c = {NULL, PROBE_OK};
    probe_status st = shim_libprobe_put_begin(w, &rec, j->nbytes, &c.put);
    if (st == PROBE_EUNSUPPORTED)
        return 0;
    if (st != PROBE_OK) {
        put_done(w, j, st);
        return 1;
    }
    st = shim_cuda_each_piece(j, stream_part, &c, reason, rlen);
    if (st == PROBE_OK) {
        put_done(w, j, shim_libprobe_put_end(c.put));
    } else {
        shim_libprobe_put_cancel(c.put);
        if (c.writer != PROBE_OK)
            put_done(w, j, c.writer);
        else
            not_put(w, j, 1, 0, reason);
    }
    return 1;
}

/* A device job that is not put: lost when the writer is gone (live 0), else,
 * when its bytes or summary could not be collected, a skip with why. */
static void not_put(probe_writer *w, const struct shim_job *j, int live, int collected,
                    const char *reason)
{
    if (!live) {
        shim_write_lost_note(j->path, 0);
    } else if (!collected) {
        atomic_fetch_add(&shim_counts.skipped, 1);
        skip_record(w, j, reason);
    }
}

void shim_write_run(struct shim_work *work)
{
    struct shim_job *j = (struct shim_job *)work;
    probe_writer *w = shim_writer();
    int live = !shim_disabled() && w;
    switch (j->kind) {
    case SHIM_JOB_HOST:
        if (live)
            put_record(w, j, j->data, j->nbytes);
        else
            shim_write_lost_note(j->path, 0);
        free(j->data);
        j->data = NULL;
        break;
    case SHIM_JOB_DEVICE: {
        char reason[SHIM_REASON_MAX] = "";
        if (live && put_streamed(w, j, reason, sizeof reason)) {
            shim_cuda_finish(j);
            break;
        }
        const void *src = NULL;
        int ok = shim_cuda_collect(j, &src, reason, sizeof reason) == PROBE_OK;
        if (ok && live)
            put_record(w, j, src, j->nbytes);
        else
            not_put(w, j, live, ok, reason);
        shim_cuda_finish(j);
        break;
    }
    case SHIM_JOB_DEVICE_SUMMARY: {
        char reason[SHIM_REASON_MAX] = "";
        probe_summary sum;
        uint64_t tree = 0;
        int ok = shim_cuda_summary_collect(j, &sum, &tree, reason, sizeof reason) == PROBE_OK;
        if (ok && live)
            put_summary(w, j, &sum, tree);
        else
            not_put(w, j, live, ok, reason);
        shim_cuda_summary_finish(j);
        break;
    }
    case SHIM_JOB_SKIP:
        if (live)
            skip_record(w, j, j->reason);
        else
            shim_write_lost_note(j->path, 0);
        break;
    }
}


void shim_write_done(struct shim_work *work)
{
    struct shim_job *j = (struct shim_job *)work;
    free(j->op);
    free(j);
}

probe_status shim_write_flush(void)
{
    probe_writer *w = shim_writer();
    if (shim_disabled() || !w)
        return PROBE_EIO;
    probe_status st = shim_libprobe_flush(w);
    if (st == PROBE_EIO)
        shim_fail_io(shim_libprobe_error());
    return st;
}
