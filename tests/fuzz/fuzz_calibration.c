/* fuzz_calibration - libFuzzer harness for T2 calibration files
 * (metrics/calibration_file.c, docs/calibration.md).
 *
 * The input is a calibration JSON file. It is loaded twice (with the
 * component table's names as the known components, and with any name
 * accepted), and a loaded calibration is asked for the thresholds of a few
 * components and paths (glob matching of "tensors" entries) and the gate is
 * applied to a fixed set of metrics. Any status is fine; a crash, sanitizer
 * report, leak or hang is a finding. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "probe/gate.h"
#include "probe/calibration_file.h"

static const char *const known[] = {"text_encoder", "dit.step", "scheduler.step", "vae.encode",
                                    "vae.decode", NULL};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[128];
    if (fuzz_tmpfile(data, size, "calibration.json", path, sizeof path) != 0)
        return 0;
    for (int k = 0; k < 2; k++) {
        probe_calibration *c = NULL;
        if (probe_calibration_load(path, k ? NULL : known, &c) != PROBE_OK)
            continue;
        static const char *const q[][2] = {
            {"dit.step", "/dit.step/0003/out"},
            {"vae.decode", "/vae.decode/0000/out.sample"},
            {"x", "/x/[a-z]*/\\*"},
            {NULL, "/"},
            {"text_encoder", NULL},
        };
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
            probe_gate g;
            if (probe_calibration_gate(c, q[i][0], q[i][1], &g) != PROBE_OK)
                continue;
            probe_metrics m;
            memset(&m, 0, sizeof m);
            m.n = 10;
            m.rel_l2 = 1e-3;
            m.cosine = 0.999;
            m.max_abs = 0.5;
            m.p99_abs = 0.25;
            m.mean_abs = 0.01;
            m.mismatch_fraction = 0.1;
            probe_gate_verdict v;
            (void)probe_gate_check(&g, &m, &v);
        }
        probe_calibration_free(c);
    }
    unlink(path);
    return 0;
}
