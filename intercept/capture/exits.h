/* intercept/capture/exits.h - abnormal ends of the capturing process: _exit, abort, exec, terminating signals. */
#ifndef PROBE_INTERCEPT_CAPTURE_EXITS_H
#define PROBE_INTERCEPT_CAPTURE_EXITS_H

#include <stdint.h>
#include <stddef.h>
#include "probe/tap.h"

/* Called once the capture file is open (shim_file_open): records the owner's
 * pid, starts the signal drain thread and installs the SIGTERM/SIGINT/SIGHUP
 * handlers where their disposition is the default. */
void shim_exits_arm(void);

/* Exec continuation (docs/file-format.md "Exec continuation"). st: the
 * capture file as the claim found it, non-empty: 1 when it is the file the
 * image before exec of this same pid closed (PROBE_EXEC_CAPTURE), which this
 * image then continues; 0 otherwise. */
struct stat;
struct shim_json;
int shim_exits_exec_continues(const struct stat *st);
/* 1 once shim_exits_exec_continues said so: the writer appends (PROBE_WRITER_APPEND). */
int shim_exits_exec_continuing(void);
/* The tap as this image writes it: t itself, or (continuing) a copy in
 * *copy whose call, and whose parent's call (in parent, parent_size bytes),
 * follow the earlier images' calls of the same component. Records the
 * highest call of each component for the next exec. */
const probe_tap_tensor_v1 *shim_exits_exec_call(const probe_tap_tensor_v1 *t, probe_tap_tensor_v1 *copy,
                                          char *parent, size_t parent_size);
/* probe.seq as written: this image's seq after the earlier images' (and
 * recorded for the next exec). */
uint64_t shim_exits_exec_seq(uint64_t seq);
/* Append a TAPPED record for path (a tensor about to be queued) to the
 * capture's journal, so that a kill names it as lost (exits.c). */
void shim_exits_note_tapped(const char *path);
/* ,"exec":{...} in the manifest of a continuing image, else nothing. */
void shim_exits_exec_json(struct shim_json *b);

#endif
