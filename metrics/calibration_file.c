/* calibration_file.c - T2 calibration files (probe/calibration_file.h; format in
 * docs/calibration.md). JSON read with jansson.
 */
#include "probe/calibration_file.h"
#include "probe/dtype.h"

#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALIBRATION_FORMAT "probe-calibration"
#define CALIBRATION_VERSION 1

/* Threshold keys of a component / tensor entry, in the order docs list them. */
enum { K_REL_L2, K_COSINE, K_ATOL, K_RTOL, K_MISMATCH, K_P99, K_MAX_ABS, K_CHANNEL_Z, K_GAIN_Z,
       K_SKIPPED, NKEYS };
static const char *const key_names[NKEYS] = {
    [K_REL_L2] = "rel_l2_max",   [K_COSINE] = "cosine_min",
    [K_ATOL] = "atol",           [K_RTOL] = "rtol",
    [K_MISMATCH] = "mismatch_fraction_max",
    [K_P99] = "p99_abs_max",     [K_MAX_ABS] = "max_abs_max",
    [K_CHANNEL_Z] = "channel_z_max", [K_GAIN_Z] = "gain_z_max",
    [K_SKIPPED] = "skipped_fraction_max",
};
#define ALL_KEYS ((1u << NKEYS) - 1)
#define STRUCTURE_KEYS ((1u << K_CHANNEL_Z) | (1u << K_GAIN_Z))
#define ENTRY_KEYS_TEXT \
    "rel_l2_max, cosine_min, atol, rtol, mismatch_fraction_max, p99_abs_max, max_abs_max, " \
    "channel_z_max, gain_z_max, skipped_fraction_max, observed, x-*"
#define STRUCTURE_KEYS_TEXT "channel_z_max, gain_z_max, channel_z_max_by_channel, observed, x-*"
#define BY_CHANNEL_KEY "channel_z_max_by_channel"

static const char *const top_keys[] = {
    "format", "version", "feature", "headroom", "weights", "weights_rounding", "components",
    "tensors", "structure", "evidence", NULL,
};
#define TOP_KEYS_TEXT \
    "format, version, feature, headroom, weights, weights_rounding, components, tensors, " \
    "structure, evidence, x-*"

typedef struct {
    char *name; /* component name, or dataset-path glob */
    unsigned has; /* bit k set: key_names[k] given */
    double v[NKEYS];
    double *by_channel; /* "structure" only: channel_z_max_by_channel (NaN: null), or NULL */
    uint64_t nby_channel;
} cal_entry;

struct probe_calibration {
    char *path;
    cal_entry *components;
    size_t ncomponents;
    cal_entry *tensors; /* file order: the first matching glob wins */
    size_t ntensors;
    cal_entry *structure; /* dataset path -> channel_z_max, gain_z_max; sorted by name */
    size_t nstructure;
    double headroom;      /* top-level "headroom", NaN when absent */
    int weights_quantized; /* top-level "weights": 1 "quantized", 0 "same" or absent */
    int weights_rounding;  /* top-level "weights_rounding": a probe_rounding, -1 absent */
};

void probe_calibration_free(probe_calibration *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->ncomponents; i++)
        free(c->components[i].name);
    for (size_t i = 0; i < c->ntensors; i++)
        free(c->tensors[i].name);
    for (size_t i = 0; i < c->nstructure; i++) {
        free(c->structure[i].name);
        free(c->structure[i].by_channel);
    }
    free(c->components);
    free(c->tensors);
    free(c->structure);
    free(c->path);
    free(c);
}

static const char *json_type_name(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "an array";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER:
    case JSON_REAL:    return "a number";
    case JSON_TRUE:
    case JSON_FALSE:   return "a boolean";
    case JSON_NULL:    return "null";
    }
    return "unknown";
}

static int is_extension_key(const char *k)
{
    return strncmp(k, "x-", 2) == 0;
}

/* A structure entry's channel_z_max_by_channel: 1..PROBE_CHANNELS_MAX numbers,
 * each finite and >= 0, or null (that channel unchecked). */
static probe_status parse_by_channel(const char *path, const char *section, const char *name,
                                     json_t *val, cal_entry *e)
{
    if (!json_is_array(val))
        return probe_set_error(PROBE_EFORMAT, "calibration %s: %s '%s': " BY_CHANNEL_KEY
                               " must be an array, not %s", path, section, name,
                               json_type_name(val));
    size_t n = json_array_size(val);
    if (n == 0 || n > PROBE_CHANNELS_MAX)
        return probe_set_error(PROBE_EFORMAT, "calibration %s: %s '%s': " BY_CHANNEL_KEY
                               " has %zu entries (1 to %d)", path, section, name, n,
                               PROBE_CHANNELS_MAX);
    double *v = malloc(n * sizeof *v);
    if (v == NULL)
        return probe_set_error(PROBE_ENOMEM, "calibration %s: out of memory", path);
    for (size_t k = 0; k < n; k++) {
        json_t *x = json_array_get(val, k);
        double d = json_is_null(x) ? NAN : json_is_number(x) ? json_number_value(x) : -1.0;
        if (!json_is_null(x) && !(isfinite(d) && d >= 0.0)) {
            free(v);
            return probe_set_error(PROBE_EFORMAT, "calibration %s: %s '%s': " BY_CHANNEL_KEY
                                   "[%zu] must be a finite number >= 0 or null, not %s", path,
                                   section, name, k,
                                   json_is_number(x) ? "a negative number" : json_type_name(x));
        }
        v[k] = d;
    }
    free(e->by_channel);
    e->by_channel = v;
    e->nby_channel = n;
    return PROBE_OK;
}

/* Parse one entry object (section "components", "tensors" or "structure", key
 * `name`); `allowed` holds the bits of the threshold keys the section takes. */
static probe_status parse_entry(const char *path, const char *section, const char *name,
                                json_t *obj, unsigned allowed, cal_entry *e)
{
    if (!json_is_object(obj))
        return probe_set_error(PROBE_EFORMAT, "calibration %s: %s '%s' must be an object, not %s",
                               path, section, name, json_type_name(obj));
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        if (strcmp(key, "observed") == 0 || is_extension_key(key))
            continue;
        if (allowed == STRUCTURE_KEYS && strcmp(key, BY_CHANNEL_KEY) == 0) {
            probe_status st = parse_by_channel(path, section, name, val, e);
            if (st != PROBE_OK)
                return st;
            continue;
        }
        int k = -1;
        for (int i = 0; i < NKEYS; i++)
            if ((allowed & (1u << i)) && strcmp(key, key_names[i]) == 0)
                k = i;
        if (k < 0)
            return probe_set_error(PROBE_EFORMAT,
                                   "calibration %s: %s '%s': unknown key '%s' (known: %s)", path,
                                   section, name, key,
                                   allowed == STRUCTURE_KEYS ? STRUCTURE_KEYS_TEXT
                                                             : ENTRY_KEYS_TEXT);
        if (!json_is_number(val))
            return probe_set_error(PROBE_EFORMAT,
                                   "calibration %s: %s '%s': %s must be a number, not %s", path,
                                   section, name, key, json_type_name(val));
        double x = json_number_value(val);
        if (!isfinite(x))
            return probe_set_error(PROBE_EFORMAT, "calibration %s: %s '%s': %s is not finite",
                                   path, section, name, key);
        if (k == K_COSINE && !(x >= -1.0 && x <= 1.0))
            return probe_set_error(PROBE_EFORMAT,
                                   "calibration %s: %s '%s': cosine_min %g is outside [-1, 1]",
                                   path, section, name, x);
        if (k != K_COSINE && x < 0.0)
            return probe_set_error(PROBE_EFORMAT,
                                   "calibration %s: %s '%s': %s %g is negative", path, section,
                                   name, key, x);
        if (k == K_SKIPPED && x > 1.0)
            return probe_set_error(PROBE_EFORMAT,
                                   "calibration %s: %s '%s': skipped_fraction_max %g is a "
                                   "fraction and must be in [0, 1]", path, section, name, x);
        if (k == K_MISMATCH && x > 1.0)
            return probe_set_error(PROBE_EFORMAT,
                                   "calibration %s: %s '%s': mismatch_fraction_max %g is a "
                                   "fraction and must be in [0, 1]", path, section, name, x);
        e->v[k] = x;
        e->has |= 1u << k;
    }
    return PROBE_OK;
}

/* Parse section "components", "tensors" or "structure" into a fresh array. */
static probe_status parse_section(const char *path, const char *section, json_t *obj,
                                  const char *const *known, unsigned allowed, cal_entry **out,
                                  size_t *nout)
{
    *out = NULL;
    *nout = 0;
    if (obj == NULL)
        return PROBE_OK;
    if (!json_is_object(obj))
        return probe_set_error(PROBE_EFORMAT, "calibration %s: \"%s\" must be an object, not %s",
                               path, section, json_type_name(obj));
    size_t n = json_object_size(obj);
    if (n == 0)
        return PROBE_OK;
    cal_entry *entries = calloc(n, sizeof *entries);
    if (entries == NULL)
        return probe_set_error(PROBE_ENOMEM, "calibration %s: out of memory", path);

    probe_status st = PROBE_OK;
    size_t i = 0;
    const char *name;
    json_t *val;
    json_object_foreach(obj, name, val) {
        if (name[0] == '\0') {
            st = probe_set_error(PROBE_EFORMAT, "calibration %s: empty name in \"%s\"", path,
                                 section);
            break;
        }
        if (known != NULL) {
            int ok = 0;
            for (size_t k = 0; known[k] != NULL; k++)
                if (strcmp(name, known[k]) == 0)
                    ok = 1;
            if (!ok) {
                char list[600] = "";
                size_t len = 0;
                for (size_t k = 0; known[k] != NULL && len < sizeof list; k++)
                    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                                            k ? ", " : "", known[k]);
                st = probe_set_error(PROBE_EINVAL,
                                     "calibration %s: unknown component '%s' (known: %s)", path,
                                     name, list);
                break;
            }
        }
        st = parse_entry(path, section, name, val, allowed, &entries[i]);
        if (st != PROBE_OK)
            break;
        if ((entries[i].name = strdup(name)) == NULL) {
            st = probe_set_error(PROBE_ENOMEM, "calibration %s: out of memory", path);
            break;
        }
        i++;
    }
    if (st != PROBE_OK) {
        for (size_t k = 0; k < n; k++) { /* entries past i are zero */
            free(entries[k].name);
            free(entries[k].by_channel);
        }
        free(entries);
        return st;
    }
    *out = entries;
    *nout = i;
    return PROBE_OK;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const cal_entry *)a)->name, ((const cal_entry *)b)->name);
}

static probe_status parse_root(const char *path, json_t *root, const char *const *known,
                               probe_calibration *c)
{
    if (!json_is_object(root))
        return probe_set_error(PROBE_EFORMAT, "calibration %s: top level must be a JSON object, not %s",
                               path, json_type_name(root));
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        int ok = is_extension_key(key);
        for (int i = 0; !ok && top_keys[i] != NULL; i++)
            ok = strcmp(key, top_keys[i]) == 0;
        if (!ok)
            return probe_set_error(PROBE_EFORMAT, "calibration %s: unknown key '%s' (known: %s)",
                                   path, key, TOP_KEYS_TEXT);
    }

    json_t *fmt = json_object_get(root, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), CALIBRATION_FORMAT) != 0)
        return probe_set_error(PROBE_EFORMAT,
                               "calibration %s: \"format\" must be \"%s\" (got %s%s%s)", path,
                               CALIBRATION_FORMAT, json_is_string(fmt) ? "\"" : "",
                               fmt == NULL ? "nothing"
                                           : (json_is_string(fmt) ? json_string_value(fmt)
                                                                  : json_type_name(fmt)),
                               json_is_string(fmt) ? "\"" : "");
    json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver) || json_integer_value(ver) != CALIBRATION_VERSION) {
        if (json_is_integer(ver))
            return probe_set_error(PROBE_EFORMAT,
                                   "calibration %s: unsupported version %lld (this build reads %d)",
                                   path, (long long)json_integer_value(ver), CALIBRATION_VERSION);
        return probe_set_error(PROBE_EFORMAT,
                               "calibration %s: \"version\" must be the integer %d (got %s)", path,
                               CALIBRATION_VERSION, ver == NULL ? "nothing" : json_type_name(ver));
    }
    json_t *feature = json_object_get(root, "feature");
    if (feature != NULL && !json_is_string(feature))
        return probe_set_error(PROBE_EFORMAT, "calibration %s: \"feature\" must be a string, not %s",
                               path, json_type_name(feature));
    json_t *headroom = json_object_get(root, "headroom");
    if (headroom != NULL && (!json_is_number(headroom) || !(json_number_value(headroom) > 0.0)))
        return probe_set_error(PROBE_EFORMAT,
                               "calibration %s: \"headroom\" must be a positive number", path);

    c->headroom = headroom != NULL ? json_number_value(headroom) : NAN;
    json_t *weights = json_object_get(root, "weights");
    if (weights != NULL &&
        (!json_is_string(weights) || (strcmp(json_string_value(weights), "same") != 0 &&
                                      strcmp(json_string_value(weights), "quantized") != 0)))
        return probe_set_error(PROBE_EFORMAT,
                               "calibration %s: \"weights\" must be \"same\" or \"quantized\"", path);
    c->weights_quantized = weights != NULL && strcmp(json_string_value(weights), "quantized") == 0;
    json_t *wr = json_object_get(root, "weights_rounding");
    c->weights_rounding = -1;
    for (int r = 0; wr != NULL && json_is_string(wr) && r < PROBE_ROUNDING_COUNT_; ++r)
        if (strcmp(json_string_value(wr), probe_rounding_name((probe_rounding)r)) == 0)
            c->weights_rounding = r;
    if (wr != NULL && c->weights_rounding < 0)
        return probe_set_error(PROBE_EFORMAT,
                               "calibration %s: \"weights_rounding\" must be \"float8_e4m3fn\" or "
                               "\"float8_e4m3fn/amax\"", path);
    if (wr != NULL && !c->weights_quantized)
        return probe_set_error(PROBE_EFORMAT,
                               "calibration %s: \"weights_rounding\" needs \"weights\": \"quantized\"",
                               path);

    probe_status st = parse_section(path, "components", json_object_get(root, "components"),
                                    known, ALL_KEYS, &c->components, &c->ncomponents);
    if (st != PROBE_OK)
        return st;
    st = parse_section(path, "tensors", json_object_get(root, "tensors"), NULL, ALL_KEYS,
                       &c->tensors, &c->ntensors);
    if (st != PROBE_OK)
        return st;
    st = parse_section(path, "structure", json_object_get(root, "structure"), NULL,
                       STRUCTURE_KEYS, &c->structure, &c->nstructure);
    if (st != PROBE_OK)
        return st;
    if (c->nstructure > 1)
        qsort(c->structure, c->nstructure, sizeof *c->structure, entry_cmp);
    if (c->ncomponents == 0 && c->ntensors == 0)
        return probe_set_error(PROBE_EFORMAT,
                               "calibration %s: no thresholds (\"components\" and \"tensors\" are "
                               "both absent or empty)", path);
    return PROBE_OK;
}

probe_status probe_calibration_load_stream(FILE *f, const char *name,
                                           const char *const *known_components,
                                           probe_calibration **out)
{
    if (out != NULL)
        *out = NULL;
    if (f == NULL || name == NULL || out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_calibration_load_stream: %s is NULL",
                               f == NULL ? "f" : name == NULL ? "name" : "out");
    json_error_t jerr;
    errno = 0;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    int read_err = ferror(f) ? (errno ? errno : EIO) : 0;
    if (root == NULL) {
        if (read_err)
            return probe_set_error(PROBE_EIO, "calibration %s: cannot read: %s", name,
                                   strerror(read_err));
        return probe_set_error(PROBE_EFORMAT, "calibration %s: not valid JSON (line %d, column %d): %s",
                               name, jerr.line, jerr.column, jerr.text);
    }

    probe_calibration *c = calloc(1, sizeof *c);
    if (c == NULL || (c->path = strdup(name)) == NULL) {
        free(c);
        json_decref(root);
        return probe_set_error(PROBE_ENOMEM, "calibration %s: out of memory", name);
    }
    probe_status st = parse_root(name, root, known_components, c);
    json_decref(root);
    if (st != PROBE_OK) {
        probe_calibration_free(c);
        return st;
    }
    *out = c;
    return PROBE_OK;
}

probe_status probe_calibration_load(const char *path, const char *const *known_components,
                                    probe_calibration **out)
{
    if (out != NULL)
        *out = NULL;
    if (path == NULL || out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_calibration_load: %s is NULL",
                               path == NULL ? "path" : "out");
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return probe_set_error(PROBE_ENOTFOUND, "calibration %s: cannot open: %s", path,
                               strerror(errno));
    probe_status st = probe_calibration_load_stream(f, path, known_components, out);
    fclose(f);
    return st;
}

probe_status probe_calibration_gate(const probe_calibration *c, const char *component,
                                    const char *path, probe_gate *g)
{
    if (c == NULL || g == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_calibration_gate: %s is NULL",
                               c == NULL ? "calibration" : "gate");
    const cal_entry *e = NULL;
    for (size_t i = 0; path != NULL && e == NULL && i < c->ntensors; i++)
        if (fnmatch(c->tensors[i].name, path, 0) == 0)
            e = &c->tensors[i];
    for (size_t i = 0; component != NULL && e == NULL && i < c->ncomponents; i++)
        if (strcmp(c->components[i].name, component) == 0)
            e = &c->components[i];
    if (e == NULL)
        return probe_set_error(PROBE_ENOTFOUND,
                               "calibration %s: no thresholds for component '%s' or tensor '%s'",
                               c->path, component ? component : "(none)", path ? path : "(none)");

    probe_status st = probe_gate_parse("T2", g); /* every threshold unchecked, atol = rtol = 0 */
    if (st != PROBE_OK)
        return st;
    double *dst[NKEYS] = {
        [K_REL_L2] = &g->rel_l2_max, [K_COSINE] = &g->cosine_min, [K_ATOL] = &g->atol,
        [K_RTOL] = &g->rtol, [K_MISMATCH] = &g->mismatch_fraction_max,
        [K_P99] = &g->p99_abs_max, [K_MAX_ABS] = &g->max_abs_max,
        [K_CHANNEL_Z] = &g->channel_z_max, [K_GAIN_Z] = &g->gain_z_max,
        [K_SKIPPED] = &g->skipped_fraction_max,
    };
    for (int k = 0; k < NKEYS; k++)
        if (e->has & (1u << k))
            *dst[k] = e->v[k];
    /* the path's structure entry, key by key, over the entry's */
    const cal_entry *se = NULL;
    if (path != NULL && c->nstructure > 0) {
        cal_entry key = {.name = (char *)path};
        se = bsearch(&key, c->structure, c->nstructure, sizeof *c->structure, entry_cmp);
    }
    for (int k = K_CHANNEL_Z; se != NULL && k <= K_GAIN_Z; k++)
        if (se->has & (1u << k))
            *dst[k] = se->v[k];
    if (se != NULL && se->by_channel != NULL) {
        g->channel_z_max_by_channel = se->by_channel;
        g->channel_z_count = se->nby_channel;
    }
    g->headroom = c->headroom;
    return PROBE_OK;
}

const char *probe_calibration_weights(const probe_calibration *c)
{
    return c && c->weights_quantized ? "quantized" : "same";
}

const char *probe_calibration_path(const probe_calibration *c)
{
    return c ? c->path : NULL;
}

const char *probe_calibration_weights_rounding(const probe_calibration *c)
{
    return c && c->weights_rounding >= 0 ? probe_rounding_name((probe_rounding)c->weights_rounding)
                                         : NULL;
}
