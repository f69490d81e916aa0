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

static probe_status load(const char *path, int roots_only, char ***out, int **axes_out,
                         int **ranks_out)
{
    *out = NULL;
    if (axes_out)
        *axes_out = NULL;
    if (ranks_out)
        *ranks_out = NULL;
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
        if (axes) {
            json_t *ax = json_object_get(row, "channel_axis");
            axes[k] = json_is_integer(ax) && json_integer_value(ax) >= -PROBE_MAX_RANK &&
                              json_integer_value(ax) < PROBE_MAX_RANK
                          ? (int)json_integer_value(ax)
                          : PROBE_NO_CHANNEL_AXIS;
        }
        if (ranks) { /* "[B, C, F, H, W]" -> 5; 0 when absent */
            const char *lay = json_string_value(json_object_get(row, "layout"));
            int r = 0;
            for (const char *c = lay; c && *c; c++)
                r += *c == ',';
            ranks[k] = lay && strchr(lay, '[') ? r + 1 : 0;
        }
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
