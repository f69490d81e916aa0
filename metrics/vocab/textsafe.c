/* Terminal-safe text and atomically replaced output files (textsafe.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "textsafe.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TESC_RING 16

/* Length of the valid UTF-8 sequence at p (2..4), 0 when p[0] does not start one. */
static size_t utf8_len(const unsigned char *p, uint32_t *cp)
{
    size_t n;
    uint32_t c, min;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        n = 2, c = p[0] & 0x1f, min = 0x80;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        n = 3, c = p[0] & 0x0f, min = 0x800;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        n = 4, c = p[0] & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (p[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    *cp = c;
    return n;
}

static int shown_escaped(uint32_t c)
{
    return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f) || (c >= 0x202a && c <= 0x202e) ||
           (c >= 0x2066 && c <= 0x2069) || c == 0x200e || c == 0x200f || c == 0x061c;
}

size_t probe_tesc_to(char *dst, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)(s ? s : "(null)");
    size_t o = 0;
    if (cap == 0)
        return 0;
    while (*p) {
        uint32_t c = *p;
        size_t n = 1;
        int bad = 0;
        if (c >= 0x80) {
            n = utf8_len(p, &c);
            if (n == 0)
                n = 1, bad = 1;
        }
        char esc[16];
        size_t elen = 0;
        if (!bad && !shown_escaped(c)) {
            memcpy(esc, p, n);
            elen = n;
        } else if (c == '\n' || c == '\r' || c == '\t') {
            esc[0] = '\\';
            esc[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
            elen = 2;
        } else {
            for (size_t i = 0; i < n; i++) {
                esc[elen++] = '\\', esc[elen++] = 'x';
                esc[elen++] = hex[p[i] >> 4], esc[elen++] = hex[p[i] & 15];
            }
        }
        if (o + elen >= cap)
            break;
        memcpy(dst + o, esc, elen);
        o += elen;
        p += n;
    }
    dst[o] = 0;
    return o;
}

const char *probe_tesc(const char *s)
{
    static _Thread_local char *ring[TESC_RING];
    static _Thread_local size_t cap[TESC_RING];
    static _Thread_local unsigned next;
    size_t need = strlen(s ? s : "(null)") * 4 + 1; /* every byte at most "\xNN" */
    unsigned k = next++ % TESC_RING;
    if (cap[k] < need) {
        char *b = realloc(ring[k], need);
        if (b == NULL)
            return "(out of memory)";
        ring[k] = b, cap[k] = need;
    }
    probe_tesc_to(ring[k], cap[k], s);
    return ring[k];
}

/* ---- output files ---------------------------------------------------------- */

static void set_err(probe_outfile *o, const char *what, const char *path, int e)
{
    snprintf(o->err, sizeof o->err, "%s %s: %s", what, probe_tesc(path), strerror(e));
}

/* The file a write to path replaces: path itself, or a symlink's final target. */
static char *resolve_target(probe_outfile *o, const char *path, struct stat *st, int *exists)
{
    struct stat lst;
    *exists = 0;
    if (lstat(path, &lst) != 0) {
        if (errno != ENOENT) {
            set_err(o, "cannot write", path, errno);
            return NULL;
        }
        return strdup(path);
    }
    if (S_ISLNK(lst.st_mode)) {
        char *real = realpath(path, NULL);
        if (real == NULL) {
            snprintf(o->err, sizeof o->err, "cannot write %s: it is a symbolic link whose target "
                     "cannot be resolved (%s)", probe_tesc(path), strerror(errno));
            return NULL;
        }
        if (stat(real, st) != 0) {
            set_err(o, "cannot write", real, errno);
            free(real);
            return NULL;
        }
        *exists = 1;
        return real;
    }
    *st = lst;
    *exists = 1;
    return strdup(path);
}

static int make_tmp(probe_outfile *o, const char *path, int *fd_out)
{
    memset(o, 0, sizeof *o);
    struct stat st;
    int exists;
    char *target = resolve_target(o, path, &st, &exists);
    if (target == NULL)
        return -1;
    if (exists && !S_ISREG(st.st_mode)) {
        o->target = target;
        o->is_stream = 1;
        return 0;
    }
    const char *slash = strrchr(target, '/');
    size_t dlen = slash ? (size_t)(slash - target) + 1 : 0;
    const char *base = slash ? slash + 1 : target;
    size_t blen = strlen(base);
    char *tmp = malloc(dlen + blen + 16);
    if (tmp == NULL) {
        free(target);
        snprintf(o->err, sizeof o->err, "out of memory");
        return -1;
    }
    memcpy(tmp, target, dlen);
    snprintf(tmp + dlen, blen + 16, ".%s.XXXXXX", base);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", dlen ? (int)dlen : 1, dlen ? target : ".");
        snprintf(o->err, sizeof o->err, "cannot write %s: cannot create a temporary file in %s: %s",
                 probe_tesc(path), probe_tesc(dir), strerror(e));
        free(tmp);
        free(target);
        return -1;
    }
    mode_t mode;
    if (exists) {
        mode = st.st_mode & 07777;
    } else {
        mode_t um = umask(0);
        umask(um);
        mode = 0666 & ~um;
    }
    if (fchmod(fd, mode) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        set_err(o, "cannot set the mode of", tmp, e);
        free(tmp);
        free(target);
        return -1;
    }
    o->target = target;
    o->tmp = tmp;
    *fd_out = fd;
    return 0;
}

int probe_outfile_open(probe_outfile *o, const char *path)
{
    if (strcmp(path, "-") == 0) {
        memset(o, 0, sizeof *o);
        o->f = stdout;
        o->is_stream = 1;
        return 0;
    }
    int fd = -1;
    if (make_tmp(o, path, &fd) != 0)
        return -1;
    if (o->is_stream) {
        o->f = fopen(o->target, "w");
        if (o->f == NULL) {
            set_err(o, "cannot write", path, errno);
            free(o->target);
            o->target = NULL;
            return -1;
        }
        return 0;
    }
    o->f = fdopen(fd, "w");
    if (o->f == NULL) {
        int e = errno;
        close(fd);
        unlink(o->tmp);
        set_err(o, "cannot write", path, e);
        free(o->tmp), free(o->target);
        o->tmp = o->target = NULL;
        return -1;
    }
    return 0;
}

static void fsync_dir(const char *target)
{
    const char *slash = strrchr(target, '/');
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - target) + 1 : 1, slash ? target : ".");
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        (void)fsync(d);
        close(d);
    }
}

static void release(probe_outfile *o)
{
    free(o->tmp), free(o->target);
    o->tmp = o->target = NULL;
    o->f = NULL;
}

int probe_outfile_commit(probe_outfile *o)
{
    FILE *f = o->f;
    if (f == NULL)
        return -1;
    const char *shown = o->target ? o->target : "stdout";
    int e = 0;
    errno = 0;
    if (fflush(f) != 0 || ferror(f))
        e = errno ? errno : EIO;
    if (!e && o->tmp && fsync(fileno(f)) != 0)
        e = errno;
    if (f != stdout) {
        if (fclose(f) != 0 && !e)
            e = errno ? errno : EIO;
    }
    if (!e && o->tmp && rename(o->tmp, o->target) != 0)
        e = errno;
    if (e) {
        if (o->tmp) {
            unlink(o->tmp);
            snprintf(o->err, sizeof o->err, "cannot write %s: %s (the file is unchanged)",
                     probe_tesc(shown), strerror(e));
        } else {
            snprintf(o->err, sizeof o->err, "cannot write %s: %s", probe_tesc(shown), strerror(e));
        }
        release(o);
        return -1;
    }
    if (o->tmp)
        fsync_dir(o->target);
    release(o);
    return 0;
}

void probe_outfile_abort(probe_outfile *o)
{
    if (o->f && o->f != stdout)
        fclose(o->f);
    if (o->tmp)
        unlink(o->tmp);
    release(o);
}

int probe_outfile_check(probe_outfile *o, const char *path)
{
    memset(o, 0, sizeof *o);
    if (strcmp(path, "-") == 0)
        return 0;
    int fd = -1; /* make_tmp leaves a non-regular target unopened (fd -1) */
    if (make_tmp(o, path, &fd) != 0)
        return -1;
    if (fd >= 0)
        close(fd);
    if (o->tmp)
        unlink(o->tmp);
    release(o);
    return 0;
}

int probe_outfile_reserve(probe_outfile *o, const char *path)
{
    int fd = -1;
    if (make_tmp(o, path, &fd) != 0)
        return -1;
    if (o->is_stream) {
        snprintf(o->err, sizeof o->err, "cannot write %s: not a regular file", probe_tesc(path));
        release(o);
        return -1;
    }
    close(fd);
    return 0;
}

int probe_outfile_commit_path(probe_outfile *o)
{
    int e = 0;
    int fd = open(o->tmp, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        e = errno;
    if (fd >= 0)
        close(fd);
    if (!e && rename(o->tmp, o->target) != 0)
        e = errno;
    if (e) {
        unlink(o->tmp);
        snprintf(o->err, sizeof o->err, "cannot write %s: %s (the file is unchanged)",
                 probe_tesc(o->target), strerror(e));
        release(o);
        return -1;
    }
    fsync_dir(o->target);
    release(o);
    return 0;
}
