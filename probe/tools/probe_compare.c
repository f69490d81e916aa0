/* probe-compare: compare a reference capture (feature off) with a candidate
 * capture (feature on). CLI, exit codes and JSON: docs/compare-json.md.
 *   exit 0  every matched tensor passes the gate and nothing is missing
 *   exit 1  a gate failed, a tensor is missing, nothing was compared, a capture is
 *           incomplete (its run_end), or the candidate equals the reference
 *           (feature not active; --expect-identical turns that into the pass and
 *           any difference into the failure)
 *   exit 2  bad arguments, or a file that cannot be opened/read
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "../../metrics/vocab/textsafe.h"
#include "../compare/engine.h"
#include "../compare/weight_check.h"
#include "../report/text.h"
#include "probe/compare.h"
#include "probe/components.h"
#include "probe/kernels.h"
#include "probe/rankset.h"
#include "probe/calibration_file.h"

#define MAX_ONLY 64
#define MAX_ALLOW 64
#define MAX_EXPECT_KERNEL 64

static void usage(FILE *f)
{
    fprintf(f,
            "usage: probe-compare [options] REF.h5 CAND.h5 [CAND.h5...]\n"
            "Compare a reference capture (feature off) with a candidate (feature on).\n"
            "Several CAND files (or one index file of a per-rank run) are one candidate made\n"
            "of per-rank files (docs/nccl.md \"Comparing rank sets\").\n\n"
            "  --gate G            T1 (default), T1-relaxed:CAUSE, or T2 (needs --calibration)\n"
            "                      CAUSE: reduction-reordering, backend-swap, compile-fusion,\n"
            "                      parallel-partial-sum\n"
            "  --calibration FILE  T2 thresholds (docs/calibration.md)\n"
            "  --atol X --rtol X   element-wise tolerance |c-r| <= atol + rtol*|r| (override)\n"
            "  --only GLOB         compare only dataset paths matching GLOB (repeatable)\n"
            "  --json FILE         write the result as JSON (docs/compare-json.md, version 1);\n"
            "                      '-' for stdout\n"
            "  --html FILE         write a self-contained HTML report\n"
            "  --junit FILE        write JUnit XML, one test case per tensor; '-' for stdout\n"
            "  --channel-axis N    axis of the per-channel mean shift for every tensor (negative\n"
            "                      counts from the last); default: the component table's, else\n"
            "                      1 for rank 4/5 and the last axis for rank 2/3\n"
            "  --threads N         metric worker threads, 1..16 (default: the online CPUs, at most 8)\n"
            "  --device D          cpu (default), cuda or cuda:N: compute the metrics on a GPU\n"
            "  --allow-root-diff GLOB\n"
            "                      the root inputs (initial latents, timesteps, prompt\n"
            "                      embeddings, scheduler configuration) whose path or\n"
            "                      component matches GLOB may differ (the feature changes\n"
            "                      them); any other difference is \"not the same experiment\"\n"
            "                      (exit 1); repeatable\n"
            "  --isolated ISO.h5   the candidate run again under probe-run --replay REF.h5:\n"
            "                      report per tensor the error as run, in isolation, and\n"
            "                      their ratio (amplification)\n"
            "  --oracle ORACLE.h5  the reference's experiment run in higher precision (its\n"
            "                      weights and root inputs, e.g. float32 for a bfloat16\n"
            "                      reference): the verdict becomes \"no less accurate than the\n"
            "                      reference\": per tensor the error of each side against the\n"
            "                      oracle, their ratio, and no added systematic error\n"
            "                      (docs/gates.md); the gate is still reported beside it\n"
            "  --oracle-headroom R the candidate's error against the oracle may be R times\n"
            "                      the reference's (default 1.05; 1 to 1e6), or 1 + 4/sqrt(n)\n"
            "                      times on a tensor of n elements when that is more\n"
            "  --allow-weight-diff compare even when the runs' weight fingerprints say they\n"
            "                      loaded different weights (docs/gemm.md); default: exit 2\n"
            "  --expect-identical  the pair must be bit-identical (determinism floor, reference\n"
            "                      vs reference); without it a candidate identical to the\n"
            "                      reference everywhere fails as \"feature not active\"\n"
            "  --expect-kernel [COMPONENT:]GLOB\n"
            "                      the feature is active only if the candidate launched a\n"
            "                      kernel whose (demangled) name matches GLOB (inside\n"
            "                      COMPONENT's scopes when given); repeatable, each must\n"
            "                      match (docs/kernels.md)\n"
            "  --kernels           list every kernel only one run launched (default: a few\n"
            "                      per component)\n"
            "  --reference-rank FILE\n"
            "                      a per-rank file of the reference (repeatable; then every\n"
            "                      positional file is a candidate file)\n"
            "  --quiet             print only the verdict: the first failure, where it was introduced\n"
            "                      and the final PASS/FAIL line (no table, no progress)\n"
            "  --help (-h), --version\n\n"
            "exit status: 0 all pass, 1 a gate failed, a tensor is missing, nothing was\n"
            "compared, the feature was not active, the runs are not the same experiment, an\n"
            "injection failed or a capture is incomplete, 2 bad arguments or an unreadable file\n"
            "On a terminal, progress (tensors and bytes done) is shown on stderr.\n");
}

static int parse_tol(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    /* decimal only: strtod would also take hexadecimal (0x10), inf and nan */
    double v = s[strspn(s, "0123456789.eE+-")] == 0 ? strtod(s, &end) : (end = (char *)s, 0);
    if (errno || end == s || *end || !isfinite(v) || v < 0) {
        fprintf(stderr, "probe-compare: %s '%s': not a finite non-negative decimal number\n", opt,
                probe_tesc(s));
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "probe-compare: %s '%s': not an integer in [%d, %d]\n", opt, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static char *file_manifest(const char *path);


/* The per-process files of a run (docs/probe-run.md "Processes and threads"),
 * as names (<stem>.<NAME><ext> of the run's file: NAME) and paths next to
 * main: those its manifest lists ("processes"), and those next to it whose
 * manifest names it as their main file ("process": {"main"}), written after
 * the run's file was closed. */
struct proc_file {
    char name[128];
    char path[PATH_MAX];
};

static int cmp_proc_file(const void *a, const void *b)
{
    return strverscmp(((const struct proc_file *)a)->name, ((const struct proc_file *)b)->name);
}

static size_t proc_files(const char *manifest, const char *main, struct proc_file **out)
{
    *out = NULL;
    json_t *m = manifest ? json_loads(manifest, 0, NULL) : NULL;
    json_t *p = m ? json_object_get(m, "processes") : NULL;
    size_t n = json_is_array(p) ? json_array_size(p) : 0, k = 0;
    struct proc_file *v = n ? calloc(n, sizeof *v) : NULL;
    const char *slash = strrchr(main, '/'), *base = slash ? slash + 1 : main;
    const char *dot = strrchr(base, '.');
    size_t stem = dot && dot != base ? (size_t)(dot - base) : strlen(base);
    const char *ext = base + stem;
    for (size_t i = 0; v && i < n; ++i) {
        const char *e = json_string_value(json_array_get(p, i));
        if (!e || !*e || strchr(e, '/') || strlen(e) >= sizeof v[k].name)
            continue;
        size_t len = strlen(e), el = strlen(ext);
        if (len > stem + 1 + el && strncmp(e, base, stem) == 0 && e[stem] == '.' &&
            strcmp(e + len - el, ext) == 0)
            snprintf(v[k].name, sizeof v[k].name, "%.*s", (int)(len - stem - 1 - el), e + stem + 1);
        else
            snprintf(v[k].name, sizeof v[k].name, "%s", e);
        snprintf(v[k].path, sizeof v[k].path, "%.*s%s", slash ? (int)(slash - main) + 1 : 0, main, e);
        ++k;
    }
    json_decref(m);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - main) + 1 : 1, slash ? main : ".");
    DIR *dd = opendir(dir);
    struct dirent *de;
    while (dd && (de = readdir(dd))) {
        const char *e = de->d_name;
        size_t len = strlen(e), el = strlen(ext);
        if (len <= stem + 5 + el || strncmp(e, base, stem) != 0 || strncmp(e + stem, ".proc", 5) != 0 ||
            strcmp(e + len - el, ext) != 0 || len - stem - 1 - el >= sizeof v[0].name)
            continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(len - stem - 1 - el), e + stem + 1);
        int seen = 0;
        for (size_t i = 0; i < k && !seen; ++i)
            seen = strcmp(v[i].name, name) == 0;
        char path[PATH_MAX];
        if (seen || (size_t)snprintf(path, sizeof path, "%.*s%s", slash ? (int)(slash - main) + 1 : 0,
                                     main, e) >= sizeof path)
            continue;
        char *pm = file_manifest(path);
        json_t *j = pm ? json_loads(pm, 0, NULL) : NULL;
        const char *mb = json_string_value(json_object_get(json_object_get(j, "process"), "main"));
        int mine = mb && strcmp(mb, base) == 0;
        json_decref(j);
        free(pm);
        if (!mine)
            continue;
        struct proc_file *nv = realloc(v, (k + 1) * sizeof *nv);
        if (!nv)
            break;
        v = nv;
        snprintf(v[k].name, sizeof v[k].name, "%s", name);
        snprintf(v[k].path, sizeof v[k].path, "%s", path);
        ++k;
    }
    if (dd)
        closedir(dd);
    if (k > 1)
        qsort(v, k, sizeof *v, cmp_proc_file);
    *out = v;
    return k;
}

/* Compare the per-process files the two runs wrote (docs/probe-run.md
 * "Processes and threads"), paired by name: one line each. A pair fails when a
 * tensor fails its gate or is missing on one side (identical workers pass: the
 * feature is judged on the run's own files); a file without a counterpart
 * fails. Returns 1 when something failed, 2 when a file cannot be read, else 0. */
static int compare_procs(FILE *out, const probe_compare_result *r, const char *ref, const char *cand,
                         const probe_compare_opts *opts, int quiet)
{
    struct proc_file *f[2];
    size_t n[2] = {proc_files(r->manifest_reference, ref, &f[0]),
                   proc_files(r->manifest_candidate, cand, &f[1])};
    int rc = 0;
    probe_compare_opts o = *opts;
    o.isolated = NULL;
    o.oracle = NULL;
    o.check_roots = 0;
    o.progress = NULL;
    for (int k = 0; k < 2; ++k)
        for (size_t i = 0; i < n[k]; ++i) {
            size_t j = 0;
            while (j < n[!k] && strcmp(f[k][i].name, f[!k][j].name) != 0)
                ++j;
            if (j < n[!k]) {
                if (k == 1)
                    continue; /* compared from the reference's side */
                probe_compare_result *pr = NULL;
                if (probe_compare_files(f[0][i].path, f[1][j].path, &o, &pr) != PROBE_OK) {
                    fprintf(stderr, "probe-compare: per-process file %s: %s\n", f[0][i].name,
                            probe_last_error());
                    rc = 2;
                    continue;
                }
                size_t nfail = 0;
                for (size_t t = 0; t < pr->ntensors; ++t)
                    nfail += !pr->tensors[t].verdict.pass;
                int ok = !nfail && !pr->nmissing_cand && !pr->nmissing_ref && !pr->nothing_compared &&
                         (!pr->expect_identical || pr->pass);
                if (!quiet)
                    fprintf(out, "processes: %s (%s vs %s): %s: %zu tensors compared, %zu fail, %zu "
                                 "missing in candidate, %zu missing in reference\n",
                            f[0][i].name, f[0][i].path, f[1][j].path, ok ? "PASS" : "FAIL",
                            pr->ntensors, nfail, pr->nmissing_cand, pr->nmissing_ref);
                if (!ok && rc == 0)
                    rc = 1;
                probe_compare_result_free(pr);
                continue;
            }
            if (!quiet)
                fprintf(out, "processes: %s (%s): FAIL: only the %s's run wrote this per-process "
                             "file\n", f[k][i].name, f[k][i].path, k ? "candidate" : "reference");
            if (rc == 0)
                rc = 1;
        }
    if (rc == 1 && r->pass && !quiet)
        fprintf(out, "FAIL: the run's own files pass, but a per-process file fails or has no "
                     "counterpart (processes: above)\n");
    free(f[0]);
    free(f[1]);
    return rc;
}


/* --- crash containment (docs/hardening.md) ---
 * libhdf5 itself is not safe on hostile files: fuzzing found crafted files
 * on which HDF5 1.10.8 reads out of bounds or frees a wild pointer while
 * decoding object headers. The files are therefore read in a child process:
 * the child does the whole comparison and every output and reports its exit
 * status through a pipe just before it ends; when it ends without doing so
 * (a signal, or a sanitizer's report), the parent names the file that crashes
 * (another child reads each file alone: reference, candidate, --isolated) and
 * exits 2, as for any unreadable file. PROBE_COMPARE_NO_FORK=1 runs everything
 * in one process (debuggers). */

/* Read every tensor of `path` in bounded chunks; 0 if that ends normally. */
static int read_all(const char *path)
{
    probe_file *f = NULL;
    if (probe_file_open(path, &f) != PROBE_OK)
        return 0;
    static unsigned char buf[1 << 16];
    for (size_t i = 0; i < probe_file_count(f); i++) {
        const probe_tensor_info *t = probe_file_tensor(f, i);
        size_t chunk = sizeof buf / probe_dtype_size(t->dtype);
        for (uint64_t off = 0; off < t->n; off += chunk)
            if (probe_file_read_range(f, i, off, t->n - off < chunk ? (size_t)(t->n - off) : chunk,
                                      buf) != PROBE_OK)
                break;
    }
    probe_file_close(f);
    return 0;
}

/* 1 if reading `path` alone kills the process that reads it. */
static int crashes_alone(const char *path)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) { /* the first crash already printed what it had to */
            dup2(devnull, STDOUT_FILENO);
            dup2(devnull, STDERR_FILENO);
        }
        read_all(path);
        _exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Fork: returns in the child (with *report_fd the pipe to report through)
 * or, in the parent, exits with the child's status when it reported one, or
 * with 2 and a one-line message when it crashed. Returns -1 in the parent
 * when no child could be started (then the caller works in this process). */
static int contain(const char *ref, const char *cand, const char *iso, const char *oracle,
                   int *report_fd)
{
    *report_fd = -1;
    const char *nofork = getenv("PROBE_COMPARE_NO_FORK");
    if (nofork && strcmp(nofork, "1") == 0)
        return -1;
    int p[2];
    if (pipe(p) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        *report_fd = p[1];
        return 0;
    }
    close(p[1]);
    unsigned char rc = 0;
    ssize_t k;
    while ((k = read(p[0], &rc, 1)) < 0 && errno == EINTR)
        ;
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (k == 1 && WIFEXITED(st))
        exit(WEXITSTATUS(st));
    if (WIFSIGNALED(st) && (WTERMSIG(st) == SIGINT || WTERMSIG(st) == SIGTERM ||
                            WTERMSIG(st) == SIGHUP || WTERMSIG(st) == SIGPIPE)) {
        signal(WTERMSIG(st), SIG_DFL);
        raise(WTERMSIG(st)); /* interrupted, not a crash: end the same way */
    }
    char how[64];
    if (WIFSIGNALED(st))
        snprintf(how, sizeof how, "signal %d, %s", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(how, sizeof how, "exit status %d before finishing", WEXITSTATUS(st));
    const char *files[4] = {ref, cand, iso, oracle}, *who = NULL;
    int ncrash = 0;
    for (int i = 0; i < 4; i++)
        if (files[i] && crashes_alone(files[i])) {
            who = files[i];
            ncrash++;
        }
    if (ncrash == 1)
        fprintf(stderr, "probe-compare: %s: corrupt HDF5 file: reading it crashed the HDF5 library "
                        "(libhdf5 %s; %s)\n", probe_tesc(who), probe_file_hdf5_version(), how);
    else
        fprintf(stderr, "probe-compare: %s, %s%s%s%s%s: reading them crashed (libhdf5 %s; %s); a "
                        "corrupt HDF5 file?\n", probe_tesc(ref), probe_tesc(cand), iso ? ", " : "",
                iso ? probe_tesc(iso) : "", oracle ? ", " : "", oracle ? probe_tesc(oracle) : "",
                probe_file_hdf5_version(), how);
    exit(2);
}

/* The child's report: its exit status, just before it ends. */
static int report(int fd, int rc)
{
    if (fd >= 0) {
        fflush(NULL);
        unsigned char b = (unsigned char)rc;
        if (write(fd, &b, 1) != 1) { /* the parent is gone: nothing to tell */
        }
        close(fd);
        /* Everything is written: end here. After a corrupt file HDF5 may hold
         * objects it cannot close, and its exit handler would then print
         * "infinite loop closing library" (a hostile file that still opens
         * leaves a result and exit 1 behind it). */
        _exit(rc);
    }
    return rc;
}

/* 1 if a and b name the same existing file (same device and inode). */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* Progress on a terminal: one line on stderr, rewritten in place at most
 * every 100 ms, cleared when the comparison ends. */
typedef struct progress_state {
    double last;
    int shown;
} progress_state;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void show_progress(void *ctx, size_t done, size_t total, uint64_t bytes_done,
                          uint64_t bytes_total)
{
    progress_state *p = ctx;
    double t = now_s();
    if (p->shown && done < total && t - p->last < 0.1)
        return;
    p->last = t;
    p->shown = 1;
    fprintf(stderr, "\rprobe-compare: %zu/%zu tensors, %.1f/%.1f MiB\033[K", done, total,
            (double)bytes_done / 1048576.0, (double)bytes_total / 1048576.0);
    fflush(stderr);
}

/* --- captures recovered from their journal (docs/file-format.md "Journal") --- */

/* The recovery state of the reference [0] and candidate [1], as JSON for
 * the "recovered" key: null for a file its writer closed, else {"journal",
 * "complete", "partial" (path or null), "reason"}. */
static json_t *recovered_json[2];

/* For each input that has a journal next to it (its writer was killed):
 * one line on stderr, and its entry for the JSON, from the file as the
 * compare opened it (sets[k]; opened here only when it is not one of the
 * set's files: an index). */
static void note_recovered(const char *const paths[2], probe_rankset *const sets[2]);

/* Tensors each input tapped and never wrote, as JSON for the "lost" key:
 * null when none, else {"count", "refused", "first", "reason", "source"}:
 * source "manifest" for the manifest key "lost" the shim writes after a
 * write error disabled capture (a closed file), "journal" for the TAPPED
 * records of a killed run (recovered_json's "lost"). */
static json_t *lost_json[2];

#define JOURNAL_LOST_REASON "lost: tapped, but the process ended before the writer wrote it"

static const char *first_skip(const probe_compare_result *r, const char *side, const char *prefix)
{
    for (size_t i = 0; i < r->nskipped; i++)
        if (strcmp(r->skipped[i].side, side) == 0 && strncmp(r->skipped[i].reason, prefix, strlen(prefix)) == 0)
            return r->skipped[i].path;
    return NULL;
}

/* One stderr line per input that lost tensors, and lost_json. */
static void note_lost(const char *const paths[2], const probe_compare_result *r)
{
    const char *man[2] = {r->manifest_reference, r->manifest_candidate};
    const char *side[2] = {"reference", "candidate"};
    for (int k = 0; k < 2; k++) {
        lost_json[k] = json_null();
        json_t *m = man[k] ? json_loads(man[k], 0, NULL) : NULL;
        json_t *l = json_object_get(m, "lost");
        json_t *c = json_object_get(l, "count");
        json_int_t n = json_is_integer(c) ? json_integer_value(c) : 0;
        json_t *mr = json_object_get(m, "recovered");
        if ((!recovered_json[k] || json_is_null(recovered_json[k])) && json_is_object(mr)) {
            /* rewritten by probe-recover: the manifest keeps what it recovered */
            json_t *jn = json_object_get(mr, "journal"), *cc = json_object_get(mr, "complete");
            json_t *ll = json_object_get(mr, "lost");
            fprintf(stderr, "probe-compare: %s was rewritten by probe-recover from %s (its writer did "
                    "not close it): %lld complete captures", probe_tesc(paths[k]),
                    json_is_string(jn) ? probe_tesc(json_string_value(jn)) : "its journal",
                    json_is_integer(cc) ? (long long)json_integer_value(cc) : 0LL);
            if (json_is_integer(ll) && json_integer_value(ll) > 0)
                fprintf(stderr, "; %lld tapped tensor%s lost (listed as skipped)",
                        (long long)json_integer_value(ll), json_integer_value(ll) == 1 ? "" : "s");
            fputc('\n', stderr);
            json_decref(recovered_json[k]);
            recovered_json[k] = json_deep_copy(mr);
        }
        json_t *rj = recovered_json[k];
        json_t *jl = rj && json_is_object(rj) ? json_object_get(rj, "lost") : NULL;
        json_int_t nj = json_is_integer(jl) ? json_integer_value(jl) : 0;
        json_t *o = NULL;
        if (n > 0) {
            const char *why = json_string_value(json_object_get(l, "reason"));
            const char *first = json_string_value(json_object_get(l, "first"));
            json_t *ref = json_object_get(l, "refused");
            fprintf(stderr, "probe-compare: %s lost %lld tapped tensor%s that were never written "
                    "(%s; first %s; listed as skipped)\n", probe_tesc(paths[k]), (long long)n,
                    n == 1 ? "" : "s", why ? probe_tesc(why) : "a write error",
                    first ? probe_tesc(first) : "unknown");
            o = json_pack("{s:I, s:I, s:o, s:s, s:s}", "count", n, "refused",
                          json_is_integer(ref) ? json_integer_value(ref) : (json_int_t)0, "first",
                          first ? json_string(first) : json_null(), "reason", why ? why : "",
                          "source", "manifest");
        } else if (nj > 0) {
            const char *first = first_skip(r, side[k], JOURNAL_LOST_REASON);
            o = json_pack("{s:I, s:I, s:o, s:s, s:s}", "count", nj, "refused", (json_int_t)0,
                          "first", first ? json_string(first) : json_null(), "reason",
                          JOURNAL_LOST_REASON + strlen("lost: "), "source", "journal");
        }
        if (o) {
            json_decref(lost_json[k]);
            lost_json[k] = o;
        }
        json_decref(m);
    }
}

/* The file of set whose path is path, or NULL. */
static probe_file *set_file(probe_rankset *set, const char *path)
{
    int n = probe_rankset_world(set);
    for (int r = 0; r < (n ? n : 1); r++)
        if (strcmp(probe_rankset_file_path(set, r), path) == 0)
            return probe_rankset_file(set, r);
    return NULL;
}

static void note_recovered(const char *const paths[2], probe_rankset *const sets[2])
{
    for (int k = 0; k < 2; k++) {
        recovered_json[k] = json_null();
        char *j = malloc(strlen(paths[k]) + sizeof ".journal");
        if (j == NULL)
            continue;
        sprintf(j, "%s.journal", paths[k]);
        probe_file *f = NULL, *opened = NULL;
        if (access(j, F_OK) == 0 &&
            ((f = set_file(sets[k], paths[k])) ||
             (probe_file_open(paths[k], &opened) == PROBE_OK && (f = opened)))) {
            const probe_recovery_info *ri = probe_file_recovery(f);
            if (ri->recovered) {
                fprintf(stderr, "probe-compare: %s was not closed by its writer (process killed?): "
                        "%zu complete captures read from %s%s%s%s", probe_tesc(paths[k]),
                        ri->complete, probe_tesc(ri->journal),
                        ri->partial[0] ? "; partial capture " : "", probe_tesc(ri->partial),
                        ri->partial[0] ? " ignored" : "");
                if (ri->lost)
                    fprintf(stderr, "; %zu tapped tensor%s lost (listed as skipped)", ri->lost,
                            ri->lost == 1 ? "" : "s");
                fputc('\n', stderr);
                json_decref(recovered_json[k]);
                recovered_json[k] = json_pack("{s:s, s:I, s:o, s:s, s:I}", "journal", ri->journal,
                                              "complete", (json_int_t)ri->complete, "partial",
                                              ri->partial[0] ? json_string(ri->partial) : json_null(),
                                              "reason", ri->reason, "lost", (json_int_t)ri->lost);
                if (recovered_json[k] == NULL)
                    recovered_json[k] = json_null();
            }
            probe_file_close(opened);
        }
        free(j);
    }
}

/* The runs' weight fingerprints side by side (probe/compare/weight_check.h): the JSON
 * object for the key "weights", or NULL when neither run has fingerprints. */
static char *weights_json;

/* The manifest of the capture file at path (malloc'd), or NULL when the file
 * cannot be read or has none. */
static char *file_manifest(const char *path)
{
    probe_file *f = NULL;
    if (probe_file_open(path, &f) != PROBE_OK)
        return NULL;
    const char *m = probe_file_manifest(f);
    char *copy = m ? strdup(m) : NULL;
    probe_file_close(f);
    return copy;
}

/* The manifest of a side given as files (one file, an index, or per-rank files): rank 0's
 * file's for a rank set rs (the index itself records no weights), else the file's; NULL when
 * it cannot be read (the compare then reports why). rs is NULL when the side could not be
 * opened as a rank set: then a single file is read alone (an index whose rank files fail). */
static char *side_manifest(probe_rankset *rs, const char *const *paths, size_t n)
{
    if (!rs)
        return n == 1 ? file_manifest(paths[0]) : NULL;
    const char *m = probe_file_manifest(probe_rankset_file(rs, 0));
    return m ? strdup(m) : NULL;
}

/* --- kernel-path evidence (docs/kernels.md) --- */

/* The kernel logs side by side and the --expect-kernel results; NULL diff
 * when neither run has a kernel log and nothing was expected. */
static probe_kernel_diff *kdiff;
static json_t *kernels_json, *expect_json;

static json_t *counts_json(const probe_kernel_count *v, size_t n)
{
    json_t *o = json_object();
    for (size_t i = 0; o && i < n; i++)
        json_object_set_new(o, v[i].name, json_integer((json_int_t)v[i].count));
    return o;
}

/* "kernels": {COMPONENT: {"only_candidate": {NAME: COUNT}, "only_reference": {...}}},
 * or null when a run has no kernel log. */
static json_t *diff_json(const probe_kernel_diff *d)
{
    if (!d->have_reference || !d->have_candidate)
        return json_null();
    json_t *o = json_object();
    for (size_t i = 0; o && i < d->ncomponents; i++) {
        const probe_kernel_component *c = &d->components[i];
        json_object_set_new(o, c->component,
                            json_pack("{s:o, s:o}", "only_candidate",
                                      counts_json(c->only_candidate, c->nonly_candidate),
                                      "only_reference",
                                      counts_json(c->only_reference, c->nonly_reference)));
    }
    return o;
}

/* Compare the kernel logs and apply --expect-kernel to res. Returns 0, or
 * 2 after one line on stderr (a manifest whose "kernels" cannot be read, or
 * expectations and no kernel log in the candidate). */
static int check_kernels(probe_compare_result *res, const char *const *expect, size_t nexpect)
{
    if (probe_kernel_diff_compute(res->manifest_reference, res->manifest_candidate, &kdiff) !=
        PROBE_OK) {
        /* a manifest key "kernels" of another shape: an error only when asked to use it */
        fprintf(stderr, "probe-compare: %skernel log: %s\n", nexpect ? "" : "note: ignoring the ",
                probe_tesc(probe_last_error()));
        return nexpect ? 2 : 0;
    }
    if (kdiff->have_reference || kdiff->have_candidate)
        kernels_json = diff_json(kdiff);
    if (!nexpect)
        return 0;
    if (!kdiff->have_candidate) {
        fprintf(stderr, "probe-compare: %s: --expect-kernel needs the candidate's kernel log, and "
                        "its manifest has none (run it under probe-run without PROBE_KERNELS=0)\n",
                probe_tesc(res->candidate));
        return 2;
    }
    expect_json = json_array();
    for (size_t i = 0; i < nexpect; i++) {
        size_t matched = 0;
        char first[512];
        if (probe_kernel_expect(res->manifest_candidate, expect[i], &matched, first,
                                sizeof first) != PROBE_OK) {
            fprintf(stderr, "probe-compare: --expect-kernel: %s\n", probe_tesc(probe_last_error()));
            return 2;
        }
        json_array_append_new(expect_json,
                              json_pack("{s:s, s:b, s:I, s:o}", "expect", expect[i], "matched",
                                        matched > 0, "kernels", (json_int_t)matched, "first",
                                        matched ? json_string(first) : json_null()));
        if (!matched) {
            res->feature_active = 0;
            res->feature_not_active = 1;
            res->pass = 0;
            if (res->nreasons < PROBE_COMPARE_MAX_REASONS) {
                snprintf(res->reasons[res->nreasons], sizeof res->reasons[0],
                         "feature not active: the candidate launched no kernel matching "
                         "--expect-kernel '%s'", expect[i]);
                res->nreasons++;
            }
        }
    }
    return 0;
}

/* The compare JSON (html 0) or HTML report (html 1) with the key
 * "recovered" added first in the result object (in the HTML: in its inline
 * probe-data JSON, so that it stays equal to --json), the rest byte for
 * byte as the library wrote it. Only when an input was recovered: otherwise
 * the output is exactly the library's. */
static probe_status write_with_recovered(const probe_compare_result *r, FILE *out, int html)
{
    int any = (recovered_json[0] && !json_is_null(recovered_json[0])) ||
              (recovered_json[1] && !json_is_null(recovered_json[1]));
    int anylost = (lost_json[0] && !json_is_null(lost_json[0])) ||
                  (lost_json[1] && !json_is_null(lost_json[1]));
    if (!any && !anylost && !weights_json && !kernels_json && !expect_json)
        return html ? probe_compare_write_html(r, out) : probe_compare_write_json(r, out);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (m == NULL)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    probe_status s = html ? probe_compare_write_html(r, m) : probe_compare_write_json(r, m);
    fclose(m);
    /* the keys added in front: "recovered" (an input was recovered), then
     * "kernels" and "expect_kernel" (docs/kernels.md) when present */
    json_t *o = any ? json_pack("{s:O, s:O}", "reference",
                                recovered_json[0] ? recovered_json[0] : json_null(), "candidate",
                                recovered_json[1] ? recovered_json[1] : json_null())
                    : NULL;
    json_t *lo = anylost ? json_pack("{s:O, s:O}", "reference",
                                     lost_json[0] ? lost_json[0] : json_null(), "candidate",
                                     lost_json[1] ? lost_json[1] : json_null())
                         : NULL;
    char *frag = NULL;
    size_t fraglen = 0;
    FILE *fm = open_memstream(&frag, &fraglen);
    int fok = fm != NULL;
    const char *fkeys[4] = {"recovered", "lost", "kernels", "expect_kernel"};
    json_t *fvals[4] = {o, lo, kernels_json, expect_json};
    for (int i = 0, n = 0; fok && i < 4; i++) {
        if (!fvals[i])
            continue;
        char *v = json_dumps(fvals[i], JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        fok = v != NULL && fprintf(fm, "%s\"%s\": %s", n++ ? ", " : "", fkeys[i], v) > 0;
        free(v);
    }
    if (fm && fclose(fm) != 0)
        fok = 0;
    if (!fok) {
        free(frag);
        frag = NULL;
    }
    json_decref(o);
    json_decref(lo);
    const char *marker = html ? "id=\"probe-data\">" : "";
    char *at = s == PROBE_OK && text != NULL ? strstr(text, marker) : NULL;
    char *brace = at != NULL ? strchr(at, '{') : NULL;
    if (s == PROBE_OK && (brace == NULL || ((any || anylost) && frag == NULL))) {
        s = probe_set_error(PROBE_ENOMEM, "out of memory");
    } else if (s == PROBE_OK) {
        size_t head = (size_t)(brace - text) + 1;
        int ok = fwrite(text, 1, head, out) == head;
        const char *keys[2] = {"", "\"weights\": "};
        const char *vals[2] = {frag && *frag ? frag : NULL, weights_json};
        for (int k = 0; k < 2; k++) {
            if (!vals[k])
                continue;
            ok = ok && fputs(keys[k], out) != EOF;
            for (const char *p = vals[k]; ok && *p; p++) /* "</" would end an HTML script element */
                ok = (p[0] == '<' && p[1] == '/' ? fputs("<\\", out) : fputc(*p, out)) != EOF;
            ok = ok && fputs(html ? "," : ", ", out) != EOF;
        }
        ok = ok && fwrite(text + head, 1, len - head, out) == len - head;
        if (!ok)
            s = probe_set_error(PROBE_EIO, "%s", strerror(errno));
    }
    free(frag);
    free(text);
    return s;
}

static int write_to(const char *path, const probe_compare_result *r, int html)
{
    probe_outfile o;
    if (probe_outfile_open(&o, path) != 0) {
        fprintf(stderr, "probe-compare: %s\n", o.err);
        return -1;
    }
    probe_status s = html == 2   ? probe_compare_write_junit(r, o.f)
                                 : write_with_recovered(r, o.f, html);
    if (s != PROBE_OK) {
        int kept = o.tmp != NULL;
        probe_outfile_abort(&o);
        fprintf(stderr, "probe-compare: cannot write %s: %s%s\n", probe_tesc(path),
                probe_tesc(probe_tesc(probe_last_error())), kept ? " (the file is unchanged)" : "");
        return -1;
    }
    if (probe_outfile_commit(&o) != 0) {
        fprintf(stderr, "probe-compare: %s\n", o.err);
        return -1;
    }
    return 0;
}

/* --- the tool: options, inputs, run, output --- */

/* The command line, parsed. */
typedef struct cli {
    const char *gate_spec, *cal_path, *json_path, *html_path, *junit_path;
    const char *only[MAX_ONLY + 1];
    size_t nonly;
    const char *allow[MAX_ALLOW + 1];
    size_t nallow;
    const char *iso_path, *oracle_path;
    const char *expect_kernel[MAX_EXPECT_KERNEL + 1];
    size_t nexpect_kernel;
    int all_kernels;
    const char *ref_ranks[PROBE_RANKSET_MAX];
    size_t nref_ranks;
    int quiet, allow_weight_diff;
    /* the reference: --reference-rank files, else the first file; then the candidate's */
    const char *const *refs;
    size_t nrefs;
    const char *const *cands;
    size_t ncands;
    probe_compare_opts opts;
} cli;

/* What main holds and frees once, on its one way out. */
typedef struct run_state {
    probe_calibration *cal;
    char **roots;
    char **axis_names;
    int *axis_values, *axis_ranks;
    probe_class_axis *class_axes;
    size_t n_class_axes;
    progress_state prog;
    probe_rankset *sets[2]; /* the reference and candidate, each opened once */
    probe_weights_verdict wv;
    int have_wv;
    probe_compare_result *res;
} run_state;

static void run_state_free(run_state *st)
{
    probe_compare_result_free(st->res);
    if (st->have_wv)
        probe_weights_verdict_free(&st->wv);
    probe_rankset_close(st->sets[0]);
    probe_rankset_close(st->sets[1]);
    probe_component_names_free(st->roots);
    probe_calibration_free(st->cal);
    probe_component_names_free(st->axis_names);
    free(st->axis_values);
    free(st->axis_ranks);
    probe_component_class_axes_free(st->class_axes, st->n_class_axes);
    json_decref(recovered_json[0]);
    json_decref(recovered_json[1]);
    json_decref(lost_json[0]);
    json_decref(lost_json[1]);
    free(weights_json);
    probe_kernel_diff_free(kdiff);
    json_decref(kernels_json);
    json_decref(expect_json);
}

enum { OPT_GATE = 256, OPT_CAL, OPT_ATOL, OPT_RTOL, OPT_ONLY, OPT_JSON, OPT_HTML, OPT_QUIET,
       OPT_HELP, OPT_VERSION, OPT_JUNIT, OPT_EXPECT_IDENTICAL, OPT_CHANNEL_AXIS, OPT_THREADS,
       OPT_DEVICE, OPT_ALLOW_ROOT_DIFF, OPT_ISOLATED, OPT_ALLOW_WEIGHT_DIFF, OPT_EXPECT_KERNEL,
       OPT_KERNELS, OPT_REFERENCE_RANK, OPT_ORACLE, OPT_ORACLE_HEADROOM };

/* A GLOB option into list[*n] (at most max of them). 0, or 2 after one line. */
static int add_glob(const char *opt, const char *arg, const char **list, size_t *n, size_t max)
{
    if (*n == max) {
        fprintf(stderr, "probe-compare: at most %zu %s options\n", max, opt);
        return 2;
    }
    if (!*arg) {
        fprintf(stderr, "probe-compare: %s needs a non-empty GLOB\n", opt);
        return 2;
    }
    list[(*n)++] = arg;
    return 0;
}

static int parse_device(const char *arg, probe_compare_opts *opts)
{
    if (!strcmp(arg, "cpu")) {
        opts->use_cuda = 0;
    } else if (!strcmp(arg, "cuda")) {
        opts->use_cuda = 1;
        opts->cuda_device = 0;
    } else if (!strncmp(arg, "cuda:", 5)) {
        if (parse_int("--device cuda:N", arg + 5, 0, 1023, &opts->cuda_device))
            return 2;
        opts->use_cuda = 1;
    } else {
        fprintf(stderr, "probe-compare: --device: '%s' is not cpu, cuda or cuda:N\n", arg);
        return 2;
    }
    return 0;
}

/* One option c with its argument. -1 to go on, else the exit status (0 after
 * --help or --version, 2 after one line on stderr). */
static int parse_option(cli *a, int c, const char *arg, char **argv)
{
    probe_compare_opts *opts = &a->opts;
    switch (c) {
    case OPT_GATE: a->gate_spec = arg; break;
    case OPT_CAL: a->cal_path = arg; break;
    case OPT_ATOL:
        if (parse_tol("--atol", arg, &opts->atol))
            return 2;
        opts->atol_set = 1;
        break;
    case OPT_RTOL:
        if (parse_tol("--rtol", arg, &opts->rtol))
            return 2;
        opts->rtol_set = 1;
        break;
    case OPT_ONLY: return add_glob("--only", arg, a->only, &a->nonly, MAX_ONLY) ? 2 : -1;
    case OPT_JSON: a->json_path = arg; break;
    case OPT_HTML: a->html_path = arg; break;
    case OPT_JUNIT: a->junit_path = arg; break;
    case OPT_EXPECT_IDENTICAL: opts->expect_identical = 1; break;
    case OPT_CHANNEL_AXIS:
        if (parse_int("--channel-axis", arg, -PROBE_MAX_RANK, PROBE_MAX_RANK - 1,
                      &opts->channel_axis))
            return 2;
        opts->channel_axis_set = 1;
        break;
    case OPT_THREADS:
        if (parse_int("--threads", arg, 1, 16, &opts->threads))
            return 2;
        break;
    case OPT_DEVICE: return parse_device(arg, opts) ? 2 : -1;
    case OPT_ALLOW_ROOT_DIFF:
        return add_glob("--allow-root-diff", arg, a->allow, &a->nallow, MAX_ALLOW) ? 2 : -1;
    case OPT_ISOLATED: a->iso_path = arg; break;
    case OPT_ORACLE:
        if (a->oracle_path) {
            fprintf(stderr, "probe-compare: --oracle given twice (%s, %s): one oracle per "
                            "comparison\n", a->oracle_path, arg);
            return 2;
        }
        a->oracle_path = arg;
        break;
    case OPT_ORACLE_HEADROOM: {
        char *end = NULL;
        errno = 0;
        double h = strtod(arg, &end);
        if (errno || end == arg || *end || !(h >= 1.0 && h <= 1e6)) {
            fprintf(stderr, "probe-compare: --oracle-headroom: '%s' is not a ratio from 1 to "
                            "1e6 (e.g. 1.05)\n", arg);
            return 2;
        }
        opts->oracle_headroom = h;
        break;
    }
    case OPT_ALLOW_WEIGHT_DIFF: a->allow_weight_diff = 1; break;
    case OPT_EXPECT_KERNEL:
        return add_glob("--expect-kernel", arg, a->expect_kernel, &a->nexpect_kernel,
                        MAX_EXPECT_KERNEL) ? 2 : -1;
    case OPT_KERNELS: a->all_kernels = 1; break;
    case OPT_REFERENCE_RANK:
        if (a->nref_ranks == PROBE_RANKSET_MAX) {
            fprintf(stderr, "probe-compare: at most %d --reference-rank options\n",
                    PROBE_RANKSET_MAX);
            return 2;
        }
        a->ref_ranks[a->nref_ranks++] = arg;
        break;
    case OPT_QUIET: a->quiet = 1; break;
    case 'h':
    case OPT_HELP: usage(stdout); return 0;
    case OPT_VERSION: printf("probe-compare %s\n", PROBE_VERSION); return 0;
    default:
        if (optopt)
            fprintf(stderr, "probe-compare: option needs an argument or is unknown: %s "
                            "(probe-compare --help)\n", probe_tesc(argv[optind - 1]));
        else
            fprintf(stderr, "probe-compare: unknown option '%s' (probe-compare --help)\n",
                    probe_tesc(argv[optind - 1]));
        return 2;
    }
    return -1;
}

/* The input files after the options: the reference's and the candidate's.
 * -1 to go on, else 2 after one line. */
static int parse_files(cli *a, int argc, char **argv)
{
    int npos = argc - optind, need = a->nref_ranks ? 1 : 2;
    if (npos < need || npos - (need - 1) > PROBE_RANKSET_MAX) {
        fprintf(stderr, "probe-compare: expected %s, got %d file%s (usage: probe-compare [options] "
                        "REF.h5 CAND.h5 [CAND.h5...]; probe-compare --help)\n",
                a->nref_ranks ? "1 or more candidate files after --reference-rank"
                              : "2 files (REF.h5 CAND.h5) or more (several per-rank CAND files)",
                npos, npos == 1 ? "" : "s");
        return 2;
    }
    a->refs = a->nref_ranks ? a->ref_ranks : (const char *const *)argv + optind;
    a->nrefs = a->nref_ranks ? a->nref_ranks : 1;
    a->cands = (const char *const *)argv + optind + (a->nref_ranks ? 0 : 1);
    a->ncands = (size_t)npos - (a->nref_ranks ? 0 : 1);
    for (int i = optind; i < argc; i++)
        if (argv[i][0] == '-' && argv[i][1] && access(argv[i], F_OK) != 0) {
            fprintf(stderr, "probe-compare: '%s' is taken as a file name (it follows '--') and "
                            "there is no such file; options go before '--'\n",
                    probe_tesc(argv[i]));
            return 2;
        }
    return -1;
}

/* --json, --html and --junit: at most one on stdout, none onto an input.
 * -1 to go on, else 2 after one line. */
static int check_outputs(const cli *a)
{
    const char *outs[3] = {a->json_path, a->html_path, a->junit_path};
    const char *out_opt[3] = {"--json", "--html", "--junit"};
    for (int x = 0; x < 3; x++)
        for (int y = x + 1; y < 3; y++)
            if (outs[x] && outs[y] && !strcmp(outs[x], "-") && !strcmp(outs[y], "-")) {
                fprintf(stderr, "probe-compare: %s - and %s - cannot both write to stdout\n",
                        out_opt[x], out_opt[y]);
                return 2;
            }
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; outs[k] && strcmp(outs[k], "-") && i < a->nrefs + a->ncands; i++)
            if (same_file(outs[k], i < a->nrefs ? a->refs[i] : a->cands[i - a->nrefs])) {
                fprintf(stderr, "probe-compare: %s %s is the %s input file; refusing to overwrite "
                                "it\n", out_opt[k], probe_tesc(outs[k]),
                        i >= a->nrefs ? "candidate" : "reference");
                return 2;
            }
    probe_outfile of;
    for (int k = 0; k < 3; k++)
        if (outs[k] && probe_outfile_check(&of, outs[k]) != 0) {
            fprintf(stderr, "probe-compare: %s\n", of.err);
            return 2;
        }
    return -1;
}

/* The whole command line into *a. -1 to go on, else the exit status. */
static int parse_cli(cli *a, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"gate", required_argument, 0, OPT_GATE},   {"calibration", required_argument, 0, OPT_CAL},
        {"atol", required_argument, 0, OPT_ATOL},   {"rtol", required_argument, 0, OPT_RTOL},
        {"only", required_argument, 0, OPT_ONLY},   {"json", required_argument, 0, OPT_JSON},
        {"html", required_argument, 0, OPT_HTML},   {"quiet", no_argument, 0, OPT_QUIET},
        {"help", no_argument, 0, OPT_HELP},         {"version", no_argument, 0, OPT_VERSION},
        {"junit", required_argument, 0, OPT_JUNIT},
        {"expect-identical", no_argument, 0, OPT_EXPECT_IDENTICAL},
        {"channel-axis", required_argument, 0, OPT_CHANNEL_AXIS},
        {"threads", required_argument, 0, OPT_THREADS},
        {"device", required_argument, 0, OPT_DEVICE},
        {"allow-root-diff", required_argument, 0, OPT_ALLOW_ROOT_DIFF},
        {"isolated", required_argument, 0, OPT_ISOLATED},
        {"allow-weight-diff", no_argument, 0, OPT_ALLOW_WEIGHT_DIFF},
        {"expect-kernel", required_argument, 0, OPT_EXPECT_KERNEL},
        {"kernels", no_argument, 0, OPT_KERNELS},
        {"reference-rank", required_argument, 0, OPT_REFERENCE_RANK},
        {"oracle", required_argument, 0, OPT_ORACLE},
        {"oracle-headroom", required_argument, 0, OPT_ORACLE_HEADROOM},
        {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->gate_spec = "T1";
    opterr = 0;
    int c, rc;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1)
        if ((rc = parse_option(a, c, optarg, argv)) >= 0)
            return rc;
    if ((rc = parse_files(a, argc, argv)) >= 0 || (rc = check_outputs(a)) >= 0)
        return rc;
    return -1;
}

/* The gate, its calibration, and the --oracle/--isolated runs checked against
 * the inputs. 0, or 2 after one line on stderr. */
static int load_gate(cli *a, run_state *st)
{
    probe_compare_opts *opts = &a->opts;
    if (probe_gate_parse(a->gate_spec, &opts->gate) != PROBE_OK) {
        fprintf(stderr, "probe-compare: --gate: %s\n", probe_tesc(probe_last_error()));
        return 2;
    }
    if (a->cal_path && opts->gate.kind != PROBE_GATE_T2) {
        fprintf(stderr, "probe-compare: --calibration %s is used only with --gate T2 (gate is %s)\n",
                a->cal_path, opts->gate.name);
        return 2;
    }
    if (a->cal_path) {
        /* Calibration entries must name components of the table (any name
         * when no table is installed next to this tool). */
        char **names = NULL;
        probe_status s = probe_component_names_load(NULL, &names);
        if (s != PROBE_OK && s != PROBE_ENOTFOUND) {
            fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
            return 2;
        }
        s = probe_calibration_load(a->cal_path, (const char *const *)names, &st->cal);
        probe_component_names_free(names);
        if (s != PROBE_OK) {
            fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
            return 2;
        }
    }
    if (opts->gate.kind == PROBE_GATE_T2 && !st->cal) {
        fprintf(stderr, "probe-compare: --gate T2 needs --calibration FILE\n");
        return 2;
    }
    const char *ref = a->refs[0], *cand = a->cands[0], *iso = a->iso_path, *oracle = a->oracle_path;
    if (oracle && (same_file(oracle, ref) || same_file(oracle, cand) ||
                   (iso && same_file(oracle, iso)))) {
        fprintf(stderr, "probe-compare: --oracle %s is the %s file; it must be a run of its own "
                        "(the reference's experiment in higher precision)\n", oracle,
                same_file(oracle, ref) ? "reference" : same_file(oracle, cand) ? "candidate"
                                                                                : "--isolated");
        return 2;
    }
    if (opts->oracle_headroom > 0 && !oracle) {
        fprintf(stderr, "probe-compare: --oracle-headroom needs --oracle FILE\n");
        return 2;
    }
    if (iso && (same_file(iso, ref) || same_file(iso, cand))) {
        fprintf(stderr, "probe-compare: --isolated %s is the %s file; it must be a third run "
                        "(probe-run --replay REF.h5)\n", iso,
                same_file(iso, ref) ? "reference" : "candidate");
        return 2;
    }
    return 0;
}

/* The component table's root inputs and channel axes into the options, and
 * the rest of the options from the command line. 0, or 2 after one line. */
static int load_tables(cli *a, run_state *st)
{
    probe_compare_opts *opts = &a->opts;
    /* Root inputs: the table's "root" rows (the built-in list without a table). */
    probe_status rs = probe_component_roots_load(NULL, &st->roots);
    if (rs != PROBE_OK && rs != PROBE_ENOTFOUND) {
        fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
        return 2;
    }
    opts->check_roots = 1;
    opts->root_components = (const char *const *)st->roots;
    opts->allow_root_diff = a->nallow ? a->allow : NULL;
    opts->isolated = a->iso_path;
    opts->oracle = a->oracle_path;
    opts->calibration = st->cal;
    /* The component table's channel axes (none when no table is installed). */
    probe_status ts =
        probe_component_axes_load(NULL, &st->axis_names, &st->axis_values, &st->axis_ranks);
    if (ts != PROBE_OK && ts != PROBE_ENOTFOUND) {
        fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
        return 2;
    }
    opts->axis_components = st->axis_names;
    opts->axis_values = st->axis_values;
    opts->axis_ranks = st->axis_ranks;
    if (ts == PROBE_OK &&
        probe_component_class_axes_load(NULL, &st->class_axes, &st->n_class_axes) == PROBE_OK) {
        opts->class_axes = st->class_axes;
        opts->n_class_axes = st->n_class_axes;
    }
    opts->only = a->nonly ? a->only : NULL;
    opts->want_stats = a->html_path != NULL; /* only the HTML report shows them */
    if (!a->quiet && isatty(STDERR_FILENO)) {
        opts->progress = show_progress;
        opts->progress_ctx = &st->prog;
    }
    return 0;
}

/* Open both captures once, check their weight fingerprints (docs/gemm.md
 * "Weights"), and compare them. 0, or 2 after one line on stderr. */
static int run_compare(cli *a, run_state *st)
{
    /* A side that cannot be opened is reported as the compare's error, the
     * reference's first; the weights are checked before that either way. */
    char open_err[2][1024] = {"", ""}; /* the size of probe_last_error() */
    probe_status open_st[2];
    const char *const *paths[2] = {a->refs, a->cands};
    size_t npaths[2] = {a->nrefs, a->ncands};
    for (int k = 0; k < 2; k++)
        if ((open_st[k] = probe_rankset_open(paths[k], npaths[k], &st->sets[k])) != PROBE_OK)
            snprintf(open_err[k], sizeof open_err[k], "%s", probe_last_error());
    /* Different weights make the comparison meaningless: refuse unless allowed. An
     * unreadable file is reported by the compare. */
    char *wm[2] = {side_manifest(st->sets[0], a->refs, a->nrefs),
                   side_manifest(st->sets[1], a->cands, a->ncands)};
    probe_status wst = probe_weights_check(wm[0], wm[1], &st->wv);
    st->have_wv = 1;
    free(wm[0]);
    free(wm[1]);
    /* Under T2 the calibration says what the feature expects of the weights. */
    const char *expect = a->allow_weight_diff ? "quantized" : probe_calibration_weights(st->cal);
    const char *rounding = a->allow_weight_diff ? NULL : probe_calibration_weights_rounding(st->cal);
    const char *why = wst == PROBE_OK ? probe_weights_refusal(&st->wv, expect, rounding) : NULL;
    if (wst != PROBE_OK || why) {
        if (wst != PROBE_OK)
            fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
        else if (rounding)
            fprintf(stderr, "probe-compare: %s (%s: the calibration's \"weights_rounding\" is "
                            "\"%s\"); not comparing (--allow-weight-diff compares anyway)\n",
                    probe_tesc(st->wv.line), why, rounding);
        else
            fprintf(stderr, "probe-compare: %s (%s); not comparing (--allow-weight-diff compares "
                            "anyway; a calibration of a feature that changes the weights says "
                            "\"weights\": \"quantized\")\n", probe_tesc(st->wv.line), why);
        return 2;
    }
    int bad = open_st[0] != PROBE_OK ? 0 : open_st[1] != PROBE_OK ? 1 : -1;
    probe_status cs = bad >= 0 ? open_st[bad]
                               : probe_compare_ranksets(st->sets[0], a->refs, a->nrefs,
                                                        st->sets[1], a->cands, a->ncands,
                                                        &a->opts, &st->res);
    if (st->prog.shown) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
    if (cs != PROBE_OK) {
        const char *err = bad >= 0 ? open_err[bad] : probe_last_error();
        if (a->ncands > 1 || a->nrefs > 1)
            fprintf(stderr, "probe-compare: %zu %s files, read as the per-rank captures of one run: "
                            "%s\n", a->ncands > 1 ? a->ncands : a->nrefs,
                    a->ncands > 1 ? "candidate" : "reference", probe_tesc(err));
        else
            fprintf(stderr, "probe-compare: %s\n", probe_tesc(err));
        return 2;
    }
    return 0;
}

/* Everything the comparison found, on the terminal and into the output
 * files. Returns the exit status: 0 pass, 1 fail, 2 an output failed. */
static int run_report(cli *a, run_state *st)
{
    probe_compare_result *res = st->res;
    probe_weights_verdict *wv = &st->wv;
    /* With the JSON or JUnit on stdout, the human-readable text goes to stderr. */
    FILE *human = (a->json_path && strcmp(a->json_path, "-") == 0) ||
                          (a->junit_path && strcmp(a->junit_path, "-") == 0)
                      ? stderr
                      : stdout;
    if (wv->line[0])
        weights_json = wv->json, wv->json = NULL;
    char gate[160];
    probe_text_gate_label(gate, sizeof gate, &a->opts);
    note_recovered((const char *const[2]){a->refs[0], a->cands[0]}, st->sets);
    note_lost((const char *const[2]){a->refs[0], a->cands[0]}, res);
    if (!a->quiet && wv->line[0])
        fprintf(human, "%s%s\n", !strcmp(wv->status, "differ") ? "weights: DIFFER: " : "",
                probe_tesc(!strcmp(wv->status, "differ")
                               ? wv->line + strlen("the runs loaded different weights: ")
                               : wv->line));
    if (!a->quiet)
        probe_text_details(human, res, gate, kdiff, a->all_kernels);
    probe_text_verdict(human, res, gate);
    int rc = res->pass ? 0 : 1;
    if (a->nrefs == 1 && a->ncands == 1) {
        int prc = compare_procs(human, res, a->refs[0], a->cands[0], &a->opts, a->quiet);
        rc = prc > rc ? prc : rc;
    }
    if (a->json_path && write_to(a->json_path, res, 0))
        rc = 2;
    if (a->html_path && write_to(a->html_path, res, 1))
        rc = 2;
    if (a->junit_path && write_to(a->junit_path, res, 2))
        rc = 2;
    return rc;
}

int main(int argc, char **argv)
{
    /* past RLIMIT_FSIZE a write fails with EFBIG (one line, the earlier output kept)
     * instead of the signal killing the tool */
    signal(SIGXFSZ, SIG_IGN);
    /* Large buffers (HDF5 decompresses whole chunks) go to mmap and back to
     * the system when freed: glibc's adaptive threshold would otherwise move
     * them onto the heap, where a 16 MiB chunk read again and again grows the
     * resident size well past the engine's bound (docs/metrics.md, Memory). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    cli a;
    int rc = parse_cli(&a, argc, argv);
    if (rc >= 0)
        return rc;
    run_state st;
    memset(&st, 0, sizeof st);
    int report_fd = -1, forked = 0;
    if ((rc = load_gate(&a, &st)) || (rc = load_tables(&a, &st)))
        goto done;
    contain(a.refs[0], a.cands[0], a.iso_path, a.oracle_path, &report_fd); /* returns in the child */
    forked = 1;
    if ((rc = run_compare(&a, &st)))
        goto done;
    if ((rc = check_kernels(st.res, a.expect_kernel, a.nexpect_kernel)))
        goto done;
    rc = run_report(&a, &st);
done:
    run_state_free(&st);
    return forked ? report(report_fd, rc) : rc;
}
