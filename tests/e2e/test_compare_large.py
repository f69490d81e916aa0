"""probe-compare on a pair of 2 GiB datasets (2^29 float32 elements each) in
bounded memory: peak resident memory under 256 MiB, and every metric equal
to its value derived exactly from the construction (Python fractions of the
class counts), not from a second implementation.

Data: r[i] = 1, c[i] = 1 + k(i) 2^-20 with k(i) = i mod 1000 (exact in
float32), so |c - r| = k 2^-20 exactly and each class k holds
n // 1000 + (k < n % 1000) elements.

Needs ~4.3 GB of free disk next to the temporary directory; with less it
says so and exits 77 (ctest: skipped)."""
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from fractions import Fraction

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
N = 1 << 29
K = 1000
STEP = Fraction(1, 1 << 20)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def write(path, cand):
    with h5py.File(path, "w") as f:
        d = f.create_dataset("/dit.step/0000/out", shape=(N,), dtype="<f4")
        block = 1 << 24  # a multiple of 1000? no: k follows the global index
        for o in range(0, N, block):
            if cand:
                k = (np.arange(o, o + block, dtype=np.int64) % K).astype(np.float32)
                d[o:o + block] = np.float32(1) + k * np.float32(2.0 ** -20)
            else:
                d[o:o + block] = np.ones(block, np.float32)


def expected():
    counts = [N // K + (k < N % K) for k in range(K)]
    s_d = sum(cnt * k for k, cnt in enumerate(counts)) * STEP
    s_dd = sum(cnt * k * k for k, cnt in enumerate(counts)) * STEP * STEP
    s_c = N + s_d                      # sum of c (r = 1)
    s_cc = N + 2 * s_d + s_dd          # sum of c^2
    rank = math.ceil(Fraction(99, 100) * N)
    below = 0
    for k, cnt in enumerate(counts):
        if below + cnt >= rank:
            p99 = float(k * STEP)
            break
        below += cnt
    return {
        "rel_l2": math.sqrt(s_dd / N),                       # ||r|| = sqrt(N)
        "cosine": float(s_c) / math.sqrt(N * float(s_cc)),
        "max_abs": float((K - 1) * STEP),
        "max_abs_index": [K - 1],
        "p99_abs": p99,
        "mean_abs": float(s_d / N),
    }


def main():
    tmp = tempfile.mkdtemp(prefix="probe-large-")
    try:
        free = shutil.disk_usage(tmp).free
        if free < 5 * (1 << 30):
            print(f"SKIP: {free / 2**30:.1f} GiB free in {tmp}, the pair needs 4.3 GB")
            return 77
        ref, cand = os.path.join(tmp, "ref.h5"), os.path.join(tmp, "cand.h5")
        write(ref, False)
        write(cand, True)
        check(os.path.getsize(ref) >= 2 * (1 << 30), f"reference dataset is 2 GiB ({os.path.getsize(ref)} bytes)")

        out = os.path.join(tmp, "out.json")
        # Peak RSS from a small parent: a child's ru_maxrss starts at its
        # parent's resident size at fork (Linux copies the high-water mark
        # across fork and exec), so this process (numpy, h5py) must not fork
        # the measured one. The small parent's own ~10 MiB make it an upper
        # bound.
        meter = ("import resource, subprocess, sys\n"
                 "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
                 "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
                 "print(ru.ru_maxrss, ru.ru_utime, ru.ru_stime, p.returncode)\n"
                 "sys.stderr.write(p.stderr)\n")
        p = subprocess.run([sys.executable, "-S", "-c", meter, COMPARE, "--quiet", "--json", out, ref, cand],
                           capture_output=True, text=True)
        se = p.stderr
        maxrss, ut, st, rc = p.stdout.split()
        rss_mib = int(maxrss) / 1024.0
        print(f"probe-compare: exit {rc}, peak RSS {rss_mib:.1f} MiB, user {float(ut):.2f} s, sys {float(st):.2f} s")
        check(os.path.exists(out), f"compare wrote its JSON ({se.strip()!r})")
        if "libasan" in os.environ.get("LD_PRELOAD", ""):
            print(f"note: peak RSS not asserted in a sanitizer build (shadow memory counts)")
        else:
            check(rss_mib < 256, f"peak resident memory {rss_mib:.1f} MiB < 256 MiB")
        if not os.path.exists(out):
            return 1
        t = json.load(open(out))["tensors"][0]
        e = expected()
        check(t["n"] == N, f"n = {t['n']}")
        for key in ("max_abs", "max_abs_index", "p99_abs"):
            check(t[key] == e[key], f"{key} {t[key]!r} == {e[key]!r} (exact)")
        for key in ("rel_l2", "cosine", "mean_abs"):
            check(abs(t[key] - e[key]) <= 1e-13 * abs(e[key]), f"{key} {t[key]!r} vs {e[key]!r} (1e-13 rel)")
        check(t["channel_axis"] is None, "rank 1: no channel axis")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
