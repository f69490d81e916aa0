/* life.c - the life cycle of the preloaded library, the one file that calls
 * into every layer (base/shim.h lists them): the constructor reads the
 * configuration (nothing heavy: the capture file opens at the first tap,
 * capture/file.c), registers the manifest's sections in their order and
 * the hooks that let lower layers call upward without knowing who answers;
 * the fork handlers; and the finalizer that drains the queue and closes the
 * file at exit. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/libprobe.h"
#include "base/libprobe_cuda.h"
#include "base/manifest.h"
#include "base/shim.h"
#include "capture/cuda.h"
#include "capture/exits.h"
#include "capture/file.h"
#include "capture/inject.h"
#include "capture/procs.h"
#include "capture/queue.h"
#include "capture/scope.h"
#include "capture/select.h"
#include "capture/shard.h"
#include "capture/stats.h"
#include "capture/weights.h"
#include "capture/write.h"
#include "hooks/gemm.h"
#include "hooks/graphs.h"
#include "hooks/kernels.h"
#include "hooks/nccl.h"

extern char **environ;

#define DEFAULT_QUEUE_MB 2048u

/* ---- exit ---------------------------------------------------------------- */

/* Drain and close. Runs once, in the owner only, from the latest-registered
 * of the shim's atexit handlers (after the first device copy: before the
 * CUDA runtime's teardown; else the one registered at open: before HDF5's),
 * or from the constructor-registered handler or the ELF destructor, or early
 * through shim_finalize_now / shim_close_now. If nothing was ever tapped,
 * the file is still created, with the manifest and no tensors. CUDA is
 * called only when it is known to be alive (see shim_exit_after_cuda);
 * otherwise the CUDA facts are those gathered at the first device tap or at
 * probe_tap_flush_v1, and pending device copies are recorded as skipped. */
static void finalize(void)
{
    shim_procs_exit_check();
    if (shim_is_foreign_process())
        return;
    if (shim_set_closed())
        return;
    if (shim_claim_state() == SHIM_CLAIM_NONE && (!shim_cfg.root || shim_procs_sidecar()))
        return; /* never tapped, not the root: another process writes the file, or the root */
    if (!shim_file_open_at_exit())
        return;
    unsigned timeout_ms = shim_stop_timeout_ms();
    if (!shim_queue_stop(timeout_ms)) {
        shim_warn("capture file %s may be incomplete: the writer did not finish within %.3g s at exit",
                  shim_cfg.out_path, timeout_ms / 1000.0);
        return; /* the writer thread still uses the file: leave it */
    }
    if (shim_cuda_alive_at_exit())
        shim_cuda_info_refresh();
    shim_inject_finish();
    shim_file_close();
}

__attribute__((destructor)) static void shim_fini(void)
{
    if (shim_cfg.mode == SHIM_OWNER)
        finalize();
}

/* ---- fork ---------------------------------------------------------------- */

static void atfork_prepare(void)
{
    shim_libprobe_fork_prepare();
}

static void atfork_parent(void)
{
    shim_libprobe_fork_release();
}

/* Child side of fork(). A parent that had neither claimed nor opened a
 * capture file, nor recorded anything for it (kernel launches are written
 * into its manifest at exit), has no writer thread and no file in HDF5: the
 * child is a fresh process of the run and claims at its first tap like any
 * other (a lost claim of the parent is forgotten; the child tries again).
 * Otherwise: no capture, no CUDA, no HDF5, and only async-signal-safe calls:
 * the capture file's descriptors are redirected to /dev/null, so whatever
 * the child's copy of HDF5 writes at its exit (HDF5 closes open files from
 * an atexit handler) never reaches the parent's file. */
static void atfork_child(void)
{
    shim_libprobe_fork_release();
    if (shim_file_untouched() && !shim_kernels_recorded()) {
        shim_file_fork_fresh();
        shim_cfg.root = 0; /* the root is PROBE_ROOT_PID (PROBE_RANK_ROOT_PID), not this child */
        atomic_store(&shim_counts.filtered, 0);
        return;
    }
    shim_set_forked_child();
    shim_file_fork_detach();
}

/* ---- manifest sections, in the order the manifest lists them --------------- */

static void register_sections(void)
{
    shim_manifest_add("cuda", 1, shim_cuda_info_json);
    shim_manifest_add("staging", 1, shim_cuda_staging_json);
    shim_manifest_add("lost", 1, shim_write_lost_json);
    shim_manifest_add("nvidia_driver", 1, shim_manifest_driver_json);
    shim_manifest_add("inject", 0, shim_inject_json);
    shim_manifest_add(NULL, 0, shim_stats_json);
    shim_manifest_add(NULL, 1, shim_select_items_json);
    shim_manifest_add(NULL, 0, shim_scope_json);
    shim_manifest_add(NULL, 0, shim_gemm_json);
    shim_manifest_add(NULL, 0, shim_weights_json);
    shim_manifest_add("kernels", 0, shim_kernels_json);
    shim_manifest_add(NULL, 0, shim_nccl_json);
    shim_manifest_add(NULL, 0, shim_shard_json);
    shim_manifest_add(NULL, 0, shim_file_ranks_json);
    shim_manifest_add(NULL, 0, shim_procs_json);
    shim_manifest_add(NULL, 0, shim_exits_exec_json);
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
    const char *self = shim_libprobe_self_path();
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
    shim_warn_config_begin();
    shim_init_config();
    shim_warn_config_end();
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
    shim_file_config(out);
    shim_shard_config();
    shim_cfg.label = xstrdup(getenv("PROBE_LABEL"));
    const char *spec = getenv("PROBE_CAPTURE");
    shim_cfg.capture_spec = xstrdup(spec && *spec ? spec : "*");
    shim_select_config(shim_cfg.capture_spec ? shim_cfg.capture_spec : "*");
    shim_stats_config();
    shim_pack_config();
    shim_hash_thread_config();
    shim_raw_files_config();
    shim_libprobe_cuda_config();
    shim_select_stats_for_config(getenv("PROBE_STATS_ONLY_FOR"));
    shim_scope_config();
    const char *lp = getenv("PROBE_LIBPROBE");
    shim_cfg.libprobe_path = lp && *lp ? xstrdup(lp) : NULL;
    shim_cfg.queue_max_bytes = parse_queue_mb(getenv("PROBE_QUEUE_MB"));
    shim_cuda_config(); /* PROBE_PINNED_MB */
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
    shim_set_finalizer(finalize);
    shim_file_set_fallback(shim_procs_take_fallback);
    register_sections();
    shim_queue_set_hooks(shim_cuda_grow_staging, shim_cuda_staging_starved, shim_cuda_close_staging);
    shim_cuda_set_graph_skip_hook(shim_graphs_note_skip);
    /* Safety net for an owner that never taps; a later registration at open
     * runs earlier (atexit is LIFO). */
    shim_atexit_finalize();
}

