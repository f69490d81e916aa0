/* intercept/capture/weights.h - fingerprints of the weight operands of interposed GEMMs. */
#ifndef PROBE_INTERCEPT_CAPTURE_WEIGHTS_H
#define PROBE_INTERCEPT_CAPTURE_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>
#include "probe/dtype.h"

struct shim_json;
struct shim_work;

/* 1 unless PROBE_WEIGHTS=0. */
int shim_weights_enabled(void);
/* 1 unless PROBE_WEIGHTS=0 or PROBE_WEIGHTS=hash: rounded fingerprints too. */
int shim_weights_rounded_enabled(void);
/* 1 when `call` is the first call seen for fingerprint key `key` (a
 * component, or "<component>@block=B"), which it then stays; 0 for a later
 * call of the same key (a block run twice in one parent call), so each key's
 * operands come from one call. */
int shim_weights_first_call(const char *key, int64_t call);
/* Register a weight operand about to be hashed; its slot, or SIZE_MAX when
 * the table is full (counted as overflow). */
size_t shim_weights_register(const char *component, int64_t k, int rank, const int64_t *shape,
                             probe_dtype dtype, size_t nbytes);
/* Writer thread: the XXH64 of the weight operand registered as slot (ok 0:
 * the copy failed or was skipped). */
void shim_weights_hashed(size_t slot, uint64_t hash, int ok);
/* Writer thread: the rounded fingerprints of the same operand (fp NULL: not
 * computed, the manifest says null). */
struct probe_rounded_fingerprint;
void shim_weights_rounded(size_t slot, const struct probe_rounded_fingerprint *fp);
/* The operand's hash will not come (the call failed, the copy was not queued). */
void shim_weights_failed(size_t slot);
/* Append ,"weights":{...} (weights.c) when any operand was registered. */
void shim_weights_json(struct shim_json *b);

/* The work callback of a weight-fingerprint job (capture/job.h, hash_only):
 * the XXH64 of the copied bytes handed to shim_weights_hashed, and for a
 * bfloat16/float16/float32 operand its rounded fingerprints
 * (probe_rounded_fingerprint_compute) to shim_weights_rounded. */
void shim_weights_run_hash(struct shim_work *w);

#endif
