/* make_seeds DIR - write the probe-writer part of the fuzz seed corpus:
 * DIR/capture_v{0,...,5}.h5 (fuzz_common.h's reference and its variants).
 * tests/fuzz/make_corpus.py adds the h5py files and calibration JSON. */
#include <stdio.h>

#include "fuzz_common.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    for (int v = 0; v < 6; v++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/capture_v%d.h5", argv[1], v);
        if (fuzz_write_capture(path, v) != PROBE_OK) {
            fprintf(stderr, "make_seeds: %s\n", probe_last_error());
            return 2;
        }
    }
    return 0;
}
