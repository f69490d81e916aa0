/* scope.c - component scopes: where an interposed library call happens.
 *
 * A GEMM, a collective or a kernel launch is attributed to the innermost
 * component scope of the thread that issues it. Scopes come from two places:
 *
 *  - the framework adapter announces each component call it wraps
 *    (probe_scope_enter_v1 before the call, probe_scope_exit_v1 after it;
 *    include/probe/tap.h), with the same component, call index, denoising
 *    step and CFG branch its taps carry;
 *  - NVTX ranges that the pipeline itself pushes (TensorRT-LLM VisualGen:
 *    `denoise_step {i}`, `_decode_latents`, ...) and that PROBE_NVTX_SCOPES
 *    maps to components (nvtx.c calls shim_scope_nvtx_enter/exit), so a
 *    pipeline without a Python adapter still gets per-step scopes.
 *
 * Each thread keeps its own stack (bounded depth; deeper frames are counted
 * and ignored). Each frame counts the interposed calls made inside it, per
 * kind, which gives the stable index k of `gemm.<k>` / `nccl.<k>` paths.
 * Outside any scope the counters are process-wide. */
#include <fnmatch.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/shim.h"
#include "capture/scope.h"
#include "probe/tap.h"

#define SCOPE_DEPTH_MAX 32
#define NVTX_MAP_MAX 32

enum { FRAME_ADAPTER = 1, FRAME_NVTX = 2 };

struct frame {
    int kind;
    unsigned token;  /* FRAME_NVTX: matches the NVTX range that opened it */
    struct shim_scope s;
    int64_t count[SHIM_COUNT_KINDS];
};

struct scope_stack {
    int depth;
    int overflow; /* adapter frames beyond SCOPE_DEPTH_MAX, not stored */
    struct frame f[SCOPE_DEPTH_MAX];
};

static __thread struct scope_stack tls_scopes;
static atomic_llong unscoped[SHIM_COUNT_KINDS];
static atomic_uint next_token = 1;

/* PROBE_NVTX_SCOPES: COMPONENT=GLOB items. Several items may name the same
 * component; they share its call counter (slot). */
struct nvtx_map {
    char *component;
    char *glob;
    int slot; /* index of the first item with this component */
};
static struct nvtx_map maps[NVTX_MAP_MAX];
static size_t nmaps;
static atomic_llong nvtx_calls[NVTX_MAP_MAX];
static char *nvtx_spec;   /* the spec in effect (for the manifest) */
static char *nvtx_error;  /* why a given spec was refused, else NULL */

/* TensorRT-LLM VisualGen's ranges (docs/intercept.md "Scopes"). */
static const char default_spec[] =
    "denoise.step=denoise_step *,denoise.step=denoise_step_*,text_encoder=_encode_prompt,"
    "latents.prepare=_prepare_latents,scheduler.step=_scheduler_step,vae.decode=_decode_latents";

static int valid_component(const char *s, size_t n)
{
    if (n == 0 || n >= SHIM_NAME_MAX || (n == 1 && s[0] == '.') ||
        (n == 2 && s[0] == '.' && s[1] == '.'))
        return 0;
    for (size_t i = 0; i < n; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (c == '/' || c < 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

static void maps_clear(void)
{
    for (size_t i = 0; i < nmaps; ++i) {
        free(maps[i].component);
        free(maps[i].glob);
    }
    nmaps = 0;
}

/* Parse spec into maps; on error fill err and leave no map. */
static int parse_spec(const char *spec, char *err, size_t errlen)
{
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            ++a;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            --b;
        if (a < b) {
            const char *eq = memchr(a, '=', (size_t)(b - a));
            if (!eq || eq == a || eq + 1 == b) {
                snprintf(err, errlen, "item '%.*s' is not COMPONENT=GLOB", (int)(b - a), a);
                goto bad;
            }
            if (!valid_component(a, (size_t)(eq - a))) {
                snprintf(err, errlen, "item '%.*s': component '%.*s' is not a valid name "
                         "(1..127 bytes, no '/', no control characters)",
                         (int)(b - a), a, (int)(eq - a), a);
                goto bad;
            }
            if (nmaps == NVTX_MAP_MAX) {
                snprintf(err, errlen, "more than %d items", NVTX_MAP_MAX);
                goto bad;
            }
            struct nvtx_map *m = &maps[nmaps];
            m->component = strndup(a, (size_t)(eq - a));
            m->glob = strndup(eq + 1, (size_t)(b - eq - 1));
            if (!m->component || !m->glob) {
                free(m->component);
                free(m->glob);
                snprintf(err, errlen, "out of memory");
                goto bad;
            }
            m->slot = (int)nmaps;
            for (size_t i = 0; i < nmaps; ++i)
                if (strcmp(maps[i].component, m->component) == 0) {
                    m->slot = maps[i].slot;
                    break;
                }
            ++nmaps;
        }
        p = *end ? end + 1 : end;
    }
    return 0;
bad:
    maps_clear();
    return -1;
}

void shim_scope_config(void)
{
    const char *v = getenv("PROBE_NVTX_SCOPES");
    const char *spec = v ? v : default_spec;
    if (v && (strcmp(v, "0") == 0 || v[0] == '\0'))
        spec = "";
    char err[256];
    if (parse_spec(spec, err, sizeof err) != 0) {
        shim_warn("PROBE_NVTX_SCOPES='%s': %s; no NVTX range is a component scope", spec, err);
        nvtx_error = strdup(err);
        spec = "";
    }
    nvtx_spec = strdup(spec);
}

/* The step a range name carries: its trailing decimal number
 * ("denoise_step 12" -> 12), else -1. */
static int64_t trailing_number(const char *name)
{
    size_t n = strlen(name), i = n;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
        --i;
    if (i == n || n - i > 9)
        return -1;
    return strtoll(name + i, NULL, 10);
}

/* `gemm.last` / `nccl.last` (PROBE_CAPTURE, docs/gemm.md "Selection"):
 * per component and kind, how many calls its latest completed instance
 * made. A frame takes a snapshot when it opens (shim_scope.last_n, so the
 * hooks read it without a lock) and reports its own count when it closes.
 * Kept only when an item names `.last`; a small table under a lock, taken
 * twice per component call. */
#define LAST_NAMES_MAX 64
#define LAST_MISMATCH_KEPT 16
struct last_entry {
    char name[SHIM_NAME_MAX];
    long long first_call;               /* call of the first instance (captured whole) */
    long long n[SHIM_COUNT_KINDS];      /* latest completed instance's count, -1 none */
    long long instances;                /* completed instances */
    long long mismatched[SHIM_COUNT_KINDS];
    long long mismatch_calls[SHIM_COUNT_KINDS][LAST_MISMATCH_KEPT];
};
static struct last_entry last_table[LAST_NAMES_MAX];
static size_t nlast;
static long long last_overflow; /* components beyond the table: .last never applies */
static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;

static struct last_entry *last_find(const char *component, int create)
{
    for (size_t i = 0; i < nlast; ++i)
        if (strcmp(last_table[i].name, component) == 0)
            return &last_table[i];
    if (!create)
        return NULL;
    if (nlast == LAST_NAMES_MAX) {
        ++last_overflow;
        return NULL;
    }
    struct last_entry *e = &last_table[nlast++];
    snprintf(e->name, sizeof e->name, "%s", component);
    e->first_call = -1;
    for (int k = 0; k < SHIM_COUNT_KINDS; ++k)
        e->n[k] = -1;
    return e;
}

/* A frame opens: snapshot the learned counts into f->s.last_n. */
static void last_open(struct frame *f)
{
    for (int k = 0; k < SHIM_COUNT_KINDS; ++k)
        f->s.last_n[k] = -1;
    if (!shim_cfg.last_kinds)
        return;
    pthread_mutex_lock(&last_lock);
    struct last_entry *e = last_find(f->s.component, 1);
    if (e) {
        for (int k = 0; k < SHIM_COUNT_KINDS; ++k)
            f->s.last_n[k] = e->n[k];
        if (e->first_call < 0)
            e->first_call = f->s.call;
    } else {
        for (int k = 0; k < SHIM_COUNT_KINDS; ++k)
            f->s.last_n[k] = -2; /* untracked component: .last never applies */
    }
    pthread_mutex_unlock(&last_lock);
}

/* A frame closes: its counts become the component's, and an instance whose
 * count differs from the snapshot it was selected by is recorded (what was
 * captured as its `.last` was not its last call, or nothing was). */
static void last_close(const struct frame *f)
{
    if (!shim_cfg.last_kinds)
        return;
    static const char *const kind_name[SHIM_COUNT_KINDS] = {"GEMM", "NCCL call", "", ""};
    int warn_kind = -1;
    long long warn_was = 0;
    pthread_mutex_lock(&last_lock);
    struct last_entry *e = last_find(f->s.component, 0);
    if (e) {
        ++e->instances;
        for (int k = 0; k < SHIM_COUNT_KINDS; ++k) {
            if (!(shim_cfg.last_kinds & (1 << k)))
                continue;
            long long was = f->s.last_n[k], now = f->count[k];
            if (was >= 0 && was != now) {
                if (e->mismatched[k] < LAST_MISMATCH_KEPT)
                    e->mismatch_calls[k][e->mismatched[k]] = f->s.call;
                if (e->mismatched[k]++ == 0) {
                    warn_kind = k;
                    warn_was = was;
                }
            }
            e->n[k] = now;
        }
    }
    pthread_mutex_unlock(&last_lock);
    if (warn_kind >= 0)
        shim_warn("capture '%s.last': %s call %lld made %lld %ss, the instance before it %lld, so "
                  "its last was not the one selected (manifest capture_last lists such calls)",
                  warn_kind == SHIM_COUNT_NCCL ? "nccl" : "gemm", f->s.component,
                  (long long)f->s.call, (long long)f->count[warn_kind], kind_name[warn_kind],
                  warn_was);
}

int shim_scope_may_be_last(const struct shim_scope *sc, int kind, int64_t k)
{
    if (kind < 0 || kind >= SHIM_COUNT_KINDS || !(shim_cfg.last_kinds & (1 << kind)) ||
        sc->component[0] == '\0')
        return 0;
    int64_t n = sc->last_n[kind];
    return n == -1 || (n > 0 && k == n - 1);
}

static struct frame *push_frame(int kind)
{
    struct scope_stack *st = &tls_scopes;
    if (st->depth >= SCOPE_DEPTH_MAX)
        return NULL;
    struct frame *f = &st->f[st->depth++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    return f;
}

static void remove_frame(int i)
{
    struct scope_stack *st = &tls_scopes;
    last_close(&st->f[i]);
    memmove(&st->f[i], &st->f[i + 1], (size_t)(st->depth - 1 - i) * sizeof st->f[0]);
    --st->depth;
}

unsigned shim_scope_nvtx_enter(const char *range_name)
{
    if (shim_cfg.mode != SHIM_OWNER || !range_name)
        return 0;
    for (size_t i = 0; i < nmaps; ++i) {
        if (fnmatch(maps[i].glob, range_name, 0) != 0)
            continue;
        struct frame *f = push_frame(FRAME_NVTX);
        if (!f)
            return 0;
        f->token = atomic_fetch_add(&next_token, 1);
        if (f->token == 0) /* wrapped: 0 means "no scope" */
            f->token = atomic_fetch_add(&next_token, 1);
        snprintf(f->s.component, sizeof f->s.component, "%s", maps[i].component);
        f->s.call = atomic_fetch_add(&nvtx_calls[maps[i].slot], 1);
        f->s.step = trailing_number(range_name);
        f->s.cfg_branch = -1;
        f->s.block = -1;
        last_open(f);
        return f->token;
    }
    return 0;
}

void shim_scope_nvtx_exit(unsigned token)
{
    struct scope_stack *st = &tls_scopes;
    if (token == 0)
        return;
    for (int i = st->depth - 1; i >= 0; --i)
        if (st->f[i].kind == FRAME_NVTX && st->f[i].token == token) {
            remove_frame(i);
            return;
        }
}

/* Adapter scopes opened per component (manifest "nvtx_scopes" sibling
 * "scopes"): a small table under a lock, taken once per component call. */
#define ADAPTER_NAMES_MAX 64
static struct {
    char name[SHIM_NAME_MAX];
    long long n;
} adapter_counts[ADAPTER_NAMES_MAX];
static size_t nadapter;
static long long adapter_overflow;
static pthread_mutex_t adapter_lock = PTHREAD_MUTEX_INITIALIZER;

static void count_adapter_scope(const char *component)
{
    pthread_mutex_lock(&adapter_lock);
    size_t i = 0;
    while (i < nadapter && strcmp(adapter_counts[i].name, component) != 0)
        ++i;
    if (i == nadapter && nadapter < ADAPTER_NAMES_MAX)
        snprintf(adapter_counts[nadapter++].name, SHIM_NAME_MAX, "%s", component);
    if (i < nadapter)
        ++adapter_counts[i].n;
    else
        ++adapter_overflow;
    pthread_mutex_unlock(&adapter_lock);
}

void shim_scope_names(char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    pthread_mutex_lock(&adapter_lock);
    for (size_t i = 0; i < nadapter && used < cap; ++i) {
        int n = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", adapter_counts[i].name);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    pthread_mutex_unlock(&adapter_lock);
}

/* 1 when the caller's struct_size covers the descriptor's field. */
#define SCOPE_HAS(s, field) ((s)->struct_size >= offsetof(probe_scope_v1, field) + sizeof((s)->field))

/* A parent call as the tap ABI takes it: '/' first, 1..255 bytes, no
 * control characters. A scope with any other parent is not nested. */
static int valid_parent(const char *p)
{
    size_t n = strlen(p);
    if (p[0] != '/' || n >= SHIM_PARENT_MAX)
        return 0;
    for (; *p; ++p)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return 0;
    return 1;
}

/* Announce a component call on the calling thread (probe/tap.h). */
SHIM_EXPORT int probe_scope_enter_v1(const probe_scope_v1 *s)
{
    if (!s || s->struct_size < offsetof(probe_scope_v1, cfg_branch) + sizeof s->cfg_branch)
        return probe_set_error(PROBE_EINVAL, "scope: NULL descriptor or struct_size too small");
    if (s->abi_version != PROBE_TAP_ABI_VERSION)
        return probe_set_error(PROBE_EINVAL, "scope: abi_version %u is not %d", s->abi_version,
                               PROBE_TAP_ABI_VERSION);
    if (!s->component || !valid_component(s->component, strlen(s->component)))
        return probe_set_error(PROBE_EINVAL, "scope: component must be 1..127 bytes, no '/', "
                               "no control characters");
    if (s->call < 0)
        return probe_set_error(PROBE_EINVAL, "scope: call must be >= 0");
    if (shim_cfg.mode != SHIM_OWNER)
        return PROBE_OK;
    count_adapter_scope(s->component);
    struct frame *f = push_frame(FRAME_ADAPTER);
    if (!f) {
        ++tls_scopes.overflow;
        return PROBE_OK;
    }
    snprintf(f->s.component, sizeof f->s.component, "%s", s->component);
    f->s.call = s->call;
    f->s.step = s->step < 0 ? -1 : s->step;
    f->s.cfg_branch = s->cfg_branch < 0 ? -1 : s->cfg_branch;
    f->s.block = -1;
    if (SCOPE_HAS(s, parent) && SCOPE_HAS(s, block) && s->parent && s->parent[0] &&
        s->block >= 0 && valid_parent(s->parent)) {
        snprintf(f->s.parent, sizeof f->s.parent, "%s", s->parent);
        f->s.block = s->block;
    }
    /* a scope that does not know its step (a DiT block inside a DiT call)
     * takes the enclosing scope's step and branch */
    if (tls_scopes.depth >= 2) {
        const struct shim_scope *up = &tls_scopes.f[tls_scopes.depth - 2].s;
        if (f->s.step < 0)
            f->s.step = up->step;
        if (f->s.cfg_branch < 0)
            f->s.cfg_branch = up->cfg_branch;
    }
    last_open(f);
    return PROBE_OK;
}

/* Close the calling thread's innermost adapter scope (probe/tap.h). */
SHIM_EXPORT int probe_scope_exit_v1(void)
{
    struct scope_stack *st = &tls_scopes;
    if (shim_cfg.mode != SHIM_OWNER)
        return PROBE_OK;
    if (st->overflow > 0) {
        --st->overflow;
        return PROBE_OK;
    }
    for (int i = st->depth - 1; i >= 0; --i)
        if (st->f[i].kind == FRAME_ADAPTER) {
            remove_frame(i);
            return PROBE_OK;
        }
    return probe_set_error(PROBE_ESTATE, "scope: probe_scope_exit_v1 without a matching enter");
}

int shim_scope_current(struct shim_scope *out)
{
    struct scope_stack *st = &tls_scopes;
    if (st->depth == 0) {
        out->component[0] = '\0';
        out->parent[0] = '\0';
        out->call = out->step = out->block = -1;
        out->cfg_branch = -1;
        return 0;
    }
    *out = st->f[st->depth - 1].s;
    return 1;
}

int64_t shim_scope_next(int kind)
{
    if (kind < 0 || kind >= SHIM_COUNT_KINDS)
        return -1;
    struct scope_stack *st = &tls_scopes;
    if (st->depth == 0)
        return atomic_fetch_add(&unscoped[kind], 1);
    return st->f[st->depth - 1].count[kind]++;
}

/* ,"capture_last":{component:{"instances":N,"first_call":C,
 *   "gemm":{"n":N,"mismatched":M,"mismatched_calls":[...]}, "nccl":{...}}} */
static void last_json(struct shim_json *b)
{
    static const char *const fam[SHIM_COUNT_KINDS] = {"gemm", "nccl", NULL, NULL};
    shim_json_raw(b, ",\"capture_last\":{");
    pthread_mutex_lock(&last_lock);
    for (size_t i = 0; i < nlast; ++i) {
        const struct last_entry *e = &last_table[i];
        if (i)
            shim_json_raw(b, ",");
        shim_json_string(b, e->name);
        shim_json_printf(b, ":{\"instances\":%lld,\"first_call\":%lld", e->instances,
                         e->first_call);
        for (int k = 0; k < SHIM_COUNT_KINDS; ++k) {
            if (!fam[k] || !(shim_cfg.last_kinds & (1 << k)))
                continue;
            shim_json_printf(b, ",\"%s\":{\"n\":%lld,\"mismatched\":%lld,\"mismatched_calls\":[",
                             fam[k], e->n[k], e->mismatched[k]);
            long long kept = e->mismatched[k] < LAST_MISMATCH_KEPT ? e->mismatched[k]
                                                                   : LAST_MISMATCH_KEPT;
            for (long long j = 0; j < kept; ++j)
                shim_json_printf(b, "%s%lld", j ? "," : "", e->mismatch_calls[k][j]);
            shim_json_raw(b, "]}");
        }
        shim_json_raw(b, "}");
    }
    if (last_overflow)
        shim_json_printf(b, "%s\"(other components)\":{\"untracked_instances\":%lld}",
                         nlast ? "," : "", last_overflow);
    pthread_mutex_unlock(&last_lock);
    shim_json_raw(b, "}");
}

void shim_scope_json(struct shim_json *b)
{
    shim_json_raw(b, ",\"nvtx_scopes\":{\"spec\":");
    shim_json_string(b, nvtx_spec ? nvtx_spec : "");
    shim_json_printf(b, ",\"set\":%s", getenv("PROBE_NVTX_SCOPES") ? "true" : "false");
    if (nvtx_error) {
        shim_json_raw(b, ",\"error\":");
        shim_json_string(b, nvtx_error);
    }
    shim_json_raw(b, ",\"calls\":{");
    int first = 1;
    for (size_t i = 0; i < nmaps; ++i) {
        if (maps[i].slot != (int)i)
            continue;
        long long n = atomic_load(&nvtx_calls[i]);
        if (n == 0)
            continue;
        if (!first)
            shim_json_raw(b, ",");
        first = 0;
        shim_json_string(b, maps[i].component);
        shim_json_printf(b, ":%lld", n);
    }
    shim_json_raw(b, "}}");
    /* component calls announced by the adapter (probe_scope_enter_v1) */
    shim_json_raw(b, ",\"scopes\":{");
    pthread_mutex_lock(&adapter_lock);
    for (size_t i = 0; i < nadapter; ++i) {
        if (i)
            shim_json_raw(b, ",");
        shim_json_string(b, adapter_counts[i].name);
        shim_json_printf(b, ":%lld", adapter_counts[i].n);
    }
    if (adapter_overflow)
        shim_json_printf(b, "%s\"(other)\":%lld", nadapter ? "," : "", adapter_overflow);
    pthread_mutex_unlock(&adapter_lock);
    shim_json_raw(b, "}");
    if (shim_cfg.last_kinds)
        last_json(b);
}
