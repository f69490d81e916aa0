/* rankset.c - per-rank capture files seen as one capture (probe/rankset.h,
 * docs/nccl.md "Comparing rank sets"). */
#include "probe/rankset.h"

#include <errno.h>
#include <fnmatch.h>
#include <unistd.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* --- block layout of a concatenation --- */

probe_status probe_concat_init(probe_concat *c, int nparts, int rank, int axis,
                               const int64_t *const *shapes)
{
    if (!c || !shapes)
        return probe_set_error(PROBE_EINVAL, "probe_concat_init: NULL argument");
    memset(c, 0, sizeof *c);
    if (nparts < 1 || nparts > PROBE_RANKSET_MAX)
        return probe_set_error(PROBE_EINVAL, "concatenation of %d parts (1..%d)", nparts,
                               PROBE_RANKSET_MAX);
    if (rank < 1 || rank > PROBE_MAX_RANK || axis < 0 || axis >= rank)
        return probe_set_error(PROBE_EINVAL, "shard axis %d of a rank-%d tensor", axis, rank);
    for (int p = 0; p < nparts; p++)
        for (int d = 0; d < rank; d++) {
            if (shapes[p][d] < 0)
                return probe_set_error(PROBE_EINVAL, "part %d: negative size on axis %d", p, d);
            if (d != axis && shapes[p][d] != shapes[0][d])
                return probe_set_error(PROBE_EINVAL,
                                       "shape differs on axis %d (not the shard axis %d): %lld on "
                                       "rank 0, %lld on rank %d", d, axis,
                                       (long long)shapes[0][d], (long long)shapes[p][d], p);
        }
    c->extent = malloc((size_t)nparts * sizeof *c->extent);
    c->start = malloc(((size_t)nparts + 1) * sizeof *c->start);
    if (!c->extent || !c->start) {
        probe_concat_free(c);
        return probe_set_error(PROBE_ENOMEM, "out of memory joining %d parts", nparts);
    }
    c->nparts = nparts;
    c->outer = c->inner = 1;
    for (int d = 0; d < axis; d++)
        c->outer *= (uint64_t)shapes[0][d];
    for (int d = axis + 1; d < rank; d++)
        c->inner *= (uint64_t)shapes[0][d];
    c->start[0] = 0;
    for (int p = 0; p < nparts; p++) {
        c->extent[p] = (uint64_t)shapes[p][axis];
        c->start[p + 1] = c->start[p] + c->extent[p] * c->inner;
    }
    c->n = c->outer * c->start[nparts];
    return PROBE_OK;
}

void probe_concat_free(probe_concat *c)
{
    if (!c)
        return;
    free(c->extent);
    free(c->start);
    c->extent = c->start = NULL;
    c->nparts = 0;
}

int probe_concat_locate(const probe_concat *c, uint64_t offset, uint64_t *part_offset,
                        uint64_t *run)
{
    if (!c || !c->nparts || offset >= c->n)
        return -1;
    uint64_t row = c->start[c->nparts]; /* > 0 since offset < n */
    uint64_t o = offset / row, w = offset % row;
    /* The part p with start[p] <= w < start[p + 1] (empty parts never match). */
    int lo = 0, hi = c->nparts - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (c->start[mid] <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    uint64_t within = w - c->start[lo], block = c->extent[lo] * c->inner;
    *part_offset = o * block + within;
    *run = block - within;
    return lo;
}

/* --- the set --- */

typedef struct shard_rule {
    char *glob;
    int axis;
} shard_rule;

struct probe_rankset {
    int world;               /* 0: a plain file */
    int nfiles;
    probe_file **files;      /* by rank */
    char **paths;
    char *index;             /* index file, or NULL */
    char *index_manifest;    /* its manifest, or NULL */
    shard_rule *rules;
    size_t nrules;
    int built;
    probe_rankset_mode mode;
    probe_rankset_entry *entries;
    size_t nentries;
    probe_concat *concat;    /* per entry; nparts 0 unless joined */
    uint64_t *left_out;      /* per rank */
    size_t **emap;           /* per rank: file tensor index -> entry index (SIZE_MAX: none) */
    probe_rankset_divergence *div;
    size_t ndiv;
};

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void probe_rankset_close(probe_rankset *rs)
{
    if (!rs)
        return;
    for (int r = 0; r < rs->nfiles; r++) {
        probe_file_close(rs->files[r]);
        free(rs->paths[r]);
    }
    free(rs->files);
    free(rs->paths);
    free(rs->index);
    free(rs->index_manifest);
    for (size_t i = 0; i < rs->nrules; i++)
        free(rs->rules[i].glob);
    free(rs->rules);
    for (size_t i = 0; i < rs->nentries; i++) {
        free(rs->entries[i].holders);
        free(rs->entries[i].index);
        free(rs->entries[i].mismatch);
        if (rs->concat)
            probe_concat_free(&rs->concat[i]);
    }
    free(rs->entries);
    free(rs->concat);
    free(rs->left_out);
    for (int r = 0; rs->emap && r < rs->nfiles; r++)
        free(rs->emap[r]);
    free(rs->emap);
    free(rs->div);
    free(rs);
}

/* rank and world_size of a rank file's manifest; 0 if either is missing. */
static int manifest_rank(const probe_file *f, long long *rank, long long *world)
{
    const char *m = probe_file_manifest(f);
    json_t *j = m ? json_loads(m, 0, NULL) : NULL;
    json_t *r = j ? json_object_get(j, "rank") : NULL, *w = j ? json_object_get(j, "world_size")
                                                              : NULL;
    int ok = json_is_integer(r) && json_is_integer(w);
    if (ok) {
        *rank = json_integer_value(r);
        *world = json_integer_value(w);
    }
    json_decref(j);
    return ok;
}

/* The index's rank file names (malloc'd, joined to the index's folder) or 0. */
static probe_status index_names(const char *index, const probe_file *f, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    const char *m = probe_file_manifest(f);
    json_t *j = m ? json_loads(m, 0, NULL) : NULL;
    json_t *ranks = j ? json_object_get(j, "ranks") : NULL;
    if (!json_is_array(ranks)) {
        json_decref(j);
        return PROBE_OK;
    }
    size_t k = json_array_size(ranks);
    probe_status s = PROBE_OK;
    if (k == 0 || k > PROBE_RANKSET_MAX) {
        s = probe_set_error(PROBE_EINVAL, "%s: index lists %zu rank files (1..%d)", index, k,
                            PROBE_RANKSET_MAX);
        goto out;
    }
    const char *slash = strrchr(index, '/');
    size_t dirlen = slash ? (size_t)(slash - index + 1) : 0;
    if (!(*names = calloc(k, sizeof **names))) {
        s = probe_set_error(PROBE_ENOMEM, "out of memory reading the index %s", index);
        goto out;
    }
    for (size_t i = 0; i < k; i++) {
        const char *b = json_string_value(json_array_get(ranks, i));
        if (!b || !b[0] || strchr(b, '/')) {
            s = probe_set_error(PROBE_EINVAL, "%s: index entry %zu of \"ranks\" is not a file "
                                "name", index, i);
            goto out;
        }
        size_t bl = strlen(b);
        if (!((*names)[i] = malloc(dirlen + bl + 1))) {
            s = probe_set_error(PROBE_ENOMEM, "out of memory reading the index %s", index);
            goto out;
        }
        memcpy((*names)[i], index, dirlen);
        memcpy((*names)[i] + dirlen, b, bl + 1);
        *n = i + 1;
    }
out:
    json_decref(j);
    if (s != PROBE_OK) {
        for (size_t i = 0; *names && i < k; i++)
            free((*names)[i]);
        free(*names);
        *names = NULL;
        *n = 0;
    }
    return s;
}

/* <stem>.rank<R><ext> for R = 0, 1, ... while such a file exists (the names the shim gives
 * rank files, docs/nccl.md "Per-rank files"; ext: from the last '.' of the base name). */
static probe_status sibling_names(const char *path, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t stem = dot && dot != base ? (size_t)(dot - path) : strlen(path);
    const char *ext = path + stem;
    for (int r = 0; r < PROBE_RANKSET_MAX; r++) {
        size_t cap = strlen(path) + 32;
        char *name = malloc(cap);
        if (!name)
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        snprintf(name, cap, "%.*s.rank%d%s", (int)stem, path, r, ext);
        if (access(name, F_OK) != 0) {
            free(name);
            break;
        }
        char **nn = realloc(*names, (*n + 1) * sizeof *nn);
        if (!nn) {
            free(name);
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        }
        *names = nn;
        nn[(*n)++] = name;
    }
    return PROBE_OK;
}

/* The "shard" list of rank 0's manifest (of the index when rank 0's has none). */
static probe_status load_rules(probe_rankset *rs)
{
    const char *m = probe_file_manifest(rs->files[0]);
    json_t *j = m ? json_loads(m, 0, NULL) : NULL;
    json_t *sh = j ? json_object_get(j, "shard") : NULL;
    if (!sh && rs->index_manifest) {
        json_decref(j);
        j = json_loads(rs->index_manifest, 0, NULL);
        sh = j ? json_object_get(j, "shard") : NULL;
    }
    probe_status s = PROBE_OK;
    size_t k = json_is_array(sh) ? json_array_size(sh) : 0;
    if (k && !(rs->rules = calloc(k, sizeof *rs->rules)))
        s = probe_set_error(PROBE_ENOMEM, "out of memory reading the shard list");
    for (size_t i = 0; s == PROBE_OK && i < k; i++) {
        json_t *e = json_array_get(sh, i);
        const char *g = json_string_value(json_object_get(e, "glob"));
        json_t *a = json_object_get(e, "axis");
        if (!g || !json_is_integer(a) || json_integer_value(a) < 0 ||
            json_integer_value(a) >= PROBE_MAX_RANK) {
            s = probe_set_error(PROBE_EINVAL, "%s: manifest \"shard\" entry %zu is not "
                                "{\"glob\": TEXT, \"axis\": 0..%d}", rs->paths[0], i,
                                PROBE_MAX_RANK - 1);
            break;
        }
        if (!(rs->rules[i].glob = dup_str(g))) {
            s = probe_set_error(PROBE_ENOMEM, "out of memory reading the shard list");
            break;
        }
        rs->rules[i].axis = (int)json_integer_value(a);
        rs->nrules = i + 1;
    }
    json_decref(j);
    return s;
}

probe_status probe_rankset_open(const char *const *paths, size_t n, probe_rankset **out)
{
    if (!paths || !out || n == 0)
        return probe_set_error(PROBE_EINVAL, "probe_rankset_open: no file");
    *out = NULL;
    if (n > PROBE_RANKSET_MAX)
        return probe_set_error(PROBE_EINVAL, "%zu files: at most %d ranks", n, PROBE_RANKSET_MAX);
    probe_rankset *rs = calloc(1, sizeof *rs);
    if (!rs)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    probe_status s = PROBE_OK;
    char **names = NULL;
    size_t nnames = 0;
    if (n == 1 && access(paths[0], F_OK) != 0 && errno == ENOENT) {
        /* No index (its writer never ran?): the rank files next to where it would be. */
        if ((s = sibling_names(paths[0], &names, &nnames)) != PROBE_OK)
            goto fail;
    }
    if (n == 1 && !nnames) {
        probe_file *f = NULL;
        if ((s = probe_file_open(paths[0], &f)) != PROBE_OK)
            goto fail;
        if ((s = index_names(paths[0], f, &names, &nnames)) != PROBE_OK) {
            probe_file_close(f);
            goto fail;
        }
        if (!nnames) { /* a plain file */
            rs->files = calloc(1, sizeof *rs->files);
            rs->paths = calloc(1, sizeof *rs->paths);
            if (!rs->files || !rs->paths || !(rs->paths[0] = dup_str(paths[0]))) {
                probe_file_close(f);
                s = probe_set_error(PROBE_ENOMEM, "out of memory");
                goto fail;
            }
            rs->files[0] = f;
            rs->nfiles = 1;
            *out = rs;
            return PROBE_OK;
        }
        if (probe_file_count(f)) {
            s = probe_set_error(PROBE_EINVAL, "%s: an index capture (manifest \"ranks\") that "
                                "holds tensors", paths[0]);
            probe_file_close(f);
            goto fail;
        }
        const char *im = probe_file_manifest(f);
        if (im && !(rs->index_manifest = dup_str(im))) {
            probe_file_close(f);
            s = probe_set_error(PROBE_ENOMEM, "out of memory");
            goto fail;
        }
        probe_file_close(f);
        if (!(rs->index = dup_str(paths[0]))) {
            s = probe_set_error(PROBE_ENOMEM, "out of memory");
            goto fail;
        }
    }
    size_t nf = nnames ? nnames : n;
    const char *const *fp = nnames ? (const char *const *)names : paths;
    rs->files = calloc(nf, sizeof *rs->files);
    rs->paths = calloc(nf, sizeof *rs->paths);
    probe_file **opened = calloc(nf, sizeof *opened);
    long long *ranks = calloc(nf, sizeof *ranks);
    if (!rs->files || !rs->paths || !opened || !ranks) {
        free(opened);
        free(ranks);
        s = probe_set_error(PROBE_ENOMEM, "out of memory");
        goto fail;
    }
    long long world = -1;
    size_t wfrom = 0;
    for (size_t i = 0; i < nf && s == PROBE_OK; i++) {
        if ((s = probe_file_open(fp[i], &opened[i])) != PROBE_OK)
            break;
        long long r, w;
        if (!manifest_rank(opened[i], &r, &w)) {
            s = probe_set_error(PROBE_EINVAL, "%s: not a per-rank capture (its manifest has no "
                                "integer \"rank\" and \"world_size\")", fp[i]);
        } else if (w < 2 || w > PROBE_RANKSET_MAX || r < 0 || r >= w) {
            s = probe_set_error(PROBE_EINVAL, "%s: manifest rank %lld of world_size %lld is not a "
                                "rank of a multi-rank run", fp[i], r, w);
        } else if (world >= 0 && w != world) {
            s = probe_set_error(PROBE_EINVAL, "%s: world_size %lld, but %s has world_size %lld",
                                fp[i], w, fp[wfrom], world);
        } else {
            world = w;
            wfrom = i;
            ranks[i] = r;
            for (size_t k = 0; k < i; k++)
                if (ranks[k] == r) {
                    s = probe_set_error(PROBE_EINVAL, "%s: rank %lld appears twice (also %s)",
                                        fp[i], r, fp[k]);
                    break;
                }
        }
    }
    if (s == PROBE_OK && (size_t)world != nf) {
        /* Every rank once: with nf < world some rank is missing. */
        long long miss = 0;
        for (; miss < world; miss++) {
            size_t k = 0;
            while (k < nf && ranks[k] != miss)
                k++;
            if (k == nf)
                break;
        }
        s = probe_set_error(PROBE_EINVAL, "%s: world_size %lld but %zu rank files given: rank "
                            "%lld is missing", fp[0], world, nf, miss);
    }
    if (s == PROBE_OK)
        for (size_t i = 0; i < nf; i++) {
            rs->files[ranks[i]] = opened[i];
            opened[i] = NULL;
            if (!(rs->paths[ranks[i]] = dup_str(fp[i])))
                s = probe_set_error(PROBE_ENOMEM, "out of memory");
        }
    for (size_t i = 0; i < nf; i++)
        probe_file_close(opened[i]);
    free(opened);
    free(ranks);
    if (s != PROBE_OK) {
        rs->nfiles = (int)nf;
        goto fail;
    }
    rs->nfiles = rs->world = (int)world;
    if ((s = load_rules(rs)) != PROBE_OK)
        goto fail;
    for (size_t i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
    *out = rs;
    return PROBE_OK;
fail:
    for (size_t i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
    probe_rankset_close(rs);
    return s;
}

int probe_rankset_world(const probe_rankset *rs) { return rs ? rs->world : 0; }
const char *probe_rankset_index(const probe_rankset *rs) { return rs ? rs->index : NULL; }

probe_file *probe_rankset_file(const probe_rankset *rs, int r)
{
    return rs && r >= 0 && r < rs->nfiles ? rs->files[r] : NULL;
}

const char *probe_rankset_file_path(const probe_rankset *rs, int r)
{
    return rs && r >= 0 && r < rs->nfiles ? rs->paths[r] : NULL;
}

int probe_rankset_is_collective(const char *path, char *op, size_t opcap, char *operand,
                                size_t operandcap)
{
    const char *last = strrchr(path, '/');
    const char *spec = NULL;
    if (!last)
        return 0;
    last++;
    if (strncmp(path, "/nccl/", 6) == 0) {
        spec = last; /* OP.OPERAND */
    } else if (strncmp(last, "nccl.", 5) == 0) {
        const char *dot = strchr(last + 5, '.'); /* nccl.K.OP.OPERAND */
        if (!dot)
            return 0;
        spec = dot + 1;
    } else {
        return 0;
    }
    const char *dot = strchr(spec, '.');
    size_t ol = dot ? (size_t)(dot - spec) : strlen(spec);
    if (op && opcap) {
        size_t k = ol < opcap - 1 ? ol : opcap - 1;
        memcpy(op, spec, k);
        op[k] = 0;
    }
    if (operand && operandcap)
        snprintf(operand, operandcap, "%s", dot ? dot + 1 : "");
    return 1;
}

/* The shard rule a path matches: its axis, or -1. */
static int shard_axis_of(const probe_rankset *rs, const char *path)
{
    for (size_t i = 0; i < rs->nrules; i++) {
        const char *g = rs->rules[i].glob;
        if (fnmatch(g, path, 0) == 0 || (g[0] != '/' && path[0] == '/' &&
                                         fnmatch(g, path + 1, 0) == 0))
            return rs->rules[i].axis;
    }
    return -1;
}

static probe_status push_entry(probe_rankset *rs, size_t *cap)
{
    if (rs->nentries == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        probe_rankset_entry *e = realloc(rs->entries, nc * sizeof *e);
        if (!e)
            return probe_set_error(PROBE_ENOMEM, "out of memory listing the rank set's tensors");
        rs->entries = e;
        probe_concat *c = realloc(rs->concat, nc * sizeof *c);
        if (!c)
            return probe_set_error(PROBE_ENOMEM, "out of memory listing the rank set's tensors");
        rs->concat = c;
        *cap = nc;
    }
    memset(&rs->entries[rs->nentries], 0, sizeof rs->entries[0]);
    memset(&rs->concat[rs->nentries], 0, sizeof rs->concat[0]);
    rs->entries[rs->nentries].tag = -1;
    rs->entries[rs->nentries].shard_axis = -1;
    rs->nentries++;
    return PROBE_OK;
}

/* Replicated copies: which ranks' bytes differ. The lowest holder is the
 * reference copy; if it alone differs from all the others (which agree with
 * each other, at least two of them), it is the one named. */
static probe_status check_replicas(probe_rankset *rs, probe_rankset_entry *e)
{
    uint64_t *h = malloc((size_t)e->nholders * sizeof *h);
    if (!h)
        return probe_set_error(PROBE_ENOMEM, "out of memory hashing %s", e->info.path);
    probe_status s = PROBE_OK;
    for (int k = 0; k < e->nholders && s == PROBE_OK; k++)
        s = probe_file_hash(rs->files[e->holders[k]], e->index[k], &h[k]);
    int ndiff = 0;
    for (int k = 1; s == PROBE_OK && k < e->nholders; k++)
        ndiff += h[k] != h[0];
    if (s == PROBE_OK && ndiff) {
        if (!(e->mismatch = malloc((size_t)e->nholders * sizeof *e->mismatch))) {
            free(h);
            return probe_set_error(PROBE_ENOMEM, "out of memory hashing %s", e->info.path);
        }
        int others_agree = e->nholders >= 3 && ndiff == e->nholders - 1;
        for (int k = 2; others_agree && k < e->nholders; k++)
            others_agree = h[k] == h[1];
        if (others_agree)
            e->mismatch[e->nmismatch++] = e->holders[0];
        else
            for (int k = 1; k < e->nholders; k++)
                if (h[k] != h[0])
                    e->mismatch[e->nmismatch++] = e->holders[k];
    }
    free(h);
    return s;
}

/* Collective outputs that every rank must hold identically. */
static probe_status check_collective(probe_rankset *rs, const probe_rankset_entry *e)
{
    char op[32], operand[32];
    if (!probe_rankset_is_collective(e->info.path, op, sizeof op, operand, sizeof operand) ||
        strcmp(operand, "out") != 0 ||
        (strcmp(op, "all_gather") && strcmp(op, "all_reduce") && strcmp(op, "broadcast")) ||
        e->nholders < 2)
        return PROBE_OK;
    probe_rankset_entry tmp = *e;
    tmp.mismatch = NULL;
    tmp.nmismatch = 0;
    probe_status s = check_replicas(rs, &tmp);
    if (s != PROBE_OK || !tmp.nmismatch) {
        free(tmp.mismatch);
        return s;
    }
    probe_rankset_divergence *d = realloc(rs->div, (rs->ndiv + 1) * sizeof *d);
    if (!d) {
        free(tmp.mismatch);
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    }
    rs->div = d;
    d = &rs->div[rs->ndiv++];
    memset(d, 0, sizeof *d);
    snprintf(d->path, sizeof d->path, "%s", e->info.path);
    d->nranks = tmp.nmismatch;
    for (int k = 0; k < tmp.nmismatch && k < 8; k++)
        d->ranks[k] = tmp.mismatch[k];
    free(tmp.mismatch);
    return PROBE_OK;
}

/* Seen-path lookup: 1 if an earlier rank (< r) holds path. */
static int held_before(const probe_rankset *rs, int r, const char *path)
{
    size_t i;
    for (int q = 0; q < r; q++)
        if (probe_file_find(rs->files[q], path, &i) == PROBE_OK)
            return 1;
    return 0;
}

static probe_status build_join(probe_rankset *rs, int exclude_collectives, size_t *cap)
{
    int W = rs->world;
    for (int r = 0; r < W; r++) {
        probe_file *f = rs->files[r];
        for (size_t i = 0; i < probe_file_count(f); i++) {
            const probe_tensor_info *ti = probe_file_tensor(f, i);
            if (held_before(rs, r, ti->path))
                continue;
            if (exclude_collectives && probe_rankset_is_collective(ti->path, NULL, 0, NULL, 0)) {
                for (int q = r; q < W; q++) {
                    size_t k;
                    rs->left_out[q] += probe_file_find(rs->files[q], ti->path, &k) == PROBE_OK;
                }
                /* Still checked across ranks: the outputs must agree. */
            }
            probe_status s = push_entry(rs, cap);
            if (s != PROBE_OK)
                return s;
            probe_rankset_entry *e = &rs->entries[rs->nentries - 1];
            e->info = *ti;
            e->holders = malloc((size_t)W * sizeof *e->holders);
            e->index = malloc((size_t)W * sizeof *e->index);
            if (!e->holders || !e->index)
                return probe_set_error(PROBE_ENOMEM, "out of memory listing %s", ti->path);
            for (int q = r; q < W; q++) {
                size_t k;
                if (probe_file_find(rs->files[q], ti->path, &k) == PROBE_OK) {
                    e->holders[e->nholders] = q;
                    e->index[e->nholders++] = k;
                }
            }
            if ((s = check_collective(rs, e)) != PROBE_OK)
                return s;
            if (exclude_collectives && probe_rankset_is_collective(ti->path, NULL, 0, NULL, 0)) {
                free(e->holders);
                free(e->index);
                rs->nentries--;
                continue;
            }
            int axis = shard_axis_of(rs, ti->path);
            if (axis < 0) {
                if (e->nholders > 1 && (s = check_replicas(rs, e)) != PROBE_OK)
                    return s;
                continue;
            }
            e->shard_axis = axis;
            if (e->nholders < W) {
                int miss = 0;
                while (miss < W && miss < e->nholders && e->holders[miss] == miss)
                    miss++;
                snprintf(e->error, sizeof e->error, "shard missing on rank %d (sharded along axis "
                         "%d by \"shard\")", miss, axis);
                continue;
            }
            const int64_t *shapes[PROBE_RANKSET_MAX];
            int bad = 0;
            for (int k = 0; k < W; k++) {
                const probe_tensor_info *pk = probe_file_tensor(rs->files[k], e->index[k]);
                shapes[k] = pk->shape;
                if (pk->rank != ti->rank && !bad++)
                    snprintf(e->error, sizeof e->error, "cannot join the shards: rank %d's piece "
                             "has %d axes, rank 0's %d", k, pk->rank, ti->rank);
                else if (pk->dtype != ti->dtype && !bad++)
                    snprintf(e->error, sizeof e->error, "cannot join the shards: rank %d's piece "
                             "is %s, rank 0's %s", k, probe_dtype_name(pk->dtype),
                             probe_dtype_name(ti->dtype));
                else if (pk->stats_only && !bad++)
                    snprintf(e->error, sizeof e->error, "cannot join the shards: rank %d's piece "
                             "is a stats-only record", k);
            }
            if (bad)
                continue;
            if (axis >= ti->rank) {
                snprintf(e->error, sizeof e->error, "cannot join the shards: shard axis %d of a "
                         "tensor with %d axes", axis, ti->rank);
                continue;
            }
            if (probe_concat_init(&rs->concat[rs->nentries - 1], W, ti->rank, axis, shapes) !=
                PROBE_OK) {
                snprintf(e->error, sizeof e->error, "cannot join the shards: %s",
                         probe_last_error());
                continue;
            }
            const probe_concat *c = &rs->concat[rs->nentries - 1];
            uint64_t total = 0;
            for (int k = 0; k < W; k++)
                total += c->extent[k];
            e->info.shape[axis] = (int64_t)total;
            e->info.n = c->n;
            e->info.hash[0] = 0; /* the pieces' hashes are not the whole's */
        }
    }
    return PROBE_OK;
}

static probe_status build_per_rank(probe_rankset *rs, size_t *cap)
{
    for (int r = 0; r < rs->world; r++)
        for (size_t i = 0; i < probe_file_count(rs->files[r]); i++) {
            probe_status s = push_entry(rs, cap);
            if (s != PROBE_OK)
                return s;
            probe_rankset_entry *e = &rs->entries[rs->nentries - 1];
            e->info = *probe_file_tensor(rs->files[r], i);
            e->tag = r;
            e->holders = malloc(sizeof *e->holders);
            e->index = malloc(sizeof *e->index);
            if (!e->holders || !e->index)
                return probe_set_error(PROBE_ENOMEM, "out of memory listing %s", e->info.path);
            e->holders[0] = r;
            e->index[0] = i;
            e->nholders = 1;
            /* Collective outputs must agree across the ranks: checked once, at rank 0's. */
            if (r == 0) {
                probe_rankset_entry all = *e;
                int W = rs->world, hold[PROBE_RANKSET_MAX];
                size_t idx[PROBE_RANKSET_MAX];
                all.holders = hold;
                all.index = idx;
                all.nholders = 0;
                for (int q = 0; q < W; q++) {
                    size_t k;
                    if (probe_file_find(rs->files[q], e->info.path, &k) == PROBE_OK) {
                        hold[all.nholders] = q;
                        idx[all.nholders++] = k;
                    }
                }
                if ((s = check_collective(rs, &all)) != PROBE_OK)
                    return s;
            }
        }
    return PROBE_OK;
}

/* emap: from each holder's file index to the entry. */
static probe_status build_map(probe_rankset *rs)
{
    if (!(rs->emap = calloc((size_t)rs->nfiles, sizeof *rs->emap)))
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    for (int r = 0; r < rs->nfiles; r++) {
        size_t n = probe_file_count(rs->files[r]);
        if (!(rs->emap[r] = malloc((n ? n : 1) * sizeof **rs->emap)))
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        for (size_t k = 0; k < n; k++)
            rs->emap[r][k] = SIZE_MAX;
    }
    for (size_t i = 0; i < rs->nentries; i++) {
        const probe_rankset_entry *e = &rs->entries[i];
        for (int k = 0; k < e->nholders; k++)
            rs->emap[e->holders[k]][e->index[k]] = i;
    }
    return PROBE_OK;
}

probe_status probe_rankset_build(probe_rankset *rs, probe_rankset_mode mode,
                                 int exclude_collectives)
{
    if (!rs || rs->built)
        return probe_set_error(PROBE_EINVAL, "probe_rankset_build: NULL or built twice");
    if (mode == PROBE_RANKSET_PER_RANK && !rs->world)
        return probe_set_error(PROBE_EINVAL, "%s: per-rank comparison needs a rank set",
                               rs->paths[0]);
    rs->built = 1;
    rs->mode = mode;
    size_t cap = 0;
    if (!(rs->left_out = calloc(rs->nfiles, sizeof *rs->left_out)))
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    if (!rs->world) { /* a plain file: its tensors as they are */
        probe_file *f = rs->files[0];
        for (size_t i = 0; i < probe_file_count(f); i++) {
            probe_status s = push_entry(rs, &cap);
            if (s != PROBE_OK)
                return s;
            probe_rankset_entry *e = &rs->entries[rs->nentries - 1];
            e->info = *probe_file_tensor(f, i);
            if (!(e->holders = malloc(sizeof *e->holders)) ||
                !(e->index = malloc(sizeof *e->index)))
                return probe_set_error(PROBE_ENOMEM, "out of memory");
            e->holders[0] = 0;
            e->index[0] = i;
            e->nholders = 1;
        }
        return build_map(rs);
    }
    probe_status s = mode == PROBE_RANKSET_PER_RANK ? build_per_rank(rs, &cap)
                                                    : build_join(rs, exclude_collectives, &cap);
    return s != PROBE_OK ? s : build_map(rs);
}

size_t probe_rankset_count(const probe_rankset *rs) { return rs ? rs->nentries : 0; }

const probe_rankset_entry *probe_rankset_entry_at(const probe_rankset *rs, size_t i)
{
    return rs && i < rs->nentries ? &rs->entries[i] : NULL;
}

probe_status probe_rankset_find(const probe_rankset *rs, const char *path, int tag, size_t *i)
{
    if (!rs || !path || !i || !rs->emap)
        return PROBE_EINVAL;
    for (int r = tag >= 0 ? tag : 0; r < rs->nfiles && (tag < 0 || r == tag); r++) {
        size_t k;
        if (probe_file_find(rs->files[r], path, &k) != PROBE_OK)
            continue;
        size_t e = rs->emap[r][k];
        if (e != SIZE_MAX && rs->entries[e].tag == tag) {
            *i = e;
            return PROBE_OK;
        }
    }
    return PROBE_ENOTFOUND;
}

int probe_rankset_single(const probe_rankset *rs, size_t i, probe_file **f, size_t *idx)
{
    if (!rs || i >= rs->nentries || rs->concat[i].nparts || rs->entries[i].shard_axis >= 0)
        return 0;
    *f = rs->files[rs->entries[i].holders[0]];
    *idx = rs->entries[i].index[0];
    return 1;
}

probe_status probe_rankset_read_range(probe_rankset *rs, size_t i, uint64_t offset, size_t count,
                                      void *dst)
{
    if (!rs || i >= rs->nentries)
        return probe_set_error(PROBE_EINVAL, "probe_rankset_read_range: no tensor %zu", i);
    const probe_rankset_entry *e = &rs->entries[i];
    if (e->error[0])
        return probe_set_error(PROBE_EINVAL, "%s: %s", e->info.path, e->error);
    const probe_concat *c = &rs->concat[i];
    if (!c->nparts)
        return probe_file_read_range(rs->files[e->holders[0]], e->index[0], offset, count, dst);
    if (offset > c->n || count > c->n - offset)
        return probe_set_error(PROBE_EINVAL, "%s: range [%llu, +%zu) outside the joined tensor",
                               e->info.path, (unsigned long long)offset, count);
    size_t es = probe_dtype_size(e->info.dtype);
    char *out = dst;
    while (count) {
        uint64_t po, run;
        int p = probe_concat_locate(c, offset, &po, &run);
        size_t m = run < count ? (size_t)run : count;
        probe_status s = probe_file_read_range(rs->files[e->holders[p]], e->index[p], po, m, out);
        if (s != PROBE_OK)
            return s;
        out += m * es;
        offset += m;
        count -= m;
    }
    return PROBE_OK;
}

uint64_t probe_rankset_collectives_left_out(const probe_rankset *rs, int r)
{
    return rs && rs->left_out && r >= 0 && r < rs->nfiles ? rs->left_out[r] : 0;
}

size_t probe_rankset_divergence_count(const probe_rankset *rs) { return rs ? rs->ndiv : 0; }

const probe_rankset_divergence *probe_rankset_divergence_at(const probe_rankset *rs, size_t i)
{
    return rs && i < rs->ndiv ? &rs->div[i] : NULL;
}
