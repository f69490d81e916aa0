/* probe/capture/journal.c - the capture journal (probe/capture/journal.h,
 * docs/file-format.md "Journal").
 *
 * File: the 8-byte magic "PRBJRNL\n", then records. A record is
 *   u32 length (of the whole record, checksum included), u32 type,
 *   payload, u64 XXH64 (seed 0) of every byte before it.
 * Strings are u32 byte count + bytes (no NUL); count 0xffffffff = absent.
 * Each record reaches the file with one write(2) on an O_APPEND descriptor,
 * so a process killed while appending leaves at most one torn record, the
 * last; the parser recognises it by its length or checksum.
 */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define STR_ABSENT UINT32_MAX

struct probe_journal {
    int fd;
    char *path;
    uint64_t reserved_end; /* blocks reserved up to this offset */
    int no_reserve;        /* fallocate is not supported here */
};

/* --- encoding --- */

typedef struct {
    unsigned char *p;
    size_t len, cap;
    int oom;
} buf_t;

static void put_bytes(buf_t *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_u64(buf_t *b, uint64_t v)
{
    unsigned char x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    put_bytes(b, x, 8);
}

static void put_u32(buf_t *b, uint32_t v)
{
    unsigned char x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    put_bytes(b, x, 4);
}

static void put_str(buf_t *b, const char *s)
{
    if (s == NULL) {
        put_u32(b, STR_ABSENT);
        return;
    }
    size_t n = strlen(s);
    put_u32(b, (uint32_t)n);
    put_bytes(b, s, n);
}

static void rec_start(buf_t *b, uint32_t type)
{
    put_u32(b, 0); /* length, patched by rec_finish */
    put_u32(b, type);
}

/* Patch the length and append the checksum; the record is b->p[start..). */
static void rec_finish(buf_t *b, size_t start)
{
    if (b->oom)
        return;
    size_t len = b->len - start + 8;
    for (int i = 0; i < 4; i++)
        b->p[start + (size_t)i] = (unsigned char)(len >> (8 * i));
    put_u64(b, (uint64_t)XXH64(b->p + start, b->len - start, 0));
}

static probe_status jwrite(probe_journal *j, buf_t *b)
{
    probe_status s = PROBE_OK;
    if (b->oom) {
        s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", j->path);
    } else if (b->len - 8 > PROBE_JOURNAL_RECORD_MAX) {
        s = probe_set_error(PROBE_EINVAL, "%s: journal record of %zu bytes is above the %u limit",
                            j->path, b->len, (unsigned)PROBE_JOURNAL_RECORD_MAX);
    } else {
        ssize_t k;
        do
            k = write(j->fd, b->p, b->len);
        while (k < 0 && errno == EINTR);
        if (k < 0)
            s = probe_set_error(PROBE_EIO, "%s: cannot append to the journal: %s", j->path,
                                strerror(errno));
        else if ((size_t)k != b->len) /* a full disk: the torn tail is detected by readers */
            s = probe_set_error(PROBE_EIO, "%s: cannot append to the journal: %s (%zd of %zu bytes written)",
                                j->path, strerror(ENOSPC), k, b->len);
    }
    free(b->p);
    return s;
}

probe_status probe_journal_create(const char *capture_path, probe_journal **out)
{
    *out = NULL;
    probe_journal *j = calloc(1, sizeof *j);
    /* an absolute name: the clean close must remove this file even if the
     * process has changed its directory since */
    char cwd[4096] = "";
    if (capture_path[0] != '/' && getcwd(cwd, sizeof cwd - 1) != NULL)
        strcat(cwd, "/");
    size_t c = strlen(cwd), n = strlen(capture_path);
    if (j == NULL || (j->path = malloc(c + n + sizeof PROBE_JOURNAL_SUFFIX)) == NULL) {
        free(j);
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", capture_path);
    }
    memcpy(j->path, cwd, c);
    memcpy(j->path + c, capture_path, n);
    memcpy(j->path + c + n, PROBE_JOURNAL_SUFFIX, sizeof PROBE_JOURNAL_SUFFIX);
    /* never through a symlink (a planted link would make the writer
     * truncate another file); the umask applies, as to the capture */
    j->fd = open(j->path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    struct stat st;
    const char *why = NULL;
    if (j->fd >= 0 && (fstat(j->fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(j->fd);
        j->fd = -1;
        why = "not a regular file";
    } else if (j->fd < 0) {
        why = errno == ELOOP ? "it is a symbolic link" : strerror(errno);
    }
    if (j->fd < 0) {
        probe_status s = probe_set_error(PROBE_EIO, "%s: cannot create the journal: %s", j->path, why);
        free(j->path);
        free(j);
        return s;
    }
    uint64_t token = 0;
    if (getrandom(&token, sizeof token, GRND_NONBLOCK) != (ssize_t)sizeof token) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        token = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 17);
    }
    const char *base = strrchr(capture_path, '/');
    base = base != NULL ? base + 1 : capture_path;
    buf_t b = {0};
    put_bytes(&b, PROBE_JOURNAL_MAGIC, 8);
    rec_start(&b, PROBE_JREC_HEADER);
    put_u32(&b, PROBE_JOURNAL_VERSION);
    put_u64(&b, token);
    put_str(&b, base);
    rec_finish(&b, 8);
    probe_status s = jwrite(j, &b);
    if (s != PROBE_OK) {
        probe_journal_close(j, 1);
        return s;
    }
    *out = j;
    return PROBE_OK;
}

probe_status probe_journal_begin(probe_journal *j, const char *path)
{
    buf_t b = {0};
    rec_start(&b, PROBE_JREC_BEGIN);
    put_str(&b, path);
    rec_finish(&b, 0);
    return jwrite(j, &b);
}

/* The fields TENSOR and SUMMARY records share, path to shape. */
static void encode_head(buf_t *b, const probe_record *rec)
{
    put_str(b, rec->path);
    put_str(b, rec->component);
    put_str(b, rec->slot);
    put_str(b, rec->scope);
    put_str(b, rec->device);
    put_str(b, probe_dtype_name(rec->dtype));
    put_u64(b, rec->seq);
    put_u64(b, (uint64_t)rec->call);
    put_u64(b, (uint64_t)rec->step);
    put_u32(b, (uint32_t)rec->cfg_branch);
    uint64_t bits;
    memcpy(&bits, &rec->timestep, 8);
    put_u64(b, bits);
    put_u32(b, (uint32_t)rec->rank);
    for (int i = 0; i < rec->rank; i++)
        put_u64(b, (uint64_t)rec->shape[i]);
}

/* The OP and CALL records that follow rec's TENSOR or SUMMARY record, when
 * it has them. */
static void encode_extras(buf_t *b, const probe_record *rec)
{
    size_t start;
    if (rec->op != NULL) {
        start = b->len;
        rec_start(b, PROBE_JREC_OP);
        put_str(b, rec->path);
        put_str(b, rec->op);
        rec_finish(b, start);
    }
    int nested = rec->parent != NULL && rec->parent[0] != '\0';
    int has_class = rec->class_name != NULL && rec->class_name[0] != '\0';
    int has_module = rec->module != NULL && rec->module[0] != '\0';
    if (nested || has_class || has_module) {
        start = b->len;
        rec_start(b, PROBE_JREC_CALL);
        put_str(b, rec->path);
        put_str(b, nested ? rec->parent : "");
        put_u64(b, nested ? (uint64_t)rec->block : UINT64_MAX);
        put_str(b, rec->class_name);
        put_str(b, has_module ? rec->module : "");
        rec_finish(b, start);
    }
}

/* The TENSOR record of rec, then its OP and CALL records when it has them. */
static void encode_tensor(buf_t *b, const probe_record *rec, uint64_t offset, uint64_t nbytes,
                          uint64_t hash)
{
    size_t start = b->len;
    rec_start(b, PROBE_JREC_TENSOR);
    encode_head(b, rec);
    put_u64(b, offset);
    put_u64(b, nbytes);
    put_u64(b, hash);
    rec_finish(b, start);
    encode_extras(b, rec);
}

static void put_f64(buf_t *b, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    put_u64(b, bits);
}

/* SUMMARY flags (the optional u64 after sum_sq) */
#define JSUM_NO_XXH64 1u
#define JSUM_TREE 2u

/* The SUMMARY record of stats-only record rec, then its OP and CALL records. */
static void encode_summary(buf_t *b, const probe_record *rec, const probe_summary *sum,
                           const uint64_t *hash, const uint64_t *tree_hash)
{
    size_t start = b->len;
    rec_start(b, PROBE_JREC_SUMMARY);
    encode_head(b, rec);
    put_u64(b, hash ? *hash : 0);
    put_u64(b, sum->n);
    put_u64(b, sum->n_finite);
    put_u64(b, sum->nan);
    put_u64(b, sum->inf);
    put_f64(b, sum->min);
    put_f64(b, sum->max);
    put_f64(b, sum->abs_max);
    put_f64(b, sum->sum);
    put_f64(b, sum->sum_sq);
    if (hash == NULL || tree_hash != NULL) {
        put_u64(b, (hash == NULL ? JSUM_NO_XXH64 : 0) | (tree_hash != NULL ? JSUM_TREE : 0));
        put_u64(b, tree_hash ? *tree_hash : 0);
    }
    rec_finish(b, start);
    encode_extras(b, rec);
}

/* The TENSOR record and its OP and CALL records go out with one write(2):
 * a kill leaves all of them or a torn tail. */
probe_status probe_journal_tensor(probe_journal *j, const probe_record *rec, uint64_t offset,
                                  uint64_t nbytes, uint64_t hash)
{
    buf_t b = {0};
    encode_tensor(&b, rec, offset, nbytes, hash);
    return jwrite(j, &b);
}

probe_status probe_journal_tensor_raw(probe_journal *j, const probe_record *rec, uint64_t nbytes,
                                      uint64_t hash, const probe_raw_seg *segs, size_t nsegs)
{
    buf_t b = {0};
    encode_tensor(&b, rec, PROBE_JOURNAL_NO_OFFSET, nbytes, hash);
    size_t start = b.len;
    rec_start(&b, PROBE_JREC_RAW);
    put_str(&b, rec->path);
    put_u32(&b, (uint32_t)nsegs);
    for (size_t i = 0; i < nsegs; i++) {
        put_u32(&b, segs[i].lane);
        put_u64(&b, segs[i].offset);
        put_u64(&b, segs[i].size);
    }
    rec_finish(&b, start);
    return jwrite(j, &b);
}

/* The SUMMARY record and its OP and CALL records go out with one write(2). */
probe_status probe_journal_summary(probe_journal *j, const probe_record *rec,
                                   const probe_summary *sum, uint64_t hash)
{
    return probe_journal_summary_ex(j, rec, sum, &hash, NULL);
}

probe_status probe_journal_summary_ex(probe_journal *j, const probe_record *rec,
                                      const probe_summary *sum, const uint64_t *hash,
                                      const uint64_t *tree_hash)
{
    buf_t b = {0};
    encode_summary(&b, rec, sum, hash, tree_hash);
    return jwrite(j, &b);
}

probe_status probe_journal_encode_header(const char *capture_name, unsigned char **out, size_t *len)
{
    buf_t b = {0};
    put_bytes(&b, PROBE_JOURNAL_MAGIC, 8);
    rec_start(&b, PROBE_JREC_HEADER);
    put_u32(&b, PROBE_JOURNAL_VERSION);
    put_u64(&b, 0);
    put_str(&b, capture_name);
    rec_finish(&b, 8);
    if (b.oom) {
        free(b.p);
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    }
    *out = b.p;
    *len = b.len;
    return PROBE_OK;
}

probe_status probe_journal_encode_tensor(const probe_record *rec, uint64_t offset, uint64_t nbytes,
                                         uint64_t hash, unsigned char **buf, size_t *len,
                                         size_t *cap)
{
    buf_t b = {*buf, *len, *cap, 0};
    encode_tensor(&b, rec, offset, nbytes, hash);
    *buf = b.p;
    *cap = b.cap;
    if (b.oom)
        return probe_set_error(PROBE_ENOMEM, "out of memory");
    *len = b.len;
    return PROBE_OK;
}

probe_status probe_journal_skip(probe_journal *j, const char *path, const char *reason)
{
    buf_t b = {0};
    rec_start(&b, PROBE_JREC_SKIP);
    put_str(&b, path);
    put_str(&b, reason);
    rec_finish(&b, 0);
    return jwrite(j, &b);
}

probe_status probe_journal_reopen(const char *jpath, uint64_t keep, probe_journal **out)
{
    *out = NULL;
    probe_journal *j = calloc(1, sizeof *j);
    if (j == NULL || (j->path = strdup(jpath)) == NULL) {
        free(j);
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", jpath);
    }
    j->fd = open(jpath, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    probe_status s = PROBE_OK;
    if (j->fd < 0)
        s = probe_set_error(PROBE_EIO, "%s: cannot open the journal: %s", jpath,
                            errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    else if (fstat(j->fd, &st) != 0 || !S_ISREG(st.st_mode))
        s = probe_set_error(PROBE_EIO, "%s: the journal is not a regular file", jpath);
    else if ((uint64_t)st.st_size > keep && ftruncate(j->fd, (off_t)keep) != 0)
        s = probe_set_error(PROBE_EIO, "%s: cannot cut the journal's torn last record: %s", jpath,
                            strerror(errno));
    if (s != PROBE_OK) {
        probe_journal_close(j, 0);
        return s;
    }
    *out = j;
    return PROBE_OK;
}

probe_status probe_journal_manifest(probe_journal *j, const char *manifest_json)
{
    buf_t b = {0};
    rec_start(&b, PROBE_JREC_MANIFEST);
    put_str(&b, manifest_json);
    rec_finish(&b, 0);
    return jwrite(j, &b);
}

int probe_journal_reserve(probe_journal *j, uint64_t room)
{
    struct stat st;
    if (j == NULL || j->fd < 0 || j->no_reserve || fstat(j->fd, &st) != 0)
        return 0;
    if ((uint64_t)st.st_size + room <= j->reserved_end)
        return 0;
    if (fallocate(j->fd, FALLOC_FL_KEEP_SIZE, st.st_size, (off_t)(2 * room)) == 0) {
        j->reserved_end = (uint64_t)st.st_size + 2 * room;
        return 0;
    }
    int e = errno;
    if (e == ENOSPC || e == EDQUOT || e == EFBIG)
        return e;
    j->no_reserve = 1;
    return 0;
}

void probe_journal_close(probe_journal *j, int remove)
{
    if (j == NULL)
        return;
    if (remove)
        unlink(j->path);
    if (j->fd >= 0)
        close(j->fd);
    free(j->path);
    free(j);
}

/* --- parsing: every read is bounds-checked against the record --- */

typedef struct {
    const unsigned char *p;
    size_t len, at;
    int bad;
} rd_t;

static uint64_t get_u64(rd_t *r)
{
    if (r->bad || r->len - r->at < 8) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | r->p[r->at + (size_t)i];
    r->at += 8;
    return v;
}

static uint32_t get_u32(rd_t *r)
{
    if (r->bad || r->len - r->at < 4) {
        r->bad = 1;
        return 0;
    }
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | r->p[r->at + (size_t)i];
    r->at += 4;
    return v;
}

/* A string into dst (size bytes, NUL-terminated); returns 1 present, 0
 * absent. A string that does not fit dst, holds a NUL or runs past the
 * record makes the record bad. */
static int get_str(rd_t *r, char *dst, size_t size)
{
    dst[0] = '\0';
    uint32_t n = get_u32(r);
    if (r->bad || n == STR_ABSENT)
        return 0;
    if (n > r->len - r->at || n >= size || memchr(r->p + r->at, '\0', n) != NULL) {
        r->bad = 1;
        return 0;
    }
    memcpy(dst, r->p + r->at, n);
    dst[n] = '\0';
    r->at += n;
    return 1;
}

/* A string into dst, cut to size - 1 bytes (as the reader cuts the same
 * attributes of a closed file). */
static void get_str_cut(rd_t *r, char *dst, size_t size)
{
    dst[0] = '\0';
    uint32_t n = get_u32(r);
    if (r->bad || n == STR_ABSENT)
        return;
    if (n > r->len - r->at || memchr(r->p + r->at, '\0', n) != NULL) {
        r->bad = 1;
        return;
    }
    size_t k = n < size ? n : size - 1;
    memcpy(dst, r->p + r->at, k);
    dst[k] = '\0';
    r->at += n;
}

/* A string as a new malloc'd copy (NULL if absent or bad; *oom on ENOMEM). */
static char *get_str_dup(rd_t *r, int *oom)
{
    uint32_t n = get_u32(r);
    if (r->bad || n == STR_ABSENT)
        return NULL;
    if (n > r->len - r->at || memchr(r->p + r->at, '\0', n) != NULL) {
        r->bad = 1;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (s == NULL) {
        *oom = 1;
        return NULL;
    }
    memcpy(s, r->p + r->at, n);
    s[n] = '\0';
    r->at += n;
    return s;
}

static int grow(void **p, size_t *cap, size_t n, size_t esize)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    void *q = realloc(*p, c * esize);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Decode the fields TENSOR and SUMMARY records share (path to shape) into
 * *t: 0 well formed, 1 well formed but its path is too long for
 * probe_tensor_info (ignored, as the reader ignores such a dataset), -1
 * malformed, -2 out of memory. */
static int decode_head(rd_t *r, probe_journal_tensor_rec *t)
{
    probe_tensor_info *i = &t->info;
    memset(t, 0, sizeof *t);
    char dtype[64];
    int oom = 0, too_long = 0;
    char *path = get_str_dup(r, &oom);
    if (path != NULL && strlen(path) < sizeof i->path)
        memcpy(i->path, path, strlen(path) + 1);
    else
        too_long = path != NULL; /* the reader ignores such a dataset too */
    free(path);
    if (oom)
        return -2;
    get_str_cut(r, i->component, sizeof i->component);
    get_str_cut(r, i->slot, sizeof i->slot);
    get_str_cut(r, i->scope, sizeof i->scope);
    get_str_cut(r, dtype, sizeof dtype); /* device: not kept by the reader */
    get_str_cut(r, dtype, sizeof dtype);
    uint64_t seq = get_u64(r);
    int64_t call = (int64_t)get_u64(r), step = (int64_t)get_u64(r);
    int32_t cfg = (int32_t)get_u32(r);
    uint64_t bits = get_u64(r);
    uint32_t rank = get_u32(r);
    if (r->bad || rank > PROBE_MAX_RANK || (i->path[0] != '/' && !too_long))
        return -1;
    i->dtype = probe_dtype_from_name(dtype);
    if (probe_dtype_size(i->dtype) == 0)
        return -1;
    uint64_t n = 1;
    for (uint32_t k = 0; k < rank; k++) {
        uint64_t d = get_u64(r);
        if (r->bad || d > (uint64_t)INT64_MAX || __builtin_mul_overflow(n, d, &n))
            return -1;
        i->shape[k] = (int64_t)d;
    }
    i->rank = (int)rank;
    i->n = n;
    i->seq = seq <= (uint64_t)INT64_MAX ? (int64_t)seq : -1;
    i->call = call >= 0 ? call : -1;
    i->step = step >= 0 ? step : -1;
    i->cfg_branch = cfg >= 0 ? cfg : -1;
    memcpy(&i->timestep, &bits, 8);
    i->block = -1; /* a CALL record may follow */
    return too_long;
}

/* What a decoded record's info gets once its hash is known: the component
 * and slot from the path when absent, the hash's text. */
static void finish_info(probe_journal_tensor_rec *t)
{
    probe_tensor_info *i = &t->info;
    if (i->component[0] == '\0') {
        const char *s = i->path + 1, *e = strchr(s, '/');
        snprintf(i->component, sizeof i->component, "%.*s",
                 (int)(e != NULL ? (size_t)(e - s) : strlen(s)), s);
    }
    if (i->slot[0] == '\0')
        snprintf(i->slot, sizeof i->slot, "%s", strrchr(i->path, '/') + 1);
    snprintf(i->hash, sizeof i->hash, "%016llx", (unsigned long long)t->hash);
}

/* Decode a TENSOR payload into *t: as decode_head. */
static int decode_tensor(rd_t *r, probe_journal_tensor_rec *t)
{
    int h = decode_head(r, t);
    if (h < 0)
        return h;
    probe_tensor_info *i = &t->info;
    uint64_t n = i->n, esize = probe_dtype_size(i->dtype);
    t->offset = get_u64(r);
    t->nbytes = get_u64(r);
    t->hash = get_u64(r);
    uint64_t want;
    if (r->bad || __builtin_mul_overflow(n, esize, &want) || want != t->nbytes ||
        want > SIZE_MAX || n > SIZE_MAX / sizeof(double) ||
        (want > 0 && t->offset != PROBE_JOURNAL_NO_OFFSET && t->offset > UINT64_MAX - want))
        return -1; /* no offset: the bytes are in raw files (the RAW record after it) */
    if (h == 0)
        finish_info(t);
    return h;
}

static double get_f64(rd_t *r)
{
    uint64_t bits = get_u64(r);
    double v;
    memcpy(&v, &bits, 8);
    return v;
}

/* Decode a SUMMARY payload into *t (info.stats_only set): as decode_head; a
 * summary whose n is not the shape's element count, or whose counts do not
 * add up to n, is malformed. */
static int decode_summary(rd_t *r, probe_journal_tensor_rec *t)
{
    int h = decode_head(r, t);
    if (h < 0)
        return h;
    probe_summary *m = &t->summary;
    t->hash = get_u64(r);
    m->n = get_u64(r);
    m->n_finite = get_u64(r);
    m->nan = get_u64(r);
    m->inf = get_u64(r);
    m->min = get_f64(r);
    m->max = get_f64(r);
    m->abs_max = get_f64(r);
    m->sum = get_f64(r);
    m->sum_sq = get_f64(r);
    uint64_t flags = 0, tree = 0;
    if (!r->bad && r->at < r->len) { /* absent from records of older writers */
        flags = get_u64(r);
        tree = get_u64(r);
    }
    uint64_t bytes;
    if (r->bad || m->n != t->info.n || m->n_finite > m->n || m->nan > m->n - m->n_finite ||
        m->inf != m->n - m->n_finite - m->nan ||
        __builtin_mul_overflow(m->n, (uint64_t)probe_dtype_size(t->info.dtype), &bytes) ||
        bytes > SIZE_MAX)
        return -1;
    t->offset = PROBE_JOURNAL_NO_OFFSET;
    t->nbytes = 0;
    t->info.stats_only = 1;
    if (h == 0) {
        finish_info(t);
        if (flags & JSUM_NO_XXH64)
            t->info.hash[0] = '\0';
        if (flags & JSUM_TREE)
            snprintf(t->info.tree_hash, sizeof t->info.tree_hash, "%016llx",
                     (unsigned long long)tree);
    }
    return h;
}

void probe_journal_data_free(probe_journal_data *d)
{
    for (size_t i = 0; d->t != NULL && i < d->n; i++) {
        free(d->t[i].op);
        free(d->t[i].segs);
    }
    free(d->t);
    free(d->skips);
    free(d->manifest);
    memset(d, 0, sizeof *d);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Append a skip for every tapped path that has neither a TENSOR nor a SKIP
 * record (tapped is sorted here); 0, or -1 out of memory. */
static int add_lost(probe_journal_data *d, char **tapped, size_t ntapped, size_t *scap)
{
    size_t nw = d->n + d->nskips;
    const char **written = nw ? malloc(nw * sizeof *written) : NULL;
    if (nw && written == NULL)
        return -1;
    for (size_t i = 0; i < d->n; i++)
        written[i] = d->t[i].info.path;
    for (size_t i = 0; i < d->nskips; i++)
        written[d->n + i] = d->skips[i].path;
    qsort(tapped, ntapped, sizeof *tapped, cmp_str);
    if (nw)
        qsort(written, nw, sizeof *written, cmp_str);
    size_t k = 0;
    int rc = 0;
    for (size_t i = 0; i < ntapped && rc == 0; i++) {
        if (i > 0 && strcmp(tapped[i], tapped[i - 1]) == 0)
            continue;
        while (k < nw && strcmp(written[k], tapped[i]) < 0)
            k++;
        if (k < nw && strcmp(written[k], tapped[i]) == 0)
            continue;
        if (grow((void **)&d->skips, scap, d->nskips, sizeof *d->skips) != 0) {
            rc = -1;
            break;
        }
        probe_skip_info *s = &d->skips[d->nskips++];
        snprintf(s->path, sizeof s->path, "%s", tapped[i]);
        snprintf(s->reason, sizeof s->reason, "%s", PROBE_JOURNAL_LOST_REASON);
        d->lost++;
    }
    free(written);
    return rc;
}

/* The parse in progress: the data being filled, capacities, the TAPPED paths. */
typedef struct parse_state {
    probe_journal_data *d;
    const char *jpath;
    size_t tcap, scap;
    char **tapped;
    size_t ntapped, tapcap;
    int seen_header;
} parse_state;

/* The HEADER record: version, token, capture name. PROBE_OK or the error (set). */
static probe_status apply_header(parse_state *ps, rd_t *r)
{
    probe_journal_data *d = ps->d;
    uint32_t version = get_u32(r);
    d->token = get_u64(r);
    get_str(r, d->capture_name, sizeof d->capture_name);
    if (ps->seen_header || r->bad)
        return probe_set_error(PROBE_EFORMAT, "%s: corrupt journal: bad header record", ps->jpath);
    if (version != PROBE_JOURNAL_VERSION)
        return probe_set_error(PROBE_EUNSUPPORTED, "%s: journal version %u is not supported (%u is)",
                               ps->jpath, version, PROBE_JOURNAL_VERSION);
    ps->seen_header = 1;
    return PROBE_OK;
}

/* A TENSOR or SUMMARY record (summary set): the capture it completes (or
 * an ignored one). */
static void apply_tensor(parse_state *ps, rd_t *r, int summary, int *oom)
{
    probe_journal_data *d = ps->d;
    int dr;
    if (grow((void **)&d->t, &ps->tcap, d->n, sizeof *d->t) != 0) {
        *oom = 1;
    } else if ((d->t[d->n].op = NULL, d->t[d->n].segs = NULL, d->t[d->n].nsegs = 0,
                dr = summary ? decode_summary(r, &d->t[d->n]) : decode_tensor(r, &d->t[d->n])) < 0) {
        r->bad = dr == -1;
        *oom = dr == -2;
    } else if (dr == 1) {
        d->partial[0] = '\0';
        d->ignored++;
    } else {
        if (strcmp(d->partial, d->t[d->n].info.path) == 0)
            d->partial[0] = '\0';
        d->n++;
    }
}

/* A CALL record: the component call of the TENSOR record just before it;
 * otherwise ignored. */
static void apply_call(parse_state *ps, rd_t *r)
{
    probe_journal_data *d = ps->d;
    char path[512], parent[256], cls[256], mod[256] = "";
    get_str_cut(r, path, sizeof path);
    get_str_cut(r, parent, sizeof parent);
    int64_t block = (int64_t)get_u64(r);
    get_str_cut(r, cls, sizeof cls);
    if (!r->bad && r->at < r->len) /* module path: absent from records of older writers */
        get_str_cut(r, mod, sizeof mod);
    if (!r->bad && d->n > 0 && strcmp(d->t[d->n - 1].info.path, path) == 0) {
        probe_tensor_info *i = &d->t[d->n - 1].info;
        snprintf(i->parent, sizeof i->parent, "%s", parent);
        i->block = parent[0] != '\0' && block >= 0 ? block : -1;
        snprintf(i->class_name, sizeof i->class_name, "%s", cls);
        snprintf(i->module, sizeof i->module, "%s", mod);
    }
}

/* A RAW record: the pieces of the TENSOR record just before it (same path,
 * no offset, no pieces yet); otherwise ignored. */
static void apply_raw(parse_state *ps, rd_t *r, int *oom)
{
    probe_journal_data *d = ps->d;
    char *path = get_str_dup(r, oom);
    uint32_t n = get_u32(r);
    if (r->bad || *oom || path == NULL || n == 0 || n > (r->len - r->at) / 20) {
        r->bad = r->bad || (!*oom && path != NULL);
        free(path);
        return;
    }
    probe_raw_seg *segs = malloc((size_t)n * sizeof *segs);
    if (segs == NULL) {
        *oom = 1;
        free(path);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        segs[i].lane = get_u32(r);
        segs[i].offset = get_u64(r);
        segs[i].size = get_u64(r);
        if (segs[i].lane >= PROBE_RAW_FILES_MAX)
            r->bad = 1;
    }
    probe_journal_tensor_rec *t = d->n > 0 ? &d->t[d->n - 1] : NULL;
    if (!r->bad && t != NULL && strcmp(t->info.path, path) == 0 && t->segs == NULL &&
        t->offset == PROBE_JOURNAL_NO_OFFSET && !t->info.stats_only) {
        t->segs = segs;
        t->nsegs = n;
        segs = NULL;
    }
    free(segs);
    free(path);
}

/* One record of the given type (its checksum checked) into ps->d. PROBE_OK
 * (with r->bad or *oom set for a malformed record or no memory), or a
 * header's error (set). Unknown types are skipped (a later version's
 * additions). */
static probe_status apply_record(parse_state *ps, uint32_t type, rd_t *r, int *oom)
{
    probe_journal_data *d = ps->d;
    if (!ps->seen_header && type != PROBE_JREC_HEADER)
        return probe_set_error(PROBE_EFORMAT, "%s: corrupt journal: no header record", ps->jpath);
    if (type == PROBE_JREC_HEADER) {
        return apply_header(ps, r);
    } else if (type == PROBE_JREC_BEGIN) {
        get_str(r, d->partial, sizeof d->partial);
    } else if (type == PROBE_JREC_TENSOR || type == PROBE_JREC_SUMMARY) {
        apply_tensor(ps, r, type == PROBE_JREC_SUMMARY, oom);
    } else if (type == PROBE_JREC_SKIP) {
        if (grow((void **)&d->skips, &ps->scap, d->nskips, sizeof *d->skips) != 0) {
            *oom = 1;
        } else {
            probe_skip_info *k = &d->skips[d->nskips];
            get_str_cut(r, k->path, sizeof k->path);
            get_str_cut(r, k->reason, sizeof k->reason);
            if (!r->bad)
                d->nskips++;
        }
    } else if (type == PROBE_JREC_OP) {
        char *path = get_str_dup(r, oom), *op = get_str_dup(r, oom);
        /* attached to the TENSOR record just before it; otherwise ignored */
        if (!r->bad && !*oom && d->n > 0 && path != NULL && op != NULL &&
            strcmp(d->t[d->n - 1].info.path, path) == 0 && d->t[d->n - 1].op == NULL) {
            d->t[d->n - 1].op = op;
            op = NULL;
        }
        free(path);
        free(op);
    } else if (type == PROBE_JREC_CALL) {
        apply_call(ps, r);
    } else if (type == PROBE_JREC_RAW) {
        apply_raw(ps, r, oom);
    } else if (type == PROBE_JREC_TAPPED) {
        char *path = get_str_dup(r, oom);
        if (!r->bad && !*oom && path != NULL && path[0] == '/' &&
            grow((void **)&ps->tapped, &ps->tapcap, ps->ntapped, sizeof *ps->tapped) == 0)
            ps->tapped[ps->ntapped++] = path;
        else
            free(path);
    } else if (type == PROBE_JREC_MANIFEST) {
        char *m = get_str_dup(r, oom);
        if (!r->bad && !*oom) {
            free(d->manifest);
            d->manifest = m;
        } else {
            free(m);
        }
    }
    return PROBE_OK;
}

probe_status probe_journal_parse(const char *jpath, const unsigned char *buf, size_t len,
                                  probe_journal_data *d)
{
    parse_state ps = {d, jpath, 0, 0, NULL, 0, 0, 0};
    memset(d, 0, sizeof *d);
    if (len < 8 || memcmp(buf, PROBE_JOURNAL_MAGIC, 8) != 0)
        return probe_set_error(PROBE_EFORMAT, "%s: not a probe capture journal (%s)", jpath,
                               len < 8 ? "shorter than its magic" : "wrong magic");
    size_t at = 8;
    probe_status s = PROBE_OK;
    if (len == 8)
        d->torn = 1; /* the header's write cut short: nothing was recorded */
    while (at < len) {
        size_t left = len - at;
        uint32_t rlen = 0;
        if (left >= 4)
            rlen = (uint32_t)buf[at] | (uint32_t)buf[at + 1] << 8 | (uint32_t)buf[at + 2] << 16 |
                   (uint32_t)buf[at + 3] << 24;
        if (left < 4 || (rlen > left && rlen >= 16 && rlen <= PROBE_JOURNAL_RECORD_MAX + 8)) {
            d->torn = 1; /* the last record, cut short */
            break;
        }
        int sum_ok = 0;
        if (rlen >= 16 && rlen <= left) {
            uint64_t stored = 0;
            for (int i = 7; i >= 0; i--)
                stored = stored << 8 | buf[at + rlen - 8 + (size_t)i];
            sum_ok = (uint64_t)XXH64(buf + at, rlen - 8, 0) == stored;
        }
        if (!sum_ok) {
            if (rlen >= 16 && rlen == left) {
                d->torn = 1; /* the last record, with a bad checksum */
                break;
            }
            s = probe_set_error(PROBE_EFORMAT, "%s: corrupt journal: record at byte %zu %s", jpath, at,
                                rlen < 16 || rlen > left ? "has an impossible length" : "fails its checksum");
            break;
        }
        rd_t r = {buf + at, rlen - 8, 8, 0};
        uint32_t type = (uint32_t)buf[at + 4] | (uint32_t)buf[at + 5] << 8 |
                        (uint32_t)buf[at + 6] << 16 | (uint32_t)buf[at + 7] << 24;
        int oom = 0;
        if ((s = apply_record(&ps, type, &r, &oom)) != PROBE_OK)
            break;
        if (oom) {
            s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", jpath);
            break;
        }
        if (r.bad) {
            s = probe_set_error(PROBE_EFORMAT, "%s: corrupt journal: malformed record at byte %zu",
                                jpath, at);
            break;
        }
        at += rlen;
    }
    d->valid_len = at < len ? at : len;
    d->header = ps.seen_header;
    if (s == PROBE_OK && !ps.seen_header && !d->torn)
        s = probe_set_error(PROBE_EFORMAT, "%s: corrupt journal: no header record", jpath);
    if (s == PROBE_OK && ps.ntapped > 0 && add_lost(d, ps.tapped, ps.ntapped, &ps.scap) != 0)
        s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", jpath);
    for (size_t i = 0; i < ps.ntapped; i++)
        free(ps.tapped[i]);
    free(ps.tapped);
    if (s != PROBE_OK)
        probe_journal_data_free(d);
    return s;
}

#define JOURNAL_READ_MAX ((size_t)1 << 30)

probe_status probe_journal_read_all(const char *path, const char *jpath, int nofollow,
                                    unsigned char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = open(jpath, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return probe_set_error(PROBE_EIO, "%s: cannot read its journal %s: %s", path, jpath,
                               nofollow && e == ELOOP ? "it is a symbolic link" : strerror(e));
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > JOURNAL_READ_MAX) {
        close(fd);
        return probe_set_error(PROBE_EFORMAT, "%s: journal %s is %s", path, jpath,
                               !S_ISREG(st.st_mode) ? "not a regular file" : "larger than 1 GiB");
    }
    size_t n = (size_t)st.st_size;
    *buf = malloc(n > 0 ? n : 1);
    if (*buf == NULL) {
        close(fd);
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", jpath);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, *buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    *len = got;
    return PROBE_OK;
}
