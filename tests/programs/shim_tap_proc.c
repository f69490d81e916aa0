/* shim_tap_proc.c - process-level behaviour of the shim: ownership across
 * fork and exec, failure to write the file, inactive shim, flush.
 *
 * usage:
 *   shim_tap_proc simple TAG N STATUS   print two fixed lines on stdout, tap N
 *                                       float32 tensors /TAG/<i:04>/out, exit STATUS;
 *                                       return codes go to stderr as "rc ..." lines
 *   shim_tap_proc fork                  tap in the parent, in a forked child (which
 *                                       exits normally), and in an exec'd grandchild
 *   shim_tap_proc notap                 never tap
 *   shim_tap_proc flushwait N           tap N tensors, flush, print "flushed", then
 *                                       wait for a line on stdin before exiting
 *   shim_tap_proc forkstorm N           while a thread taps 150 tensors of 256 KiB
 *                                       (/storm/<i>/out, element k = i * 65536 + k as
 *                                       float32), fork N children that exit() at once;
 *                                       a child still alive after 10 s is a hang
 *                                       (killed, reported)
 * Tensor i holds {i, i + 0.25, i + 0.5, i + 0.75}.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "probe/dtype.h"
#include "probe/tap.h"
#include "tap_client.h"

typedef int (*tap_fn)(const probe_tap_tensor_v1 *);
typedef int (*int_fn)(void);

static tap_fn tap;
static int_fn enabled, flush;

static int tap_one(const char *component, long long i)
{
    float v[4] = {(float)i, (float)i + 0.25f, (float)i + 0.5f, (float)i + 0.75f};
    int64_t shape[1] = {4};
    probe_tap_tensor_v1 t = tap_desc(component, i, -1);
    t.dtype = PROBE_DTYPE_FLOAT32;
    t.rank = 1;
    t.shape = shape;
    t.data = v;
    return tap(&t);
}

static int simple(const char *tag, int n, int status)
{
    printf("program output: line one\n");
    fflush(stdout);
    for (int i = 0; i < n; ++i)
        fprintf(stderr, "rc %s %d = %d\n", tag, i, tap_one(tag, i));
    fprintf(stderr, "rc enabled = %d\n", enabled());
    fprintf(stderr, "rc flush = %d\n", flush());
    printf("program output: line two\n");
    return status;
}

static int forks(const char *self)
{
    printf("parent pid %ld\n", (long)getpid());
    printf("parent tap0 rc=%d\n", tap_one("parent", 0));
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        int rc = tap_one("child", 0);
        int rc2 = tap_one("child", 1);
        printf("child pid %ld rc=%d,%d enabled=%d flush=%d\n", (long)getpid(), rc, rc2, enabled(),
               flush());
        exit(0); /* a normal exit: atexit handlers and destructors run in the child */
    }
    int st;
    waitpid(c, &st, 0);
    printf("child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    printf("parent tap1 rc=%d\n", tap_one("parent", 1));
    fflush(stdout);
    pid_t g = fork();
    if (g == 0) {
        execl(self, self, "simple", "grandchild", "2", "0", (char *)NULL);
        _exit(127);
    }
    waitpid(g, &st, 0);
    printf("grandchild status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    printf("parent tap2 rc=%d\n", tap_one("parent", 2));
    printf("parent enabled=%d\n", enabled());
    return 0;
}

static void *storm_tapper(void *arg)
{
    (void)arg;
    const int64_t n = 65536;
    float *v = malloc((size_t)n * sizeof *v);
    for (int i = 0; i < 150; ++i) {
        for (int64_t k = 0; k < n; ++k)
            v[k] = (float)(i * 65536 + k);
        probe_tap_tensor_v1 t = tap_desc("storm", i, -1);
        t.dtype = PROBE_DTYPE_FLOAT32;
        t.rank = 1;
        t.shape = &n;
        t.data = v;
        if (tap(&t) != 0)
            fprintf(stderr, "storm tap %d failed\n", i);
    }
    free(v);
    return NULL;
}

/* Children forked while the writer thread is busy in HDF5 must still exit. */
static int forkstorm(int nchildren)
{
    pthread_t th;
    pthread_create(&th, NULL, storm_tapper, NULL);
    int hung = 0;
    for (int c = 0; c < nchildren; ++c) {
        pid_t pid = fork();
        if (pid == 0)
            exit(0); /* atexit handlers (HDF5's among them) and destructors run */
        int st = 0, done = 0;
        for (int w = 0; w < 1000 && !done; ++w) {
            if (waitpid(pid, &st, WNOHANG) == pid) {
                done = 1;
                break;
            }
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        if (!done) {
            ++hung;
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
    }
    pthread_join(th, NULL);
    printf("forkstorm: %d children, %d hung\n", nchildren, hung);
    return hung ? 1 : 0;
}

int main(int argc, char **argv)
{
    tap = (tap_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_v1");
    enabled = (int_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_enabled_v1");
    flush = (int_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_flush_v1");
    if (!tap || !enabled || !flush) {
        fprintf(stderr, "tap ABI not found: is libprobe_intercept.so preloaded?\n");
        return 2;
    }
    if (argc == 5 && strcmp(argv[1], "simple") == 0)
        return simple(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (argc == 2 && strcmp(argv[1], "fork") == 0)
        return forks(argv[0]);
    if (argc == 2 && strcmp(argv[1], "notap") == 0)
        return 0;
    if (argc == 3 && strcmp(argv[1], "forkstorm") == 0)
        return forkstorm(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "flushwait") == 0) {
        int n = atoi(argv[2]), bad = 0;
        for (int i = 0; i < n; ++i)
            bad += tap_one("flushed", i) != 0;
        printf("flushed rc=%d bad=%d\n", flush(), bad);
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin))
            return 3;
        return tap_one("late", 0) == 0 ? 0 : 4;
    }
    fprintf(stderr, "usage: %s simple TAG N STATUS | fork | notap | flushwait N | forkstorm N\n", argv[0]);
    return 2;
}
