"""Sustained capture throughput into probe's pinned staging, against the
device-to-host link measured in the same run (GPU).

usage: python3 bench/staging_throughput.py --shim build/lib/libprobe_intercept.so
           [--mib 256] [--count 8] [--reps 3] [--json FILE]

Both sides copy COUNT bf16 tensors of MIB MiB from one CUDA stream, timed
with CUDA events on that stream:
  link   the baseline: torch `dst.copy_(src, non_blocking=True)` into pinned
         host tensors allocated beforehand (the fastest D2H a user can write);
  probe  a child process with libprobe_intercept.so preloaded
         (PROBE_PINNED_MB large enough that nothing waits for space,
         PROBE_OUT on /dev/shm) taps the same tensors through probe_tap_v1
         back to back, after a warm-up repetition and 3 s in which the idle
         writer grows the pool; the producer stream waits for each copy (probe's
         ordering), so the events around the taps time the copies into
         staging. It also reports how long the taps took on the host, and how
         long the writer needed to drain everything into the file after the
         last tap (end to end, tmpfs).
Prints GB/s (10^9 bytes/s) per repetition, the medians, the ratio
probe / link, and the goal checks: staging >= 35 GB/s, producer-stream stall
<= captured bytes / 40 GB/s.
"""
import argparse
import shutil
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


class T(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("abi_version", ctypes.c_uint32),
                ("component", ctypes.c_char_p), ("slot", ctypes.c_char_p),
                ("call", ctypes.c_int64), ("step", ctypes.c_int64),
                ("cfg_branch", ctypes.c_int32), ("device", ctypes.c_int32),
                ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("data", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("timestep", ctypes.c_double)]


def tensors(torch, mib, count):
    n = (mib << 20) // 2
    return [torch.full((n,), float(i), device="cuda", dtype=torch.bfloat16) for i in range(count)]


def link(args):
    import torch
    src = tensors(torch, args.mib, args.count)
    dst = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in src]
    s = torch.cuda.current_stream()
    rates = []
    for rep in range(args.reps + 1):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(s)
        for d, t in zip(dst, src):
            d.copy_(t, non_blocking=True)
        b.record(s)
        b.synchronize()
        if rep:  # the first is a warm-up
            rates.append(args.mib * args.count * 2**20 / (a.elapsed_time(b) * 1e-3) / 1e9)
    return {"gbps": rates}


def probe(args):
    import torch
    lib = ctypes.CDLL(None)
    lib.probe_tap_v1.argtypes = [ctypes.POINTER(T)]
    src = tensors(torch, args.mib, args.count)
    s = torch.cuda.current_stream()
    rates, host_ms, drain_s = [], [], []
    call = 0
    for rep in range(args.reps + 1):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        descs = []
        for t in src:
            shape = (ctypes.c_int64 * 1)(t.numel())
            descs.append((T(ctypes.sizeof(T), 1, b"bench", b"out", call, -1, -1, 0, 11, 1, shape, None,
                            t.data_ptr(), s.cuda_stream, float("nan")), shape))
            call += 1
        a.record(s)
        h0 = time.perf_counter()
        for d, _ in descs:
            if lib.probe_tap_v1(ctypes.byref(d)) != 0:
                raise SystemExit("probe_tap_v1 failed")
        h1 = time.perf_counter()
        b.record(s)
        b.synchronize()
        c0 = time.perf_counter()
        if lib.probe_tap_flush_v1() != 0:
            raise SystemExit("probe_tap_flush_v1 failed")
        c1 = time.perf_counter()
        if rep:
            rates.append(args.mib * args.count * 2**20 / (a.elapsed_time(b) * 1e-3) / 1e9)
            host_ms.append((h1 - h0) * 1e3)
            drain_s.append(c1 - c0)
        else:
            time.sleep(3)  # the writer, idle, grows the pool to its full size
    return {"gbps": rates, "tap_host_ms": host_ms, "drain_after_last_tap_s": drain_s}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--child", choices=["link", "probe"])
    args = ap.parse_args()
    if args.child:
        r = link(args) if args.child == "link" else probe(args)
        print(json.dumps(r))
        return 0
    if not args.shim:
        ap.error("--shim is required")
    nbytes = args.mib * args.count * 2**20
    common = [sys.executable, os.path.abspath(__file__), "--mib", str(args.mib), "--count", str(args.count),
              "--reps", str(args.reps)]
    out = subprocess.run(common + ["--child", "link"], capture_output=True, text=True, check=True)
    lk = json.loads(out.stdout.strip().splitlines()[-1])
    d = tempfile.mkdtemp(prefix="probe-staging-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.shim), PROBE_OUT=os.path.join(d, "bench.h5"),
               PROBE_PINNED_MB=str(max(1024, 2 * nbytes >> 20)))
    env.pop("PROBE_ROOT_PID", None)
    out = subprocess.run(common + ["--child", "probe"], capture_output=True, text=True, env=env)
    staging = None
    try:
        import h5py
        with h5py.File(os.path.join(d, "bench.h5"), "r") as f:
            staging = json.loads(f.attrs["probe.manifest"]).get("staging")
    except Exception as e:  # h5py missing or the file unreadable: report without it
        staging = "unavailable: %s" % e
    shutil.rmtree(d)  # the capture, and its .raw folder under PROBE_RAW_FILES
    if out.returncode != 0:
        print(out.stdout, out.stderr)
        return 1
    pr = json.loads(out.stdout.strip().splitlines()[-1])
    ml, mp = statistics.median(lk["gbps"]), statistics.median(pr["gbps"])
    stall_s = nbytes / (mp * 1e9)
    res = {"bytes_per_rep": nbytes, "tensors": args.count, "tensor_mib": args.mib,
           "link_gbps": lk["gbps"], "probe_staging_gbps": pr["gbps"], "probe_tap_host_ms": pr["tap_host_ms"],
           "probe_drain_after_last_tap_s": pr["drain_after_last_tap_s"],
           "median_link_gbps": ml, "median_probe_gbps": mp, "ratio_probe_over_link": mp / ml,
           "stall_s": stall_s, "stall_budget_s": nbytes / 40e9, "manifest_staging": staging}
    print("%d x %d MiB bf16 per repetition, %d repetitions after a warm-up" % (args.count, args.mib, args.reps))
    print("link  (torch copy_ into pinned, non_blocking): %s GB/s" % " ".join("%.1f" % x for x in lk["gbps"]))
    print("probe (probe_tap_v1 into staging)            : %s GB/s" % " ".join("%.1f" % x for x in pr["gbps"]))
    print("probe taps on the host: %s ms for %d taps; writer drained to tmpfs %s s after the last tap"
          % (" ".join("%.2f" % x for x in pr["tap_host_ms"]), args.count,
             " ".join("%.2f" % x for x in pr["drain_after_last_tap_s"])))
    print("probe's manifest, staging:", staging)
    print("median: link %.1f GB/s, probe %.1f GB/s, ratio probe/link %.3f" % (ml, mp, mp / ml))
    print("goal staging >= 35 GB/s: %s (%.1f)" % ("PASS" if mp >= 35 else "FAIL", mp))
    print("goal producer stall <= bytes / 40 GB/s: %s (%.1f ms vs %.1f ms)"
          % ("PASS" if stall_s <= nbytes / 40e9 else "FAIL", stall_s * 1e3, nbytes / 40e9 * 1e3))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
