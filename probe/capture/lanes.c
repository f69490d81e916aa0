/* probe/capture/lanes.c - the raw files of a capture and their writing
 * threads (lanes.h). */
#include "lanes.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "probe/status.h"

typedef struct {
    const unsigned char *src;
    size_t len;
    uint64_t off;
} lane_io;

typedef struct lane {
    struct probe_lanes *set;
    int fd;
    uint64_t end;     /* bytes placed in the file */
    char name[300];   /* "<base>.raw/NN" */
    pthread_t thread;
    int started;
    lane_io *io;      /* the writes of the call, listed by the caller */
    size_t nio, cap;
    int posted;       /* (under the lock) io is this lane's thread's to write */
    int err;          /* (under the lock) the first errno of the posted writes, 0 */
} lane;

struct probe_lanes {
    unsigned k;
    lane lane[PROBE_RAW_FILES_MAX];
    pid_t pid;             /* the process whose threads these are */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned busy;         /* posted lanes still writing */
    int quit;
    int threads_failed;    /* a thread could not start: the caller writes alone */
    uint64_t last_start[PROBE_RAW_FILES_MAX]; /* each file's end before the last placement */
};

int probe_raw_name_parse(const char *name, size_t *dir_len, unsigned *lane)
{
    const char *slash = strchr(name, '/');
    size_t sfx = sizeof PROBE_RAW_SUFFIX - 1;
    if (slash == NULL || (size_t)(slash - name) <= sfx ||
        memcmp(slash - sfx, PROBE_RAW_SUFFIX, sfx) != 0)
        return 0;
    const char *d = slash + 1;
    if (d[0] < '0' || d[0] > '9' || d[1] < '0' || d[1] > '9' || d[2] != '\0')
        return 0;
    unsigned n = (unsigned)(d[0] - '0') * 10 + (unsigned)(d[1] - '0');
    if (n >= PROBE_RAW_FILES_MAX)
        return 0;
    *dir_len = (size_t)(slash - name);
    *lane = n;
    return 1;
}

int probe_raw_efl_read(long long dcpl_id, char *dir, size_t dir_cap, probe_raw_seg **segs,
                       size_t *nsegs)
{
    hid_t dcpl = (hid_t)dcpl_id;
    probe_raw_seg *s = NULL;
    if (segs != NULL)
        *segs = NULL;
    *nsegs = 0;
    if (dir_cap > 0)
        dir[0] = '\0';
    int n = H5Pget_external_count(dcpl);
    if (n == 0)
        return 0;
    if (n < 0)
        return -1;
    if (segs != NULL && (s = malloc((size_t)n * sizeof *s)) == NULL)
        return -2;
    char name[512], first[512] = "";
    for (int i = 0; i < n; i++) {
        off_t off = 0;
        hsize_t size = 0;
        size_t dlen = 0;
        unsigned lane = 0;
        name[0] = '\0';
        int ok = H5Pget_external(dcpl, (unsigned)i, sizeof name, name, &off, &size) >= 0;
        name[sizeof name - 1] = '\0';
        if (i == 0)
            snprintf(first, sizeof first, "%s", name);
        ok = ok && off >= 0 && size != H5F_UNLIMITED && probe_raw_name_parse(name, &dlen, &lane) &&
             (i == 0 ? dlen < sizeof first : dlen == strlen(first) && strncmp(name, first, dlen) == 0);
        if (!ok) {
            size_t j = 0;
            for (; name[j] != '\0' && j + 1 < dir_cap; j++)
                dir[j] = (unsigned char)name[j] < 0x20 || name[j] == 0x7f ? '?' : name[j];
            if (dir_cap > 0)
                dir[j] = '\0';
            free(s);
            return -1;
        }
        if (i == 0)
            first[dlen] = '\0';
        if (s != NULL)
            s[i] = (probe_raw_seg){lane, (uint64_t)off, (uint64_t)size};
    }
    snprintf(dir, dir_cap, "%s", first);
    if (segs != NULL)
        *segs = s;
    *nsegs = (size_t)n;
    return 1;
}

int probe_pwrite_all(int fd, const void *src, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, (const unsigned char *)src + done, n - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w == 0 ? ENOSPC : errno;
        done += (size_t)w;
    }
    return 0;
}

static int run_lane(lane *ln)
{
    for (size_t i = 0; i < ln->nio; i++) {
        int e = probe_pwrite_all(ln->fd, ln->io[i].src, ln->io[i].len, ln->io[i].off);
        if (e != 0)
            return e;
    }
    return 0;
}

static void *lane_main(void *arg)
{
    lane *ln = arg;
    probe_lanes *l = ln->set;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        while (!l->quit && !ln->posted)
            pthread_cond_wait(&l->cond, &l->lock);
        if (!ln->posted) /* quit, nothing posted */
            break;
        pthread_mutex_unlock(&l->lock);
        int e = run_lane(ln); /* the caller does not touch ln->io while it is posted */
        pthread_mutex_lock(&l->lock);
        ln->err = e;
        ln->posted = 0;
        if (--l->busy == 0)
            pthread_cond_broadcast(&l->cond);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

probe_status probe_lanes_open(const char *capture_path, unsigned k, int append, probe_lanes **out)
{
    *out = NULL;
    if (k == 0 || k > PROBE_RAW_FILES_MAX)
        return probe_set_error(PROBE_EINVAL, "probe_lanes_open: %u raw files (1 to %u)", k,
                               PROBE_RAW_FILES_MAX);
    const char *base = strrchr(capture_path, '/');
    base = base != NULL ? base + 1 : capture_path;
    size_t plen = strlen(capture_path);
    char *dir = malloc(plen + sizeof PROBE_RAW_SUFFIX);
    probe_lanes *l = calloc(1, sizeof *l);
    if (dir == NULL || l == NULL || strlen(base) + sizeof PROBE_RAW_SUFFIX + 3 > sizeof l->lane[0].name) {
        free(dir);
        free(l);
        return probe_set_error(dir == NULL || l == NULL ? PROBE_ENOMEM : PROBE_EINVAL,
                               "%s: %s", capture_path,
                               dir == NULL || l == NULL ? "out of memory" : "name too long for raw files");
    }
    memcpy(dir, capture_path, plen);
    memcpy(dir + plen, PROBE_RAW_SUFFIX, sizeof PROBE_RAW_SUFFIX);
    probe_status s = PROBE_OK;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        s = probe_set_error(PROBE_EIO, "%s: cannot create the raw files' folder: %s", dir,
                            strerror(errno));
    int dfd = s == PROBE_OK ? open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    if (s == PROBE_OK && dfd < 0)
        s = probe_set_error(PROBE_EIO, "%s: cannot open the raw files' folder: %s%s", dir,
                            strerror(errno), errno == ELOOP || errno == ENOTDIR ?
                            " (it must be a folder, not a symbolic link)" : "");
    l->k = k;
    for (unsigned i = 0; i < PROBE_RAW_FILES_MAX; i++)
        l->lane[i].fd = -1;
    for (unsigned i = 0; s == PROBE_OK && i < k; i++) {
        lane *ln = &l->lane[i];
        ln->set = l;
        char leaf[4];
        snprintf(leaf, sizeof leaf, "%02u", i);
        snprintf(ln->name, sizeof ln->name, "%s%s/%s", base, PROBE_RAW_SUFFIX, leaf);
        ln->fd = openat(dfd, leaf, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (append ? 0 : O_TRUNC),
                        0666);
        struct stat st;
        if (ln->fd < 0 || fstat(ln->fd, &st) != 0 || !S_ISREG(st.st_mode))
            s = probe_set_error(PROBE_EIO, "%s/%s: cannot open raw file: %s", dir, leaf,
                                ln->fd < 0 || errno != 0 ? strerror(errno) : "not a regular file");
        else
            ln->end = append ? (uint64_t)st.st_size : 0;
    }
    if (dfd >= 0)
        close(dfd);
    free(dir);
    if (s == PROBE_OK && pthread_mutex_init(&l->lock, NULL) != 0)
        s = probe_set_error(PROBE_ENOMEM, "%s: cannot make the raw files' lock", capture_path);
    else if (s == PROBE_OK && pthread_cond_init(&l->cond, NULL) != 0) {
        pthread_mutex_destroy(&l->lock);
        s = probe_set_error(PROBE_ENOMEM, "%s: cannot make the raw files' lock", capture_path);
    }
    if (s != PROBE_OK) {
        for (unsigned i = 0; i < k; i++)
            if (l->lane[i].fd >= 0)
                close(l->lane[i].fd);
        free(l);
        return s;
    }
    l->pid = getpid();
    *out = l;
    return PROBE_OK;
}

unsigned probe_lanes_count(const probe_lanes *l)
{
    return l->k;
}

const char *probe_lanes_name(const probe_lanes *l, unsigned i)
{
    return l->lane[i].name;
}

int probe_lanes_fd(const probe_lanes *l, unsigned i)
{
    return l->lane[i].fd;
}

probe_status probe_lanes_place(probe_lanes *l, uint64_t nbytes, uint64_t stripe, unsigned first,
                               probe_raw_seg **segs, size_t *nsegs)
{
    *segs = NULL;
    *nsegs = 0;
    if (stripe == 0 || nbytes == 0)
        return probe_set_error(PROBE_EINVAL, "probe_lanes_place: %s is 0", stripe ? "nbytes" : "stripe");
    uint64_t n = (nbytes + stripe - 1) / stripe;
    probe_raw_seg *s = n <= SIZE_MAX / sizeof *s ? malloc((size_t)n * sizeof *s) : NULL;
    if (s == NULL)
        return probe_set_error(PROBE_ENOMEM, "probe_lanes_place: out of memory");
    for (unsigned i = 0; i < l->k; i++)
        l->last_start[i] = l->lane[i].end;
    for (uint64_t i = 0; i < n; i++) {
        unsigned ln = (unsigned)((first + i) % l->k);
        uint64_t size = i + 1 < n ? stripe : nbytes - i * stripe;
        s[i] = (probe_raw_seg){ln, l->lane[ln].end, size};
        l->lane[ln].end += size;
    }
    *segs = s;
    *nsegs = (size_t)n;
    return PROBE_OK;
}

void probe_lanes_unplace(probe_lanes *l)
{
    for (unsigned i = 0; i < l->k; i++)
        l->lane[i].end = l->last_start[i];
}

static int start_threads(probe_lanes *l)
{
    if (l->threads_failed)
        return 0;
    for (unsigned i = 0; i < l->k; i++) {
        lane *ln = &l->lane[i];
        if (ln->started)
            continue;
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int rc = pthread_create(&ln->thread, NULL, lane_main, ln);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            l->threads_failed = 1;
            return 0;
        }
        ln->started = 1;
    }
    return 1;
}

static int add_io(lane *ln, const unsigned char *src, size_t len, uint64_t off)
{
    if (ln->nio == ln->cap) {
        size_t cap = ln->cap ? 2 * ln->cap : 8;
        lane_io *io = realloc(ln->io, cap * sizeof *io);
        if (io == NULL)
            return ENOMEM;
        ln->io = io;
        ln->cap = cap;
    }
    ln->io[ln->nio++] = (lane_io){src, len, off};
    return 0;
}

int probe_lanes_write(probe_lanes *l, const probe_raw_seg *segs, size_t nsegs, uint64_t at,
                      const void *src, size_t len)
{
    if (len == 0)
        return 0;
    /* the piece holding byte `at`: pieces are in tensor order */
    size_t i = 0;
    uint64_t start = 0;
    while (i < nsegs && start + segs[i].size <= at)
        start += segs[i++].size;
    const unsigned char *p = src;
    int e = 0;
    unsigned mine = i < nsegs ? segs[i].lane : 0;
    for (unsigned k = 0; k < l->k; k++)
        l->lane[k].nio = 0;
    for (size_t left = len; left > 0 && e == 0; i++) {
        if (i >= nsegs)
            return EINVAL;
        uint64_t in = at - start, n = segs[i].size - in;
        if (n > left)
            n = left;
        e = add_io(&l->lane[segs[i].lane], p, (size_t)n, segs[i].offset + in);
        p += n;
        at += n;
        left -= (size_t)n;
        start += segs[i].size;
    }
    if (e != 0)
        return e;
    int threads = l->pid == getpid() && start_threads(l);
    if (!threads) { /* in a fork's child, or no threads: one lane after another */
        for (unsigned k = 0; k < l->k && e == 0; k++)
            e = run_lane(&l->lane[k]);
        return e;
    }
    /* every other lane's list to its thread; the caller writes its own */
    pthread_mutex_lock(&l->lock);
    l->busy = 0;
    for (unsigned k = 0; k < l->k; k++)
        if (k != mine && l->lane[k].nio > 0) {
            l->lane[k].err = 0;
            l->lane[k].posted = 1;
            l->busy++;
        }
    if (l->busy > 0)
        pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    e = run_lane(&l->lane[mine]);
    pthread_mutex_lock(&l->lock);
    while (l->busy > 0)
        pthread_cond_wait(&l->cond, &l->lock);
    for (unsigned k = 0; k < l->k && e == 0; k++)
        if (k != mine)
            e = l->lane[k].err;
    pthread_mutex_unlock(&l->lock);
    return e;
}

void probe_lanes_close(probe_lanes *l)
{
    if (l == NULL)
        return;
    if (l->pid == getpid()) {
        pthread_mutex_lock(&l->lock);
        l->quit = 1;
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
        for (unsigned i = 0; i < l->k; i++)
            if (l->lane[i].started)
                pthread_join(l->lane[i].thread, NULL);
    }
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    for (unsigned i = 0; i < l->k; i++) {
        if (l->lane[i].fd >= 0)
            close(l->lane[i].fd);
        free(l->lane[i].io);
    }
    free(l);
}
