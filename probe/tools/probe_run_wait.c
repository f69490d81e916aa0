/* probe-run-wait: the process probe-run becomes (exec) to run COMMAND. It
 * starts COMMAND as its child with the capture library preloaded, waits for
 * it, records how it ended in the run's capture files (the manifest key
 * "run_end", probe_run_end_record), and then ends the way COMMAND ended: the
 * same exit status, or death by the same signal.
 *
 *   probe-run-wait --out FILE [--preload LIST] -- COMMAND [ARGS...]
 *
 * --out: the capture file (probe-run's --out, absolute); the per-rank files
 * <stem>.rank<R><ext> next to it get run_end too. --preload: COMMAND's
 * LD_PRELOAD (this process keeps its own, so that the capture library is
 * not loaded here). Internal to probe-run (docs/probe-run.md "Exit status
 * and output"); not installed in bin/.
 *
 * Signals: one sent to this process with kill(2) (kill PID, timeout, a
 * job-control kill) is forwarded to COMMAND; one the terminal sends to the
 * foreground process group (Ctrl-C, Ctrl-\) reaches COMMAND directly and is
 * not forwarded again. While it waits, this process is not ended by the
 * signals it forwards. If it is killed anyway (SIGKILL), COMMAND gets
 * SIGKILL too (PR_SET_PDEATHSIG), as when probe-run exec'd COMMAND itself.
 * The recording runs in a child process, in a session of its own and with
 * every signal blocked, so a crash inside HDF5 on a damaged file never
 * changes the exit status, and a kill of the process group (or of this
 * process) does not stop it half-way through rewriting the file; a
 * recording that fails prints one `probe-run: ...` line on stderr. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "probe/capture.h"
#include "../../metrics/vocab/textsafe.h"

static const int forwarded[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM, SIGUSR1,
                                SIGUSR2, SIGALRM, SIGCONT, SIGWINCH};
#define NFORWARDED (sizeof forwarded / sizeof forwarded[0])

static volatile pid_t child = 0;

static void forward(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    pid_t c = child;
    if (c <= 0)
        return;
    if (si && si->si_code == SI_KERNEL)
        return; /* from the terminal: COMMAND, in the same process group, got it too */
    if (si && si->si_code <= 0 && si->si_pid == c)
        return; /* COMMAND signalled its own process group */
    kill(c, sig);
}

static void usage_error(const char *msg)
{
    fprintf(stderr, "probe-run-wait: %s (usage: probe-run-wait --out FILE [--preload LIST] -- "
                    "COMMAND [ARGS...]; probe-run runs it)\n", msg);
    exit(2);
}

/* The manifest of a capture that no process of the run wrote: the command,
 * the label and the version (malloc'd JSON text, or NULL). */
static char *manifest_if_new(char *const *cmd)
{
    json_t *m = json_pack("{s:s, s:i}", "format", "probe-manifest", "version", 1);
    json_t *a = json_array();
    for (size_t i = 0; cmd[i]; i++)
        json_array_append_new(a, json_string(cmd[i]));
    const char *label = getenv("PROBE_LABEL");
    json_object_set_new(m, "command", a);
    json_object_set_new(m, "label", label ? json_string(label) : json_null());
    json_object_set_new(m, "probe_version", json_string(PROBE_VERSION));
    char *text = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(m);
    return text;
}

static void record_one(const char *path, const probe_run_end *re, const char *manifest)
{
    if (probe_run_end_record(path, re, manifest) != PROBE_OK)
        fprintf(stderr, "probe-run: %s\n", probe_tesc(probe_last_error()));
}

/* Record run_end in out and in every per-rank file <stem>.rank<R><ext> next
 * to it (R decimal digits; probe-run removed those of earlier runs). */
static int record_all(const char *out, const probe_run_end *re, char *const *cmd)
{
    char *manifest = manifest_if_new(cmd);
    const char *slash = strrchr(out, '/');
    const char *base = slash ? slash + 1 : out;
    const char *dot = strrchr(base, '.');
    if (dot == base)
        dot = NULL;
    size_t stem = dot ? (size_t)(dot - base) : strlen(base);
    const char *ext = dot ? dot : "";
    char *dir = slash ? strndup(out, (size_t)(slash - out) + 1) : strdup("./");
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, base, stem) != 0 || strncmp(n + stem, ".rank", 5) != 0)
            continue;
        const char *r = n + stem + 5, *q = r;
        while (*q >= '0' && *q <= '9')
            q++;
        if (q == r || strcmp(q, ext) != 0)
            continue;
        char *p = malloc(strlen(dir) + strlen(n) + 1);
        if (!p)
            continue;
        sprintf(p, "%s%s", dir, n);
        record_one(p, re, manifest);
        free(p);
    }
    if (d)
        closedir(d);
    free(dir);
    record_one(out, re, manifest);
    free(manifest);
    return 0;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *preload = NULL;
    int i = 1;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(argv[i], "--preload") == 0 && i + 1 < argc) {
            preload = argv[++i];
        } else {
            usage_error("bad arguments");
        }
    }
    if (!out || !*out)
        usage_error("--out FILE is missing");
    if (i >= argc)
        usage_error("COMMAND is missing");
    char *const *cmd = argv + i;

    sigset_t fwd, orig;
    sigemptyset(&fwd);
    for (size_t k = 0; k < NFORWARDED; k++)
        sigaddset(&fwd, forwarded[k]);
    sigprocmask(SIG_BLOCK, &fwd, &orig);
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "probe-run: cannot start %s: %s\n", probe_tesc(cmd[0]), strerror(errno));
        return 126;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(137); /* the waiting process is already gone */
        if (preload && *preload)
            setenv("LD_PRELOAD", preload, 1);
        else if (preload)
            unsetenv("LD_PRELOAD");
        sigprocmask(SIG_SETMASK, &orig, NULL);
        execvp(cmd[0], cmd);
        int e = errno;
        fprintf(stderr, "probe-run: %s: %s\n", probe_tesc(cmd[0]), e == ENOENT ? "command not found"
                                                                   : strerror(e));
        _exit(e == ENOENT ? 127 : 126);
    }
    child = pid;
    for (size_t k = 0; k < NFORWARDED; k++) {
        struct sigaction old, sa;
        /* A signal the caller ignores stays ignored (COMMAND inherited that too). */
        if (sigaction(forwarded[k], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = forward;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(forwarded[k], &sa, NULL);
    }
    sigprocmask(SIG_SETMASK, &orig, NULL);

    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "probe-run: waiting for %s: %s\n", probe_tesc(cmd[0]), strerror(errno));
            return 126;
        }
    }
    child = 0;

    /* Record with every signal blocked: a Ctrl-C now must not leave a
     * half-rewritten file, and must not replace COMMAND's status. */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    probe_run_end re = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0};
    fflush(NULL);
    pid_t rec = fork();
    if (rec == 0) {
        /* Its own session: a kill of probe-run's process group (killpg) does not
         * stop it half-way through rewriting the file. */
        setsid();
        _exit(record_all(out, &re, cmd));
    }
    if (rec > 0) {
        int rs = 0;
        while (waitpid(rec, &rs, 0) < 0 && errno == EINTR)
            ;
        if (WIFSIGNALED(rs))
            fprintf(stderr, "probe-run: run_end not recorded in %s: recording it ended by signal "
                            "%d (a damaged capture file?)\n", probe_tesc(out), WTERMSIG(rs));
    } else {
        record_all(out, &re, cmd);
    }

    if (WIFSIGNALED(st)) {
        int sig = WTERMSIG(st);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none); /* COMMAND dumped its own core, if any */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, NULL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        raise(sig);
        return 128 + sig; /* a signal whose default action is not to end the process */
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 126;
}
