#!/usr/bin/env python3
"""Capture overhead on a diffusers Wan pipeline, measured in one run
(docs/observer.md, bench/README.md).

Variants, each a separate process of scripts/gpu/lib/wan_run.py (the same
pipeline, weights, inputs and deterministic settings):
  A  no probe (plain python);
  B  probe-run preloaded, capturing nothing (--capture matching no path:
     the adapter's wrappers and the shim's tap calls still run);
  C  probe-run capturing all component I/O;
  D  the capture users write today: forward hooks on the text encoder and
     the transformer, wrappers of scheduler.step and vae.decode, each doing
     .cpu() + torch.save per tensor (wan_pipe.SaveHooks).
Runs are interleaved (warm-up A, then rounds A B C D A B C D ...). In each
process the pipeline runs --inproc-repeat times (default 2: the first warms
up CUDA/cuBLAS/kernels); the last call is timed with the device
synchronized before and after ("pipeline s"); probe's flush after each call
is untimed and reported separately ("drain s": what the capture did not
overlap). Printed: medians and spread (min-max) per variant, the ratios B/A
(goal <= 1.01), C/A, C/D (goal < 1), the captured bytes per pipeline call,
and the producer-stall estimate (median C - median A) against
captured bytes / 40 GB/s; and whether the decoded video (SHA-256 of the
pipeline's output) is identical in A, B and C (the observer-effect proof) and
D. A table on stdout, everything in OUT/capture_wan.json.

  python3 bench/capture_wan.py --out DIR                       # H200 defaults
  python3 bench/capture_wan.py --device cpu --config tiny --height 32 --width 32 \\
      --frames 5 --steps 2 --reps 1 --out /tmp/cw                # a dry run on a CPU

Needs the build tree's probe-run (--build-dir), and torch + transformers +
diffusers + h5py for --python (default: this interpreter)."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
LINK_GBPS = 40.0  # the stall goal: captured bytes / 40 GB/s (pinned D2H measured at 55 GB/s)

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--build-dir", default=os.path.join(SRC, "build"))
ap.add_argument("--python", default=sys.executable)
ap.add_argument("--out", default=os.environ.get("OUT") or "capture-wan-out")
ap.add_argument("--device", default="cuda")
ap.add_argument("--config", default="wan2.1-1.3b")
ap.add_argument("--dtype", default="bf16")
ap.add_argument("--height", type=int, default=480)
ap.add_argument("--width", type=int, default=832)
ap.add_argument("--frames", type=int, default=33)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--reps", type=int, default=3, help="measured rounds of A B C D")
ap.add_argument("--inproc-repeat", type=int, default=2, help="pipeline calls per process (last timed)")
ap.add_argument("--variants", default="ABCD")
ap.add_argument("--threads", type=int, default=8, help="CPU intra-op threads of each run")
ap.add_argument("--budget-s", type=float, default=420.0,
                help="start no round that would end (at the last round's duration) past this many "
                     "seconds; the rounds done are reported")
ap.add_argument("--logs", default=None, help="folder for each run's log (default OUT/logs)")
ap.add_argument("--scratch", default=None, help="folder for capture files and hook output")
args = ap.parse_args()

probe_run = os.path.join(args.build_dir, "bin", "probe-run")
wan_run = os.path.join(SRC, "scripts", "gpu", "lib", "wan_run.py")
for f in (probe_run, wan_run):
    if not os.path.exists(f):
        sys.exit("capture_wan: %s not found (build probe first: cmake -S . -B build && cmake --build build)" % f)
os.makedirs(args.out, exist_ok=True)
scratch = tempfile.mkdtemp(prefix="probe-capture-wan.", dir=args.scratch)
logs = args.logs or os.path.join(args.out, "logs")
os.makedirs(logs, exist_ok=True)
common = ["--config", args.config, "--dtype", args.dtype, "--device", args.device,
          "--height", str(args.height), "--width", str(args.width), "--frames", str(args.frames),
          "--steps", str(args.steps), "--seed", "1", "--deterministic", "--threads", str(args.threads),
          "--attn", "default", "--no-time", "--repeat", str(args.inproc_repeat)]
NAMES = {"A": "no probe", "B": "probe, capturing nothing", "C": "probe, capturing all",
         "D": "hooks + .cpu() + torch.save"}


def captured_bytes(h5):
    """Bytes of tensor data in a capture file: element size x elements of
    every dataset (from the HDF5 datatype: bfloat16 counts 2 bytes)."""
    import h5py
    total, n = 0, 0
    with h5py.File(h5, "r") as f:
        def visit(_, obj):
            nonlocal total, n
            if isinstance(obj, h5py.Dataset):
                total += obj.id.get_type().get_size() * obj.size
                n += 1
        f.visititems(visit)
        skips = f.attrs.get("probe.skips", "[]")
    if isinstance(skips, bytes):
        skips = skips.decode()
    return total, n, json.loads(skips)


def run_one(v, tag):
    js = os.path.join(scratch, "%s.json" % tag)
    cmd = [args.python, wan_run] + common + ["--json", js]
    h5 = hooks = None
    if v == "B":
        h5 = os.path.join(scratch, tag + ".h5")
        cmd = [probe_run, "--out", h5, "--label", tag, "--capture", "/probe-bench/matches-nothing",
               "--"] + cmd
    elif v == "C":
        h5 = os.path.join(scratch, tag + ".h5")
        cmd = [probe_run, "--out", h5, "--label", tag, "--"] + cmd
    elif v == "D":
        hooks = os.path.join(scratch, tag + ".hooks")
        cmd += ["--hooks", hooks]
    t0 = time.perf_counter()
    with open(os.path.join(logs, tag + ".log"), "w") as log:
        p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    rec = {"variant": v, "tag": tag, "exit": p.returncode, "process_s": wall}
    if p.returncode == 0 and os.path.exists(js):
        with open(js) as f:
            rec.update(json.load(f))
    if h5 and os.path.exists(h5):
        try:
            b, n, skips = captured_bytes(h5)
            rec.update(captured_bytes=b, datasets=n, skips=len(skips),
                       skip_reasons=sorted({s.get("reason", "?") for s in skips}))
        except Exception as e:  # an unreadable capture is a result too
            rec["capture_error"] = "%s: %s" % (type(e).__name__, e)
        os.remove(h5)
    if hooks:
        shutil.rmtree(hooks, ignore_errors=True)
    print("  %-4s %-30s exit %d  pipeline %s s  drain %s s  process %.1f s" % (
        tag, NAMES[v], p.returncode, "%.3f" % rec["pipeline_s"] if "pipeline_s" in rec else "-",
        "%.3f" % rec["flush_s"] if rec.get("flush_s") is not None else "-", wall), flush=True)
    return rec


t_start = time.perf_counter()
print("capture_wan: %s %s %dx%d, %d frames, %d steps, device %s; rounds of %s x %d after a warm-up"
      % (args.config, args.dtype, args.height, args.width, args.frames, args.steps, args.device,
         args.variants, args.reps), flush=True)
records = [dict(run_one("A", "warm"), warmup=True)]
rounds = 0
last_round_s = 0.0
for r in range(args.reps):
    elapsed = time.perf_counter() - t_start
    if r > 0 and elapsed + last_round_s > args.budget_s:
        print("  stopping after %d rounds: another round (%.0f s) would end past the budget of %.0f s"
              % (rounds, last_round_s, args.budget_s))
        break
    t_round = time.perf_counter()
    for v in args.variants:
        records.append(run_one(v, "%s%d" % (v, r)))
    last_round_s = time.perf_counter() - t_round
    rounds += 1
shutil.rmtree(scratch, ignore_errors=True)

ok = {v: [x for x in records if x["variant"] == v and not x.get("warmup") and x["exit"] == 0
          and "pipeline_s" in x] for v in args.variants}
summary = {}
for v, xs in ok.items():
    t = [x["pipeline_s"] for x in xs]
    summary[v] = {"runs": len(xs), "median_s": statistics.median(t) if t else None,
                  "min_s": min(t) if t else None, "max_s": max(t) if t else None,
                  "drain_median_s": statistics.median([x["flush_s"] for x in xs])
                  if xs and all(x.get("flush_s") is not None for x in xs) else None,
                  "process_median_s": statistics.median([x["process_s"] for x in xs]) if xs else None}


def med(v):
    return summary.get(v, {}).get("median_s")


def ratio(a, b):
    return med(a) / med(b) if med(a) and med(b) else None


cb = [x["captured_bytes"] / x.get("repeat", 1) for x in ok.get("C", []) if "captured_bytes" in x]
hb = [x["hook_bytes"] / x.get("repeat", 1) for x in ok.get("D", []) if x.get("hook_bytes")]
bytes_per_call = statistics.median(cb) if cb else None
stall = med("C") - med("A") if med("C") is not None and med("A") is not None else None
allowed = bytes_per_call / (LINK_GBPS * 1e9) if bytes_per_call else None
hashes = {v: sorted({x.get("video_sha256") for x in ok.get(v, [])}) for v in args.variants}
all_abc = [h for v in "ABC" if v in hashes for h in hashes[v]]
identical_abc = len(set(all_abc)) == 1 if all_abc else None
# The determinism floor: repeated runs without probe agree among themselves.
a_hashes = [x.get("video_sha256") for x in ok.get("A", [])] + [records[0].get("video_sha256")]
a_repeatable = len(set(h for h in a_hashes if h)) == 1 if any(a_hashes) else None
result = {
    "format": "probe-bench-capture-wan", "version": 1,
    "config": vars(args), "rounds": rounds, "elapsed_s": time.perf_counter() - t_start,
    "summary": summary,
    "ratios": {"B/A": ratio("B", "A"), "C/A": ratio("C", "A"), "C/D": ratio("C", "D")},
    "goals": {"B/A <= 1.01": (ratio("B", "A") <= 1.01) if ratio("B", "A") else None,
              "C/D < 1": (ratio("C", "D") < 1) if ratio("C", "D") else None,
              "stall <= bytes / 40 GB/s": (stall <= allowed) if stall is not None and allowed else None},
    "captured_bytes_per_call": bytes_per_call, "hook_bytes_per_call": statistics.median(hb) if hb else None,
    "stall_estimate_s": stall, "stall_allowed_s": allowed,
    "video_sha256": hashes, "video_identical_ABC": identical_abc,
    "video_repeatable_A": a_repeatable,
    "video_identical_D": (hashes.get("D") == hashes.get("A")) if "D" in hashes and "A" in hashes else None,
    "capture_skips": sorted({r for x in ok.get("C", []) for r in x.get("skip_reasons", [])}),
    "runs": records,
}
with open(os.path.join(args.out, "capture_wan.json"), "w") as f:
    json.dump(result, f, indent=1)


def fmt(x, f="%.3f"):
    return "-" if x is None else f % x


print()
print("%-3s %-30s %5s %10s %10s %10s %10s" % ("", "variant", "runs", "median s", "min s", "max s", "drain s"))
for v in args.variants:
    s = summary[v]
    print("%-3s %-30s %5d %10s %10s %10s %10s" % (v, NAMES[v], s["runs"], fmt(s["median_s"]),
                                                  fmt(s["min_s"]), fmt(s["max_s"]),
                                                  fmt(s["drain_median_s"])))
r = result["ratios"]
print("B/A %s (goal <= 1.01)   C/A %s   C/D %s (goal < 1)" % (fmt(r["B/A"], "%.4f"),
                                                             fmt(r["C/A"], "%.4f"), fmt(r["C/D"], "%.4f")))
print("captured per pipeline call: %s MB (probe), %s MB (hooks)" % (
    fmt(bytes_per_call and bytes_per_call / 1e6, "%.1f"),
    fmt(result["hook_bytes_per_call"] and result["hook_bytes_per_call"] / 1e6, "%.1f")))
print("producer stall estimate (median C - median A): %s s; allowed (bytes / 40 GB/s): %s s" % (
    fmt(stall, "%.4f"), fmt(allowed, "%.4f")))
print("decoded video identical in A, B, C: %s; D: %s; the runs without probe among themselves "
      "(determinism floor): %s; capture skips: %s" % (
          identical_abc, result["video_identical_D"], a_repeatable, result["capture_skips"] or "none"))
failed = [x["tag"] for x in records if x["exit"] != 0]
if failed:
    print("failed runs (logs in %s): %s" % (logs, " ".join(failed)))
sys.exit(1 if failed or identical_abc is False else 0)
