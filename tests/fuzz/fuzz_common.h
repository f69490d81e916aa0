/* tests/fuzz/fuzz_common.h - shared by the libFuzzer harnesses and the seed
 * writer: an input as a file path (a scratch file on tmpfs), and the fixed reference capture
 * that fuzz_compare compares mutated candidates against. */
#ifndef PROBE_FUZZ_COMMON_H
#define PROBE_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "probe/capture.h"

/* Write `size` bytes to a file of this process's scratch folder (in
 * $PROBE_FUZZ_TMPDIR, else on tmpfs, /dev/shm, when there is one) and put its
 * path in path; the caller unlinks
 * it. A real file and not a memfd: HDF5 1.10 resolves the real path of the
 * file it opens, which fails for /proc/self/fd/N of a memfd (and probe's
 * writer checks the free space of the file system). The folder is removed at
 * exit. Returns 0 or -1. */
static char fuzz_dir[64];

/* At exit: the scratch folder and what is left in it (libFuzzer's fork mode
 * starts a process per job; a crashing one leaves its folder behind). */
static void fuzz_dir_remove(void)
{
    static const char *const names[] = {"input.h5", "candidate.h5", "calibration.json",
                                        "reference.h5"};
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir, names[i]);
        unlink(p);
    }
    rmdir(fuzz_dir);
}

static inline int fuzz_tmpfile(const uint8_t *data, size_t size, const char *name, char *path,
                               size_t cap)
{
    char *dir = fuzz_dir;
    if (dir[0] == '\0') {
        const char *base = getenv("PROBE_FUZZ_TMPDIR"); /* scripts/fuzz: one per run */
        if (base == NULL || base[0] == '\0')
            base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof fuzz_dir, "%s/probe-fuzz-XXXXXX", base);
        if (mkdtemp(dir) == NULL) {
            dir[0] = '\0';
            return -1;
        }
        atexit(fuzz_dir_remove);
    }
    snprintf(path, cap, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t k = write(fd, data + done, size - done);
        if (k <= 0)
            break;
        done += (size_t)k;
    }
    close(fd);
    return done == size ? 0 : -1;
}

/* The reference of fuzz_compare (and, with variant > 0, the candidates of its
 * seed corpus): a few small tensors of different element types, ranks and
 * layouts under probe's own path scheme, written by probe's writer.
 * variant 0: reference; 1: every float scaled by 1.01; 2: a NaN and an Inf
 * in the candidate; 3: one tensor missing and one reshaped; 4: the reference
 * in the packed layout (every tensor in /probe.pack); 5: the reference with
 * in.hidden_states as a stats-only record. */
static inline probe_status fuzz_write_capture(const char *path, int variant)
{
    probe_writer *w = NULL;
    probe_status s = probe_writer_open(path, "{\"label\": \"fuzz\", \"argv\": [\"fuzz\"]}", &w);
    if (s != PROBE_OK)
        return s;
    if (variant == 4 && (s = probe_writer_set_pack(w, 4096)) != PROBE_OK) {
        (void)probe_writer_close(w);
        return s;
    }
    float lat[1 * 4 * 2 * 3 * 3];
    for (size_t i = 0; i < sizeof lat / sizeof lat[0]; i++)
        lat[i] = (float)((int)(i * 37 % 23) - 11) / 7.0f * (variant == 1 ? 1.01f : 1.0f);
    if (variant == 2) {
        lat[5] = 0.0f / 0.0f;
        lat[7] = 1.0f / 0.0f;
    }
    double emb[2 * 3 * 8];
    for (size_t i = 0; i < sizeof emb / sizeof emb[0]; i++)
        emb[i] = (double)i / 10.0 - 2.0 + (variant == 1 ? 1e-3 : 0.0);
    uint16_t bf[16];
    for (size_t i = 0; i < 16; i++)
        bf[i] = (uint16_t)(0x3f80 + i * 3 + (variant == 1 ? 1 : 0));
    int32_t ints[7] = {-3, -2, -1, 0, 1, 2, variant == 1 ? 4 : 3};
    uint8_t fp8[12];
    for (size_t i = 0; i < 12; i++)
        fp8[i] = (uint8_t)(i * 21 + (variant == 1 ? 1 : 0));
    const float scalar = variant == 1 ? 500.5f : 500.0f;

    const int64_t lat_shape[5] = {1, 4, 2, 3, 3}, emb_shape[3] = {2, 3, 8},
                  emb_shape3[3] = {3, 2, 8}, bf_shape[2] = {4, 4}, int_shape[1] = {7},
                  fp8_shape[2] = {3, 4}, empty_shape[2] = {0, 5};
    struct {
        const char *path, *component, *slot;
        probe_dtype t;
        int rank;
        const int64_t *shape;
        const void *data;
        size_t nbytes;
    } put[] = {
        {"/text_encoder/0000/out", "text_encoder", "out", PROBE_DTYPE_FLOAT64, 3,
         variant == 3 ? emb_shape3 : emb_shape, emb, sizeof emb},
        {"/dit.step/0000/in.hidden_states", "dit.step", "in.hidden_states", PROBE_DTYPE_FLOAT32, 5,
         lat_shape, lat, sizeof lat},
        {"/dit.step/0000/in.timestep", "dit.step", "in.timestep", PROBE_DTYPE_FLOAT32, 0, NULL,
         &scalar, sizeof scalar},
        {"/dit.step/0000/out", "dit.step", "out", PROBE_DTYPE_BFLOAT16, 2, bf_shape, bf, sizeof bf},
        {"/scheduler.step/0000/out.prev_sample", "scheduler.step", "out.prev_sample",
         PROBE_DTYPE_INT32, 1, int_shape, ints, sizeof ints},
        {"/vae.decode/0000/out", "vae.decode", "out", PROBE_DTYPE_FLOAT8_E4M3FN, 2, fp8_shape, fp8,
         sizeof fp8},
        {"/vae.decode/0000/in.empty", "vae.decode", "in.empty", PROBE_DTYPE_FLOAT16, 2, empty_shape,
         NULL, 0},
    };
    for (size_t i = 0; s == PROBE_OK && i < sizeof put / sizeof put[0]; i++) {
        if (variant == 3 && i == 4)
            continue;
        probe_record r = {.path = put[i].path, .component = put[i].component, .slot = put[i].slot,
                          .call = 0, .step = 0, .cfg_branch = -1, .timestep = 999.0,
                          .scope = "pipe/denoise", .device = "cpu", .seq = i, .dtype = put[i].t,
                          .rank = put[i].rank, .shape = put[i].shape};
        if (variant == 5 && i == 1) {
            probe_summary sum;
            s = probe_summary_compute(put[i].t, put[i].data, put[i].nbytes / sizeof(float), &sum);
            if (s == PROBE_OK)
                s = probe_writer_put_summary(w, &r, &sum,
                                             probe_capture_hash(put[i].data, put[i].nbytes));
            continue;
        }
        s = probe_writer_put(w, &r, put[i].data, put[i].nbytes);
    }
    if (s == PROBE_OK) {
        probe_record r = {.path = "/dit.step/0001/out", .component = "dit.step", .slot = "out",
                          .call = 1, .step = 1, .cfg_branch = -1, .timestep = 900.0,
                          .scope = "", .device = "cuda:0", .seq = 99,
                          .dtype = PROBE_DTYPE_FLOAT32, .rank = 0, .shape = NULL};
        s = probe_writer_skip(w, &r, "stream capturing a CUDA graph");
    }
    probe_status c = probe_writer_close(w);
    return s != PROBE_OK ? s : c;
}

#endif
