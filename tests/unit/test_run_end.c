/* test_run_end.c - probe_run_end_record (probe/capture/run_end.c): the manifest key
 * "run_end" that probe-run records after the command exits, in each state a
 * run leaves its capture in (closed by its writer, left with its journal by
 * a killed writer, never written), and the refusals that leave a file as it
 * was (another process holds it, a journal of another capture, a file that
 * is not HDF5, a symbolic link, a manifest that is not an object). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "probe/capture.h"

#define TMPDIR_PREFIX "probe-runend"
#include "tmpdir_fixture.h"

TestSuite(run_end, .init = setup, .fini = teardown, .timeout = 60);

static void put(probe_writer *w, int i)
{
    char p[32];
    snprintf(p, sizeof p, "/t/%04d/out", i);
    float v[4] = {(float)i, 1.5f, -2.0f, 0.25f};
    int64_t shape[1] = {4};
    probe_record rec = {.path = p, .call = i, .step = -1, .cfg_branch = -1, .seq = (uint64_t)i,
                        .dtype = PROBE_DTYPE_FLOAT32, .rank = 1, .shape = shape};
    cr_assert_eq(probe_writer_put(w, &rec, v, sizeof v), PROBE_OK, "%s", probe_last_error());
}

/* A capture with n tensors and manifest m, closed by its writer. */
static void closed_capture(const char *path, int n, const char *m)
{
    probe_writer *w;
    cr_assert_eq(probe_writer_open(path, m, &w), PROBE_OK, "%s", probe_last_error());
    for (int i = 0; i < n; i++)
        put(w, i);
    cr_assert_eq(probe_writer_close(w), PROBE_OK, "%s", probe_last_error());
}

/* A capture whose writer was killed after n puts: written in a child that
 * ends without closing it, so its journal stays next to it. */
static void killed_capture(const char *path, int n, const char *m)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        probe_writer *w;
        if (probe_writer_open(path, m, &w) != PROBE_OK)
            _exit(1);
        for (int i = 0; i < n; i++)
            put(w, i);
        _exit(0);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char j[600];
    snprintf(j, sizeof j, "%s.journal", path);
    cr_assert_eq(access(j, F_OK), 0, "no journal after the kill");
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "%s: %s", path, strerror(errno));
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return b;
}

/* The file's manifest (read through the probe reader, journal or not),
 * parsed; its tensor count in *n. */
static json_t *manifest_of(const char *path, size_t *n)
{
    probe_file *f;
    cr_assert_eq(probe_file_open(path, &f), PROBE_OK, "%s", probe_last_error());
    *n = probe_file_count(f);
    const char *m = probe_file_manifest(f);
    cr_assert_not_null(m);
    json_t *j = json_loads(m, 0, NULL);
    cr_assert_not_null(j, "manifest is not JSON: %s", m);
    probe_file_close(f);
    return j;
}

static json_t *run_end_of(json_t *m)
{
    json_t *re = json_object_get(m, "run_end");
    cr_assert(json_is_object(re), "no run_end object");
    return re;
}

Test(run_end, closed_capture_exit_0_is_complete_and_keeps_the_manifest)
{
    char out[600];
    snprintf(out, sizeof out, "%s/a.h5", g_dir);
    const char *m0 = "{\"format\":\"probe-manifest\",\"x\":0.1,\"nested\":{\"k\":[1,2]}}";
    closed_capture(out, 3, m0);
    probe_run_end re = {0, 0};
    cr_assert_eq(probe_run_end_record(out, &re, NULL), PROBE_OK, "%s", probe_last_error());
    probe_file *f;
    cr_assert_eq(probe_file_open(out, &f), PROBE_OK, "%s", probe_last_error());
    cr_assert_eq(probe_file_count(f), 3);
    const char *m = probe_file_manifest(f);
    /* every byte of the writer's manifest is kept; run_end is appended */
    cr_assert(strncmp(m, m0, strlen(m0) - 1) == 0, "%s", m);
    cr_assert_not_null(strstr(m, ",\"run_end\":{\"exit_status\":0,\"signal\":null,\"capture\":"
                                 "\"closed\",\"capture_complete\":true,\"end_time\":\""), "%s", m);
    float got[4];
    cr_assert_eq(probe_file_read_raw(f, 2, got, sizeof got), PROBE_OK);
    cr_assert(got[0] == 2.0f && got[3] == 0.25f);
    probe_file_close(f);
    char j[700];
    snprintf(j, sizeof j, "%s.journal", out);
    cr_assert_eq(access(j, F_OK), -1, "recording created a journal");
}

Test(run_end, nonzero_exit_status_is_incomplete)
{
    char out[600];
    snprintf(out, sizeof out, "%s/b.h5", g_dir);
    closed_capture(out, 1, "{}");
    probe_run_end re = {3, 0};
    cr_assert_eq(probe_run_end_record(out, &re, NULL), PROBE_OK, "%s", probe_last_error());
    size_t n;
    json_t *m = manifest_of(out, &n);
    json_t *r = run_end_of(m);
    cr_assert_eq(json_integer_value(json_object_get(r, "exit_status")), 3);
    cr_assert(json_is_null(json_object_get(r, "signal")));
    cr_assert_str_eq(json_string_value(json_object_get(r, "capture")), "closed");
    cr_assert(json_is_false(json_object_get(r, "capture_complete")));
    cr_assert_eq(json_object_size(m), 1, "an empty manifest gets run_end only");
    json_decref(m);
}

Test(run_end, killed_writer_appends_to_the_journal_and_leaves_the_capture_alone)
{
    char out[600], j[700];
    snprintf(out, sizeof out, "%s/k.h5", g_dir);
    snprintf(j, sizeof j, "%s.journal", out);
    killed_capture(out, 4, "{\"label\":\"k\"}");
    size_t before_len, after_len;
    unsigned char *before = slurp(out, &before_len);
    probe_run_end re = {-1, SIGSEGV};
    cr_assert_eq(probe_run_end_record(out, &re, NULL), PROBE_OK, "%s", probe_last_error());
    unsigned char *after = slurp(out, &after_len);
    cr_assert(before_len == after_len && memcmp(before, after, before_len) == 0,
              "the capture file itself changed");
    free(before);
    free(after);
    cr_assert_eq(access(j, F_OK), 0, "the journal is still authoritative");
    size_t n;
    json_t *m = manifest_of(out, &n);
    cr_assert_eq(n, 4);
    cr_assert_str_eq(json_string_value(json_object_get(m, "label")), "k");
    json_t *r = run_end_of(m);
    cr_assert(json_is_null(json_object_get(r, "exit_status")));
    cr_assert_str_eq(json_string_value(json_object_get(r, "signal")), "SIGSEGV");
    cr_assert_str_eq(json_string_value(json_object_get(r, "capture")), "journal");
    cr_assert(json_is_false(json_object_get(r, "capture_complete")));
    json_decref(m);
}

Test(run_end, torn_last_journal_record_is_cut_first)
{
    char out[600], j[700];
    snprintf(out, sizeof out, "%s/t.h5", g_dir);
    snprintf(j, sizeof j, "%s.journal", out);
    killed_capture(out, 2, "{}");
    size_t jlen;
    unsigned char *jb = slurp(j, &jlen);
    /* a record cut short: its length says 200 bytes, 11 are there */
    FILE *fp = fopen(j, "ab");
    unsigned char torn[11] = {200, 0, 0, 0, 3, 0, 0, 0, 'x', 'y', 'z'};
    cr_assert_eq(fwrite(torn, 1, sizeof torn, fp), sizeof torn);
    fclose(fp);
    probe_run_end re = {-1, SIGKILL};
    cr_assert_eq(probe_run_end_record(out, &re, NULL), PROBE_OK, "%s", probe_last_error());
    size_t jlen2;
    unsigned char *jb2 = slurp(j, &jlen2);
    cr_assert(jlen2 > jlen && memcmp(jb, jb2, jlen) == 0, "the journal's complete records changed");
    free(jb);
    free(jb2);
    size_t n;
    json_t *m = manifest_of(out, &n);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(json_string_value(json_object_get(run_end_of(m), "signal")), "SIGKILL");
    json_decref(m);
}

Test(run_end, empty_file_becomes_a_capture_with_no_tensors)
{
    char out[600];
    snprintf(out, sizeof out, "%s/e.h5", g_dir);
    int fd = open(out, O_CREAT | O_WRONLY, 0644);
    cr_assert_geq(fd, 0);
    close(fd);
    probe_run_end re = {-1, SIGTERM};
    cr_assert_eq(probe_run_end_record(out, &re, "{\"command\":[\"x\",\"y\"]}"), PROBE_OK, "%s",
                 probe_last_error());
    size_t n;
    json_t *m = manifest_of(out, &n);
    cr_assert_eq(n, 0);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(m, "command"), 1)), "y");
    json_t *r = run_end_of(m);
    cr_assert_str_eq(json_string_value(json_object_get(r, "capture")), "not written");
    cr_assert_str_eq(json_string_value(json_object_get(r, "signal")), "SIGTERM");
    cr_assert(json_is_false(json_object_get(r, "capture_complete")));
    json_decref(m);
    char j[700];
    snprintf(j, sizeof j, "%s.journal", out);
    cr_assert_eq(access(j, F_OK), -1);
}

/* A refusal changes nothing: the bytes of the file (and of its journal). */
static void refused(const char *path, probe_status want, const char *text)
{
    size_t l0 = 0, l1 = 0;
    struct stat st;
    int exists = lstat(path, &st) == 0 && S_ISREG(st.st_mode);
    unsigned char *b0 = exists ? slurp(path, &l0) : NULL;
    probe_run_end re = {0, 0};
    probe_status s = probe_run_end_record(path, &re, NULL);
    cr_assert_eq(s, want, "status %d, want %d: %s", s, want, probe_last_error());
    cr_assert_not_null(strstr(probe_last_error(), text), "%s", probe_last_error());
    cr_assert_not_null(strstr(probe_last_error(), path), "%s", probe_last_error());
    if (exists) {
        unsigned char *b1 = slurp(path, &l1);
        cr_assert(l0 == l1 && memcmp(b0, b1, l0) == 0, "%s changed", path);
        free(b1);
    }
    free(b0);
}

Test(run_end, refusals_leave_the_file_as_it_was)
{
    char p[600];
    /* missing */
    snprintf(p, sizeof p, "%s/none.h5", g_dir);
    refused(p, PROBE_ENOTFOUND, "No such file");
    cr_assert_eq(access(p, F_OK), -1, "a missing file was created");
    /* not HDF5 */
    snprintf(p, sizeof p, "%s/text.h5", g_dir);
    FILE *fp = fopen(p, "w");
    fputs("not a capture\n", fp);
    fclose(fp);
    refused(p, PROBE_EFORMAT, "HDF5 cannot open it");
    /* a symbolic link to a capture */
    char target[600];
    snprintf(target, sizeof target, "%s/target.h5", g_dir);
    closed_capture(target, 1, "{}");
    snprintf(p, sizeof p, "%s/link.h5", g_dir);
    cr_assert_eq(symlink(target, p), 0);
    refused(p, PROBE_EIO, "symbolic link");
    size_t n;
    json_t *m = manifest_of(target, &n);
    cr_assert_null(json_object_get(m, "run_end"), "written through the link");
    json_decref(m);
    /* a manifest that is not a JSON object */
    snprintf(p, sizeof p, "%s/arr.h5", g_dir);
    closed_capture(p, 1, "[1, 2]");
    refused(p, PROBE_EFORMAT, "not a JSON object");
    /* a directory */
    snprintf(p, sizeof p, "%s/dir.h5", g_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    refused(p, PROBE_EINVAL, "not a regular file");
    /* NULL arguments */
    probe_run_end re = {0, 0};
    cr_assert_eq(probe_run_end_record(NULL, &re, NULL), PROBE_EINVAL);
    cr_assert_eq(probe_run_end_record(p, NULL, NULL), PROBE_EINVAL);
}

Test(run_end, journal_of_another_capture_is_refused)
{
    char a[600], b[600], ja[700], jb[700];
    snprintf(a, sizeof a, "%s/a.h5", g_dir);
    snprintf(b, sizeof b, "%s/b.h5", g_dir);
    snprintf(ja, sizeof ja, "%s.journal", a);
    snprintf(jb, sizeof jb, "%s.journal", b);
    killed_capture(a, 1, "{}");
    closed_capture(b, 1, "{}");
    cr_assert_eq(rename(ja, jb), 0);
    size_t l0, l1;
    unsigned char *j0 = slurp(jb, &l0);
    refused(b, PROBE_EFORMAT, "belongs to another capture file");
    unsigned char *j1 = slurp(jb, &l1);
    cr_assert(l0 == l1 && memcmp(j0, j1, l0) == 0, "the foreign journal changed");
    free(j0);
    free(j1);
}

Test(run_end, file_locked_by_another_process_is_left_alone)
{
    char out[600];
    snprintf(out, sizeof out, "%s/l.h5", g_dir);
    closed_capture(out, 1, "{}");
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out, O_RDONLY);
        char c = flock(fd, LOCK_EX) == 0 ? 'y' : 'n';
        if (write(pfd[1], &c, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char c = 0;
    cr_assert_eq(read(pfd[0], &c, 1), 1);
    cr_assert_eq(c, 'y');
    refused(out, PROBE_ESTATE, "another process of the run still writes it");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    probe_run_end re = {0, 0};
    cr_assert_eq(probe_run_end_record(out, &re, NULL), PROBE_OK, "once the lock is gone: %s",
                 probe_last_error());
}

Test(run_end, signal_names)
{
    char b[32];
    probe_run_end_signal_name(SIGSEGV, b, sizeof b);
    cr_assert_str_eq(b, "SIGSEGV");
    probe_run_end_signal_name(SIGKILL, b, sizeof b);
    cr_assert_str_eq(b, "SIGKILL");
    probe_run_end_signal_name(SIGRTMIN + 2, b, sizeof b);
    cr_assert_str_eq(b, "SIGRTMIN+2");
    probe_run_end_signal_name(200, b, sizeof b);
    cr_assert_str_eq(b, "SIG200");
}
