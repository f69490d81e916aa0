/* rounded_fingerprint.c - what a weight's rounded fingerprints cost
 * (probe_rounded_fingerprint_compute, docs/gemm.md "Weights"), against the
 * XXH64 of the same bytes (probe_capture_hash: the hash every fingerprinted
 * weight pays anyway), measured in the same run on the same buffer.
 *
 * build:  cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -o rounded_fingerprint bench/rounded_fingerprint.c \
 *           -Lbuild/lib -lprobe -Wl,-rpath,$PWD/build/lib
 * run:    ./rounded_fingerprint [MELEMENTS] [ROUNDS]   (default 64 M bfloat16 elements, best of 3)
 *
 * Three ways over one random bfloat16 buffer (normal values of sd 0.02, as a
 * weight's): XXH64 of its bytes; the rounded fingerprints of the whole buffer
 * (2^22 elements or more: several threads); the same in slices of
 * 2^22 - 1 elements (each slice on the calling thread alone: the same work
 * one thread does). Prints ns per element of each, the speed-up of the whole
 * over the slices, and the whole's cost in XXH64s of the same bytes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe/capture.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    double mel = argc > 1 ? strtod(argv[1], NULL) : 64;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    if (!(mel >= 1 && mel <= 4096) || rounds < 1) {
        fprintf(stderr, "usage: rounded_fingerprint [MELEMENTS 1..4096] [ROUNDS >= 1]\n");
        return 2;
    }
    size_t n = (size_t)(mel * 1048576.0);
    uint16_t *w = malloc(n * sizeof *w);
    if (w == NULL) {
        fprintf(stderr, "rounded_fingerprint: out of memory\n");
        return 2;
    }
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i += 2) { /* Box-Muller pairs, sd 0.02, to bfloat16 by truncation */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u1 = ((s >> 11) + 1) * 0x1p-53, u2 = ((s & 0xfffff) + 0.5) * 0x1p-20;
        double r = sqrt(-2 * log(u1)) * 0.02;
        float v[2] = {(float)(r * cos(6.283185307179586 * u2)), (float)(r * sin(6.283185307179586 * u2))};
        for (int k = 0; k < 2 && i + k < n; k++) {
            uint32_t b;
            memcpy(&b, &v[k], 4);
            w[i + k] = (uint16_t)(b >> 16);
        }
    }
    const size_t slice = ((size_t)1 << 22) - 1;
    double best[3] = {1e30, 1e30, 1e30};
    probe_rounded_fingerprint fp;
    uint64_t h = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        h ^= probe_capture_hash(w, n * 2);
        double t1 = now();
        if (probe_rounded_fingerprint_compute(PROBE_DTYPE_BFLOAT16, w, n, &fp) != PROBE_OK)
            return 1;
        double t2 = now();
        for (size_t at = 0; at < n; at += slice)
            if (probe_rounded_fingerprint_compute(PROBE_DTYPE_BFLOAT16, w + at, n - at < slice ? n - at : slice,
                                                  &fp) != PROBE_OK)
                return 1;
        double t3 = now();
        double d[3] = {t1 - t0, t2 - t1, t3 - t2};
        for (int k = 0; k < 3; k++)
            best[k] = d[k] < best[k] ? d[k] : best[k];
    }
    printf("rounded_fingerprint: %zu bfloat16 elements (%.0f MiB), best of %d\n", n, n * 2 / 1048576.0, rounds);
    printf("XXH64 of the bytes (baseline)     %6.2f ns/element\n", best[0] / n * 1e9);
    printf("rounded fingerprints, whole       %6.2f ns/element  (%.1f XXH64s)\n", best[1] / n * 1e9,
           best[1] / best[0]);
    printf("rounded fingerprints, one thread  %6.2f ns/element  (%.1f XXH64s)\n", best[2] / n * 1e9,
           best[2] / best[0]);
    printf("whole against one thread: x%.2f faster (hash %016llx)\n", best[2] / best[1],
           (unsigned long long)h);
    free(w);
    return 0;
}
