/* probe/status.h - the one status enum every probe library function returns.
 *
 * Convention (libuv style): library functions return a probe_status and never
 * print or exit. PROBE_OK is 0; every error is positive. The text of the last
 * error on the calling thread (naming the file/object and the reason) is kept
 * by probe_last_error(); the CLIs print it.
 */
#ifndef PROBE_STATUS_H
#define PROBE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum probe_status {
    PROBE_OK = 0,
    PROBE_EINVAL = 1,       /* bad argument (NULL, out of range, unknown name) */
    PROBE_ENOMEM = 2,       /* allocation failed */
    PROBE_EIO = 3,          /* the OS or HDF5 failed to read/write */
    PROBE_EFORMAT = 4,      /* input exists but is not what it must be (not HDF5, bad JSON, bad attribute) */
    PROBE_ENOTFOUND = 5,    /* file, dataset, component or key does not exist */
    PROBE_EUNSUPPORTED = 6, /* valid input this build cannot handle (element type, rank) */
    PROBE_EMISMATCH = 7,    /* reference and candidate cannot be compared (shape, element count) */
    PROBE_ESTATE = 8        /* call not valid in the object's current state */
} probe_status;

/* A static, never-NULL English name for a status ("invalid argument", ...). */
const char *probe_status_str(probe_status s);

/* The message of the last error set on this thread by any probe function, or
 * "" if none. Valid until the next probe call on this thread. */
const char *probe_last_error(void);

/* Set the calling thread's last-error message (printf-style) and return s.
 * For use inside probe's libraries. */
probe_status probe_set_error(probe_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
