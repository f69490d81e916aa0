"""The lossy mutation study on the CPU (bench/mutation/study.py --lossy --quick: the
real diffusers WanPipeline of the probe venv in bfloat16 at 64x64, 9 frames, 4 blocks
captured; fp8-storage, fp8-gemm and fbcache; T2 calibrated on seeds 1-2, judged on
the unseen seeds 3-4; docs/mutation.md "Lossy features").

It asserts what holds whatever T2 computes: the study ran, probe-calibrate wrote a
calibration file per feature, the table has a row for every feature, unseen seed
and candidate, every feature-alone candidate differs from its reference (the feature
ran), every bug candidate differs from the feature-alone candidate of its seed, and
a bug planted in a block changes that block's output first (the DiT step's output
for fbcache, whose runs do not capture the blocks). The verdicts (detections and
false alarms of T2 and T1-relaxed) are printed, not asserted: they measure the gate.

Skipped (77) when the venv of scripts/setup ($PROBE_VENV, default
~/.cache/probe-venv) has no torch/diffusers.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import BUILD, check, finish, need_build, diffusers_venv_python  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FEATURES = ["fp8-storage", "fp8-gemm", "fbcache"]
CALIB, TEST = 2, 2


def main():
    need_build()
    build = os.path.abspath(BUILD)
    py = diffusers_venv_python()
    out = tempfile.mkdtemp(prefix="probe-lossy-")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "mutation", "study.py"), "--python", py,
                        "--bin", os.path.join(build, "bin"), "--device", "cpu", "--size", "64",
                        "--frames", "9", "--steps", "4", "--layers", "4", "--blocks", "--quick",
                        "--lossy", ",".join(FEATURES), "--calib-seeds", str(CALIB), "--test-seeds", str(TEST),
                        "--jobs", "2", "--threads", "1", "--out", out],
                       capture_output=True, text=True, timeout=3000)
    print(p.stdout[-6000:])
    if p.returncode != 0:
        print(p.stderr[-3000:])
    check(p.returncode == 0, "the lossy study ran (exit %d)" % p.returncode)
    if p.returncode != 0:
        return finish()
    s = json.load(open(os.path.join(out, "lossy.json")))
    md = open(os.path.join(out, "lossy.md")).read()
    unseen = list(range(CALIB + 1, CALIB + TEST + 1))
    check(s["test_seeds"] == unseen, "unseen seeds %s" % s["test_seeds"])
    for f in FEATURES:
        cal = os.path.join(out, s["calibration"][f]["file"])
        ok = os.path.exists(cal) and json.load(open(cal)).get("format") == "probe-calibration"
        check(ok, "probe-calibrate wrote %s's calibration (exit %d)" % (f, s["calibration"][f]["exit"]))
        ho = s["calibration"][f].get("held_out") or {}
        res = ho.get("results", [])
        check(ho.get("pairs") == CALIB and [x["pair"] for x in res] == list(range(CALIB))
              and ho.get("failed") == sum(x["verdict"] == "fail" for x in res)
              and all(x["verdict"] == "pass" or x.get("first_failure") for x in res)
              and ("| %s | " % f) in md and ("| %d/%d" % (ho.get("failed", -1), CALIB)) in md,
              "%s: the held-out check judged each of the %d calibration pairs, in the table (%r)"
              % (f, CALIB, ho))
        for seed in unseen:
            alone = [r for r in s["rows"] if r["feature"] == f and r["seed"] == seed and r["role"] == "feature"]
            check(len(alone) == 1, "%s alone on unseen seed %d has a row" % (f, seed))
            check(all(r["verdicts"]["T2"]["feature_active"] for r in alone),
                  "%s alone differs from its reference on seed %d" % (f, seed))
            check(("| %s | feature alone | %d |" % (f, seed)) in md, "lossy.md: %s alone, seed %d" % (f, seed))
            for b in s["bugs"]:
                rows = [r for r in s["rows"] if r["feature"] == f and r["seed"] == seed and r["bug"] == b]
                check(len(rows) == 1 and ("| %s | %s | %d |" % (f, b, seed)) in md,
                      "%s + %s on seed %d has a row in lossy.json and lossy.md" % (f, b, seed))
                if len(rows) != 1:
                    continue
                vf = rows[0]["vs_feature"]
                check((vf["dit_rel_l2"] or 0) > 0, "%s + %s on seed %d differs from %s alone (rel_l2 %s)"
                      % (f, b, seed, f, vf["dit_rel_l2"]))
                if not b.startswith("timestep"):
                    want = rows[0]["named_at"] + ("/out" if rows[0]["blocks"] else "/out.0")
                    check(vf["first_differing"] == want, "%s + %s on seed %d changes %s first (got %s)"
                          % (f, b, seed, want, vf["first_differing"]))
        for gate in s["gates"]:
            check(("| %s | %s |" % (f, gate)) in md, "lossy.md summarises %s under %s" % (f, gate))
    for f in FEATURES:
        for gate in s["gates"]:
            fa = sum(r["verdicts"][gate]["fail"] for r in s["rows"] if r["feature"] == f and r["role"] == "feature")
            bugs = [r for r in s["rows"] if r["feature"] == f and r["role"] == "bug"]
            det = sum(r["verdicts"][gate]["fail"] for r in bugs)
            nam = sum(r["verdicts"][gate]["fail"] and r["verdicts"][gate]["named"] for r in bugs)
            print("MEASURED %s %s: %d of %d false alarms on unseen seeds; %d of %d bug candidates detected, "
                  "%d named where they sit" % (f, gate, fa, TEST, det, len(bugs), nam))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
