/* libprobe.c - load the HDF5-linked writer (libprobe.so) into the process
 * without putting HDF5 into the global symbol scope (docs/intercept.md
 * "What the shim links, and why": a preloaded libhdf5 breaks `import h5py`). */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/libprobe.h"
#include "base/resolve.h"
#include "base/shim.h"
#include "base/resolve.h"

struct shim_libprobe shim_libprobe_api;

/* See shim_libprobe_fork_prepare. */
static pthread_mutex_t hdf5_lock = PTHREAD_MUTEX_INITIALIZER;

static char self_path[PATH_MAX];
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static void find_self(void)
{
    Dl_info info;
    if (dladdr((void *)&find_self, &info) && info.dli_fname && info.dli_fname[0]) {
        if (!realpath(info.dli_fname, self_path))
            snprintf(self_path, sizeof self_path, "%s", info.dli_fname);
    }
}

const char *shim_libprobe_self_path(void)
{
    pthread_once(&self_once, find_self);
    return self_path[0] ? self_path : NULL;
}

/* RTLD_DEEPBIND makes libprobe and its HDF5 prefer their own symbols over
 * the process's; ASan and TSan refuse it (they must see every malloc and
 * every lock). */
static int dlopen_flags(void)
{
    int flags = RTLD_NOW | RTLD_LOCAL;
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    if (!shim_resolve_default("__asan_init") && !shim_resolve_default("__tsan_init"))
        flags |= RTLD_DEEPBIND;
#endif
    return flags;
}

static void *try_open(const char *path, char *why, size_t whylen)
{
    void *h = dlopen(path, dlopen_flags());
    if (!h) {
        const char *e = dlerror();
        size_t used = strlen(why);
        const char *parts[2] = {used ? "; " : "", e ? e : path};
        for (int i = 0; i < 2; ++i) { /* append, truncating */
            size_t n = strlen(parts[i]);
            if (used + n >= whylen)
                n = whylen - used - 1;
            memcpy(why + used, parts[i], n);
            used += n;
            why[used] = '\0';
        }
    }
    return h;
}

static probe_status load_locked(void);

/* dlopen runs under hdf5_lock too: a fork racing with it would copy the
 * loader's (and a sanitizer's) locks held into the child. */
probe_status shim_libprobe_load(void)
{
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = load_locked();
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

static probe_status load_locked(void)
{
    char why[1024] = "";
    void *h = NULL;
    if (shim_cfg.libprobe_path) {
        h = try_open(shim_cfg.libprobe_path, why, sizeof why);
    } else {
        const char *self = shim_libprobe_self_path();
        char dir[PATH_MAX], cand[PATH_MAX + 32];
        if (!self)
            return probe_set_error(PROBE_ENOTFOUND,
                                   "cannot locate libprobe.so: the shim's own path is unknown "
                                   "(set PROBE_LIBPROBE)");
        snprintf(dir, sizeof dir, "%s", self);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
        static const char *const names[] = {"libprobe.so.0", "libprobe.so"};
        for (size_t i = 0; i < 2 && !h; ++i) {
            snprintf(cand, sizeof cand, "%s/%s", dir, names[i]);
            h = try_open(cand, why, sizeof why);
        }
    }
    if (!h)
        return probe_set_error(PROBE_ENOTFOUND, "cannot load libprobe.so: %s", why);

    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"probe_writer_open_ex", (void **)&shim_libprobe_api.writer_open},
        {"probe_writer_put", (void **)&shim_libprobe_api.writer_put},
        {"probe_writer_skip", (void **)&shim_libprobe_api.writer_skip},
        {"probe_writer_set_manifest", (void **)&shim_libprobe_api.writer_set_manifest},
        {"probe_writer_flush", (void **)&shim_libprobe_api.writer_flush},
        {"probe_writer_close", (void **)&shim_libprobe_api.writer_close},
        {"probe_last_error", (void **)&shim_libprobe_api.last_error},
        {"probe_file_open", (void **)&shim_libprobe_api.file_open},
        {"probe_file_close", (void **)&shim_libprobe_api.file_close},
        {"probe_file_count", (void **)&shim_libprobe_api.file_count},
        {"probe_file_tensor", (void **)&shim_libprobe_api.file_tensor},
        {"probe_file_find", (void **)&shim_libprobe_api.file_find},
        {"probe_file_read_raw", (void **)&shim_libprobe_api.file_read_raw},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; ++i) {
        *syms[i].slot = shim_resolve_handle(h, syms[i].name);
        if (!*syms[i].slot) {
            memset(&shim_libprobe_api, 0, sizeof shim_libprobe_api);
            return probe_set_error(PROBE_ENOTFOUND, "libprobe.so lacks %s", syms[i].name);
        }
    }
    /* Optional (stats-only capture): NULL in a libprobe.so that predates them;
     * stats.c then writes full tensors and says so once. */
    shim_libprobe_api.writer_put_summary =
        (probe_status(*)(probe_writer *, const probe_record *, const probe_summary *, uint64_t))
            shim_resolve_handle(h, "probe_writer_put_summary");
    shim_libprobe_api.summary_compute = (probe_status(*)(probe_dtype, const void *, size_t, probe_summary *))
        shim_resolve_handle(h, "probe_summary_compute");
    shim_libprobe_api.capture_hash = (uint64_t(*)(const void *, size_t))shim_resolve_handle(h, "probe_capture_hash");
    shim_libprobe_api.summary_tree =
        (probe_status(*)(probe_dtype, const void *, size_t, probe_summary *, uint64_t *))
            shim_resolve_handle(h, "probe_summary_tree");
    shim_libprobe_api.writer_put_summary_ex =
        (probe_status(*)(probe_writer *, const probe_record *, const probe_summary *,
                         const uint64_t *, const uint64_t *))
            shim_resolve_handle(h, "probe_writer_put_summary_ex");
    shim_libprobe_api.writer_set_pack =
        (probe_status(*)(probe_writer *, size_t))shim_resolve_handle(h, "probe_writer_set_pack");
    shim_libprobe_api.writer_set_hash_thread =
        (probe_status(*)(probe_writer *, int))shim_resolve_handle(h, "probe_writer_set_hash_thread");
    shim_libprobe_api.writer_set_raw_files =
        (probe_status(*)(probe_writer *, unsigned))shim_resolve_handle(h, "probe_writer_set_raw_files");
    shim_libprobe_api.writer_put_begin =
        (probe_status(*)(probe_writer *, const probe_record *, size_t, probe_put **))
            shim_resolve_handle(h, "probe_writer_put_begin");
    shim_libprobe_api.writer_put_part =
        (probe_status(*)(probe_put *, const void *, size_t))shim_resolve_handle(h, "probe_writer_put_part");
    shim_libprobe_api.writer_put_end =
        (probe_status(*)(probe_put *))shim_resolve_handle(h, "probe_writer_put_end");
    shim_libprobe_api.writer_put_cancel =
        (void (*)(probe_put *))shim_resolve_handle(h, "probe_writer_put_cancel");
    shim_libprobe_api.rounded_fingerprint =
        (probe_status(*)(probe_dtype, const void *, size_t, probe_rounded_fingerprint *))
            shim_resolve_handle(h, "probe_rounded_fingerprint_compute");
    if (!shim_libprobe_api.writer_put_part || !shim_libprobe_api.writer_put_end ||
        !shim_libprobe_api.writer_put_cancel)
        shim_libprobe_api.writer_put_begin = NULL;
    return PROBE_OK; /* the handle stays open for the life of the process */
}

/* Every call into libprobe (and so HDF5) holds hdf5_lock, and fork() takes
 * it first (pthread_atfork prepare): a child is never forked while the
 * writer is inside HDF5. A thread-safe HDF5 (Debian's is) would otherwise be
 * copied with its global lock held, and the child's exit (HDF5's atexit
 * handler) would wait for it forever. */

void shim_libprobe_fork_prepare(void)
{
    pthread_mutex_lock(&hdf5_lock);
}

void shim_libprobe_fork_release(void)
{
    pthread_mutex_unlock(&hdf5_lock);
}

probe_status shim_libprobe_open(const char *path, const char *manifest, int append,
                                probe_writer **out)
{
    pthread_mutex_lock(&hdf5_lock);
    unsigned flags = PROBE_WRITER_CALLER_LOCKED | (append ? PROBE_WRITER_APPEND : 0);
    probe_status st = shim_libprobe_api.writer_open(path, manifest, flags, out);
    if (st == PROBE_OK && shim_cfg.pack_small > 0) {
        if (!shim_libprobe_api.writer_set_pack)
            shim_warn("libprobe.so has no probe_writer_set_pack: PROBE_PACK_SMALL=%zu ignored, every "
                      "tensor gets a dataset of its own", shim_cfg.pack_small);
        else if (shim_libprobe_api.writer_set_pack(*out, shim_cfg.pack_small) != PROBE_OK)
            shim_warn("PROBE_PACK_SMALL=%zu ignored: %s", shim_cfg.pack_small,
                      shim_libprobe_api.last_error());
    }
    /* a libprobe.so without the thread hashes on the writer's thread anyway */
    if (st == PROBE_OK && !shim_cfg.hash_thread && shim_libprobe_api.writer_set_hash_thread)
        shim_libprobe_api.writer_set_hash_thread(*out, 0);
    if (st == PROBE_OK && shim_cfg.raw_files > 0) {
        if (!shim_libprobe_api.writer_set_raw_files)
            shim_warn("libprobe.so has no probe_writer_set_raw_files: PROBE_RAW_FILES=%u ignored, "
                      "every tensor is written inside the capture file", shim_cfg.raw_files);
        else if (shim_libprobe_api.writer_set_raw_files(*out, shim_cfg.raw_files) != PROBE_OK)
            shim_warn("PROBE_RAW_FILES=%u ignored: %s", shim_cfg.raw_files,
                      shim_libprobe_api.last_error());
    }
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

void shim_hash_thread_config(void)
{
    const char *v = getenv("PROBE_HASH_THREAD");
    shim_cfg.hash_thread = 1;
    if (!v || !*v || !strcmp(v, "1"))
        return;
    if (!strcmp(v, "0"))
        shim_cfg.hash_thread = 0;
    else
        shim_warn_config("PROBE_HASH_THREAD=%s is not 0 or 1; the writer hashes on a thread of its "
                         "own (1)", v);
}

/* Environment variable v's text as a decimal count 0..max: 1 with *n set,
 * 0 when v is unset or empty, -1 when it is anything else (*n then 0). */
static int env_count(const char *v, unsigned long long max, unsigned long long *n)
{
    *n = 0;
    if (!v || !*v)
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || v[0] == '-' || x > max)
        return -1;
    *n = x;
    return 1;
}

void shim_raw_files_config(void)
{
    const char *v = getenv("PROBE_RAW_FILES");
    unsigned long long n;
    if (env_count(v, PROBE_RAW_FILES_MAX, &n) < 0)
        shim_warn_config("PROBE_RAW_FILES=%s is not a count of raw files (0..%u); every tensor is "
                         "written inside the capture file", v, PROBE_RAW_FILES_MAX);
    shim_cfg.raw_files = (unsigned)n;
}

void shim_pack_config(void)
{
    const char *v = getenv("PROBE_PACK_SMALL");
    unsigned long long n;
    if (env_count(v, PROBE_PACK_MAX_BYTES, &n) < 0)
        shim_warn_config("PROBE_PACK_SMALL=%s is not a byte count from 0 to %zu; every tensor gets a "
                         "dataset of its own", v, PROBE_PACK_MAX_BYTES);
    shim_cfg.pack_small = (size_t)n;
}

probe_status shim_libprobe_put(probe_writer *w, const probe_record *rec, const void *data, size_t nbytes)
{
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = shim_libprobe_api.writer_put(w, rec, data, nbytes);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

/* Stats-only record (probe_writer_put_summary), under the same lock. */
probe_status shim_libprobe_put_summary(probe_writer *w, const probe_record *rec, const probe_summary *sum,
                                const uint64_t *hash, const uint64_t *tree_hash)
{
    if (!hash && !(tree_hash && shim_libprobe_api.writer_put_summary_ex))
        return probe_set_error(PROBE_EINVAL, "a tree-hash-only record needs "
                                             "probe_writer_put_summary_ex, which libprobe.so lacks");
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = tree_hash && shim_libprobe_api.writer_put_summary_ex
                          ? shim_libprobe_api.writer_put_summary_ex(w, rec, sum, hash, tree_hash)
                          : shim_libprobe_api.writer_put_summary(w, rec, sum, *hash);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

probe_status shim_libprobe_put_begin(probe_writer *w, const probe_record *rec, size_t nbytes,
                                     probe_put **out)
{
    if (!shim_libprobe_api.writer_put_begin)
        return PROBE_EUNSUPPORTED;
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = shim_libprobe_api.writer_put_begin(w, rec, nbytes, out);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

probe_status shim_libprobe_put_part(probe_put *p, const void *data, size_t len)
{
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = shim_libprobe_api.writer_put_part(p, data, len);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

probe_status shim_libprobe_put_end(probe_put *p)
{
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = shim_libprobe_api.writer_put_end(p);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

void shim_libprobe_put_cancel(probe_put *p)
{
    pthread_mutex_lock(&hdf5_lock);
    shim_libprobe_api.writer_put_cancel(p);
    pthread_mutex_unlock(&hdf5_lock);
}

probe_status shim_libprobe_skip(probe_writer *w, const probe_record *rec, const char *reason)
{
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = shim_libprobe_api.writer_skip(w, rec, reason);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

probe_status shim_libprobe_set_manifest(probe_writer *w, const char *manifest)
{
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = shim_libprobe_api.writer_set_manifest(w, manifest);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

probe_status shim_libprobe_flush(probe_writer *w)
{
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = shim_libprobe_api.writer_flush(w);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

probe_status shim_libprobe_close(probe_writer *w)
{
    pthread_mutex_lock(&hdf5_lock);
    probe_status st = shim_libprobe_api.writer_close(w);
    pthread_mutex_unlock(&hdf5_lock);
    return st;
}

const char *shim_libprobe_error(void)
{
    const char *e = shim_libprobe_api.last_error ? shim_libprobe_api.last_error() : NULL;
    return e && *e ? e : "unknown error";
}
