"""Concurrent taps and back-pressure.

1. 8 threads x 200 taps (half of them transposed) with the default queue:
   every tensor present, every value equal to the formula the program used
   (recomputed here), seq unique over all 1600, per-thread NVTX scope right,
   and within a thread seq increases with the call index.
2. 4 threads x 40 taps of 272 KiB with PROBE_QUEUE_MB=1: the tapping threads
   must wait for the writer (manifest queue_waits.count > 0) and still every
   tensor is present and correct.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import attr_str, check, finish, need_build, preload_env, program, run, tmpdir  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402


def expected(t, i, rows):
    k = np.arange(rows * 17, dtype=np.int64).reshape(rows, 17)
    return (t * 1000003 + i * 1009 + k).astype(np.int32)


def verify(out, nthreads, taps, rows_arg, label):
    ok_values = ok_scope = ok_order = True
    missing = 0
    seqs = []
    with h5py.File(out, "r") as f:
        for t in range(nthreads):
            last = -1
            for i in range(taps):
                p = "/thr%d/%04d/out" % (t, i)
                if p not in f:
                    missing += 1
                    continue
                ds = f[p]
                rows = rows_arg if rows_arg else 1 + (t + i) % 7
                if not np.array_equal(ds[()], expected(t, i, rows)):
                    ok_values = False
                    print("value mismatch at", p)
                if attr_str(ds, "probe.scope") != "thread %d" % t:
                    ok_scope = False
                    print("scope mismatch at", p, attr_str(ds, "probe.scope"))
                s = int(ds.attrs["probe.seq"])
                seqs.append(s)
                if s <= last:
                    ok_order = False
                last = s
        manifest = json.loads(attr_str(f, "probe.manifest"))
    total = nthreads * taps
    check(missing == 0, "%s: all %d tensors present (missing %d)" % (label, total, missing))
    check(ok_values, "%s: every value equals t*1000003 + i*1009 + k" % label)
    check(ok_scope, "%s: every tensor carries its own thread's NVTX scope" % label)
    check(len(set(seqs)) == len(seqs) == total, "%s: probe.seq unique over %d tensors" % (label, total))
    check(ok_order, "%s: seq increases with the call index within each thread" % label)
    return manifest


def main():
    need_build()
    d = tmpdir("probe-shim-threads-")
    out = os.path.join(d, "cap.h5")
    r = run([program("shim_tap_threads"), "8", "200", "0"], preload_env(out))
    check(r.returncode == 0, "8x200 taps returned 0 (rc=%d, %s)" % (r.returncode, r.stderr.strip()))
    m = verify(out, 8, 200, 0, "8x200")
    check(m["taps"]["accepted"] == 1600, "manifest accepted == 1600")

    out2 = os.path.join(d, "bp.h5")
    # 4096 rows x 17 x 4 bytes = 272 KiB per tensor; the queue holds 1 MiB.
    r = run([program("shim_tap_threads"), "4", "40", "4096"], preload_env(out2, PROBE_QUEUE_MB="1"))
    check(r.returncode == 0, "back-pressure run returned 0 (rc=%d, %s)" % (r.returncode, r.stderr.strip()))
    m = verify(out2, 4, 40, 4096, "PROBE_QUEUE_MB=1")
    qw = m["queue_waits"]
    print("queue_waits:", qw)
    check(qw["count"] > 0 and qw["total_s"] > 0, "tapping threads waited for the writer (%s)" % qw)
    check(m["queue_limit_bytes"] == 1 << 20, "manifest queue_limit_bytes == 1 MiB")
    finish()


if __name__ == "__main__":
    main()
