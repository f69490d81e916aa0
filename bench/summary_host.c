/* summary_host.c - what a host stats-only record costs in the canonical tree
 * order (probe_summary_tree: summary and tree hash in one pass over 256-byte
 * pieces), against the baseline a stats-only record paid before it: the
 * XXH64 of the whole tensor (probe_capture_hash) and a summary by one
 * sequential pass, measured in the same run on the same buffer.
 *
 * build:  cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -o summary_host bench/summary_host.c \
 *           -Lbuild/lib -lprobe -Wl,-rpath,$PWD/build/lib
 * run:    ./summary_host [MIB] [ROUNDS]   (default 256 MiB of bfloat16, best of 5)
 *
 * Prints GB/s for each and the ratio to the baseline (XXH64 + sequential
 * sums: what probe_capture_hash + a plain loop cost), and the ratio of the
 * tree hash alone to XXH64 alone. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe/capture.h"
#include "probe/metrics.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the plain sequential summary sums of bfloat16 elements (the baseline's
 * summary pass; finite elements only) */
static double plain_sums(const uint16_t *x, size_t n, double *sq)
{
    double s = 0, q = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)x[i] << 16;
        float f;
        memcpy(&f, &b, 4);
        if ((b & 0x7F800000u) != 0x7F800000u) {
            s += f;
            q += (double)f * f;
        }
    }
    *sq = q;
    return s;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    size_t nbytes = mib << 20, n = nbytes / 2;
    uint16_t *x = malloc(nbytes);
    if (!x || rounds < 1) {
        fprintf(stderr, "summary_host: cannot allocate %zu MiB\n", mib);
        return 2;
    }
    uint64_t st = 1;
    for (size_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (uint16_t)(0x3000 + ((st >> 40) & 0x1FFF) + ((st >> 63) << 15)); /* finite */
    }
    double best[4] = {1e9, 1e9, 1e9, 1e9};
    volatile uint64_t sink = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        uint64_t h = probe_capture_hash(x, nbytes);
        double q, s = plain_sums(x, n, &q);
        double t1 = now();
        uint64_t th = probe_tree_hash(x, nbytes);
        double t2 = now();
        probe_summary sum;
        uint64_t th2;
        if (probe_summary_tree(PROBE_DTYPE_BFLOAT16, x, n, &sum, &th2) != PROBE_OK) {
            fprintf(stderr, "summary_host: %s\n", probe_last_error());
            return 2;
        }
        double t3 = now();
        uint64_t h2 = probe_capture_hash(x, nbytes);
        double t4 = now();
        sink ^= h ^ th ^ th2 ^ h2 ^ (uint64_t)(s + q + sum.sum);
        if (th != th2) {
            fprintf(stderr, "summary_host: probe_tree_hash and probe_summary_tree disagree\n");
            return 1;
        }
        double d[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3};
        for (int k = 0; k < 4; k++)
            best[k] = d[k] < best[k] ? d[k] : best[k];
    }
    const char *name[4] = {"baseline: XXH64 + sequential sums", "probe_tree_hash",
                           "probe_summary_tree (summary + tree hash)", "XXH64 alone"};
    printf("%zu MiB of bfloat16, best of %d rounds, one thread\n", mib, rounds);
    for (int k = 0; k < 4; k++)
        printf("  %-42s %8.3f ms  %6.2f GB/s\n", name[k], best[k] * 1e3,
               (double)nbytes / best[k] / 1e9);
    printf("probe_summary_tree / baseline: %.2fx the time\n", best[2] / best[0]);
    printf("probe_tree_hash / XXH64:       %.2fx the time\n", best[1] / best[3]);
    return (int)(sink & 0);
}
