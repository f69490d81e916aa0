/* libprobe_cuda.c - load libprobe_cuda.so on demand (base/libprobe_cuda.h).
 * The shim links no CUDA library: libprobe_cuda.so carries its own static
 * CUDA runtime and needs only the driver, which a process with device
 * tensors has loaded. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/libprobe.h"
#include "base/libprobe_cuda.h"
#include "base/resolve.h"
#include "base/shim.h"

static int device_summary_off;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct shim_libprobe_cuda api;
static const struct shim_libprobe_cuda *loaded;
static char why[PATH_MAX + 512];

void shim_libprobe_cuda_config(void)
{
    const char *v = getenv("PROBE_DEVICE_SUMMARY");
    device_summary_off = 0;
    if (!v || !*v || strcmp(v, "1") == 0)
        return;
    if (strcmp(v, "0") == 0) {
        device_summary_off = 1;
        return;
    }
    shim_warn_config("PROBE_DEVICE_SUMMARY=%s is neither 0 nor 1; taking it as 1 (summaries of "
                     "device tensors on the GPU)", v);
}

static void load(void)
{
    if (device_summary_off) {
        snprintf(why, sizeof why, "PROBE_DEVICE_SUMMARY=0");
        return;
    }
    char path[PATH_MAX] = "libprobe_cuda.so";
    const char *self = shim_libprobe_self_path();
    const char *slash = self ? strrchr(self, '/') : NULL;
    if (slash)
        snprintf(path, sizeof path, "%.*s/libprobe_cuda.so", (int)(slash - self), self);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && slash)
        h = dlopen("libprobe_cuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, sizeof why, "cannot load %s: %s", path, e ? e : "unknown error");
        return;
    }
    int (*abi)(void) = (int (*)(void))shim_resolve_handle(h, "probe_cuda_abi_version");
    api.summary_enqueue = (probe_status(*)(probe_dtype, const void *, uint64_t, void *, void *))
        shim_resolve_handle(h, "probe_cuda_summary_tree_enqueue");
    api.summary_result =
        (probe_status(*)(probe_dtype, uint64_t, const void *, probe_summary *, uint64_t *))
            shim_resolve_handle(h, "probe_cuda_summary_tree_result");
    if (!abi || abi() != 1 || !api.summary_enqueue || !api.summary_result) {
        snprintf(why, sizeof why,
                 "%s is not a libprobe_cuda of ABI version 1 with probe_cuda_summary_tree_enqueue",
                 path);
        memset(&api, 0, sizeof api);
        return; /* the handle stays open: closing a CUDA library is never safe */
    }
    loaded = &api;
}

const struct shim_libprobe_cuda *shim_libprobe_cuda(void)
{
    pthread_once(&once, load);
    return loaded;
}

const char *shim_libprobe_cuda_why(void)
{
    return why;
}
