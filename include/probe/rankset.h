/* probe/rankset.h - a capture made of per-rank files, seen as one capture.
 *
 * A parallel run under a multi-rank launcher writes one capture file per
 * rank (<stem>.rank<R><ext>, manifest keys "rank" and "world_size") and an
 * index file (manifest "ranks": [basenames]) (docs/nccl.md "Per-rank
 * files"). probe-compare treats such a set as ONE candidate (or reference):
 * docs/nccl.md "Comparing rank sets".
 *
 * The set gives a list of logical tensors:
 *  - mode PROBE_RANKSET_JOIN: one logical tensor per path. A path matching
 *    a glob of the manifest's "shard" list ([{"glob": G, "axis": A}], fnmatch;
 *    a glob without a leading '/' is also tried against the path without
 *    its '/') is the concatenation of the ranks' pieces along axis A in rank
 *    order; any other path present on several ranks is replicated (rank 0's
 *    copy, or the lowest rank holding it, stands for it; every other copy
 *    must hold the same bytes); a path on some ranks only comes from those.
 *    Collective operands (a path starting with "/nccl/" or holding "/nccl.")
 *    are left out when exclude_collectives is set and counted per rank.
 *  - mode PROBE_RANKSET_PER_RANK: every tensor of every rank file as it is,
 *    tagged with its rank (rank r of one set is compared with rank r of the
 *    other).
 * A single file that is not an index is a set of one plain file (world 0):
 * its logical tensors are the file's tensors, untouched.
 */
#ifndef PROBE_RANKSET_H
#define PROBE_RANKSET_H

#include <stddef.h>
#include <stdint.h>
#include "probe/capture.h"
#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PROBE_RANKSET_MAX 1024 /* ranks in one set */

/* --- the block layout of a concatenation (pure arithmetic) ---
 * W parts whose row-major shapes agree on every axis but `axis` are joined
 * along `axis`. In row-major order the joined tensor is, for each of the
 * `outer` = prod(shape[:axis]) outer indices, part 0's block of
 * extent[0] * inner elements, then part 1's block, ... (inner =
 * prod(shape[axis+1:])). */
typedef struct probe_concat {
    int nparts;
    uint64_t outer, inner;
    uint64_t *extent;   /* nparts entries: the parts' sizes along the axis */
    uint64_t *start;    /* nparts + 1 entries: start[p] = inner * (extent[0] + ... + extent[p-1]) */
    uint64_t n;         /* elements of the joined tensor = outer * start[nparts] */
} probe_concat;

/* Fill c for parts of rank `rank` joined along `axis` (0 <= axis < rank):
 * shapes[p] is part p's shape. Errors: PROBE_EINVAL (bad rank/axis, nparts
 * < 1 or > PROBE_RANKSET_MAX, negative sizes, shapes that differ on another
 * axis: the message names the part and the axis), PROBE_ENOMEM. */
probe_status probe_concat_init(probe_concat *c, int nparts, int rank, int axis,
                               const int64_t *const *shapes);
void probe_concat_free(probe_concat *c);
/* Where logical element `offset` (< c->n) lies: its part (return value), the
 * element offset inside that part's row-major data (*part_offset), and how
 * many elements from there on are contiguous in both the part and the joined
 * tensor (*run >= 1). Returns -1 when offset >= c->n. */
int probe_concat_locate(const probe_concat *c, uint64_t offset, uint64_t *part_offset,
                        uint64_t *run);

/* --- the rank set --- */
typedef struct probe_rankset probe_rankset;

typedef enum { PROBE_RANKSET_JOIN = 0, PROBE_RANKSET_PER_RANK = 1 } probe_rankset_mode;

/* Open paths[0..n) as one capture. n == 1: the file itself, or, when its
 * manifest has "ranks" (an index capture), the rank files it names (relative
 * to the index's folder). n > 1: every file is one rank: its manifest must
 * carry "rank" and "world_size" (integers), all the same world size, each
 * rank 0..W-1 exactly once (n == W). Errors (PROBE_EINVAL, one line naming
 * the file and the problem; or the reader's errors for a file that cannot be
 * opened, PROBE_ENOMEM). */
probe_status probe_rankset_open(const char *const *paths, size_t n, probe_rankset **out);
void probe_rankset_close(probe_rankset *rs);
/* 0 for a plain file, W for a set of W rank files. */
int probe_rankset_world(const probe_rankset *rs);
/* The index file the set came from, or NULL. */
const char *probe_rankset_index(const probe_rankset *rs);
/* File of rank r (r < max(1, world)) and its path. */
probe_file *probe_rankset_file(const probe_rankset *rs, int r);
const char *probe_rankset_file_path(const probe_rankset *rs, int r);

/* Build the logical tensor list (see the top of this file). Must be called
 * once before the functions below. Errors: PROBE_EINVAL (mode PER_RANK on a
 * plain file), PROBE_EIO/PROBE_EFORMAT from hashing replicated copies,
 * PROBE_ENOMEM. A tensor that cannot be joined is not an error: it has a
 * reason (probe_rankset_entry.error). */
probe_status probe_rankset_build(probe_rankset *rs, probe_rankset_mode mode,
                                 int exclude_collectives);

typedef struct probe_rankset_entry {
    probe_tensor_info info; /* the logical tensor (a joined tensor: its shape and n) */
    int tag;                /* its rank in mode PER_RANK, else -1 */
    int shard_axis;         /* >= 0: joined along this axis; -1: not sharded */
    int nholders;           /* ranks that hold the path */
    int *holders;           /* their ranks, increasing */
    size_t *index;          /* their tensor indices in their files */
    int nmismatch;          /* replicated: ranks whose copy differs (see probe/compare/rankset.c) */
    int *mismatch;
    char error[256];        /* why it cannot be joined ("" if it can) */
} probe_rankset_entry;

size_t probe_rankset_count(const probe_rankset *rs);
const probe_rankset_entry *probe_rankset_entry_at(const probe_rankset *rs, size_t i);
/* Logical tensor with that path and tag (-1 in mode JOIN), or PROBE_ENOTFOUND. */
probe_status probe_rankset_find(const probe_rankset *rs, const char *path, int tag, size_t *i);
/* Elements [offset, offset + count) of logical tensor i, row-major, packed
 * in its element type (as probe_file_read_range). A joined tensor is read
 * from its parts block by block. Errors: PROBE_EINVAL (range, or an entry
 * with an error), the reader's errors. */
probe_status probe_rankset_read_range(probe_rankset *rs, size_t i, uint64_t offset, size_t count,
                                      void *dst);
/* The one file tensor behind logical tensor i when it is not joined (rank
 * 0's copy of a replicated one): 1 and *f, *idx; 0 for a joined tensor. */
int probe_rankset_single(const probe_rankset *rs, size_t i, probe_file **f, size_t *idx);

/* Collective operands left out by exclude_collectives, per rank. */
uint64_t probe_rankset_collectives_left_out(const probe_rankset *rs, int r);

/* Collective outputs that must be equal on every rank (the "out" of
 * all_gather, all_reduce, broadcast) and are not: path and the ranks whose
 * bytes differ from rank 0's (rank 0 itself when every other rank agrees). */
typedef struct probe_rankset_divergence {
    char path[512];
    int nranks;
    int ranks[8];           /* the first 8 */
} probe_rankset_divergence;
size_t probe_rankset_divergence_count(const probe_rankset *rs);
const probe_rankset_divergence *probe_rankset_divergence_at(const probe_rankset *rs, size_t i);

/* 1 when path names a collective operand (shared convention: "/nccl/..." or
 * ".../nccl.K.OP.OPERAND"); op (up to 31 chars) and operand are filled when
 * not NULL. */
int probe_rankset_is_collective(const char *path, char *op, size_t opcap, char *operand,
                                size_t operandcap);

#ifdef __cplusplus
}
#endif
#endif
