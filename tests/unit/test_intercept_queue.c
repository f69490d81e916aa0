/* test_intercept_queue.c - the shim's work queue (intercept/capture/queue.c)
 * on its own: items run on the writer thread in push order with their own
 * callbacks, a barrier runs after every earlier item, back-pressure counts
 * its waits, and a stopped queue refuses work. One queue per process: every
 * case runs in its own Criterion process. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/shim.h"
#include "capture/queue.h"

#define N 1000

struct item {
    struct shim_work work;
    int id;
};

static int order[N];
static atomic_int nrun, ndone;
static pthread_t runner;

static void run_item(struct shim_work *w)
{
    struct item *it = (struct item *)w;
    if (nrun == 0)
        runner = pthread_self();
    cr_assert(pthread_equal(runner, pthread_self()), "every item runs on the one writer thread");
    order[atomic_fetch_add(&nrun, 1)] = it->id;
}

static void done_item(struct shim_work *w)
{
    atomic_fetch_add(&ndone, 1);
    free(w);
}

static struct item *new_item(int id)
{
    struct item *it = calloc(1, sizeof *it);
    cr_assert_not_null(it);
    it->work.run = run_item;
    it->work.done = done_item;
    it->id = id;
    return it;
}

static int seen_at_barrier;
static probe_status at_barrier(void)
{
    seen_at_barrier = atomic_load(&nrun);
    return PROBE_EIO; /* any status: the barrier hands it back */
}

static void setup(void)
{
    shim_cfg.queue_max_bytes = (size_t)1 << 30;
}

Test(intercept_queue, items_run_in_push_order_then_done, .init = setup)
{
    cr_assert_eq(shim_queue_start(), PROBE_OK);
    for (int i = 0; i < N; ++i)
        cr_assert_eq(shim_queue_push(&new_item(i)->work), PROBE_OK);
    cr_assert_eq(shim_queue_barrier(at_barrier), PROBE_EIO, "the barrier returns at()'s status");
    cr_assert_eq(seen_at_barrier, N, "at() runs after every item pushed before the barrier");
    for (int i = 0; i < N; ++i)
        cr_assert_eq(order[i], i, "item %d ran %dth", order[i], i);
    cr_assert_eq(shim_queue_stop(5000), 1);
    cr_assert_eq(atomic_load(&ndone), N, "done() ran once per item");
}

static atomic_int nstopping;
static void on_stopping(void)
{
    atomic_fetch_add(&nstopping, 1);
}

Test(intercept_queue, stopped_queue_refuses_work, .init = setup)
{
    shim_queue_set_hooks(NULL, NULL, on_stopping);
    struct item *it = new_item(0);
    cr_assert_eq(shim_queue_push(&it->work), PROBE_ESTATE, "never started: refused");
    cr_assert_eq(shim_queue_start(), PROBE_OK);
    cr_assert_eq(shim_queue_closing(), 0);
    cr_assert_eq(shim_queue_stop(5000), 1);
    cr_assert_eq(shim_queue_stop(5000), 1, "a second stop is harmless");
    cr_assert_eq(atomic_load(&nstopping), 1, "the stopping hook runs once");
    cr_assert_eq(shim_queue_closing(), 1);
    cr_assert_eq(shim_queue_push(&it->work), PROBE_ESTATE, "stopped: refused, item not taken");
    cr_assert_eq(shim_queue_barrier(at_barrier), PROBE_ESTATE);
    cr_assert_eq(shim_queue_reserve(1), PROBE_ESTATE);
    free(it);
}

/* A slow item holds the queue; a tap that reserves more than the limit
 * waits (counted) until the item is done and its bytes return. */
static atomic_int release_slow;
static void run_slow(struct shim_work *w)
{
    (void)w;
    while (!atomic_load(&release_slow))
        usleep(1000);
}

static void *release_later(void *arg)
{
    (void)arg;
    usleep(100 * 1000);
    atomic_store(&release_slow, 1);
    return NULL;
}

Test(intercept_queue, back_pressure_waits_are_counted, .init = setup)
{
    shim_cfg.queue_max_bytes = 1000;
    cr_assert_eq(shim_queue_start(), PROBE_OK);
    struct shim_work slow = {.run = run_slow};
    cr_assert_eq(shim_queue_reserve(800), PROBE_OK);
    slow.reserved = 800;
    cr_assert_eq(shim_queue_push(&slow), PROBE_OK);
    pthread_t t;
    pthread_create(&t, NULL, release_later, NULL);
    uint64_t t0 = shim_now_ns();
    cr_assert_eq(shim_queue_reserve(500), PROBE_OK, "waits, then gets its bytes");
    double waited = (double)(shim_now_ns() - t0) * 1e-9;
    pthread_join(t, NULL);
    cr_assert_geq(waited, 0.05, "the reserve waited for the slow item (%.3f s)", waited);
    cr_assert_eq(atomic_load(&shim_counts.queue_waits), 1);
    cr_assert_geq(atomic_load(&shim_counts.queue_wait_ns), 50000000ull);
    shim_queue_unreserve(500);
    cr_assert_eq(shim_queue_stop(5000), 1);
}

static atomic_int nidle;
static int idle_twice(void)
{
    return atomic_fetch_add(&nidle, 1) < 1; /* work once more, then nothing */
}

Test(intercept_queue, idle_hook_runs_while_empty, .init = setup)
{
    shim_queue_set_hooks(idle_twice, NULL, NULL);
    cr_assert_eq(shim_queue_start(), PROBE_OK);
    for (int i = 0; i < 200 && atomic_load(&nidle) < 2; ++i)
        usleep(1000);
    cr_assert_eq(atomic_load(&nidle), 2, "asked again after 1, not after 0");
    cr_assert_eq(shim_queue_stop(5000), 1);
}
