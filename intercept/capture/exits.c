/* exits.c - abnormal ends of the process that writes the capture file:
 * _exit, _Exit and quick_exit (Python's os._exit), abort (os.abort,
 * std::terminate), the exec family (os.execv and friends), and SIGTERM,
 * SIGINT and SIGHUP with the default disposition. None of them runs the
 * atexit handlers that drain the queue and close the file (life.c), so each
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
 * tensor the old image tapped is in a closed file, and the new image's
 * environment gets PROBE_EXEC_CAPTURE: this pid, the closed file's identity
 * (device, inode, size, mtime) and the next call index of every component
 * and the next step and probe.seq; PROBE_EXEC_PREVIOUS: a JSON array describing the
 * images before it. A new image with the same pid that finds that same file
 * continues the capture (docs/file-format.md "Exec continuation"): it claims
 * the non-empty file, the writer appends to it (PROBE_WRITER_APPEND), and
 * its call indices, parents, steps and probe.seq continue after the
 * earlier images', as calls in one process would; its manifest gains "exec". Any
 * other process keeps capture/file.c's rules (a file that holds a capture is never
 * claimed). The drain happens only when the target exists and is
 * executable; if the exec still fails, one line says that this image
 * captures nothing more.
 *
 * What cannot be drained (SIGKILL, a crash) is at least named: each
 * accepted tap appends a TAPPED record to the journal (end of this file). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/libprobe.h"
#include "base/desc.h"
#include "base/json.h"
#include "base/resolve.h"
#include "base/shim.h"
#include "capture/exits.h"

extern char **environ;

#define DEFAULT_EXIT_TIMEOUT_MS 60000u

typedef void (*exit_fn)(int);
typedef void (*abort_fn)(void);
typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);

static exit_fn real__exit, real__Exit, real_quick_exit;
static abort_fn real_abort;
static execve_fn real_execve, real_execvpe;
static fexecve_fn real_fexecve;
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef void (*sighandler_fn)(int);
static sigaction_fn real_sigaction;

static atomic_long owner_pid;           /* the pid that opened the file, 0 before */
static unsigned exit_timeout_ms = DEFAULT_EXIT_TIMEOUT_MS;

static void resolve(void)
{
    real__exit = (exit_fn)shim_resolve_next("_exit");
    real__Exit = (exit_fn)shim_resolve_next("_Exit");
    real_quick_exit = (exit_fn)shim_resolve_next("quick_exit");
    real_abort = (abort_fn)shim_resolve_next("abort");
    real_execve = (execve_fn)shim_resolve_next("execve");
    real_execvpe = (execve_fn)shim_resolve_next("execvpe");
    real_fexecve = (fexecve_fn)shim_resolve_next("fexecve");
    real_sigaction = (sigaction_fn)shim_resolve_next("sigaction");
}

static void read_exec_marker(void);

/* The real calls are resolved before anything can exit (the constructor
 * runs before main), and the exec marker is read and removed. */
__attribute__((constructor)) static void exits_init(void)
{
    resolve();
    read_exec_marker();
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

/* Async-signal-safe: sigaction, raise. owner: this is the process that
 * armed the handler (a vfork child shares its memory: it leaves ours[]
 * alone). */
static void die_by(int sig, int owner)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    if (owner)
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
    int owner = (long)syscall(SYS_getpid) == pid && !shim_is_foreign_process();
    if (!owner || atomic_exchange(&sig_taken, sig) != 0) {
        die_by(sig, owner);
        errno = saved;
        return;
    }
    sem_post(&sig_sem);
    uint64_t deadline = mono_ms() + exit_timeout_ms + 1000u;
    while (!atomic_load(&sig_drained) && mono_ms() < deadline) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    die_by(sig, 1);
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
        shim_warn_config("PROBE_EXIT_TIMEOUT_S=%s is not a number of seconds in (0, 3600]; using %u",
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

/* ---- exec continuation -------------------------------------------------------- */

#define EXEC_ENV "PROBE_EXEC_CAPTURE"
#define EXEC_PREV_ENV "PROBE_EXEC_PREVIOUS"
#define EXEC_MARKER_VERSION 1
#define EXEC_PREVIOUS_MAX 32768 /* bytes of PROBE_EXEC_PREVIOUS, well under MAX_ARG_STRLEN */

struct comp_next {
    char name[SHIM_NAME_MAX];
    int64_t base; /* calls of the earlier images: this image's call k is written as base + k */
    int64_t next; /* one past the highest call written, base included */
};

static pthread_mutex_t calls_lock = PTHREAD_MUTEX_INITIALIZER;
static struct comp_next *comps;
static size_t ncomps, capcomps;
static uint64_t seq_base;          /* probe.seq of this image's first tensor */
static int64_t step_base;          /* steps of the earlier images: step k is written as step_base + k */
static int64_t step_next;          /* one past the highest step written (under calls_lock) */
static atomic_ullong seq_next;     /* one past the highest probe.seq written */
static atomic_int continuing;      /* this image continues the capture before exec */
static int marker_ok;              /* PROBE_EXEC_CAPTURE names this pid */
static unsigned long long mk_dev, mk_ino, mk_size;
static long long mk_mtime_ns;
static char *previous_json;        /* PROBE_EXEC_PREVIOUS (a JSON array), or NULL */
static long images_before;

/* caller holds calls_lock */
static struct comp_next *comp_find(const char *name, int add)
{
    for (size_t i = 0; i < ncomps; ++i)
        if (strcmp(comps[i].name, name) == 0)
            return &comps[i];
    if (!add || strlen(name) >= SHIM_NAME_MAX)
        return NULL;
    if (ncomps == capcomps) {
        size_t nc = capcomps ? capcomps * 2 : 16;
        struct comp_next *nv = realloc(comps, nc * sizeof *nv);
        if (!nv)
            return NULL;
        comps = nv;
        capcomps = nc;
    }
    struct comp_next *c = &comps[ncomps++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    return c;
}

/* Component names hold no '/' and no control characters; ' ' and '%' are
 * written %20 and %25 in the marker. */
static void put_escaped(struct shim_json *b, const char *s)
{
    char one[4];
    for (; *s; ++s) {
        if (*s == ' ' || *s == '%')
            snprintf(one, sizeof one, "%%%02X", (unsigned char)*s);
        else
            one[0] = *s, one[1] = '\0';
        shim_json_raw(b, one);
    }
}

static int get_unescaped(const char *s, size_t n, char *dst, size_t size)
{
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= n + 0 && i + 2 > n - 1 + 1)
                return -1;
            char hex[3] = {s[i + 1], s[i + 2], 0};
            char *end;
            long v = strtol(hex, &end, 16);
            if (*end || v <= 0)
                return -1;
            c = (char)v;
            i += 2;
        }
        if (k + 1 >= size)
            return -1;
        dst[k++] = c;
    }
    dst[k] = '\0';
    return k ? 0 : -1;
}

/* PROBE_EXEC_CAPTURE = "1 PID DEV INO SIZE MTIME_NS SEQ_NEXT STEP_NEXT IMAGES N NAME NEXT ..." */
static void read_exec_marker(void)
{
    const char *v = getenv(EXEC_ENV);
    if (!v || !*v)
        return;
    char *copy = strdup(v);
    const char *prev = getenv(EXEC_PREV_ENV);
    char *prev_copy = prev && *prev == '[' ? strdup(prev) : NULL;
    unsetenv(EXEC_ENV); /* for this image only: the next exec writes its own */
    unsetenv(EXEC_PREV_ENV);
    if (!copy)
        return;
    char *save = NULL, *tok = strtok_r(copy, " ", &save);
    unsigned long long f[9];
    int ok = 1;
    for (int i = 0; i < 9 && ok; ++i) {
        if (!tok) {
            ok = 0;
            break;
        }
        char *end;
        errno = 0;
        f[i] = strtoull(tok, &end, 10);
        ok = !errno && !*end;
        tok = strtok_r(NULL, " ", &save);
    }
    if (!ok || f[0] != EXEC_MARKER_VERSION || (long)f[1] != (long)syscall(SYS_getpid)) {
        free(copy);
        free(prev_copy);
        return;
    }
    mk_dev = f[2];
    mk_ino = f[3];
    mk_size = f[4];
    mk_mtime_ns = (long long)f[5];
    seq_base = f[6];
    step_base = step_next = (int64_t)f[7];
    images_before = (long)f[8];
    atomic_store(&seq_next, seq_base);
    unsigned long long n = 0;
    if (tok) {
        n = strtoull(tok, NULL, 10);
        tok = strtok_r(NULL, " ", &save);
    }
    for (unsigned long long i = 0; i < n && tok; ++i) {
        char name[SHIM_NAME_MAX];
        const char *num = strtok_r(NULL, " ", &save);
        if (!num || get_unescaped(tok, strlen(tok), name, sizeof name) != 0) {
            ok = 0;
            break;
        }
        pthread_mutex_lock(&calls_lock);
        struct comp_next *c = comp_find(name, 1);
        if (c)
            c->base = c->next = strtoll(num, NULL, 10);
        pthread_mutex_unlock(&calls_lock);
        tok = strtok_r(NULL, " ", &save);
    }
    free(copy);
    marker_ok = ok;
    previous_json = ok ? prev_copy : (free(prev_copy), NULL);
}

int shim_exits_exec_continues(const struct stat *st)
{
    if (!marker_ok || (unsigned long long)st->st_dev != mk_dev ||
        (unsigned long long)st->st_ino != mk_ino || (unsigned long long)st->st_size != mk_size ||
        (long long)st->st_mtim.tv_sec * 1000000000ll + st->st_mtim.tv_nsec != mk_mtime_ns)
        return 0;
    atomic_store(&continuing, 1);
    return 1;
}

int shim_exits_exec_continuing(void)
{
    return atomic_load(&continuing);
}

uint64_t shim_exits_exec_seq(uint64_t seq)
{
    uint64_t s = seq + (atomic_load(&continuing) ? seq_base : 0);
    unsigned long long cur = atomic_load(&seq_next);
    while (s + 1 > cur && !atomic_compare_exchange_weak(&seq_next, &cur, s + 1))
        ;
    return s;
}

const probe_tap_tensor_v1 *shim_exits_exec_call(const probe_tap_tensor_v1 *t, probe_tap_tensor_v1 *copy,
                                          char *parent, size_t parent_size)
{
    int cont = atomic_load(&continuing);
    int64_t base = 0, pbase = 0;
    const char *par = shim_desc_parent(t);
    char pcomp[SHIM_NAME_MAX] = "";
    long long pcall = -1;
    if (cont && par) {
        const char *c = par[0] == '/' ? par + 1 : par, *e = strchr(c, '/');
        char *end;
        if (e && (size_t)(e - c) < sizeof pcomp) {
            snprintf(pcomp, sizeof pcomp, "%.*s", (int)(e - c), c);
            pcall = strtoll(e + 1, &end, 10);
            if (*end || pcall < 0)
                pcall = -1;
        }
    }
    pthread_mutex_lock(&calls_lock);
    if (cont) {
        struct comp_next *c = comp_find(t->component, 0);
        base = c ? c->base : 0;
        c = pcall >= 0 ? comp_find(pcomp, 0) : NULL;
        pbase = c ? c->base : 0;
    }
    int64_t sbase = cont && t->step >= 0 ? step_base : 0;
    struct comp_next *me = comp_find(t->component, 1);
    if (me && t->call + base + 1 > me->next)
        me->next = t->call + base + 1;
    if (t->step >= 0 && t->step + sbase + 1 > step_next)
        step_next = t->step + sbase + 1;
    pthread_mutex_unlock(&calls_lock);
    if (base == 0 && pbase == 0 && sbase == 0)
        return t;
    size_t n = t->struct_size < sizeof *copy ? t->struct_size : sizeof *copy;
    memset(copy, 0, sizeof *copy);
    memcpy(copy, t, n);
    copy->call = t->call + base;
    copy->step = t->step + sbase;
    if (pbase) {
        snprintf(parent, parent_size, "/%s/%04lld", pcomp, (long long)(pcall + pbase));
        copy->parent = parent;
    }
    return copy;
}

void shim_exits_exec_json(struct shim_json *b)
{
    if (!atomic_load(&continuing))
        return;
    shim_json_printf(b, ",\"exec\":{\"image\":%ld,\"previous\":", images_before + 1);
    shim_json_raw(b, previous_json ? previous_json : "[]");
    shim_json_raw(b, "}");
}

/* The marker and the earlier images' list for the image exec starts, once
 * the file is closed (no journal next to it). NULL when there is nothing to
 * continue. *prev gets PROBE_EXEC_PREVIOUS=... (malloc'd). */
static char *exec_marker(char **prev)
{
    *prev = NULL;
    if (!shim_cfg.out_path || shim_writer() != NULL || shim_disabled())
        return NULL;
    char jpath[PATH_MAX];
    struct stat st, jst;
    if (snprintf(jpath, sizeof jpath, "%s.journal", shim_cfg.out_path) >= (int)sizeof jpath ||
        lstat(jpath, &jst) == 0 || stat(shim_cfg.out_path, &st) != 0 || st.st_size == 0)
        return NULL;
    struct shim_json b, p;
    shim_json_init(&b);
    pthread_mutex_lock(&calls_lock);
    long long steps = (long long)step_next;
    pthread_mutex_unlock(&calls_lock);
    shim_json_printf(&b, EXEC_ENV "=%d %ld %llu %llu %llu %lld %llu %lld %ld", EXEC_MARKER_VERSION,
                     (long)syscall(SYS_getpid), (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino, (unsigned long long)st.st_size,
                     (long long)st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec,
                     (unsigned long long)atomic_load(&seq_next), steps, images_before + 1);
    pthread_mutex_lock(&calls_lock);
    shim_json_printf(&b, " %zu", ncomps);
    for (size_t i = 0; i < ncomps; ++i) {
        shim_json_raw(&b, " ");
        put_escaped(&b, comps[i].name);
        shim_json_printf(&b, " %lld", (long long)comps[i].next);
    }
    pthread_mutex_unlock(&calls_lock);
    shim_json_init(&p);
    shim_json_raw(&p, EXEC_PREV_ENV "=");
    if (previous_json && strlen(previous_json) > 2) {
        shim_json_printf(&p, "%.*s,", (int)(strlen(previous_json) - 1), previous_json);
    } else {
        shim_json_raw(&p, "[");
    }
    shim_json_printf(&p, "{\"pid\":%ld,\"start_time\":", (long)syscall(SYS_getpid));
    shim_json_string(&p, shim_cfg.start_time);
    shim_json_raw(&p, ",\"command\":[");
    for (size_t i = 0; i < shim_cfg.argc; ++i) {
        if (i)
            shim_json_raw(&p, ",");
        shim_json_string(&p, shim_cfg.argv[i]);
    }
    shim_json_printf(&p, "],\"tensors\":%llu}]",
                     (unsigned long long)atomic_load(&shim_counts.accepted));
    if (!p.oom && p.len > EXEC_PREVIOUS_MAX) {
        /* long command lines over many execs: keep the environment small */
        shim_json_free(&p);
        shim_json_init(&p);
        shim_json_printf(&p, EXEC_PREV_ENV "=[{\"pid\":%ld,\"tensors\":%llu,\"truncated\":true}]",
                         (long)syscall(SYS_getpid),
                         (unsigned long long)atomic_load(&shim_counts.accepted));
    }
    if (b.oom || p.oom) {
        shim_json_free(&b);
        shim_json_free(&p);
        return NULL;
    }
    *prev = p.p;
    return b.p;
}

/* envp with the two marker entries put in place of any earlier ones
 * (malloc'd array; the strings are marker and prev). */
static char **with_marker(char *const envp[], char *marker, char *prev)
{
    size_t n = 0;
    for (char *const *e = envp; e && *e; ++e)
        ++n;
    char **v = malloc((n + 3) * sizeof *v);
    if (!v)
        return NULL;
    size_t k = 0;
    for (char *const *e = envp; e && *e; ++e)
        if (strncmp(*e, EXEC_ENV "=", sizeof EXEC_ENV) != 0 &&
            strncmp(*e, EXEC_PREV_ENV "=", sizeof EXEC_PREV_ENV) != 0)
            v[k++] = *e;
    v[k++] = marker;
    v[k++] = prev;
    v[k] = NULL;
    return v;
}


/* ---- the exec calls ----------------------------------------------------------- */

/* Drain and close before an exec of file (or of descriptor fd >= 0).
 * Returns the environment the new image gets: envp with the continuation
 * marker (exec_marker) when the file was closed cleanly, else envp; *drained
 * says whether the file was closed for it. */
static char *const *before_exec(const char *file, int search, int fd, char *const envp[],
                                int *drained, char ***owned, char **m1, char **m2)
{
    *drained = 0;
    *owned = NULL;
    *m1 = *m2 = NULL;
    if (!owner_here() || (fd < 0 && !findable(file, search)))
        return envp;
    shim_finalize_now(exit_timeout_ms);
    *drained = 1;
    *m1 = exec_marker(m2);
    if (*m1 && (*owned = with_marker(envp, *m1, *m2)) != NULL)
        return *owned;
    free(*m1);
    free(*m2);
    *m1 = *m2 = NULL;
    return envp;
}

static void after_failed_exec(int drained, const char *file, int err, char **owned, char *m1,
                              char *m2)
{
    free(owned);
    free(m1);
    free(m2);
    if (drained)
        shim_warn("exec of %s failed (%s) after the capture file %s was closed for it; this "
                  "process captures nothing more", file ? file : "(null)", strerror(err),
                  shim_cfg.out_path);
    errno = err;
}

/* execv and execvp are execve and execvpe with environ. An exec refused
 * for the size of the environment (E2BIG) is retried without the marker:
 * the program's exec must not fail because of probe. */
#define EXEC_VIA(real, file, search, fd, envp, call)                                         \
    int d_;                                                                                \
    char **o_, *m1_, *m2_;                                                                 \
    char *const *env_ = before_exec(file, search, fd, envp, &d_, &o_, &m1_, &m2_);         \
    int r_ = real ? (call) : (errno = ENOSYS, -1);                                         \
    if (r_ < 0 && errno == E2BIG && o_ && real) {                                          \
        env_ = envp;                                                                       \
        r_ = (call);                                                                       \
    }                                                                                      \
    after_failed_exec(d_, fd >= 0 ? "a file descriptor" : file, errno, o_, m1_, m2_);      \
    return r_

SHIM_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    EXEC_VIA(real_execve, path, 0, -1, envp, real_execve(path, argv, env_));
}

SHIM_EXPORT int execv(const char *path, char *const argv[])
{
    EXEC_VIA(real_execve, path, 0, -1, environ, real_execve(path, argv, env_));
}

SHIM_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    EXEC_VIA(real_execvpe, file, 1, -1, envp, real_execvpe(file, argv, env_));
}

SHIM_EXPORT int execvp(const char *file, char *const argv[])
{
    EXEC_VIA(real_execvpe, file, 1, -1, environ, real_execvpe(file, argv, env_));
}

SHIM_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    EXEC_VIA(real_fexecve, NULL, 0, fd, envp, real_fexecve(fd, argv, env_));
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

/* ---- TAPPED journal records ------------------------------------------------------ */

/* What a kill cannot drain is at least named: when a tensor is queued, its
 * path is appended to the capture's journal as a TAPPED record (type 8,
 * probe/journal.h) with one write(2) on this process's own O_APPEND
 * descriptor, before the job is queued, so it precedes the writer's TENSOR
 * record for it. A reader of a killed run's journal lists every TAPPED path
 * without a TENSOR or SKIP record as a skip, "lost: tapped, but the process
 * ended before the writer wrote it". A clean close removes the journal with
 * these records; a SUMMARY record (stats-only capture) answers a TAPPED
 * record as a TENSOR record does. The first failed or short write stops the
 * records (a full disk: the writer reports it). */
#define JREC_TAPPED 8u

static pthread_mutex_t tapped_lock = PTHREAD_MUTEX_INITIALIZER;
static int tapped_fd = -2; /* -2 not opened yet, -1 off */
static long tapped_pid;

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; ++i)
        p[i] = (unsigned char)(v >> (8 * i));
}

void shim_exits_note_tapped(const char *path)
{
    if (!shim_libprobe_api.capture_hash || !shim_cfg.out_path)
        return;
    size_t n = strlen(path);
    if (n > 4096)
        return;
    unsigned char rec[4 + 4 + 4 + 4096 + 8];
    size_t len = 4 + 4 + 4 + n + 8;
    put32(rec, (uint32_t)len);
    put32(rec + 4, JREC_TAPPED);
    put32(rec + 8, (uint32_t)n);
    memcpy(rec + 12, path, n);
    uint64_t h = shim_libprobe_api.capture_hash(rec, len - 8);
    for (int i = 0; i < 8; ++i)
        rec[len - 8 + (size_t)i] = (unsigned char)(h >> (8 * i));
    pthread_mutex_lock(&tapped_lock);
    long me = (long)syscall(SYS_getpid);
    if (tapped_fd == -2 || tapped_pid != me) {
        char jpath[PATH_MAX];
        tapped_fd = -1;
        tapped_pid = me;
        if (snprintf(jpath, sizeof jpath, "%s.journal", shim_cfg.out_path) < (int)sizeof jpath)
            tapped_fd = open(jpath, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
        struct stat st;
        if (tapped_fd >= 0 && (fstat(tapped_fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0)) {
            close(tapped_fd);
            tapped_fd = -1;
        }
    }
    if (tapped_fd >= 0) {
        ssize_t w;
        do
            w = write(tapped_fd, rec, len);
        while (w < 0 && errno == EINTR);
        if (w != (ssize_t)len) {
            close(tapped_fd);
            tapped_fd = -1;
        }
    }
    pthread_mutex_unlock(&tapped_lock);
}

