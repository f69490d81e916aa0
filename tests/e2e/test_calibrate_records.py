"""probe-calibrate --records (docs/calibration.md "Records from tests"): T2
thresholds from the statistics tests recorded (JSON lines of probe-record,
pytest --probe-record), by the same rule as from capture files. The
thresholds must equal the worst recorded value x headroom computed here;
records of other features are left out; floor records give the T1 check
(none for a component: exit 1, the file still written); the architectures go
to the evidence; the file gates a tensor in probe.compare(gate="T2") as
expected; bad records exit 2 with one line naming FILE:LINE."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

BUILD = os.path.abspath(os.environ.get("PROBE_BUILD_DIR", "build"))
CAL = os.path.join(BUILD, "bin", "probe-calibrate")
sys.path.insert(0, os.path.join(BUILD, "share", "probe", "python"))
import probe  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run([CAL, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def close(a, b, tol=1e-12):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def rec(component, feature, kind, arch, **stats):
    return {"format": "probe-record", "version": 1, "test": "test_x.py::t", "component": component,
            "feature": feature, "kind": kind, "arch": arch, "stats": stats}


tmp = tempfile.mkdtemp(prefix="probe-cal-rec.")
P = lambda n: os.path.join(tmp, n)
TOL = {"atol": 1e-3, "rtol": 1e-3}
dit = [dict(rel_l2=0.01, cosine=0.99995, max_abs=0.1, p99_abs=0.05, mismatch_fraction=0.2, gain_z=-3.0, **TOL),
       dict(rel_l2=0.03, cosine=0.9990, max_abs=0.2, p99_abs=0.09, mismatch_fraction=0.4, gain_z=5.0, **TOL),
       dict(rel_l2=0.02, cosine=0.9995, max_abs=0.35, p99_abs=0.07, mismatch_fraction=0.3, gain_z=1.0, **TOL)]
vae = [dict(rel_l2=0.004, cosine=0.99999, max_abs=0.02, p99_abs=0.01, mismatch_fraction=0.05, **TOL),
       dict(rel_l2=0.006, cosine=0.99998, max_abs=0.03, p99_abs=0.02, mismatch_fraction=0.6, **TOL)]
floor = {"dit.step": [dict(rel_l2=0.0, cosine=1.0, max_abs=0.0), dict(rel_l2=1e-6, cosine=1 - 1e-12, max_abs=1e-6)],
         "vae.decode": [dict(rel_l2=2e-7, cosine=1.0, max_abs=1e-7)]}
with open(P("a.jsonl"), "w") as f:
    for s in dit[:2]:
        f.write(json.dumps(rec("dit.step", "fp8", "feature", "sm_90", **s)) + "\n")
    f.write("\n")   # blank lines are allowed
    f.write(json.dumps(rec("dit.step", "bf16", "feature", "sm_80", rel_l2=0.5, cosine=0.5, max_abs=9.0)) + "\n")
    for s in floor["dit.step"]:
        f.write(json.dumps(rec("dit.step", "fp8", "floor", "sm_90", **s)) + "\n")
with open(P("b.jsonl"), "w") as f:
    f.write(json.dumps(rec("dit.step", "fp8", "feature", "sm_100", **dit[2])) + "\n")
    for s in vae:
        f.write(json.dumps(rec("vae.decode", "fp8", "feature", "sm_100", **s)) + "\n")
    for s in floor["vae.decode"]:
        f.write(json.dumps(rec("vae.decode", "fp8", "floor", "sm_100", **s)) + "\n")

H = 2.0
rc, out, err = run("--feature", "fp8", "--headroom", str(H), "--records", P("a.jsonl"), "--records", P("b.jsonl"),
                   "--out", P("cal.json"))
check(rc == 0 and err == "", "--records: exit 0, T1 above the floor everywhere (%d %s)" % (rc, err.strip()))
check("feature fp8: 5 record(s), 3 floor record(s) (1 of other features left out)" in out,
      "summary line counts records: %r" % out.splitlines()[:1])
cal = json.load(open(P("cal.json")))
check(cal["format"] == "probe-calibration" and cal["version"] == 1 and cal["feature"] == "fp8"
      and cal["headroom"] == H and cal["structure"] == {}, "a version-1 file for fp8, no structure entries")
check(sorted(cal["components"]) == ["dit.step", "vae.decode"], "one entry per recorded component")
for name, samples in (("dit.step", dit), ("vae.decode", vae)):
    e = cal["components"].get(name, {})
    want = {"rel_l2_max": H * max(s["rel_l2"] for s in samples),
            "cosine_min": 1 - H * max(1 - s["cosine"] for s in samples),
            "max_abs_max": H * max(s["max_abs"] for s in samples),
            "p99_abs_max": H * max(s["p99_abs"] for s in samples),
            "mismatch_fraction_max": min(1.0, H * max(s["mismatch_fraction"] for s in samples))}
    if name == "dit.step":
        want["gain_z_max"] = H * max(abs(s["gain_z"]) for s in samples)
    for k, v in want.items():
        check(k in e and close(e[k], v), "%s %s %r == worst x headroom %r" % (name, k, e.get(k), v))
    check(name != "vae.decode" or "gain_z_max" not in e, "vae.decode: no gain_z recorded, no gain_z_max")
    check(e.get("atol") == 1e-3 and e.get("rtol") == 1e-3, "%s: the records' atol/rtol" % name)
    obs = e.get("observed", {})
    check(obs.get("runs") == len(samples) and obs.get("tensors") == len(samples)
          and close(obs["rel_l2"]["mean"], np.mean([s["rel_l2"] for s in samples])),
          "%s observed: %d records, mean rel_l2" % (name, len(samples)))
    fl = obs.get("floor", {})
    check(fl.get("runs") == len(floor[name]) and close(fl["rel_l2"]["max"], max(s["rel_l2"] for s in floor[name]))
          and obs.get("t1_above_floor") is True, "%s floor: the floor records, T1 above it" % name)
ev = cal["evidence"]
check(ev["architectures"] == ["sm_90", "sm_100"] and ev["records"] == {"feature": 5, "floor": 3, "other_features": 1}
      and [f["role"] for f in ev["files"]] == ["records", "records"] and ev["method"].startswith("probe-calibrate --records"),
      "evidence: the records' architectures (not the other feature's sm_80), counts, files (%r)"
      % {k: ev.get(k) for k in ("architectures", "records")})

# the file gates in probe.compare(gate="T2") as thresholds from capture files do
rng = np.random.default_rng(3)
r = rng.standard_normal(4096)
noise = rng.standard_normal(4096)
noise -= noise.dot(r) / r.dot(r) * r   # no gain error
for target, want in ((0.05, "pass"), (0.07, "fail")):
    c = r + noise * (target * np.linalg.norm(r) / np.linalg.norm(noise))
    res = probe.compare(r, c, gate="T2", calibration=P("cal.json"), component="dit.step",
                        atol=1.0, rtol=1.0)  # leave out max_abs-free element-wise counting
    check(res["verdict"] == want and close(res["rel_l2"], target, 1e-9),
          "T2 from records: rel_l2 %.2g against rel_l2_max %.2g: %s (%r)" % (target, 0.06, want, res["reasons"]))

# a component without floor records: the file is written, exit 1
with open(P("nofloor.jsonl"), "w") as f:
    for s in dit:
        f.write(json.dumps(rec("dit.step", "fp8", "feature", "sm_90", **s)) + "\n")
rc, out, err = run("--feature", "fp8", "--records", P("nofloor.jsonl"), "--out", P("cal2.json"))
check(rc == 1 and os.path.exists(P("cal2.json")) and "dit.step (floor not measured)" in out,
      "no floor record: exit 1, the file written, the summary says the floor was not measured (%d)" % rc)
check(close(json.load(open(P("cal2.json")))["components"]["dit.step"]["rel_l2_max"], 1.5 * 0.03),
      "the default headroom 1.5")

# bad input: exit 2, one line, no file
good = json.dumps(rec("dit.step", "fp8", "feature", "sm_90", **dit[0]))
bad = [
    ("notjson", [good, "{not json"], "notjson.jsonl:2: not a JSON object"),
    ("format", [json.dumps(dict(json.loads(good), format="probe-matrix"))], ":1: not a probe-record"),
    ("version", [json.dumps(dict(json.loads(good), version=2))], "version 2 is not supported"),
    ("nostats", [json.dumps({k: v for k, v in json.loads(good).items() if k != "stats"})], "\"stats\" object"),
    ("norel", [json.dumps(rec("dit.step", "fp8", "feature", "x", cosine=1.0, max_abs=0.1))], "stats lacks \"rel_l2\""),
    ("cos", [json.dumps(rec("dit.step", "fp8", "feature", "x", rel_l2=0.1, cosine=1.5, max_abs=0.1))],
     "\"cosine\" 1.5 is outside [-1, 1]"),
    ("str", [json.dumps(rec("dit.step", "fp8", "feature", "x", rel_l2="0.1", cosine=1.0, max_abs=0.1))],
     "\"rel_l2\" must be a number"),
    ("kind", [json.dumps(rec("dit.step", "fp8", "other", "x", **dit[0]))], "kind 'other' is not feature or floor"),
    ("comp", [json.dumps(rec("dit.stp", "fp8", "feature", "x", **dit[0]))], "unknown component 'dit.stp'"),
    ("tol", [good, json.dumps(rec("dit.step", "fp8", "feature", "x", **dict(dit[1], atol=0.5)))],
     "tol.jsonl:2: mismatch_fraction at atol 0.5 rtol 0.001, but"),
    ("other", [json.dumps(rec("dit.step", "bf16", "feature", "x", **dit[0]))],
     "no record of feature 'fp8' of kind feature in the records (1 of other features: bf16)"),
    ("zero", [json.dumps(rec("dit.step", "fp8", "feature", "x", rel_l2=0.0, cosine=1.0, max_abs=0.0))],
     "feature not active"),
]
for name, lines, needle in bad:
    with open(P(name + ".jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    out_path = P("bad-%s.json" % name)
    rc, out, err = run("--feature", "fp8", "--records", P(name + ".jsonl"), "--out", out_path)
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and el[0].startswith("probe-calibrate: ") and needle in el[0]
          and not os.path.exists(out_path), "bad records %s: exit 2, one line with %r (%d %r)" % (name, needle, rc, err))
for argv, needle in [(["--records", P("missing.jsonl")], "missing.jsonl: cannot open"),
                     (["--records", P("a.jsonl"), "--reference", P("a.jsonl"), "--candidate", P("a.jsonl")],
                      "cannot be mixed"),
                     (["--records", P("a.jsonl"), "--references-differ"], "--references-differ"),
                     (["--records", P("a.jsonl"), "--out", P("a.jsonl")], "refusing to overwrite")]:
    if "--out" not in argv:
        argv = argv + ["--out", P("x.json")]
    rc, out, err = run("--feature", "fp8", *argv)
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and needle in el[0], "%r: exit 2, %r (%d %r)" % (argv[:2], needle, rc, err))

import shutil  # noqa: E402
shutil.rmtree(tmp, ignore_errors=True)
print("test_calibrate_records: %d failed" % len(failures))
sys.exit(1 if failures else 0)
