/* file.c - the capture file of this process: which path (PROBE_OUT, the
 * rank's file, a per-process file), its claim, its lazy open, its close, and
 * what a forked child does with it.
 *
 * Ownership: LD_PRELOAD is inherited by every child, and the process that
 * runs the pipeline is often not the one probe-run started (`bash -c
 * 'python gen.py; ...'`, launcher scripts). The first process of the run
 * that taps claims the capture file: an exclusive flock(2) on it, held until
 * it exits, on a file that must be empty (probe-run empties it at start).
 * Every other process that taps finds the lock held or the file written and
 * does not capture (one `probe:` line). A process that the adapter names a
 * worker (probe_tap_sidecar_v1, capture/procs.c) claims its own per-process file
 * instead. A child forked after its parent claimed the file never captures;
 * one forked before is a fresh process of the run (it claims as any other).
 * The first process that loaded the shim (the root: PROBE_ROOT_PID) still
 * creates an empty capture at exit if no process of the run tapped. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "base/libprobe.h"
#include "base/manifest.h"
#include "base/shim.h"
#include "capture/exits.h"
#include "capture/file.h"
#include "capture/queue.h"
#include "capture/write.h"

/* Per-rank capture files (see "per-rank capture files" below). */
static int rank_self = -1, rank_world = -1;  /* from the environment, -1 none */
static const char *rank_source;               /* the variable pair used */
static int index_mode;                        /* close: the root wrote no tensors */

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int open_state; /* 0 not tried, 1 open, 2 failed */
static int (*take_fallback)(void);

static int claim_fd = -1;      /* holds the flock for the life of the process */
static char claim_why[PATH_MAX + 160];

/* Descriptors that refer to the capture file, so a forked child can point
 * them at /dev/null: whatever the child's copy of HDF5 flushes at its exit
 * then never reaches the parent's file. */
#define MAX_FILE_FDS 8
static int file_fds[MAX_FILE_FDS];
static atomic_int nfile_fds;

void shim_file_set_fallback(int (*take)(void))
{
    take_fallback = take;
}

const char *shim_file_claim_lost_reason(void)
{
    if (shim_forked_child()) {
        if (!claim_why[0])
            snprintf(claim_why, sizeof claim_why,
                     "it was forked from pid %ld, and a forked child never captures",
                     (long)getppid());
        return claim_why;
    }
    return shim_claim_state() == SHIM_CLAIM_LOST ? claim_why : "";
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

/* Claim the capture file for this process (see Ownership above): flock it
 * exclusively without blocking and require it to be an empty regular file.
 * Lost (state 2): the lock is held by another process, or the file already
 * holds a capture (an earlier process of this run wrote it, or it is an older
 * capture, which is never overwritten). A file that cannot be opened or is
 * not a regular file counts as won and disables capture with the one
 * warning line. Runs under open_lock. */
static void claim_locked(void)
{
    if (shim_claim_state() != SHIM_CLAIM_NONE)
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
        shim_set_claim_state(SHIM_CLAIM_OWN);
        shim_fail_io(why);
        atomic_store(&open_state, 2);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || fcntl(fd, F_SETFL, O_RDWR) != 0) {
        close(fd);
        shim_set_claim_state(SHIM_CLAIM_OWN);
        shim_fail_io("not a regular file");
        atomic_store(&open_state, 2);
        return;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 && (errno == EWOULDBLOCK || errno == EINTR)) {
        close(fd);
        if (take_fallback && take_fallback()) /* capture/procs.c: this process's own file instead */
            goto retry;
        snprintf(claim_why, sizeof claim_why,
                 "the capture file %s is being written by another process", shim_cfg.out_path);
        shim_set_claim_state(SHIM_CLAIM_LOST);
        return;
    }
    if (fstat(fd, &st) == 0 && st.st_size > 0 && !shim_exits_exec_continues(&st)) {
        close(fd); /* releases the lock */
        if (take_fallback && take_fallback())
            goto retry;
        snprintf(claim_why, sizeof claim_why,
                 "the capture file %s already holds a capture (written by an earlier process of "
                 "this run, or an older capture: probe-run empties it at start)",
                 shim_cfg.out_path);
        shim_set_claim_state(SHIM_CLAIM_LOST);
        return;
    }
    claim_fd = fd;
    shim_set_claim_state(SHIM_CLAIM_OWN);
}

void shim_file_claim(void)
{
    if (shim_claim_state() != SHIM_CLAIM_NONE)
        return;
    pthread_mutex_lock(&open_lock);
    claim_locked();
    pthread_mutex_unlock(&open_lock);
}

probe_status shim_file_open(void)
{
    shim_file_claim();
    if (shim_claim_state() == SHIM_CLAIM_LOST)
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
            st = shim_libprobe_open(shim_cfg.out_path, manifest, shim_exits_exec_continuing(), &w);
            if (st != PROBE_OK) {
                shim_fail_io(shim_libprobe_error());
            } else {
                remember_file_fds();
                st = shim_queue_start();
                if (st != PROBE_OK) {
                    shim_fail_io(probe_last_error());
                    shim_libprobe_close(w);
                } else {
                    shim_set_writer(w);
                    /* Registered after HDF5 (and usually the CUDA runtime)
                     * registered theirs, so it runs before their teardown. */
                    shim_atexit_finalize();
                    shim_exits_arm();
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
int shim_file_set_out_path(char *path)
{
    pthread_mutex_lock(&open_lock);
    int ok = shim_claim_state() == SHIM_CLAIM_NONE && atomic_load(&open_state) == 0 &&
             !shim_forked_child() && !shim_closed();
    if (ok)
        shim_cfg.out_path = path; /* the previous string stays valid: never freed */
    pthread_mutex_unlock(&open_lock);
    return ok ? 0 : -1;
}

/* ---- closing the file ----------------------------------------------------- */

int shim_file_open_at_exit(void)
{
    if (shim_claim_state() == SHIM_CLAIM_NONE && rank_self < 0)
        index_mode = 1; /* the run's root wrote no tensors: list the rank files, if any */
    if (atomic_load(&open_state) == 0 && !shim_disabled() && shim_file_open() != PROBE_OK)
        return 0;
    return atomic_load(&open_state) == 1;
}

/* After a write error the manifest says what was lost ("lost"), and the lost
 * paths follow in probe.skips: the manifest is flushed first, so a skip that
 * no longer fits leaves a file that still says so. Calls the writer refuses
 * (it failed half-way) leave the file as it was. */
void shim_file_close(void)
{
    probe_writer *w = shim_writer();
    if (!w)
        return;
    char *manifest = shim_manifest_build(1);
    int disabled_now = shim_disabled();
    if (manifest && shim_libprobe_set_manifest(w, manifest) == PROBE_OK && disabled_now &&
        shim_libprobe_flush(w) == PROBE_OK)
        shim_write_lost_skips(w);
    free(manifest);
    probe_status st = shim_libprobe_close(w);
    shim_set_writer(NULL);
    if (st == PROBE_EIO && !shim_disabled())
        shim_fail_io(shim_libprobe_error());
}

/* ---- fork ------------------------------------------------------------------ */

int shim_file_untouched(void)
{
    return shim_claim_state() != SHIM_CLAIM_OWN && atomic_load(&open_state) == 0;
}

void shim_file_fork_fresh(void)
{
    pthread_mutex_init(&open_lock, NULL);
    shim_set_claim_state(SHIM_CLAIM_NONE);
    claim_why[0] = '\0';
}

void shim_file_fork_detach(void)
{
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

/* "<stem>.rank<R><ext>" for path (malloc'd). */
static char *rank_path(const char *path, int r)
{
    const char *ext = shim_path_ext(path);
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

void shim_file_ranks_json(struct shim_json *b)
{
    if (rank_self >= 0 && !shim_env_raw("RANK")) { /* fallback pair: the manifest still says who */
        shim_json_printf(b, ",\"rank\":%d,\"world_size\":%d", rank_self, rank_world);
    }
    if (rank_self >= 0)
        shim_json_raw(b, ",\"rank_source\":"), shim_json_string(b, rank_source);
    if (!index_mode || !shim_cfg.out_path)
        return;
    const char *path = shim_cfg.out_path, *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path, *ext = shim_path_ext(path);
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

void shim_file_config(const char *out)
{
    read_rank();
    if (rank_self >= 0) {
        /* This rank's own file; its first process is that file's root. */
        shim_cfg.out_path = rank_path(out, rank_self);
        const char *rr = shim_env_raw("PROBE_RANK_ROOT_PID");
        char buf[32];
        snprintf(buf, sizeof buf, "%ld", (long)getpid());
        if (!rr || !*rr) {
            setenv("PROBE_RANK_ROOT_PID", buf, 1);
            shim_cfg.root = 1;
        } else {
            shim_cfg.root = strcmp(rr, buf) == 0;
        }
    } else {
        shim_cfg.out_path = out ? strdup(out) : NULL;
    }
}
