/* components.c - the component table's names for the C tools
 * (probe/components.h). */
#include "probe/components.h"
#include "probe/capture.h" /* PROBE_MAX_RANK */

#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void probe_component_names_free(char **names)
{
    if (!names)
        return;
    for (size_t i = 0; names[i]; i++)
        free(names[i]);
    free(names);
}

/* The table's JSON (path as probe_component_names_load finds it). */
static probe_status open_table(const char *path, json_t **root_out, json_t **rows_out)
{
    *root_out = NULL;
    *rows_out = NULL;
    char buf[PATH_MAX];
    if (!path) {
        const char *env = getenv("PROBE_COMPONENTS");
        if (env && *env) {
            path = env;
        } else {
            char exe[PATH_MAX];
            ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
            if (len <= 0)
                return probe_set_error(PROBE_ENOTFOUND, "component table: cannot locate the "
                                                        "running executable");
            exe[len] = 0;
            if (snprintf(buf, sizeof buf, "%s/../share/probe/components.json", dirname(exe)) >=
                (int)sizeof buf)
                return probe_set_error(PROBE_ENOTFOUND, "component table: path too long");
            if (access(buf, F_OK) != 0)
                return probe_set_error(PROBE_ENOTFOUND, "component table %s: not installed", buf);
            path = buf;
        }
    }
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return probe_set_error(PROBE_EFORMAT, "component table %s: %s", path, err.text);
    json_t *rows = json_object_get(root, "components");
    if (!json_is_array(rows)) {
        json_decref(root);
        return probe_set_error(PROBE_EFORMAT, "component table %s: no \"components\" list", path);
    }
    *root_out = root;
    *rows_out = rows;
    return PROBE_OK;
}

/* "[B, C, F, H, W]" -> 5; 0 when absent */
static int layout_rank(json_t *layout)
{
    const char *lay = json_string_value(layout);
    int r = 0;
    for (const char *c = lay; c && *c; c++)
        r += *c == ',';
    return lay && strchr(lay, '[') ? r + 1 : 0;
}

/* The "channel_axis" of o, or PROBE_NO_CHANNEL_AXIS (absent, not an integer
 * in [-PROBE_MAX_RANK, PROBE_MAX_RANK)). */
static int axis_of(json_t *o)
{
    json_t *ax = json_object_get(o, "channel_axis");
    return json_is_integer(ax) && json_integer_value(ax) >= -PROBE_MAX_RANK &&
                   json_integer_value(ax) < PROBE_MAX_RANK
               ? (int)json_integer_value(ax)
               : PROBE_NO_CHANNEL_AXIS;
}

static probe_status load(const char *path, int roots_only, char ***out, int **axes_out,
                         int **ranks_out)
{
    *out = NULL;
    if (axes_out)
        *axes_out = NULL;
    if (ranks_out)
        *ranks_out = NULL;
    json_t *root, *rows;
    probe_status st = open_table(path, &root, &rows);
    if (st != PROBE_OK)
        return st;
    size_t n = json_array_size(rows), k = 0, i;
    char **names = calloc(n + 1, sizeof *names);
    int *axes = axes_out ? malloc((n + 1) * sizeof *axes) : NULL;
    int *ranks = ranks_out ? malloc((n + 1) * sizeof *ranks) : NULL;
    if (!names || (axes_out && !axes) || (ranks_out && !ranks)) {
        free(names);
        free(axes);
        free(ranks);
        json_decref(root);
        return probe_set_error(PROBE_ENOMEM, "component table %s: out of memory", path);
    }
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *name = json_string_value(json_object_get(row, "name"));
        if (!name || (roots_only && !json_is_true(json_object_get(row, "root"))))
            continue;
        if (axes)
            axes[k] = axis_of(row);
        if (ranks)
            ranks[k] = layout_rank(json_object_get(row, "layout"));
        if (!(names[k++] = strdup(name))) {
            probe_component_names_free(names);
            free(axes);
            free(ranks);
            json_decref(root);
            return probe_set_error(PROBE_ENOMEM, "component table %s: out of memory", path);
        }
    }
    json_decref(root);
    *out = names;
    if (axes_out)
        *axes_out = axes;
    if (ranks_out)
        *ranks_out = ranks;
    return PROBE_OK;
}

probe_status probe_component_names_load(const char *path, char ***out)
{
    if (!out)
        return probe_set_error(PROBE_EINVAL, "probe_component_names_load: out is NULL");
    return load(path, 0, out, NULL, NULL);
}

probe_status probe_component_axes_load(const char *path, char ***names, int **axes, int **ranks)
{
    if (!names || !axes || !ranks)
        return probe_set_error(PROBE_EINVAL, "probe_component_axes_load: NULL argument");
    return load(path, 0, names, axes, ranks);
}

probe_status probe_component_roots_load(const char *path, char ***out)
{
    if (!out)
        return probe_set_error(PROBE_EINVAL, "probe_component_roots_load: out is NULL");
    return load(path, 1, out, NULL, NULL);
}

void probe_component_class_axes_free(probe_class_axis *a, size_t n)
{
    if (!a)
        return;
    for (size_t i = 0; i < n; i++) {
        free(a[i].component);
        free(a[i].class_glob);
    }
    free(a);
}

probe_status probe_component_class_axes_load(const char *path, probe_class_axis **out, size_t *n)
{
    if (!out || !n)
        return probe_set_error(PROBE_EINVAL, "probe_component_class_axes_load: NULL argument");
    *out = NULL;
    *n = 0;
    json_t *root, *rows;
    probe_status st = open_table(path, &root, &rows);
    if (st != PROBE_OK)
        return st;
    probe_class_axis *a = NULL;
    size_t k = 0, cap = 0, i, j, c;
    json_t *row, *ent, *glob;
    json_array_foreach(rows, i, row) {
        const char *name = json_string_value(json_object_get(row, "name"));
        json_t *list = json_object_get(row, "class_layouts");
        if (!name || !json_is_array(list))
            continue;
        json_array_foreach(list, j, ent) {
            int axis = axis_of(ent), rank = layout_rank(json_object_get(ent, "layout"));
            if (axis == PROBE_NO_CHANNEL_AXIS || rank == 0)
                continue;
            json_array_foreach(json_object_get(ent, "classes"), c, glob) {
                if (!json_is_string(glob))
                    continue;
                if (k == cap) {
                    size_t ncap = cap ? 2 * cap : 8;
                    probe_class_axis *na = realloc(a, ncap * sizeof *na);
                    if (!na)
                        goto oom;
                    a = na;
                    cap = ncap;
                }
                a[k].component = strdup(name);
                a[k].class_glob = strdup(json_string_value(glob));
                a[k].axis = axis;
                a[k].rank = rank;
                k++;
                if (!a[k - 1].component || !a[k - 1].class_glob)
                    goto oom;
            }
        }
    }
    json_decref(root);
    *out = a;
    *n = k;
    return PROBE_OK;
oom:
    probe_component_class_axes_free(a, k);
    json_decref(root);
    return probe_set_error(PROBE_ENOMEM, "component table: out of memory");
}
