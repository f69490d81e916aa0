/* intercept/capture/nvtx.h - NVTX injection entry point and per-thread range stacks. */
#ifndef PROBE_INTERCEPT_CAPTURE_NVTX_H
#define PROBE_INTERCEPT_CAPTURE_NVTX_H

#include <stddef.h>

/* Write this thread's NVTX range stack joined by '/' ("" if empty) into buf
 * (cap bytes, truncated at a UTF-8 boundary). */
void shim_nvtx_scope(char *buf, size_t cap);

#endif
