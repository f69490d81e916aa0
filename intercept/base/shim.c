/* shim.c - the shim's process state (base/shim.h): configuration, counters,
 * process flags, `probe:` lines, and the exit path's hooks that every layer
 * may call without knowing the finalizer (life.c). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/shim.h"
#include "textsafe.h"

extern char **environ;

struct shim_config shim_cfg;
struct shim_counts shim_counts;
__thread int shim_own_gpu_work;

static atomic_int disabled;     /* an I/O error disabled capture */
static atomic_int forked_child; /* set by the atfork child handler */
static atomic_int closed;       /* the finalizer has started */
static atomic_int claim_state;  /* enum shim_file_claim */
static atomic_int warned_io;

#define STOP_TIMEOUT_MS 60000u

/* ---- process flags --------------------------------------------------------- */

int shim_claim_state(void)
{
    return atomic_load(&claim_state);
}

void shim_set_claim_state(int state)
{
    atomic_store(&claim_state, state);
}

int shim_forked_child(void)
{
    return atomic_load(&forked_child);
}

void shim_set_forked_child(void)
{
    atomic_store(&forked_child, 1);
}

int shim_is_foreign_process(void)
{
    return shim_cfg.mode != SHIM_OWNER || atomic_load(&forked_child) ||
           atomic_load(&claim_state) == SHIM_CLAIM_LOST;
}

int shim_disabled(void)
{
    return atomic_load(&disabled);
}

int shim_closed(void)
{
    return atomic_load(&closed);
}

int shim_set_closed(void)
{
    return atomic_exchange(&closed, 1);
}

int shim_capturing(void)
{
    return shim_cfg.mode == SHIM_OWNER && !atomic_load(&forked_child) && !atomic_load(&disabled) &&
           !atomic_load(&closed);
}

static _Atomic(probe_writer *) writer;

probe_writer *shim_writer(void)
{
    return atomic_load(&writer);
}

void shim_set_writer(probe_writer *w)
{
    atomic_store(&writer, w);
}

static char fail_reason[512];
static atomic_int fail_reason_set;

const char *shim_fail_reason(void)
{
    return atomic_load(&fail_reason_set) ? fail_reason : "";
}

void shim_fail_io(const char *reason)
{
    /* The writer's messages start with the file name, which the line
     * already gives. */
    size_t n = strlen(shim_cfg.out_path);
    if (strncmp(reason, shim_cfg.out_path, n) == 0 && strncmp(reason + n, ": ", 2) == 0)
        reason += n + 2;
    atomic_store(&disabled, 1);
    if (atomic_exchange(&warned_io, 1) == 0) {
        snprintf(fail_reason, sizeof fail_reason, "%s", reason);
        atomic_store(&fail_reason_set, 1);
        shim_warn("cannot write capture file %s: %s; capture disabled, the run continues",
                  shim_cfg.out_path, reason);
    }
}

/* ---- lines on stderr ------------------------------------------------------- */

uint64_t shim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* What a `probe:` line starts with so that it starts a line of its own
 * (docs/intercept.md "probe: lines"): on a terminal "\r\033[K" (back to the
 * first column and erase it: a progress bar such as tqdm's, drawn with "\r"
 * and no newline, is erased and redrawn by its next update); on a regular
 * file whose last byte is not a newline, "\n" (read through /proc/self/fd/2,
 * never opening anything that is not a regular file); otherwise nothing (a
 * pipe's last byte cannot be known). */
static const char *line_start(void)
{
    if (isatty(STDERR_FILENO))
        return "\r\033[K";
    struct stat st;
    if (fstat(STDERR_FILENO, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
        return "";
    int fd = open("/proc/self/fd/2", O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return "";
    struct stat again;
    char last = '\n';
    if (fstat(fd, &again) == 0 && again.st_dev == st.st_dev && again.st_ino == st.st_ino &&
        again.st_size > 0 && pread(fd, &last, 1, again.st_size - 1) != 1)
        last = '\n';
    close(fd);
    return last == '\n' ? "" : "\n";
}

static void vwarn(const char *fmt, va_list ap)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "probe: ");
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    char shown[sizeof line * 2 + 8]; /* one line, control characters and bad UTF-8 escaped */
    size_t len = (size_t)snprintf(shown, sizeof shown, "%s", line_start());
    len += probe_tesc_to(shown + len, sizeof shown - 1 - len, line);
    shown[len++] = '\n';
    ssize_t off = 0;
    while ((size_t)off < len) {
        ssize_t w = write(STDERR_FILENO, shown + off, len - (size_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += w;
    }
}

void shim_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vwarn(fmt, ap);
    va_end(ap);
}

/* PROBE_CONFIG_WARNED was set when this image started: an earlier process
 * or image of the run already printed the configuration warnings. */
static int config_warned_before;
static int in_constructor;

void shim_warn_config_begin(void)
{
    config_warned_before = getenv("PROBE_CONFIG_WARNED") != NULL;
    in_constructor = 1;
}

void shim_warn_config_end(void)
{
    in_constructor = 0;
}

void shim_warn_config(const char *fmt, ...)
{
    if (config_warned_before)
        return;
    va_list ap;
    va_start(ap, fmt);
    vwarn(fmt, ap);
    va_end(ap);
    if (in_constructor)
        setenv("PROBE_CONFIG_WARNED", "1", 1); /* single-threaded here: the children inherit it */
}

/* ---- the exit path --------------------------------------------------------- */

static void (*finalizer)(void);
static atomic_int cuda_alive_at_exit, cuda_exit_registered;
static unsigned stop_timeout_ms = STOP_TIMEOUT_MS;

void shim_set_finalizer(void (*finalize)(void))
{
    finalizer = finalize;
}

static void run_finalizer(void)
{
    if (finalizer)
        finalizer();
}

unsigned shim_stop_timeout_ms(void)
{
    return stop_timeout_ms;
}

void shim_finalize_now(unsigned timeout_ms)
{
    if (atomic_load(&cuda_exit_registered))
        atomic_store(&cuda_alive_at_exit, 1); /* no exit handler has run: CUDA is intact */
    stop_timeout_ms = timeout_ms;
    run_finalizer();
}

void shim_close_now(void)
{
    run_finalizer();
}

void shim_atexit_finalize(void)
{
    atexit(run_finalizer);
}

static void atexit_finalize_cuda_alive(void)
{
    atomic_store(&cuda_alive_at_exit, 1);
    run_finalizer();
}

void shim_exit_after_cuda(void)
{
    if (atomic_exchange(&cuda_exit_registered, 1) == 0)
        atexit(atexit_finalize_cuda_alive);
}

int shim_cuda_alive_at_exit(void)
{
    return atomic_load(&cuda_alive_at_exit);
}

/* ---- small helpers --------------------------------------------------------- */

const char *shim_env_raw(const char *name)
{
    size_t n = strlen(name);
    for (char **e = environ; e && *e; ++e)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}


char *shim_trim_spaces(char *s)
{
    while (*s == ' ')
        ++s;
    size_t len = strlen(s);
    while (len && s[len - 1] == ' ')
        s[--len] = '\0';
    return s;
}

const char *shim_path_base(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

const char *shim_path_ext(const char *path)
{
    const char *base = shim_path_base(path);
    const char *dot = strrchr(base, '.');
    return dot && dot != base ? dot : path + strlen(path);
}
