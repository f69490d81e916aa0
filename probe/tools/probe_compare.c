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

#include "../../metrics/textsafe.h"
#include "../compare/weight_check.h"
#include "probe/compare.h"
#include "probe/components.h"
#include "probe/kernels.h"
#include "probe/rankset.h"

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
            "  --threads N         metric worker threads (default: the online CPUs, at most 8)\n"
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
            "  --quiet             print only the final verdict line (and no progress)\n"
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

static void fmt_num(char *buf, size_t cap, double x, int present)
{
    if (!present || !isfinite(x))
        snprintf(buf, cap, "%s", !present ? "-" : "null");
    else
        snprintf(buf, cap, "%.3e", x);
}

/* The path as the table shows it: "PATH (rank R)" when compared rank by rank,
 * "PATH <- CAND[H] BRANCH" for a CFG-split pair (the half H of the candidate's
 * batched tensor CAND). */
static void rank_path(char *buf, size_t cap, const probe_tensor_result *t)
{
    const char *path = probe_tesc(t->ref.path);
    int n = t->rank_tag >= 0   ? snprintf(buf, cap, "%s (rank %d)", path, t->rank_tag)
            : t->cfg_candidate[0] ? snprintf(buf, cap, "%s <- %s[%d] %s", path,
                                             probe_tesc(t->cfg_candidate), t->cfg_half,
                                             probe_tesc(t->cfg_branch_name))
                                  : snprintf(buf, cap, "%s", path);
    if (n < 0)
        buf[0] = 0;
}

/* Rank sets (docs/nccl.md "Comparing rank sets"): what each side is made of, how they
 * were compared, the collectives without counterpart, and collective outputs that differ
 * across the ranks of one run. Nothing when both sides are plain files. */
static void print_rank_sets(FILE *out, const probe_compare_result *r)
{
    if (!r->world[0] && !r->world[1])
        return;
    for (int side = 0; side < 2; side++) {
        fprintf(out, "%-9s ", side ? "candidate" : "reference");
        if (!r->world[side]) {
            fprintf(out, "one file\n");
            continue;
        }
        fprintf(out, "rank set of %d files", r->world[side]);
        if (r->index[side][0])
            fprintf(out, " (index %s)", probe_tesc(r->index[side]));
        fputc(':', out);
        for (int k = 0; k < r->world[side]; k++)
            fprintf(out, " %s", probe_tesc(r->files[side][k]));
        fputc('\n', out);
    }
    fprintf(out, "%s\n", r->per_rank ? "compared rank by rank (rank r against rank r)"
                                      : "rank sets joined: sharded tensors reassembled along "
                                        "their shard axis, replicated ones checked across ranks");
    for (int side = 0; side < 2; side++) {
        uint64_t tot = 0;
        for (int k = 0; r->collectives_left_out[side] && k < r->world[side]; k++)
            tot += r->collectives_left_out[side][k];
        if (!tot)
            continue;
        fprintf(out, "collectives of the %s without counterpart (not compared, not missing):",
                side ? "candidate" : "reference");
        for (int k = 0; k < r->world[side]; k++)
            fprintf(out, "%s rank %d: %llu", k ? "," : "", k,
                    (unsigned long long)r->collectives_left_out[side][k]);
        fputc('\n', out);
    }
    for (size_t i = 0; i < r->ndivergent; i++) {
        const probe_collective_divergence *d = &r->divergent[i];
        fprintf(out, "collective output differs across ranks (%s): %s on rank", d->side,
                probe_tesc(d->path));
        for (int k = 0; k < d->nranks && k < 8; k++)
            fprintf(out, "%s %d", k ? "," : "", d->ranks[k]);
        fprintf(out, " (from rank 0)\n");
    }
    fputc('\n', out);
}

/* The class's name without its module ("WanTransformerBlock"), "" when unknown. */
static const char *short_class(const char *qualified)
{
    const char *dot = strrchr(qualified, '.');
    return dot ? dot + 1 : qualified;
}

/* Calls paired by module path, and calls whose class differs between the runs. */
static void print_identity(FILE *out, const probe_compare_result *r)
{
    if (r->calls_by_module || r->calls_unpaired_by_module) {
        const probe_tensor_result *first = NULL;
        for (size_t i = 0; i < r->ntensors && !first; i++)
            if (r->tensors[i].cand_path[0])
                first = &r->tensors[i];
        fprintf(out, "paired by module path: the runs called the modules of %s in another order; "
                     "%zu reference call%s paired with a candidate call of another index",
                probe_tesc(r->by_module_component), r->calls_by_module, r->calls_by_module == 1 ? "" : "s");
        if (first)
            fprintf(out, " (first: %s [%s] with %s)", probe_tesc(first->ref.path),
                    probe_tesc(first->ref.module), probe_tesc(first->cand_path));
        if (r->calls_unpaired_by_module)
            fprintf(out, ", %zu without a call of the same module in the candidate",
                    r->calls_unpaired_by_module);
        fputc('\n', out);
    }
    if (r->class_mismatches) {
        const probe_tensor_result *first = NULL;
        for (size_t i = 0; i < r->ntensors && !first; i++)
            if (r->tensors[i].class_mismatch)
                first = &r->tensors[i];
        fprintf(out, "class differs: %zu compared tensor%s ran in a module of another class in the "
                     "candidate (first: %s: reference %s, candidate %s)\n", r->class_mismatches,
                r->class_mismatches == 1 ? "" : "s", probe_tesc(r->first_class_mismatch),
                probe_tesc(first ? first->ref.class_name : "?"),
                probe_tesc(first ? first->class_cand : "?"));
    }
}

static void print_table(FILE *out, const probe_compare_result *r, const char *gate)
{
    int w = 4, wc = 0;
    for (size_t i = 0; i < r->ntensors; i++) {
        int len = (int)strlen(probe_tesc(short_class(r->tensors[i].ref.class_name)));
        if (len > wc)
            wc = len;
    }
    if (wc > 0 && wc < 5)
        wc = 5;
    if (wc > 28)
        wc = 28;
    for (size_t i = 0; i < r->ntensors; i++) {
        int len = (int)strlen(probe_tesc(r->tensors[i].ref.path)) +
                  (r->tensors[i].rank_tag >= 0 ? 10 : 0) +
                  (r->tensors[i].cfg_candidate[0]
                       ? (int)strlen(probe_tesc(r->tensors[i].cfg_candidate)) + 13 : 0);
        if (len > w)
            w = len;
    }
    if (w > 72)
        w = 72;
    fprintf(out, "reference %s\ncandidate %s\ngate %s:", probe_tesc(r->reference),
            probe_tesc(r->candidate), gate);
    if (isfinite(r->gate.mismatch_fraction_max))
        fprintf(out, " elements within atol %g rtol %g (mismatch fraction <= %g)", r->gate.atol,
                r->gate.rtol, r->gate.mismatch_fraction_max);
    else
        fprintf(out, " element-wise tolerance unchecked (mismatch counted at atol %g rtol %g)",
                r->gate.atol, r->gate.rtol);
    if (isfinite(r->gate.rel_l2_max))
        fprintf(out, ", rel_l2 <= %g", r->gate.rel_l2_max);
    if (isfinite(r->gate.cosine_min))
        fprintf(out, ", cosine >= %g", r->gate.cosine_min);
    if (r->oracle[0])
        fprintf(out, "\noracle %s: verdict = no less accurate than the reference (error ratio "
                     "against the oracle, no added systematic error); the gate is reported beside "
                     "it", probe_tesc(r->oracle));
    else if (r->headline == PROBE_HEADLINE_SYSTEMATIC)
        fprintf(out, "\nverdict = the gate and the systematic test (gain_z, chan_z: beyond "
                     "rounding noise fails)");
    fprintf(out, "\n\n%-*s  ", w, "path");
    if (wc)
        fprintf(out, "%-*s  ", wc, "class");
    /* the dtype column: the reference's, "REF/CAND" where the candidate's differs */
    int wd = 9, mixed = 0;
    for (size_t i = 0; i < r->ntensors; i++) {
        const probe_tensor_result *t = &r->tensors[i];
        int len = (int)strlen(probe_dtype_name(t->ref.dtype));
        if (t->dtype_cand != t->ref.dtype) {
            len += 1 + (int)strlen(probe_dtype_name(t->dtype_cand));
            mixed = 1;
        }
        if (len > wd)
            wd = len;
    }
    fprintf(out, "%-*s %10s %10s %12s %10s %10s %9s %7s %7s%s  %s\n", wd,
            mixed ? "dtype r/c" : "dtype", "n", "rel_l2", "cosine", "max_abs", "p99_abs", "mismatch", "gain_z", "chan_z",
            r->oracle[0] ? "  err_ratio" : "", "verdict");
    for (size_t i = 0; i < r->ntensors; i++) {
        const probe_tensor_result *t = &r->tensors[i];
        const probe_metrics *m = &t->m;
        int fin = t->compared && m->n_finite > 0;
        char rl[32], mx[32], p99[32], mm[32], cs[32];
        fmt_num(rl, sizeof rl, m->rel_l2, t->compared);
        if (t->stats_only && !t->compared) /* only the summaries' lower bound is known */
            snprintf(rl, sizeof rl, isfinite(t->rel_l2_lower_bound) ? ">=%.2e" : "-",
                     t->rel_l2_lower_bound);
        fmt_num(mx, sizeof mx, m->max_abs, fin);
        fmt_num(p99, sizeof p99, m->p99_abs, fin);
        fmt_num(mm, sizeof mm, m->mismatch_fraction, t->compared);
        if (t->compared && isfinite(m->cosine))
            snprintf(cs, sizeof cs, "%.8f", m->cosine);
        else
            snprintf(cs, sizeof cs, "%s", t->compared ? "null" : "-");
        char disp[2400], gz[32] = "-", cz[32] = "-", er[40] = "";
        rank_path(disp, sizeof disp, t);
        if (t->sys.computed) {
            snprintf(gz, sizeof gz, "%.3g", t->m.gain_z);
            if (t->sys.channels)
                snprintf(cz, sizeof cz, "%.3g", t->sys.channel_z);
        }
        if (r->oracle[0]) {
            if (t->has_oracle && isfinite(t->oracle.ratio))
                snprintf(er, sizeof er, "  %9.4f", t->oracle.ratio);
            else
                snprintf(er, sizeof er, "  %9s", t->has_oracle ? "inf" : "-");
        }
        const char *gate_note = t->verdict.pass && !t->gate_verdict.pass ? " (gate: FAIL)" : "";
        fprintf(out, "%-*s  ", w, disp);
        if (wc)
            fprintf(out, "%-*.*s  ", wc, wc, short_class(t->ref.class_name)[0]
                                                 ? probe_tesc(short_class(t->ref.class_name))
                                                 : "-");
        char dt[40];
        if (t->dtype_cand != t->ref.dtype)
            snprintf(dt, sizeof dt, "%s/%s", probe_dtype_name(t->ref.dtype),
                     probe_dtype_name(t->dtype_cand));
        else
            snprintf(dt, sizeof dt, "%s", probe_dtype_name(t->ref.dtype));
        fprintf(out, "%-*s %10llu %10s %12s %10s %10s %9s %7s %7s%s  %s%s%s%s\n", wd, dt,
                (unsigned long long)t->ref.n, rl, cs, mx, p99, mm,
                gz, cz, er, t->verdict.pass ? "pass" : "FAIL", gate_note,
                t->verdict.nreasons ? ": " : "", probe_tesc(t->verdict.nreasons ? t->verdict.reasons[0] : ""));
    }
    size_t nstats = 0;
    for (size_t i = 0; i < r->ntensors; i++)
        nstats += r->tensors[i].stats_only != 0;
    if (nstats)
        fprintf(out, "(%zu stats-only pair%s: identical by hash, or rel_l2 >= the bound the "
                "summaries prove; the other metrics need the tensors)\n", nstats,
                nstats == 1 ? "" : "s");
    print_identity(out, r);
    for (size_t i = 0; i < r->nmissing_cand; i++)
        fprintf(out, "%-*s  missing in candidate\n", w, probe_tesc(r->missing_in_candidate[i]));
    for (size_t i = 0; i < r->nmissing_ref; i++)
        fprintf(out, "%-*s  missing in reference\n", w, probe_tesc(r->missing_in_reference[i]));
    for (size_t i = 0; i < r->nskipped; i++)
        fprintf(out, "%-*s  skipped in %s: %s\n", w, probe_tesc(r->skipped[i].path),
                r->skipped[i].side, probe_tesc(r->skipped[i].reason));
    fputc('\n', out);
}

/* ---- run manifests side by side ------------------------------------------ */

/* Text of one manifest field (dotted key path) into buf; "" when absent. */
static void mval(json_t *m, const char *key, char *buf, size_t cap)
{
    buf[0] = 0;
    char k[128];
    snprintf(k, sizeof k, "%s", key);
    json_t *v = m;
    for (char *save = NULL, *tok = strtok_r(k, ".", &save); tok && v;
         tok = strtok_r(NULL, ".", &save))
        v = json_is_object(v) ? json_object_get(v, tok) : NULL;
    if (!v || json_is_null(v))
        return;
    if (json_is_string(v)) {
        snprintf(buf, cap, "%s", json_string_value(v));
    } else if (json_is_array(v) && strcmp(key, "command") == 0) {
        size_t i, len = 0;
        json_t *e;
        json_array_foreach(v, i, e) {
            const char *a = json_is_string(e) ? json_string_value(e) : "?";
            int q = strpbrk(a, " \t'\"") != NULL || !*a;
            if (len < cap)
                len += (size_t)snprintf(buf + len, cap - len, q ? "%s'%s'" : "%s%s", i ? " " : "", a);
        }
    } else {
        char *t = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        if (t)
            snprintf(buf, cap, "%s", t);
        free(t);
    }
}

static void inject_summary(json_t *m, char *buf, size_t cap)
{
    json_t *inj = m ? json_object_get(m, "inject") : NULL;
    buf[0] = 0;
    if (!json_is_object(inj)) {
        snprintf(buf, cap, m ? "none" : "");
        return;
    }
    const char *ref = json_string_value(json_object_get(inj, "reference"));
    const char *base = ref ? strrchr(ref, '/') : NULL;
    snprintf(buf, cap, "%s: %lld of %lld from %s",
             json_string_value(json_object_get(inj, "status")) ? json_string_value(json_object_get(inj, "status")) : "?",
             (long long)json_integer_value(json_object_get(inj, "injected")),
             (long long)json_integer_value(json_object_get(inj, "selected")),
             base ? base + 1 : ref ? ref : "?");
}

/* The run_end of a side (JSON text) in a few words: "exit status 0, capture complete",
 * "signal SIGSEGV, capture journal"; "" when the file has none. */
static void run_end_summary(const char *text, char *buf, size_t cap)
{
    json_t *re = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    buf[0] = 0;
    if (json_is_object(re)) {
        const char *sig = json_string_value(json_object_get(re, "signal"));
        json_t *st = json_object_get(re, "exit_status");
        const char *cs = json_string_value(json_object_get(re, "capture"));
        size_t len = 0;
        if (sig)
            len = (size_t)snprintf(buf, cap, "signal %s", sig);
        else if (json_is_integer(st))
            len = (size_t)snprintf(buf, cap, "exit status %lld", (long long)json_integer_value(st));
        if (len < cap)
            snprintf(buf + len, cap - len, "%scapture %s", len ? ", " : "",
                     json_is_true(json_object_get(re, "capture_complete")) ? "complete"
                     : cs                                                   ? cs
                                                                            : "incomplete");
    }
    json_decref(re);
}

/* Threads (docs/probe-run.md "Processes and threads"): the components called
 * on threads other than the main one (manifest "threads"), whose paths carry
 * the thread. */
static void print_threads(FILE *out, const probe_compare_result *r)
{
    static const char *const side[2] = {"reference", "candidate"};
    json_t *m[2] = {r->manifest_reference ? json_loads(r->manifest_reference, 0, NULL) : NULL,
                    r->manifest_candidate ? json_loads(r->manifest_candidate, 0, NULL) : NULL};
    json_t *t[2] = {m[0] ? json_object_get(m[0], "threads") : NULL,
                    m[1] ? json_object_get(m[1], "threads") : NULL};
    for (int k = 0; k < 2; ++k) {
        if (!json_is_object(t[k]) || (k == 1 && t[0] && json_equal(t[0], t[1])))
            continue;
        /* component -> the thread tags that called it */
        json_t *by = json_object();
        const char *tag;
        json_t *th;
        json_object_foreach(t[k], tag, th) {
            json_t *calls = json_object_get(th, "calls");
            const char *c;
            json_t *n;
            json_object_foreach(calls, c, n) {
                json_t *l = json_object_get(by, c);
                if (!l)
                    json_object_set_new(by, c, l = json_array());
                json_array_append_new(l, json_string(tag));
            }
        }
        const char *c;
        json_t *l;
        json_object_foreach(by, c, l) {
            size_t n = json_array_size(l), i;
            json_t *v;
            fprintf(out, "threads: %s was called on %zu thread%s besides the main one in the %s (", c,
                    n, n == 1 ? "" : "s", side[k]);
            json_array_foreach(l, i, v) fprintf(out, "%s%s", i ? ", " : "", json_string_value(v));
            fprintf(out, "): their calls are /%s@<thread>/<call>, paired by thread name\n", c);
        }
        json_decref(by);
    }
    json_decref(m[0]);
    json_decref(m[1]);
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

static void print_runs(FILE *out, const probe_compare_result *r)
{
    json_t *m[2] = {r->manifest_reference ? json_loads(r->manifest_reference, 0, NULL) : NULL,
                    r->manifest_candidate ? json_loads(r->manifest_candidate, 0, NULL) : NULL};
    static const struct { const char *label, *key; } rows[] = {
        {"label", "label"}, {"command", "command"}, {"host", "host"}, {"start", "start_time"},
        {"GPU", "cuda.devices"}, {"NVIDIA driver", "nvidia_driver"},
        {"CUDA driver API", "cuda.driver_version"}, {"CUDA runtime", "cuda.runtime_version"},
        {"python", "python"}, {"torch", "torch"}, {"diffusers", "diffusers"},
        {"transformers", "transformers"}, {"tensorrt_llm", "tensorrt_llm"},
        {"probe", "probe_version"}, {"rank/world", "world_size"},
        {"default dtype", "dtypes.default_dtype"},
        {"fp32 matmul", "dtypes.float32_matmul_precision"},
        {"TF32 matmul", "dtypes.cuda_matmul_allow_tf32"},
        {"output dtypes", "dtypes.outputs"}, {"scheduler", "scheduler"},
        {"capture", "capture"}, {"taps", "taps"}, {"staging waits", "staging.waits"},
        {"staging wait s", "staging.wait_s"}, {"inject", ""}, {"run end", ""}, {"skips", ""},
        {"files", ""}};
    char v[2][1024];
    int w = 30;
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        for (int s = 0; s < 2; s++) {
            mval(m[s], rows[k].key[0] ? rows[k].key : "-", v[s], sizeof v[s]);
            int len = (int)strlen(probe_tesc(v[s]));
            if (len > w)
                w = len;
        }
    if (w > 58)
        w = 58;
    fprintf(out, "runs (from each file's manifest; * marks a difference)\n  %-16s %-*s  %s\n",
            "", w, "reference", "candidate");
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        for (int s = 0; s < 2; s++) {
            if (strcmp(rows[k].label, "inject") == 0) {
                inject_summary(m[s], v[s], sizeof v[s]);
            } else if (strcmp(rows[k].label, "run end") == 0) {
                run_end_summary(s ? r->run_end_candidate : r->run_end_reference, v[s],
                                sizeof v[s]);
            } else if (strcmp(rows[k].label, "files") == 0) {
                if (r->world[0] || r->world[1])
                    snprintf(v[s], sizeof v[s], r->world[s] ? "rank set (%d files)" : "one file",
                             r->world[s]);
                else
                    v[s][0] = 0;
            } else if (strcmp(rows[k].label, "skips") == 0) {
                size_t n = 0;
                for (size_t i = 0; i < r->nskipped; i++)
                    n += strcmp(r->skipped[i].side, s ? "candidate" : "reference") == 0;
                snprintf(v[s], sizeof v[s], "%zu", n);
            } else {
                mval(m[s], rows[k].key, v[s], sizeof v[s]);
            }
        }
        if (!v[0][0] && !v[1][0])
            continue;
        int diff = strcmp(v[0], v[1]) != 0;
        for (int s = 0; s < 2; s++)
            snprintf(v[s], sizeof v[s], "%s", probe_tesc(v[s]));
        /* Cut long values: the JSON and HTML carry them whole. */
        for (int s = 0; s < 2; s++)
            if ((int)strlen(v[s]) > w)
                snprintf(v[s] + w - 3, sizeof v[s] - (size_t)w + 3, "...");
        fprintf(out, "%c %-16s %-*s  %s\n", diff ? '*' : ' ', rows[k].label, w,
                v[0][0] ? v[0] : "-", v[1][0] ? v[1] : "-");
    }
    fputc('\n', out);
    json_decref(m[0]);
    json_decref(m[1]);
}

static void print_roots(FILE *out, const probe_compare_result *r)
{
    if (!r->roots_checked)
        return;
    size_t ndiff = 0, nallowed = 0, nincomplete = 0;
    for (size_t i = 0; i < r->nroots; i++) {
        ndiff += !r->roots[i].same && !r->roots[i].allowed && !r->roots[i].incomplete;
        nallowed += r->roots[i].allowed;
        nincomplete += r->roots[i].incomplete;
    }
    if (r->nroots == 0) {
        fprintf(out, "root inputs: none recorded in either file (initial latents, timesteps and "
                     "prompt embeddings are not known to be the same)\n\n");
        return;
    }
    size_t nconv = 0;
    for (size_t i = 0; i < r->nroots; i++)
        nconv += r->roots[i].same && r->roots[i].converted;
    fprintf(out, "root inputs: %zu checked, %zu identical", r->nroots,
            r->nroots - ndiff - nallowed - nconv - nincomplete);
    if (nconv)
        fprintf(out, ", %zu converted from the reference", nconv);
    if (nincomplete)
        fprintf(out, ", %zu missing from an incomplete capture", nincomplete);
    fprintf(out, ", %zu differ%s\n", ndiff + nallowed,
            nallowed ? " (some allowed by --allow-root-diff)" : "");
    for (size_t i = 0; i < r->nroots; i++) {
        const probe_root_input *ri = &r->roots[i];
        if (ri->same && ri->converted)
            fprintf(out, "  same      %s: %s\n", probe_tesc(ri->path), probe_tesc(ri->why));
        if (ri->same)
            continue;
        fprintf(out, "  %s %s: %s\n", ri->allowed ? "allowed  " : ri->incomplete ? "unknown  " : "DIFFERENT",
                probe_tesc(ri->path), probe_tesc(ri->why));
    }
    if (ndiff)
        fprintf(out, "not the same experiment: the runs did not start from the same inputs; "
                     "inject them (probe-run --inject REF.h5) or allow the difference "
                     "(--allow-root-diff GLOB)\n");
    fputc('\n', out);
}

/* Error introduced vs inherited: the output tensors of each component and
 * step, as run and in isolation (--isolated). */
static void print_isolation(FILE *out, const probe_compare_result *r)
{
    if (!r->isolated[0])
        return;
    if (!r->isolated_complete) {
        fprintf(out, "isolation: no table: %s is not a complete replay of the reference (the "
                     "reason is below), so no isolated error is measured\n\n", probe_tesc(r->isolated));
        return;
    }
    int w = 4;
    for (size_t i = 0; i < r->ntensors; i++) {
        int len = (int)strlen(probe_tesc(r->tensors[i].ref.path));
        if (len > w)
            w = len;
    }
    if (w > 60)
        w = 60;
    /* What the isolated run replayed: its manifest's inject globs. */
    char globs[512] = "?";
    json_t *m = r->manifest_isolated ? json_loads(r->manifest_isolated, 0, NULL) : NULL;
    json_t *g = m ? json_object_get(json_object_get(m, "inject"), "globs") : NULL;
    if (json_is_array(g)) {
        size_t k, len = 0;
        json_t *e;
        globs[0] = 0;
        json_array_foreach(g, k, e)
            if (len < sizeof globs)
                len += (size_t)snprintf(globs + len, sizeof globs - len, "%s%s", k ? "," : "",
                                        json_is_string(e) ? json_string_value(e) : "?");
    }
    json_decref(m);
    fprintf(out, "isolation (%s: the reference's values injected at %s)\n"
                 "error introduced (isolated) vs inherited (as run / isolated = amplification), "
                 "output tensors:\n%-*s  %-14s %5s %12s %12s %13s\n",
            probe_tesc(r->isolated), probe_tesc(globs), w, "path", "component", "step", "rel_l2 run", "rel_l2 iso",
            "amplification");
    size_t nconv = 0;
    for (size_t i = 0; i < r->ntensors; i++) {
        const probe_tensor_result *t = &r->tensors[i];
        if (strncmp(t->ref.slot, "out", 3) != 0)
            continue;
        char a[32], b[32], c[32], st[24];
        fmt_num(a, sizeof a, t->m.rel_l2, t->compared);
        fmt_num(b, sizeof b, t->m_isolated.rel_l2, t->has_isolated);
        if (t->has_isolated && isfinite(t->amplification))
            snprintf(c, sizeof c, "%.3g", t->amplification);
        else
            snprintf(c, sizeof c, "%s", t->has_isolated ? "n/a" : "-");
        if (t->ref.step >= 0)
            snprintf(st, sizeof st, "%lld", (long long)t->ref.step);
        else
            snprintf(st, sizeof st, "-");
        char inputs[200] = "";
        if (t->isolated_inputs_converted) {
            char x[32];
            fmt_num(x, sizeof x, t->isolated_inputs_rel_l2, 1);
            snprintf(inputs, sizeof inputs, "  inputs converted: rel_l2 %s (%s)", x,
                     probe_tesc(t->isolated_inputs_worst));
            nconv++;
        }
        fprintf(out, "%-*s  %-14s %5s %12s %12s %13s%s\n", w, probe_tesc(t->ref.path),
                probe_tesc(t->ref.component), st, a,
                b, c, inputs);
    }
    fprintf(out, "(rel_l2 iso > 0: the component introduces error itself; 0 with rel_l2 run > 0: "
                 "all of its error is inherited from upstream)\n");
    if (nconv)
        fprintf(out, "(inputs converted: the isolated run's inputs of that call are the "
                     "reference's converted to the candidate's dtype (probe-run --convert), so "
                     "its rel_l2 iso includes the rounding of its inputs; rel_l2 of the worst "
                     "input)\n");
    fputc('\n', out);
}

/* The gate's name, plus any --atol/--rtol override, as the human output shows it. */
static void gate_label(char *buf, size_t cap, const probe_compare_opts *o)
{
    size_t len = (size_t)snprintf(buf, cap, "%s", o->gate.name);
    if (o->atol_set && len < cap)
        len += (size_t)snprintf(buf + len, cap - len, " with --atol %g", o->atol);
    if (o->rtol_set && len < cap)
        snprintf(buf + len, cap - len, "%s --rtol %g", o->atol_set ? "," : " with", o->rtol);
}

/* "component/NNNN" of call k. */
static void call_name(char *buf, size_t cap, const probe_compare_result *r, long k)
{
    if (k < 0 || (size_t)k >= r->ncalls) {
        snprintf(buf, cap, "?");
        return;
    }
    if (snprintf(buf, cap, "%s/%04lld", probe_tesc(r->calls[k].component),
                 (long long)r->calls[k].call) < 0)
        buf[0] = 0;
}

/* Where the difference was introduced (probe_introduction), one or two lines. */
static void print_introduced(FILE *out, const probe_compare_result *r)
{
    const probe_introduction *in = &r->introduced;
    if (in->kind == PROBE_INTRODUCED_NONE || in->call < 0)
        return;
    const probe_call_verdict *c = &r->calls[in->call];
    const probe_tensor_result *t = in->tensor >= 0 ? &r->tensors[in->tensor] : NULL;
    char name[200], where[200] = "", after[200];
    call_name(name, sizeof name, r, in->call);
    size_t len = 0;
    if (c->parent >= 0) {
        char pn[200];
        call_name(pn, sizeof pn, r, c->parent);
        len += (size_t)snprintf(where + len, sizeof where - len, "%s%ld of %s", c->block >= 0 ?
                                "block " : "", c->block, pn);
    }
    if (c->step >= 0 && len < sizeof where)
        len += (size_t)snprintf(where + len, sizeof where - len, "%sstep %lld", len ? ", " : "",
                                (long long)c->step);
    if (c->cfg_branch >= 0 && len < sizeof where)
        snprintf(where + len, sizeof where - len, "%sbranch %d", len ? ", " : "", c->cfg_branch);
    if (in->kind == PROBE_INTRODUCED_CALL)
        fprintf(out, "introduced by %s%s%s%s: %s fails while its inputs pass%s\n", name,
                where[0] ? " (" : "", where, where[0] ? ")" : "", probe_tesc(t ? t->ref.path : "?"),
                !strcmp(c->decided_by, "isolated") ? " (and fails in isolation)" : "");
    else if (in->kind == PROBE_INTRODUCED_BETWEEN) {
        call_name(after, sizeof after, r, in->after_call);
        char amp[64] = "";
        if (isfinite(in->amplification))
            snprintf(amp, sizeof amp, ", %.3g x the largest of the outputs since", in->amplification);
        fprintf(out, "introduced between %s and %s%s%s%s, in pipeline code: %s fails (rel_l2 %.3e%s) "
                     "while every output since passes\n", after, name, where[0] ? " (" : "", where,
                where[0] ? ")" : "", probe_tesc(t ? t->ref.path : "?"), t ? t->m.rel_l2 : NAN, amp);
    } else
        fprintf(out, "introduced before the first captured call: %s fails\n",
                probe_tesc(t ? t->ref.path : "?"));
    if (in->ninherited)
        fprintf(out, "inherited by %zu later component call%s (their inputs already differ)\n",
                in->ninherited, in->ninherited == 1 ? "" : "s");
}

static void print_verdict(FILE *out, const probe_compare_result *r, const char *gate)
{
    size_t npass = 0;
    for (size_t i = 0; i < r->ntensors; i++)
        npass += r->tensors[i].verdict.pass != 0;
    if (r->first_failure_path[0]) {
        const char *why = "missing in candidate";
        char comp[160] = "";
        if (r->first_failure >= 0) {
            const probe_tensor_result *t = &r->tensors[r->first_failure];
            why = t->verdict.nreasons ? t->verdict.reasons[0] : "failed";
            snprintf(comp, sizeof comp, "%s", t->ref.component);
        } else {
            const char *p = r->first_failure_path + 1, *slash = strchr(p, '/');
            snprintf(comp, sizeof comp, "%.*s", slash ? (int)(slash - p) : (int)strlen(p), p);
        }
        char rk[32] = ""; /* compared rank by rank: which rank's pair */
        if (r->first_failure >= 0 && r->tensors[r->first_failure].rank_tag >= 0)
            snprintf(rk, sizeof rk, " (rank %d)", r->tensors[r->first_failure].rank_tag);
        fprintf(out, "first failure: component %s at %s%s: %s\n", probe_tesc(comp),
                probe_tesc(r->first_failure_path), rk, probe_tesc(why));
    }
    print_introduced(out, r);
    if (r->nothing_compared)
        fprintf(out, "nothing to compare: no dataset path is in both files%s (a --capture or "
                     "--only glob that matches nothing, or empty captures)\n",
                r->ignored_ref || r->ignored_cand ? " as a numeric tensor" : "");
    if (r->ignored_ref || r->ignored_cand)
        fprintf(out, "note: %zu dataset(s) in the reference and %zu in the candidate are not "
                     "numeric tensors (strings, compound, complex, ...; or shapes whose element "
                     "count overflows or that the file does not store) and were not compared\n",
                r->ignored_ref, r->ignored_cand);
    for (int i = 0; i < r->nreasons; i++)
        if (!r->nothing_compared)
            fprintf(out, "%s\n", probe_tesc(r->reasons[i]));
    if (r->expect_identical && r->ntensors && !r->feature_active)
        fprintf(out, "identical: every compared tensor is bit-identical, as expected "
                     "(--expect-identical)\n");
    size_t ngate = 0;
    for (size_t i = 0; i < r->ntensors; i++)
        ngate += !r->tensors[i].gate_verdict.pass;
    if (r->headline != PROBE_HEADLINE_GATE && ngate != r->ntensors - npass)
        fprintf(out, "gate %s alone: %zu of %zu compared tensors fail it%s\n", gate, ngate,
                r->ntensors, r->headline == PROBE_HEADLINE_ORACLE ? " (reported, not the verdict)"
                                                                  : "");
    if (r->oracle[0] && r->noracle_same)
        fprintf(out, "note: the oracle holds the reference's very bytes in %zu compared tensor%s (it "
                     "computed them as the reference did): those are judged by the gate and the "
                     "systematic test\n", r->noracle_same, r->noracle_same == 1 ? "" : "s");
    if (r->oracle[0] && r->noracle_missing)
        fprintf(out, "note: the oracle does not hold %zu compared tensor%s (with the reference's "
                     "shape): those are judged by the gate and the systematic test\n",
                r->noracle_missing, r->noracle_missing == 1 ? "" : "s");
    fprintf(out,
            "%s: %zu tensors compared, %zu pass, %zu fail, %zu missing in candidate, %zu missing "
            "in reference, %zu skipped (gate %s%s)\n",
            r->pass ? "PASS" : "FAIL", r->ntensors, npass, r->ntensors - npass, r->nmissing_cand,
            r->nmissing_ref, r->nskipped, gate,
            r->headline == PROBE_HEADLINE_ORACLE && r->noracle ? "; verdict: against the oracle"
            : r->headline == PROBE_HEADLINE_ORACLE ? "; no tensor judged against the oracle"
            : r->headline == PROBE_HEADLINE_SYSTEMATIC ? " + systematic test"
                                                       : "");
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
 * one line on stderr, and its entry for the JSON. Reads only such files. */
static void note_recovered(const char *const paths[2]);

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

static void note_recovered(const char *const paths[2])
{
    for (int k = 0; k < 2; k++) {
        recovered_json[k] = json_null();
        char *j = malloc(strlen(paths[k]) + sizeof ".journal");
        if (j == NULL)
            continue;
        sprintf(j, "%s.journal", paths[k]);
        probe_file *f = NULL;
        if (access(j, F_OK) == 0 && probe_file_open(paths[k], &f) == PROBE_OK) {
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
            probe_file_close(f);
        }
        free(j);
    }
}

/* The runs' weight fingerprints side by side (probe/compare/weight_check.h): the JSON
 * object for the key "weights", or NULL when neither run has fingerprints. */
static char *weights_json;

/* The compare JSON (html 0) or HTML report (html 1) with the keys
 * "recovered" (an input was recovered) and "weights" (a run has weight
 * fingerprints, docs/gemm.md) added first in the result object (in the HTML:
 * in its inline probe-data JSON, so that it stays equal to --json), the rest
 * byte for byte as the library wrote it. When neither applies the output is
 * exactly the library's. */
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
 * file's for a rank set (the index itself records no weights), else the file's; NULL when
 * it cannot be read (the compare then reports why). */
static char *side_manifest(const char *const *paths, size_t n)
{
    probe_rankset *rs = NULL;
    if (probe_rankset_open(paths, n, &rs) != PROBE_OK)
        return n == 1 ? file_manifest(paths[0]) : NULL;
    const char *m = probe_file_manifest(probe_rankset_file(rs, 0));
    char *copy = m ? strdup(m) : NULL;
    probe_rankset_close(rs);
    return copy;
}

/* --- kernel-path evidence (docs/kernels.md) --- */

/* The kernel logs side by side and the --expect-kernel results; NULL diff
 * when neither run has a kernel log and nothing was expected. */
static probe_kernel_diff *kdiff;
static json_t *kernels_json, *expect_json;

/* "name" shortened to at most w bytes (with "...") unless full. */
static void print_kernel(FILE *out, const char *mark, const probe_kernel_count *k, int full)
{
    const char *name = probe_tesc(k->name);
    size_t w = 110, n = strlen(name);
    if (full || n <= w)
        fprintf(out, "    %s %s  x%llu\n", mark, name, k->count);
    else
        fprintf(out, "    %s %.*s...  x%llu\n", mark, (int)(w - 3), name, k->count);
}

/* Per component, the kernels only one run launched: at most 5 of each side
 * (names cut at 110 bytes) unless full. */
static void print_kernels(FILE *out, const probe_kernel_diff *d, int full)
{
    if (!d || (!d->have_reference && !d->have_candidate))
        return;
    if (!d->have_reference || !d->have_candidate) {
        fprintf(out, "kernels: only the %s logged kernel launches\n",
                d->have_reference ? "reference" : "candidate");
        return;
    }
    if (d->ncomponents == 0)
        return; /* both logs empty: no CUDA launches (a CPU run), nothing to say */
    size_t ndiff = 0, hidden = 0;
    for (size_t i = 0; i < d->ncomponents; i++)
        ndiff += d->components[i].nonly_candidate + d->components[i].nonly_reference > 0;
    if (!ndiff) {
        fprintf(out, "kernels: both runs launched the same kernel names in every component\n");
        return;
    }
    fprintf(out, "kernels only in the candidate (+) or only in the reference (-), per component\n");
    for (size_t i = 0; i < d->ncomponents; i++) {
        const probe_kernel_component *c = &d->components[i];
        if (!c->nonly_candidate && !c->nonly_reference)
            continue;
        fprintf(out, "  %s (launches: reference %llu, candidate %llu)\n",
                probe_tesc(c->component),
                c->launches_reference, c->launches_candidate);
        for (size_t j = 0; j < c->nonly_candidate; j++)
            if (full || j < 5)
                print_kernel(out, "+", &c->only_candidate[j], full);
        for (size_t j = 0; j < c->nonly_reference; j++)
            if (full || j < 5)
                print_kernel(out, "-", &c->only_reference[j], full);
        if (!full)
            hidden += (c->nonly_candidate > 5 ? c->nonly_candidate - 5 : 0) +
                      (c->nonly_reference > 5 ? c->nonly_reference - 5 : 0);
    }
    if (hidden)
        fprintf(out, "  (%zu more: --kernels lists them all)\n", hidden);
}

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

int main(int argc, char **argv)
{
    /* past RLIMIT_FSIZE a write fails with EFBIG (one line, the earlier output kept)
     * instead of the signal killing the tool */
    signal(SIGXFSZ, SIG_IGN);
    enum { OPT_GATE = 256, OPT_CAL, OPT_ATOL, OPT_RTOL, OPT_ONLY, OPT_JSON, OPT_HTML, OPT_QUIET,
           OPT_HELP, OPT_VERSION, OPT_JUNIT, OPT_EXPECT_IDENTICAL, OPT_CHANNEL_AXIS, OPT_THREADS,
           OPT_DEVICE, OPT_ALLOW_ROOT_DIFF, OPT_ISOLATED, OPT_ALLOW_WEIGHT_DIFF, OPT_EXPECT_KERNEL,
           OPT_KERNELS, OPT_REFERENCE_RANK, OPT_ORACLE, OPT_ORACLE_HEADROOM };
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
    const char *gate_spec = "T1", *cal_path = NULL, *json_path = NULL, *html_path = NULL;
    const char *junit_path = NULL;
    const char *only[MAX_ONLY + 1] = {0};
    size_t nonly = 0;
    const char *allow[MAX_ALLOW + 1] = {0};
    size_t nallow = 0;
    const char *iso_path = NULL, *oracle_path = NULL;
    const char *expect_kernel[MAX_EXPECT_KERNEL + 1] = {0};
    size_t nexpect_kernel = 0;
    int all_kernels = 0;
    const char *ref_ranks[PROBE_RANKSET_MAX];
    size_t nref_ranks = 0;
    int quiet = 0, allow_weight_diff = 0;
    probe_compare_opts opts;
    memset(&opts, 0, sizeof opts);
    /* Large buffers (HDF5 decompresses whole chunks) go to mmap and back to
     * the system when freed: glibc's adaptive threshold would otherwise move
     * them onto the heap, where a 16 MiB chunk read again and again grows the
     * resident size well past the engine's bound (docs/metrics.md, Memory). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);

    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_GATE: gate_spec = optarg; break;
        case OPT_CAL: cal_path = optarg; break;
        case OPT_ATOL:
            if (parse_tol("--atol", optarg, &opts.atol))
                return 2;
            opts.atol_set = 1;
            break;
        case OPT_RTOL:
            if (parse_tol("--rtol", optarg, &opts.rtol))
                return 2;
            opts.rtol_set = 1;
            break;
        case OPT_ONLY:
            if (nonly == MAX_ONLY) {
                fprintf(stderr, "probe-compare: at most %d --only options\n", MAX_ONLY);
                return 2;
            }
            if (!*optarg) {
                fprintf(stderr, "probe-compare: --only needs a non-empty GLOB\n");
                return 2;
            }
            only[nonly++] = optarg;
            break;
        case OPT_JSON: json_path = optarg; break;
        case OPT_HTML: html_path = optarg; break;
        case OPT_JUNIT: junit_path = optarg; break;
        case OPT_EXPECT_IDENTICAL: opts.expect_identical = 1; break;
        case OPT_CHANNEL_AXIS:
            if (parse_int("--channel-axis", optarg, -PROBE_MAX_RANK, PROBE_MAX_RANK - 1,
                          &opts.channel_axis))
                return 2;
            opts.channel_axis_set = 1;
            break;
        case OPT_THREADS:
            if (parse_int("--threads", optarg, 1, 16, &opts.threads))
                return 2;
            break;
        case OPT_DEVICE:
            if (!strcmp(optarg, "cpu")) {
                opts.use_cuda = 0;
            } else if (!strcmp(optarg, "cuda")) {
                opts.use_cuda = 1;
                opts.cuda_device = 0;
            } else if (!strncmp(optarg, "cuda:", 5)) {
                if (parse_int("--device cuda:N", optarg + 5, 0, 1023, &opts.cuda_device))
                    return 2;
                opts.use_cuda = 1;
            } else {
                fprintf(stderr, "probe-compare: --device: '%s' is not cpu, cuda or cuda:N\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_ALLOW_ROOT_DIFF:
            if (nallow == MAX_ALLOW) {
                fprintf(stderr, "probe-compare: at most %d --allow-root-diff options\n", MAX_ALLOW);
                return 2;
            }
            if (!*optarg) {
                fprintf(stderr, "probe-compare: --allow-root-diff needs a non-empty GLOB\n");
                return 2;
            }
            allow[nallow++] = optarg;
            break;
        case OPT_ISOLATED: iso_path = optarg; break;
        case OPT_ORACLE:
            if (oracle_path) {
                fprintf(stderr, "probe-compare: --oracle given twice (%s, %s): one oracle per "
                                "comparison\n", oracle_path, optarg);
                return 2;
            }
            oracle_path = optarg;
            break;
        case OPT_ORACLE_HEADROOM: {
            char *end = NULL;
            errno = 0;
            double h = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(h >= 1.0 && h <= 1e6)) {
                fprintf(stderr, "probe-compare: --oracle-headroom: '%s' is not a ratio from 1 to "
                                "1e6 (e.g. 1.05)\n", optarg);
                return 2;
            }
            opts.oracle_headroom = h;
            break;
        }
        case OPT_ALLOW_WEIGHT_DIFF: allow_weight_diff = 1; break;
        case OPT_EXPECT_KERNEL:
            if (nexpect_kernel == MAX_EXPECT_KERNEL) {
                fprintf(stderr, "probe-compare: at most %d --expect-kernel options\n",
                        MAX_EXPECT_KERNEL);
                return 2;
            }
            if (!*optarg) {
                fprintf(stderr, "probe-compare: --expect-kernel needs a non-empty GLOB\n");
                return 2;
            }
            expect_kernel[nexpect_kernel++] = optarg;
            break;
        case OPT_KERNELS: all_kernels = 1; break;
        case OPT_REFERENCE_RANK:
            if (nref_ranks == PROBE_RANKSET_MAX) {
                fprintf(stderr, "probe-compare: at most %d --reference-rank options\n",
                        PROBE_RANKSET_MAX);
                return 2;
            }
            ref_ranks[nref_ranks++] = optarg;
            break;
        case OPT_QUIET: quiet = 1; break;
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
    }
    int npos = argc - optind, need = nref_ranks ? 1 : 2;
    if (npos < need || npos - (need - 1) > PROBE_RANKSET_MAX) {
        fprintf(stderr, "probe-compare: expected %s, got %d file%s (usage: probe-compare [options] "
                        "REF.h5 CAND.h5 [CAND.h5...]; probe-compare --help)\n",
                nref_ranks ? "1 or more candidate files after --reference-rank"
                           : "2 files (REF.h5 CAND.h5) or more (several per-rank CAND files)",
                npos, npos == 1 ? "" : "s");
        return 2;
    }
    /* The reference: --reference-rank files, else the first file; then the candidate's. */
    const char *const *refs = nref_ranks ? ref_ranks : (const char *const *)argv + optind;
    size_t nrefs = nref_ranks ? nref_ranks : 1;
    const char *const *cands = (const char *const *)argv + optind + (nref_ranks ? 0 : 1);
    size_t ncands = (size_t)npos - (nref_ranks ? 0 : 1);
    for (int i = optind; i < argc; i++)
        if (argv[i][0] == '-' && argv[i][1] && access(argv[i], F_OK) != 0) {
            fprintf(stderr, "probe-compare: '%s' is taken as a file name (it follows '--') and "
                            "there is no such file; options go before '--'\n",
                    probe_tesc(argv[i]));
            return 2;
        }
    const char *outs[3] = {json_path, html_path, junit_path};
    const char *out_opt[3] = {"--json", "--html", "--junit"};
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            if (outs[a] && outs[b] && !strcmp(outs[a], "-") && !strcmp(outs[b], "-")) {
                fprintf(stderr, "probe-compare: %s - and %s - cannot both write to stdout\n",
                        out_opt[a], out_opt[b]);
                return 2;
            }
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; outs[k] && strcmp(outs[k], "-") && i < nrefs + ncands; i++)
            if (same_file(outs[k], i < nrefs ? refs[i] : cands[i - nrefs])) {
                fprintf(stderr, "probe-compare: %s %s is the %s input file; refusing to overwrite "
                                "it\n", out_opt[k], probe_tesc(outs[k]), i >= nrefs ? "candidate" : "reference");
                return 2;
            }
    if (probe_gate_parse(gate_spec, &opts.gate) != PROBE_OK) {
        fprintf(stderr, "probe-compare: --gate: %s\n", probe_tesc(probe_last_error()));
        return 2;
    }
    if (cal_path && opts.gate.kind != PROBE_GATE_T2) {
        fprintf(stderr, "probe-compare: --calibration %s is used only with --gate T2 (gate is %s)\n",
                cal_path, opts.gate.name);
        return 2;
    }
    probe_calibration *cal = NULL;
    if (cal_path) {
        /* Calibration entries must name components of the table (any name
         * when no table is installed next to this tool). */
        char **names = NULL;
        probe_status s = probe_component_names_load(NULL, &names);
        if (s != PROBE_OK && s != PROBE_ENOTFOUND) {
            fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
            return 2;
        }
        s = probe_calibration_load(cal_path, (const char *const *)names, &cal);
        probe_component_names_free(names);
        if (s != PROBE_OK) {
            fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
            return 2;
        }
    }
    if (opts.gate.kind == PROBE_GATE_T2 && !cal) {
        fprintf(stderr, "probe-compare: --gate T2 needs --calibration FILE\n");
        return 2;
    }
    if (oracle_path && (same_file(oracle_path, refs[0]) || same_file(oracle_path, cands[0]) ||
                        (iso_path && same_file(oracle_path, iso_path)))) {
        fprintf(stderr, "probe-compare: --oracle %s is the %s file; it must be a run of its own "
                        "(the reference's experiment in higher precision)\n", oracle_path,
                same_file(oracle_path, refs[0]) ? "reference"
                : same_file(oracle_path, cands[0]) ? "candidate" : "--isolated");
        probe_calibration_free(cal);
        return 2;
    }
    if (opts.oracle_headroom > 0 && !oracle_path) {
        fprintf(stderr, "probe-compare: --oracle-headroom needs --oracle FILE\n");
        probe_calibration_free(cal);
        return 2;
    }
    if (iso_path && (same_file(iso_path, refs[0]) || same_file(iso_path, cands[0]))) {
        fprintf(stderr, "probe-compare: --isolated %s is the %s file; it must be a third run "
                        "(probe-run --replay REF.h5)\n", iso_path,
                same_file(iso_path, refs[0]) ? "reference" : "candidate");
        probe_calibration_free(cal);
        return 2;
    }
    /* Root inputs: the table's "root" rows (the built-in list without a table). */
    char **roots = NULL;
    probe_status rs = probe_component_roots_load(NULL, &roots);
    if (rs != PROBE_OK && rs != PROBE_ENOTFOUND) {
        fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
        probe_calibration_free(cal);
        return 2;
    }
    opts.check_roots = 1;
    opts.root_components = (const char *const *)roots;
    opts.allow_root_diff = nallow ? allow : NULL;
    opts.isolated = iso_path;
    opts.oracle = oracle_path;
    opts.calibration = cal;
    /* The component table's channel axes (none when no table is installed). */
    char **axis_names = NULL;
    int *axis_values = NULL, *axis_ranks = NULL;
    probe_status ts = probe_component_axes_load(NULL, &axis_names, &axis_values, &axis_ranks);
    if (ts != PROBE_OK && ts != PROBE_ENOTFOUND) {
        fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
        probe_calibration_free(cal);
        probe_component_names_free(roots);
        return 2;
    }
    opts.axis_components = axis_names;
    opts.axis_values = axis_values;
    opts.axis_ranks = axis_ranks;
    probe_class_axis *class_axes = NULL;
    size_t n_class_axes = 0;
    if (ts == PROBE_OK &&
        probe_component_class_axes_load(NULL, &class_axes, &n_class_axes) == PROBE_OK) {
        opts.class_axes = class_axes;
        opts.n_class_axes = n_class_axes;
    }
    opts.only = nonly ? only : NULL;
    opts.want_stats = html_path != NULL; /* only the HTML report shows them */
    progress_state prog = {0, 0};
    if (!quiet && isatty(STDERR_FILENO)) {
        opts.progress = show_progress;
        opts.progress_ctx = &prog;
    }

    int report_fd = -1;
    contain(refs[0], cands[0], iso_path, oracle_path, &report_fd); /* returns in the child */
    /* Weight fingerprints (docs/gemm.md "Weights"), read from both manifests
     * before comparing: different weights make the comparison meaningless;
     * refuse unless allowed. An unreadable file is reported by the compare. */
    probe_weights_verdict wv;
    char *wm[2] = {side_manifest(refs, nrefs), side_manifest(cands, ncands)};
    probe_status wst = probe_weights_check(wm[0], wm[1], &wv);
    free(wm[0]);
    free(wm[1]);
    if (wst != PROBE_OK || (!strcmp(wv.status, "differ") && !allow_weight_diff)) {
        if (wst != PROBE_OK)
            fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
        else
            fprintf(stderr, "probe-compare: %s; not comparing (--allow-weight-diff compares "
                            "anyway)\n", probe_tesc(wv.line));
        probe_weights_verdict_free(&wv);
        probe_component_names_free(roots);
        probe_calibration_free(cal);
        probe_component_names_free(axis_names);
        free(axis_values);
        free(axis_ranks);
        probe_component_class_axes_free(class_axes, n_class_axes);
        return report(report_fd, 2);
    }
    probe_compare_result *res = NULL;
    probe_status cs = probe_compare_sets(refs, nrefs, cands, ncands, &opts, &res);
    if (prog.shown) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
    probe_component_names_free(roots);
    if (cs != PROBE_OK) {
        if (ncands > 1 || nrefs > 1)
            fprintf(stderr, "probe-compare: %zu %s files, read as the per-rank captures of one run: "
                            "%s\n", ncands > 1 ? ncands : nrefs,
                    ncands > 1 ? "candidate" : "reference", probe_tesc(probe_last_error()));
        else
            fprintf(stderr, "probe-compare: %s\n", probe_tesc(probe_last_error()));
        probe_weights_verdict_free(&wv);
        probe_calibration_free(cal);
        probe_component_names_free(axis_names);
        free(axis_values);
        free(axis_ranks);
        probe_component_class_axes_free(class_axes, n_class_axes);
        return report(report_fd, 2);
    }
    if (check_kernels(res, expect_kernel, nexpect_kernel)) {
        probe_compare_result_free(res);
        probe_kernel_diff_free(kdiff);
        json_decref(kernels_json);
        json_decref(expect_json);
        probe_calibration_free(cal);
        probe_component_names_free(axis_names);
        free(axis_values);
        free(axis_ranks);
        probe_component_class_axes_free(class_axes, n_class_axes);
        return report(report_fd, 2);
    }
    /* With the JSON or JUnit on stdout, the human-readable text goes to stderr. */
    FILE *human = (json_path && strcmp(json_path, "-") == 0) ||
                          (junit_path && strcmp(junit_path, "-") == 0)
                      ? stderr
                      : stdout;
    if (wv.line[0])
        weights_json = wv.json, wv.json = NULL;
    char gate[160];
    gate_label(gate, sizeof gate, &opts);
    note_recovered((const char *const[2]){refs[0], cands[0]});
    note_lost((const char *const[2]){refs[0], cands[0]}, res);
    if (!quiet && wv.line[0])
        fprintf(human, "%s%s\n", !strcmp(wv.status, "differ") ? "weights: DIFFER: " : "",
                probe_tesc(!strcmp(wv.status, "differ")
                               ? wv.line + strlen("the runs loaded different weights: ")
                               : wv.line));
    probe_weights_verdict_free(&wv);
    if (!quiet) {
        print_runs(human, res);
        print_rank_sets(human, res);
        print_threads(human, res);
        print_table(human, res, gate);
        print_roots(human, res);
        print_isolation(human, res);
        print_kernels(human, kdiff, all_kernels);
    }
    print_verdict(human, res, gate);
    int rc = res->pass ? 0 : 1;
    if (nrefs == 1 && ncands == 1) {
        int prc = compare_procs(human, res, refs[0], cands[0], &opts, quiet);
        rc = prc > rc ? prc : rc;
    }
    if (json_path && write_to(json_path, res, 0))
        rc = 2;
    if (html_path && write_to(html_path, res, 1))
        rc = 2;
    if (junit_path && write_to(junit_path, res, 2))
        rc = 2;
    probe_compare_result_free(res);
    probe_calibration_free(cal);
    probe_component_names_free(axis_names);
    free(axis_values);
    free(axis_ranks);
    probe_component_class_axes_free(class_axes, n_class_axes);
    json_decref(recovered_json[0]);
    json_decref(recovered_json[1]);
    json_decref(lost_json[0]);
    json_decref(lost_json[1]);
    free(weights_json);
    probe_kernel_diff_free(kdiff);
    json_decref(kernels_json);
    json_decref(expect_json);
    return report(report_fd, rc);
}
