/* probe-recover: rewrite a capture whose writer was killed (it has a
 * journal, docs/file-format.md "Journal") as a clean HDF5 capture that any
 * HDF5 reader (h5py) opens.
 *
 *   probe-recover X.h5 [-o OUT.h5]
 *
 * Reads X through its journal (the complete captures only; the partial one
 * is dropped and named), writes every tensor with its attributes (a
 * stats-only record as a stats-only record: its summary and hash), the skips
 * and the manifest to OUT, and closes it cleanly. Without -o, X itself is
 * replaced and X.journal removed. OUT (or X) is replaced atomically (textsafe.h probe_outfile): a
 * failed write leaves it as it was. Exit 0 on success (also when X has no journal: nothing to do),
 * 2 on bad arguments or a file that cannot be read or written (one line
 * `probe-recover: ...` on stderr). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <time.h>

#include "probe/capture.h"
#include "../../metrics/vocab/textsafe.h"

/* The manifest of the rewritten file: X's, with the key "recovered" set to
 * {"journal": NAME, "complete": N, "partial": PATH or null, "reason": TEXT,
 * "lost": L, "by": "probe-recover", "time": ISO 8601 UTC}, so the clean file
 * still says that it was read from a killed run's journal. malloc'd; NULL
 * when X's manifest is absent or not a JSON object (kept as it is). */
static char *recovered_manifest(probe_file *f, const probe_recovery_info *ri)
{
    const char *text = probe_file_manifest(f);
    json_t *m = text ? json_loads(text, 0, NULL) : NULL;
    if (!json_is_object(m)) {
        json_decref(m);
        return NULL;
    }
    const char *jbase = strrchr(ri->journal, '/');
    char when[32] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *r = json_pack("{s:s, s:I, s:o, s:s, s:I, s:s, s:s}", "journal",
                          jbase ? jbase + 1 : ri->journal, "complete", (json_int_t)ri->complete,
                          "partial", ri->partial[0] ? json_string(ri->partial) : json_null(),
                          "reason", ri->reason, "lost", (json_int_t)ri->lost, "by",
                          "probe-recover", "time", when);
    char *out = NULL;
    if (r && json_object_set_new(m, "recovered", r) == 0)
        out = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(m);
    return out;
}

static int copy_all(probe_file *f, const char *out)
{
    probe_writer *w;
    char *manifest = recovered_manifest(f, probe_file_recovery(f));
    probe_status o = probe_writer_open(out, manifest ? manifest : probe_file_manifest(f), &w);
    free(manifest);
    if (o != PROBE_OK) {
        fprintf(stderr, "probe-recover: %s\n", probe_tesc(probe_last_error()));
        return 2;
    }
    probe_status s = PROBE_OK;
    for (size_t i = 0; i < probe_file_count(f) && s == PROBE_OK; i++) {
        const probe_tensor_info *t = probe_file_tensor(f, i);
        size_t nb = t->stats_only ? 0 : (size_t)t->n * probe_dtype_size(t->dtype);
        void *buf = malloc(nb ? nb : 1);
        if (buf == NULL) {
            s = probe_set_error(PROBE_ENOMEM, "%s: out of memory (%zu bytes)", t->path, nb);
            break;
        }
        probe_summary sum; /* a stats-only record: its summary and hashes, no bytes */
        uint64_t hash = 0, tree = 0;
        if (t->stats_only) {
            s = probe_file_summary(f, i, &sum);
            if (s == PROBE_OK && t->hash[0])
                s = probe_file_hash(f, i, &hash);
            if (s == PROBE_OK && t->tree_hash[0])
                s = probe_file_tree_hash(f, i, &tree);
        } else {
            s = probe_file_read_raw(f, i, buf, nb);
        }
        char *op = NULL; /* an interposed operand's probe.op (kept by the journal) */
        if (s == PROBE_OK && probe_file_tensor_attr(f, i, "probe.op", &op) == PROBE_ENOMEM)
            s = PROBE_ENOMEM;
        probe_record rec = {.path = t->path, .component = t->component, .slot = t->slot,
                            .call = t->call, .step = t->step, .cfg_branch = t->cfg_branch,
                            .timestep = t->timestep, .scope = t->scope,
                            .seq = t->seq >= 0 ? (uint64_t)t->seq : (uint64_t)i, .dtype = t->dtype,
                            .rank = t->rank, .shape = t->shape, .op = op,
                            .parent = t->parent, .block = t->block, .class_name = t->class_name,
                            .module = t->module};
        if (s == PROBE_OK)
            s = t->stats_only ? probe_writer_put_summary_ex(w, &rec, &sum, t->hash[0] ? &hash : NULL,
                                                            t->tree_hash[0] ? &tree : NULL)
                              : probe_writer_put(w, &rec, buf, nb);
        free(op);
        free(buf);
    }
    for (size_t i = 0; i < probe_file_skip_count(f) && s == PROBE_OK; i++) {
        const probe_skip_info *k = probe_file_skip(f, i);
        probe_record rec = {.path = k->path};
        s = probe_writer_skip(w, &rec, k->reason);
    }
    char msg[1024] = "";
    if (s != PROBE_OK)
        snprintf(msg, sizeof msg, "%s", probe_last_error());
    probe_status c = probe_writer_close(w);
    if (s == PROBE_OK && c != PROBE_OK)
        snprintf(msg, sizeof msg, "%s", probe_last_error());
    if (s != PROBE_OK || c != PROBE_OK) {
        fprintf(stderr, "probe-recover: %s%s\n", probe_tesc(msg), " (the file is unchanged)");
        unlink(out);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* past RLIMIT_FSIZE a write fails with EFBIG (one line, the earlier output kept)
     * instead of the signal killing the tool */
    signal(SIGXFSZ, SIG_IGN);
    const char *out = NULL;
    static const struct option longopts[] = {{"output", required_argument, 0, 'o'},
                                             {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        if (c == 'o') {
            out = optarg;
        } else if (c == 'h') {
            printf("usage: probe-recover X.h5 [-o OUT.h5]\n"
                   "Rewrite a capture whose writer was killed (X.h5.journal next to it) as a clean\n"
                   "HDF5 capture: OUT.h5, or X.h5 itself (its journal removed) without -o.\n");
            return 0;
        } else {
            fprintf(stderr, "usage: probe-recover X.h5 [-o OUT.h5]\n");
            return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "probe-recover: expected one capture file, got %d\n", argc - optind);
        return 2;
    }
    const char *in = argv[optind];
    probe_file *f;
    if (probe_file_open(in, &f) != PROBE_OK) {
        fprintf(stderr, "probe-recover: %s\n", probe_tesc(probe_last_error()));
        return 2;
    }
    const probe_recovery_info *ri = probe_file_recovery(f);
    if (!ri->recovered) {
        fprintf(stderr, "probe-recover: %s was closed by its writer: nothing to recover\n",
                probe_tesc(in));
        probe_file_close(f);
        return 0;
    }
    char journal[sizeof ri->journal], partial[sizeof ri->partial];
    snprintf(journal, sizeof journal, "%s", ri->journal);
    snprintf(partial, sizeof partial, "%s", ri->partial);
    size_t n = probe_file_count(f), lost = ri->lost;
    probe_outfile of;
    if (probe_outfile_reserve(&of, out != NULL ? out : in) != 0) {
        fprintf(stderr, "probe-recover: %s\n", of.err);
        probe_file_close(f);
        return 2;
    }
    int rc = copy_all(f, of.tmp);
    probe_file_close(f);
    if (rc != 0) {
        probe_outfile_abort(&of);
    } else if (probe_outfile_commit_path(&of) != 0) {
        fprintf(stderr, "probe-recover: %s\n", of.err);
        rc = 2;
    } else if (out == NULL && unlink(journal) != 0) {
        fprintf(stderr, "probe-recover: cannot remove %s: %s\n", probe_tesc(journal), strerror(errno));
        rc = 2;
    }
    if (rc == 0) {
        fprintf(stderr, "probe-recover: wrote %s: %zu complete captures from %s%s%s%s",
                probe_tesc(out != NULL ? out : in), n, probe_tesc(journal),
                partial[0] ? "; partial capture " : "", probe_tesc(partial),
                partial[0] ? " dropped" : "");
        if (lost > 0)
            fprintf(stderr, "; %zu tapped tensor%s lost (listed as skipped)", lost, lost == 1 ? "" : "s");
        fprintf(stderr, "; recorded in its manifest as \"recovered\"\n");
    }
    return rc;
}
