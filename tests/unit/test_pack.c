/* The packed layout (probe_writer_set_pack; docs/file-format.md "Packed
 * small tensors"): packed tensors read back bit-exact with their dtype,
 * shape and attributes; a packed and an unpacked file of the same tensors
 * compare identically; a writer killed before its close leaves packed
 * tensors that the journal recovers (also through probe-recover); bad pack
 * sizes, reserved and duplicate paths, and a corrupt index are clear errors.
 * Expected values are computed here (the element values from their index,
 * hashes with xxhash itself), not read from the writer. */
#include <criterion/criterion.h>

#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "probe/capture.h"
#include "probe/compare.h"

#define TMPDIR_PREFIX "probe-pack"
#include "tmpdir_fixture.h"

TestSuite(pack, .init = setup, .fini = teardown, .timeout = 120);

/* --- the tensors: a pure function of their index --- */

#define NT 400   /* enough 1 KiB tensors to fill several chunks (64 KiB, 128 KiB, ...) */
#define PACK 2048

typedef struct {
    char path[64];
    probe_dtype dtype;
    int rank;
    int64_t shape[3];
    size_t nbytes;
    unsigned char bytes[4096];
} tensor;

/* Tensor i: mostly 256 float32 (1 KiB); every 7th a bfloat16 [2, 3], every
 * 11th a bool [5] (stored as 0/1), every 13th an int64 scalar, every 17th a
 * float32 [0, 4] (no bytes), every 19th float32 [3, 300] (3600 bytes: above
 * PACK, a dataset of its own). */
static void make(int i, tensor *t, int perturb)
{
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "/tiny/%04d/%s", i / 2, i % 2 ? "out" : "in.x");
    if (i % 19 == 0 && i > 0) {
        t->dtype = PROBE_DTYPE_FLOAT32, t->rank = 2, t->shape[0] = 3, t->shape[1] = 300;
    } else if (i % 17 == 0 && i > 0) {
        t->dtype = PROBE_DTYPE_FLOAT32, t->rank = 2, t->shape[0] = 0, t->shape[1] = 4;
    } else if (i % 13 == 0 && i > 0) {
        t->dtype = PROBE_DTYPE_INT64, t->rank = 0;
    } else if (i % 11 == 0 && i > 0) {
        t->dtype = PROBE_DTYPE_BOOL, t->rank = 1, t->shape[0] = 5;
    } else if (i % 7 == 0 && i > 0) {
        t->dtype = PROBE_DTYPE_BFLOAT16, t->rank = 2, t->shape[0] = 2, t->shape[1] = 3;
    } else {
        t->dtype = PROBE_DTYPE_FLOAT32, t->rank = 1, t->shape[0] = 256;
    }
    size_t n = 1;
    for (int k = 0; k < t->rank; k++)
        n *= (size_t)t->shape[k];
    t->nbytes = n * probe_dtype_size(t->dtype);
    for (size_t k = 0; k < n; k++) {
        if (t->dtype == PROBE_DTYPE_FLOAT32) {
            float v = (float)(i * 1000 + (int)k) * 0.25f + (perturb ? 1e-3f * (float)(k % 3) : 0.0f);
            memcpy(t->bytes + 4 * k, &v, 4);
        } else if (t->dtype == PROBE_DTYPE_BFLOAT16) {
            uint16_t v = (uint16_t)(0x3f80 + i + (int)k);
            memcpy(t->bytes + 2 * k, &v, 2);
        } else if (t->dtype == PROBE_DTYPE_BOOL) {
            t->bytes[k] = (unsigned char)((i + k) % 3 == 0 ? 0 : 7); /* nonzero: true */
        } else {
            int64_t v = -(int64_t)i * 12345;
            memcpy(t->bytes, &v, 8);
        }
    }
}

/* The bytes the file stores for t (bool as 0/1). */
static void stored(const tensor *t, unsigned char *out)
{
    memcpy(out, t->bytes, t->nbytes);
    if (t->dtype == PROBE_DTYPE_BOOL)
        for (size_t k = 0; k < t->nbytes; k++)
            out[k] = out[k] != 0;
}

static probe_record record(int i, const tensor *t, char *op, char *parent, char *module)
{
    snprintf(op, 64, "{\"api\":\"demo\",\"i\":%d}", i);
    snprintf(parent, 64, "/dit.step/%04d", i / 40);
    snprintf(module, 64, "transformer.blocks.%d", i % 5);
    probe_record r = {.path = t->path, .component = "tiny", .slot = i % 2 ? "out" : "in.x",
                      .call = i / 2, .step = i / 40, .cfg_branch = i % 2, .timestep = 999.0 - i,
                      .scope = i % 3 ? "range/a" : "", .device = "cpu", .seq = (uint64_t)i,
                      .dtype = t->dtype, .rank = t->rank, .shape = t->shape,
                      .op = i % 4 == 0 ? op : NULL, .parent = i % 5 == 0 ? parent : NULL,
                      .block = i % 5 == 0 ? i % 3 : -1,
                      .class_name = i % 6 == 0 ? "demo.Tiny" : NULL,
                      .module = i % 6 == 0 ? module : NULL};
    return r;
}

/* Write tensors [0, n) to path, packing those of at most pack bytes (0: none). */
static void write_file(const char *path, size_t pack, int n, int perturb)
{
    probe_writer *w;
    cr_assert_eq(probe_writer_open(path, "{\"format\":\"probe-manifest\"}", &w), PROBE_OK, "%s",
                 probe_last_error());
    if (pack > 0)
        cr_assert_eq(probe_writer_set_pack(w, pack), PROBE_OK, "%s", probe_last_error());
    static tensor t;
    char op[64], parent[64], module[64];
    for (int i = 0; i < n; i++) {
        make(i, &t, perturb);
        probe_record r = record(i, &t, op, parent, module);
        cr_assert_eq(probe_writer_put(w, &r, t.bytes, t.nbytes), PROBE_OK, "%s", probe_last_error());
    }
    probe_record sk = {.path = "/tiny/skipped/out"};
    cr_assert_eq(probe_writer_skip(w, &sk, "demo"), PROBE_OK);
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
}

/* In a forked child: open path packed (PACK) and put tensors [0, n), flushing
 * after tensor flush_at (-1: never); _exit(3) when the open fails, 4 a put,
 * 8 the flush. Returns the open writer. */
static probe_writer *child_put_packed(const char *path, int n, int flush_at)
{
    probe_writer *w;
    if (probe_writer_open(path, "{}", &w) != PROBE_OK || probe_writer_set_pack(w, PACK) != PROBE_OK)
        _exit(3);
    static tensor t;
    char op[64], parent[64], module[64];
    for (int i = 0; i < n; i++) {
        make(i, &t, 0);
        probe_record r = record(i, &t, op, parent, module);
        if (probe_writer_put(w, &r, t.bytes, t.nbytes) != PROBE_OK)
            _exit(4);
        if (i == flush_at && probe_writer_flush(w) != PROBE_OK)
            _exit(8);
    }
    return w;
}

/* Every tensor of [0, n) is in f, in seq order, bit-exact, with its attributes;
 * with_attrs 0: a recovered file (the journal keeps probe.op of the string
 * attributes). */
static void check_file(probe_file *f, int n, int with_attrs)
{
    cr_assert_eq(probe_file_count(f), (size_t)n);
    static tensor t;
    static unsigned char want[4096], got[4096];
    char op[64], parent[64], module[64];
    for (int i = 0; i < n; i++) {
        make(i, &t, 0);
        probe_record r = record(i, &t, op, parent, module);
        const probe_tensor_info *x = probe_file_tensor(f, (size_t)i);
        cr_assert_str_eq(x->path, t.path);
        cr_assert_eq(x->dtype, t.dtype, "%s", t.path);
        cr_assert_eq(x->rank, t.rank, "%s", t.path);
        for (int k = 0; k < t.rank; k++)
            cr_assert_eq(x->shape[k], t.shape[k], "%s", t.path);
        cr_assert_eq(x->seq, i);
        cr_assert_eq(x->call, r.call);
        cr_assert_eq(x->step, r.step);
        cr_assert_eq(x->cfg_branch, r.cfg_branch);
        cr_assert_eq(x->timestep, r.timestep);
        cr_assert_str_eq(x->component, "tiny");
        cr_assert_str_eq(x->slot, r.slot);
        cr_assert_str_eq(x->scope, r.scope);
        cr_assert_str_eq(x->parent, r.parent ? r.parent : "");
        cr_assert_eq(x->block, r.parent ? r.block : -1);
        cr_assert_str_eq(x->class_name, r.class_name ? r.class_name : "");
        cr_assert_str_eq(x->module, r.module ? r.module : "");
        stored(&t, want);
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(want, t.nbytes, 0));
        cr_assert_str_eq(x->hash, hex, "%s", t.path);
        memset(got, 0xa5, sizeof got);
        cr_assert_eq(probe_file_read_raw(f, (size_t)i, got, t.nbytes), PROBE_OK, "%s", probe_last_error());
        cr_assert_eq(memcmp(got, want, t.nbytes), 0, "%s: bytes differ", t.path);
        uint64_t h = 0;
        cr_assert_eq(probe_file_hash(f, (size_t)i, &h), PROBE_OK);
        cr_assert_eq(h, XXH64(want, t.nbytes, 0));
        char *a = NULL;
        probe_status s = probe_file_tensor_attr(f, (size_t)i, "probe.op", &a);
        if (r.op != NULL) {
            cr_assert_eq(s, PROBE_OK, "%s: %s", t.path, probe_last_error());
            cr_assert_str_eq(a, op);
        } else {
            cr_assert_eq(s, PROBE_ENOTFOUND, "%s", t.path);
        }
        free(a);
        if (with_attrs) {
            cr_assert_eq(probe_file_tensor_attr(f, (size_t)i, "probe.dtype", &a), PROBE_OK);
            cr_assert_str_eq(a, probe_dtype_name(t.dtype));
            free(a);
        }
    }
    cr_assert_eq(probe_file_ignored_count(f), 0, "the pack's own datasets are not counted as ignored");
}

/* path, whose writer did not close it, read through its journal: every one
 * of its n tensors complete, bit-exact (check_file). */
static void check_recovered(const char *path, int n)
{
    probe_file *f;
    cr_assert_eq(probe_file_open(path, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_recovery(f)->recovered, 1);
    cr_assert_eq(probe_file_recovery(f)->complete, (size_t)n);
    check_file(f, n, 0);
    probe_file_close(f);
}


/* 1 when path is a link in the HDF5 file (a dataset or group). */
static int h5_has(const char *file, const char *path)
{
    hid_t h = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(h, 0);
    htri_t r = 1;
    char *buf = strdup(path);
    for (char *e = strchr(buf + 1, '/'); r > 0; e = strchr(e + 1, '/')) {
        if (e != NULL)
            *e = '\0';
        H5E_BEGIN_TRY { r = H5Lexists(h, buf, H5P_DEFAULT); } H5E_END_TRY;
        if (e == NULL)
            break;
        *e = '/';
    }
    free(buf);
    H5Fclose(h);
    return r > 0;
}

Test(pack, packed_tensors_read_back_bit_exact)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/packed.h5", g_dir);
    write_file(p, PACK, NT, 0);
    probe_file *f;
    cr_assert_eq(probe_file_open(p, &f), PROBE_OK, "%s", probe_last_error());
    check_file(f, NT, 1);
    cr_assert_eq(probe_file_skip_count(f), 1);
    cr_assert_str_eq(probe_file_skip(f, 0)->path, "/tiny/skipped/out");
    size_t k;
    cr_assert_eq(probe_file_find(f, "/tiny/0010/out", &k), PROBE_OK);
    cr_assert_str_eq(probe_file_tensor(f, k)->path, "/tiny/0010/out");
    /* a range read inside a packed tensor */
    float v[3];
    cr_assert_eq(probe_file_read_range(f, 1, 100, 3, v), PROBE_OK, "%s", probe_last_error());
    for (int j = 0; j < 3; j++)
        cr_assert_eq(v[j], (float)(1 * 1000 + 100 + j) * 0.25f);
    probe_summary s;
    cr_assert_eq(probe_file_summary(f, 1, &s), PROBE_OK);
    cr_assert_eq(s.n, 256);
    cr_assert_eq(s.max, (float)(1000 + 255) * 0.25f);
    probe_file_close(f);
    /* packed tensors are not datasets; the one above PACK is */
    cr_assert(!h5_has(p, "/tiny/0001/out"));
    cr_assert(h5_has(p, "/tiny/0009/out"), "tensor 19 (3600 bytes) is a dataset");
    cr_assert(h5_has(p, "/probe.pack/0000/data") && h5_has(p, "/probe.pack/0000/index"));
    cr_assert(h5_has(p, "/probe.pack/0002/data"), "400 KiB of tensors fill more than two chunks");
}

/* The whole probe_compare_write_json text of ref vs cand, compared in dir. */
static char *compare_json(const char *dir)
{
    char old[4096];
    cr_assert_not_null(getcwd(old, sizeof old));
    cr_assert_eq(chdir(dir), 0);
    probe_compare_opts o;
    memset(&o, 0, sizeof o);
    probe_compare_result *r = NULL;
    cr_assert_eq(probe_compare_files("ref.h5", "cand.h5", &o, &r), PROBE_OK, "%s", probe_last_error());
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    cr_assert_eq(probe_compare_write_json(r, m), PROBE_OK);
    fclose(m);
    cr_assert_eq(r->ntensors, NT);
    probe_compare_result_free(r);
    cr_assert_eq(chdir(old), 0);
    return text;
}

Test(pack, packed_and_unpacked_files_compare_identically)
{
    char a[1024], b[1024], p[1100];
    snprintf(a, sizeof a, "%s/plain", g_dir);
    snprintf(b, sizeof b, "%s/packed", g_dir);
    cr_assert_eq(mkdir(a, 0700), 0);
    cr_assert_eq(mkdir(b, 0700), 0);
    snprintf(p, sizeof p, "%s/ref.h5", a);
    write_file(p, 0, NT, 0);
    snprintf(p, sizeof p, "%s/cand.h5", a);
    write_file(p, 0, NT, 1);
    snprintf(p, sizeof p, "%s/ref.h5", b);
    write_file(p, PACK, NT, 0);
    snprintf(p, sizeof p, "%s/cand.h5", b);
    write_file(p, PACK, NT, 1);
    char *ja = compare_json(a), *jb = compare_json(b);
    cr_assert(strstr(ja, "\"rel_l2\"") != NULL);
    cr_assert(strcmp(ja, jb) == 0, "the JSON of the packed pair differs from the unpacked pair's");
    free(ja);
    free(jb);
    /* a packed reference against an unpacked candidate: the same metrics */
    probe_compare_opts o;
    memset(&o, 0, sizeof o);
    probe_compare_result *r1 = NULL, *r2 = NULL;
    char ra[1100], ca[1100], rb[1100];
    snprintf(ra, sizeof ra, "%s/ref.h5", a);
    snprintf(ca, sizeof ca, "%s/cand.h5", a);
    snprintf(rb, sizeof rb, "%s/ref.h5", b);
    cr_assert_eq(probe_compare_files(ra, ca, &o, &r1), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_compare_files(rb, ca, &o, &r2), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(r1->ntensors, r2->ntensors);
    for (size_t i = 0; i < r1->ntensors; i++)
        cr_assert(memcmp(&r1->tensors[i].m, &r2->tensors[i].m, sizeof r1->tensors[i].m) == 0, "%s",
                  r1->tensors[i].ref.path);
    probe_compare_result_free(r1);
    probe_compare_result_free(r2);
}

Test(pack, a_killed_writer_leaves_recoverable_packed_tensors)
{
    char p[1024], out[1100], j[1100];
    snprintf(p, sizeof p, "%s/killed.h5", g_dir);
    snprintf(j, sizeof j, "%s.journal", p);
    snprintf(out, sizeof out, "%s/recovered.h5", g_dir);
    const int n = 150;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        child_put_packed(p, n, -1);
        raise(SIGKILL); /* no close: the index of the open chunk never reaches the file */
        _exit(5);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child status %d", st);
    cr_assert_eq(access(j, F_OK), 0, "the journal is left by the kill");
    check_recovered(p, n);
    probe_file *f;

    char cmd[4096];
    const char *build = getenv("PROBE_BUILD_DIR");
    cr_assert_not_null(build, "PROBE_BUILD_DIR is set by ctest");
    snprintf(cmd, sizeof cmd, "'%s/bin/probe-recover' '%s' -o '%s' >/dev/null 2>&1", build, p, out);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cr_assert_eq(probe_file_open(out, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_recovery(f)->recovered, 0);
    check_file(f, n, 1);
    probe_file_close(f);
}

Test(pack, bad_pack_sizes_and_paths_are_refused)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/bad.h5", g_dir);
    probe_writer *w;
    cr_assert_eq(probe_writer_set_pack(NULL, 16), PROBE_EINVAL);
    cr_assert_eq(probe_writer_open(p, NULL, &w), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_set_pack(w, PROBE_PACK_MAX_BYTES + 1), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "above the limit") != NULL, "%s", probe_last_error());
    cr_assert_eq(probe_writer_set_pack(w, SIZE_MAX), PROBE_EINVAL);
    cr_assert_eq(probe_writer_set_pack(w, (size_t)-5), PROBE_EINVAL);
    cr_assert_eq(probe_writer_set_pack(w, 64), PROBE_OK);
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    probe_record r = {.path = "/a/b", .call = -1, .step = -1, .cfg_branch = -1, .timestep = NAN,
                      .dtype = PROBE_DTYPE_FLOAT32, .rank = 1, .shape = shape};
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_EINVAL, "a path is written once");
    cr_assert(strstr(probe_last_error(), "already written") != NULL, "%s", probe_last_error());
    r.path = "/a/b/c"; /* below a packed tensor */
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "is not a group") != NULL, "%s", probe_last_error());
    r.path = "/a"; /* the group of a packed tensor */
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_EINVAL);
    r.path = "/probe.pack/0000/x";
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "/probe.pack") != NULL, "%s", probe_last_error());
    /* off again (0): the next tensor is a dataset, and a dataset under a packed path is refused */
    cr_assert_eq(probe_writer_set_pack(w, 0), PROBE_OK);
    r.path = "/a/b/d";
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_EINVAL);
    r.path = "/a/c";
    cr_assert_eq(probe_writer_put(w, &r, v, sizeof v), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
    cr_assert(h5_has(p, "/a/c") && !h5_has(p, "/a/b"));
    probe_file *f;
    cr_assert_eq(probe_file_open(p, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_count(f), 2);
    cr_assert_str_eq(probe_file_tensor(f, 0)->path, "/a/b");
    cr_assert_str_eq(probe_file_tensor(f, 1)->path, "/a/c");
    probe_file_close(f);
}

/* /probe.pack/0000/index of a closed capture, opened for rewriting: its n bytes
 * in b, with room for `extra` more (zeroed). */
typedef struct {
    hid_t h, d;
    hsize_t n;
    unsigned char *b;
} pack_index;

static pack_index index_read(const char *file, size_t extra)
{
    pack_index x;
    x.h = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(x.h, 0);
    x.d = H5Dopen2(x.h, "/probe.pack/0000/index", H5P_DEFAULT);
    cr_assert_geq(x.d, 0);
    hid_t sp = H5Dget_space(x.d);
    x.n = 0;
    H5Sget_simple_extent_dims(sp, &x.n, NULL);
    H5Sclose(sp);
    x.b = calloc((size_t)x.n + extra, 1);
    cr_assert_not_null(x.b);
    cr_assert_eq(H5Dread(x.d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.b), 0);
    return x;
}

/* Write x.n bytes of x.b back as the index (extended when x.n grew) and close it. */
static void index_write(pack_index *x)
{
    cr_assert_geq(H5Dset_extent(x->d, &x->n), 0);
    cr_assert_geq(H5Dwrite(x->d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, x->b), 0);
    free(x->b);
    H5Dclose(x->d);
    H5Fclose(x->h);
}

/* Overwrite byte `at` of /probe.pack/0000/index (counted from its end when
 * negative) with its complement, or append `extra` bytes of garbage. */
static void damage_index(const char *file, long at, size_t extra)
{
    pack_index x = index_read(file, extra);
    if (extra > 0) {
        memset(x.b + x.n, 0x5a, extra);
        x.n += extra;
    } else {
        size_t k = at >= 0 ? (size_t)at : (size_t)x.n - (size_t)(-at);
        x.b[k] = (unsigned char)~x.b[k];
    }
    index_write(&x);
}

Test(pack, a_corrupt_index_is_a_clear_error)
{
    const long where[] = {3, 40, 200, -3};
    for (size_t k = 0; k < sizeof where / sizeof where[0] + 1; k++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/corrupt%zu.h5", g_dir, k);
        write_file(p, PACK, 20, 0);
        if (k < sizeof where / sizeof where[0])
            damage_index(p, where[k], 0);
        else
            damage_index(p, 0, 100); /* garbage after the last record */
        probe_file *f = NULL;
        probe_status s = probe_file_open(p, &f);
        cr_assert_eq(s, PROBE_EFORMAT, "damage %zu: %d", k, s);
        cr_assert_null(f);
        cr_assert(strstr(probe_last_error(), "corrupt pack index") != NULL, "%s", probe_last_error());
        cr_assert(strstr(probe_last_error(), p) != NULL, "the message names the file: %s",
                  probe_last_error());
    }
}

Test(pack, an_appended_capture_keeps_packing_and_journals_the_earlier_packed_tensors)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/exec.h5", g_dir);
    const int n1 = 60, n = 150;
    write_file(p, PACK, n1, 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        probe_writer *w;
        if (probe_writer_open_ex(p, "{}", PROBE_WRITER_APPEND, &w) != PROBE_OK ||
            probe_writer_set_pack(w, PACK) != PROBE_OK)
            _exit(3);
        static tensor t;
        char op[64], parent[64], module[64];
        make(n1 - 1, &t, 0);
        probe_record again = record(n1 - 1, &t, op, parent, module);
        if (probe_writer_put(w, &again, t.bytes, t.nbytes) != PROBE_EINVAL)
            _exit(4); /* written by the first image */
        for (int i = n1; i < n; i++) {
            make(i, &t, 0);
            probe_record r = record(i, &t, op, parent, module);
            if (probe_writer_put(w, &r, t.bytes, t.nbytes) != PROBE_OK)
                _exit(5);
        }
        raise(SIGKILL);
        _exit(6);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child status %d", st);
    check_recovered(p, n); /* the first image's packed tensors come from the new journal too */
}

/* Rewrite the offset field of the first TENSOR record of /probe.pack/0000/index
 * to `offset` and fix the record's checksum: a well-formed index that points
 * outside its chunk. */
static void point_first_record_at(const char *file, uint64_t offset)
{
    pack_index x = index_read(file, 0);
    unsigned char *b = x.b;
#define U32(p) ((uint32_t)(p)[0] | (uint32_t)(p)[1] << 8 | (uint32_t)(p)[2] << 16 | (uint32_t)(p)[3] << 24)
    size_t at = 8;                   /* after the magic: the HEADER record */
    at += U32(b + at);               /* the first TENSOR record */
    unsigned char *rec = b + at;
    cr_assert_eq(U32(rec + 4), 3u, "a TENSOR record follows the header");
    size_t q = 8;
    for (int k = 0; k < 6; k++) {    /* path, component, slot, scope, device, dtype */
        uint32_t len = U32(rec + q);
        q += 4 + (len == UINT32_MAX ? 0 : len);
    }
    q += 8 + 8 + 8 + 4 + 8;          /* seq, call, step, cfg_branch, timestep */
    uint32_t rank = U32(rec + q);
    q += 4 + 8 * (size_t)rank;
    for (int k = 0; k < 8; k++)
        rec[q + (size_t)k] = (unsigned char)(offset >> (8 * k));
    uint32_t len = U32(rec);
    uint64_t sum = XXH64(rec, len - 8, 0);
    for (int k = 0; k < 8; k++)
        rec[len - 8 + (size_t)k] = (unsigned char)(sum >> (8 * k));
#undef U32
    index_write(&x);
}

Test(pack, an_index_pointing_outside_its_chunk_is_a_clear_error)
{
    const uint64_t offsets[] = {65536 - 100, 65536, UINT64_MAX - 8, 1ull << 62};
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/outside%zu.h5", g_dir, k);
        write_file(p, PACK, 4, 0); /* tensor 0: 256 float32, 1 KiB, in a 64 KiB chunk */
        point_first_record_at(p, offsets[k]);
        probe_file *f = NULL;
        probe_status s = probe_file_open(p, &f);
        cr_assert_eq(s, PROBE_EFORMAT, "offset %llu: %d", (unsigned long long)offsets[k], s);
        cr_assert(strstr(probe_last_error(), "runs past the chunk's 65536 bytes") != NULL ||
                      strstr(probe_last_error(), "corrupt pack index") != NULL,
                  "%s", probe_last_error());
    }
    /* inside the chunk but elsewhere: opens, and reads what is there (the next tensor's bytes) */
    char p[1024];
    snprintf(p, sizeof p, "%s/elsewhere.h5", g_dir);
    write_file(p, PACK, 4, 0);
    point_first_record_at(p, 1024);
    probe_file *f = NULL;
    cr_assert_eq(probe_file_open(p, &f), PROBE_OK, "%s", probe_last_error());
    probe_file_close(f);
}

Test(pack, a_close_without_room_for_the_index_keeps_the_journal)
{
    char p[1024], j[1100];
    snprintf(p, sizeof p, "%s/full.h5", g_dir);
    snprintf(j, sizeof j, "%s.journal", p);
    const int n = 30;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        probe_writer *w = child_put_packed(p, n, n - 2); /* the file is at its EOA */
        struct stat st;
        if (stat(p, &st) != 0)
            _exit(5);
        /* room for HDF5's flush at close, not for the index's 64 KiB of slack:
         * the last tensor's index record is refused, its bytes are in the file */
        struct rlimit rl = {(rlim_t)st.st_size + 16384, (rlim_t)st.st_size + 16384};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(6);
        probe_status s = probe_writer_close(w);
        _exit(s == PROBE_EIO ? 0 : 7);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
    cr_assert_eq(access(j, F_OK), 0, "the journal is kept: the index did not reach the file");
    check_recovered(p, n);
}

/* Stats-only records are never packed: a pack index holding a well-formed
 * SUMMARY record (journal type 9) is corrupt. */
Test(pack, an_index_holding_a_stats_only_record_is_a_clear_error)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/summary_in_index.h5", g_dir);
    write_file(p, PACK, 4, 0);
    unsigned char rec[256];
    size_t q = 8;
#define PUT(v, n) do { uint64_t v_ = (uint64_t)(v); memcpy(rec + q, &v_, n); q += n; } while (0)
#define PSTR(s) do { PUT(strlen(s), 4); memcpy(rec + q, s, strlen(s)); q += strlen(s); } while (0)
    PSTR("/s/0000/out");
    for (int k = 0; k < 4; k++) /* component, slot, scope, device: absent */
        PUT(UINT32_MAX, 4);
    PSTR("float32");
    PUT(0, 8); /* seq */
    PUT(0, 8); /* call */
    PUT(UINT64_MAX, 8); /* step -1 */
    PUT(UINT32_MAX, 4); /* cfg_branch -1 */
    double ts = 0.5, f[5] = {1, 4, 4, 10, 30};
    memcpy(rec + q, &ts, 8);
    q += 8;
    PUT(1, 4); /* rank */
    PUT(4, 8); /* shape */
    PUT(0x1234, 8); /* hash */
    PUT(4, 8); /* n */
    PUT(4, 8); /* n_finite */
    PUT(0, 8); /* nan */
    PUT(0, 8); /* inf */
    memcpy(rec + q, f, sizeof f);
    q += sizeof f;
#undef PSTR
#undef PUT
    uint32_t len = (uint32_t)(q + 8), type = 9;
    memcpy(rec, &len, 4); /* the test machine is little-endian, as the format */
    memcpy(rec + 4, &type, 4);
    uint64_t sum = XXH64(rec, q, 0);
    memcpy(rec + q, &sum, 8);

    pack_index x = index_read(p, len);
    memcpy(x.b + x.n, rec, len);
    x.n += len;
    index_write(&x);

    probe_file *fl = NULL;
    cr_assert_eq(probe_file_open(p, &fl), PROBE_EFORMAT, "%s", probe_last_error());
    cr_assert_null(fl);
    cr_assert(strstr(probe_last_error(), "corrupt pack index") != NULL &&
                  strstr(probe_last_error(), "/s/0000/out is a stats-only record") != NULL,
              "%s", probe_last_error());
}
