#!/usr/bin/env python3
"""Derive T2 thresholds (docs/calibration.md) from probe-compare JSON results
of repeated feature-off / feature-on runs (e.g. fp32 vs bf16 on several
seeds): per component, the worst observed drift times a stated headroom.

  calibrate.py --feature bf16 --headroom 1.5 --out cal.json run1.json run2.json ...

rel_l2_max, p99_abs_max, max_abs_max = headroom * worst observed value;
cosine_min = 1 - headroom * (1 - worst observed cosine). Element-wise
atol/rtol are left out (mismatch fraction unchecked): a lossy feature is
judged by its norms and tails. The observed statistics and the evidence
(input files, their references/candidates, date) are written with them."""
import argparse
import datetime
import json
import math

ap = argparse.ArgumentParser()
ap.add_argument("--feature", required=True)
ap.add_argument("--headroom", type=float, default=1.5)
ap.add_argument("--out", required=True)
ap.add_argument("results", nargs="+", help="probe-compare --json files")
args = ap.parse_args()

obs = {}
evidence = []
for path in args.results:
    with open(path) as f:
        res = json.load(f)
    evidence.append({"result": path.rsplit("/", 1)[-1], "reference": res["reference"].rsplit("/", 1)[-1],
                     "candidate": res["candidate"].rsplit("/", 1)[-1], "tensors": len(res["tensors"])})
    for t in res["tensors"]:
        if t["rel_l2"] is None or t["nan_cand"]:
            raise SystemExit("calibrate: %s %s has a non-finite metric; cannot calibrate on it" % (path, t["path"]))
        o = obs.setdefault(t["component"], {"rel_l2": 0.0, "cosine": 1.0, "p99_abs": 0.0, "max_abs": 0.0,
                                            "tensors": 0})
        o["rel_l2"] = max(o["rel_l2"], t["rel_l2"])
        o["cosine"] = min(o["cosine"], t["cosine"])
        o["p99_abs"] = max(o["p99_abs"], t["p99_abs"] or 0.0)
        o["max_abs"] = max(o["max_abs"], t["max_abs"] or 0.0)
        o["tensors"] += 1

h = args.headroom
components = {}
for name, o in sorted(obs.items()):
    components[name] = {
        "rel_l2_max": h * o["rel_l2"],
        "cosine_min": max(-1.0, 1.0 - h * (1.0 - o["cosine"])),
        "p99_abs_max": h * o["p99_abs"],
        "max_abs_max": h * o["max_abs"],
        "observed": {"rel_l2_max": o["rel_l2"], "cosine_min": o["cosine"], "p99_abs_max": o["p99_abs"],
                     "max_abs_max": o["max_abs"], "tensors": o["tensors"], "runs": len(args.results)},
    }
cal = {"format": "probe-calibration", "version": 1, "feature": args.feature, "headroom": h,
       "components": components,
       "evidence": {"runs": evidence, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "method": "worst observed per component x headroom (scripts/gpu/calibrate.py)"}}
with open(args.out, "w") as f:
    json.dump(cal, f, indent=1)
for name, c in components.items():
    print("%-16s rel_l2_max %.4g  cosine_min %.8f  p99_abs_max %.4g  max_abs_max %.4g" % (
        name, c["rel_l2_max"], c["cosine_min"], c["p99_abs_max"], c["max_abs_max"]))
