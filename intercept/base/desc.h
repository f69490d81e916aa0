/* intercept/base/desc.h - the tap descriptor (probe/tap.h
 * probe_tap_tensor_v1): validation, and the fields after timestep as known
 * from the caller's struct_size. */
#ifndef PROBE_INTERCEPT_BASE_DESC_H
#define PROBE_INTERCEPT_BASE_DESC_H

#include <stdint.h>

#include "base/gather.h"
#include "probe/status.h"
#include "probe/tap.h"

/* Validate a tap descriptor and compute its extent: PROBE_OK, or
 * PROBE_EINVAL with the message naming the field. */
probe_status shim_desc_validate(const probe_tap_tensor_v1 *t, struct shim_extent *ext);
/* parent (NULL when absent, empty or not nested), block (-1 without a
 * parent), class_name and module (NULL when absent or empty). */
const char *shim_desc_parent(const probe_tap_tensor_v1 *t);
int64_t shim_desc_block(const probe_tap_tensor_v1 *t);
const char *shim_desc_class(const probe_tap_tensor_v1 *t);
const char *shim_desc_module(const probe_tap_tensor_v1 *t);

#endif
