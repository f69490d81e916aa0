/* intercept/base/ring.h - ring allocator over the pinned staging pool. */
#ifndef PROBE_INTERCEPT_BASE_RING_H
#define PROBE_INTERCEPT_BASE_RING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define SHIM_RING_PIECE_MAX ((size_t)64 << 20) /* largest piece of one device copy */

struct shim_ring_rec {
    size_t start; /* where the claim begins (before off when the region's end was skipped) */
    size_t off;   /* offset of the bytes handed out */
    size_t end;   /* one past them */
    int freed;
};

struct shim_ring {
    size_t cap;    /* bytes usable now: a multiple of seg */
    size_t seg;    /* segment size (claims never cross a multiple of it), a multiple of 256 */
    size_t piece;  /* largest piece: min(seg / 4, SHIM_RING_PIECE_MAX), a multiple of 256 */
    size_t head;   /* next offset handed out */
    struct shim_ring_rec *recs; /* live claims, oldest first (circular) */
    size_t first, nrecs, rcap;
    int closed;
    atomic_int waiting;  /* claims waiting for space now */
    unsigned long long waits, wait_ns, bytes;
    size_t peak;
    pthread_mutex_t lock;
    pthread_cond_t space;
};

struct shim_ring_stats {
    size_t cap, seg, piece, peak, live;
    unsigned long long waits, wait_ns, bytes;
};

/* Set up a ring of cap bytes made of segments of seg bytes (both rounded
 * down to 256; seg 0 or > cap: one segment). -1 when that leaves no room
 * for a piece or cap is not a multiple of seg. */
int shim_ring_init(struct shim_ring *r, size_t cap, size_t seg);
/* Add one segment at the end (its memory must be addressable first). */
void shim_ring_grow(struct shim_ring *r);
/* Claim n bytes (1..seg; rounded up to 256) and return their offset, 256-
 * aligned. Waits while they do not fit (counted in waits/wait_ns); every
 * 50 ms give_up (may be NULL) is asked whether to stop waiting. SIZE_MAX
 * when n is out of range, the ring is closed, give_up said so, or out of
 * memory. */
size_t shim_ring_alloc(struct shim_ring *r, size_t n, int (*give_up)(void));
/* Return the claim at off (any order; space is reused once every older
 * claim is back). */
void shim_ring_free(struct shim_ring *r, size_t off);
/* Refuse further claims and wake waiters. */
void shim_ring_close(struct shim_ring *r);
void shim_ring_stats(struct shim_ring *r, struct shim_ring_stats *s);

#endif
