/* shim.c - configuration, ownership of the capture file, and the life cycle
 * of the preloaded library: constructor (read config, set env, nothing
 * heavy), lazy open of the capture file, fork handling, and the finalizer
 * that drains the queue and closes the file at exit.
 *
 * Ownership: LD_PRELOAD is inherited by every child, and the process that
 * runs the pipeline is often not the one probe-run started (`bash -c
 * 'python gen.py; ...'`, launcher scripts). The first process of the run
 * that taps claims the capture file: an exclusive flock(2) on it, held until
 * it exits, on a file that must be empty (probe-run empties it at start).
 * Every other process that taps finds the lock held or the file written and
 * does not capture (one `probe:` line). A process that the adapter names a
 * worker (probe_tap_sidecar_v1, procs.c) claims its own per-process file
 * instead. A child forked after its parent claimed the file never captures;
 * one forked before is a fresh process of the run (it claims as any other).
 * The first process that loaded the shim (the root: PROBE_ROOT_PID) still
 * creates an empty capture at exit if no process of the run tapped. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "shim.h"
#include "../metrics/textsafe.h"

extern char **environ;

struct shim_config shim_cfg;
struct shim_stats shim_stats;

static atomic_int disabled;     /* an I/O error disabled capture */
static atomic_int forked_child; /* set by the atfork child handler */
static atomic_int closed;       /* the finalizer has started */
static atomic_int warned_io;

/* Per-rank capture files (see "per-rank capture files" below). */
static int rank_self = -1, rank_world = -1;  /* from the environment, -1 none */
static const char *rank_source;               /* the variable pair used */
static int index_mode;                        /* finalize: root wrote no tensors */

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int open_state; /* 0 not tried, 1 open, 2 failed */
static probe_writer *writer;

/* Descriptors that refer to the capture file, so a forked child can point
 * them at /dev/null: whatever the child's copy of HDF5 flushes at its exit
 * then never reaches the parent's file. */
#define MAX_FILE_FDS 8
static int file_fds[MAX_FILE_FDS];
static atomic_int nfile_fds;

#define DEFAULT_QUEUE_MB 2048u
#define STOP_TIMEOUT_MS 60000u

uint64_t shim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* What a `probe:` line starts with so that it starts a line of its own
 * (docs/intercept.md "probe: lines"): on a terminal "\r\033[K" (back to the
 * first column and erase it: a progress bar such as tqdm's, drawn with "\r"
 * and no newline, is erased and redrawn by its next update); on a regular
 * file whose last byte is not a newline, "\n" (read through /proc/self/fd/2,
 * never opening anything that is not a regular file); otherwise nothing (a
 * pipe's last byte cannot be known). */
static const char *line_start(void)
{
    if (isatty(STDERR_FILENO))
        return "\r\033[K";
    struct stat st;
    if (fstat(STDERR_FILENO, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
        return "";
    int fd = open("/proc/self/fd/2", O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return "";
    struct stat again;
    char last = '\n';
    if (fstat(fd, &again) == 0 && again.st_dev == st.st_dev && again.st_ino == st.st_ino &&
        again.st_size > 0 && pread(fd, &last, 1, again.st_size - 1) != 1)
        last = '\n';
    close(fd);
    return last == '\n' ? "" : "\n";
}

static void vwarn(const char *fmt, va_list ap)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "probe: ");
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    char shown[sizeof line * 2 + 8]; /* one line, control characters and bad UTF-8 escaped */
    size_t len = (size_t)snprintf(shown, sizeof shown, "%s", line_start());
    len += probe_tesc_to(shown + len, sizeof shown - 1 - len, line);
    shown[len++] = '\n';
    ssize_t off = 0;
    while ((size_t)off < len) {
        ssize_t w = write(STDERR_FILENO, shown + off, len - (size_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += w;
    }
}

void shim_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vwarn(fmt, ap);
    va_end(ap);
}

/* PROBE_CONFIG_WARNED was set when this image started: an earlier process
 * or image of the run already printed the configuration warnings. */
static int config_warned_before;
static int in_constructor;

void shim_warn_config(const char *fmt, ...)
{
    if (config_warned_before)
        return;
    va_list ap;
    va_start(ap, fmt);
    vwarn(fmt, ap);
    va_end(ap);
    if (in_constructor)
        setenv("PROBE_CONFIG_WARNED", "1", 1); /* single-threaded here: the children inherit it */
}

static atomic_int claim_state; /* 0 not tried, 1 this process owns the file, 2 another does */
static int claim_fd = -1;      /* holds the flock for the life of the process */
static char claim_why[PATH_MAX + 160];

int shim_is_foreign_process(void)
{
    return shim_cfg.mode != SHIM_OWNER || atomic_load(&forked_child) ||
           atomic_load(&claim_state) == 2;
}

const char *shim_claim_lost_reason(void)
{
    if (atomic_load(&forked_child)) {
        if (!claim_why[0])
            snprintf(claim_why, sizeof claim_why,
                     "it was forked from pid %ld, and a forked child never captures",
                     (long)getppid());
        return claim_why;
    }
    return atomic_load(&claim_state) == 2 ? claim_why : "";
}

int shim_disabled(void)
{
    return atomic_load(&disabled);
}

int shim_closed(void)
{
    return atomic_load(&closed);
}

int shim_capturing(void)
{
    return shim_cfg.mode == SHIM_OWNER && !atomic_load(&forked_child) && !atomic_load(&disabled) &&
           !atomic_load(&closed);
}

probe_writer *shim_writer(void)
{
    return atomic_load(&open_state) == 1 ? writer : NULL;
}

static char fail_reason[512];
static atomic_int fail_reason_set;

const char *shim_fail_reason(void)
{
    return atomic_load(&fail_reason_set) ? fail_reason : "";
}

void shim_fail_io(const char *reason)
{
    /* The writer's messages start with the file name, which the line
     * already gives. */
    size_t n = strlen(shim_cfg.out_path);
    if (strncmp(reason, shim_cfg.out_path, n) == 0 && strncmp(reason + n, ": ", 2) == 0)
        reason += n + 2;
    atomic_store(&disabled, 1);
    if (atomic_exchange(&warned_io, 1) == 0) {
        snprintf(fail_reason, sizeof fail_reason, "%s", reason);
        atomic_store(&fail_reason_set, 1);
        shim_warn("cannot write capture file %s: %s; capture disabled, the run continues",
                  shim_cfg.out_path, reason);
    }
}

/* ---- opening the file ----------------------------------------------------- */

static void remember_file_fds(void)
{
    struct stat want;
    if (stat(shim_cfg.out_path, &want) != 0)
        return;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_FILE_FDS) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || fd < 0 || fd == dirfd(d))
            continue;
        struct stat st;
        if (fstat((int)fd, &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino)
            file_fds[n++] = (int)fd;
    }
    closedir(d);
    atomic_store(&nfile_fds, n);
}

static void finalize(void);
static atomic_int cuda_alive_at_exit, cuda_exit_registered;
static unsigned stop_timeout_ms = STOP_TIMEOUT_MS; /* the finalizer's bound on the drain */

static void atexit_finalize(void)
{
    finalize();
}

static void atexit_finalize_cuda_alive(void)
{
    atomic_store(&cuda_alive_at_exit, 1);
    finalize();
}

void shim_exit_after_cuda(void)
{
    if (atomic_exchange(&cuda_exit_registered, 1) == 0)
        atexit(atexit_finalize_cuda_alive);
}

int shim_cuda_alive_at_exit(void)
{
    return atomic_load(&cuda_alive_at_exit);
}

/* Claim the capture file for this process (see Ownership above): flock it
 * exclusively without blocking and require it to be an empty regular file.
 * Lost (state 2): the lock is held by another process, or the file already
 * holds a capture (an earlier process of this run wrote it, or it is an older
 * capture, which is never overwritten). A file that cannot be opened or is
 * not a regular file counts as won and disables capture with the one
 * warning line. Runs under open_lock. */
static void claim_locked(void)
{
    if (atomic_load(&claim_state) != 0)
        return;
retry:;
    /* Never through a symbolic link (O_NOFOLLOW: ELOOP), never opening a
     * device or FIFO (O_NONBLOCK; checked to be a regular file before any
     * use); created with the process's umask applied to 0666. */
    int fd = open(shim_cfg.out_path,
                  O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK, 0666);
    if (fd < 0) {
        char why[256];
        if (errno == ELOOP)
            snprintf(why, sizeof why, "it is a symbolic link (probe never writes through one)");
        else
            snprintf(why, sizeof why, "%s", strerror(errno));
        atomic_store(&claim_state, 1);
        shim_fail_io(why);
        atomic_store(&open_state, 2);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || fcntl(fd, F_SETFL, O_RDWR) != 0) {
        close(fd);
        atomic_store(&claim_state, 1);
        shim_fail_io("not a regular file");
        atomic_store(&open_state, 2);
        return;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 && (errno == EWOULDBLOCK || errno == EINTR)) {
        close(fd);
        if (shim_procs_take_fallback()) /* procs.c: this process's own file instead */
            goto retry;
        snprintf(claim_why, sizeof claim_why,
                 "the capture file %s is being written by another process", shim_cfg.out_path);
        atomic_store(&claim_state, 2);
        return;
    }
    if (fstat(fd, &st) == 0 && st.st_size > 0 && !shim_exec_continues(&st)) {
        close(fd); /* releases the lock */
        if (shim_procs_take_fallback())
            goto retry;
        snprintf(claim_why, sizeof claim_why,
                 "the capture file %s already holds a capture (written by an earlier process of "
                 "this run, or an older capture: probe-run empties it at start)",
                 shim_cfg.out_path);
        atomic_store(&claim_state, 2);
        return;
    }
    claim_fd = fd;
    atomic_store(&claim_state, 1);
}

void shim_claim(void)
{
    if (atomic_load(&claim_state) != 0)
        return;
    pthread_mutex_lock(&open_lock);
    claim_locked();
    pthread_mutex_unlock(&open_lock);
}

probe_status shim_file_open(void)
{
    shim_claim();
    if (atomic_load(&claim_state) == 2)
        return probe_set_error(PROBE_ESTATE, "%s", claim_why);
    int s = atomic_load(&open_state);
    if (s == 1)
        return PROBE_OK;
    if (s == 2)
        return probe_set_error(PROBE_EIO, "capture file %s: capture disabled", shim_cfg.out_path);
    pthread_mutex_lock(&open_lock);
    probe_status st = PROBE_OK;
    if (atomic_load(&open_state) == 0) {
        char *manifest = NULL;
        st = shim_libprobe_load();
        if (st != PROBE_OK) {
            shim_fail_io(probe_last_error());
        } else {
            manifest = shim_manifest_build(0);
            probe_writer *w = NULL;
            st = shim_w_open(shim_cfg.out_path, manifest, &w);
            if (st != PROBE_OK) {
                shim_fail_io(shim_libprobe_error());
            } else {
                writer = w;
                remember_file_fds();
                st = shim_queue_start();
                if (st != PROBE_OK) {
                    shim_fail_io(probe_last_error());
                    shim_w_close(w);
                    writer = NULL;
                } else {
                    /* Registered after HDF5 (and usually the CUDA runtime)
                     * registered theirs, so it runs before their teardown. */
                    atexit(atexit_finalize);
                    shim_exits_arm(); /* exits.c */
                }
            }
        }
        free(manifest);
        atomic_store(&open_state, st == PROBE_OK ? 1 : 2);
        if (st != PROBE_OK)
            st = PROBE_EIO;
    } else if (atomic_load(&open_state) == 2) {
        st = PROBE_EIO;
    }
    pthread_mutex_unlock(&open_lock);
    if (st != PROBE_OK)
        return probe_set_error(PROBE_EIO, "capture file %s: capture disabled", shim_cfg.out_path);
    return PROBE_OK;
}

/* Point this process at another capture file (a per-process file, procs.c)
 * before it claimed any: 0, or -1 when it already claimed, opened or is a
 * forked child that never captures. Takes ownership of path on success. */
int shim_set_out_path(char *path)
{
    pthread_mutex_lock(&open_lock);
    int ok = atomic_load(&claim_state) == 0 && atomic_load(&open_state) == 0 &&
             !atomic_load(&forked_child) && !atomic_load(&closed);
    if (ok)
        shim_cfg.out_path = path; /* the previous string stays valid: never freed */
    pthread_mutex_unlock(&open_lock);
    return ok ? 0 : -1;
}

/* ---- exit ---------------------------------------------------------------- */

/* Drain and close. Runs once, in the owner only, from the latest-registered
 * of the shim's atexit handlers (after the first device copy: before the
 * CUDA runtime's teardown; else the one registered at open: before HDF5's),
 * or from the constructor-registered handler or the ELF destructor. If
 * nothing was ever tapped, the file is still created, with the manifest and
 * no tensors. CUDA is called only when it is known to be alive (see
 * shim_exit_after_cuda); otherwise the CUDA facts are those gathered at the
 * first device tap or at probe_tap_flush_v1, and pending device copies are
 * recorded as skipped. */
static void finalize(void)
{
    shim_procs_exit_check(); /* procs.c */
    if (shim_is_foreign_process())
        return;
    if (atomic_exchange(&closed, 1))
        return;
    if (atomic_load(&claim_state) == 0 && (!shim_cfg.root || shim_procs_sidecar()))
        return; /* never tapped, not the root: another process writes the file, or the root */
    if (atomic_load(&claim_state) == 0 && rank_self < 0)
        index_mode = 1; /* the run's root wrote no tensors: list the rank files, if any */
    if (atomic_load(&open_state) == 0 && !atomic_load(&disabled) &&
        shim_file_open() != PROBE_OK)
        return;
    if (atomic_load(&open_state) != 1)
        return;
    if (!shim_queue_stop(stop_timeout_ms)) {
        shim_warn("capture file %s may be incomplete: the writer did not finish within %.3g s at exit",
                  shim_cfg.out_path, stop_timeout_ms / 1000.0);
        return; /* the writer thread still uses the file: leave it */
    }
    if (atomic_load(&cuda_alive_at_exit))
        shim_cuda_info_refresh();
    shim_inject_finish();
    /* After a write error the manifest says what was lost ("lost"), and the
     * lost paths follow in probe.skips: the manifest is flushed first, so a
     * skip that no longer fits leaves a file that still says so. Calls the
     * writer refuses (it failed half-way) leave the file as it was. */
    char *manifest = shim_manifest_build(1);
    int disabled_now = atomic_load(&disabled);
    if (manifest && shim_w_set_manifest(writer, manifest) == PROBE_OK && disabled_now &&
        shim_w_flush(writer) == PROBE_OK)
        shim_lost_skips(writer);
    free(manifest);
    probe_status st = shim_w_close(writer);
    writer = NULL;
    if (st == PROBE_EIO && !atomic_load(&disabled))
        shim_fail_io(shim_libprobe_error());
}

void shim_finalize_now(unsigned timeout_ms)
{
    if (atomic_load(&cuda_exit_registered))
        atomic_store(&cuda_alive_at_exit, 1); /* no exit handler has run: CUDA is intact */
    stop_timeout_ms = timeout_ms;
    finalize();
}

void shim_close_now(void)
{
    finalize();
}

__attribute__((destructor)) static void shim_fini(void)
{
    if (shim_cfg.mode == SHIM_OWNER)
        finalize();
}

/* ---- fork ---------------------------------------------------------------- */

static void atfork_prepare(void)
{
    shim_hdf5_fork_prepare();
}

static void atfork_parent(void)
{
    shim_hdf5_fork_release();
}

/* Child side of fork(). A parent that had neither claimed nor opened a
 * capture file has no writer thread and no file in HDF5: the child is a
 * fresh process of the run and claims at its first tap like any other (a
 * lost claim of the parent is forgotten; the child tries again). Otherwise:
 * no capture, no CUDA, no HDF5, and only async-signal-safe calls: the
 * capture file's descriptors are redirected to /dev/null, so whatever the
 * child's copy of HDF5 writes at its exit (HDF5 closes open files from an
 * atexit handler) never reaches the parent's file. */
static void atfork_child(void)
{
    shim_hdf5_fork_release();
    /* A child of a process that has neither claimed the file nor recorded
     * anything for it (kernel launches are written into its manifest at exit)
     * is a fresh process of the run. */
    if (atomic_load(&claim_state) != 1 && atomic_load(&open_state) == 0 &&
        !shim_kernels_recorded()) {
        pthread_mutex_init(&open_lock, NULL);
        atomic_store(&claim_state, 0);
        claim_why[0] = '\0';
        shim_cfg.root = 0; /* the root is PROBE_ROOT_PID (PROBE_RANK_ROOT_PID), not this child */
        atomic_store(&shim_stats.filtered, 0);
        return;
    }
    atomic_store(&forked_child, 1);
    int n = atomic_load(&nfile_fds);
    if (n <= 0)
        return;
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0)
        return;
    for (int i = 0; i < n; ++i)
        dup2(nul, file_fds[i]);
    close(nul);
}


/* ---- per-rank capture files (docs/nccl.md "Per-rank files") ---------------
 * Under a multi-process launcher each rank writes its own file: when the
 * environment names a rank R of a world of size > 1, the capture file is
 * <stem>.rank<R><ext> (PROBE_OUT "on.h5" -> "on.rank0.h5"). The rank is
 * read from the first complete pair of: RANK/WORLD_SIZE (torchrun),
 * OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI's mpirun),
 * SLURM_PROCID/SLURM_NTASKS (srun). The first process of each rank file
 * (PROBE_RANK_ROOT_PID, set by it, inherited by its children) is that
 * file's root: it writes the file, empty, at exit if nothing tapped. The
 * run's root (the launcher, e.g. the torchrun agent, which has no rank)
 * that never tapped writes PROBE_OUT as an index capture instead: its
 * manifest lists the rank files next to it ("ranks"). */

const char *shim_env_raw(const char *name)
{
    size_t n = strlen(name);
    for (char **e = environ; e && *e; ++e)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

static int env_nonneg(const char *name, long *v)
{
    const char *s = shim_env_raw(name);
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || *end || x < 0 || x > 1000000)
        return -1;
    *v = x;
    return 1;
}

static void read_rank(void)
{
    static const char *const pairs[][2] = {{"RANK", "WORLD_SIZE"},
                                           {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                           {"SLURM_PROCID", "SLURM_NTASKS"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; ++i) {
        long r = 0, w = 0;
        int hr = env_nonneg(pairs[i][0], &r), hw = env_nonneg(pairs[i][1], &w);
        if (hr == 0 && hw == 0)
            continue;
        if (hr != 1 || hw != 1 || r >= w) {
            shim_warn("%s=%s / %s=%s do not name a rank of the world; no per-rank capture file "
                      "from them", pairs[i][0], shim_env_raw(pairs[i][0]) ? shim_env_raw(pairs[i][0]) : "",
                      pairs[i][1], shim_env_raw(pairs[i][1]) ? shim_env_raw(pairs[i][1]) : "");
            continue;
        }
        if (w > 1) {
            rank_self = (int)r;
            rank_world = (int)w;
            rank_source = pairs[i][0];
        }
        return;
    }
}

/* Split the basename of path at its extension: *ext points at the last '.'
 * of the basename (not a leading one), or at the end. */
static const char *ext_of(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    return dot && dot != base ? dot : path + strlen(path);
}

/* "<stem>.rank<R><ext>" for path (malloc'd). */
static char *rank_path(const char *path, int r)
{
    const char *ext = ext_of(path);
    size_t n = strlen(path) + 32;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%.*s.rank%d%s", (int)(ext - path), path, r, ext);
    return p;
}

struct rank_file {
    long rank;
    char *name;
};

static int cmp_rank_file(const void *a, const void *b)
{
    long x = ((const struct rank_file *)a)->rank, y = ((const struct rank_file *)b)->rank;
    return (x > y) - (x < y);
}

void shim_ranks_json(struct shim_json *b)
{
    if (rank_self >= 0 && !shim_env_raw("RANK")) { /* fallback pair: the manifest still says who */
        shim_json_printf(b, ",\"rank\":%d,\"world_size\":%d", rank_self, rank_world);
    }
    if (rank_self >= 0)
        shim_json_raw(b, ",\"rank_source\":"), shim_json_string(b, rank_source);
    shim_procs_json(b); /* procs.c: "process" or "processes" */
    if (!index_mode || !shim_cfg.out_path)
        return;
    const char *path = shim_cfg.out_path, *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path, *ext = ext_of(path);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    size_t stem_len = (size_t)(ext - base), ext_len = strlen(ext);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct rank_file *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        size_t len = strlen(nm);
        if (len <= stem_len + 5 + ext_len || strncmp(nm, base, stem_len) != 0 ||
            strncmp(nm + stem_len, ".rank", 5) != 0 || strcmp(nm + len - ext_len, ext) != 0)
            continue;
        const char *p = nm + stem_len + 5, *end = nm + len - ext_len;
        long r = 0;
        int ok = p < end && end - p <= 7;
        for (; ok && p < end; ++p) {
            if (*p < '0' || *p > '9')
                ok = 0;
            else
                r = r * 10 + (*p - '0');
        }
        if (!ok)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            struct rank_file *nv = realloc(v, nc * sizeof *nv);
            if (!nv)
                break;
            v = nv;
            cap = nc;
        }
        v[n].rank = r;
        v[n].name = strdup(nm);
        if (v[n].name)
            ++n;
    }
    closedir(d);
    if (n > 0) {
        qsort(v, n, sizeof *v, cmp_rank_file);
        shim_json_raw(b, ",\"ranks\":[");
        for (size_t i = 0; i < n; ++i) {
            if (i)
                shim_json_raw(b, ",");
            shim_json_string(b, v[i].name);
        }
        shim_json_raw(b, "]");
    }
    for (size_t i = 0; i < n; ++i)
        free(v[i].name);
    free(v);
}

/* ---- constructor ---------------------------------------------------------- */

static char *xstrdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void read_cmdline(void)
{
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
    }
    close(fd);
    if (!buf || len == 0) {
        free(buf);
        return;
    }
    if (buf[len - 1] != '\0') {
        if (len == cap) {
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                return;
            }
            buf = nb;
        }
        buf[len++] = '\0';
    }
    size_t argc = 0;
    for (size_t i = 0; i < len; ++i)
        argc += buf[i] == '\0';
    char **argv = malloc(argc * sizeof *argv);
    if (!argv) {
        free(buf);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1)
        argv[k++] = buf + i;
    shim_cfg.argv = argv;
    shim_cfg.argc = argc;
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

static void setup_nvtx(void)
{
    const char *self = shim_self_path();
    const char *cur = getenv("NVTX_INJECTION64_PATH");
    if (!cur || !*cur) {
        if (self)
            setenv("NVTX_INJECTION64_PATH", self, 1);
        else
            shim_cfg.nvtx_note = strdup("not injected: the shim's own path is unknown");
        return;
    }
    if (same_file(cur, self))
        return;
    size_t n = strlen(cur) + 64;
    shim_cfg.nvtx_note = malloc(n);
    if (shim_cfg.nvtx_note)
        snprintf(shim_cfg.nvtx_note, n, "not injected: NVTX_INJECTION64_PATH already set to %s", cur);
}

/* Replace an existing variable's value in the environment array itself
 * (the array main() received, when nothing added a variable before us), as
 * well as through setenv: a shell such as bash defines its own setenv and
 * imports its variables from main()'s array after our constructor ran. The
 * new string is never freed. */
static void replace_env(const char *name, const char *value)
{
    size_t nl = strlen(name), n = nl + strlen(value) + 2;
    char *entry = malloc(n);
    if (entry) {
        snprintf(entry, n, "%s=%s", name, value);
        for (char **e = environ; e && *e; ++e) {
            if (strncmp(*e, name, nl) == 0 && (*e)[nl] == '=') {
                *e = entry;
                break;
            }
        }
    }
    setenv(name, value, 1);
}

static size_t parse_queue_mb(const char *v)
{
    if (!v || !*v)
        return (size_t)DEFAULT_QUEUE_MB << 20;
    char *end;
    errno = 0;
    unsigned long long mb = strtoull(v, &end, 10);
    if (errno || *end || mb == 0 || mb > (1ull << 40)) {
        shim_warn_config("PROBE_QUEUE_MB=%s is not a positive number of MiB; using %u", v,
                         DEFAULT_QUEUE_MB);
        return (size_t)DEFAULT_QUEUE_MB << 20;
    }
    return (size_t)mb << 20;
}

static void shim_init_config(void);

__attribute__((constructor)) static void shim_init(void)
{
    config_warned_before = getenv("PROBE_CONFIG_WARNED") != NULL;
    in_constructor = 1;
    shim_init_config();
    in_constructor = 0;
}

static void shim_init_config(void)
{
    const char *out = getenv("PROBE_OUT");
    if (!out || !*out) {
        shim_cfg.mode = SHIM_INACTIVE;
        return;
    }
    long me = (long)getpid();
    const char *root = getenv("PROBE_ROOT_PID");
    if (!root || !*root) {
        /* Make PROBE_OUT absolute once, for this image and any exec'd one. */
        if (out[0] != '/') {
            char cwd[PATH_MAX];
            if (getcwd(cwd, sizeof cwd)) {
                size_t n = strlen(cwd) + strlen(out) + 2;
                char *abs = malloc(n);
                if (abs) {
                    snprintf(abs, n, "%s/%s", cwd, out);
                    replace_env("PROBE_OUT", abs);
                    free(abs);
                    out = getenv("PROBE_OUT");
                }
            }
        }
        char buf[32];
        snprintf(buf, sizeof buf, "%ld", me);
        setenv("PROBE_ROOT_PID", buf, 1);
        shim_cfg.root = 1;
    } else {
        char *end;
        errno = 0;
        long v = strtol(root, &end, 10);
        shim_cfg.root = !errno && !*end && v == me; /* the root's exec'd image */
    }
    shim_cfg.mode = SHIM_OWNER;
    read_rank();
    if (rank_self >= 0) {
        /* This rank's own file; its first process is that file's root. */
        shim_cfg.out_path = rank_path(out, rank_self);
        const char *rr = shim_env_raw("PROBE_RANK_ROOT_PID");
        char buf[32];
        snprintf(buf, sizeof buf, "%ld", me);
        if (!rr || !*rr) {
            setenv("PROBE_RANK_ROOT_PID", buf, 1);
            shim_cfg.root = 1;
        } else {
            shim_cfg.root = strcmp(rr, buf) == 0;
        }
    } else {
        shim_cfg.out_path = xstrdup(out);
    }
    shim_shard_config(); /* shard.c */
    shim_cfg.label = xstrdup(getenv("PROBE_LABEL"));
    const char *spec = getenv("PROBE_CAPTURE");
    shim_cfg.capture_spec = xstrdup(spec && *spec ? spec : "*");
    shim_capture_config(shim_cfg.capture_spec ? shim_cfg.capture_spec : "*"); /* tap.c */
    shim_stats_config();                                                       /* stats.c */
    shim_stats_for_config(getenv("PROBE_STATS_ONLY_FOR"));                     /* tap.c */
    shim_scope_config();                                                       /* scope.c */
    const char *lp = getenv("PROBE_LIBPROBE");
    shim_cfg.libprobe_path = lp && *lp ? xstrdup(lp) : NULL;
    shim_cfg.queue_max_bytes = parse_queue_mb(getenv("PROBE_QUEUE_MB"));
    shim_cuda_config(); /* cuda.c: PROBE_PINNED_MB */
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(shim_cfg.start_time, sizeof shim_cfg.start_time, "%Y-%m-%dT%H:%M:%SZ", &tm);
    read_cmdline();
    setup_nvtx();
    shim_inject_init();
    if (!shim_cfg.out_path) {
        shim_cfg.mode = SHIM_INACTIVE;
        return;
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    /* Safety net for an owner that never taps; a later registration at open
     * runs earlier (atexit is LIFO). */
    atexit(atexit_finalize);
}
