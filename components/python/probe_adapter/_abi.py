"""ctypes view of the tap ABI (include/probe/tap.h), version 1.

The functions are looked up in the global symbol scope of the process
(ctypes.CDLL(None)): probe-run LD_PRELOADs libprobe_intercept.so, whose
exported symbols are therefore global. Nothing here copies tensor bytes:
probe_tap_v1 receives a pointer, the shape and the strides.
"""

import ctypes

PROBE_TAP_ABI_VERSION = 1
PROBE_MAX_RANK = 16


class ProbeTapTensorV1(ctypes.Structure):
    """Mirror of struct probe_tap_tensor_v1 (field order and types exactly as
    in tap.h; ctypes applies the same natural alignment as the C compiler:
    128 bytes on LP64). A shim built before parent/block/class_name reads
    the first 96 bytes and ignores the rest; one built before module, the
    first 120."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("abi_version", ctypes.c_uint32),
        ("component", ctypes.c_char_p),
        ("slot", ctypes.c_char_p),
        ("call", ctypes.c_int64),
        ("step", ctypes.c_int64),
        ("cfg_branch", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
        ("timestep", ctypes.c_double),
        ("parent", ctypes.c_char_p),
        ("block", ctypes.c_int64),
        ("class_name", ctypes.c_char_p),
        ("module", ctypes.c_char_p),
    ]


class ProbeScopeV1(ctypes.Structure):
    """Mirror of struct probe_scope_v1 (tap.h): 56 bytes on LP64."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("abi_version", ctypes.c_uint32),
        ("component", ctypes.c_char_p),
        ("call", ctypes.c_int64),
        ("step", ctypes.c_int64),
        ("cfg_branch", ctypes.c_int32),
        ("parent", ctypes.c_char_p),
        ("block", ctypes.c_int64),
    ]


PROBE_INJECT_NONE = 0
PROBE_INJECT_DONE = 1
PROBE_INJECT_ERROR = -1


class TapLibrary:
    """The tap ABI functions, bound with their C signatures (inject, sidecar
    and close are None when the preloaded shim predates them)."""

    def __init__(self, handle):
        self.tap = handle.probe_tap_v1
        self.tap.argtypes = [ctypes.POINTER(ProbeTapTensorV1)]
        self.tap.restype = ctypes.c_int
        self.enabled = handle.probe_tap_enabled_v1
        self.enabled.argtypes = []
        self.enabled.restype = ctypes.c_int
        self.manifest = handle.probe_tap_manifest_v1
        self.manifest.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        self.manifest.restype = ctypes.c_int
        self.stream = handle.probe_tap_stream_v1
        self.stream.argtypes = [ctypes.c_int32]
        self.stream.restype = ctypes.c_void_p
        self.flush = handle.probe_tap_flush_v1
        self.flush.argtypes = []
        self.flush.restype = ctypes.c_int
        try:
            self.inject = handle.probe_inject_v1
            self.inject.argtypes = [ctypes.POINTER(ProbeTapTensorV1)]
            self.inject.restype = ctypes.c_int
        except AttributeError:
            self.inject = None
        try:
            self.sidecar = handle.probe_tap_sidecar_v1
            self.sidecar.argtypes = [ctypes.c_char_p]
            self.sidecar.restype = ctypes.c_int
            self.sidecar_if_taken = handle.probe_tap_sidecar_if_taken_v1
            self.sidecar_if_taken.argtypes = [ctypes.c_char_p]
            self.sidecar_if_taken.restype = ctypes.c_int
            self.close = handle.probe_tap_close_v1
            self.close.argtypes = []
            self.close.restype = ctypes.c_int
        except AttributeError:
            self.sidecar = self.sidecar_if_taken = self.close = None
        try:
            self.scope_enter = handle.probe_scope_enter_v1
            self.scope_enter.argtypes = [ctypes.POINTER(ProbeScopeV1)]
            self.scope_enter.restype = ctypes.c_int
            self.scope_exit = handle.probe_scope_exit_v1
            self.scope_exit.argtypes = []
            self.scope_exit.restype = ctypes.c_int
        except AttributeError:
            self.scope_enter = self.scope_exit = None


def load():
    """Return a TapLibrary for the preloaded shim, or None when the process
    does not export probe_tap_v1 (probe's library is not preloaded)."""
    try:
        handle = ctypes.CDLL(None)
        return TapLibrary(handle)
    except (AttributeError, OSError):
        return None
