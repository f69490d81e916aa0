/* writer_drain.c - how fast probe's capture writer drains device-copy pieces
 * into a file (the streamed put: probe_writer_put_begin/_part/_end, as the
 * preloaded shim's writer thread calls it for a device tensor), against one
 * thread's pwrite(2) of the same bytes into the same directory, measured in
 * the same run.
 *
 * build:  cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -o writer_drain bench/writer_drain.c \
 *           -Lbuild/lib -lprobe -Wl,-rpath,$PWD/build/lib
 * run:    ./writer_drain DIR [GIB] [TENSOR_MIB] [PART_MIB] [RAW_FILES]
 *         (default 2 GiB in bfloat16 tensors of 256 MiB, parts of 64 MiB: the
 *         staging ring's largest piece; RAW_FILES a comma list of raw file
 *         counts, default 2,4,8; 0 for none)
 *
 * The source is a 1 GiB buffer of non-zero bytes (the size of probe's default
 * staging pool, so the bytes come from memory, not from a cache), walked in
 * part order. Four ways, each 5 runs after one untimed run of the baseline,
 * a fresh file each run, removed after it:
 *
 *   pwrite (baseline)    one thread, pwrite(2) of PART_MIB pieces in file order
 *   pwrite + XXH64       the same, each piece then added to an XXH64 (the
 *                        floor of a writer that hashes what it writes)
 *   writer, hash inline  probe_writer_open, a streamed put per tensor, close;
 *                        probe_writer_set_hash_thread(w, 0): each part hashed
 *                        after its write on the calling thread
 *   writer, hash beside  the same with the default: each part hashed on the
 *                        writer's hashing thread while it is written
 *   writer, N raw files  the same with probe_writer_set_raw_files(w, N): the
 *                        bytes go to N files in DIR/...h5.raw/, written at
 *                        once by the writer's threads (one per file)
 *
 * A writer run is timed from probe_writer_open to probe_writer_close
 * returning (HDF5 metadata, journal, flushes included). Prints GB/s (1e9
 * bytes) min/median/max and each median's ratio to the baseline's median, and
 * whether every writer way wrote the same probe.hash for every tensor.
 * fsync is not called: the rate into the page cache (tmpfs: into memory), the
 * rate the writer's drain sees. Exit 0; 1 when the two ways' hashes differ;
 * 2 with one line on a bad argument or an error. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "probe/capture.h"

#define REPEAT 5
#define SRC_BYTES ((size_t)1 << 30)
#define MAX_TENSORS 4096

static unsigned char *src;
static size_t total, tensor_bytes, part_bytes;
static char dir[4000];
static char hashes[3][MAX_TENSORS][17];
static unsigned raw_files; /* the raw files of run_writer's next runs, 0: none */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "writer_drain: %s: %s\n", what, why);
    exit(2);
}

/* The source bytes of file offset off (parts never straddle the buffer's end). */
static const unsigned char *at(size_t off)
{
    return src + off % SRC_BYTES;
}

static double run_pwrite(int hash)
{
    char path[4100];
    snprintf(path, sizeof path, "%s/writer_drain.%d.raw", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        die(path, strerror(errno));
    unlink(path);
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    double t0 = now();
    for (size_t off = 0; off < total; off += part_bytes) {
        for (size_t done = 0; done < part_bytes;) {
            ssize_t k = pwrite(fd, at(off) + done, part_bytes - done, (off_t)(off + done));
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                die("pwrite", strerror(k == 0 ? ENOSPC : errno));
            done += (size_t)k;
        }
        if (hash)
            XXH64_update(h, at(off), part_bytes);
    }
    double dt = now() - t0;
    volatile unsigned long long sink = XXH64_digest(h);
    (void)sink;
    XXH64_freeState(h);
    close(fd);
    return (double)total / dt / 1e9;
}

/* The probe.hash of dataset path in the capture at file, into out[17]. */
static void read_hash(const char *file, const char *path, char *out)
{
    probe_file *f = NULL;
    size_t i;
    if (probe_file_open(file, &f) != PROBE_OK || probe_file_find(f, path, &i) != PROBE_OK)
        die(file, probe_last_error());
    snprintf(out, 17, "%s", probe_file_tensor(f, i)->hash);
    probe_file_close(f);
}

static double run_writer(int beside, int record)
{
    char path[4100];
    snprintf(path, sizeof path, "%s/writer_drain.%d.h5", dir, (int)getpid());
    size_t ntensors = total / tensor_bytes;
    int64_t shape[1] = {(int64_t)(tensor_bytes / 2)};
    static char names[MAX_TENSORS][40];
    double t0 = now();
    probe_writer *w = NULL;
    if (probe_writer_open(path, "{\"bench\":\"writer_drain\"}", &w) != PROBE_OK ||
        probe_writer_set_hash_thread(w, beside) != PROBE_OK ||
        probe_writer_set_raw_files(w, raw_files) != PROBE_OK)
        die(path, probe_last_error());
    for (size_t t = 0; t < ntensors; t++) {
        snprintf(names[t], sizeof names[t], "/dit.block/%04zu/out", t);
        probe_record rec = {.path = names[t], .component = "dit.block", .slot = "out",
                            .call = (int64_t)t, .step = 0, .cfg_branch = 0, .timestep = 0.0,
                            .scope = "", .device = "cuda:0", .seq = t,
                            .dtype = PROBE_DTYPE_BFLOAT16, .rank = 1, .shape = shape};
        probe_put *p = NULL;
        if (probe_writer_put_begin(w, &rec, tensor_bytes, &p) != PROBE_OK)
            die(names[t], probe_last_error());
        for (size_t off = 0; off < tensor_bytes; off += part_bytes)
            if (probe_writer_put_part(p, at(t * tensor_bytes + off), part_bytes) != PROBE_OK)
                die(names[t], probe_last_error());
        if (probe_writer_put_end(p) != PROBE_OK)
            die(names[t], probe_last_error());
    }
    if (probe_writer_close(w) != PROBE_OK)
        die(path, probe_last_error());
    double dt = now() - t0;
    if (record)
        for (size_t t = 0; t < ntensors; t++)
            read_hash(path, names[t], hashes[raw_files ? 2 : beside][t]);
    unlink(path);
    for (unsigned i = 0; i < raw_files; i++) {
        char lane[4200];
        snprintf(lane, sizeof lane, "%s.raw/%02u", path, i);
        unlink(lane);
    }
    if (raw_files) {
        char rd[4200];
        snprintf(rd, sizeof rd, "%s.raw", path);
        rmdir(rd);
    }
    return (double)total / dt / 1e9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* way: 0 pwrite, 1 pwrite + XXH64, 2 writer inline, 3 writer beside */
static double report(const char *name, int way, double base)
{
    double r[REPEAT];
    for (int i = 0; i < REPEAT; i++)
        r[i] = way < 2 ? run_pwrite(way) : run_writer(way == 3, i == 0);
    qsort(r, REPEAT, sizeof r[0], cmp);
    double med = r[REPEAT / 2];
    printf("%-26s %6.2f %6.2f %6.2f GB/s   x%.2f of pwrite\n", name, r[0], med, r[REPEAT - 1],
           base > 0 ? med / base : 1.0);
    return med;
}

static size_t mib_arg(const char *s, const char *what, size_t lo, size_t hi)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s: not in %zu..%zu", s, lo, hi);
        die(what, msg);
    }
    return (size_t)v;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 6) {
        fprintf(stderr, "usage: writer_drain DIR [GIB] [TENSOR_MIB] [PART_MIB] [RAW_FILES]\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    size_t gib = argc > 2 ? mib_arg(argv[2], "GIB", 1, 64) : 2;
    tensor_bytes = (argc > 3 ? mib_arg(argv[3], "TENSOR_MIB", 1, 16384) : 256) << 20;
    part_bytes = (argc > 4 ? mib_arg(argv[4], "PART_MIB", 1, 1024) : 64) << 20;
    if (tensor_bytes % part_bytes || SRC_BYTES % part_bytes)
        die("PART_MIB", "must divide TENSOR_MIB and 1024");
    total = (gib << 30) / tensor_bytes * tensor_bytes;
    if (total == 0 || total / tensor_bytes > MAX_TENSORS)
        die("GIB", "holds no tensor, or more than 4096");
    setvbuf(stdout, NULL, _IOLBF, 0);
    if ((src = malloc(SRC_BYTES)) == NULL)
        die("malloc", strerror(ENOMEM));
    for (size_t i = 0; i < SRC_BYTES; i++)
        src[i] = (unsigned char)(i * 2654435761u >> 24) | 1;
    printf("writer_drain: %.2f GB into %s: %zu bfloat16 tensors of %zu MiB, parts of %zu MiB, "
           "%d runs each (min median max)\n",
           (double)total / 1e9, dir, total / tensor_bytes, tensor_bytes >> 20, part_bytes >> 20,
           REPEAT);
    run_pwrite(0);
    double base = report("pwrite (baseline)", 0, 0);
    report("pwrite + XXH64", 1, base);
    double inl = report("writer, hash inline", 2, base);
    double bes = report("writer, hash beside", 3, base);
    size_t ntensors = total / tensor_bytes;
    const char *list = argc > 5 ? argv[5] : "2,4,8";
    for (const char *c = list; *c;) {
        char *end;
        unsigned long k = strtoul(c, &end, 10);
        if (end == c || k > PROBE_RAW_FILES_MAX || (*end && *end != ','))
            die("RAW_FILES", "not a comma list of counts 0..16");
        c = *end ? end + 1 : end;
        if (k == 0)
            continue;
        raw_files = (unsigned)k;
        char name[40];
        snprintf(name, sizeof name, "writer, %lu raw files", k);
        report(name, 3, base);
        for (size_t t = 0; t < ntensors; t++)
            if (strcmp(hashes[2][t], hashes[1][t]) != 0) {
                printf("probe.hash DIFFERS at tensor %zu: %lu raw files %s, in the file %s\n", t, k,
                       hashes[2][t], hashes[1][t]);
                return 1;
            }
        raw_files = 0;
    }
    report("pwrite (baseline again)", 0, base);
    printf("writer: hash beside / hash inline x%.2f\n", bes / inl);
    for (size_t t = 0; t < ntensors; t++)
        if (strcmp(hashes[0][t], hashes[1][t]) != 0) {
            printf("probe.hash DIFFERS at tensor %zu: inline %s, beside %s\n", t, hashes[0][t],
                   hashes[1][t]);
            return 1;
        }
    printf("probe.hash of all %zu tensors the same every way (tensor 0: %s)\n", ntensors, hashes[0][0]);
    free(src);
    return 0;
}
