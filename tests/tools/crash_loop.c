/* crash_loop: the kill experiment of docs/evidence/2026-11-30-crash.md.
 *
 *   crash_loop write OUT.h5 SEED   put float32 tensors of 1..2^20 random
 *                                  elements in a loop until killed
 *   crash_loop check OUT.h5        exit 0 when probe_file_open reads the
 *                                  file and every tensor's bytes hash to its
 *                                  probe.hash; 1 (with the error) otherwise
 *
 * bench/crash_kill.py runs it against a libprobe (LD_LIBRARY_PATH picks
 * which: the journal-less writer of an older build, or this one). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/capture.h"

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "write") == 0) {
        probe_writer *w;
        if (probe_writer_open(argv[2], NULL, &w) != PROBE_OK) {
            fprintf(stderr, "crash_loop: %s\n", probe_last_error());
            return 2;
        }
        uint64_t s = strtoull(argv[3], NULL, 0) | 1;
        float *buf = malloc(sizeof(float) << 20);
        for (uint64_t i = 0;; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            int64_t n = 1 + (int64_t)(s % (1u << 20));
            for (int64_t k = 0; k < n; k++)
                buf[k] = (float)(k ^ (int64_t)i);
            char path[64];
            snprintf(path, sizeof path, "/loop/%06llu/out", (unsigned long long)i);
            probe_record rec = {.path = path, .call = (int64_t)i, .step = -1, .cfg_branch = -1,
                                .timestep = 0, .seq = i, .dtype = PROBE_DTYPE_FLOAT32, .rank = 1,
                                .shape = &n};
            if (probe_writer_put(w, &rec, buf, (size_t)n * sizeof(float)) != PROBE_OK) {
                fprintf(stderr, "crash_loop: %s\n", probe_last_error());
                return 2;
            }
        }
    }
    if (argc == 3 && strcmp(argv[1], "check") == 0) {
        probe_file *f;
        if (probe_file_open(argv[2], &f) != PROBE_OK) {
            printf("%s\n", probe_last_error());
            return 1;
        }
        float *buf = malloc(sizeof(float) << 20);
        for (size_t i = 0; i < probe_file_count(f); i++) {
            const probe_tensor_info *t = probe_file_tensor(f, i);
            char h[17];
            if (t->n > (1u << 20) || probe_file_read_raw(f, i, buf, t->n * 4) != PROBE_OK) {
                printf("%s: %s\n", t->path, probe_last_error());
                return 1;
            }
            snprintf(h, sizeof h, "%016llx", (unsigned long long)probe_capture_hash(buf, t->n * 4));
            if (strcmp(h, t->hash) != 0) {
                printf("%s: bytes do not hash to probe.hash\n", t->path);
                return 1;
            }
        }
        printf("ok %zu tensors\n", probe_file_count(f));
        probe_file_close(f);
        return 0;
    }
    fprintf(stderr, "usage: crash_loop write OUT.h5 SEED | crash_loop check OUT.h5\n");
    return 2;
}
