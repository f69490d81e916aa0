/* shim_tap_threads.c - many threads tapping at once.
 *
 * usage: shim_tap_threads THREADS TAPS ROWS
 * Thread t taps TAPS tensors /thr<t>/<i:04>/out, int32 of shape [ROWS, 17]
 * (ROWS 0 means 1 + (t+i) % 7), element k (row-major) = t*1000003 + i*1009 + k,
 * every other one transposed (strides [1, ROWS] over a [17, ROWS] buffer), each
 * inside its own NVTX range "thread <t>" so per-thread scopes are checked
 * too. The checker (tests/e2e/test_shim_threads.py) recomputes every value.
 * Exit 0 when every tap returned 0.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#include "probe/dtype.h"
#include "probe/tap.h"
#include "tap_client.h"

typedef int (*tap_fn)(const probe_tap_tensor_v1 *);

static tap_fn tap;
static int taps_per_thread, rows_arg;
static atomic_int failures;

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    char comp[32], range[32];
    snprintf(comp, sizeof comp, "thr%d", t);
    snprintf(range, sizeof range, "thread %d", t);
    nvtxRangePushA(range);
    for (int i = 0; i < taps_per_thread; ++i) {
        int64_t rows = rows_arg ? rows_arg : 1 + (t + i) % 7;
        size_t n = (size_t)rows * 17;
        int32_t *buf = malloc(n * sizeof *buf);
        int transposed = i % 2;
        int64_t shape[2] = {rows, 17}, strides[2] = {1, rows};
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < 17; ++c) {
                int32_t v = (int32_t)(t * 1000003 + i * 1009 + r * 17 + c);
                if (transposed)
                    buf[c * rows + r] = v; /* memory [17, rows]; logical [rows, 17] */
                else
                    buf[r * 17 + c] = v;
            }
        }
        probe_tap_tensor_v1 d = tap_desc(comp, i, -1);
        d.dtype = PROBE_DTYPE_INT32;
        d.rank = 2;
        d.shape = shape;
        d.strides = transposed ? strides : NULL;
        d.data = buf;
        d.timestep = 0.0;
        if (tap(&d) != 0)
            atomic_fetch_add(&failures, 1);
        memset(buf, 0xEE, n * sizeof *buf);
        free(buf);
    }
    nvtxRangePop();
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s THREADS TAPS ROWS\n", argv[0]);
        return 2;
    }
    int nthreads = atoi(argv[1]);
    taps_per_thread = atoi(argv[2]);
    rows_arg = atoi(argv[3]);
    tap = (tap_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_v1");
    if (!tap || nthreads <= 0 || nthreads > 256) {
        fprintf(stderr, "probe_tap_v1 not found or bad arguments\n");
        return 2;
    }
    pthread_t th[256];
    for (int t = 0; t < nthreads; ++t)
        pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < nthreads; ++t)
        pthread_join(th[t], NULL);
    printf("threads done, failures=%d\n", atomic_load(&failures));
    return atomic_load(&failures) ? 1 : 0;
}
