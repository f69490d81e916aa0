/* exits_proc.c - a tapping process that ends without a normal exit.
 *
 * usage: exits_proc HOW N KB IMAGE
 *   taps N float32 tensors /exits/<i:04>/out of KB KiB each, element k of
 *   tensor i = IMAGE * 4000000 + i * 1000 + k % 1000 (exact in float32 for
 *   i < 4000), prints "tapped N" on stdout, then ends by HOW:
 *     exit        return 0 from main
 *     _exit, _Exit, quick_exit    that call with status 7
 *     abort       abort()
 *     term, int, hup              kill(getpid(), SIGTERM / SIGINT / SIGHUP)
 *     kill        kill(getpid(), SIGKILL)
 *     wait        pause() until a signal ends the process (sent from outside)
 *     exec        execl(self, self, HOW2, N, KB, IMAGE + 1): the next image of
 *                 the same pid taps as many tensors and ends by HOW2, which
 *                 is $EXITS_NEXT (default _exit)
 *     execfail    execl of $EXITS_BAD_EXEC (an executable file that is not a
 *                 program: ENOEXEC), then taps one more tensor; exits 5
 *                 when that tap failed (the file was closed for the exec), else 6
 *     fork        fork a child that calls _exit(3) at once; the parent
 *                 checks its status, taps N more tensors (calls N..2N-1), exits 0
 *     vfork       vfork a child that execs /bin/true (or _exits 4), likewise
 *   Return codes of the taps go to stderr as "rc ..." lines when not 0.
 */
#include <dlfcn.h>
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
static tap_fn tap;

static int tap_range(long first, long n, long kb, long image)
{
    int64_t len = kb * 256;
    float *v = malloc((size_t)len * sizeof *v);
    if (!v)
        return 1;
    int bad = 0;
    for (long i = first; i < first + n; ++i) {
        for (int64_t k = 0; k < len; ++k)
            v[k] = (float)(image * 4000000 + i * 1000 + k % 1000);
        probe_tap_tensor_v1 t = tap_desc("exits", i, -1);
        t.dtype = PROBE_DTYPE_FLOAT32;
        t.rank = 1;
        t.shape = &len;
        t.data = v;
        int rc = tap(&t);
        if (rc != 0) {
            fprintf(stderr, "rc exits %ld = %d\n", i, rc);
            bad = 1;
        }
    }
    free(v);
    return bad;
}

int main(int argc, char **argv)
{
    tap = (tap_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_v1");
    if (!tap) {
        fprintf(stderr, "tap ABI not found: is libprobe_intercept.so preloaded?\n");
        return 2;
    }
    if (argc != 5) {
        fprintf(stderr, "usage: %s HOW N KB IMAGE\n", argv[0]);
        return 2;
    }
    const char *how = argv[1];
    long n = atol(argv[2]), kb = atol(argv[3]), image = atol(argv[4]);
    tap_range(0, n, kb, image);
    printf("tapped %ld\n", n);
    fflush(stdout);
    if (!strcmp(how, "_exit"))
        _exit(7);
    if (!strcmp(how, "_Exit"))
        _Exit(7);
    if (!strcmp(how, "quick_exit"))
        quick_exit(7);
    if (!strcmp(how, "abort"))
        abort();
    if (!strcmp(how, "kill"))
        kill(getpid(), SIGKILL);
    if (!strcmp(how, "wait")) {
        for (;;)
            pause();
    }
    if (!strcmp(how, "term") || !strcmp(how, "int") || !strcmp(how, "hup")) {
        kill(getpid(), !strcmp(how, "term") ? SIGTERM : !strcmp(how, "int") ? SIGINT : SIGHUP);
        struct timespec ts = {30, 0};
        nanosleep(&ts, NULL);
        return 9; /* not reached: the signal ends the process */
    }
    if (!strcmp(how, "exec")) {
        char next[32];
        snprintf(next, sizeof next, "%ld", image + 1);
        const char *how2 = getenv("EXITS_NEXT");
        execl(argv[0], argv[0], how2 && *how2 ? how2 : "_exit", argv[2], argv[3], next, (char *)NULL);
        return 8;
    }
    if (!strcmp(how, "execfail")) {
        const char *bad = getenv("EXITS_BAD_EXEC");
        execl(bad ? bad : "/nonexistent", "probe-exits", (char *)NULL);
        return tap_range(n, 1, kb, image) != 0 ? 5 : 6;
    }
    if (!strcmp(how, "fork") || !strcmp(how, "vfork")) {
        int is_fork = !strcmp(how, "fork");
        pid_t c = is_fork ? fork() : vfork();
        if (c == 0) {
            if (!is_fork)
                execl("/bin/true", "true", (char *)NULL);
            _exit(is_fork ? 3 : 4);
        }
        int st = 0;
        waitpid(c, &st, 0);
        printf("child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        fflush(stdout);
        return tap_range(n, n, kb, image);
    }
    return tap_range(0, 0, kb, image); /* exit */
}
