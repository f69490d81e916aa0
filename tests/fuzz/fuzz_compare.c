/* fuzz_compare - libFuzzer harness for the compare engine (probe/compare/compare.c,
 * metrics/metrics.c, probe/compare/tensor_stats.c and the JSON/JUnit/HTML writers).
 *
 * The input is a mutated candidate capture file; the reference is fixed: the
 * capture fuzz_write_capture(…, 0) writes once at start-up (the seed corpus
 * holds its variants 1-3 and h5py files with the same paths, so mutations
 * start from files whose tensors match the reference's). probe_compare_files
 * runs under T1 with the report statistics and two metric worker threads,
 * and a result is written as JSON, JUnit and HTML to /dev/null. The
 * reference stays in the scratch folder (fuzz_common.h) until exit. Any
 * status is fine; a crash, sanitizer report, leak or hang is a finding. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "probe/compare.h"

static char ref_path[128];
static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* a scratch file (fuzz_tmpfile makes the folder), then the writer fills it */
    if (fuzz_tmpfile((const uint8_t *)"", 0, "reference.h5", ref_path, sizeof ref_path) != 0 ||
        fuzz_write_capture(ref_path, 0) != PROBE_OK) {
        fprintf(stderr, "fuzz_compare: cannot write the reference: %s\n", probe_last_error());
        abort();
    }
    devnull = fopen("/dev/null", "w");
    if (devnull == NULL)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[128];
    if (fuzz_tmpfile(data, size, "candidate.h5", path, sizeof path) != 0)
        return 0;
    probe_compare_opts o;
    memset(&o, 0, sizeof o);
    if (probe_gate_parse("T1", &o.gate) != PROBE_OK)
        abort();
    o.want_stats = 1;
    o.threads = 2;
    probe_compare_result *r = NULL;
    for (int swap = 0; swap < 2; swap++) { /* the mutated file on each side */
        if (probe_compare_files(swap ? path : ref_path, swap ? ref_path : path, &o, &r) == PROBE_OK) {
            (void)probe_compare_write_json(r, devnull);
            (void)probe_compare_write_junit(r, devnull);
            (void)probe_compare_write_html(r, devnull);
            probe_compare_result_free(r);
        }
    }
    unlink(path);
    return 0;
}
