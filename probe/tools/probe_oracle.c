/* probe-oracle: recompute the captured ops of a capture file in fp64
 * (references/) and gate each captured output against the rounding-error
 * bound its precision implies (docs/oracle.md).
 *   exit 0  every checkable op passes (ops whose inputs are not in the file
 *           are listed as "not checkable", which is not a failure)
 *   exit 1  an op's output violates its bound
 *   exit 2  bad arguments, a file that cannot be read, or a probe.op record
 *           that is not valid JSON, lacks a required field or names an
 *           operand that is not in the file
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../../metrics/vocab/textsafe.h"
#include "../oracle/oracle_check.h"
#include "probe/capture.h"

#define MAX_ONLY 64

static void usage(FILE *f)
{
    fprintf(f,
            "usage: probe-oracle [options] FILE.h5\n"
            "Recompute every captured op whose probe.op record names an op it knows (gemm,\n"
            "rmsnorm, layernorm, rope, attention, silu, gelu) and whose inputs are in the\n"
            "file, in fp64, and gate the captured output against the rounding-error bound\n"
            "of its precision (docs/oracle.md). T1 metrics are reported as information.\n\n"
            "  --json FILE      write the result as JSON ('-' for stdout)\n"
            "  --only GLOB      check only ops whose output path matches GLOB (repeatable)\n"
            "  --max-flops N    refuse (not checkable) an op whose fp64 work exceeds N\n"
            "                   floating-point operations (default 1e10)\n"
            "  --quiet          print only the final line\n"
            "  --help (-h)\n\n"
            "exit status: 0 every checkable op passes, 1 an op fails its bound,\n"
            "2 bad arguments, an unreadable file or a malformed probe.op record\n");
}

/* The command line, parsed. */
typedef struct cli {
    const char *json_out;
    const char *only[MAX_ONLY];
    int nonly, quiet;
    double max_flops;
    const char *file;
} cli;

/* -1 to go on, else the exit status (0 after --help, 2 after one line). */
static int parse_cli(cli *a, int argc, char **argv)
{
    enum { OPT_JSON = 256, OPT_ONLY, OPT_QUIET, OPT_MAXF, OPT_HELP };
    static const struct option lo[] = {
        {"json", required_argument, 0, OPT_JSON},   {"only", required_argument, 0, OPT_ONLY},
        {"quiet", no_argument, 0, OPT_QUIET},       {"max-flops", required_argument, 0, OPT_MAXF},
        {"help", no_argument, 0, OPT_HELP},         {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->max_flops = 1e10;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case OPT_JSON: a->json_out = optarg; break;
        case OPT_ONLY:
            if (a->nonly == MAX_ONLY) {
                fprintf(stderr, "probe-oracle: more than %d --only patterns\n", MAX_ONLY);
                return 2;
            }
            a->only[a->nonly++] = optarg;
            break;
        case OPT_QUIET: a->quiet = 1; break;
        case OPT_MAXF: {
            char *end;
            errno = 0;
            double v = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(v > 0) || !isfinite(v)) {
                fprintf(stderr, "probe-oracle: --max-flops '%s': not a positive number\n", optarg);
                return 2;
            }
            a->max_flops = v;
            break;
        }
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        default:
            fprintf(stderr, "probe-oracle: unknown or incomplete option '%s' (--help for usage)\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "usage: probe-oracle [options] FILE.h5 (--help for more)\n");
        return 2;
    }
    a->file = argv[optind];
    return -1;
}

/* One line per op: verdict, err/bound, rel_l2, cosine, op, shape, path. */
static void print_ops(const probe_oracle_report *rep)
{
    printf("%-13s %-10s %-10s %-10s %-10s %-20s %s\n", "verdict", "err/bound", "rel_l2",
           "cosine", "op", "shape", "path");
    for (size_t i = 0; i < rep->nops; i++) {
        const probe_oracle_op *x = &rep->ops[i];
        char sh[128] = "-";
        if (x->v == PROBE_ORACLE_NOT_CHECKABLE) {
            printf("%-13s %-10s %-10s %-10s %-10s %-20s %s\n", "not-checkable", "-", "-", "-",
                   probe_tesc(x->op), sh, probe_tesc(x->path));
            printf("    why: %s\n", probe_tesc(x->reason));
            continue;
        }
        probe_oracle_format_shape(x, sh, sizeof sh);
        printf("%-13s %-10.3g %-10.3g %-10.8f %-10s %-20s %s\n",
               x->v == PROBE_ORACLE_PASS ? "pass" : "FAIL", x->max_ratio, x->m.rel_l2, x->m.cosine,
               probe_tesc(x->op), sh, probe_tesc(x->path));
        if (x->v == PROBE_ORACLE_FAIL)
            printf("    %s\n", probe_tesc(x->reason));
    }
}

/* The JSON result into a->json_out ('-': stdout). 0, or 2 after one line. */
static int write_json(const cli *a, const probe_oracle_report *rep)
{
    json_t *root = probe_oracle_report_json(rep, a->file);
    int w = strcmp(a->json_out, "-") == 0
                ? json_dumpf(root, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(17))
                : json_dump_file(root, a->json_out, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
    if (w == 0 && strcmp(a->json_out, "-") == 0)
        fputc('\n', stdout);
    json_decref(root);
    if (w != 0) {
        fprintf(stderr, "probe-oracle: %s: cannot write the JSON result\n", a->json_out);
        return 2;
    }
    return 0;
}

/* The table, the summary line and the JSON. Returns the exit status. */
static int report(const cli *a, const probe_oracle_report *rep)
{
    int json_stdout = a->json_out != NULL && strcmp(a->json_out, "-") == 0;
    if (!a->quiet && !json_stdout && rep->nops > 0)
        print_ops(rep);
    size_t nres = rep->nops;
    fprintf(json_stdout ? stderr : stdout,
            "probe-oracle: %s: %zu op%s: %zu pass, %zu fail, %zu not checkable -> %s\n", a->file,
            nres, nres == 1 ? "" : "s", rep->npass, rep->nfail, rep->nnot_checkable,
            rep->nfail ? "FAIL"
            : rep->npass ? "pass"
                         : "nothing checked (no checkable op: capture GEMM operands with "
                           "probe-run --capture 'COMPONENT/*/gemm.*', docs/gemm.md)");
    int rc = rep->nfail ? 1 : 0;
    if (a->json_out != NULL && write_json(a, rep))
        rc = 2;
    return rc;
}

int main(int argc, char **argv)
{
    /* past RLIMIT_FSIZE a write fails with EFBIG (one line, the earlier output kept)
     * instead of the signal killing the tool */
    signal(SIGXFSZ, SIG_IGN);
    cli a;
    int rc = parse_cli(&a, argc, argv);
    if (rc >= 0)
        return rc;
    probe_file *f = NULL;
    if (probe_file_open(a.file, &f) != PROBE_OK) {
        fprintf(stderr, "probe-oracle: %s\n", probe_tesc(probe_last_error()));
        return 2;
    }
    probe_oracle_opts o = {a.only, a.nonly, a.max_flops};
    probe_oracle_report rep;
    rc = probe_oracle_check_file(f, a.file, &o, &rep);
    if (rc == 0)
        rc = report(&a, &rep);
    probe_oracle_report_free(&rep);
    probe_file_close(f);
    return rc;
}
