#!/usr/bin/env python3
"""End-to-end test of selective and stats-only capture on the
embedded toy pipeline (scripts/example/toy_pipeline.py) under probe-run.

Expected values are computed here, independently of probe: the set of
dataset paths from the pipeline's description (per step two dit.step calls,
conditional then unconditional, and one scheduler.step call), summaries,
hashes (xxh64 via probe.hash of the full capture), norms and the rel_l2 lower
bound with numpy / math.fsum from full captures of the same runs.

 (a) --capture with @step= / @branch= selectors writes exactly the expected
     paths; taps.filtered counts the rest; repeated --capture are OR-ed
 (b) bad selectors: probe-run exits 2 with one line and does not run the
     command; PROBE_CAPTURE set directly: one `probe:` line, nothing captured,
     manifest capture_error
 (c) --stats-only: the same paths as a full capture, each a compound record
     whose fields equal numpy's summary of the full capture's tensor, with
     the full capture's probe.dtype, probe.shape and probe.hash, and a
     probe.tree_hash equal to the reader's tree hash of the full capture's
     bytes; manifest stats_only; the file is a small fraction of the full one
 (d) probe-compare stats-only vs stats-only of the same run: all identical,
     pass, exact metrics; full vs stats-only of the same run: identical
 (e) full reference vs stats-only perturbed candidate: exit 1, first failure
     = the first tensor in execution order whose bytes differ (from the full
     captures), rel_l2 null, rel_l2_lower_bound and mean_shift as numpy
     computes them from the full captures; probe-calibrate refuses it

Environment: PROBE_BUILD_DIR (required), PROBE_SOURCE_DIR, PROBE_PYTHON.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR")
SRC = os.environ.get("PROBE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PY = os.environ.get("PROBE_PYTHON") or sys.executable
STEPS = 3
ARGS = ["--steps", str(STEPS), "--frames", "4", "--height", "128", "--width", "128"]
FAILURES = []


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def run(cmd, env=None):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=600, env=env)
    if p.stderr.strip():
        print("  stderr: " + p.stderr.strip().replace("\n", "\n  stderr: ")[:3000])
    return p


def probe_run(out, *opts, feature="none", env=None):
    return run([os.path.join(BUILD, "bin", "probe-run"), "--out", out, *opts, "--", PY,
                os.path.join(SRC, "scripts", "example", "toy_pipeline.py"), "--feature", feature,
                *ARGS], env=env)


# what the pipeline taps: (component, call, slot, step, cfg_branch); derived from
# its description, not from probe (step/branch -1: unknown)
def all_taps():
    taps = []
    for c in range(2):
        taps += [("text_encoder", c, s, -1, -1)
                 for s in ("in.input_ids", "in.attention_mask", "out.last_hidden_state")]
        taps.append(("prompt_embeds", c, "out", -1, -1))
    taps.append(("latents.init", 0, "out", -1, -1))
    taps += [("timesteps", 0, s, -1, -1) for s in ("out.timesteps", "out.sigmas")]
    for i in range(STEPS):
        for b in range(2):
            taps += [("dit.step", 2 * i + b, s, i, b)
                     for s in ("in.hidden_states", "in.timestep", "in.encoder_hidden_states",
                               "out.sample")]
        taps += [("scheduler.step", i, s, i, -1)
                 for s in ("in.model_output", "in.timestep", "in.sample", "out.prev_sample")]
    taps += [("vae.decode", 0, s, -1, -1) for s in ("in.latents", "out.sample")]
    return [(f"/{c}/{k:04d}/{s}", st, br) for c, k, s, st, br in taps]


def datasets(path):
    found = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: found.append("/" + n) if isinstance(o, h5py.Dataset) else None)
    return found


def manifest(path):
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["probe.manifest"])


def attr_str(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def as_f64(ds):
    return np.asarray(ds[()]).astype(np.float64).ravel()


def selection_tests(tmp):
    taps = all_taps()
    cases = [
        (["--capture", "dit.step/*/out*@step=0-1"],
         lambda p, st, br: p.startswith("/dit.step/") and "/out" in p and 0 <= st <= 1),
        (["--capture", "/scheduler.step/*@step=2", "--capture", "*/in.timestep@branch=1"],
         lambda p, st, br: (p.startswith("/scheduler.step/") and st == 2)
         or (p.endswith("/in.timestep") and br == 1)),
        (["--capture", "dit.step/*/out.sample@step=1-@branch=0"],
         lambda p, st, br: p.startswith("/dit.step/") and p.endswith("/out.sample")
         and st >= 1 and br == 0),
        (["--capture", "*@step=0+2"],   # '*' crosses '/'; unknown step never matches
         lambda p, st, br: st in (0, 2)),
        (["--capture", "/vae.decode/0000/?n.latents"],   # plain glob, '?' one character
         lambda p, st, br: p == "/vae.decode/0000/in.latents"),
    ]
    for i, (opts, pred) in enumerate(cases):
        out = os.path.join(tmp, f"sel{i}.h5")
        p = probe_run(out, *opts)
        if not check(p.returncode == 0, f"(a) {' '.join(opts)}: the run exits 0"):
            continue
        want = {path for path, st, br in taps if pred(path, st, br)}
        got = set(datasets(out))
        check(got == want and want, f"(a) {' '.join(opts)}: exactly the {len(want)} expected "
              f"paths (missing {sorted(want - got)[:4]}, extra {sorted(got - want)[:4]})")
        t = manifest(out)["taps"]
        check(t["accepted"] == len(want) and t["filtered"] == len(taps) - len(want),
              f"(a) manifest taps: accepted {t['accepted']} == {len(want)}, filtered "
              f"{t['filtered']} == {len(taps) - len(want)}")

    # items that match nothing (a typo in a component, a step the run does not
    # have): one probe: line each, and the manifest's capture_items counts
    # what each item matched
    out = os.path.join(tmp, "unmatched.h5")
    # (the toy pipeline runs on the CPU: no cuBLAS GEMM, so a GEMM item cannot match)
    items = ["dit.step/*/out*@step=0-1", "dit.stpe/*/out", "/scheduler.step/*@step=99",
             "dit.step/*/gemm.last.out"]
    p = probe_run(out, *[a for it in items for a in ("--capture", it)])
    warn = [ln for ln in p.stderr.splitlines() if ln.startswith("probe: ")]
    check(p.returncode == 0 and len(warn) == 3 and "'dit.stpe/*/out' matched no tensor" in warn[0]
          and "components: " in warn[0] and "dit.step" in warn[0]
          and "'/scheduler.step/*@step=99' matched no tensor" in warn[1]
          and "denoising steps 0-2" in warn[1]
          and "'dit.step/*/gemm.last.out' matched no tensor: this process offered no GEMM" in warn[2],
          f"(a) unmatched items: the run goes on, one probe: line per unmatched item ({warn})")
    want = {path for path, st, br in taps if path.startswith("/dit.step/") and "/out" in path and 0 <= st <= 1}
    ci = manifest(out).get("capture_items")
    check(ci == [{"item": items[0], "matched": len(want)}, {"item": items[1], "matched": 0},
                 {"item": items[2], "matched": 0}, {"item": items[3], "matched": 0}]
          and set(datasets(out)) == want,
          f"(a) manifest capture_items: {len(want)}, 0, 0, 0 ({ci})")
    check("capture_items" not in manifest(os.path.join(tmp, "sel0.h5")) or
          all(x["matched"] > 0 for x in manifest(os.path.join(tmp, "sel0.h5"))["capture_items"]),
          "(a) an item that matched has its count")

    # (b) bad selectors: probe-run refuses them before running the command
    marker = os.path.join(tmp, "ran")
    for bad in ("x@step=3-1", "x@foo=1", "@step=1", "x@step=", "x@step=1@step=2", "x@step=a",
                "x@step=1,2", "x@step=1@"):
        p = run([os.path.join(BUILD, "bin", "probe-run"), "--out", os.path.join(tmp, "bad.h5"),
                 "--capture", bad, "--", "touch", marker])
        lines = p.stderr.strip().splitlines()
        check(p.returncode == 2 and len(lines) == 1 and lines[0].startswith("probe-run: ")
              and not os.path.exists(marker),
              f"(b) --capture {bad!r}: exit 2 ({p.returncode}), one probe-run line, command not run")

    # PROBE_CAPTURE given to the shim directly (env after probe-run): one warning, nothing captured
    out = os.path.join(tmp, "badenv.h5")
    p = run([os.path.join(BUILD, "bin", "probe-run"), "--out", out, "--", "env",
             "PROBE_CAPTURE=dit.step/*@step=2-1", PY,
             os.path.join(SRC, "scripts", "example", "toy_pipeline.py"), *ARGS])
    warn = [ln for ln in p.stderr.splitlines() if ln.startswith("probe: ")]
    check(p.returncode == 0 and len(warn) == 1 and "PROBE_CAPTURE" in warn[0]
          and "nothing is captured" in warn[0],
          f"(b) bad PROBE_CAPTURE in the shim: the run goes on, one probe: line ({warn})")
    if os.path.exists(out):
        m = manifest(out)
        check(datasets(out) == [] and m["taps"]["filtered"] == len(taps)
              and "below its start" in m.get("capture_error", ""),
              f"(b) nothing captured, every tap filtered, manifest capture_error "
              f"({m.get('capture_error')})")


def summary_np(x):
    fin = x[np.isfinite(x)]
    return {"n": x.size, "n_finite": fin.size, "nan": int(np.isnan(x).sum()),
            "inf": int(np.isinf(x).sum()),
            "min": fin.min() if fin.size else math.nan, "max": fin.max() if fin.size else math.nan,
            "abs_max": np.abs(fin).max() if fin.size else math.nan,
            "sum": math.fsum(fin), "sum_sq": math.fsum(fin * fin)}


def close(a, b, rtol=1e-12):
    return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rtol * max(abs(a), abs(b))


def tree_hashes(path, paths):
    """{path: probe_file_tree_hash as 16 hex digits} of a capture, through libprobe."""
    import ctypes
    lib = ctypes.CDLL(os.path.join(BUILD, "lib", "libprobe.so"))
    lib.probe_file_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.probe_file_find.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.probe_file_tree_hash.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]
    lib.probe_file_close.argtypes = [ctypes.c_void_p]
    f, out = ctypes.c_void_p(), {}
    if lib.probe_file_open(path.encode(), ctypes.byref(f)) != 0:
        return {p: "(cannot open)" for p in paths}
    for p in paths:
        i, h = ctypes.c_size_t(), ctypes.c_uint64()
        ok = lib.probe_file_find(f, p.encode(), ctypes.byref(i)) == 0 and \
            lib.probe_file_tree_hash(f, i, ctypes.byref(h)) == 0
        out[p] = "%016x" % h.value if ok else "(error)"
    lib.probe_file_close(f)
    return out


def stats_only_tests(tmp):
    full, so, so2 = (os.path.join(tmp, n) for n in ("full.h5", "so.h5", "so2.h5"))
    pfull, pso = os.path.join(tmp, "pfull.h5"), os.path.join(tmp, "pso.h5")
    ok = all(check(probe_run(*a, feature=f).returncode == 0, f"capture {os.path.basename(a[0])}")
             for a, f in (((full,), "none"), ((so, "--stats-only"), "none"),
                          ((so2, "--stats-only"), "none"), ((pfull,), "perturb-denoiser"),
                          ((pso, "--stats-only"), "perturb-denoiser")))
    if not ok:
        return

    # (c) the records
    paths = [p for p, _, _ in all_taps()]
    check(sorted(datasets(so)) == sorted(paths) == sorted(datasets(full)),
          "(c) stats-only capture has the same paths as the full capture")
    bad = []
    with h5py.File(full, "r") as F, h5py.File(so, "r") as S:
        for p in paths:
            ds, rec = F[p], S[p]
            a, b = ds.attrs, rec.attrs
            want = summary_np(as_f64(ds))
            v = rec[()]
            if rec.shape != () or rec.dtype.names != ("n", "n_finite", "nan", "inf", "min", "max",
                                                       "abs_max", "sum", "sum_sq"):
                bad.append(f"{p}: record {rec.shape} {rec.dtype.names}")
                continue
            for k in ("n", "n_finite", "nan", "inf"):
                if int(v[k]) != want[k]:
                    bad.append(f"{p}: {k} {int(v[k])} != {want[k]}")
            for k in ("min", "max", "abs_max"):
                if not close(float(v[k]), float(want[k]), 0):
                    bad.append(f"{p}: {k} {float(v[k])} != {want[k]}")
            for k in ("sum", "sum_sq"):
                if not close(float(v[k]), want[k]):
                    bad.append(f"{p}: {k} {float(v[k])!r} != {want[k]!r}")
            if (attr_str(a["probe.dtype"]) != attr_str(b["probe.dtype"])
                    or list(np.atleast_1d(a["probe.shape"])) != list(np.atleast_1d(b["probe.shape"]))
                    or list(ds.shape) != [int(x) for x in np.atleast_1d(b["probe.shape"])]
                    or attr_str(a["probe.hash"]) != attr_str(b["probe.hash"])
                    or int(b["probe.stats_only"]) != 1):
                bad.append(f"{p}: probe.dtype/shape/hash/stats_only differ from the full capture")
        mf = json.loads(S.attrs["probe.manifest"])
        # the tree hash the shim stored with each record, against the reader's
        # tree hash of the full capture's stored bytes (probe_file_tree_hash)
        trees = tree_hashes(full, paths)
        for p in paths:
            got = attr_str(S[p].attrs.get("probe.tree_hash", ""))
            if got != trees[p]:
                bad.append(f"{p}: probe.tree_hash {got!r} != {trees[p]!r} of the full capture's bytes")
    check(not bad, f"(c) every record equals numpy's summary of the full tensor, same dtype, "
          f"shape, hash, tree hash: {bad[:4]}")
    check(mf.get("stats_only") is True, "(c) manifest stats_only: true")
    check("stats_only" not in manifest(full), "(c) a full capture's manifest has no stats_only")
    sf, ss = os.path.getsize(full), os.path.getsize(so)
    check(ss < 0.1 * sf, f"(c) stats-only file {ss} B is under 10% of the full capture {sf} B")

    # (d) identical pairs
    cmp = os.path.join(BUILD, "bin", "probe-compare")
    for a, b, what in ((so, so2, "stats-only vs stats-only"), (full, so, "full vs stats-only")):
        js = os.path.join(tmp, "d.json")
        p = run([cmp, a, b, "--expect-identical", "--json", js])
        j = json.load(open(js))
        ts = j["tensors"]
        check(p.returncode == 0 and j["verdict"] == "pass" and len(ts) == len(paths),
              f"(d) {what}: exit 0, pass, {len(paths)} tensors")
        check(all(t["identical"] and t["stats_only"] and t["verdict"] == "pass"
                  and t["rel_l2"] == 0 and t["cosine"] == 1 and t["max_abs"] == 0
                  and t["p99_abs"] == 0 and t["mean_abs"] == 0 and t["rel_l2_lower_bound"] == 0
                  for t in ts), f"(d) {what}: every tensor identical with exact metrics")

    # (e) perturbed candidate, stats-only, against the full reference
    with h5py.File(full, "r") as F, h5py.File(pfull, "r") as P:
        order = sorted(paths, key=lambda p: int(F[p].attrs["probe.seq"]))
        differ = [p for p in order if np.asarray(F[p][()]).tobytes() != np.asarray(P[p][()]).tobytes()]
        expect = {}
        for p in differ:
            r, c = as_f64(F[p]), as_f64(P[p])
            nr, nc = math.sqrt(math.fsum(r * r)), math.sqrt(math.fsum(c * c))
            expect[p] = (abs(nc - nr) / nr, math.fsum(c) / c.size - math.fsum(r) / r.size)
    js = os.path.join(tmp, "e.json")
    p = run([cmp, full, pso, "--json", js])
    j = json.load(open(js))
    check(p.returncode == 1 and j["verdict"] == "fail", "(e) full vs perturbed stats-only: exit 1, fail")
    check(differ and j["first_failure"] == differ[0],
          f"(e) first failure {j['first_failure']} is the first tensor whose bytes differ "
          f"({differ[:1]})")
    ts = {t["path"]: t for t in j["tensors"]}
    bad = []
    for p, (lb, ms) in expect.items():
        t = ts[p]
        if not (t["rel_l2"] is None and t["cosine"] is None and t["max_abs"] is None
                and t["p99_abs"] is None and t["verdict"] == "fail" and t["stats_only"]
                and not t["identical"]
                and any("stats-only capture: needs the tensors" in r for r in t["reasons"])):
            bad.append(f"{p}: metrics/verdict/reasons {t['rel_l2']} {t['verdict']} {t['reasons']}")
        if not close(t["rel_l2_lower_bound"], lb, 1e-9) or not close(t["mean_shift"], ms, 1e-9):
            bad.append(f"{p}: bound {t['rel_l2_lower_bound']} vs {lb}, shift {t['mean_shift']} vs {ms}")
    check(not bad, f"(e) every differing tensor: null metrics, fail, bound and mean shift as "
          f"numpy computes them ({len(expect)} tensors) {bad[:3]}")
    # the bound is a lower bound of the true rel_l2 (from the full pair)
    jf = os.path.join(tmp, "f.json")
    run([cmp, full, pfull, "--json", jf])
    truth = {t["path"]: t["rel_l2"] for t in json.load(open(jf))["tensors"]}
    check(all(ts[p]["rel_l2_lower_bound"] <= truth[p] * (1 + 1e-12) for p in expect),
          "(e) rel_l2_lower_bound <= the rel_l2 of the full pair, for every differing tensor")
    # calibration needs element-wise metrics: probe-calibrate refuses a stats-only capture
    cal = os.path.join(tmp, "cal.json")
    p = run([os.path.join(BUILD, "bin", "probe-calibrate"), "--feature", "perturb",
             "--reference", full, "--reference", so, "--candidate", pso, "--out", cal])
    lines = p.stderr.strip().splitlines()
    check(p.returncode == 2 and len(lines) == 1 and "stats-only" in lines[0]
          and not os.path.exists(cal),
          f"(e) probe-calibrate refuses a stats-only capture: exit {p.returncode}, one line, no file")
    same = [p for p in paths if p not in expect]
    check(all(ts[p]["identical"] and ts[p]["verdict"] == "pass" for p in same),
          f"(e) the {len(same)} byte-identical tensors are identical and pass")


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR is not set")
        return 2
    tmp = tempfile.mkdtemp(prefix="probe-stats-")
    try:
        selection_tests(tmp)
        stats_only_tests(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(FAILURES)} failure(s)" if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
