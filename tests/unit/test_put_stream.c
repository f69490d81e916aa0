/* The streamed put (probe_writer_put_begin / _part / _end / _cancel,
 * include/probe/capture.h): a tensor written in parts reads back with the
 * bytes, hash and attributes probe_writer_put gives the same tensor; bool
 * parts are stored as 0/1; a writer killed after the put recovers it from
 * the journal; bytes past the size, a short put, a second open put, an empty
 * or packed tensor, a taken path and a close with the put still open are
 * clear errors that keep everything else. Expected bytes and hashes are
 * computed here (xxhash itself), not read from the writer. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "probe/capture.h"

#define TMPDIR_PREFIX "probe-put-stream"
#include "tmpdir_fixture.h"

TestSuite(put_stream, .init = setup, .fini = teardown, .timeout = 120);

/* A bfloat16 [3, 1000, 7] tensor: 42000 bytes, element k = 0x3f00 + k % 4099. */
#define N_ELEM (3 * 1000 * 7)
static int64_t shape3[3] = {3, 1000, 7};

static void fill(uint16_t *x)
{
    for (size_t k = 0; k < N_ELEM; k++)
        x[k] = (uint16_t)(0x3f00 + k % 4099);
}

static probe_record rec_at(const char *path)
{
    probe_record r = {.path = path, .component = "dit", .slot = "out", .call = 4, .step = 2,
                      .cfg_branch = 1, .timestep = 750.0, .scope = "dit.block/0003", .device = "cuda:0",
                      .seq = 9, .dtype = PROBE_DTYPE_BFLOAT16, .rank = 3, .shape = shape3,
                      .op = "{\"api\":\"demo\"}", .parent = "/dit.step/0002", .block = 3,
                      .class_name = "demo.Block", .module = "blocks.3"};
    return r;
}

static char *path_in_dir(const char *name)
{
    static char buf[4][600];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 600, "%s/%s", g_dir, name);
    return p;
}

static probe_writer *open_w(const char *file)
{
    probe_writer *w;
    cr_assert_eq(probe_writer_open(file, "{\"format\":\"probe-manifest\"}", &w), PROBE_OK, "%s",
                 probe_last_error());
    return w;
}

/* Put x in parts of the given sizes (summing to its size). */
static void put_parts(probe_writer *w, const probe_record *r, const void *x, size_t nbytes,
                      const size_t *parts, int nparts)
{
    probe_put *p = NULL;
    cr_assert_eq(probe_writer_put_begin(w, r, nbytes, &p), PROBE_OK, "%s", probe_last_error());
    cr_assert_not_null(p);
    size_t at = 0;
    for (int i = 0; i < nparts; i++) {
        cr_assert_eq(probe_writer_put_part(p, (const char *)x + at, parts[i]), PROBE_OK, "%s",
                     probe_last_error());
        at += parts[i];
    }
    cr_assert_eq(at, nbytes);
    cr_assert_eq(probe_writer_put_end(p), PROBE_OK, "%s", probe_last_error());
}

static void expect_attr(probe_file *f, size_t i, const char *name, const char *want)
{
    char *a = NULL;
    cr_assert_eq(probe_file_tensor_attr(f, i, name, &a), PROBE_OK, "%s: %s", name, probe_last_error());
    cr_assert_str_eq(a, want, "%s", name);
    free(a);
}

Test(put_stream, parts_read_back_as_a_put)
{
    static uint16_t x[N_ELEM], got[N_ELEM];
    fill(x);
    const size_t nbytes = sizeof x;
    probe_record r = rec_at("/dit.block/0003/out");
    const char *streamed = path_in_dir("streamed.h5"), *plain = path_in_dir("plain.h5");
    probe_writer *w = open_w(streamed);
    const size_t parts[] = {1, 4095, 0, 20000, nbytes - 24096}; /* odd and empty parts */
    put_parts(w, &r, x, nbytes, parts, 5);
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
    w = open_w(plain);
    cr_assert_eq(probe_writer_put(w, &r, x, nbytes), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK);

    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(x, nbytes, 0));
    for (int k = 0; k < 2; k++) {
        probe_file *f;
        cr_assert_eq(probe_file_open(k ? plain : streamed, &f), PROBE_OK, "%s", probe_last_error());
        cr_assert_eq(probe_file_count(f), 1u);
        const probe_tensor_info *t = probe_file_tensor(f, 0);
        cr_assert_str_eq(t->path, r.path);
        cr_assert_eq(t->dtype, PROBE_DTYPE_BFLOAT16);
        cr_assert_eq(t->rank, 3);
        cr_assert_eq(t->shape[1], 1000);
        cr_assert_eq(t->step, 2);
        cr_assert_eq(t->cfg_branch, 1);
        cr_assert_eq(t->block, 3);
        cr_assert_str_eq(t->hash, hex);
        cr_assert_str_eq(t->module, "blocks.3");
        expect_attr(f, 0, "probe.op", "{\"api\":\"demo\"}");
        expect_attr(f, 0, "probe.device", "cuda:0");
        memset(got, 0, sizeof got);
        cr_assert_eq(probe_file_read_raw(f, 0, got, nbytes), PROBE_OK, "%s", probe_last_error());
        cr_assert_eq(memcmp(got, x, nbytes), 0);
        uint64_t h = 0;
        cr_assert_eq(probe_file_hash(f, 0, &h), PROBE_OK);
        cr_assert_eq(h, XXH64(x, nbytes, 0));
        probe_file_close(f);
    }
}

Test(put_stream, bool_parts_are_stored_as_0_1)
{
    enum { NB = 200000 }; /* above the 64 KiB block the writer normalises in */
    static unsigned char b[NB], want[NB], got[NB];
    for (size_t k = 0; k < NB; k++) {
        b[k] = (unsigned char)(k % 5 == 0 ? 0 : 1 + k % 250);
        want[k] = b[k] != 0;
    }
    int64_t shape[1] = {NB};
    probe_record r = {.path = "/mask", .dtype = PROBE_DTYPE_BOOL, .rank = 1, .shape = shape,
                      .call = -1, .step = -1, .cfg_branch = -1, .timestep = 0.0 / 0.0, .block = -1};
    const char *file = path_in_dir("bool.h5");
    probe_writer *w = open_w(file);
    const size_t parts[] = {70000, 70000, NB - 140000};
    put_parts(w, &r, b, NB, parts, 3);
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    probe_file *f;
    cr_assert_eq(probe_file_open(file, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_read_raw(f, 0, got, NB), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(memcmp(got, want, NB), 0);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(want, NB, 0));
    cr_assert_str_eq(probe_file_tensor(f, 0)->hash, hex);
    probe_file_close(f);
}

Test(put_stream, a_killed_writer_recovers_the_put)
{
    static uint16_t x[N_ELEM], got[N_ELEM];
    fill(x);
    const char *file = path_in_dir("killed.h5");
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        probe_writer *w;
        if (probe_writer_open(file, "{}", &w) != PROBE_OK)
            _exit(3);
        probe_record r = rec_at("/dit.block/0003/out");
        probe_put *p;
        if (probe_writer_put_begin(w, &r, sizeof x, &p) != PROBE_OK ||
            probe_writer_put_part(p, x, 1000) != PROBE_OK ||
            probe_writer_put_part(p, (char *)x + 1000, sizeof x - 1000) != PROBE_OK ||
            probe_writer_put_end(p) != PROBE_OK)
            _exit(4);
        probe_record r2 = rec_at("/dit.block/0004/out");
        if (probe_writer_put_begin(w, &r2, sizeof x, &p) != PROBE_OK ||
            probe_writer_put_part(p, x, 1000) != PROBE_OK)
            _exit(5);
        _exit(0); /* killed in the middle of the second put: no close */
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exit %d", WEXITSTATUS(st));
    probe_file *f;
    cr_assert_eq(probe_file_open(file, &f), PROBE_OK, "%s", probe_last_error());
    const probe_recovery_info *ri = probe_file_recovery(f);
    cr_assert_not_null(ri);
    cr_assert_eq(ri->recovered, 1);
    cr_assert_str_eq(ri->partial, "/dit.block/0004/out");
    cr_assert_eq(probe_file_count(f), 1u);
    cr_assert_str_eq(probe_file_tensor(f, 0)->path, "/dit.block/0003/out");
    cr_assert_eq(probe_file_read_raw(f, 0, got, sizeof got), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(memcmp(got, x, sizeof x), 0);
    probe_file_close(f);
}

Test(put_stream, bad_use_is_a_clear_error_and_keeps_the_rest)
{
    static uint16_t x[N_ELEM], got[N_ELEM];
    fill(x);
    const size_t nbytes = sizeof x;
    const char *file = path_in_dir("bad.h5");
    probe_writer *w = open_w(file);
    probe_record kept = rec_at("/kept");
    cr_assert_eq(probe_writer_put(w, &kept, x, nbytes), PROBE_OK);

    probe_put *p = (probe_put *)&p;
    /* a taken path, the wrong size, an empty tensor, NULL arguments */
    cr_assert_eq(probe_writer_put_begin(w, &kept, nbytes, &p), PROBE_EINVAL);
    cr_assert_null(p);
    cr_assert(strstr(probe_last_error(), "/kept") != NULL, "%s", probe_last_error());
    probe_record r = rec_at("/short");
    cr_assert_eq(probe_writer_put_begin(w, &r, nbytes - 2, &p), PROBE_EINVAL);
    int64_t zero[1] = {0};
    probe_record e = {.path = "/empty", .dtype = PROBE_DTYPE_FLOAT32, .rank = 1, .shape = zero,
                      .call = -1, .step = -1, .cfg_branch = -1, .block = -1};
    cr_assert_eq(probe_writer_put_begin(w, &e, 0, &p), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "probe_writer_put") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_put_begin(NULL, &r, nbytes, &p), PROBE_EINVAL);
    cr_assert_eq(probe_writer_put_begin(w, &r, nbytes, NULL), PROBE_EINVAL);
    cr_assert_eq(probe_writer_put_part(NULL, x, 1), PROBE_EINVAL);
    cr_assert_eq(probe_writer_put_end(NULL), PROBE_EINVAL);
    probe_writer_put_cancel(NULL);

    /* bytes past the size: refused, nothing written, the put goes on */
    cr_assert_eq(probe_writer_put_begin(w, &r, nbytes, &p), PROBE_OK, "%s", probe_last_error());
    probe_put *q = NULL;
    probe_record r2 = rec_at("/second");
    cr_assert_eq(probe_writer_put_begin(w, &r2, nbytes, &q), PROBE_ESTATE);
    cr_assert_null(q);
    cr_assert_eq(probe_writer_put_part(p, x, 40000), PROBE_OK);
    cr_assert_eq(probe_writer_put_part(p, x, nbytes), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "40000 of 42000") != NULL, "%s", probe_last_error());
    /* a short put: refused at the end, its dataset removed */
    cr_assert_eq(probe_writer_put_end(p), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "40000 of 42000 bytes") != NULL, "%s", probe_last_error());
    /* the path is free again: a full put of it */
    const size_t parts[] = {nbytes};
    put_parts(w, &r, x, nbytes, parts, 1);
    /* a cancelled put leaves nothing */
    probe_record c = rec_at("/cancelled");
    cr_assert_eq(probe_writer_put_begin(w, &c, nbytes, &p), PROBE_OK);
    cr_assert_eq(probe_writer_put_part(p, x, 100), PROBE_OK);
    probe_writer_put_cancel(p);
    /* a packed size is refused */
    cr_assert_eq(probe_writer_set_pack(w, 65536), PROBE_OK);
    probe_record pk = rec_at("/packed");
    cr_assert_eq(probe_writer_put_begin(w, &pk, nbytes, &p), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "packed") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_set_pack(w, 0), PROBE_OK);
    /* a put still open at close is not kept; the close succeeds */
    probe_record open_at_close = rec_at("/open/at/close");
    cr_assert_eq(probe_writer_put_begin(w, &open_at_close, nbytes, &p), PROBE_OK);
    cr_assert_eq(probe_writer_put_part(p, x, 5), PROBE_OK);
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());

    probe_file *f;
    cr_assert_eq(probe_file_open(file, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_count(f), 2u);
    const char *want[2] = {"/kept", "/short"};
    for (size_t i = 0; i < 2; i++) {
        cr_assert_str_eq(probe_file_tensor(f, i)->path, want[i]);
        cr_assert_eq(probe_file_read_raw(f, i, got, nbytes), PROBE_OK);
        cr_assert_eq(memcmp(got, x, nbytes), 0, "%s", want[i]);
    }
    probe_file_close(f);
}

/* Parts of 256 KiB and more are hashed on the writer's hashing thread
 * (probe_writer_set_hash_thread): the same bytes and probe.hash as with the
 * thread off, equal to the one-shot XXH64 of the whole tensor, with parts
 * below and above the threshold mixed in one put. And a forked child that
 * goes on with a writer whose thread started in its parent (the thread does
 * not exist in the child) hashes on its own thread and writes the same hash:
 * process A opens the writer and puts tensor 0 (the thread starts), its
 * child B puts tensor 1 with it and closes the file, A leaves with _exit. */
#define BESIDE_NB (3 << 20)
static const size_t beside_parts[] = {1 << 20, 100, (256 << 10) - 1, 256 << 10,
                                      BESIDE_NB - (1 << 20) - 100 - (512 << 10) + 1};

static int put_beside(probe_writer *w, const char *path, const unsigned char *x)
{
    static int64_t shape[1] = {BESIDE_NB / 2};
    probe_record r = {.path = path, .dtype = PROBE_DTYPE_BFLOAT16, .rank = 1, .shape = shape,
                      .call = -1, .step = -1, .cfg_branch = -1, .timestep = 0.0 / 0.0, .block = -1};
    probe_put *p;
    if (probe_writer_put_begin(w, &r, BESIDE_NB, &p) != PROBE_OK)
        return -1;
    size_t at = 0;
    for (int i = 0; i < 5; at += beside_parts[i], i++)
        if (probe_writer_put_part(p, x + at, beside_parts[i]) != PROBE_OK)
            return -1;
    return probe_writer_put_end(p) == PROBE_OK ? 0 : -1;
}

Test(put_stream, parts_hashed_beside_the_write_give_the_same_hash)
{
    unsigned char *x = malloc(BESIDE_NB), *got = malloc(BESIDE_NB);
    cr_assert(x && got);
    for (size_t k = 0; k < BESIDE_NB; k++)
        x[k] = (unsigned char)(k * 2654435761u >> 13);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(x, BESIDE_NB, 0));
    const char *files[2] = {path_in_dir("beside.h5"), path_in_dir("inline.h5")};

    pid_t a = fork();
    cr_assert_neq(a, -1);
    if (a == 0) {
        probe_writer *w;
        if (probe_writer_open(files[0], "{}", &w) != PROBE_OK || put_beside(w, "/t/0000", x) != 0)
            _exit(3);
        pid_t b = fork();
        if (b == 0)
            _exit(put_beside(w, "/t/0001", x) == 0 && probe_writer_close(w) == PROBE_OK ? 0 : 4);
        int st;
        if (b < 0 || waitpid(b, &st, 0) != b)
            _exit(5);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 6);
    }
    int st;
    cr_assert_eq(waitpid(a, &st, 0), a);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer processes exit %d", WEXITSTATUS(st));

    probe_writer *w = open_w(files[1]);
    cr_assert_eq(probe_writer_set_hash_thread(w, 0), PROBE_OK);
    cr_assert_eq(put_beside(w, "/t/0000", x), 0, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());

    for (int k = 0; k < 2; k++) {
        probe_file *f;
        cr_assert_eq(probe_file_open(files[k], &f), PROBE_OK, "%s", probe_last_error());
        cr_assert_eq(probe_file_count(f), k == 0 ? 2u : 1u);
        for (size_t i = 0; i < probe_file_count(f); i++) {
            cr_assert_str_eq(probe_file_tensor(f, i)->hash, hex, "%s tensor %zu", files[k], i);
            memset(got, 0, BESIDE_NB);
            cr_assert_eq(probe_file_read_raw(f, i, got, BESIDE_NB), PROBE_OK, "%s", probe_last_error());
            cr_assert_eq(memcmp(got, x, BESIDE_NB), 0);
        }
        probe_file_close(f);
    }
    cr_assert_eq(probe_writer_set_hash_thread(NULL, 1), PROBE_EINVAL);
    free(x);
    free(got);
}
