/* probe/capture/hasher.h - a thread that adds bytes to an XXH64 state while
 * the caller writes the same bytes to the file (the writer's streamed put:
 * probe/capture/writer.c). Internal to libprobe. */
#ifndef PROBE_CAPTURE_HASHER_H
#define PROBE_CAPTURE_HASHER_H

#include <stddef.h>

#include <xxhash.h>

typedef struct probe_hasher probe_hasher;

/* A hashing thread, with every signal blocked; NULL when it cannot be
 * started (out of memory, pthread_create failed): the caller hashes itself. */
probe_hasher *probe_hasher_start(void);

/* Start XXH64_update(state, data, len) on the thread. 0: started (call
 * probe_hasher_wait before touching state or data again); -1: not started
 * (h is NULL, or the calling process is not the one that started h, as in
 * the child of a fork, where the thread does not exist): nothing happened. */
int probe_hasher_post(probe_hasher *h, XXH64_state_t *state, const void *data, size_t len);

/* Wait until the update that probe_hasher_post started has finished. */
void probe_hasher_wait(probe_hasher *h);

/* Stop and join the thread and free h (NULL: nothing). In another process
 * than the one that started it, only the memory is freed. */
void probe_hasher_stop(probe_hasher *h);

#endif
