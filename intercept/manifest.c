/* manifest.c - JSON text (builder, string escaping, validation) and the run
 * manifest written into the capture file's root attribute probe.manifest.
 *
 * JSON grammar and string escaping: RFC 8259. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

/* ---- builder -------------------------------------------------------------- */

void shim_json_init(struct shim_json *b)
{
    memset(b, 0, sizeof *b);
}

void shim_json_free(struct shim_json *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static int reserve(struct shim_json *b, size_t more)
{
    if (b->oom)
        return 0;
    if (b->len + more + 1 <= b->cap)
        return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

static void put(struct shim_json *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void shim_json_raw(struct shim_json *b, const char *s)
{
    put(b, s, strlen(s));
}

void shim_json_printf(struct shim_json *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        put(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid
 * (overlong forms, surrogates and code points above U+10FFFF rejected,
 * per RFC 3629 section 4). */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80)
            return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        return 4;
    }
    return 0;
}

void shim_json_string(struct shim_json *b, const char *s)
{
    if (!s) {
        shim_json_raw(b, "null");
        return;
    }
    put(b, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(b, e, 2);
            ++p;
        } else if (c < 0x20) {
            const char *e = NULL;
            switch (c) {
            case '\b': e = "\\b"; break;
            case '\f': e = "\\f"; break;
            case '\n': e = "\\n"; break;
            case '\r': e = "\\r"; break;
            case '\t': e = "\\t"; break;
            default: break;
            }
            if (e) {
                put(b, e, 2);
            } else {
                char u[8];
                snprintf(u, sizeof u, "\\u%04x", c);
                put(b, u, 6);
            }
            ++p;
        } else if (c < 0x80) {
            put(b, (const char *)p, 1);
            ++p;
        } else {
            size_t n = utf8_len(p);
            if (n) {
                put(b, (const char *)p, n);
                p += n;
            } else {
                put(b, "\xEF\xBF\xBD", 3); /* U+FFFD REPLACEMENT CHARACTER */
                ++p;
            }
        }
    }
    put(b, "\"", 1);
}

/* ---- validation (RFC 8259 grammar) ------------------------------------- */

struct parser {
    const char *s;
    int depth;
};

static void ws(struct parser *p)
{
    while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
        ++p->s;
}

static int hexd(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int pstring(struct parser *p)
{
    if (*p->s != '"')
        return 0;
    ++p->s;
    for (;;) {
        unsigned char c = (unsigned char)*p->s;
        if (c == '"') {
            ++p->s;
            return 1;
        }
        if (c < 0x20)
            return 0; /* includes the terminating NUL */
        if (c == '\\') {
            char e = p->s[1];
            if (e == 'u') {
                if (!hexd(p->s[2]) || !hexd(p->s[3]) || !hexd(p->s[4]) || !hexd(p->s[5]))
                    return 0;
                p->s += 6;
            } else if (e && strchr("\"\\/bfnrt", e)) {
                p->s += 2;
            } else {
                return 0;
            }
        } else if (c >= 0x80) {
            size_t n = utf8_len((const unsigned char *)p->s);
            if (!n)
                return 0;
            p->s += n;
        } else {
            ++p->s;
        }
    }
}

static int digits(struct parser *p)
{
    const char *start = p->s;
    while (*p->s >= '0' && *p->s <= '9')
        ++p->s;
    return p->s > start;
}

static int pnumber(struct parser *p)
{
    if (*p->s == '-')
        ++p->s;
    if (*p->s == '0')
        ++p->s;
    else if (!digits(p))
        return 0;
    if (*p->s == '.') {
        ++p->s;
        if (!digits(p))
            return 0;
    }
    if (*p->s == 'e' || *p->s == 'E') {
        ++p->s;
        if (*p->s == '+' || *p->s == '-')
            ++p->s;
        if (!digits(p))
            return 0;
    }
    return 1;
}

static int pvalue(struct parser *p);

static int pcontainer(struct parser *p, char open, char close)
{
    if (++p->depth > 64)
        return 0;
    ++p->s; /* open */
    ws(p);
    if (*p->s == close) {
        ++p->s;
        --p->depth;
        return 1;
    }
    for (;;) {
        if (open == '{') {
            if (!pstring(p))
                return 0;
            ws(p);
            if (*p->s != ':')
                return 0;
            ++p->s;
            ws(p);
        }
        if (!pvalue(p))
            return 0;
        ws(p);
        if (*p->s == ',') {
            ++p->s;
            ws(p);
            continue;
        }
        if (*p->s == close) {
            ++p->s;
            --p->depth;
            return 1;
        }
        return 0;
    }
}

static int pvalue(struct parser *p)
{
    switch (*p->s) {
    case '{': return pcontainer(p, '{', '}');
    case '[': return pcontainer(p, '[', ']');
    case '"': return pstring(p);
    case 't': return strncmp(p->s, "true", 4) == 0 ? (p->s += 4, 1) : 0;
    case 'f': return strncmp(p->s, "false", 5) == 0 ? (p->s += 5, 1) : 0;
    case 'n': return strncmp(p->s, "null", 4) == 0 ? (p->s += 4, 1) : 0;
    default: return pnumber(p);
    }
}

int shim_json_valid(const char *s)
{
    if (!s)
        return 0;
    struct parser p = {s, 0};
    ws(&p);
    if (!pvalue(&p))
        return 0;
    ws(&p);
    return *p.s == '\0';
}

/* ---- keys added by adapters ------------------------------------------- */

struct entry {
    char *key;
    char *value; /* JSON text */
};

static pthread_mutex_t keys_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *keys;
static size_t nkeys, capkeys;

#define KEY_MAX 64

static int key_ok(const char *key)
{
    size_t n = 0;
    for (const char *c = key; *c; ++c, ++n) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '.' || *c == '-'))
            return 0;
    }
    return n >= 1 && n <= KEY_MAX;
}

/* Add or replace a manifest key. key: 1..64 characters of [A-Za-z0-9_.-],
 * not "format" or "version" (those identify the manifest itself);
 * json_value: one complete JSON value (RFC 8259). Keys set here replace the
 * shim's own key of the same name. Errors: PROBE_EINVAL (bad key or value,
 * message says which), PROBE_ENOMEM. Works whether or not capture is active
 * (the manifest is written at close). */
SHIM_EXPORT int probe_tap_manifest_v1(const char *key, const char *json_value)
{
    if (!key || !key_ok(key))
        return probe_set_error(PROBE_EINVAL,
                               "probe_tap_manifest_v1: key must be 1..%d characters of "
                               "[A-Za-z0-9_.-]",
                               KEY_MAX);
    if (strcmp(key, "format") == 0 || strcmp(key, "version") == 0)
        return probe_set_error(PROBE_EINVAL, "probe_tap_manifest_v1: key '%s' is reserved", key);
    if (!shim_json_valid(json_value))
        return probe_set_error(PROBE_EINVAL,
                               "probe_tap_manifest_v1: value for key '%s' is not one JSON value",
                               key);
    if (shim_cfg.mode == SHIM_OWNER && shim_is_foreign_process())
        return PROBE_OK; /* a forked child: its manifest is never written */
    char *v = strdup(json_value);
    if (!v)
        return probe_set_error(PROBE_ENOMEM, "probe_tap_manifest_v1: out of memory");
    int rc = PROBE_OK;
    pthread_mutex_lock(&keys_lock);
    size_t i = 0;
    for (; i < nkeys; ++i) {
        if (strcmp(keys[i].key, key) == 0)
            break;
    }
    if (i < nkeys) {
        free(keys[i].value);
        keys[i].value = v;
    } else {
        char *k = strdup(key);
        if (nkeys == capkeys) {
            size_t nc = capkeys ? capkeys * 2 : 16;
            struct entry *ne = realloc(keys, nc * sizeof *ne);
            if (ne) {
                keys = ne;
                capkeys = nc;
            }
        }
        if (!k || nkeys == capkeys) {
            free(k);
            free(v);
            rc = probe_set_error(PROBE_ENOMEM, "probe_tap_manifest_v1: out of memory");
        } else {
            keys[nkeys].key = k;
            keys[nkeys].value = v;
            ++nkeys;
        }
    }
    pthread_mutex_unlock(&keys_lock);
    return rc;
}

/* Is key set by an adapter? (caller holds keys_lock) */
static int user_has(const char *key)
{
    for (size_t i = 0; i < nkeys; ++i) {
        if (strcmp(keys[i].key, key) == 0)
            return 1;
    }
    return 0;
}

static void key(struct shim_json *b, const char *k)
{
    shim_json_raw(b, ",");
    shim_json_string(b, k);
    shim_json_raw(b, ":");
}

/* RANK / WORLD_SIZE / LOCAL_RANK as integers; omitted if absent or not an
 * integer. */
static void env_int(struct shim_json *b, const char *k, const char *env)
{
    const char *v = getenv(env);
    if (!v || !*v || user_has(k))
        return;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end)
        return;
    key(b, k);
    shim_json_printf(b, "%lld", x);
}

/* The NVIDIA kernel driver's version ("580.95.05") from
 * /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel
 * Module  580.95.05  ..."); 0 when there is none. No CUDA call. */
static int nvidia_driver(char *buf, size_t cap)
{
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f)
        return 0;
    char line[512];
    int ok = 0;
    if (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "Kernel Module");
        if (p) {
            p += strlen("Kernel Module");
            while (*p == ' ' || *p == '\t')
                ++p;
            size_t n = strspn(p, "0123456789.");
            if (n > 0 && n < cap) {
                memcpy(buf, p, n);
                buf[n] = 0;
                ok = 1;
            }
        }
    }
    fclose(f);
    return ok;
}

char *shim_manifest_build(int final)
{
    struct shim_json b;
    shim_json_init(&b);
    pthread_mutex_lock(&keys_lock);
    shim_json_raw(&b, "{\"format\":\"probe-manifest\",\"version\":1");
    if (!user_has("command")) {
        key(&b, "command");
        shim_json_raw(&b, "[");
        for (size_t i = 0; i < shim_cfg.argc; ++i) {
            if (i)
                shim_json_raw(&b, ",");
            shim_json_string(&b, shim_cfg.argv[i]);
        }
        shim_json_raw(&b, "]");
    }
    if (!user_has("label")) {
        key(&b, "label");
        shim_json_string(&b, shim_cfg.label);
    }
    if (!user_has("host")) {
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        key(&b, "host");
        shim_json_string(&b, host);
    }
    if (!user_has("pid")) {
        key(&b, "pid");
        shim_json_printf(&b, "%ld", (long)getpid());
    }
    if (!user_has("start_time")) {
        key(&b, "start_time");
        shim_json_string(&b, shim_cfg.start_time);
    }
    if (!user_has("probe_version")) {
        key(&b, "probe_version");
        shim_json_string(&b, PROBE_VERSION);
    }
    env_int(&b, "rank", "RANK");
    env_int(&b, "world_size", "WORLD_SIZE");
    env_int(&b, "local_rank", "LOCAL_RANK");
    if (!user_has("nvtx")) {
        key(&b, "nvtx");
        if (shim_cfg.nvtx_note) {
            shim_json_string(&b, shim_cfg.nvtx_note);
        } else {
            unsigned m = shim_nvtx_modules();
            shim_json_printf(&b, "\"injected (%u module%s initialized)\"", m, m == 1 ? "" : "s");
        }
    }
    if (!user_has("capture")) {
        key(&b, "capture");
        shim_json_string(&b, shim_cfg.capture_spec);
    }
    if (!user_has("queue_limit_bytes")) {
        key(&b, "queue_limit_bytes");
        shim_json_printf(&b, "%zu", shim_cfg.queue_max_bytes);
    }
    if (final) {
        if (!user_has("queue_waits")) {
            key(&b, "queue_waits");
            shim_json_printf(&b, "{\"count\":%llu,\"total_s\":%.6f}",
                             (unsigned long long)atomic_load(&shim_stats.queue_waits),
                             (double)atomic_load(&shim_stats.queue_wait_ns) * 1e-9);
        }
        if (!user_has("taps")) {
            key(&b, "taps");
            shim_json_printf(&b,
                             "{\"accepted\":%llu,\"skipped\":%llu,\"filtered\":%llu,"
                             "\"write_errors\":%llu,\"pinned_pool_bytes\":%zu,"
                             "\"graph_replays\":%llu}",
                             (unsigned long long)atomic_load(&shim_stats.accepted),
                             (unsigned long long)atomic_load(&shim_stats.skipped),
                             (unsigned long long)atomic_load(&shim_stats.filtered),
                             (unsigned long long)atomic_load(&shim_stats.write_errors),
                             shim_cuda_pinned_bytes(),
                             (unsigned long long)atomic_load(&shim_stats.graph_replays));
        }
        if (!user_has("cuda"))
            shim_cuda_info_json(&b);
        if (!user_has("staging"))
            shim_cuda_staging_json(&b);
        if (!user_has("lost"))
            shim_lost_json(&b); /* queue.c: tensors tapped and never written */
        char drv[64];
        if (!user_has("nvidia_driver") && nvidia_driver(drv, sizeof drv)) {
            key(&b, "nvidia_driver");
            shim_json_string(&b, drv);
        }
    }
    if (!user_has("inject"))
        shim_inject_json(&b);
    shim_stats_json(&b); /* stats.c: stats_only, capture_error */
    if (final)
        shim_capture_items_json(&b, 1); /* tap.c: capture_items (and a line per unmatched item) */
    shim_scope_json(&b); /* scope.c: nvtx_scopes */
    shim_gemm_json(&b);  /* gemm.c, weights.c: "gemm", "weights" */
    if (!user_has("kernels"))
        shim_kernels_json(&b); /* kernels.c: "kernels" */
    shim_nccl_json(&b);  /* nccl.c: nccl, shard (shard.c), ranks (index capture, shim.c) */
    shim_exec_json(&b);  /* exits.c: exec (an image continuing the capture after exec) */
    for (size_t i = 0; i < nkeys; ++i) {
        key(&b, keys[i].key);
        shim_json_raw(&b, keys[i].value);
    }
    pthread_mutex_unlock(&keys_lock);
    shim_json_raw(&b, "}");
    if (b.oom) {
        shim_json_free(&b);
        return NULL;
    }
    return b.p;
}
