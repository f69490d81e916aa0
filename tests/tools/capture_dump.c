/* capture_dump FILE - print what the probe reader sees in an HDF5 file, one
 * line per item, tab-separated, for tests/e2e/test_h5py_interop.py:
 *   tensor PATH DTYPE SHAPE N SEQ COMPONENT SLOT VALUES
 *     SHAPE is the dims joined by ',' ("" for rank 0); VALUES are the
 *     elements from probe_file_read_f64, space-separated, printf %.17g
 *   attrs PATH CALL STEP CFG_BRANCH TIMESTEP(%.17g) HASH SCOPE
 *   raw PATH HEX          (probe_file_read_raw bytes, lowercase hex)
 *   ignored COUNT
 *   skip PATH REASON
 *   manifest JSON         (only if present)
 * Exit 0 on success, 2 with "capture_dump: MESSAGE (STATUS)" on stderr. */
#include <stdio.h>
#include <stdlib.h>

#include "probe/capture.h"

static int fail(probe_status s)
{
    fprintf(stderr, "capture_dump: %s (%s)\n", probe_last_error(), probe_status_str(s));
    return 2;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: capture_dump FILE\n");
        return 2;
    }
    probe_file *f;
    probe_status s = probe_file_open(argv[1], &f);
    if (s != PROBE_OK)
        return fail(s);
    for (size_t i = 0; i < probe_file_count(f); i++) {
        const probe_tensor_info *t = probe_file_tensor(f, i);
        printf("tensor\t%s\t%s\t", t->path, probe_dtype_name(t->dtype));
        for (int k = 0; k < t->rank; k++)
            printf("%s%lld", k ? "," : "", (long long)t->shape[k]);
        printf("\t%llu\t%lld\t%s\t%s\t", (unsigned long long)t->n, (long long)t->seq, t->component, t->slot);
        size_t nbytes = (size_t)t->n * probe_dtype_size(t->dtype);
        double *v = malloc(t->n ? t->n * sizeof *v : 1);
        unsigned char *raw = malloc(nbytes ? nbytes : 1);
        if (v == NULL || raw == NULL)
            return 2;
        if ((s = probe_file_read_f64(f, i, v)) != PROBE_OK || (s = probe_file_read_raw(f, i, raw, nbytes)) != PROBE_OK)
            return fail(s);
        for (uint64_t k = 0; k < t->n; k++)
            printf("%s%.17g", k ? " " : "", v[k]);
        printf("\nattrs\t%s\t%lld\t%lld\t%d\t%.17g\t%s\t%s\nraw\t%s\t", t->path, (long long)t->call,
               (long long)t->step, (int)t->cfg_branch, t->timestep, t->hash, t->scope, t->path);
        for (size_t k = 0; k < nbytes; k++)
            printf("%02x", raw[k]);
        printf("\n");
        free(v);
        free(raw);
    }
    printf("ignored\t%zu\n", probe_file_ignored_count(f));
    for (size_t i = 0; i < probe_file_skip_count(f); i++)
        printf("skip\t%s\t%s\n", probe_file_skip(f, i)->path, probe_file_skip(f, i)->reason);
    if (probe_file_manifest(f) != NULL)
        printf("manifest\t%s\n", probe_file_manifest(f));
    probe_file_close(f);
    return 0;
}
