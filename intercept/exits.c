/* exits.c - abnormal ends of the process that writes the capture file:
 * _exit, _Exit and quick_exit (Python's os._exit), abort (os.abort,
 * std::terminate), the exec family (os.execv and friends), and SIGTERM,
 * SIGINT and SIGHUP with the default disposition. None of them runs the
 * atexit handlers that drain the queue and close the file (shim.c), so each
 * is interposed here: the owner drains the queue and closes the file (within
 * PROBE_EXIT_TIMEOUT_S, default 60 s), then the real call runs with its own
 * arguments, so the exit status or signal the parent sees is unchanged.
 *
 * Only the process that opened the capture file does this: a forked child,
 * a vfork child (it shares the parent's memory but has its own pid, and
 * Python's subprocess execs from one) and a process that lost the claim go
 * straight to the real call.
 *
 * Signals: the handler is installed when the file opens, only for a signal
 * whose disposition is then the default (a program's own handler, such as
 * Python's SIGINT handler that raises KeyboardInterrupt, is left alone; its
 * normal exit closes the file). The handler does only async-signal-safe
 * things: it posts a semaphore that wakes the drain thread (started with
 * every signal blocked), polls an atomic flag with nanosleep until the drain
 * is done or the bound has passed, restores the default disposition and
 * raises the signal again, which is delivered as the handler returns: the
 * process dies by the same signal. A second such signal during the drain
 * kills the process at once.
 *
 * exec: the file is drained and closed before the real call, so every
 * tensor the old image tapped is in a closed file. The new image (same pid)
 * finds a file that holds a capture and does not capture (one `probe:`
 * line, shim.c's ownership rules). The drain happens only when the target
 * exists and is executable; if the exec still fails, one line says that
 * this image captures nothing more. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

extern char **environ;

#define DEFAULT_EXIT_TIMEOUT_MS 60000u

typedef void (*exit_fn)(int);
typedef void (*abort_fn)(void);
typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);

static exit_fn real__exit, real__Exit, real_quick_exit;
static abort_fn real_abort;
static execve_fn real_execve, real_execvpe;
static execv_fn real_execv, real_execvp;
static fexecve_fn real_fexecve;
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef void (*sighandler_fn)(int);
static sigaction_fn real_sigaction;

static atomic_long owner_pid;           /* the pid that opened the file, 0 before */
static unsigned exit_timeout_ms = DEFAULT_EXIT_TIMEOUT_MS;

static void resolve(void)
{
    real__exit = (exit_fn)dlsym(RTLD_NEXT, "_exit");
    real__Exit = (exit_fn)dlsym(RTLD_NEXT, "_Exit");
    real_quick_exit = (exit_fn)dlsym(RTLD_NEXT, "quick_exit");
    real_abort = (abort_fn)dlsym(RTLD_NEXT, "abort");
    real_execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
    real_execvpe = (execve_fn)dlsym(RTLD_NEXT, "execvpe");
    real_execv = (execv_fn)dlsym(RTLD_NEXT, "execv");
    real_execvp = (execv_fn)dlsym(RTLD_NEXT, "execvp");
    real_fexecve = (fexecve_fn)dlsym(RTLD_NEXT, "fexecve");
    real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
}

/* Resolved before anything can exit (the constructor runs before main). */
__attribute__((constructor)) static void exits_init(void)
{
    resolve();
}

/* 1 in the process that opened the capture file and has not closed it. */
static int owner_here(void)
{
    long pid = atomic_load(&owner_pid);
    return pid != 0 && (long)syscall(SYS_getpid) == pid && !shim_is_foreign_process() &&
           !shim_closed() && shim_writer() != NULL;
}

static void drain(void)
{
    if (owner_here())
        shim_finalize_now(exit_timeout_ms);
}

/* ---- _exit, _Exit, quick_exit, abort -------------------------------------- */

SHIM_EXPORT void _exit(int status)
{
    drain();
    if (real__exit)
        real__exit(status);
    syscall(SYS_exit_group, status);
    for (;;)
        ;
}

SHIM_EXPORT void _Exit(int status)
{
    drain();
    if (real__Exit)
        real__Exit(status);
    syscall(SYS_exit_group, status);
    for (;;)
        ;
}

/* quick_exit runs the at_quick_exit handlers, then exits without the atexit
 * ones: the drain comes first, before those handlers. */
SHIM_EXPORT void quick_exit(int status)
{
    drain();
    if (real_quick_exit)
        real_quick_exit(status);
    syscall(SYS_exit_group, status);
    for (;;)
        ;
}

SHIM_EXPORT void abort(void)
{
    drain();
    if (real_abort)
        real_abort();
    signal(SIGABRT, SIG_DFL);
    raise(SIGABRT);
    syscall(SYS_exit_group, 127);
    for (;;)
        ;
}

/* ---- terminating signals ---------------------------------------------------- */

static const int drained_signals[] = {SIGTERM, SIGINT, SIGHUP};

static atomic_int ours[NSIG]; /* 1: on_signal stands in for SIG_DFL on this signal */

static int drained_signal(int sig)
{
    for (size_t i = 0; i < sizeof drained_signals / sizeof drained_signals[0]; ++i)
        if (drained_signals[i] == sig)
            return 1;
    return 0;
}

static sem_t sig_sem;
static atomic_int sig_taken; /* the signal being handled, 0 none */
static atomic_int sig_drained;

static void *sig_drain_main(void *arg)
{
    (void)arg;
    while (sem_wait(&sig_sem) != 0 && errno == EINTR)
        ;
    drain();
    atomic_store(&sig_drained, 1);
    return NULL;
}

/* Async-signal-safe: sigaction, raise. */
static void die_by(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    atomic_store(&ours[sig], 0);
    real_sigaction(sig, &sa, NULL);
    raise(sig); /* blocked while the handler runs: delivered as it returns */
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void as_default(struct sigaction *o)
{
    memset(o, 0, sizeof *o);
    o->sa_handler = SIG_DFL;
    sigemptyset(&o->sa_mask);
}

/* Only async-signal-safe calls: syscall(getpid), atomics, sem_post,
 * clock_gettime, nanosleep, sigaction, raise. */
static void on_signal(int sig)
{
    int saved = errno;
    long pid = atomic_load(&owner_pid);
    if ((long)syscall(SYS_getpid) != pid || shim_is_foreign_process() ||
        atomic_exchange(&sig_taken, sig) != 0) {
        die_by(sig);
        errno = saved;
        return;
    }
    sem_post(&sig_sem);
    uint64_t deadline = mono_ms() + exit_timeout_ms + 1000u;
    while (!atomic_load(&sig_drained) && mono_ms() < deadline) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    die_by(sig);
    errno = saved;
}

static void on_signal(int sig);

static int install_ours(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t k = 0; k < sizeof drained_signals / sizeof drained_signals[0]; ++k)
        sigaddset(&sa.sa_mask, drained_signals[k]);
    sa.sa_flags = SA_RESTART;
    if (real_sigaction(sig, &sa, NULL) != 0)
        return 0;
    atomic_store(&ours[sig], 1);
    return 1;
}

static void parse_timeout(void)
{
    const char *v = getenv("PROBE_EXIT_TIMEOUT_S");
    if (!v || !*v)
        return;
    char *end;
    errno = 0;
    double s = strtod(v, &end);
    if (errno || *end || !(s > 0.0) || s > 3600.0) {
        shim_warn("PROBE_EXIT_TIMEOUT_S=%s is not a number of seconds in (0, 3600]; using %u",
                  v, DEFAULT_EXIT_TIMEOUT_MS / 1000);
        return;
    }
    exit_timeout_ms = (unsigned)(s * 1000.0);
    if (exit_timeout_ms == 0)
        exit_timeout_ms = 1;
}

void shim_exits_arm(void)
{
    static atomic_int armed;
    if (atomic_exchange(&armed, 1))
        return;
    parse_timeout();
    if (!real__exit)
        resolve();
    atomic_store(&owner_pid, (long)syscall(SYS_getpid));
    if (sem_init(&sig_sem, 0, 0) != 0)
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int rc = pthread_create(&t, NULL, sig_drain_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return; /* no drain thread: the signals keep their default action */
    pthread_detach(t);
    for (size_t i = 0; i < sizeof drained_signals / sizeof drained_signals[0]; ++i) {
        struct sigaction cur;
        if (real_sigaction(drained_signals[i], NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
            cur.sa_handler == SIG_DFL)
            install_ours(drained_signals[i]);
    }
}

/* The program's own sigaction and signal: setting the default disposition
 * of a drained signal installs on_signal in its place (Python, for one,
 * sets SIGINT back to SIG_DFL and kills itself with it after an uncaught
 * KeyboardInterrupt, without running the exit handlers), and on_signal is
 * reported as SIG_DFL (flags 0, empty mask) to whoever asks. Any other
 * disposition is installed as asked. Before the file opens, and for other
 * signals, both pass straight through. */
SHIM_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!real_sigaction)
        resolve();
    if (!real_sigaction) {
        errno = ENOSYS;
        return -1;
    }
    if (sig <= 0 || sig >= NSIG || !drained_signal(sig) || atomic_load(&owner_pid) == 0)
        return real_sigaction(sig, act, old);
    int was_ours = atomic_load(&ours[sig]);
    struct sigaction prev;
    int r;
    if (act && act->sa_handler == SIG_DFL && !(act->sa_flags & SA_SIGINFO)) {
        r = real_sigaction(sig, NULL, &prev);
        if (r == 0 && !install_ours(sig))
            r = real_sigaction(sig, act, NULL);
    } else {
        r = real_sigaction(sig, act, &prev);
        if (r == 0 && act)
            atomic_store(&ours[sig], 0);
    }
    if (r == 0 && old) {
        if (was_ours)
            as_default(old);
        else
            *old = prev;
    }
    return r;
}

SHIM_EXPORT sighandler_fn signal(int sig, sighandler_fn handler)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, sig);
    sa.sa_flags = SA_RESTART; /* glibc's signal(): BSD semantics */
    if (sigaction(sig, &sa, &old) != 0)
        return SIG_ERR;
    return old.sa_handler;
}

/* ---- exec ------------------------------------------------------------------- */

/* 1 when file names an executable the way execvp would find it. */
static int findable(const char *file, int search)
{
    if (!file || !*file)
        return 0;
    if (!search || strchr(file, '/'))
        return access(file, X_OK) == 0;
    const char *p = getenv("PATH");
    if (!p)
        p = "/bin:/usr/bin";
    char buf[PATH_MAX];
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int k = snprintf(buf, sizeof buf, "%.*s/%s", (int)n, n ? p : ".", file);
        if (k > 0 && (size_t)k < sizeof buf && access(buf, X_OK) == 0)
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* Drain and close before an exec of file; returns 1 if it did. */
static int before_exec(const char *file, int search)
{
    if (!owner_here() || !findable(file, search))
        return 0;
    shim_finalize_now(exit_timeout_ms);
    return 1;
}

static void after_failed_exec(int drained, const char *file, int err)
{
    if (drained)
        shim_warn("exec of %s failed (%s) after the capture file %s was closed for it; this "
                  "process captures nothing more", file ? file : "(null)", strerror(err),
                  shim_cfg.out_path);
    errno = err;
}

SHIM_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    int d = before_exec(path, 0);
    int r = real_execve ? real_execve(path, argv, envp) : (errno = ENOSYS, -1);
    after_failed_exec(d, path, errno);
    return r;
}

SHIM_EXPORT int execv(const char *path, char *const argv[])
{
    int d = before_exec(path, 0);
    int r = real_execv ? real_execv(path, argv) : (errno = ENOSYS, -1);
    after_failed_exec(d, path, errno);
    return r;
}

SHIM_EXPORT int execvp(const char *file, char *const argv[])
{
    int d = before_exec(file, 1);
    int r = real_execvp ? real_execvp(file, argv) : (errno = ENOSYS, -1);
    after_failed_exec(d, file, errno);
    return r;
}

SHIM_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    int d = before_exec(file, 1);
    int r = real_execvpe ? real_execvpe(file, argv, envp) : (errno = ENOSYS, -1);
    after_failed_exec(d, file, errno);
    return r;
}

SHIM_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    int d = 0;
    if (owner_here() && fd >= 0) {
        shim_finalize_now(exit_timeout_ms);
        d = 1;
    }
    int r = real_fexecve ? real_fexecve(fd, argv, envp) : (errno = ENOSYS, -1);
    after_failed_exec(d, "a file descriptor", errno);
    return r;
}

/* execl, execle, execlp: the arguments collected into an array (as glibc
 * does), then the vector form above. */
#define COLLECT_ARGS(arg0, ap, argv, tail_env)                                         \
    size_t n_ = 1; /* arg0 is non-null (glibc declares it so) */                    \
    va_start(ap, arg0);                                                              \
    while (va_arg(ap, const char *))                                                 \
        ++n_;                                                                        \
    va_end(ap);                                                                      \
    char *argv[n_ + 1];                                                              \
    argv[0] = (char *)arg0;                                                          \
    va_start(ap, arg0);                                                              \
    for (size_t i_ = 1; i_ <= n_; ++i_)                                              \
        argv[i_] = va_arg(ap, char *); /* the last one read is the terminating NULL */ \
    tail_env;                                                                        \
    va_end(ap)

SHIM_EXPORT int execl(const char *path, const char *arg, ...)
{
    va_list ap;
    COLLECT_ARGS(arg, ap, argv, (void)0);
    return execv(path, argv);
}

SHIM_EXPORT int execlp(const char *file, const char *arg, ...)
{
    va_list ap;
    COLLECT_ARGS(arg, ap, argv, (void)0);
    return execvp(file, argv);
}

SHIM_EXPORT int execle(const char *path, const char *arg, ...)
{
    va_list ap;
    char *const *envp = NULL;
    COLLECT_ARGS(arg, ap, argv, envp = va_arg(ap, char *const *));
    return execve(path, argv, envp);
}
