/* calibration_build.c - T2 thresholds and the determinism floor from repeated runs
 * (probe/calibrate.h, docs/calibration.md "probe-calibrate"). Every metric
 * comes from the compare engine (probe_compare_files). */
#include "probe/calibrate.h"

#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe/calibration_file.h"
#include "probe/capture.h"
#include "probe/compare.h"
#include "probe/gate.h"
#include "probe/verdict.h"
#include "weight_check.h"

enum { S_REL_L2, S_1MCOS, S_P99, S_MAX_ABS, S_MISMATCH, S_CHANNEL_Z, S_GAIN_Z, S_SKIPPED, NSTATS };

typedef struct {
    double worst, sum;
    size_t n;
} acc;

typedef struct {
    acc a[NSTATS];
    size_t pairs, tensors;
    long last_pair; /* pair id that last added to this drift (counts pairs) */
    size_t pair_tensors, pair_skipped; /* of the pair last_skip: compared, missing in the candidate */
    long last_skip;
} drift_acc;

typedef struct {
    probe_calibrate_component *c; /* result components, grown together with accs */
    drift_acc *feature, *floor;
    size_t n, cap;
} comp_table;

/* Per tensor path: |channel z| and |gain_z|, [0] feature pairs, [1] floor pairs. */
typedef struct {
    char path[512];
    char component[128];
    acc channel_z[2], gain_z[2];
    size_t pairs[2];
    long last_pair[2];
    /* per channel, over the feature pairs with a finite z_k: worst |z_k| (NaN: none yet),
     * sum and sum of squares of z_k, and their count */
    double *chan_worst, *chan_sum, *chan_sq, *chan_n;
    uint64_t nchan;
    double gain_sum, gain_sq, gain_n; /* signed gain_z over the feature pairs (finite ones) */
} path_acc;

typedef struct {
    path_acc *p;   /* first-seen order */
    size_t n, cap;
    size_t *slot;  /* open addressing over p: index + 1, 0 = empty; nslot a power of 2 */
    size_t nslot;
    struct {
        char component[128];
        double channel, gain;
    } *spread;     /* component_spread's cache */
    size_t nspread;
} path_table;

static size_t path_hash(const char *s)
{
    size_t h = (size_t)1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * (size_t)1099511628211ull;
    return h;
}

static int path_rehash(path_table *t, size_t nslot)
{
    size_t *slot = calloc(nslot, sizeof *slot);
    if (!slot)
        return -1;
    for (size_t i = 0; i < t->n; i++) {
        size_t h = path_hash(t->p[i].path) & (nslot - 1);
        while (slot[h])
            h = (h + 1) & (nslot - 1);
        slot[h] = i + 1;
    }
    free(t->slot);
    t->slot = slot;
    t->nslot = nslot;
    return 0;
}

/* The entry of `path` (created if new); -1 when out of memory. */
static long path_find(path_table *t, const char *path, const char *component)
{
    if (2 * (t->n + 1) > t->nslot && path_rehash(t, t->nslot ? 2 * t->nslot : 64) < 0)
        return -1;
    size_t h = path_hash(path) & (t->nslot - 1);
    for (; t->slot[h]; h = (h + 1) & (t->nslot - 1))
        if (strcmp(t->p[t->slot[h] - 1].path, path) == 0)
            return (long)(t->slot[h] - 1);
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        path_acc *p = realloc(t->p, cap * sizeof *p);
        if (!p)
            return -1;
        t->p = p;
        t->cap = cap;
    }
    path_acc *e = &t->p[t->n];
    memset(e, 0, sizeof *e);
    snprintf(e->path, sizeof e->path, "%s", path);
    snprintf(e->component, sizeof e->component, "%s", component);
    e->last_pair[0] = e->last_pair[1] = -1;
    t->slot[h] = t->n + 1;
    return (long)t->n++;
}

static void path_table_free(path_table *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->p[i].chan_worst);
        free(t->p[i].chan_sum);
        free(t->p[i].chan_sq);
        free(t->p[i].chan_n);
    }
    free(t->p);
    free(t->slot);
    free(t->spread);
}

/* A calibration's component and path tables (not the structs themselves). */
static void tables_free(comp_table *t, path_table *pt)
{
    free(t->c);
    free(t->feature);
    free(t->floor);
    path_table_free(pt);
}

static void acc_add(acc *a, double x)
{
    if (isnan(x))
        return;
    if (a->n == 0 || x > a->worst)
        a->worst = x;
    a->sum += x;
    a->n++;
}

static probe_calibrate_stat acc_stat(const acc *a)
{
    probe_calibrate_stat s = {NAN, NAN, a->n};
    if (a->n) {
        s.worst = a->worst;
        s.mean = a->sum / (double)a->n;
    }
    return s;
}

static long comp_find(comp_table *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->c[i].name, name) == 0)
            return (long)i;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 8;
        probe_calibrate_component *c = realloc(t->c, cap * sizeof *c);
        if (c)
            t->c = c;
        drift_acc *f = c ? realloc(t->feature, cap * sizeof *f) : NULL;
        if (f)
            t->feature = f;
        drift_acc *g = f ? realloc(t->floor, cap * sizeof *g) : NULL;
        if (!g)
            return -1;
        t->floor = g;
        t->cap = cap;
    }
    memset(&t->c[t->n], 0, sizeof t->c[0]);
    snprintf(t->c[t->n].name, sizeof t->c[0].name, "%s", name);
    memset(&t->feature[t->n], 0, sizeof t->feature[0]);
    memset(&t->floor[t->n], 0, sizeof t->floor[0]);
    t->feature[t->n].last_pair = t->floor[t->n].last_pair = -1;
    t->feature[t->n].last_skip = t->floor[t->n].last_skip = -1;
    return (long)t->n++;
}

static int known(const char *const *names, const char *name)
{
    if (!names)
        return 1;
    for (size_t i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0)
            return 1;
    return 0;
}

static void known_list(char *buf, size_t cap, const char *const *names)
{
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; names[i] && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", names[i]);
}

/* One sample (a tensor of a pair, or a record) of a component's feature or floor
 * statistics. -1 when out of memory. */
/* One compared (skipped 0) or skipped (1) tensor of pair pair_id in d's count. */
static void skip_count(drift_acc *d, long pair_id, int skipped)
{
    if (d->last_skip != pair_id) {
        d->last_skip = pair_id;
        d->pair_tensors = d->pair_skipped = 0;
    }
    if (skipped)
        d->pair_skipped++;
    else
        d->pair_tensors++;
}

static int add_sample(comp_table *t, const char *component, int is_floor, long pair_id,
                      double rel_l2, double cosine, double p99_abs, double max_abs,
                      double mismatch_fraction, double channel_z, double gain_z)
{
    long k = comp_find(t, component);
    if (k < 0)
        return -1;
    drift_acc *d = is_floor ? &t->floor[k] : &t->feature[k];
    skip_count(d, pair_id, 0);
    acc_add(&d->a[S_REL_L2], rel_l2);
    acc_add(&d->a[S_1MCOS], 1.0 - cosine);
    acc_add(&d->a[S_P99], p99_abs);
    acc_add(&d->a[S_MAX_ABS], max_abs);
    acc_add(&d->a[S_MISMATCH], mismatch_fraction);
    acc_add(&d->a[S_CHANNEL_Z], channel_z);
    acc_add(&d->a[S_GAIN_Z], gain_z);
    d->tensors++;
    if (d->last_pair != pair_id) {
        d->pairs++;
        d->last_pair = pair_id;
    }
    return 0;
}

/* Every channel's |z| of tensor x into the path's per-channel worst. */
static probe_status add_channels(path_acc *pa, const probe_tensor_result *x, const char *ref,
                                 const char *cand)
{
    uint64_t n = x->shift.count;
    if (!pa->chan_worst) {
        pa->chan_worst = malloc((size_t)n * sizeof(double));
        pa->chan_sum = calloc((size_t)n, sizeof(double));
        pa->chan_sq = calloc((size_t)n, sizeof(double));
        pa->chan_n = calloc((size_t)n, sizeof(double));
        if (!pa->chan_worst || !pa->chan_sum || !pa->chan_sq || !pa->chan_n)
            return probe_set_error(PROBE_ENOMEM, "out of memory"); /* freed with the table */
        for (uint64_t k = 0; k < n; k++)
            pa->chan_worst[k] = NAN;
        pa->nchan = n;
    }
    if (n != pa->nchan)
        return probe_set_error(PROBE_EMISMATCH, "pair %s vs %s: tensor %s has %llu channels, "
                               "%llu in an earlier pair; calibration runs must share the shapes",
                               ref, cand, x->ref.path, (unsigned long long)n,
                               (unsigned long long)pa->nchan);
    for (uint64_t k = 0; k < n; k++) {
        double z = x->channel_z[k];
        if (!isfinite(z))
            continue;
        if (isnan(pa->chan_worst[k]) || fabs(z) > pa->chan_worst[k])
            pa->chan_worst[k] = fabs(z);
        pa->chan_sum[k] += z;
        pa->chan_sq[k] += z * z;
        pa->chan_n[k] += 1;
    }
    return PROBE_OK;
}

/* The squared deviations of z_k about each channel's mean over the feature pairs of
 * path a, summed over the channels, and their degrees of freedom. */
static void path_spread(const path_acc *a, double *ss, double *dof)
{
    *ss = *dof = 0;
    for (uint64_t k = 0; a->chan_worst && k < a->nchan; k++)
        if (a->chan_n[k] >= 2) {
            double m = a->chan_sum[k] / a->chan_n[k];
            double d = a->chan_sq[k] - a->chan_n[k] * m * m;
            *ss += d > 0 ? d : 0;
            *dof += a->chan_n[k] - 1;
        }
}

/* The pooled spreads, over every path of component `comp`, of z_k about each path's
 * channel mean (*channel) and of gain_z about each path's mean (*gain); NaN: no degree of
 * freedom. Computed once per component into the table's cache. */
static void component_spread(path_table *pt, const char *comp, double *channel, double *gain)
{
    for (size_t i = 0; i < pt->nspread; i++)
        if (strcmp(pt->spread[i].component, comp) == 0) {
            *channel = pt->spread[i].channel;
            *gain = pt->spread[i].gain;
            return;
        }
    double ss = 0, dof = 0, gss = 0, gdof = 0;
    for (size_t i = 0; i < pt->n; i++)
        if (strcmp(pt->p[i].component, comp) == 0) {
            const path_acc *a = &pt->p[i];
            double s1, d1;
            path_spread(a, &s1, &d1);
            ss += s1;
            dof += d1;
            if (a->gain_n >= 2) {
                double m = a->gain_sum / a->gain_n, d = a->gain_sq - a->gain_n * m * m;
                gss += d > 0 ? d : 0;
                gdof += a->gain_n - 1;
            }
        }
    *channel = dof > 0 ? sqrt(ss / dof) : NAN;
    *gain = gdof > 0 ? sqrt(gss / gdof) : NAN;
    void *grown = realloc(pt->spread, (pt->nspread + 1) * sizeof *pt->spread);
    if (grown) { /* without memory it is computed again next time */
        pt->spread = grown;
        snprintf(pt->spread[pt->nspread].component, sizeof pt->spread[0].component, "%s", comp);
        pt->spread[pt->nspread].channel = *channel;
        pt->spread[pt->nspread++].gain = *gain;
    }
}

/* gain_z_max of one path: max(h * worst |gain_z|, |mean gain_z| + t_1 * s * sqrt(1 + 1/N)),
 * s the component's pooled gain_z spread (the band left out when it is NaN). */
static void gain_threshold(const path_acc *a, double h, path_table *pt, probe_calibrate_path *p)
{
    double sc, sg;
    component_spread(pt, a->component, &sc, &sg);
    p->gain_z_spread = sg;
    p->gain_z_max = h * p->gain_z.worst;
    if (a->gain_n >= 1 && isfinite(sg)) {
        double band = fabs(a->gain_sum / a->gain_n) +
                      probe_systematic_limit(1, PROBE_SYSTEMATIC_FALSE_ALARM) * sg *
                          sqrt(1.0 + 1.0 / a->gain_n);
        if (band > p->gain_z_max)
            p->gain_z_max = band;
    }
}

/* The per-channel thresholds of one path (probe/calibrate.h): the pooled spread of z_k
 * across the feature pairs (the component's, when the path was held by one pair only),
 * and per channel ceil(max(h * worst |z_k|, |mean z_k| + t_K * spread * sqrt(1 + 1/N_k))). */
static probe_status channel_thresholds(const path_acc *a, double h, path_table *pt,
                                       probe_calibrate_path *p)
{
    double ss, dof, sc, sg;
    path_spread(a, &ss, &dof);
    component_spread(pt, a->component, &sc, &sg);
    /* the path's own, or its component's where that is larger or the path has none: a
     * feature whose regime changes from seed to seed (a step cache) moves quiet paths more
     * than the few calibration seeds of that path show */
    p->channel_z_spread = dof > 0 && !(sqrt(ss / dof) < sc) ? sqrt(ss / dof) : sc;
    p->channel_t = probe_systematic_limit(a->nchan, PROBE_SYSTEMATIC_FALSE_ALARM);
    if (!(p->channel_z_max_by_channel = malloc((size_t)a->nchan * sizeof(double))))
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    p->nchannels = a->nchan;
    for (uint64_t k = 0; k < a->nchan; k++) {
        double w = a->chan_worst[k], t = h * w;
        if (a->chan_n[k] >= 1 && isfinite(p->channel_z_spread)) {
            double band = fabs(a->chan_sum[k] / a->chan_n[k]) +
                          p->channel_t * p->channel_z_spread * sqrt(1.0 + 1.0 / a->chan_n[k]);
            t = band > t ? band : t;
        }
        p->channel_z_max_by_channel[k] = isfinite(w) ? ceil(t) : NAN; /* a whole z, up */
    }
    return PROBE_OK;
}

/* The tensors a feature pair's candidate lacks (a feature that skips calls), counted
 * per component (a path's first element), and each component's skipped fraction of the
 * pair as one sample. */
static probe_status add_skipped(comp_table *t, const probe_compare_result *r, long pair_id)
{
    for (size_t i = 0; i < r->nmissing_cand; i++) {
        char comp[128];
        const char *p = r->missing_in_candidate[i] + (r->missing_in_candidate[i][0] == '/');
        size_t len = strcspn(p, "/");
        snprintf(comp, sizeof comp, "%.*s", (int)(len < sizeof comp ? len : sizeof comp - 1), p);
        long k = comp_find(t, comp);
        if (k < 0)
            return probe_set_error(PROBE_ENOMEM, "out of memory");
        skip_count(&t->feature[k], pair_id, 1);
    }
    for (size_t k = 0; k < t->n; k++) {
        drift_acc *d = &t->feature[k];
        if (d->last_skip == pair_id && d->pair_tensors + d->pair_skipped)
            acc_add(&d->a[S_SKIPPED],
                    (double)d->pair_skipped / (double)(d->pair_tensors + d->pair_skipped));
    }
    return PROBE_OK;
}

/* The compare options of a calibration pair: `gate` ("T1" to calibrate, "T2" for the
 * held-out check), the tolerances and channel axes of the options, the per-channel z
 * kept. */
static probe_status pair_opts(const probe_calibrate_opts *o, const char *gate,
                              probe_compare_opts *co)
{
    memset(co, 0, sizeof *co);
    probe_status s = probe_gate_parse(gate, &co->gate);
    if (s != PROBE_OK)
        return s;
    co->atol_set = co->rtol_set = 1;
    co->atol = o->atol;
    co->rtol = o->rtol;
    co->axis_components = o->axis_components;
    co->axis_values = o->axis_values;
    co->axis_ranks = o->axis_ranks;
    co->class_axes = o->class_axes;
    co->n_class_axes = o->n_class_axes;
    co->keep_channel_z = 1;
    return PROBE_OK;
}

/* Add the tensors of one compared pair (r, compared under T1 by pair_opts) to the
 * feature or floor statistics; an error when the pair cannot be calibrated on. */
static probe_status add_result(const probe_compare_result *r, const char *ref, const char *cand,
                               int is_floor, long pair_id, const probe_calibrate_opts *o,
                               comp_table *t, path_table *pt)
{
    probe_status s = PROBE_OK;
    const char *what = is_floor ? "floor pair" : "pair";
    if (r->nothing_compared) {
        s = probe_set_error(PROBE_EMISMATCH, "%s %s vs %s: nothing compared (no dataset path in "
                            "both files)", what, ref, cand);
        goto out;
    }
    if (r->nmissing_ref || (r->nmissing_cand && (is_floor || !o->skips_calls))) {
        s = probe_set_error(PROBE_EMISMATCH, "%s %s vs %s: %s %s (%zu missing in the second "
                            "file, %zu in the first); calibration runs must capture the same "
                            "tensors%s", what, ref, cand,
                            r->nmissing_cand ? r->missing_in_candidate[0]
                                             : r->missing_in_reference[0],
                            r->nmissing_cand ? "is missing in the second file"
                                             : "is missing in the first file",
                            r->nmissing_cand, r->nmissing_ref,
                            !is_floor && !r->nmissing_ref
                                ? " (a feature that skips calls, such as a step cache: "
                                  "--skips-calls)" : "");
        goto out;
    }
    for (size_t i = 0; i < r->ntensors; i++) {
        if (r->tensors[i].stats_only) { /* thresholds come from element-wise metrics */
            s = probe_set_error(PROBE_EUNSUPPORTED, "%s %s vs %s: %s is a stats-only record "
                                "(summary and hash, no elements); calibration needs full captures "
                                "(probe-run without --stats-only)", what, ref, cand,
                                r->tensors[i].ref.path);
            goto out;
        }
    }
    for (size_t i = 0; i < r->ntensors; i++) {
        const probe_tensor_result *x = &r->tensors[i];
        const probe_metrics *m = &x->m;
        if (!known(o->known_components, x->ref.component)) {
            char list[1024];
            known_list(list, sizeof list, o->known_components);
            s = probe_set_error(PROBE_EINVAL, "%s: tensor %s: unknown component '%s' (known: %s)",
                                ref, x->ref.path, x->ref.component, list);
            goto out;
        }
        const char *bad = NULL;
        if (!x->compared)
            bad = x->verdict.nreasons ? x->verdict.reasons[0] : "not compared";
        else if (m->nan_cand)
            bad = "NaN in the candidate";
        else if (m->nan_ref_only)
            bad = "NaN in the reference where the candidate is not NaN";
        else if (m->inf_mismatch)
            bad = "an infinity on one side only";
        else if (!isfinite(m->rel_l2) || !isfinite(m->cosine) || !isfinite(m->max_abs))
            bad = "a metric is not finite (zero-norm reference?)";
        if (bad) {
            s = probe_set_error(PROBE_EMISMATCH, "%s %s vs %s: tensor %s: %s; cannot calibrate "
                                "on it", what, ref, cand, x->ref.path, bad);
            goto out;
        }
        /* NaN (no channel axis) is not a sample */
        double cz = x->shift.count ? fabs(x->shift.z_max) : NAN, gz = fabs(m->gain_z);
        if (add_sample(t, x->ref.component, is_floor, pair_id, m->rel_l2, m->cosine, m->p99_abs,
                       m->max_abs, m->mismatch_fraction, cz, gz)) {
            s = probe_set_error(PROBE_ENOMEM, "out of memory");
            goto out;
        }
        long pk = path_find(pt, x->ref.path, x->ref.component);
        if (pk < 0) {
            s = probe_set_error(PROBE_ENOMEM, "out of memory");
            goto out;
        }
        path_acc *pa = &pt->p[pk];
        acc_add(&pa->channel_z[is_floor], cz);
        acc_add(&pa->gain_z[is_floor], gz);
        if (!is_floor && isfinite(m->gain_z)) {
            pa->gain_sum += m->gain_z;
            pa->gain_sq += m->gain_z * m->gain_z;
            pa->gain_n += 1;
        }
        if (!is_floor && x->channel_z && (s = add_channels(pa, x, ref, cand)) != PROBE_OK)
            goto out;
        if (pa->last_pair[is_floor] != pair_id) {
            pa->pairs[is_floor]++;
            pa->last_pair[is_floor] = pair_id;
        }
    }
    if (!is_floor && (s = add_skipped(t, r, pair_id)) != PROBE_OK)
        goto out;
    if (!is_floor && !r->feature_active)
        s = probe_set_error(PROBE_EMISMATCH, "pair %s vs %s: the candidate is identical to the "
                            "reference in every tensor (feature not active?); a feature that did "
                            "not run cannot be calibrated", ref, cand);
out:
    return s;
}

/* Compare one pair and add its tensors to the feature or floor statistics; *kept (when
 * not NULL) receives the compare result, else it is freed. */
static probe_status add_pair(const char *ref, const char *cand, int is_floor, long pair_id,
                             const probe_calibrate_opts *o, comp_table *t, path_table *pt,
                             probe_compare_result **kept)
{
    probe_compare_opts co;
    probe_compare_result *r = NULL;
    probe_status s = pair_opts(o, "T1", &co);
    if (s == PROBE_OK)
        s = probe_compare_files(ref, cand, &co, &r);
    if (s == PROBE_OK)
        s = add_result(r, ref, cand, is_floor, pair_id, o, t, pt);
    if (s == PROBE_OK && kept)
        *kept = r;
    else
        probe_compare_result_free(r);
    return s;
}

static void drift_out(const drift_acc *a, probe_calibrate_drift *d)
{
    d->pairs = a->pairs;
    d->tensors = a->tensors;
    d->rel_l2 = acc_stat(&a->a[S_REL_L2]);
    d->one_minus_cosine = acc_stat(&a->a[S_1MCOS]);
    d->p99_abs = acc_stat(&a->a[S_P99]);
    d->max_abs = acc_stat(&a->a[S_MAX_ABS]);
    d->mismatch_fraction = acc_stat(&a->a[S_MISMATCH]);
    d->channel_z = acc_stat(&a->a[S_CHANNEL_Z]);
    d->gain_z = acc_stat(&a->a[S_GAIN_Z]);
    d->skipped_fraction = acc_stat(&a->a[S_SKIPPED]);
}

void probe_calibrate_result_free(probe_calibrate_result *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nfiles; i++)
        free(r->files[i].manifest);
    for (size_t i = 0; i < r->narchs; i++)
        free(r->archs[i]);
    free(r->archs);
    free(r->files);
    free(r->components);
    for (size_t i = 0; i < r->npaths; i++)
        free(r->paths[i].channel_z_max_by_channel);
    free(r->paths);
    free(r->held_out);
    free(r);
}

static probe_status check_opts(const probe_calibrate_opts *o)
{
    if (!o)
        return probe_set_error(PROBE_EINVAL, "probe_calibrate_run: NULL options");
    if (!o->feature || !o->feature[0])
        return probe_set_error(PROBE_EINVAL, "no feature name");
    if (!isfinite(o->headroom) || o->headroom < 1)
        return probe_set_error(PROBE_EINVAL, "headroom %g: must be a finite number >= 1",
                               o->headroom);
    if (!isfinite(o->atol) || o->atol < 0 || !isfinite(o->rtol) || o->rtol < 0)
        return probe_set_error(PROBE_EINVAL, "atol %g rtol %g: must be finite and >= 0",
                               o->atol, o->rtol);
    if (o->nrecords) {
        if (!o->records)
            return probe_set_error(PROBE_EINVAL, "records: NULL list");
        if (o->nreferences || o->ncandidates || o->nrepeats)
            return probe_set_error(PROBE_EINVAL, "records and capture files cannot be mixed: "
                                   "give either records or reference/candidate runs");
        return PROBE_OK;
    }
    if (o->nreferences == 0 || !o->references)
        return probe_set_error(PROBE_EINVAL, "no reference run");
    if (o->ncandidates == 0 || !o->candidates)
        return probe_set_error(PROBE_EINVAL, "no candidate run");
    if (o->ncandidates > o->nreferences)
        return probe_set_error(PROBE_EINVAL, "%zu candidates but %zu references: "
                               "candidate i pairs with reference i", o->ncandidates,
                               o->nreferences);
    if (o->nrepeats > o->nreferences || (o->nrepeats && !o->repeats))
        return probe_set_error(PROBE_EINVAL, "%zu reference repeats but %zu "
                               "references: repeat k is a second run of reference k",
                               o->nrepeats, o->nreferences);
    if (o->weights && strcmp(o->weights, "same") != 0 && strcmp(o->weights, "quantized") != 0)
        return probe_set_error(PROBE_EINVAL, "weights '%s': must be same or quantized",
                               o->weights);
    size_t nfloor = o->nrepeats + (o->references_differ ? 0 : o->nreferences - 1);
    if (nfloor == 0)
        return probe_set_error(PROBE_EINVAL, "no determinism floor: give a second "
                               "reference run of the same inputs (another reference, or a "
                               "reference repeat)");
    return PROBE_OK;
}

static probe_status add_file(probe_calibrate_result *r, const char *path, const char *role, int idx)
{
    probe_calibrate_file *f = &r->files[r->nfiles];
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->role, sizeof f->role, "%s", role);
    f->index = idx;
    probe_file *pf = NULL;
    probe_status s = probe_file_open(path, &pf);
    if (s != PROBE_OK)
        return s;
    const char *m = probe_file_manifest(pf);
    if (m && !(f->manifest = strdup(m))) {
        probe_file_close(pf);
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    }
    probe_file_close(pf);
    r->nfiles++;
    return PROBE_OK;
}

/* The weights of every pair, by probe-compare's rule (probe_weights_refusal): a
 * feature pair as the options say, a floor pair always "same". r->files holds the
 * references, candidates and repeats in that order. Under "quantized",
 * r->weights_rounding is the rounding every feature pair was proven to be, if
 * one is. */
static probe_status check_weights(const probe_calibrate_opts *o, probe_calibrate_result *r)
{
    size_t nref = o->nreferences, ncand = o->ncandidates;
    size_t npairs = ncand + o->nrepeats + (o->references_differ ? 0 : nref - 1);
    int quantized = !strcmp(r->weights, "quantized"), common = quantized && ncand > 0;
    r->weights_rounding[0] = '\0';
    for (size_t p = 0; p < npairs; p++) {
        size_t a, b;
        int feature = p < ncand;
        if (feature)
            a = p, b = nref + p;
        else if (p < ncand + o->nrepeats)
            a = p - ncand, b = nref + ncand + (p - ncand);
        else
            a = 0, b = p - ncand - o->nrepeats + 1;
        probe_weights_verdict v;
        if (probe_weights_check(r->files[a].manifest, r->files[b].manifest, &v) != PROBE_OK)
            return PROBE_ENOMEM;
        const char *why = probe_weights_refusal(&v, feature ? r->weights : "same", NULL);
        int changed = !strcmp(v.status, "differ") || !strcmp(v.status, "quantized");
        if (feature && changed && !r->weights_line[0])
            snprintf(r->weights_line, sizeof r->weights_line, "%s", v.line);
        if (feature && common) {
            if (!strcmp(v.status, "quantized") && strcmp(v.rounding, "mixed") &&
                (!r->weights_rounding[0] || !strcmp(r->weights_rounding, v.rounding)))
                snprintf(r->weights_rounding, sizeof r->weights_rounding, "%s", v.rounding);
            else
                common = 0;
        }
        if (why) {
            probe_status s = probe_set_error(
                PROBE_EMISMATCH, "%s pair %s / %s: %s (%s); not calibrating (%s)",
                feature ? "feature" : "floor", r->files[a].path, r->files[b].path, v.line, why,
                feature ? "--weights quantized calibrates a feature that changes the weights"
                        : "the runs of a determinism floor load the same weights");
            probe_weights_verdict_free(&v);
            return s;
        }
        probe_weights_verdict_free(&v);
    }
    if (!common)
        r->weights_rounding[0] = '\0';
    return PROBE_OK;
}

/* Thresholds and the T1 check from the accumulated statistics, into r. */
static probe_status finish(probe_calibrate_result *r, const comp_table *t, path_table *pt,
                           double h, const probe_gate *t1)
{
    /* Components with feature drift get thresholds; floor-only ones are dropped. */
    r->t1_above_floor = 1;
    r->components = calloc(t->n ? t->n : 1, sizeof *r->components);
    if (!r->components)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    for (size_t i = 0; i < t->n; i++) {
        if (t->feature[i].tensors == 0)
            continue;
        probe_calibrate_component *c = &r->components[r->ncomponents++];
        *c = t->c[i];
        drift_out(&t->feature[i], &c->feature);
        drift_out(&t->floor[i], &c->floor);
        c->rel_l2_max = h * c->feature.rel_l2.worst;
        c->cosine_min = fmax(-1.0, 1.0 - h * c->feature.one_minus_cosine.worst);
        c->p99_abs_max = h * c->feature.p99_abs.worst; /* NaN stays NaN: not written */
        c->max_abs_max = h * c->feature.max_abs.worst;
        c->mismatch_fraction_max = fmin(1.0, h * c->feature.mismatch_fraction.worst);
        c->skipped_fraction_max = c->feature.skipped_fraction.worst > 0
                                      ? fmin(1.0, h * c->feature.skipped_fraction.worst) : NAN;
        c->channel_z_max = h * c->feature.channel_z.worst; /* NaN, inf: not written */
        c->gain_z_max = h * c->feature.gain_z.worst;
        c->t1_rel_l2_max = t1->rel_l2_max;
        c->t1_one_minus_cosine_max = 1.0 - t1->cosine_min;
        c->floor_rel_l2_x_headroom = h * c->floor.rel_l2.worst;
        c->floor_one_minus_cosine_x_headroom = h * c->floor.one_minus_cosine.worst;
        c->t1_above_floor = c->floor.tensors > 0 &&
                            c->floor_rel_l2_x_headroom < c->t1_rel_l2_max &&
                            c->floor_one_minus_cosine_x_headroom < c->t1_one_minus_cosine_max;
        r->t1_above_floor &= c->t1_above_floor;
    }
    if (r->ncomponents == 0)
        return probe_set_error(PROBE_EMISMATCH, "no tensor compared in any pair");
    /* Paths of the feature pairs; floor-only ones are dropped as components are. */
    r->paths = calloc(pt->n ? pt->n : 1, sizeof *r->paths);
    if (!r->paths)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    for (size_t i = 0; i < pt->n; i++) {
        const path_acc *a = &pt->p[i];
        if (a->pairs[0] == 0)
            continue;
        probe_calibrate_path *p = &r->paths[r->npaths++];
        snprintf(p->path, sizeof p->path, "%s", a->path);
        snprintf(p->component, sizeof p->component, "%s", a->component);
        p->pairs = a->pairs[0];
        p->floor_pairs = a->pairs[1];
        p->channel_z = acc_stat(&a->channel_z[0]);
        p->gain_z = acc_stat(&a->gain_z[0]);
        p->floor_channel_z = acc_stat(&a->channel_z[1]);
        p->floor_gain_z = acc_stat(&a->gain_z[1]);
        p->channel_z_max = h * p->channel_z.worst;
        gain_threshold(a, h, pt, p);
        probe_status s;
        if (a->chan_worst && (s = channel_thresholds(a, h, pt, p)) != PROBE_OK)
            return s;
    }
    return PROBE_OK;
}

/* --- records (probe-record JSON lines, docs/calibration.md "Records from tests") --- */

/* stats[key] as a finite number >= lo (<= hi); NAN when absent and optional. -1 after
 * the error. */
static int record_num(json_t *stats, const char *key, int required, double lo, double hi,
                      const char *where, double *out)
{
    json_t *v = json_object_get(stats, key);
    *out = NAN;
    if (!v) {
        if (!required)
            return 0;
        probe_set_error(PROBE_EFORMAT, "%s: stats lacks \"%s\"", where, key);
        return -1;
    }
    if (!json_is_number(v)) {
        probe_set_error(PROBE_EFORMAT, "%s: stats \"%s\" must be a number", where, key);
        return -1;
    }
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) {
        probe_set_error(PROBE_EFORMAT, "%s: stats \"%s\" %g is outside [%g, %g]", where, key, x,
                        lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static probe_status add_arch(probe_calibrate_result *r, const char *arch)
{
    for (size_t i = 0; i < r->narchs; i++)
        if (!strcmp(r->archs[i], arch))
            return PROBE_OK;
    char **a = realloc(r->archs, (r->narchs + 1) * sizeof *a);
    if (!a)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    r->archs = a;
    if (!(a[r->narchs] = strdup(arch)))
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    r->narchs++;
    return PROBE_OK;
}

typedef struct {
    int tol_set;       /* a record gave atol/rtol */
    double atol, rtol;
    char tol_where[600];
    size_t nonzero;    /* feature records with max_abs > 0 */
    char features[512]; /* other features seen, for the message when none matches */
} record_state;

/* One line (a JSON object) of a records file. */
static probe_status add_record(const probe_calibrate_opts *o, probe_calibrate_result *r,
                               comp_table *t, record_state *rs, const char *line,
                               const char *where, long id)
{
    json_error_t err;
    json_t *doc = json_loads(line, JSON_REJECT_DUPLICATES, &err);
    probe_status s = PROBE_OK;
    if (!json_is_object(doc)) {
        s = probe_set_error(PROBE_EFORMAT, "%s: not a JSON object (%s)", where,
                            doc ? "another JSON value" : err.text);
        goto out;
    }
    const char *format = json_string_value(json_object_get(doc, "format"));
    json_t *ver = json_object_get(doc, "version");
    if (!format || strcmp(format, "probe-record") || !json_is_integer(ver)) {
        s = probe_set_error(PROBE_EFORMAT, "%s: not a probe-record (no \"format\": "
                            "\"probe-record\" and integer \"version\")", where);
        goto out;
    }
    if (json_integer_value(ver) != 1) {
        s = probe_set_error(PROBE_EFORMAT, "%s: probe-record version %lld is not supported "
                            "(version 1)", where, (long long)json_integer_value(ver));
        goto out;
    }
    const char *comp = json_string_value(json_object_get(doc, "component"));
    const char *feat = json_string_value(json_object_get(doc, "feature"));
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    const char *arch = json_string_value(json_object_get(doc, "arch"));
    json_t *stats = json_object_get(doc, "stats");
    if (!comp || !*comp || !feat || !*feat || !kind || !json_is_object(stats)) {
        s = probe_set_error(PROBE_EFORMAT, "%s: a record needs a string \"component\", "
                            "\"feature\", \"kind\" and a \"stats\" object", where);
        goto out;
    }
    if (strcmp(kind, "feature") && strcmp(kind, "floor")) {
        s = probe_set_error(PROBE_EFORMAT, "%s: kind '%s' is not feature or floor", where, kind);
        goto out;
    }
    if (json_object_get(doc, "arch") && !arch) {
        s = probe_set_error(PROBE_EFORMAT, "%s: \"arch\" must be a string", where);
        goto out;
    }
    double rel, cos, mx, p99, mm, gz, cz, atol, rtol;
    if (record_num(stats, "rel_l2", 1, 0, INFINITY, where, &rel) ||
        record_num(stats, "cosine", 1, -1, 1, where, &cos) ||
        record_num(stats, "max_abs", 1, 0, INFINITY, where, &mx) ||
        record_num(stats, "p99_abs", 0, 0, INFINITY, where, &p99) ||
        record_num(stats, "mismatch_fraction", 0, 0, 1, where, &mm) ||
        record_num(stats, "gain_z", 0, -INFINITY, INFINITY, where, &gz) ||
        record_num(stats, "channel_z", 0, -INFINITY, INFINITY, where, &cz) ||
        record_num(stats, "atol", 0, 0, INFINITY, where, &atol) ||
        record_num(stats, "rtol", 0, 0, INFINITY, where, &rtol)) {
        s = PROBE_EFORMAT;
        goto out;
    }
    if (strcmp(feat, o->feature)) {
        r->nrecords_other++;
        size_t len = strlen(rs->features);
        if (!strstr(rs->features, feat) && len + strlen(feat) + 3 < sizeof rs->features)
            snprintf(rs->features + len, sizeof rs->features - len, "%s%s", len ? ", " : "", feat);
        goto out;
    }
    if (!known(o->known_components, comp)) {
        char list[1024];
        known_list(list, sizeof list, o->known_components);
        s = probe_set_error(PROBE_EINVAL, "%s: unknown component '%s' (known: %s)", where, comp,
                            list);
        goto out;
    }
    if (!isnan(mm) && (!isnan(atol) || !isnan(rtol))) {
        if (isnan(atol) || isnan(rtol)) {
            s = probe_set_error(PROBE_EFORMAT, "%s: stats gives one of atol/rtol without the "
                                "other", where);
            goto out;
        }
        if (!rs->tol_set) {
            rs->tol_set = 1;
            rs->atol = atol;
            rs->rtol = rtol;
            snprintf(rs->tol_where, sizeof rs->tol_where, "%s", where);
        } else if (atol != rs->atol || rtol != rs->rtol) {
            s = probe_set_error(PROBE_EINVAL, "%s: mismatch_fraction at atol %g rtol %g, but %s "
                                "measured it at atol %g rtol %g; records of one feature must "
                                "share them", where, atol, rtol, rs->tol_where, rs->atol,
                                rs->rtol);
            goto out;
        }
    }
    int is_floor = !strcmp(kind, "floor");
    if (add_sample(t, comp, is_floor, id, rel, cos, p99, mx, mm, isnan(cz) ? NAN : fabs(cz),
                   isnan(gz) ? NAN : fabs(gz))) {
        s = probe_set_error(PROBE_ENOMEM, "out of memory");
        goto out;
    }
    if (is_floor) {
        r->nfloor_pairs++;
    } else {
        r->npairs++;
        rs->nonzero += mx > 0;
    }
    if (arch && *arch)
        s = add_arch(r, arch);
out:
    json_decref(doc);
    return s;
}

/* A fresh result with the options' feature, headroom and tolerances, room for nfiles
 * files and the date; NULL when out of memory. */
static probe_calibrate_result *result_new(const probe_calibrate_opts *o, size_t nfiles)
{
    probe_calibrate_result *r = calloc(1, sizeof *r);
    if (!r || !(r->files = calloc(nfiles ? nfiles : 1, sizeof *r->files))) {
        free(r);
        return NULL;
    }
    snprintf(r->feature, sizeof r->feature, "%s", o->feature);
    r->headroom = o->headroom;
    r->atol = o->atol;
    r->rtol = o->rtol;
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(r->date, sizeof r->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return r;
}

static probe_status run_records(const probe_calibrate_opts *o, probe_calibrate_result **out)
{
    probe_gate t1;
    probe_status s = probe_gate_parse("T1", &t1);
    if (s != PROBE_OK)
        return s;
    probe_calibrate_result *r = result_new(o, o->nrecords);
    if (!r)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    r->from_records = 1;
    snprintf(r->weights, sizeof r->weights, "%s", o->weights ? o->weights : "same");
    comp_table t = {0};
    path_table pt = {0};
    record_state rs;
    memset(&rs, 0, sizeof rs);
    long id = 0;
    char *line = NULL;
    size_t cap = 0;
    for (size_t i = 0; s == PROBE_OK && i < o->nrecords; i++) {
        const char *path = o->records[i];
        probe_calibrate_file *f = &r->files[r->nfiles++];
        snprintf(f->path, sizeof f->path, "%s", path);
        snprintf(f->role, sizeof f->role, "records");
        f->index = (int)i;
        FILE *fp = fopen(path, "r");
        if (!fp) {
            s = probe_set_error(errno == ENOENT ? PROBE_ENOTFOUND : PROBE_EIO,
                                "records %s: cannot open: %s", path, strerror(errno));
            break;
        }
        ssize_t n;
        long lineno = 0;
        errno = 0;
        while (s == PROBE_OK && (n = getline(&line, &cap, fp)) >= 0) {
            lineno++;
            if (strspn(line, " \t\r\n") == (size_t)n)
                continue;
            char where[600];
            snprintf(where, sizeof where, "records %s:%ld", path, lineno);
            s = add_record(o, r, &t, &rs, line, where, id++);
        }
        if (s == PROBE_OK && ferror(fp))
            s = probe_set_error(PROBE_EIO, "records %s: cannot read: %s", path,
                                strerror(errno ? errno : EIO));
        fclose(fp);
    }
    free(line);
    if (s == PROBE_OK && r->npairs == 0)
        s = probe_set_error(PROBE_EINVAL, "no record of feature '%s' of kind feature in the "
                            "records (%zu of other features: %s)", o->feature, r->nrecords_other,
                            rs.features[0] ? rs.features : "none");
    if (s == PROBE_OK && rs.nonzero == 0)
        s = probe_set_error(PROBE_EMISMATCH, "every feature record of '%s' has max_abs 0: the "
                            "candidate was identical to the reference (feature not active?); a "
                            "feature that did not run cannot be calibrated", o->feature);
    if (s == PROBE_OK && rs.tol_set) {
        r->atol = rs.atol;
        r->rtol = rs.rtol;
    }
    if (s == PROBE_OK)
        s = finish(r, &t, &pt, o->headroom, &t1);
    tables_free(&t, &pt);
    if (s != PROBE_OK) {
        probe_calibrate_result_free(r);
        return s;
    }
    *out = r;
    return PROBE_OK;
}

/* Pair i of kept (the feature pairs' T1 results) judged by T2 with the thresholds of
 * the other feature pairs: calibrated again from them (finish, same headroom), written
 * and loaded as probe-compare loads a file, and pair i compared under it. */
static probe_status held_out_pair(const probe_calibrate_opts *o, const probe_calibrate_result *r,
                                  probe_compare_result *const *kept, size_t i,
                                  const probe_gate *t1, probe_calibrate_held_out *h)
{
    comp_table t = {0};
    path_table pt = {0};
    probe_calibrate_result *loo = result_new(o, 0);
    probe_calibration *cal = NULL;
    probe_compare_result *cr = NULL;
    FILE *f = NULL;
    probe_status s = loo ? PROBE_OK : probe_set_error(PROBE_ENOMEM, "out of memory");
    for (size_t j = 0; s == PROBE_OK && j < r->npairs; j++)
        if (j != i)
            s = add_result(kept[j], o->references[j], o->candidates[j], 0, (long)j, o, &t, &pt);
    if (s == PROBE_OK) {
        memcpy(loo->weights, r->weights, sizeof loo->weights);
        memcpy(loo->weights_rounding, r->weights_rounding, sizeof loo->weights_rounding);
        loo->npairs = r->npairs - 1;
        s = finish(loo, &t, &pt, o->headroom, t1);
    }
    if (s == PROBE_OK && !(f = tmpfile()))
        s = probe_set_error(PROBE_EIO, "held-out check: cannot create a temporary file: %s",
                            strerror(errno));
    if (s == PROBE_OK && (s = probe_calibrate_write_json(loo, f)) == PROBE_OK) {
        char name[64];
        snprintf(name, sizeof name, "(held-out check: every feature pair but %zu)", i);
        rewind(f);
        s = probe_calibration_load_stream(f, name, o->known_components, &cal);
    }
    probe_compare_opts co;
    if (s == PROBE_OK && (s = pair_opts(o, "T2", &co)) == PROBE_OK) {
        co.calibration = cal;
        s = probe_compare_files(o->references[i], o->candidates[i], &co, &cr);
    }
    if (s == PROBE_OK) {
        memset(h, 0, sizeof *h);
        h->pair = i;
        h->pass = cr->pass;
        h->tensors = cr->ntensors;
        for (size_t k = 0; k < cr->ntensors; k++)
            if (cr->tensors[k].compared && !cr->tensors[k].verdict.pass)
                h->failed++;
        if (!cr->pass && cr->first_failure >= 0) {
            const probe_tensor_result *x = &cr->tensors[cr->first_failure];
            snprintf(h->first_failure, sizeof h->first_failure, "%s", x->ref.path);
            snprintf(h->reason, sizeof h->reason, "%s",
                     x->verdict.nreasons ? x->verdict.reasons[0] : "fails");
        } else if (!cr->pass) {
            snprintf(h->first_failure, sizeof h->first_failure, "%s", cr->first_failure_path);
            snprintf(h->reason, sizeof h->reason, "%s",
                     cr->nreasons ? cr->reasons[0] : "fails");
        }
    }
    if (f)
        fclose(f);
    probe_compare_result_free(cr);
    probe_calibration_free(cal);
    probe_calibrate_result_free(loo);
    tables_free(&t, &pt);
    return s;
}

static probe_status held_out_check(const probe_calibrate_opts *o, probe_calibrate_result *r,
                                   probe_compare_result *const *kept, const probe_gate *t1)
{
    if (!(r->held_out = calloc(r->npairs, sizeof *r->held_out)))
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    for (size_t i = 0; i < r->npairs; i++) {
        probe_status s = held_out_pair(o, r, kept, i, t1, &r->held_out[i]);
        if (s != PROBE_OK)
            return s;
        r->nheld_out++;
        r->held_out_failed += !r->held_out[i].pass;
    }
    return PROBE_OK;
}

probe_status probe_calibrate_run(const probe_calibrate_opts *o, probe_calibrate_result **out)
{
    if (!out)
        return probe_set_error(PROBE_EINVAL, "probe_calibrate_run: NULL result pointer");
    *out = NULL;
    probe_status s = check_opts(o);
    if (s != PROBE_OK)
        return s;
    if (o->nrecords)
        return run_records(o, out);
    probe_gate t1;
    if ((s = probe_gate_parse("T1", &t1)) != PROBE_OK)
        return s;

    probe_calibrate_result *r = result_new(o, o->nreferences + o->ncandidates + o->nrepeats);
    if (!r)
        return probe_set_error(PROBE_ENOMEM, "out of memory");

    /* Every file first: a missing one is reported before any comparison. */
    for (size_t i = 0; s == PROBE_OK && i < o->nreferences; i++)
        s = add_file(r, o->references[i], "reference", (int)i);
    for (size_t i = 0; s == PROBE_OK && i < o->ncandidates; i++)
        s = add_file(r, o->candidates[i], "candidate", (int)i);
    for (size_t i = 0; s == PROBE_OK && i < o->nrepeats; i++)
        s = add_file(r, o->repeats[i], "repeat", (int)i);

    snprintf(r->weights, sizeof r->weights, "%s", o->weights ? o->weights : "same");
    if (s == PROBE_OK)
        s = check_weights(o, r);

    comp_table t = {0};
    path_table pt = {0};
    size_t held = o->held_out < 0 ? 0 : o->ncandidates >= (o->held_out > 0 ? 2u : 3u)
                                          ? o->ncandidates : 0;
    probe_compare_result **kept = held ? calloc(held, sizeof *kept) : NULL;
    if (held && !kept)
        s = probe_set_error(PROBE_ENOMEM, "out of memory");
    long pair = 0;
    for (size_t i = 0; s == PROBE_OK && i < o->ncandidates; i++)
        s = add_pair(o->references[i], o->candidates[i], 0, pair++, o, &t, &pt,
                     held ? &kept[i] : NULL);
    r->npairs = o->ncandidates;
    for (size_t i = 1; s == PROBE_OK && !o->references_differ && i < o->nreferences; i++, r->nfloor_pairs++)
        s = add_pair(o->references[0], o->references[i], 1, pair++, o, &t, &pt, NULL);
    for (size_t k = 0; s == PROBE_OK && k < o->nrepeats; k++, r->nfloor_pairs++)
        s = add_pair(o->references[k], o->repeats[k], 1, pair++, o, &t, &pt, NULL);
    if (s == PROBE_OK)
        s = finish(r, &t, &pt, o->headroom, &t1);
    if (s == PROBE_OK && held)
        s = held_out_check(o, r, kept, &t1);
    for (size_t i = 0; i < held; i++)
        probe_compare_result_free(kept[i]);
    free(kept);
    tables_free(&t, &pt);
    if (s != PROBE_OK) {
        probe_calibrate_result_free(r);
        return s;
    }
    *out = r;
    return PROBE_OK;
}

/* --- JSON --- */

static json_t *jnum(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *jstat(const probe_calibrate_stat *s, const char *worst_key)
{
    json_t *o = json_object();
    json_object_set_new(o, worst_key, jnum(s->worst));
    json_object_set_new(o, "mean", jnum(s->mean));
    return o;
}

static json_t *jdrift(const probe_calibrate_drift *d, double atol, double rtol)
{
    json_t *o = json_object();
    json_object_set_new(o, "runs", json_integer((json_int_t)d->pairs));
    json_object_set_new(o, "tensors", json_integer((json_int_t)d->tensors));
    json_object_set_new(o, "rel_l2", jstat(&d->rel_l2, "max"));
    json_object_set_new(o, "one_minus_cosine", jstat(&d->one_minus_cosine, "max"));
    probe_calibrate_stat cs = d->one_minus_cosine;
    cs.worst = 1.0 - cs.worst;
    cs.mean = 1.0 - cs.mean;
    json_object_set_new(o, "cosine", jstat(&cs, "min"));
    json_object_set_new(o, "p99_abs", jstat(&d->p99_abs, "max"));
    json_object_set_new(o, "max_abs", jstat(&d->max_abs, "max"));
    json_t *mm = jstat(&d->mismatch_fraction, "max");
    json_object_set_new(mm, "atol", json_real(atol));
    json_object_set_new(mm, "rtol", json_real(rtol));
    json_object_set_new(o, "mismatch_fraction", mm);
    if (d->skipped_fraction.n)
        json_object_set_new(o, "skipped_fraction", jstat(&d->skipped_fraction, "max"));
    json_object_set_new(o, "channel_z", jstat(&d->channel_z, "max"));
    json_object_set_new(o, "gain_z", jstat(&d->gain_z, "max"));
    return o;
}

static void set_if_finite(json_t *o, const char *k, double x)
{
    if (isfinite(x))
        json_object_set_new(o, k, json_real(x));
}

/* Append s to the array a unless it is already there. */
static void add_distinct(json_t *a, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) if (strcmp(json_string_value(v), s) == 0) return;
    json_array_append_new(a, json_string(s));
}

static const char *base_name(const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", path);
    return basename(buf);
}

static json_t *jfile(const probe_calibrate_file *f, json_t *hosts, json_t *archs)
{
    char b[1024];
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(base_name(f->path, b, sizeof b)));
    json_object_set_new(o, "role", json_string(f->role));
    json_object_set_new(o, "index", json_integer(f->index));
    json_t *m = f->manifest ? json_loads(f->manifest, 0, NULL) : NULL;
    if (!json_is_object(m)) {
        json_object_set_new(o, "manifest", json_null());
        json_decref(m);
        return o;
    }
    static const char *const keys[] = {"label", "command", "host", "start_time", "probe_version",
                                       "cuda", "torch", "diffusers", "transformers",
                                       "tensorrt_llm", "rank", "world_size", NULL};
    for (size_t i = 0; keys[i]; i++) {
        json_t *v = json_object_get(m, keys[i]);
        if (v)
            json_object_set(o, keys[i], v);
    }
    const char *host = json_string_value(json_object_get(m, "host"));
    if (host && *host)
        add_distinct(hosts, host);
    size_t i;
    json_t *dev;
    json_array_foreach(json_object_get(json_object_get(m, "cuda"), "devices"), i, dev)
        if (json_string_value(dev) && *json_string_value(dev))
            add_distinct(archs, json_string_value(dev));
    json_decref(m);
    return o;
}

/* The base name of the input file of `role` and index idx, as a JSON string; NULL
 * when there is none. */
static json_t *jfile_name(const probe_calibrate_result *r, const char *role, int idx)
{
    char b[1024];
    for (size_t i = 0; i < r->nfiles; i++)
        if (strcmp(r->files[i].role, role) == 0 && r->files[i].index == idx)
            return json_string(base_name(r->files[i].path, b, sizeof b));
    return NULL;
}

static json_t *jpair(const probe_calibrate_result *r, const char *role_a, int ia,
                     const char *role_b, int ib)
{
    json_t *p = json_array();
    json_array_append_new(p, jfile_name(r, role_a, ia));
    json_array_append_new(p, jfile_name(r, role_b, ib));
    return p;
}

/* evidence.held_out: each feature pair under T2 calibrated on the other feature pairs. */
static json_t *jheld_out(const probe_calibrate_result *r)
{
    json_t *o = json_object(), *a = json_array();
    for (size_t i = 0; i < r->nheld_out; i++) {
        const probe_calibrate_held_out *h = &r->held_out[i];
        json_t *e = json_object();
        json_object_set_new(e, "pair", json_integer((json_int_t)h->pair));
        json_object_set_new(e, "reference", jfile_name(r, "reference", (int)h->pair));
        json_object_set_new(e, "candidate", jfile_name(r, "candidate", (int)h->pair));
        json_object_set_new(e, "verdict", json_string(h->pass ? "pass" : "fail"));
        json_object_set_new(e, "tensors", json_integer((json_int_t)h->tensors));
        json_object_set_new(e, "tensors_failed", json_integer((json_int_t)h->failed));
        if (!h->pass) {
            json_object_set_new(e, "first_failure", json_string(h->first_failure));
            json_object_set_new(e, "reason", json_string(h->reason));
        }
        json_array_append_new(a, e);
    }
    json_object_set_new(o, "rule", json_string("each feature pair compared under T2 with the "
                                               "thresholds of the other feature pairs (same "
                                               "headroom): leave-one-out cross-validation"));
    json_object_set_new(o, "pairs", json_integer((json_int_t)r->nheld_out));
    json_object_set_new(o, "failed", json_integer((json_int_t)r->held_out_failed));
    json_object_set_new(o, "results", a);
    return o;
}

probe_status probe_calibrate_write_json(const probe_calibrate_result *r, FILE *f)
{
    if (!r || !f)
        return probe_set_error(PROBE_EINVAL, "probe_calibrate_write_json: NULL argument");
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string("probe-calibration"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "feature", json_string(r->feature));
    json_object_set_new(root, "headroom", json_real(r->headroom));
    json_object_set_new(root, "weights", json_string(r->weights[0] ? r->weights : "same"));
    if (r->weights_rounding[0])
        json_object_set_new(root, "weights_rounding", json_string(r->weights_rounding));
    json_t *comps = json_object();
    for (size_t i = 0; i < r->ncomponents; i++) {
        const probe_calibrate_component *c = &r->components[i];
        json_t *e = json_object();
        set_if_finite(e, "rel_l2_max", c->rel_l2_max);
        set_if_finite(e, "cosine_min", c->cosine_min);
        json_object_set_new(e, "atol", json_real(r->atol));
        json_object_set_new(e, "rtol", json_real(r->rtol));
        set_if_finite(e, "mismatch_fraction_max", c->mismatch_fraction_max);
        set_if_finite(e, "p99_abs_max", c->p99_abs_max);
        set_if_finite(e, "max_abs_max", c->max_abs_max);
        set_if_finite(e, "channel_z_max", c->channel_z_max);
        set_if_finite(e, "gain_z_max", c->gain_z_max);
        set_if_finite(e, "skipped_fraction_max", c->skipped_fraction_max);
        json_t *obs = jdrift(&c->feature, r->atol, r->rtol);
        json_object_set_new(obs, "floor", jdrift(&c->floor, r->atol, r->rtol));
        json_object_set_new(obs, "t1_above_floor", json_boolean(c->t1_above_floor));
        json_t *chk = json_object();
        json_object_set_new(chk, "floor_rel_l2_x_headroom", jnum(c->floor_rel_l2_x_headroom));
        json_object_set_new(chk, "t1_rel_l2_max", json_real(c->t1_rel_l2_max));
        json_object_set_new(chk, "floor_one_minus_cosine_x_headroom",
                            jnum(c->floor_one_minus_cosine_x_headroom));
        json_object_set_new(chk, "t1_one_minus_cosine_max", json_real(c->t1_one_minus_cosine_max));
        json_object_set_new(obs, "t1_floor_check", chk);
        json_object_set_new(e, "observed", obs);
        json_object_set_new(comps, c->name, e);
    }
    json_object_set_new(root, "components", comps);
    json_t *st = json_object();
    for (size_t i = 0; i < r->npaths; i++) {
        const probe_calibrate_path *p = &r->paths[i];
        json_t *e = json_object(), *obs = json_object(), *fl = json_object();
        set_if_finite(e, "channel_z_max", p->channel_z_max);
        set_if_finite(e, "gain_z_max", p->gain_z_max);
        if (p->channel_z_max_by_channel) {
            json_t *v = json_array();
            for (uint64_t k = 0; k < p->nchannels; k++) {
                double x = p->channel_z_max_by_channel[k];
                json_array_append_new(v, isfinite(x) && x < 9e15 ? json_integer((json_int_t)x)
                                                                 : json_null());
            }
            json_object_set_new(e, "channel_z_max_by_channel", v);
        }
        json_object_set_new(obs, "component", json_string(p->component));
        json_object_set_new(obs, "runs", json_integer((json_int_t)p->pairs));
        json_object_set_new(obs, "channel_z", jstat(&p->channel_z, "max"));
        json_object_set_new(obs, "gain_z", jstat(&p->gain_z, "max"));
        if (p->channel_z_max_by_channel) {
            json_object_set_new(obs, "channel_z_spread", jnum(p->channel_z_spread));
            json_object_set_new(obs, "channel_t", jnum(p->channel_t));
        }
        if (isfinite(p->gain_z_spread))
            json_object_set_new(obs, "gain_z_spread", jnum(p->gain_z_spread));
        json_object_set_new(fl, "runs", json_integer((json_int_t)p->floor_pairs));
        json_object_set_new(fl, "channel_z", jstat(&p->floor_channel_z, "max"));
        json_object_set_new(fl, "gain_z", jstat(&p->floor_gain_z, "max"));
        json_object_set_new(obs, "floor", fl);
        json_object_set_new(e, "observed", obs);
        json_object_set_new(st, p->path, e);
    }
    json_object_set_new(root, "structure", st);

    json_t *ev = json_object(), *files = json_array(), *hosts = json_array(),
           *archs = json_array(), *pairs = json_array(), *floor = json_array();
    for (size_t i = 0; i < r->nfiles; i++)
        json_array_append_new(files, jfile(&r->files[i], hosts, archs));
    for (size_t i = 0; i < r->npairs; i++)
        json_array_append_new(pairs, jpair(r, "reference", (int)i, "candidate", (int)i));
    size_t nrep = 0, nref = 0;
    for (size_t i = 0; i < r->nfiles; i++) {
        nrep += strcmp(r->files[i].role, "repeat") == 0;
        nref += strcmp(r->files[i].role, "reference") == 0;
    }
    if (r->nfloor_pairs > nrep) /* the references are repeats of R_0 */
        for (size_t i = 1; i < nref; i++)
            json_array_append_new(floor, jpair(r, "reference", 0, "reference", (int)i));
    for (size_t k = 0; k < nrep; k++)
        json_array_append_new(floor, jpair(r, "reference", (int)k, "repeat", (int)k));
    for (size_t i = 0; i < r->narchs; i++)
        add_distinct(archs, r->archs[i]);
    if (r->from_records)
        json_object_set_new(ev, "records",
                            json_pack("{s:I,s:I,s:I}", "feature", (json_int_t)r->npairs, "floor",
                                      (json_int_t)r->nfloor_pairs, "other_features",
                                      (json_int_t)r->nrecords_other));
    json_object_set_new(ev, "runs", json_integer((json_int_t)r->npairs));
    json_object_set_new(ev, "floor_runs", json_integer((json_int_t)r->nfloor_pairs));
    json_object_set_new(ev, "pairs", pairs);
    json_object_set_new(ev, "floor_pairs", floor);
    json_object_set_new(ev, "files", files);
    json_object_set_new(ev, "machine", hosts);
    json_object_set_new(ev, "architectures", archs);
    json_object_set_new(ev, "date", json_string(r->date));
    json_object_set_new(ev, "probe_version", json_string(PROBE_VERSION));
    json_object_set_new(ev, "headroom", json_real(r->headroom));
    if (r->weights_line[0])
        json_object_set_new(ev, "weights", json_string(r->weights_line));
    json_object_set_new(ev, "atol", json_real(r->atol));
    json_object_set_new(ev, "rtol", json_real(r->rtol));
    json_object_set_new(ev, "t1_above_floor", json_boolean(r->t1_above_floor));
    json_object_set_new(ev, "method",
                        json_string(r->from_records
                                    ? "probe-calibrate --records: per component, worst recorded "
                                      "statistic over every record of the feature x headroom "
                                      "(cosine: 1 - headroom x (1 - worst cosine)); |channel z| "
                                      "and |gain_z| likewise; metrics by probe.compare (libprobe) "
                                      "in the tests that recorded them"
                                    : "probe-calibrate: per component, worst observed drift over "
                                    "every tensor of every pair x headroom (cosine: 1 - headroom "
                                    "x (1 - worst cosine)); per component and per tensor path, worst "
                                    "|channel z| and |gain_z| x headroom; metrics by the compare "
                                    "engine"));
    if (r->nheld_out)
        json_object_set_new(ev, "held_out", jheld_out(r));
    json_object_set_new(root, "evidence", ev);

    errno = 0;
    int rc = json_dumpf(root, f, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (rc != 0 || fputc('\n', f) == EOF || ferror(f))
        return probe_set_error(PROBE_EIO, "%s", strerror(errno ? errno : EIO));
    return PROBE_OK;
}
