/* probe/oracle/oracle_check.h - the fp64 oracle check of a capture file
 * (docs/oracle.md): every op whose probe.op record names an op it knows
 * (gemm, rmsnorm, layernorm, rope, attention, silu, gelu) and whose operands
 * are in the file is recomputed in fp64 (references/) and its captured output
 * gated against the rounding-error bound of its precision. Part of libprobe;
 * internal to the build tree (not installed): probe-oracle is its user. */
#ifndef PROBE_ORACLE_CHECK_H
#define PROBE_ORACLE_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "probe/capture.h"
#include "probe/gate.h"
#include "probe/metrics.h"

typedef enum probe_oracle_verdict {
    PROBE_ORACLE_PASS,
    PROBE_ORACLE_FAIL,
    PROBE_ORACLE_NOT_CHECKABLE
} probe_oracle_verdict;

/* One checked op: its output, the bound it was gated against, the worst
 * element, and T1 metrics of the output against the fp64 result. */
typedef struct probe_oracle_op {
    char path[512];        /* the output's path (or the record's, without one) */
    char op[32];
    char api[64];
    probe_oracle_verdict v;
    char reason[512];      /* not checkable: why; fail: the worst element */
    char dtype[24];
    int rank;
    int64_t shape[PROBE_MAX_RANK];
    uint64_t n;
    double u_acc, u_out;
    double max_ratio, worst_err, worst_bound, worst_ref, worst_cand;
    int64_t worst_index[PROBE_MAX_RANK];
    uint64_t violations;
    probe_metrics m;
    int have_metrics;
    probe_gate_verdict t1;
} probe_oracle_op;

typedef struct probe_oracle_opts {
    const char *const *only; /* check only ops whose output path matches one (fnmatch) */
    int nonly;               /* 0: every op */
    double max_flops;        /* an op with more fp64 work is not checkable */
} probe_oracle_opts;

typedef struct probe_oracle_report {
    probe_oracle_op *ops; /* in the file's order, one per op (checked from its first dataset) */
    size_t nops;
    size_t npass, nfail, nnot_checkable;
} probe_oracle_report;

/* Check every op of f (file: its name, for messages) into *out. Returns 0,
 * or 2 after one line on stderr ("probe-oracle: FILE: PATH: why"): a file
 * that cannot be read, or a probe.op record that is not valid JSON, lacks a
 * required field or names an operand that is not in the file; *out then
 * holds the ops up to that one. Free *out with probe_oracle_report_free. */
int probe_oracle_check_file(probe_file *f, const char *file, const probe_oracle_opts *opts,
                            probe_oracle_report *out);
void probe_oracle_report_free(probe_oracle_report *r);

/* The report as probe-oracle's JSON (version 1, docs/oracle.md): a new reference. */
json_t *probe_oracle_report_json(const probe_oracle_report *r, const char *file);

/* The op's output shape as "[d0, d1, ...]". */
void probe_oracle_format_shape(const probe_oracle_op *r, char *buf, size_t size);

#endif
