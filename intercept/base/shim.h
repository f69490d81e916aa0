/* intercept/base/shim.h - the shim's process state, at the bottom of its
 * layers: configuration, counters, the flags every layer reads (owner,
 * forked child, claim, disabled, closed), warning lines, the exit path's
 * hooks, and the limits of names and paths.
 *
 * intercept/ is built in layers that only call downward (docs/intercept.md
 * "Layers"):
 *   base/     state (this file), JSON builder, manifest assembled from
 *             registered sections, the real-symbol resolver, libprobe.so
 *             loader, staging ring, gather, path set, tap descriptors
 *   capture/  from a tap to the file: queue, tensor jobs and their writing,
 *             device copies, stats-only, weights, selection, scopes, NVTX,
 *             shards, exits, the capture file, per-process files, the tap
 *             ABI, injection
 *   hooks/    interposed library calls: CUDA graphs, kernel launches,
 *             cuBLAS/cuBLASLt GEMMs, NCCL collectives
 *   life.c    constructor, fork handlers, atexit/destructor finalizer: the
 *             one file that calls into every layer
 * Nothing is exported: the library is built with -fvisibility=hidden and
 * only the tap ABI (probe/tap.h), the interposed functions and
 * InitializeInjectionNvtx2 carry SHIM_EXPORT. */
#ifndef PROBE_INTERCEPT_BASE_SHIM_H
#define PROBE_INTERCEPT_BASE_SHIM_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "probe/capture.h"

#define SHIM_EXPORT __attribute__((visibility("default")))

#define SHIM_PATH_MAX 300   /* "/" component(127) "/" call(<=19) "/" slot(127) + NUL */
#define SHIM_NAME_MAX 128   /* component and slot, NUL included (reader keeps 128) */
#define SHIM_SCOPE_MAX 512  /* NVTX scope path, NUL included (reader keeps 512) */
#define SHIM_REASON_MAX 256 /* skip reason, NUL included (reader keeps 256) */
#define SHIM_MAX_DEVICES 64 /* CUDA device ordinals probe handles: 0..63 */
#define SHIM_PARENT_MAX 256 /* parent call and class name, NUL included (reader keeps 256) */

/* ---- configuration --------------------------------------------------------- */

enum shim_mode {
    SHIM_INACTIVE = 0,  /* PROBE_OUT unset: taps do nothing */
    SHIM_OWNER = 2      /* PROBE_OUT set: this process captures if it claims the file
                           at its first tap */
};

/* The selectors of one PROBE_CAPTURE item (docs/intercept.md "Selection"): a tap matches when its value is known (>= 0)
 * and inside one of the inclusive ranges [lo, hi]. nranges 0: no selector
 * on that key. */
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
    /* selection and stats-only capture */
    struct shim_select *sel;  /* nglobs entries: the step/branch selectors of each glob */
    char *capture_error;      /* PROBE_CAPTURE rejected (nothing is captured), else NULL */
    int stats_only;           /* PROBE_STATS_ONLY: write summaries and hashes, not bytes */
    size_t pack_small;        /* PROBE_PACK_SMALL: pack tensors of at most this many bytes; 0 off */
    int hash_thread;          /* PROBE_HASH_THREAD: 0 off, 1 the writer's default (on) */
    unsigned raw_files;       /* PROBE_RAW_FILES: raw files for device tensors, 0: none */
    int last_kinds;           /* union of sel[].last: scope.c learns per-instance counts */
    char **items;             /* nglobs entries: each item as given (glob and selectors) */
    atomic_ullong *item_hits; /* nglobs entries: tensors each item matched */
    /* selections evaluated in this process: [0] adapter taps, [1 + SHIM_COUNT_GEMM]
     * GEMM operands, [1 + SHIM_COUNT_NCCL] collective operands */
    atomic_ullong selections[3];
};

extern struct shim_config shim_cfg;

/* Counters the manifest reports at close. */
struct shim_counts {
    atomic_ullong accepted;       /* tensors queued for writing */
    atomic_ullong skipped;        /* tensors recorded as skipped */
    atomic_ullong filtered;       /* taps not matching PROBE_CAPTURE */
    atomic_ullong write_errors;   /* writer rejected a tensor (not I/O) */
    atomic_ullong queue_waits;    /* taps that waited for queue space */
    atomic_ullong queue_wait_ns;  /* total time waited */
    atomic_ullong graph_replays;  /* launches of CUDA graphs that hold skipped taps */
    atomic_size_t pinned_bytes;   /* pinned bytes held by the staging pool  */
    atomic_uint nvtx_modules;     /* NVTX modules that called InitializeInjectionNvtx2 */
};
extern struct shim_counts shim_counts;

/* Nonzero on a thread while it launches probe's own GPU work (the device
 * summaries of capture/cuda.c): the kernel log does not count those launches. */
extern __thread int shim_own_gpu_work;

/* ---- process flags --------------------------------------------------------- */

/* The claim of the capture file: none yet, this process owns it, another does. */
enum shim_claim_kind { SHIM_CLAIM_NONE = 0, SHIM_CLAIM_OWN = 1, SHIM_CLAIM_LOST = 2 };
int shim_claim_state(void);
void shim_set_claim_state(int state);
/* 1 in a child forked after its parent claimed or opened the file. */
int shim_forked_child(void);
void shim_set_forked_child(void);
/* 1 while this process may capture: owner, not a forked child, capture not
 * disabled by an error and not closed. */
int shim_capturing(void);
/* 1 when this process does not write the capture file: a forked child, or
 * another process of the run claimed the file first. */
int shim_is_foreign_process(void);
/* 1 after an I/O error disabled capture. */
int shim_disabled(void);
/* 1 once the finalizer has started (taps are refused after that). */
int shim_closed(void);
/* Mark the finalizer as started: the previous value (0 the first time). */
int shim_set_closed(void);

/* The writer of the open capture file (NULL before it is open and after it
 * is closed); set by capture/file.c. */
probe_writer *shim_writer(void);
void shim_set_writer(probe_writer *w);

/* Disable capture after a write failure and print, once per process,
 * "probe: cannot write capture file PATH: REASON; capture disabled, the run
 * continues". */
void shim_fail_io(const char *reason);
/* The reason given to the first shim_fail_io ("" before any). */
const char *shim_fail_reason(void);

/* ---- lines on stderr ------------------------------------------------------- */

/* Print one line "probe: <text>" on stderr with a single write(2). */
void shim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A warning about the run's configuration (an environment variable's value,
 * the same in every process of the run): printed by the first process or
 * image of the run that loads the shim only (PROBE_CONFIG_WARNED, set in its
 * constructor, tells the later ones). */
void shim_warn_config(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Constructor: whether an earlier process of the run printed the
 * configuration warnings, and whether the constructor is running. */
void shim_warn_config_begin(void);
void shim_warn_config_end(void);

/* ---- the exit path --------------------------------------------------------- */

/* The finalizer (life.c): drains the queue and closes the file, once. Every
 * layer that must end the capture early (exits, procs) calls it through
 * shim_finalize_now / shim_close_now. */
void shim_set_finalizer(void (*finalize)(void));
/* Drain the queue and close the file now, as the finalizer does at exit,
 * waiting at most timeout_ms for the writer (capture/exits.c: _exit, abort,
 * exec, a terminating signal). CUDA counts as alive when it was used: no
 * exit handler has torn it down. */
void shim_finalize_now(unsigned timeout_ms);
/* Drain and close now with the finalizer's usual bound (probe_tap_close_v1). */
void shim_close_now(void);
/* The bound of the finalizer's drain in milliseconds. */
unsigned shim_stop_timeout_ms(void);
/* Register the finalizer with atexit (at open: after HDF5 and usually the
 * CUDA runtime registered theirs, so it runs before their teardown). */
void shim_atexit_finalize(void);
/* Called after the first device copy was enqueued (the CUDA runtime is
 * initialized by then, so its exit handlers are registered): registers one
 * more atexit handler, which therefore runs before the runtime's teardown
 * (atexit is LIFO) and marks CUDA as usable for the finalizer. */
void shim_exit_after_cuda(void);
/* 1 while the finalizer runs from that handler: only then may it, or the
 * writer draining for exit, call into CUDA. */
int shim_cuda_alive_at_exit(void);

/* ---- small helpers --------------------------------------------------------- */

/* Monotonic clock in nanoseconds. */
uint64_t shim_now_ns(void);
/* getenv on the environment array itself: a shell such as bash defines its
 * own getenv, which knows nothing before bash initialized its variables
 * (after the constructors ran). NULL when name is not set. */
const char *shim_env_raw(const char *name);
/* The basename of path (after its last '/'), and the extension of that
 * basename: its last '.' that is not its first character, else the end of
 * path ("/d/on.h5" -> "on.h5", ".h5"; "/d/.h5" -> ".h5", ""). */
const char *shim_path_base(const char *path);
const char *shim_path_ext(const char *path);
/* s without its leading and trailing spaces (trailing ones overwritten with
 * NUL): the items of comma-separated environment lists. */
char *shim_trim_spaces(char *s);

#endif

