/* check_capture.c - reads the capture written by tests/gpu/tap_device with
 * libprobe's reader (include/probe/capture.h) and compares every tensor bit
 * for bit with the device buffers tap_device saved after the run.
 *
 * usage: check_capture FILE.h5 DIR
 * DIR/cases.txt: one line per tensor, "path dtype offset rank shape...
 * strides...|- binfile" (strides in elements, offset in elements into the
 * saved base buffer). The expected bytes are gathered here with a plain
 * odometer over the multi-index, independently of the shim's gather.
 * Also checks the recorded skips and the manifest. Prints PASS/FAIL lines;
 * exit 0 when all pass, 1 otherwise, 2 when the file cannot be read.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe/capture.h"
#include "probe/dtype.h"

static int failures;

static void result(int ok, const char *what, const char *path)
{
    printf("%s %s %s\n", ok ? "PASS" : "FAIL", what, path);
    if (!ok)
        ++failures;
}

static void *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s FILE.h5 DIR\n", argv[0]);
        return 2;
    }
    probe_file *f = NULL;
    if (probe_file_open(argv[1], &f) != PROBE_OK) {
        printf("FAIL cannot open %s: %s\n", argv[1], probe_last_error());
        return 2;
    }
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/cases.txt", argv[2]);
    FILE *cases = fopen(cpath, "r");
    if (!cases) {
        printf("FAIL cannot read %s\n", cpath);
        return 2;
    }
    char line[4096];
    while (fgets(line, sizeof line, cases)) {
        char path[512], bin[512], *tok, *save = NULL;
        int dtype, rank;
        size_t offset;
        int64_t shape[PROBE_MAX_RANK], strides[PROBE_MAX_RANK];
        int has_strides = 1;
        tok = strtok_r(line, " \n", &save);
        if (!tok)
            continue;
        snprintf(path, sizeof path, "%s", tok);
        dtype = atoi(strtok_r(NULL, " \n", &save));
        offset = strtoull(strtok_r(NULL, " \n", &save), NULL, 10);
        rank = atoi(strtok_r(NULL, " \n", &save));
        for (int k = 0; k < rank; ++k)
            shape[k] = strtoll(strtok_r(NULL, " \n", &save), NULL, 10);
        tok = strtok_r(NULL, " \n", &save);
        if (strcmp(tok, "-") == 0) {
            has_strides = 0;
        } else {
            strides[0] = strtoll(tok, NULL, 10);
            for (int k = 1; k < rank; ++k)
                strides[k] = strtoll(strtok_r(NULL, " \n", &save), NULL, 10);
        }
        snprintf(bin, sizeof bin, "%s/%s", argv[2], strtok_r(NULL, " \n", &save));
        if (!has_strides) { /* row-major */
            int64_t st = 1;
            for (int k = rank - 1; k >= 0; --k) {
                strides[k] = st;
                st *= shape[k];
            }
        }

        size_t idx;
        if (probe_file_find(f, path, &idx) != PROBE_OK) {
            result(0, "present", path);
            continue;
        }
        const probe_tensor_info *ti = probe_file_tensor(f, idx);
        int shape_ok = ti->rank == rank && (int)ti->dtype == dtype;
        uint64_t n = 1;
        for (int k = 0; k < rank; ++k) {
            shape_ok = shape_ok && ti->shape[k] == shape[k];
            n *= (uint64_t)shape[k];
        }
        result(shape_ok, "dtype and shape", path);
        if (!shape_ok)
            continue;
        size_t es = probe_dtype_size((probe_dtype)dtype), nbase = 0;
        unsigned char *base = slurp(bin, &nbase);
        unsigned char *want = malloc(n * es + 1), *got = malloc(n * es + 1);
        int64_t ix[PROBE_MAX_RANK] = {0};
        int in_range = base != NULL;
        for (uint64_t e = 0; e < n && in_range; ++e) {
            size_t off = offset;
            for (int k = 0; k < rank; ++k)
                off += (size_t)(ix[k] * strides[k]);
            if ((off + 1) * es > nbase) {
                in_range = 0;
                break;
            }
            memcpy(want + e * es, base + off * es, es);
            for (int k = rank - 1; k >= 0; --k) {
                if (++ix[k] < shape[k])
                    break;
                ix[k] = 0;
            }
        }
        result(in_range, "expected data available", path);
        if (in_range) {
            int rd = probe_file_read_raw(f, idx, got, n * es) == PROBE_OK;
            result(rd && memcmp(want, got, n * es) == 0, "bit-exact", path);
        }
        free(base);
        free(want);
        free(got);
    }
    fclose(cases);

    int found = 0;
    for (size_t i = 0; i < probe_file_skip_count(f); ++i) {
        const probe_skip_info *s = probe_file_skip(f, i);
        printf("skip %s: %s\n", s->path, s->reason);
        if (strcmp(s->path, "/graph/0000/out") == 0 && strcmp(s->reason, "stream is capturing a CUDA graph") == 0)
            found = 1;
    }
    result(found, "tap on the capturing stream recorded as skipped", "/graph/0000/out");
    size_t idx;
    if (probe_file_find(f, "/graph/0002/out", &idx) == PROBE_OK)
        printf("note /graph/0002/out (legacy stream during the capture): captured\n");
    else
        printf("note /graph/0002/out (legacy stream during the capture): not captured (see skips)\n");
    const char *m = probe_file_manifest(f);
    printf("manifest: %s\n", m ? m : "(none)");
    result(m && strstr(m, "\"cuda\":{\"runtime_version\":") != NULL, "manifest has CUDA versions and devices", "/");
    probe_file_close(f);
    printf("check_capture: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
