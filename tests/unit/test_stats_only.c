/* Unit tests for stats-only capture: probe_writer_put_summary (probe/capture/writer.c),
 * the reader's stats-only records, probe_file_summary / probe_file_hash
 * (probe/capture/reader.c), the rel_l2 lower bound and stats-only pairs in the compare
 * engine (probe/compare/compare.c). docs/file-format.md "Stats-only records",
 * docs/compare-json.md "Stats-only pairs".
 *
 * Expected values are derived by hand (commented) and by reading the files
 * back through the raw HDF5 C API, never from the code under test. */
#include <criterion/criterion.h>

#include <errno.h>
#include <ftw.h>
#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe/capture.h"
#include "probe/compare.h"

#define TMPDIR_PREFIX "probe-stats"
#include "tmpdir_fixture.h"

TestSuite(stats_only, .init = setup, .fini = teardown);

static const char *tmp(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static const int64_t SHAPE23[2] = {2, 3};

static probe_record rec_of(const char *path, probe_dtype dt, int rank, const int64_t *shape)
{
    probe_record r = {0};
    r.path = path;
    r.component = "dit.step";
    r.slot = "out";
    r.call = 3;
    r.step = 1;
    r.cfg_branch = 1;
    r.timestep = NAN;
    r.scope = "";
    r.device = "cpu";
    r.seq = 7;
    r.dtype = dt;
    r.rank = rank;
    r.shape = shape;
    return r;
}

/* x = {1, -2, 3.5, 0, NaN, +inf}: by hand n 6, n_finite 4, nan 1, inf 1,
 * min -2, max 3.5, abs_max 3.5, sum 1 - 2 + 3.5 + 0 = 2.5,
 * sum_sq 1 + 4 + 12.25 + 0 = 17.25. */
static const float X[6] = {1.0f, -2.0f, 3.5f, 0.0f, NAN, INFINITY};

static void write_stats_file(const char *file, const char *path, const float *x, uint64_t *hash)
{
    probe_writer *w = NULL;
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK, "%s", probe_last_error());
    probe_summary s;
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT32, x, 6, &s), PROBE_OK);
    probe_record r = rec_of(path, PROBE_DTYPE_FLOAT32, 2, SHAPE23);
    *hash = probe_capture_hash(x, 6 * sizeof(float));
    cr_assert_eq(probe_writer_put_summary(w, &r, &s, *hash), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
}

static void write_full_file(const char *file, const char *path, const float *x)
{
    probe_writer *w = NULL;
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK, "%s", probe_last_error());
    probe_record r = rec_of(path, PROBE_DTYPE_FLOAT32, 2, SHAPE23);
    cr_assert_eq(probe_writer_put(w, &r, x, 6 * sizeof(float)), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
}

Test(stats_only, record_layout_in_hdf5)
{
    const char *f = tmp("a.h5");
    uint64_t h;
    write_stats_file(f, "/dit.step/0003/out", X, &h);

    /* Raw HDF5: a scalar compound of 9 named fields, u64 x 4 then f64 x 5. */
    hid_t file = H5Fopen(f, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(file, 0);
    hid_t d = H5Dopen2(file, "/dit.step/0003/out", H5P_DEFAULT);
    cr_assert_geq(d, 0);
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    cr_assert_eq(H5Tget_class(t), H5T_COMPOUND);
    cr_assert_eq(H5Sget_simple_extent_type(sp), H5S_SCALAR);
    static const char *names[] = {"n", "n_finite", "nan", "inf", "min", "max", "abs_max", "sum",
                                  "sum_sq"};
    cr_assert_eq(H5Tget_nmembers(t), 9);
    for (unsigned i = 0; i < 9; i++) {
        char *nm = H5Tget_member_name(t, i);
        cr_assert_str_eq(nm, names[i]);
        H5free_memory(nm);
        cr_assert_eq(H5Tget_member_class(t, i), i < 4 ? H5T_INTEGER : H5T_FLOAT);
    }
    struct {
        uint64_t n, nf, nan, inf;
        double mn, mx, am, sum, sq;
    } v;
    hid_t mt = H5Tcreate(H5T_COMPOUND, sizeof v);
    H5Tinsert(mt, "n", 0, H5T_NATIVE_UINT64);
    H5Tinsert(mt, "n_finite", 8, H5T_NATIVE_UINT64);
    H5Tinsert(mt, "nan", 16, H5T_NATIVE_UINT64);
    H5Tinsert(mt, "inf", 24, H5T_NATIVE_UINT64);
    H5Tinsert(mt, "min", 32, H5T_NATIVE_DOUBLE);
    H5Tinsert(mt, "max", 40, H5T_NATIVE_DOUBLE);
    H5Tinsert(mt, "abs_max", 48, H5T_NATIVE_DOUBLE);
    H5Tinsert(mt, "sum", 56, H5T_NATIVE_DOUBLE);
    H5Tinsert(mt, "sum_sq", 64, H5T_NATIVE_DOUBLE);
    cr_assert_geq(H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v), 0);
    cr_assert_eq(v.n, 6);
    cr_assert_eq(v.nf, 4);
    cr_assert_eq(v.nan, 1);
    cr_assert_eq(v.inf, 1);
    cr_assert_eq(v.mn, -2.0);
    cr_assert_eq(v.mx, 3.5);
    cr_assert_eq(v.am, 3.5);
    cr_assert_eq(v.sum, 2.5);
    cr_assert_eq(v.sq, 17.25);
    int32_t flag = 0;
    hid_t a = H5Aopen(d, "probe.stats_only", H5P_DEFAULT);
    cr_assert_geq(a, 0);
    H5Aread(a, H5T_NATIVE_INT32, &flag);
    H5Aclose(a);
    cr_assert_eq(flag, 1);
    int64_t shape[2] = {0, 0};
    a = H5Aopen(d, "probe.shape", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, shape);
    H5Aclose(a);
    cr_assert(shape[0] == 2 && shape[1] == 3);
    H5Tclose(mt);
    H5Tclose(t);
    H5Sclose(sp);
    H5Dclose(d);
    H5Fclose(file);
}

Test(stats_only, reader_round_trip)
{
    const char *f = tmp("b.h5");
    uint64_t h;
    write_stats_file(f, "/dit.step/0003/out", X, &h);
    probe_file *pf = NULL;
    cr_assert_eq(probe_file_open(f, &pf), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_count(pf), 1);
    cr_assert_eq(probe_file_ignored_count(pf), 0);
    const probe_tensor_info *t = probe_file_tensor(pf, 0);
    cr_assert_eq(t->stats_only, 1);
    cr_assert_eq(t->dtype, PROBE_DTYPE_FLOAT32);
    cr_assert_eq(t->rank, 2);
    cr_assert(t->shape[0] == 2 && t->shape[1] == 3);
    cr_assert_eq(t->n, 6);
    cr_assert_eq(t->step, 1);
    cr_assert_eq(t->cfg_branch, 1);
    cr_assert_eq(t->seq, 7);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    cr_assert_str_eq(t->hash, hex);
    uint64_t h2 = 0;
    cr_assert_eq(probe_file_hash(pf, 0, &h2), PROBE_OK);
    cr_assert_eq(h2, h);
    probe_summary s;
    cr_assert_eq(probe_file_summary(pf, 0, &s), PROBE_OK, "%s", probe_last_error());
    cr_assert(s.n == 6 && s.n_finite == 4 && s.nan == 1 && s.inf == 1);
    cr_assert(s.min == -2.0 && s.max == 3.5 && s.abs_max == 3.5 && s.sum == 2.5 &&
              s.sum_sq == 17.25);

    /* The elements are not in the file. */
    float buf[6];
    double d64[6];
    cr_assert_eq(probe_file_read_raw(pf, 0, buf, sizeof buf), PROBE_EUNSUPPORTED);
    cr_assert(strstr(probe_last_error(), "stats-only") != NULL, "%s", probe_last_error());
    cr_assert(strstr(probe_last_error(), "/dit.step/0003/out") != NULL);
    cr_assert_eq(probe_file_read_f64(pf, 0, d64), PROBE_EUNSUPPORTED);
    cr_assert_eq(probe_file_read_range(pf, 0, 0, 2, buf), PROBE_EUNSUPPORTED);
    /* bad index */
    cr_assert_eq(probe_file_summary(pf, 1, &s), PROBE_EINVAL);
    cr_assert_eq(probe_file_hash(pf, 1, &h2), PROBE_EINVAL);
    cr_assert_eq(probe_file_summary(pf, 0, NULL), PROBE_EINVAL);
    probe_file_close(pf);
}

Test(stats_only, full_tensor_summary_and_hash)
{
    const char *f = tmp("c.h5");
    write_full_file(f, "/x/0000/out", X);
    /* an HDF5 file without probe.hash: the hash comes from the bytes */
    const char *g = tmp("d.h5");
    hid_t file = H5Fcreate(g, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {2, 3};
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t d = H5Dcreate2(file, "plain", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, X);
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(file);

    const char *files[2] = {f, g};
    for (int k = 0; k < 2; k++) {
        probe_file *pf = NULL;
        cr_assert_eq(probe_file_open(files[k], &pf), PROBE_OK, "%s", probe_last_error());
        cr_assert_eq(probe_file_tensor(pf, 0)->stats_only, 0);
        probe_summary s;
        cr_assert_eq(probe_file_summary(pf, 0, &s), PROBE_OK, "%s", probe_last_error());
        cr_assert(s.n == 6 && s.n_finite == 4 && s.nan == 1 && s.inf == 1);
        cr_assert(s.min == -2.0 && s.max == 3.5 && s.abs_max == 3.5 && s.sum == 2.5 &&
                  s.sum_sq == 17.25);
        uint64_t h = 0;
        cr_assert_eq(probe_file_hash(pf, 0, &h), PROBE_OK);
        cr_assert_eq(h, probe_capture_hash(X, sizeof X));
        probe_file_close(pf);
    }
}

Test(stats_only, writer_rejects_bad_records)
{
    probe_writer *w = NULL;
    cr_assert_eq(probe_writer_open(tmp("e.h5"), NULL, &w), PROBE_OK);
    probe_summary s;
    cr_assert_eq(probe_summary_compute(PROBE_DTYPE_FLOAT32, X, 6, &s), PROBE_OK);
    probe_record r = rec_of("/a/0000/out", PROBE_DTYPE_FLOAT32, 2, SHAPE23);
    cr_assert_eq(probe_writer_put_summary(w, &r, NULL, 0), PROBE_EINVAL);
    cr_assert_eq(probe_writer_put_summary(NULL, &r, &s, 0), PROBE_EINVAL);
    probe_summary bad = s;
    bad.n = 5; /* the shape says 6 */
    cr_assert_eq(probe_writer_put_summary(w, &r, &bad, 0), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "/a/0000/out") != NULL, "%s", probe_last_error());
    bad = s;
    bad.nan = 2; /* 4 + 2 + 1 != 6 */
    cr_assert_eq(probe_writer_put_summary(w, &r, &bad, 0), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "do not add up") != NULL, "%s", probe_last_error());
    probe_record rp = rec_of("relative/path", PROBE_DTYPE_FLOAT32, 2, SHAPE23);
    cr_assert_eq(probe_writer_put_summary(w, &rp, &s, 0), PROBE_EINVAL);
    cr_assert_eq(probe_writer_put_summary(w, &r, &s, 1), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_put_summary(w, &r, &s, 1), PROBE_EINVAL); /* already written */
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
}

Test(stats_only, rel_l2_lower_bound)
{
    probe_summary r = {0}, c = {0};
    r.n = c.n = r.n_finite = c.n_finite = 2;
    /* r = (3, 4): ||r|| = 5; c = (6, 8): ||c|| = 10; bound |10 - 5| / 5 = 1,
     * which is the true rel_l2 (c - r = (3, 4)): the bound is attained. */
    r.sum_sq = 25, c.sum_sq = 100;
    cr_assert_eq(probe_summary_rel_l2_lower_bound(&r, &c), 1.0);
    /* r = (1, 0), c = (0, 1): equal norms, bound 0 (true rel_l2 sqrt 2). */
    r.sum_sq = 1, c.sum_sq = 1;
    cr_assert_eq(probe_summary_rel_l2_lower_bound(&r, &c), 0.0);
    /* r = (2, 0), c = (1, 0): |1 - 2| / 2 = 0.5 */
    r.sum_sq = 4;
    cr_assert_eq(probe_summary_rel_l2_lower_bound(&r, &c), 0.5);
    /* zero reference: 0 when the candidate is 0 too, else infinite */
    r.sum_sq = 0, c.sum_sq = 0;
    cr_assert_eq(probe_summary_rel_l2_lower_bound(&r, &c), 0.0);
    c.sum_sq = 1;
    cr_assert(isinf(probe_summary_rel_l2_lower_bound(&r, &c)));
    /* a non-finite element on either side: unknown */
    r.sum_sq = 4, c.nan = 1, c.n_finite = 1;
    cr_assert(isnan(probe_summary_rel_l2_lower_bound(&r, &c)));
    c.nan = 0, r.inf = 1;
    cr_assert(isnan(probe_summary_rel_l2_lower_bound(&r, &c)));
    cr_assert(isnan(probe_summary_rel_l2_lower_bound(NULL, &c)));
}

static probe_compare_result *compare(const char *a, const char *b)
{
    probe_compare_opts o;
    memset(&o, 0, sizeof o);
    cr_assert_eq(probe_gate_parse("T1", &o.gate), PROBE_OK);
    probe_compare_result *r = NULL;
    cr_assert_eq(probe_compare_files(a, b, &o, &r), PROBE_OK, "%s", probe_last_error());
    return r;
}

Test(stats_only, compare_identical_by_hash)
{
    static const float Y[6] = {1.0f, -2.0f, 3.5f, 0.0f, 0.5f, 2.0f};
    const char *full = tmp("full.h5"), *so = tmp("so.h5");
    uint64_t h;
    write_full_file(full, "/x/0000/out", Y);
    write_stats_file(so, "/x/0000/out", Y, &h);
    const char *pairs[3][2] = {{full, so}, {so, full}, {so, so}};
    for (int k = 0; k < 3; k++) {
        probe_compare_result *r = compare(pairs[k][0], pairs[k][1]);
        cr_assert_eq(r->ntensors, 1);
        const probe_tensor_result *t = &r->tensors[0];
        cr_assert_eq(t->stats_only, 1);
        cr_assert_eq(t->compared, 1);
        cr_assert_eq(t->m.identical, 1);
        cr_assert(t->m.rel_l2 == 0 && t->m.cosine == 1 && t->m.max_abs == 0 &&
                  t->m.p99_abs == 0 && t->m.mean_abs == 0 && t->m.mismatch_fraction == 0);
        cr_assert_eq(t->verdict.pass, 1);
        cr_assert_eq(t->rel_l2_lower_bound, 0.0);
        cr_assert_eq(t->mean_shift, 0.0);
        cr_assert_eq(r->feature_active, 0); /* identical everywhere: feature not active */
        probe_compare_result_free(r);
    }
}

Test(stats_only, compare_differs_fails_with_bound)
{
    /* r = (3, 4, 0, 0, 0, 0): ||r|| = 5; c = (6, 8, 0, 0, 0, 0): ||c|| = 10:
     * bound 1 > rel_l2_max 0.01 of T1; mean shift (14 - 7) / 6 = 7/6. */
    static const float R[6] = {3, 4, 0, 0, 0, 0}, C[6] = {6, 8, 0, 0, 0, 0};
    /* C2 = (3, 4, 0, 0, 0, 1e-3): ||C2|| = sqrt(25 + 1e-6 (as float)), bound ~1e-7 < 0.01,
     * but not identical: still a failure, with the "needs the tensors" reason. */
    static const float C2[6] = {3, 4, 0, 0, 0, 1e-3f};
    const char *ref = tmp("r.h5"), *c1 = tmp("c1.h5"), *c2 = tmp("c2.h5");
    uint64_t h;
    write_full_file(ref, "/x/0000/out", R);
    write_stats_file(c1, "/x/0000/out", C, &h);
    write_stats_file(c2, "/x/0000/out", C2, &h);

    probe_compare_result *r = compare(ref, c1);
    const probe_tensor_result *t = &r->tensors[0];
    cr_assert_eq(t->compared, 0);
    cr_assert_eq(t->verdict.pass, 0);
    cr_assert_eq(r->pass, 0);
    cr_assert_str_eq(r->first_failure_path, "/x/0000/out");
    cr_assert_eq(t->rel_l2_lower_bound, 1.0);
    cr_assert_float_eq(t->mean_shift, 7.0 / 6.0, 1e-15);
    cr_assert(strstr(t->verdict.reasons[0], "exceeds rel_l2_max") != NULL, "%s",
              t->verdict.reasons[0]);
    cr_assert_eq(t->summary_ref.sum_sq, 25.0);
    cr_assert_eq(t->summary_cand.sum_sq, 100.0);
    probe_compare_result_free(r);

    r = compare(ref, c2);
    t = &r->tensors[0];
    cr_assert_eq(t->compared, 0);
    cr_assert_eq(t->verdict.pass, 0);
    double c5 = (double)1e-3f;
    double want = (sqrt(25.0 + c5 * c5) - 5.0) / 5.0;
    cr_assert_float_eq(t->rel_l2_lower_bound, want, 1e-15);
    cr_assert(strstr(t->verdict.reasons[0], "the gate needs the tensors") != NULL, "%s",
              t->verdict.reasons[0]);
    probe_compare_result_free(r);
}

Test(stats_only, compare_nan_in_candidate_fails)
{
    static const float R[6] = {3, 4, 0, 0, 0, 0}, C[6] = {3, 4, 0, 0, 0, NAN};
    const char *ref = tmp("r.h5"), *c = tmp("c.h5");
    uint64_t h;
    write_full_file(ref, "/x/0000/out", R);
    write_stats_file(c, "/x/0000/out", C, &h);
    probe_compare_result *r = compare(ref, c);
    const probe_tensor_result *t = &r->tensors[0];
    cr_assert_eq(t->verdict.pass, 0);
    cr_assert(isnan(t->rel_l2_lower_bound));
    cr_assert_eq(t->summary_cand.nan, 1);
    cr_assert(strstr(t->verdict.reasons[0], "NaN in candidate") != NULL, "%s", t->verdict.reasons[0]);
    probe_compare_result_free(r);
}

/* Write a compound record by hand: fields named in names (all u64 for
 * simplicity), probe.stats_only = flag, probe.dtype float32, probe.shape
 * [2, 3] when with_shape. */
static void write_foreign_record(const char *file, const char *const *names, int nnames, int flag,
                                 int with_shape)
{
    hid_t f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t t = H5Tcreate(H5T_COMPOUND, 8 * (size_t)nnames);
    for (int i = 0; i < nnames; i++)
        H5Tinsert(t, names[i], 8 * (size_t)i, H5T_NATIVE_UINT64);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t d = H5Dcreate2(f, "rec", t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    uint64_t v[9] = {6, 6, 0, 0, 0, 0, 0, 0, 0};
    H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    hid_t s1 = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, "probe.stats_only", H5T_STD_I32LE, s1, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &flag);
    H5Aclose(a);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    const char *dt = "float32";
    a = H5Acreate2(d, "probe.dtype", st, s1, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, st, &dt);
    H5Aclose(a);
    if (with_shape) {
        hsize_t two = 2;
        hid_t s2 = H5Screate_simple(1, &two, NULL);
        a = H5Acreate2(d, "probe.shape", H5T_STD_I64LE, s2, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_INT64, SHAPE23);
        H5Aclose(a);
        H5Sclose(s2);
    }
    H5Tclose(st);
    H5Sclose(s1);
    H5Dclose(d);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(f);
}

Test(stats_only, foreign_compounds)
{
    static const char *all[] = {"n", "n_finite", "nan", "inf", "min", "max", "abs_max", "sum",
                                "sum_sq"};
    probe_file *pf = NULL;
    probe_summary s;
    /* not flagged, or flagged without probe.shape: an ignored compound */
    write_foreign_record(tmp("f1.h5"), all, 9, 0, 1);
    cr_assert_eq(probe_file_open(tmp("f1.h5"), &pf), PROBE_OK);
    cr_assert(probe_file_count(pf) == 0 && probe_file_ignored_count(pf) == 1);
    probe_file_close(pf);
    write_foreign_record(tmp("f2.h5"), all, 9, 1, 0);
    cr_assert_eq(probe_file_open(tmp("f2.h5"), &pf), PROBE_OK);
    cr_assert(probe_file_count(pf) == 0 && probe_file_ignored_count(pf) == 1);
    probe_file_close(pf);
    /* flagged, shaped, but "sum" is missing: indexed, its summary is EFORMAT */
    static const char *no_sum[] = {"n", "n_finite", "nan", "inf", "min", "max", "abs_max", "sum_sq"};
    write_foreign_record(tmp("f3.h5"), no_sum, 8, 1, 1);
    cr_assert_eq(probe_file_open(tmp("f3.h5"), &pf), PROBE_OK);
    cr_assert_eq(probe_file_count(pf), 1);
    cr_assert_eq(probe_file_tensor(pf, 0)->stats_only, 1);
    cr_assert_eq(probe_file_summary(pf, 0, &s), PROBE_EFORMAT);
    cr_assert(strstr(probe_last_error(), "rec") != NULL, "%s", probe_last_error());
    uint64_t h;
    cr_assert_eq(probe_file_hash(pf, 0, &h), PROBE_EFORMAT); /* no probe.hash */
    probe_file_close(pf);
    /* all nine fields (stored as uint64: HDF5 converts them to the record types) */
    write_foreign_record(tmp("f4.h5"), all, 9, 1, 1);
    cr_assert_eq(probe_file_open(tmp("f4.h5"), &pf), PROBE_OK);
    cr_assert_eq(probe_file_summary(pf, 0, &s), PROBE_OK, "%s", probe_last_error());
    cr_assert(s.n == 6 && s.n_finite == 6);
    probe_file_close(pf);
}

/* A stats-only record as a GPU makes it: the summary and only the tree
 * hash (probe_writer_put_summary_ex, hash NULL); or only the XXH64. */
static void write_tree_file(const char *file, const char *path, const float *x, int with_xxh,
                            int with_tree)
{
    probe_writer *w = NULL;
    cr_assert_eq(probe_writer_open(file, NULL, &w), PROBE_OK, "%s", probe_last_error());
    probe_summary s;
    uint64_t tree = 0, xxh = probe_capture_hash(x, 6 * sizeof(float));
    cr_assert_eq(probe_summary_tree(PROBE_DTYPE_FLOAT32, x, 6, &s, &tree), PROBE_OK);
    probe_record r = rec_of(path, PROBE_DTYPE_FLOAT32, 2, SHAPE23);
    cr_assert_eq(probe_writer_put_summary_ex(w, &r, &s, with_xxh ? &xxh : NULL,
                                             with_tree ? &tree : NULL),
                 PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
}

/* the string attribute as the raw HDF5 C API reads it (in its own type),
 * "" when absent */
static void raw_attr(const char *file, const char *path, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    if (H5Aexists(d, name) > 0) {
        hid_t a = H5Aopen(d, name, H5P_DEFAULT), t = H5Aget_type(a);
        if (H5Tis_variable_str(t) > 0) {
            char *v = NULL;
            if (H5Aread(a, t, &v) >= 0 && v)
                snprintf(out, cap, "%s", v);
            H5free_memory(v);
        } else {
            char buf[64] = "";
            size_t n = H5Tget_size(t);
            if (n < sizeof buf && H5Aread(a, t, buf) >= 0)
                snprintf(out, cap, "%.*s", (int)n, buf);
        }
        H5Tclose(t);
        H5Aclose(a);
    }
    H5Dclose(d);
    H5Fclose(f);
}

Test(stats_only, tree_hash_only_record)
{
    static const float Y[6] = {1.0f, -2.0f, 3.5f, 0.0f, 0.5f, 2.0f};
    const char *so = tmp("tree.h5"), *full = tmp("full.h5");
    write_tree_file(so, "/x/0000/out", Y, 0, 1);
    write_full_file(full, "/x/0000/out", Y);
    uint64_t want = probe_tree_hash(Y, sizeof Y);
    char hex[17], got[64];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)want);
    raw_attr(so, "/x/0000/out", "probe.tree_hash", got, sizeof got);
    cr_assert_str_eq(got, hex);
    raw_attr(so, "/x/0000/out", "probe.hash", got, sizeof got);
    cr_assert_str_eq(got, "", "no XXH64 was given: no probe.hash");

    probe_file *f = NULL;
    cr_assert_eq(probe_file_open(so, &f), PROBE_OK, "%s", probe_last_error());
    const probe_tensor_info *t = probe_file_tensor(f, 0);
    cr_assert_eq(t->stats_only, 1);
    cr_assert_str_eq(t->hash, "");
    cr_assert_str_eq(t->tree_hash, hex);
    uint64_t h = 0;
    cr_assert_eq(probe_file_tree_hash(f, 0, &h), PROBE_OK);
    cr_assert_eq(h, want);
    cr_assert_eq(probe_file_hash(f, 0, &h), PROBE_ENOTFOUND);
    cr_assert(strstr(probe_last_error(), "tree hash") != NULL, "%s", probe_last_error());
    probe_file_close(f);

    /* the full capture's tree hash, computed from its bytes */
    cr_assert_eq(probe_file_open(full, &f), PROBE_OK);
    cr_assert_eq(probe_file_tree_hash(f, 0, &h), PROBE_OK);
    cr_assert_eq(h, want);
    cr_assert_str_eq(probe_file_tensor(f, 0)->tree_hash, "");
    probe_file_close(f);

    /* identical by the tree hash, both ways */
    const char *pairs[2][2] = {{full, so}, {so, full}};
    for (int k = 0; k < 2; k++) {
        probe_compare_result *r = compare(pairs[k][0], pairs[k][1]);
        cr_assert_eq(r->ntensors, 1);
        cr_assert_eq(r->tensors[0].compared, 1);
        cr_assert_eq(r->tensors[0].m.identical, 1);
        cr_assert_eq(r->tensors[0].verdict.pass, 1);
        probe_compare_result_free(r);
    }
    /* one element changed: not identical, and the summaries show it */
    static const float Z[6] = {1.0f, -2.0f, 3.5f, 0.0f, 0.5f, 2.5f};
    const char *full2 = tmp("full2.h5");
    write_full_file(full2, "/x/0000/out", Z);
    probe_compare_result *r = compare(full2, so);
    cr_assert_eq(r->tensors[0].m.identical, 0);
    cr_assert_eq(r->tensors[0].verdict.pass, 0);
    probe_compare_result_free(r);
}

Test(stats_only, records_that_share_no_hash)
{
    /* one record with only the XXH64, one with only the tree hash: equal
     * bytes cannot be proven, so the pair is not identical (and no error) */
    static const float Y[6] = {1.0f, -2.0f, 3.5f, 0.0f, 0.5f, 2.0f};
    const char *a = tmp("xxh.h5"), *b = tmp("tree.h5"), *c = tmp("both.h5");
    write_tree_file(a, "/x/0000/out", Y, 1, 0);
    write_tree_file(b, "/x/0000/out", Y, 0, 1);
    write_tree_file(c, "/x/0000/out", Y, 1, 1);
    probe_file *fa = NULL, *fb = NULL, *fc = NULL;
    cr_assert_eq(probe_file_open(a, &fa), PROBE_OK);
    cr_assert_eq(probe_file_open(b, &fb), PROBE_OK);
    cr_assert_eq(probe_file_open(c, &fc), PROBE_OK);
    int same = -1;
    cr_assert_eq(probe_file_hash_match(fa, 0, fb, 0, &same), PROBE_OK);
    cr_assert_eq(same, 0);
    cr_assert_eq(probe_file_hash_match(fa, 0, fc, 0, &same), PROBE_OK); /* by XXH64 */
    cr_assert_eq(same, 1);
    cr_assert_eq(probe_file_hash_match(fb, 0, fc, 0, &same), PROBE_OK); /* by tree hash */
    cr_assert_eq(same, 1);
    cr_assert_eq(probe_file_hash_match(fa, 1, fc, 0, &same), PROBE_EINVAL);
    uint64_t h;
    cr_assert_eq(probe_file_tree_hash(fa, 0, &h), PROBE_ENOTFOUND);
    probe_file_close(fa);
    probe_file_close(fb);
    probe_file_close(fc);
    probe_compare_result *r = compare(a, b);
    cr_assert_eq(r->tensors[0].m.identical, 0);
    probe_compare_result_free(r);

    /* neither hash: refused, nothing written */
    probe_writer *w = NULL;
    cr_assert_eq(probe_writer_open(tmp("none.h5"), NULL, &w), PROBE_OK);
    probe_summary s;
    cr_assert_eq(probe_summary_tree(PROBE_DTYPE_FLOAT32, Y, 6, &s, NULL), PROBE_OK);
    probe_record rr = rec_of("/x/0000/out", PROBE_DTYPE_FLOAT32, 2, SHAPE23);
    cr_assert_eq(probe_writer_put_summary_ex(w, &rr, &s, NULL, NULL), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "XXH64 or its tree hash") != NULL, "%s",
              probe_last_error());
    cr_assert_eq(probe_writer_close(w), PROBE_OK);
    probe_file *fn = NULL;
    cr_assert_eq(probe_file_open(tmp("none.h5"), &fn), PROBE_OK);
    cr_assert_eq(probe_file_count(fn), 0);
    probe_file_close(fn);
}

/* A killed writer's tree-hash-only record: the journal keeps that it has no
 * XXH64 and its tree hash, in journal mode and after probe-recover's rewrite
 * (the same records through probe_file_open of the recovered file). */
Test(stats_only, tree_hash_survives_the_journal)
{
    static const float Y[6] = {1.0f, -2.0f, 3.5f, 0.0f, 0.5f, 2.0f};
    const char *f = tmp("killed.h5");
    uint64_t want = probe_tree_hash(Y, sizeof Y);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        probe_writer *w = NULL;
        probe_summary s;
        uint64_t tree = want;
        probe_record r = rec_of("/x/0000/out", PROBE_DTYPE_FLOAT32, 2, SHAPE23);
        probe_record r2 = rec_of("/x/0001/out", PROBE_DTYPE_FLOAT32, 2, SHAPE23);
        uint64_t xxh = probe_capture_hash(Y, sizeof Y);
        if (probe_writer_open(f, NULL, &w) != PROBE_OK ||
            probe_summary_tree(PROBE_DTYPE_FLOAT32, Y, 6, &s, NULL) != PROBE_OK ||
            probe_writer_put_summary_ex(w, &r, &s, NULL, &tree) != PROBE_OK ||
            probe_writer_put_summary(w, &r2, &s, xxh) != PROBE_OK)
            _exit(2);
        _exit(0); /* killed: never closed */
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char jpath[1100];
    snprintf(jpath, sizeof jpath, "%s.journal", f);
    cr_assert_eq(access(jpath, F_OK), 0, "the journal is left");
    probe_file *pf = NULL;
    cr_assert_eq(probe_file_open(f, &pf), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_count(pf), 2);
    size_t i0, i1;
    cr_assert_eq(probe_file_find(pf, "/x/0000/out", &i0), PROBE_OK);
    cr_assert_eq(probe_file_find(pf, "/x/0001/out", &i1), PROBE_OK);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)want);
    cr_assert_str_eq(probe_file_tensor(pf, i0)->hash, "");
    cr_assert_str_eq(probe_file_tensor(pf, i0)->tree_hash, hex);
    cr_assert_neq(probe_file_tensor(pf, i1)->hash[0], '\0', "the old record keeps its XXH64");
    cr_assert_str_eq(probe_file_tensor(pf, i1)->tree_hash, "");
    probe_file_close(pf);

    /* probe-recover rewrites both records with the hashes they had */
    char cmd[2400], out[1100];
    snprintf(out, sizeof out, "%s/recovered.h5", g_dir);
    snprintf(cmd, sizeof cmd, "'%s/bin/probe-recover' '%s' -o '%s' >/dev/null 2>&1",
             getenv("PROBE_BUILD_DIR") ? getenv("PROBE_BUILD_DIR") : "build", f, out);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cr_assert_eq(probe_file_open(out, &pf), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_find(pf, "/x/0000/out", &i0), PROBE_OK);
    cr_assert_str_eq(probe_file_tensor(pf, i0)->hash, "");
    cr_assert_str_eq(probe_file_tensor(pf, i0)->tree_hash, hex);
    probe_file_close(pf);
    char got[64];
    raw_attr(out, "/x/0000/out", "probe.tree_hash", got, sizeof got);
    cr_assert_str_eq(got, hex);
}
