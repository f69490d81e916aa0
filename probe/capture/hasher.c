/* probe/capture/hasher.c - the XXH64 of a streamed put's bytes, computed on
 * a thread of its own while the writer's thread writes them (hasher.h). */
#include "hasher.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

struct probe_hasher {
    pthread_t thread;
    pid_t pid; /* the process the thread runs in */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    XXH64_state_t *state; /* the posted update */
    const void *data;
    size_t len;
    int pending; /* an update is posted and not finished */
    int quit;
};

static void *hasher_main(void *arg)
{
    probe_hasher *h = arg;
    pthread_mutex_lock(&h->lock);
    for (;;) {
        while (!h->quit && !h->pending)
            pthread_cond_wait(&h->cond, &h->lock);
        if (!h->pending) /* quit, nothing pending */
            break;
        XXH64_state_t *st = h->state;
        const void *data = h->data;
        size_t len = h->len;
        pthread_mutex_unlock(&h->lock);
        XXH64_update(st, data, len);
        pthread_mutex_lock(&h->lock);
        h->pending = 0;
        pthread_cond_broadcast(&h->cond);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

probe_hasher *probe_hasher_start(void)
{
    probe_hasher *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    if (pthread_mutex_init(&h->lock, NULL) != 0) {
        free(h);
        return NULL;
    }
    if (pthread_cond_init(&h->cond, NULL) != 0) {
        pthread_mutex_destroy(&h->lock);
        free(h);
        return NULL;
    }
    h->pid = getpid();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&h->thread, NULL, hasher_main, h);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&h->cond);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return NULL;
    }
    return h;
}

int probe_hasher_post(probe_hasher *h, XXH64_state_t *state, const void *data, size_t len)
{
    if (h == NULL || h->pid != getpid())
        return -1;
    pthread_mutex_lock(&h->lock);
    while (h->pending) /* one update at a time */
        pthread_cond_wait(&h->cond, &h->lock);
    h->state = state;
    h->data = data;
    h->len = len;
    h->pending = 1;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    return 0;
}

void probe_hasher_wait(probe_hasher *h)
{
    if (h == NULL || h->pid != getpid())
        return;
    pthread_mutex_lock(&h->lock);
    while (h->pending)
        pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
}

void probe_hasher_stop(probe_hasher *h)
{
    if (h == NULL)
        return;
    if (h->pid == getpid()) {
        pthread_mutex_lock(&h->lock);
        h->quit = 1;
        pthread_cond_broadcast(&h->cond);
        pthread_mutex_unlock(&h->lock);
        pthread_join(h->thread, NULL);
        pthread_cond_destroy(&h->cond);
        pthread_mutex_destroy(&h->lock);
    }
    free(h);
}
