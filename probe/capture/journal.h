/* probe/capture/journal.h - the capture journal, <capture>.journal (internal to
 * libprobe; docs/file-format.md "Journal").
 *
 * The writer appends one record per event with a single write(2): BEGIN
 * (a put started), TENSOR (a put completed and was flushed: everything
 * needed to read the tensor without HDF5's metadata), SUMMARY (the same for
 * a stats-only record: its summary and hash instead of the bytes' place),
 * SKIP, MANIFEST. Clean
 * close removes the journal; a journal next to its capture therefore means
 * the writer never closed it (killed), and the reader rebuilds the capture
 * from it. All integers are little-endian. */
#ifndef PROBE_JOURNAL_H
#define PROBE_JOURNAL_H

#include <stddef.h>
#include <stdint.h>
#include "probe/capture.h"
#include "lanes.h"

/* Internal to libprobe: not exported. */
#define PROBE_JOURNAL_API __attribute__((visibility("hidden")))

#define PROBE_JOURNAL_MAGIC "PRBJRNL\n"
#define PROBE_JOURNAL_VERSION 1u
#define PROBE_JOURNAL_SUFFIX ".journal"
/* No record is longer: bounds every length field the parser reads. */
#define PROBE_JOURNAL_RECORD_MAX ((uint32_t)32 << 20)

enum {
    PROBE_JREC_HEADER = 1,
    PROBE_JREC_BEGIN = 2,
    PROBE_JREC_TENSOR = 3,
    PROBE_JREC_SKIP = 4,
    PROBE_JREC_MANIFEST = 5,
    /* the probe.op text of the TENSOR record just before it (same path):
     * written only for records with an op (interposed GEMM/NCCL operands);
     * a version-1 reader without it skips it as an unknown type */
    PROBE_JREC_OP = 6,
    /* the nesting and class of the TENSOR record just before it (same path):
     * parent, block (u64), class, module path (absent from records of
     * writers before it); written only for records with a parent, a class or
     * a module path; a reader without it skips it as an unknown type */
    PROBE_JREC_CALL = 7,
    /* a tensor queued for writing (the path), appended by the preloaded shim
     * when the tap is accepted, on its own O_APPEND descriptor: a path with
     * such a record and no TENSOR or SKIP record is lost (the parser lists
     * it among the skips, PROBE_JOURNAL_LOST_REASON); a reader without it
     * skips it as an unknown type */
    PROBE_JREC_TAPPED = 8,
    /* a stats-only record (probe_writer_put_summary) that was written: the
     * TENSOR record's fields up to the shape, then the hash and the
     * probe_summary (docs/file-format.md "Journal"); OP and CALL records
     * follow it as they follow a TENSOR record. A version-1 reader without
     * it skips it as an unknown type (and loses the record) */
    PROBE_JREC_SUMMARY = 9,
    /* the raw-file pieces of the TENSOR record just before it (same path,
     * offset PROBE_JOURNAL_NO_OFFSET): path, count (u32), then per piece
     * lane (u32), offset (u64), size (u64) in <capture>.raw/NN
     * (docs/file-format.md "Raw files"). A reader without it finds no bytes
     * for that TENSOR record */
    PROBE_JREC_RAW = 10
};

#define PROBE_JOURNAL_LOST_REASON \
    "lost: tapped, but the process ended before the writer wrote it"


/* --- writing --- */
typedef struct probe_journal probe_journal;

/* Create (truncate) path + ".journal" and write its header (magic, version,
 * a random run token, the capture file's base name). PROBE_EIO naming the
 * journal on failure; PROBE_ENOMEM. */
PROBE_JOURNAL_API probe_status probe_journal_create(const char *capture_path, probe_journal **out);
/* Append one record; PROBE_EIO (naming the journal and errno's text) when
 * the write fails or is short (disk full). */
PROBE_JOURNAL_API probe_status probe_journal_begin(probe_journal *j, const char *path);
/* probe_journal_tensor appends the TENSOR record, then an OP record when
 * rec->op is set and a CALL record when rec->parent or rec->class_name is. */
PROBE_JOURNAL_API probe_status probe_journal_tensor(probe_journal *j, const probe_record *rec, uint64_t offset,
                                  uint64_t nbytes, uint64_t hash);
/* The TENSOR record of a tensor whose bytes are the raw-file pieces
 * segs[0..nsegs) (offset PROBE_JOURNAL_NO_OFFSET), then its OP and CALL
 * records, then the RAW record, with one write(2). */
PROBE_JOURNAL_API probe_status probe_journal_tensor_raw(probe_journal *j, const probe_record *rec,
                                                        uint64_t nbytes, uint64_t hash,
                                                        const probe_raw_seg *segs, size_t nsegs);
/* probe_journal_summary appends the SUMMARY record of stats-only record rec
 * (sum, hash), then its OP and CALL records as probe_journal_tensor does. */
PROBE_JOURNAL_API probe_status probe_journal_summary(probe_journal *j, const probe_record *rec,
                                                     const probe_summary *sum, uint64_t hash);
/* The same with the hashes a record has (probe_writer_put_summary_ex): hash
 * NULL: the record has no XXH64; tree_hash NULL: no tree hash. After the
 * fields above the record then holds flags (u64: bit 0 no XXH64, bit 1 a
 * tree hash) and the tree hash (u64); a reader that predates them stops
 * before them. */
PROBE_JOURNAL_API probe_status probe_journal_summary_ex(probe_journal *j, const probe_record *rec,
                                                        const probe_summary *sum,
                                                        const uint64_t *hash,
                                                        const uint64_t *tree_hash);
/* The same records as probe_journal_tensor writes, appended to the buffer
 * *buf (*len bytes used of *cap, realloc'd as needed; *buf NULL, *len and
 * *cap 0 to start one). PROBE_ENOMEM leaves *len as it was. */
PROBE_JOURNAL_API probe_status probe_journal_encode_tensor(const probe_record *rec, uint64_t offset,
                                                           uint64_t nbytes, uint64_t hash,
                                                           unsigned char **buf, size_t *len,
                                                           size_t *cap);
/* The magic and a HEADER record (token 0) naming capture_name, malloc'd. */
PROBE_JOURNAL_API probe_status probe_journal_encode_header(const char *capture_name,
                                                           unsigned char **out, size_t *len);
PROBE_JOURNAL_API probe_status probe_journal_skip(probe_journal *j, const char *path, const char *reason);
/* Open the existing journal jpath to append to it (never through a symlink;
 * it must be a regular file), first cutting it to keep bytes when it is
 * longer: keep is probe_journal_data.valid_len of its parse, so that a torn
 * last record left by a killed writer does not sit before the new records.
 * PROBE_EIO naming the journal; PROBE_ENOMEM. */
PROBE_JOURNAL_API probe_status probe_journal_reopen(const char *jpath, uint64_t keep, probe_journal **out);
/* manifest_json NULL: the manifest was removed. */
PROBE_JOURNAL_API probe_status probe_journal_manifest(probe_journal *j, const char *manifest_json);
/* Keep at least room bytes of the file system reserved for the journal's
 * next records (fallocate(FALLOC_FL_KEEP_SIZE) past its end, twice room at a
 * time), so the records that close a capture still fit when its disk filled.
 * 0, or the errno of a refusal (ENOSPC, EDQUOT, EFBIG); where fallocate is
 * not supported nothing is reserved and 0 is returned. */
PROBE_JOURNAL_API int probe_journal_reserve(probe_journal *j, uint64_t room);
/* Close the descriptor; with remove set, unlink the journal first. j may be NULL. */
PROBE_JOURNAL_API void probe_journal_close(probe_journal *j, int remove);

/* 1 when a writer of this process has the file (st_dev, st_ino) open
 * (probe/capture/owned.c). */
PROBE_JOURNAL_API int probe_writer_owns_(uint64_t dev, uint64_t ino);
/* Record (add 1) or forget (add 0) the file behind descriptor fd as held by a
 * writer of this process (probe/capture/owned.c). */
PROBE_JOURNAL_API void probe_writer_owned_set_(int fd, int add);

/* probe_file_open without HDF5's file lock (probe/capture/reader.c), for a writer
 * of this process whose caller holds the file's flock. */
PROBE_JOURNAL_API probe_status probe_file_open_unlocked_(const char *path, probe_file **out);

/* --- reading --- */
#define PROBE_JOURNAL_NO_OFFSET UINT64_MAX

/* The file offset of packed tensor i's bytes (probe/capture/reader.c), or
 * PROBE_JOURNAL_NO_OFFSET when tensor i is not packed (a dataset, or a file
 * recovered from its journal). */
PROBE_JOURNAL_API uint64_t probe_file_packed_addr_(const probe_file *f, size_t i);

typedef struct probe_journal_tensor_rec {
    probe_tensor_info info; /* path, component, slot, scope, hash, dtype, shape, n, seq, ... */
    uint64_t offset;        /* raw data's byte offset in the capture, or PROBE_JOURNAL_NO_OFFSET */
    uint64_t nbytes;
    uint64_t hash;
    char *op;               /* the record's probe.op text (malloc'd), NULL when none */
    probe_raw_seg *segs;    /* its RAW record's pieces (malloc'd), NULL when none */
    size_t nsegs;
    /* info.stats_only set: a SUMMARY record; offset is PROBE_JOURNAL_NO_OFFSET,
     * nbytes 0, and this is its stored summary */
    probe_summary summary;
} probe_journal_tensor_rec;

typedef struct probe_journal_data {
    char capture_name[256]; /* base name the header names */
    uint64_t token;
    probe_journal_tensor_rec *t; /* complete TENSOR and SUMMARY records, journal order */
    size_t n;
    probe_skip_info *skips; /* SKIP records, then one per lost TAPPED path */
    size_t nskips;
    size_t lost;      /* TAPPED paths with no TENSOR or SKIP record (the last skips) */
    char *manifest;   /* last MANIFEST record's text, or NULL */
    char partial[512]; /* path of a put begun and not completed, "" if none/unknown */
    size_t ignored;    /* TENSOR/SUMMARY records with a path too long to index */
    int torn;          /* the journal ends in an incomplete/corrupt record */
    size_t valid_len;  /* bytes up to the end of the last complete record (the magic
                          included): what is left once a torn tail is cut off */
    int header;        /* the header record was read */
} probe_journal_data;

/* Parse a journal image (len bytes). PROBE_EFORMAT (message names jpath)
 * when it is not a probe journal, a record before the last is corrupt, or a
 * length field is out of bounds; a last record cut short or failing its
 * checksum is a torn tail (d->torn), not an error. PROBE_ENOMEM. */
PROBE_JOURNAL_API probe_status probe_journal_parse(const char *jpath, const unsigned char *buf, size_t len,
                                 probe_journal_data *d);
PROBE_JOURNAL_API void probe_journal_data_free(probe_journal_data *d);

/* The whole journal jpath of capture `path` into *buf (malloc'd, *len bytes): a
 * regular file of at most 1 GiB; with nofollow, never through a symbolic link.
 * Errors: PROBE_EIO (cannot open or stat it; a symbolic link with nofollow),
 * PROBE_EFORMAT (not a regular file, larger than 1 GiB), PROBE_ENOMEM; the
 * message names the file. */
PROBE_JOURNAL_API probe_status probe_journal_read_all(const char *path, const char *jpath,
                                                      int nofollow, unsigned char **buf,
                                                      size_t *len);

#endif
