/* intercept/hooks/graphs.h - interposed CUDA graph calls: each launch of a
 * graph whose capture held skipped taps is recorded in probe.skips. */
#ifndef PROBE_INTERCEPT_HOOKS_GRAPHS_H
#define PROBE_INTERCEPT_HOOKS_GRAPHS_H

/* A tap for path was skipped because `stream` is capturing a CUDA graph:
 * remember it under the capture's id, so that each later launch of the
 * graph made from that capture is recorded in probe.skips too (the hook of
 * capture/cuda.c, set by life.c). */
void shim_graphs_note_skip(void *stream, const char *path);

#endif
