/* staging_ring.c - the pinned staging ring's allocator (intercept/base/ring.c)
 * without CUDA: compiled in directly, run by ctest and under TSan
 * (scripts/test --tsan).
 *
 * 1. Out-of-order returns while the ring grows from one segment to four:
 *    live claims never overlap (checked against a byte-ownership map),
 *    every claim is 256-aligned, inside the ring and inside one segment,
 *    and once everything is returned a whole segment is claimable again.
 * 2. Producers and one consumer, as the shim uses it: 4 threads claim
 *    pieces of random size under one lock (cuda.c's capture lock), fill them
 *    with a pattern of their own and queue them; the consumer checks each
 *    pattern (a claim overwritten by another would show), returns it, and
 *    grows the ring by a segment every 1000 items up to 4 (as the writer
 *    thread does). The ring is small, so producers wait: waits are counted.
 * Prints FAIL lines; exit status 1 on any.
 */
#include "../../intercept/base/ring.c"

#include <stdio.h>

static int failures;
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL " __VA_ARGS__);                                                               \
        printf("\n");                                                                              \
        failures++;                                                                                \
    } while (0)

static uint64_t rng = 88172645463325252ull;
static uint64_t next64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void out_of_order(void)
{
    struct shim_ring r;
    size_t cap = 1 << 20;
    if (shim_ring_init(&r, cap / 4, cap / 4) != 0) { /* one segment; grows to 4 */
        FAIL("init");
        return;
    }
    unsigned char *owner = calloc(cap, 1); /* 0 free, else 1 + slot */
    struct { size_t off, n; int live; } slot[64] = {{0}};
    for (int round = 0; round < 20000; ++round) {
        if (round % 5000 == 4999 && r.cap < cap)
            shim_ring_grow(&r);
        int k = (int)(next64() % 64);
        if (slot[k].live) {
            for (size_t b = 0; b < slot[k].n; ++b)
                owner[slot[k].off + b] = 0;
            shim_ring_free(&r, slot[k].off);
            slot[k].live = 0;
            continue;
        }
        size_t n = 1 + next64() % (r.piece);
        /* only claim when it fits without waiting: probe with a give-up */
        struct shim_ring_stats before, after;
        shim_ring_stats(&r, &before);
        size_t off;
        {
            pthread_mutex_lock(&r.lock);
            size_t start;
            size_t rounded = n + (RING_ALIGN - n % RING_ALIGN) % RING_ALIGN;
            off = fit(&r, rounded, &start);
            pthread_mutex_unlock(&r.lock);
        }
        if (off == SIZE_MAX)
            continue;
        off = shim_ring_alloc(&r, n, NULL);
        shim_ring_stats(&r, &after);
        if (off == SIZE_MAX || after.waits != before.waits) {
            FAIL("claim of %zu bytes that fits was refused or waited", n);
            break;
        }
        if (off % RING_ALIGN || off + n > r.cap || off / r.seg != (off + n - 1) / r.seg)
            FAIL("claim at %zu of %zu bytes misaligned, outside the ring or across a segment", off, n);
        for (size_t b = 0; b < n; ++b) {
            if (owner[off + b]) {
                FAIL("claim at %zu overlaps slot %d at byte %zu", off, owner[off + b] - 1, off + b);
                break;
            }
            owner[off + b] = (unsigned char)(k + 1);
        }
        slot[k].off = off;
        slot[k].n = n;
        slot[k].live = 1;
        if (failures)
            break;
    }
    for (int k = 0; k < 64; ++k)
        if (slot[k].live)
            shim_ring_free(&r, slot[k].off);
    struct shim_ring_stats s;
    shim_ring_stats(&r, &s);
    if (s.live != 0)
        FAIL("%zu claims left after returning all", s.live);
    if (r.cap != cap)
        FAIL("ring grew to %zu bytes, want %zu", r.cap, cap);
    size_t whole = shim_ring_alloc(&r, r.seg, NULL);
    if (whole != 0)
        FAIL("a whole segment is not claimable after everything came back (%zu)", whole);
    else
        shim_ring_free(&r, whole);
    free(owner);
    free(r.recs);
    printf("out_of_order: 20000 rounds, peak %zu of %zu bytes\n", s.peak, s.cap);
}

/* ---- producers and a consumer ------------------------------------------- */

struct item {
    struct item *next;
    size_t off, n;
    uint32_t tag;
};

static struct shim_ring R;
static unsigned char *base;
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER; /* cuda.c's capture lock */
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;
static struct item *qhead, *qtail;
static int producers_left = 4;
static atomic_ullong checked;

static void *producer(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
    for (int i = 0; i < 3000; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t n = 1 + x % R.piece;
        pthread_mutex_lock(&order_lock);
        size_t off = shim_ring_alloc(&R, n, NULL);
        if (off == SIZE_MAX) {
            pthread_mutex_unlock(&order_lock);
            printf("FAIL producer %d: claim refused\n", t);
            break;
        }
        uint32_t tag = (uint32_t)(t << 24 | i);
        for (size_t b = 0; b < n; b += 4)
            memcpy(base + off + b, &tag, n - b < 4 ? n - b : 4);
        struct item *it = malloc(sizeof *it);
        it->off = off;
        it->n = n;
        it->tag = tag;
        it->next = NULL;
        pthread_mutex_lock(&qlock);
        if (qtail)
            qtail->next = it;
        else
            qhead = it;
        qtail = it;
        pthread_cond_signal(&qcond);
        pthread_mutex_unlock(&qlock);
        pthread_mutex_unlock(&order_lock);
    }
    pthread_mutex_lock(&qlock);
    producers_left--;
    pthread_cond_signal(&qcond);
    pthread_mutex_unlock(&qlock);
    return NULL;
}

static void *consumer(void *arg)
{
    (void)arg;
    long bad = 0;
    for (;;) {
        pthread_mutex_lock(&qlock);
        while (!qhead && producers_left)
            pthread_cond_wait(&qcond, &qlock);
        struct item *it = qhead;
        if (it) {
            qhead = it->next;
            if (!qhead)
                qtail = NULL;
        }
        pthread_mutex_unlock(&qlock);
        if (!it)
            break;
        for (size_t b = 0; b < it->n; b += 4) {
            uint32_t v = 0;
            memcpy(&v, base + it->off + b, it->n - b < 4 ? it->n - b : 4);
            uint32_t want = it->tag;
            if (it->n - b < 4) {
                v &= (1u << 8 * (it->n - b)) - 1;
                want &= (1u << 8 * (it->n - b)) - 1;
            }
            if (v != want) {
                bad++;
                break;
            }
        }
        shim_ring_free(&R, it->off);
        free(it);
        if (atomic_fetch_add(&checked, 1) % 1000 == 999 && R.cap < 4 * R.seg)
            shim_ring_grow(&R);
    }
    return (void *)bad;
}

static void producers_consumer(void)
{
    if (shim_ring_init(&R, 64 << 10, 64 << 10) != 0) { /* 16 KiB pieces: producers wait */
        FAIL("init");
        return;
    }
    base = malloc(4 * R.cap);
    pthread_t p[4], c;
    pthread_create(&c, NULL, consumer, NULL);
    for (int t = 0; t < 4; ++t)
        pthread_create(&p[t], NULL, producer, (void *)(intptr_t)t);
    for (int t = 0; t < 4; ++t)
        pthread_join(p[t], NULL);
    void *bad;
    pthread_join(c, &bad);
    struct shim_ring_stats s;
    shim_ring_stats(&R, &s);
    if ((long)(intptr_t)bad != 0)
        FAIL("%ld claims were overwritten before the consumer read them", (long)(intptr_t)bad);
    if (atomic_load(&checked) != 4 * 3000)
        FAIL("consumer saw %llu items, want 12000", (unsigned long long)atomic_load(&checked));
    if (s.live != 0)
        FAIL("%zu claims left", s.live);
    if (s.waits == 0)
        FAIL("no producer waited on a 256 KiB ring");
    printf("producers_consumer: 12000 claims checked, %llu waits, peak %zu of %zu bytes\n", s.waits,
           s.peak, s.cap);
    free(base);
    free(R.recs);
}

int main(void)
{
    out_of_order();
    producers_consumer();
    printf("staging_ring: %s\n", failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}
