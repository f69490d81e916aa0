/* raw_lanes - the writer's raw files (probe_writer_set_raw_files) driven
 * without Criterion, so that the writing threads of the raw files and the
 * hashing thread also run under ThreadSanitizer (scripts/test --tsan). For
 * 1, 2, 3, 5 and 8 raw files, with the hashing thread on and off: 12
 * tensors of 1 to 13 MiB (sizes not multiples of the 4 MiB piece), put in
 * parts of 5 sizes from 4099 bytes to the whole tensor, each read back whole and
 * in a range across a piece end, the bytes and probe.hash checked against
 * the source and a one-shot XXH64. Exit 0 when all hold, 1 otherwise (the
 * failing check on stderr). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "probe/capture.h"

static int failures;
#define CHECK(cond, ...)                                \
    do {                                                \
        if (!(cond)) {                                  \
            fprintf(stderr, "raw_lanes: " __VA_ARGS__); \
            fputc('\n', stderr);                        \
            failures++;                                 \
        }                                               \
    } while (0)

#define MiB ((size_t)1 << 20)
#define NT 12

static void remove_capture(const char *path, unsigned k)
{
    char p[700];
    for (unsigned i = 0; i < k; i++) {
        snprintf(p, sizeof p, "%s.raw/%02u", path, i);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s.raw", path);
    rmdir(p);
    unlink(path);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/probe-raw-lanes-XXXXXX", t && *t ? t : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    size_t size[NT], total = 0;
    for (int i = 0; i < NT; i++)
        total += size[i] = MiB + (size_t)i * 1000003u;
    unsigned char *src = malloc(total), *got = malloc(13 * MiB);
    if (src == NULL || got == NULL)
        return 1;
    uint32_t v = 12345;
    for (size_t i = 0; i < total; i++) {
        v = v * 1664525u + 1013904223u;
        src[i] = (unsigned char)(v >> 24);
    }
    static const size_t parts[] = {4099, 65536, 3 * MiB + 1, 4 * MiB, 64 * MiB};
    static const unsigned ks[] = {1, 2, 3, 5, 8};
    char path[600];
    snprintf(path, sizeof path, "%s/cap.h5", dir);
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        for (int ht = 0; ht < 2; ht++) {
            unsigned k = ks[ki];
            probe_writer *w = NULL;
            CHECK(probe_writer_open(path, "{}", &w) == PROBE_OK, "open: %s", probe_last_error());
            if (w == NULL)
                return 1;
            CHECK(probe_writer_set_hash_thread(w, ht) == PROBE_OK, "hash thread");
            CHECK(probe_writer_set_raw_files(w, k) == PROBE_OK, "set %u: %s", k, probe_last_error());
            char names[NT][16];
            int64_t shape[NT][1];
            size_t at = 0;
            for (int i = 0; i < NT; i++) {
                snprintf(names[i], sizeof names[i], "/t/%02d", i);
                shape[i][0] = (int64_t)size[i];
                probe_record r = {.path = names[i], .call = -1, .step = -1, .cfg_branch = -1,
                                  .timestep = 0.0, .block = -1, .dtype = PROBE_DTYPE_UINT8,
                                  .rank = 1, .shape = shape[i]};
                size_t part = parts[(i + ki) % 5];
                probe_put *p = NULL;
                if (probe_writer_put_begin(w, &r, size[i], &p) != PROBE_OK) {
                    CHECK(0, "begin %s: %s", names[i], probe_last_error());
                    return 1;
                }
                for (size_t o = 0; o < size[i]; o += part)
                    CHECK(probe_writer_put_part(p, src + at + o, size[i] - o < part ? size[i] - o : part) ==
                              PROBE_OK, "part: %s", probe_last_error());
                CHECK(probe_writer_put_end(p) == PROBE_OK, "end: %s", probe_last_error());
                at += size[i];
            }
            CHECK(probe_writer_close(w) == PROBE_OK, "close: %s", probe_last_error());
            probe_file *f = NULL;
            CHECK(probe_file_open(path, &f) == PROBE_OK, "read: %s", probe_last_error());
            at = 0;
            for (int i = 0; f != NULL && i < NT; i++) {
                size_t idx = 0;
                CHECK(probe_file_find(f, names[i], &idx) == PROBE_OK, "find %s", names[i]);
                CHECK(probe_file_read_raw(f, idx, got, size[i]) == PROBE_OK && memcmp(got, src + at, size[i]) == 0,
                      "%u files, hash thread %d: %s bytes", k, ht, names[i]);
                char hex[17];
                snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(src + at, size[i], 0));
                CHECK(strcmp(probe_file_tensor(f, idx)->hash, hex) == 0, "%u files: %s hash", k, names[i]);
                if (size[i] > 4 * MiB + 100) {
                    CHECK(probe_file_read_range(f, idx, 4 * MiB - 100, 200, got) == PROBE_OK &&
                              memcmp(got, src + at + 4 * MiB - 100, 200) == 0,
                          "%u files: %s range across a piece end", k, names[i]);
                }
                at += size[i];
            }
            probe_file_close(f);
            remove_capture(path, k);
        }
    }
    rmdir(dir);
    free(src);
    free(got);
    if (failures == 0)
        printf("raw_lanes: 5 raw file counts x 2 hash threads x %d tensors: bytes and hashes hold\n", NT);
    return failures ? 1 : 0;
}
