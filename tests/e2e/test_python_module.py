"""The Python module `probe` (probe.compare / probe.assert_parity) on in-memory
torch tensors and numpy arrays: values against a numpy fp64 oracle, bfloat16
and float16 inputs, mixed element types, non-contiguous and big-endian inputs,
verdicts (identical pass, perturbed and NaN fail with reasons), integers
handed to the C library in their own type (Python ints as int64, never float64;
2**53 + 1 against 2**53 at atol = rtol = 0 fails once the C engine takes 64-bit
integer differences exactly, an expected failure before), T2 with a
calibration file, bad input (shape mismatch, unknown gate, element types
probe does not compare), agreement with probe-compare on the same data (same
C metrics), and the module working from an installed prefix."""
import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

BUILD = os.path.abspath(os.environ.get("PROBE_BUILD_DIR", "build"))
PY = os.environ.get("PROBE_PYTHON", sys.executable)
sys.path.insert(0, os.path.join(BUILD, "share", "probe", "python"))
import probe  # noqa: E402
import probe._lib  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def close(a, b, rel=1e-12):
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


def as_f64(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x).astype(np.float64)


def oracle(r, c, atol, rtol):
    """docs/metrics.md's definitions in numpy fp64 over the finite indices."""
    r = as_f64(r).ravel()
    c = as_f64(c).ravel()
    fin = np.isfinite(r) & np.isfinite(c)
    rf, cf = r[fin], c[fin]
    d = np.abs(cf - rf)
    nr, nc = np.linalg.norm(rf), np.linalg.norm(cf)
    mism = np.zeros(r.shape, bool)
    mism[fin] = d > atol + rtol * np.abs(rf)
    nonfin = ~fin
    same = (r == c) | (np.isnan(r) & np.isnan(c))
    mism[nonfin] = ~same[nonfin]
    return {
        "rel_l2": float(np.linalg.norm(cf - rf) / nr),
        "cosine": float(np.clip(np.dot(rf, cf) / (nr * nc), -1, 1)),
        "max_abs": float(d.max()),
        "max_abs_offset": int(np.flatnonzero(fin)[int(np.argmax(d))]),
        "p99_abs": float(np.percentile(d, 99, method="inverted_cdf")),
        "mean_abs": float(d.mean()),
        "mismatch_fraction": float(mism.sum()) / r.size,
        "nan_cand": int(np.isnan(c).sum()),
    }


def check_values(name, ref, cand, atol=None, rtol=None):
    """probe.compare under T1 (atol = rtol = 1e-3 unless overridden) against the oracle."""
    res = probe.compare(ref, cand, gate="T1", atol=atol, rtol=rtol)
    o = oracle(ref, cand, 1e-3 if atol is None else atol, 1e-3 if rtol is None else rtol)
    for k in ("rel_l2", "cosine", "mean_abs"):
        check(close(res[k], o[k]), "%s: %s %r == oracle %r" % (name, k, res[k], o[k]))
    for k in ("max_abs", "p99_abs", "mismatch_fraction", "nan_cand"):
        check(res[k] == o[k], "%s: %s %r == oracle %r (exact)" % (name, k, res[k], o[k]))
    shape = tuple(ref.shape)
    idx = list(np.unravel_index(o["max_abs_offset"], shape)) if shape else []
    check(res["max_abs_index"] == [int(i) for i in idx],
          "%s: max_abs_index %r == %r" % (name, res["max_abs_index"], idx))
    check(res["n"] == int(np.prod(shape)) and res["shape"] == list(shape),
          "%s: n and shape" % name)
    return res


def raises(exc, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except exc as e:
        return str(e)
    except Exception as e:  # the wrong exception type
        return "WRONG %s: %s" % (type(e).__name__, e)
    return None


# --- the library is the build tree's ---------------------------------------
lib = probe._lib.get()
check(os.path.realpath(lib.path) == os.path.realpath(os.path.join(BUILD, "lib", "libprobe.so")),
      "probe loads the build tree's libprobe (%s)" % lib.path)

# probe.__version__ is CMake's project version
import re  # noqa: E402
SRC = os.environ.get("PROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
want = re.search(r"project\(probe VERSION ([0-9.]+)", open(os.path.join(SRC, "CMakeLists.txt")).read())
check(want is not None and probe.__version__ == want.group(1),
      "probe.__version__ %r is the CMake project version" % probe.__version__)
p = subprocess.run([PY, "-c", "import probe; print(probe.__version__, probe.__file__)"], capture_output=True,
                   text=True, env=dict(os.environ, PYTHONPATH=os.path.join(SRC, "components", "python")))
check(p.returncode == 0 and p.stdout.split()[0] == want.group(1)
      and os.path.realpath(p.stdout.split()[1]).startswith(os.path.realpath(SRC) + os.sep),
      "imported from the source tree, probe.__version__ is the same (%r)" % (p.stdout or p.stderr)[-300:])

# the ctypes structs match the C headers (a field added in C and not here corrupts memory)
csrc = os.path.join(tempfile.mkdtemp(prefix="probe-pymod-abi."), "abi.c")
with open(csrc, "w") as f:
    f.write('#include <stddef.h>\n#include <stdio.h>\n#include "probe/metrics.h"\n#include "probe/gate.h"\n'
            'int main(void) { printf("%zu %zu %zu %zu %zu %zu\\n", sizeof(probe_metrics_opts), '
            'sizeof(probe_metrics), sizeof(probe_gate), sizeof(probe_gate_verdict), '
            'offsetof(probe_gate, headroom), offsetof(probe_metrics, max_abs_ulps_scale)); return 0; }\n')
exe = csrc[:-2]
p = subprocess.run(["cc", "-std=c11", "-I", os.path.join(SRC, "include"), "-o", exe, csrc],
                   capture_output=True, text=True)
check(p.returncode == 0, "the struct layout probe compiles: %s" % p.stderr[-300:])
if p.returncode == 0:
    got = [int(x) for x in subprocess.run([exe], capture_output=True, text=True).stdout.split()]
    L = probe._lib
    want_l = [ctypes.sizeof(L.MetricsOpts), ctypes.sizeof(L.Metrics), ctypes.sizeof(L.Gate),
              ctypes.sizeof(L.GateVerdict), L.Gate.headroom.offset, L.Metrics.max_abs_ulps_scale.offset]
    check(got == want_l, "ctypes MetricsOpts, Metrics, Gate, GateVerdict sizes and last offsets == C's "
          "(C %r, ctypes %r)" % (got, want_l))

g = torch.Generator().manual_seed(1234)

# --- values against the oracle ----------------------------------------------
ref = torch.randn(2, 3, 17, 19, generator=g)
cand = ref + 2e-2 * torch.randn(ref.shape, generator=g)
cand[1, 2, 5, 7] += 0.25
r32 = check_values("float32 perturbed", ref, cand)
check(r32["verdict"] == "fail" and r32["dtype"] == "float32", "float32 perturbed fails T1")

rb = (torch.randn(64, 48, generator=g) * 3).to(torch.bfloat16)
cb = (rb.float() + 0.02 * torch.randn(64, 48, generator=g)).to(torch.bfloat16)
res = check_values("bfloat16", rb, cb)
check(res["dtype"] == "bfloat16" and res["dtype_candidate"] == "bfloat16", "bfloat16 dtypes reported")

rh = torch.randn(5, 7, 9, generator=g).to(torch.float16)
ch = (rh.float() * (1 + 1e-3 * torch.randn(5, 7, 9, generator=g))).to(torch.float16)
res = check_values("float16", rh, ch)
check(res["dtype"] == "float16", "float16 dtype reported")

# mixed: float32 reference, bfloat16 candidate (the candidate's values are its bf16 values)
rm = torch.randn(33, 31, generator=g)
res = check_values("float32 vs bfloat16", rm, rm.to(torch.bfloat16))
check(res["dtype_candidate"] == "bfloat16" and res["rel_l2"] > 0, "mixed dtypes compared as stored")

# numpy arrays: float64, float16, int32; non-contiguous; big-endian
rn = np.random.default_rng(7).standard_normal((40, 25))
cn = rn + np.random.default_rng(8).standard_normal((40, 25)) * 1e-4
check_values("numpy float64", rn, cn)
check_values("numpy float16", rn.astype(np.float16), cn.astype(np.float16))
check_values("numpy int32", (rn * 100).astype(np.int32), (cn * 100).astype(np.int32) + 1)
check_values("numpy transposed (non-contiguous)", rn.T, cn.T)
check_values("numpy big-endian", rn.astype(">f4"), cn.astype(">f8"))
check_values("torch transposed (non-contiguous)", ref[0, 0].t(), cand[0, 0].t())
check_values("torch strided slice", ref[:, ::2, 3:, ::3], cand[:, ::2, 3:, ::3])
rg = ref.clone().requires_grad_(True)
check_values("torch requires_grad", rg, cand)

# atol/rtol overrides change only the element-wise tolerance
res = check_values("atol/rtol override", ref, cand, atol=0.01, rtol=0.0)
check(res["gate"]["atol"] == 0.01 and res["gate"]["rtol"] == 0.0 and res["gate"]["rel_l2_max"] == 1e-2,
      "override keeps the gate's other thresholds")

# --- verdicts ----------------------------------------------------------------
res = probe.assert_parity(ref, ref.clone())
check(res["verdict"] == "pass" and res["identical"] and res["rel_l2"] == 0.0 and res["cosine"] == 1.0,
      "identical tensors pass T1")
small = ref * (1 + 1e-5)
res = probe.assert_parity(ref, small)
check(res["verdict"] == "pass" and not res["identical"], "a 1e-5 relative change passes T1")

msg = raises(AssertionError, probe.assert_parity, ref, cand)
o = oracle(ref, cand, 1e-3, 1e-3)
check(msg is not None and not msg.startswith("WRONG") and "gate T1 failed" in msg,
      "perturbed: AssertionError naming the gate: %r" % (msg or "")[:200])
check(msg is not None and "rel_l2 %.4g > 0.01" % o["rel_l2"] in msg,
      "perturbed: the reason gives rel_l2 %.4g > 0.01" % o["rel_l2"])
check(msg is not None and "mismatch" in msg and "rel_l2=%.6g" % o["rel_l2"] in msg
      and "max_abs=%.6g at [1, 2, 5, 7]" % o["max_abs"] in msg,
      "perturbed: the message carries the metrics and the max_abs index")
# the elements at the max-abs index, in the dict and the message (numpy's values)
flat = int(np.ravel_multi_index([1, 2, 5, 7], tuple(ref.shape)))
rv, cv = float(ref.numpy().ravel()[flat]), float(cand.numpy().ravel()[flat])
check(o["max_abs_offset"] == flat, "the oracle's max-abs element is the one perturbed by 0.25")
res = probe.compare(ref, cand)
check(res["ref_at_max_abs"] == rv and res["cand_at_max_abs"] == cv and abs(cv - rv) == o["max_abs"],
      "ref_at_max_abs / cand_at_max_abs are the elements there (%r, %r)" % (rv, cv))
check(msg is not None and "(reference %r, candidate %r)" % (rv, cv) in msg,
      "the failure message gives the reference and candidate values at the max-abs index")
ri = np.array([[3, 7, -2], [10, 4, 4]], np.int32)
ci = ri.copy()
ci[1, 0] = -5
res = probe.compare(ri, ci)
check(res["max_abs_index"] == [1, 0] and res["ref_at_max_abs"] == 10 and res["cand_at_max_abs"] == -5
      and isinstance(res["ref_at_max_abs"], int), "integer elements at the max-abs index stay ints")
rb2 = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
cb2 = torch.tensor([1.0, 2.0, 3.015625], dtype=torch.bfloat16)
res = probe.compare(rb2, cb2)
check(res["ref_at_max_abs"] == 3.0 and res["cand_at_max_abs"] == 3.015625,
      "bfloat16 elements at the max-abs index are their exact values")
check(probe.compare(np.zeros(0), np.zeros(0))["ref_at_max_abs"] is None, "empty tensors: no element")

# library frames are hidden from pytest's traceback (__tracebackhide__)
try:
    probe.assert_parity(ref, cand)
except AssertionError as e:
    tb, probe_frames, hidden = e.__traceback__, 0, 0
    pkg = os.path.dirname(os.path.abspath(probe.__file__)) + os.sep
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(pkg):
            probe_frames += 1
            hidden += tb.tb_frame.f_locals.get("__tracebackhide__") is True
        tb = tb.tb_next
    check(probe_frames >= 1 and hidden == probe_frames,
          "every probe frame of a failure sets __tracebackhide__ (%d of %d)" % (hidden, probe_frames))
try:
    probe.compare(ref, cand, atol="1e-3")
except TypeError as e:
    tb, probe_frames, hidden = e.__traceback__, 0, 0
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("compare", "_effective_gate", "_tolerance"):
            probe_frames += 1
            hidden += tb.tb_frame.f_locals.get("__tracebackhide__") is True
        tb = tb.tb_next
    check(probe_frames == 3 and hidden == 3, "a bad-argument error hides probe's frames too (%d of %d)"
          % (hidden, probe_frames))

res = probe.compare(ref, cand, gate="T1-relaxed:backend-swap")
check(res["gate"]["name"] == "T1-relaxed:backend-swap" and res["gate"]["rel_l2_max"] == 5e-2,
      "T1-relaxed:backend-swap thresholds")

nan_c = ref.clone()
nan_c[0, 1, 2, 3] = float("nan")
msg = raises(AssertionError, probe.assert_parity, ref, nan_c, gate="T1-relaxed:compile-fusion")
check(msg is not None and not msg.startswith("WRONG") and "nan_cand=1" in msg and "NaN" in msg,
      "NaN in the candidate fails even a relaxed gate: %r" % (msg or "")[:200])
res = probe.compare(ref, nan_c)
o = oracle(ref, nan_c, 1e-3, 1e-3)
check(res["nan_cand"] == 1 and res["mismatch_fraction"] == o["mismatch_fraction"]
      and res["rel_l2"] == 0.0, "NaN index excluded from the norms, counted as a mismatch")

# --- T2 with a calibration file ---------------------------------------------
tmp = tempfile.mkdtemp(prefix="probe-pymod.")
cal = os.path.join(tmp, "cal.json")
with open(cal, "w") as f:
    json.dump({"format": "probe-calibration", "version": 1,
               "components": {"dit.step": {"rel_l2_max": 0.05, "cosine_min": 0.99,
                                           "atol": 0.5, "rtol": 0.5}},
               "tensors": {"/vae.decode/*/out": {"rel_l2_max": 1e-6}}}, f)
lossy = ref + 0.02 * torch.randn(ref.shape, generator=g)
o = oracle(ref, lossy, 0.5, 0.5)
check(0.01 < o["rel_l2"] < 0.05, "T2 test tensor: rel_l2 %.4g between T1's and T2's limits" % o["rel_l2"])
res = probe.assert_parity(ref, lossy, gate="T2", calibration=cal, component="dit.step")
check(res["verdict"] == "pass" and res["gate"]["rel_l2_max"] == 0.05 and res["gate"]["atol"] == 0.5,
      "T2: dit.step thresholds from the calibration file pass a lossy tensor")
check(raises(AssertionError, probe.assert_parity, ref, lossy) is not None, "the same tensor fails T1")
msg = raises(AssertionError, probe.assert_parity, ref, lossy, gate="T2", calibration=cal,
             component="dit.step", path="/vae.decode/0000/out")
check(msg is not None and "rel_l2" in msg and "1e-06" in msg, "T2: a tensors glob wins over the component")
msg = raises(ValueError, probe.assert_parity, ref, lossy, gate="T2", calibration=cal,
             component="text_encoder")
check(msg is not None and not msg.startswith("WRONG")
      and "no T2 thresholds for component 'text_encoder'" in msg and "dit.step" in msg
      and "/vae.decode/*/out" in msg,
      "T2: a component the calibration file lacks is a ValueError naming what it has: %r" % msg)
msg = raises(ValueError, probe.compare, ref, lossy, gate="T2", calibration=cal, component="dit.stpe")
check(msg is not None and not msg.startswith("WRONG") and "'dit.stpe'" in msg,
      "T2: a misspelt component is a ValueError, not a parity failure: %r" % msg)
msg = raises(ValueError, probe.compare, ref, lossy, gate="T2")
check(msg is not None and not msg.startswith("WRONG") and "calibration" in msg, "T2 without calibration: ValueError")
cal_z = os.path.join(tmp, "cal-z.json")
with open(cal_z, "w") as f:
    json.dump({"format": "probe-calibration", "version": 1, "headroom": 1.5,
               "components": {"dit.step": {"rel_l2_max": 0.05, "gain_z_max": 10}}}, f)
scaled = ref * 1.01 + 1e-3 * torch.randn(ref.shape, generator=g)  # a gain error of 1e-2
res = probe.compare(ref, scaled, gate="T2", calibration=cal_z, component="dit.step")
check(res["verdict"] == "fail" and res["gate"]["gain_z_max"] == 10 and "channel_z_max" not in res["gate"]
      and any(x.startswith("systematic gain error 9.9") and x.endswith(
          "> 10 (the feature's own, calibrated with headroom 1.5)") for x in res["reasons"]),
      "T2: gain_z_max from the calibration file fails a gain error (%r)" % res["reasons"])
res = probe.compare(ref, lossy, gate="T2", calibration=cal_z, component="dit.step")
check(res["verdict"] == "pass", "T2: gain_z_max passes noise of no gain (%r)" % res["reasons"])
msg = raises(FileNotFoundError, probe.compare, ref, lossy, gate="T2",
             calibration=os.path.join(tmp, "missing.json"), component="dit.step")
check(msg is not None and not msg.startswith("WRONG") and "missing.json" in msg,
      "T2 with a missing calibration file: FileNotFoundError naming it")

# --- bad input -----------------------------------------------------------------
msg = raises(ValueError, probe.assert_parity, ref, ref[0])
check(msg is not None and not msg.startswith("WRONG") and "shape mismatch" in msg
      and "[2, 3, 17, 19]" in msg and "[3, 17, 19]" in msg, "shape mismatch: ValueError naming both: %r" % msg)
msg = raises(ValueError, probe.assert_parity, ref, ref, gate="T3")
check(msg is not None and not msg.startswith("WRONG") and "T3" in msg, "unknown gate: ValueError: %r" % msg)
msg = raises(ValueError, probe.compare, ref, ref, gate="T1-relaxed:magic")
check(msg is not None and not msg.startswith("WRONG") and "magic" in msg, "unknown cause: ValueError")
msg = raises(ValueError, probe.compare, ref, ref, gate=None)
check(msg is not None and not msg.startswith("WRONG"), "gate=None: ValueError")
msg = raises(TypeError, probe.compare, torch.zeros(3, dtype=torch.complex64), torch.zeros(3, dtype=torch.complex64))
check(msg is not None and not msg.startswith("WRONG") and "complex64" in msg, "complex tensor: TypeError")
msg = raises(TypeError, probe.compare, np.array(["a", "b"]), np.array(["a", "b"]))
check(msg is not None and not msg.startswith("WRONG"), "string array: TypeError")

# tolerances: real numbers only (TypeError), finite and >= 0 (ValueError)
for bad in ("1e-3", b"1e-3", [1e-3], {}, True, torch.tensor(1e-3)):
    msg = raises(TypeError, probe.compare, ref, cand, atol=bad)
    check(msg is not None and not msg.startswith("WRONG") and "atol must be a real number" in msg,
          "atol=%r: TypeError (%r)" % (bad, msg))
msg = raises(TypeError, probe.assert_parity, ref, cand, rtol="0")
check(msg is not None and not msg.startswith("WRONG") and "rtol must be a real number" in msg
      and "str" in msg, "rtol='0': TypeError naming the type (%r)" % msg)
for bad in (-1e-3, float("nan"), float("inf")):
    msg = raises(ValueError, probe.compare, ref, cand, atol=bad)
    check(msg is not None and not msg.startswith("WRONG") and "atol must be finite and >= 0" in msg,
          "atol=%r: ValueError (%r)" % (bad, msg))
res = probe.compare(ref, cand, atol=np.float32(0.5), rtol=1)
check(res["gate"]["atol"] == 0.5 and res["gate"]["rtol"] == 1.0 and isinstance(res["gate"]["atol"], float),
      "numpy and int tolerances are accepted as floats")

# --- integers are never compared through float64 ---------------------------
res = probe.compare(2**53 + 1, 2**53, atol=0, rtol=0)
check(res["dtype"] == "int64" and res["dtype_candidate"] == "int64",
      "Python ints are handed to the C library as int64 (%s/%s)" % (res["dtype"], res["dtype_candidate"]))
check(probe.compare([2**63, 1], [2**63, 1])["dtype"] == "uint64",
      "Python ints above int64 (numpy would make them float64): uint64")
check(probe.compare([True, 2], [True, 2])["dtype"] == "int64", "ints and bools mixed: int64")
check(probe.compare(True, False)["dtype"] == "bool", "Python bools alone: bool")
check(probe.compare([[1, 2], (3, 4)], [[1, 2], [3, 4]])["shape"] == [2, 2], "nested lists of ints: shape kept")
check(probe.compare([1.5, 2], [1.5, 2])["dtype"] == "float64", "a list holding a float: float64, as numpy makes it")
msg = raises(TypeError, probe.compare, [-1, 2**63], [-1, 2**63])
check(msg is not None and not msg.startswith("WRONG") and "int64 and uint64" in msg and "reference" in msg,
      "Python ints that fit neither int64 nor uint64: TypeError (%r)" % msg)
msg = raises(TypeError, probe.compare, 2**64, 2**64)
check(msg is not None and not msg.startswith("WRONG"), "2**64: TypeError, not object or float64")
big = torch.tensor([2**53 + 1, -(2**62) - 3], dtype=torch.int64)
res = probe.compare(big, big - torch.tensor([1, 0]), atol=0, rtol=0)
check(res["dtype"] == "int64" and res["dtype_candidate"] == "int64", "torch int64 tensors stay int64")
res = probe.compare(np.array([2**53 + 1], np.int64), np.array([2**53], np.int64), atol=0, rtol=0)
check(res["dtype"] == "int64", "numpy int64 arrays stay int64")
# 2**53 + 1 against 2**53 at atol = rtol = 0 must fail: the C metrics engine takes the
# difference of 64-bit integers exactly (it would round both to 2**53 through fp64).
check(not res["identical"], "numpy int64 2**53 + 1 vs 2**53: not identical")
msg = raises(AssertionError, probe.assert_parity, 2**53 + 1, 2**53, atol=0, rtol=0)
check(msg is not None and not msg.startswith("WRONG") and "gate T1 failed" in msg,
      "assert_parity(2**53 + 1, 2**53, atol=0, rtol=0) fails with a mismatch: %r" % (msg or "")[:200])
msg = raises(AssertionError, probe.assert_parity, big, big - torch.tensor([1, 0]), atol=0, rtol=0)
check(msg is not None and not msg.startswith("WRONG"), "torch int64 tensors 1 apart at 2**53 fail")

# --- the same C metrics as probe-compare -------------------------------------
ref_h5, cand_h5, out_json = (os.path.join(tmp, n) for n in ("r.h5", "c.h5", "c.json"))
rnp, cnp = ref.numpy(), cand.numpy()
with h5py.File(ref_h5, "w") as f:
    f["/dit.step/0000/out"] = rnp
with h5py.File(cand_h5, "w") as f:
    f["/dit.step/0000/out"] = cnp
p = subprocess.run([os.path.join(BUILD, "bin", "probe-compare"), "--json", out_json, ref_h5, cand_h5],
                   capture_output=True, text=True)
check(p.returncode == 1, "probe-compare on the perturbed pair exits 1 (%d %s)" % (p.returncode, p.stderr))
t = json.load(open(out_json))["tensors"][0]
res = probe.compare(ref, cand)
for k in ("rel_l2", "cosine", "max_abs", "p99_abs", "mean_abs", "mismatch_fraction", "max_abs_index"):
    check(res[k] == t[k], "probe.compare %s == probe-compare's %s (bit for bit)" % (k, k))
check(res["reasons"] == t["reasons"], "same reasons as probe-compare: %r" % res["reasons"])

# --- from an installed prefix ---------------------------------------------------
prefix = os.path.join(tmp, "prefix")
p = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], capture_output=True, text=True)
check(p.returncode == 0, "cmake --install: %s" % p.stderr[-300:])
pkgdir = os.path.join(prefix, "share", "probe", "python")
check(os.path.isfile(os.path.join(pkgdir, "probe", "__init__.py")), "probe module installed in share/probe/python")
script = r"""
import json, sys, numpy as np, torch, probe, probe._lib
r = torch.arange(1, 7, dtype=torch.float32).reshape(2, 3)
c = r.clone(); c[1, 2] = 7
res = probe.compare(r, c)
print(json.dumps({"lib": probe._lib.get().path, "rel_l2": res["rel_l2"], "max_abs": res["max_abs"],
                  "index": res["max_abs_index"], "verdict": res["verdict"]}))
"""
env = dict(os.environ, PYTHONPATH=pkgdir)
env.pop("PROBE_LIBPROBE", None)
p = subprocess.run([PY, "-c", script], capture_output=True, text=True, env=env, cwd=tmp)
check(p.returncode == 0, "installed module runs: %s" % p.stderr[-400:])
if p.returncode == 0:
    out = json.loads(p.stdout)
    check(os.path.realpath(out["lib"]).startswith(os.path.realpath(prefix) + os.sep),
          "installed module loads the prefix's libprobe (%s)" % out["lib"])
    check(close(out["rel_l2"], 1.0 / math.sqrt(91.0)) and out["max_abs"] == 1.0 and out["index"] == [1, 2]
          and out["verdict"] == "fail", "installed module's values: %r" % out)
# PROBE_LIBPROBE overrides the search; a wrong one is an OSError naming it
env["PROBE_LIBPROBE"] = os.path.join(tmp, "nowhere", "libprobe.so")
p = subprocess.run([PY, "-c", script], capture_output=True, text=True, env=env, cwd=tmp)
check(p.returncode != 0 and "OSError" in p.stderr and "nowhere" in p.stderr,
      "PROBE_LIBPROBE pointing nowhere: OSError naming it")

import shutil  # noqa: E402
shutil.rmtree(tmp, ignore_errors=True)
print("test_python_module: %d failed" % len(failures))
sys.exit(1 if failures else 0)
