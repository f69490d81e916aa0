/* probe-calibrate: write a T2 calibration file (docs/calibration.md) from
 * repeated reference and feature runs, and check that T1 sits above the
 * determinism floor (probe/calibrate.h).
 *   exit 0  calibration written, T1 sits above the floor for every component
 *   exit 1  calibration written, but T1 does not sit above the floor somewhere
 *   exit 2  bad arguments or input (missing file, pair count, unknown
 *           component, a pair that cannot be calibrated on)
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "probe/calibrate.h"
#include "../../metrics/vocab/textsafe.h"
#include "probe/components.h"

#define MAX_FILES 256
#define USAGE_LINE                                                                            \
    "usage: probe-calibrate --feature NAME --reference R.h5... --candidate C.h5... --out "    \
    "CAL.json (--help for more)\n"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: probe-calibrate --feature NAME [--headroom H] [--atol X --rtol X]\n"
            "                       --reference R0.h5 [--reference R1.h5]...\n"
            "                       --candidate C0.h5 [--candidate C1.h5]...\n"
            "                       [--reference-repeat R0b.h5]... [--references-differ]\n"
            "                       [--weights same|quantized] [--skips-calls]\n"
            "                       [--held-out | --no-held-out]\n"
            "                       --out CAL.json\n"
            "       probe-calibrate --feature NAME [--headroom H] --records FILE.jsonl... --out CAL.json\n"
            "Write T2 thresholds (docs/calibration.md) from repeated runs: candidate i (feature\n"
            "on) pairs with reference i (feature off, same inputs); per component the worst\n"
            "observed drift x headroom. The determinism floor is reference 0 vs every other\n"
            "reference (unless --references-differ) and reference k vs its k-th repeat; T1 must\n"
            "sit above it: headroom x floor rel_l2 < 1e-2 and headroom x floor (1 - cosine) < 1e-4.\n\n"
            "  --feature NAME          the feature being calibrated (required)\n"
            "  --headroom H            factor on the worst observed drift, >= 1 (default 1.5)\n"
            "  --atol X --rtol X       tolerance of the mismatch fraction (default 1e-3 each)\n"
            "  --reference FILE        a reference run (repeatable; at least as many as candidates)\n"
            "  --candidate FILE        a feature run (repeatable)\n"
            "  --reference-repeat FILE the k-th one is a second run of reference k (repeatable)\n"
            "  --references-differ     the references ran on different inputs (seeds): only\n"
            "                          --reference-repeat gives the floor\n"
            "  --weights same|quantized what the feature does to the weights: same (default; a\n"
            "                          pair whose weight fingerprints differ is refused, as\n"
            "                          probe-compare refuses it) or quantized (it changes them,\n"
            "                          e.g. FP8 weight storage); written into the file\n"
            "  --skips-calls           the feature skips calls (a step cache): a candidate may\n"
            "                          lack tensors; per component the fraction it lacks is\n"
            "                          calibrated (skipped_fraction_max)\n"
            "  --held-out              judge every feature pair by T2 calibrated on the other\n"
            "                          feature pairs (leave-one-out; by default with 3 or more\n"
            "                          feature pairs; --held-out: with 2 too): a pair that fails\n"
            "                          says a new run of the feature would fail as it does\n"
            "  --no-held-out           skip that check\n"
            "  --records FILE          instead of runs: statistics recorded by tests (JSON lines\n"
            "                          of probe-record, pytest --probe-record; repeatable); each\n"
            "                          record of the feature is one sample of its component\n"
            "  --out FILE              the calibration file to write ('-' for stdout)\n"
            "  --help (-h), --version\n\n"
            "exit status: 0 written and T1 sits above the floor, 1 written but T1 does not sit\n"
            "above the floor, 2 bad arguments or input\n");
}

static int parse_num(const char *opt, const char *s, double min, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min) {
        fprintf(stderr, "probe-calibrate: %s '%s': not a finite number >= %g\n", opt, s, min);
        return -1;
    }
    *out = v;
    return 0;
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The held-out check's lines: one for the count, one per failing pair. */
static void print_held_out(FILE *out, const probe_calibrate_result *r)
{
    if (!r->nheld_out)
        return;
    fprintf(out, "held out: %zu of %zu feature pair(s) fail T2 calibrated on the other pairs%s\n",
            r->held_out_failed, r->nheld_out,
            r->held_out_failed ? ": the calibration does not cover the feature's run-to-run "
                                 "variation; calibrate on more runs" : "");
    for (size_t i = 0; i < r->nheld_out; i++) {
        const probe_calibrate_held_out *h = &r->held_out[i];
        if (!h->pass)
            fprintf(out, "  pair %zu: %zu of %zu tensors fail; %s%s%s\n", h->pair, h->failed,
                    h->tensors, probe_tesc(h->first_failure), h->first_failure[0] ? ": " : "",
                    probe_tesc(h->reason));
    }
}

static void print_summary(FILE *out, const probe_calibrate_result *r)
{
    if (r->from_records)
        fprintf(out, "feature %s: %zu record(s), %zu floor record(s) (%zu of other features left "
                     "out), headroom %g, mismatch at atol %g rtol %g\n",
                probe_tesc(r->feature), r->npairs, r->nfloor_pairs, r->nrecords_other,
                r->headroom, r->atol, r->rtol);
    else
        fprintf(out, "feature %s: %zu pair(s), %zu floor pair(s), headroom %g, mismatch at atol "
                     "%g rtol %g\n", probe_tesc(r->feature), r->npairs, r->nfloor_pairs,
                r->headroom, r->atol, r->rtol);
    if (r->weights_line[0])
        fprintf(out, "weights: %s (--weights quantized): %s\n", r->weights,
                probe_tesc(r->weights_line));
    if (r->weights_rounding[0])
        fprintf(out, "weights_rounding: %s (every feature pair's weights are the reference's so "
                     "rounded; probe-compare --gate T2 refuses weights that are not)\n",
                r->weights_rounding);
    else if (!strcmp(r->weights, "quantized") && r->weights_line[0])
        fprintf(out, "weights_rounding: none (not every feature pair's weights were proven one "
                     "float8 rounding of the reference's: any change of the weights is accepted)\n");
    fprintf(out, "%-16s %11s %12s %11s %11s %11s   %-24s %s\n", "component", "rel_l2_max", "cosine_min",
           "p99_abs_max", "max_abs_max", "mismatch_max", "floor x headroom", "T1 above floor");
    for (size_t i = 0; i < r->ncomponents; i++) {
        const probe_calibrate_component *c = &r->components[i];
        char fl[64];
        if (c->floor.tensors)
            snprintf(fl, sizeof fl, "rel_l2 %.3g, 1-cos %.3g", c->floor_rel_l2_x_headroom,
                     c->floor_one_minus_cosine_x_headroom);
        else
            snprintf(fl, sizeof fl, "not measured");
        fprintf(out, "%-16s %11.4g %12.10f %11.4g %11.4g %11.4g   %-24s %s\n", probe_tesc(c->name), c->rel_l2_max,
               c->cosine_min, c->p99_abs_max, c->max_abs_max, c->mismatch_fraction_max, fl,
               c->t1_above_floor ? "yes" : "NO");
    }
    print_held_out(out, r);
    if (r->t1_above_floor) {
        fprintf(out, "T1 sits above the determinism floor for every component (rel_l2 < %g, 1 - cosine "
               "< %g after headroom)\n", r->components[0].t1_rel_l2_max,
               r->components[0].t1_one_minus_cosine_max);
        return;
    }
    fprintf(out, "T1 does NOT sit above the determinism floor for:");
    for (size_t i = 0; i < r->ncomponents; i++) {
        const probe_calibrate_component *c = &r->components[i];
        if (c->t1_above_floor)
            continue;
        if (!c->floor.tensors)
            fprintf(out, " %s (floor not measured)", probe_tesc(c->name));
        else
            fprintf(out, " %s (headroom x floor: rel_l2 %.4g vs %g, 1 - cosine %.4g vs %g)", probe_tesc(c->name),
                   c->floor_rel_l2_x_headroom, c->t1_rel_l2_max,
                   c->floor_one_minus_cosine_x_headroom, c->t1_one_minus_cosine_max);
    }
    fprintf(out, "\n");
}

/* The command line, parsed: the builder's options and the output file. */
typedef struct cli {
    const char *refs[MAX_FILES], *cands[MAX_FILES], *reps[MAX_FILES], *recs[MAX_FILES];
    size_t nref, ncand, nrep, nrec;
    const char *out_path;
    probe_calibrate_opts o;
} cli;

enum { OPT_FEATURE = 256, OPT_HEADROOM, OPT_ATOL, OPT_RTOL, OPT_REF, OPT_CAND, OPT_REPEAT,
       OPT_DIFFER, OPT_WEIGHTS, OPT_SKIPS, OPT_OUT, OPT_HELP, OPT_VERSION, OPT_RECORDS,
       OPT_HELD_OUT, OPT_NO_HELD_OUT };

/* One option c. -1 to go on, else the exit status (0 after --help or
 * --version, 2 after one line). */
static int parse_option(cli *a, int c, char **argv)
{
    switch (c) {
    case OPT_FEATURE: a->o.feature = optarg; break;
    case OPT_HEADROOM:
        if (parse_num("--headroom", optarg, 1.0, &a->o.headroom))
            return 2;
        break;
    case OPT_ATOL:
        if (parse_num("--atol", optarg, 0.0, &a->o.atol))
            return 2;
        break;
    case OPT_RTOL:
        if (parse_num("--rtol", optarg, 0.0, &a->o.rtol))
            return 2;
        break;
    case OPT_REF:
    case OPT_CAND:
    case OPT_REPEAT:
    case OPT_RECORDS: {
        size_t *n = c == OPT_REF ? &a->nref : c == OPT_CAND ? &a->ncand
                    : c == OPT_REPEAT ? &a->nrep : &a->nrec;
        const char **v = c == OPT_REF ? a->refs : c == OPT_CAND ? a->cands
                         : c == OPT_REPEAT ? a->reps : a->recs;
        if (*n == MAX_FILES) {
            fprintf(stderr, "probe-calibrate: at most %d files per option\n", MAX_FILES);
            return 2;
        }
        v[(*n)++] = optarg;
        break;
    }
    case OPT_DIFFER: a->o.references_differ = 1; break;
    case OPT_SKIPS: a->o.skips_calls = 1; break;
    case OPT_HELD_OUT:
    case OPT_NO_HELD_OUT:
        if (a->o.held_out && a->o.held_out != (c == OPT_HELD_OUT ? 1 : -1)) {
            fprintf(stderr, "probe-calibrate: --held-out and --no-held-out exclude each other\n");
            return 2;
        }
        a->o.held_out = c == OPT_HELD_OUT ? 1 : -1;
        break;
    case OPT_WEIGHTS:
        if (strcmp(optarg, "same") != 0 && strcmp(optarg, "quantized") != 0) {
            fprintf(stderr, "probe-calibrate: --weights %s: must be same or quantized\n",
                    probe_tesc(optarg));
            return 2;
        }
        a->o.weights = optarg;
        break;
    case OPT_OUT: a->out_path = optarg; break;
    case 'h':
    case OPT_HELP: usage(stdout); return 0;
    case OPT_VERSION: printf("probe-calibrate %s\n", PROBE_VERSION); return 0;
    default:
        if (optopt)
            fprintf(stderr, "probe-calibrate: option needs an argument or is unknown: %s\n",
                    argv[optind - 1]);
        else
            fprintf(stderr, "probe-calibrate: unknown option '%s'\n", argv[optind - 1]);
        fprintf(stderr, USAGE_LINE);
        return 2;
    }
    return -1;
}

/* The options together: required ones given, candidates pair with
 * references, --out is no input. -1 to go on, else 2 after one line. */
static int check_cli(cli *a, int argc, char **argv)
{
    if (optind < argc) {
        fprintf(stderr, "probe-calibrate: unexpected argument '%s' (files go after --reference, "
                        "--candidate or --reference-repeat)\n", argv[optind]);
        return 2;
    }
    if (!a->o.feature || !*a->o.feature) {
        fprintf(stderr, "probe-calibrate: --feature NAME is required\n");
        return 2;
    }
    if (!a->out_path) {
        fprintf(stderr, "probe-calibrate: --out FILE is required\n");
        return 2;
    }
    if (a->nrec && (a->nref || a->ncand || a->nrep)) {
        fprintf(stderr, "probe-calibrate: --records and --reference/--candidate/"
                        "--reference-repeat cannot be mixed\n");
        return 2;
    }
    if (a->nrec && a->o.references_differ) {
        fprintf(stderr, "probe-calibrate: --references-differ applies to runs, not --records\n");
        return 2;
    }
    if (a->nrec && a->o.held_out > 0) {
        fprintf(stderr, "probe-calibrate: --held-out applies to runs, not --records\n");
        return 2;
    }
    if (a->o.held_out > 0 && a->ncand < 2) {
        fprintf(stderr, "probe-calibrate: --held-out needs at least 2 --candidate runs (got %zu)\n",
                a->ncand);
        return 2;
    }
    if (!a->nrec && (a->nref == 0 || a->ncand == 0)) {
        fprintf(stderr, "probe-calibrate: need at least one --reference and one --candidate (or --records) "
                        "(got %zu and %zu)\n", a->nref, a->ncand);
        return 2;
    }
    if (!a->nrec && a->ncand > a->nref) {
        fprintf(stderr, "probe-calibrate: %zu candidates but %zu references: candidate i pairs "
                        "with reference i\n", a->ncand, a->nref);
        return 2;
    }
    /* repeat k against reference k: the same file measures no floor (a candidate that is its
     * own reference is caught as "feature not active") */
    for (size_t k = 0; !a->nrec && k < a->nrep && k < a->nref; k++)
        if (same_file(a->refs[k], a->reps[k])) {
            fprintf(stderr, "probe-calibrate: --reference-repeat %zu (%s) is the same file as "
                            "--reference %zu; a repeat must be a run of its own (against itself "
                            "the floor is zero)\n", k, probe_tesc(a->reps[k]), k);
            return 2;
        }
    const char *const *lists[4] = {a->refs, a->cands, a->reps, a->recs};
    size_t counts[4] = {a->nref, a->ncand, a->nrep, a->nrec};
    for (int k = 0; k < 4 && strcmp(a->out_path, "-"); k++)
        for (size_t i = 0; i < counts[k]; i++)
            if (same_file(a->out_path, lists[k][i])) {
                fprintf(stderr, "probe-calibrate: --out %s is the input file %s; refusing to "
                                "overwrite it\n", probe_tesc(a->out_path), probe_tesc(lists[k][i]));
                return 2;
            }
    probe_outfile of;
    if (probe_outfile_check(&of, a->out_path) != 0) {
        fprintf(stderr, "probe-calibrate: %s\n", of.err);
        return 2;
    }
    return -1;
}

/* -1 to go on, else the exit status. */
static int parse_cli(cli *a, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"feature", required_argument, 0, OPT_FEATURE},
        {"headroom", required_argument, 0, OPT_HEADROOM},
        {"atol", required_argument, 0, OPT_ATOL},
        {"rtol", required_argument, 0, OPT_RTOL},
        {"reference", required_argument, 0, OPT_REF},
        {"candidate", required_argument, 0, OPT_CAND},
        {"reference-repeat", required_argument, 0, OPT_REPEAT},
        {"references-differ", no_argument, 0, OPT_DIFFER},
        {"weights", required_argument, 0, OPT_WEIGHTS},
        {"skips-calls", no_argument, 0, OPT_SKIPS},
        {"held-out", no_argument, 0, OPT_HELD_OUT},
        {"no-held-out", no_argument, 0, OPT_NO_HELD_OUT},
        {"out", required_argument, 0, OPT_OUT},
        {"records", required_argument, 0, OPT_RECORDS},
        {"help", no_argument, 0, OPT_HELP},
        {"version", no_argument, 0, OPT_VERSION},
        {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->o.headroom = 1.5;
    a->o.atol = a->o.rtol = 1e-3;
    opterr = 0;
    int c, rc;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1)
        if ((rc = parse_option(a, c, argv)) >= 0)
            return rc;
    if ((rc = check_cli(a, argc, argv)) >= 0)
        return rc;
    a->o.references = a->refs;
    a->o.nreferences = a->nref;
    a->o.candidates = a->cands;
    a->o.ncandidates = a->ncand;
    a->o.repeats = a->reps;
    a->o.nrepeats = a->nrep;
    a->o.records = a->recs;
    a->o.nrecords = a->nrec;
    return -1;
}

/* The calibration file into path ('-': stdout), replaced only when complete.
 * 0, or 2 after one line. */
static int write_result(const char *path, const probe_calibrate_result *r, int *to_stdout)
{
    probe_outfile of;
    if (probe_outfile_open(&of, path) != 0) {
        fprintf(stderr, "probe-calibrate: %s\n", of.err);
        return 2;
    }
    *to_stdout = of.f == stdout;
    probe_status s = probe_calibrate_write_json(r, of.f);
    if (s != PROBE_OK) {
        int kept = of.tmp != NULL;
        probe_outfile_abort(&of);
        fprintf(stderr, "probe-calibrate: cannot write %s: %s%s\n", probe_tesc(path),
                probe_tesc(probe_last_error()), kept ? " (the file is unchanged)" : "");
        return 2;
    }
    if (probe_outfile_commit(&of) != 0) {
        fprintf(stderr, "probe-calibrate: %s\n", of.err);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* past RLIMIT_FSIZE a write fails with EFBIG (one line, the earlier output kept)
     * instead of the signal killing the tool */
    signal(SIGXFSZ, SIG_IGN);
    static cli a;
    int rc = parse_cli(&a, argc, argv);
    if (rc >= 0)
        return rc;
    char **names = NULL, **axis_names = NULL;
    int *axis_values = NULL, *axis_ranks = NULL;
    probe_class_axis *class_axes = NULL;
    size_t n_class_axes = 0;
    probe_calibrate_result *r = NULL;
    probe_status s = probe_component_names_load(NULL, &names);
    if (s != PROBE_OK && s != PROBE_ENOTFOUND) {
        fprintf(stderr, "probe-calibrate: %s\n", probe_tesc(probe_last_error()));
        rc = 2;
        goto done;
    }
    a.o.known_components = (const char *const *)names; /* NULL: no table installed, any name */
    /* The component table's channel axes, as probe-compare takes them. */
    s = probe_component_axes_load(NULL, &axis_names, &axis_values, &axis_ranks);
    if (s != PROBE_OK && s != PROBE_ENOTFOUND) {
        fprintf(stderr, "probe-calibrate: %s\n", probe_tesc(probe_last_error()));
        rc = 2;
        goto done;
    }
    a.o.axis_components = axis_names;
    a.o.axis_values = axis_values;
    a.o.axis_ranks = axis_ranks;
    if (s == PROBE_OK &&
        probe_component_class_axes_load(NULL, &class_axes, &n_class_axes) == PROBE_OK) {
        a.o.class_axes = class_axes;
        a.o.n_class_axes = n_class_axes;
    }
    if ((s = probe_calibrate_run(&a.o, &r)) != PROBE_OK) {
        fprintf(stderr, "probe-calibrate: %s\n", probe_tesc(probe_last_error()));
        rc = 2;
        goto done;
    }
    int to_stdout = 0;
    if ((rc = write_result(a.out_path, r, &to_stdout)))
        goto done;
    rc = r->t1_above_floor ? 0 : 1;
    /* With the file on stdout, the summary goes to stderr. */
    print_summary(to_stdout ? stderr : stdout, r);
done:
    probe_component_names_free(names);
    probe_component_names_free(axis_names);
    free(axis_values);
    free(axis_ranks);
    probe_component_class_axes_free(class_axes, n_class_axes);
    probe_calibrate_result_free(r);
    return rc;
}
