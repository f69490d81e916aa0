/* experiment.c - is the pair the same experiment? (probe/compare/experiment.h,
 * docs/inject.md): the root-input check, the injection status recorded in a
 * run's manifest, and the isolated run's metrics. */
#include "experiment.h"

#include <fnmatch.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *const default_roots[] = {"latents.init", "timesteps", "prompt_embeds", NULL};

/* A call on a thread other than the main one is "<component>@<thread>"
 * (docs/components.md, threads): a root input too. */
static int is_root(const char *component, const char *const *roots)
{
    const char *at = strchr(component, '@');
    size_t n = at ? (size_t)(at - component) : strlen(component);
    for (size_t i = 0; roots[i]; i++)
        if (strlen(roots[i]) == n && strncmp(roots[i], component, n) == 0)
            return 1;
    return 0;
}

static int allowed(const char *path, const char *component, const char *const *globs)
{
    for (size_t i = 0; globs && globs[i]; i++)
        if (fnmatch(globs[i], path, 0) == 0 || fnmatch(globs[i], component, 0) == 0 ||
            (globs[i][0] != '/' && path[0] == '/' && fnmatch(globs[i], path + 1, 0) == 0))
            return 1;
    return 0;
}

static probe_root_input *push_root(probe_compare_result *res)
{
    probe_root_input *p = realloc(res->roots, (res->nroots + 1) * sizeof *p);
    if (!p)
        return NULL;
    res->roots = p;
    memset(&p[res->nroots], 0, sizeof *p);
    return &p[res->nroots++];
}

/* A new root input of tensor ti (its path and component set); NULL: out of memory. */
static probe_root_input *root_of(probe_compare_result *res, const probe_tensor_info *ti)
{
    probe_root_input *ri = push_root(res);
    if (ri) {
        snprintf(ri->path, sizeof ri->path, "%s", ti->path);
        snprintf(ri->component, sizeof ri->component, "%s", ti->component);
    }
    return ri;
}

static void shape_text(char *buf, size_t cap, int rank, const int64_t *shape)
{
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < rank && len < cap; ++k)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", k ? ", " : "", (long long)shape[k]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

/* Equal bytes of two tensors of equal dtype and shape: by probe.hash when
 * both sides carry one (xxh64 of the stored bytes, writer.c), by a hash both
 * can give when one is a stats-only record (probe_file_hash_match), else by
 * reading and comparing the bytes. 1 equal, 0 differ, -1 read error. */
static int same_bytes(probe_file *rf, size_t ri, probe_file *cf, size_t ci)
{
    const probe_tensor_info *a = probe_file_tensor(rf, ri), *b = probe_file_tensor(cf, ci);
    if (a->hash[0] && b->hash[0])
        return strcmp(a->hash, b->hash) == 0;
    if (a->stats_only || b->stats_only) { /* no bytes to read on that side */
        int same;
        return probe_file_hash_match(rf, ri, cf, ci, &same) == PROBE_OK ? same : -1;
    }
    size_t nbytes = (size_t)a->n * probe_dtype_size(a->dtype);
    if (nbytes == 0)
        return 1;
    unsigned char *x = malloc(nbytes), *y = malloc(nbytes);
    int r = -1;
    if (x && y && probe_file_read_raw(rf, ri, x, nbytes) == PROBE_OK &&
        probe_file_read_raw(cf, ci, y, nbytes) == PROBE_OK)
        r = memcmp(x, y, nbytes) == 0;
    else if (!x || !y)
        probe_set_error(PROBE_ENOMEM, "%s: cannot allocate 2 x %zu bytes", a->path, nbytes);
    free(x);
    free(y);
    return r;
}

/* The candidate manifest's record of an injection with conversion of path:
 * the entry of "inject"."tensors" for path when the injection converted it
 * ("converted_from") from a tensor whose recorded hash is ref_hash; NULL
 * otherwise. inject is the manifest's "inject" object (or NULL). */
static json_t *converted_entry(json_t *inject, const char *path, const char *ref_hash)
{
    if (!json_is_object(inject) || !json_is_true(json_object_get(inject, "convert")))
        return NULL;
    json_t *list = json_object_get(inject, "tensors"), *e;
    size_t k;
    json_array_foreach(list, k, e) {
        const char *p = json_string_value(json_object_get(e, "path"));
        const char *h = json_string_value(json_object_get(e, "reference_hash"));
        if (p && strcmp(p, path) == 0)
            return h && strcmp(h, ref_hash) == 0 &&
                           json_is_string(json_object_get(e, "converted_from"))
                       ? e
                       : NULL;
    }
    return NULL;
}

/* 1 in *same when candidate tensor ci holds exactly reference tensor ri
 * converted to the candidate's dtype with the rounding of the injection
 * (probe_dtype_convert); both have n elements. Read in chunks. */
static probe_status same_as_converted(probe_file *rf, size_t ri, probe_file *cf, size_t ci,
                                      int *same)
{
    const probe_tensor_info *a = probe_file_tensor(rf, ri), *b = probe_file_tensor(cf, ci);
    enum { CHUNK = 1 << 15 };
    size_t ea = probe_dtype_size(a->dtype), eb = probe_dtype_size(b->dtype);
    unsigned char *x = malloc((size_t)CHUNK * ea), *y = malloc((size_t)CHUNK * eb),
                  *z = malloc((size_t)CHUNK * eb);
    probe_status s = PROBE_OK;
    *same = 1;
    if (!x || !y || !z)
        s = probe_set_error(PROBE_ENOMEM, "out of memory comparing root input %s", a->path);
    for (uint64_t off = 0; s == PROBE_OK && *same && off < a->n; off += CHUNK) {
        size_t m = a->n - off < CHUNK ? (size_t)(a->n - off) : CHUNK;
        if ((s = probe_file_read_range(rf, ri, off, m, x)) == PROBE_OK &&
            (s = probe_file_read_range(cf, ci, off, m, y)) == PROBE_OK &&
            (s = probe_dtype_convert(a->dtype, x, b->dtype, z, m)) == PROBE_OK)
            *same = memcmp(y, z, m * eb) == 0;
    }
    free(x);
    free(y);
    free(z);
    return s;
}

static probe_status root_pair(probe_root_input *ri, probe_file *rf, size_t i, probe_file *cf,
                              size_t ci, json_t *cand_inject)
{
    const probe_tensor_info *a = probe_file_tensor(rf, i), *b = probe_file_tensor(cf, ci);
    snprintf(ri->hash_reference, sizeof ri->hash_reference, "%s", a->hash);
    snprintf(ri->hash_candidate, sizeof ri->hash_candidate, "%s", b->hash);
    int same_shape = a->rank == b->rank;
    for (int k = 0; same_shape && k < a->rank; k++)
        same_shape = a->shape[k] == b->shape[k];
    if (a->dtype != b->dtype) {
        /* Injected with --convert: the same experiment when the candidate holds exactly
         * the reference's values converted to its dtype. */
        json_t *e = same_shape && !a->stats_only && !b->stats_only
                        ? converted_entry(cand_inject, a->path, a->hash)
                        : NULL;
        const char *from = e ? json_string_value(json_object_get(e, "converted_from")) : NULL;
        if (from && strcmp(from, probe_dtype_name(a->dtype)) == 0) {
            int eq = 0;
            probe_status s = same_as_converted(rf, i, cf, ci, &eq);
            if (s != PROBE_OK && s != PROBE_EINVAL)
                return s;
            if (s == PROBE_OK && eq) {
                ri->same = ri->converted = 1;
                snprintf(ri->why, sizeof ri->why, "converted from the reference (%s -> %s)",
                         probe_dtype_name(a->dtype), probe_dtype_name(b->dtype));
                return PROBE_OK;
            }
            snprintf(ri->why, sizeof ri->why, "dtype %s vs %s (injected with conversion, but the "
                     "values are not the reference's converted to %s)", probe_dtype_name(a->dtype),
                     probe_dtype_name(b->dtype), probe_dtype_name(b->dtype));
            return PROBE_OK;
        }
        snprintf(ri->why, sizeof ri->why, "dtype %s vs %s", probe_dtype_name(a->dtype),
                 probe_dtype_name(b->dtype));
        return PROBE_OK;
    }
    if (!same_shape) {
        char x[64], y[64];
        shape_text(x, sizeof x, a->rank, a->shape);
        shape_text(y, sizeof y, b->rank, b->shape);
        snprintf(ri->why, sizeof ri->why, "shape %s vs %s", x, y);
        return PROBE_OK;
    }
    int eq = same_bytes(rf, i, cf, ci);
    if (eq < 0)
        return PROBE_EIO;
    ri->same = eq;
    if (!eq)
        snprintf(ri->why, sizeof ri->why, "contents differ (hash %s vs %s)",
                 a->hash[0] ? a->hash : "?", b->hash[0] ? b->hash : "?");
    return PROBE_OK;
}

probe_status probe_experiment_roots(probe_compare_result *res, probe_file *rf, probe_file *cf,
                                    const probe_compare_opts *opts)
{
    const char *const *roots = opts->root_components ? opts->root_components : default_roots;
    res->roots_checked = 1;
    res->same_experiment = 1;
    size_t nref = probe_file_count(rf), ncand = probe_file_count(cf);
    json_t *mc = res->manifest_candidate ? json_loads(res->manifest_candidate, 0, NULL) : NULL;
    json_t *cand_inject = mc ? json_object_get(mc, "inject") : NULL;
    for (size_t i = 0; i < nref; i++) {
        const probe_tensor_info *ti = probe_file_tensor(rf, i);
        if (!is_root(ti->component, roots))
            continue;
        probe_root_input *ri = root_of(res, ti);
        if (!ri) {
            json_decref(mc);
            return probe_set_error(PROBE_ENOMEM, "out of memory listing root inputs");
        }
        snprintf(ri->hash_reference, sizeof ri->hash_reference, "%s", ti->hash);
        ri->in_reference = 1;
        size_t ci;
        if (probe_file_find(cf, ti->path, &ci) != PROBE_OK) {
            snprintf(ri->why, sizeof ri->why, "missing in the candidate");
            continue;
        }
        ri->in_candidate = 1;
        probe_status s = root_pair(ri, rf, i, cf, ci, cand_inject);
        if (s != PROBE_OK) {
            json_decref(mc);
            return s;
        }
    }
    for (size_t i = 0; i < ncand; i++) {
        const probe_tensor_info *ti = probe_file_tensor(cf, i);
        size_t ri_;
        if (!is_root(ti->component, roots) || probe_file_find(rf, ti->path, &ri_) == PROBE_OK)
            continue;
        probe_root_input *ri = root_of(res, ti);
        if (!ri) {
            json_decref(mc);
            return probe_set_error(PROBE_ENOMEM, "out of memory listing root inputs");
        }
        snprintf(ri->hash_candidate, sizeof ri->hash_candidate, "%s", ti->hash);
        ri->in_candidate = 1;
        snprintf(ri->why, sizeof ri->why, "missing in the reference");
    }
    /* The scheduler configuration the adapter records (manifest "scheduler"):
     * compared when both runs carry one. */
    json_t *mr = res->manifest_reference ? json_loads(res->manifest_reference, 0, NULL) : NULL;
    json_t *sr = mr ? json_object_get(mr, "scheduler") : NULL;
    json_t *sc = mc ? json_object_get(mc, "scheduler") : NULL;
    if (sr || sc) {
        probe_root_input *ri = push_root(res);
        if (!ri) {
            json_decref(mr);
            json_decref(mc);
            return probe_set_error(PROBE_ENOMEM, "out of memory listing root inputs");
        }
        snprintf(ri->path, sizeof ri->path, "manifest:scheduler");
        snprintf(ri->component, sizeof ri->component, "scheduler");
        ri->in_reference = sr != NULL;
        ri->in_candidate = sc != NULL;
        if (sr && sc) {
            ri->same = json_equal(sr, sc);
            if (!ri->same)
                snprintf(ri->why, sizeof ri->why, "scheduler configuration differs");
        } else {
            /* One run recorded none (an older capture, or no scheduler was
             * tapped): nothing to compare, not a difference. */
            ri->same = 1;
        }
    }
    json_decref(mr);
    json_decref(mc);
    for (size_t i = 0; i < res->nroots; i++) {
        probe_root_input *ri = &res->roots[i];
        if (ri->same)
            continue;
        if (allowed(ri->path, ri->component, opts->allow_root_diff)) {
            ri->allowed = 1;
        } else if ((!ri->in_candidate && res->incomplete_candidate) ||
                   (!ri->in_reference && res->incomplete_reference)) {
            /* A run that did not complete may simply not have reached it. */
            ri->incomplete = 1;
            snprintf(ri->why, sizeof ri->why, "missing in the %s, whose capture is incomplete",
                     ri->in_candidate ? "reference" : "candidate");
        } else {
            res->same_experiment = 0;
        }
    }
    return PROBE_OK;
}

int probe_experiment_inject_failed(const char *manifest, char *why, size_t cap)
{
    if (!manifest)
        return 0;
    json_t *m = json_loads(manifest, 0, NULL);
    json_t *inj = m ? json_object_get(m, "inject") : NULL;
    int failed = 0;
    if (json_is_object(inj)) {
        const char *status = json_string_value(json_object_get(inj, "status"));
        if (!status || strcmp(status, "ok") != 0) {
            failed = 1;
            const char *err = json_string_value(json_object_get(inj, "error"));
            if (err)
                snprintf(why, cap, "%s", err);
            else
                snprintf(why, cap, "injection status \"%s\" (the run did not finish its injection)",
                         status ? status : "?");
        }
    }
    json_decref(m);
    return failed;
}

int probe_experiment_run_incomplete(const char *manifest, char *how, size_t cap,
                                    char **run_end_json)
{
    if (run_end_json)
        *run_end_json = NULL;
    if (cap)
        how[0] = 0;
    json_t *m = manifest ? json_loads(manifest, 0, NULL) : NULL;
    json_t *re = m ? json_object_get(m, "run_end") : NULL;
    /* the shim's "lost": tensors tapped and never written (a write error) */
    json_t *lost = m ? json_object_get(m, "lost") : NULL;
    json_t *lc = json_object_get(lost, "count");
    json_int_t nlost = json_is_integer(lc) ? json_integer_value(lc) : 0;
    if (!re && nlost <= 0) {
        json_decref(m);
        return 0;
    }
    if (run_end_json && re)
        *run_end_json = json_dumps(re, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    int incomplete = nlost > 0 || !json_is_true(json_object_get(re, "capture_complete"));
    if (incomplete) {
        size_t len = 0;
        const char *sig = json_string_value(json_object_get(re, "signal"));
        json_t *st = json_object_get(re, "exit_status");
        const char *cs = json_string_value(json_object_get(re, "capture"));
        char part[4][160];
        int np = 0;
        if (nlost > 0) {
            const char *why = json_string_value(json_object_get(lost, "reason"));
            snprintf(part[np++], sizeof part[0], "%lld tapped tensor%s not written: %.100s",
                     (long long)nlost, nlost == 1 ? "" : "s", why ? why : "a write error");
        }
        if (sig)
            snprintf(part[np++], sizeof part[0], "killed by signal %.40s", sig);
        if (json_is_integer(st) && json_integer_value(st) != 0)
            snprintf(part[np++], sizeof part[0], "exit status %lld",
                     (long long)json_integer_value(st));
        if (cs && strcmp(cs, "journal") == 0)
            snprintf(part[np++], sizeof part[0], "its writer did not close the capture");
        else if (cs && strcmp(cs, "not written") == 0)
            snprintf(part[np++], sizeof part[0], "no process of the run wrote the capture");
        if (!np)
            snprintf(part[np++], sizeof part[0], "its run_end does not say that it completed");
        for (int k = 0; k < np && len < cap; k++)
            len += (size_t)snprintf(how + len, cap - len, "%s%s", k ? "; " : "", part[k]);
    }
    json_decref(m);
    return incomplete;
}

int probe_experiment_check_isolated(const char *iso_manifest, probe_file *rf, char *why,
                                    size_t cap)
{
    char how[256];
    if (probe_experiment_run_incomplete(iso_manifest, how, sizeof how, NULL)) {
        snprintf(why, cap, "the run did not complete (%s)", how);
        return 1;
    }
    if (probe_experiment_inject_failed(iso_manifest, why, cap))
        return 1;
    json_t *m = iso_manifest ? json_loads(iso_manifest, 0, NULL) : NULL;
    json_t *inj = m ? json_object_get(m, "inject") : NULL;
    int bad = 0;
    if (!json_is_object(inj)) {
        snprintf(why, cap, "it was not run with probe-run --replay (its manifest has no \"inject\")");
        bad = 1;
    } else {
        json_t *list = json_object_get(inj, "tensors"), *e;
        size_t k;
        if (!json_array_size(list)) {
            snprintf(why, cap, "nothing was injected in it");
            bad = 1;
        }
        json_array_foreach(list, k, e) {
            const char *p = json_string_value(json_object_get(e, "path"));
            const char *h = json_string_value(json_object_get(e, "reference_hash"));
            size_t ri;
            if (!p || !h || probe_file_find(rf, p, &ri) != PROBE_OK ||
                strcmp(probe_file_tensor(rf, ri)->hash, h) != 0) {
                snprintf(why, cap, "%s was injected from another reference (its recorded hash is "
                         "not this reference's)", p ? p : "a tensor");
                bad = 1;
                break;
            }
        }
    }
    json_decref(m);
    return bad;
}

int probe_experiment_is_replay(const char *manifest, const char *const *roots)
{
    json_t *m = manifest ? json_loads(manifest, 0, NULL) : NULL;
    json_t *list = m ? json_object_get(json_object_get(m, "inject"), "tensors") : NULL, *e;
    size_t k;
    int replay = 0;
    json_array_foreach(list, k, e) {
        const char *p = json_string_value(json_object_get(e, "path"));
        const char *slot = p ? strrchr(p, '/') : NULL;
        char comp[128];
        if (!slot || strncmp(slot + 1, "in.", 3) || p[0] != '/')
            continue;
        const char *end = strchr(p + 1, '/');
        snprintf(comp, sizeof comp, "%.*s", end ? (int)(end - p - 1) : 0, p + 1);
        if (!is_root(comp, roots))
            replay = 1;
    }
    json_decref(m);
    return replay;
}
