/* staging.c - the ring allocator over the pinned staging pool.
 *
 * Device tensors are copied, in pieces of at most a fixed size, into pinned
 * memory made of equal segments (cuda.c allocates the first at the first
 * device tap and the rest from the writer thread while it is idle; the ring
 * grows by one segment at a time). A claim never crosses a segment boundary. Pieces are taken at the head of the
 * ring and returned when the writer thread has consumed them. Allocation
 * order is the writer's processing order (cuda.c takes pieces under one lock
 * and queues the job before it takes the next tensor's), so returns are
 * normally first-in first-out; a piece returned early is remembered and the
 * tail passes it once everything older is back. A request that does not fit
 * waits (back-pressure): the wait is counted and timed.
 *
 * Pure host code (no CUDA): tests/threads/staging_ring.c runs it under TSan.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/ring.h"

#define RING_ALIGN 256u

static uint64_t ring_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int shim_ring_init(struct shim_ring *r, size_t cap, size_t seg)
{
    memset(r, 0, sizeof *r);
    r->cap = cap - cap % RING_ALIGN;
    r->seg = seg - seg % RING_ALIGN;
    if (r->seg == 0 || r->seg > r->cap)
        r->seg = r->cap;
    r->piece = r->seg / 4;
    if (r->piece > SHIM_RING_PIECE_MAX)
        r->piece = SHIM_RING_PIECE_MAX;
    r->piece -= r->piece % RING_ALIGN;
    if (r->piece == 0 || r->cap % r->seg)
        return -1;
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&r->space, &a);
    pthread_condattr_destroy(&a);
    pthread_mutex_init(&r->lock, NULL);
    return 0;
}

void shim_ring_grow(struct shim_ring *r)
{
    pthread_mutex_lock(&r->lock);
    r->cap += r->seg;
    pthread_cond_broadcast(&r->space);
    pthread_mutex_unlock(&r->lock);
}

/* caller holds r->lock: the n-th live record from the oldest */
static struct shim_ring_rec *rec_at(struct shim_ring *r, size_t n)
{
    return &r->recs[(r->first + n) % r->rcap];
}

static int recs_push(struct shim_ring *r, size_t start, size_t off, size_t end)
{
    if (r->nrecs == r->rcap) {
        size_t nc = r->rcap ? r->rcap * 2 : 64;
        struct shim_ring_rec *nv = malloc(nc * sizeof *nv);
        if (!nv)
            return -1;
        for (size_t i = 0; i < r->nrecs; ++i)
            nv[i] = *rec_at(r, i);
        free(r->recs);
        r->recs = nv;
        r->rcap = nc;
        r->first = 0;
    }
    struct shim_ring_rec *x = &r->recs[(r->first + r->nrecs) % r->rcap];
    x->start = start;
    x->off = off;
    x->end = end;
    x->freed = 0;
    r->nrecs++;
    return 0;
}

/* The first offset >= at where n bytes (n <= seg) lie within one segment. */
static size_t place(const struct shim_ring *r, size_t at, size_t n)
{
    if (at / r->seg != (at + n - 1) / r->seg)
        at = (at / r->seg + 1) * r->seg;
    return at;
}

/* caller holds r->lock: offset where n bytes fit now, or SIZE_MAX. *start is
 * where the record's claim begins (the head, which is before the offset
 * when bytes up to a segment's or the region's end are skipped). Live
 * claims occupy [tail, head) when head > tail, else [tail, cap) and
 * [0, head). */
static size_t fit(const struct shim_ring *r, size_t n, size_t *start)
{
    if (r->nrecs == 0) {
        *start = 0;
        return n <= r->cap ? 0 : SIZE_MAX;
    }
    size_t tail = r->recs[r->first].start;
    *start = r->head;
    if (r->head > tail) {
        size_t off = place(r, r->head, n);
        if (off + n <= r->cap)
            return off;
        if (tail >= n)
            return 0; /* skip to the start: the skipped bytes belong to this claim */
        return SIZE_MAX;
    }
    if (r->head < tail) {
        size_t off = place(r, r->head, n);
        if (off + n <= tail)
            return off;
    }
    return SIZE_MAX;
}

size_t shim_ring_alloc(struct shim_ring *r, size_t n, int (*give_up)(void))
{
    if (n == 0 || n > r->seg)
        return SIZE_MAX;
    size_t rounded = n + (RING_ALIGN - n % RING_ALIGN) % RING_ALIGN;
    if (rounded > r->seg)
        rounded = r->seg;
    pthread_mutex_lock(&r->lock);
    size_t start, off = fit(r, rounded, &start);
    if (off == SIZE_MAX && !r->closed) {
        uint64_t t0 = ring_now_ns();
        r->waits++;
        atomic_fetch_add(&r->waiting, 1);
        while (off == SIZE_MAX && !r->closed) {
            struct timespec dl;
            clock_gettime(CLOCK_MONOTONIC, &dl);
            dl.tv_nsec += 50000000L; /* re-check give_up every 50 ms */
            if (dl.tv_nsec >= 1000000000L) {
                dl.tv_sec += 1;
                dl.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&r->space, &r->lock, &dl);
            if (give_up && give_up())
                break;
            off = fit(r, rounded, &start);
        }
        r->wait_ns += ring_now_ns() - t0;
        atomic_fetch_sub(&r->waiting, 1);
    }
    if (off != SIZE_MAX && (r->closed || recs_push(r, start, off, off + rounded) != 0))
        off = SIZE_MAX;
    if (off != SIZE_MAX) {
        r->head = off + rounded;
        size_t tail = r->recs[r->first].start;
        size_t used = r->head > tail ? r->head - tail : r->cap - tail + r->head;
        if (used > r->peak)
            r->peak = used;
        r->bytes += n;
    }
    pthread_mutex_unlock(&r->lock);
    return off;
}

void shim_ring_free(struct shim_ring *r, size_t off)
{
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->nrecs; ++i) {
        struct shim_ring_rec *x = rec_at(r, i);
        if (x->off == off && !x->freed) {
            x->freed = 1;
            break;
        }
    }
    int moved = 0;
    while (r->nrecs && r->recs[r->first].freed) {
        r->first = (r->first + 1) % r->rcap;
        r->nrecs--;
        moved = 1;
    }
    if (r->nrecs == 0)
        r->head = 0;
    if (moved)
        pthread_cond_broadcast(&r->space);
    pthread_mutex_unlock(&r->lock);
}

void shim_ring_close(struct shim_ring *r)
{
    pthread_mutex_lock(&r->lock);
    r->closed = 1;
    pthread_cond_broadcast(&r->space);
    pthread_mutex_unlock(&r->lock);
}

void shim_ring_stats(struct shim_ring *r, struct shim_ring_stats *s)
{
    pthread_mutex_lock(&r->lock);
    s->cap = r->cap;
    s->seg = r->seg;
    s->piece = r->piece;
    s->waits = r->waits;
    s->wait_ns = r->wait_ns;
    s->peak = r->peak;
    s->bytes = r->bytes;
    s->live = r->nrecs;
    pthread_mutex_unlock(&r->lock);
}
