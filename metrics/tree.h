/* tree.h - the canonical tree order of a summary and of the tree hash
 * (docs/file-format.md "Tree order"), fed in order, a piece-aligned chunk at
 * a time, in bounded memory (16 levels of 32 pending nodes: 2^64 bytes).
 * Used by probe_summary_tree (tree.c) and by the reader's probe_file_summary
 * and probe_file_tree_hash of a full tensor read in chunks. */
#ifndef PROBE_METRICS_TREE_H
#define PROBE_METRICS_TREE_H

#include <stddef.h>
#include <stdint.h>

#include "probe/metrics.h"

typedef struct {
    uint64_t hash, nf, nan, inf;
    double mn, mx, am, s, q;
} probe_tree_node;

#define PROBE_TREE_LEVELS 16
typedef struct {
    probe_dtype dtype;
    int with_hash;                  /* 0: sums and counts only (no XXH64) */
    int hash_only;                  /* 1: the hashes only (probe_tree_hash) */
    uint64_t nbytes;                /* fed so far */
    unsigned pending[PROBE_TREE_LEVELS];
    uint64_t total[PROBE_TREE_LEVELS]; /* nodes ever made at each level */
    probe_tree_node node[PROBE_TREE_LEVELS][PROBE_TREE_FANOUT];
    double scratch[PROBE_TREE_FANOUT * PROBE_TREE_PIECE_BYTES]; /* 32 pieces' elements */
} probe_tree_state;

/* PROBE_EINVAL for an unknown dtype. */
probe_status probe_tree_begin_(probe_tree_state *t, probe_dtype dtype, int with_hash);
/* nbytes of the tensor's bytes, in order; every chunk but the last must be a
 * multiple of PROBE_TREE_PIECE_BYTES (PROBE_EINVAL otherwise). */
probe_status probe_tree_feed_(probe_tree_state *t, const void *data, size_t nbytes);
/* The summary (out->n = bytes fed / element size) and, when tree_hash is
 * not NULL, the tree hash. */
void probe_tree_finish_(probe_tree_state *t, probe_summary *out, uint64_t *tree_hash);

#endif
