/* procs.c - the processes of one run other than the owner of the capture
 * file (docs/probe-run.md "Processes and threads"):
 *
 *   per-process files  probe_tap_sidecar_v1(NAME): a process that the
 *                      adapter names a worker (it runs components, not the
 *                      pipeline's own loop: a DataLoader worker calling the
 *                      text encoder) writes <stem>.<NAME><ext> next to
 *                      PROBE_OUT instead of claiming it; its manifest has
 *                      "process" {"name", "main", "ppid"}; the owner's
 *                      manifest lists the per-process files next to it
 *                      ("processes", names sorted in version order);
 *                      probe_tap_sidecar_if_taken_v1(NAME): the same, only
 *                      when the run's file is already taken when this
 *                      process first taps (a pool of pipeline processes);
 *   closing early      probe_tap_close_v1: drain and close now (a process
 *                      that leaves with _exit, as a forked multiprocessing
 *                      child does, runs no atexit handler);
 *   adapter missing    a Python process of a probe-run run (PYTHONPATH names
 *                      probe's adapter) that never called the tap ABI says so
 *                      in one line at exit: python -I, -E or -S never import
 *                      probe's sitecustomize. */
/* strverscmp: _GNU_SOURCE comes from the build */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "base/shim.h"
#include "capture/file.h"
#include "capture/procs.h"

#define SIDECAR_NAME_MAX 64

static char *sidecar;   /* this process's NAME, or NULL */
static char *fallback;  /* probe_tap_sidecar_if_taken_v1's NAME, or NULL */
static char *main_base; /* basename of the file this one is a per-process file of */
static atomic_int abi_used;
static atomic_int exit_checked;

int shim_procs_sidecar(void)
{
    return sidecar != NULL;
}

void shim_procs_abi_used(void)
{
    atomic_store(&abi_used, 1);
}

/* NAME: "proc" then up to 60 of [A-Za-z0-9_-]. */
static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n > SIDECAR_NAME_MAX || strncmp(s, "proc", 4) != 0)
        return 0;
    for (const char *c = s; *c; ++c) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 *c == '_' || *c == '-';
        if (!ok)
            return 0;
    }
    return 1;
}

SHIM_EXPORT int probe_tap_sidecar_v1(const char *name)
{
    shim_procs_abi_used();
    if (!name || !name_ok(name))
        return probe_set_error(PROBE_EINVAL,
                               "probe_tap_sidecar_v1: the name must be 'proc' followed by "
                               "[A-Za-z0-9_-], at most %d characters",
                               SIDECAR_NAME_MAX);
    if (shim_cfg.mode != SHIM_OWNER || !shim_cfg.out_path)
        return PROBE_OK; /* not capturing: nothing to redirect */
    if (shim_cfg.root)
        return probe_set_error(PROBE_ESTATE, "probe_tap_sidecar_v1: the run's first process writes "
                                             "the run's capture file, never a per-process one");
    if (sidecar)
        return strcmp(sidecar, name) == 0 ? PROBE_OK
                                            : probe_set_error(PROBE_ESTATE,
                                                              "probe_tap_sidecar_v1: this process "
                                                              "already writes its own file (%s)",
                                                              sidecar);
    const char *path = shim_cfg.out_path, *ext = shim_path_ext(path);
    size_t n = strlen(path) + strlen(name) + 2;
    char *p = malloc(n), *nm = strdup(name), *mb = strdup(shim_path_base(path));
    if (!p || !nm || !mb) {
        free(p), free(nm), free(mb);
        return probe_set_error(PROBE_ENOMEM, "probe_tap_sidecar_v1: out of memory");
    }
    snprintf(p, n, "%.*s.%s%s", (int)(ext - path), path, name, ext);
    if (shim_file_set_out_path(p) != 0) {
        free(p), free(nm), free(mb);
        return probe_set_error(PROBE_ESTATE,
                               "probe_tap_sidecar_v1: this process already claimed a capture file");
    }
    sidecar = nm;
    main_base = mb;
    return PROBE_OK;
}

SHIM_EXPORT int probe_tap_sidecar_if_taken_v1(const char *name)
{
    shim_procs_abi_used();
    if (!name || !name_ok(name))
        return probe_set_error(PROBE_EINVAL,
                               "probe_tap_sidecar_if_taken_v1: the name must be 'proc' followed by "
                               "[A-Za-z0-9_-], at most %d characters",
                               SIDECAR_NAME_MAX);
    if (shim_cfg.mode != SHIM_OWNER || !shim_cfg.out_path)
        return PROBE_OK;
    if (sidecar || shim_cfg.root)
        return probe_set_error(PROBE_ESTATE, "probe_tap_sidecar_if_taken_v1: %s",
                               sidecar ? "this process already writes its own file"
                                       : "the run's first process writes the run's capture file");
    char *nm = strdup(name);
    if (!nm)
        return probe_set_error(PROBE_ENOMEM, "probe_tap_sidecar_if_taken_v1: out of memory");
    free(fallback);
    fallback = nm;
    return PROBE_OK;
}

int shim_procs_take_fallback(void)
{
    if (!fallback || sidecar)
        return 0;
    const char *path = shim_cfg.out_path, *ext = shim_path_ext(path);
    size_t n = strlen(path) + strlen(fallback) + 2;
    char *p = malloc(n), *mb = strdup(shim_path_base(path));
    if (!p || !mb) {
        free(p), free(mb);
        return 0;
    }
    snprintf(p, n, "%.*s.%s%s", (int)(ext - path), path, fallback, ext);
    shim_cfg.out_path = p; /* the previous string stays valid: never freed */
    sidecar = fallback;
    fallback = NULL;
    main_base = mb;
    return 1;
}

SHIM_EXPORT int probe_tap_close_v1(void)
{
    shim_procs_abi_used();
    if (shim_cfg.mode != SHIM_OWNER)
        return PROBE_OK;
    shim_close_now();
    return shim_disabled() && !shim_is_foreign_process()
               ? probe_set_error(PROBE_EIO, "probe_tap_close_v1: capture disabled after a write error")
               : PROBE_OK;
}

static int cmp_ver(const void *a, const void *b)
{
    return strverscmp(*(char *const *)a, *(char *const *)b);
}

/* The per-process files next to the owner's file: <stem>.<NAME><ext> where
 * NAME is a valid sidecar name. */
static void list_sidecars(struct shim_json *b)
{
    const char *path = shim_cfg.out_path, *base = shim_path_base(path), *ext = shim_path_ext(path);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", base > path ? (int)(base - path) : 1, base > path ? path : ".");
    size_t stem_len = (size_t)(ext - base), ext_len = strlen(ext);
    DIR *d = opendir(dir);
    if (!d)
        return;
    char **v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        size_t len = strlen(nm);
        if (len <= stem_len + 1 + ext_len || strncmp(nm, base, stem_len) != 0 || nm[stem_len] != '.' ||
            strcmp(nm + len - ext_len, ext) != 0)
            continue;
        char name[SIDECAR_NAME_MAX + 1];
        size_t k = len - ext_len - stem_len - 1;
        if (k > SIDECAR_NAME_MAX)
            continue;
        memcpy(name, nm + stem_len + 1, k);
        name[k] = '\0';
        if (!name_ok(name))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char **nv = realloc(v, nc * sizeof *nv);
            if (!nv)
                break;
            v = nv;
            cap = nc;
        }
        if ((v[n] = strdup(nm)))
            ++n;
    }
    closedir(d);
    if (n > 0) {
        qsort(v, n, sizeof *v, cmp_ver);
        shim_json_raw(b, ",\"processes\":[");
        for (size_t i = 0; i < n; ++i) {
            if (i)
                shim_json_raw(b, ",");
            shim_json_string(b, v[i]);
        }
        shim_json_raw(b, "]");
    }
    for (size_t i = 0; i < n; ++i)
        free(v[i]);
    free(v);
}

void shim_procs_json(struct shim_json *b)
{
    if (!shim_cfg.out_path)
        return;
    if (sidecar) {
        shim_json_raw(b, ",\"process\":{\"name\":");
        shim_json_string(b, sidecar);
        shim_json_raw(b, ",\"main\":");
        shim_json_string(b, main_base);
        shim_json_printf(b, ",\"ppid\":%ld}", (long)getppid());
        return;
    }
    list_sidecars(b);
}

/* 1 when some PYTHONPATH entry holds probe's adapter (probe-run put it there). */
static int pythonpath_names_adapter(void)
{
    const char *pp = shim_env_raw("PYTHONPATH");
    if (!pp || !*pp)
        return 0;
    char *copy = strdup(pp);
    int found = 0;
    for (char *save = NULL, *d = copy ? strtok_r(copy, ":", &save) : NULL; d && !found;
         d = strtok_r(NULL, ":", &save)) {
        char f[PATH_MAX];
        if (snprintf(f, sizeof f, "%s/probe_adapter/__init__.py", d) < (int)sizeof f &&
            access(f, R_OK) == 0) {
            snprintf(f, sizeof f, "%s/sitecustomize.py", d);
            found = access(f, R_OK) == 0;
        }
    }
    free(copy);
    return found;
}

void shim_procs_exit_check(void)
{
    if (shim_cfg.mode != SHIM_OWNER || atomic_load(&abi_used) || atomic_exchange(&exit_checked, 1))
        return;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    const char *b = shim_path_base(exe);
    if (strncmp(b, "python", 6) != 0 || !pythonpath_names_adapter())
        return;
    shim_warn("pid %ld (%s) ran without probe's Python adapter: Python did not import probe's "
              "sitecustomize (python -I, -E or -S), so no Python component of this process was "
              "captured",
              (long)getpid(), b);
}
