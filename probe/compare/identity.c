/* identity.c - pairing component calls by module path (identity.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "identity.h"

typedef struct {
    const char *comp;
    const char *module; /* "" unknown */
    const char *parent; /* the enclosing call (probe.parent), "" when not nested */
    int64_t block;      /* probe.block, -1 when not nested */
    int64_t call;       /* -1: the tensor's path is not /<component>/<call>/... */
} call_rec;

typedef struct {
    const char *comp;   /* points into a rankset entry: the rank sets outlive the map */
    size_t n[2];
    int64_t *calls[2];  /* the side's calls of the component, increasing */
    int64_t *other[2];  /* the paired call on the other side, -1 none */
    int nested;         /* 1: paired by (parent call, block index), 0: by module path */
} comp_map;

struct probe_call_map {
    comp_map *c;
    size_t nc;
    size_t moved, unpaired;
};

/* The call index of path when it is /<comp>/<digits>[/...] with those digits
 * equal to call; *rest then points after the digits. -1 otherwise. */
static int64_t path_call(const char *path, const char *comp, int64_t call, const char **rest)
{
    size_t len = strlen(comp);
    if (path[0] != '/' || strncmp(path + 1, comp, len) != 0 || path[1 + len] != '/')
        return -1;
    const char *p = path + 2 + len;
    int64_t v = 0;
    size_t nd = 0;
    for (; *p >= '0' && *p <= '9'; ++p, ++nd) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    if (nd == 0 || (*p != '\0' && *p != '/') || v != call)
        return -1;
    if (rest)
        *rest = p;
    return v;
}

static int cmp_comp_call(const void *a, const void *b)
{
    const call_rec *x = a, *y = b;
    int c = strcmp(x->comp, y->comp);
    if (c)
        return c;
    return (x->call > y->call) - (x->call < y->call);
}

/* One record per call of the side, sorted by (component, call); a component
 * with a tensor outside /<component>/<call>/ keeps one record of call -1. */
static probe_status side_calls(const probe_rankset *set, call_rec **out, size_t *nout)
{
    size_t n = probe_rankset_count(set);
    call_rec *v = n ? malloc(n * sizeof *v) : NULL;
    if (n && !v)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const probe_tensor_info *ti = &probe_rankset_entry_at(set, i)->info;
        v[i].comp = ti->component;
        v[i].module = ti->module;
        v[i].parent = ti->parent;
        v[i].block = ti->parent[0] ? ti->block : -1;
        v[i].call = ti->call >= 0 ? path_call(ti->path, ti->component, ti->call, NULL) : -1;
    }
    if (n)
        qsort(v, n, sizeof *v, cmp_comp_call);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && !strcmp(v[k - 1].comp, v[i].comp) && v[k - 1].call == v[i].call) {
            if (strcmp(v[k - 1].module, v[i].module) != 0)
                v[k - 1].module = ""; /* one call, two module paths: unknown */
            continue;
        }
        v[k++] = v[i];
    }
    *out = v;
    *nout = k;
    return PROBE_OK;
}

/* Every call of the group is nested (a parent call and a block index) and has a
 * well-formed path. */
static int group_nested(const call_rec *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (g[i].call < 0 || !g[i].parent[0] || g[i].block < 0)
            return 0;
    return n > 0;
}

/* The two sides' calls have the same (parent, block) at the same call index. */
static int same_nesting(const call_rec *a, size_t na, const call_rec *b, size_t nb)
{
    if (na != nb)
        return 0;
    for (size_t i = 0; i < na; i++)
        if (a[i].call != b[i].call || a[i].block != b[i].block || strcmp(a[i].parent, b[i].parent))
            return 0;
    return 1;
}

/* The key two paired calls share: (parent call, block index) when nested, else the
 * module path. */
static int cmp_key(const call_rec *x, const call_rec *y, int nested)
{
    if (!nested)
        return strcmp(x->module, y->module);
    int c = strcmp(x->parent, y->parent);
    return c ? c : (x->block > y->block) - (x->block < y->block);
}

/* qsort orders: by key, then by call index (the j-th call of a key pairs with the j-th). */
static int cmp_call(const call_rec *x, const call_rec *y)
{
    return (x->call > y->call) - (x->call < y->call);
}

static int cmp_sort_nested(const void *a, const void *b)
{
    const call_rec *x = *(const call_rec *const *)a, *y = *(const call_rec *const *)b;
    int c = cmp_key(x, y, 1);
    return c ? c : cmp_call(x, y);
}

static int cmp_sort_module(const void *a, const void *b)
{
    const call_rec *x = *(const call_rec *const *)a, *y = *(const call_rec *const *)b;
    int c = cmp_key(x, y, 0);
    return c ? c : cmp_call(x, y);
}

/* Every call of the group has a module path and a well-formed path. */
static int group_known(const call_rec *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (g[i].call < 0 || !g[i].module[0])
            return 0;
    return 1;
}

static int same_order(const call_rec *a, size_t na, const call_rec *b, size_t nb)
{
    if (na != nb)
        return 0;
    for (size_t i = 0; i < na; i++)
        if (strcmp(a[i].module, b[i].module) != 0)
            return 0;
    return 1;
}

/* Fill cm for the groups g[0] (reference) and g[1] (candidate): the j-th
 * call of each key (cmp_key) on one side with the j-th call of it on the other. */
static probe_status pair_group(comp_map *cm, const call_rec *const g[2], const size_t n[2],
                               int nested)
{
    const call_rec **ord[2] = {NULL, NULL};
    probe_status s = PROBE_OK;
    for (int side = 0; side < 2; side++) {
        cm->n[side] = n[side];
        cm->calls[side] = malloc((n[side] ? n[side] : 1) * sizeof(int64_t));
        cm->other[side] = malloc((n[side] ? n[side] : 1) * sizeof(int64_t));
        ord[side] = malloc((n[side] ? n[side] : 1) * sizeof *ord[side]);
        if (!cm->calls[side] || !cm->other[side] || !ord[side]) {
            s = probe_set_error(PROBE_ENOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < n[side]; i++) {
            cm->calls[side][i] = g[side][i].call;
            cm->other[side][i] = -1;
            ord[side][i] = &g[side][i];
        }
        qsort(ord[side], n[side], sizeof *ord[side], nested ? cmp_sort_nested : cmp_sort_module);
    }
    size_t i = 0, j = 0;
    while (i < n[0] && j < n[1]) {
        const call_rec *a = ord[0][i], *b = ord[1][j];
        int c = cmp_key(a, b, nested);
        if (c < 0) {
            i++;
        } else if (c > 0) {
            j++;
        } else {
            cm->other[0][a - g[0]] = b->call;
            cm->other[1][b - g[1]] = a->call;
            i++;
            j++;
        }
    }
done:
    free((void *)ord[0]);
    free((void *)ord[1]);
    return s;
}

probe_status probe_call_map_build(const probe_rankset *ref, const probe_rankset *cand,
                                  probe_call_map **out)
{
    *out = NULL;
    call_rec *v[2] = {NULL, NULL};
    size_t nv[2] = {0, 0};
    probe_call_map *m = NULL;
    probe_status s;
    if ((s = side_calls(ref, &v[0], &nv[0])) != PROBE_OK ||
        (s = side_calls(cand, &v[1], &nv[1])) != PROBE_OK)
        goto done;
    size_t i = 0, j = 0;
    while (i < nv[0] && j < nv[1]) {
        int c = strcmp(v[0][i].comp, v[1][j].comp);
        size_t ei = i, ej = j;
        if (c <= 0)
            while (ei < nv[0] && !strcmp(v[0][ei].comp, v[0][i].comp))
                ei++;
        if (c >= 0)
            while (ej < nv[1] && !strcmp(v[1][ej].comp, v[1][j].comp))
                ej++;
        /* nested calls pair by (parent call, block index); others by module path */
        int nested = c == 0 && group_nested(v[0] + i, ei - i) && group_nested(v[1] + j, ej - j);
        int by_nesting = nested && !same_nesting(v[0] + i, ei - i, v[1] + j, ej - j);
        int by_module = c == 0 && !nested && group_known(v[0] + i, ei - i) &&
                        group_known(v[1] + j, ej - j) &&
                        !same_order(v[0] + i, ei - i, v[1] + j, ej - j);
        if (by_nesting || by_module) {
            if (!m && !(m = calloc(1, sizeof *m))) {
                s = probe_set_error(PROBE_ENOMEM, "out of memory");
                goto done;
            }
            comp_map *grown = realloc(m->c, (m->nc + 1) * sizeof *grown);
            if (!grown) {
                s = probe_set_error(PROBE_ENOMEM, "out of memory");
                goto done;
            }
            m->c = grown;
            comp_map *cm = &m->c[m->nc++];
            memset(cm, 0, sizeof *cm);
            cm->comp = v[0][i].comp;
            cm->nested = by_nesting;
            const call_rec *g[2] = {v[0] + i, v[1] + j};
            const size_t n[2] = {ei - i, ej - j};
            if ((s = pair_group(cm, g, n, by_nesting)) != PROBE_OK)
                goto done;
            for (size_t k = 0; k < cm->n[0]; k++) {
                m->moved += cm->other[0][k] >= 0 && cm->other[0][k] != cm->calls[0][k];
                m->unpaired += cm->other[0][k] < 0;
            }
        }
        i = c <= 0 ? ei : i;
        j = c >= 0 ? ej : j;
    }
done:
    free(v[0]);
    free(v[1]);
    if (s != PROBE_OK) {
        probe_call_map_free(m);
        return s;
    }
    *out = m;
    return PROBE_OK;
}

int probe_call_map_other(const probe_call_map *m, int side, const probe_tensor_info *ti, char *buf,
                         size_t cap)
{
    if (!m || side < 0 || side > 1)
        return 0;
    const comp_map *cm = NULL;
    for (size_t i = 0; i < m->nc && !cm; i++)
        if (!strcmp(m->c[i].comp, ti->component))
            cm = &m->c[i];
    if (!cm)
        return 0;
    const char *rest = NULL;
    int64_t call = path_call(ti->path, ti->component, ti->call, &rest);
    buf[0] = '\0';
    size_t lo = 0, hi = cm->n[side];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cm->calls[side][mid] < call)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (call < 0 || lo == cm->n[side] || cm->calls[side][lo] != call || cm->other[side][lo] < 0)
        return 1;
    int w = snprintf(buf, cap, "/%s/%04lld%s", ti->component, (long long)cm->other[side][lo], rest);
    if (w < 0 || (size_t)w >= cap)
        buf[0] = '\0';
    return 1;
}

size_t probe_call_map_moved(const probe_call_map *m) { return m ? m->moved : 0; }
size_t probe_call_map_unpaired(const probe_call_map *m) { return m ? m->unpaired : 0; }

int probe_call_map_first_nested(const probe_call_map *m)
{
    return m && m->nc ? m->c[0].nested : 0;
}

const char *probe_call_map_first_component(const probe_call_map *m)
{
    return m && m->nc ? m->c[0].comp : "";
}

void probe_call_map_free(probe_call_map *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nc; i++)
        for (int side = 0; side < 2; side++) {
            free(m->c[i].calls[side]);
            free(m->c[i].other[side]);
        }
    free(m->c);
    free(m);
}
