"""ctypes bindings to libprobe_cuda.so (include/probe/device.h): the metrics
of probe/metrics.h computed on CUDA tensors where they lie, with no copy to
the host. Nothing here computes a metric.

libprobe_cuda.so is found, in this order:
  1. the environment variable PROBE_LIBPROBE_CUDA (a path to libprobe_cuda.so);
  2. the directory of the libprobe.so that probe._lib loaded (the build tree's
     lib/ and an installed prefix's lib/ hold both libraries).

metrics(ref, cand, atol, rtol, channel) takes two torch CUDA tensors of one
device and the same number of elements and returns (Metrics, ChannelShift):
  - a tensor that is not contiguous is made contiguous on the device
    (tensor.contiguous(): one device copy of that side; no host copy);
  - the call is enqueued on torch's current stream of the tensors' device
    (torch.cuda.current_stream(device).cuda_stream), after the work that
    produced the tensors, with that device current; probe_cuda_metrics
    returns when the result is on the host (it synchronizes that stream only);
  - device scratch is the library's bounded pool (docs/device.md "Scratch
    memory": 112 bytes per 32768 elements plus 128 KiB, plus 56 bytes per
    channel segment and channel when a channel axis is given).
"""

import ctypes
import os
import threading

from . import _lib


class ChannelSpec(ctypes.Structure):
    """struct probe_channel_spec (probe/metrics.h)."""
    _fields_ = [("count", ctypes.c_uint64), ("inner", ctypes.c_uint64)]


class ChannelShift(ctypes.Structure):
    """struct probe_channel_shift (probe/metrics.h), field for field."""
    _fields_ = [
        ("count", ctypes.c_uint64),
        ("argmax", ctypes.c_uint64),
        ("max", ctypes.c_double),
        ("max_rel", ctypes.c_double),
        ("std_ref", ctypes.c_double),
        ("z_argmax", ctypes.c_uint64),
        ("z_max", ctypes.c_double),
    ]


PROBE_EUNSUPPORTED = 6
PROBE_EIO = 3


class CudaUnavailable(_lib.ProbeError):
    """libprobe_cuda.so has no usable CUDA device (PROBE_EUNSUPPORTED)."""


class CudaLibrary:
    """The libprobe_cuda function the pairing calls, with its C signature."""

    def __init__(self, path, core):
        self.path = path
        self.core = core
        h = ctypes.CDLL(path)
        self.handle = h
        self.abi_version = h.probe_cuda_abi_version
        self.abi_version.argtypes = []
        self.abi_version.restype = ctypes.c_int
        self.metrics_fn = h.probe_cuda_metrics
        self.metrics_fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_uint64, ctypes.POINTER(_lib.MetricsOpts),
                                    ctypes.POINTER(ChannelSpec), ctypes.c_void_p,
                                    ctypes.POINTER(_lib.Metrics), ctypes.POINTER(ChannelShift)]
        self.metrics_fn.restype = ctypes.c_int
        for cls, name in ((ChannelSpec, "probe_channel_spec"), (ChannelShift, "probe_channel_shift")):
            core.check_layout(cls, name)

    def raw_metrics(self, ref_dtype, ref_ptr, cand_dtype, cand_ptr, n, atol, rtol, channel=None,
                    stream=0):
        """probe_cuda_metrics on device pointers (ints) of the current device.
        channel: None or (count, inner). Returns (Metrics, ChannelShift).
        Raises ValueError (PROBE_EINVAL), CudaUnavailable (no usable device),
        probe.ProbeError (any other CUDA error, named by the library)."""
        m = _lib.Metrics()
        sh = ChannelShift()
        opts = _lib.MetricsOpts(float(atol), float(rtol))
        spec = ChannelSpec(*channel) if channel else None
        st = self.metrics_fn(int(ref_dtype), ctypes.c_void_p(ref_ptr or None), int(cand_dtype),
                             ctypes.c_void_p(cand_ptr or None), int(n), ctypes.byref(opts),
                             ctypes.byref(spec) if spec is not None else None,
                             ctypes.c_void_p(stream or None), ctypes.byref(m), ctypes.byref(sh))
        if st == PROBE_EUNSUPPORTED:
            raise CudaUnavailable("probe: %s" % self.core.last_error())
        self.core.check(st, "probe")
        return m, sh


_lock = threading.Lock()
_cuda = None


def library_path():
    env = os.environ.get("PROBE_LIBPROBE_CUDA")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(_lib.get().path)), "libprobe_cuda.so")


def get():
    """The loaded CudaLibrary (once per process). Raises OSError naming the
    path when libprobe_cuda.so is absent (a build without the CUDA toolkit)."""
    global _cuda
    with _lock:
        if _cuda is None:
            core = _lib.get()
            path = library_path()
            if not os.path.exists(path):
                raise OSError("probe: libprobe_cuda.so not found at %s (built when CMake finds the "
                              "CUDA toolkit; PROBE_LIBPROBE_CUDA names another): CUDA tensors are "
                              "compared on the device by it" % path)
            lib = CudaLibrary(path, core)
            v = lib.abi_version()
            if v != 1:
                raise OSError("probe: %s has plugin ABI version %d, this module needs 1" % (path, v))
            _cuda = lib
        return _cuda


def metrics(ref, cand, ref_dtype, cand_dtype, atol, rtol, channel=None):
    """Metrics of two torch CUDA tensors of one device (see the module
    docstring). ref_dtype/cand_dtype: probe_dtype codes."""
    import torch
    if ref.device != cand.device:
        raise ValueError("probe: reference on %s, candidate on %s: the device path needs both "
                         "on one device" % (ref.device, cand.device))
    if ref.numel() != cand.numel():
        raise ValueError("probe: %d reference elements, %d candidate elements"
                         % (ref.numel(), cand.numel()))
    lib = get()
    r = ref.detach()
    c = cand.detach()
    if not r.is_contiguous():
        r = r.contiguous()
    if not c.is_contiguous():
        c = c.contiguous()
    if getattr(r, "is_neg", lambda: False)():
        r = r.resolve_neg()
    if getattr(c, "is_neg", lambda: False)():
        c = c.resolve_neg()
    with torch.cuda.device(r.device):
        stream = torch.cuda.current_stream(r.device).cuda_stream
        return lib.raw_metrics(ref_dtype, r.data_ptr(), cand_dtype, c.data_ptr(), r.numel(),
                               atol, rtol, channel, stream)
