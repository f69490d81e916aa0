/* fuzz_reader - libFuzzer harness for the capture-file reader (probe/capture/reader.c).
 *
 * The input is a whole file (a mutated probe capture or h5py file). It is
 * opened with probe_file_open; every query is made (count, tensor, find,
 * manifest, skips, ignored) and every tensor is read: whole with
 * probe_file_read_f64 and probe_file_read_raw, and in odd ranges with
 * probe_file_read_range (first element, last element, a middle range that
 * crosses rows, a range that runs past the end). Any status is fine; a crash,
 * a sanitizer report, a leak, a hang or unbounded memory is a finding.
 * Reads are bounded: at most READ_CAP elements per tensor, so that a file
 * that declares a huge (valid) dataset costs the fuzzer no more than a few
 * MiB; larger tensors are only read in ranges. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz_common.h"

enum { READ_CAP = 1 << 16 };

static void read_tensor(probe_file *f, size_t i)
{
    const probe_tensor_info *t = probe_file_tensor(f, i);
    size_t index;
    if (t == NULL || probe_file_find(f, t->path, &index) != PROBE_OK || index != i)
        abort(); /* every listed tensor must be found again by its path */
    size_t esize = probe_dtype_size(t->dtype);
    if (esize == 0 || esize > 8)
        abort(); /* describe() lets only known element types through */
    if (t->n <= READ_CAP) {
        double *d = malloc((t->n ? t->n : 1) * sizeof *d);
        if (d != NULL) {
            (void)probe_file_read_f64(f, i, d);
            (void)probe_file_read_raw(f, i, d, (size_t)t->n * esize);
        }
        free(d);
    }
    unsigned char buf[4096 * 8];
    uint64_t n = t->n;
    struct { uint64_t off, count; } r[] = {
        {0, n ? 1 : 0},
        {n ? n - 1 : 0, n ? 1 : 0},
        {n / 3, n - n / 3 < 777 ? n - n / 3 : 777},
        {n > 4096 ? n - 4096 : 0, n > 4096 ? 4096 : n},
        {n / 2, n}, /* past the end: PROBE_EINVAL */
        {UINT64_MAX - 1, 2},
    };
    for (size_t k = 0; k < sizeof r / sizeof r[0]; k++)
        (void)probe_file_read_range(f, i, r[k].off, (size_t)r[k].count, buf);
    /* back to the first tensor and again: the cached open dataset switches */
    if (i > 0 && probe_file_tensor(f, 0)->n > 0)
        (void)probe_file_read_range(f, 0, 0, 1, buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[128];
    if (fuzz_tmpfile(data, size, "input.h5", path, sizeof path) != 0)
        return 0;
    probe_file *f = NULL;
    if (probe_file_open(path, &f) == PROBE_OK) {
        (void)probe_file_manifest(f);
        (void)probe_file_path(f);
        (void)probe_file_ignored_count(f);
        for (size_t i = 0; i < probe_file_skip_count(f); i++)
            (void)probe_file_skip(f, i);
        for (size_t i = 0; i < probe_file_count(f); i++)
            read_tensor(f, i);
        size_t index;
        (void)probe_file_find(f, "/no/such/tensor", &index);
        probe_file_close(f);
    }
    unlink(path);
    return 0;
}
