"""probe-compare end to end on files written by h5py: metric values against a
numpy fp64 oracle, docs/compare-json.md's JSON keys, exit codes 0/1/2, and bad input
(missing, empty, truncated, non-HDF5 files, bad options) that must give a
one-line message naming the thing and exit 2, never a crash."""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run([COMPARE, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def oracle(r, c, atol, rtol):
    """docs/metrics.md's definitions in numpy fp64, finite indices only."""
    r = r.astype(np.float64).ravel()
    c = c.astype(np.float64).ravel()
    fin = np.isfinite(r) & np.isfinite(c)
    rf, cf = r[fin], c[fin]
    d = np.abs(cf - rf)
    nr, nc = np.linalg.norm(rf), np.linalg.norm(cf)
    out = {
        "rel_l2": np.linalg.norm(cf - rf) / nr if nr > 0 else (0.0 if np.all(cf == rf) else None),
        "cosine": (1.0 if nr == 0 and nc == 0 else 0.0 if nr == 0 or nc == 0
                   else float(np.clip(np.dot(rf, cf) / (nr * nc), -1, 1))),
        "max_abs": float(d.max()) if d.size else None,
        "p99_abs": float(np.percentile(d, 99, method="inverted_cdf")) if d.size else None,
        "mean_abs": float(d.mean()) if d.size else None,
    }
    mism = np.zeros(r.shape, bool)
    mism[fin] = d > atol + rtol * np.abs(rf)
    nonfin = ~fin
    same_inf = np.isinf(r) & (r == c)
    both_nan = np.isnan(r) & np.isnan(c)
    mism |= nonfin & ~(same_inf | both_nan)
    out["mismatch_fraction"] = float(mism.sum()) / r.size if r.size else 0.0
    if d.size:
        flat = np.flatnonzero(fin)[int(np.argmax(d))]
        out["max_abs_flat"] = int(flat)
    return out


def close(a, b, tol=1e-12):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol * max(1.0, abs(b))


tmp = tempfile.mkdtemp(prefix="probe-compare-cli-")
ref_path, cand_path = os.path.join(tmp, "ref.h5"), os.path.join(tmp, "cand.h5")
rng = np.random.default_rng(7)
tensors = {
    "/text_encoder/0000/out": rng.standard_normal((2, 8, 16)).astype(np.float32),
    "/dit.step/0000/out": rng.standard_normal((1, 4, 3, 8, 8)).astype(np.float16),
    "/dit.step/0001/out": rng.standard_normal((1, 4, 3, 8, 8)),
    "/scheduler.step/0000/out.prev_sample": rng.standard_normal((5, 7)).astype(np.float32),
    "/misc/ints": rng.integers(-50, 50, size=(10,)).astype(np.int32),
}
cands = {k: v.copy() for k, v in tensors.items()}
cands["/dit.step/0000/out"] = (tensors["/dit.step/0000/out"].astype(np.float32)
                               * np.float32(1.01)).astype(np.float16)
cands["/dit.step/0001/out"] = tensors["/dit.step/0001/out"] + 1e-7 * rng.standard_normal((1, 4, 3, 8, 8))
cands["/scheduler.step/0000/out.prev_sample"][2, 3] += 0.5
with h5py.File(ref_path, "w") as f:
    for k, v in tensors.items():
        f.create_dataset(k, data=v)
with h5py.File(cand_path, "w") as f:
    for k, v in cands.items():
        f.create_dataset(k, data=v)

# 1. identical files pass with exit 0 and every tensor identical when identity is
#    expected (--expect-identical, the determinism floor) ...
rc, out, err = run(ref_path, ref_path, "--expect-identical", "--json", "-")
res = json.loads(out)
check(rc == 0 and res["verdict"] == "pass",
      "reference vs itself --expect-identical: exit 0, verdict pass (rc=%d)" % rc)
check(all(t["identical"] for t in res["tensors"]), "reference vs itself: every tensor identical")
check(res["feature_active"] is False, "reference vs itself: feature_active false")
# ... and fail as "feature not active" (exit 1) without it.
rc, out, err = run(ref_path, ref_path, "--json", "-")
res = json.loads(out)
check(rc == 1 and res["verdict"] == "fail" and res["feature_not_active"] is True,
      "reference vs itself without --expect-identical: exit 1, feature not active (rc=%d)" % rc)
check(res["reasons"] == ["feature not active: the candidate is identical to the reference in "
                         "every compared tensor"], "feature-not-active reason: %r" % res["reasons"])

# 2. numbers against the numpy oracle, JSON keys, first failure in path order (h5py files carry no seq).
rc, out, err = run(ref_path, cand_path, "--json", "-")
res = json.loads(out)
check(rc == 1, "perturbed candidate: exit 1 (rc=%d)" % rc)
for key in ["format", "version", "reference", "candidate", "gate", "verdict", "first_failure",
            "feature_active", "missing_in_candidate", "missing_in_reference", "tensors"]:
    check(key in res, "JSON has key %s" % key)
check(res["format"] == "probe-compare" and res["version"] == 1, "JSON format/version")
for key in ["name", "atol", "rtol", "rel_l2_max", "cosine_min"]:
    check(key in res["gate"], "JSON gate has %s" % key)
g = res["gate"]
check(g["name"] == "T1" and g["atol"] == 1e-3 and g["rtol"] == 1e-3 and g["rel_l2_max"] == 1e-2
      and g["cosine_min"] == 0.9999, "default gate is T1 with CONTRACT thresholds")
by_path = {t["path"]: t for t in res["tensors"]}
check(sorted(by_path) == sorted(tensors), "every tensor compared")
check([t["path"] for t in res["tensors"]] == sorted(tensors), "tensors in path order (no seq)")
tkeys = ["path", "component", "dtype", "shape", "n", "rel_l2", "cosine", "max_abs", "max_abs_index",
         "p99_abs", "mean_abs", "mismatch_fraction", "nan_ref", "nan_cand", "inf_ref", "inf_cand",
         "zero_norm_reference", "identical", "verdict", "reasons"]
for p, t in by_path.items():
    missing = [k for k in tkeys if k not in t]
    check(not missing, "%s has every tensor key %s" % (p, missing))
    o = oracle(tensors[p], cands[p], g["atol"], g["rtol"])
    for k in ["rel_l2", "cosine", "max_abs", "p99_abs", "mean_abs", "mismatch_fraction"]:
        check(close(t[k], o[k]), "%s %s = %r (numpy %r)" % (p, k, t[k], o[k]))
    idx = list(np.unravel_index(o["max_abs_flat"], tensors[p].shape))
    check(t["max_abs_index"] == [int(i) for i in idx], "%s max_abs_index %r" % (p, t["max_abs_index"]))
    check(t["shape"] == list(tensors[p].shape) and t["n"] == tensors[p].size, "%s shape/n" % p)
check(by_path["/dit.step/0000/out"]["dtype"] == "float16", "h5py f2 read as float16")
check(by_path["/misc/ints"]["dtype"] == "int32", "h5py i4 read as int32")
check(by_path["/text_encoder/0000/out"]["verdict"] == "pass", "text encoder passes")
check(by_path["/dit.step/0000/out"]["verdict"] == "fail", "dit.step 0 fails")
check(by_path["/dit.step/0001/out"]["verdict"] == "pass", "dit.step 1 (1e-7 noise) passes")
check(res["first_failure"] == "/dit.step/0000/out", "first failure %r" % res["first_failure"])
check(by_path["/dit.step/0000/out"]["component"] == "dit.step", "component from the path")

# 3. missing tensors on either side fail the run and are listed.
extra = os.path.join(tmp, "extra.h5")
with h5py.File(extra, "w") as f:
    for k, v in tensors.items():
        if k != "/misc/ints":
            f.create_dataset(k, data=v)
    f.create_dataset("/vae.decode/0000/out", data=np.zeros(3, np.float32))
rc, out, err = run(ref_path, extra, "--json", "-")
res = json.loads(out)
check(rc == 1 and res["missing_in_candidate"] == ["/misc/ints"], "missing in candidate listed, exit 1")
check(res["missing_in_reference"] == ["/vae.decode/0000/out"], "missing in reference listed")
rc, out, err = run(ref_path, extra, "--only", "/dit.step/*", "--expect-identical")
check(rc == 0, "--only restricts to matching paths (rc=%d)" % rc)

# 4. shape mismatch: a failing tensor with the reason, exit 1 (not 2).
shp = os.path.join(tmp, "shape.h5")
with h5py.File(shp, "w") as f:
    for k, v in tensors.items():
        f.create_dataset(k, data=v.reshape(-1) if k == "/misc/ints" else v)
    f["/misc/ints"].attrs["note"] = "flattened"
with h5py.File(shp, "a") as f:
    del f["/misc/ints"]
    f.create_dataset("/misc/ints", data=np.zeros((2, 5), np.int32))
rc, out, err = run(ref_path, shp, "--json", "-")
res = json.loads(out)
t = {t["path"]: t for t in res["tensors"]}["/misc/ints"]
check(rc == 1 and t["verdict"] == "fail" and "shape mismatch" in t["reasons"][0],
      "shape mismatch fails the tensor with a reason: %r" % t["reasons"])

# 5. NaN in the candidate fails; the NaN is excluded from the norms.
nan = os.path.join(tmp, "nan.h5")
with h5py.File(nan, "w") as f:
    for k, v in tensors.items():
        w = v.copy()
        if k == "/text_encoder/0000/out":
            w[0, 0, 0] = np.nan
        f.create_dataset(k, data=w)
rc, out, err = run(ref_path, nan, "--json", "-", "--only", "/text_encoder/*")
t = json.loads(out)["tensors"][0]
check(rc == 1 and t["nan_cand"] == 1 and t["verdict"] == "fail", "NaN in candidate fails")
check(t["rel_l2"] == 0.0, "NaN index excluded from rel_l2")

# 6. T1-relaxed passes what T1 fails; T2 with a calibration file.
rc, out, err = run(ref_path, cand_path, "--gate", "T1-relaxed:backend-swap", "--only", "/dit.step/0001/*")
check(rc == 0, "T1-relaxed:backend-swap accepted (rc=%d %s)" % (rc, err.strip()))
cal = os.path.join(tmp, "cal.json")
with open(cal, "w") as f:
    json.dump({"format": "probe-calibration", "version": 1, "feature": "test",
               "components": {"dit.step": {"rel_l2_max": 0.05, "cosine_min": 0.99},
                              "text_encoder": {"rel_l2_max": 0.0},
                              "scheduler.step": {"rel_l2_max": 1.0}}}, f)
rc, out, err = run(ref_path, cand_path, "--gate", "T2", "--calibration", cal, "--only", "/dit.step/*",
                   "--json", "-")
check(rc == 0, "T2 with calibration passes dit.step (rc=%d %s)" % (rc, err.strip()))

# 6b. nothing compared is never a pass: empty captures, a glob that selects
# nothing, files holding only non-numeric (here complex) datasets.
cplx_a, cplx_b = os.path.join(tmp, "cplx_a.h5"), os.path.join(tmp, "cplx_b.h5")
for pth, val in [(cplx_a, 1 + 2j), (cplx_b, 3 - 1j)]:
    with h5py.File(pth, "w") as f:
        f.create_dataset("/dit.step/0000/out", data=np.full(4, val, np.complex64))
for args, what in [((ref_path, cand_path, "--only", "/nomatch/*"), "--only matching nothing"),
                   ((cplx_a, cplx_b), "only complex datasets")]:
    rc, out, err = run(*args, "--json", "-")
    res = json.loads(out)
    check(rc == 1 and res["verdict"] == "fail" and res["nothing_compared"] is True
          and "nothing to compare" in err, "%s: exit 1, nothing_compared (rc=%d)" % (what, rc))
check(res["ignored_datasets"] == {"reference": 1, "candidate": 1} and "not numeric" in err,
      "complex datasets counted and reported as not compared: %r" % res["ignored_datasets"])
rc, out, err = run(ref_path, cand_path, "--atol", "0.5", "--rtol", "0.5", "--only", "/dit.step/0000/*")
check("gate T1 with --atol 0.5, --rtol 0.5" in out, "an --atol/--rtol override is named in the output")
rc, out, err = run("-h")
check(rc == 0 and "usage: probe-compare" in out, "-h prints the usage, exit 0")

# 7. bad input: exit 2 with one line naming the thing, never a crash.
empty = os.path.join(tmp, "empty.h5")
open(empty, "w").close()
text = os.path.join(tmp, "text.h5")
with open(text, "w") as f:
    f.write("this is not an HDF5 file\n" * 100)
trunc = os.path.join(tmp, "trunc.h5")
with open(ref_path, "rb") as f:
    data = f.read()
with open(trunc, "wb") as f:
    f.write(data[: len(data) // 2])
badcal = os.path.join(tmp, "badcal.json")
with open(badcal, "w") as f:
    json.dump({"format": "probe-calibration", "version": 1, "components": {"no_such_component": {}}}, f)
cases = [
    ((ref_path, os.path.join(tmp, "nope.h5")), "nope.h5"),
    ((empty, ref_path), "empty.h5"),
    ((ref_path, text), "text.h5"),
    ((ref_path, trunc), "trunc.h5"),
    ((ref_path,), "expected 2 files"),
    ((ref_path, cand_path, "--gate", "T3"), "T3"),
    ((ref_path, cand_path, "--gate", "T1-relaxed:because"), "because"),
    ((ref_path, cand_path, "--gate", "T2"), "calibration"),
    ((ref_path, cand_path, "--gate", "T2", "--calibration", os.path.join(tmp, "nocal.json")), "nocal.json"),
    ((ref_path, cand_path, "--gate", "T2", "--calibration", text), "text.h5"),
    ((ref_path, cand_path, "--gate", "T2", "--calibration", badcal), "no_such_component"),
    ((ref_path, cand_path, "--atol", "x"), "--atol"),
    ((ref_path, cand_path, "--rtol", "-1"), "--rtol"),
    ((ref_path, cand_path, "--frobnicate"), "--frobnicate"),
    ((ref_path, cand_path, "--json", os.path.join(tmp, "no", "dir", "x.json")), "x.json"),
    ((ref_path, cand_path, "--json", cand_path), "refusing to overwrite"),
    ((ref_path, cand_path, "--html", ref_path), "refusing to overwrite"),
    ((ref_path, cand_path, "--json", "-", "--html", "-"), "stdout"),
    ((ref_path, cand_path, "--calibration", cal), "only with --gate T2"),
]
for args, needle in cases:
    rc, out, err = run(*args)
    lines = [l for l in err.splitlines() if l.strip()]
    check(rc == 2 and len(lines) == 1 and needle in lines[0] and lines[0].startswith("probe-compare:"),
          "bad input %r -> exit 2, one line naming %r (rc=%d, stderr=%r)" % (args[-1], needle, rc, err[:200]))

# an output that cannot be written is refused before anything is compared: no table, no verdict
broken = os.path.join(tmp, "broken.json")
os.symlink(os.path.join(tmp, "no", "target.json"), broken)
for opt, path in (("--json", os.path.join(tmp, "no", "dir", "x.json")), ("--html", broken),
                  ("--junit", os.path.join(tmp, "no", "dir", "x.xml"))):
    rc, out, err = run(ref_path, cand_path, opt, path)
    check(rc == 2 and out == "" and err.count("\n") == 1 and
          err.startswith("probe-compare: cannot write ") and os.path.basename(path) in err,
          "%s %s that cannot be written -> exit 2 before comparing, one line (rc=%d, stdout %d bytes, "
          "stderr=%r)" % (opt, os.path.basename(path), rc, len(out), err[:200]))
check(os.path.islink(broken) and not os.path.exists(os.path.join(tmp, "no")),
      "the refused outputs created nothing (the symbolic link is left as it was)")

if failures:
    print("%d checks failed (files kept in %s)" % (len(failures), tmp))
    sys.exit(1)
shutil.rmtree(tmp)
print("all checks passed")
