/* intercept/base/libprobe.h - libprobe.so loaded with dlopen: the HDF5 writer and reader the shim calls. */
#ifndef PROBE_INTERCEPT_BASE_LIBPROBE_H
#define PROBE_INTERCEPT_BASE_LIBPROBE_H

#include "probe/capture.h"
#include "probe/metrics.h"
#include "probe/status.h"

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
    /* the packed layout; NULL when libprobe.so predates it */
    probe_status (*writer_set_pack)(probe_writer *, size_t);
    /* the streamed put's hashing thread; NULL when libprobe.so predates it */
    probe_status (*writer_set_hash_thread)(probe_writer *, int);
    probe_status (*writer_set_raw_files)(probe_writer *, unsigned);
    /* the tree order's summary and hash, and records with both hashes; NULL
     * when libprobe.so predates them */
    probe_status (*summary_tree)(probe_dtype, const void *, size_t, probe_summary *, uint64_t *);
    probe_status (*writer_put_summary_ex)(probe_writer *, const probe_record *,
                                          const probe_summary *, const uint64_t *, const uint64_t *);
    /* the streamed put; NULL when libprobe.so predates it */
    probe_status (*writer_put_begin)(probe_writer *, const probe_record *, size_t, probe_put **);
    probe_status (*writer_put_part)(probe_put *, const void *, size_t);
    probe_status (*writer_put_end)(probe_put *);
    void (*writer_put_cancel)(probe_put *);
    /* rounded-weight fingerprints; NULL when libprobe.so predates them */
    probe_status (*rounded_fingerprint)(probe_dtype, const void *, size_t,
                                        probe_rounded_fingerprint *);
};

extern struct shim_libprobe shim_libprobe_api;

/* Load libprobe.so (PROBE_LIBPROBE, else next to the shim: libprobe.so.0,
 * then libprobe.so) with RTLD_NOW | RTLD_LOCAL (| RTLD_DEEPBIND unless ASan
 * is present) and fill shim_libprobe_api. PROBE_ENOTFOUND with the dlopen/dlsym reason
 * in probe_last_error() when it cannot be loaded. Call once, under the open
 * lock. */
probe_status shim_libprobe_load(void);

/* Read PROBE_PACK_SMALL into shim_cfg.pack_small (constructor). */
void shim_pack_config(void);
/* Read PROBE_HASH_THREAD into shim_cfg.hash_thread (constructor). */
void shim_hash_thread_config(void);
/* Read PROBE_RAW_FILES into shim_cfg.raw_files (constructor). */
void shim_raw_files_config(void);

/* The writer API, each call made under one lock that fork() also takes
 * (shim_libprobe_fork_prepare/release), so no child is forked while HDF5 runs. */
/* append: continue the file an earlier image of this pid closed before exec
 * (PROBE_WRITER_APPEND, capture/exits.c). */
probe_status shim_libprobe_open(const char *path, const char *manifest, int append,
                                probe_writer **out);
probe_status shim_libprobe_put(probe_writer *w, const probe_record *rec, const void *data, size_t nbytes);
probe_status shim_libprobe_skip(probe_writer *w, const probe_record *rec, const char *reason);
/* needs shim_libprobe_api.writer_put_summary (check it first). hash: the
 * XXH64, or NULL for a record with only the tree hash (then
 * writer_put_summary_ex is required: PROBE_EINVAL without it); tree_hash
 * NULL, or the tree hash too when shim_libprobe_api.writer_put_summary_ex
 * is there (else it is dropped) */
probe_status shim_libprobe_put_summary(probe_writer *w, const probe_record *rec, const probe_summary *sum,
                                const uint64_t *hash, const uint64_t *tree_hash);
/* The streamed put (probe_writer_put_begin/_part/_end/_cancel), each call
 * under the lock; begin is PROBE_EUNSUPPORTED when libprobe.so lacks it. */
probe_status shim_libprobe_put_begin(probe_writer *w, const probe_record *rec, size_t nbytes,
                                     probe_put **out);
probe_status shim_libprobe_put_part(probe_put *p, const void *data, size_t len);
probe_status shim_libprobe_put_end(probe_put *p);
void shim_libprobe_put_cancel(probe_put *p);
probe_status shim_libprobe_set_manifest(probe_writer *w, const char *manifest);
probe_status shim_libprobe_flush(probe_writer *w);
probe_status shim_libprobe_close(probe_writer *w);
void shim_libprobe_fork_prepare(void);
void shim_libprobe_fork_release(void);

/* The writer's last error text on this thread ("unknown error" if none). */
const char *shim_libprobe_error(void);

/* Absolute path of the shim itself (dladdr + realpath); NULL if unknown.
 * The string is static. */
const char *shim_libprobe_self_path(void);

#endif
