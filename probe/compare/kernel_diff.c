/* kernel_diff.c - the kernel logs of two run manifests side by side, and the
 * --expect-kernel check (include/probe/kernels.h, docs/kernels.md). */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "probe/kernels.h"

/* The "kernels" object of manifest text (borrowed from *root, which the
 * caller frees), NULL when absent. PROBE_EFORMAT names the side. */
static probe_status load(const char *text, const char *side, json_t **root, json_t **kernels)
{
    *root = NULL;
    *kernels = NULL;
    if (!text)
        return PROBE_OK;
    json_error_t err;
    *root = json_loads(text, 0, &err);
    if (!*root)
        return probe_set_error(PROBE_EFORMAT, "%s manifest is not JSON: %s", side, err.text);
    json_t *k = json_object_get(*root, "kernels");
    if (!k)
        return PROBE_OK;
    if (!json_is_object(k))
        return probe_set_error(PROBE_EFORMAT, "%s manifest: \"kernels\" is not an object", side);
    const char *comp;
    json_t *c;
    json_object_foreach(k, comp, c) {
        json_t *by = json_is_object(c) ? json_object_get(c, "by_name") : NULL;
        if (!json_is_object(by))
            return probe_set_error(PROBE_EFORMAT,
                                   "%s manifest: kernels of component '%s' have no \"by_name\" object",
                                   side, comp);
        const char *name;
        json_t *n;
        json_object_foreach(by, name, n) {
            if (!json_is_integer(n) || json_integer_value(n) < 0)
                return probe_set_error(PROBE_EFORMAT,
                                       "%s manifest: kernel count of '%s' in component '%s' is not "
                                       "a non-negative integer", side, name, comp);
        }
    }
    *kernels = k;
    return PROBE_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_count(const void *a, const void *b)
{
    return strcmp(((const probe_kernel_count *)a)->name, ((const probe_kernel_count *)b)->name);
}

static unsigned long long launches(json_t *c)
{
    json_t *l = c ? json_object_get(c, "launches") : NULL;
    return json_is_integer(l) && json_integer_value(l) > 0 ? (unsigned long long)json_integer_value(l)
                                                           : 0;
}

/* Names of `by` absent from `other` (NULL: all) into *out, name order. */
static probe_status only_in(json_t *by, json_t *other, probe_kernel_count **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!by)
        return PROBE_OK;
    size_t cap = json_object_size(by);
    if (!cap)
        return PROBE_OK;
    probe_kernel_count *v = calloc(cap, sizeof *v);
    if (!v)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    const char *name;
    json_t *cnt;
    json_object_foreach(by, name, cnt) {
        if (other && json_object_get(other, name))
            continue;
        if (!(v[*n].name = strdup(name))) {
            for (size_t i = 0; i < *n; i++)
                free(v[i].name);
            free(v);
            *n = 0;
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        }
        v[*n].count = (unsigned long long)json_integer_value(cnt);
        ++*n;
    }
    qsort(v, *n, sizeof *v, cmp_count);
    *out = v;
    return PROBE_OK;
}

void probe_kernel_diff_free(probe_kernel_diff *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->ncomponents; i++) {
        probe_kernel_component *c = &d->components[i];
        free(c->component);
        for (size_t j = 0; j < c->nonly_candidate; j++)
            free(c->only_candidate[j].name);
        for (size_t j = 0; j < c->nonly_reference; j++)
            free(c->only_reference[j].name);
        free(c->only_candidate);
        free(c->only_reference);
    }
    free(d->components);
    free(d);
}

probe_status probe_kernel_diff_compute(const char *manifest_reference,
                                       const char *manifest_candidate, probe_kernel_diff **out)
{
    if (!out)
        return probe_set_error(PROBE_EINVAL, "probe_kernel_diff_compute: out is NULL");
    *out = NULL;
    json_t *rr = NULL, *cr = NULL, *rk = NULL, *ck = NULL;
    const char **names = NULL;
    probe_kernel_diff *d = NULL;
    probe_status s = load(manifest_reference, "reference", &rr, &rk);
    if (s == PROBE_OK)
        s = load(manifest_candidate, "candidate", &cr, &ck);
    if (s != PROBE_OK)
        goto done;
    d = calloc(1, sizeof *d);
    size_t nmax = (rk ? json_object_size(rk) : 0) + (ck ? json_object_size(ck) : 0);
    names = calloc(nmax + 1, sizeof *names);
    if (!d || !names) {
        s = probe_set_error(PROBE_ENOMEM, "out of memory");
        goto done;
    }
    d->have_reference = rk != NULL;
    d->have_candidate = ck != NULL;
    size_t n = 0;
    const char *key;
    json_t *val;
    if (rk)
        json_object_foreach(rk, key, val) names[n++] = key;
    if (ck)
        json_object_foreach(ck, key, val) if (!rk || !json_object_get(rk, key)) names[n++] = key;
    qsort(names, n, sizeof *names, cmp_str);
    d->components = calloc(n ? n : 1, sizeof *d->components);
    if (!d->components) {
        s = probe_set_error(PROBE_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        probe_kernel_component *c = &d->components[i];
        d->ncomponents = i + 1;
        json_t *rc = rk ? json_object_get(rk, names[i]) : NULL;
        json_t *cc = ck ? json_object_get(ck, names[i]) : NULL;
        json_t *rb = rc ? json_object_get(rc, "by_name") : NULL;
        json_t *cb = cc ? json_object_get(cc, "by_name") : NULL;
        c->launches_reference = launches(rc);
        c->launches_candidate = launches(cc);
        if (!(c->component = strdup(names[i]))) {
            s = probe_set_error(PROBE_ENOMEM, "out of memory");
            goto done;
        }
        if ((s = only_in(cb, rb, &c->only_candidate, &c->nonly_candidate)) ||
            (s = only_in(rb, cb, &c->only_reference, &c->nonly_reference)))
            goto done;
    }
    *out = d;
    d = NULL;
done:
    probe_kernel_diff_free(d);
    free(names);
    json_decref(rr);
    json_decref(cr);
    return s;
}

/* Length of the component prefix of spec ("COMPONENT:GLOB"), 0 if none. */
static size_t component_prefix(const char *spec)
{
    const char *colon = strchr(spec, ':');
    if (!colon || colon == spec || colon[1] == ':')
        return 0;
    for (const char *p = spec; p < colon; p++)
        if (strchr("*?[] <>\t", *p))
            return 0;
    return (size_t)(colon - spec);
}

probe_status probe_kernel_expect(const char *manifest, const char *spec, size_t *matched,
                                 char *first, size_t cap)
{
    if (!spec || !*spec || !matched)
        return probe_set_error(PROBE_EINVAL, "probe_kernel_expect: empty expectation");
    *matched = 0;
    if (first && cap)
        first[0] = '\0';
    size_t plen = component_prefix(spec);
    const char *glob = plen ? spec + plen + 1 : spec;
    if (!*glob)
        return probe_set_error(PROBE_EINVAL, "--expect-kernel '%s': empty GLOB", spec);
    json_t *root = NULL, *k = NULL;
    probe_status s = load(manifest, "candidate", &root, &k);
    if (s == PROBE_OK && !k)
        s = probe_set_error(PROBE_ENOTFOUND, "the run's manifest has no kernel log (\"kernels\")");
    if (s == PROBE_OK) {
        const char *comp;
        json_t *c;
        json_object_foreach(k, comp, c) {
            if (plen && (strlen(comp) != plen || strncmp(comp, spec, plen) != 0))
                continue;
            const char *name;
            json_t *cnt;
            json_object_foreach(json_object_get(c, "by_name"), name, cnt) {
                if (json_integer_value(cnt) > 0 && fnmatch(glob, name, 0) == 0) {
                    if (*matched == 0 && first && cap) {
                        strncpy(first, name, cap - 1);
                        first[cap - 1] = '\0';
                    }
                    ++*matched;
                }
            }
        }
    }
    json_decref(root);
    return s;
}
