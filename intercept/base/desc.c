/* desc.c - the tap descriptor (probe/tap.h probe_tap_tensor_v1): validation
 * of every field, and the fields after timestep as known from struct_size. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/desc.h"
#include "base/gather.h"
#include "base/shim.h"
#include "probe/dtype.h"

/* component / slot: 1..127 bytes, no '/', no control characters, not "."
 * or ".." (each becomes one HDF5 path element). */
static probe_status check_name(const char *s, const char *what)
{
    if (!s)
        return probe_set_error(PROBE_EINVAL, "tap: %s is NULL", what);
    size_t n = strlen(s);
    if (n == 0 || n >= SHIM_NAME_MAX)
        return probe_set_error(PROBE_EINVAL, "tap: %s must be 1..%d bytes long (got %zu)", what,
                               SHIM_NAME_MAX - 1, n);
    if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return probe_set_error(PROBE_EINVAL, "tap: %s '%s' is not a valid path element", what, s);
    for (const unsigned char *c = (const unsigned char *)s; *c; ++c) {
        if (*c == '/')
            return probe_set_error(PROBE_EINVAL, "tap: %s '%s' contains '/'", what, s);
        if (*c < 0x20 || *c == 0x7f)
            return probe_set_error(PROBE_EINVAL, "tap: %s contains a control character", what);
    }
    return PROBE_OK;
}

/* 1 when the caller's struct_size covers the descriptor's field. */
#define TAP_HAS(t, field)                                                                       \
    ((t)->struct_size >= offsetof(probe_tap_tensor_v1, field) + sizeof((t)->field))

const char *shim_desc_parent(const probe_tap_tensor_v1 *t)
{
    return TAP_HAS(t, parent) && TAP_HAS(t, block) && t->parent && t->parent[0] ? t->parent : NULL;
}

int64_t shim_desc_block(const probe_tap_tensor_v1 *t)
{
    return shim_desc_parent(t) ? t->block : -1;
}

const char *shim_desc_class(const probe_tap_tensor_v1 *t)
{
    return TAP_HAS(t, class_name) && t->class_name && t->class_name[0] ? t->class_name : NULL;
}

const char *shim_desc_module(const probe_tap_tensor_v1 *t)
{
    return TAP_HAS(t, module) && t->module && t->module[0] ? t->module : NULL;
}

/* parent ("/<component>/<call>", 1..255 bytes), class name and module path
 * (1..255 bytes): no control characters. */
static probe_status check_text(const char *s, const char *what, int path)
{
    size_t n = strlen(s);
    if (n >= SHIM_PARENT_MAX)
        return probe_set_error(PROBE_EINVAL, "tap: %s must be at most %d bytes long (got %zu)", what,
                               SHIM_PARENT_MAX - 1, n);
    if (path && s[0] != '/')
        return probe_set_error(PROBE_EINVAL, "tap: %s '%s' does not start with '/'", what, s);
    for (const unsigned char *c = (const unsigned char *)s; *c; ++c)
        if (*c < 0x20 || *c == 0x7f)
            return probe_set_error(PROBE_EINVAL, "tap: %s contains a control character", what);
    return PROBE_OK;
}

probe_status shim_desc_validate(const probe_tap_tensor_v1 *t, struct shim_extent *ext)
{
    if (!t)
        return probe_set_error(PROBE_EINVAL, "tap: descriptor is NULL");
    if (t->struct_size < PROBE_TAP_TENSOR_V1_BASE_SIZE)
        return probe_set_error(PROBE_EINVAL, "tap: struct_size %u is smaller than the v1 size %zu",
                               t->struct_size, (size_t)PROBE_TAP_TENSOR_V1_BASE_SIZE);
    if (t->abi_version != PROBE_TAP_ABI_VERSION)
        return probe_set_error(PROBE_EINVAL, "tap: abi_version %u is not %d", t->abi_version,
                               PROBE_TAP_ABI_VERSION);
    probe_status st;
    if ((st = check_name(t->component, "component")) != PROBE_OK ||
        (st = check_name(t->slot, "slot")) != PROBE_OK)
        return st;
    if (t->call < 0)
        return probe_set_error(PROBE_EINVAL, "tap: call %lld is negative", (long long)t->call);
    const char *parent = shim_desc_parent(t), *cls = shim_desc_class(t);
    if (parent && (st = check_text(parent, "parent", 1)) != PROBE_OK)
        return st;
    if (parent && t->block < 0)
        return probe_set_error(PROBE_EINVAL, "tap: block %lld is negative for a nested call (parent %s)",
                               (long long)t->block, parent);
    if (cls && (st = check_text(cls, "class_name", 0)) != PROBE_OK)
        return st;
    const char *mod = shim_desc_module(t);
    if (mod && (st = check_text(mod, "module", 0)) != PROBE_OK)
        return st;
    if (t->rank < 0 || t->rank > PROBE_MAX_RANK)
        return probe_set_error(PROBE_EINVAL, "tap: rank %d is outside 0..%d", t->rank, PROBE_MAX_RANK);
    size_t esize = probe_dtype_size((probe_dtype)t->dtype);
    if (esize == 0)
        return probe_set_error(PROBE_EINVAL, "tap: dtype %d is not a probe_dtype", t->dtype);
    if (t->device < -1)
        return probe_set_error(PROBE_EINVAL, "tap: device %d is neither -1 (host) nor a CUDA ordinal",
                               t->device);
    if (t->rank > 0 && !t->shape)
        return probe_set_error(PROBE_EINVAL, "tap: shape is NULL for rank %d", t->rank);
    if ((st = shim_gather_extent(t->rank, t->shape, t->strides, esize, ext)) != PROBE_OK)
        return st;
    if (ext->n > 0 && !t->data)
        return probe_set_error(PROBE_EINVAL, "tap: data is NULL for %llu elements",
                               (unsigned long long)ext->n);
    return PROBE_OK;
}

