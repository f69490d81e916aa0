/* probe/report/text.h - a compare result as the text probe-compare prints.
 * Internal to the build tree (not installed). Every string from a capture
 * file goes through probe_tesc (metrics/vocab/textsafe.h) before it is printed. */
#ifndef PROBE_REPORT_TEXT_H
#define PROBE_REPORT_TEXT_H

#include <stddef.h>
#include <stdio.h>

#include "probe/compare.h"
#include "probe/kernels.h"

/* The gate's name, plus any --atol/--rtol override ("T1 atol=...") into buf. */
void probe_text_gate_label(char *buf, size_t cap, const probe_compare_opts *o);

/* Everything before the verdict line, in this order: the run manifests side
 * by side, rank sets, threads, the per-tensor table, root inputs, the
 * isolated run, and the kernels only one run launched (kernels may be NULL;
 * all_kernels lists them all instead of 5 per side). */
void probe_text_details(FILE *out, const probe_compare_result *r, const char *gate,
                        const probe_kernel_diff *kernels, int all_kernels);

/* The reasons of a failed run, where the difference was introduced, and
 * the last line: PASS or FAIL with the counts and the gate. */
void probe_text_verdict(FILE *out, const probe_compare_result *r, const char *gate);

#endif
