/* probe/capture/h5types.c - HDF5 element types of the capture file (see h5types.h,
 * docs/file-format.md) and the HDF5 error text. */
#include "h5types.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* A 2-byte float from H5T_IEEE_F32LE. HDF5 checks every setter against the
 * current state: the fields must lie inside the precision and the precision
 * inside the size, so shrink in this order: fields, precision, size. */
static hid_t float2_create(H5T_order_t order, size_t epos, size_t esize, size_t msize,
                           size_t ebias)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0)
        return H5I_INVALID_HID;
    if (H5Tset_fields(t, 15, epos, esize, 0, msize) < 0 || H5Tset_precision(t, 16) < 0 ||
        H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, ebias) < 0 || H5Tset_order(t, order) < 0) {
        H5Tclose(t);
        return H5I_INVALID_HID;
    }
    return t;
}

hid_t probe_h5_float16_create(H5T_order_t order)
{
    return float2_create(order, 10, 5, 10, 15);
}

hid_t probe_h5_bfloat16_create(H5T_order_t order)
{
    return float2_create(order, 7, 8, 7, 127);
}

static hid_t bool_create(void)
{
    hid_t t = H5Tenum_create(H5T_STD_I8LE);
    if (t < 0)
        return H5I_INVALID_HID;
    int8_t f = 0, tr = 1;
    if (H5Tenum_insert(t, "FALSE", &f) < 0 || H5Tenum_insert(t, "TRUE", &tr) < 0) {
        H5Tclose(t);
        return H5I_INVALID_HID;
    }
    return t;
}

hid_t probe_h5_type_create(probe_dtype t)
{
    switch (t) {
    case PROBE_DTYPE_BOOL: return bool_create();
    case PROBE_DTYPE_INT8: return H5Tcopy(H5T_STD_I8LE);
    case PROBE_DTYPE_INT16: return H5Tcopy(H5T_STD_I16LE);
    case PROBE_DTYPE_INT32: return H5Tcopy(H5T_STD_I32LE);
    case PROBE_DTYPE_INT64: return H5Tcopy(H5T_STD_I64LE);
    case PROBE_DTYPE_UINT8: return H5Tcopy(H5T_STD_U8LE);
    case PROBE_DTYPE_UINT16: return H5Tcopy(H5T_STD_U16LE);
    case PROBE_DTYPE_UINT32: return H5Tcopy(H5T_STD_U32LE);
    case PROBE_DTYPE_UINT64: return H5Tcopy(H5T_STD_U64LE);
    case PROBE_DTYPE_FLOAT16: return probe_h5_float16_create(H5T_ORDER_LE);
    case PROBE_DTYPE_BFLOAT16: return probe_h5_bfloat16_create(H5T_ORDER_LE);
    case PROBE_DTYPE_FLOAT32: return H5Tcopy(H5T_IEEE_F32LE);
    case PROBE_DTYPE_FLOAT64: return H5Tcopy(H5T_IEEE_F64LE);
    case PROBE_DTYPE_FLOAT8_E4M3FN:
    case PROBE_DTYPE_FLOAT8_E5M2: return H5Tcopy(H5T_STD_U8LE);
    default: return H5I_INVALID_HID;
    }
}

static int order_ok(H5T_order_t o, size_t size)
{
    return o == H5T_ORDER_LE || o == H5T_ORDER_BE || (size == 1 && o == H5T_ORDER_NONE);
}

static probe_dtype classify_float(hid_t ft, hid_t *memtype)
{
    size_t size = H5Tget_size(ft);
    size_t spos, epos, esize, mpos, msize;
    H5T_order_t order = H5Tget_order(ft);
    if (size == 0 || H5Tget_fields(ft, &spos, &epos, &esize, &mpos, &msize) < 0)
        return PROBE_DTYPE_INVALID;
    if (!order_ok(order, size) || H5Tget_precision(ft) != 8 * size || H5Tget_offset(ft) != 0 ||
        H5Tget_norm(ft) != H5T_NORM_IMPLIED || mpos != 0)
        return PROBE_DTYPE_INVALID;
    size_t ebias = H5Tget_ebias(ft);
    if (size == 2 && spos == 15 && epos == 10 && esize == 5 && msize == 10 && ebias == 15) {
        *memtype = probe_h5_float16_create(H5T_ORDER_LE);
        return *memtype < 0 ? PROBE_DTYPE_INVALID : PROBE_DTYPE_FLOAT16;
    }
    if (size == 2 && spos == 15 && epos == 7 && esize == 8 && msize == 7 && ebias == 127) {
        *memtype = probe_h5_bfloat16_create(H5T_ORDER_LE);
        return *memtype < 0 ? PROBE_DTYPE_INVALID : PROBE_DTYPE_BFLOAT16;
    }
    if (size == 4 && spos == 31 && epos == 23 && esize == 8 && msize == 23 && ebias == 127) {
        *memtype = H5Tcopy(H5T_IEEE_F32LE);
        return *memtype < 0 ? PROBE_DTYPE_INVALID : PROBE_DTYPE_FLOAT32;
    }
    if (size == 8 && spos == 63 && epos == 52 && esize == 11 && msize == 52 && ebias == 1023) {
        *memtype = H5Tcopy(H5T_IEEE_F64LE);
        return *memtype < 0 ? PROBE_DTYPE_INVALID : PROBE_DTYPE_FLOAT64;
    }
    return PROBE_DTYPE_INVALID;
}

static probe_dtype classify_int(hid_t ft, probe_dtype attr_dtype, hid_t *memtype)
{
    static const probe_dtype sdt[9] = {[1] = PROBE_DTYPE_INT8, [2] = PROBE_DTYPE_INT16,
                                       [4] = PROBE_DTYPE_INT32, [8] = PROBE_DTYPE_INT64};
    static const probe_dtype udt[9] = {[1] = PROBE_DTYPE_UINT8, [2] = PROBE_DTYPE_UINT16,
                                       [4] = PROBE_DTYPE_UINT32, [8] = PROBE_DTYPE_UINT64};
    size_t size = H5Tget_size(ft);
    H5T_sign_t sign = H5Tget_sign(ft);
    if (size == 0 || size > 8 || sdt[size] == PROBE_DTYPE_INVALID)
        return PROBE_DTYPE_INVALID;
    if (!order_ok(H5Tget_order(ft), size) || H5Tget_precision(ft) != 8 * size ||
        H5Tget_offset(ft) != 0 || (sign != H5T_SGN_NONE && sign != H5T_SGN_2))
        return PROBE_DTYPE_INVALID;
    probe_dtype t = sign == H5T_SGN_2 ? sdt[size] : udt[size];
    if (t == PROBE_DTYPE_UINT8 &&
        (attr_dtype == PROBE_DTYPE_FLOAT8_E4M3FN || attr_dtype == PROBE_DTYPE_FLOAT8_E5M2))
        t = attr_dtype;
    *memtype = probe_h5_type_create(t);
    return *memtype < 0 ? PROBE_DTYPE_INVALID : t;
}

/* h5py's bool: enum over a 1-byte integer with exactly FALSE = 0, TRUE = 1. */
static probe_dtype classify_enum(hid_t ft, hid_t *memtype)
{
    hid_t base = H5Tget_super(ft);
    if (base < 0)
        return PROBE_DTYPE_INVALID;
    int ok = H5Tget_class(base) == H5T_INTEGER && H5Tget_size(base) == 1 &&
             H5Tget_precision(base) == 8 && H5Tget_offset(base) == 0 && H5Tget_nmembers(ft) == 2;
    H5Tclose(base);
    int seen_false = 0, seen_true = 0;
    for (unsigned i = 0; ok && i < 2; i++) {
        int8_t v = -1;
        char *name = H5Tget_member_name(ft, i);
        if (name == NULL || H5Tget_member_value(ft, i, &v) < 0) {
            ok = 0;
        } else if (strcmp(name, "FALSE") == 0 && v == 0) {
            seen_false = 1;
        } else if (strcmp(name, "TRUE") == 0 && v == 1) {
            seen_true = 1;
        } else {
            ok = 0;
        }
        if (name != NULL)
            H5free_memory(name);
    }
    if (!ok || !seen_false || !seen_true)
        return PROBE_DTYPE_INVALID;
    /* The same enum as memory type: no conversion, the stored bytes arrive. */
    *memtype = H5Tcopy(ft);
    return *memtype < 0 ? PROBE_DTYPE_INVALID : PROBE_DTYPE_BOOL;
}

probe_dtype probe_h5_classify(hid_t ftype, probe_dtype attr_dtype, hid_t *memtype)
{
    *memtype = H5I_INVALID_HID;
    switch (H5Tget_class(ftype)) {
    case H5T_FLOAT: return classify_float(ftype, memtype);
    case H5T_INTEGER: return classify_int(ftype, attr_dtype, memtype);
    case H5T_ENUM: return classify_enum(ftype, memtype);
    default: return PROBE_DTYPE_INVALID;
    }
}

struct err_walk {
    char *buf;
    size_t size;
    int found;
};

static herr_t err_walk_cb(unsigned n, const H5E_error2_t *e, void *data)
{
    struct err_walk *w = data;
    if (w->found || e == NULL)
        return 0;
    const char *desc = e->desc != NULL && e->desc[0] != '\0' ? e->desc : NULL;
    char minor[128] = "";
    if (desc == NULL) {
        H5E_type_t type;
        if (H5Eget_msg(e->min_num, &type, minor, sizeof minor) > 0)
            desc = minor;
    }
    if (desc == NULL)
        return 0;
    /* OS failures read "file write failed: time = ..., filename = ...,
     * errno = 27, error message = 'File too large', buf = ..." or "unable to
     * lock file, errno = 11, error message = '...'": keep the head (up to the
     * first ':' or ',') and the OS message. */
    const char *os = strstr(desc, "error message = '");
    const char *colon = desc + strcspn(desc, ":,");
    if (os != NULL && colon < os) {
        os += strlen("error message = '");
        const char *end = strchr(os, '\'');
        snprintf(w->buf, w->size, "%.*s: %.*s", (int)(colon - desc), desc,
                 (int)(end != NULL ? (size_t)(end - os) : strlen(os)), os);
    } else {
        snprintf(w->buf, w->size, "%s", desc);
    }
    for (char *p = w->buf; *p != '\0'; p++)
        if (*p == '\n')
            *p = ' ';
    w->found = 1;
    return 0;
}

void probe_h5_error_text(char *buf, size_t size)
{
    if (buf == NULL || size == 0)
        return;
    struct err_walk w = {buf, size, 0};
    buf[0] = '\0';
    /* Upward: starts with the most specific entry (where HDF5 detected it). */
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, err_walk_cb, &w);
    if (!w.found)
        snprintf(buf, size, "unknown HDF5 error");
}
