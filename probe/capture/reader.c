/* probe/capture/reader.c - the capture-file reader (include/probe/capture.h,
 * docs/file-format.md). Reads probe capture files and any other HDF5 file:
 * every numeric dataset reachable through hard links is a tensor.
 *
 * Every HDF5 call runs inside H5E_BEGIN_TRY/H5E_END_TRY: no HDF5 error stack
 * is ever printed; failures become probe_set_error messages that name the
 * file and the dataset path.
 */
#include "probe/capture.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/file.h>
#include <time.h>
#include <xxhash.h>

#include "h5types.h"
#include "journal.h"
#include "lanes.h"
#include "tree.h"

struct probe_file {
    hid_t file;
    char *path;
    probe_tensor_info *t; /* execution order (seq) or path order */
    size_t n, cap;
    const probe_tensor_info **by_path; /* into t, sorted by path, for probe_file_find */
    size_t ignored;
    char *manifest;
    probe_skip_info *skips;
    size_t nskips;
    /* probe_file_read_range: the dataset last read, kept open */
    struct {
        size_t index;       /* (size_t)-1: none */
        hid_t d, ft, mt, fsp;
        int fd;             /* >= 0 (pfd): the bytes are in the file as read: pread at `addr` */
        uint64_t addr;
        probe_raw_seg *segs; /* non-NULL: in raw files, these pieces (pread each) */
        size_t nsegs;
        int segs_owned;      /* segs is this struct's (not jsegs') */
    } cur;
    /* recovered from the journal (no HDF5 handle), or a packed tensor
     * (docs/file-format.md "Packed small tensors"; jaddr[i] is then
     * PROBE_JOURNAL_NO_OFFSET for a tensor that is a dataset): tensor i's
     * bytes are at jaddr[i] in the file. NULL when neither. */
    probe_recovery_info recovery;
    uint64_t *jaddr;
    char **jop; /* tensor i's probe.op text from the journal or pack index, or NULL */
    probe_summary *jsum; /* recovered: stats-only tensor i's summary from its SUMMARY
                            record; NULL when the journal has none */
    /* tensor i is a contiguous dataset, allocated inside the file, with no
     * external storage, whose file type is its memory type: its bytes are
     * at daddr[i] in the file (read with pread, not through HDF5);
     * PROBE_JOURNAL_NO_OFFSET for every other tensor. NULL for a file
     * recovered from its journal. */
    uint64_t *daddr;
    int pfd;    /* descriptor for pread of the file's own bytes, -1 until needed */
    /* the raw files (docs/file-format.md "Raw files"): the folder's name
     * (relative to the capture's folder), its descriptor + 1 and each raw
     * file's descriptor + 1 (0: not open yet) and size */
    char raw_dir[256];
    int raw_dfd1;
    int lane_fd1[PROBE_RAW_FILES_MAX];
    uint64_t lane_size[PROBE_RAW_FILES_MAX];
    /* recovered: tensor i's raw-file pieces from its RAW record; NULL when
     * the journal has none */
    probe_raw_seg **jsegs;
    size_t *jnsegs;
};

/* 1 when tensor i is read from jaddr (recovered, or packed). */
static int at_jaddr(const probe_file *f, size_t i)
{
    return f->recovery.recovered || (f->jaddr != NULL && f->jaddr[i] != PROBE_JOURNAL_NO_OFFSET);
}

static probe_status open_journaled(const char *path, probe_file **out);
static probe_status sort_tensors(probe_file *f, int all_seq);
static probe_status check_contained(hid_t d, const char *fpath, const char *dpath, int *plain);
static probe_status read_recovered(probe_file *f, size_t i, uint64_t first, uint64_t count, void *dst);
static probe_status read_at(probe_file *f, size_t i, uint64_t base, uint64_t first, uint64_t count,
                            void *dst);
static probe_status own_fd(probe_file *f);

/* --- attributes (call inside H5E_BEGIN_TRY); an attribute of an unexpected
 * type or shape is treated as absent --- */

/* Attribute a (opened; closed here unless returned) when it holds one
 * element; *cls its type class. */
static hid_t attr_checked(hid_t a, H5T_class_t *cls)
{
    if (a < 0)
        return H5I_INVALID_HID;
    hid_t sp = H5Aget_space(a), ty = H5Aget_type(a);
    int ok = sp >= 0 && ty >= 0 && H5Sget_simple_extent_npoints(sp) == 1;
    *cls = ty >= 0 ? H5Tget_class(ty) : H5T_NO_CLASS;
    if (sp >= 0)
        H5Sclose(sp);
    if (ty >= 0)
        H5Tclose(ty);
    if (!ok) {
        H5Aclose(a);
        return H5I_INVALID_HID;
    }
    return a;
}

/* Attribute `name` of obj when it exists and holds one element. */
static hid_t attr_open_1(hid_t obj, const char *name, H5T_class_t *cls)
{
    if (H5Aexists(obj, name) <= 0)
        return H5I_INVALID_HID;
    return attr_checked(H5Aopen(obj, name, H5P_DEFAULT), cls);
}

/* The longest attribute string that is read: the manifest and the skip list
 * of a real capture are kilobytes; a longer one is treated as absent (a fixed
 * length type) or refused (probe.skips: PROBE_EFORMAT), so that a hostile
 * file cannot make the reader hold or parse gigabytes of JSON. A variable
 * length string is first read whole by HDF5: at most the file's size, since
 * check_global_heaps() has made sure that its heap lies inside the file. */
#define ATTR_STR_MAX ((size_t)16 << 20)

/* A string attribute (variable or fixed length, ASCII or UTF-8; a of type
 * class cls, one element) as a new malloc'd string in *out. Returns 1
 * found, 0 not a string (or a fixed-length type above ATTR_STR_MAX), -1 out
 * of memory. */
static int attr_str_a(hid_t a, H5T_class_t cls, char **out)
{
    *out = NULL;
    int found = 0;
    hid_t ft = H5Aget_type(a);
    if (cls == H5T_STRING && ft >= 0) {
        if (H5Tis_variable_str(ft) > 0) {
            hid_t mt = H5Tcopy(H5T_C_S1);
            char *p = NULL;
            if (mt >= 0 && H5Tset_size(mt, H5T_VARIABLE) >= 0 &&
                H5Tset_cset(mt, H5Tget_cset(ft)) >= 0 && H5Aread(a, mt, &p) >= 0) {
                *out = strdup(p != NULL ? p : "");
                found = *out != NULL ? 1 : -1;
                if (p != NULL)
                    H5free_memory(p);
            }
            if (mt >= 0)
                H5Tclose(mt);
        } else {
            size_t size = H5Tget_size(ft);
            /* a hostile type may claim gigabytes: such a string is absent */
            char *buf = size > 0 && size <= ATTR_STR_MAX ? calloc(size + 1, 1) : NULL;
            if (buf == NULL) {
                found = size > 0 && size <= ATTR_STR_MAX ? -1 : 0;
            } else if (H5Aread(a, ft, buf) >= 0) {
                size_t len = strnlen(buf, size);
                if (H5Tget_strpad(ft) == H5T_STR_SPACEPAD)
                    while (len > 0 && buf[len - 1] == ' ')
                        len--;
                buf[len] = '\0';
                *out = buf;
                buf = NULL;
                found = 1;
            }
            free(buf);
        }
    }
    if (ft >= 0)
        H5Tclose(ft);
    return found;
}

/* attr_str_a of attribute `name` of obj (absent: 0). */
static int attr_str(hid_t obj, const char *name, char **out)
{
    H5T_class_t cls;
    *out = NULL;
    hid_t a = attr_open_1(obj, name, &cls);
    if (a < 0)
        return 0;
    int found = attr_str_a(a, cls, out);
    H5Aclose(a);
    return found;
}

/* An integer attribute (any integer type, one element) into *v; 1 if found.
 * Values beyond int64 are clipped by HDF5's conversion. */
static int attr_i64_a(hid_t a, H5T_class_t cls, int64_t *v)
{
    int64_t x = 0;
    int ok = cls == H5T_INTEGER && H5Aread(a, H5T_NATIVE_INT64, &x) >= 0;
    if (ok)
        *v = x;
    return ok;
}

static int attr_i64(hid_t obj, const char *name, int64_t *v)
{
    H5T_class_t cls;
    hid_t a = attr_open_1(obj, name, &cls);
    if (a < 0)
        return 0;
    int ok = attr_i64_a(a, cls, v);
    H5Aclose(a);
    return ok;
}

/* A numeric attribute (float or integer, one element) into *v; 1 if found. */
static int attr_f64_a(hid_t a, H5T_class_t cls, double *v)
{
    double x = 0;
    int ok = (cls == H5T_FLOAT || cls == H5T_INTEGER) && H5Aread(a, H5T_NATIVE_DOUBLE, &x) >= 0;
    if (ok)
        *v = x;
    return ok;
}

/* --- indexing --- */

struct visit {
    probe_file *f;
    probe_status status; /* PROBE_OK or the error that stopped the visit */
};

static const char *last_elem(const char *path)
{
    const char *s = strrchr(path, '/');
    return s != NULL ? s + 1 : path;
}

#define SPARSE_FREE_BYTES ((uint64_t)64 << 20)

/* The probe.* attributes of one dataset, read in one pass over its
 * attributes (H5Aiterate2): the tensor's own fields go straight into *t,
 * the rest here. */
typedef struct {
    probe_tensor_info *t;
    char dtype[64];     /* probe.dtype, "" if absent */
    int64_t stats_only; /* probe.stats_only, 0 if absent */
    int64_t block;      /* probe.block, -1 if absent or < 0 */
    int has_component, has_slot;
    int oom;
} tensor_attrs;

/* H5Aiterate2 callback: one probe.* attribute into ta. An attribute of an
 * unexpected type or shape is treated as absent; -1 (stop) out of memory. */
static herr_t tensor_attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data)
{
    (void)info;
    tensor_attrs *ta = data;
    probe_tensor_info *t = ta->t;
    if (strncmp(name, "probe.", 6) != 0)
        return 0;
    const char *k = name + 6;
    char hash[32];
    char *dst = NULL;
    size_t cap = 0;
    int *found = NULL;
    int64_t *iv = NULL, ilow = 0;
    double *fv = NULL;
    if (strcmp(k, "dtype") == 0) {
        dst = ta->dtype, cap = sizeof ta->dtype;
    } else if (strcmp(k, "component") == 0) {
        dst = t->component, cap = sizeof t->component, found = &ta->has_component;
    } else if (strcmp(k, "slot") == 0) {
        dst = t->slot, cap = sizeof t->slot, found = &ta->has_slot;
    } else if (strcmp(k, "scope") == 0) {
        dst = t->scope, cap = sizeof t->scope;
    } else if (strcmp(k, "hash") == 0 || strcmp(k, "tree_hash") == 0) {
        dst = hash, cap = sizeof hash;
    } else if (strcmp(k, "parent") == 0) {
        dst = t->parent, cap = sizeof t->parent;
    } else if (strcmp(k, "class") == 0) {
        dst = t->class_name, cap = sizeof t->class_name;
    } else if (strcmp(k, "module") == 0) {
        dst = t->module, cap = sizeof t->module;
    } else if (strcmp(k, "seq") == 0) {
        iv = &t->seq;
    } else if (strcmp(k, "call") == 0) {
        iv = &t->call;
    } else if (strcmp(k, "step") == 0) {
        iv = &t->step;
    } else if (strcmp(k, "block") == 0) {
        iv = &ta->block;
    } else if (strcmp(k, "stats_only") == 0) {
        iv = &ta->stats_only, ilow = INT64_MIN;
    } else if (strcmp(k, "timestep") == 0) {
        fv = &t->timestep;
    } else if (strcmp(k, "cfg_branch") != 0) {
        return 0;
    }
    H5T_class_t cls;
    hid_t a = attr_checked(H5Aopen(loc, name, H5P_DEFAULT), &cls);
    if (a < 0)
        return 0;
    int64_t v;
    if (dst != NULL) {
        char *str = NULL;
        int r = attr_str_a(a, cls, &str);
        if (r < 0) {
            ta->oom = 1;
        } else if (r == 1) {
            snprintf(dst, cap, "%s", str);
            if (found != NULL)
                *found = 1;
            if (dst == hash) {
                char *to = k[0] == 'h' ? t->hash : t->tree_hash;
                if (strlen(hash) == 16 && strspn(hash, "0123456789abcdef") == 16)
                    memcpy(to, hash, 17);
            }
        }
        free(str);
    } else if (iv != NULL) {
        if (attr_i64_a(a, cls, &v) && v >= ilow)
            *iv = v;
    } else if (fv != NULL) {
        attr_f64_a(a, cls, fv);
    } else if (attr_i64_a(a, cls, &v) && v >= 0 && v <= INT32_MAX) {
        t->cfg_branch = (int32_t)v;
    }
    H5Aclose(a);
    return ta->oom ? -1 : 0;
}

/* Read the probe.* attributes of dataset d into *t and *ta (t's other
 * fields untouched). 0, or -1 out of memory. An attribute storage HDF5
 * cannot walk leaves the attributes not yet seen absent. */
static int read_tensor_attrs(hid_t d, probe_tensor_info *t, tensor_attrs *ta)
{
    memset(ta, 0, sizeof *ta);
    ta->t = t;
    ta->block = -1;
    t->seq = t->call = t->step = -1;
    t->cfg_branch = -1;
    t->timestep = NAN;
    hsize_t idx = 0;
    H5Aiterate2(d, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, tensor_attr_cb, ta);
    return ta->oom ? -1 : 0;
}

/* The defaults of the attributes that are absent (component and slot from
 * the path; block only with a parent). */
static void finish_tensor_attrs(const tensor_attrs *ta, const char *path, probe_tensor_info *t)
{
    if (!ta->has_component) {
        const char *s = path + 1, *e = strchr(s, '/');
        snprintf(t->component, sizeof t->component, "%.*s", (int)(e != NULL ? (size_t)(e - s) : strlen(s)), s);
    }
    if (!ta->has_slot)
        snprintf(t->slot, sizeof t->slot, "%s", last_elem(path));
    t->block = t->parent[0] != '\0' ? ta->block : -1;
}

/* A stats-only record (docs/file-format.md): a scalar compound dataset with
 * probe.stats_only = 1, a known probe.dtype and a probe.shape of at most
 * PROBE_MAX_RANK entries >= 0 whose element count and byte size do not
 * overflow. Fills dtype, rank, shape, n and stats_only; 1 if it is one, 0
 * if not (the dataset is then ignored, like any compound dataset). */
static int describe_stats_only(hid_t d, probe_dtype hint, int64_t flag, probe_tensor_info *t)
{
    if (hint == PROBE_DTYPE_INVALID || flag != 1)
        return 0;
    hid_t sp = H5Dget_space(d);
    int scalar = sp >= 0 && H5Sget_simple_extent_type(sp) == H5S_SCALAR;
    if (sp >= 0)
        H5Sclose(sp);
    if (!scalar || H5Aexists(d, "probe.shape") <= 0)
        return 0;
    hid_t a = H5Aopen(d, "probe.shape", H5P_DEFAULT);
    if (a < 0)
        return 0;
    hid_t asp = H5Aget_space(a), aty = H5Aget_type(a);
    int ok = asp >= 0 && aty >= 0 && H5Tget_class(aty) == H5T_INTEGER &&
             H5Sget_simple_extent_type(asp) == H5S_SIMPLE && H5Sget_simple_extent_ndims(asp) == 1;
    hssize_t rank = ok ? H5Sget_simple_extent_npoints(asp) : -1;
    int64_t shape[PROBE_MAX_RANK];
    ok = ok && rank >= 0 && rank <= PROBE_MAX_RANK &&
         (rank == 0 || H5Aread(a, H5T_NATIVE_INT64, shape) >= 0);
    if (asp >= 0)
        H5Sclose(asp);
    if (aty >= 0)
        H5Tclose(aty);
    H5Aclose(a);
    if (!ok)
        return 0;
    uint64_t n = 1, bytes;
    for (int i = 0; i < (int)rank; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n))
            return 0;
        t->shape[i] = shape[i];
    }
    if (__builtin_mul_overflow(n, (uint64_t)probe_dtype_size(hint), &bytes) || bytes > SIZE_MAX ||
        n > SIZE_MAX / sizeof(double))
        return 0;
    t->dtype = hint;
    t->rank = (int)rank;
    t->n = n;
    t->stats_only = 1;
    return 1;
}

/* Describe dataset d at path into *t. Returns 1 if it is a tensor, 0 if it is
 * ignored (not numeric, NULL dataspace, rank > PROBE_MAX_RANK, element count
 * or byte size overflow, declared far beyond its storage), -1 out of memory.
 * *as_stored is 1 when the file type is the memory type that reads it (its
 * bytes are the tensor's bytes), else 0. */
static int describe(hid_t d, const char *path, probe_tensor_info *t, int *as_stored)
{
    *as_stored = 0;
    memset(t, 0, sizeof *t);
    if (strlen(path) >= sizeof t->path)
        return 0;
    snprintf(t->path, sizeof t->path, "%s", path);

    tensor_attrs ta;
    if (read_tensor_attrs(d, t, &ta) < 0)
        return -1;
    probe_dtype hint = ta.dtype[0] != '\0' ? probe_dtype_from_name(ta.dtype) : PROBE_DTYPE_INVALID;
    hid_t ft = H5Dget_type(d), mt = H5I_INVALID_HID;
    int compound = ft >= 0 && H5Tget_class(ft) == H5T_COMPOUND;
    t->dtype = ft >= 0 && !compound ? probe_h5_classify(ft, hint, &mt) : PROBE_DTYPE_INVALID;
    *as_stored = t->dtype != PROBE_DTYPE_INVALID && mt >= 0 && H5Tequal(ft, mt) > 0;
    if (ft >= 0)
        H5Tclose(ft);
    if (mt >= 0)
        H5Tclose(mt);
    if (compound) {
        if (!describe_stats_only(d, hint, ta.stats_only, t))
            return 0;
        finish_tensor_attrs(&ta, path, t);
        return 1;
    }
    if (t->dtype == PROBE_DTYPE_INVALID)
        return 0;

    hid_t sp = H5Dget_space(d);
    if (sp < 0)
        return 0;
    H5S_class_t sc = H5Sget_simple_extent_type(sp);
    int rank = sc == H5S_SCALAR ? 0 : sc == H5S_SIMPLE ? H5Sget_simple_extent_ndims(sp) : -1;
    hsize_t dims[H5S_MAX_RANK];
    int ok = rank >= 0 && rank <= PROBE_MAX_RANK &&
             (rank == 0 || H5Sget_simple_extent_dims(sp, dims, NULL) == rank);
    H5Sclose(sp);
    if (!ok)
        return 0;
    uint64_t n = 1, bytes;
    for (int i = 0; i < rank; i++) {
        if (dims[i] > (hsize_t)INT64_MAX || __builtin_mul_overflow(n, (uint64_t)dims[i], &n))
            return 0;
        t->shape[i] = (int64_t)dims[i];
    }
    if (__builtin_mul_overflow(n, (uint64_t)probe_dtype_size(t->dtype), &bytes) || bytes > SIZE_MAX ||
        n > SIZE_MAX / sizeof(double))
        return 0;
    /* A dataset may declare far more elements than the file stores (chunks
     * never written, a contiguous dataset never allocated): HDF5 then
     * returns its fill value, and a hostile shape such as 2^30 x 2^30 would
     * keep the compare streaming fill values for days. Read only what is
     * either small or backed by storage: at most 64 MiB declared, or at most
     * 2048 times the bytes stored (deflate cannot compress beyond ~1032:1). */
    hsize_t stored = H5Dget_storage_size(d);
    if (bytes > SPARSE_FREE_BYTES && bytes / 2048 > (uint64_t)stored)
        return 0;
    t->rank = rank;
    t->n = n;
    finish_tensor_attrs(&ta, path, t);
    return 1;
}


/* Room for one more tensor in f (and in jaddr/jop when present). 0, or -1
 * out of memory. */
static int grow(probe_file *f)
{
    if (f->n < f->cap)
        return 0;
    size_t cap = f->cap ? 2 * f->cap : 64;
    probe_tensor_info *t = realloc(f->t, cap * sizeof *t);
    if (t == NULL)
        return -1;
    f->t = t;
    uint64_t *da = realloc(f->daddr, cap * sizeof *da);
    if (da == NULL)
        return -1;
    f->daddr = da;
    if (f->jaddr != NULL) {
        uint64_t *a = realloc(f->jaddr, cap * sizeof *a);
        if (a == NULL)
            return -1;
        f->jaddr = a;
        char **op = realloc(f->jop, cap * sizeof *op);
        if (op == NULL)
            return -1;
        f->jop = op;
    }
    f->cap = cap;
    return 0;
}

#define PACK_GROUP "probe.pack"
#define PACK_INDEX_MAX ((hsize_t)1 << 30)

/* 1 when d is a 1-D dataset of 1-byte integers; *len its length. */
static int byte_vector(hid_t d, hsize_t *len)
{
    hid_t ft = H5Dget_type(d), sp = H5Dget_space(d);
    int ok = ft >= 0 && sp >= 0 && H5Tget_class(ft) == H5T_INTEGER && H5Tget_size(ft) == 1 &&
             H5Sget_simple_extent_type(sp) == H5S_SIMPLE && H5Sget_simple_extent_ndims(sp) == 1 &&
             H5Sget_simple_extent_dims(sp, len, NULL) == 1;
    if (ft >= 0)
        H5Tclose(ft);
    if (sp >= 0)
        H5Sclose(sp);
    return ok;
}

/* Index the packed tensors of the chunk whose index dataset is ix, at name
 * (relative to the root, ".../index"): parse the index (records in the
 * journal's encoding) and point each tensor at its bytes inside the chunk's
 * data. PROBE_EFORMAT when the chunk is malformed. Call inside H5E_BEGIN_TRY. */
static probe_status load_pack(probe_file *f, hid_t ix, const char *name)
{
    char dpath[600], label[1200];
    int glen = (int)(last_elem(name) - name);
    snprintf(dpath, sizeof dpath, "/%.*sdata", glen, name);
    snprintf(label, sizeof label, "%s: /%s", f->path, name);
    hsize_t ilen = 0, dlen = 0;
    if (!byte_vector(ix, &ilen) || ilen > PACK_INDEX_MAX)
        return probe_set_error(PROBE_EFORMAT, "%s: corrupt pack index: not a 1-D byte dataset of at "
                               "most 1 GiB", label);
    hid_t d = H5Dopen2(f->file, dpath, H5P_DEFAULT);
    if (d < 0)
        return probe_set_error(PROBE_EFORMAT, "%s: corrupt pack chunk: no %s", label, dpath);
    hid_t dcpl = H5Dget_create_plist(d);
    haddr_t addr = H5Dget_offset(d);
    int ok = byte_vector(d, &dlen) && dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS &&
             H5Pget_external_count(dcpl) == 0 && (addr != HADDR_UNDEF || dlen == 0);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    probe_status s = ok ? check_contained(d, f->path, dpath, NULL) : PROBE_OK;
    H5Dclose(d);
    if (s != PROBE_OK)
        return s;
    if (!ok)
        return probe_set_error(PROBE_EFORMAT, "%s: corrupt pack chunk: %s is not an allocated "
                               "contiguous 1-D byte dataset", label, dpath);
    unsigned char *buf = malloc(ilen ? (size_t)ilen : 1);
    if (buf == NULL)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
    if (ilen > 0 && H5Dread(ix, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        free(buf);
        char text[256];
        probe_h5_error_text(text, sizeof text);
        return probe_set_error(PROBE_EFORMAT, "%s: cannot read the pack index (%s)", label, text);
    }
    probe_journal_data jd;
    memset(&jd, 0, sizeof jd);
    s = probe_journal_parse(label, buf, (size_t)ilen, &jd);
    free(buf);
    if (s == PROBE_EFORMAT || s == PROBE_EUNSUPPORTED) {
        char why[512];
        snprintf(why, sizeof why, "%s", probe_last_error());
        probe_journal_data_free(&jd);
        return probe_set_error(PROBE_EFORMAT, "%s: corrupt pack index (%s)", label, why);
    }
    if (s == PROBE_OK && (jd.torn || !jd.header || jd.nskips > 0 || jd.manifest != NULL ||
                          jd.partial[0] != '\0'))
        s = probe_set_error(PROBE_EFORMAT, "%s: corrupt pack index (%s)", label,
                            jd.torn ? "its last record is cut short or fails its checksum"
                                    : "it holds records other than tensors");
    for (size_t i = 0; s == PROBE_OK && i < jd.n; i++) {
        const probe_journal_tensor_rec *r = &jd.t[i];
        if (r->info.stats_only) { /* stats-only records are never packed */
            s = probe_set_error(PROBE_EFORMAT, "%s: corrupt pack index (it holds records other "
                                "than tensors: %s is a stats-only record)", label, r->info.path);
            break;
        }
        if (r->nbytes > 0 && (r->offset > (uint64_t)dlen || r->nbytes > (uint64_t)dlen - r->offset)) {
            s = probe_set_error(PROBE_EFORMAT, "%s: corrupt pack index: %s (%llu bytes at %llu) runs "
                                "past the chunk's %llu bytes of data", label, r->info.path,
                                (unsigned long long)r->nbytes, (unsigned long long)r->offset,
                                (unsigned long long)dlen);
            break;
        }
        if (f->jaddr == NULL) {
            f->jaddr = malloc((f->cap ? f->cap : 1) * sizeof *f->jaddr);
            f->jop = calloc(f->cap ? f->cap : 1, sizeof *f->jop);
            if (f->jaddr == NULL || f->jop == NULL) {
                s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
                break;
            }
            for (size_t k = 0; k < f->cap; k++)
                f->jaddr[k] = PROBE_JOURNAL_NO_OFFSET;
        }
        if (grow(f) != 0) {
            s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
            break;
        }
        f->t[f->n] = r->info;
        f->daddr[f->n] = PROBE_JOURNAL_NO_OFFSET;
        f->jaddr[f->n] = (uint64_t)addr + (r->nbytes > 0 ? r->offset : 0);
        f->jop[f->n] = r->op;
        jd.t[i].op = NULL;
        f->n++;
    }
    f->ignored += jd.ignored;
    probe_journal_data_free(&jd);
    return s;
}

static herr_t visit_cb(hid_t group, const char *name, const H5L_info_t *info, void *data)
{
    struct visit *v = data;
    probe_file *f = v->f;
    if (info->type != H5L_TYPE_HARD)
        return 0; /* soft and external links: the target is indexed by its own hard link, or not ours */
    hid_t o = H5Oopen(group, name, H5P_DEFAULT);
    if (o < 0) {
        f->ignored++; /* a hard link to an unreadable object: counted, not fatal */
        return 0;
    }
    H5I_type_t type = H5Iget_type(o);
    if (type != H5I_DATASET) {
        H5Oclose(o);
        return 0;
    }
    if (grow(f) != 0) {
        H5Oclose(o);
        v->status = probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
        return -1;
    }
    char path[sizeof f->t->path + 1];
    int len = snprintf(path, sizeof path, "/%s", name);
    int plain = 0;
    probe_status c = check_contained(o, f->path, len < 0 || (size_t)len >= sizeof path ? name : path,
                                     &plain);
    if (c != PROBE_OK) {
        H5Oclose(o);
        v->status = c;
        return -1;
    }
    if (strncmp(name, PACK_GROUP "/", sizeof PACK_GROUP) == 0) {
        /* the packed layout: an index lists tensors, its data holds their
         * bytes; neither is a tensor itself */
        const char *tail = last_elem(name);
        probe_status ps = PROBE_OK;
        if (strcmp(tail, "index") == 0)
            ps = load_pack(f, o, name);
        else if (strcmp(tail, "data") != 0)
            f->ignored++;
        H5Oclose(o);
        if (ps != PROBE_OK) {
            v->status = ps;
            return -1;
        }
        return 0;
    }
    int as_stored = 0;
    int r = len < 0 || (size_t)len >= sizeof path ? 0 : describe(o, path, &f->t[f->n], &as_stored);
    uint64_t daddr = PROBE_JOURNAL_NO_OFFSET;
    if (r == 1 && plain && as_stored && !f->t[f->n].stats_only) {
        const probe_tensor_info *t = &f->t[f->n];
        haddr_t a = H5Dget_offset(o);
        if (a != HADDR_UNDEF && (uint64_t)a != PROBE_JOURNAL_NO_OFFSET &&
            H5Dget_storage_size(o) == t->n * probe_dtype_size(t->dtype))
            daddr = (uint64_t)a;
    }
    H5Oclose(o);
    if (r < 0) {
        v->status = probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
        return -1;
    }
    if (r == 0) {
        f->ignored++;
    } else {
        f->daddr[f->n] = daddr;
        if (f->jaddr != NULL) {
            f->jaddr[f->n] = PROBE_JOURNAL_NO_OFFSET;
            f->jop[f->n] = NULL;
        }
        f->n++;
    }
    return 0;
}

static int cmp_path(const void *a, const void *b)
{
    return strcmp(((const probe_tensor_info *)a)->path, ((const probe_tensor_info *)b)->path);
}

static int cmp_seq(const void *a, const void *b)
{
    const probe_tensor_info *x = a, *y = b;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return strcmp(x->path, y->path);
}

static int cmp_ptr_path(const void *a, const void *b)
{
    return strcmp((*(const probe_tensor_info *const *)a)->path,
                  (*(const probe_tensor_info *const *)b)->path);
}

static int cmp_ptr_seq(const void *a, const void *b)
{
    return cmp_seq(*(const probe_tensor_info *const *)a, *(const probe_tensor_info *const *)b);
}

/* --- root attributes --- */

static probe_status parse_skips(probe_file *f, const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &err);
    if (j == NULL || !json_is_array(j)) {
        json_decref(j);
        return probe_set_error(PROBE_EFORMAT, "%s: root attribute probe.skips is not a JSON array", f->path);
    }
    size_t n = json_array_size(j);
    f->skips = n > 0 ? calloc(n, sizeof *f->skips) : NULL;
    if (n > 0 && f->skips == NULL) {
        json_decref(j);
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(j, i);
        const char *p = json_string_value(json_object_get(e, "path"));
        const char *r = json_string_value(json_object_get(e, "reason"));
        if (p == NULL || r == NULL) {
            json_decref(j);
            return probe_set_error(PROBE_EFORMAT,
                                   "%s: root attribute probe.skips: entry %zu lacks string \"path\" and \"reason\"",
                                   f->path, i);
        }
        snprintf(f->skips[i].path, sizeof f->skips[i].path, "%s", p);
        snprintf(f->skips[i].reason, sizeof f->skips[i].reason, "%s", r);
        f->nskips = i + 1;
    }
    json_decref(j);
    return PROBE_OK;
}

/* Read the root attributes; PROBE_EUNSUPPORTED for a newer capture format
 * version. Call inside H5E_BEGIN_TRY. */
static probe_status read_root(probe_file *f)
{
    char *format = NULL;
    if (attr_str(f->file, "probe.format", &format) < 0)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
    int64_t version = 0;
    int is_capture = format != NULL && strcmp(format, "probe-capture") == 0;
    free(format);
    if (is_capture && attr_i64(f->file, "probe.version", &version) &&
        version > PROBE_CAPTURE_FORMAT_VERSION)
        return probe_set_error(PROBE_EUNSUPPORTED,
                               "%s: capture format version %lld is newer than this reader (version %d)",
                               f->path, (long long)version, PROBE_CAPTURE_FORMAT_VERSION);
    if (attr_str(f->file, "probe.manifest", &f->manifest) < 0)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
    if (f->manifest != NULL && strlen(f->manifest) > ATTR_STR_MAX) {
        free(f->manifest); /* informational only: dropped, the tensors stay comparable */
        f->manifest = NULL;
    }
    char *skips = NULL;
    if (attr_str(f->file, "probe.skips", &skips) < 0)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
    if (skips != NULL && strlen(skips) > ATTR_STR_MAX) {
        free(skips);
        return probe_set_error(PROBE_EFORMAT, "%s: root attribute probe.skips is larger than %zu MiB",
                               f->path, ATTR_STR_MAX >> 20);
    }
    probe_status s = skips != NULL ? parse_skips(f, skips) : PROBE_OK;
    free(skips);
    return s;
}

/* --- open/close --- */

/* --- storage outside the capture file ---
 * HDF5 reads some datasets' elements from elsewhere: external storage (raw
 * files named in the dataset's creation properties, opened by name at
 * H5Dread: a FIFO blocks it forever, /etc/passwd reads as floats), virtual
 * datasets (source datasets in other files, or reached through links), and
 * filters that are not built into libhdf5 (H5Dread then dlopens every shared
 * object in HDF5_PLUGIN_PATH, or the default plugin folder, to find one).
 * probe reads only data inside the capture file: a dataset with any of these
 * is refused, checked from its creation properties (object header only)
 * before anything reads an attribute or an element. External links are never
 * followed (only hard links index datasets: visit_cb). */

static void printable(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src[i] != '\0' && i + 1 < cap; i++)
        dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
    dst[i] = '\0';
}

static int builtin_filter(H5Z_filter_t id)
{
    switch (id) {
#ifdef H5_HAVE_FILTER_DEFLATE
    case H5Z_FILTER_DEFLATE:
#endif
#ifdef H5_HAVE_FILTER_SZIP
    case H5Z_FILTER_SZIP:
#endif
    case H5Z_FILTER_SHUFFLE:
    case H5Z_FILTER_FLETCHER32:
    case H5Z_FILTER_NBIT:
    case H5Z_FILTER_SCALEOFFSET:
        return 1;
    default:
        return 0;
    }
}

/* PROBE_OK if every element of dataset d (at dpath in file fpath) is stored
 * inside the file and decoded by libhdf5's built-in filters; otherwise
 * PROBE_EUNSUPPORTED with one line naming the dataset and the target. Call
 * inside H5E_BEGIN_TRY. A dataset whose creation properties cannot be read
 * is refused too (its storage is unknown). When plain is not NULL, *plain
 * is 1 for a contained dataset of contiguous layout with no external
 * storage (not even probe's raw files), else 0. */
static probe_status check_contained(hid_t d, const char *fpath, const char *dpath, int *plain)
{
    if (plain != NULL)
        *plain = 0;
    enum { NAME = 512 };
    char name[NAME] = "", src[NAME] = "", shown[2 * NAME + 2];
    static const char inside[] = "refused, probe reads only data inside the capture file";
    probe_status s = PROBE_OK;
    hid_t dcpl = H5Dget_create_plist(d);
    if (dcpl < 0)
        return probe_set_error(PROBE_EUNSUPPORTED, "%s: %s: storage properties unreadable: %s", fpath,
                               dpath, inside);
    int next = H5Pget_external_count(dcpl), next0 = next;
    size_t nsegs = 0; /* probe's raw files: read by probe at reads (raw_pieces), checked then */
    if (next > 0 && probe_raw_efl_read(dcpl, name, sizeof name, NULL, &nsegs) == 1)
        next = 0;
    H5D_layout_t lay = H5Pget_layout(dcpl);
    if (plain != NULL)
        *plain = next0 == 0 && lay == H5D_CONTIGUOUS;
    int nfilters = H5Pget_nfilters(dcpl);
    if (next != 0) {
        off_t off = 0;
        hsize_t size = 0;
        if (next < 0 || H5Pget_external(dcpl, 0, sizeof name, name, &off, &size) < 0)
            snprintf(name, sizeof name, "unreadable file name");
        name[sizeof name - 1] = '\0';
        printable(shown, sizeof shown, name);
        s = probe_set_error(PROBE_EUNSUPPORTED, "%s: %s: external storage (%s%s): %s", fpath, dpath,
                            shown, next > 1 ? ", ..." : "", inside);
    } else if (lay < 0) {
        s = probe_set_error(PROBE_EUNSUPPORTED, "%s: %s: storage layout unreadable: %s", fpath, dpath,
                            inside);
    } else if (lay == H5D_VIRTUAL) {
        size_t count = 0;
        if (H5Pget_virtual_count(dcpl, &count) >= 0 && count > 0 &&
            H5Pget_virtual_filename(dcpl, 0, name, sizeof name) >= 0 &&
            H5Pget_virtual_dsetname(dcpl, 0, src, sizeof src) >= 0) {
            char both[2 * NAME + 2];
            name[sizeof name - 1] = src[sizeof src - 1] = '\0';
            snprintf(both, sizeof both, "%s:%s", name, src);
            printable(shown, sizeof shown, both);
        } else {
            snprintf(shown, sizeof shown, "sources unreadable");
        }
        s = probe_set_error(PROBE_EUNSUPPORTED, "%s: %s: virtual dataset source (%s%s): %s", fpath,
                            dpath, shown, count > 1 ? ", ..." : "", inside);
    } else if (nfilters < 0) {
        s = probe_set_error(PROBE_EUNSUPPORTED, "%s: %s: filter pipeline unreadable: %s", fpath, dpath,
                            inside);
    } else {
        for (int i = 0; i < nfilters; i++) {
            unsigned flags = 0;
            size_t ncd = 0;
            /* no filter_config: that would look the filter up in libhdf5 */
            H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, NULL, sizeof name, name, NULL);
            if (id >= 0 && builtin_filter(id))
                continue;
            name[sizeof name - 1] = '\0';
            printable(shown, sizeof shown, name);
            s = probe_set_error(PROBE_EUNSUPPORTED,
                                "%s: %s: filter %d%s%s%s is not built into HDF5 (a plugin): refused, "
                                "probe loads no filter plugins", fpath, dpath, (int)id,
                                shown[0] ? " (" : "", shown, shown[0] ? ")" : "");
            break;
        }
    }
    H5Pclose(dcpl);
    if (s != PROBE_OK && plain != NULL)
        *plain = 0;
    return s;
}

/* --- global heap collections, checked before HDF5 reads them ---
 * Variable-length strings (the probe.* attributes that probe's writer and
 * h5py write) live in global heap collections: "GCOL", version 1, 3 reserved
 * bytes, the collection size (L bytes, L = the superblock's size of lengths),
 * then objects of {index u16, refcount u16, reserved 4, size L, data padded
 * to 8}, index 0 being the free space. HDF5 1.10.8 walks the objects with
 * `p = begin + need` where need is the free space's size itself: a size of 0
 * (also the zeros that its sec2 driver returns past the end of a file that a
 * collection claims to extend beyond) never advances and HDF5 loops forever
 * (found by tests/fuzz/fuzz_reader; docs/hardening.md). So every collection
 * header that HDF5 would accept (signature and version 1) anywhere in the
 * file is walked here first the same way; one that does not end exactly at
 * its size, inside the file, makes the file corrupt. One sequential read of
 * the file (page-cache speed; the compare reads it anyway). */

typedef struct {
    int fd;
    uint64_t fsize;
    unsigned char *buf; /* window [at, at + len) of the file */
    uint64_t at;
    size_t len, cap;
} file_window;

/* Make [off, off + n) (n <= 64) available in w->buf; returns its pointer or NULL. */
static const unsigned char *window_get(file_window *w, uint64_t off, size_t n)
{
    if (off + n > w->fsize)
        return NULL;
    if (off >= w->at && off + n <= w->at + w->len)
        return w->buf + (off - w->at);
    size_t want = w->fsize - off < w->cap ? (size_t)(w->fsize - off) : w->cap, got = 0;
    while (got < want) {
        ssize_t k = pread(w->fd, w->buf + got, want - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    w->at = off;
    w->len = got;
    return got >= n ? w->buf : NULL;
}

static uint64_t decode_le(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

/* The superblock's size of lengths (2..8), or 0 when it cannot be found. */
static unsigned sizeof_lengths(file_window *w)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    for (uint64_t off = 0; off + 16 <= w->fsize; off = off ? off * 2 : 512) {
        const unsigned char *p = window_get(w, off, 16);
        if (p == NULL)
            return 0;
        if (memcmp(p, sig, 8) == 0) {
            unsigned l = p[8] <= 1 ? p[14] : p[10]; /* versions 0/1 and 2/3 */
            return l >= 2 && l <= 8 ? l : 0;
        }
    }
    return 0;
}

/* Walk the collection at `off`: 0 when it is well formed, -1 otherwise.
 * *budget counts the objects walked in the whole file: collections of a real
 * file do not overlap, so more than one object per 16 bytes means crafted
 * overlapping collections (which could otherwise cost quadratic time). */
static int check_collection(file_window *w, uint64_t off, unsigned L, uint64_t *budget)
{
    const unsigned char *h = window_get(w, off, 8 + L);
    if (h == NULL)
        return -1; /* a header cut by the end of the file */
    uint64_t size = decode_le(h + 8, L);
    uint64_t hdr = (8 + L + 7) & ~(uint64_t)7, ohdr = 8 + L; /* H5HG_SIZEOF_HDR, _OBJHDR */
    if (size < hdr || size > w->fsize - off)
        return -1;
    uint64_t end = off + size, p = off + hdr;
    while (p < end) {
        if ((*budget)-- == 0)
            return -1;
        if (end - p < ohdr)
            break; /* a tail too small for an object header: free space */
        const unsigned char *o = window_get(w, p, ohdr);
        if (o == NULL)
            return -1;
        unsigned idx = (unsigned)decode_le(o, 2);
        uint64_t osize = decode_le(o + 8, L), need;
        if (idx > 0) {
            if (osize > end - p)
                return -1;
            need = ohdr + ((osize + 7) & ~(uint64_t)7);
        } else {
            need = osize;
        }
        if (need == 0 || need > end - p)
            return -1;
        p += need;
    }
    return 0;
}

/* Raw data of the file's datasets: byte ranges [start, end) that hold
 * tensor elements, not HDF5 metadata. */
typedef struct {
    uint64_t start, end;
} extent;

typedef struct {
    extent *e;
    size_t n, cap;
    int incomplete; /* too many chunks to list: scan everything */
    const char *fpath;
    probe_status refused; /* a dataset stored outside the file (check_contained) */
} extent_list;

static int cmp_extent(const void *a, const void *b)
{
    const extent *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void extent_add(extent_list *l, uint64_t start, uint64_t size)
{
    if (size == 0 || l->incomplete)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        extent *e = cap <= ((size_t)1 << 20) ? realloc(l->e, cap * sizeof *e) : NULL;
        if (e == NULL) {
            l->incomplete = 1;
            return;
        }
        l->e = e;
        l->cap = cap;
    }
    l->e[l->n++] = (extent){start, start + size};
}

/* H5Lvisit callback: the raw-data extents of every dataset reachable by a
 * hard link (contiguous storage, or every allocated chunk), and the first
 * dataset stored outside the file (stops the visit). Reads object headers
 * and chunk indexes only, no attribute and no global heap. */
static herr_t extent_cb(hid_t group, const char *name, const H5L_info_t *info, void *data)
{
    extent_list *l = data;
    if (info->type != H5L_TYPE_HARD)
        return 0;
    hid_t o = H5Oopen(group, name, H5P_DEFAULT);
    if (o < 0)
        return 0;
    int dataset = H5Iget_type(o) == H5I_DATASET;
    if (dataset) {
        char dpath[1024];
        snprintf(dpath, sizeof dpath, "/%s", name);
        if ((l->refused = check_contained(o, l->fpath, dpath, NULL)) != PROBE_OK) {
            H5Oclose(o);
            return 1;
        }
    }
    if (dataset && !l->incomplete) {
        hid_t dcpl = H5Dget_create_plist(o);
        H5D_layout_t lay = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
        if (lay == H5D_CONTIGUOUS) {
            haddr_t a = H5Dget_offset(o);
            if (a != HADDR_UNDEF)
                extent_add(l, (uint64_t)a, (uint64_t)H5Dget_storage_size(o));
        } else if (lay == H5D_CHUNKED) {
            hid_t sp = H5Dget_space(o);
            hsize_t nchunks = 0;
            if (sp >= 0 && H5Dget_num_chunks(o, sp, &nchunks) >= 0 && nchunks <= ((hsize_t)1 << 20)) {
                for (hsize_t i = 0; i < nchunks; i++) {
                    hsize_t off[32];
                    unsigned mask;
                    haddr_t a;
                    hsize_t size;
                    if (H5Dget_chunk_info(o, sp, i, off, &mask, &a, &size) >= 0 && a != HADDR_UNDEF)
                        extent_add(l, (uint64_t)a, (uint64_t)size);
                }
            } else {
                l->incomplete = 1;
            }
            if (sp >= 0)
                H5Sclose(sp);
        }
        if (dcpl >= 0)
            H5Pclose(dcpl);
    }
    H5Oclose(o);
    return 0;
}

static probe_status check_global_heaps(const char *path, const struct stat *st,
                                       const extent_list *skip)
{
    file_window w = {.fd = open(path, O_RDONLY | O_CLOEXEC), .fsize = (uint64_t)st->st_size,
                     .cap = (size_t)1 << 20};
    if (w.fd < 0)
        return probe_set_error(PROBE_EIO, "%s: %s", path, strerror(errno));
    unsigned char *scan = malloc(w.cap);
    w.buf = malloc(w.cap);
    probe_status s = PROBE_OK;
    if (scan == NULL || w.buf == NULL) {
        s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    unsigned L = sizeof_lengths(&w);
    uint64_t budget = w.fsize / 16 + 1024;
    if (L == 0)
        goto done; /* no superblock: HDF5 rejects the file itself */
    /* consecutive windows overlap by 5 bytes: a "GCOL" + version across a seam is seen;
     * the datasets' raw data (sorted extents) is skipped: tensor bytes may
     * hold "GCOL\1" by chance and are not heap collections */
    size_t xi = 0;
    for (uint64_t base = 0; base < w.fsize;) {
        while (skip && !skip->incomplete && xi < skip->n && skip->e[xi].end <= base)
            xi++;
        if (skip && !skip->incomplete && xi < skip->n && skip->e[xi].start <= base) {
            base = skip->e[xi].end; /* inside raw data: jump past it */
            continue;
        }
        uint64_t limit = w.fsize;
        if (skip && !skip->incomplete && xi < skip->n && skip->e[xi].start < limit)
            limit = skip->e[xi].start + 4; /* up to the next extent (the seam overlap) */
        size_t len = 0;
        while (len < w.cap && base + len < limit) {
            size_t room = w.cap - len;
            if (room > limit - base - len)
                room = (size_t)(limit - base - len);
            ssize_t k = pread(w.fd, scan + len, room, (off_t)(base + len));
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                break;
            len += (size_t)k;
        }
        if (len < 5) { /* a gap too short to hold a signature */
            if (limit >= w.fsize)
                break;
            base = limit;
            continue;
        }
        for (const unsigned char *q = scan; (q = memmem(q, len - (size_t)(q - scan), "GCOL\1", 5)) != NULL; q++) {
            if (check_collection(&w, base + (uint64_t)(q - scan), L, &budget) != 0) {
                s = probe_set_error(PROBE_EFORMAT, "%s: corrupt HDF5 file (malformed global heap "
                                    "collection at byte %llu)", path,
                                    (unsigned long long)(base + (uint64_t)(q - scan)));
                goto done;
            }
        }
        if (base + len >= w.fsize)
            break;
        base += len - 4;
        if (base + 4 >= limit && limit < w.fsize)
            base = limit; /* reached the extent: the loop head jumps past it */
    }
done:
    free(scan);
    free(w.buf);
    close(w.fd);
    return s;
}

/* Classify why path cannot be opened before HDF5 sees it. */
static probe_status precheck(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        return probe_set_error(e == ENOENT || e == ENOTDIR ? PROBE_ENOTFOUND : PROBE_EIO, "%s: %s",
                               path, strerror(e));
    }
    if (S_ISDIR(st.st_mode))
        return probe_set_error(PROBE_EFORMAT, "%s: not an HDF5 file (%s)", path, strerror(EISDIR));
    if (!S_ISREG(st.st_mode)) /* a FIFO would block HDF5's open forever */
        return probe_set_error(PROBE_EFORMAT, "%s: not an HDF5 file (not a regular file)", path);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return probe_set_error(PROBE_EIO, "%s: %s", path, strerror(errno));
    close(fd);
    if (st.st_size == 0)
        return probe_set_error(PROBE_EFORMAT, "%s: not an HDF5 file (empty file)", path);
    return PROBE_OK;
}

/* Files up to this size are first scanned whole for heap collections: one
 * read of at most 256 MiB, which the compare reads anyway, instead of
 * opening every dataset to list its raw data (the cost of a file of many
 * small datasets). */
#define HEAP_SCAN_WHOLE_MAX ((uint64_t)256 << 20)

/* The global-heap check of an opened file (call before anything reads an
 * attribute). A file of at most HEAP_SCAN_WHOLE_MAX bytes whose every
 * collection signature, raw data included, heads a well-formed collection
 * passes at once; any other file is scanned again skipping its datasets'
 * raw data (where tensor bytes may hold the signature by chance), which
 * checks a subset of the same signatures, so the first scan never passes a
 * file that the second would refuse. */
static probe_status check_heaps_of(probe_file *f)
{
    struct stat st;
    if (stat(f->path, &st) != 0)
        return probe_set_error(PROBE_EIO, "%s: %s", f->path, strerror(errno));
    if ((uint64_t)st.st_size <= HEAP_SCAN_WHOLE_MAX && check_global_heaps(f->path, &st, NULL) == PROBE_OK)
        return PROBE_OK;
    extent_list l = {.fpath = f->path, .refused = PROBE_OK};
    H5Lvisit(f->file, H5_INDEX_NAME, H5_ITER_INC, extent_cb, &l);
    if (l.refused != PROBE_OK) {
        free(l.e);
        return l.refused;
    }
    if (l.n > 1)
        qsort(l.e, l.n, sizeof *l.e, cmp_extent);
    probe_status s = check_global_heaps(f->path, &st, &l);
    free(l.e);
    return s;
}

/* Status for an HDF5 file whose superblock HDF5 cannot read: a lock held by
 * a writer is PROBE_EIO, everything else (truncation, corruption) is
 * PROBE_EFORMAT. Call inside H5E_BEGIN_TRY, right after the failing call. */
static probe_status open_failure(const char *path)
{
    char text[256];
    probe_h5_error_text(text, sizeof text);
    if (strstr(text, "unable to lock") != NULL)
        return probe_set_error(PROBE_EIO, "%s: cannot open (%s; is another process writing it?)", path, text);
    return probe_set_error(PROBE_EFORMAT, "%s: truncated or corrupt HDF5 file (%s)", path, text);
}

/* 1 on the thread inside probe_file_open_unlocked_: HDF5's file lock is
 * not taken and not waited for (the caller, a writer of this process,
 * holds an exclusive flock on the file, with which a shared lock would
 * conflict). */
static _Thread_local int open_unlocked;

/* A file whose lock another process holds is waited for, up to 2 s, before
 * it is opened: the process of a writer that was just killed may still be
 * exiting (it holds its lock until it is gone), and probe-run may still be
 * recording run_end in it. A writer that goes on writing is then refused as
 * before. */
static void wait_for_lock(const char *path)
{
    struct stat st;
    if (open_unlocked || stat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
        probe_writer_owns_((uint64_t)st.st_dev, (uint64_t)st.st_ino))
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return;
    struct timespec ms10 = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 200; i++) {
        if (flock(fd, LOCK_SH | LOCK_NB) == 0 || errno != EWOULDBLOCK)
            break;
        nanosleep(&ms10, NULL);
    }
    close(fd); /* drops the shared lock, if taken */
}

probe_status probe_file_open_unlocked_(const char *path, probe_file **out)
{
    open_unlocked = 1;
    probe_status s = probe_file_open(path, out);
    open_unlocked = 0;
    return s;
}

probe_status probe_file_open(const char *path, probe_file **out)
{
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_file_open: out is NULL");
    *out = NULL;
    if (path == NULL || path[0] == '\0')
        return probe_set_error(PROBE_EINVAL, "probe_file_open: path is NULL or empty");
    wait_for_lock(path);
    probe_status s = open_journaled(path, out);
    if (s != PROBE_OK || *out != NULL)
        return s;
    s = precheck(path);
    if (s != PROBE_OK)
        return s;
    probe_file *f = calloc(1, sizeof *f);
    if (f == NULL || (f->path = strdup(path)) == NULL) {
        free(f);
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    }
    f->file = H5I_INVALID_HID;
    f->cur.index = (size_t)-1;
    f->pfd = -1;

    char text[256] = "";
    H5E_BEGIN_TRY {
        htri_t is = H5Fis_hdf5(path); /* finds the signature, reads the superblock */
        if (is == 0) {
            s = probe_set_error(PROBE_EFORMAT, "%s: not an HDF5 file", path);
        } else if (is < 0) {
            s = open_failure(path);
        } else {
            hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
#if H5_VERSION_GE(1, 10, 7)
            if (fapl >= 0) /* lock, but work on file systems without flock */
                H5Pset_file_locking(fapl, open_unlocked ? 0 : 1, 1);
#endif
            f->file = H5Fopen(path, H5F_ACC_RDONLY, fapl >= 0 ? fapl : H5P_DEFAULT);
            if (f->file < 0)
                s = open_failure(path);
            if (fapl >= 0)
                H5Pclose(fapl);
        }
        if (s == PROBE_OK)
            s = check_heaps_of(f);
        if (s == PROBE_OK)
            s = read_root(f);
        if (s == PROBE_OK) {
            struct visit v = {f, PROBE_OK};
            if (H5Lvisit(f->file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &v) < 0) {
                if (v.status != PROBE_OK) {
                    s = v.status;
                } else {
                    probe_h5_error_text(text, sizeof text);
                    s = probe_set_error(PROBE_EFORMAT, "%s: truncated or corrupt HDF5 file (%s)", path, text);
                }
            }
        }
    } H5E_END_TRY;
    if (s == PROBE_OK && f->n > 0) {
        f->by_path = malloc(f->n * sizeof *f->by_path);
        if (f->by_path == NULL)
            s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    }
    if (s != PROBE_OK) {
        probe_file_close(f);
        return s;
    }
    int all_seq = 1;
    for (size_t i = 0; i < f->n; i++)
        all_seq &= f->t[i].seq >= 0;
    if (f->n > 0)
        s = sort_tensors(f, all_seq);
    for (size_t i = 0; i < f->n; i++)
        f->by_path[i] = &f->t[i];
    if (f->n > 0 && (all_seq || f->jaddr != NULL))
        qsort(f->by_path, f->n, sizeof *f->by_path, cmp_ptr_path);
    /* a packed tensor at the path of a dataset (or of another packed one) */
    for (size_t i = 1; s == PROBE_OK && f->jaddr != NULL && i < f->n; i++)
        if (strcmp(f->by_path[i - 1]->path, f->by_path[i]->path) == 0)
            s = probe_set_error(PROBE_EFORMAT, "%s: corrupt pack index: %s is stored twice", path,
                                f->by_path[i]->path);
    if (s != PROBE_OK) {
        probe_file_close(f);
        return s;
    }
    *out = f;
    return PROBE_OK;
}

/* Sort f->t by seq (all_seq) or by path, carrying daddr, jaddr and jop along. */
static probe_status sort_tensors(probe_file *f, int all_seq)
{
    size_t n = f->n;
    const probe_tensor_info **p = malloc(n * sizeof *p);
    probe_tensor_info *t = malloc(n * sizeof *t);
    uint64_t *da = malloc(n * sizeof *da);
    uint64_t *a = f->jaddr != NULL ? malloc(n * sizeof *a) : NULL;
    char **op = f->jaddr != NULL ? malloc(n * sizeof *op) : NULL;
    if (p == NULL || t == NULL || da == NULL || (f->jaddr != NULL && (a == NULL || op == NULL))) {
        free(p);
        free(t);
        free(da);
        free(a);
        free(op);
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = &f->t[i];
    qsort(p, n, sizeof *p, all_seq ? cmp_ptr_seq : cmp_ptr_path);
    for (size_t i = 0; i < n; i++) {
        size_t k = (size_t)(p[i] - f->t);
        t[i] = f->t[k];
        da[i] = f->daddr[k];
        if (a != NULL) {
            a[i] = f->jaddr[k];
            op[i] = f->jop[k];
        }
    }
    free(p);
    free(f->t);
    free(f->daddr);
    f->t = t;
    f->daddr = da;
    if (a != NULL) {
        free(f->jaddr);
        free(f->jop);
        f->jaddr = a;
        f->jop = op;
    }
    f->cap = n;
    return PROBE_OK;
}

static void range_close(probe_file *f);

void probe_file_close(probe_file *f)
{
    if (f == NULL)
        return;
    range_close(f);
    if (f->file >= 0) {
        H5E_BEGIN_TRY { H5Fclose(f->file); } H5E_END_TRY;
    }
    free(f->t);
    free(f->by_path);
    free(f->manifest);
    free(f->skips);
    free(f->path);
    free(f->jaddr);
    free(f->daddr);
    for (size_t i = 0; f->jop != NULL && i < f->n; i++)
        free(f->jop[i]);
    free(f->jop);
    free(f->jsum);
    if (f->pfd >= 0)
        close(f->pfd);
    for (size_t i = 0; f->jsegs != NULL && i < f->n; i++)
        free(f->jsegs[i]);
    free(f->jsegs);
    free(f->jnsegs);
    for (unsigned i = 0; i < PROBE_RAW_FILES_MAX; i++)
        if (f->lane_fd1[i] > 0)
            close(f->lane_fd1[i] - 1);
    if (f->raw_dfd1 > 0)
        close(f->raw_dfd1 - 1);
    free(f);
}

/* --- queries --- */

size_t probe_file_count(const probe_file *f)
{
    return f != NULL ? f->n : 0;
}

const probe_tensor_info *probe_file_tensor(const probe_file *f, size_t i)
{
    return f != NULL && i < f->n ? &f->t[i] : NULL;
}

probe_status probe_file_find(const probe_file *f, const char *path, size_t *index)
{
    if (f == NULL || path == NULL || index == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_file_find: %s is NULL",
                               f == NULL ? "file" : path == NULL ? "path" : "index");
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_path[mid]->path, path);
        if (c == 0) {
            *index = (size_t)(f->by_path[mid] - f->t);
            return PROBE_OK;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return probe_set_error(PROBE_ENOTFOUND, "%s: no tensor at %s", f->path, path);
}

const char *probe_file_manifest(const probe_file *f)
{
    return f != NULL ? f->manifest : NULL;
}

size_t probe_file_skip_count(const probe_file *f)
{
    return f != NULL ? f->nskips : 0;
}

const probe_skip_info *probe_file_skip(const probe_file *f, size_t i)
{
    return f != NULL && i < f->nskips ? &f->skips[i] : NULL;
}

size_t probe_file_ignored_count(const probe_file *f)
{
    return f != NULL ? f->ignored : 0;
}

const char *probe_file_path(const probe_file *f)
{
    return f != NULL ? f->path : NULL;
}

const char *probe_file_hdf5_version(void)
{
    static char v[32];
    unsigned maj = 0, min = 0, rel = 0;
    if (v[0] == '\0' && H5get_libversion(&maj, &min, &rel) >= 0)
        snprintf(v, sizeof v, "%u.%u.%u", maj, min, rel);
    return v[0] ? v : "unknown";
}

/* --- string attributes of a tensor (the probe.op record, docs/oracle.md) --- */

probe_status probe_file_tensor_attr(probe_file *f, size_t i, const char *name, char **out)
{
    if (out != NULL)
        *out = NULL;
    if (f == NULL || name == NULL || out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_file_tensor_attr: NULL argument");
    if (i >= f->n)
        return probe_set_error(PROBE_EINVAL,
                               "probe_file_tensor_attr: %s: tensor index %zu out of range (%zu tensors)",
                               f->path, i, f->n);
    const probe_tensor_info *t = &f->t[i];
    if (!f->recovery.recovered && at_jaddr(f, i) && strcmp(name, "probe.op") != 0) {
        /* a packed tensor: its index record holds the attributes */
        const char *v = strcmp(name, "probe.dtype") == 0       ? probe_dtype_name(t->dtype)
                        : strcmp(name, "probe.component") == 0 ? t->component
                        : strcmp(name, "probe.slot") == 0      ? t->slot
                        : strcmp(name, "probe.scope") == 0     ? t->scope
                        : strcmp(name, "probe.hash") == 0      ? t->hash
                        : strcmp(name, "probe.parent") == 0    ? t->parent
                        : strcmp(name, "probe.class") == 0     ? t->class_name
                        : strcmp(name, "probe.module") == 0    ? t->module
                                                               : NULL;
        if (v == NULL || (v[0] == '\0' && strcmp(name, "probe.scope") != 0))
            return probe_set_error(PROBE_ENOTFOUND, "%s: %s: no string attribute %s", f->path,
                                   t->path, name);
        if ((*out = strdup(v)) == NULL)
            return probe_set_error(PROBE_ENOMEM, "%s: %s: attribute %s: out of memory", f->path,
                                   t->path, name);
        return PROBE_OK;
    }
    if (f->recovery.recovered || at_jaddr(f, i)) { /* the journal keeps probe.op only */
        if (strcmp(name, "probe.op") != 0)
            return probe_set_error(PROBE_ENOTFOUND,
                                   "%s: %s: attribute %s: not kept for a capture recovered from its journal",
                                   f->path, t->path, name);
        if (f->jop == NULL || f->jop[i] == NULL)
            return probe_set_error(PROBE_ENOTFOUND, "%s: %s: no string attribute %s", f->path, t->path,
                                   name);
        if ((*out = strdup(f->jop[i])) == NULL)
            return probe_set_error(PROBE_ENOMEM, "%s: %s: attribute %s: out of memory", f->path,
                                   t->path, name);
        return PROBE_OK;
    }
    probe_status s = PROBE_OK;
    char text[256];
    H5E_BEGIN_TRY {
        hid_t d = H5Oopen(f->file, t->path, H5P_DEFAULT);
        if (d < 0) {
            probe_h5_error_text(text, sizeof text);
            s = probe_set_error(PROBE_EIO, "%s: %s: cannot open dataset (%s)", f->path, t->path, text);
        } else {
            int r = attr_str(d, name, out);
            if (r < 0)
                s = probe_set_error(PROBE_ENOMEM, "%s: %s: attribute %s: out of memory", f->path,
                                    t->path, name);
            else if (r == 0)
                s = probe_set_error(PROBE_ENOTFOUND, "%s: %s: no string attribute %s", f->path,
                                    t->path, name);
            H5Oclose(d);
        }
    } H5E_END_TRY;
    return s;
}

/* --- raw files (docs/file-format.md "Raw files") --- */

/* Open raw file `lane` of folder dir (next to the capture) once, into
 * f->lane_fd1: never through a symbolic link (the folder or the file), and
 * only a regular file (a FIFO would block a read). PROBE_EFORMAT or
 * PROBE_EIO naming the folder or file. */
static probe_status raw_lane_open(probe_file *f, const char *dir, unsigned lane, const char *tpath)
{
    if (f->raw_dir[0] != '\0' && strcmp(f->raw_dir, dir) != 0) {
        return probe_set_error(PROBE_EFORMAT, "%s: %s: raw files in %s, but others in %s: a "
                               "capture has one raw files folder", f->path, tpath, dir, f->raw_dir);
    }
    if (f->raw_dfd1 == 0) {
        char *slash = strrchr(f->path, '/');
        char *parent = slash == NULL ? strdup(".") : strndup(f->path, (size_t)(slash - f->path) + 1);
        int pfd = parent != NULL ? open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        int dfd = pfd >= 0 ? openat(pfd, dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        int e = errno;
        free(parent);
        if (pfd >= 0)
            close(pfd);
        if (dfd < 0) {
            return probe_set_error(PROBE_EIO, "%s: %s: its bytes are in the raw files folder %s "
                                   "next to it, which cannot be opened: %s%s", f->path, tpath, dir,
                                   strerror(e), e == ELOOP || e == ENOTDIR
                                                    ? " (a symbolic link or not a folder)" : "");
        }
        snprintf(f->raw_dir, sizeof f->raw_dir, "%s", dir);
        f->raw_dfd1 = dfd + 1;
    }
    if (f->lane_fd1[lane] == 0) {
        char leaf[4];
        snprintf(leaf, sizeof leaf, "%02u", lane);
        errno = 0;
        int fd = openat(f->raw_dfd1 - 1, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            int e = errno;
            int notreg = fd >= 0 && e == 0;
            if (fd >= 0)
                close(fd);
            return probe_set_error(notreg ? PROBE_EFORMAT : PROBE_EIO, "%s: %s: raw file %s/%s: %s",
                                   f->path, tpath, dir, leaf,
                                   notreg ? "not a regular file"
                                          : e == ELOOP ? "a symbolic link" : strerror(e));
        }
        f->lane_fd1[lane] = fd + 1;
        f->lane_size[lane] = (uint64_t)st.st_size;
    }
    return PROBE_OK;
}

/* PROBE_OK when pieces segs[0..n) of tensor tpath are nbytes in all and
 * each lies inside its raw file of folder dir; else PROBE_EFORMAT (or the
 * raw file's PROBE_EIO) naming the file. */
static probe_status raw_check(probe_file *f, const char *dir, const probe_raw_seg *segs, size_t n,
                              uint64_t nbytes, const char *tpath)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (segs[i].lane >= PROBE_RAW_FILES_MAX)
            return probe_set_error(PROBE_EFORMAT, "%s: %s: raw file %u out of range", f->path, tpath,
                                   segs[i].lane);
        probe_status ls = raw_lane_open(f, dir, segs[i].lane, tpath);
        if (ls != PROBE_OK)
            return ls;
        uint64_t size = f->lane_size[segs[i].lane];
        if (segs[i].offset > size || segs[i].size > size - segs[i].offset)
            return probe_set_error(PROBE_EFORMAT, "%s: %s: raw file %s/%02u holds %llu bytes, its "
                                   "piece %zu is bytes [%llu, %llu): truncated", f->path, tpath,
                                   dir, segs[i].lane, (unsigned long long)size, i,
                                   (unsigned long long)segs[i].offset,
                                   (unsigned long long)(segs[i].offset + segs[i].size));
        if (segs[i].size > UINT64_MAX - sum)
            return probe_set_error(PROBE_EFORMAT, "%s: %s: raw pieces overflow", f->path, tpath);
        sum += segs[i].size;
    }
    if (sum != nbytes)
        return probe_set_error(PROBE_EFORMAT, "%s: %s: its raw pieces hold %llu bytes, the tensor "
                               "has %llu", f->path, tpath, (unsigned long long)sum,
                               (unsigned long long)nbytes);
    return PROBE_OK;
}

static int pread_full(int fd, void *dst, size_t n, uint64_t off);

/* Bytes [at, at + len) of the tensor whose (checked) pieces are segs. */
static probe_status raw_read(probe_file *f, const probe_raw_seg *segs, size_t n, uint64_t at,
                             size_t len, void *dst, const char *tpath)
{
    uint64_t start = 0;
    size_t i = 0;
    while (i < n && start + segs[i].size <= at)
        start += segs[i++].size;
    unsigned char *p = dst;
    while (len > 0) {
        if (i >= n)
            return probe_set_error(PROBE_EFORMAT, "%s: %s: read past its raw pieces", f->path, tpath);
        uint64_t in = at - start, k = segs[i].size - in;
        if (k > len)
            k = len;
        if (pread_full(f->lane_fd1[segs[i].lane] - 1, p, (size_t)k, segs[i].offset + in) != 0) {
            int e = errno;
            return probe_set_error(e ? PROBE_EIO : PROBE_EFORMAT, "%s: %s: cannot read raw file "
                                   "%s/%02u (%s)", f->path, tpath, f->raw_dir, segs[i].lane,
                                   e ? strerror(e) : "truncated since it was opened");
        }
        p += k;
        at += k;
        len -= (size_t)k;
        start += segs[i].size;
        i++;
    }
    return PROBE_OK;
}

/* The checked pieces of dataset d (tensor t, file type ft, memory type mt)
 * when it is in raw files: PROBE_OK with *segs malloc'd, or *segs NULL when
 * it is not. Call inside H5E_BEGIN_TRY. */
static probe_status raw_pieces(probe_file *f, const probe_tensor_info *t, hid_t d, hid_t ft,
                               hid_t mt, probe_raw_seg **segs, size_t *nsegs)
{
    char dir[256];
    hid_t dcpl = H5Dget_create_plist(d);
    int r = dcpl >= 0 ? probe_raw_efl_read(dcpl, dir, sizeof dir, segs, nsegs) : 0;
    if (dcpl >= 0)
        H5Pclose(dcpl);
    if (r == -2)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
    if (r != 1)
        return PROBE_OK; /* check_contained refused anything else */
    probe_status s = PROBE_OK;
    if (H5Tequal(ft, mt) <= 0)
        s = probe_set_error(PROBE_EUNSUPPORTED, "%s: %s: raw files in another byte order or type "
                            "than the tensor's: refused", f->path, t->path);
    else
        s = raw_check(f, dir, *segs, *nsegs, t->n * probe_dtype_size(t->dtype), t->path);
    if (s != PROBE_OK) {
        free(*segs);
        *segs = NULL;
    }
    return s;
}

/* --- reading --- */

/* Read all n elements of tensor t, converted to t's logical type in
 * little-endian order, into dst (n * probe_dtype_size bytes). */
static probe_status read_into(probe_file *f, const probe_tensor_info *t, void *dst)
{
    size_t ti = (size_t)(t - f->t);
    if (f->jsegs != NULL && f->jsegs[ti] != NULL)
        return raw_read(f, f->jsegs[ti], f->jnsegs[ti], 0, t->n * probe_dtype_size(t->dtype), dst,
                        t->path);
    if (at_jaddr(f, ti))
        return read_recovered(f, ti, 0, t->n, dst);
    if (f->daddr != NULL && f->daddr[ti] != PROBE_JOURNAL_NO_OFFSET)
        return read_at(f, ti, f->daddr[ti], 0, t->n, dst);
    probe_status s = PROBE_OK;
    char text[256];
    H5E_BEGIN_TRY {
        hid_t d = H5Dopen2(f->file, t->path, H5P_DEFAULT);
        hid_t ft = d >= 0 ? H5Dget_type(d) : H5I_INVALID_HID;
        hid_t sp = d >= 0 ? H5Dget_space(d) : H5I_INVALID_HID;
        hid_t mt = H5I_INVALID_HID;
        if (d < 0 || ft < 0 || sp < 0) {
            probe_h5_error_text(text, sizeof text);
            s = probe_set_error(PROBE_EIO, "%s: %s: cannot open dataset (%s)", f->path, t->path, text);
        } else if (probe_h5_classify(ft, t->dtype, &mt) != t->dtype ||
                   (uint64_t)H5Sget_simple_extent_npoints(sp) != t->n) {
            s = probe_set_error(PROBE_EFORMAT, "%s: %s: dataset changed since the file was opened",
                                f->path, t->path);
        } else if ((s = check_contained(d, f->path, t->path, NULL)) == PROBE_OK) {
            probe_raw_seg *segs = NULL;
            size_t nsegs = 0;
            if ((s = raw_pieces(f, t, d, ft, mt, &segs, &nsegs)) == PROBE_OK && segs != NULL) {
                s = raw_read(f, segs, nsegs, 0, t->n * probe_dtype_size(t->dtype), dst, t->path);
            } else if (s == PROBE_OK && H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0) {
                probe_h5_error_text(text, sizeof text);
                s = probe_set_error(PROBE_EIO, "%s: %s: cannot read dataset (%s)", f->path, t->path,
                                    text);
            }
            free(segs);
        }
        if (mt >= 0)
            H5Tclose(mt);
        if (sp >= 0)
            H5Sclose(sp);
        if (ft >= 0)
            H5Tclose(ft);
        if (d >= 0)
            H5Dclose(d);
    } H5E_END_TRY;
    return s;
}

static probe_status check_read(const probe_file *f, size_t i, const void *dst, const char *fn)
{
    if (f == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: file is NULL", fn);
    if (i >= f->n)
        return probe_set_error(PROBE_EINVAL, "%s: %s: tensor index %zu out of range (%zu tensors)", fn,
                               f->path, i, f->n);
    if (f->t[i].stats_only)
        return probe_set_error(PROBE_EUNSUPPORTED,
                               "%s: %s: %s is a stats-only record (summary and hash, no elements): "
                               "capture it without --stats-only to read its values",
                               fn, f->path, f->t[i].path);
    if (dst == NULL && f->t[i].n > 0)
        return probe_set_error(PROBE_EINVAL, "%s: %s: %s: dst is NULL", fn, f->path, f->t[i].path);
    return PROBE_OK;
}

probe_status probe_file_read_raw(probe_file *f, size_t i, void *dst, size_t nbytes)
{
    probe_status s = check_read(f, i, dst, "probe_file_read_raw");
    if (s != PROBE_OK)
        return s;
    const probe_tensor_info *t = &f->t[i];
    size_t want = (size_t)t->n * probe_dtype_size(t->dtype); /* cannot overflow: checked in describe() */
    if (nbytes != want)
        return probe_set_error(PROBE_EINVAL, "%s: %s: nbytes is %zu, the tensor has %zu bytes", f->path,
                               t->path, nbytes, want);
    return t->n == 0 ? PROBE_OK : read_into(f, t, dst);
}

probe_status probe_file_read_f64(probe_file *f, size_t i, double *dst)
{
    probe_status s = check_read(f, i, dst, "probe_file_read_f64");
    if (s != PROBE_OK)
        return s;
    const probe_tensor_info *t = &f->t[i];
    if (t->n == 0)
        return PROBE_OK;
    /* The raw elements (esize <= 8 bytes each) are read into the tail of dst
     * and converted front to back in blocks through a small buffer: block k's
     * doubles end at or before the raw bytes of block k+1 start, because
     * base + j*esize >= 8*j for every j <= n when base = n*(8 - esize). */
    size_t n = (size_t)t->n, esize = probe_dtype_size(t->dtype);
    unsigned char *raw = (unsigned char *)dst + n * (sizeof(double) - esize);
    s = read_into(f, t, raw);
    if (s != PROBE_OK)
        return s;
    enum { BLOCK = 1024 };
    unsigned char buf[BLOCK * sizeof(double)];
    for (size_t k = 0; k < n; k += BLOCK) {
        size_t m = n - k < BLOCK ? n - k : BLOCK;
        memcpy(buf, raw + k * esize, m * esize);
        s = probe_dtype_to_f64(t->dtype, buf, dst + k, m);
        if (s != PROBE_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", probe_last_error());
            return probe_set_error(s, "%s: %s: cannot convert %s to double (%s)", f->path, t->path,
                                   probe_dtype_name(t->dtype), why);
        }
    }
    return PROBE_OK;
}

/* --- reading a range of elements --- */

static void range_close(probe_file *f)
{
    if (f->cur.index == (size_t)-1)
        return;
    H5E_BEGIN_TRY {
        if (f->cur.mt >= 0)
            H5Tclose(f->cur.mt);
        if (f->cur.ft >= 0)
            H5Tclose(f->cur.ft);
        if (f->cur.fsp >= 0)
            H5Sclose(f->cur.fsp);
        if (f->cur.d >= 0)
            H5Dclose(f->cur.d);
    } H5E_END_TRY;
    if (f->cur.segs_owned)
        free(f->cur.segs);
    f->cur.segs = NULL;
    f->cur.segs_owned = 0;
    f->cur.index = (size_t)-1;
}

/* Open tensor i for range reads. A tensor with an offset (daddr, jaddr) or
 * raw-file pieces is read with pread(); anything else (chunked, compressed,
 * big-endian, converted types, compact) through H5Dread with a hyperslab
 * selection. */
static probe_status range_open(probe_file *f, size_t i)
{
    if (f->cur.index == i)
        return PROBE_OK;
    range_close(f);
    const probe_tensor_info *t = &f->t[i];
    probe_status s = PROBE_OK;
    char text[256];
    f->cur.d = f->cur.ft = f->cur.mt = f->cur.fsp = H5I_INVALID_HID;
    f->cur.fd = -1;
    f->cur.segs = NULL;
    f->cur.segs_owned = 0;
    f->cur.index = i;
    if (f->jsegs != NULL && f->jsegs[i] != NULL) { /* recovered, in raw files (checked) */
        f->cur.segs = f->jsegs[i];
        f->cur.nsegs = f->jnsegs[i];
        return PROBE_OK;
    }
    int at_j = at_jaddr(f, i);
    if (at_j || (f->daddr != NULL && f->daddr[i] != PROBE_JOURNAL_NO_OFFSET)) {
        /* the journal, the pack index or the dataset's layout gave the bytes' offset */
        if ((s = own_fd(f)) != PROBE_OK) {
            f->cur.index = (size_t)-1;
            return s;
        }
        f->cur.fd = f->pfd;
        f->cur.addr = at_j ? f->jaddr[i] : f->daddr[i];
        return PROBE_OK;
    }
    H5E_BEGIN_TRY {
        /* A chunked dataset is read a range at a time: a chunk cache that
         * holds whole HDF5 chunks (up to 32 MiB; one per open side) keeps each one from being
         * read and decompressed once per range it overlaps. */
        hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
        if (dapl >= 0)
            H5Pset_chunk_cache(dapl, 12421, (size_t)32 << 20, 1.0);
        f->cur.d = H5Dopen2(f->file, t->path, dapl >= 0 ? dapl : H5P_DEFAULT);
        if (dapl >= 0)
            H5Pclose(dapl);
        f->cur.ft = f->cur.d >= 0 ? H5Dget_type(f->cur.d) : H5I_INVALID_HID;
        f->cur.fsp = f->cur.d >= 0 ? H5Dget_space(f->cur.d) : H5I_INVALID_HID;
        if (f->cur.d < 0 || f->cur.ft < 0 || f->cur.fsp < 0) {
            probe_h5_error_text(text, sizeof text);
            s = probe_set_error(PROBE_EIO, "%s: %s: cannot open dataset (%s)", f->path, t->path, text);
        } else if (probe_h5_classify(f->cur.ft, t->dtype, &f->cur.mt) != t->dtype ||
                   (uint64_t)H5Sget_simple_extent_npoints(f->cur.fsp) != t->n) {
            s = probe_set_error(PROBE_EFORMAT, "%s: %s: dataset changed since the file was opened",
                                f->path, t->path);
        } else if ((s = check_contained(f->cur.d, f->path, t->path, NULL)) == PROBE_OK &&
                   (s = raw_pieces(f, t, f->cur.d, f->cur.ft, f->cur.mt, &f->cur.segs,
                                   &f->cur.nsegs)) == PROBE_OK && f->cur.segs != NULL) {
            f->cur.segs_owned = 1;
        }
    } H5E_END_TRY;
    if (s != PROBE_OK)
        range_close(f);
    return s;
}

/* The row-major flat range [a, b) of a tensor of the given shape as at most
 * 2*rank - 1 regular hyperslab blocks, in order (a partial row at each end
 * and the whole rows between, recursively); emit() gets each block's start
 * and count. `lead` holds the indices fixed so far (dims [0, dim)). Each
 * block is read on its own: one regular hyperslab per H5Dread keeps HDF5 on
 * its fast path (a union of blocks is iterated element by element). */
typedef int (*block_fn)(void *ctx, const hsize_t *start, const hsize_t *count, uint64_t nelem);

static int for_each_block(int rank, const hsize_t *shape, int dim, hsize_t *lead, uint64_t a,
                          uint64_t b, block_fn emit, void *ctx)
{
    if (a >= b)
        return 0;
    uint64_t inner = 1;
    for (int k = dim + 1; k < rank; k++)
        inner *= shape[k];
    uint64_t a0 = a / inner, a1 = a % inner, b0 = b / inner, b1 = b % inner;
    if (dim < rank - 1 && a0 == b0) { /* within one row of this dimension */
        lead[dim] = a0;
        return for_each_block(rank, shape, dim + 1, lead, a1, b1, emit, ctx);
    }
    if (dim == rank - 1 || (a1 == 0 && b1 == 0)) {
        /* whole rows [a0, b0) (in the last dimension: elements [a, b)) */
        hsize_t start[PROBE_MAX_RANK], count[PROBE_MAX_RANK];
        for (int k = 0; k < rank; k++) {
            start[k] = k < dim ? lead[k] : k == dim ? a0 : 0;
            count[k] = k < dim ? 1 : k == dim ? b0 - a0 : shape[k];
        }
        return emit(ctx, start, count, b - a);
    }
    if (a1 != 0) { /* the partial first row */
        lead[dim] = a0;
        if (for_each_block(rank, shape, dim + 1, lead, a1, inner, emit, ctx) < 0)
            return -1;
        a0++;
    }
    if (b0 > a0 && for_each_block(rank, shape, dim, lead, a0 * inner, b0 * inner, emit, ctx) < 0)
        return -1;
    if (b1 != 0) { /* the partial last row */
        lead[dim] = b0;
        if (for_each_block(rank, shape, dim + 1, lead, 0, b1, emit, ctx) < 0)
            return -1;
    }
    return 0;
}

typedef struct {
    probe_file *f;
    unsigned char *dst;
    size_t esize;
} block_read;

static int read_block(void *ctx, const hsize_t *start, const hsize_t *count, uint64_t nelem)
{
    block_read *br = ctx;
    /* the memory space has the block's own shape: HDF5 maps same-shaped
     * selections chunk by chunk, others element by element */
    hid_t msp = H5Screate_simple(H5Sget_simple_extent_ndims(br->f->cur.fsp), count, NULL);
    int ok = msp >= 0 &&
             H5Sselect_hyperslab(br->f->cur.fsp, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
             H5Dread(br->f->cur.d, br->f->cur.mt, msp, br->f->cur.fsp, H5P_DEFAULT, br->dst) >= 0;
    if (msp >= 0)
        H5Sclose(msp);
    br->dst += nelem * br->esize;
    return ok ? 0 : -1;
}

probe_status probe_file_read_range(probe_file *f, size_t i, uint64_t offset, size_t count, void *dst)
{
    probe_status s = check_read(f, i, dst, "probe_file_read_range");
    if (s != PROBE_OK)
        return s;
    const probe_tensor_info *t = &f->t[i];
    if (offset > t->n || count > t->n - offset)
        return probe_set_error(PROBE_EINVAL, "probe_file_read_range: %s: %s: elements [%llu, %llu) "
                               "outside the tensor's %llu", f->path, t->path,
                               (unsigned long long)offset, (unsigned long long)(offset + count),
                               (unsigned long long)t->n);
    if (count == 0)
        return PROBE_OK;
    if (dst == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_file_read_range: dst is NULL");
    if ((s = range_open(f, i)) != PROBE_OK)
        return s;
    size_t esize = probe_dtype_size(t->dtype);
    if (f->cur.segs != NULL)
        return raw_read(f, f->cur.segs, f->cur.nsegs, offset * esize, count * esize, dst, t->path);
    if (f->cur.fd >= 0) {
        size_t want = count * esize, got = 0;
        uint64_t at = f->cur.addr + offset * esize;
        while (got < want) {
            ssize_t k = pread(f->cur.fd, (char *)dst + got, want - got, (off_t)(at + got));
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                return probe_set_error(k < 0 ? PROBE_EIO : PROBE_EFORMAT,
                                       "%s: %s: cannot read elements at %llu (%s)", f->path,
                                       t->path, (unsigned long long)offset,
                                       k < 0 ? strerror(errno) : "file truncated");
            got += (size_t)k;
        }
        return PROBE_OK;
    }
    char text[256];
    H5E_BEGIN_TRY {
        hsize_t shape[PROBE_MAX_RANK], lead[PROBE_MAX_RANK];
        int rank = t->rank;
        for (int k = 0; k < rank; k++)
            shape[k] = (hsize_t)t->shape[k];
        block_read br = {f, dst, esize};
        int bad = rank == 0 ? H5Dread(f->cur.d, f->cur.mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0
                            : for_each_block(rank, shape, 0, lead, offset, offset + count,
                                             read_block, &br) < 0;
        if (bad) {
            probe_h5_error_text(text, sizeof text);
            s = probe_set_error(PROBE_EIO, "%s: %s: cannot read elements [%llu, %llu) (%s)",
                                f->path, t->path, (unsigned long long)offset,
                                (unsigned long long)(offset + count), text);
        }
    } H5E_END_TRY;
    return s;
}

/* --- summaries and hashes (stats-only capture) --- */

#define SUMMARY_CHUNK ((size_t)1 << 20) /* elements read per step */

/* The stored record of stats-only tensor t. */
static probe_status read_summary_record(probe_file *f, const probe_tensor_info *t,
                                        probe_summary *out)
{
    probe_status s = PROBE_OK;
    char text[256];
    if (f->recovery.recovered) { /* the journal's SUMMARY record (checked by its parser) */
        if (f->jsum == NULL)
            return probe_set_error(PROBE_EFORMAT, "%s: %s: no stats-only record", f->path, t->path);
        *out = f->jsum[t - f->t];
        return PROBE_OK;
    }
    H5E_BEGIN_TRY {
        hid_t d = H5Dopen2(f->file, t->path, H5P_DEFAULT);
        hid_t mt = H5Tcreate(H5T_COMPOUND, sizeof(probe_summary));
        herr_t r = d >= 0 && mt >= 0 ? 0 : -1;
        probe_status c = d >= 0 ? check_contained(d, f->path, t->path, NULL) : PROBE_OK;
        if (c != PROBE_OK)
            r = -1;
        static const char *const u64[] = {"n", "n_finite", "nan", "inf"};
        static const char *const f64[] = {"min", "max", "abs_max", "sum", "sum_sq"};
        const size_t off_u64[] = {offsetof(probe_summary, n), offsetof(probe_summary, n_finite),
                                  offsetof(probe_summary, nan), offsetof(probe_summary, inf)};
        const size_t off_f64[] = {offsetof(probe_summary, min), offsetof(probe_summary, max),
                                  offsetof(probe_summary, abs_max), offsetof(probe_summary, sum),
                                  offsetof(probe_summary, sum_sq)};
        for (size_t k = 0; k < 4 && r >= 0; k++)
            r = H5Tinsert(mt, u64[k], off_u64[k], H5T_NATIVE_UINT64);
        for (size_t k = 0; k < 5 && r >= 0; k++)
            r = H5Tinsert(mt, f64[k], off_f64[k], H5T_NATIVE_DOUBLE);
        /* HDF5 converts compounds field by field, by name, and leaves a field
         * the file lacks untouched: require all nine. */
        hid_t ft = d >= 0 ? H5Dget_type(d) : H5I_INVALID_HID;
        for (size_t k = 0; k < 9 && r >= 0; k++)
            if (ft < 0 || H5Tget_member_index(ft, k < 4 ? u64[k] : f64[k - 4]) < 0)
                r = -1;
        if (ft >= 0)
            H5Tclose(ft);
        if (c != PROBE_OK) {
            s = c;
        } else if (r < 0 || H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0) {
            probe_h5_error_text(text, sizeof text);
            s = probe_set_error(PROBE_EFORMAT, "%s: %s: cannot read the stats-only record (%s)",
                                f->path, t->path, text);
        }
        if (mt >= 0)
            H5Tclose(mt);
        if (d >= 0)
            H5Dclose(d);
    } H5E_END_TRY;
    if (s == PROBE_OK &&
        (out->n != t->n || out->n_finite > out->n || out->nan > out->n || out->inf > out->n ||
         out->n_finite + out->nan + out->inf != out->n))
        s = probe_set_error(PROBE_EFORMAT,
                            "%s: %s: stats-only record is inconsistent (n %llu, n_finite %llu, nan "
                            "%llu, inf %llu; probe.shape gives %llu elements)",
                            f->path, t->path, (unsigned long long)out->n,
                            (unsigned long long)out->n_finite, (unsigned long long)out->nan,
                            (unsigned long long)out->inf, (unsigned long long)t->n);
    return s;
}

/* The summary (and, when tree_hash is not NULL, the tree hash) of full
 * tensor i from its stored bytes, read in chunks of SUMMARY_CHUNK elements
 * (a multiple of the tree's 256-byte pieces) through the tree order of
 * metrics/tree.h: the bits of probe_summary_tree over the whole tensor. */
static probe_status tree_of_tensor(probe_file *f, size_t i, probe_summary *out,
                                   uint64_t *tree_hash)
{
    const probe_tensor_info *t = &f->t[i];
    size_t esize = probe_dtype_size(t->dtype);
    size_t chunk = t->n < SUMMARY_CHUNK ? (size_t)t->n : SUMMARY_CHUNK;
    unsigned char *buf = malloc(chunk ? chunk * esize : 1);
    probe_tree_state *ts = malloc(sizeof *ts);
    probe_status st = buf && ts ? probe_tree_begin_(ts, t->dtype, tree_hash != NULL)
                                : probe_set_error(PROBE_ENOMEM, "%s: %s: out of memory", f->path,
                                                  t->path);
    for (uint64_t off = 0; off < t->n && st == PROBE_OK; off += chunk) {
        size_t m = t->n - off < chunk ? (size_t)(t->n - off) : chunk;
        if ((st = probe_file_read_range(f, i, off, m, buf)) == PROBE_OK)
            st = probe_tree_feed_(ts, buf, m * esize);
    }
    if (st == PROBE_OK)
        probe_tree_finish_(ts, out, tree_hash);
    free(buf);
    free(ts);
    return st;
}

probe_status probe_file_summary(probe_file *f, size_t i, probe_summary *out)
{
    if (f == NULL || out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_file_summary: %s is NULL", f ? "out" : "file");
    if (i >= f->n)
        return probe_set_error(PROBE_EINVAL, "probe_file_summary: %s: tensor index %zu out of range "
                               "(%zu tensors)", f->path, i, f->n);
    memset(out, 0, sizeof *out);
    const probe_tensor_info *t = &f->t[i];
    if (t->stats_only)
        return read_summary_record(f, t, out);
    probe_status st = tree_of_tensor(f, i, out, NULL);
    if (st != PROBE_OK)
        memset(out, 0, sizeof *out);
    return st;
}

probe_status probe_file_tree_hash(probe_file *f, size_t i, uint64_t *out)
{
    if (f == NULL || out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_file_tree_hash: %s is NULL",
                               f ? "out" : "file");
    if (i >= f->n)
        return probe_set_error(PROBE_EINVAL, "probe_file_tree_hash: %s: tensor index %zu out of "
                               "range (%zu tensors)", f->path, i, f->n);
    const probe_tensor_info *t = &f->t[i];
    if (t->tree_hash[0]) {
        *out = strtoull(t->tree_hash, NULL, 16); /* describe() kept only 16 lowercase hex digits */
        return PROBE_OK;
    }
    if (t->stats_only)
        return probe_set_error(PROBE_ENOTFOUND, "%s: %s: stats-only record without a valid "
                               "probe.tree_hash (its writer stored only the XXH64)",
                               f->path, t->path);
    probe_summary sum;
    return tree_of_tensor(f, i, &sum, out);
}

probe_status probe_file_hash_match(probe_file *rf, size_t ri, probe_file *cf, size_t ci,
                                   int *same)
{
    if (rf == NULL || cf == NULL || same == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_file_hash_match: NULL argument");
    *same = 0;
    if (ri >= rf->n || ci >= cf->n)
        return probe_set_error(PROBE_EINVAL, "probe_file_hash_match: tensor index out of range");
    const probe_tensor_info *a = &rf->t[ri], *b = &cf->t[ci];
    uint64_t ha = 0, hb = 0;
    probe_status s = PROBE_OK;
    *same = 0;
    if ((a->hash[0] || !a->stats_only) && (b->hash[0] || !b->stats_only)) {
        if ((s = probe_file_hash(rf, ri, &ha)) == PROBE_OK &&
            (s = probe_file_hash(cf, ci, &hb)) == PROBE_OK)
            *same = ha == hb;
    } else if ((a->tree_hash[0] || !a->stats_only) && (b->tree_hash[0] || !b->stats_only)) {
        if ((s = probe_file_tree_hash(rf, ri, &ha)) == PROBE_OK &&
            (s = probe_file_tree_hash(cf, ci, &hb)) == PROBE_OK)
            *same = ha == hb;
    }
    return s;
}

probe_status probe_file_hash(probe_file *f, size_t i, uint64_t *out)
{
    if (f == NULL || out == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_file_hash: %s is NULL", f ? "out" : "file");
    if (i >= f->n)
        return probe_set_error(PROBE_EINVAL, "probe_file_hash: %s: tensor index %zu out of range "
                               "(%zu tensors)", f->path, i, f->n);
    const probe_tensor_info *t = &f->t[i];
    if (t->hash[0]) {
        *out = strtoull(t->hash, NULL, 16); /* describe() kept only 16 lowercase hex digits */
        return PROBE_OK;
    }
    if (t->stats_only)
        return probe_set_error(t->tree_hash[0] ? PROBE_ENOTFOUND : PROBE_EFORMAT,
                               "%s: %s: stats-only record without a valid probe.hash%s", f->path,
                               t->path, t->tree_hash[0] ? " (it has a tree hash: probe_file_tree_hash)" : "");
    size_t esize = probe_dtype_size(t->dtype);
    size_t chunk = t->n < SUMMARY_CHUNK ? (size_t)t->n : SUMMARY_CHUNK;
    unsigned char *buf = malloc(chunk ? chunk * esize : 1);
    XXH64_state_t *h = XXH64_createState();
    if (buf == NULL || h == NULL) {
        free(buf);
        XXH64_freeState(h);
        return probe_set_error(PROBE_ENOMEM, "%s: %s: out of memory", f->path, t->path);
    }
    XXH64_reset(h, 0);
    probe_status st = PROBE_OK;
    for (uint64_t off = 0; off < t->n; off += chunk) {
        size_t m = t->n - off < chunk ? (size_t)(t->n - off) : chunk;
        if ((st = probe_file_read_range(f, i, off, m, buf)) != PROBE_OK)
            break;
        XXH64_update(h, buf, m * esize);
    }
    if (st == PROBE_OK)
        *out = (uint64_t)XXH64_digest(h);
    free(buf);
    XXH64_freeState(h);
    return st;
}

/* --- recovery from the journal (include/probe/capture.h,
 * docs/file-format.md "Journal") --- */

/* pread exactly n bytes at off; 0, or -1 with errno (0 = end of file). */
static int pread_full(int fd, void *dst, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, (char *)dst + got, n - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = 0;
            return -1;
        }
        got += (size_t)k;
    }
    return 0;
}

/* f->pfd, opened on first use: PROBE_OK or PROBE_EIO. */
static probe_status own_fd(probe_file *f)
{
    if (f->pfd < 0 && (f->pfd = open(f->path, O_RDONLY | O_CLOEXEC)) < 0)
        return probe_set_error(PROBE_EIO, "%s: %s", f->path, strerror(errno));
    return PROBE_OK;
}

/* Elements [first, first + count) of tensor i, whose bytes start at byte
 * base of the file, into dst. */
static probe_status read_at(probe_file *f, size_t i, uint64_t base, uint64_t first, uint64_t count,
                            void *dst)
{
    const probe_tensor_info *t = &f->t[i];
    size_t esize = probe_dtype_size(t->dtype);
    if (count == 0)
        return PROBE_OK;
    probe_status s = own_fd(f);
    if (s != PROBE_OK)
        return s;
    int r = pread_full(f->pfd, dst, (size_t)count * esize, base + first * esize);
    int e = errno;
    if (r != 0)
        return probe_set_error(e ? PROBE_EIO : PROBE_EFORMAT, "%s: %s: cannot read (%s)", f->path,
                               t->path, e ? strerror(e) : "file truncated");
    return PROBE_OK;
}

/* Elements [first, first + count) of recovered or packed tensor i into dst. */
static probe_status read_recovered(probe_file *f, size_t i, uint64_t first, uint64_t count, void *dst)
{
    return read_at(f, i, f->jaddr[i], first, count, dst);
}

/* 1 when the bytes of TENSOR record r hash (XXH64) to its hash, 0 when not
 * (past the end of the file, or a raw file missing or short), -1 on ENOMEM.
 * The bytes are at r->offset in fd, or, for a record with raw-file pieces,
 * in those pieces of the raw files in <capture name>.raw next to the
 * capture (d's header names the capture). */
static int record_matches(probe_file *f, int fd, const probe_journal_data *d,
                          const probe_journal_tensor_rec *r)
{
    if (r->segs != NULL) {
        char dir[sizeof d->capture_name + sizeof PROBE_RAW_SUFFIX];
        snprintf(dir, sizeof dir, "%s%s", d->capture_name, PROBE_RAW_SUFFIX);
        if (d->capture_name[0] == '\0' ||
            raw_check(f, dir, r->segs, r->nsegs, r->nbytes, r->info.path) != PROBE_OK)
            return 0;
    }
    if (r->nbytes == 0)
        return probe_capture_hash(NULL, 0) == r->hash;
    XXH64_state_t *st = XXH64_createState();
    size_t cap = (size_t)1 << 20;
    unsigned char *buf = malloc(cap);
    int ok = -1;
    if (st != NULL && buf != NULL && XXH64_reset(st, 0) == XXH_OK) {
        ok = 1;
        for (uint64_t at = 0; at < r->nbytes && ok == 1;) {
            size_t n = r->nbytes - at < cap ? (size_t)(r->nbytes - at) : cap;
            int got = r->segs != NULL
                          ? raw_read(f, r->segs, r->nsegs, at, n, buf, r->info.path) == PROBE_OK
                          : pread_full(fd, buf, n, r->offset + at) == 0;
            if (!got)
                ok = 0;
            else
                XXH64_update(st, buf, n);
            at += n;
        }
        if (ok == 1)
            ok = (uint64_t)XXH64_digest(st) == r->hash;
    }
    free(buf);
    XXH64_freeState(st);
    return ok;
}

static int cmp_jrec_seq(const void *a, const void *b)
{
    return cmp_seq(&((const probe_journal_tensor_rec *)a)->info, &((const probe_journal_tensor_rec *)b)->info);
}

static int cmp_jrec_path(const void *a, const void *b)
{
    return cmp_path(&((const probe_journal_tensor_rec *)a)->info, &((const probe_journal_tensor_rec *)b)->info);
}

/* Fill f from parsed journal d, checking every tensor's bytes in fd. */
static probe_status recover_from(probe_file *f, const char *jpath, int fd, probe_journal_data *d)
{
    probe_recovery_info *ri = &f->recovery;
    ri->recovered = 1;
    snprintf(ri->journal, sizeof ri->journal, "%s", jpath);
    const char *base = strrchr(f->path, '/');
    base = base != NULL ? base + 1 : f->path;
    if (d->capture_name[0] != '\0' && strcmp(d->capture_name, base) != 0)
        return probe_set_error(PROBE_EFORMAT,
                               "%s: the journal %s next to it belongs to another capture file ('%s')",
                               f->path, jpath, d->capture_name);
    /* every complete record must describe f's bytes; a last record that
     * does not is the torn tail of a kill (its bytes never reached f) */
    size_t keep = d->n, nstats = 0;
    for (size_t i = 0; i < d->n; i++) {
        const probe_journal_tensor_rec *r = &d->t[i];
        if (r->info.stats_only) { /* a SUMMARY record holds all of it: no bytes in f */
            nstats++;
            continue;
        }
        int m = record_matches(f, fd, d, r);
        if (m < 0)
            return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
        if (m == 1)
            continue;
        if (i + 1 == d->n) {
            keep = i;
            snprintf(ri->partial, sizeof ri->partial, "%s", r->info.path);
            snprintf(ri->reason, sizeof ri->reason,
                     "its last journal record's bytes are not in the capture file");
            break;
        }
        return probe_set_error(PROBE_EFORMAT,
                               "%s: the journal %s does not describe this file: tensor %s "
                               "(%llu bytes at byte %llu) does not hash to %016llx",
                               f->path, jpath, r->info.path, (unsigned long long)r->nbytes,
                               (unsigned long long)r->offset, (unsigned long long)r->hash);
    }
    if (ri->partial[0] == '\0' && d->partial[0] != '\0') {
        snprintf(ri->partial, sizeof ri->partial, "%s", d->partial);
        snprintf(ri->reason, sizeof ri->reason, "the writer was stopped during its put");
    } else if (ri->partial[0] == '\0' && d->torn) {
        snprintf(ri->reason, sizeof ri->reason, "the journal ends in a torn record");
    }
    int all_seq = 1;
    for (size_t i = 0; i < keep; i++)
        all_seq &= d->t[i].info.seq >= 0;
    if (keep > 0)
        qsort(d->t, keep, sizeof *d->t, all_seq ? cmp_jrec_seq : cmp_jrec_path);
    f->n = f->cap = keep;
    f->ignored = d->ignored;
    if (keep > 0) {
        f->t = malloc(keep * sizeof *f->t);
        f->jaddr = malloc(keep * sizeof *f->jaddr);
        f->by_path = malloc(keep * sizeof *f->by_path);
        f->jop = calloc(keep, sizeof *f->jop);
        f->jsum = nstats > 0 ? calloc(keep, sizeof *f->jsum) : NULL;
        size_t nraw = 0;
        for (size_t i = 0; i < keep; i++)
            nraw += d->t[i].segs != NULL;
        f->jsegs = nraw > 0 ? calloc(keep, sizeof *f->jsegs) : NULL;
        f->jnsegs = nraw > 0 ? calloc(keep, sizeof *f->jnsegs) : NULL;
        if (nraw > 0 && (f->jsegs == NULL || f->jnsegs == NULL))
            return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
        if (f->t == NULL || f->jaddr == NULL || f->by_path == NULL || f->jop == NULL ||
            (nstats > 0 && f->jsum == NULL))
            return probe_set_error(PROBE_ENOMEM, "%s: out of memory", f->path);
    }
    for (size_t i = 0; i < keep; i++) {
        f->t[i] = d->t[i].info;
        f->jaddr[i] = d->t[i].offset;
        if (f->jsum != NULL)
            f->jsum[i] = d->t[i].summary;
        f->jop[i] = d->t[i].op;
        d->t[i].op = NULL;
        if (f->jsegs != NULL) {
            f->jsegs[i] = d->t[i].segs;
            f->jnsegs[i] = d->t[i].nsegs;
            d->t[i].segs = NULL;
        }
        f->by_path[i] = &f->t[i];
    }
    if (keep > 1)
        qsort(f->by_path, keep, sizeof *f->by_path, cmp_ptr_path);
    for (size_t i = 1; i < keep; i++)
        if (strcmp(f->by_path[i - 1]->path, f->by_path[i]->path) == 0)
            return probe_set_error(PROBE_EFORMAT, "%s: corrupt journal %s: %s is recorded twice",
                                   f->path, jpath, f->by_path[i]->path);
    ri->complete = keep;
    ri->lost = d->lost;
    f->skips = d->skips;
    f->nskips = d->nskips;
    d->skips = NULL;
    f->manifest = d->manifest;
    d->manifest = NULL;
    return PROBE_OK;
}

/* probe_file_open's first step: when path.journal exists next to an
 * existing path, open path from the journal into *out. Leaves *out NULL
 * (and returns PROBE_OK) when there is no journal. */
static probe_status open_journaled(const char *path, probe_file **out)
{
    size_t plen = strlen(path);
    char *jpath = malloc(plen + sizeof PROBE_JOURNAL_SUFFIX);
    if (jpath == NULL)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    memcpy(jpath, path, plen);
    memcpy(jpath + plen, PROBE_JOURNAL_SUFFIX, sizeof PROBE_JOURNAL_SUFFIX);
    struct stat st, jst;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || lstat(jpath, &jst) != 0) {
        free(jpath);
        return PROBE_OK; /* no file (precheck says why) or no journal: the normal path */
    }
    if (probe_writer_owns_((uint64_t)st.st_dev, (uint64_t)st.st_ino)) {
        free(jpath);
        return PROBE_OK; /* this process writes it: HDF5 reads it through the writer's handle */
    }
    probe_status s = PROBE_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        s = probe_set_error(PROBE_EIO, "%s: %s", path, strerror(errno));
        free(jpath);
        return s;
    }
    /* a live writer holds an exclusive lock on the capture (HDF5's, or the
     * shim's): its journal is not a crash's */
    if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        close(fd);
        s = probe_set_error(PROBE_EIO, "%s: cannot open (is another process writing it? it holds "
                            "the file's lock, and the journal %s is still growing)", path, jpath);
        free(jpath);
        return s;
    }
    unsigned char *buf = NULL;
    size_t len = 0;
    probe_journal_data d;
    memset(&d, 0, sizeof d);
    probe_file *f = calloc(1, sizeof *f);
    if (f == NULL || (f->path = strdup(path)) == NULL) {
        free(f);
        f = NULL;
        s = probe_set_error(PROBE_ENOMEM, "%s: out of memory", path);
    } else {
        f->file = H5I_INVALID_HID;
        f->cur.index = (size_t)-1;
        f->pfd = -1;
        s = probe_journal_read_all(path, jpath, 0, &buf, &len);
    }
    if (s == PROBE_OK) {
        s = probe_journal_parse(jpath, buf, len, &d);
        if (s == PROBE_EFORMAT || s == PROBE_EUNSUPPORTED) {
            char why[512];
            snprintf(why, sizeof why, "%s", probe_last_error());
            s = probe_set_error(s, "%s: cannot recover from its journal (%s)", path, why);
        }
    }
    if (s == PROBE_OK)
        s = recover_from(f, jpath, fd, &d);
    probe_journal_data_free(&d);
    free(buf);
    close(fd); /* also drops the shared lock */
    free(jpath);
    if (s != PROBE_OK) {
        probe_file_close(f);
        return s;
    }
    *out = f;
    return PROBE_OK;
}

uint64_t probe_file_packed_addr_(const probe_file *f, size_t i)
{
    if (f == NULL || i >= f->n || f->recovery.recovered || f->jaddr == NULL)
        return PROBE_JOURNAL_NO_OFFSET;
    return f->jaddr[i];
}

const probe_recovery_info *probe_file_recovery(const probe_file *f)
{
    static const probe_recovery_info none;
    return f != NULL ? &f->recovery : &none;
}
