#!/usr/bin/env python3
"""bench/compare_cpu.py - probe-compare against what a user runs today,
h5py + numpy, on the same pair of 1 GiB files, in one run.

    bench/compare_cpu.py [--build-dir build] [--dir DIR] [--n ELEMENTS] [--keep]

The pair: two float32 datasets of n elements (default 2^28: 1 GiB each),
reference r ~ N(0, 1), candidate c = r + 1e-3 N(0, 1). Baseline (as a user
writes it): read both with h5py, convert to float64, then
np.linalg.norm(c - r) / np.linalg.norm(r), np.dot(r, c) / (|r| |c|),
np.abs(c - r).max() and np.percentile(np.abs(c - r), 99,
method="inverted_cdf"). probe: `probe-compare --json`. Each runs in a fresh
process started from a small parent (a child's peak RSS starts at its
parent's size on Linux), after one untimed read of both files so both find
them in the page cache. Prints wall time, peak RSS, the ratios, and whether
the two agree (max and p99 must be equal, rel_l2 and cosine close).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

METER = r"""
import resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
dt = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(repr((dt, ru.ru_maxrss, p.returncode, p.stdout, p.stderr)))
"""

BASELINE = r"""
import sys, h5py, numpy as np
ref, cand, path = sys.argv[1:4]
with h5py.File(ref, "r") as f:
    r = f[path][...].astype(np.float64)
with h5py.File(cand, "r") as f:
    c = f[path][...].astype(np.float64)
nr, nc = np.linalg.norm(r), np.linalg.norm(c)
d = np.abs(c - r)
print(repr({"rel_l2": float(np.linalg.norm(c - r) / nr), "cosine": float(np.dot(r, c) / (nr * nc)),
            "max_abs": float(d.max()), "p99_abs": float(np.percentile(d, 99, method="inverted_cdf"))}))
"""

MAKE = r"""
import sys, h5py, numpy as np
n, ref, cand, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
with h5py.File(ref, "w") as fr, h5py.File(cand, "w") as fc:
    dr = fr.create_dataset(path, shape=(n,), dtype="<f4")
    dc = fc.create_dataset(path, shape=(n,), dtype="<f4")
    step = 1 << 24
    for o in range(0, n, step):
        m = min(step, n - o)
        g = np.random.default_rng(o)
        r = g.standard_normal(m, dtype=np.float32)
        dr[o:o + m] = r
        dc[o:o + m] = r + np.float32(1e-3) * g.standard_normal(m, dtype=np.float32)
"""


def measured(argv):
    out = subprocess.run([sys.executable, "-S", "-c", METER, *argv], capture_output=True, text=True,
                         check=True).stdout
    return eval(out)  # noqa: S307 - our own repr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--build-dir", default=os.environ.get("PROBE_BUILD_DIR", "build"))
    ap.add_argument("--dir", default=None, help="where the pair goes (default: a temporary folder)")
    ap.add_argument("--n", type=int, default=1 << 28)
    ap.add_argument("--keep", action="store_true", help="keep the files")
    ap.add_argument("--python", default=sys.executable, help="interpreter with h5py and numpy")
    a = ap.parse_args()
    compare = os.path.join(a.build_dir, "bin", "probe-compare")
    tmp = a.dir or tempfile.mkdtemp(prefix="probe-bench-")
    os.makedirs(tmp, exist_ok=True)
    ref, cand, path = os.path.join(tmp, "ref.h5"), os.path.join(tmp, "cand.h5"), "/dit.step/0000/out"
    try:
        if not (os.path.exists(ref) and os.path.exists(cand)):
            subprocess.run([a.python, "-c", MAKE, str(a.n), ref, cand, path], check=True)
        for p in (ref, cand):  # page cache: both sides start warm
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass
        gib = (os.path.getsize(ref) + os.path.getsize(cand)) / 2**30
        dt_np, rss_np, rc, out, err = measured([a.python, "-c", BASELINE, ref, cand, path])
        if rc != 0:
            sys.exit(f"baseline failed: {err}")
        base = eval(out)  # noqa: S307
        dt_pr, rss_pr, rc, out, err = measured([compare, "--quiet", "--json", "-", ref, cand])
        if rc not in (0, 1):
            sys.exit(f"probe-compare failed: {err}")
        t = json.loads(out)["tensors"][0]
        print(f"pair: 2 x float32 [{a.n}], {gib:.2f} GiB in all, {os.cpu_count()} CPUs")
        print(f"{'':24}{'wall s':>10}{'peak RSS MiB':>15}")
        print(f"{'h5py + numpy':24}{dt_np:10.2f}{rss_np / 1024:15.1f}")
        print(f"{'probe-compare':24}{dt_pr:10.2f}{rss_pr / 1024:15.1f}")
        print(f"speed: probe {dt_np / dt_pr:.1f}x faster (goal >= 5x); "
              f"memory: probe uses {rss_pr / rss_np:.4f} of numpy's peak (goal <= 0.25)")
        same = t["max_abs"] == base["max_abs"] and t["p99_abs"] == base["p99_abs"]
        print(f"agreement: max_abs and p99_abs {'equal' if same else 'DIFFER'}; "
              f"rel_l2 {t['rel_l2']!r} vs {base['rel_l2']!r}; cosine {t['cosine']!r} vs {base['cosine']!r}")
        return 0 if same else 1
    finally:
        if not a.keep and not a.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
