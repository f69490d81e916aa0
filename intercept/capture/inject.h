/* intercept/capture/inject.h - probe_inject_v1: the reference file, inject globs, count check, manifest record. */
#ifndef PROBE_INTERCEPT_CAPTURE_INJECT_H
#define PROBE_INTERCEPT_CAPTURE_INJECT_H

struct shim_json;


/* Read PROBE_INJECT / PROBE_INJECT_GLOBS (constructor). */
void shim_inject_init(void);
/* At close, before the final manifest: check that every reference tensor
 * the globs select was injected (count check) and close the reference. */
void shim_inject_finish(void);
/* Append ,"inject":{...} to the manifest being built when injection is configured. */
void shim_inject_json(struct shim_json *b);

#endif
