/* The raw files layout (probe_writer_set_raw_files, include/probe/capture.h;
 * docs/file-format.md "Raw files"): a streamed tensor of 1 MiB or more keeps
 * its bytes in <capture>.raw/NN, striped over the files in 4 MiB pieces from
 * the lane after the last tensor's last piece, and so does a tensor of 1 MiB
 * or more that probe_writer_put writes; smaller and bool tensors stay in the
 * file. Checked here: the bytes of each raw file at the offsets the
 * striping rule gives (computed in this file), whole and range reads across
 * piece ends, probe.hash against xxhash itself, a killed writer's raw
 * tensors recovered from the journal, appending with raw files, and the
 * refusals (too many files, set twice, a folder that is a symbolic link, a
 * raw file missing, short, a FIFO or a symbolic link). */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "probe/capture.h"

#define TMPDIR_PREFIX "probe-raw-files"
#include "tmpdir_fixture.h"

TestSuite(raw_files, .init = setup, .fini = teardown, .timeout = 120);

#define MiB ((size_t)1 << 20)

static char *path_in_dir(const char *name)
{
    static char buf[8][600];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 600, "%s/%s", g_dir, name);
    return p;
}

/* bytes with no period near a piece size: byte k of tensor `salt` */
static unsigned char *make(size_t n, unsigned salt)
{
    unsigned char *x = malloc(n);
    cr_assert_not_null(x);
    uint32_t v = 2463534242u ^ salt;
    for (size_t k = 0; k < n; k++) {
        v ^= v << 13;
        v ^= v >> 17;
        v ^= v << 5;
        x[k] = (unsigned char)v;
    }
    return x;
}

static probe_record rec_of(const char *path, probe_dtype dt, int64_t *shape, size_t nbytes)
{
    shape[0] = (int64_t)(nbytes / probe_dtype_size(dt));
    probe_record r = {.path = path, .component = "dit", .slot = "out", .call = -1, .step = -1,
                      .cfg_branch = -1, .timestep = 0.0 / 0.0, .block = -1, .dtype = dt,
                      .rank = 1, .shape = shape};
    return r;
}

/* Put x in parts of `part` bytes (the last shorter). */
static void put_streamed(probe_writer *w, const probe_record *r, const void *x, size_t n, size_t part)
{
    probe_put *p = NULL;
    cr_assert_eq(probe_writer_put_begin(w, r, n, &p), PROBE_OK, "%s", probe_last_error());
    for (size_t at = 0; at < n; at += part) {
        size_t k = n - at < part ? n - at : part;
        cr_assert_eq(probe_writer_put_part(p, (const char *)x + at, k), PROBE_OK, "%s",
                     probe_last_error());
    }
    cr_assert_eq(probe_writer_put_end(p), PROBE_OK, "%s", probe_last_error());
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "%s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    cr_assert_eq(fread(b, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return b;
}

static void expect_tensor(probe_file *f, const char *path, const unsigned char *x, size_t n)
{
    size_t i = 0;
    cr_assert_eq(probe_file_find(f, path, &i), PROBE_OK, "%s", probe_last_error());
    unsigned char *got = malloc(n);
    cr_assert_eq(probe_file_read_raw(f, i, got, n), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(memcmp(got, x, n), 0, "%s: bytes", path);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(x, n, 0));
    cr_assert_str_eq(probe_file_tensor(f, i)->hash, hex, "%s", path);
    uint64_t h = 0;
    cr_assert_eq(probe_file_hash(f, i, &h), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(h, XXH64(x, n, 0));
    free(got);
}

/* The capture of raw_layout: a (9 MiB bf16), b (1.5 MiB f32), c (64 KiB,
 * in the file), m (2 MiB bool, in the file), d (5 MiB u8) streamed, then h
 * (3 MiB u8) with probe_writer_put, on 4 raw files. */
static unsigned char *A, *B, *C, *M, *D, *H;
#define NH (3 * MiB)
#define NA (9 * MiB)
#define NB (3 * MiB / 2)
#define NC ((size_t)64 << 10)
#define NM (2 * MiB)
#define ND (5 * MiB)

static void write_layout(const char *file, int raw)
{
    A = make(NA, 1), B = make(NB, 2), C = make(NC, 3), M = make(NM, 4), D = make(ND, 5);
    H = make(NH, 6);
    for (size_t k = 0; k < NM; k++)
        M[k] &= 1;
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{}", &w), PROBE_OK, "%s", probe_last_error());
    if (raw)
        cr_assert_eq(probe_writer_set_raw_files(w, 4), PROBE_OK, "%s", probe_last_error());
    int64_t sa[1], sb[1], sc[1], sm[1], sd[1];
    probe_record ra = rec_of("/a", PROBE_DTYPE_BFLOAT16, sa, NA);
    probe_record rb = rec_of("/b", PROBE_DTYPE_FLOAT32, sb, NB);
    probe_record rc = rec_of("/c", PROBE_DTYPE_UINT8, sc, NC);
    probe_record rm = rec_of("/m", PROBE_DTYPE_BOOL, sm, NM);
    probe_record rd = rec_of("/d", PROBE_DTYPE_UINT8, sd, ND);
    put_streamed(w, &ra, A, NA, 3 * MiB + 7);   /* parts that cross piece ends */
    put_streamed(w, &rb, B, NB, 100000);
    put_streamed(w, &rc, C, NC, NC);
    put_streamed(w, &rm, M, NM, MiB);
    put_streamed(w, &rd, D, ND, ND);
    int64_t sh[1];
    probe_record rh = rec_of("/h", PROBE_DTYPE_UINT8, sh, NH);
    cr_assert_eq(probe_writer_put(w, &rh, H, NH), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
}

Test(raw_files, raw_layout_bytes_are_where_the_striping_puts_them)
{
    const char *file = path_in_dir("cap.h5");
    write_layout(file, 1);
    /* a: pieces [0,4) [4,8) [8,9) MiB on lanes 0 1 2; b: lane 3; d: pieces
     * [0,4) on lane 0 (after a's), [4,5) on lane 1 (after a's); h: lane 2
     * (after a's) */
    size_t len[4];
    unsigned char *lane[4];
    for (int i = 0; i < 4; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s.raw/%02d", file, i);
        lane[i] = slurp(p, &len[i]);
    }
    cr_assert_eq(len[0], 8 * MiB);
    cr_assert_eq(len[1], 5 * MiB);
    cr_assert_eq(len[2], 1 * MiB + NH);
    cr_assert_eq(len[3], NB);
    cr_assert_eq(memcmp(lane[0], A, 4 * MiB), 0);
    cr_assert_eq(memcmp(lane[1], A + 4 * MiB, 4 * MiB), 0);
    cr_assert_eq(memcmp(lane[2], A + 8 * MiB, MiB), 0);
    cr_assert_eq(memcmp(lane[3], B, NB), 0);
    cr_assert_eq(memcmp(lane[0] + 4 * MiB, D, 4 * MiB), 0);
    cr_assert_eq(memcmp(lane[1] + 4 * MiB, D + 4 * MiB, MiB), 0);
    cr_assert_eq(memcmp(lane[2] + MiB, H, NH), 0);
    for (int i = 0; i < 4; i++)
        free(lane[i]);
    char p[700];
    snprintf(p, sizeof p, "%s.raw/04", file);
    cr_assert_neq(access(p, F_OK), 0, "only 4 raw files");

    probe_file *f;
    cr_assert_eq(probe_file_open(file, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_count(f), 6u);
    expect_tensor(f, "/a", A, NA);
    expect_tensor(f, "/b", B, NB);
    expect_tensor(f, "/c", C, NC);
    expect_tensor(f, "/m", M, NM);
    expect_tensor(f, "/d", D, ND);
    expect_tensor(f, "/h", H, NH);
    /* element ranges across piece ends: a's elements are 2 bytes */
    size_t ia = 0;
    cr_assert_eq(probe_file_find(f, "/a", &ia), PROBE_OK);
    uint16_t got[5000];
    uint64_t first = (4 * MiB) / 2 - 1234;
    cr_assert_eq(probe_file_read_range(f, ia, first, 5000, got), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(memcmp(got, A + first * 2, sizeof got), 0);
    first = NA / 2 - 5000;
    cr_assert_eq(probe_file_read_range(f, ia, first, 5000, got), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(memcmp(got, A + first * 2, sizeof got), 0);
    probe_file_close(f);

    /* the same tensors without raw files: the same hashes, nothing outside */
    const char *plain = path_in_dir("plain.h5");
    free(A), free(B), free(C), free(M), free(D), free(H);
    write_layout(plain, 0);
    snprintf(p, sizeof p, "%s.raw", plain);
    cr_assert_neq(access(p, F_OK), 0, "no raw folder without raw files");
    cr_assert_eq(probe_file_open(plain, &f), PROBE_OK, "%s", probe_last_error());
    expect_tensor(f, "/a", A, NA);
    expect_tensor(f, "/d", D, ND);
    probe_file_close(f);
    free(A), free(B), free(C), free(M), free(D), free(H);
}

Test(raw_files, a_killed_writer_recovers_its_raw_tensors)
{
    const char *file = path_in_dir("killed.h5");
    unsigned char *x = make(6 * MiB, 7), *y = make(2 * MiB, 8);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        probe_writer *w;
        int64_t s1[1], s2[1];
        probe_record r1 = rec_of("/x", PROBE_DTYPE_FLOAT16, s1, 6 * MiB);
        probe_record r2 = rec_of("/y", PROBE_DTYPE_FLOAT16, s2, 2 * MiB);
        probe_put *p;
        if (probe_writer_open(file, "{}", &w) != PROBE_OK || probe_writer_set_raw_files(w, 3) != PROBE_OK ||
            probe_writer_put_begin(w, &r1, 6 * MiB, &p) != PROBE_OK ||
            probe_writer_put_part(p, x, 6 * MiB) != PROBE_OK || probe_writer_put_end(p) != PROBE_OK ||
            probe_writer_put_begin(w, &r2, 2 * MiB, &p) != PROBE_OK ||
            probe_writer_put_part(p, y, MiB) != PROBE_OK)
            _exit(3);
        _exit(0); /* killed during the second put */
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exit %d", WEXITSTATUS(st));
    probe_file *f;
    cr_assert_eq(probe_file_open(file, &f), PROBE_OK, "%s", probe_last_error());
    const probe_recovery_info *ri = probe_file_recovery(f);
    cr_assert(ri != NULL && ri->recovered);
    cr_assert_str_eq(ri->partial, "/y");
    cr_assert_eq(probe_file_count(f), 1u);
    expect_tensor(f, "/x", x, 6 * MiB);
    uint16_t got[100];
    cr_assert_eq(probe_file_read_range(f, 0, (4 * MiB) / 2 - 50, 100, got), PROBE_OK, "%s",
                 probe_last_error());
    cr_assert_eq(memcmp(got, x + 4 * MiB - 100, sizeof got), 0);
    probe_file_close(f);

    /* a raw file cut short: the recovery does not take the tensor */
    char p[700];
    snprintf(p, sizeof p, "%s.raw/01", file);
    cr_assert_eq(truncate(p, 1000), 0);
    probe_status s = probe_file_open(file, &f);
    cr_assert_eq(s, PROBE_OK, "a last record whose bytes are missing is a torn tail: %s",
                 probe_last_error());
    cr_assert_eq(probe_file_count(f), 0u);
    probe_file_close(f);
    free(x);
    free(y);
}

Test(raw_files, append_keeps_and_adds_raw_tensors)
{
    const char *file = path_in_dir("app.h5");
    unsigned char *x = make(5 * MiB, 9), *y = make(3 * MiB, 10);
    int64_t s1[1], s2[1];
    probe_record r1 = rec_of("/x", PROBE_DTYPE_UINT8, s1, 5 * MiB);
    probe_record r2 = rec_of("/y", PROBE_DTYPE_UINT8, s2, 3 * MiB);
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{}", &w), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_set_raw_files(w, 2), PROBE_OK, "%s", probe_last_error());
    put_streamed(w, &r1, x, 5 * MiB, MiB);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    cr_assert_eq(probe_writer_open_ex(file, "{}", PROBE_WRITER_APPEND, &w), PROBE_OK, "%s",
                 probe_last_error());
    cr_assert_eq(probe_writer_set_raw_files(w, 2), PROBE_OK, "%s", probe_last_error());
    put_streamed(w, &r2, y, 3 * MiB, MiB);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    size_t len;
    char p[700];
    snprintf(p, sizeof p, "%s.raw/00", file);
    free(slurp(p, &len));
    cr_assert_eq(len, 4 * MiB + 3 * MiB, "x's first piece, then y (a reopened writer starts on lane 0)");
    probe_file *f;
    cr_assert_eq(probe_file_open(file, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_count(f), 2u);
    expect_tensor(f, "/x", x, 5 * MiB);
    expect_tensor(f, "/y", y, 3 * MiB);
    probe_file_close(f);
    free(x);
    free(y);
}

Test(raw_files, bad_settings_are_clear_errors)
{
    const char *file = path_in_dir("bad.h5");
    probe_writer *w;
    cr_assert_eq(probe_writer_set_raw_files(NULL, 2), PROBE_EINVAL);
    cr_assert_eq(probe_writer_open(file, "{}", &w), PROBE_OK);
    cr_assert_eq(probe_writer_set_raw_files(w, PROBE_RAW_FILES_MAX + 1), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "at most 16") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_set_raw_files(w, 2), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_set_raw_files(w, 3), PROBE_ESTATE);
    cr_assert(strstr(probe_last_error(), "set already") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK);

    /* the folder a symbolic link: refused, nothing written through it */
    const char *linked = path_in_dir("linked.h5"), *elsewhere = path_in_dir("elsewhere");
    char rawdir[700];
    snprintf(rawdir, sizeof rawdir, "%s.raw", linked);
    cr_assert_eq(mkdir(elsewhere, 0700), 0);
    cr_assert_eq(symlink(elsewhere, rawdir), 0);
    cr_assert_eq(probe_writer_open(linked, "{}", &w), PROBE_OK);
    cr_assert_eq(probe_writer_set_raw_files(w, 2), PROBE_EIO);
    cr_assert(strstr(probe_last_error(), "symbolic link") != NULL, "%s", probe_last_error());
    char inside[700];
    snprintf(inside, sizeof inside, "%s/00", elsewhere);
    cr_assert_neq(access(inside, F_OK), 0);
    /* the writer goes on without raw files */
    unsigned char *x = make(2 * MiB, 11);
    int64_t s1[1];
    probe_record r = rec_of("/x", PROBE_DTYPE_UINT8, s1, 2 * MiB);
    put_streamed(w, &r, x, 2 * MiB, MiB);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    probe_file *f;
    cr_assert_eq(probe_file_open(linked, &f), PROBE_OK, "%s", probe_last_error());
    expect_tensor(f, "/x", x, 2 * MiB);
    probe_file_close(f);
    free(x);
}

/* A capture with raw tensor /x (2 MiB, lane 0 and 1 of 2) to damage. */
static const char *raw_capture(const char *name, unsigned char **x)
{
    const char *file = path_in_dir(name);
    *x = make(6 * MiB, 12);
    int64_t s1[1];
    probe_record r = rec_of("/x", PROBE_DTYPE_UINT8, s1, 6 * MiB);
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{}", &w), PROBE_OK);
    cr_assert_eq(probe_writer_set_raw_files(w, 2), PROBE_OK, "%s", probe_last_error());
    put_streamed(w, &r, *x, 6 * MiB, 6 * MiB);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    return file;
}

static void expect_read_error(const char *file, probe_status want, const char *text)
{
    probe_file *f;
    cr_assert_eq(probe_file_open(file, &f), PROBE_OK, "%s", probe_last_error());
    unsigned char *got = malloc(6 * MiB);
    cr_assert_eq(probe_file_read_raw(f, 0, got, 6 * MiB), want, "%s", probe_last_error());
    cr_assert(strstr(probe_last_error(), text) != NULL, "wanted '%s' in: %s", text, probe_last_error());
    uint16_t r[4];
    cr_assert_eq(probe_file_read_range(f, 0, 0, 4, r), want);
    free(got);
    probe_file_close(f);
}

Test(raw_files, damaged_raw_files_are_clear_errors)
{
    unsigned char *x;
    char p[700], q[700];
    const char *short_ = raw_capture("short.h5", &x);
    free(x);
    snprintf(p, sizeof p, "%s.raw/01", short_);
    cr_assert_eq(truncate(p, MiB), 0);
    expect_read_error(short_, PROBE_EFORMAT, "truncated");

    const char *gone = raw_capture("gone.h5", &x);
    free(x);
    snprintf(p, sizeof p, "%s.raw/00", gone);
    cr_assert_eq(unlink(p), 0);
    expect_read_error(gone, PROBE_EIO, "raw file gone.h5.raw/00");

    const char *fifo = raw_capture("fifo.h5", &x);
    free(x);
    snprintf(p, sizeof p, "%s.raw/00", fifo);
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(mkfifo(p, 0600), 0);
    expect_read_error(fifo, PROBE_EFORMAT, "not a regular file"); /* and did not block */

    const char *linked = raw_capture("linked2.h5", &x);
    free(x);
    snprintf(p, sizeof p, "%s.raw/00", linked);
    snprintf(q, sizeof q, "%s.raw/01", linked);
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(symlink(q, p), 0);
    expect_read_error(linked, PROBE_EIO, "symbolic link");

    const char *nodir = raw_capture("nodir.h5", &x);
    free(x);
    snprintf(p, sizeof p, "%s.raw", nodir);
    snprintf(q, sizeof q, "%s.moved", nodir);
    cr_assert_eq(rename(p, q), 0);
    expect_read_error(nodir, PROBE_EIO, "raw files folder nodir.h5.raw");
}
