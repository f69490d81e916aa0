/* intercept/capture/taps.h - the tap ABI (probe/tap.h) as the other layers use it: a tensor
 * captured with an op attribute, a device tensor only hashed, operand descriptors of interposed
 * calls, a path recorded as skipped. */
#ifndef PROBE_INTERCEPT_CAPTURE_TAPS_H
#define PROBE_INTERCEPT_CAPTURE_TAPS_H

#include <stdint.h>
#include "probe/status.h"
#include "probe/tap.h"

#include "capture/scope.h"

/* 1 if this process captures (claims the file at its first call), else 0. */
int shim_tap_process_captures(void);
/* Capture one tensor as probe_tap_v1 does (validation, selection by
 * PROBE_CAPTURE unless the caller selected it already, path taken once,
 * host gather or device copy) and attach op_json (NULL: none; copied) as
 * the dataset's probe.op attribute. select: 1 apply the glob selection,
 * 0 the caller already decided (interposed calls: shim_select_interposed).
 * Returns as probe_tap_v1. */
probe_status shim_tap_capture(const probe_tap_tensor_v1 *t, const char *op_json, int select);

/* Like shim_tap_capture for a device tensor whose bytes are only hashed
 * (XXH64 on the writer thread, handed to shim_weights_hashed(slot, ...));
 * nothing is written and no path is taken. PROBE_OK when queued. */
probe_status shim_tap_hash_device(const probe_tap_tensor_v1 *t, size_t slot);

/* Fill *t for an operand of an interposed library call: the ABI fields,
 * the scope's names (component, slot, call, step, CFG branch), a device
 * tensor (device, probe_dtype, rank, shape, strides or NULL = contiguous,
 * data, stream) and no timestep (NaN); not nested, no class. shape/strides
 * are not copied. */
void shim_tap_operand(probe_tap_tensor_v1 *t, const char *component, const char *slot,
                      int64_t call, int64_t step, int32_t cfg_branch, int device, int32_t dtype,
                      int32_t rank, const int64_t *shape, const int64_t *strides, const void *data,
                      void *stream);
/* Give an operand descriptor filled by shim_tap_operand the nesting of the
 * scope it was made in (sc->parent, sc->block; nothing when sc is NULL or
 * not nested). sc must outlive t. */
void shim_tap_operand_nesting(probe_tap_tensor_v1 *t, const struct shim_scope *sc);

/* Record path as skipped with reason (no tensor; hooks/graphs.c). */
void shim_tap_skip_path(const char *path, const char *reason);

#endif
