/* probe/kernels.h - the kernel logs of two runs side by side (manifest key
 * "kernels", written by the preloaded shim: docs/kernels.md) and the
 * feature-active check on the candidate's kernels (probe-compare
 * --expect-kernel). */
#ifndef PROBE_KERNELS_H
#define PROBE_KERNELS_H

#include <stddef.h>

#include "probe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One kernel name (demangled when the run could) and its launch count. */
typedef struct probe_kernel_count {
    char *name;
    unsigned long long count;
} probe_kernel_count;

/* One component of either run: the kernels launched inside its scopes in
 * one run and never in the other, each with that run's launch count, in
 * name order (strcmp). */
typedef struct probe_kernel_component {
    char *component;                   /* "(none)": outside every scope */
    unsigned long long launches_reference, launches_candidate; /* "launches" of each run, 0 if absent */
    size_t nonly_candidate, nonly_reference;
    probe_kernel_count *only_candidate, *only_reference;
} probe_kernel_component;

typedef struct probe_kernel_diff {
    int have_reference, have_candidate; /* 1 when that run's manifest has a "kernels" object */
    size_t ncomponents;
    probe_kernel_component *components; /* union of both runs' components, name order */
} probe_kernel_diff;

/* Compare the "kernels" objects of two run manifests (probe.manifest JSON
 * text; NULL or a manifest without the key = no log on that side). Names
 * are compared as written (exact bytes). On success *out holds the result
 * (free with probe_kernel_diff_free). Errors: PROBE_EINVAL when out is NULL;
 * PROBE_EFORMAT when a manifest is not JSON or its "kernels" is not an
 * object of {"by_name": {NAME: non-negative integer}} (the message says
 * which side and what); PROBE_ENOMEM. */
probe_status probe_kernel_diff_compute(const char *manifest_reference,
                                       const char *manifest_candidate, probe_kernel_diff **out);
void probe_kernel_diff_free(probe_kernel_diff *d);

/* Does the run launch a kernel that `spec` expects? spec: "GLOB" (any
 * component) or "COMPONENT:GLOB" (only that component's scopes). The text
 * before the first ':' names a component only when it is non-empty, holds
 * no glob character (*?[), no space or '<', and the ':' is not part of
 * "::" (so "*flash::*" and "flash::fwd*" are globs over every component).
 * GLOB is matched with fnmatch(3), flags 0, against each kernel name of
 * the manifest's "kernels" ... "by_name". On success *matched is the number
 * of distinct (component, name) pairs that match and, when first is not
 * NULL, first (cap bytes) holds the first match's name ("" when none).
 * Errors: PROBE_EINVAL (empty spec or GLOB, NULL arguments); PROBE_ENOTFOUND
 * when the manifest has no "kernels" object (the run logged no kernels);
 * PROBE_EFORMAT as probe_kernel_diff_compute. */
probe_status probe_kernel_expect(const char *manifest, const char *spec, size_t *matched,
                                 char *first, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
