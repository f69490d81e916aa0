#!/usr/bin/env python3
"""probe_inject_v1 into device memory on a CPU, against the mock CUDA runtime
(tests/fakes/mock_cudart.c, built here as libcudart.so.13 and loaded the way
torch loads its runtime; "device memory" is host memory and every stream
runs through one FIFO worker, so copies really are asynchronous).

Checked, against the reference values computed here:
- a device tensor behind a 300 ms "kernel" on the producer stream: the
  injection returns at once (the pinned buffer is not waited for), and once
  the stream drains the tensor holds the reference's values, not the
  kernel's (the host-to-device copy is ordered after the kernel, on the
  producer's stream), for float32 and bfloat16 (raw bits) and on the legacy
  stream (NULL);
- exactly one host-to-device copy per injection, and nothing synchronizes
  (no cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize /
  cudaFreeHost / cudaMalloc, no rule violation counted by the mock);
- a non-contiguous device tensor is refused (error naming the path), and so
  is a producer stream that is capturing a CUDA graph (nothing enqueued);
  either stops the injection and the manifest says "failed".
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import BUILD, SOURCE, check, finish, need_build, probe_lines, tmpdir  # noqa: E402
from test_shim_cuda_mock import build_mock  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402

PY = os.environ.get("PROBE_PYTHON") or sys.executable

PROG = r'''
import ctypes, json, os, sys, time
import numpy as np
sys.path.insert(0, os.environ["PYTHONPATH"].split(":")[0])
from probe_adapter import _abi
mode, mock = sys.argv[1], sys.argv[2]
cuda = ctypes.CDLL(mock, mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(None)
for f in (lib.probe_tap_v1, lib.probe_inject_v1):
    f.argtypes = [ctypes.POINTER(_abi.ProbeTapTensorV1)]
    f.restype = ctypes.c_int

def desc(slot, arr, code, device=-1, stream=None, strides=None):
    shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
    st = strides or [s // arr.itemsize for s in arr.strides]
    return _abi.ProbeTapTensorV1(struct_size=ctypes.sizeof(_abi.ProbeTapTensorV1), abi_version=1,
        component=b"dev", slot=slot.encode(), call=0, step=-1, cfg_branch=-1, device=device,
        dtype=code, rank=arr.ndim, shape=shape, strides=(ctypes.c_int64 * arr.ndim)(*st),
        data=arr.ctypes.data, stream=stream, timestep=float("nan"))

rng = np.random.default_rng(5)
a = rng.standard_normal((64, 33)).astype(np.float32)
b = rng.integers(0, 65535, size=(7, 9), dtype=np.uint16)   # bfloat16 bits
c = rng.standard_normal(1000).astype(np.float32)
nc = rng.standard_normal((4, 6)).astype(np.float32)
if mode == "write":
    for slot, arr, code in (("out.a", a, 12), ("out.b", b, 11), ("out.c", c, 12), ("out.nc", nc, 12)):
        assert lib.probe_tap_v1(ctypes.byref(desc(slot, arr, code))) == 0
    sys.exit(0)

stream = ctypes.c_void_p()
assert cuda.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) == 0
res = {}
# float32 behind a 300 ms kernel that writes 7.0 everywhere at its end
da = np.zeros_like(a)
sevens = np.full_like(a, 7.0)
cuda.mock_cuda_spin(stream, 300, da.ctypes.data_as(ctypes.c_void_p), sevens.ctypes.data_as(ctypes.c_void_p),
                    ctypes.c_size_t(sevens.nbytes))
t0 = time.monotonic()
res["rc_a"] = lib.probe_inject_v1(ctypes.byref(desc("out.a", da, 12, 0, stream)))
res["inject_ms"] = (time.monotonic() - t0) * 1e3
db = np.zeros_like(b)
res["rc_b"] = lib.probe_inject_v1(ctypes.byref(desc("out.b", db, 11, 0, stream)))
dc = np.zeros_like(c)
res["rc_c"] = lib.probe_inject_v1(ctypes.byref(desc("out.c", dc, 12, 0, None)))  # legacy stream
time.sleep(0.8)
res["a_ok"] = bool(np.array_equal(da, a))
res["b_ok"] = bool(np.array_equal(db, b))
res["c_ok"] = bool(np.array_equal(dc, c))
if sys.argv[3] == "capturing":
    dn = np.zeros_like(nc)
    cuda.mock_cuda_capture(stream, 1)
    res["rc_cap"] = lib.probe_inject_v1(ctypes.byref(desc("out.nc", dn, 12, 0, stream)))
    cuda.mock_cuda_capture(stream, 0)
    res["nc_untouched"] = bool(np.all(dn == 0))
else:
    big = np.zeros((6, 4), dtype=np.float32)
    res["rc_nc"] = lib.probe_inject_v1(ctypes.byref(desc("out.nc", big.T, 12, 0, stream)))
stats = (ctypes.c_longlong * 15)()
cuda.mock_cuda_stats(stats, 15)
names = ["hostalloc", "freehost", "streamsync", "devicesync", "malloc", "memcpy_async", "event_sync",
         "violation", "sync_on_tapper", "exchange", "setdevice", "streams", "events", "record", "wait"]
res["stats"] = dict(zip(names, list(stats)))
print("RESULT " + json.dumps(res))
'''


def main():
    need_build()
    d = tmpdir("probe-inject-cudamock-")
    lib = build_mock(d)
    prog = os.path.join(d, "prog.py")
    with open(prog, "w") as fh:
        fh.write(PROG)
    run = os.path.join(BUILD, "bin", "probe-run")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE_") or k in
           ("PROBE_BUILD_DIR", "PROBE_SOURCE_DIR", "PROBE_PYTHON")}
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"  # the mock never frees
    ref = os.path.join(d, "ref.h5")
    p = subprocess.run([run, "--out", ref, "--", PY, prog, "write", lib, "-"], env=env,
                       capture_output=True, text=True, timeout=120)
    print(p.stdout, p.stderr)
    check(p.returncode == 0, "reference written (host taps)")
    for case in ("strided", "capturing"):
        out = os.path.join(d, case + ".h5")
        p = subprocess.run([run, "--out", out, "--inject", ref + ":/dev/*", "--", PY, prog, "inject", lib, case],
                           env=env, capture_output=True, text=True, timeout=120)
        print(p.stdout, p.stderr)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not check(p.returncode == 0 and line, "%s: the program ran (rc %d)" % (case, p.returncode)):
            continue
        r = json.loads(line[0][7:])
        st = r["stats"]
        check(r["rc_a"] == 1 and r["rc_b"] == 1 and r["rc_c"] == 1, "%s: three device injections done" % case)
        check(r["inject_ms"] < 200, "%s: injecting behind a 300 ms kernel returned in %.1f ms (no wait)"
              % (case, r["inject_ms"]))
        check(r["a_ok"] and r["b_ok"] and r["c_ok"],
              "%s: float32, bfloat16 bits and a legacy-stream tensor hold the reference's values after the "
              "kernel (stream order)" % case)
        check(st["violation"] == 0 and st["streamsync"] == 0 and st["devicesync"] == 0 and st["freehost"] == 0
              and st["malloc"] == 0 and st["event_sync"] == 0,
              "%s: nothing synchronizes, no rule violation (%s)" % (case, st))
        check(st["memcpy_async"] == 3, "%s: exactly 3 host-to-device copies enqueued (%d)" % (case, st["memcpy_async"]))
        with h5py.File(out, "r") as f:
            m = json.loads(f.attrs["probe.manifest"])["inject"]
        lines = probe_lines(p.stderr)
        if case == "strided":
            check(r["rc_nc"] == -1 and m["status"] == "failed" and "/dev/0000/out.nc: a non-contiguous device tensor"
                  in m["error"] and len(lines) == 1, "strided: a non-contiguous device tensor is refused, named (%s)"
                  % m["error"])
        else:
            check(r["rc_cap"] == -1 and r["nc_untouched"] and m["status"] == "failed"
                  and "capturing a CUDA graph" in m["error"] and len(lines) == 1,
                  "capturing: a stream capturing a CUDA graph gets nothing, the injection fails (%s)" % m["error"])
        check([e["path"] for e in m["tensors"]] == ["/dev/0000/out.a", "/dev/0000/out.b", "/dev/0000/out.c"],
              "%s: the manifest lists the three injected paths" % case)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
