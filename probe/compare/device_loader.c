/* device_loader.c - find and load libprobe_cuda.so (device_loader.h). */
#include "device_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static probe_cuda_source_fn loaded;
static probe_cuda_source_v2_fn loaded_v2;
static char why[PATH_MAX + 1024];
static char why_v2[PATH_MAX + 1024];

static void load(void)
{
    char path[PATH_MAX] = "libprobe_cuda.so";
    Dl_info info;
    if (dladdr((void *)&probe_cuda_load, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash)
            snprintf(path, sizeof path, "%.*s/libprobe_cuda.so", (int)(slash - info.dli_fname),
                     info.dli_fname);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && strchr(path, '/'))
        h = dlopen("libprobe_cuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why, "CUDA metrics are not available: cannot load %s (%s)", path,
                 dlerror());
        memcpy(why_v2, why, sizeof why_v2);
        return;
    }
    int (*abi)(void) = (int (*)(void))dlsym(h, "probe_cuda_abi_version");
    void *fn = dlsym(h, "probe_cuda_metrics_source");
    if (!abi || !fn || abi() != 1) {
        snprintf(why, sizeof why, "CUDA metrics are not available: %s is not a libprobe_cuda of "
                 "ABI version 1", path);
        memcpy(why_v2, why, sizeof why_v2);
        return;
    }
    memcpy(&loaded, &fn, sizeof loaded);
    void *fn2 = dlsym(h, "probe_cuda_metrics_source_v2");
    if (fn2)
        memcpy(&loaded_v2, &fn2, sizeof loaded_v2);
    else
        snprintf(why_v2, sizeof why_v2, "CUDA metrics are not available: %s is an older "
                 "libprobe_cuda without probe_cuda_metrics_source_v2 (rebuild it with this probe)",
                 path);
}

probe_status probe_cuda_load(probe_cuda_source_fn *fn)
{
    pthread_once(&once, load);
    *fn = loaded;
    return loaded ? PROBE_OK : probe_set_error(PROBE_EUNSUPPORTED, "%s", why);
}

probe_status probe_cuda_load_v2(probe_cuda_source_v2_fn *fn)
{
    pthread_once(&once, load);
    *fn = loaded_v2;
    return loaded_v2 ? PROBE_OK : probe_set_error(PROBE_EUNSUPPORTED, "%s", why_v2);
}
