/* intercept/capture/job.h - one tensor job of the writer queue: the record,
 * its payload (host bytes, a device copy in pieces, a skip reason). */
#ifndef PROBE_INTERCEPT_CAPTURE_JOB_H
#define PROBE_INTERCEPT_CAPTURE_JOB_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/shim.h"
#include "capture/queue.h"
#include "probe/capture.h"
#include "probe/dtype.h"

/* HOST: bytes in host memory; DEVICE: a device copy in pieces; DEVICE_SUMMARY:
 * a stats-only record whose summary the GPU computes (capture/cuda.c);
 * SKIP: a reason. */
enum shim_job_kind { SHIM_JOB_HOST, SHIM_JOB_DEVICE, SHIM_JOB_SKIP, SHIM_JOB_DEVICE_SUMMARY };

/* One piece of a device copy: bytes [i * ring.piece, + len) of the span,
 * copied into the staging ring at ring_off; event recorded after the copy. */
struct shim_piece {
    size_t ring_off, len;
    void *event;        /* cudaEvent_t on probe's stream */
    int state;          /* 0 not enqueued, 1 enqueued, 2 copy complete, 3 returned to the ring */
};

struct shim_device_copy {
    size_t span;        /* bytes of the strided span */
    size_t npieces;
    struct shim_piece *pieces;
    atomic_size_t published; /* pieces whose copy is enqueued (writer may consume them) */
    atomic_int aborted;      /* the submitter stopped early: reason in the job */
    void *assembled;    /* writer: malloc'd span when npieces > 1 */
    void *gathered;     /* writer: malloc'd row-major copy when strided */
    int64_t strides[PROBE_MAX_RANK];
    int has_strides;
    int device;
    /* SHIM_JOB_DEVICE_SUMMARY: the pinned slot the tree's root is copied to
     * (SHIM_DEVICE_SUMMARY_BYTES), and the event after that copy on probe's
     * stream (done.event, done.state as a piece's) */
    void *summary;
    struct shim_piece done;
};

/* A tensor job: work.run is shim_write_run (capture/write.c) for a tensor,
 * shim_weights_run_hash (capture/weights.c) for a weight fingerprint. */
struct shim_job {
    struct shim_work work; /* first: the queue item */
    enum shim_job_kind kind;
    /* record */
    char path[SHIM_PATH_MAX];
    char component[SHIM_NAME_MAX];
    char slot[SHIM_NAME_MAX];
    char scope[SHIM_SCOPE_MAX];
    char device_name[24];
    int64_t call, step;
    int32_t cfg_branch;
    double timestep;
    uint64_t seq;
    probe_dtype dtype;
    int rank;
    int64_t shape[PROBE_MAX_RANK];
    char parent[SHIM_PARENT_MAX];     /* "" not nested */
    int64_t block;                    /* with parent: index among the parent's calls of the component */
    char class_name[SHIM_PARENT_MAX]; /* "" unknown */
    char module[SHIM_PARENT_MAX];     /* "" unknown */
    /* payload */
    void *data;         /* SHIM_JOB_HOST: malloc'd contiguous bytes (NULL when nbytes 0) */
    size_t nbytes;      /* contiguous size */
    struct shim_device_copy dev; /* SHIM_JOB_DEVICE */
    char reason[SHIM_REASON_MAX]; /* SHIM_JOB_SKIP */
    /* interposed library calls (hooks/gemm.c) */
    char *op;           /* malloc'd probe.op JSON text or NULL; freed with the job */
    int hash_only;      /* 1: a weight fingerprint: the XXH64 of the bytes goes to
                           shim_weights_hashed(hash_slot, ...); no dataset */
    size_t hash_slot;
};

/* Fill a probe_record that points into job's fields. */
void shim_job_record(const struct shim_job *j, probe_record *rec);

#endif
