/* bench/write_paths.c - how fast bytes from memory reach one file: the write
 * paths a capture writer can take, each against the baseline measured in the
 * same run.
 *
 *   cc -O2 -pthread -o write_paths bench/write_paths.c
 *   write_paths DIR [GIB] [THREADS...]   (THREADS default: 2, 4, 8 as the cores allow)
 *
 * Writes GIB GiB (default 2) of non-zero bytes from an 8 MiB source buffer
 * (as a staging ring's slot would hold) into a new file in DIR, five ways:
 *
 *   pwrite          one thread, pwrite(2) of 8 MiB pieces in file order (the
 *                   baseline: probe's writer today)
 *   pwrite-T        T threads, each pwrite(2) of its own 8 MiB pieces of the
 *                   same file (Linux takes the inode's lock for a buffered
 *                   write, so this measures whether that serializes them)
 *   fallocate+mmap-T the file's blocks reserved with fallocate(2), mapped
 *                   shared, and T threads memcpy disjoint pieces into it
 *   mmap-T          the same without the fallocate (pages allocated at the
 *                   first touch)
 *   files-T         T threads, each pwrite(2) into a file of its own (the
 *                   ceiling for T writers: no shared inode)
 *
 * Each way runs REPEAT (5) times after one untimed run of the baseline, a
 * fresh file each time, its pages freed (unlinked) after each run; it prints GB/s (1e9 bytes) min/median/max
 * and the ratio of each median to the baseline's median. fsync is not
 * called: this is the rate into the page cache (tmpfs: into memory), the
 * rate a capture writer's drain sees. Exit 0, or 2 with one line on a bad
 * argument or an I/O error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PIECE ((size_t)8 << 20)
#define REPEAT 5
#define MAX_THREADS 64

static unsigned char *src;
static size_t total;
static char dir[4096];

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "write_paths: %s: %s\n", what, strerror(errno));
    exit(2);
}

static int pwrite_full(int fd, const unsigned char *b, size_t n, off_t off)
{
    while (n > 0) {
        ssize_t k = pwrite(fd, b, n, off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

typedef enum { W_PWRITE, W_MMAP, W_FILES } way;

typedef struct {
    way how;
    int fd;               /* the shared file (W_PWRITE), or this thread's (W_FILES) */
    unsigned char *map;   /* W_MMAP */
    int t, nthreads;
    int failed;
} worker;

/* Piece i of the file belongs to thread i % nthreads. */
static void *work(void *arg)
{
    worker *w = arg;
    size_t npieces = total / PIECE;
    for (size_t i = (size_t)w->t; i < npieces; i += (size_t)w->nthreads) {
        off_t off = (off_t)(i * PIECE);
        if (w->how == W_FILES)
            off = (off_t)((i / (size_t)w->nthreads) * PIECE);
        if (w->how == W_MMAP)
            memcpy(w->map + i * PIECE, src, PIECE);
        else if (pwrite_full(w->fd, src, PIECE, off) != 0) {
            w->failed = errno ? errno : EIO;
            break;
        }
    }
    return NULL;
}

/* One timed run; returns GB/s. */
static double run(way how, int nthreads, int reserve)
{
    char path[4200];
    int fds[MAX_THREADS];
    int nfiles = how == W_FILES ? nthreads : 1;
    for (int f = 0; f < nfiles; f++) {
        snprintf(path, sizeof path, "%s/write_paths.%d.%d", dir, (int)getpid(), f);
        if ((fds[f] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600)) < 0)
            die(path);
        unlink(path);
    }
    double t0 = now();
    unsigned char *map = NULL;
    if (how == W_MMAP) {
        if (reserve) {
            int e = posix_fallocate(fds[0], 0, (off_t)total);
            if (e != 0) {
                errno = e;
                die("fallocate");
            }
        } else if (ftruncate(fds[0], (off_t)total) != 0) {
            die("ftruncate");
        }
        map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
        if (map == MAP_FAILED)
            die("mmap");
    }
    pthread_t th[MAX_THREADS];
    worker w[MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        w[t] = (worker){how, fds[how == W_FILES ? t : 0], map, t, nthreads, 0};
        if (pthread_create(&th[t], NULL, work, &w[t]) != 0)
            die("pthread_create");
    }
    for (int t = 0; t < nthreads; t++)
        pthread_join(th[t], NULL);
    if (map != NULL && munmap(map, total) != 0)
        die("munmap");
    double dt = now() - t0;
    for (int t = 0; t < nthreads; t++)
        if (w[t].failed) {
            errno = w[t].failed;
            die("write");
        }
    for (int f = 0; f < nfiles; f++)
        close(fds[f]);
    return (double)total / dt / 1e9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double report(const char *name, way how, int nthreads, int reserve, double base)
{
    double r[REPEAT];
    for (int i = 0; i < REPEAT; i++)
        r[i] = run(how, nthreads, reserve);
    qsort(r, REPEAT, sizeof r[0], cmp);
    double med = r[REPEAT / 2];
    printf("%-22s %6.2f %6.2f %6.2f GB/s   x%.2f of pwrite\n", name, r[0], med, r[REPEAT - 1],
           base > 0 ? med / base : 1.0);
    return med;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: write_paths DIR [GIB] [THREADS...]\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    double gib = argc > 2 ? strtod(argv[2], NULL) : 2.0;
    if (!(gib > 0 && gib <= 64)) {
        fprintf(stderr, "write_paths: GIB %s: not in (0, 64]\n", argv[2]);
        return 2;
    }
    total = (size_t)(gib * (double)(1u << 30)) / PIECE * PIECE;
    if (total == 0)
        total = PIECE;
    int threads[16], nt = 0;
    for (int i = 3; i < argc && nt < 16; i++) {
        int t = atoi(argv[i]);
        if (t < 1 || t > MAX_THREADS) {
            fprintf(stderr, "write_paths: THREADS %s: not in 1..%d\n", argv[i], MAX_THREADS);
            return 2;
        }
        threads[nt++] = t;
    }
    if (nt == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads[nt++] = 2;
        if (c >= 4)
            threads[nt++] = 4;
        if (c >= 8)
            threads[nt++] = 8;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if ((src = malloc(PIECE)) == NULL)
        die("malloc");
    for (size_t i = 0; i < PIECE; i++)
        src[i] = (unsigned char)(i * 2654435761u >> 24) | 1;
    printf("write_paths: %.2f GB into %s, %zu MiB pieces, %d runs each (min median max)\n",
           (double)total / 1e9, dir, PIECE >> 20, REPEAT);
    run(W_PWRITE, 1, 0);
    double base = report("pwrite (baseline)", W_PWRITE, 1, 0, 0);
    for (int i = 0; i < nt; i++) {
        char name[64];
        int t = threads[i];
        if (t == 1)
            continue;
        snprintf(name, sizeof name, "pwrite-%d", t);
        report(name, W_PWRITE, t, 0, base);
        snprintf(name, sizeof name, "fallocate+mmap-%d", t);
        report(name, W_MMAP, t, 1, base);
        snprintf(name, sizeof name, "mmap-%d", t);
        report(name, W_MMAP, t, 0, base);
        snprintf(name, sizeof name, "files-%d", t);
        report(name, W_FILES, t, 0, base);
    }
    report("fallocate+mmap-1", W_MMAP, 1, 1, base);
    report("pwrite (baseline again)", W_PWRITE, 1, 0, base);
    free(src);
    return 0;
}
