"""probe-compare --device cuda against the CPU engine on the same files (run
on a CUDA machine; needs h5py and numpy).

    python3 tests/gpu/compare_device.py BUILD_DIR [WORKDIR]

Writes pairs of HDF5 files (float32, float16, float64 with extreme
magnitudes, int32 vs float32, a 5-D tensor with a channel bias, a 2^27
float32 pair, NaN/Inf at known places), runs `probe-compare --json` on the
CPU and with `--device cuda`, and checks that the two agree as docs/device.md
states: counts (nan_ref_only included), identical, max_abs and its index,
p99_abs, mismatch_ulps_max, the verdicts and the systematic test's outcome
(gain_fail, channel_fail, its channel) bit-equal; rel_l2, cosine, mean_abs
and the channel shift within 1e-12 relative, gain, gain_se, gain_z and the
channel's shift within 1e-9 relative, its z within 1e-8 relative. Prints one
PASS/FAIL line per check, the wall time of both, and exits 1 on a failure.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

build = sys.argv[1]
work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="probe-cmpdev-")
os.makedirs(work, exist_ok=True)
compare = os.path.join(build, "bin", "probe-compare")
fails = 0


def check(ok, what):
    global fails
    print(("PASS " if ok else "FAIL ") + what)
    fails += not ok


def write(name, tensors):
    p = os.path.join(work, name)
    with h5py.File(p, "w") as f:
        for path, a in tensors.items():
            f.create_dataset(path, data=a)
    return p


rng = np.random.default_rng(0)
cases = {}
r = rng.standard_normal((4, 257, 129)).astype(np.float32)
cases["/f32/0000/out"] = (r, (r + np.float32(1e-3) * rng.standard_normal(r.shape, dtype=np.float32)))
h = rng.standard_normal((1000, 33)).astype(np.float16)
cases["/f16/0000/out"] = (h, (h.astype(np.float32) * np.float32(1.001)).astype(np.float16))
x = rng.standard_normal(50000) * 1e300
cases["/f64big/0000/out"] = (x, x * (1 + 1e-9 * rng.standard_normal(50000)))
i = rng.integers(-1000, 1000, 77777).astype(np.int32)
cases["/mixed/0000/out"] = (i, i.astype(np.float32) + np.float32(0.25))
v = rng.standard_normal((2, 16, 3, 33, 35)).astype(np.float32)
w = v + np.float32(1e-3) * rng.standard_normal(v.shape, dtype=np.float32)
w[:, 5] += np.float32(0.03)
cases["/dit.step/0000/out.sample"] = (v, w)
nf = rng.standard_normal(100003).astype(np.float32)
nc = nf.copy()
nc[[3, 50, 999]] = [np.nan, np.inf, -np.inf]
nf[[50, 7]] = [np.inf, np.nan]
cases["/nonfinite/0000/out"] = (nf, nc)
same = rng.standard_normal(300000).astype(np.float32)
cases["/same/0000/out"] = (same, same.copy())
# int64 beyond 2^53 (exact differences), -0 against +0 (not identical), NaN
# in the reference only, a gain error of 1e-3 under noise
big = (np.int64(1) << 62) + rng.integers(0, 1000, 20000)
cases["/int64/0000/out"] = (big, big + rng.integers(-2, 3, 20000))
z = np.zeros(1000, np.float32)
zc = z.copy()
zc[17] = -0.0
cases["/signed-zero/0000/out"] = (z, zc)
nr = rng.standard_normal(5000).astype(np.float32)
nr[[1, 2, 3]] = np.nan
cases["/nan-ref/0000/out"] = (nr, rng.standard_normal(5000).astype(np.float32))
gr = rng.standard_normal((8, 4096)).astype(np.float32)
cases["/gain/0000/out"] = (gr, gr * np.float32(1.001) + np.float32(1e-3) * rng.standard_normal(gr.shape, dtype=np.float32))
ref = write("ref.h5", {k: a for k, (a, b) in cases.items()})
cand = write("cand.h5", {k: b for k, (a, b) in cases.items()})

big_n = 1 << 27
g = np.random.default_rng(1)
br = g.standard_normal(big_n, dtype=np.float32)
bc = br + np.float32(1e-3) * g.standard_normal(big_n, dtype=np.float32)
bref = write("big_ref.h5", {"/big/0000/out": br})
bcand = write("big_cand.h5", {"/big/0000/out": bc})
del br, bc


def run(*args):
    t = time.perf_counter()
    p = subprocess.run([compare, "--quiet", "--json", "-", *args], capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode not in (0, 1):
        print(p.stderr)
        return None, dt
    return {t["path"]: t for t in json.loads(p.stdout)["tensors"]}, dt


EXACT = ["n", "nan_ref", "nan_cand", "inf_ref", "inf_cand", "identical", "zero_norm_reference",
         "max_abs", "max_abs_index", "p99_abs", "mismatch_count", "channel_axis",
         "channel_shift_argmax", "verdict", "nan_ref_only", "mismatch_ulps_max"]
CLOSE = ["rel_l2", "cosine", "mean_abs", "channel_shift_max", "channel_shift_max_rel"]
SYS_EXACT = ["gain_fail", "channels", "channel", "channel_fail"]
SYS_CLOSE = [("gain", 1e-9), ("gain_se", 1e-9), ("gain_z", 1e-9), ("channel_shift", 1e-9),
             ("channel_z", 1e-8)]


def near(x, y, tol):
    if x is None or y is None or isinstance(x, str) or isinstance(y, str):
        return x == y
    return x == y or abs(x - y) <= tol * max(abs(x), abs(y), 1e-300)


def agree(a, b, path):
    for k in EXACT:
        check(a.get(k) == b.get(k), f"{path}: {k} equal ({a.get(k)!r})")
    for k in CLOSE:
        x, y = a.get(k), b.get(k)
        check(near(x, y, 1e-12), f"{path}: {k} {x!r} vs {y!r} (1e-12 rel)")
    sa, sb = a.get("systematic") or {}, b.get("systematic") or {}
    for k in SYS_EXACT:
        check(sa.get(k) == sb.get(k), f"{path}: systematic.{k} equal ({sa.get(k)!r})")
    for k, tol in SYS_CLOSE:
        x, y = sa.get(k), sb.get(k)
        check(near(x, y, tol), f"{path}: systematic.{k} {x!r} vs {y!r} ({tol:g} rel)")


for (rf, cf) in ((ref, cand), (bref, bcand)):
    cpu, t_cpu = run(rf, cf)
    gpu, t_gpu = run("--device", "cuda", rf, cf)
    check(cpu is not None and gpu is not None, f"{os.path.basename(rf)}: both ran")
    if cpu and gpu:
        check(sorted(cpu) == sorted(gpu), "same tensors")
        for path in cpu:
            agree(cpu[path], gpu[path], path)
    print(f"time {os.path.basename(rf)}: cpu {t_cpu:.2f} s, --device cuda {t_gpu:.2f} s (wall, incl. file reads)")

print(f"compare_device: {'FAIL' if fails else 'PASS'} ({fails} failure(s))")
sys.exit(1 if fails else 0)
