"""The mutation study of probe-compare's verdicts (docs/mutation.md): a real
diffusers WanPipeline (bench/mutation/wan_mutants.py, random weights) run under
probe-run as a bfloat16 reference, a second reference (the determinism floor), a
float32 oracle of the same experiment (the reference's bfloat16 weights held in
float32, its root inputs injected), transparent features, and planted bugs of
graded size; every candidate is compared with the reference under each verdict:

  T1           the literal gate T1
  T1-relaxed   the literal gate T1-relaxed:CAUSE (the feature's cause; backend-swap
               for bugs)
  systematic   the headline of --gate T1-relaxed:CAUSE without an oracle: T1-relaxed
               plus the systematic test
  oracle       the headline with --oracle: no less accurate than the reference

and the study reports, per verdict, false alarms on transparent features and
detections per bug size, and where each verdict says the difference was
introduced (with --blocks the DiT blocks are captured as dit.block, so a bug
planted in block B should be named at /dit.block/<B> of the first dit.step call).

  python3 bench/mutation/study.py --python ~/.cache/probe-venv/bin/python \\
      --device cpu --size 128 --out /tmp/study [--blocks] [--quick]

Writes OUT/study.json (every verdict of every candidate, with the numbers behind
it) and OUT/study.md (the tables of docs/mutation.md), and prints the tables.

  python3 bench/mutation/study.py --python ~/.cache/probe-venv/bin/python \
      --device cpu --size 64 --frames 9 --blocks --lossy fp8-storage,fp8-gemm,fbcache \
      --out /tmp/lossy [--calib-seeds 3] [--test-seeds 2] [--quick]

runs the lossy study instead (bench/mutation/lossy.py): per lossy feature a T2
calibration on seeds 1..S, then the feature alone and the feature with planted
bugs on unseen seeds under T2 and T1-relaxed; writes OUT/lossy.json and
OUT/lossy.md.
Exit status 0 when the study ran (whatever it found), 2 when a run or a compare
failed to produce a result.
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

TRANSPARENT = {  # feature -> the T1-relaxed cause a user would name
    "sdpa-math": "backend-swap",
    "sdpa-flash": "backend-swap",
    "sdpa-efficient": "backend-swap",
    "fused-qkv": "compile-fusion",
    "tp-merge": "parallel-partial-sum",
    "compile": "compile-fusion",
    "cuda-graphs": "compile-fusion",
}
BUGS = [  # (family, size, --bug spec); BLOCK is where the bug sits (None: not in a block)
    ("chanbias", 0.03, "chanbias:1:0.03"), ("chanbias", 0.1, "chanbias:1:0.1"),
    ("chanbias", 0.3, "chanbias:1:0.3"), ("chanbias", 1.0, "chanbias:1:1"),
    ("attnscale", 0.01, "attnscale:1:0.01"), ("attnscale", 0.03, "attnscale:1:0.03"),
    ("attnscale", 0.1, "attnscale:1:0.1"), ("attnscale", 0.3, "attnscale:1:0.3"),
    ("gain", 0.003, "gain:1:0.003"), ("gain", 0.01, "gain:1:0.01"), ("gain", 0.03, "gain:1:0.03"),
    ("gain", 0.1, "gain:1:0.1"),
    ("normeps", 1e-3, "normeps:1:1e-3"), ("normeps", 1e-2, "normeps:1:1e-2"),
    ("normeps", 1e-1, "normeps:1:1e-1"),
    ("fp8", 1, "fp8:1"), ("rope", 1, "rope:1"), ("mask", 1, "mask:1"),
    ("timestep", 0.01, "timestep:0.01"), ("timestep", 0.1, "timestep:0.1"),
    ("timestep", 1.0, "timestep:1"),
]
BUG_BLOCK = 1
QUICK_BUGS = ["chanbias:1:0.3", "chanbias:1:1", "attnscale:1:0.3", "gain:1:0.1", "mask:1",
              "rope:1", "timestep:1"]
VERDICTS = ("T1", "T1-relaxed", "systematic", "oracle")


def sh(cmd, log, timeout):
    t0 = time.time()
    with open(log, "w") as f:
        f.write("$ %s\n" % " ".join(shlex.quote(c) for c in cmd))
        f.flush()
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch and diffusers")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"), help="probe-run, probe-compare")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--blocks", action="store_true", help="capture the DiT blocks as dit.block")
    ap.add_argument("--quick", action="store_true", help="a few features and bugs (CI)")
    ap.add_argument("--features", default=None, help="comma-separated features (default: all "
                    "that run on the device)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--reuse", action="store_true", help="keep captures already in --out")
    ap.add_argument("--jobs", type=int, default=1, help="candidate runs and compares at a time "
                    "(the reference and the oracle run first, alone)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per run (wan_mutants)")
    ap.add_argument("--lossy", default=None, metavar="FEATURE[,FEATURE]",
                    help="the lossy study of these features (fp8-storage, fp8-gemm, fbcache) instead")
    ap.add_argument("--calib-seeds", type=int, default=3, help="--lossy: calibration seeds 1..S")
    ap.add_argument("--test-seeds", type=int, default=2, help="--lossy: unseen seeds S+1..S+T")
    ap.add_argument("--calib-subsets", default="", help="--lossy: comma-separated K < S: also calibrate "
                    "on seeds 1..K alone and judge the unseen runs under T2 with it (how many seeds a "
                    "feature needs)")
    ap.add_argument("--lossy-bugs", default=None, help="--lossy: comma-separated --bug specs, BLOCK for "
                    "the block (default: the graded set of lossy.py; --quick: a few)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    run_bin, cmp_bin = os.path.join(a.bin, "probe-run"), os.path.join(a.bin, "probe-compare")
    if a.lossy:
        import lossy
        return lossy.run(a, sh, run_bin, cmp_bin, os.path.join(a.bin, "probe-calibrate"),
                         lambda name: os.path.join(a.out, name))
    prog = [a.python, os.path.join(HERE, "wan_mutants.py"), "--device", a.device, "--size",
            str(a.size), "--frames", str(a.frames), "--steps", str(a.steps), "--layers",
            str(a.layers)]
    tap = ["--blocks"] if a.blocks else []
    cpu = a.device == "cpu"
    if a.features:
        features = a.features.split(",")
    elif a.quick:
        features = ["sdpa-math", "tp-merge"]
    else:
        features = [f for f in TRANSPARENT if not (cpu and f in ("sdpa-efficient", "cuda-graphs"))]
    bugs = [b for b in BUGS if not a.quick or b[2] in QUICK_BUGS]

    def P(name):
        return os.path.join(a.out, name)

    def capture(name, extra, inject=None, convert=False):
        cmd = [run_bin, "--out", P(name + ".h5"), "--force", "--label", name, *tap]
        if inject:
            cmd += ["--inject", inject] + (["--convert"] if convert else [])
        rc, secs = sh(cmd + ["--", *prog, *extra], P(name + ".log"), a.timeout)
        if rc != 0:
            sys.exit("study: run %s failed (exit %d): see %s" % (name, rc, P(name + ".log")))
        return secs

    timings = {}
    if a.reuse and os.path.exists(P("ref.h5")):
        capture = reuse(capture, P)
    timings["ref"] = capture("ref", ["--dtype", "bf16"])
    timings["ref2"] = capture("ref2", ["--dtype", "bf16"])
    timings["oracle"] = capture("oracle", ["--dtype", "fp32", "--weights-from", "bf16"], P("ref.h5"),
                                convert=True)
    cands = [("floor", "ref2", None, None, None)]
    jobs = []
    for f in features:
        jobs.append((f, ["--dtype", "bf16", "--feature", f]))
        cands.append(("transparent", f, f, None, None))
    for fam, size, spec in bugs:
        name = "bug-" + spec.replace(":", "_")
        jobs.append((name, ["--dtype", "bf16", "--bug", spec]))
        cands.append(("bug", name, spec, fam, size))
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        done = {n: ex.submit(capture, n, args, P("ref.h5")) for n, args in jobs}
        for n, fut in done.items():
            timings[n] = fut.result()

    def compare(name, key, *opts):
        js = P("%s.%s.json" % (name, key))
        cmd = [cmp_bin, P("ref.h5"), P(name + ".h5"), "--json", js, "--quiet", *opts]
        rc, secs = sh(cmd, js + ".log", 600)
        if rc == 2 or not os.path.exists(js):
            sys.exit("study: probe-compare %s failed: see %s.log" % (name, js))
        j = json.load(open(js))
        j["_seconds"] = secs
        return j

    def three(name, what):
        cause = TRANSPARENT.get(what, "backend-swap")
        return {"T1": compare(name, "T1"),
                "T1-relaxed": compare(name, "T1-relaxed", "--gate", "T1-relaxed:" + cause),
                "oracle": compare(name, "oracle", "--oracle", P("oracle.h5"))}
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        results = [ex.submit(three, c[1], c[2]) for c in cands]
        results = [r.result() for r in results]
    rows = []
    for (kind, name, what, fam, size), res in zip(cands, results):
        # a candidate identical to the reference did not exercise anything: no verdict
        # on it counts as a false alarm or a detection
        identical = not res["T1"]["feature_active"]
        row = {"kind": kind, "name": name, "what": what, "family": fam, "size": size,
               "identical": identical, "verdicts": {},
               "compare_seconds": {k: v["_seconds"] for k, v in res.items()}}
        for v in VERDICTS:
            j = res["oracle" if v == "oracle" else "T1" if v == "T1" else "T1-relaxed"]
            if v in ("T1", "T1-relaxed"):
                fail = j["gate_verdict"] == "fail" or j["missing_in_candidate"] or j["missing_in_reference"]
            else:
                fail = j["verdict"] == "fail" and not j["feature_not_active"]
            intro = j.get("introduced") or {}
            row["verdicts"][v] = {
                "fail": bool(fail) and not identical,
                "first_failure": j["first_failure"],
                "reason": next((t["reasons"][-1] for t in j["tensors"]
                                if t["path"] == j["first_failure"] and t["reasons"]), None),
                "introduced": intro.get("call"),
                "introduced_kind": intro.get("kind"),
                "amplification": intro.get("amplification"),
            }
        # the bug's effect at its own block against the bf16 noise there (call 0)
        t1 = {t["path"]: t for t in res["T1"]["tensors"]}
        bpath = "/dit.block/%04d/out" % BUG_BLOCK
        row["block_rel_l2"] = t1.get(bpath, {}).get("rel_l2")
        row["dit_rel_l2"] = t1.get("/dit.step/0000/out.0", {}).get("rel_l2")
        o = {t["path"]: t for t in res["oracle"]["tensors"]}.get("/dit.step/0000/out.0", {})
        row["dit_oracle_ratio"] = (o.get("oracle") or {}).get("ratio")
        rows.append(row)

    noise = [r["block_rel_l2"] for r in rows if r["kind"] == "transparent" and r["block_rel_l2"]]
    noise_dit = [r["dit_rel_l2"] for r in rows if r["kind"] == "transparent" and r["dit_rel_l2"]]
    want = "/dit.block/%04d" % BUG_BLOCK if a.blocks else "/dit.step/0000"
    for r in rows:
        if r["kind"] == "bug":
            # the effect where the bug sits (its block, else the DiT output) over the largest
            # difference a transparent feature makes there: the bf16 noise
            inblock = a.blocks and r["family"] != "timestep"
            eff, base = (r["block_rel_l2"], noise) if inblock else (r["dit_rel_l2"], noise_dit)
            r["effect_over_noise"] = eff / max(base) if base and eff else None
            r["named_at"] = want if inblock else "/dit.step/0000"
            for v in VERDICTS:
                r["verdicts"][v]["named"] = r["verdicts"][v]["introduced"] == r["named_at"]
    cs = [r["compare_seconds"] for r in rows]
    cost = {"run_seconds_reference": timings.get("ref"), "run_seconds_oracle": timings.get("oracle"),
            "compare_seconds_T1": sum(c["T1"] for c in cs), "compare_seconds_oracle": sum(c["oracle"] for c in cs)}
    summary = {"device": a.device, "cost": cost, "size": a.size, "frames": a.frames, "steps": a.steps,
               "layers": a.layers, "blocks": a.blocks, "named_at": want, "bf16_noise_block": noise,
               "bf16_noise_dit": noise_dit, "seconds": timings, "rows": rows}
    json.dump(summary, open(P("study.json"), "w"), indent=1)
    json.dump(details(cands, results), open(P("details.json"), "w"))
    md = tables(summary)
    open(P("study.md"), "w").write(md)
    print(md)
    return 0


def details(cands, results):
    """Per candidate, per tensor, the numbers behind each verdict (compact lists):
    path, rel_l2, then (no oracle, T1-relaxed's systematic test) gain_z, gain share of the
    difference, channel_z, channel share, then (oracle) ratio, ratio_limit, channel excess
    z, its size, gain excess z, its size, the excess floor, the reference's error, verdict."""
    def num(x):
        return None if x is None else float("%.4g" % x)
    out = {"columns": ["path", "rel_l2", "gain_z", "gain_share", "channel_z", "channel_share",
                       "ratio", "ratio_limit", "channel_excess", "channel_excess_size",
                       "gain_excess", "gain_excess_size", "excess_floor", "err_reference",
                       "oracle_verdict"], "candidates": {}}
    for (kind, name, what, fam, size), res in zip(cands, results):
        orc = {t["path"]: t for t in res["oracle"]["tensors"]}
        rows = []
        for t in res["T1-relaxed"]["tensors"]:
            y, o, rel = t.get("systematic") or {}, (orc.get(t["path"]) or {}).get("oracle") or {}, t["rel_l2"]
            gs = abs(y["gain"]) / rel if y and rel else None
            cs = y.get("channel_size") / rel if y and rel and y.get("channels") else None
            ges = (abs(o["gain_candidate"]) - abs(o["gain_reference"])) if o and o.get("gain_candidate") is not None \
                and o.get("gain_reference") is not None else None
            rows.append([t["path"], num(rel), num(y.get("gain_z")), num(gs), num(y.get("channel_z")), num(cs),
                         num(o.get("ratio")), num(o.get("ratio_limit")), num(o.get("channel_excess")),
                         num(o.get("channel_excess_size")), num(o.get("gain_excess")), num(ges),
                         num(o.get("floor")), num(o.get("rel_l2_reference")), o.get("verdict")])
        out["candidates"][name] = {"kind": kind, "what": what, "tensors": rows}
    return out


def reuse(capture, P):
    """capture, except for runs whose capture and log are already there."""
    def again(name, *args, **kw):
        if os.path.exists(P(name + ".h5")) and os.path.exists(P(name + ".log")):
            return 0.0
        return capture(name, *args, **kw)
    return again


def tables(s):
    rows = s["rows"]
    out = ["Device %s, %dx%d, %d frames, %d steps, %d blocks%s; bugs planted in block %d; "
           "'named' = introduced at %s (the timestep bug: at /dit.step/0000, whose input it "
           "changes); effect / noise: the bug's rel_l2 %s over the largest a transparent feature "
           "makes there." % (s["device"], s["size"], s["size"], s["frames"], s["steps"], s["layers"],
                            ", blocks captured" if s["blocks"] else "", BUG_BLOCK, s["named_at"],
                            "at its block's output" if s["blocks"] else "at the DiT output (call 0)"),
           ""]
    out.append("| candidate | " + " | ".join(VERDICTS) + " | introduced (oracle verdict) |")
    # 'systematic' is T1-relaxed + the systematic test; T1 and T1-relaxed are the gates alone
    out.append("| --- |" + " --- |" * (len(VERDICTS) + 1))
    for r in rows:
        if r["kind"] == "bug":
            continue
        cells = ["identical" if r["identical"] else
                 "**false alarm**" if r["verdicts"][v]["fail"] else "pass" for v in VERDICTS]
        out.append("| %s (%s) | %s | %s |" % (r["what"] or "reference repeat", r["kind"], " | ".join(cells),
                                             r["verdicts"]["oracle"]["introduced"] or "-"))
    out += ["", "| bug | size | effect / bf16 noise at its block | " + " | ".join(VERDICTS) +
            " | introduced (oracle verdict) |", "| --- | --- | --- |" + " --- |" * (len(VERDICTS) + 1)]
    for r in rows:
        if r["kind"] != "bug":
            continue
        eff = r.get("effect_over_noise")
        cells = []
        for v in VERDICTS:
            x = r["verdicts"][v]
            cells.append(("detected" + (", named" if x.get("named") else "")) if x["fail"] else "missed")
        out.append("| %s | %g | %s | %s | %s |" % (r["family"], r["size"], "%.2f" % eff if eff else "-",
                                                  " | ".join(cells), r["verdicts"]["oracle"]["introduced"] or "-"))
    tr = [r for r in rows if r["kind"] == "transparent" and not r["identical"]]
    bugs = [r for r in rows if r["kind"] == "bug"]
    out.append("")
    for v in VERDICTS:
        fa = sum(r["verdicts"][v]["fail"] for r in tr)
        det = sum(r["verdicts"][v]["fail"] for r in bugs)
        nam = sum(bool(r["verdicts"][v].get("named")) and r["verdicts"][v]["fail"] for r in bugs)
        out.append("- %s: %d of %d transparent features (not identical to the reference) fail: false "
                   "alarms; %d of %d bugs detected, %d named where they sit" % (v, fa, len(tr), det,
                                                                              len(bugs), nam))
    c = s.get("cost") or {}
    if c.get("run_seconds_reference"):
        out.append("- cost of the oracle: its run %.1f s against the reference's %.1f s (each a whole "
                   "process under probe-run); comparing every candidate took %.1f s with --oracle "
                   "against %.1f s without" % (c["run_seconds_oracle"], c["run_seconds_reference"],
                                               c["compare_seconds_oracle"], c["compare_seconds_T1"]))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
