/* tap.c - the tap ABI (probe/tap.h): descriptor validation, dataset paths,
 * the PROBE_CAPTURE filter, and dispatch of host and device tensors to the
 * writer queue. */
#include <fnmatch.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

char *shim_trim_spaces(char *s)
{
    while (*s == ' ')
        ++s;
    size_t len = strlen(s);
    while (len && s[len - 1] == ' ')
        s[--len] = '\0';
    return s;
}

static atomic_ullong next_seq;
static atomic_int warned_foreign;
static atomic_int cuda_info_taken;

/* 1: go on capturing; 0: this process does not capture (the tap returns 0). */
static int this_process_captures(void)
{
    if (shim_cfg.mode == SHIM_INACTIVE)
        return 0;
    shim_claim();
    if (shim_is_foreign_process()) {
        const char *why = shim_claim_lost_reason();
        if (*why && atomic_exchange(&warned_foreign, 1) == 0)
            shim_warn("pid %ld does not capture: %s", (long)getpid(), why);
        return 0;
    }
    return 1;
}

int shim_tap_process_captures(void)
{
    return this_process_captures();
}

/* component / slot: 1..127 bytes, no '/', no control characters, not "."
 * or ".." (each becomes one HDF5 path element). */
static probe_status check_name(const char *s, const char *what)
{
    if (!s)
        return probe_set_error(PROBE_EINVAL, "tap: %s is NULL", what);
    size_t n = strlen(s);
    if (n == 0 || n >= SHIM_NAME_MAX)
        return probe_set_error(PROBE_EINVAL, "tap: %s must be 1..%d bytes long (got %zu)", what,
                               SHIM_NAME_MAX - 1, n);
    if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return probe_set_error(PROBE_EINVAL, "tap: %s '%s' is not a valid path element", what, s);
    for (const unsigned char *c = (const unsigned char *)s; *c; ++c) {
        if (*c == '/')
            return probe_set_error(PROBE_EINVAL, "tap: %s '%s' contains '/'", what, s);
        if (*c < 0x20 || *c == 0x7f)
            return probe_set_error(PROBE_EINVAL, "tap: %s contains a control character", what);
    }
    return PROBE_OK;
}

/* 1 when the caller's struct_size covers the descriptor's field. */
#define TAP_HAS(t, field)                                                                       \
    ((t)->struct_size >= offsetof(probe_tap_tensor_v1, field) + sizeof((t)->field))

const char *shim_tap_parent(const probe_tap_tensor_v1 *t)
{
    return TAP_HAS(t, parent) && TAP_HAS(t, block) && t->parent && t->parent[0] ? t->parent : NULL;
}

int64_t shim_tap_block(const probe_tap_tensor_v1 *t)
{
    return shim_tap_parent(t) ? t->block : -1;
}

const char *shim_tap_class(const probe_tap_tensor_v1 *t)
{
    return TAP_HAS(t, class_name) && t->class_name && t->class_name[0] ? t->class_name : NULL;
}

const char *shim_tap_module(const probe_tap_tensor_v1 *t)
{
    return TAP_HAS(t, module) && t->module && t->module[0] ? t->module : NULL;
}

/* parent ("/<component>/<call>", 1..255 bytes), class name and module path
 * (1..255 bytes): no control characters. */
static probe_status check_text(const char *s, const char *what, int path)
{
    size_t n = strlen(s);
    if (n >= SHIM_PARENT_MAX)
        return probe_set_error(PROBE_EINVAL, "tap: %s must be at most %d bytes long (got %zu)", what,
                               SHIM_PARENT_MAX - 1, n);
    if (path && s[0] != '/')
        return probe_set_error(PROBE_EINVAL, "tap: %s '%s' does not start with '/'", what, s);
    for (const unsigned char *c = (const unsigned char *)s; *c; ++c)
        if (*c < 0x20 || *c == 0x7f)
            return probe_set_error(PROBE_EINVAL, "tap: %s contains a control character", what);
    return PROBE_OK;
}

probe_status shim_tap_validate(const probe_tap_tensor_v1 *t, struct shim_extent *ext)
{
    if (!t)
        return probe_set_error(PROBE_EINVAL, "tap: descriptor is NULL");
    if (t->struct_size < PROBE_TAP_TENSOR_V1_BASE_SIZE)
        return probe_set_error(PROBE_EINVAL, "tap: struct_size %u is smaller than the v1 size %zu",
                               t->struct_size, (size_t)PROBE_TAP_TENSOR_V1_BASE_SIZE);
    if (t->abi_version != PROBE_TAP_ABI_VERSION)
        return probe_set_error(PROBE_EINVAL, "tap: abi_version %u is not %d", t->abi_version,
                               PROBE_TAP_ABI_VERSION);
    probe_status st;
    if ((st = check_name(t->component, "component")) != PROBE_OK ||
        (st = check_name(t->slot, "slot")) != PROBE_OK)
        return st;
    if (t->call < 0)
        return probe_set_error(PROBE_EINVAL, "tap: call %lld is negative", (long long)t->call);
    const char *parent = shim_tap_parent(t), *cls = shim_tap_class(t);
    if (parent && (st = check_text(parent, "parent", 1)) != PROBE_OK)
        return st;
    if (parent && t->block < 0)
        return probe_set_error(PROBE_EINVAL, "tap: block %lld is negative for a nested call (parent %s)",
                               (long long)t->block, parent);
    if (cls && (st = check_text(cls, "class_name", 0)) != PROBE_OK)
        return st;
    const char *mod = shim_tap_module(t);
    if (mod && (st = check_text(mod, "module", 0)) != PROBE_OK)
        return st;
    if (t->rank < 0 || t->rank > PROBE_MAX_RANK)
        return probe_set_error(PROBE_EINVAL, "tap: rank %d is outside 0..%d", t->rank, PROBE_MAX_RANK);
    size_t esize = probe_dtype_size((probe_dtype)t->dtype);
    if (esize == 0)
        return probe_set_error(PROBE_EINVAL, "tap: dtype %d is not a probe_dtype", t->dtype);
    if (t->device < -1)
        return probe_set_error(PROBE_EINVAL, "tap: device %d is neither -1 (host) nor a CUDA ordinal",
                               t->device);
    if (t->rank > 0 && !t->shape)
        return probe_set_error(PROBE_EINVAL, "tap: shape is NULL for rank %d", t->rank);
    if ((st = shim_extent_of(t->rank, t->shape, t->strides, esize, ext)) != PROBE_OK)
        return st;
    if (ext->n > 0 && !t->data)
        return probe_set_error(PROBE_EINVAL, "tap: data is NULL for %llu elements",
                               (unsigned long long)ext->n);
    return PROBE_OK;
}

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

void shim_capture_config(const char *spec)
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

void shim_stats_for_config(const char *spec)
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

int shim_stats_for_selected(const char *path, int64_t step, int64_t branch, int64_t block)
{
    for (size_t i = 0; i < stats_for.n; ++i)
        if (glob_matches(stats_for.globs[i], path) &&
            selectors_hold(&stats_for.sel[i], step, branch, block))
            return 1;
    return 0;
}

int shim_stats_for_count(void)
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
 * item's count says whether it selected anything (shim_capture_items_json). */
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

static int selected(const char *path, int64_t step, int64_t branch, int64_t block)
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

void shim_capture_items_json(struct shim_json *b, int warn)
{
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

static void fill_record(struct shim_job *j, const probe_tap_tensor_v1 *t, const char *path)
{
    snprintf(j->path, sizeof j->path, "%s", path);
    snprintf(j->component, sizeof j->component, "%s", t->component);
    snprintf(j->slot, sizeof j->slot, "%s", t->slot);
    shim_nvtx_scope(j->scope, sizeof j->scope);
    if (t->device < 0)
        snprintf(j->device_name, sizeof j->device_name, "cpu");
    else
        snprintf(j->device_name, sizeof j->device_name, "cuda:%d", t->device);
    j->call = t->call;
    j->step = t->step;
    j->cfg_branch = t->cfg_branch;
    j->timestep = t->timestep;
    const char *parent = shim_tap_parent(t), *cls = shim_tap_class(t);
    snprintf(j->parent, sizeof j->parent, "%s", parent ? parent : "");
    j->block = shim_tap_block(t);
    snprintf(j->class_name, sizeof j->class_name, "%s", cls ? cls : "");
    const char *mod = shim_tap_module(t);
    snprintf(j->module, sizeof j->module, "%s", mod ? mod : "");
    j->dtype = (probe_dtype)t->dtype;
    j->rank = t->rank;
    for (int k = 0; k < t->rank; ++k)
        j->shape[k] = t->shape[k];
    j->seq = shim_exec_seq(atomic_fetch_add(&next_seq, 1));
}

/* Capture one tensor (probe/tap.h). Returns PROBE_OK (0) when the tensor was
 * queued, recorded as skipped, filtered out by PROBE_CAPTURE, or when this
 * process does not capture (PROBE_OUT unset; not the owner: one `probe:`
 * line the first time). Errors: PROBE_EINVAL bad descriptor or a path
 * already captured (message says which field); PROBE_EIO capture disabled
 * after a write error; PROBE_ESTATE after the file was closed at exit;
 * PROBE_ENOMEM. Host data is gathered into a contiguous copy before
 * returning; device data is copied asynchronously (cuda.c). */
SHIM_EXPORT int probe_tap_v1(const probe_tap_tensor_v1 *t)
{
    shim_procs_abi_used();
    return shim_tap_capture(t, NULL, 1);
}

void shim_tap_operand(probe_tap_tensor_v1 *t, const char *component, const char *slot,
                      int64_t call, int64_t step, int32_t cfg_branch, int device, int32_t dtype,
                      int32_t rank, const int64_t *shape, const int64_t *strides, const void *data,
                      void *stream)
{
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
    t->abi_version = PROBE_TAP_ABI_VERSION;
    t->component = component;
    t->slot = slot;
    t->call = call;
    t->step = step;
    t->cfg_branch = cfg_branch;
    t->device = device;
    t->dtype = dtype;
    t->rank = rank;
    t->shape = shape;
    t->strides = strides;
    t->data = data;
    t->stream = stream;
    t->timestep = NAN;
    t->parent = NULL;
    t->block = -1;
    t->class_name = NULL;
    t->module = NULL;
}

void shim_tap_operand_nesting(probe_tap_tensor_v1 *t, const struct shim_scope *sc)
{
    if (sc && sc->parent[0] && sc->block >= 0) {
        t->parent = sc->parent;
        t->block = sc->block;
    }
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

int shim_tap_selected_interposed(const char *path, int64_t step, int64_t branch, int64_t block,
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

probe_status shim_tap_hash_device(const probe_tap_tensor_v1 *t, size_t slot)
{
    if (!this_process_captures())
        return PROBE_ESTATE;
    struct shim_extent ext;
    probe_status st = shim_tap_validate(t, &ext);
    if (st != PROBE_OK)
        return st;
    if (t->device < 0 || ext.n == 0)
        return probe_set_error(PROBE_EINVAL, "tap: hash-only capture needs a non-empty device tensor");
    if (shim_closed() || shim_disabled())
        return probe_set_error(PROBE_ESTATE, "tap: capture is closed or disabled");
    if ((st = shim_file_open()) != PROBE_OK)
        return st;
    probe_tap_tensor_v1 renumbered;
    char parent[SHIM_PARENT_MAX];
    t = shim_exec_call(t, &renumbered, parent, sizeof parent); /* exits.c */
    struct shim_job *j = calloc(1, sizeof *j);
    if (!j)
        return probe_set_error(PROBE_ENOMEM, "tap: out of memory");
    char path[SHIM_PATH_MAX];
    snprintf(path, sizeof path, "/%s/%04lld/%s", t->component, (long long)t->call, t->slot);
    fill_record(j, t, path);
    j->nbytes = ext.nbytes;
    j->hash_only = 1;
    j->hash_slot = slot;
    j->dev.has_strides = t->strides && !ext.contiguous;
    for (int k = 0; j->dev.has_strides && k < t->rank; ++k)
        j->dev.strides[k] = t->strides[k];
    if (atomic_exchange(&cuda_info_taken, 1) == 0) {
        shim_cuda_info_refresh();
        shim_exit_after_cuda();
    }
    int queued = 0;
    st = shim_cuda_capture(j, t->data, ext.span_bytes, t->device, t->stream, &queued);
    if (queued)
        return PROBE_OK;
    free(j->dev.pieces);
    free(j);
    return st != PROBE_OK ? st : probe_set_error(PROBE_ESTATE, "tap: hash-only capture skipped");
}

probe_status shim_tap_capture(const probe_tap_tensor_v1 *t, const char *op_json, int select)
{
    if (!this_process_captures())
        return PROBE_OK;
    struct shim_extent ext;
    probe_status st = shim_tap_validate(t, &ext);
    if (st != PROBE_OK)
        return st;
    if (shim_closed())
        return probe_set_error(PROBE_ESTATE, "tap: the capture file is already closed");
    int was_disabled = shim_disabled();
    if (!was_disabled && (st = shim_file_open()) != PROBE_OK)
        return st;
    probe_tap_tensor_v1 renumbered;
    char parent[SHIM_PARENT_MAX];
    t = shim_exec_call(t, &renumbered, parent, sizeof parent); /* exits.c: exec continuation */

    char path[SHIM_PATH_MAX];
    snprintf(path, sizeof path, "/%s/%04lld/%s", t->component, (long long)t->call, t->slot);
    if (select && !selected(path, t->step, t->cfg_branch, shim_tap_block(t))) {
        atomic_fetch_add(&shim_stats.filtered, 1);
        return PROBE_OK;
    }
    if (was_disabled) {
        shim_lost_note(path, 1); /* queue.c: in the manifest's "lost" */
        return probe_set_error(PROBE_EIO, "tap: capture disabled after a write error");
    }
    int ins = shim_pathset_insert(path);
    if (ins < 0)
        return probe_set_error(PROBE_ENOMEM, "tap: out of memory");
    if (ins == 0)
        return probe_set_error(PROBE_EINVAL, "tap: %s was already captured in this run", path);

    struct shim_job *j = calloc(1, sizeof *j);
    if (!j) {
        shim_pathset_remove(path);
        return probe_set_error(PROBE_ENOMEM, "tap: out of memory");
    }
    fill_record(j, t, path);
    shim_exits_note_tapped(path); /* exits.c: a kill now names it as lost */
    j->nbytes = ext.nbytes;
    if (op_json && !(j->op = strdup(op_json))) {
        st = probe_set_error(PROBE_ENOMEM, "tap: out of memory");
        goto fail;
    }

    if (ext.n == 0 || t->device < 0) {
        j->kind = SHIM_JOB_HOST;
        if (ext.nbytes > 0) {
            if ((st = shim_queue_reserve(ext.nbytes)) != PROBE_OK)
                goto fail;
            j->reserved = ext.nbytes;
            j->data = malloc(ext.nbytes);
            if (!j->data) {
                st = probe_set_error(PROBE_ENOMEM, "tap: cannot allocate %zu bytes for %s",
                                     ext.nbytes, path);
                goto fail;
            }
            shim_gather(j->data, t->data, t->rank, t->shape, t->strides,
                        probe_dtype_size(j->dtype));
        }
    } else {
        int queued = 0;
        j->dev.has_strides = t->strides && !ext.contiguous;
        for (int k = 0; j->dev.has_strides && k < t->rank; ++k)
            j->dev.strides[k] = t->strides[k];
        if (atomic_exchange(&cuda_info_taken, 1) == 0) {
            shim_cuda_info_refresh();
            shim_exit_after_cuda();
        }
        /* Queues the job itself once its first piece is enqueued (after
         * that, j belongs to the writer thread). */
        st = shim_cuda_capture(j, t->data, ext.span_bytes, t->device, t->stream, &queued);
        if (queued) {
            atomic_fetch_add(&shim_stats.accepted, 1);
            return PROBE_OK;
        }
        free(j->dev.pieces);
        j->dev.pieces = NULL;
        if (st != PROBE_OK)
            goto fail;
        j->nbytes = 0; /* j->kind is SHIM_JOB_SKIP, j->reason says why */
    }
    enum shim_job_kind kind = j->kind;
    if ((st = shim_queue_push(j)) != PROBE_OK)
        goto fail;
    if (kind == SHIM_JOB_SKIP)
        atomic_fetch_add(&shim_stats.skipped, 1);
    else
        atomic_fetch_add(&shim_stats.accepted, 1);
    return PROBE_OK;

fail:
    if (j->reserved)
        shim_queue_unreserve(j->reserved);
    free(j->data);
    free(j->op);
    free(j);
    shim_pathset_remove(path);
    return st;
}

void shim_tap_skip_path(const char *path, const char *reason)
{
    if (!shim_capturing() || shim_is_foreign_process() || shim_closed() || !shim_writer())
        return;
    struct shim_job *j = calloc(1, sizeof *j);
    if (!j)
        return;
    j->kind = SHIM_JOB_SKIP;
    snprintf(j->path, sizeof j->path, "%s", path);
    /* "/<component>/<call>/<slot>": the record's fields, for the writer */
    const char *c = path[0] == '/' ? path + 1 : path, *e = strchr(c, '/');
    snprintf(j->component, sizeof j->component, "%.*s", e ? (int)(e - c) : (int)strlen(c), c);
    const char *slot = strrchr(path, '/');
    snprintf(j->slot, sizeof j->slot, "%s", slot ? slot + 1 : path);
    snprintf(j->device_name, sizeof j->device_name, "cuda");
    j->call = e ? strtoll(e + 1, NULL, 10) : -1;
    j->step = -1;
    j->cfg_branch = -1;
    j->timestep = NAN;
    j->block = -1;
    j->seq = shim_exec_seq(atomic_fetch_add(&next_seq, 1));
    snprintf(j->reason, sizeof j->reason, "%s", reason);
    if (shim_queue_push(j) != PROBE_OK) {
        free(j);
        return;
    }
    atomic_fetch_add(&shim_stats.skipped, 1);
}

/* 1 if this process is capturing (probe/tap.h), else 0. */
SHIM_EXPORT int probe_tap_enabled_v1(void)
{
    shim_procs_abi_used();
    return shim_capturing() && !shim_is_foreign_process();
}

/* Wait until every accepted capture is in the file and flush it
 * (probe/tap.h). Also records CUDA versions/devices for the manifest while
 * the runtime is alive. PROBE_OK when this process does not capture;
 * PROBE_EIO when capture was disabled by a write error; PROBE_ESTATE after
 * the file was closed. */
SHIM_EXPORT int probe_tap_flush_v1(void)
{
    /* A process that never tapped has nothing to flush and must not claim
     * the file (its at-exit flush would take it from the process that taps). */
    if (shim_cfg.mode != SHIM_OWNER || shim_is_foreign_process() || !shim_writer())
        return shim_disabled() && !shim_is_foreign_process()
                   ? probe_set_error(PROBE_EIO, "probe_tap_flush_v1: capture disabled after a write error")
                   : PROBE_OK;
    if (shim_closed())
        return probe_set_error(PROBE_ESTATE, "probe_tap_flush_v1: the capture file is already closed");
    if (shim_disabled())
        return probe_set_error(PROBE_EIO, "probe_tap_flush_v1: capture disabled after a write error");
    probe_status st = shim_file_open();
    if (st != PROBE_OK)
        return st;
    shim_cuda_info_refresh();
    return shim_queue_flush();
}
