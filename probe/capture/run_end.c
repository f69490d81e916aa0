/* run_end.c - record how a run ended in its capture file: the manifest key
 * "run_end" (include/probe/capture.h, docs/file-format.md "Root
 * attributes"), written by probe-run after the command exits.
 *
 * The capture may be in any of the states a run leaves it in: closed by
 * its writer (HDF5 file, no journal: the root attribute probe.manifest is
 * rewritten in place), not closed (the writer was killed: the journal is
 * authoritative, so a MANIFEST record is appended to it and the HDF5 file,
 * whose metadata may be half written, is not touched), or never written
 * (the empty file probe-run created: a capture with no tensors and this
 * manifest is written). */
#include "probe/capture.h"
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define ROOM_SLACK ((uint64_t)64 << 10)

void probe_run_end_signal_name(int sig, char *buf, size_t cap)
{
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},     {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
        {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},     {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
        {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},       {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
        {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
        {SIGSYS, "SIGSYS"},
#ifdef SIGSTKFLT
        {SIGSTKFLT, "SIGSTKFLT"},
#endif
#ifdef SIGPWR
        {SIGPWR, "SIGPWR"},
#endif
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig) {
            snprintf(buf, cap, "%s", names[i].name);
            return;
        }
#ifdef SIGRTMIN
    if (sig >= SIGRTMIN && sig <= SIGRTMAX) {
        snprintf(buf, cap, "SIGRTMIN+%d", sig - SIGRTMIN);
        return;
    }
#endif
    snprintf(buf, cap, "SIG%d", sig);
}

/* The run_end object (docs/file-format.md). */
static json_t *run_end_json(const probe_run_end *re, const char *capture, json_int_t lost)
{
    char sig[32] = "", when[32] = "";
    if (re->signal > 0)
        probe_run_end_signal_name(re->signal, sig, sizeof sig);
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int complete = strcmp(capture, "closed") == 0 && re->signal <= 0 && re->exit_status == 0 &&
                   lost == 0;
    json_t *v = json_pack("{s:o, s:o, s:s, s:b, s:s}", "exit_status",
                          re->signal > 0 || re->exit_status < 0 ? json_null()
                                                                : json_integer(re->exit_status),
                          "signal", re->signal > 0 ? json_string(sig) : json_null(), "capture",
                          capture, "capture_complete", complete, "end_time", when);
    if (v && lost > 0)
        json_object_set_new(v, "lost", json_integer(lost));
    return v;
}

/* manifest text (or NULL: a new object) with key "run_end" set, as malloc'd
 * compact JSON in *out. PROBE_EFORMAT when the text is not a JSON object,
 * PROBE_ENOMEM. */
static probe_status with_run_end(const char *path, const char *manifest, const probe_run_end *re,
                                 const char *capture, char **out)
{
    *out = NULL;
    json_t *m = manifest ? json_loads(manifest, 0, NULL) : json_object();
    if (!json_is_object(m)) {
        json_decref(m);
        return probe_set_error(PROBE_EFORMAT, "%s: its manifest is not a JSON object; run_end "
                               "not recorded", path);
    }
    /* the manifest's "lost" (the shim: tensors tapped and never written) */
    json_t *lc = json_object_get(json_object_get(m, "lost"), "count");
    json_t *v = run_end_json(re, capture, json_is_integer(lc) ? json_integer_value(lc) : 0);
    char *vt = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    const char *end = manifest ? strrchr(manifest, '}') : NULL;
    if (vt && manifest && end && !json_object_get(m, "run_end")) {
        /* Appended to the text as it is: every other byte of the manifest stays. */
        size_t head = (size_t)(end - manifest), n = head + strlen(vt) + 16;
        if ((*out = malloc(n)))
            snprintf(*out, n, "%.*s%s\"run_end\":%s}", (int)head, manifest,
                     json_object_size(m) ? "," : "", vt);
    } else if (vt && json_object_set(m, "run_end", v) == 0) {
        *out = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    free(vt);
    json_decref(v);
    json_decref(m);
    if (!*out)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory building run_end", path);
    return PROBE_OK;
}


/* A capture its writer did not close: append the manifest with run_end to
 * the journal (the reader takes its last MANIFEST record). *empty_journal:
 * the journal has no header (the writer was killed while creating it) and
 * nothing was appended. */
static probe_status record_in_journal(const char *path, const char *jpath, const probe_run_end *re,
                                      int *empty_journal)
{
    unsigned char *buf;
    size_t len;
    *empty_journal = 0;
    probe_status s = probe_journal_read_all(path, jpath, 1, &buf, &len);
    if (s != PROBE_OK)
        return s;
    probe_journal_data d;
    s = probe_journal_parse(jpath, buf, len, &d);
    free(buf);
    if (s != PROBE_OK)
        return probe_set_error(s, "%s: run_end not recorded: %s", path, probe_last_error());
    if (!d.header) {
        probe_journal_data_free(&d);
        *empty_journal = 1;
        return PROBE_OK;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strcmp(d.capture_name, base) != 0) {
        s = probe_set_error(PROBE_EFORMAT, "%s: the journal %s next to it belongs to another "
                            "capture file ('%s'); run_end not recorded", path, jpath,
                            d.capture_name);
        probe_journal_data_free(&d);
        return s;
    }
    char *text;
    s = with_run_end(path, d.manifest, re, "journal", &text);
    size_t keep = d.valid_len;
    probe_journal_data_free(&d);
    if (s != PROBE_OK)
        return s;
    probe_journal *j;
    if ((s = probe_journal_reopen(jpath, keep, &j)) == PROBE_OK) {
        s = probe_journal_manifest(j, text);
        probe_journal_close(j, 0);
    }
    free(text);
    return s;
}

/* The string attribute `name` of the root group (variable or fixed length)
 * into *out (malloc'd; NULL when absent). -1 when it exists and cannot be
 * read as one string. Call inside H5E_BEGIN_TRY. */
static int read_root_str(hid_t file, const char *name, char **out)
{
    *out = NULL;
    if (H5Aexists(file, name) <= 0)
        return 0;
    hid_t a = H5Aopen(file, name, H5P_DEFAULT), t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
    int ok = 0;
    if (t >= 0 && sp >= 0 && H5Tget_class(t) == H5T_STRING && H5Sget_simple_extent_npoints(sp) == 1) {
        hid_t mt = H5Tcopy(H5T_C_S1);
        if (H5Tis_variable_str(t) > 0) {
            char *v = NULL;
            if (mt >= 0 && H5Tset_size(mt, H5T_VARIABLE) >= 0 &&
                H5Tset_cset(mt, H5Tget_cset(t)) >= 0 && H5Aread(a, mt, &v) >= 0 && v) {
                ok = (*out = strdup(v)) != NULL;
                H5free_memory(v);
            }
        } else {
            size_t n = H5Tget_size(t);
            if (n > 0 && n < ((size_t)64 << 20) && (*out = calloc(1, n + 1)) &&
                H5Aread(a, t, *out) >= 0)
                ok = 1;
        }
        if (mt >= 0)
            H5Tclose(mt);
    }
    if (!ok) {
        free(*out);
        *out = NULL;
    }
    if (sp >= 0)
        H5Sclose(sp);
    if (t >= 0)
        H5Tclose(t);
    if (a >= 0)
        H5Aclose(a);
    return ok ? 0 : -1;
}

/* Room for about need bytes more in the file of fd (the process's file size
 * limit, the file system's free space), so that HDF5 never runs out of
 * space half-way through rewriting the attribute (docs/file-format.md
 * "Full disk"). */
static probe_status check_room(const char *path, int fd, uint64_t need)
{
    struct stat st;
    struct rlimit rl;
    if (fstat(fd, &st) == 0 && getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (uint64_t)st.st_size + need > (uint64_t)rl.rlim_cur)
        return probe_set_error(PROBE_EIO, "%s: run_end not recorded: %s (the file would pass the "
                               "size limit RLIMIT_FSIZE of %llu bytes)", path, strerror(EFBIG),
                               (unsigned long long)rl.rlim_cur);
    struct statvfs vfs;
    if (fstatvfs(fd, &vfs) == 0 && vfs.f_frsize) {
        uint64_t blocks = geteuid() == 0 ? (uint64_t)vfs.f_bfree : (uint64_t)vfs.f_bavail;
        if (blocks < need / vfs.f_frsize + 1)
            return probe_set_error(PROBE_EIO, "%s: run_end not recorded: %s (%llu bytes free, "
                                   "about %llu needed)", path, strerror(ENOSPC),
                                   (unsigned long long)(blocks * vfs.f_frsize),
                                   (unsigned long long)need);
    }
    return PROBE_OK;
}

/* A capture its writer closed: rewrite probe.manifest with run_end in place.
 * The caller holds the file's flock, so HDF5's own lock is not taken. */
static probe_status record_in_file(const char *path, int fd, const probe_run_end *re)
{
    probe_status s = PROBE_OK;
    char *manifest = NULL, *text = NULL;
    hid_t file = -1;
    H5E_BEGIN_TRY {
        hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
#if H5_VERSION_GE(1, 10, 7)
        if (fapl >= 0)
            H5Pset_file_locking(fapl, 0, 1);
#endif
        file = H5Fopen(path, H5F_ACC_RDWR, fapl >= 0 ? fapl : H5P_DEFAULT);
        if (fapl >= 0)
            H5Pclose(fapl);
        if (file >= 0 && read_root_str(file, "probe.manifest", &manifest) < 0)
            s = probe_set_error(PROBE_EFORMAT, "%s: run_end not recorded: its root attribute "
                                "probe.manifest cannot be read as a string", path);
    } H5E_END_TRY;
    if (file < 0)
        return probe_set_error(PROBE_EFORMAT, "%s: run_end not recorded: HDF5 cannot open it "
                               "for writing (not an HDF5 file, or its metadata is damaged)", path);
    if (s == PROBE_OK)
        s = with_run_end(path, manifest, re, "closed", &text);
    if (s == PROBE_OK)
        s = check_room(path, fd, 2 * strlen(text) + ROOM_SLACK);
    if (s == PROBE_OK) {
        H5E_BEGIN_TRY {
            hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR), a = -1;
            int ok = t >= 0 && sp >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0 &&
                     H5Tset_cset(t, H5T_CSET_UTF8) >= 0 &&
                     (H5Aexists(file, "probe.manifest") <= 0 ||
                      H5Adelete(file, "probe.manifest") >= 0) &&
                     (a = H5Acreate2(file, "probe.manifest", t, sp, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
                     H5Awrite(a, t, &text) >= 0;
            if (a >= 0 && H5Aclose(a) < 0)
                ok = 0;
            if (t >= 0)
                H5Tclose(t);
            if (sp >= 0)
                H5Sclose(sp);
            if (!ok)
                s = probe_set_error(PROBE_EIO, "%s: run_end not recorded: HDF5 cannot write the "
                                    "root attribute probe.manifest", path);
        } H5E_END_TRY;
    }
    probe_status c = PROBE_OK;
    H5E_BEGIN_TRY {
        if (H5Fclose(file) < 0)
            c = probe_set_error(PROBE_EIO, "%s: run_end: HDF5 cannot close the file", path);
    } H5E_END_TRY;
    free(manifest);
    free(text);
    return s != PROBE_OK ? s : c;
}

probe_status probe_run_end_record(const char *path, const probe_run_end *re,
                                  const char *manifest_if_new)
{
    if (!path || !*path || !re)
        return probe_set_error(PROBE_EINVAL, "probe_run_end_record: NULL argument");
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        if (e == EISDIR)
            return probe_set_error(PROBE_EINVAL, "%s: run_end not recorded: not a regular file "
                                   "(a directory)", path);
        return probe_set_error(e == ENOENT ? PROBE_ENOTFOUND : PROBE_EIO,
                               "%s: run_end not recorded: %s", path,
                               e == ELOOP ? "it is a symbolic link" : strerror(e));
    }
    struct stat st;
    probe_status s = PROBE_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = probe_set_error(PROBE_EINVAL, "%s: run_end not recorded: not a regular file", path);
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        s = probe_set_error(PROBE_ESTATE, "%s: run_end not recorded: another process of the run "
                            "still writes it (it holds the file's lock)", path);
    }
    if (s != PROBE_OK) {
        close(fd);
        return s;
    }
    size_t plen = strlen(path);
    char *jpath = malloc(plen + sizeof PROBE_JOURNAL_SUFFIX);
    if (!jpath) {
        close(fd);
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    }
    memcpy(jpath, path, plen);
    memcpy(jpath + plen, PROBE_JOURNAL_SUFFIX, sizeof PROBE_JOURNAL_SUFFIX);
    struct stat jst;
    int empty_journal = 0, has_journal = lstat(jpath, &jst) == 0;
    if (has_journal)
        s = record_in_journal(path, jpath, re, &empty_journal);
    if (s == PROBE_OK && has_journal && empty_journal && st.st_size > 0)
        s = probe_set_error(PROBE_EFORMAT, "%s: run_end not recorded: its journal %s has no "
                            "header", path, jpath);
    if (s == PROBE_OK && (!has_journal || empty_journal) && st.st_size == 0) {
        /* No process of the run wrote the file: a capture with no tensors. */
        char *text = NULL;
        probe_writer *w = NULL;
        s = with_run_end(path, manifest_if_new, re, "not written", &text);
        if (s == PROBE_OK &&
            (s = probe_writer_open_ex(path, text, PROBE_WRITER_CALLER_LOCKED, &w)) == PROBE_OK)
            s = probe_writer_close(w);
        free(text);
    } else if (s == PROBE_OK && !has_journal) {
        s = record_in_file(path, fd, re);
    }
    free(jpath);
    close(fd); /* drops the lock */
    return s;
}
