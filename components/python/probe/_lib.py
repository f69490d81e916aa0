"""ctypes bindings to libprobe.so: the metrics, gates and T2 calibration of
include/probe/metrics.h and include/probe/gate.h. Nothing here computes a
metric; every number comes from the C library.

libprobe.so is found, in this order:
  1. the environment variable PROBE_LIBPROBE (a path to libprobe.so);
  2. next to this package: the package lives in <prefix>/share/probe/python/probe
     (installed) or <build>/share/probe/python/probe (build tree), and the
     library in <prefix>/lib, <prefix>/lib64 or <prefix>/lib/<multiarch>;
     or, installed by pip (the distribution probe-parity), the package is
     <site-packages>/probe and the prefix <site-packages>/probe/_prefix.
"""

import ctypes
import glob
import os
import threading

PROBE_OK = 0
PROBE_EINVAL = 1
PROBE_ENOMEM = 2
PROBE_ENOTFOUND = 5
PROBE_GATE_MAX_REASONS = 8


class MetricsOpts(ctypes.Structure):
    """struct probe_metrics_opts (probe/metrics.h)."""
    _fields_ = [("atol", ctypes.c_double), ("rtol", ctypes.c_double)]


class Metrics(ctypes.Structure):
    """struct probe_metrics (probe/metrics.h), field for field."""
    _fields_ = [
        ("n", ctypes.c_uint64),
        ("n_finite", ctypes.c_uint64),
        ("rel_l2", ctypes.c_double),
        ("cosine", ctypes.c_double),
        ("max_abs", ctypes.c_double),
        ("max_abs_offset", ctypes.c_uint64),
        ("p99_abs", ctypes.c_double),
        ("mean_abs", ctypes.c_double),
        ("mismatch_count", ctypes.c_uint64),
        ("mismatch_fraction", ctypes.c_double),
        ("nan_ref", ctypes.c_uint64),
        ("nan_cand", ctypes.c_uint64),
        ("inf_ref", ctypes.c_uint64),
        ("inf_cand", ctypes.c_uint64),
        ("zero_norm_reference", ctypes.c_int),
        ("identical", ctypes.c_int),
        ("norm_ref", ctypes.c_double),
        ("norm_cand", ctypes.c_double),
        ("norm_diff", ctypes.c_double),
        ("dot", ctypes.c_double),
        ("inf_mismatch", ctypes.c_uint64),
        ("gain", ctypes.c_double),
        ("gain_se", ctypes.c_double),
        ("gain_z", ctypes.c_double),
        ("nan_ref_only", ctypes.c_uint64),
        ("mismatch_ulps_max", ctypes.c_double),
        ("max_abs_ulps_scale", ctypes.c_double),
    ]


class Gate(ctypes.Structure):
    """struct probe_gate (probe/gate.h), field for field."""
    _fields_ = [
        ("kind", ctypes.c_int),
        ("name", ctypes.c_char * 64),
        ("cause", ctypes.c_char * 32),
        ("atol", ctypes.c_double),
        ("rtol", ctypes.c_double),
        ("mismatch_fraction_max", ctypes.c_double),
        ("rel_l2_max", ctypes.c_double),
        ("cosine_min", ctypes.c_double),
        ("max_abs_max", ctypes.c_double),
        ("p99_abs_max", ctypes.c_double),
        ("channel_z_max", ctypes.c_double),
        ("gain_z_max", ctypes.c_double),
        ("channel_z_max_by_channel", ctypes.POINTER(ctypes.c_double)),
        ("channel_z_count", ctypes.c_uint64),
        ("skipped_fraction_max", ctypes.c_double),
        ("headroom", ctypes.c_double),
    ]


class GateVerdict(ctypes.Structure):
    """struct probe_gate_verdict (probe/gate.h)."""
    _fields_ = [
        ("pass_", ctypes.c_int),
        ("nreasons", ctypes.c_int),
        ("reasons", (ctypes.c_char * 160) * PROBE_GATE_MAX_REASONS),
    ]


# the structs above, with their C names (checked against the library on load)
MIRRORED = ((MetricsOpts, "probe_metrics_opts"), (Metrics, "probe_metrics"), (Gate, "probe_gate"),
            (GateVerdict, "probe_gate_verdict"))


class ProbeError(RuntimeError):
    """libprobe returned an error status that is not a bad argument."""


def prefixes():
    """The install prefixes this package may belong to, in search order: the
    pip layout (<package>/_prefix), then <prefix>/share/probe/python/probe."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, "_prefix")]
    parts = here.split(os.sep)
    if parts[-4:] == ["share", "probe", "python", "probe"]:
        out.append(os.sep.join(parts[:-4]) or os.sep)
    return out


def share_file(name):
    """The path of <prefix>/share/probe/NAME for the first prefix that has it,
    or None."""
    for prefix in prefixes():
        p = os.path.join(prefix, "share", "probe", name)
        if os.path.exists(p):
            return p
    return None


def _candidates():
    env = os.environ.get("PROBE_LIBPROBE")
    if env:
        return [env]
    out = []
    for prefix in prefixes():
        for d in ["lib", "lib64"] + sorted(os.path.relpath(p, prefix) for p in
                                           glob.glob(os.path.join(prefix, "lib", "*-linux-*"))):
            for name in ("libprobe.so", "libprobe.so.0"):
                out.append(os.path.join(prefix, d, name))
    return out


class Library:
    """The libprobe functions the module calls, with their C signatures."""

    def __init__(self, path):
        self.path = path
        h = ctypes.CDLL(path)
        self.handle = h
        self.compute_typed = h.probe_metrics_compute_typed
        self.compute_typed.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_size_t, ctypes.POINTER(MetricsOpts),
                                       ctypes.POINTER(Metrics)]
        self.compute_typed.restype = ctypes.c_int
        self.gate_parse = h.probe_gate_parse
        self.gate_parse.argtypes = [ctypes.c_char_p, ctypes.POINTER(Gate)]
        self.gate_parse.restype = ctypes.c_int
        self.gate_check = h.probe_gate_check
        self.gate_check.argtypes = [ctypes.POINTER(Gate), ctypes.POINTER(Metrics),
                                    ctypes.POINTER(GateVerdict)]
        self.gate_check.restype = ctypes.c_int
        self.gate_check_structure = h.probe_gate_check_structure
        self.gate_check_structure.argtypes = [ctypes.POINTER(Gate), ctypes.POINTER(Metrics),
                                              ctypes.c_void_p, ctypes.c_double, ctypes.c_double,
                                              ctypes.POINTER(GateVerdict)]
        self.gate_check_structure.restype = ctypes.c_int
        self.systematic_limit = h.probe_systematic_limit
        self.systematic_limit.argtypes = [ctypes.c_uint64, ctypes.c_double]
        self.systematic_limit.restype = ctypes.c_double
        self.cal_load = h.probe_calibration_load
        self.cal_load.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        self.cal_load.restype = ctypes.c_int
        self.cal_free = h.probe_calibration_free
        self.cal_free.argtypes = [ctypes.c_void_p]
        self.cal_free.restype = None
        self.cal_gate = h.probe_calibration_gate
        self.cal_gate.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                  ctypes.POINTER(Gate)]
        self.cal_gate.restype = ctypes.c_int
        self.last_error_fn = h.probe_last_error
        self.last_error_fn.argtypes = []
        self.last_error_fn.restype = ctypes.c_char_p
        self.dtype_from_name = h.probe_dtype_from_name
        self.dtype_from_name.argtypes = [ctypes.c_char_p]
        self.dtype_from_name.restype = ctypes.c_int
        self.check_layouts()

    def check_layouts(self):
        """Each struct this module mirrors has the library's size (probe_struct_size),
        so a module and a library of different versions never write past a buffer.
        Raises ProbeError naming the struct."""
        for cls, name in MIRRORED:
            self.check_layout(cls, name)

    def check_layout(self, cls, name):
        """ProbeError unless ctypes structure cls has the size of C struct `name`."""
        size = self.handle.probe_struct_size
        size.argtypes = [ctypes.c_char_p]
        size.restype = ctypes.c_size_t
        want = size(name.encode())
        if want != ctypes.sizeof(cls):
            raise ProbeError("%s: struct %s is %d bytes in the library, %d in this module: "
                             "the probe module and libprobe are from different versions"
                             % (self.path, name, want, ctypes.sizeof(cls)))

    def last_error(self):
        s = self.last_error_fn()
        return s.decode("utf-8", "replace") if s else ""

    def check(self, status, what):
        """Turn a probe_status into an exception carrying probe_last_error()."""
        if status == PROBE_OK:
            return
        msg = "%s: %s" % (what, self.last_error())
        if status == PROBE_EINVAL:
            raise ValueError(msg)
        if status == PROBE_ENOMEM:
            raise MemoryError(msg)
        if status == PROBE_ENOTFOUND:
            raise FileNotFoundError(msg)
        raise ProbeError(msg)


_lock = threading.Lock()
_lib = None


def get():
    """The loaded Library (loaded once per process). Raises OSError naming the
    paths tried when libprobe.so cannot be found or loaded."""
    global _lib
    with _lock:
        if _lib is None:
            tried = []
            for p in _candidates():
                if os.path.exists(p):
                    _lib = Library(p)
                    break
                tried.append(p)
            if _lib is None:
                raise OSError("probe: libprobe.so not found (tried %s); set PROBE_LIBPROBE to its path"
                              % ", ".join(tried))
        return _lib
