/* intercept/shim.h - internal interfaces of the preloaded shim
 * (libprobe_intercept.so). Nothing here is exported: the library is built
 * with -fvisibility=hidden and only the tap ABI (probe/tap.h) and
 * InitializeInjectionNvtx2 carry SHIM_EXPORT.
 *
 * Files (one concept each):
 *   shim.c      configuration, ownership, constructor/atexit/destructor, fork
 *   tap.c       probe_tap_v1 & co: descriptor validation, paths, filter, dispatch
 *   pathset.c   set of dataset paths already taken (duplicate detection)
 *   gather.c    element counts/spans with overflow checks; strided gather
 *   queue.c     job queue, writer thread, back-pressure, flush
 *   cuda.c      CUDA runtime resolved lazily; private streams, events, device captures
 *   staging.c   ring allocator over the pinned staging pool
 *   graphs.c    interposed CUDA graph calls: replays of graphs with skipped taps
 *   nvtx.c      NVTX injection entry point and per-thread range stacks
 *   manifest.c  JSON text building/validation and the run manifest
 *   libprobe.c  dlopen of libprobe.so (the HDF5 writer and reader)
 *   inject.c    probe_inject_v1: reference file, inject globs, checks, manifest record
 *   stats.c     stats-only capture: summary + hash instead of the bytes
 *   scope.c     component scopes (adapter calls, NVTX ranges) of interposed calls
 *   exits.c     _exit/_Exit/quick_exit, abort, exec and SIGTERM/SIGINT/SIGHUP: drain first
 *   procs.c     per-process files of workers, early close, the missing-adapter line
 */
#ifndef PROBE_INTERCEPT_SHIM_H
#define PROBE_INTERCEPT_SHIM_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "probe/capture.h"
#include "probe/dtype.h"
#include "probe/metrics.h"
#include "probe/status.h"
#include "probe/tap.h"

#define SHIM_EXPORT __attribute__((visibility("default")))

#define SHIM_PATH_MAX 300   /* "/" component(127) "/" call(<=19) "/" slot(127) + NUL */
#define SHIM_NAME_MAX 128   /* component and slot, NUL included (reader keeps 128) */
#define SHIM_SCOPE_MAX 512  /* NVTX scope path, NUL included (reader keeps 512) */
#define SHIM_REASON_MAX 256 /* skip reason, NUL included (reader keeps 256) */
#define SHIM_MAX_DEVICES 64 /* CUDA device ordinals probe handles: 0..63 */
#define SHIM_PARENT_MAX 256 /* parent call and class name, NUL included (reader keeps 256) */

/* ---- shim.c: configuration and process state ---------------------------- */

enum shim_mode {
    SHIM_INACTIVE = 0,  /* PROBE_OUT unset: taps do nothing */
    SHIM_OWNER = 2      /* PROBE_OUT set: this process captures if it claims the file
                           at its first tap (shim_claim) */
};

struct shim_config {
    int mode;                 /* enum shim_mode, fixed by the constructor */
    int root;                 /* the first process of the run (PROBE_ROOT_PID is its pid) */
    char *out_path;           /* PROBE_OUT made absolute */
    char *label;              /* PROBE_LABEL or NULL */
    char *capture_spec;       /* PROBE_CAPTURE as given, or "*" */
    char **globs;             /* capture_spec split at ',' */
    size_t nglobs;
    char *libprobe_path;      /* PROBE_LIBPROBE or NULL */
    size_t queue_max_bytes;   /* PROBE_QUEUE_MB * 2^20 */
    char start_time[32];      /* ISO 8601 UTC, taken by the constructor */
    char **argv;              /* /proc/self/cmdline split at NUL */
    size_t argc;
    char *nvtx_note;          /* manifest "nvtx" when not injected, else NULL */
    /* selection and stats-only capture (tap.c, stats.c) */
    struct shim_select *sel;  /* nglobs entries: the step/branch selectors of each glob */
    char *capture_error;      /* PROBE_CAPTURE rejected (nothing is captured), else NULL */
    int stats_only;           /* PROBE_STATS_ONLY: write summaries and hashes, not bytes */
    int last_kinds;           /* union of sel[].last: scope.c learns per-instance counts */
    char **items;             /* nglobs entries: each item as given (glob and selectors) */
    atomic_ullong *item_hits; /* nglobs entries: tensors each item matched (tap.c) */
    /* selections evaluated in this process: [0] adapter taps, [1 + SHIM_COUNT_GEMM]
     * GEMM operands, [1 + SHIM_COUNT_NCCL] collective operands (tap.c) */
    atomic_ullong selections[3];
};

/* The selectors of one PROBE_CAPTURE item (docs/intercept.md "Selection"):
 * a tap matches when its value is known (>= 0) and inside one of the
 * inclusive ranges [lo, hi]. nranges 0: no selector on that key. */
#define SHIM_SELECT_MAX_RANGES 16
struct shim_range {
    int64_t lo, hi;
};
struct shim_select {
    int last; /* the glob names `<family>.last` (1 << SHIM_COUNT_*): see shim_scope_may_be_last */
    size_t nstep, nbranch, nblock;
    struct shim_range step[SHIM_SELECT_MAX_RANGES], branch[SHIM_SELECT_MAX_RANGES],
        block[SHIM_SELECT_MAX_RANGES];
};

extern struct shim_config shim_cfg;

/* Counters the manifest reports at close. */
struct shim_stats {
    atomic_ullong accepted;       /* tensors queued for writing */
    atomic_ullong skipped;        /* tensors recorded as skipped */
    atomic_ullong filtered;       /* taps not matching PROBE_CAPTURE */
    atomic_ullong write_errors;   /* writer rejected a tensor (not I/O) */
    atomic_ullong queue_waits;    /* taps that waited for queue space */
    atomic_ullong queue_wait_ns;  /* total time waited */
    atomic_ullong graph_replays;  /* launches of CUDA graphs that hold skipped taps */
};
extern struct shim_stats shim_stats;

/* 1 while this process may capture: owner, not a forked child, capture not
 * disabled by an error and not closed. */
int shim_capturing(void);
/* 1 when this process does not write the capture file: a forked child, or
 * another process of the run claimed the file first (shim_claim). */
int shim_is_foreign_process(void);
/* Claim the capture file at this process's first tap (idempotent). */
void shim_claim(void);
/* Point this process at another capture file before it claimed one (0), -1
 * when too late; takes ownership of path on success (procs.c). */
int shim_set_out_path(char *path);
/* 1 when this process has logged a kernel launch (kernels.c): its manifest
 * will hold them, so a child forked from it is not a fresh process. */
int shim_kernels_recorded(void);
/* Drain and close the capture file now, as at exit (procs.c). */
void shim_close_now(void);
/* Why the claim was lost ("" if it was not). */
const char *shim_claim_lost_reason(void);
/* 1 after an I/O error disabled capture. */
int shim_disabled(void);
/* 1 once the finalizer has started (taps are refused after that). */
int shim_closed(void);

/* Open the capture file if not yet done (first caller does the work, others
 * wait). PROBE_OK, or PROBE_EIO when capture is disabled (the one warning
 * line has been printed). */
probe_status shim_file_open(void);

/* The writer opened by shim_file_open (NULL before). */
probe_writer *shim_writer(void);

/* Disable capture after a write failure and print, once per process,
 * "probe: cannot write capture file PATH: REASON; capture disabled, the run
 * continues". */
void shim_fail_io(const char *reason);
struct shim_json;
/* The reason given to the first shim_fail_io ("" before any). */
const char *shim_fail_reason(void);

/* Tensors this process tapped that never reach the file (queue.c): a tensor
 * whose write failed, jobs still queued when a write error disabled capture,
 * and taps refused after that (refused set). Recorded in the manifest's
 * "lost" key and, the first SHIM_LOST_LIST_MAX paths, in probe.skips at
 * close. */
#define SHIM_LOST_LIST_MAX 1000
#define SHIM_LOST_REASON "lost: tapped, but not written: a write error disabled capture"
void shim_lost_note(const char *path, int refused);
/* Check PROBE_PINNED_MB at start-up (cuda.c): one line when it is bad. */
void shim_cuda_config(void);
/* ,"lost":{...} when a tensor was lost (manifest.c) */
void shim_lost_json(struct shim_json *b);
/* Append the lost paths to the writer's skips (finalize, the writer thread
 * stopped): the number appended. */
size_t shim_lost_skips(probe_writer *w);

/* Print one line "probe: <text>" on stderr with a single write(2). */
void shim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A warning about the run's configuration (an environment variable's value,
 * the same in every process of the run): printed by the first process or
 * image of the run that loads the shim only (PROBE_CONFIG_WARNED, set in its
 * constructor, tells the later ones). */
void shim_warn_config(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Called after the first device copy was enqueued (the CUDA runtime is
 * initialized by then, so its exit handlers are registered): registers one
 * more atexit handler, which therefore runs before the runtime's teardown
 * (atexit is LIFO) and marks CUDA as usable for the finalizer. */
void shim_exit_after_cuda(void);
/* 1 while the finalizer runs from that handler: only then may it, or the
 * writer draining for exit, call into CUDA. */
int shim_cuda_alive_at_exit(void);

/* Drain the queue and close the file now, as the finalizer does at exit,
 * waiting at most timeout_ms for the writer (exits.c: _exit, abort, exec,
 * a terminating signal). CUDA counts as alive when it was used: no exit
 * handler has torn it down. Does nothing outside the owner or once the
 * finalizer has started. */
void shim_finalize_now(unsigned timeout_ms);

/* ---- exits.c: abnormal ends of the capturing process -------------------- */

/* Called once the capture file is open (shim_file_open): records the owner's
 * pid, starts the signal drain thread and installs the SIGTERM/SIGINT/SIGHUP
 * handlers where their disposition is the default. */
void shim_exits_arm(void);

/* Exec continuation (docs/file-format.md "Exec continuation"). st: the
 * capture file as the claim found it, non-empty: 1 when it is the file the
 * image before exec of this same pid closed (PROBE_EXEC_CAPTURE), which this
 * image then continues; 0 otherwise. */
struct stat;
int shim_exec_continues(const struct stat *st);
/* 1 once shim_exec_continues said so: the writer appends (PROBE_WRITER_APPEND). */
int shim_exec_continuing(void);
/* The tap as this image writes it: t itself, or (continuing) a copy in
 * *copy whose call, and whose parent's call (in parent, parent_size bytes),
 * follow the earlier images' calls of the same component. Records the
 * highest call of each component for the next exec. */
const probe_tap_tensor_v1 *shim_exec_call(const probe_tap_tensor_v1 *t, probe_tap_tensor_v1 *copy,
                                          char *parent, size_t parent_size);
/* probe.seq as written: this image's seq after the earlier images' (and
 * recorded for the next exec). */
uint64_t shim_exec_seq(uint64_t seq);
/* Append a TAPPED record for path (a tensor about to be queued) to the
 * capture's journal, so that a kill names it as lost (exits.c). */
void shim_exits_note_tapped(const char *path);
/* ,"exec":{...} in the manifest of a continuing image, else nothing. */
struct shim_json;
void shim_exec_json(struct shim_json *b);

/* Monotonic clock in nanoseconds. */
uint64_t shim_now_ns(void);

/* ---- libprobe.c: the HDF5 writer, loaded with dlopen -------------------- */

struct shim_libprobe {
    probe_status (*writer_open)(const char *, const char *, unsigned, probe_writer **);
    probe_status (*writer_put)(probe_writer *, const probe_record *, const void *, size_t);
    probe_status (*writer_skip)(probe_writer *, const probe_record *, const char *);
    probe_status (*writer_set_manifest)(probe_writer *, const char *);
    probe_status (*writer_flush)(probe_writer *);
    probe_status (*writer_close)(probe_writer *);
    const char *(*last_error)(void);
    /* reader (injection reads the reference file through it) */
    probe_status (*file_open)(const char *, probe_file **);
    void (*file_close)(probe_file *);
    size_t (*file_count)(const probe_file *);
    const probe_tensor_info *(*file_tensor)(const probe_file *, size_t);
    probe_status (*file_find)(const probe_file *, const char *, size_t *);
    probe_status (*file_read_raw)(probe_file *, size_t, void *, size_t);
    /* stats-only capture; NULL when libprobe.so predates it */
    probe_status (*writer_put_summary)(probe_writer *, const probe_record *, const probe_summary *,
                                       uint64_t);
    probe_status (*summary_compute)(probe_dtype, const void *, size_t, probe_summary *);
    uint64_t (*capture_hash)(const void *, size_t);
};

extern struct shim_libprobe shim_lp;

/* Load libprobe.so (PROBE_LIBPROBE, else next to the shim: libprobe.so.0,
 * then libprobe.so) with RTLD_NOW | RTLD_LOCAL (| RTLD_DEEPBIND unless ASan
 * is present) and fill shim_lp. PROBE_ENOTFOUND with the dlopen/dlsym reason
 * in probe_last_error() when it cannot be loaded. Call once, under the open
 * lock. */
probe_status shim_libprobe_load(void);

/* The writer API, each call made under one lock that fork() also takes
 * (shim_hdf5_fork_prepare/release), so no child is forked while HDF5 runs. */
probe_status shim_w_open(const char *path, const char *manifest, probe_writer **out);
probe_status shim_w_put(probe_writer *w, const probe_record *rec, const void *data, size_t nbytes);
probe_status shim_w_skip(probe_writer *w, const probe_record *rec, const char *reason);
/* needs shim_lp.writer_put_summary (check it first) */
probe_status shim_w_put_summary(probe_writer *w, const probe_record *rec, const probe_summary *sum,
                                uint64_t hash);
probe_status shim_w_set_manifest(probe_writer *w, const char *manifest);
probe_status shim_w_flush(probe_writer *w);
probe_status shim_w_close(probe_writer *w);
void shim_hdf5_fork_prepare(void);
void shim_hdf5_fork_release(void);

/* The writer's last error text on this thread ("unknown error" if none). */
const char *shim_libprobe_error(void);

/* Absolute path of the shim itself (dladdr + realpath); NULL if unknown.
 * The string is static. */
const char *shim_self_path(void);

/* ---- gather.c: sizes and strided copies ----------------------------------- */

struct shim_extent {
    uint64_t n;        /* elements: prod(shape), 1 for rank 0 */
    size_t nbytes;     /* n * element size */
    size_t span_bytes; /* bytes from the lowest to one past the highest byte the strides reach */
    int contiguous;    /* 1 if the strided layout equals row-major contiguous */
};

/* Compute the extent of a tensor. shape: rank entries >= 0; strides: rank
 * entries >= 0 in elements, or NULL for row-major contiguous; esize: bytes
 * per element (1..8). PROBE_EINVAL (message names the field) on a negative
 * entry or when n, nbytes or span_bytes overflow size_t. For n == 0 every
 * size is 0. */
probe_status shim_extent_of(int rank, const int64_t *shape, const int64_t *strides, size_t esize,
                            struct shim_extent *out);

/* Copy the n elements of a strided tensor whose element [0,...,0] is at base
 * into dst in row-major order. Element (i_0..i_{r-1}) is read at
 * base + esize * sum_k i_k * strides[k] (strides NULL = contiguous). dst
 * holds n * esize bytes. Overlapping (stride 0) and arbitrary orders are
 * allowed; src and dst must not overlap. */
void shim_gather(void *dst, const void *base, int rank, const int64_t *shape,
                 const int64_t *strides, size_t esize);

/* Write the n elements of src (contiguous, row-major) into a strided tensor
 * whose element [0,...,0] is at base: the inverse of shim_gather, same
 * arguments. With overlapping strides (stride 0) the last write wins. */
void shim_scatter(void *base, const void *src, int rank, const int64_t *shape,
                  const int64_t *strides, size_t esize);

/* ---- pathset.c: dataset paths already captured --------------------------- */

/* Insert path; 1 if inserted, 0 if present, -1 out of memory. Thread-safe. */
int shim_pathset_insert(const char *path);
/* Remove path (after a tap that failed before queueing). */
void shim_pathset_remove(const char *path);

/* ---- staging.c: ring allocator over the pinned staging pool ---------------- */

#include <pthread.h>

#define SHIM_RING_PIECE_MAX ((size_t)64 << 20) /* largest piece of one device copy */

struct shim_ring_rec {
    size_t start; /* where the claim begins (before off when the region's end was skipped) */
    size_t off;   /* offset of the bytes handed out */
    size_t end;   /* one past them */
    int freed;
};

struct shim_ring {
    size_t cap;    /* bytes usable now: a multiple of seg */
    size_t seg;    /* segment size (claims never cross a multiple of it), a multiple of 256 */
    size_t piece;  /* largest piece: min(seg / 4, SHIM_RING_PIECE_MAX), a multiple of 256 */
    size_t head;   /* next offset handed out */
    struct shim_ring_rec *recs; /* live claims, oldest first (circular) */
    size_t first, nrecs, rcap;
    int closed;
    atomic_int waiting;  /* claims waiting for space now */
    unsigned long long waits, wait_ns, bytes;
    size_t peak;
    pthread_mutex_t lock;
    pthread_cond_t space;
};

struct shim_ring_stats {
    size_t cap, seg, piece, peak, live;
    unsigned long long waits, wait_ns, bytes;
};

/* Set up a ring of cap bytes made of segments of seg bytes (both rounded
 * down to 256; seg 0 or > cap: one segment). -1 when that leaves no room
 * for a piece or cap is not a multiple of seg. */
int shim_ring_init(struct shim_ring *r, size_t cap, size_t seg);
/* Add one segment at the end (its memory must be addressable first). */
void shim_ring_grow(struct shim_ring *r);
/* Claim n bytes (1..seg; rounded up to 256) and return their offset, 256-
 * aligned. Waits while they do not fit (counted in waits/wait_ns); every
 * 50 ms give_up (may be NULL) is asked whether to stop waiting. SIZE_MAX
 * when n is out of range, the ring is closed, give_up said so, or out of
 * memory. */
size_t shim_ring_alloc(struct shim_ring *r, size_t n, int (*give_up)(void));
/* Return the claim at off (any order; space is reused once every older
 * claim is back). */
void shim_ring_free(struct shim_ring *r, size_t off);
/* Refuse further claims and wake waiters. */
void shim_ring_close(struct shim_ring *r);
void shim_ring_stats(struct shim_ring *r, struct shim_ring_stats *s);

/* ---- queue.c: jobs, writer thread, back-pressure -------------------------- */

enum shim_job_kind { SHIM_JOB_HOST, SHIM_JOB_DEVICE, SHIM_JOB_SKIP, SHIM_JOB_FLUSH, SHIM_JOB_STOP };

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
};

struct shim_job {
    struct shim_job *next;
    enum shim_job_kind kind;
    size_t reserved;    /* bytes counted against PROBE_QUEUE_MB */
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
    uint64_t ticket;    /* SHIM_JOB_FLUSH */
    /* interposed library calls (gemm.c) */
    char *op;           /* malloc'd probe.op JSON text or NULL; freed with the job */
    int hash_only;      /* 1: compute the XXH64 of the bytes and hand it to
                           shim_weights_hashed(hash_slot, ...); no dataset */
    size_t hash_slot;
};

/* Fill a probe_record that points into job's fields. */
void shim_job_record(const struct shim_job *j, probe_record *rec);

/* Start the writer thread (after the file is open). PROBE_ENOMEM/EIO if
 * pthread_create fails. */
probe_status shim_queue_start(void);

/* Count bytes against PROBE_QUEUE_MB, waiting while the queue holds other
 * work and bytes would exceed the limit (each wait is counted in
 * shim_stats). PROBE_ESTATE once the queue is stopping. */
probe_status shim_queue_reserve(size_t bytes);
void shim_queue_unreserve(size_t bytes);

/* Append a job (ownership passes to the queue). PROBE_ESTATE, job not taken,
 * once the queue is stopping or was never started. */
probe_status shim_queue_push(struct shim_job *j);

/* Wait until every job queued before this call is written, then flush the
 * file. Returns the writer's flush status (PROBE_EIO once disabled). */
probe_status shim_queue_flush(void);

/* Ask the writer to finish the queue and exit; device jobs still pending are
 * completed only while CUDA answers, otherwise recorded as skipped. Waits at
 * most timeout_ms; returns 1 if the writer thread finished (the writer may
 * then be closed), 0 if not. */
int shim_queue_stop(unsigned timeout_ms);

/* 1 while the writer is draining for process exit. */
int shim_queue_closing(void);

/* ---- cuda.c: device tensors ---------------------------------------------- */

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

struct shim_json;
/* Append ,"staging":{...} to the manifest being built (pool size, piece
 * size, waits, peak, bytes copied). */
void shim_cuda_staging_json(struct shim_json *b);

/* Injection into device memory: copy nbytes from host src into a pinned
 * buffer and cudaMemcpyAsync it host-to-device to dst on `stream` (device
 * made current, the caller's restored), then record a completion event on
 * `stream`; the buffer returns to the pool once a later call sees the event
 * completed (cudaEventQuery, never a wait). Nothing synchronizes. PROBE_OK,
 * or PROBE_EIO / PROBE_EUNSUPPORTED with why in err (CUDA absent, stream
 * capturing a CUDA graph, a failed CUDA call). */
probe_status shim_cuda_inject(void *dst, const void *src, size_t nbytes, int device, void *stream,
                              char *err, size_t errlen);

/* Query versions and device names while CUDA is usable (cached). */
void shim_cuda_info_refresh(void);
/* Append ,"cuda":{...} to the manifest being built when known. */
struct shim_json;
void shim_cuda_info_json(struct shim_json *b);
/* Pinned bytes held by the staging pool. */
size_t shim_cuda_pinned_bytes(void);

/* ---- tap.c: shared with inject.c ------------------------------------------- */

/* 1 if this process captures (claims the file at its first call), else 0. */
int shim_tap_process_captures(void);
/* Validate a tap descriptor and compute its extent (PROBE_EINVAL naming the field). */
probe_status shim_tap_validate(const probe_tap_tensor_v1 *t, struct shim_extent *ext);
/* The descriptor's fields after timestep, as known from its struct_size:
 * parent (NULL when absent, empty or not nested), block (-1 without a
 * parent), class_name and module (NULL when absent or empty). */
const char *shim_tap_parent(const probe_tap_tensor_v1 *t);
int64_t shim_tap_block(const probe_tap_tensor_v1 *t);
const char *shim_tap_class(const probe_tap_tensor_v1 *t);
const char *shim_tap_module(const probe_tap_tensor_v1 *t);

/* Capture one tensor as probe_tap_v1 does (validation, selection by
 * PROBE_CAPTURE unless the caller selected it already, path taken once,
 * host gather or device copy) and attach op_json (NULL: none; copied) as
 * the dataset's probe.op attribute. select: 1 apply the glob selection,
 * 0 the caller already decided (interposed calls: shim_tap_selected_interposed).
 * Returns as probe_tap_v1. */
probe_status shim_tap_capture(const probe_tap_tensor_v1 *t, const char *op_json, int select);

/* Like shim_tap_capture for a device tensor whose bytes are only hashed
 * (XXH64 on the writer thread, handed to shim_weights_hashed(slot, ...));
 * nothing is written and no path is taken. PROBE_OK when queued. */
probe_status shim_tap_hash_device(const probe_tap_tensor_v1 *t, size_t slot);

/* Fill *t for an operand of an interposed library call: the ABI fields,
 * the scope's names (component, slot, call, step, CFG branch), a device
 * tensor (device, probe_dtype, rank, shape, strides or NULL = contiguous,
 * data, stream) and no timestep (NaN); not nested, no class. shape/strides
 * are not copied. */
void shim_tap_operand(probe_tap_tensor_v1 *t, const char *component, const char *slot,
                      int64_t call, int64_t step, int32_t cfg_branch, int device, int32_t dtype,
                      int32_t rank, const int64_t *shape, const int64_t *strides, const void *data,
                      void *stream);
struct shim_scope;
/* Give an operand descriptor filled by shim_tap_operand the nesting of the
 * scope it was made in (sc->parent, sc->block; nothing when sc is NULL or
 * not nested). sc must outlive t. */
void shim_tap_operand_nesting(probe_tap_tensor_v1 *t, const struct shim_scope *sc);

/* Selection of a tensor of an interposed library call (docs/gemm.md
 * "Selection"): 1 if an item of PROBE_CAPTURE whose glob contains the text
 * `family` ("gemm" or "nccl") matches path with its step/branch/block
 * selectors (block -1: not nested), else 0. The default "*" therefore never
 * selects library-call operands.
 * An item naming `<family>.last` is matched, only when may_be_last
 * (shim_scope_may_be_last), against path with the index of its last
 * component's `<family>.<k>.` written `<family>.last.`. */
int shim_tap_selected_interposed(const char *path, int64_t step, int64_t branch, int64_t block,
                                 const char *family, int may_be_last);

/* Append ,"capture_items":[{"item":TEXT,"matched":N},...] when PROBE_CAPTURE
 * was given, and, when warn, one `probe:` line per item that matched no
 * tensor although this process evaluated selections of its kind (an item
 * naming `gemm` / `nccl`: that library's operands; any other: adapter taps).
 * Such an item is almost always a typo in a path or a @step= outside the
 * run's steps. */
void shim_capture_items_json(struct shim_json *b, int warn);

/* Record path as skipped with reason (no tensor; graphs.c). */
void shim_tap_skip_path(const char *path, const char *reason);

/* ---- graphs.c: CUDA graph replays ----------------------------------------- */

/* The CUDA runtime's definition of name that this process already loaded:
 * RTLD_NEXT, else libcudart.so.13 / .so.12 opened with RTLD_NOLOAD. NULL
 * when none is loaded. Shared by graphs.c and kernels.c. */
void *shim_cudart_sym(const char *name);

/* A tap for path was skipped because `stream` is capturing a CUDA graph:
 * remember it under the capture's id, so that each later launch of the
 * graph made from that capture is recorded in probe.skips too. */
void shim_graph_note_skip(void *stream, const char *path);

/* ---- tap.c: selection (PROBE_CAPTURE) ------------------------------------ */

/* Parse spec (PROBE_CAPTURE, "*" when unset) into shim_cfg.globs/sel/nglobs.
 * A bad spec sets shim_cfg.capture_error, prints one `probe:` line and
 * selects nothing. Constructor only. */
void shim_capture_config(const char *spec);
/* Parse spec (PROBE_STATS_ONLY_FOR; NULL or "" none), the same grammar: the
 * tensors an item selects are written as stats-only records. A bad spec
 * prints one `probe:` line and makes every tensor stats-only. Constructor only. */
void shim_stats_for_config(const char *spec);
/* 1 when an item of PROBE_STATS_ONLY_FOR selects the tensor at path with this
 * step, CFG branch and block index (-1 unknown). */
int shim_stats_for_selected(const char *path, int64_t step, int64_t branch, int64_t block);
/* The number of items of PROBE_STATS_ONLY_FOR. */
int shim_stats_for_count(void);

/* ---- stats.c: stats-only capture ------------------------------------------ */

/* Read PROBE_STATS_ONLY into shim_cfg.stats_only (constructor). */
void shim_stats_config(void);
/* Writer thread: write j's contiguous bytes (data, nbytes) as what the
 * configuration asks for: the tensor itself, or (stats-only) its summary
 * and hash. Returns the writer's status, as shim_w_put. */
probe_status shim_stats_put(probe_writer *w, const probe_record *rec, const void *data,
                            size_t nbytes);
/* Append ,"stats_only":true and ,"capture_error":"..." to the manifest
 * being built, when they apply. */
void shim_stats_json(struct shim_json *b);

/* ---- gemm.c / weights.c: interposed cuBLAS / cuBLASLt ---------------------- */

/* 1 unless PROBE_WEIGHTS=0. */
int shim_weights_enabled(void);
/* Register a weight operand about to be hashed; its slot, or SIZE_MAX when
 * the table is full (counted as overflow). */
size_t shim_weights_register(const char *component, int64_t k, int rank, const int64_t *shape,
                             probe_dtype dtype, size_t nbytes);
/* Writer thread: the XXH64 of the weight operand registered as slot (ok 0:
 * the copy failed or was skipped). */
void shim_weights_hashed(size_t slot, uint64_t hash, int ok);
/* The operand's hash will not come (the call failed, the copy was not queued). */
void shim_weights_failed(size_t slot);
/* Append ,"weights":{...} (weights.c) when any operand was registered. */
void shim_weights_json(struct shim_json *b);
/* Append ,"gemm":{...} (when a GEMM was seen) and the "weights" key. */
void shim_gemm_json(struct shim_json *b);

/* ---- inject.c ------------------------------------------------------------- */

/* Read PROBE_INJECT / PROBE_INJECT_GLOBS (constructor). */
void shim_inject_init(void);
/* At close, before the final manifest: check that every reference tensor
 * the globs select was injected (count check) and close the reference. */
void shim_inject_finish(void);
/* Append ,"inject":{...} to the manifest being built when injection is configured. */
void shim_inject_json(struct shim_json *b);

/* ---- scope.c: component scopes of interposed library calls ---------------- */

/* Counters kept per scope instance (shim_scope_next). */
enum { SHIM_COUNT_GEMM = 0, SHIM_COUNT_NCCL = 1, SHIM_COUNT_KINDS = 4 };

struct shim_scope {
    char component[SHIM_NAME_MAX]; /* "" outside any scope */
    int64_t call, step;            /* -1 unknown */
    int32_t cfg_branch;            /* -1 unknown */
    char parent[SHIM_PARENT_MAX];  /* the enclosing component call of an adapter scope, "" none */
    int64_t block;                 /* with parent: the block index (probe_scope_v1.block), else -1 */
    /* per kind, when PROBE_CAPTURE names `<family>.last` (shim_cfg.last_kinds):
     * the number of calls the component's previous completed instance made,
     * -1 while no instance has completed */
    int64_t last_n[SHIM_COUNT_KINDS];
};

/* Read PROBE_NVTX_SCOPES (constructor): COMPONENT=GLOB items, comma-
 * separated; unset: TensorRT-LLM VisualGen's ranges; "" or "0": none. A bad
 * spec: one `probe:` line and no NVTX range becomes a scope. */
void shim_scope_config(void);
/* The calling thread's innermost scope: a component call announced by the
 * adapter (probe_scope_enter_v1/exit_v1) or an NVTX range mapped to a
 * component. Returns 1 and fills out; 0 outside any (out->component "",
 * call/step/cfg_branch -1). */
int shim_scope_current(struct shim_scope *out);
/* Next index (0, 1, ...) of counter `kind` (SHIM_COUNT_*) inside the calling
 * thread's innermost scope instance; outside any scope a process-wide
 * counter per kind. -1 for a bad kind. */
int64_t shim_scope_next(int kind);
/* 1 when call k (of counter `kind`) of the scope instance sc may be the
 * instance's last such call, so a `<family>.last` item applies to it: k is
 * the previous completed instance's count - 1, or no instance of sc's
 * component has completed yet (the first instance: every k, docs/gemm.md
 * "Selection"). 0 outside any scope, for other k, or when no item names
 * `.last`. */
int shim_scope_may_be_last(const struct shim_scope *sc, int kind, int64_t k);
/* The components the adapter opened scopes for, in first-seen order,
 * ", "-separated into buf (truncated to cap - 1 bytes). */
void shim_scope_names(char *buf, size_t cap);
/* nvtx.c: a push/pop range named range_name opened on this thread. Returns
 * a token (!= 0) when it matches PROBE_NVTX_SCOPES and a scope was opened
 * (component from the item; call = that component's count of such ranges;
 * step = the name's trailing number, else -1), else 0. */
unsigned shim_scope_nvtx_enter(const char *range_name);
/* nvtx.c: the range that returned token closed (0: nothing to do). */
void shim_scope_nvtx_exit(unsigned token);
/* Append ,"nvtx_scopes":{spec, error, calls per component} and
 * ,"scopes":{component: adapter scopes opened} to the manifest. */
void shim_scope_json(struct shim_json *b);
/* ---- kernels.c: kernel-path evidence ---------------------------------------- */

/* Append ,"kernels":{...} (launch counts per component and kernel name,
 * docs/kernels.md) when kernel logging is on in this process. */
void shim_kernels_json(struct shim_json *b);

/* ---- nvtx.c -------------------------------------------------------------- */

/* Write this thread's NVTX range stack joined by '/' ("" if empty) into buf
 * (cap bytes, truncated at a UTF-8 boundary). */
void shim_nvtx_scope(char *buf, size_t cap);
/* Number of NVTX modules that called InitializeInjectionNvtx2. */
unsigned shim_nvtx_modules(void);

/* ---- manifest.c: JSON -------------------------------------------------- */

struct shim_json {
    char *p;
    size_t len, cap;
    int oom;
};

void shim_json_init(struct shim_json *b);
void shim_json_free(struct shim_json *b);
void shim_json_raw(struct shim_json *b, const char *s);
void shim_json_printf(struct shim_json *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s as a JSON string literal: quotes, backslash and control
 * characters escaped (RFC 8259 section 7); bytes that are not valid UTF-8
 * become U+FFFD. NULL appends null. */
void shim_json_string(struct shim_json *b, const char *s);
/* 1 if s is one complete JSON value (RFC 8259), nesting at most 64 deep. */
int shim_json_valid(const char *s);

/* The run manifest as JSON text (malloc'd; NULL when out of memory).
 * final = 1 adds what is known at close (queue waits, counts, CUDA). */
char *shim_manifest_build(int final);

/* ---- nccl.c, shard.c, shim.c: collectives, PROBE_SHARD, per-rank files ---- */

/* Append ,"nccl":{rank, nranks, per component and collective counts and
 * bytes} when NCCL was called, then shim_shard_json and shim_ranks_json
 * (the one manifest hook of this part). */
void shim_nccl_json(struct shim_json *b);

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
/* Index capture (shim.c): when the root process never tapped and rank files
 * <stem>.rank<R><ext> exist next to PROBE_OUT, append ,"ranks":[basenames
 * sorted by rank]. */
void shim_ranks_json(struct shim_json *b);

/* ---- procs.c ------------------------------------------------------------------ */

/* 1 when this process writes a per-process file (probe_tap_sidecar_v1). */
int shim_procs_sidecar(void);
/* The claim of the run's file was lost: switch shim_cfg.out_path to the
 * per-process file named by probe_tap_sidecar_if_taken_v1 (1), or 0 when
 * none was named or it was taken already. Runs under the open lock. */
int shim_procs_take_fallback(void);
/* A tap ABI function was called: the adapter (or another caller) is here. */
void shim_procs_abi_used(void);
/* Append ,"process":{...} (a per-process file) or ,"processes":[...] (the
 * per-process files next to this one) to the manifest being built. */
void shim_procs_json(struct shim_json *b);
/* At exit: the one line of a Python process that never loaded the adapter. */
void shim_procs_exit_check(void);

/* getenv on the environment array itself (shim.c): a shell such as bash
 * defines its own getenv, which knows nothing before bash initialized its
 * variables (after the constructors ran). NULL when name is not set. */
const char *shim_env_raw(const char *name);

/* s without its leading and trailing spaces (trailing ones overwritten with
 * NUL; tap.c): the items of comma-separated environment lists. */
char *shim_trim_spaces(char *s);

#endif
