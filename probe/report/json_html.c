/* json_html.c - compare results as probe-compare's JSON (version 1, docs/compare-json.md) and as a
 * self-contained HTML page. */
#include "probe/compare.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

static json_t *num_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *shape_json(int rank, const int64_t *shape)
{
    json_t *a = json_array();
    for (int i = 0; i < rank; i++)
        json_array_append_new(a, json_integer((json_int_t)shape[i]));
    return a;
}

static json_t *gate_json(const probe_gate *g)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(g->name));
    json_object_set_new(o, "atol", json_real(g->atol));
    json_object_set_new(o, "rtol", json_real(g->rtol));
    json_object_set_new(o, "rel_l2_max", num_or_null(g->rel_l2_max));
    json_object_set_new(o, "cosine_min", num_or_null(g->cosine_min));
    json_object_set_new(o, "mismatch_fraction_max", num_or_null(g->mismatch_fraction_max));
    json_object_set_new(o, "max_abs_max", num_or_null(g->max_abs_max));
    json_object_set_new(o, "p99_abs_max", num_or_null(g->p99_abs_max));
    if (isfinite(g->channel_z_max))
        json_object_set_new(o, "channel_z_max", json_real(g->channel_z_max));
    if (isfinite(g->gain_z_max))
        json_object_set_new(o, "gain_z_max", json_real(g->gain_z_max));
    return o;
}

/* Explain each metric that is written as null (docs/metrics.md "NaN / Inf rule":
 * the gate gives the reason). */
static void null_reasons(const probe_tensor_result *t, json_t *reasons)
{
    const probe_metrics *m = &t->m;
    if (!isfinite(m->rel_l2))
        json_array_append_new(reasons, json_string(
            "rel_l2 is not finite: the reference norm is 0 and the candidate differs"));
    if (m->n_finite == 0 && m->n > 0)
        json_array_append_new(reasons, json_string(
            "max_abs, p99_abs, mean_abs are null: no index is finite on both sides"));
}

/* The per-channel mean shift keys (docs/compare-json.md): present on every
 * compared tensor, null when no channel axis applied. */
static void channel_json(json_t *o, const probe_tensor_result *t)
{
    const probe_channel_shift *cs = &t->shift;
    int have = cs->count > 0 && t->channel_axis >= 0;
    json_object_set_new(o, "channel_axis", have ? json_integer(t->channel_axis) : json_null());
    json_object_set_new(o, "channel_axis_from",
                        have && t->channel_axis_from ? json_string(t->channel_axis_from)
                                                     : json_null());
    json_object_set_new(o, "channel_shift_max", have ? num_or_null(cs->max) : json_null());
    json_object_set_new(o, "channel_shift_max_rel", have ? num_or_null(cs->max_rel) : json_null());
    json_object_set_new(o, "channel_shift_argmax",
                        have && isfinite(cs->max) ? json_integer((json_int_t)cs->argmax)
                                                  : json_null());
}

static json_t *summary_json(const probe_summary *s)
{
    json_t *o = json_object();
    json_object_set_new(o, "n", json_integer((json_int_t)s->n));
    json_object_set_new(o, "n_finite", json_integer((json_int_t)s->n_finite));
    json_object_set_new(o, "nan", json_integer((json_int_t)s->nan));
    json_object_set_new(o, "inf", json_integer((json_int_t)s->inf));
    json_object_set_new(o, "min", num_or_null(s->min));
    json_object_set_new(o, "max", num_or_null(s->max));
    json_object_set_new(o, "abs_max", num_or_null(s->abs_max));
    json_object_set_new(o, "mean", s->n_finite ? num_or_null(s->sum / (double)s->n_finite)
                                               : json_null());
    json_object_set_new(o, "l2", num_or_null(sqrt(s->sum_sq)));
    return o;
}

/* (docs/compare-json.md "Stats-only pairs") "stats_only" on every
 * tensor; for a stats-only pair the summaries, the rel_l2 lower bound, the
 * mean shift, the NaN/Inf counts the summaries give, and why the element-wise
 * metrics are null. */
static void stats_only_json(json_t *o, const probe_tensor_result *t, json_t *reasons)
{
    json_object_set_new(o, "stats_only", json_boolean(t->stats_only));
    if (!t->stats_only)
        return;
    json_object_set_new(o, "rel_l2_lower_bound", num_or_null(t->rel_l2_lower_bound));
    json_object_set_new(o, "mean_shift", num_or_null(t->mean_shift));
    json_object_set_new(o, "summary_reference", summary_json(&t->summary_ref));
    json_object_set_new(o, "summary_candidate", summary_json(&t->summary_cand));
    if (t->compared)
        return;
    json_object_set_new(o, "nan_ref", json_integer((json_int_t)t->summary_ref.nan));
    json_object_set_new(o, "nan_cand", json_integer((json_int_t)t->summary_cand.nan));
    json_object_set_new(o, "inf_ref", json_integer((json_int_t)t->summary_ref.inf));
    json_object_set_new(o, "inf_cand", json_integer((json_int_t)t->summary_cand.inf));
    json_array_append_new(reasons, json_string(
        "rel_l2, cosine, max_abs, p99_abs, mean_abs, mismatch_fraction are null: stats-only "
        "capture: needs the tensors"));
    if (isnan(t->rel_l2_lower_bound))
        json_array_append_new(reasons, json_string(
            "rel_l2_lower_bound is null: a side holds NaN or Inf, whose indices the summaries "
            "do not give"));
    else if (isinf(t->rel_l2_lower_bound))
        json_array_append_new(reasons, json_string(
            "rel_l2_lower_bound is null (infinite): the reference norm is 0 and the candidate's "
            "is not"));
}

static json_t *int_list(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* rank sets (docs/compare-json.md "Rank sets"): only on tensors of a rank set. */
static void rank_keys_json(json_t *o, const probe_tensor_result *t)
{
    if (t->rank_tag >= 0)
        json_object_set_new(o, "rank", json_integer(t->rank_tag));
    if (t->ranks > 0)
        json_object_set_new(o, "ranks", json_integer(t->ranks));
    if (t->shard_axis >= 0)
        json_object_set_new(o, "shard_axis", json_integer(t->shard_axis));
    if (t->nreplica_mismatch)
        json_object_set_new(o, "replica_mismatch_ranks",
                            int_list(t->replica_mismatch_ranks, t->nreplica_mismatch));
    if (t->nranks_present)
        json_object_set_new(o, "ranks_present", int_list(t->ranks_present, t->nranks_present));
}

/* top level, only when a side is a rank set: "rank_sets", "collectives_unmatched",
 * "collective_divergence". */
static void rank_sets_json(json_t *o, const probe_compare_result *r)
{
    if (!r->world[0] && !r->world[1])
        return;
    json_t *rs = json_object(), *cu = json_array(), *cd = json_array();
    for (int side = 0; side < 2; side++) {
        const char *name = side ? "candidate" : "reference";
        if (!r->world[side]) {
            json_object_set_new(rs, name, json_null());
            continue;
        }
        json_t *files = json_array();
        for (int k = 0; k < r->world[side]; k++) {
            json_array_append_new(files, json_string(r->files[side][k]));
            if (r->collectives_left_out[side][k])
                json_array_append_new(cu, json_pack("{s:s,s:i,s:I}", "side", name, "rank", k,
                                                    "count", (json_int_t)
                                                    r->collectives_left_out[side][k]));
        }
        json_object_set_new(rs, name, json_pack("{s:i,s:o,s:o}", "world_size", r->world[side],
                                                "files", files, "index", r->index[side][0]
                                                ? json_string(r->index[side]) : json_null()));
    }
    json_object_set_new(rs, "per_rank", json_boolean(r->per_rank));
    for (size_t i = 0; i < r->ndivergent; i++) {
        const probe_collective_divergence *d = &r->divergent[i];
        json_array_append_new(cd, json_pack("{s:s,s:s,s:o}", "side", d->side, "path", d->path,
                                            "ranks", int_list(d->ranks, d->nranks < 8 ? d->nranks
                                                                                       : 8)));
    }
    json_object_set_new(o, "rank_sets", rs);
    json_object_set_new(o, "collectives_unmatched", cu);
    json_object_set_new(o, "collective_divergence", cd);
}

static json_t *verdict_json(const probe_gate_verdict *v)
{
    json_t *why = json_array();
    for (int i = 0; i < v->nreasons; i++)
        json_array_append_new(why, json_string(v->reasons[i]));
    return json_pack("{s:s,s:o}", "verdict", v->pass ? "pass" : "fail", "reasons", why);
}

/* "systematic" (docs/compare-json.md "Verdicts"): the gain and channel tests of the pair. */
static json_t *systematic_json(const probe_tensor_result *t)
{
    const probe_systematic *y = &t->sys;
    if (!y->computed)
        return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "gain", num_or_null(t->m.gain));
    json_object_set_new(o, "gain_se", num_or_null(t->m.gain_se));
    json_object_set_new(o, "gain_z", num_or_null(t->m.gain_z));
    json_object_set_new(o, "gain_limit", num_or_null(y->gain_limit));
    json_object_set_new(o, "gain_fail", json_boolean(y->gain_fail));
    json_object_set_new(o, "channels", json_integer((json_int_t)y->channels));
    if (y->channels) {
        json_object_set_new(o, "channel", json_integer((json_int_t)y->channel));
        json_object_set_new(o, "channel_shift", num_or_null(y->channel_shift));
        json_object_set_new(o, "channel_z", num_or_null(y->channel_z));
        json_object_set_new(o, "channel_size", num_or_null(y->channel_size));
        json_object_set_new(o, "channel_limit", num_or_null(y->channel_limit));
    }
    json_object_set_new(o, "channel_fail", json_boolean(y->channel_fail));
    json_object_set_new(o, "floor", num_or_null(y->floor));
    json_object_set_new(o, "floor_gate", num_or_null(y->floor_gate));
    return o;
}

/* "oracle" per tensor: both sides' error against the oracle and the oracle verdict
 * (m_or: (oracle, reference), m_oc: (oracle, candidate side)). */
static json_t *oracle_json(int has, const probe_oracle_verdict *v, const probe_metrics *m_or,
                           const probe_metrics *m_oc)
{
    if (!has)
        return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "rel_l2_reference", num_or_null(v->err_reference));
    json_object_set_new(o, "rel_l2_candidate", num_or_null(v->err_candidate));
    json_object_set_new(o, "ratio", num_or_null(v->ratio));
    json_object_set_new(o, "ratio_limit", num_or_null(v->limit));
    json_object_set_new(o, "cosine_reference", num_or_null(m_or->cosine));
    json_object_set_new(o, "cosine_candidate", num_or_null(m_oc->cosine));
    json_object_set_new(o, "gain_reference", num_or_null(m_or->gain));
    json_object_set_new(o, "gain_candidate", num_or_null(m_oc->gain));
    json_object_set_new(o, "gain_excess", num_or_null(v->gain_excess));
    json_object_set_new(o, "channel", json_integer((json_int_t)v->channel));
    json_object_set_new(o, "channel_excess", num_or_null(v->channel_excess));
    json_object_set_new(o, "channel_excess_size", num_or_null(v->channel_excess_size));
    json_object_set_new(o, "floor", num_or_null(v->floor));
    json_object_set_new(o, "ratio_fail", json_boolean(v->ratio_fail));
    json_object_set_new(o, "gain_fail", json_boolean(v->gain_fail));
    json_object_set_new(o, "channel_fail", json_boolean(v->channel_fail));
    json_object_set_new(o, "verdict", json_string(v->pass ? "pass" : "fail"));
    return o;
}

static json_t *str_or_null(const char *s)
{
    return s[0] ? json_string(s) : json_null();
}

/* "class", "module" (the reference call's, null when unknown); "candidate_path",
 * "class_candidate" and "module_candidate" only where the candidate's differ. */
static void identity_json(json_t *o, const probe_tensor_result *t)
{
    json_object_set_new(o, "class", str_or_null(t->ref.class_name));
    json_object_set_new(o, "module", str_or_null(t->ref.module));
    if (t->cand_path[0])
        json_object_set_new(o, "candidate_path", json_string(t->cand_path));
    if (strcmp(t->class_cand, t->ref.class_name) != 0)
        json_object_set_new(o, "class_candidate", str_or_null(t->class_cand));
    if (strcmp(t->module_cand, t->ref.module) != 0)
        json_object_set_new(o, "module_candidate", str_or_null(t->module_cand));
}

static json_t *tensor_json(const probe_tensor_result *t)
{
    json_t *o = json_object();
    const probe_metrics *m = &t->m;
    json_object_set_new(o, "path", json_string(t->ref.path));
    json_object_set_new(o, "component", json_string(t->ref.component));
    identity_json(o, t);
    json_object_set_new(o, "dtype", json_string(probe_dtype_name(t->ref.dtype)));
    json_object_set_new(o, "dtype_candidate", json_string(probe_dtype_name(t->dtype_cand)));
    json_object_set_new(o, "shape", shape_json(t->ref.rank, t->ref.shape));
    if (t->rank_cand != t->ref.rank || memcmp(t->shape_cand, t->ref.shape,
                                              sizeof(int64_t) * (size_t)t->ref.rank))
        json_object_set_new(o, "shape_candidate", shape_json(t->rank_cand, t->shape_cand));
    json_object_set_new(o, "n", json_integer((json_int_t)t->ref.n));
    json_t *reasons = json_array();
    if (t->compared) {
        int any = m->n_finite > 0;
        json_object_set_new(o, "rel_l2", num_or_null(m->rel_l2));
        json_object_set_new(o, "cosine", num_or_null(m->cosine));
        json_object_set_new(o, "max_abs", any ? num_or_null(m->max_abs) : json_null());
        json_object_set_new(o, "max_abs_index",
                            any ? shape_json(t->ref.rank, t->max_abs_index) : json_null());
        json_object_set_new(o, "p99_abs", any ? num_or_null(m->p99_abs) : json_null());
        json_object_set_new(o, "mean_abs", any ? num_or_null(m->mean_abs) : json_null());
        json_object_set_new(o, "mismatch_fraction", json_real(m->mismatch_fraction));
        json_object_set_new(o, "nan_ref", json_integer((json_int_t)m->nan_ref));
        json_object_set_new(o, "nan_cand", json_integer((json_int_t)m->nan_cand));
        json_object_set_new(o, "inf_ref", json_integer((json_int_t)m->inf_ref));
        json_object_set_new(o, "inf_cand", json_integer((json_int_t)m->inf_cand));
        json_object_set_new(o, "zero_norm_reference", json_boolean(m->zero_norm_reference));
        json_object_set_new(o, "identical", json_boolean(m->identical));
        json_object_set_new(o, "mismatch_count", json_integer((json_int_t)m->mismatch_count));
        json_object_set_new(o, "mismatch_ulps_max", num_or_null(m->mismatch_ulps_max));
        json_object_set_new(o, "max_abs_ulps_scale", num_or_null(m->max_abs_ulps_scale));
        json_object_set_new(o, "nan_ref_only", json_integer((json_int_t)m->nan_ref_only));
        null_reasons(t, reasons);
        channel_json(o, t);
    } else {
        static const char *keys[] = {"rel_l2", "cosine", "max_abs", "max_abs_index", "p99_abs",
                                     "mean_abs", "mismatch_fraction", "nan_ref", "nan_cand",
                                     "inf_ref", "inf_cand"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            json_object_set_new(o, keys[k], json_null());
        json_object_set_new(o, "zero_norm_reference", json_false());
        json_object_set_new(o, "identical", json_false());
    }
    stats_only_json(o, t, reasons);
    json_object_set_new(o, "verdict", json_string(t->verdict.pass ? "pass" : "fail"));
    for (int i = 0; i < t->verdict.nreasons; i++)
        json_array_append_new(reasons, json_string(t->verdict.reasons[i]));
    json_object_set_new(o, "reasons", reasons);
    json_object_set_new(o, "gate_verdict", verdict_json(&t->gate_verdict));
    json_object_set_new(o, "systematic", systematic_json(t));
    json_object_set_new(o, "oracle", oracle_json(t->has_oracle, &t->oracle, &t->m_oracle_ref,
                                                 &t->m_oracle_cand));
    if (t->oracle_same)
        json_object_set_new(o, "oracle_same_as_reference", json_true());
    if (t->ref.call >= 0)
        json_object_set_new(o, "call", json_integer(t->ref.call));
    if (t->ref.cfg_branch >= 0)
        json_object_set_new(o, "cfg_branch", json_integer(t->ref.cfg_branch));
    if (t->ref.parent[0]) {
        json_object_set_new(o, "parent", json_string(t->ref.parent));
        if (t->ref.block >= 0)
            json_object_set_new(o, "block", json_integer(t->ref.block));
    }
    if (t->cfg_candidate[0])
        json_object_set_new(o, "cfg_split",
                            json_pack("{s:s, s:i, s:s}", "candidate", t->cfg_candidate, "half",
                                      t->cfg_half, "branch", t->cfg_branch_name));
    if (t->ref.step >= 0)
        json_object_set_new(o, "step", json_integer(t->ref.step));
    if (t->ref.seq >= 0)
        json_object_set_new(o, "seq", json_integer(t->ref.seq));
    if (t->gate.kind == PROBE_GATE_T2)
        json_object_set_new(o, "gate", gate_json(&t->gate));
    rank_keys_json(o, t);
    return o;
}

/* per tensor, with --isolated: the reference vs isolated-run
 * metrics and amplification = rel_l2 / rel_l2_isolated (null when undefined). */
static void isolated_keys(json_t *o, const probe_tensor_result *t)
{
    const probe_metrics *m = &t->m_isolated;
    int h = t->has_isolated, any = h && m->n_finite > 0;
    json_object_set_new(o, "rel_l2_isolated", h ? num_or_null(m->rel_l2) : json_null());
    json_object_set_new(o, "cosine_isolated", h ? num_or_null(m->cosine) : json_null());
    json_object_set_new(o, "max_abs_isolated", any ? num_or_null(m->max_abs) : json_null());
    json_object_set_new(o, "identical_isolated", h ? json_boolean(m->identical) : json_null());
    json_object_set_new(o, "amplification", h ? num_or_null(t->amplification) : json_null());
    json_object_set_new(o, "oracle_isolated",
                        oracle_json(t->has_oracle_isolated, &t->oracle_isolated, &t->m_oracle_ref,
                                    &t->m_oracle_isolated));
    const char *slash = strrchr(t->ref.path, '/');
    if (h && slash && strncmp(slash + 1, "out", 3) == 0) {
        int c = t->isolated_inputs_converted > 0;
        json_object_set_new(o, "isolated_inputs_converted", json_boolean(c));
        json_object_set_new(o, "isolated_inputs_rel_l2",
                            c ? num_or_null(t->isolated_inputs_rel_l2) : json_null());
        json_object_set_new(o, "isolated_inputs_worst",
                            c && t->isolated_inputs_worst[0] ? json_string(t->isolated_inputs_worst)
                                                             : json_null());
    }
}

static json_t *manifest_json(const char *text)
{
    json_t *m = text ? json_loads(text, 0, NULL) : NULL;
    return m ? m : json_null();
}

/* A JSON value of any type from its text; null when absent or not JSON. */
static json_t *any_json(const char *text)
{
    json_t *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    return v ? v : json_null();
}

/* what was compared: both runs' manifests, the root-input check,
 * the injection status, the isolated run (docs/compare-json.md). */
static void experiment_json(json_t *o, const probe_compare_result *r)
{
    json_object_set_new(o, "same_experiment", json_boolean(r->same_experiment));
    json_t *roots = json_array();
    for (size_t i = 0; i < r->nroots; i++) {
        const probe_root_input *ri = &r->roots[i];
        json_array_append_new(roots, json_pack(
            "{s:s,s:s,s:b,s:b,s:o,s:o,s:b,s:b,s:o}", "path", ri->path, "component", ri->component,
            "in_reference", ri->in_reference, "in_candidate", ri->in_candidate, "hash_reference",
            ri->hash_reference[0] ? json_string(ri->hash_reference) : json_null(), "hash_candidate",
            ri->hash_candidate[0] ? json_string(ri->hash_candidate) : json_null(), "same", ri->same,
            "allowed", ri->allowed, "why", ri->why[0] ? json_string(ri->why) : json_null()));
        json_t *last = json_array_get(roots, json_array_size(roots) - 1);
        json_object_set_new(last, "converted", json_boolean(ri->converted));
        json_object_set_new(last, "incomplete", json_boolean(ri->incomplete));
    }
    json_object_set_new(o, "root_inputs", r->roots_checked ? roots : (json_decref(roots), json_null()));
    json_object_set_new(o, "inject_failed", json_pack("{s:b,s:b}", "reference",
                                                      r->inject_failed_reference, "candidate",
                                                      r->inject_failed_candidate));
    json_object_set_new(o, "isolated", r->isolated[0] ? json_string(r->isolated) : json_null());
    json_object_set_new(o, "isolated_complete",
                        r->isolated[0] ? json_boolean(r->isolated_complete) : json_null());
    json_object_set_new(o, "incomplete_reference", json_boolean(r->incomplete_reference));
    json_object_set_new(o, "incomplete_candidate", json_boolean(r->incomplete_candidate));
    json_t *re = json_object();
    json_object_set_new(re, "reference", any_json(r->run_end_reference));
    json_object_set_new(re, "candidate", any_json(r->run_end_candidate));
    if (r->isolated[0])
        json_object_set_new(re, "isolated", any_json(r->run_end_isolated));
    json_object_set_new(o, "run_end", re);
    json_t *m = json_object();
    json_object_set_new(m, "reference", manifest_json(r->manifest_reference));
    json_object_set_new(m, "candidate", manifest_json(r->manifest_candidate));
    if (r->isolated[0])
        json_object_set_new(m, "isolated", manifest_json(r->manifest_isolated));
    if (r->oracle[0])
        json_object_set_new(m, "oracle", manifest_json(r->manifest_oracle));
    json_object_set_new(o, "manifests", m);
}

static json_t *call_ref(const probe_compare_result *r, long k)
{
    if (k < 0 || (size_t)k >= r->ncalls)
        return json_null();
    char b[200];
    snprintf(b, sizeof b, "/%s/%04lld", r->calls[k].component, (long long)r->calls[k].call);
    return json_string(b);
}

/* "calls" and "introduced" (docs/compare-json.md "Attribution"). */
static void attribution_json(json_t *o, const probe_compare_result *r)
{
    json_t *calls = json_array();
    for (size_t k = 0; k < r->ncalls; k++) {
        const probe_call_verdict *c = &r->calls[k];
        json_t *x = json_object();
        json_object_set_new(x, "call", call_ref(r, (long)k));
        json_object_set_new(x, "component", json_string(c->component));
        json_object_set_new(x, "index", json_integer(c->call));
        json_object_set_new(x, "step", c->step >= 0 ? json_integer(c->step) : json_null());
        json_object_set_new(x, "cfg_branch",
                            c->cfg_branch >= 0 ? json_integer(c->cfg_branch) : json_null());
        json_object_set_new(x, "parent", call_ref(r, c->parent));
        json_object_set_new(x, "block", c->block >= 0 ? json_integer(c->block) : json_null());
        json_object_set_new(x, "status", json_string(probe_call_status_name(c->status)));
        json_object_set_new(x, "decided_by", json_string(c->decided_by));
        json_object_set_new(x, "first_failure", c->first_failure >= 0
                            ? json_string(r->tensors[c->first_failure].ref.path) : json_null());
        json_object_set_new(x, "via", call_ref(r, c->via));
        json_array_append_new(calls, x);
    }
    json_object_set_new(o, "calls", calls);
    const probe_introduction *in = &r->introduced;
    if (in->kind == PROBE_INTRODUCED_NONE) {
        json_object_set_new(o, "introduced", json_null());
        return;
    }
    static const char *kinds[] = {"none", "call", "between", "before"};
    json_t *x = json_object();
    json_object_set_new(x, "kind", json_string(kinds[in->kind]));
    json_object_set_new(x, "call", call_ref(r, in->call));
    json_object_set_new(x, "component", json_string(r->calls[in->call].component));
    json_object_set_new(x, "path", in->tensor >= 0 ? json_string(r->tensors[in->tensor].ref.path)
                                                   : json_null());
    json_object_set_new(x, "step", r->calls[in->call].step >= 0
                                       ? json_integer(r->calls[in->call].step) : json_null());
    json_object_set_new(x, "after", call_ref(r, in->after_call));
    json_object_set_new(x, "amplification", num_or_null(in->amplification));
    json_object_set_new(x, "inherited_calls", json_integer((json_int_t)in->ninherited));
    json_object_set_new(x, "no_thresholds", json_boolean(in->tensor >= 0 &&
                                                         r->tensors[in->tensor].no_thresholds));
    json_object_set_new(o, "introduced", x);
}

static json_t *result_json(const probe_compare_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string("probe-compare"));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "reference", json_string(r->reference));
    json_object_set_new(o, "candidate", json_string(r->candidate));
    json_object_set_new(o, "gate", gate_json(&r->gate));
    json_object_set_new(o, "verdict", json_string(r->pass ? "pass" : "fail"));
    static const char *rules[] = {"gate", "gate+systematic", "oracle"};
    json_object_set_new(o, "headline", json_string(rules[r->headline]));
    json_object_set_new(o, "gate_verdict", json_string(r->gate_pass ? "pass" : "fail"));
    json_object_set_new(o, "oracle", r->oracle[0] ? json_string(r->oracle) : json_null());
    json_object_set_new(o, "calibration", r->calibration[0] ? json_string(r->calibration) : json_null());
    if (r->oracle[0])
        json_object_set_new(o, "incomplete_oracle", json_boolean(r->incomplete_oracle));
    if (r->oracle[0])
        json_object_set_new(o, "oracle_tensors", json_pack("{s:I,s:I,s:I}", "judged",
                            (json_int_t)r->noracle, "same_as_reference", (json_int_t)r->noracle_same,
                            "not_held", (json_int_t)r->noracle_missing));
    json_object_set_new(o, "first_failure",
                        r->first_failure_path[0] ? json_string(r->first_failure_path) : json_null());
    json_object_set_new(o, "feature_active", json_boolean(r->feature_active));
    json_object_set_new(o, "feature_not_active", json_boolean(r->feature_not_active));
    json_object_set_new(o, "expect_identical", json_boolean(r->expect_identical));
    json_t *why = json_array();
    for (int i = 0; i < r->nreasons; i++)
        json_array_append_new(why, json_string(r->reasons[i]));
    json_object_set_new(o, "reasons", why);
    json_t *mc = json_array(), *mr = json_array(), *sk = json_array(), *ts = json_array();
    for (size_t i = 0; i < r->nmissing_cand; i++)
        json_array_append_new(mc, json_string(r->missing_in_candidate[i]));
    for (size_t i = 0; i < r->nmissing_ref; i++)
        json_array_append_new(mr, json_string(r->missing_in_reference[i]));
    for (size_t i = 0; i < r->nskipped; i++)
        json_array_append_new(sk, json_pack("{s:s,s:s,s:s}", "path", r->skipped[i].path, "side",
                                            r->skipped[i].side, "reason", r->skipped[i].reason));
    size_t npass = 0;
    for (size_t i = 0; i < r->ntensors; i++) {
        json_t *tj = tensor_json(&r->tensors[i]);
        if (r->isolated[0] && r->isolated_complete)
            isolated_keys(tj, &r->tensors[i]);
        json_array_append_new(ts, tj);
        npass += r->tensors[i].verdict.pass != 0;
    }
    json_object_set_new(o, "missing_in_candidate", mc);
    json_object_set_new(o, "missing_in_reference", mr);
    json_object_set_new(o, "skipped", sk);
    json_t *sf = json_array();
    for (size_t i = 0; i < r->nskipped_by_feature; i++)
        json_array_append_new(sf, json_string(r->skipped_by_feature[i]));
    json_object_set_new(o, "skipped_by_feature", sf);
    json_object_set_new(o, "nothing_compared", json_boolean(r->nothing_compared));
    json_object_set_new(o, "ignored_datasets", json_pack("{s:I,s:I}", "reference",
                                                         (json_int_t)r->ignored_ref, "candidate",
                                                         (json_int_t)r->ignored_cand));
    json_object_set_new(o, "summary",
                        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "tensors", (json_int_t)r->ntensors,
                                  "passed", (json_int_t)npass, "failed",
                                  (json_int_t)(r->ntensors - npass), "missing_in_candidate",
                                  (json_int_t)r->nmissing_cand, "missing_in_reference",
                                  (json_int_t)r->nmissing_ref, "skipped", (json_int_t)r->nskipped));
    json_object_set_new(o, "identity",
                        json_pack("{s:I,s:I,s:o,s:s,s:I,s:o}", "calls_paired_by_module",
                                  (json_int_t)r->calls_by_module, "calls_unpaired_by_module",
                                  (json_int_t)r->calls_unpaired_by_module, "by_module_component",
                                  str_or_null(r->by_module_component), "paired_by",
                                  r->by_nesting ? "parent_and_block" : "module",
                                  "class_mismatches",
                                  (json_int_t)r->class_mismatches, "first_class_mismatch",
                                  str_or_null(r->first_class_mismatch)));
    experiment_json(o, r);
    rank_sets_json(o, r);
    attribution_json(o, r);
    json_object_set_new(o, "tensors", ts);
    return o;
}

probe_status probe_compare_write_json(const probe_compare_result *r, FILE *f)
{
    if (!r || !f)
        return probe_set_error(PROBE_EINVAL, "probe_compare_write_json: NULL argument");
    json_t *o = result_json(r);
    if (!o)
        return probe_set_error(PROBE_ENOMEM, "out of memory building JSON");
    errno = 0;
    int rc = json_dumpf(o, f, JSON_INDENT(1) | JSON_REAL_PRECISION(17) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (rc != 0 || fputc('\n', f) == EOF || fflush(f) != 0)
        return probe_set_error(PROBE_EIO, "%s", strerror(errno ? errno : EIO));
    return PROBE_OK;
}

/* The page (docs/report.md): the verdict, the step x component heatmap of
 * rel_l2, the selected tensor's histogram, channel shift and spatial map, the
 * tensor table. The data is inline: probe-data holds exactly the JSON of
 * probe_compare_write_json, probe-stats one entry per tensor (same order)
 * from probe_tensor_stats; the script only draws it, and needs no network. */
static const char html_head[] =
    "<!DOCTYPE html>\n"
    "<html><head><meta charset=\"utf-8\"><title>probe-compare report</title>\n"
    "<style>\n"
    "body{font-family:system-ui,sans-serif;margin:1em 1.5em;color:#222}\n"
    "h1{font-size:20px;margin:0 0 .3em}h2{font-size:16px;margin:1em 0 .4em}\n"
    "code,.mono{font-family:monospace}\n"
    "#verdict{display:inline-block;font-size:22px;font-weight:bold;padding:2px 14px;border-radius:4px;color:#fff}\n"
    "#verdict.pass{background:#2a8a2a}#verdict.fail{background:#c0392b}\n"
    ".info{color:#555;font-size:13px;margin:.2em 0}\n"
    "table{border-collapse:collapse;font-size:12px}\n"
    "td,th{border:1px solid #ccc;padding:2px 5px;text-align:right}\n"
    "th{background:#f3f3f3}\n"
    "#blockmap td.hm{min-width:58px;text-align:center;cursor:pointer;font-family:monospace}\n"
    "#blockmap td.hm.failcell{outline:2px solid #000;outline-offset:-2px;font-weight:bold}\n"
    "#blockmap td.hm.none{background:#fafafa;color:#bbb;cursor:default}\n"
    "#blockmap th.row{text-align:left;font-family:monospace}\n"
    "#heatmap td.hm{min-width:58px;text-align:center;cursor:pointer;font-family:monospace}\n"
    "#heatmap td.hm.failcell{outline:2px solid #000;outline-offset:-2px;font-weight:bold}\n"
    "#heatmap td.hm.none{background:#fafafa;color:#bbb;cursor:default}\n"
    "#heatmap th.row{text-align:left;font-family:monospace}\n"
    "#tensors td:first-child{text-align:left;font-family:monospace}\n"
    "#tensors tr{cursor:pointer}#tensors tr.fail td{background:#fdd}#tensors tr.pass td{background:#efe}\n"
    "#calls tr.fail td{background:#fdd}#calls tr.inh td{background:#fed}#calls tr.pass td{background:#efe}\n"
    "#tensors tr.sel td{outline:2px solid #36c}\n"
    ".legend{font-size:11px;color:#555;margin:.3em 0}\n"
    ".legend span.bar{display:inline-block;width:160px;height:10px;vertical-align:middle;margin:0 4px}\n"
    "#detail{border:1px solid #bbb;border-radius:4px;padding:.4em .8em;margin:.8em 0}\n"
    ".charts{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}\n"
    ".chart{font-size:12px}.chart .t{font-weight:bold;margin-bottom:2px}\n"
    ".frames{display:flex;flex-wrap:wrap;gap:8px}\n"
    ".frame{font-size:11px;text-align:center}\n"
    "svg text{font-size:10px;fill:#444}\n"
    "#runs td,#roots td{text-align:left;max-width:600px;word-break:break-all;vertical-align:top}\n"
    "#runs th.runkey{text-align:left;white-space:nowrap}\n"
    "</style></head><body>\n"
    "<h1>probe-compare report</h1>\n"
    "<p>verdict <span id=\"verdict\"></span> under gate <b id=\"gate\"></b><span id=\"headline\"></span> &mdash; first failing component: <b id=\"first-failure-component\"></b> <code id=\"first-failure-path\"></code></p>\n"
    "<p id=\"introduced\"></p>\n"
    "<p class=\"info\" id=\"files\"></p><p class=\"info\" id=\"counts\"></p><p class=\"info\" id=\"run-reasons\"></p>\n"
    "<h2>runs (each file's manifest; highlighted rows differ)</h2><table id=\"runs\"></table>\n"
    "<h2>root inputs (initial latents, timesteps, prompt embeddings, scheduler configuration)</h2><p class=\"info\" id=\"roots-summary\"></p><table id=\"roots\"></table>\n"
    "<noscript><p>This report draws its tables and charts with JavaScript; the data is in the inline JSON blocks (script elements probe-data and probe-stats).</p></noscript>\n"
    "<h2>relative L2 by denoising step and component (worst output slot per cell; click a cell)</h2>\n"
    "<table id=\"heatmap\"></table><div class=\"legend\" id=\"hm-legend\"></div>\n"
    "<div id=\"blocks-box\" style=\"display:none\"><h2>relative L2 by denoising step and block (worst output slot over the CFG branches; click a cell)</h2><table id=\"blockmap\"></table><p id=\"blocks-first\"></p></div>\n"
    "<div id=\"detail\"></div>\n"
    "<h2>tensors in execution order (click a row to show its charts)</h2>\n"
    "<table id=\"tensors\"><thead><tr><th>path</th><th>component</th><th>class</th><th>step</th><th>dtype</th><th>shape</th><th>rel_l2</th><th>cosine</th><th>max_abs</th><th>p99_abs</th><th>mismatch</th><th>gain_z</th><th>chan_z</th><th>oracle ratio</th><th>gate</th><th>verdict</th><th>reasons</th></tr></thead><tbody></tbody></table>\n"
    "<h2>component calls: introduced, inherited</h2><table id=\"calls\"><thead><tr><th>call</th><th>step</th><th>branch</th><th>inside</th><th>status</th><th>first failing output</th><th>via</th></tr></thead><tbody></tbody></table>\n"
    "<div id=\"isolation-box\" style=\"display:none\"><h2>error introduced vs inherited (isolated run <code id=\"isolated-file\"></code>; output tensors)</h2><table id=\"isolation\"><thead><tr><th>path</th><th>component</th><th>step</th><th>rel_l2 as run</th><th>rel_l2 isolated</th><th>amplification</th><th>inputs</th></tr></thead><tbody></tbody></table></div>\n"
    "<h2>missing</h2><p class=\"info\">in the candidate:</p><ul id=\"missing_in_candidate\"></ul><p class=\"info\">in the reference:</p><ul id=\"missing_in_reference\"></ul>\n";
static const char html_script[] =
    "(function(){'use strict';\n"
    "var D=JSON.parse(document.getElementById('probe-data').textContent);\n"
    "var S=JSON.parse(document.getElementById('probe-stats').textContent).tensors;\n"
    "var NS='http://www.w3.org/2000/svg';\n"
    "function $(id){return document.getElementById(id);}\n"
    "function el(tag,attrs,text){var e=document.createElement(tag);for(var k in attrs||{})e.setAttribute(k,attrs[k]);if(text!==undefined)e.textContent=text;return e;}\n"
    "function sv(tag,attrs){var e=document.createElementNS(NS,tag);for(var k in attrs||{})e.setAttribute(k,attrs[k]);return e;}\n"
    "function fmt(x){return x===null||x===undefined?'n/a':(typeof x==='number'?(x===0?'0':Math.abs(x)>=1e-3&&Math.abs(x)<1e4?x.toPrecision(4):x.toExponential(3)):String(x));}\n"
    "function comp(p){var i=D.tensors.findIndex(function(t){return t.path===p;});return i>=0?D.tensors[i].component:p.split('/')[1];}\n"
    "/* colour: t in [0,1] from green (small) through yellow to red (large) */\n"
    "function heat(t){t=Math.max(0,Math.min(1,t));return 'hsl('+Math.round(120*(1-t))+',75%,'+Math.round(62-12*t)+'%)';}\n"
    "/* spatial map colour: dark blue (0) to yellow (max) */\n"
    "function mapc(t){t=Math.max(0,Math.min(1,t));var a=[[13,8,135],[126,3,168],[204,71,120],[248,149,64],[240,249,33]];var x=t*4,i=Math.min(3,Math.floor(x)),f=x-i;var c=a[i].map(function(v,k){return Math.round(v+(a[i+1][k]-v)*f);});return 'rgb('+c.join(',')+')';}\n"
    "/* verdict */\n"
    "var v=$('verdict');v.textContent=D.verdict.toUpperCase();v.className=D.verdict;\n"
    "$('gate').textContent=D.gate.name;\n"
    "$('headline').textContent=D.headline==='oracle'?' (verdict against the oracle '+D.oracle+'; gate alone: '+D.gate_verdict+')':D.headline==='gate+systematic'?' + the systematic test':'';\n"
    "var I=D.introduced;if(I){var t=I.kind==='call'?'introduced by '+I.call+': '+I.path+' fails while its inputs pass':I.kind==='between'?'introduced between '+I.after+' and '+I.call+', in pipeline code: '+I.path+' fails'+(I.amplification!==null?' ('+fmt(I.amplification)+' x the largest of the outputs since)':'')+' while every output since passes':'introduced before the first captured call: '+I.path+' fails';if(I.no_thresholds)t+='; it has no T2 thresholds in the calibration file, so how much it differs is not judged';if(I.inherited_calls)t+='; inherited by '+I.inherited_calls+' later call'+(I.inherited_calls===1?'':'s');$('introduced').textContent=t;}\n"
    "(D.calls||[]).forEach(function(c){var tr=el('tr',{'class':c.status==='pass'?'pass':c.status==='introduced'||c.status==='inside'?'fail':'inh'});[c.call,c.step===null?'':c.step,c.cfg_branch===null?'':c.cfg_branch,c.parent?c.parent+(c.block!==null?' (block '+c.block+')':''):'',c.status,c.first_failure||'',c.via||''].forEach(function(x){tr.appendChild(el('td',{},String(x)));});$('calls').querySelector('tbody').appendChild(tr);});\n"
    "var ff=D.first_failure;$('first-failure-component').textContent=ff?comp(ff):'none';$('first-failure-path').textContent=ff||'';\n"
    "var sm=D.summary||{};\n"
    "$('files').textContent='reference '+D.reference+' \\u2022 candidate '+D.candidate;\n"
    "$('counts').textContent=(sm.tensors!==undefined?sm.tensors:D.tensors.length)+' tensors compared, '+(sm.passed!==undefined?sm.passed:'?')+' pass, '+(sm.failed!==undefined?sm.failed:'?')+' fail; missing in candidate '+D.missing_in_candidate.length+', missing in reference '+D.missing_in_reference.length+(D.skipped?', skipped at capture '+D.skipped.length:'')+(D.feature_active?'':'; the candidate is identical to the reference: feature not active?');\n"
    "var rr=(D.reasons||[]).slice();if(D.nothing_compared&&!rr.length)rr.push('nothing compared');$('run-reasons').textContent=rr.join('; ');\n"
    "/* heatmap: rows components in execution order, columns steps (else call index), value the worst rel_l2 of the output slots */\n"
    "var comps=[],cols=[],hasOut={},cells={};\n"
    "D.tensors.forEach(function(t,i){if(comps.indexOf(t.component)<0)comps.push(t.component);if(/^out/.test(S[i].slot))hasOut[t.component]=1;});\n"
    "D.tensors.forEach(function(t,i){var s=S[i];if(hasOut[t.component]&&!/^out/.test(s.slot))return;\n"
    " var key=t.component+'\\u0000'+s.column,val=t.rel_l2===null?Infinity:t.rel_l2,c=cells[key];\n"
    " if(cols.indexOf(s.column)<0)cols.push(s.column);\n"
    " if(!c||val>c.v)cells[key]=c={v:val,i:i,fail:c?c.fail:0};c.fail=c.fail||t.verdict==='fail';});\n"
    "cols.sort(function(a,b){return a-b;});\n"
    "var lo=Infinity,hi=-Infinity;for(var k in cells){var x=cells[k].v;if(x>0&&isFinite(x)){lo=Math.min(lo,Math.floor(Math.log10(x)));hi=Math.max(hi,Math.ceil(Math.log10(x)));}}\n"
    "if(hi<=lo)hi=lo+1;\n"
    "var hm=$('heatmap'),tr=el('tr');tr.appendChild(el('th',{},'component \\\\ step'));cols.forEach(function(c){tr.appendChild(el('th',{},String(c)));});hm.appendChild(tr);\n"
    "comps.forEach(function(cn){var tr=el('tr');tr.appendChild(el('th',{'class':'row'},cn));cols.forEach(function(col){var c=cells[cn+'\\u0000'+col];\n"
    " if(!c){tr.appendChild(el('td',{'class':'hm none'},'\\u00b7'));return;}\n"
    " var td=el('td',{'class':'hm'+(c.fail?' failcell':''),'data-component':cn,'data-step':String(col),'data-rel-l2':isFinite(c.v)?String(c.v):'null','data-tensor':String(c.i),title:D.tensors[c.i].path+': rel_l2 '+fmt(c.v)},isFinite(c.v)?fmt(c.v):'n/a');\n"
    " td.style.background=!isFinite(c.v)?'#600':c.v===0?'#e8f0ff':heat((Math.log10(c.v)-lo)/(hi-lo));if(!isFinite(c.v))td.style.color='#fff';\n"
    " td.onclick=function(){location.hash='tensor='+encodeURIComponent(tkey(D.tensors[c.i]));};tr.appendChild(td);});hm.appendChild(tr);});\n"
    "$('hm-legend').innerHTML='';var lg=$('hm-legend');lg.appendChild(document.createTextNode('log10 scale: 1e'+lo));var bar=el('span',{'class':'bar'});bar.style.background='linear-gradient(to right,'+[0,.25,.5,.75,1].map(heat).join(',')+')';lg.appendChild(bar);\n"
    "lg.appendChild(document.createTextNode('1e'+hi+'; bold outline: a tensor of the cell fails the gate'+(D.gate.rel_l2_max!==null?' (T1 rel_l2_max '+D.gate.rel_l2_max+')':'')+'; rows with outputs show output slots only'));\n"
    "/* block x step: rows (component, block index) of nested calls, columns steps, value the worst rel_l2 of their output slots */\n"
    "var bk=[],bcols=[],bcells={},bfirst=null;\n"
    "D.tensors.forEach(function(t,i){if(t.block===undefined||!/^out/.test(S[i].slot))return;var rk=t.component+' '+t.block,col=t.step===undefined?S[i].column:t.step,key=rk+'\\u0000'+col,val=t.rel_l2===null?Infinity:t.rel_l2,c=bcells[key];\n"
    " if(bk.indexOf(rk)<0)bk.push(rk);if(bcols.indexOf(col)<0)bcols.push(col);\n"
    " if(!c||val>c.v)bcells[key]=c={v:val,i:i,fail:c?c.fail:0};if(t.verdict==='fail'){c.fail=1;if(bfirst===null)bfirst=i;}});\n"
    "if(bk.length){$('blocks-box').style.display='';bcols.sort(function(a,b){return a-b;});\n"
    " bk.sort(function(a,b){var x=a.split(' '),y=b.split(' ');return x[0]<y[0]?-1:x[0]>y[0]?1:(+x[1])-(+y[1]);});\n"
    " var bm=$('blockmap'),br=el('tr');br.appendChild(el('th',{},'block \\\\ step'));bcols.forEach(function(c){br.appendChild(el('th',{},String(c)));});bm.appendChild(br);\n"
    " bk.forEach(function(rk){var tr=el('tr');tr.appendChild(el('th',{'class':'row'},rk));bcols.forEach(function(col){var c=bcells[rk+'\\u0000'+col];\n"
    "  if(!c){tr.appendChild(el('td',{'class':'hm none'},'\\u00b7'));return;}\n"
    "  var td=el('td',{'class':'hm'+(c.fail?' failcell':''),'data-block':rk,'data-step':String(col),'data-rel-l2':isFinite(c.v)?String(c.v):'null','data-tensor':String(c.i),title:D.tensors[c.i].path+': rel_l2 '+fmt(c.v)},isFinite(c.v)?fmt(c.v):'n/a');\n"
    "  td.style.background=!isFinite(c.v)?'#600':c.v===0?'#e8f0ff':heat((Math.log10(c.v)-lo)/(hi-lo));if(!isFinite(c.v))td.style.color='#fff';\n"
    "  td.onclick=function(){location.hash='tensor='+encodeURIComponent(tkey(D.tensors[c.i]));};tr.appendChild(td);});bm.appendChild(tr);});\n"
    " $('blocks-first').textContent=bfirst===null?'no block output fails':'first failing block output in execution order: '+D.tensors[bfirst].path+' (block '+D.tensors[bfirst].block+' of '+D.tensors[bfirst].parent+(D.tensors[bfirst].step!==undefined?', step '+D.tensors[bfirst].step:'')+')';}\n"
    "/* tensor table; a rank-by-rank comparison names the rank (docs/nccl.md) */\n"
    "function tkey(t){return t.rank===undefined?t.path:t.path+' (rank '+t.rank+')';}\n"
    "var tb=$('tensors').querySelector('tbody');\n"
    "D.tensors.forEach(function(t,i){var tr=el('tr',{'class':t.verdict,'data-index':String(i)});\n"
    " [tkey(t),t.component,(t['class']?t['class'].split('.').pop():'')+(t.class_candidate!==undefined?' (candidate: '+(t.class_candidate?t.class_candidate.split('.').pop():'unknown')+')':''),S[i].column,t.dtype,JSON.stringify(t.shape),(t.rel_l2===null&&t.stats_only&&t.rel_l2_lower_bound!==null?'>= '+fmt(t.rel_l2_lower_bound)+' (stats-only)':fmt(t.rel_l2)),t.cosine===null?'n/a':t.cosine.toFixed(8),fmt(t.max_abs),fmt(t.p99_abs),fmt(t.mismatch_fraction),t.systematic?fmt(t.systematic.gain_z):'n/a',t.systematic&&t.systematic.channels?fmt(t.systematic.channel_z):'n/a',t.oracle?fmt(t.oracle.ratio):'n/a',t.gate_verdict?t.gate_verdict.verdict:'',t.verdict,t.reasons.join('; ')].forEach(function(x){tr.appendChild(el('td',{},String(x)));});\n"
    " tr.onclick=function(){location.hash='tensor='+encodeURIComponent(tkey(t));};tb.appendChild(tr);});\n"
    "['missing_in_candidate','missing_in_reference'].forEach(function(k){var ul=$(k);D[k].forEach(function(p){ul.appendChild(el('li',{},p));});});\n"
    "/* per-tensor charts */\n"
    "function histogram(t,s,box){var h=s.hist,B=h.counts.length,bars=[['0',null,null,h.zero]];\n"
    " for(var k=0;k<B;k++)bars.push([null,h.log10_lo+k*(h.log10_hi-h.log10_lo)/B,h.log10_lo+(k+1)*(h.log10_hi-h.log10_lo)/B,h.counts[k]]);\n"
    " bars.push(['non-finite',null,null,h.nonfinite]);\n"
    " var mx=Math.max.apply(null,bars.map(function(b){return b[3];}))||1,W=12,H=120,g=sv('svg',{id:'hist',width:String(bars.length*W+20),height:String(H+30),'data-log10-lo':String(h.log10_lo),'data-log10-hi':String(h.log10_hi)});\n"
    " var total=0;bars.forEach(function(b,j){total+=b[3];var bh=b[3]?Math.max(1,H*b[3]/mx):0;var r=sv('rect',{'class':'hbar',x:String(10+j*W),y:String(H-bh),width:String(W-2),height:String(bh),fill:j===0?'#7a7':j===bars.length-1?'#a33':'#47a','data-count':String(b[3]),'data-kind':j===0?'zero':j===bars.length-1?'nonfinite':'bin'});\n"
    "  if(b[1]!==null){r.setAttribute('data-log10-from',String(b[1]));r.setAttribute('data-log10-to',String(b[2]));}\n"
    "  var ti=sv('title');ti.textContent=(b[0]||('|c-r| in [1e'+b[1].toFixed(2)+', 1e'+b[2].toFixed(2)+')'))+': '+b[3];r.appendChild(ti);g.appendChild(r);});\n"
    " var t0=sv('text',{x:'10',y:String(H+12)});t0.textContent='0';g.appendChild(t0);\n"
    " var t1=sv('text',{x:'24',y:String(H+24)});t1.textContent='1e'+h.log10_lo;g.appendChild(t1);\n"
    " var t2=sv('text',{x:String(bars.length*W-30),y:String(H+24)});t2.textContent='1e'+h.log10_hi;g.appendChild(t2);\n"
    " var d=el('div',{'class':'chart'});d.appendChild(el('div',{'class':'t'},'histogram of |c \\u2212 r| (log-spaced bins; left: exactly 0, right: non-finite)'));d.appendChild(g);\n"
    " var p=el('div');p.appendChild(document.createTextNode('total count '));p.appendChild(el('span',{id:'hist-total'},String(total)));p.appendChild(document.createTextNode(' of n = '+t.n+'; largest bin '+mx));d.appendChild(p);box.appendChild(d);}\n"
    "function shift(s,box){var a=s.channel_shift,n=a.length,W=Math.max(1,Math.min(12,Math.floor(420/n))),H=120,m=0,mi=-1;\n"
    " a.forEach(function(x,k){if(x!==null&&Math.abs(x)>m){m=Math.abs(x);mi=k;}});\n"
    " var g=sv('svg',{id:'shift',width:String(n*W+20),height:String(H+20)});g.appendChild(sv('line',{x1:'10',x2:String(10+n*W),y1:String(H/2),y2:String(H/2),stroke:'#999'}));\n"
    " a.forEach(function(x,k){var bh=x===null||m===0?0:(H/2)*Math.abs(x)/m;var r=sv('rect',{'class':'cbar',x:String(10+k*W),y:String(x>0?H/2-bh:H/2),width:String(Math.max(1,W-1)),height:String(bh),fill:x>0?'#c55':'#55c','data-channel':String(k),'data-shift':String(x)});var ti=sv('title');ti.textContent='channel '+k+': '+fmt(x);r.appendChild(ti);g.appendChild(r);});\n"
    " var d=el('div',{'class':'chart'});d.appendChild(el('div',{'class':'t'},'per-channel mean shift, mean(c \\u2212 r) over axis '+s.channel_axis+' ('+n+' channels)'));d.appendChild(g);\n"
    " d.appendChild(el('div',{id:'shift-max','data-channel':String(mi)},mi<0?'no shift':'largest |shift|: channel '+mi+', '+fmt(a[mi])));box.appendChild(d);}\n"
    "function smap(s,box){var M=s.map,mh=M.map_h,mw=M.map_w,px=Math.max(2,Math.floor(192/Math.max(mh,mw))),mx=0,best=null;\n"
    " M.values.forEach(function(x,k){if(x!==null&&x>mx){mx=x;best=k;}});\n"
    " var d=el('div',{'class':'chart'});d.appendChild(el('div',{'class':'t'},'spatial map of mean |c \\u2212 r| over batch and channels ('+M.frames+' frame'+(M.frames>1?'s':'')+' of '+M.height+' x '+M.width+' pixels, '+mh+' x '+mw+' cells per map; one colour scale, 0 to '+fmt(mx)+')'));\n"
    " var fr=el('div',{'class':'frames'});\n"
    " for(var f=0;f<M.map_frames;f++){var f0=Math.ceil(f*M.frames/M.map_frames),f1=Math.ceil((f+1)*M.frames/M.map_frames)-1;\n"
    "  var c=el('div',{'class':'frame'}),g=sv('svg',{'class':'map','data-frame':String(f),width:String(mw*px),height:String(mh*px)});\n"
    "  for(var y=0;y<mh;y++)for(var x=0;x<mw;x++){var val=M.values[(f*mh+y)*mw+x];g.appendChild(sv('rect',{'class':'mcell',x:String(x*px),y:String(y*px),width:String(px),height:String(px),fill:val===null?'#888':mapc(mx?val/mx:0),'data-frame':String(f),'data-y':String(y),'data-x':String(x),'data-v':String(val)}));}\n"
    "  c.appendChild(g);c.appendChild(el('div',{},f0===f1?'frame '+f0:'frames '+f0+'\\u2013'+f1));fr.appendChild(c);}\n"
    " d.appendChild(fr);\n"
    " if(best!==null){var bf=Math.floor(best/(mh*mw)),by=Math.floor(best/mw)%mh,bx=best%mw;\n"
    "  var r0=Math.ceil(by*M.height/mh),r1=Math.ceil((by+1)*M.height/mh)-1,c0=Math.ceil(bx*M.width/mw),c1=Math.ceil((bx+1)*M.width/mw)-1;\n"
    "  var f0=Math.ceil(bf*M.frames/M.map_frames),f1=Math.ceil((bf+1)*M.frames/M.map_frames)-1;\n"
    "  d.appendChild(el('div',{id:'map-hottest','data-frame':String(f0),'data-frame-last':String(f1),'data-row':String(r0),'data-row-last':String(r1),'data-col':String(c0),'data-col-last':String(c1),'data-v':String(mx)},\n"
    "   'hottest cell: frame '+(f0===f1?f0:f0+'\\u2013'+f1)+', pixel rows '+(r0===r1?r0:r0+'\\u2013'+r1)+', columns '+(c0===c1?c0:c0+'\\u2013'+c1)+': mean |c \\u2212 r| = '+fmt(mx)));}\n"
    " box.appendChild(d);}\n"
    "function select(){var m=/^#tensor=(.*)$/.exec(location.hash),i=-1;\n"
    " if(m){var p=decodeURIComponent(m[1]);i=D.tensors.findIndex(function(t){return tkey(t)===p;});}\n"
    " if(i<0&&ff)i=D.tensors.findIndex(function(t){return t.path===ff;});\n"
    " if(i<0&&D.tensors.length)i=0;\n"
    " var box=$('detail');box.innerHTML='';\n"
    " Array.prototype.forEach.call(document.querySelectorAll('#tensors tr.sel'),function(r){r.classList.remove('sel');});\n"
    " if(i<0){box.appendChild(el('p',{},'no tensor was compared'));return;}\n"
    " var row=document.querySelector('#tensors tr[data-index=\"'+i+'\"]');if(row)row.classList.add('sel');\n"
    " var t=D.tensors[i],s=S[i];\n"
    " var h=el('h2');h.appendChild(document.createTextNode('tensor '));h.appendChild(el('code',{id:'detail-path'},tkey(t)));h.appendChild(document.createTextNode(' \\u2014 '));h.appendChild(el('span',{id:'detail-verdict','class':t.verdict},t.verdict.toUpperCase()));box.appendChild(h);\n"
    " box.appendChild(el('p',{'class':'info',id:'detail-metrics'},'component '+t.component+', '+s.column_kind+' '+s.column+', '+t.dtype+' '+JSON.stringify(t.shape)+'; rel_l2 '+fmt(t.rel_l2)+', cosine '+(t.cosine===null?'n/a':t.cosine.toFixed(8))+', max_abs '+fmt(t.max_abs)+(t.max_abs_index?' at '+JSON.stringify(t.max_abs_index):'')+', p99_abs '+fmt(t.p99_abs)+', mean_abs '+fmt(t.mean_abs)+', mismatch '+fmt(t.mismatch_fraction)+(t.reasons.length?'; '+t.reasons.join('; '):'')));\n"
    " if(!s.hist){box.appendChild(el('p',{},'not compared: no histogram or map'));return;}\n"
    " var ch=el('div',{'class':'charts'});histogram(t,s,ch);if(s.channel_shift)shift(s,ch);box.appendChild(ch);\n"
    " if(s.map)smap(s,box);else if(s.map_omitted)box.appendChild(el('p',{'class':'info'},'spatial map omitted: '+s.map_omitted));}\n"
    "/* runs side by side, root inputs, isolation (docs/report.md) */\n"
    "var MF=D.manifests||{},MR=MF.reference||{},MC=MF.candidate||{};\n"
    "function mget(m,k){var v=m;k.split('.').forEach(function(p){v=(v&&typeof v==='object')?v[p]:undefined;});if(v===undefined||v===null)return '';if(k==='command'&&Array.isArray(v))return v.join(' ');return typeof v==='string'?v:JSON.stringify(v);}\n"
    "function injs(m){var i=m.inject;return i?(i.status+': '+i.injected+' of '+i.selected+' from '+i.reference+(i.error?' ('+i.error+')':'')):(MF.reference||MF.candidate?'none':'');}\n"
    "var rt=$('runs'),h0=el('tr');['','reference','candidate'].forEach(function(x){h0.appendChild(el('th',{},x));});rt.appendChild(h0);\n"
    "[['label','label'],['command','command'],['host','host'],['start','start_time'],['GPU','cuda.devices'],['NVIDIA driver','nvidia_driver'],['CUDA driver API','cuda.driver_version'],['CUDA runtime','cuda.runtime_version'],['python','python'],['torch','torch'],['diffusers','diffusers'],['transformers','transformers'],['tensorrt_llm','tensorrt_llm'],['probe','probe_version'],['dtype settings','dtypes'],['scheduler','scheduler'],['capture','capture'],['taps','taps'],['inject',null],['skips',null],['files',null],['gate',null]].forEach(function(row){\n"
    " var a,b;if(row[0]==='files'){var RS=D.rank_sets;if(RS){var fs=function(x){return x?('rank set ('+x.world_size+' files'+(x.index?', index '+x.index:'')+'): '+x.files.join(' ')):'one file';};a=fs(RS.reference);b=fs(RS.candidate);}}else if(row[0]==='inject'){a=injs(MR);b=injs(MC);}else if(row[0]==='skips'){a=String((D.skipped||[]).filter(function(s){return s.side==='reference';}).length);b=String((D.skipped||[]).filter(function(s){return s.side==='candidate';}).length);}else if(row[0]==='gate'){a=b=JSON.stringify(D.gate);}else{a=mget(MR,row[1]);b=mget(MC,row[1]);}\n"
    " if(!a&&!b)return;var tr=el('tr',{'class':'run-row','data-key':row[0]});tr.appendChild(el('th',{'class':'runkey'},row[0]));tr.appendChild(el('td',{'class':'mono'},a||'-'));tr.appendChild(el('td',{'class':'mono'},b||'-'));if(a!==b)tr.style.background='#fff3cd';rt.appendChild(tr);});\n"
    "var RI=D.root_inputs;\n"
    "if(!RI){$('roots-summary').textContent='not checked';}else{var nd=RI.filter(function(x){return !x.same&&!x.allowed&&!x.incomplete;}).length;$('roots-summary').textContent=RI.length?(RI.length+' root inputs checked; '+(D.same_experiment?'the same experiment':'NOT the same experiment: '+nd+' differ')):'no root input recorded in either file';\n"
    " var rh=el('tr');['path','reference hash','candidate hash','status'].forEach(function(x){rh.appendChild(el('th',{},x));});$('roots').appendChild(rh);\n"
    " RI.forEach(function(x){var tr=el('tr',{'class':'root-row','data-same':String(x.same)});[x.path,x.hash_reference||'-',x.hash_candidate||'-',x.same?(x.converted?'same: '+x.why:'same'):(x.allowed?'differs (allowed): ':x.incomplete?'unknown: ':'DIFFERS: ')+(x.why||'')].forEach(function(v){tr.appendChild(el('td',{'class':'mono'},v));});if(!x.same)tr.style.background=x.allowed?'#fff3cd':'#fdd';$('roots').appendChild(tr);});}\n"
    "if(D.isolated&&D.isolated_complete){$('isolation-box').style.display='';$('isolated-file').textContent=D.isolated;var ib=$('isolation').querySelector('tbody');\n"
    " D.tensors.forEach(function(t,i){if(!/^out/.test(S[i].slot))return;var tr=el('tr',{'class':'iso-row','data-path':t.path});[t.path,t.component,t.step===undefined?'-':String(t.step),fmt(t.rel_l2),fmt(t.rel_l2_isolated),fmt(t.amplification),t.isolated_inputs_converted?'converted: rel_l2 '+fmt(t.isolated_inputs_rel_l2):''].forEach(function(v){tr.appendChild(el('td',{},v));});ib.appendChild(tr);});}\n"
    "window.addEventListener('hashchange',select);select();\n"
    "})();\n";

/* The heatmap's column of a tensor: its denoising step, else its call index
 * (probe.call, else the numeric path element after the component), else 0. */
static json_int_t heat_column(const probe_tensor_info *ti, const char **kind)
{
    *kind = "step";
    if (ti->step >= 0)
        return (json_int_t)ti->step;
    *kind = "call";
    if (ti->call >= 0)
        return (json_int_t)ti->call;
    const char *p = strchr(ti->path + (ti->path[0] == '/'), '/');
    if (p && p[1] >= '0' && p[1] <= '9') {
        char *end;
        long long v = strtoll(p + 1, &end, 10);
        if ((*end == '/' || *end == 0) && v >= 0)
            return (json_int_t)v;
    }
    return 0;
}

/* All spatial maps of one page together hold at most this many cells (about
 * 10 bytes each in the page); later maps are left out with a note. */
#define HTML_MAP_BUDGET (4u << 20)

static json_t *stats_json(const probe_tensor_result *t, size_t *map_cells)
{
    const probe_tensor_stats *st = &t->stats;
    const char *kind;
    json_int_t col = heat_column(&t->ref, &kind);
    json_t *o = json_pack("{s:s,s:I,s:s}", "slot", t->ref.slot, "column", col, "column_kind", kind);
    if (!o)
        return NULL;
    if (!t->compared || !st->computed) {
        json_object_set_new(o, "hist", json_null());
        return o;
    }
    json_t *counts = json_array();
    for (int k = 0; k < PROBE_STATS_HIST_BINS; k++)
        json_array_append_new(counts, json_integer((json_int_t)st->hist[k]));
    json_object_set_new(o, "hist", json_pack("{s:I,s:I,s:i,s:i,s:o}", "zero",
                                             (json_int_t)st->hist_zero, "nonfinite",
                                             (json_int_t)st->hist_nonfinite, "log10_lo",
                                             st->hist_log10_lo, "log10_hi", st->hist_log10_hi,
                                             "counts", counts));
    if (st->nchannels > 0) {
        json_t *a = json_array();
        for (int k = 0; k < st->nchannels; k++)
            json_array_append_new(a, num_or_null(st->channel_shift[k]));
        json_object_set_new(o, "channel_axis", json_integer(st->channel_axis));
        json_object_set_new(o, "channel_shift", a);
    }
    if (st->map) {
        size_t cells = (size_t)st->map_frames * (size_t)st->map_h * (size_t)st->map_w;
        if (*map_cells + cells > HTML_MAP_BUDGET) {
            json_object_set_new(o, "map_omitted",
                                json_string("the page already holds its budget of map cells"));
            return o;
        }
        *map_cells += cells;
        json_t *a = json_array();
        for (size_t k = 0; k < cells; k++)
            json_array_append_new(a, num_or_null(st->map[k]));
        json_object_set_new(o, "map", json_pack("{s:I,s:I,s:I,s:i,s:i,s:i,s:o}", "frames",
                                                (json_int_t)st->frames, "height",
                                                (json_int_t)st->height, "width",
                                                (json_int_t)st->width, "map_frames", st->map_frames,
                                                "map_h", st->map_h, "map_w", st->map_w,
                                                "values", a));
    }
    return o;
}

/* Write j inside <script type="application/json" id="ID">; "</" is written
 * as "<\/" so that no string in the data can end the element. */
static int write_json_script(FILE *f, const char *id, json_t *j, int precision)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(precision) | JSON_PRESERVE_ORDER);
    if (!text)
        return -1;
    int ok = fprintf(f, "<script type=\"application/json\" id=\"%s\">", id) > 0;
    for (const char *p = text; ok && *p; p++) {
        if (p[0] == '<' && p[1] == '/')
            ok = fputs("<\\", f) != EOF;
        else
            ok = fputc(*p, f) != EOF;
    }
    free(text);
    return ok && fputs("</script>\n", f) != EOF ? 0 : 1;
}

probe_status probe_compare_write_html(const probe_compare_result *r, FILE *f)
{
    if (!r || !f)
        return probe_set_error(PROBE_EINVAL, "probe_compare_write_html: NULL argument");
    errno = 0;
    json_t *data = result_json(r), *stats = json_object(), *ts = json_array();
    size_t map_cells = 0;
    int built = data && stats && ts && json_object_set(stats, "tensors", ts) == 0;
    for (size_t i = 0; built && i < r->ntensors; i++)
        built = json_array_append_new(ts, stats_json(&r->tensors[i], &map_cells)) == 0;
    json_decref(ts);
    int rc = built ? 0 : -1;
    if (built) {
        rc = fputs(html_head, f) == EOF;
        if (!rc)
            rc = write_json_script(f, "probe-data", data, 17);
        if (!rc)
            rc = write_json_script(f, "probe-stats", stats, 6);
        if (!rc)
            rc = fprintf(f, "<script>\n%s</script>\n</body></html>\n", html_script) < 0 ||
                 fflush(f) != 0;
    }
    json_decref(data);
    json_decref(stats);
    if (rc < 0)
        return probe_set_error(PROBE_ENOMEM, "out of memory building the HTML report");
    return rc ? probe_set_error(PROBE_EIO, "%s", strerror(errno ? errno : EIO)) : PROBE_OK;
}
