/* probe/components.h - the component table (components/components.json,
 * installed as <prefix>/share/probe/components.json) as the C tools use it:
 * the list of known component names, against which calibration files and
 * other user input are checked (an unknown component name is an error). */
#ifndef PROBE_COMPONENTS_H
#define PROBE_COMPONENTS_H

#include "probe/status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Load the names of the table's rows ("name" of each entry of "components").
 * path: the table; NULL finds it: $PROBE_COMPONENTS if set, else
 * <directory of the running executable>/../share/probe/components.json.
 * On success *out is a NULL-terminated array of names; free it with
 * probe_component_names_free. Errors: PROBE_ENOTFOUND when path is NULL,
 * $PROBE_COMPONENTS is unset and no table is installed next to the
 * executable (callers may then accept any name); PROBE_EFORMAT when the table
 * (given, or named by $PROBE_COMPONENTS) cannot be read as JSON or has no
 * "components" list (the message names the file and the reason);
 * PROBE_ENOMEM; PROBE_EINVAL when out is NULL. */
probe_status probe_component_names_load(const char *path, char ***out);

/* The same names and, in (*axes)[i], the "channel_axis" of row i: the axis
 * of the component's tensors along which the per-channel mean shift is taken
 * (negative counts from the last axis: -1 = last), or PROBE_NO_CHANNEL_AXIS
 * when the row has none (or one outside [-16, 15]); in (*ranks)[i] the rank
 * of the row's "layout" ("[B, C, F, H, W]": 5; 0 when absent): the axis
 * applies to the component's tensors of that rank. Free *axes and *ranks
 * with free(). Errors as probe_component_names_load. */
#define PROBE_NO_CHANNEL_AXIS (-1000)
probe_status probe_component_axes_load(const char *path, char ***names, int **axes, int **ranks);

/* A row's per-class channel axes ("class_layouts": [{"classes": [glob, ...],
 * "layout": "[B, F, C, H, W]", "channel_axis": 2}, ...], docs/components.md):
 * for the tensors of `component` whose probe.class ("module.Qualname")
 * matches class_glob (fnmatch(3), flags 0: '*' also matches '.') and whose
 * rank is `rank` (the rank of the entry's "layout"), the channel axis is
 * `axis` instead of the row's. */
typedef struct probe_class_axis {
    char *component;
    char *class_glob;
    int axis; /* negative counts from the last axis */
    int rank;
} probe_class_axis;

/* All rows' per-class channel axes, in table order (rows in order, within a
 * row its entries in order, within an entry its classes in order: the first
 * that matches a tensor applies). *out is NULL and *n 0 when there are none.
 * Entries without a string glob, an integer "channel_axis" in [-16, 15] or a
 * "layout" are skipped. Free with probe_component_class_axes_free. Errors as
 * probe_component_names_load (PROBE_EINVAL when out or n is NULL). */
probe_status probe_component_class_axes_load(const char *path, probe_class_axis **out, size_t *n);

/* Free what probe_component_class_axes_load returned; a may be NULL. */
void probe_component_class_axes_free(probe_class_axis *a, size_t n);

/* The names of the rows marked "root": true (JSON true): the root inputs
 * of a run (initial latents, timesteps, prompt embeddings) whose contents
 * must be equal for two runs to be the same experiment (docs/inject.md).
 * path, errors and freeing as probe_component_names_load. */
probe_status probe_component_roots_load(const char *path, char ***out);

/* Free what probe_component_names_load returned; names may be NULL. */
void probe_component_names_free(char **names);

#ifdef __cplusplus
}
#endif
#endif
