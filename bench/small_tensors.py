#!/usr/bin/env python3
"""bench/small_tensors.py - many tiny host tensors: a run's wall time under
probe-run against the same run without it, and probe-compare on a file of
35k small tensors, in the default layout and with --pack-small, in one run.

    bench/small_tensors.py [--build-dir build] [--calls N] [--compare-calls M]
                           [--reps R] [--pack BYTES] [--python PY] [--dir DIR]

The run: a tiny torch module (Linear(4, 4) + tanh on a 1 x 4 float32 tensor)
called N times (default 10000) in a loop; `--tap tiny=tiny:Tiny.forward`
makes every call a component call with two captured tensors (in.x, out).
Each variant runs in a fresh process, R rounds (default 3) interleaved:
A plain `python tiny.py`, B `probe-run` (default layout), C `probe-run
--pack-small BYTES` (default 4096). The wall time is the whole process,
start to exit (the writer's drain at exit included). Prints medians, B/A and
C/A (goal <= 2), and the capture's bytes per tensor.

The compare: a capture of M calls (default 17500: 35000 tensors) in each
layout, compared with a copy of itself, R rounds each of `probe-compare
--quiet` (the verdict on stdout) and of `probe-compare --quiet --json`
(which adds writing ~50 MB of JSON); prints the medians, the ratio of the
first, and whether the two layouts give the same JSON (they must; the runs'
pid and start and end times aside). The machine's CPU count is printed beside the numbers.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TINY = r"""
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))
"""

MAIN = r"""
import sys
import torch
from tiny import Tiny

torch.manual_seed(0)
torch.set_num_threads(1)
m = Tiny()
x = torch.randn(1, 4)
with torch.no_grad():
    for _ in range(int(sys.argv[1])):
        x = m(x)
print("%.6f" % float(x.sum()))
"""


RUN_IDENTITY = ("pid", "start_time", "end_time")  # differ between any two runs


def without_run_identity(v):
    if isinstance(v, dict):
        return {k: without_run_identity(x) for k, x in v.items() if k not in RUN_IDENTITY}
    if isinstance(v, list):
        return [without_run_identity(x) for x in v]
    return v


def wall(argv, cwd, env):
    t = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(argv), p.stderr))
    return dt, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--build-dir", default=os.environ.get("PROBE_BUILD_DIR", "build"))
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--compare-calls", type=int, default=17500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pack", type=int, default=4096, help="--pack-small BYTES")
    ap.add_argument("--python", default=os.environ.get("PROBE_PYTHON", "/usr/bin/python3"),
                    help="interpreter with torch")
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed)")
    a = ap.parse_args()
    run = os.path.abspath(os.path.join(a.build_dir, "bin", "probe-run"))
    compare = os.path.abspath(os.path.join(a.build_dir, "bin", "probe-compare"))
    for tool in (run, compare):
        if not os.access(tool, os.X_OK):
            sys.exit("no %s (build first, or --build-dir)" % tool)
    tmp = a.dir or tempfile.mkdtemp(prefix="probe-small-")
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    try:
        for name, text in (("tiny.py", TINY), ("main.py", MAIN)):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        tap = ["--tap", "tiny=tiny:Tiny.forward"]
        variants = {
            "plain": lambda out, n: [a.python, "main.py", str(n)],
            "probe-run": lambda out, n: [run, "--out", out, "--force", *tap, "--", a.python, "main.py",
                                         str(n)],
            "probe-run --pack-small %d" % a.pack: lambda out, n: [
                run, "--out", out, "--force", "--pack-small", str(a.pack), *tap, "--", a.python,
                "main.py", str(n)],
        }
        names = list(variants)
        times = {k: [] for k in names}
        sizes, outputs = {}, {}
        wall(variants["plain"](None, 10), tmp, env)  # warm the page cache (torch's import)
        for _ in range(a.reps):
            for i, k in enumerate(names):
                out = os.path.join(tmp, "run%d.h5" % i)
                dt, stdout = wall(variants[k](out, a.calls), tmp, env)
                times[k].append(dt)
                outputs[k] = stdout
                if i > 0:
                    sizes[k] = os.path.getsize(out)
        if len(set(outputs.values())) != 1:
            print("WARNING: the runs printed different results: %r" % outputs)
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med["plain"]
        ntensors = 2 * a.calls
        print("run: %d calls of a tiny torch module, %d captured tensors of 16 bytes; %d CPUs; "
              "median of %d" % (a.calls, ntensors, os.cpu_count(), a.reps))
        print("%-30s%10s%10s%16s" % ("", "wall s", "x plain", "bytes/tensor"))
        for k in names:
            per = "%16.0f" % (sizes[k] / ntensors) if k in sizes else "%16s" % "-"
            print("%-30s%10.2f%10.2f%s" % (k, med[k], med[k] / base, per))

        # compare: one capture per layout, against a copy of itself
        cmp_t, jsons, counts = {}, {}, {}
        for i, k in enumerate(names[1:]):
            d = os.path.join(tmp, "cmp%d" % i)
            os.makedirs(d, exist_ok=True)
            ref = os.path.join(d, "ref.h5")
            wall(variants[k](ref, a.compare_calls), tmp, env)
            shutil.copyfile(ref, os.path.join(d, "cand.h5"))
            counts[k] = os.path.getsize(ref)
            for mode, argv in (("text", [compare, "--quiet", "ref.h5", "cand.h5"]),
                               ("json", [compare, "--quiet", "--json", "out.json", "ref.h5", "cand.h5"])):
                wall_c = []
                for _ in range(a.reps):
                    t = time.perf_counter()
                    p = subprocess.run(argv, cwd=d, capture_output=True, text=True)
                    wall_c.append(time.perf_counter() - t)
                    if p.returncode not in (0, 1):
                        sys.exit("probe-compare failed (%d): %s" % (p.returncode, p.stderr))
                cmp_t[k, mode] = statistics.median(wall_c)
            with open(os.path.join(d, "out.json")) as f:
                jsons[k] = json.dumps(without_run_identity(json.load(f)), sort_keys=True)
        n = 2 * a.compare_calls
        print("compare: %d tensors per file, the file against a copy of itself; median of %d" % (n, a.reps))
        print("%-30s%10s%10s%12s%16s" % ("", "wall s", "x default", "--json s", "bytes/tensor"))
        first = names[1]
        for k in names[1:]:
            print("%-30s%10.2f%10.2f%12.2f%16.0f" % (k, cmp_t[k, "text"], cmp_t[k, "text"] / cmp_t[first, "text"],
                                                     cmp_t[k, "json"], counts[k] / n))
        same = len(set(jsons.values())) == 1
        print("goals: run <= 2x plain: %s; compare <= 1.5 s: %s; same JSON in both layouts: %s"
              % ("met" if med[names[2]] / base <= 2 else "NOT met",
                 "met" if cmp_t[names[2], "text"] <= 1.5 else "NOT met", "yes" if same else "NO"))
        return 0 if same else 1
    finally:
        if not a.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
