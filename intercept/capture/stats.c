/* stats.c - stats-only capture (PROBE_STATS_ONLY=1, probe-run --stats-only; or
 * only the tensors PROBE_STATS_ONLY_FOR selects, probe-run --stats-only-for):
 * the writer thread keeps each selected tensor's summary (probe_summary:
 * counts, min, max, max |x|, sum, sum of squares), the XXH64 of its bytes and
 * their tree hash instead of the bytes (docs/file-format.md "Stats-only
 * records", "Tree order").
 *
 * A contiguous device tensor is summarized on the GPU (capture/cuda.c,
 * shim_cuda_summarize, with libprobe_cuda.so): its record has the tree hash
 * only. Other device tensors (strided, PROBE_DEVICE_SUMMARY=0, no
 * libprobe_cuda.so) travel through the staging copy and are summarized on
 * the host, on the writer thread, from the same contiguous bytes a full
 * capture would store. The writer functions come from libprobe.so
 * (dlopen'ed, libprobe.c). */
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/libprobe.h"
#include "base/shim.h"
#include "capture/select.h"
#include "capture/stats.h"

static atomic_int warned_old_libprobe;

void shim_stats_config(void)
{
    const char *v = getenv("PROBE_STATS_ONLY");
    if (!v || !*v || strcmp(v, "0") == 0) {
        shim_cfg.stats_only = 0;
        return;
    }
    /* Someone who set the variable to anything else meant "on": writing
     * every byte of a run that was too large to store is the worse mistake. */
    if (strcmp(v, "1") != 0)
        shim_warn_config("PROBE_STATS_ONLY=%s is neither 0 nor 1; taking it as 1 (stats-only capture)",
                         v);
    shim_cfg.stats_only = 1;
}

int shim_stats_selected(const char *path, int64_t step, int32_t cfg_branch, int64_t block)
{
    return shim_cfg.stats_only || shim_select_stats_for(path, step, cfg_branch, block);
}

int shim_stats_on_device(void)
{
    return shim_libprobe_api.writer_put_summary && shim_libprobe_api.writer_put_summary_ex;
}

probe_status shim_stats_put_device(probe_writer *w, const probe_record *rec,
                                   const probe_summary *sum, uint64_t tree_hash)
{
    return shim_libprobe_put_summary(w, rec, sum, NULL, &tree_hash);
}

probe_status shim_stats_put(probe_writer *w, const probe_record *rec, const void *data,
                            size_t nbytes)
{
    if (!shim_stats_selected(rec->path, rec->step, rec->cfg_branch,
                             rec->parent && rec->parent[0] ? rec->block : -1))
        return shim_libprobe_put(w, rec, data, nbytes);
    if (!shim_libprobe_api.writer_put_summary || !shim_libprobe_api.summary_compute || !shim_libprobe_api.capture_hash) {
        if (atomic_exchange(&warned_old_libprobe, 1) == 0)
            shim_warn("libprobe.so has no probe_writer_put_summary: writing full tensors, not "
                      "stats-only records");
        return shim_libprobe_put(w, rec, data, nbytes);
    }
    size_t esize = probe_dtype_size(rec->dtype);
    size_t n = esize ? nbytes / esize : 0;
    /* The file stores bool as 0/1 and hashes those bytes (writer.c): hash
     * the same bytes so that a stats-only record matches a full capture. */
    unsigned char *norm = NULL;
    if (rec->dtype == PROBE_DTYPE_BOOL && nbytes > 0) {
        norm = malloc(nbytes);
        if (!norm)
            return PROBE_ENOMEM;
        for (size_t i = 0; i < nbytes; ++i)
            norm[i] = ((const unsigned char *)data)[i] != 0;
        data = norm;
    }
    /* the summary and both hashes: the XXH64 of a full capture's bytes and
     * the tree hash a record made on a GPU carries */
    probe_summary sum;
    uint64_t tree = 0;
    int have_tree = shim_libprobe_api.summary_tree && shim_libprobe_api.writer_put_summary_ex;
    probe_status st = have_tree ? shim_libprobe_api.summary_tree(rec->dtype, data, n, &sum, &tree)
                                : shim_libprobe_api.summary_compute(rec->dtype, data, n, &sum);
    uint64_t hash = shim_libprobe_api.capture_hash(data, nbytes);
    if (st == PROBE_OK)
        st = shim_libprobe_put_summary(w, rec, &sum, &hash, have_tree ? &tree : NULL);
    free(norm);
    return st;
}

void shim_stats_json(struct shim_json *b)
{
    if (shim_cfg.stats_only)
        shim_json_raw(b, ",\"stats_only\":true");
    const char *spec = getenv("PROBE_STATS_ONLY_FOR");
    if (!shim_cfg.stats_only && spec && *spec && shim_select_stats_for_count() > 0) {
        shim_json_raw(b, ",\"stats_only_for\":");
        shim_json_string(b, spec);
    }
    if (shim_cfg.capture_error) {
        shim_json_raw(b, ",\"capture_error\":");
        shim_json_string(b, shim_cfg.capture_error);
    }
}
