/* inject.c - probe_inject_v1 (probe/tap.h): replace a tapped tensor of the
 * running process with the value recorded at the same path in a reference
 * capture (docs/inject.md).
 *
 * Configuration (probe-run sets it): PROBE_INJECT = the reference file,
 * PROBE_INJECT_GLOBS = comma-separated fnmatch(3) globs on dataset paths
 * (default "*"). The reference is opened through libprobe's reader (the
 * HDF5-linked library the shim dlopens) at the first call whose path a glob
 * selects. Every check failure (unreadable reference, path absent from it,
 * shape or dtype mismatch, a device tensor that cannot be written) stops
 * injection for the rest of the run: one `probe:` line names the path, and
 * the manifest's "inject" entry says "status": "failed" with the error, so
 * probe-compare refuses the file; never a silent partial injection. At close
 * (shim_inject_finish) every reference tensor the globs select must have
 * been injected, else the run failed with a count mismatch. */
#include <fnmatch.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/desc.h"
#include "base/gather.h"
#include "base/json.h"
#include "base/libprobe.h"
#include "base/shim.h"
#include "capture/cuda.h"
#include "capture/file.h"
#include "capture/inject.h"
#include "capture/taps.h"

#define INJECT_ERR_MAX 512

static struct {
    char *ref_path;        /* PROBE_INJECT, or NULL: injection off */
    char *globs_text;      /* PROBE_INJECT_GLOBS as given, or "*" */
    char **globs;
    size_t nglobs;
    int convert;           /* PROBE_INJECT_CONVERT=1: floating dtypes are converted */
} icfg;

static pthread_mutex_t ilock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int opened;    /* 1 after the first attempt to open the reference */
static probe_file *ref;      /* the reference, open while injecting */
static size_t ref_count;
static unsigned char *ref_selected; /* per reference tensor: a glob selects it */
static unsigned char *ref_used;     /* per reference tensor: injected */
static size_t nselected;
static int failed;
static int finished;
static char error[INJECT_ERR_MAX];
static char warning[INJECT_ERR_MAX];

struct injected {
    char path[SHIM_PATH_MAX];
    char hash[17];
    probe_dtype converted_from; /* PROBE_DTYPE_INVALID: the reference's bytes as they are */
};
static struct injected *done_list;
static size_t ndone, done_cap;

static char *xstrdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

void shim_inject_init(void)
{
    const char *ref_env = getenv("PROBE_INJECT");
    if (!ref_env || !*ref_env)
        return;
    const char *g = getenv("PROBE_INJECT_GLOBS");
    const char *conv = getenv("PROBE_INJECT_CONVERT");
    icfg.convert = conv && strcmp(conv, "1") == 0;
    icfg.ref_path = xstrdup(ref_env);
    icfg.globs_text = xstrdup(g && *g ? g : "*");
    if (!icfg.ref_path || !icfg.globs_text)
        return;
    size_t n = 1;
    for (const char *c = icfg.globs_text; *c; ++c)
        n += *c == ',';
    icfg.globs = calloc(n, sizeof *icfg.globs);
    char *copy = xstrdup(icfg.globs_text);
    if (!icfg.globs || !copy) {
        free(copy);
        return;
    }
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (*tok)
            icfg.globs[icfg.nglobs++] = xstrdup(tok);
    free(copy);
}

/* Same rule as PROBE_CAPTURE (tap.c): a glob without a leading '/' is also
 * tried against the path without its '/'. */
static int glob_selects(const char *g, const char *path)
{
    return fnmatch(g, path, 0) == 0 || (g[0] != '/' && fnmatch(g, path + 1, 0) == 0);
}

static int inject_selected(const char *path)
{
    for (size_t i = 0; i < icfg.nglobs; ++i)
        if (icfg.globs[i] && glob_selects(icfg.globs[i], path))
            return 1;
    return 0;
}

/* Under ilock: mark injection failed (first error kept), print one line. */
static void fail_locked(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_locked(const char *fmt, ...)
{
    if (failed)
        return;
    failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, sizeof error, fmt, ap);
    va_end(ap);
    shim_warn("inject: %s; %s (the capture file records the failure and probe-compare refuses "
              "it)", error, finished ? "at exit" : "injection stopped for the rest of the run");
}

/* Under ilock: open the reference and mark the tensors the globs select. */
static void open_ref_locked(void)
{
    atomic_store(&opened, 1);
    probe_status st;
    /* The caller opened the capture file before taking ilock (that loads
     * libprobe.so, the reader; and the open builds the manifest, which takes
     * ilock through shim_inject_json). */
    if (!shim_writer() || !shim_libprobe_api.file_open) {
        fail_locked("cannot read the reference %s: probe's library is not available",
                    icfg.ref_path);
        return;
    }
    shim_libprobe_fork_prepare();
    st = shim_libprobe_api.file_open(icfg.ref_path, &ref);
    const char *why = st != PROBE_OK ? shim_libprobe_error() : "";
    char whybuf[INJECT_ERR_MAX];
    snprintf(whybuf, sizeof whybuf, "%s", why);
    if (st == PROBE_OK)
        ref_count = shim_libprobe_api.file_count(ref);
    shim_libprobe_fork_release();
    if (st != PROBE_OK) {
        ref = NULL;
        fail_locked("cannot open the reference %s: %s", icfg.ref_path, whybuf);
        return;
    }
    ref_selected = calloc(ref_count ? ref_count : 1, 1);
    ref_used = calloc(ref_count ? ref_count : 1, 1);
    if (!ref_selected || !ref_used) {
        fail_locked("out of memory indexing the reference %s", icfg.ref_path);
        return;
    }
    for (size_t i = 0; i < ref_count; ++i)
        if (inject_selected(shim_libprobe_api.file_tensor(ref, i)->path)) {
            ref_selected[i] = 1;
            ++nselected;
        }
    /* A glob that selects nothing in the reference is almost certainly a typo. */
    for (size_t g = 0; g < icfg.nglobs; ++g) {
        size_t hits = 0;
        for (size_t i = 0; i < ref_count && !hits; ++i)
            hits += glob_selects(icfg.globs[g], shim_libprobe_api.file_tensor(ref, i)->path);
        if (!hits) {
            size_t len = strlen(warning);
            snprintf(warning + len, sizeof warning - len, "%sglob '%s' matches no tensor of %s",
                     len ? "; " : "", icfg.globs[g], icfg.ref_path);
            shim_warn("inject: glob '%s' matches no tensor of the reference %s: nothing is "
                      "injected for it", icfg.globs[g], icfg.ref_path);
        }
    }
}

/* With PROBE_INJECT_CONVERT=1 a floating reference may be injected into a
 * floating tensor of another type: float32, float64 and bfloat16 targets. */
static int convertible(probe_dtype from, probe_dtype to)
{
    int src = from == PROBE_DTYPE_FLOAT16 || from == PROBE_DTYPE_BFLOAT16 ||
              from == PROBE_DTYPE_FLOAT32 || from == PROBE_DTYPE_FLOAT64;
    int dst = to == PROBE_DTYPE_BFLOAT16 || to == PROBE_DTYPE_FLOAT32 || to == PROBE_DTYPE_FLOAT64;
    return src && dst;
}

static void shape_text(char *buf, size_t cap, int rank, const int64_t *shape)
{
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < rank && len < cap; ++k)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", k ? ", " : "", (long long)shape[k]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

SHIM_EXPORT int probe_inject_v1(const probe_tap_tensor_v1 *t)
{
    if (!icfg.ref_path || !shim_tap_process_captures())
        return PROBE_INJECT_NONE;
    struct shim_extent ext;
    probe_status st = shim_desc_validate(t, &ext);
    if (st != PROBE_OK) {
        /* A descriptor the tap would refuse: not a tensor of this run. */
        return PROBE_INJECT_NONE;
    }
    if (!atomic_load(&opened)) {
        /* Opened at the first call, selected or not, so that a glob matching
         * nothing in the reference is reported at once. The capture file
         * first, outside ilock (see open_ref_locked). */
        if (shim_file_open() != PROBE_OK)
            return PROBE_INJECT_NONE; /* capture disabled: it said why */
        pthread_mutex_lock(&ilock);
        if (!atomic_load(&opened) && !finished)
            open_ref_locked();
        pthread_mutex_unlock(&ilock);
    }
    char path[SHIM_PATH_MAX];
    snprintf(path, sizeof path, "/%s/%04lld/%s", t->component, (long long)t->call, t->slot);
    if (!inject_selected(path))
        return PROBE_INJECT_NONE;

    pthread_mutex_lock(&ilock);
    int rc = PROBE_INJECT_ERROR;
    unsigned char *buf = NULL;
    if (finished) {
        fail_locked("%s: injection requested after the capture file was closed", path);
        goto out;
    }
    if (failed || !ref)
        goto out;
    size_t ri = 0;
    if (shim_libprobe_api.file_find(ref, path, &ri) != PROBE_OK) {
        fail_locked("%s: not in the reference %s (count mismatch: the candidate makes a call "
                    "or has an input the reference does not)", path, icfg.ref_path);
        goto out;
    }
    const probe_tensor_info *ti = shim_libprobe_api.file_tensor(ref, ri);
    if (ref_used[ri]) {
        fail_locked("%s: injected twice in this run", path);
        goto out;
    }
    probe_dtype conv_from = PROBE_DTYPE_INVALID;
    if (ti->dtype != (probe_dtype)t->dtype) {
        if (!icfg.convert || !convertible(ti->dtype, (probe_dtype)t->dtype)) {
            fail_locked("%s: dtype mismatch: reference %s, candidate %s%s", path,
                        probe_dtype_name(ti->dtype), probe_dtype_name((probe_dtype)t->dtype),
                        icfg.convert ? " (not a floating conversion probe makes)"
                                     : " (probe-run --convert converts floating types)");
            goto out;
        }
        conv_from = ti->dtype;
    }
    int same = ti->rank == t->rank;
    for (int k = 0; same && k < t->rank; ++k)
        same = ti->shape[k] == t->shape[k];
    if (!same) {
        char a[256], b[256];
        shape_text(a, sizeof a, ti->rank, ti->shape);
        shape_text(b, sizeof b, t->rank, t->shape);
        fail_locked("%s: shape mismatch: reference %s, candidate %s", path, a, b);
        goto out;
    }
    if (t->device >= 0 && ext.n > 0 && !ext.contiguous) {
        fail_locked("%s: a non-contiguous device tensor cannot be injected (copy it into a "
                    "contiguous one first)", path);
        goto out;
    }
    if (ext.nbytes > 0) {
        size_t ref_bytes = (size_t)ext.n * probe_dtype_size(ti->dtype);
        buf = malloc(ref_bytes > ext.nbytes ? ref_bytes : ext.nbytes);
        if (!buf) {
            fail_locked("%s: cannot allocate %zu bytes", path, ext.nbytes);
            goto out;
        }
        shim_libprobe_fork_prepare();
        st = shim_libprobe_api.file_read_raw(ref, ri, buf, ref_bytes);
        char why[INJECT_ERR_MAX];
        snprintf(why, sizeof why, "%s", st != PROBE_OK ? shim_libprobe_error() : "");
        shim_libprobe_fork_release();
        if (st != PROBE_OK) {
            fail_locked("%s: cannot read it from the reference %s: %s", path, icfg.ref_path, why);
            goto out;
        }
        if (conv_from != PROBE_DTYPE_INVALID) {
            unsigned char *cbuf = malloc(ext.nbytes);
            if (!cbuf ||
                probe_dtype_convert(conv_from, buf, (probe_dtype)t->dtype, cbuf, (size_t)ext.n)) {
                free(cbuf);
                fail_locked("%s: cannot allocate %zu bytes to convert", path, ext.nbytes);
                goto out;
            }
            free(buf);
            buf = cbuf;
        }
        if (t->device < 0) {
            shim_gather_scatter((void *)t->data, buf, t->rank, t->shape, t->strides,
                         probe_dtype_size((probe_dtype)t->dtype));
        } else {
            st = shim_cuda_inject((void *)t->data, buf, ext.nbytes, t->device, t->stream);
            if (st != PROBE_OK) {
                fail_locked("%s: cannot write the device tensor: %s", path, probe_last_error());
                goto out;
            }
        }
    }
    if (ndone == done_cap) {
        size_t cap = done_cap ? done_cap * 2 : 64;
        struct injected *p = realloc(done_list, cap * sizeof *p);
        if (!p) {
            fail_locked("%s: out of memory recording the injection", path);
            goto out;
        }
        done_list = p;
        done_cap = cap;
    }
    snprintf(done_list[ndone].path, sizeof done_list[ndone].path, "%s", path);
    snprintf(done_list[ndone].hash, sizeof done_list[ndone].hash, "%s", ti->hash);
    done_list[ndone].converted_from = conv_from;
    ++ndone;
    ref_used[ri] = 1;
    rc = PROBE_INJECT_DONE;
out:
    pthread_mutex_unlock(&ilock);
    free(buf);
    return rc;
}

void shim_inject_finish(void)
{
    if (!icfg.ref_path)
        return;
    pthread_mutex_lock(&ilock);
    if (!finished) {
        if (!atomic_load(&opened))
            open_ref_locked(); /* never called: still check the globs and the count */
        finished = 1;
        if (!failed && ref) {
            size_t never = 0, first = 0;
            for (size_t i = 0; i < ref_count; ++i)
                if (ref_selected[i] && !ref_used[i] && !never++)
                    first = i;
            if (never)
                fail_locked("count mismatch: %zu tensor(s) of the reference %s that the inject "
                            "globs select were never injected (first: %s; the candidate makes "
                            "fewer calls, or the pipeline never reached them)",
                            never, icfg.ref_path, shim_libprobe_api.file_tensor(ref, first)->path);
        }
        if (ref) {
            shim_libprobe_fork_prepare();
            shim_libprobe_api.file_close(ref);
            shim_libprobe_fork_release();
            ref = NULL;
        }
    }
    pthread_mutex_unlock(&ilock);
}

void shim_inject_json(struct shim_json *b)
{
    if (!icfg.ref_path)
        return;
    pthread_mutex_lock(&ilock);
    shim_json_raw(b, ",\"inject\":{\"reference\":");
    shim_json_string(b, icfg.ref_path);
    shim_json_raw(b, ",\"globs\":[");
    for (size_t i = 0; i < icfg.nglobs; ++i) {
        if (i)
            shim_json_raw(b, ",");
        shim_json_string(b, icfg.globs[i]);
    }
    shim_json_raw(b, "],\"status\":");
    /* "running" until close: a file whose run died mid-way is not a valid injected run */
    shim_json_string(b, failed ? "failed" : finished ? "ok" : "running");
    shim_json_raw(b, ",\"error\":");
    shim_json_string(b, failed ? error : NULL);
    shim_json_raw(b, ",\"warning\":");
    shim_json_string(b, warning[0] ? warning : NULL);
    shim_json_printf(b, ",\"convert\":%s,\"selected\":%zu,\"injected\":%zu,\"tensors\":[",
                     icfg.convert ? "true" : "false", nselected, ndone);
    for (size_t i = 0; i < ndone; ++i) {
        shim_json_raw(b, i ? ",{\"path\":" : "{\"path\":");
        shim_json_string(b, done_list[i].path);
        shim_json_raw(b, ",\"reference_hash\":");
        shim_json_string(b, done_list[i].hash);
        if (done_list[i].converted_from != PROBE_DTYPE_INVALID) {
            shim_json_raw(b, ",\"converted_from\":");
            shim_json_string(b, probe_dtype_name(done_list[i].converted_from));
        }
        shim_json_raw(b, "}");
    }
    shim_json_raw(b, "]}");
    pthread_mutex_unlock(&ilock);
}
