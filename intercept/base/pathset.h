/* intercept/base/pathset.h - the set of dataset paths already taken (duplicate detection). */
#ifndef PROBE_INTERCEPT_BASE_PATHSET_H
#define PROBE_INTERCEPT_BASE_PATHSET_H



/* Insert path; 1 if inserted, 0 if present, -1 out of memory. Thread-safe. */
int shim_pathset_insert(const char *path);
/* Remove path (after a tap that failed before queueing). */
void shim_pathset_remove(const char *path);

#endif
