/* probe/capture/writer.c - the capture-file writer (include/probe/capture.h,
 * docs/file-format.md).
 *
 * One HDF5 dataset per tensor, contiguous, with probe.* attributes; root
 * attributes probe.format, probe.version, probe.manifest, probe.skips.
 * Every HDF5 call runs inside H5E_BEGIN_TRY/H5E_END_TRY: the library never
 * prints an HDF5 error stack (the same libhdf5 may serve the user's h5py, so
 * printing is suppressed per call, never globally). The file is flushed at
 * most every FLUSH_INTERVAL while the journal covers the puts (after every
 * record when there is no journal), so that a later failure leaves the
 * tensors written so far readable.
 *
 * Crash consistency: a kill during HDF5's flush can leave its metadata half
 * updated, so every completed put, skip and manifest change is also appended
 * to the journal <path>.journal (probe/capture/journal.c) with one write(2), once
 * the tensor's bytes are in the file (no sieve buffer: raw data reaches the
 * file at H5Dwrite; packed bytes are written with pwrite). The raw bytes of a
 * completed put are never moved or overwritten (contiguous storage is
 * allocated once and only freed by deleting the dataset, which happens only
 * to a put that failed; pack chunks are never deleted), so the journal's
 * offsets stay valid whatever HDF5 does to its metadata later. A clean close
 * removes the journal.
 *
 * The packed layout (probe_writer_set_pack, docs/file-format.md "Packed small
 * tensors"): small tensors go into shared chunks /probe.pack/NNNN/{data,index}.
 */
#include "probe/capture.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "h5types.h"
#include "hasher.h"
#include "lanes.h"
#include "journal.h"

/* Room kept beyond the payload before each write. HDF5's metadata for one
 * tensor (object header, attributes, heaps, B-tree growth) is a few KiB;
 * tensors ask for far more than root attributes do, so that when tensors are
 * refused for lack of space there is still room to write probe.skips and
 * probe.manifest and close the file. */
#define SLACK_TENSOR (1u << 20)
#define SLACK_ROOT (64u << 10)
#define SLACK_JOURNAL (64u << 10) /* journal room kept for the records that close a capture */
/* File blocks reserved past what a write needs, so that most puts find them
 * reserved already (one fallocate per RESERVE_AHEAD bytes of growth). */
#define RESERVE_AHEAD ((uint64_t)4 << 20)
/* With a journal, a put flushes HDF5 at most this often (seconds): the
 * journal, not HDF5's metadata, is what a killed process leaves readable. */
#define FLUSH_INTERVAL 0.5

/* A set of strings (open addressing, XXH64). */
typedef struct {
    char **slot;
    size_t cap, n; /* cap is 0 or a power of two */
} pathset;

static size_t pathset_pos(const pathset *ps, const char *key, size_t len)
{
    size_t m = ps->cap - 1, i = (size_t)XXH64(key, len, 0) & m;
    while (ps->slot[i] != NULL && (strncmp(ps->slot[i], key, len) != 0 || ps->slot[i][len] != '\0'))
        i = (i + 1) & m;
    return i;
}

/* 1 when the first len bytes of key are in the set. */
static int pathset_has(const pathset *ps, const char *key, size_t len)
{
    return ps->cap != 0 && ps->slot[pathset_pos(ps, key, len)] != NULL;
}

/* Add the first len bytes of key; 0, or -1 out of memory. */
static int pathset_add(pathset *ps, const char *key, size_t len)
{
    if (2 * (ps->n + 1) > ps->cap) {
        pathset bigger = {calloc(ps->cap ? 2 * ps->cap : 256, sizeof(char *)),
                          ps->cap ? 2 * ps->cap : 256, 0};
        if (bigger.slot == NULL)
            return -1;
        for (size_t i = 0; i < ps->cap; i++)
            if (ps->slot[i] != NULL) {
                bigger.slot[pathset_pos(&bigger, ps->slot[i], strlen(ps->slot[i]))] = ps->slot[i];
                bigger.n++;
            }
        free(ps->slot);
        *ps = bigger;
    }
    size_t i = pathset_pos(ps, key, len);
    if (ps->slot[i] != NULL)
        return 0;
    if ((ps->slot[i] = strndup(key, len)) == NULL)
        return -1;
    ps->n++;
    return 0;
}

static void pathset_free(pathset *ps)
{
    for (size_t i = 0; i < ps->cap; i++)
        free(ps->slot[i]);
    free(ps->slot);
    memset(ps, 0, sizeof *ps);
}

struct probe_writer {
    hid_t file;
    int fd;             /* the HDF5 sec2 driver's descriptor, -1 unknown */
    int can_reserve;    /* fallocate works on this file system (so far) */
    uint64_t reserved_end; /* file blocks are reserved up to this offset */
    char *path;         /* the file's name, for messages */
    char *manifest;     /* current manifest JSON text, or NULL */
    int manifest_dirty; /* probe.manifest on disk differs from manifest */
    json_t *skips;      /* array of {"path", "reason"} */
    size_t skips_written; /* entries in probe.skips on disk */
    size_t skips_bytes;   /* approximate length of skips as JSON text */
    probe_status failed;  /* PROBE_OK, or the error of a write that failed half-way */
    char failure[512];    /* its message */
    probe_journal *journal; /* <path>.journal: removed by a clean close */
    double last_flush;    /* CLOCK_MONOTONIC seconds of the last H5Fflush */
    int unflushed;        /* puts since the last H5Fflush */
    probe_put *open_put;  /* the streamed put in progress (probe_writer_put_begin), or NULL */
    int hash_thread;      /* a streamed part of HASH_BESIDE_MIN bytes or more is hashed on a
                             thread of its own while this one writes it (probe_writer_set_hash_thread) */
    probe_hasher *hasher; /* that thread, started at the first such part; NULL: none (yet) */
    int hasher_failed;    /* it could not be started: parts are hashed on the caller's thread */
    int appended;         /* opened with PROBE_WRITER_APPEND */
    probe_lanes *lanes;   /* the raw files (probe_writer_set_raw_files), or NULL */
    unsigned raw_next;    /* the lane the next raw tensor starts on */
    struct {              /* the packed layout (probe_writer_set_pack) */
        size_t max;       /* tensors of at most max bytes are packed; 0: none */
        unsigned next;    /* number of the next chunk (/probe.pack/NNNN) */
        int open;         /* a chunk is open: the fields below describe it */
        char name[40];    /* its group, "/probe.pack/NNNN" */
        uint64_t addr;    /* its data's file address */
        uint64_t cap, used; /* its data's size and the bytes used */
        hid_t index;      /* its index dataset */
        unsigned char *idx; /* its index's bytes (magic, header, records) */
        size_t idx_len, idx_cap, idx_written; /* ... of which idx_written are in the file */
        pathset paths;    /* every packed tensor's path */
        pathset groups;   /* every proper prefix of those paths ("/a", "/a/b") */
    } pack;
};

#define PACK_ROOT "/probe.pack" /* the group of the packed layout's chunks */

static probe_status pack_write_index(probe_writer *w);
static probe_status check_packed_free(const probe_writer *w, const char *path);
static int pack_remember(probe_writer *w, const char *path);

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- attributes (call inside H5E_BEGIN_TRY) --- */

/* Create attribute name of file type ftype from buf in memory type mtype.
 * Root attributes (obj is the file) are rewritten, so an old one is deleted
 * first; a dataset is new when its attributes are written. */
static herr_t attr_write(hid_t obj, const char *name, hid_t ftype, hid_t mtype, hid_t space,
                         const void *buf)
{
    if (H5Iget_type(obj) == H5I_FILE && H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0)
        return -1;
    hid_t a = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0)
        return -1;
    herr_t r = H5Awrite(a, mtype, buf);
    if (H5Aclose(a) < 0)
        r = -1;
    return r;
}

/* Scalar variable-length UTF-8 string: h5py reads it as str. */
static herr_t attr_write_str(hid_t obj, const char *name, const char *value)
{
    hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate(H5S_SCALAR);
    herr_t r = -1;
    if (t >= 0 && s >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0 &&
        H5Tset_cset(t, H5T_CSET_UTF8) >= 0)
        r = attr_write(obj, name, t, t, s, &value);
    if (t >= 0)
        H5Tclose(t);
    if (s >= 0)
        H5Sclose(s);
    return r;
}

/* Scalar number of file type ftype from *v in memory type mtype. */
static herr_t attr_write_scalar(hid_t obj, const char *name, hid_t ftype, hid_t mtype, const void *v)
{
    hid_t s = H5Screate(H5S_SCALAR);
    if (s < 0)
        return -1;
    herr_t r = attr_write(obj, name, ftype, mtype, s, v);
    H5Sclose(s);
    return r;
}

/* probe.shape: int64 array of rank entries; rank 0 is an empty array (a
 * simple dataspace of one dimension of size 0), which h5py reads as
 * array([], dtype=int64). */
static herr_t attr_write_shape(hid_t obj, int rank, const int64_t *shape)
{
    hsize_t n = (hsize_t)rank;
    static const int64_t none = 0;
    hid_t s = H5Screate_simple(1, &n, NULL);
    if (s < 0)
        return -1;
    herr_t r = attr_write(obj, "probe.shape", H5T_STD_I64LE, H5T_NATIVE_INT64, s,
                          rank > 0 ? (const void *)shape : &none);
    H5Sclose(s);
    return r;
}

/* --- errors --- */

/* The directory part of path ("." if none), malloc'd; NULL if out of memory. */
static char *parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        return strdup(".");
    return strndup(path, slash == path ? 1 : (size_t)(slash - path));
}

/* The reason a file at path cannot be created, from the OS's point of view:
 * missing directory, permission, a directory in the way; else HDF5's text. */
static void create_reason(const char *path, char *buf, size_t size)
{
    char hdf5_text[256];
    probe_h5_error_text(hdf5_text, sizeof hdf5_text);
    char *dir = parent_dir(path);
    if (dir == NULL) {
        snprintf(buf, size, "%s", hdf5_text);
        return;
    }
    struct stat st;
    if (stat(dir, &st) != 0)
        snprintf(buf, size, "directory %s: %s", dir, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        snprintf(buf, size, "%s is not a directory", dir);
    else if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(buf, size, "%s", strerror(EISDIR));
    else if (access(dir, W_OK) != 0)
        snprintf(buf, size, "directory %s: %s", dir, strerror(errno));
    else if (access(path, F_OK) == 0 && access(path, W_OK) != 0)
        snprintf(buf, size, "%s", strerror(errno));
    else
        snprintf(buf, size, "%s", hdf5_text);
    free(dir);
}

static probe_status h5_fail(const probe_writer *w, const char *what, const char *obj)
{
    char text[256];
    probe_h5_error_text(text, sizeof text);
    if (obj != NULL)
        return probe_set_error(PROBE_EIO, "%s: %s: %s (%s)", w->path, obj, what, text);
    return probe_set_error(PROBE_EIO, "%s: %s (%s)", w->path, what, text);
}

/* --- failure handling --- */

/* Before a write of about payload bytes: make sure HDF5's writes up to the
 * next preflight cannot run out of space, or fail with PROBE_EIO touching
 * nothing. HDF5 1.10 does not recover from a flush that fails half-way (its
 * metadata cache is left inconsistent, H5Fclose fails, and the failed close
 * leaves a dangling handle that crashes the process at exit), so a full disk
 * must be found before HDF5 writes:
 *   - the process's file size limit (RLIMIT_FSIZE) is checked;
 *   - the file's blocks from its current end to its allocated size plus the
 *     payload plus slack are reserved with fallocate(KEEP_SIZE),
 *     so another process filling the disk cannot take them;
 *   - where fallocate is not supported (some network file systems) the free
 *     space (fstatvfs) is checked instead. */
/* PROBE_EIO unless the file system described by vfs has need bytes free
 * (plus extra bytes that will be freed first). */
static probe_status check_free_space(const struct statvfs *vfs, uint64_t extra, uint64_t need,
                                     const char *path, const char *obj)
{
    if (vfs->f_frsize == 0)
        return PROBE_OK;
    uint64_t blocks = geteuid() == 0 ? (uint64_t)vfs->f_bfree : (uint64_t)vfs->f_bavail;
    uint64_t avail = blocks > UINT64_MAX / vfs->f_frsize ? UINT64_MAX : blocks * vfs->f_frsize;
    avail = avail > UINT64_MAX - extra ? UINT64_MAX : avail + extra;
    if (avail < need)
        return probe_set_error(PROBE_EIO, "%s: %s: not written: %s (%llu bytes free, about %llu needed)",
                               path, obj, strerror(ENOSPC), (unsigned long long)avail,
                               (unsigned long long)need);
    return PROBE_OK;
}

static probe_status check_fsize_limit(uint64_t end, const char *path, const char *obj)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && end > (uint64_t)rl.rlim_cur)
        return probe_set_error(PROBE_EIO,
                               "%s: %s: not written: %s (the file would pass the size limit RLIMIT_FSIZE of %llu bytes)",
                               path, obj, strerror(EFBIG), (unsigned long long)rl.rlim_cur);
    return PROBE_OK;
}

static probe_status preflight(probe_writer *w, const char *obj, uint64_t payload, uint64_t slack)
{
    uint64_t need = payload + slack;
    hsize_t size = 0;
    H5E_BEGIN_TRY {
        if (H5Fget_filesize(w->file, &size) < 0) /* max(end of allocation, end of file) */
            size = 0;
    } H5E_END_TRY;
    uint64_t end = (uint64_t)size + need;
    probe_status s = check_fsize_limit(end, w->path, obj);
    if (s != PROBE_OK)
        return s;
    if (w->fd < 0 || end <= w->reserved_end)
        return PROBE_OK;
    struct stat st;
    if (w->can_reserve && fstat(w->fd, &st) == 0 && (uint64_t)st.st_size < end) {
        if (fallocate(w->fd, FALLOC_FL_KEEP_SIZE, st.st_size,
                      (off_t)(end + RESERVE_AHEAD - (uint64_t)st.st_size)) == 0) {
            w->reserved_end = end + RESERVE_AHEAD;
            return PROBE_OK;
        }
        if (fallocate(w->fd, FALLOC_FL_KEEP_SIZE, st.st_size, (off_t)(end - (uint64_t)st.st_size)) == 0) {
            w->reserved_end = end; /* no room for the extra: reserve what this write needs */
            return PROBE_OK;
        }
        int e = errno;
        if (e == ENOSPC || e == EDQUOT || e == EFBIG)
            return probe_set_error(PROBE_EIO, "%s: %s: not written: %s (reserving %llu bytes)", w->path,
                                   obj, strerror(e), (unsigned long long)(end - (uint64_t)st.st_size));
        w->can_reserve = 0; /* EOPNOTSUPP and the like: check the free space instead */
    }
    struct statvfs vfs;
    if (fstatvfs(w->fd, &vfs) == 0)
        return check_free_space(&vfs, 0, need, w->path, obj);
    return PROBE_OK;
}

/* Give back the blocks reserved beyond the end of the file (before close,
 * after a successful flush). Best effort. */
static void release_reservation(probe_writer *w)
{
    hsize_t size = 0;
    struct stat st;
    if (w->fd < 0 || w->reserved_end == 0 || fstat(w->fd, &st) != 0)
        return;
    H5E_BEGIN_TRY {
        if (H5Fget_filesize(w->file, &size) < 0)
            size = 0;
    } H5E_END_TRY;
    uint64_t from = (uint64_t)st.st_size > (uint64_t)size ? (uint64_t)st.st_size : (uint64_t)size;
    if (w->reserved_end > from)
        fallocate(w->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)from,
                  (off_t)(w->reserved_end - from));
    w->reserved_end = 0;
}

/* A write failed after HDF5 started it: from now on nothing more is written
 * (the file keeps what the last successful flush put there). Returns s. */
static probe_status mark_failed(probe_writer *w, probe_status s)
{
    if (w->failed == PROBE_OK) {
        w->failed = s;
        snprintf(w->failure, sizeof w->failure, "%s", probe_last_error());
    }
    return s;
}

/* A journal append failed (HDF5 itself is fine): flush HDF5 first, so that
 * the file holds every put that returned PROBE_OK without the journal, then
 * stop writing. Returns s. */
static probe_status journal_failed(probe_writer *w, probe_status s)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", probe_last_error());
    if (w->failed == PROBE_OK && w->unflushed > 0) {
        H5E_BEGIN_TRY {
            if (H5Fflush(w->file, H5F_SCOPE_LOCAL) >= 0)
                w->unflushed = 0;
        } H5E_END_TRY;
    }
    probe_set_error(s, "%s", msg);
    return mark_failed(w, s);
}

static probe_status check_usable(const probe_writer *w)
{
    if (w->failed != PROBE_OK)
        return probe_set_error(PROBE_EIO, "%s: not written: an earlier write failed (%s)", w->path,
                               w->failure);
    return PROBE_OK;
}

/* --- root attributes --- */

static probe_status write_skips(probe_writer *w)
{
    probe_status s = preflight(w, "root attribute probe.skips", w->skips_bytes, SLACK_ROOT);
    if (s != PROBE_OK)
        return s;
    char *text = json_dumps(w->skips, JSON_COMPACT);
    if (text == NULL)
        return probe_set_error(PROBE_ENOMEM, "%s: cannot format probe.skips", w->path);
    H5E_BEGIN_TRY {
        if (attr_write_str(w->file, "probe.skips", text) < 0)
            s = mark_failed(w, h5_fail(w, "cannot write root attribute probe.skips", NULL));
    } H5E_END_TRY;
    free(text);
    if (s == PROBE_OK)
        w->skips_written = json_array_size(w->skips);
    return s;
}

/* Write (or, for a NULL manifest, delete) the root attribute probe.manifest. */
static probe_status write_manifest(probe_writer *w)
{
    probe_status s = preflight(w, "root attribute probe.manifest",
                               w->manifest != NULL ? strlen(w->manifest) : 0, SLACK_ROOT);
    if (s != PROBE_OK)
        return s;
    H5E_BEGIN_TRY {
        if (w->manifest != NULL) {
            if (attr_write_str(w->file, "probe.manifest", w->manifest) < 0)
                s = mark_failed(w, h5_fail(w, "cannot write root attribute probe.manifest", NULL));
        } else if (H5Aexists(w->file, "probe.manifest") > 0 &&
                   H5Adelete(w->file, "probe.manifest") < 0) {
            s = mark_failed(w, h5_fail(w, "cannot delete root attribute probe.manifest", NULL));
        }
    } H5E_END_TRY;
    if (s == PROBE_OK)
        w->manifest_dirty = 0;
    return s;
}

/* Write pending root attributes and flush HDF5's caches to the file. With
 * after_put set, probe.skips is rewritten only once the list has grown by
 * half since it was last written (so rewriting it costs time linear in its
 * final size), a root attribute refused for lack of space stays pending
 * without failing the put (the tensor itself was written), and, while the
 * writer keeps a journal, nothing is done until FLUSH_INTERVAL has passed
 * since the last flush. */
static probe_status flush_file(probe_writer *w, int after_put)
{
    probe_status s = PROBE_OK;
    double t = mono_now();
    if (after_put) {
        w->unflushed++;
        if (w->journal != NULL && t - w->last_flush < FLUSH_INTERVAL)
            return PROBE_OK;
    }
    if (w->manifest_dirty)
        s = write_manifest(w);
    size_t n = json_array_size(w->skips);
    if (s == PROBE_OK && n != w->skips_written &&
        (!after_put || n >= w->skips_written + w->skips_written / 2 + 1))
        s = write_skips(w);
    if (s == PROBE_OK && w->pack.open) {
        H5E_BEGIN_TRY { s = pack_write_index(w); } H5E_END_TRY;
    }
    if (w->failed != PROBE_OK)
        return s;
    if (after_put)
        s = PROBE_OK;
    H5E_BEGIN_TRY {
        if (H5Fflush(w->file, H5F_SCOPE_LOCAL) < 0)
            s = mark_failed(w, h5_fail(w, "cannot flush", NULL));
    } H5E_END_TRY;
    if (w->failed == PROBE_OK) {
        w->last_flush = t;
        w->unflushed = 0;
    }
    return s;
}

static probe_status check_manifest(const char *manifest_json, const char *path)
{
    if (manifest_json == NULL)
        return PROBE_OK;
    json_error_t err;
    json_t *j = json_loads(manifest_json, JSON_DECODE_ANY, &err);
    if (j == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: manifest is not valid JSON (line %d column %d: %s)",
                               path, err.line, err.column, err.text);
    json_decref(j);
    return PROBE_OK;
}

/* --- open --- */

/* The writer's file access properties (negative on failure; call inside
 * H5E_BEGIN_TRY):
 *   - the file is locked (but works on file systems without flock), unless
 *     the caller holds the lock: a second flock from this process would fail;
 *   - no sieve buffer: raw data goes to the file at H5Dwrite, so the bytes a
 *     journal TENSOR record names are in the file before the next flush. */
static hid_t writer_fapl(unsigned flags)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0)
        return fapl;
#if H5_VERSION_GE(1, 10, 7)
    H5Pset_file_locking(fapl, (flags & PROBE_WRITER_CALLER_LOCKED) ? 0 : 1, 1);
#else
    (void)flags;
#endif
    if (H5Pset_sieve_buf_size(fapl, 0) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    return fapl;
}

/* PROBE_WRITER_APPEND (capture.h): open w->path, a cleanly closed capture,
 * for writing. Its tensors are read with the reader first (attributes,
 * probe.op, hash, summaries, skips), then the file is opened read-write and
 * each full tensor's TENSOR record, with its bytes' offset, each stats-only
 * record's SUMMARY record and each skip's SKIP record start the new journal. */
static probe_status open_append(probe_writer *w, unsigned flags)
{
    const char *path = w->path;
    size_t jn = strlen(path) + sizeof PROBE_JOURNAL_SUFFIX;
    char *jpath = malloc(jn);
    if (jpath == NULL)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    snprintf(jpath, jn, "%s%s", path, PROBE_JOURNAL_SUFFIX);
    struct stat jst;
    int has_journal = lstat(jpath, &jst) == 0;
    free(jpath);
    if (has_journal)
        return probe_set_error(PROBE_ESTATE, "%s: cannot append: a journal is next to it (its writer "
                               "did not close it; recover it first)", path);
    probe_file *f = NULL;
    probe_status s = (flags & PROBE_WRITER_CALLER_LOCKED) ? probe_file_open_unlocked_(path, &f)
                                                          : probe_file_open(path, &f);
    if (s != PROBE_OK)
        return s;
    size_t n = probe_file_count(f), ns = probe_file_skip_count(f);
    probe_tensor_info *info = n ? calloc(n, sizeof *info) : NULL;
    char **ops = n ? calloc(n, sizeof *ops) : NULL;
    uint64_t *hashes = n ? calloc(n, sizeof *hashes) : NULL;
    uint64_t *packed = n ? calloc(n, sizeof *packed) : NULL;
    probe_summary *sums = n ? calloc(n, sizeof *sums) : NULL;
    unsigned char *nosum = n ? calloc(n, 1) : NULL; /* a stats-only record that cannot be read */
    if (n && (info == NULL || ops == NULL || hashes == NULL || packed == NULL || sums == NULL ||
              nosum == NULL))
        s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; s == PROBE_OK && i < n; i++) {
        info[i] = *probe_file_tensor(f, i);
        packed[i] = probe_file_packed_addr_(f, i);
        if (packed[i] != PROBE_JOURNAL_NO_OFFSET && pack_remember(w, info[i].path) != 0)
            s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
        if (info[i].stats_only && probe_file_summary(f, i, &sums[i]) != PROBE_OK)
            nosum[i] = 1;
        if (probe_file_tensor_attr(f, i, "probe.op", &ops[i]) != PROBE_OK)
            ops[i] = NULL;
        if (probe_file_hash(f, i, &hashes[i]) != PROBE_OK)
            hashes[i] = 0;
    }
    for (size_t i = 0; s == PROBE_OK && i < ns; i++) {
        const probe_skip_info *k = probe_file_skip(f, i);
        json_t *e = json_pack("{s:s, s:s}", "path", k->path, "reason", k->reason);
        if (e == NULL || json_array_append_new(w->skips, e) != 0)
            s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    }
    probe_file_close(f);
    if (s == PROBE_OK) {
        char *text = json_dumps(w->skips, JSON_COMPACT);
        w->skips_written = json_array_size(w->skips);
        w->skips_bytes = text != NULL ? strlen(text) : 0;
        free(text);
    }
    if (s == PROBE_OK && (s = probe_journal_create(path, &w->journal)) == PROBE_OK &&
        w->manifest != NULL)
        s = probe_journal_manifest(w->journal, w->manifest);
    if (s == PROBE_OK) {
        char reason[256] = "";
        H5E_BEGIN_TRY {
            hid_t fapl = writer_fapl(flags);
            w->file = H5Fopen(path, H5F_ACC_RDWR, fapl >= 0 ? fapl : H5P_DEFAULT);
            if (w->file < 0)
                probe_h5_error_text(reason, sizeof reason);
            if (fapl >= 0)
                H5Pclose(fapl);
            int *fdp = NULL;
            if (w->file >= 0 && H5Fget_vfd_handle(w->file, H5P_DEFAULT, (void **)&fdp) >= 0 &&
                fdp != NULL)
                w->fd = *fdp;
        } H5E_END_TRY;
        if (w->file < 0)
            s = probe_set_error(PROBE_EIO, "%s: cannot open the capture to append to it: %s", path,
                                reason);
    }
    for (size_t i = 0; s == PROBE_OK && w->journal != NULL && i < n; i++) {
        const probe_tensor_info *t = &info[i];
        haddr_t off = packed[i] != PROBE_JOURNAL_NO_OFFSET ? (haddr_t)packed[i] : HADDR_UNDEF;
        H5E_BEGIN_TRY {
            hid_t d = off == HADDR_UNDEF && !t->stats_only ? H5Dopen2(w->file, t->path, H5P_DEFAULT) : H5I_INVALID_HID;
            if (d >= 0) {
                off = H5Dget_offset(d);
                H5Dclose(d);
            }
        } H5E_END_TRY;
        uint64_t nbytes = t->n * probe_dtype_size(t->dtype);
        probe_record rec = {
            .path = t->path, .component = t->component, .slot = t->slot, .call = t->call,
            .step = t->step, .cfg_branch = t->cfg_branch, .timestep = t->timestep,
            .scope = t->scope, .seq = t->seq >= 0 ? (uint64_t)t->seq : 0, .dtype = t->dtype,
            .rank = t->rank, .shape = t->shape, .op = ops[i],
            .parent = t->parent[0] ? t->parent : NULL, .block = t->block,
            .class_name = t->class_name[0] ? t->class_name : NULL,
            .module = t->module[0] ? t->module : NULL};
        if (t->stats_only) { /* one that cannot be read is kept by HDF5 only */
            uint64_t tree = t->tree_hash[0] ? strtoull(t->tree_hash, NULL, 16) : 0;
            if (!nosum[i] && (t->hash[0] || t->tree_hash[0]))
                s = probe_journal_summary_ex(w->journal, &rec, &sums[i],
                                             t->hash[0] ? &hashes[i] : NULL,
                                             t->tree_hash[0] ? &tree : NULL);
            continue;
        }
        if (off == HADDR_UNDEF && nbytes > 0) {
            /* in raw files: the journal points at its pieces; otherwise not
             * storage the journal can point at: kept by HDF5 only */
            probe_raw_seg *segs = NULL;
            size_t nsegs = 0;
            int raw = 0;
            char dir[256];
            H5E_BEGIN_TRY {
                hid_t d = H5Dopen2(w->file, t->path, H5P_DEFAULT);
                hid_t dcpl = d >= 0 ? H5Dget_create_plist(d) : H5I_INVALID_HID;
                if (dcpl >= 0)
                    raw = probe_raw_efl_read(dcpl, dir, sizeof dir, &segs, &nsegs);
                if (dcpl >= 0)
                    H5Pclose(dcpl);
                if (d >= 0)
                    H5Dclose(d);
            } H5E_END_TRY;
            if (raw == -2)
                s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
            else if (raw == 1)
                s = probe_journal_tensor_raw(w->journal, &rec, nbytes, hashes[i], segs, nsegs);
            free(segs);
            continue;
        }
        s = probe_journal_tensor(w->journal, &rec, off == HADDR_UNDEF ? PROBE_JOURNAL_NO_OFFSET
                                                                      : (uint64_t)off,
                                 nbytes, hashes[i]);
    }
    for (size_t i = 0; s == PROBE_OK && w->journal != NULL && i < json_array_size(w->skips); i++) {
        json_t *e = json_array_get(w->skips, i);
        s = probe_journal_skip(w->journal, json_string_value(json_object_get(e, "path")),
                               json_string_value(json_object_get(e, "reason")));
    }
    for (size_t i = 0; ops != NULL && i < n; i++)
        free(ops[i]);
    free(ops);
    free(info);
    free(hashes);
    free(packed);
    free(sums);
    free(nosum);
    if (s == PROBE_OK) { /* new pack chunks are numbered after the file's */
        H5G_info_t gi;
        H5E_BEGIN_TRY {
            if (H5Lexists(w->file, PACK_ROOT, H5P_DEFAULT) > 0 &&
                H5Gget_info_by_name(w->file, PACK_ROOT, &gi, H5P_DEFAULT) >= 0)
                w->pack.next = (unsigned)gi.nlinks;
        } H5E_END_TRY;
    }
    if (s == PROBE_OK) {
        w->manifest_dirty = w->manifest != NULL;
        s = flush_file(w, 0);
    }
    return s;
}

probe_status probe_writer_open(const char *path, const char *manifest_json, probe_writer **out)
{
    return probe_writer_open_ex(path, manifest_json, 0, out);
}

probe_status probe_writer_open_ex(const char *path, const char *manifest_json, unsigned flags,
                                  probe_writer **out)
{
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_open: out is NULL");
    *out = NULL;
    if (flags & ~(PROBE_WRITER_CALLER_LOCKED | PROBE_WRITER_APPEND))
        return probe_set_error(PROBE_EINVAL, "probe_writer_open: unknown flags 0x%x", flags);
    if (path == NULL || path[0] == '\0')
        return probe_set_error(PROBE_EINVAL, "probe_writer_open: path is NULL or empty");
    probe_status s = check_manifest(manifest_json, path);
    if (s != PROBE_OK)
        return s;

    probe_writer *w = calloc(1, sizeof *w);
    if (w == NULL)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    w->file = H5I_INVALID_HID;
    w->fd = -1;
    w->can_reserve = 1;
    w->hash_thread = 1;
    w->path = strdup(path);
    w->manifest = manifest_json != NULL ? strdup(manifest_json) : NULL;
    w->manifest_dirty = manifest_json != NULL;
    w->skips = json_array();
    if (w->path == NULL || (manifest_json != NULL && w->manifest == NULL) || w->skips == NULL) {
        probe_writer_close(w);
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    }

    if (flags & PROBE_WRITER_APPEND) {
        w->appended = 1;
        s = open_append(w, flags);
        if (s != PROBE_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", probe_last_error());
            probe_journal_close(w->journal, 1);
            w->journal = NULL;
            if (w->file >= 0) {
                H5E_BEGIN_TRY {
                    H5Fclose(w->file);
                } H5E_END_TRY;
                w->file = H5I_INVALID_HID;
            }
            probe_writer_close(w);
            return probe_set_error(s, "%s", msg);
        }
        probe_writer_owned_set_(w->fd, 1);
        *out = w;
        return PROBE_OK;
    }

    /* HDF5 1.10 cannot clean up after an H5Fcreate that runs out of space
     * (it keeps the half-made file open and complains at exit), so check
     * first; the blocks of a file about to be truncated count as free. */
    uint64_t need = SLACK_TENSOR + (manifest_json != NULL ? strlen(manifest_json) : 0);
    s = check_fsize_limit(need, path, "new capture file");
    char *dir = parent_dir(path);
    struct statvfs vfs;
    struct stat old;
    if (s == PROBE_OK && dir != NULL && statvfs(dir, &vfs) == 0)
        s = check_free_space(&vfs, stat(path, &old) == 0 && S_ISREG(old.st_mode) ? (uint64_t)old.st_blocks * 512 : 0,
                             need, path, "new capture file");
    free(dir);
    if (s != PROBE_OK) {
        probe_writer_close(w);
        return s;
    }

    /* The journal first: a capture file without one was closed cleanly (or
     * written by an older probe). Created before the capture so that a kill
     * at any point after it leaves a file the reader can recover. */
    if ((s = probe_journal_create(path, &w->journal)) != PROBE_OK) {
        probe_writer_close(w);
        return s;
    }
    if (manifest_json != NULL && (s = probe_journal_manifest(w->journal, manifest_json)) != PROBE_OK) {
        probe_journal_close(w->journal, 1);
        w->journal = NULL;
        probe_writer_close(w);
        return s;
    }

    char reason[512];
    H5E_BEGIN_TRY {
        hid_t fapl = writer_fapl(flags);
        w->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl >= 0 ? fapl : H5P_DEFAULT);
        if (w->file < 0)
            create_reason(path, reason, sizeof reason);
        if (fapl >= 0)
            H5Pclose(fapl);
        int *fdp = NULL;
        if (w->file >= 0 && H5Fget_vfd_handle(w->file, H5P_DEFAULT, (void **)&fdp) >= 0 && fdp != NULL)
            w->fd = *fdp;
    } H5E_END_TRY;
    if (w->file < 0) {
        probe_journal_close(w->journal, 1);
        w->journal = NULL;
        probe_writer_close(w);
        return probe_set_error(PROBE_EIO, "%s: cannot create capture file: %s", path, reason);
    }

    const char *format = "probe-capture";
    const int64_t version = PROBE_CAPTURE_FORMAT_VERSION;
    s = preflight(w, "root attributes", w->manifest != NULL ? strlen(w->manifest) : 0, SLACK_TENSOR);
    H5E_BEGIN_TRY {
        if (s == PROBE_OK &&
            (attr_write_str(w->file, "probe.format", format) < 0 ||
             attr_write_scalar(w->file, "probe.version", H5T_STD_I64LE, H5T_NATIVE_INT64, &version) < 0))
            s = mark_failed(w, h5_fail(w, "cannot write root attributes", NULL));
    } H5E_END_TRY;
    if (s == PROBE_OK)
        s = write_skips(w); /* "[]": the list is always present */
    if (s == PROBE_OK)
        s = flush_file(w, 0);
    if (s != PROBE_OK) {
        /* The new file's metadata may not be on disk yet and there may be no
         * room for it: close through the detached descriptor (nothing more
         * reaches the file) and remove the half-made file. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", probe_last_error());
        if (w->failed == PROBE_OK)
            mark_failed(w, s);
        probe_journal_close(w->journal, 1);
        w->journal = NULL;
        probe_writer_close(w);
        unlink(path);
        return probe_set_error(s, "%s", msg);
    }
    probe_writer_owned_set_(w->fd, 1);
    *out = w;
    return PROBE_OK;
}

/* --- put --- */

/* A dataset path: absolute, components non-empty and not "." or "..", no
 * trailing '/'. Returns NULL if valid, else the reason. */
static const char *path_problem(const char *path)
{
    if (path[0] != '/')
        return "must start with '/'";
    if (path[1] == '\0')
        return "names the root group, not a dataset";
    if (strncmp(path, PACK_ROOT, sizeof PACK_ROOT - 1) == 0 &&
        (path[sizeof PACK_ROOT - 1] == '\0' || path[sizeof PACK_ROOT - 1] == '/'))
        return "is under " PACK_ROOT ", which holds packed tensors";
    const char *p = path + 1;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t len = e != NULL ? (size_t)(e - p) : strlen(p);
        if (len == 0)
            return e != NULL ? "has an empty component ('//')" : "ends with '/'";
        if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return "has a '.' or '..' component";
        if (e == NULL)
            return NULL;
        p = e + 1;
    }
}

/* Check the record against data/nbytes and fill dims; PROBE_EINVAL on a problem. */
static probe_status check_record(const probe_writer *w, const probe_record *rec, const void *data,
                                 size_t nbytes, hsize_t *dims)
{
    const char *why = path_problem(rec->path);
    if (why != NULL)
        return probe_set_error(PROBE_EINVAL, "%s: dataset path '%s' %s", w->path, rec->path, why);
    size_t esize = probe_dtype_size(rec->dtype);
    if (esize == 0)
        return probe_set_error(PROBE_EINVAL, "%s: %s: unknown element type %d", w->path, rec->path,
                               (int)rec->dtype);
    if (rec->rank < 0 || rec->rank > PROBE_MAX_RANK)
        return probe_set_error(PROBE_EINVAL, "%s: %s: rank %d is outside 0..%d", w->path, rec->path,
                               rec->rank, PROBE_MAX_RANK);
    if (rec->rank > 0 && rec->shape == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: %s: shape is NULL for rank %d", w->path,
                               rec->path, rec->rank);
    size_t n = 1;
    for (int i = 0; i < rec->rank; i++) {
        if (rec->shape[i] < 0)
            return probe_set_error(PROBE_EINVAL, "%s: %s: dimension %d is negative (%lld)", w->path,
                                   rec->path, i, (long long)rec->shape[i]);
        if ((uint64_t)rec->shape[i] > SIZE_MAX || __builtin_mul_overflow(n, (size_t)rec->shape[i], &n))
            return probe_set_error(PROBE_EINVAL, "%s: %s: element count overflows", w->path, rec->path);
        dims[i] = (hsize_t)rec->shape[i];
    }
    size_t want;
    if (__builtin_mul_overflow(n, esize, &want))
        return probe_set_error(PROBE_EINVAL, "%s: %s: byte size overflows", w->path, rec->path);
    if (nbytes != want)
        return probe_set_error(PROBE_EINVAL,
                               "%s: %s: nbytes is %zu, but %zu elements of %s are %zu bytes", w->path,
                               rec->path, nbytes, n, probe_dtype_name(rec->dtype), want);
    if (want > 0 && data == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: %s: data is NULL", w->path, rec->path);
    if (rec->parent != NULL && rec->parent[0] != '\0' && rec->block < 0)
        return probe_set_error(PROBE_EINVAL, "%s: %s: block %lld is negative for the nested call "
                               "(parent %s)", w->path, rec->path, (long long)rec->block, rec->parent);
    return PROBE_OK;
}

/* PROBE_EINVAL if path exists already or an ancestor exists and is not a
 * group. Call inside H5E_BEGIN_TRY. */
static probe_status check_free(probe_writer *w, const char *path)
{
    char *buf = strdup(path);
    if (buf == NULL)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", w->path);
    probe_status s = PROBE_OK;
    char *p = buf;
    for (;;) {
        char *e = strchr(p + 1, '/');
        if (e != NULL)
            *e = '\0';
        htri_t x = H5Lexists(w->file, buf, H5P_DEFAULT);
        if (x < 0) {
            s = probe_set_error(PROBE_EINVAL, "%s: %s: cannot look up %s", w->path, path, buf);
        } else if (x > 0 && e == NULL) {
            s = probe_set_error(PROBE_EINVAL, "%s: %s: path already written", w->path, path);
        } else if (x > 0) {
            H5O_info_t oi;
            if (H5Oget_info_by_name2(w->file, buf, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0 ||
                oi.type != H5O_TYPE_GROUP)
                s = probe_set_error(PROBE_EINVAL, "%s: %s: %s exists and is not a group", w->path,
                                    path, buf);
        }
        if (x <= 0 || s != PROBE_OK || e == NULL)
            break; /* a missing group: everything below it is free */
        *e = '/';
        p = e;
    }
    free(buf);
    return s;
}

static herr_t write_attrs(hid_t d, const probe_record *rec, const char *hash, const char *tree)
{
    herr_t r = attr_write_str(d, "probe.dtype", probe_dtype_name(rec->dtype));
    if (r >= 0)
        r = attr_write_shape(d, rec->rank, rec->shape);
    if (r >= 0 && rec->component != NULL)
        r = attr_write_str(d, "probe.component", rec->component);
    if (r >= 0 && rec->slot != NULL)
        r = attr_write_str(d, "probe.slot", rec->slot);
    if (r >= 0 && rec->call >= 0)
        r = attr_write_scalar(d, "probe.call", H5T_STD_I64LE, H5T_NATIVE_INT64, &rec->call);
    if (r >= 0 && rec->step >= 0)
        r = attr_write_scalar(d, "probe.step", H5T_STD_I64LE, H5T_NATIVE_INT64, &rec->step);
    if (r >= 0 && rec->cfg_branch >= 0)
        r = attr_write_scalar(d, "probe.cfg_branch", H5T_STD_I32LE, H5T_NATIVE_INT32, &rec->cfg_branch);
    if (r >= 0 && !isnan(rec->timestep))
        r = attr_write_scalar(d, "probe.timestep", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &rec->timestep);
    if (r >= 0 && rec->scope != NULL)
        r = attr_write_str(d, "probe.scope", rec->scope);
    if (r >= 0 && rec->device != NULL)
        r = attr_write_str(d, "probe.device", rec->device);
    if (r >= 0)
        r = attr_write_scalar(d, "probe.seq", H5T_STD_U64LE, H5T_NATIVE_UINT64, &rec->seq);
    if (r >= 0 && hash != NULL)
        r = attr_write_str(d, "probe.hash", hash);
    if (r >= 0 && tree != NULL)
        r = attr_write_str(d, "probe.tree_hash", tree);
    if (r >= 0 && rec->op != NULL)
        r = attr_write_str(d, "probe.op", rec->op);
    if (r >= 0 && rec->parent != NULL && rec->parent[0] != '\0') {
        r = attr_write_str(d, "probe.parent", rec->parent);
        if (r >= 0)
            r = attr_write_scalar(d, "probe.block", H5T_STD_I64LE, H5T_NATIVE_INT64, &rec->block);
    }
    if (r >= 0 && rec->class_name != NULL && rec->class_name[0] != '\0')
        r = attr_write_str(d, "probe.class", rec->class_name);
    if (r >= 0 && rec->module != NULL && rec->module[0] != '\0')
        r = attr_write_str(d, "probe.module", rec->module);
    return r;
}

/* Strings that are not valid UTF-8 would make h5py fail to decode them. */
static const char *bad_utf8_field(const probe_record *rec)
{
    const char *names[] = {"component", "slot",   "scope",      "device", "path",
                           "op",        "parent", "class_name", "module"};
    const char *vals[] = {rec->component, rec->slot,   rec->scope,      rec->device, rec->path,
                          rec->op,        rec->parent, rec->class_name, rec->module};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        if (vals[i] == NULL)
            continue;
        json_t *j = json_string(vals[i]); /* NULL unless valid UTF-8 */
        if (j == NULL)
            return names[i];
        json_decref(j);
    }
    return NULL;
}

/* The TENSOR record of a put whose bytes are flushed: at offset in the file,
 * or (segs non-NULL) in the raw files' pieces segs[0..nsegs), then its RAW
 * record. A failed append is a failed write: nothing more is written (the
 * file keeps the tensor). */
static probe_status journal_put(probe_writer *w, const probe_record *rec, uint64_t offset,
                                uint64_t nbytes, uint64_t hash, const probe_raw_seg *segs,
                                size_t nsegs)
{
    if (w->journal == NULL)
        return PROBE_OK;
    probe_status s = segs != NULL ? probe_journal_tensor_raw(w->journal, rec, nbytes, hash, segs, nsegs)
                                  : probe_journal_tensor(w->journal, rec, offset, nbytes, hash);
    return s != PROBE_OK ? journal_failed(w, s) : PROBE_OK;
}

/* The SUMMARY record of a stats-only record that was written; a failed
 * append is a failed write, as in journal_put. */
static probe_status journal_summary(probe_writer *w, const probe_record *rec,
                                    const probe_summary *sum, const uint64_t *hash,
                                    const uint64_t *tree_hash)
{
    if (w->journal == NULL)
        return PROBE_OK;
    probe_status s = probe_journal_summary_ex(w->journal, rec, sum, hash, tree_hash);
    return s != PROBE_OK ? journal_failed(w, s) : PROBE_OK;
}

/* Create the dataset rec->path (file type ftype, dataspace space), write
 * data (memory type mtype; NULL: nothing to write), its probe.* attributes
 * with hash (and probe.stats_only = 1 when stats_only), and close it; on any
 * failure the half-made dataset is unlinked. With offset non-NULL and data
 * written, *offset is the raw data's file address (contiguous: fixed from
 * then on). Call inside H5E_BEGIN_TRY. */
static probe_status write_dataset(probe_writer *w, const probe_record *rec, hid_t ftype, hid_t mtype,
                                  hid_t space, const void *data, const char *hash,
                                  const char *tree, int stats_only, uint64_t *offset)
{
    static const int32_t one = 1;
    probe_status s = PROBE_OK;
    hid_t d = H5I_INVALID_HID, lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0)
        s = h5_fail(w, "cannot create datatype/dataspace", rec->path);
    if (s == PROBE_OK) {
        d = H5Dcreate2(w->file, rec->path, ftype, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
        if (d < 0)
            s = h5_fail(w, "cannot create dataset", rec->path);
    }
    if (s == PROBE_OK && data != NULL && H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        s = h5_fail(w, "cannot write dataset", rec->path);
    if (s == PROBE_OK && data != NULL && offset != NULL) {
        haddr_t a = H5Dget_offset(d);
        if (a == HADDR_UNDEF)
            s = h5_fail(w, "cannot find the raw data's offset", rec->path);
        else
            *offset = (uint64_t)a;
    }
    if (s == PROBE_OK && (write_attrs(d, rec, hash, tree) < 0 ||
                          (stats_only && attr_write_scalar(d, "probe.stats_only", H5T_STD_I32LE,
                                                           H5T_NATIVE_INT32, &one) < 0)))
        s = h5_fail(w, "cannot write attributes", rec->path);
    if (d >= 0 && H5Dclose(d) < 0 && s == PROBE_OK)
        s = h5_fail(w, "cannot close dataset", rec->path);
    if (d >= 0 && s != PROBE_OK)
        H5Ldelete(w->file, rec->path, H5P_DEFAULT); /* do not leave half a tensor */
    if (lcpl >= 0)
        H5Pclose(lcpl);
    return s;
}

/* What every record must pass before it is written, after check_record: text fields
 * in UTF-8, a usable file, its path free, room for `bytes` more (preflight) and
 * the journal's room for the records that close a capture. */
static probe_status admit(probe_writer *w, const probe_record *rec, size_t bytes)
{
    const char *bad = bad_utf8_field(rec);
    if (bad != NULL)
        return probe_set_error(PROBE_EINVAL, "%s: %s: record %s is not valid UTF-8", w->path,
                               rec->path, bad);
    probe_status s = check_usable(w);
    if (s != PROBE_OK)
        return s;
    H5E_BEGIN_TRY { s = check_free(w, rec->path); } H5E_END_TRY;
    if (s == PROBE_OK)
        s = check_packed_free(w, rec->path);
    if (s != PROBE_OK)
        return s;
    if ((s = preflight(w, rec->path, bytes, SLACK_TENSOR)) != PROBE_OK)
        return s;
    int je = probe_journal_reserve(w->journal, SLACK_JOURNAL);
    if (je != 0)
        return probe_set_error(PROBE_EIO, "%s: %s: not written: %s (reserving %u bytes of its journal)",
                               w->path, rec->path, strerror(je), 2 * SLACK_JOURNAL);
    return PROBE_OK;
}

/* --- the packed layout (docs/file-format.md "Packed small tensors") --- */

#define PACK_CHUNK_MIN ((uint64_t)64 << 10) /* chunk k's data holds 64 KiB << min(k, 6) */
#define PACK_CHUNK_SHIFT_MAX 6
#define PACK_INDEX_CHUNK ((hsize_t)16 << 10) /* the index dataset's HDF5 chunk, bytes */

/* PROBE_EINVAL when path, or one of its ancestors, is taken by a packed
 * tensor, or path is an ancestor of one: the same refusals check_free gives
 * for datasets. */
static probe_status check_packed_free(const probe_writer *w, const char *path)
{
    if (w->pack.paths.n == 0)
        return PROBE_OK;
    size_t len = strlen(path);
    if (pathset_has(&w->pack.paths, path, len) || pathset_has(&w->pack.groups, path, len))
        return probe_set_error(PROBE_EINVAL, "%s: %s: path already written", w->path, path);
    for (const char *e = strchr(path + 1, '/'); e != NULL; e = strchr(e + 1, '/'))
        if (pathset_has(&w->pack.paths, path, (size_t)(e - path)))
            return probe_set_error(PROBE_EINVAL, "%s: %s: %.*s exists and is not a group", w->path,
                                   path, (int)(e - path), path);
    return PROBE_OK;
}

/* Remember path as packed (and its ancestors as groups). 0, or -1 out of memory. */
static int pack_remember(probe_writer *w, const char *path)
{
    for (const char *e = strchr(path + 1, '/'); e != NULL; e = strchr(e + 1, '/'))
        if (pathset_add(&w->pack.groups, path, (size_t)(e - path)) != 0)
            return -1;
    return pathset_add(&w->pack.paths, path, strlen(path));
}

/* Append the open chunk's index bytes that are not in the file yet. A
 * refusal for lack of room leaves them pending (PROBE_EIO, nothing written).
 * Call inside H5E_BEGIN_TRY. */
static probe_status pack_write_index(probe_writer *w)
{
    if (!w->pack.open || w->pack.idx_written == w->pack.idx_len)
        return PROBE_OK;
    hsize_t start = w->pack.idx_written, count = w->pack.idx_len - w->pack.idx_written,
            size = w->pack.idx_len;
    char what[64];
    snprintf(what, sizeof what, "%s/index", w->pack.name);
    probe_status s = preflight(w, what, count, SLACK_ROOT);
    if (s != PROBE_OK)
        return s;
    hid_t fsp = H5I_INVALID_HID, msp = H5I_INVALID_HID;
    int ok = H5Dset_extent(w->pack.index, &size) >= 0 &&
             (fsp = H5Dget_space(w->pack.index)) >= 0 &&
             H5Sselect_hyperslab(fsp, H5S_SELECT_SET, &start, NULL, &count, NULL) >= 0 &&
             (msp = H5Screate_simple(1, &count, NULL)) >= 0 &&
             H5Dwrite(w->pack.index, H5T_NATIVE_UCHAR, msp, fsp, H5P_DEFAULT,
                      w->pack.idx + start) >= 0;
    if (msp >= 0)
        H5Sclose(msp);
    if (fsp >= 0)
        H5Sclose(fsp);
    if (!ok)
        return mark_failed(w, h5_fail(w, "cannot write the pack index", what));
    w->pack.idx_written = w->pack.idx_len;
    return PROBE_OK;
}

/* Write the open chunk's index and close the chunk. Call inside H5E_BEGIN_TRY. */
static probe_status pack_seal(probe_writer *w)
{
    if (!w->pack.open)
        return PROBE_OK;
    probe_status s = pack_write_index(w);
    if (s != PROBE_OK)
        return s;
    if (H5Dclose(w->pack.index) < 0)
        s = mark_failed(w, h5_fail(w, "cannot close the pack index", w->pack.name));
    free(w->pack.idx);
    w->pack.idx = NULL;
    w->pack.idx_len = w->pack.idx_cap = w->pack.idx_written = 0;
    w->pack.index = H5I_INVALID_HID;
    w->pack.open = 0;
    return s;
}

/* Create the next chunk, with room for at least need bytes: its data, a
 * contiguous byte dataset allocated at once (never filled: the writer puts
 * each tensor's bytes there itself), and its index, an extensible byte
 * dataset. Call inside H5E_BEGIN_TRY. */
static probe_status pack_open_chunk(probe_writer *w, uint64_t need)
{
    unsigned k = w->pack.next;
    uint64_t cap = PACK_CHUNK_MIN << (k < PACK_CHUNK_SHIFT_MAX ? k : PACK_CHUNK_SHIFT_MAX);
    if (cap < need)
        cap = need;
    if (k > 9999)
        return probe_set_error(PROBE_EINVAL, "%s: more than 10000 pack chunks", w->path);
    char name[40], data[48], index[48];
    snprintf(name, sizeof name, PACK_ROOT "/%04u", k);
    snprintf(data, sizeof data, "%s/data", name);
    snprintf(index, sizeof index, "%s/index", name);
    probe_status s = preflight(w, name, cap, SLACK_TENSOR);
    if (s != PROBE_OK)
        return s;
    unsigned char *hdr = NULL;
    size_t hlen = 0;
    if ((s = probe_journal_encode_header("", &hdr, &hlen)) != PROBE_OK)
        return s;
    hsize_t dcap = cap, zero = 0, unlimited = H5S_UNLIMITED, ichunk = PACK_INDEX_CHUNK;
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE),
          icpl = H5Pcreate(H5P_DATASET_CREATE), dsp = H5Screate_simple(1, &dcap, NULL),
          isp = H5Screate_simple(1, &zero, &unlimited), d = H5I_INVALID_HID, ix = H5I_INVALID_HID;
    haddr_t addr = HADDR_UNDEF;
    int ok = lcpl >= 0 && dcpl >= 0 && icpl >= 0 && dsp >= 0 && isp >= 0 &&
             H5Pset_create_intermediate_group(lcpl, 1) >= 0 &&
             H5Pset_layout(dcpl, H5D_CONTIGUOUS) >= 0 &&
             H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0 &&
             H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0 && H5Pset_chunk(icpl, 1, &ichunk) >= 0;
    ok = ok && (d = H5Dcreate2(w->file, data, H5T_STD_U8LE, dsp, lcpl, dcpl, H5P_DEFAULT)) >= 0 &&
         (addr = H5Dget_offset(d)) != HADDR_UNDEF &&
         (ix = H5Dcreate2(w->file, index, H5T_STD_U8LE, isp, lcpl, icpl, H5P_DEFAULT)) >= 0;
    if (d >= 0 && H5Dclose(d) < 0)
        ok = 0;
    hid_t ids[] = {lcpl, dcpl, icpl};
    for (size_t i = 0; i < 3; i++)
        if (ids[i] >= 0)
            H5Pclose(ids[i]);
    if (dsp >= 0)
        H5Sclose(dsp);
    if (isp >= 0)
        H5Sclose(isp);
    if (!ok) {
        free(hdr);
        if (ix >= 0)
            H5Dclose(ix);
        return mark_failed(w, h5_fail(w, "cannot create the pack chunk", name));
    }
    w->pack.next = k + 1;
    w->pack.open = 1;
    snprintf(w->pack.name, sizeof w->pack.name, "%s", name);
    w->pack.addr = (uint64_t)addr;
    w->pack.cap = cap;
    w->pack.used = 0;
    w->pack.index = ix;
    w->pack.idx = hdr;
    w->pack.idx_len = w->pack.idx_cap = hlen;
    w->pack.idx_written = 0;
    return PROBE_OK;
}

/* probe_writer_put of a tensor of at most pack.max bytes (admitted, bool
 * normalised, hashed): its bytes go to the open chunk's data (straight to
 * the file: HDF5 never writes that dataset), its records to the chunk's
 * index (written at the next flush) and to the journal. */
static probe_status put_packed(probe_writer *w, const probe_record *rec, const void *data,
                               size_t nbytes, uint64_t hash)
{
    probe_status s = PROBE_OK;
    if (!w->pack.open || w->pack.used + nbytes > w->pack.cap) {
        H5E_BEGIN_TRY {
            s = pack_seal(w);
            if (s == PROBE_OK)
                s = pack_open_chunk(w, nbytes);
        } H5E_END_TRY;
        if (s != PROBE_OK)
            return s;
    }
    if (w->journal != NULL && (s = probe_journal_begin(w->journal, rec->path)) != PROBE_OK)
        return journal_failed(w, s);
    uint64_t at = w->pack.addr + w->pack.used;
    int e = nbytes > 0 ? probe_pwrite_all(w->fd, data, nbytes, at) : 0;
    if (e != 0)
        return mark_failed(w, probe_set_error(PROBE_EIO, "%s: %s: cannot write its bytes to %s/data: %s",
                                              w->path, rec->path, w->pack.name, strerror(e)));
    size_t len = w->pack.idx_len;
    if (probe_journal_encode_tensor(rec, w->pack.used, nbytes, hash, &w->pack.idx, &len,
                                    &w->pack.idx_cap) != PROBE_OK ||
        pack_remember(w, rec->path) != 0) {
        /* the bytes are in the chunk, the records are not: nothing names them */
        return mark_failed(w, probe_set_error(PROBE_ENOMEM, "%s: %s: out of memory", w->path, rec->path));
    }
    w->pack.idx_len = len;
    w->pack.used += nbytes;
    if ((s = flush_file(w, 1)) != PROBE_OK || w->failed != PROBE_OK)
        return s;
    return journal_put(w, rec, nbytes > 0 ? at : PROBE_JOURNAL_NO_OFFSET, nbytes, hash, NULL, 0);
}

probe_status probe_writer_set_pack(probe_writer *w, size_t max_bytes)
{
    if (w == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_set_pack: writer is NULL");
    if (max_bytes > PROBE_PACK_MAX_BYTES)
        return probe_set_error(PROBE_EINVAL, "%s: pack size %zu bytes is above the limit of %zu bytes",
                               w->path, max_bytes, PROBE_PACK_MAX_BYTES);
    probe_status s = check_usable(w);
    if (s != PROBE_OK)
        return s;
    if (w->fd < 0 && max_bytes > 0)
        return probe_set_error(PROBE_EUNSUPPORTED, "%s: packing needs the file's descriptor, which "
                               "HDF5 did not give", w->path);
    w->pack.max = max_bytes;
    return PROBE_OK;
}

/* 1 when a tensor of nbytes of record rec keeps its bytes in w's raw files
 * (docs/file-format.md "Raw files"): raw files set, 1 MiB or more, not bool,
 * not packed. */
static int goes_raw(const probe_writer *w, const probe_record *rec, size_t nbytes)
{
    return w->lanes != NULL && nbytes >= PROBE_RAW_MIN_BYTES && rec->dtype != PROBE_DTYPE_BOOL &&
           !(w->pack.max > 0 && nbytes <= w->pack.max);
}

probe_status probe_writer_put(probe_writer *w, const probe_record *rec, const void *data,
                              size_t nbytes)
{
    if (w == NULL || rec == NULL || rec->path == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_put: %s is NULL",
                               w == NULL ? "writer" : rec == NULL ? "record" : "record path");
    hsize_t dims[PROBE_MAX_RANK + 1];
    probe_status s = check_record(w, rec, data, nbytes, dims);
    if (s != PROBE_OK)
        return s;
    if (goes_raw(w, rec, nbytes) && w->fd >= 0 && w->open_put == NULL) {
        /* into the raw files: the streamed put, in one part */
        probe_put *p = NULL;
        if ((s = probe_writer_put_begin(w, rec, nbytes, &p)) != PROBE_OK)
            return s;
        if ((s = probe_writer_put_part(p, data, nbytes)) != PROBE_OK) {
            probe_writer_put_cancel(p);
            return s;
        }
        return probe_writer_put_end(p);
    }
    if ((s = admit(w, rec, nbytes)) != PROBE_OK)
        return s;

    /* bool is stored as the enum {FALSE = 0, TRUE = 1}: any nonzero byte is
     * true (dtype.h), so normalise, and hash the bytes actually stored. */
    unsigned char *norm = NULL;
    if (rec->dtype == PROBE_DTYPE_BOOL && nbytes > 0) {
        norm = malloc(nbytes);
        if (norm == NULL)
            return probe_set_error(PROBE_ENOMEM, "%s: %s: out of memory", w->path, rec->path);
        for (size_t i = 0; i < nbytes; i++)
            norm[i] = ((const unsigned char *)data)[i] != 0;
        data = norm;
    }
    uint64_t hash64 = probe_capture_hash(data, nbytes);
    if (w->pack.max > 0 && nbytes <= w->pack.max) {
        s = put_packed(w, rec, data, nbytes, hash64);
        free(norm);
        return s;
    }
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)hash64);
    /* BEGIN before HDF5 touches the file: a kill from here until the TENSOR
     * record lands is reported by the reader as a partial capture. */
    if (w->journal != NULL && (s = probe_journal_begin(w->journal, rec->path)) != PROBE_OK) {
        free(norm);
        return journal_failed(w, s);
    }
    uint64_t offset = PROBE_JOURNAL_NO_OFFSET;

    hid_t type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    H5E_BEGIN_TRY {
        type = probe_h5_type_create(rec->dtype);
        space = rec->rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rec->rank, dims, NULL);
        if (type < 0 || space < 0)
            s = h5_fail(w, "cannot create datatype/dataspace", rec->path);
        else
            s = write_dataset(w, rec, type, type, space, nbytes > 0 ? data : NULL, hash, NULL, 0,
                              &offset);
        if (type >= 0)
            H5Tclose(type);
        if (space >= 0)
            H5Sclose(space);
    } H5E_END_TRY;
    free(norm);
    if (s != PROBE_OK)
        return mark_failed(w, s);
    if ((s = flush_file(w, 1)) != PROBE_OK || w->failed != PROBE_OK)
        return s;
    return journal_put(w, rec, offset, nbytes, hash64, NULL, 0);
}

/* --- streamed put (probe_writer_put_begin) --- */

struct probe_put {
    probe_writer *w;
    const probe_record *rec; /* the caller's, valid until _end or _cancel */
    hid_t d;                 /* the dataset, open until _end or _cancel */
    uint64_t addr;           /* its raw data's file address */
    size_t nbytes, done;     /* its size, the bytes written so far */
    XXH64_state_t *hash;     /* of the bytes written, in order */
    unsigned char *norm;     /* bool: PUT_BOOL_BLOCK bytes where they are normalised to 0/1 */
    probe_raw_seg *segs;     /* in raw files: its pieces (addr unused); NULL: inside the file */
    size_t nsegs;
};

#define PUT_BOOL_BLOCK ((size_t)64 << 10)
/* Parts this large or larger are hashed beside their write: below it the
 * hand-over to the hasher's thread would cost about what the hash does. */
#define HASH_BESIDE_MIN ((size_t)256 << 10)
/* A raw tensor's pieces per lane, at most (the stripe grows past
 * PROBE_RAW_STRIPE_BYTES for tensors larger than this many stripes a lane). */
#define RAW_SEGS_PER_LANE 64u

/* The hasher's thread, started once; 0 when it cannot run. */
static int start_hasher(probe_writer *w)
{
    if (w->hasher == NULL && !w->hasher_failed && (w->hasher = probe_hasher_start()) == NULL)
        w->hasher_failed = 1;
    return w->hasher != NULL;
}

probe_status probe_writer_set_raw_files(probe_writer *w, unsigned k)
{
    static const char fn[] = "probe_writer_set_raw_files";
    if (w == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: writer is NULL", fn);
    if (k > PROBE_RAW_FILES_MAX)
        return probe_set_error(PROBE_EINVAL, "%s: %s: %u raw files; at most %u", fn, w->path, k,
                               PROBE_RAW_FILES_MAX);
    probe_status s = check_usable(w);
    if (s != PROBE_OK)
        return s;
    if (w->open_put != NULL)
        return probe_set_error(PROBE_ESTATE, "%s: %s: the streamed put of %s is open", fn, w->path,
                               w->open_put->rec->path);
    if (w->lanes != NULL)
        return probe_set_error(PROBE_ESTATE, "%s: %s: raw files are set already (%u)", fn, w->path,
                               probe_lanes_count(w->lanes));
    if (k == 0)
        return PROBE_OK;
    return probe_lanes_open(w->path, k, w->appended, &w->lanes);
}

probe_status probe_writer_set_hash_thread(probe_writer *w, int on)
{
    if (w == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_set_hash_thread: writer is NULL");
    w->hash_thread = on != 0;
    return PROBE_OK;
}

static void put_free(probe_put *p)
{
    if (p->d >= 0) {
        H5E_BEGIN_TRY { H5Dclose(p->d); } H5E_END_TRY;
    }
    XXH64_freeState(p->hash);
    free(p->norm);
    free(p->segs);
    if (p->w->open_put == p)
        p->w->open_put = NULL;
    free(p);
}

/* The dataset of a put that did not end removed, as write_dataset does. */
static void put_discard(probe_put *p)
{
    if (p->segs != NULL)
        probe_lanes_unplace(p->w->lanes);
    if (p->d >= 0) {
        H5E_BEGIN_TRY {
            H5Dclose(p->d);
            H5Ldelete(p->w->file, p->rec->path, H5P_DEFAULT);
        } H5E_END_TRY;
        p->d = H5I_INVALID_HID;
    }
    put_free(p);
}

probe_status probe_writer_put_begin(probe_writer *w, const probe_record *rec, size_t nbytes,
                                    probe_put **out)
{
    static const char fn[] = "probe_writer_put_begin";
    if (out != NULL)
        *out = NULL;
    if (w == NULL || rec == NULL || rec->path == NULL || out == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: %s is NULL", fn,
                               w == NULL ? "writer" : rec == NULL ? "record" : out == NULL ? "out" : "record path");
    if (w->open_put != NULL)
        return probe_set_error(PROBE_ESTATE, "%s: %s: the streamed put of %s is still open", fn,
                               w->path, w->open_put->rec->path);
    hsize_t dims[PROBE_MAX_RANK + 1];
    static const unsigned char any = 0;
    probe_status s = check_record(w, rec, &any, nbytes, dims);
    if (s != PROBE_OK)
        return s;
    if (nbytes == 0 || (w->pack.max > 0 && nbytes <= w->pack.max))
        return probe_set_error(PROBE_EINVAL, "%s: %s: %s: %zu bytes %s; use probe_writer_put", fn,
                               w->path, rec->path, nbytes,
                               nbytes == 0 ? "is an empty tensor" : "is a packed tensor");
    if (w->fd < 0)
        return probe_set_error(PROBE_EUNSUPPORTED, "%s: %s: the file's descriptor is unknown; use "
                               "probe_writer_put", fn, w->path);
    int raw = goes_raw(w, rec, nbytes);
    if ((s = admit(w, rec, raw ? 0 : nbytes)) != PROBE_OK)
        return s;
    struct statvfs vfs;
    if (raw && fstatvfs(probe_lanes_fd(w->lanes, 0), &vfs) == 0 &&
        (s = check_free_space(&vfs, 0, nbytes, w->path, rec->path)) != PROBE_OK)
        return s;
    probe_put *p = calloc(1, sizeof *p);
    if (p == NULL || (p->hash = XXH64_createState()) == NULL) {
        free(p);
        return probe_set_error(PROBE_ENOMEM, "%s: %s: out of memory", w->path, rec->path);
    }
    XXH64_reset(p->hash, 0);
    p->w = w;
    p->rec = rec;
    p->d = H5I_INVALID_HID;
    p->nbytes = nbytes;
    if (rec->dtype == PROBE_DTYPE_BOOL && (p->norm = malloc(PUT_BOOL_BLOCK)) == NULL) {
        put_free(p);
        return probe_set_error(PROBE_ENOMEM, "%s: %s: out of memory", w->path, rec->path);
    }
    if (raw) {
        /* at most RAW_SEGS_PER_LANE pieces a lane: the external storage
         * list stays far below an object header message's 64 KiB */
        unsigned k = probe_lanes_count(w->lanes);
        uint64_t stripe = PROBE_RAW_STRIPE_BYTES, most = (uint64_t)k * RAW_SEGS_PER_LANE;
        if (nbytes / stripe >= most)
            stripe = ((nbytes + most - 1) / most + PROBE_RAW_STRIPE_BYTES - 1) /
                     PROBE_RAW_STRIPE_BYTES * PROBE_RAW_STRIPE_BYTES;
        if ((s = probe_lanes_place(w->lanes, nbytes, stripe, w->raw_next, &p->segs, &p->nsegs)) !=
            PROBE_OK) {
            put_free(p);
            return s;
        }
        w->raw_next = (w->raw_next + (unsigned)(p->nsegs % k)) % k;
    }
    if (w->journal != NULL && (s = probe_journal_begin(w->journal, rec->path)) != PROBE_OK) {
        put_free(p);
        return journal_failed(w, s);
    }
    H5E_BEGIN_TRY {
        hid_t type = probe_h5_type_create(rec->dtype);
        hid_t space = rec->rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rec->rank, dims, NULL);
        hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
        haddr_t a = HADDR_UNDEF;
        if (type < 0 || space < 0 || lcpl < 0 || dcpl < 0 ||
            H5Pset_create_intermediate_group(lcpl, 1) < 0 || H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 ||
            (p->segs == NULL && H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) < 0) ||
            H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0)
            s = h5_fail(w, "cannot create datatype/dataspace", rec->path);
        for (size_t i = 0; s == PROBE_OK && i < p->nsegs; i++)
            if (H5Pset_external(dcpl, probe_lanes_name(w->lanes, p->segs[i].lane),
                                (off_t)p->segs[i].offset, (hsize_t)p->segs[i].size) < 0)
                s = h5_fail(w, "cannot list the raw files' pieces", rec->path);
        if (s != PROBE_OK)
            ;
        else if ((p->d = H5Dcreate2(w->file, rec->path, type, space, lcpl, dcpl, H5P_DEFAULT)) < 0)
            s = h5_fail(w, "cannot create dataset", rec->path);
        else if (p->segs == NULL && (a = H5Dget_offset(p->d)) == HADDR_UNDEF)
            s = h5_fail(w, "cannot find the raw data's offset", rec->path);
        p->addr = (uint64_t)a;
        hid_t ids[] = {lcpl, dcpl};
        for (size_t i = 0; i < 2; i++)
            if (ids[i] >= 0)
                H5Pclose(ids[i]);
        if (type >= 0)
            H5Tclose(type);
        if (space >= 0)
            H5Sclose(space);
    } H5E_END_TRY;
    if (s != PROBE_OK) {
        put_discard(p);
        return mark_failed(w, s);
    }
    w->open_put = p;
    *out = p;
    return PROBE_OK;
}

probe_status probe_writer_put_part(probe_put *p, const void *data, size_t len)
{
    if (p == NULL || (data == NULL && len > 0))
        return probe_set_error(PROBE_EINVAL, "probe_writer_put_part: %s is NULL",
                               p == NULL ? "put" : "data");
    probe_writer *w = p->w;
    if (len > p->nbytes - p->done)
        return probe_set_error(PROBE_EINVAL,
                               "probe_writer_put_part: %s: %s: %zu more bytes after %zu of %zu",
                               w->path, p->rec->path, len, p->done, p->nbytes);
    probe_status s = check_usable(w);
    if (s != PROBE_OK)
        return s;
    const unsigned char *src = data;
    for (size_t at = 0; at < len;) {
        size_t k = len - at;
        const unsigned char *b = src + at;
        if (p->norm != NULL) {
            k = k < PUT_BOOL_BLOCK ? k : PUT_BOOL_BLOCK;
            for (size_t i = 0; i < k; i++)
                p->norm[i] = b[i] != 0;
            b = p->norm;
        }
        /* the same bytes hashed on the hasher's thread while this one writes them */
        int beside = k >= HASH_BESIDE_MIN && w->hash_thread && start_hasher(w) &&
                     probe_hasher_post(w->hasher, p->hash, b, k) == 0;
        int e = p->segs != NULL ? probe_lanes_write(w->lanes, p->segs, p->nsegs, p->done, b, k)
                                : probe_pwrite_all(w->fd, b, k, p->addr + p->done);
        if (beside)
            probe_hasher_wait(w->hasher);
        if (e != 0)
            return mark_failed(w, probe_set_error(PROBE_EIO, "%s: %s: cannot write its bytes: %s",
                                                  w->path, p->rec->path, strerror(e)));
        if (!beside)
            XXH64_update(p->hash, b, k);
        p->done += k;
        at += k;
    }
    return PROBE_OK;
}

probe_status probe_writer_put_end(probe_put *p)
{
    if (p == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_put_end: put is NULL");
    probe_writer *w = p->w;
    const probe_record *rec = p->rec;
    if (p->done != p->nbytes) {
        probe_status s = probe_set_error(PROBE_EINVAL,
                                         "probe_writer_put_end: %s: %s: %zu of %zu bytes written; "
                                         "nothing is kept",
                                         w->path, rec->path, p->done, p->nbytes);
        put_discard(p);
        return s;
    }
    uint64_t hash64 = (uint64_t)XXH64_digest(p->hash);
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)hash64);
    probe_status s = check_usable(w);
    if (s == PROBE_OK) {
        H5E_BEGIN_TRY {
            if (write_attrs(p->d, rec, hash, NULL) < 0)
                s = h5_fail(w, "cannot write attributes", rec->path);
            else if (H5Dclose(p->d) < 0)
                s = h5_fail(w, "cannot close dataset", rec->path);
            else
                p->d = H5I_INVALID_HID;
        } H5E_END_TRY;
    }
    uint64_t addr = p->addr;
    size_t nbytes = p->nbytes;
    if (s != PROBE_OK) {
        put_discard(p);
        return w->failed == PROBE_OK ? mark_failed(w, s) : s;
    }
    probe_raw_seg *segs = p->segs; /* kept for the journal past put_free */
    size_t nsegs = p->nsegs;
    p->segs = NULL;
    put_free(p);
    if ((s = flush_file(w, 1)) == PROBE_OK && w->failed == PROBE_OK)
        s = journal_put(w, rec, addr, nbytes, hash64, segs, nsegs);
    free(segs);
    return s;
}

void probe_writer_put_cancel(probe_put *p)
{
    if (p != NULL)
        put_discard(p);
}

/* --- stats-only record --- */

/* The compound type of a stats-only record: file type (little-endian,
 * packed, field order of probe_summary) when file is 1, else the memory type
 * of probe_summary. Negative on failure. Call inside H5E_BEGIN_TRY. */
static hid_t summary_type(int file)
{
    static const char *const u64[] = {"n", "n_finite", "nan", "inf"};
    static const char *const f64[] = {"min", "max", "abs_max", "sum", "sum_sq"};
    static const size_t off_u64[] = {offsetof(probe_summary, n), offsetof(probe_summary, n_finite),
                                     offsetof(probe_summary, nan), offsetof(probe_summary, inf)};
    static const size_t off_f64[] = {offsetof(probe_summary, min), offsetof(probe_summary, max),
                                     offsetof(probe_summary, abs_max), offsetof(probe_summary, sum),
                                     offsetof(probe_summary, sum_sq)};
    hid_t t = H5Tcreate(H5T_COMPOUND, file ? 9 * 8 : sizeof(probe_summary));
    if (t < 0)
        return -1;
    herr_t r = 0;
    for (size_t i = 0; i < 4 && r >= 0; i++)
        r = H5Tinsert(t, u64[i], file ? 8 * i : off_u64[i], file ? H5T_STD_U64LE : H5T_NATIVE_UINT64);
    for (size_t i = 0; i < 5 && r >= 0; i++)
        r = H5Tinsert(t, f64[i], file ? 8 * (4 + i) : off_f64[i],
                      file ? H5T_IEEE_F64LE : H5T_NATIVE_DOUBLE);
    if (r < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* Stats-only capture of one tensor (capture.h). */
probe_status probe_writer_put_summary(probe_writer *w, const probe_record *rec,
                                      const probe_summary *sum, uint64_t hash)
{
    return probe_writer_put_summary_ex(w, rec, sum, &hash, NULL);
}

probe_status probe_writer_put_summary_ex(probe_writer *w, const probe_record *rec,
                                         const probe_summary *sum, const uint64_t *hash,
                                         const uint64_t *tree_hash)
{
    if (w == NULL || rec == NULL || rec->path == NULL || sum == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_put_summary: %s is NULL",
                               w == NULL     ? "writer"
                               : rec == NULL ? "record"
                               : sum == NULL ? "summary"
                                             : "record path");
    if (hash == NULL && tree_hash == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: %s: a stats-only record needs its XXH64 or its "
                                             "tree hash (both are NULL)",
                               w->path, rec->path);
    hsize_t dims[PROBE_MAX_RANK + 1];
    size_t esize = probe_dtype_size(rec->dtype), nbytes;
    if (esize == 0)
        return probe_set_error(PROBE_EINVAL, "%s: %s: unknown element type %d", w->path, rec->path,
                               (int)rec->dtype);
    if (sum->n > SIZE_MAX || __builtin_mul_overflow((size_t)sum->n, esize, &nbytes))
        return probe_set_error(PROBE_EINVAL, "%s: %s: summary n %llu overflows", w->path, rec->path,
                               (unsigned long long)sum->n);
    /* check_record compares prod(shape) x element size with nbytes: the
     * summary must describe exactly the tensor the record names. */
    probe_status s = check_record(w, rec, sum, nbytes, dims);
    if (s != PROBE_OK)
        return probe_set_error(s, "%s (summary n = %llu)", probe_last_error(),
                               (unsigned long long)sum->n);
    if (sum->n_finite + sum->nan + sum->inf != sum->n || sum->n_finite > sum->n)
        return probe_set_error(PROBE_EINVAL,
                               "%s: %s: summary counts do not add up (n_finite %llu + nan %llu + "
                               "inf %llu != n %llu)",
                               w->path, rec->path, (unsigned long long)sum->n_finite,
                               (unsigned long long)sum->nan, (unsigned long long)sum->inf,
                               (unsigned long long)sum->n);
    if ((s = admit(w, rec, sizeof *sum)) != PROBE_OK)
        return s;
    char hex[17], thex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)(hash ? *hash : 0));
    snprintf(thex, sizeof thex, "%016llx", (unsigned long long)(tree_hash ? *tree_hash : 0));
    /* BEGIN before HDF5 touches the file, as for a full put */
    if (w->journal != NULL && (s = probe_journal_begin(w->journal, rec->path)) != PROBE_OK)
        return journal_failed(w, s);

    hid_t ft = H5I_INVALID_HID, mt = H5I_INVALID_HID, space = H5I_INVALID_HID;
    H5E_BEGIN_TRY {
        ft = summary_type(1);
        mt = summary_type(0);
        space = H5Screate(H5S_SCALAR);
        if (ft < 0 || mt < 0 || space < 0)
            s = h5_fail(w, "cannot create datatype/dataspace", rec->path);
        else
            s = write_dataset(w, rec, ft, mt, space, sum, hash ? hex : NULL,
                              tree_hash ? thex : NULL, 1, NULL);
        if (ft >= 0)
            H5Tclose(ft);
        if (mt >= 0)
            H5Tclose(mt);
        if (space >= 0)
            H5Sclose(space);
    } H5E_END_TRY;
    if (s != PROBE_OK)
        return mark_failed(w, s);
    if ((s = flush_file(w, 1)) != PROBE_OK || w->failed != PROBE_OK)
        return s;
    return journal_summary(w, rec, sum, hash, tree_hash);
}

/* --- skips, manifest, flush, close --- */

probe_status probe_writer_skip(probe_writer *w, const probe_record *rec, const char *reason)
{
    if (w == NULL || rec == NULL || rec->path == NULL || reason == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_skip: %s is NULL",
                               w == NULL        ? "writer"
                               : rec == NULL    ? "record"
                               : reason == NULL ? "reason"
                                                : "record path");
    json_t *e = json_pack("{s:s, s:s}", "path", rec->path, "reason", reason);
    if (e == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: skip of %s: path or reason is not valid UTF-8",
                               w->path, rec->path);
    if (json_array_append_new(w->skips, e) != 0)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", w->path);
    w->skips_bytes += strlen(rec->path) + strlen(reason) + 32;
    if (w->journal != NULL && w->failed == PROBE_OK) {
        probe_status s = probe_journal_skip(w->journal, rec->path, reason);
        if (s != PROBE_OK)
            return journal_failed(w, s);
    }
    return PROBE_OK;
}

probe_status probe_writer_set_manifest(probe_writer *w, const char *manifest_json)
{
    if (w == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_set_manifest: writer is NULL");
    probe_status s = check_manifest(manifest_json, w->path);
    if (s != PROBE_OK)
        return s;
    char *copy = NULL;
    if (manifest_json != NULL && (copy = strdup(manifest_json)) == NULL)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", w->path);
    free(w->manifest);
    w->manifest = copy;
    w->manifest_dirty = 1;
    if (w->journal != NULL && w->failed == PROBE_OK) {
        s = probe_journal_manifest(w->journal, manifest_json);
        if (s != PROBE_OK)
            return journal_failed(w, s);
    }
    return PROBE_OK;
}

probe_status probe_writer_flush(probe_writer *w)
{
    if (w == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_writer_flush: writer is NULL");
    probe_status s = check_usable(w);
    return s != PROBE_OK ? s : flush_file(w, 0);
}

/* After a write that failed half-way, HDF5's metadata cache holds changes
 * that must not reach the file (they may refer to space that could not be
 * written), yet H5Fclose flushes them, and a failed H5Fclose in HDF5 1.10
 * leaves a dangling handle that crashes the process at exit. So point HDF5's
 * descriptor at an anonymous memory file (memfd) first: the close then
 * succeeds and the capture file keeps what the last successful flush wrote.
 * Returns 0 on success. */
static int detach_file(probe_writer *w)
{
    if (w->fd < 0)
        return -1;
    int m = memfd_create("probe-detached-capture", MFD_CLOEXEC);
    if (m < 0)
        return -1;
    int r = dup2(m, w->fd);
    close(m);
    return r < 0 ? -1 : 0;
}

probe_status probe_writer_close(probe_writer *w)
{
    if (w == NULL)
        return PROBE_OK;
    probe_status s = PROBE_OK;
    if (w->open_put != NULL) /* a streamed put that did not end is not kept */
        put_discard(w->open_put);
    int keep_journal = 0; /* records of packed tensors that no index in the file holds */
    if (w->file >= 0 && w->failed == PROBE_OK && w->pack.open) {
        H5E_BEGIN_TRY { s = pack_seal(w); } H5E_END_TRY;
        keep_journal = s != PROBE_OK && w->pack.idx_written < w->pack.idx_len;
    }
    if (w->file >= 0 && w->failed == PROBE_OK) {
        probe_status fs = flush_file(w, 0); /* a preflight refusal leaves the file consistent */
        if (s == PROBE_OK)
            s = fs;
        if (w->failed == PROBE_OK)
            release_reservation(w);
    }
    probe_writer_owned_set_(w->fd, 0);
    int close_it = w->file >= 0;
    if (close_it && w->failed != PROBE_OK && detach_file(w) != 0)
        close_it = 0; /* cannot detach: leave HDF5's handle open (closed at exit) */
    if (close_it) {
        char text[256] = "";
        herr_t r;
        H5E_BEGIN_TRY {
            r = H5Fclose(w->file);
            if (r < 0)
                probe_h5_error_text(text, sizeof text);
        } H5E_END_TRY;
        if (r < 0 && s == PROBE_OK)
            s = probe_set_error(PROBE_EIO, "%s: cannot close (%s)", w->path, text);
        /* closed: HDF5's metadata is complete (or, after a failed write, is
         * what the last successful flush left); the journal is not needed,
         * unless a failed write left puts that no flush reached, or a pack
         * index could not be written: then the journal holds them and
         * readers recover from it */
        if (r >= 0 && !keep_journal && (w->failed == PROBE_OK || w->unflushed == 0)) {
            probe_journal_close(w->journal, 1);
            w->journal = NULL;
        }
    }
    probe_journal_close(w->journal, 0); /* not closed: readers recover from it */
    if (w->failed != PROBE_OK)
        s = probe_set_error(w->failed,
                            "%s: a write failed (%s); the file holds the tensors written before it",
                            w->path, w->failure);
    if (w->pack.open) {
        H5E_BEGIN_TRY { H5Dclose(w->pack.index); } H5E_END_TRY;
    }
    probe_hasher_stop(w->hasher);
    probe_lanes_close(w->lanes);
    free(w->pack.idx);
    pathset_free(&w->pack.paths);
    pathset_free(&w->pack.groups);
    free(w->path);
    free(w->manifest);
    json_decref(w->skips);
    free(w);
    return s;
}
