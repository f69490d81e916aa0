/* intercept/base/manifest.h - the run manifest (the capture file's root
 * attribute probe.manifest, docs/file-format.md): the shim's own keys, the
 * sections registered by the layers above, and the keys adapters set with
 * probe_tap_manifest_v1. */
#ifndef PROBE_INTERCEPT_BASE_MANIFEST_H
#define PROBE_INTERCEPT_BASE_MANIFEST_H

struct shim_json;

/* Register a section: append(b) writes zero or more `,"key":value` pairs
 * into the manifest being built, in the order of registration, after the
 * shim's own keys and before the adapters' keys. key: the key it writes
 * (the section is skipped when an adapter set that key), NULL when it
 * writes several or none that adapters may replace. final_only: written
 * only into the manifest at close. At most 32 sections; constructor only
 * (life.c). */
void shim_manifest_add(const char *key, int final_only, void (*append)(struct shim_json *b));

/* ,"nvidia_driver":"580.95.05" from /proc/driver/nvidia/version (no CUDA
 * call), nothing when there is none. */
void shim_manifest_driver_json(struct shim_json *b);

/* The run manifest as JSON text (malloc'd; NULL when out of memory).
 * final = 1 adds what is known at close (queue waits, counts, CUDA). */
char *shim_manifest_build(int final);

#endif
