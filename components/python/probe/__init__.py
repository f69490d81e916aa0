"""probe: parity checks on in-memory tensors, for a user's pytest.

    import probe
    probe.assert_parity(ref, cand, gate="T1")      # raises AssertionError on failure
    m = probe.compare(ref, cand, gate="T1-relaxed:backend-swap")

ref and cand are torch tensors or numpy arrays (Python numbers and lists of
them are made arrays as said below; anything else is passed through
numpy.asarray). Every metric is computed by libprobe's C code
(probe_metrics_compute_typed, the same probe_metrics_compute that
probe-compare uses) and every verdict by probe_gate_parse/probe_gate_check:
there is no second implementation of any metric in Python. Definitions:
docs/contract.md "Metric definitions" and docs/metrics.md; gates: docs/gates.md.

Data passing: the C code reads the tensors' memory through a pointer, in
their own element type (float16, bfloat16, float32, float64, FP8 when torch
has it, integers, bool). A copy is made only when it must be:
  - a torch tensor on a device other than the CPU (e.g. CUDA) is copied to
    host memory (tensor.to("cpu"), which synchronizes with its stream);
  - a tensor or array that is not C-contiguous is copied to a contiguous one;
  - a big-endian numpy array is copied to little-endian.
Otherwise no bytes are copied in Python; libprobe converts both sides to
fp64 inside C (2 x n doubles of scratch) and accumulates in fp64.

Integers are handed to the C library in their own element type, never
through float64: integer tensors and arrays as they are (int64 stays int64),
and Python ints (a number, or nested lists/tuples of them, bools included)
become an int64 array (uint64 when a value is above the int64 range and none
is negative; TypeError when they fit neither). Python bools alone become a
bool array; a list holding a Python float is numpy's float64, as numpy makes
it.

libprobe.so is found through PROBE_LIBPROBE or next to this package (see
probe._lib); docs/packaging.md.

The feature table (probe.Feature, probe.register_feature, probe.FEATURES,
probe.parametrize_features) and the pytest plugin (probe.pytest_plugin):
docs/pytest.md.
"""

import json
import math
import numbers
import sys

from . import _lib


def _source_version():
    """The CMake project version, read from the source tree's CMakeLists.txt
    when the package is imported from components/python (no build wrote
    _version.py); "unknown" when that is not found either."""
    import os
    import re
    top = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir)
    try:
        with open(os.path.join(top, "CMakeLists.txt")) as f:
            m = re.search(r"project\(probe VERSION ([0-9.]+)", f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


try:
    from ._version import __version__
except ImportError:
    __version__ = _source_version()
from .features import (FEATURES, Feature, features_with, parametrize_features,  # noqa: F401
                       register_feature, unregister_feature)

__all__ = ["compare", "assert_parity", "ProbeError", "__version__", "Feature", "FEATURES",
           "register_feature", "unregister_feature", "features_with", "parametrize_features"]

ProbeError = _lib.ProbeError

# torch dtype name / numpy dtype name -> probe_dtype name (probe/dtype.h)
_NUMPY_NAMES = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "float32": "float32", "float64": "float64",
    "bfloat16": "bfloat16",  # ml_dtypes' numpy bfloat16
}
_TORCH_NAMES = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "bfloat16": "bfloat16", "float32": "float32",
    "float64": "float64", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def _python_numbers(x):
    """The Python scalars of x (a number or nested lists/tuples of them), or
    None when x holds anything else (arrays, tensors, strings, ...)."""
    out, todo = [], [x]
    while todo:
        v = todo.pop()
        if isinstance(v, (list, tuple)):
            todo.extend(v)
        elif isinstance(v, (bool, int, float, complex)):
            out.append(v)
        else:
            return None
    return out


def _from_python(x, side):
    """x as a numpy array when it is made of Python numbers whose integers
    numpy would otherwise round through float64 (it makes [2**63, 1] and
    [-1, 2**63] float64): ints (bools among them) as int64, or uint64 when a
    value needs it and none is negative; bools alone as bool. None when x is
    not made of Python numbers or holds a float (numpy's float64, as asked)."""
    __tracebackhide__ = True
    import numpy as np
    vals = _python_numbers(x)
    if vals is None or any(isinstance(v, (float, complex)) for v in vals):
        return None
    if vals and all(isinstance(v, bool) for v in vals):
        return np.asarray(x, dtype=np.bool_)
    lo = min(vals, default=0)
    hi = max(vals, default=0)
    if _INT64_MIN <= lo and hi <= _INT64_MAX:
        return np.asarray(x, dtype=np.int64)
    if lo >= 0 and hi <= _UINT64_MAX:
        return np.asarray(x, dtype=np.uint64)
    raise TypeError("probe: %s holds Python ints outside the int64 and uint64 ranges (%d .. %d), "
                    "which probe cannot compare exactly" % (side, lo, hi))


class _View:
    """A host, contiguous, little-endian view of one input: pointer, probe
    dtype, shape; `keep` holds the object that owns the memory."""

    def __init__(self, keep, ptr, dtype_name, shape, n):
        self.keep = keep
        self.ptr = ptr
        self.dtype_name = dtype_name
        self.shape = tuple(int(d) for d in shape)
        self.n = int(n)


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _view(x, side):
    __tracebackhide__ = True
    if _is_torch_tensor(x):
        t = x.detach()
        if t.layout != sys.modules["torch"].strided:
            raise TypeError("probe: %s is a %s tensor; only dense (strided) tensors are supported"
                            % (side, t.layout))
        if t.is_complex() or t.is_quantized:
            raise TypeError("probe: %s has element type %s, which probe does not compare"
                            % (side, t.dtype))
        name = _TORCH_NAMES.get(str(t.dtype).replace("torch.", ""))
        if name is None:
            raise TypeError("probe: %s has element type %s, which probe does not compare"
                            % (side, t.dtype))
        if t.device.type != "cpu":
            t = t.to("cpu")          # copy: the C code reads host memory
        if not t.is_contiguous():
            t = t.contiguous()       # copy: the C code reads row-major packed elements
        if getattr(t, "is_neg", lambda: False)():
            t = t.resolve_neg()
        return _View(t, t.data_ptr(), name, t.shape, t.numel())

    import numpy as np
    a = x if isinstance(x, np.ndarray) else _from_python(x, side)
    if a is None:
        a = np.asarray(x)
    name = _NUMPY_NAMES.get(a.dtype.name)
    if name is None:
        raise TypeError("probe: %s has element type %s, which probe does not compare"
                        % (side, a.dtype))
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.astype(a.dtype.newbyteorder("<"))   # copy: probe reads little-endian
    a = np.ascontiguousarray(a)                    # copy only if not C-contiguous
    return _View(a, a.ctypes.data if a.size else None, name, a.shape, a.size)


def _unravel(offset, shape):
    idx = []
    for d in reversed(shape):
        if d == 0:
            return [0] * len(shape)
        idx.append(offset % d)
        offset //= d
    return list(reversed(idx))


def _element(view, offset):
    """The element at flat row-major offset of a view, as a Python number (an
    int for integer and bool types, a float otherwise: every float type probe
    reads is exactly a double); None when offset is None."""
    if offset is None:
        return None
    v = view.keep.reshape(-1)[offset].item()
    return v if isinstance(v, (bool, int)) else float(v)


def _fmt(v):
    return "n/a" if v is None else repr(v)


def _gate_dict(g):
    d = {"name": g.name.decode(), "atol": g.atol, "rtol": g.rtol,
         "mismatch_fraction_max": g.mismatch_fraction_max, "rel_l2_max": g.rel_l2_max,
         "cosine_min": g.cosine_min, "max_abs_max": g.max_abs_max, "p99_abs_max": g.p99_abs_max}
    for k in ("channel_z_max", "gain_z_max"):  # only when checked, as in probe-compare's JSON
        if math.isfinite(getattr(g, k)):
            d[k] = getattr(g, k)
    if g.cause:
        d["cause"] = g.cause.decode()
    return d


def _tolerance(name, x):
    """atol/rtol as a float: None stays None; a real number (Python or numpy,
    not bool) that is finite and >= 0; TypeError for anything else (a string
    such as "1e-3" included), ValueError for a negative or non-finite one."""
    __tracebackhide__ = True
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError("probe: %s must be a real number (int or float), not %s %r"
                        % (name, type(x).__name__, x))
    v = float(x)
    if not math.isfinite(v) or v < 0:
        raise ValueError("probe: %s must be finite and >= 0, not %r" % (name, x))
    return v


def _calibrated_names(calibration):
    """The component names and tensor globs of a calibration file (its
    "components" and "tensors" keys), for the error message of a T2 lookup
    that finds no entry. The file has already been loaded by libprobe."""
    try:
        with open(str(calibration)) as f:
            doc = json.load(f)
        return sorted(doc.get("components") or {}), list(doc.get("tensors") or {})
    except (OSError, ValueError, AttributeError):
        return [], []


def _effective_gate(lib, gate, atol, rtol, calibration, component, path):
    """The gate as probe-compare applies it to one tensor: parsed spec, T2
    thresholds from the calibration file, then the atol/rtol overrides.
    Returns the Gate. Raises ValueError when T2 finds no entry for
    component/path in the calibration file."""
    __tracebackhide__ = True
    import ctypes
    if not isinstance(gate, str):
        raise ValueError("probe: gate must be a string such as 'T1', not %r" % (gate,))
    atol = _tolerance("atol", atol)
    rtol = _tolerance("rtol", rtol)
    g = _lib.Gate()
    lib.check(lib.gate_parse(gate.encode(), ctypes.byref(g)), "probe: gate")
    if g.kind == 3:  # PROBE_GATE_T2
        if calibration is None:
            raise ValueError("probe: gate T2 needs calibration=FILE (docs/calibration.md)")
        if component is None and path is None:
            raise ValueError("probe: gate T2 needs component= (or path=) to look up its thresholds")
        cal = ctypes.c_void_p()
        lib.check(lib.cal_load(str(calibration).encode(), None, ctypes.byref(cal)),
                  "probe")  # the message starts "calibration FILE: ..."
        try:
            st = lib.cal_gate(cal, component.encode() if component is not None else None,
                              path.encode() if path is not None else None, ctypes.byref(g))
        finally:
            lib.cal_free(cal)
            # the per-channel thresholds are the calibration's memory, freed here: the
            # module applies the largest-|z| threshold only (docs/pairing.md)
            g.channel_z_max_by_channel = None
            g.channel_z_count = 0
        if st != _lib.PROBE_OK:
            comps, globs = _calibrated_names(calibration)
            what = ("component '%s'" % component if path is None else
                    "path '%s'" % path if component is None else
                    "component '%s' or path '%s'" % (component, path))
            raise ValueError("probe: no T2 thresholds for %s in the calibration file %s "
                             "(its components: %s; its tensor globs: %s)"
                             % (what, calibration, ", ".join(comps) or "none",
                                ", ".join(globs) or "none"))
    if atol is not None:
        g.atol = atol
    if rtol is not None:
        g.rtol = rtol
    return g


def compare(ref, cand, gate="T1", atol=None, rtol=None, calibration=None, component=None,
            path=None):
    """Compare a reference tensor (feature off) with a candidate (feature on).

    ref, cand: torch tensors or numpy arrays of the same shape (element types
        may differ, e.g. float32 vs bfloat16); see the module docstring for
        when a copy is made.
    gate: "T1", "T1-relaxed:CAUSE" or "T2" (docs/gates.md).
    atol, rtol: override the gate's element-wise tolerance
        (|c - r| > atol + rtol*|r| is a mismatch), as probe-compare's --atol/--rtol.
    calibration: path of a T2 calibration file (docs/calibration.md), with
        component= (e.g. "dit.step") and/or path= (a dataset path matched
        against the file's "tensors" globs) naming the thresholds to use.
        T2 also applies the file's gain_z_max (never below rounding noise's z
        limit); channel_z_max needs a channel axis, which only probe-compare has.

    Returns a dict with the keys of a tensor in probe-compare's JSON
    (docs/compare-json.md "Per tensor"): n, shape, dtype, dtype_candidate, rel_l2, cosine,
    max_abs, max_abs_index, p99_abs, mean_abs, mismatch_fraction, nan_ref,
    nan_cand, inf_ref, inf_cand, zero_norm_reference, identical, verdict
    ("pass"/"fail"), reasons; plus n_finite, mismatch_count, inf_mismatch,
    norm_ref, norm_cand, norm_diff, dot, gate (the thresholds applied) and
    ref_at_max_abs / cand_at_max_abs (the two elements at max_abs_index, as
    Python numbers; None for empty tensors).
    Metrics that are not finite are float nan/inf (the JSON writes null).

    Raises ValueError for shapes that differ, an unknown gate, T2 without
    calibration/component, a T2 component (or path) for which the
    calibration file has no thresholds, a negative or non-finite atol/rtol;
    TypeError for an element type probe does not compare and for an
    atol/rtol that is not a real number (e.g. the string "1e-3");
    FileNotFoundError / probe.ProbeError for an unreadable calibration file;
    OSError when libprobe.so cannot be found.
    """
    __tracebackhide__ = True
    import ctypes
    lib = _lib.get()
    r = _view(ref, "reference")
    c = _view(cand, "candidate")
    if r.shape != c.shape:
        raise ValueError("probe: shape mismatch: reference %s, candidate %s"
                         % (list(r.shape), list(c.shape)))
    g = _effective_gate(lib, gate, atol, rtol, calibration, component, path)

    m = _lib.Metrics()
    opts = _lib.MetricsOpts(g.atol, g.rtol)
    rt = lib.dtype_from_name(r.dtype_name.encode())
    ct = lib.dtype_from_name(c.dtype_name.encode())
    lib.check(lib.compute_typed(rt, r.ptr, ct, c.ptr, r.n, ctypes.byref(opts), ctypes.byref(m)),
              "probe: metrics")
    v = _lib.GateVerdict()
    lib.check(lib.gate_check(ctypes.byref(g), ctypes.byref(m), ctypes.byref(v)), "probe: gate")
    if g.kind == 3:  # T2: the calibrated gain z (no channel axis in memory: no channel z)
        noise = lib.systematic_limit(1, 1e-6)  # PROBE_SYSTEMATIC_FALSE_ALARM
        lib.check(lib.gate_check_structure(ctypes.byref(g), ctypes.byref(m), None,
                                           float("nan"), noise, ctypes.byref(v)), "probe: gate")
    passed = bool(v.pass_)
    reasons = [v.reasons[i].value.decode("utf-8", "replace") for i in range(v.nreasons)]
    at = m.max_abs_offset if r.n and m.max_abs_offset < r.n else None

    return {
        "n": m.n, "shape": list(r.shape), "dtype": r.dtype_name, "dtype_candidate": c.dtype_name,
        "rel_l2": m.rel_l2, "cosine": m.cosine, "max_abs": m.max_abs,
        "max_abs_index": _unravel(m.max_abs_offset, r.shape),
        "ref_at_max_abs": _element(r, at), "cand_at_max_abs": _element(c, at),
        "p99_abs": m.p99_abs,
        "mean_abs": m.mean_abs, "mismatch_fraction": m.mismatch_fraction,
        "mismatch_count": m.mismatch_count, "nan_ref": m.nan_ref, "nan_cand": m.nan_cand,
        "inf_ref": m.inf_ref, "inf_cand": m.inf_cand, "inf_mismatch": m.inf_mismatch,
        "n_finite": m.n_finite, "zero_norm_reference": bool(m.zero_norm_reference),
        "identical": bool(m.identical), "norm_ref": m.norm_ref, "norm_cand": m.norm_cand,
        "norm_diff": m.norm_diff, "dot": m.dot, "gate": _gate_dict(g),
        "verdict": "pass" if passed else "fail", "reasons": reasons,
    }


def assert_parity(ref, cand, gate="T1", atol=None, rtol=None, calibration=None, component=None,
                  path=None):
    """Assert that cand matches ref under gate (arguments as compare()).

    Returns compare()'s dict when the gate passes. Raises AssertionError when
    it fails; the message names the gate, every failing reason (e.g.
    "rel_l2 0.0312 > 0.01", "candidate has 1 NaN"), the metrics and the
    reference and candidate values at the max_abs index. Raises
    ValueError / TypeError / OSError as compare() does for bad input. Under
    pytest, the traceback of a failure stops at the caller's line
    (__tracebackhide__).
    """
    __tracebackhide__ = True
    res = compare(ref, cand, gate=gate, atol=atol, rtol=rtol, calibration=calibration,
                  component=component, path=path)
    if res["verdict"] == "pass":
        return res
    what = ""
    if component is not None or path is not None:
        what = " for %s" % (path if path is not None else component)
    raise AssertionError(
        "probe: gate %s failed%s: %s\n  rel_l2=%.6g cosine=%.9g max_abs=%.6g at %s "
        "(reference %s, candidate %s) p99_abs=%.6g "
        "mean_abs=%.6g mismatch_fraction=%.6g (atol=%g rtol=%g) nan_ref=%d nan_cand=%d "
        "inf_ref=%d inf_cand=%d n=%d shape=%s dtype=%s/%s"
        % (res["gate"]["name"], what, "; ".join(res["reasons"]), res["rel_l2"], res["cosine"],
           res["max_abs"], res["max_abs_index"], _fmt(res["ref_at_max_abs"]),
           _fmt(res["cand_at_max_abs"]), res["p99_abs"], res["mean_abs"],
           res["mismatch_fraction"], res["gate"]["atol"], res["gate"]["rtol"], res["nan_ref"],
           res["nan_cand"], res["inf_ref"], res["inf_cand"], res["n"], res["shape"],
           res["dtype"], res["dtype_candidate"]))

from .pairing import (pair, assert_pair, assert_active, feature, external,  # noqa: E402
                      output_slots)
__all__ += ["pair", "assert_pair", "assert_active", "feature", "external", "output_slots"]
