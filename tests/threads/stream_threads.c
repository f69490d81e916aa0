/* stream_threads - the streaming metrics engine's worker threads
 * (metrics/metrics.c) driven without Criterion, so that it also runs under
 * ThreadSanitizer (scripts/test --tsan; Criterion's fork arena does not start
 * under TSan). For 1..16 threads: the same bits as with one thread (metrics
 * and channel shift, with NaN/Inf, two p99 passes), and a read that fails
 * part-way through the pass stops every worker cleanly with the reader's
 * status. Exit 0 when all hold, 1 otherwise (the failing check on stderr). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/metrics.h"

typedef struct {
    const double *side[2];
    uint64_t fail_at; /* offset at which a read fails (UINT64_MAX: never) */
} src_ctx;

static probe_status src_read(void *ctx, int side, uint64_t offset, size_t count, void *dst)
{
    src_ctx *c = ctx;
    if (offset + count > c->fail_at)
        return probe_set_error(PROBE_EIO, "injected read failure at %llu", (unsigned long long)offset);
    memcpy(dst, c->side[side] + offset, count * sizeof(double));
    return PROBE_OK;
}

static int failures;
#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "stream_threads: " __VA_ARGS__); \
            fputc('\n', stderr);                          \
            failures++;                                   \
        }                                                 \
    } while (0)

int main(void)
{
    const size_t n = 1000006; /* 7 channels x 142858 */
    double *r = malloc(n * sizeof *r), *c = malloc(n * sizeof *c);
    if (!r || !c)
        return 1;
    srand(7);
    for (size_t i = 0; i < n; i++) {
        r[i] = (rand() / (double)RAND_MAX - 0.5) * 8.0;
        c[i] = r[i] + (rand() / (double)RAND_MAX - 0.5) * 1e-3;
    }
    r[17] = NAN;
    c[1000] = INFINITY;
    r[2000] = c[2000] = -INFINITY;
    const probe_metrics_opts tol = {1e-3, 1e-3};
    probe_metrics m0, m;
    probe_channel_shift s0, s;
    double shift0[7], shift[7];
    for (int th = 1; th <= 16; th++) {
        src_ctx ctx = {{r, c}, UINT64_MAX};
        probe_pair_source src = {n, {PROBE_DTYPE_FLOAT64, PROBE_DTYPE_FLOAT64}, src_read, &ctx};
        probe_stream_opts so = {th, {7, 1}, th == 1 ? shift0 : shift, NULL, NULL};
        probe_status st = probe_metrics_compute_source(&src, &tol, &so, th == 1 ? &m0 : &m,
                                                       th == 1 ? &s0 : &s);
        CHECK(st == PROBE_OK, "%d threads: status %d (%s)", th, st, probe_last_error());
        if (th > 1 && st == PROBE_OK) {
            CHECK(memcmp(&m0, &m, sizeof m) == 0, "%d threads: metrics differ from 1 thread", th);
            CHECK(memcmp(&s0, &s, sizeof s) == 0, "%d threads: channel shift differs", th);
            CHECK(memcmp(shift0, shift, sizeof shift) == 0, "%d threads: shift_k differ", th);
        }
        /* a failing read part-way: the reader's status, workers joined */
        ctx.fail_at = n / 2 + (uint64_t)th * 1001;
        st = probe_metrics_compute_source(&src, &tol, &so, &m, &s);
        CHECK(st == PROBE_EIO, "%d threads: a failing read gave status %d, not PROBE_EIO", th, st);
    }
    free(r);
    free(c);
    if (failures == 0)
        printf("stream_threads: 1..16 threads give the same bits; a failing read stops cleanly\n");
    return failures ? 1 : 0;
}
