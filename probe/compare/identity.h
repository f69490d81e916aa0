/* probe/compare/identity.h - which candidate call each reference call is paired with
 * (internal to libprobe; docs/compare-json.md "Pairing by module path").
 *
 * A call is the group of datasets /<component>/<call:04>/... . By default the
 * reference's call k of a component is paired with the candidate's call k
 * (the same dataset path). When both captures record the module path
 * (probe.module) of every call of a component, and the two runs called that
 * component's modules in a different order (SD3's three text encoders in
 * another order, Wan2.2's two experts switching at another step), the calls
 * are paired by module path instead: the j-th call of module M in the
 * reference with the j-th call of M in the candidate. A call whose module has
 * no j-th call on the other side has no counterpart: its tensors are missing
 * on the other side. Components whose calls come in the same module order on
 * both sides, or that lack a module path anywhere, pair by path as before.
 * A component whose every call is nested on both sides (probe.parent and
 * probe.block: a DiT block inside a DiT step) pairs by (parent call, block
 * index) instead, when the two sides differ there at some call index: a
 * feature that skips calls (a step cache running only the first block of a
 * step) shifts the call indices of every later block, and the block of the
 * same step and index is its counterpart; a skipped block has none. */
#ifndef PROBE_IDENTITY_H
#define PROBE_IDENTITY_H

#include <stddef.h>
#include "probe/capture.h"
#include "probe/rankset.h"

#define PROBE_IDENTITY_API __attribute__((visibility("hidden")))

typedef struct probe_call_map probe_call_map;

/* Build the pairing of two single-file captures (probe_rankset_world 0 on
 * both sides). *out is NULL when no component needs pairing by module path.
 * PROBE_ENOMEM. */
PROBE_IDENTITY_API probe_status probe_call_map_build(const probe_rankset *ref, const probe_rankset *cand,
                                                     probe_call_map **out);

/* The path on the other side paired with tensor ti of side `side` (0: a
 * reference tensor, whose candidate path is wanted; 1: a candidate tensor)
 * into buf (cap bytes). Returns 0 when ti pairs by its own path (m NULL, or
 * its component is not re-paired); 1 when it is re-paired: buf holds the
 * other side's path, or "" when its call has no counterpart. */
PROBE_IDENTITY_API int probe_call_map_other(const probe_call_map *m, int side, const probe_tensor_info *ti,
                                            char *buf, size_t cap);

/* Reference calls paired with a candidate call of another index, and
 * reference calls without a counterpart, over every re-paired component. */
PROBE_IDENTITY_API size_t probe_call_map_moved(const probe_call_map *m);
PROBE_IDENTITY_API size_t probe_call_map_unpaired(const probe_call_map *m);
/* The first re-paired component's name ("" when none). */
PROBE_IDENTITY_API const char *probe_call_map_first_component(const probe_call_map *m);
/* 1 when the first re-paired component was paired by (parent call, block index). */
PROBE_IDENTITY_API int probe_call_map_first_nested(const probe_call_map *m);

PROBE_IDENTITY_API void probe_call_map_free(probe_call_map *m);

#endif
