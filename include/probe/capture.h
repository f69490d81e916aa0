/* probe/capture.h - the capture file (HDF5): writer and reader.
 *
 * Layout (docs/file-format.md): one dataset per captured tensor
 * at /<component>/<call, 4 digits>/<slot>, stored contiguous, row-major, in
 * its logical element type:
 *   float16/32/64     IEEE little-endian (H5T_IEEE_F16LE-like, F32LE, F64LE)
 *   bfloat16          a 2-byte HDF5 float type with bfloat16's bit fields
 *                     (sign 15, exponent 7..14 bias 127, mantissa 0..6):
 *                     h5py reads it as float32 exactly, h5dump prints values
 *   float8_e4m3fn/e5m2 uint8 holding the raw encoding
 *   ints, bool        HDF5 native integers; bool as h5py's int8 enum
 * Dataset attributes (all prefixed "probe."): dtype (logical type name),
 * shape (int64 array), component, slot, call, step, cfg_branch, timestep,
 * scope (NVTX range path), device, seq (execution order), hash (xxh64 of the
 * contiguous bytes as 16 hex digits), parent and block (nested calls),
 * class (the wrapped method's class). Root attributes: probe.format
 * ("probe-capture"), probe.version (1), probe.manifest (JSON text),
 * probe.skips (JSON list of {path, reason}).
 */
#ifndef PROBE_CAPTURE_H
#define PROBE_CAPTURE_H

#include <stddef.h>
#include <stdint.h>
#include "probe/dtype.h"
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PROBE_MAX_RANK 16
#define PROBE_CAPTURE_FORMAT_VERSION 1

/* What is known about one captured tensor. Strings may be NULL (absent). */
typedef struct probe_record {
    const char *path;        /* "/dit.step/0003/out"; required */
    const char *component;   /* "dit.step" */
    const char *slot;        /* "out", "in.hidden_states", "out.sample", "out.0" */
    int64_t call;            /* call index of the component, -1 unknown */
    int64_t step;            /* denoising step, -1 unknown */
    int32_t cfg_branch;      /* -1 unknown */
    double timestep;         /* NaN unknown */
    const char *scope;       /* NVTX range path, ranges joined by '/'; "" if none */
    const char *device;      /* "cpu", "cuda:0" */
    uint64_t seq;            /* capture sequence number: execution order */
    probe_dtype dtype;
    int rank;                /* 0..PROBE_MAX_RANK */
    const int64_t *shape;    /* rank entries, each >= 0 */
    /* JSON text describing the library call this tensor is an
     * operand of (docs/gemm.md "probe.op"), written as the dataset's string
     * attribute probe.op; NULL: no attribute. Must be valid UTF-8. Not kept
     * in the journal: a recovered file has no probe.op. */
    const char *op;
    /* A call nested in another component's call (docs/file-format.md): parent
     * is the enclosing call "/<component>/<call:04>" (written as probe.parent)
     * and block the index of this call among the calls of the same component
     * inside that parent call, >= 0 (probe.block). parent NULL or "": not
     * nested, neither attribute is written and block is ignored (so a
     * zero-initialised record is "not nested"). */
    const char *parent;
    int64_t block;
    /* qualified name "module.Qualname" of the class whose method was wrapped
     * (probe.class); NULL or "": not written. */
    const char *class_name;
    /* module path of the object whose method was wrapped ("text_encoder_2",
     * "transformer.blocks.3"; probe.module); NULL or "": not written. */
    const char *module;
} probe_record;

/* --- writer --- */
typedef struct probe_writer probe_writer;

/* Create (truncate) the capture file at path with the run manifest (JSON
 * text, may be NULL), and its journal path + ".journal" (first; never
 * through a symlink), to which every completed put, skip and manifest
 * change is appended and which a clean probe_writer_close removes
 * (docs/file-format.md "Journal"). Errors: PROBE_EIO with the OS/HDF5
 * reason (missing directory, permission, disk full, a symlinked journal),
 * PROBE_EINVAL for NULL path/out. Not thread-safe: one thread uses one
 * writer. */
probe_status probe_writer_open(const char *path, const char *manifest_json, probe_writer **out);

/* probe_writer_open with flags. PROBE_WRITER_CALLER_LOCKED: the caller
 * already holds an exclusive flock(2) on path (the preloaded shim claims the
 * file that way before anything truncates it), so HDF5's own file lock, which
 * would conflict with it, is not taken (needs HDF5 >= 1.10.7). Unknown flag
 * bits: PROBE_EINVAL. Other errors as probe_writer_open. */
#define PROBE_WRITER_CALLER_LOCKED 1u
/* PROBE_WRITER_APPEND: path is an existing capture that a writer closed
 * cleanly (no journal next to it): it is opened for writing rather than
 * created, its tensors and probe.skips are kept, manifest_json replaces its
 * manifest, and new puts add datasets (a path already in the file is
 * PROBE_EINVAL, as within one writer). The journal is created anew and
 * first lists every full tensor already in the file, so that a writer
 * killed later leaves a file that recovers to all of them; a file holding
 * stats-only records gets no journal (as after the writer's first summary).
 * Errors: PROBE_ESTATE (a journal is next to it: recover it first),
 * PROBE_ENOTFOUND, PROBE_EFORMAT (not a probe capture), PROBE_EIO. (the
 * preloaded shim uses it for an exec'd image that continues the capture:
 * docs/file-format.md "Exec continuation") */
#define PROBE_WRITER_APPEND 2u
probe_status probe_writer_open_ex(const char *path, const char *manifest_json, unsigned flags,
                                  probe_writer **out);

/* Write one tensor: data holds the contiguous row-major bytes of
 * prod(shape) elements of rec->dtype; nbytes must equal that size
 * (PROBE_EINVAL otherwise). A path already written is PROBE_EINVAL.
 * PROBE_EIO on a failed write (e.g. ENOSPC); the file stays readable up to
 * the previous tensor. */
probe_status probe_writer_put(probe_writer *w, const probe_record *rec, const void *data,
                              size_t nbytes);

/* A streamed put: one tensor written in parts as its bytes arrive (e.g.
 * piece by piece out of a staging buffer), never assembled in memory.
 * probe_writer_put_begin admits the record as probe_writer_put does (same
 * checks and errors; rec and what it points to must stay valid until the
 * put ends) and creates its dataset (contiguous, allocated at once);
 * probe_writer_put_part writes the next len bytes (contiguous row-major,
 * in order, straight to the file; bool bytes normalised to 0/1) and adds
 * them to the XXH64; probe_writer_put_end, once exactly nbytes were
 * written, writes the attributes (probe.hash as probe_writer_put's),
 * journals the tensor and frees the put, whatever it returns. The file then
 * holds what probe_writer_put of the same bytes writes. One streamed put may
 * be open per writer (PROBE_ESTATE for a second); other writer calls may
 * come between its parts. Errors: begin PROBE_EINVAL also for an empty
 * tensor or one probe_writer_set_pack would pack (use probe_writer_put),
 * PROBE_EUNSUPPORTED when the file's descriptor is unknown; part
 * PROBE_EINVAL for bytes past nbytes (nothing written), PROBE_EIO on a
 * failed write (the writer fails, as after a failed probe_writer_put: call
 * _cancel); end PROBE_EINVAL when fewer than nbytes were written (the
 * dataset is removed, the put freed). probe_writer_put_cancel removes the
 * dataset and frees the put (NULL: nothing); probe_writer_close cancels one
 * still open. */
typedef struct probe_put probe_put;
/* probe_writer_set_hash_thread: on (the default), a part of 256 KiB or more
 * is added to the put's XXH64 on a thread of the writer's own while the
 * calling thread writes it to the file, so a part costs the longer of the
 * two rather than their sum (the thread, with every signal blocked, starts
 * at the first such part and ends at probe_writer_close; when it cannot
 * start, or in the child of a fork, the caller hashes). off: the caller
 * hashes every part after writing it. The bytes and probe.hash are the
 * same either way. PROBE_EINVAL for a NULL writer. */
probe_status probe_writer_set_hash_thread(probe_writer *w, int on);
probe_status probe_writer_put_begin(probe_writer *w, const probe_record *rec, size_t nbytes,
                                    probe_put **out);
probe_status probe_writer_put_part(probe_put *p, const void *data, size_t len);
probe_status probe_writer_put_end(probe_put *p);
void probe_writer_put_cancel(probe_put *p);

/* The packed layout (docs/file-format.md "Packed small tensors"): from now
 * on, each tensor of at most max_bytes bytes that probe_writer_put writes is
 * appended to a shared chunk /probe.pack/NNNN/{data,index} instead of getting
 * a dataset of its own; the probe_file_* reader reads it as if it were a
 * dataset at its path, and the journal covers it as any tensor. max_bytes 0
 * turns packing off for later puts. PROBE_EINVAL when max_bytes is above
 * PROBE_PACK_MAX_BYTES or the writer is NULL; a writer that failed keeps
 * failing (PROBE_EIO). */
#define PROBE_PACK_MAX_BYTES ((size_t)1 << 20)
probe_status probe_writer_set_pack(probe_writer *w, size_t max_bytes);

/* The raw files layout (docs/file-format.md "Raw files"): from now on,
 * each tensor of at least PROBE_RAW_MIN_BYTES that probe_writer_put or a
 * streamed put (probe_writer_put_begin) writes keeps its bytes outside the
 * capture file (bool tensors, packed tensors and stats-only records stay in it),
 * in k raw files <path>.raw/00 .. <path>.raw/NN next to it, striped over
 * them in pieces of PROBE_RAW_STRIPE_BYTES or more, and the k files are
 * written at once by threads of the writer: a drain k files wide, where one
 * file is bound by the kernel's one writer per file. The dataset names its
 * pieces in HDF5 external storage (names relative to the capture's folder),
 * which probe's reader accepts only in this form; h5py reads them with
 * HDF5_EXTFILE_PREFIX='${ORIGIN}'. Move the capture together with its .raw
 * folder. Call before the first streamed put; k 0 keeps every tensor
 * inside the file. Errors: PROBE_EINVAL (k above PROBE_RAW_FILES_MAX, w
 * NULL), PROBE_ESTATE (a streamed put is open, or raw files were set
 * already), PROBE_EIO (the folder or a file cannot be made: the message
 * names it); a writer that failed keeps failing (PROBE_EIO). */
#define PROBE_RAW_FILES_MAX 16u
#define PROBE_RAW_MIN_BYTES ((size_t)1 << 20)
#define PROBE_RAW_STRIPE_BYTES ((uint64_t)4 << 20)
probe_status probe_writer_set_raw_files(probe_writer *w, unsigned k);

/* Record that rec->path was not captured and why (e.g. "stream capturing a
 * CUDA graph"). Kept in the root attribute probe.skips. */
probe_status probe_writer_skip(probe_writer *w, const probe_record *rec, const char *reason);

/* Replace the manifest JSON (written at close). */
probe_status probe_writer_set_manifest(probe_writer *w, const char *manifest_json);

/* Flush everything to disk. */
probe_status probe_writer_flush(probe_writer *w);

/* Write pending attributes, close and free. w may be NULL. Returns the first
 * error seen while closing. Removes the journal once HDF5 closed the file
 * (also after a failed write: the file then holds what the last successful
 * flush wrote); a process that never gets here leaves it for the reader. */
probe_status probe_writer_close(probe_writer *w);

/* xxh64 (seed 0) of n bytes, the content hash stored in probe.hash. */
uint64_t probe_capture_hash(const void *data, size_t n);

/* probe_tree_hash, the tree hash of a tensor's bytes: probe/metrics.h. */

/* --- rounded-weight fingerprints (docs/gemm.md "Quantized from the same weights") ---
 *
 * Whether one tensor is another rounded to float8, told from two small
 * fingerprints instead of the values: each rounding maps every element to its
 * float8_e4m3fn code (one byte), and the fingerprint is the XXH64 (seed 0) of
 * those codes in element order. A weight W and the weights a quantizing
 * feature computes from it, Q (stored in float8 and cast back, or dequantized
 * in the compute type), have the same codes; different weights have different
 * codes except where they agree to float8 precision everywhere. */
/* probe_rounding and probe_rounding_name: probe/dtype.h. */

#define PROBE_AMAX_CONVENTIONS 5

typedef struct probe_rounded_fingerprint {
    /* Distinct element bit patterns when at most 256 (a float8 rounding cast
     * back has at most 256), else -1; 0 for an empty tensor. */
    int levels;
    /* max |x| as float32 (0 for an empty tensor; NaN when an element is NaN,
     * inf when one is infinite): the scale a rounding's codes carry. */
    float amax;
    unsigned valid;                        /* bit r set: xxh64[r] is defined */
    uint64_t xxh64[PROBE_ROUNDING_COUNT_]; /* XXH64 of the codes of rounding r */
    /* With "float8_e4m3fn/amax" valid: the XXH64 of its codes under each
     * float32 scale convention of the same recipe, which disagree on the
     * elements whose x / s falls within an ulp of a rounding boundary (a few
     * per million, up to ~1 %): [0] x / s, s = amax / 448 (the definition,
     * = xxh64[1]); [1] x / s, s = amax * fl(1/448) (torch on CUDA dividing
     * by a Python number); [2] x * fl(448 / amax); [3] x * (fl(1/amax) * 448)
     * (torch eager `448.0 / amax`, torchao's scale); [4] x * fl(1 / s). A
     * weight quantized by any of them has codes equal to one of these. */
    uint64_t amax_variants[PROBE_AMAX_CONVENTIONS];
} probe_rounded_fingerprint;

/* The fingerprints of `count` elements of type `dtype` (bfloat16, float16 or
 * float32, little-endian) at `data`. Errors: PROBE_EINVAL (other types, NULL
 * with count > 0, NULL out), PROBE_ENOMEM. Cost: two reads of the tensor
 * through tables for 16-bit types (one thread: about 4 ns per element,
 * bench/rounded_fingerprint.c), more for float32. A 16-bit tensor of 2^22
 * elements or more is fingerprinted by up to six threads that the call
 * starts and joins (pass 1 over slices, then one thread per hash stream;
 * where a thread cannot be started its share runs on the caller); the
 * results do not depend on the threads. */
probe_status probe_rounded_fingerprint_compute(probe_dtype dtype, const void *data, size_t count,
                                               probe_rounded_fingerprint *out);

/* --- how the run ended (probe/capture/run_end.c; docs/file-format.md "run_end") --- */

typedef struct probe_run_end {
    int exit_status; /* the command's exit status (0..255), or -1 when a signal ended it */
    int signal;      /* the signal that ended the command, or 0 */
} probe_run_end;

/* Record how the run that wrote the capture file `path` ended: the key
 * "run_end" of its manifest, {"exit_status": N or null, "signal": "SIGSEGV"
 * or null, "capture": "closed" | "journal" | "not written",
 * "capture_complete": bool, "end_time": "YYYY-MM-DDTHH:MM:SSZ"}, with
 * capture_complete true only for "closed" with exit status 0. Works on the
 * file in whatever state the run left it:
 *   - "closed" (its writer closed it, no journal): probe.manifest is
 *     rewritten in place with HDF5, after checking the process's file size
 *     limit and the free space (PROBE_EIO before HDF5 writes anything);
 *   - "journal" (path.journal next to it: the writer was killed): the
 *     manifest is appended to the journal as a MANIFEST record, which
 *     readers take (a torn last record is cut off first); the capture file
 *     itself is not touched;
 *   - "not written" (an empty file, the one probe-run creates, and no
 *     journal or one without its header): a capture with no tensors whose
 *     manifest is manifest_if_new (JSON object text, or NULL for {}) plus
 *     run_end.
 * Takes an exclusive flock(2) on path without blocking first. Errors,
 * nothing written: PROBE_ESTATE when another process holds the lock (still
 * writing it), PROBE_ENOTFOUND for a missing file, PROBE_EINVAL for NULL
 * arguments or a path that is not a regular file, PROBE_EFORMAT for a
 * journal that is corrupt or names another capture, a manifest that is not
 * a JSON object, or a file HDF5 cannot open; PROBE_EIO; PROBE_ENOMEM. The
 * message names the file. */
probe_status probe_run_end_record(const char *path, const probe_run_end *re,
                                  const char *manifest_if_new);

/* "SIGSEGV", "SIGTERM", ... ("SIGRTMIN+N" for a real-time signal, "SIGN"
 * for an unknown number) into buf. */
void probe_run_end_signal_name(int sig, char *buf, size_t cap);

/* --- reader --- */
typedef struct probe_file probe_file;

typedef struct probe_tensor_info {
    char path[512];
    char component[128];   /* probe.component, else the first path element */
    char slot[128];        /* probe.slot, else the last path element */
    char scope[512];       /* "" if absent */
    char hash[17];         /* "" if absent */
    probe_dtype dtype;     /* logical type (probe.dtype or from the HDF5 type) */
    int rank;
    int64_t shape[PROBE_MAX_RANK];
    uint64_t n;            /* number of elements */
    int64_t seq;           /* -1 if absent */
    int64_t call, step;    /* -1 if absent */
    int32_t cfg_branch;    /* -1 if absent */
    double timestep;       /* NaN if absent */
    /* 1: a stats-only record (docs/file-format.md "Stats-only
     * records"): dtype, rank, shape and n are the true tensor's (probe.dtype,
     * probe.shape), hash its probe.hash; the bytes are not in the file, so
     * probe_file_read_* return PROBE_EUNSUPPORTED; probe_file_summary gives
     * the stored summary. 0: a full tensor. */
    int stats_only;
    /* probe.parent: the enclosing component call ("/dit.step/0003") of a
     * nested call, "" if absent (not nested); cut to 255 bytes. */
    char parent[256];
    /* probe.block: the index of the call among the calls of its component
     * inside the parent call, -1 if absent (not nested). */
    int64_t block;
    /* probe.class: "module.Qualname" of the class whose method was wrapped,
     * "" if absent; cut to 255 bytes. */
    char class_name[256];
    /* probe.module: the module path of that object ("text_encoder_2",
     * "transformer.blocks.3"), "" if absent; cut to 255 bytes. */
    char module[256];
    /* probe.tree_hash: the tensor's tree hash (probe_tree_hash of its bytes)
     * as 16 lowercase hex digits, "" if absent. Stored only on stats-only
     * records; probe_file_tree_hash computes it for a full tensor. */
    char tree_hash[17];
} probe_tensor_info;

typedef struct probe_skip_info {
    char path[512];
    char reason[256];
} probe_skip_info;

/* Open a capture file, or any HDF5 file, for reading and index every numeric
 * dataset (float, integer, bool-enum, probe bfloat16/fp8) reachable through
 * hard links (soft and external links are never followed). Non-numeric
 * datasets (strings, compound, vlen), shapes whose element count or byte size
 * overflows, and datasets declaring more than 64 MiB and more than 2048 times
 * their allocated storage are not tensors; their count is given by
 * probe_file_ignored_count(). Errors: PROBE_ENOTFOUND (no such file),
 * PROBE_EFORMAT (not a regular file, not an HDF5 file, truncated, a malformed
 * global heap collection, a probe.skips attribute above 16 MiB),
 * PROBE_EUNSUPPORTED (a dataset whose elements HDF5 would read from outside
 * the file: external storage, a virtual dataset, a filter that is not built
 * into libhdf5; refused before anything is read, docs/hardening.md), PROBE_EIO.
 * The message names the file. HDF5 itself can crash on crafted files: this
 * call runs it in the calling process (docs/hardening.md). */
probe_status probe_file_open(const char *path, probe_file **out);
void probe_file_close(probe_file *f);

/* Tensors in execution order (probe.seq) when every tensor has one,
 * otherwise in path order. */
size_t probe_file_count(const probe_file *f);
const probe_tensor_info *probe_file_tensor(const probe_file *f, size_t i);
/* Index of the tensor at path, or PROBE_ENOTFOUND. */
probe_status probe_file_find(const probe_file *f, const char *path, size_t *index);

/* Read tensor i converted to double (n elements into dst). PROBE_EIO or
 * PROBE_EFORMAT if HDF5 cannot read it (message names file and path). */
probe_status probe_file_read_f64(probe_file *f, size_t i, double *dst);
/* Read tensor i's raw bytes in its logical type (n * probe_dtype_size bytes). */
probe_status probe_file_read_raw(probe_file *f, size_t i, void *dst, size_t nbytes);
/* Read elements [offset, offset + count) of tensor i in row-major order,
 * in its logical type, packed little-endian (count * probe_dtype_size bytes
 * into dst): what the streaming compare reads, a chunk at a time. The
 * dataset stays open between calls on the same tensor; a contiguous dataset
 * stored as read is read with pread() from the file directly, any other
 * through HDF5 (hyperslab selection). Errors: PROBE_EINVAL (range outside
 * the tensor, NULL dst with count > 0), PROBE_EIO / PROBE_EFORMAT (message
 * names file and path). */
probe_status probe_file_read_range(probe_file *f, size_t i, uint64_t offset, size_t count,
                                   void *dst);

/* String attribute `name` of tensor i (e.g. "probe.op", the JSON record of
 * an interposed or tapped op: docs/oracle.md) as a malloc'd NUL-terminated
 * string in *out (free() it); variable or fixed length, ASCII or UTF-8, one
 * element. Errors (*out NULL): PROBE_EINVAL (NULL argument, i out of range),
 * PROBE_ENOTFOUND (no such attribute, not a one-element string, or a file
 * recovered from its journal, which keeps only probe.op), PROBE_EIO (HDF5
 * cannot open the dataset), PROBE_ENOMEM. Messages name file and path. */
probe_status probe_file_tensor_attr(probe_file *f, size_t i, const char *name, char **out);

/* Root attribute probe.manifest (JSON text) or NULL. */
const char *probe_file_manifest(const probe_file *f);
size_t probe_file_skip_count(const probe_file *f);
const probe_skip_info *probe_file_skip(const probe_file *f, size_t i);
size_t probe_file_ignored_count(const probe_file *f);
const char *probe_file_path(const probe_file *f);
/* The version of the HDF5 library this reader runs on ("1.10.8"): named in
 * messages about files that crash it (docs/hardening.md). */
const char *probe_file_hdf5_version(void);

/* --- stats-only capture (docs/file-format.md "Stats-only records") --- */

/* Write a stats-only record for the tensor rec describes: at rec->path a
 * scalar HDF5 compound dataset with the fields of probe_summary (n,
 * n_finite, nan, inf: uint64 little-endian; min, max, abs_max, sum,
 * sum_sq: float64 little-endian, in that order), the usual probe.*
 * attributes of rec (probe.dtype and probe.shape are the true tensor's),
 * probe.hash = hash as 16 hex digits (the XXH64 of the bytes a full capture
 * would store: probe_capture_hash of the contiguous bytes, bool normalised
 * to 0/1) and probe.stats_only = 1 (int32). sum->n must equal prod(shape)
 * and n_finite + nan + inf must equal n (PROBE_EINVAL otherwise, as for a
 * bad record or a path already written). PROBE_EIO on a failed write, as
 * probe_writer_put. The record is journalled (a SUMMARY record) and HDF5
 * flushed as for probe_writer_put, so a killed writer's stats-only records
 * are recovered like its tensors (docs/file-format.md "Journal"). */
#include "probe/metrics.h"
probe_status probe_writer_put_summary(probe_writer *w, const probe_record *rec,
                                      const probe_summary *sum, uint64_t hash);

/* probe_writer_put_summary with the hashes the caller has: hash (the XXH64
 * of the bytes, probe.hash) and tree_hash (probe_tree_hash of the bytes,
 * probe.tree_hash, 16 hex digits), each NULL when not known; at least one
 * is required (PROBE_EINVAL). A record made on a GPU
 * (probe_cuda_summary_tree) has only the tree hash. Both are journalled
 * (docs/file-format.md "Journal", SUMMARY). Other errors as
 * probe_writer_put_summary. */
probe_status probe_writer_put_summary_ex(probe_writer *w, const probe_record *rec,
                                         const probe_summary *sum, const uint64_t *hash,
                                         const uint64_t *tree_hash);

/* Summary of tensor i: a stats-only record's stored fields, or, for a full
 * tensor, probe_summary_compute over its elements (read in chunks; bounded
 * memory; the same bits as one probe_summary_compute over the whole tensor:
 * both follow the tree order, docs/file-format.md "Tree order"). Errors:
 * PROBE_EINVAL (NULL f/out, i out of range), PROBE_EIO / PROBE_EFORMAT
 * (message names file and path). */
probe_status probe_file_summary(probe_file *f, size_t i, probe_summary *out);

/* Tree hash of tensor i (probe_tree_hash of its bytes as a full capture
 * stores them): a stats-only record's probe.tree_hash, or, for a full
 * tensor, computed from its bytes (read in chunks; bounded memory).
 * PROBE_ENOTFOUND for a stats-only record without one (written with only
 * an XXH64); other errors as probe_file_summary. */
probe_status probe_file_tree_hash(probe_file *f, size_t i, uint64_t *out);

/* Whether tensor ai of a and tensor bi of b hold the same bytes, by hash
 * alone: the XXH64 when both have one (probe.hash, or a full tensor's
 * bytes), else the tree hash when both have one (probe.tree_hash, or a full
 * tensor's bytes); *same is 0 when they differ or share no hash (a record
 * with only an XXH64 against one with only a tree hash). Errors:
 * PROBE_EINVAL (NULL, index out of range), and those of reading a full
 * tensor's bytes (PROBE_EIO, PROBE_EFORMAT, PROBE_ENOMEM). */
probe_status probe_file_hash_match(probe_file *a, size_t ai, probe_file *b, size_t bi, int *same);

/* XXH64 (seed 0) of tensor i's bytes as a full capture stores them (what
 * probe.hash holds): the stored probe.hash when the dataset has one (always
 * for a stats-only record), else computed from the bytes (read in chunks).
 * Errors as probe_file_summary, and PROBE_EFORMAT for a stats-only record
 * without a valid probe.hash. */
probe_status probe_file_hash(probe_file *f, size_t i, uint64_t *out);

/* --- recovery of a capture whose writer was killed --- */

/* A capture file X whose writer did not close it (the process was killed)
 * has its journal X.journal next to it (docs/file-format.md "Journal").
 * probe_file_open then reads X from the journal: the tensors are exactly
 * the journal's complete records whose bytes at the recorded offset in X
 * hash to the recorded probe.hash (read with pread; HDF5's metadata of X,
 * which a kill can leave half written, is not used); skips and manifest
 * come from the journal too. A put that had begun and not completed (or a
 * torn/mismatching last record) is the partial capture: named here, never
 * returned as a tensor. Every reader function works on a recovered file.
 * Errors of probe_file_open on this path: PROBE_EFORMAT naming both files
 * when the journal is not a probe journal, is corrupt before its last
 * record, names another capture file, or does not describe X's bytes;
 * PROBE_EIO when a running process still writes X (it holds X's lock). */
typedef struct probe_recovery_info {
    int recovered;      /* 1: read from the journal; 0: X was closed cleanly */
    size_t complete;    /* complete captures read (probe_file_count) */
    char partial[512];  /* path of the partial capture, "" if none or unknown */
    char journal[1024]; /* the journal's path, "" unless recovered */
    char reason[256];   /* why there is a partial capture, "" if none */
    /* tensors the journal says were tapped (TAPPED records of the
     * preloaded shim) but never written: listed among the skips with the
     * reason "lost: tapped, but the process ended before the writer wrote it" */
    size_t lost;
} probe_recovery_info;

/* The recovery state of an open file (all zero / "" for a clean file or
 * f == NULL). The pointer stays valid until probe_file_close(f). */
const probe_recovery_info *probe_file_recovery(const probe_file *f);

#ifdef __cplusplus
}
#endif
#endif
