/* select.c - PROBE_CAPTURE and PROBE_STATS_ONLY_FOR: the grammar of
 * selection items, which tensors an item selects, and the per-item counts
 * and lines of the manifest. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/shim.h"
#include "capture/scope.h"
#include "capture/select.h"

/* ---- selection: PROBE_CAPTURE (docs/intercept.md "Selection") ----
 *
 *   spec   := item (',' item)*          items are OR-ed; blank items ignored
 *   item   := glob ('@' sel)*           every selector of an item must hold
 *   sel    := ('step' | 'branch' | 'block') '=' ranges   (each key at most once)
 *   ranges := range ('+' range)*        at most SHIM_SELECT_MAX_RANGES
 *   range  := N | N '-' M | N '-'       inclusive; N '-' is N and above
 *
 * glob is an fnmatch(3) pattern (no flags: '*' and '?' also match '/')
 * against the dataset path "/<component>/<call, 4 digits>/<slot>"; one
 * without a leading '/' is also tried against the path without its '/'.
 * step is the tap's denoising step, branch its CFG branch, block its block
 * index (a call nested in another component's call); a tap whose value is
 * unknown (-1) never satisfies a selector on it. */

#define SEL_VALUE_MAX ((int64_t)999999999)

static int selectors_hold(const struct shim_select *s, int64_t step, int64_t branch, int64_t block);

/* Parse "N" at *p (decimal, 0..SEL_VALUE_MAX; as scripts/probe-run checks); 1 and *p past it, or 0. */
static int parse_num(const char **p, int64_t *v)
{
    const char *c = *p;
    int64_t x = 0;
    if (*c < '0' || *c > '9')
        return 0;
    for (; *c >= '0' && *c <= '9'; ++c) {
        x = x * 10 + (*c - '0');
        if (x > SEL_VALUE_MAX)
            return 0;
    }
    *p = c;
    *v = x;
    return 1;
}

/* Parse ranges (up to '@' or the end) into r; NULL or the reason it is bad. */
static const char *parse_ranges(const char *p, const char *end, struct shim_range *r, size_t *nr)
{
    *nr = 0;
    if (p == end)
        return "has no range after '='";
    for (;;) {
        struct shim_range x;
        if (*nr == SHIM_SELECT_MAX_RANGES)
            return "has more than 16 ranges";
        if (!parse_num(&p, &x.lo))
            return "has a range that does not start with a number (0..999999999)";
        x.hi = x.lo;
        if (p < end && *p == '-') {
            ++p;
            if (p == end || *p == '+')
                x.hi = INT64_MAX;
            else if (!parse_num(&p, &x.hi))
                return "has a range whose end is not a number (0..999999999)";
            if (x.hi < x.lo)
                return "has a range whose end is below its start";
        }
        r[(*nr)++] = x;
        if (p == end)
            return NULL;
        if (*p != '+')
            return "has a character other than a digit, '-' or '+' in its ranges";
        ++p;
    }
}

/* Split item (modified in place) into its glob and selectors. NULL or why
 * it is bad. */
static const char *parse_item(char *item, struct shim_select *sel)
{
    memset(sel, 0, sizeof *sel);
    char *at = strchr(item, '@');
    if (at == item)
        return "has no glob before '@'";
    if (!at)
        return NULL;
    *at = '\0';
    for (char *p = at + 1;;) {
        char *next = strchr(p, '@');
        const char *end = next ? next : p + strlen(p);
        struct shim_range *r;
        size_t *nr;
        if (strncmp(p, "step=", 5) == 0) {
            r = sel->step, nr = &sel->nstep, p += 5;
        } else if (strncmp(p, "branch=", 7) == 0) {
            r = sel->branch, nr = &sel->nbranch, p += 7;
        } else if (strncmp(p, "block=", 6) == 0) {
            r = sel->block, nr = &sel->nblock, p += 6;
        } else {
            return "has a selector other than @step=RANGES, @branch=RANGES or @block=RANGES";
        }
        if (*nr)
            return "names the same selector twice";
        const char *why = parse_ranges(p, end, r, nr);
        if (why)
            return why;
        if (!next)
            return NULL;
        p = next + 1;
    }
}

/* The items of a spec (PROBE_CAPTURE, PROBE_STATS_ONLY_FOR): each item as
 * given, its glob (pointing into copy) and its selectors. */
struct spec_items {
    char *copy;
    char **globs, **items;
    struct shim_select *sel;
    size_t n;
};

static void spec_items_free(struct spec_items *s)
{
    for (size_t i = 0; s->items && i < s->n; ++i)
        free(s->items[i]);
    free(s->copy);
    free(s->globs);
    free(s->items);
    free(s->sel);
    memset(s, 0, sizeof *s);
}

/* Parse spec into out (blank items skipped). NULL on success; otherwise why,
 * with the item at fault in bad (cap bytes; "" for out of memory), and out
 * holds nothing. */
static const char *parse_spec(const char *spec, struct spec_items *out, char *bad, size_t cap)
{
    memset(out, 0, sizeof *out);
    bad[0] = '\0';
    size_t n = 1;
    for (const char *c = spec; *c; ++c)
        n += *c == ',';
    out->copy = strdup(spec);
    out->globs = calloc(n, sizeof *out->globs);
    out->items = calloc(n, sizeof *out->items);
    out->sel = calloc(n, sizeof *out->sel);
    if (!out->copy || !out->globs || !out->items || !out->sel) {
        spec_items_free(out);
        return "out of memory";
    }
    for (char *save = NULL, *tok = strtok_r(out->copy, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (!*(tok = shim_trim_spaces(tok)))
            continue;
        char item[SHIM_PATH_MAX + 64];
        snprintf(item, sizeof item, "%s", tok);
        const char *why = parse_item(tok, &out->sel[out->n]);
        if (why) {
            snprintf(bad, cap, "%s", item);
            spec_items_free(out);
            return why;
        }
        out->items[out->n] = strdup(item); /* NULL on ENOMEM: the item is then shown as its glob */
        out->globs[out->n++] = tok;
    }
    return NULL;
}

/* glob matches path, or (a glob without a leading '/') path without its '/' */
static int glob_matches(const char *g, const char *path)
{
    return fnmatch(g, path, 0) == 0 || (g[0] != '/' && fnmatch(g, path + 1, 0) == 0);
}

void shim_select_config(const char *spec)
{
    struct spec_items s;
    char bad[SHIM_PATH_MAX + 64];
    const char *why = parse_spec(spec, &s, bad, sizeof bad);
    atomic_ullong *hits = why ? NULL : calloc(s.n ? s.n : 1, sizeof *hits);
    if (!why && !hits) {
        spec_items_free(&s);
        return; /* nglobs stays 0: nothing is selected */
    }
    if (why && !bad[0])
        return; /* out of memory: nothing is selected */
    if (why) {
        char msg[512];
        snprintf(msg, sizeof msg, "item '%s' %s", bad, why);
        shim_cfg.capture_error = strdup(msg);
        shim_warn_config("PROBE_CAPTURE='%s': %s; nothing is captured (every tap counts as filtered)",
                         spec, msg);
        shim_cfg.last_kinds = 0;
        return;
    }
    for (size_t k = 0; k < s.n; ++k) {
        /* `gemm.last` / `nccl.last`: the last call of each scope instance */
        if (strstr(s.globs[k], "gemm.last"))
            s.sel[k].last |= 1 << SHIM_COUNT_GEMM;
        if (strstr(s.globs[k], "nccl.last"))
            s.sel[k].last |= 1 << SHIM_COUNT_NCCL;
        shim_cfg.last_kinds |= s.sel[k].last;
    }
    shim_cfg.items = s.items;
    shim_cfg.item_hits = hits;
    shim_cfg.globs = s.globs;
    shim_cfg.sel = s.sel;
    shim_cfg.nglobs = s.n;
}

/* PROBE_STATS_ONLY_FOR (probe-run --stats-only-for SPEC): the tensors an item
 * of SPEC selects (the grammar above) are written as stats-only records. */
static struct spec_items stats_for;

void shim_select_stats_for_config(const char *spec)
{
    if (!spec || !*spec)
        return;
    char bad[SHIM_PATH_MAX + 64];
    const char *why = parse_spec(spec, &stats_for, bad, sizeof bad);
    if (why) {
        /* writing every byte of a run meant to be summarized is the worse mistake */
        if (bad[0])
            shim_warn_config("PROBE_STATS_ONLY_FOR='%s': item '%s' %s; every tensor is written "
                             "stats-only", spec, bad, why);
        else
            shim_warn("PROBE_STATS_ONLY_FOR: out of memory; every tensor is written stats-only");
        shim_cfg.stats_only = 1;
    }
}

int shim_select_stats_for(const char *path, int64_t step, int64_t branch, int64_t block)
{
    for (size_t i = 0; i < stats_for.n; ++i)
        if (glob_matches(stats_for.globs[i], path) &&
            selectors_hold(&stats_for.sel[i], step, branch, block))
            return 1;
    return 0;
}

int shim_select_stats_for_count(void)
{
    return (int)stats_for.n;
}

static int in_ranges(int64_t v, const struct shim_range *r, size_t nr)
{
    if (nr == 0)
        return 1;
    if (v < 0)
        return 0; /* unknown step or branch */
    for (size_t i = 0; i < nr; ++i)
        if (v >= r[i].lo && v <= r[i].hi)
            return 1;
    return 0;
}

/* Every item is tried (not only up to the first that matches), so that each
 * item's count says whether it selected anything (shim_select_items_json). */
/* the largest denoising step an adapter tap carried (-1: none), for the
 * message about an item that matched nothing */
static atomic_llong step_max = -1;
/* the largest block index an adapter tap carried (-1: none), likewise */
static atomic_llong block_max = -1;

static void raise_to(atomic_llong *max, int64_t v)
{
    long long seen = atomic_load_explicit(max, memory_order_relaxed);
    while (v > seen && !atomic_compare_exchange_weak(max, &seen, (long long)v))
        ;
}

/* every selector of item s holds for (step, branch, block) */
static int selectors_hold(const struct shim_select *s, int64_t step, int64_t branch, int64_t block)
{
    return in_ranges(step, s->step, s->nstep) && in_ranges(branch, s->branch, s->nbranch) &&
           in_ranges(block, s->block, s->nblock);
}

int shim_select_tap(const char *path, int64_t step, int64_t branch, int64_t block)
{
    int any = 0;
    atomic_fetch_add_explicit(&shim_cfg.selections[0], 1, memory_order_relaxed);
    raise_to(&step_max, step);
    raise_to(&block_max, block);
    for (size_t i = 0; i < shim_cfg.nglobs; ++i) {
        const struct shim_select *s = &shim_cfg.sel[i];
        if (glob_matches(shim_cfg.globs[i], path) && selectors_hold(s, step, branch, block)) {
            atomic_fetch_add_explicit(&shim_cfg.item_hits[i], 1, memory_order_relaxed);
            any = 1;
        }
    }
    return any;
}

void shim_select_items_json(struct shim_json *b)
{
    const int warn = 1;
    if (!getenv("PROBE_CAPTURE") || shim_cfg.nglobs == 0)
        return;
    shim_json_raw(b, ",\"capture_items\":[");
    for (size_t i = 0; i < shim_cfg.nglobs; ++i) {
        const char *item = shim_cfg.items[i] ? shim_cfg.items[i] : shim_cfg.globs[i];
        unsigned long long n = atomic_load(&shim_cfg.item_hits[i]);
        shim_json_printf(b, "%s{\"item\":", i ? "," : "");
        shim_json_string(b, item);
        shim_json_printf(b, ",\"matched\":%llu}", n);
        const char *g = shim_cfg.globs[i];
        int kind = strstr(g, "gemm") ? 1 + SHIM_COUNT_GEMM : strstr(g, "nccl") ? 1 + SHIM_COUNT_NCCL : 0;
        unsigned long long offered = atomic_load(&shim_cfg.selections[kind]);
        unsigned long long any = atomic_load(&shim_cfg.selections[0]) +
                                 atomic_load(&shim_cfg.selections[1 + SHIM_COUNT_GEMM]) +
                                 atomic_load(&shim_cfg.selections[1 + SHIM_COUNT_NCCL]);
        /* nothing offered at all: a launcher or a process that only forwarded */
        if (!warn || n != 0 || any == 0 || (kind == 0 && offered == 0))
            continue;
        if (offered == 0) {
            shim_warn("--capture item '%s' matched no tensor: this process offered no %s operand "
                      "for selection (no %s call that probe hooks and can decode, e.g. a CPU "
                      "run; manifest %s)", item,
                      kind == 1 + SHIM_COUNT_GEMM ? "GEMM" : "NCCL",
                      kind == 1 + SHIM_COUNT_GEMM ? "cuBLAS/cuBLASLt GEMM" : "NCCL collective",
                      kind == 1 + SHIM_COUNT_GEMM ? "gemm" : "nccl");
        } else if (kind == 0) {
            char names[256];
            shim_scope_names(names, sizeof names);
            long long smax = atomic_load(&step_max), bmax = atomic_load(&block_max);
            char steps[96] = "";
            int n = 0;
            if (smax >= 0)
                n = snprintf(steps, sizeof steps, "; denoising steps 0-%lld", smax);
            if (bmax >= 0 && n >= 0 && (size_t)n < sizeof steps)
                snprintf(steps + n, sizeof steps - (size_t)n, "; block indices 0-%lld", bmax);
            shim_warn("--capture item '%s' matched no tensor in this run (paths are "
                      "/<component>/<call:04>/<slot>; components: %s%s)",
                      item, names[0] ? names : "none announced", steps);
        } else {
            shim_warn("--capture item '%s' matched no tensor in this run (operand paths are "
                      "/<component>/<call:04>/%s.<k:04>.%s)", item,
                      kind == 1 + SHIM_COUNT_GEMM ? "gemm" : "nccl",
                      kind == 1 + SHIM_COUNT_GEMM ? "<a|b|c|bias|out>" : "<op>.<in|out>");
        }
    }
    shim_json_raw(b, "]");
}

/* path with the index of its last component's "<family>.<digits>." written
 * "<family>.last." into buf; 0 when that component does not start so. */
static int last_alias(const char *path, const char *family, char *buf, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t fl = strlen(family), d = 0;
    if (strncmp(base, family, fl) != 0 || base[fl] != '.')
        return 0;
    const char *digits = base + fl + 1;
    while (digits[d] >= '0' && digits[d] <= '9')
        ++d;
    if (d == 0 || digits[d] != '.')
        return 0;
    int n = snprintf(buf, cap, "%.*s.last%s", (int)(digits - 1 - path), path, digits + d);
    return n > 0 && (size_t)n < cap;
}

int shim_select_interposed(const char *path, int64_t step, int64_t branch, int64_t block,
                                 const char *family, int may_be_last)
{
    char alias[SHIM_PATH_MAX];
    int have_alias = -1; /* not built yet */
    int any = 0;
    int kind = strcmp(family, "nccl") == 0 ? SHIM_COUNT_NCCL : SHIM_COUNT_GEMM, bit = 1 << kind;
    atomic_fetch_add_explicit(&shim_cfg.selections[1 + kind], 1, memory_order_relaxed);
    for (size_t i = 0; i < shim_cfg.nglobs; ++i) {
        const char *g = shim_cfg.globs[i];
        const struct shim_select *s = &shim_cfg.sel[i];
        if (!strstr(g, family))
            continue;
        const char *p = path;
        if (s->last & bit) {
            if (!may_be_last)
                continue;
            if (have_alias < 0)
                have_alias = last_alias(path, family, alias, sizeof alias);
            if (!have_alias)
                continue;
            p = alias;
        }
        if ((fnmatch(g, p, 0) == 0 || (g[0] != '/' && fnmatch(g, p + 1, 0) == 0)) &&
            selectors_hold(s, step, branch, block)) {
            atomic_fetch_add_explicit(&shim_cfg.item_hits[i], 1, memory_order_relaxed);
            any = 1;
        }
    }
    return any;
}

