/* pathset.c - the set of dataset paths already captured in this run, so a
 * second tap of the same path is refused at the tap (PROBE_EINVAL) instead
 * of failing later inside the writer thread. Chained hash table, FNV-1a. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <stdint.h>

#include "base/pathset.h"

struct node {
    struct node *next;
    uint64_t hash;
    char path[];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct node **buckets;
static size_t nbuckets, count;

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; ++s) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static int grow(void)
{
    size_t nb = nbuckets ? nbuckets * 2 : 1024;
    struct node **nbk = calloc(nb, sizeof *nbk);
    if (!nbk)
        return -1;
    for (size_t i = 0; i < nbuckets; ++i) {
        struct node *e = buckets[i];
        while (e) {
            struct node *next = e->next;
            size_t b = e->hash & (nb - 1);
            e->next = nbk[b];
            nbk[b] = e;
            e = next;
        }
    }
    free(buckets);
    buckets = nbk;
    nbuckets = nb;
    return 0;
}

int shim_pathset_insert(const char *path)
{
    uint64_t h = fnv1a(path);
    int rc = 1;
    pthread_mutex_lock(&lock);
    if (count >= nbuckets && grow() != 0 && !buckets) {
        rc = -1;
        goto out;
    }
    size_t b = h & (nbuckets - 1);
    for (struct node *e = buckets[b]; e; e = e->next) {
        if (e->hash == h && strcmp(e->path, path) == 0) {
            rc = 0;
            goto out;
        }
    }
    size_t len = strlen(path);
    struct node *e = malloc(sizeof *e + len + 1);
    if (!e) {
        rc = -1;
        goto out;
    }
    e->hash = h;
    memcpy(e->path, path, len + 1);
    e->next = buckets[b];
    buckets[b] = e;
    ++count;
out:
    pthread_mutex_unlock(&lock);
    return rc;
}

void shim_pathset_remove(const char *path)
{
    uint64_t h = fnv1a(path);
    pthread_mutex_lock(&lock);
    if (buckets) {
        struct node **pp = &buckets[h & (nbuckets - 1)];
        for (; *pp; pp = &(*pp)->next) {
            struct node *e = *pp;
            if (e->hash == h && strcmp(e->path, path) == 0) {
                *pp = e->next;
                free(e);
                --count;
                break;
            }
        }
    }
    pthread_mutex_unlock(&lock);
}
