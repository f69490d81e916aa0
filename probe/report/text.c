/* text.c - a compare result as the text probe-compare prints: the run
 * manifests side by side, rank sets, threads, the per-tensor table, root
 * inputs, the isolated run, kernels only one run launched, and the verdict
 * (probe/report/text.h). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "../../metrics/vocab/textsafe.h"
#include "text.h"

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
        if (r->by_nesting)
            fprintf(out, "paired by parent call and block index: the candidate skipped calls of "
                         "%s (a step cache?); %zu reference call%s paired with a candidate call of "
                         "another index", probe_tesc(r->by_module_component), r->calls_by_module,
                    r->calls_by_module == 1 ? "" : "s");
        else
            fprintf(out, "paired by module path: the runs called the modules of %s in another "
                         "order; %zu reference call%s paired with a candidate call of another "
                         "index", probe_tesc(r->by_module_component), r->calls_by_module,
                    r->calls_by_module == 1 ? "" : "s");
        if (first)
            fprintf(out, " (first: %s [%s] with %s)", probe_tesc(first->ref.path),
                    probe_tesc(first->ref.module), probe_tesc(first->cand_path));
        if (r->calls_unpaired_by_module)
            fprintf(out, r->by_nesting ? ", %zu without a call at the same step and block in the "
                                         "candidate"
                                       : ", %zu without a call of the same module in the candidate",
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
    if (r->gate.kind == PROBE_GATE_T2)
        fprintf(out, " each tensor's thresholds from the calibration%s%s (its component's, tensor "
                     "path's and structure entries: the tensor's \"gate\" in the JSON)",
                r->calibration[0] ? " file " : "", probe_tesc(r->calibration));
    else if (isfinite(r->gate.mismatch_fraction_max))
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
    if (r->nskipped_by_feature)
        fprintf(out, "skipped by the feature (its calibration lets it skip these calls): %zu "
                "tensor%s, first %s\n", r->nskipped_by_feature,
                r->nskipped_by_feature == 1 ? "" : "s", probe_tesc(r->skipped_by_feature[0]));
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


/* 1 when label (any case) is one of the NULL-ended names. */
static int label_is(const char *label, const char *const *names)
{
    for (; *names; names++)
        if (strcasecmp(label, *names) == 0)
            return 1;
    return 0;
}

/* The reference labelled as the feature-on run and the candidate as the
 * feature-off one (manifest "label", probe-run --label): the files were
 * most likely given in the wrong order. */
static void print_swapped_labels(FILE *out, json_t *const m[2])
{
    static const char *const on[] = {"on", "candidate", "feature-on", "feature_on", NULL};
    static const char *const off[] = {"off", "reference", "baseline", "feature-off", "feature_off",
                                      NULL};
    const char *l[2];
    for (int s = 0; s < 2; s++)
        if (!(l[s] = json_string_value(json_object_get(m[s], "label"))))
            return;
    if (label_is(l[0], on) && label_is(l[1], off))
        fprintf(out, "note: the reference is labelled '%s' and the candidate '%s': probe-compare "
                     "takes the feature-off run first (REFERENCE CANDIDATE); were the files given "
                     "the wrong way round?\n\n", probe_tesc(l[0]), probe_tesc(l[1]));
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
    print_swapped_labels(out, m);
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
void probe_text_gate_label(char *buf, size_t cap, const probe_compare_opts *o)
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
    const char *unjudged = t && t->no_thresholds
                               ? "; it has no T2 thresholds in the calibration file, so how "
                                 "much it differs is not judged"
                               : "";
    if (in->kind == PROBE_INTRODUCED_CALL)
        fprintf(out, "introduced by %s%s%s%s: %s %s while its inputs pass%s%s\n", name,
                where[0] ? " (" : "", where, where[0] ? ")" : "", probe_tesc(t ? t->ref.path : "?"),
                unjudged[0] ? "differs" : "fails",
                !strcmp(c->decided_by, "isolated") ? " (and fails in isolation)" : "", unjudged);
    else if (in->kind == PROBE_INTRODUCED_BETWEEN) {
        call_name(after, sizeof after, r, in->after_call);
        char amp[64] = "";
        if (isfinite(in->amplification))
            snprintf(amp, sizeof amp, ", %.3g x the largest of the outputs since", in->amplification);
        fprintf(out, "introduced between %s and %s%s%s%s, in pipeline code: %s fails (rel_l2 %.3e%s) "
                     "while every output since passes%s\n", after, name, where[0] ? " (" : "", where,
                where[0] ? ")" : "", probe_tesc(t ? t->ref.path : "?"), t ? t->m.rel_l2 : NAN, amp,
                unjudged);
    } else
        fprintf(out, "introduced before the first captured call: %s fails%s\n",
                probe_tesc(t ? t->ref.path : "?"), unjudged);
    if (in->ninherited)
        fprintf(out, "inherited by %zu later component call%s (their inputs already differ)\n",
                in->ninherited, in->ninherited == 1 ? "" : "s");
}

void probe_text_verdict(FILE *out, const probe_compare_result *r, const char *gate)
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

void probe_text_details(FILE *out, const probe_compare_result *r, const char *gate,
                        const probe_kernel_diff *kernels, int all_kernels)
{
    print_runs(out, r);
    print_rank_sets(out, r);
    print_threads(out, r);
    print_table(out, r, gate);
    print_roots(out, r);
    print_isolation(out, r);
    print_kernels(out, kernels, all_kernels);
}
