/* device_loader.h - libprobe_cuda.so, loaded on demand (probe/device.h). */
#ifndef PROBE_DEVICE_LOADER_H
#define PROBE_DEVICE_LOADER_H

#include "probe/metrics.h"

typedef probe_status (*probe_cuda_source_fn)(int device, const probe_pair_source *src,
                                             const probe_metrics_opts *opts,
                                             const probe_channel_spec *channel,
                                             probe_metrics *out, probe_channel_shift *shift);

typedef probe_status (*probe_cuda_source_v2_fn)(int device, const probe_pair_source *src,
                                                const probe_metrics_opts *opts,
                                                const probe_stream_opts *sopts,
                                                probe_metrics *out, probe_channel_shift *shift);

/* probe_cuda_metrics_source of libprobe_cuda.so, found next to libprobe (the
 * directory of the library holding this code), else on the loader's path.
 * PROBE_EUNSUPPORTED with the reason when it cannot be loaded or has another
 * ABI version. Thread-safe; loads once. */
probe_status probe_cuda_load(probe_cuda_source_fn *fn);

/* probe_cuda_metrics_source_v2 of the same library (per-channel arrays, the
 * CPU engine's probe_stream_opts). PROBE_EUNSUPPORTED as probe_cuda_load, and
 * also when the library loaded is an older one without it. */
probe_status probe_cuda_load_v2(probe_cuda_source_v2_fn *fn);

#endif
