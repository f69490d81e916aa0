/* status.c - status names and the per-thread last-error message (probe/status.h).
 *
 * Also compiled into the preloaded shim (intercept/), so it must link only
 * against libc: no libm, no jansson.
 */
#include "probe/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define PROBE_ERROR_MAX 1024

static _Thread_local char last_error[PROBE_ERROR_MAX];

const char *probe_status_str(probe_status s)
{
    switch (s) {
    case PROBE_OK:           return "ok";
    case PROBE_EINVAL:       return "invalid argument";
    case PROBE_ENOMEM:       return "out of memory";
    case PROBE_EIO:          return "input/output error";
    case PROBE_EFORMAT:      return "bad format";
    case PROBE_ENOTFOUND:    return "not found";
    case PROBE_EUNSUPPORTED: return "unsupported";
    case PROBE_EMISMATCH:    return "reference and candidate do not match";
    case PROBE_ESTATE:       return "invalid state";
    }
    return "unknown status";
}

const char *probe_last_error(void)
{
    return last_error;
}

probe_status probe_set_error(probe_status s, const char *fmt, ...)
{
    /* Format into a temporary first: callers may pass probe_last_error() as
     * an argument to wrap the previous message ("file X: %s"). */
    char tmp[PROBE_ERROR_MAX];
    if (fmt == NULL) {
        tmp[0] = '\0';
    } else {
        va_list ap;
        va_start(ap, fmt);
        int len = vsnprintf(tmp, sizeof tmp, fmt, ap);
        va_end(ap);
        if (len < 0)
            tmp[0] = '\0';
        else if ((size_t)len >= sizeof tmp) /* truncated: say so */
            memcpy(tmp + sizeof tmp - 4, "...", 4);
    }
    memcpy(last_error, tmp, sizeof last_error);
    return s;
}
