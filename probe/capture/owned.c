/* owned.c - the capture files this process's writers hold open (journal.h:
 * probe_writer_owned_set_, probe_writer_owns_), so that a reader in the same
 * process opens such a file through HDF5, which shares the writer's open
 * file, rather than through its journal; and the content hash of a tensor's
 * bytes (capture.h: probe_capture_hash). */
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "probe/capture.h"
#include "journal.h"

/* (st_dev, st_ino) of every capture file an open writer of this process
 * holds: a reader in the same process opens such a file through HDF5 (which
 * shares the writer's open file) rather than through its journal. */
#define OWNED_MAX 64
static struct {
    pthread_mutex_t lock;
    uint64_t dev[OWNED_MAX], ino[OWNED_MAX];
    int n;
} owned = {.lock = PTHREAD_MUTEX_INITIALIZER};

void probe_writer_owned_set_(int fd, int add)
{
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return;
    pthread_mutex_lock(&owned.lock);
    for (int i = 0; i < owned.n; i++)
        if (owned.dev[i] == (uint64_t)st.st_dev && owned.ino[i] == (uint64_t)st.st_ino) {
            owned.n--;
            owned.dev[i] = owned.dev[owned.n];
            owned.ino[i] = owned.ino[owned.n];
            break;
        }
    if (add && owned.n < OWNED_MAX) {
        owned.dev[owned.n] = (uint64_t)st.st_dev;
        owned.ino[owned.n] = (uint64_t)st.st_ino;
        owned.n++;
    }
    pthread_mutex_unlock(&owned.lock);
}

int probe_writer_owns_(uint64_t dev, uint64_t ino)
{
    int r = 0;
    pthread_mutex_lock(&owned.lock);
    for (int i = 0; i < owned.n && !r; i++)
        r = owned.dev[i] == dev && owned.ino[i] == ino;
    pthread_mutex_unlock(&owned.lock);
    return r;
}

uint64_t probe_capture_hash(const void *data, size_t n)
{
    static const unsigned char empty = 0;
    return (uint64_t)XXH64(data != NULL ? data : &empty, n, 0);
}
