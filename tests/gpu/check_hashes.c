/* check_hashes.c - every full tensor of a capture file holds the bytes its
 * probe.hash names: the stored hash against probe_capture_hash (one-shot
 * XXH64, seed 0) of the bytes read back whole. A check of the writer's
 * streamed put, which hashes a device tensor piece by piece (on the writer's
 * hashing thread, PROBE_HASH_THREAD) while it writes it.
 *
 *   check_hashes FILE.h5...
 *
 * Prints one line per file ("PASS FILE: N full tensors, every probe.hash
 * matches its bytes (M bytes)" or the first mismatch) and exits 0 when every
 * file passes, 1 on a mismatch or a tensor without a hash, 2 when a file
 * cannot be read. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/capture.h"

static int check(const char *path)
{
    probe_file *f = NULL;
    if (probe_file_open(path, &f) != PROBE_OK) {
        printf("FAIL %s: %s\n", path, probe_last_error());
        return 2;
    }
    size_t n = probe_file_count(f), full = 0;
    uint64_t bytes = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const probe_tensor_info *t = probe_file_tensor(f, i);
        if (t->stats_only)
            continue;
        size_t nb = (size_t)t->n * probe_dtype_size(t->dtype);
        if (!t->hash[0]) {
            printf("FAIL %s: %s has no probe.hash\n", path, t->path);
            rc = 1;
            break;
        }
        unsigned char *b = malloc(nb ? nb : 1);
        if (b == NULL || probe_file_read_raw(f, i, b, nb) != PROBE_OK) {
            printf("FAIL %s: %s: %s\n", path, t->path, b ? probe_last_error() : "out of memory");
            free(b);
            rc = 2;
            break;
        }
        char want[17];
        snprintf(want, sizeof want, "%016" PRIx64, probe_capture_hash(b, nb));
        free(b);
        if (strcmp(want, t->hash) != 0) {
            printf("FAIL %s: %s: probe.hash %s, its bytes hash to %s\n", path, t->path, t->hash,
                   want);
            rc = 1;
        }
        full++;
        bytes += nb;
    }
    if (rc == 0)
        printf("PASS %s: %zu full tensors, every probe.hash matches its bytes (%" PRIu64
               " bytes)\n", path, full, bytes);
    probe_file_close(f);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: check_hashes FILE.h5...\n");
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        int r = check(argv[i]);
        if (r > rc)
            rc = r;
    }
    return rc;
}
