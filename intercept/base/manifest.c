/* manifest.c - the run manifest written into the capture file's root
 * attribute probe.manifest: the shim's own keys, the sections the layers
 * above register (shim_manifest_add), and the keys adapters set
 * (probe_tap_manifest_v1). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "base/manifest.h"
#include "base/shim.h"

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

/* ---- sections registered by the layers above ------------------------------ */

#define SECTIONS_MAX 32

struct section {
    const char *key; /* the key the section writes, skipped when an adapter set it; NULL: none */
    int final_only;  /* written only into the manifest at close */
    void (*append)(struct shim_json *b);
};

static struct section sections[SECTIONS_MAX];
static size_t nsections;

void shim_manifest_add(const char *key, int final_only, void (*append)(struct shim_json *b))
{
    if (nsections < SECTIONS_MAX)
        sections[nsections++] = (struct section){key, final_only, append};
}

void shim_manifest_driver_json(struct shim_json *b)
{
    char drv[64];
    if (nvidia_driver(drv, sizeof drv)) {
        shim_json_raw(b, ",\"nvidia_driver\":");
        shim_json_string(b, drv);
    }
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
            unsigned m = atomic_load(&shim_counts.nvtx_modules);
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
                             (unsigned long long)atomic_load(&shim_counts.queue_waits),
                             (double)atomic_load(&shim_counts.queue_wait_ns) * 1e-9);
        }
        if (!user_has("taps")) {
            key(&b, "taps");
            shim_json_printf(&b,
                             "{\"accepted\":%llu,\"skipped\":%llu,\"filtered\":%llu,"
                             "\"write_errors\":%llu,\"pinned_pool_bytes\":%zu,"
                             "\"graph_replays\":%llu}",
                             (unsigned long long)atomic_load(&shim_counts.accepted),
                             (unsigned long long)atomic_load(&shim_counts.skipped),
                             (unsigned long long)atomic_load(&shim_counts.filtered),
                             (unsigned long long)atomic_load(&shim_counts.write_errors),
                             atomic_load(&shim_counts.pinned_bytes),
                             (unsigned long long)atomic_load(&shim_counts.graph_replays));
        }
    }
    for (size_t i = 0; i < nsections; ++i) {
        const struct section *s = &sections[i];
        if ((s->final_only && !final) || (s->key && user_has(s->key)))
            continue;
        s->append(&b);
    }
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
