"""probe-calibrate end to end on capture files written by h5py with known
drift: 3 references (tiny noise: the determinism floor) and 3 candidates
(larger noise: the feature). The thresholds must equal the numpy-computed
worst value x headroom (1e-12), the file must load in probe-compare --gate T2
and gate a 4th pair as expected (pass within, fail beyond), a floor above T1
exits 1, and bad input exits 2 with one line."""
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
CAL = os.path.join(BUILD, "bin", "probe-calibrate")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
ATOL = RTOL = 1e-3
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(exe, *args):
    p = subprocess.run([exe, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


# Tensors per component; the feature's noise differs per component.
SHAPES = {
    "/text_encoder/0000/out.last_hidden_state": (1, 16, 32),
    "/dit.step/0000/out.sample": (1, 4, 2, 8, 8),
    "/dit.step/0001/out.sample": (1, 4, 2, 8, 8),
    "/dit.step/0002/out.sample": (1, 4, 2, 8, 8),
    "/vae.decode/0000/out.sample": (1, 3, 2, 16, 16),
}
SIGMA = {"text_encoder": 5e-3, "dit.step": 1e-2, "vae.decode": 2e-2}


def comp(path):
    return path.split("/")[1]


def write(path, tensors, manifest=None):
    with h5py.File(path, "w") as f:
        for k, v in tensors.items():
            f.create_dataset(k, data=v.astype(np.float32))
        if manifest is not None:
            f.attrs["probe.manifest"] = json.dumps(manifest)
    # what probe reads back (float32), as float64 for the oracle
    return {k: v.astype(np.float32).astype(np.float64) for k, v in tensors.items()}


def metrics(r, c):
    r, c = r.ravel(), c.ravel()
    d = np.abs(c - r)
    nr, nc = np.linalg.norm(r), np.linalg.norm(c)
    return {
        "rel_l2": np.linalg.norm(c - r) / nr,
        "one_minus_cosine": 1.0 - float(np.clip(np.dot(r, c) / (nr * nc), -1, 1)),
        "p99_abs": float(np.percentile(d, 99, method="inverted_cdf")),
        "max_abs": float(d.max()),
        "mismatch_fraction": float((d > ATOL + RTOL * np.abs(r)).sum()) / r.size,
    }


def oracle(pairs):
    """Per component: worst and mean of each metric over every tensor of every pair."""
    samples = {}
    for r, c in pairs:
        for k in r:
            for m, v in metrics(r[k], c[k]).items():
                samples.setdefault(comp(k), {}).setdefault(m, []).append(v)
    return {cn: {m: (max(v), sum(v) / len(v)) for m, v in ms.items()} for cn, ms in samples.items()}


def close(a, b, tol=1e-12):
    return a is not None and abs(a - b) <= tol * max(abs(b), 1e-300)


def manifest(label, gpu, torch="2.5.1"):
    return {"format": "probe-manifest", "version": 1, "label": label, "command": ["python3", "gen.py"],
            "host": "gpu01", "torch": torch,
            "cuda": {"runtime_version": 12040, "driver_version": 12040, "devices": [gpu]}}


def channel_z(r, c, axis=1):
    """docs/metrics.md: the largest |z_k| = |mu_k| / (s_k / sqrt(n_k)) over the channels of axis,
    s_k the sample standard deviation of d = c - r; and its channel."""
    d = np.moveaxis(c - r, axis, 0).reshape(r.shape[axis], -1)
    z = np.abs(d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(d.shape[1])))
    return float(z.max()), int(z.argmax())


def channel_z_signed(r, c, axis=1):
    """Every channel's z_k (signed), as channel_z."""
    d = np.moveaxis(c - r, axis, 0).reshape(r.shape[axis], -1)
    return d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(d.shape[1]))


def z_limit(k, p=1e-6):
    """t with erfc(t / sqrt 2) = p / k (docs/gates.md, the systematic test), by bisection."""
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if math.erfc(mid / math.sqrt(2)) > p / k else (lo, mid)
    return 0.5 * (lo + hi)


def spread(zs):
    """The pooled spread of z_k about each channel's mean: squared deviations, dof."""
    z = np.array(zs)  # [N pairs, K channels]
    return float(((z - z.mean(axis=0)) ** 2).sum()), z.shape[1] * (z.shape[0] - 1)


def band(zs, h, comp):
    """docs/calibration.md "Structure per channel": per channel ceil(max(h worst |z_k|,
    |mean z_k| + t_K s sqrt(1 + 1/N))), s the pooled spread about each channel's mean, or the
    component's (comp) where larger."""
    z = np.array(zs)  # [N pairs, K channels]
    n, k = z.shape
    ss, dof = spread(zs)
    s = max(math.sqrt(ss / dof), comp)
    t = np.maximum(h * np.abs(z).max(axis=0), np.abs(z.mean(axis=0)) + z_limit(k) * s * math.sqrt(1 + 1 / n))
    return [math.ceil(x) for x in t], s


def structure(P, rng):
    """The feature biases channel 2 of one block; a candidate with a larger bias there fails T2 on
    the channel z although its rel_l2 is within the feature's drift; a fresh feature run passes."""
    shape, bias, sigma, h = (1, 8, 2, 8, 8), 8e-3, 1e-2, 2.0
    paths = ["/dit.step/0000/out.sample", "/dit.step/0001/out.sample"]
    base = {k: rng.standard_normal(shape) for k in paths}

    def feature(ref, b):
        c = {k: v + sigma * rng.standard_normal(shape) for k, v in ref.items()}
        c[paths[1]][:, 2] += b
        return c

    refs, worst, zs = [], {k: 0.0 for k in paths}, {k: [] for k in paths}
    args = ["--feature", "fp8", "--headroom", str(h)]
    for i in range(3):
        r = write(P("s-ref%d.h5" % i), {k: v + 1e-6 * rng.standard_normal(shape) for k, v in base.items()})
        c = write(P("s-cand%d.h5" % i), feature(r, bias))
        refs.append(r)
        args += ["--reference", P("s-ref%d.h5" % i), "--candidate", P("s-cand%d.h5" % i)]
        for k in paths:
            worst[k] = max(worst[k], channel_z(r[k], c[k])[0])
            zs[k].append(channel_z_signed(r[k], c[k]))
    rc, so, se = run(CAL, *args, "--out", P("s-cal.json"))
    check(rc == 0, "structure: probe-calibrate exit 0 [rc=%d %s]" % (rc, se.strip()))
    cal = json.load(open(P("s-cal.json")))
    st = cal.get("structure", {})
    check(sorted(st) == sorted(paths), "structure: one entry per tensor path (%r)" % sorted(st))
    for k in paths:
        e = st.get(k, {})
        check(close(e.get("channel_z_max"), h * worst[k], 1e-9)
              and close(e["observed"]["channel_z"]["max"], worst[k], 1e-9)
              and e["observed"]["runs"] == 3 and e["observed"]["floor"]["runs"] == 2,
              "structure %s: channel_z_max = %g x numpy's worst |z| (%r vs %r)"
              % (k, h, e.get("channel_z_max"), h * worst[k]))
        sd = [spread(zs[p]) for p in paths]
        comp = math.sqrt(sum(x for x, _ in sd) / sum(d for _, d in sd))
        want, sp = band(zs[k], h, comp)
        check(e.get("channel_z_max_by_channel") == want
              and close(e["observed"].get("channel_z_spread"), sp, 1e-9)
              and close(e["observed"].get("channel_t"), z_limit(8), 1e-9),
              "structure %s: channel_z_max_by_channel is numpy's prediction band (%r vs %r)"
              % (k, e.get("channel_z_max_by_channel"), want))
    comp_e = cal["components"]["dit.step"]
    check(close(comp_e.get("channel_z_max"), h * max(worst.values()), 1e-9),
          "structure: the component's channel_z_max = %g x its worst |z|" % h)
    limit = st[paths[1]]["channel_z_max"]
    limit2 = st[paths[1]]["channel_z_max_by_channel"][2]

    bug = feature(refs[0], 4 * bias)
    zb, kb = channel_z(refs[0][paths[1]], write(P("s-bug.h5"), bug)[paths[1]])
    check(zb > limit2 and kb == 2, "structure: the bug's z %g is above %g" % (zb, limit2))
    rc, so, se = run(COMPARE, P("s-ref0.h5"), P("s-bug.h5"), "--gate", "T2", "--calibration",
                     P("s-cal.json"), "--json", P("s-bug.json"))
    res = json.load(open(P("s-bug.json"))) if rc != 2 else {"tensors": []}
    t = {x["path"]: x for x in res["tensors"]}
    tb = t.get(paths[1], {"reasons": [], "gate": {}})
    want = "systematic shift of channel 2: |z| %.4g > %d " % (zb, limit2)
    check(rc == 1 and tb.get("verdict") == "fail" and any(x.startswith(want) and
          x.endswith("(the feature's own in that channel, calibrated with headroom 2)")
          for x in tb["reasons"])
          and tb.get("rel_l2", 1) <= comp_e["rel_l2_max"],
          "structure: T2 fails the bug on the channel z, its rel_l2 within the drift [rc=%d %r]"
          % (rc, tb["reasons"]))
    check(close(tb["gate"].get("channel_z_max"), limit, 1e-15) and "gain_z_max" in tb["gate"],
          "structure: the tensor's gate lists channel_z_max and gain_z_max")
    check(t.get(paths[0], {}).get("verdict") == "pass", "structure: the other block passes")
    write(P("s-fresh.h5"), feature(refs[0], bias))
    rc, so, se = run(COMPARE, P("s-ref0.h5"), P("s-fresh.h5"), "--gate", "T2", "--calibration",
                     P("s-cal.json"))
    check(rc == 0, "structure: a fresh run of the feature passes T2 [rc=%d %s]" % (rc, so[-300:]))


def main():
    rng = np.random.default_rng(1234)
    tmp = tempfile.mkdtemp(prefix="probe-cal-")
    P = lambda n: os.path.join(tmp, n)  # noqa: E731
    base = {k: rng.standard_normal(s) for k, s in SHAPES.items()}

    def noisy(src, sigma_of):
        return {k: v + sigma_of(comp(k)) * rng.standard_normal(v.shape) for k, v in src.items()}

    floor_sigma = lambda c: 1e-6  # noqa: E731
    refs, cands = [], []
    for i in range(4):  # the 4th pair is gated with the calibration, not used for it
        gpu = "NVIDIA H200" if i != 1 else "NVIDIA A100-SXM4-80GB"
        raw_r = noisy(base, floor_sigma)
        refs.append(write(P("ref%d.h5" % i), raw_r, manifest("ref%d" % i, gpu)))
        if i < 3:
            cands.append(write(P("cand%d.h5" % i), noisy(raw_r, lambda c: SIGMA[c]),
                               manifest("cand%d" % i, gpu)))
        else:
            write(P("within.h5"), noisy(raw_r, lambda c: 0.5 * SIGMA[c]))
            write(P("beyond.h5"), noisy(raw_r, lambda c: 3.0 * SIGMA[c]))

    args = ["--feature", "fp8"]
    for i in range(3):
        args += ["--reference", P("ref%d.h5" % i)]
    for i in range(3):
        args += ["--candidate", P("cand%d.h5" % i)]

    # --- default headroom 1.5; and 2 ---
    for h in (None, 2.0):
        hr = 1.5 if h is None else h
        extra = [] if h is None else ["--headroom", str(h)]
        out = P("cal-%s.json" % hr)
        rc, so, se = run(CAL, *args, *extra, "--out", out)
        check(rc == 0, "headroom %g: exit 0 (floor below T1) [rc=%d %s]" % (hr, rc, se.strip()))
        cal = json.load(open(out))
        feat = oracle([(refs[i], cands[i]) for i in range(3)])
        flo = oracle([(refs[0], refs[1]), (refs[0], refs[2])])
        check(cal["format"] == "probe-calibration" and cal["version"] == 1 and cal["feature"] == "fp8"
              and cal["headroom"] == hr, "headroom %g: format, version, feature, headroom" % hr)
        check(sorted(cal["components"]) == sorted(SIGMA), "headroom %g: one entry per component" % hr)
        for cn, o in feat.items():
            e = cal["components"][cn]
            check(close(e["rel_l2_max"], hr * o["rel_l2"][0]), "%s rel_l2_max = %g x worst (%r vs %r)"
                  % (cn, hr, e["rel_l2_max"], hr * o["rel_l2"][0]))
            check(abs(e["cosine_min"] - (1 - hr * o["one_minus_cosine"][0])) <= 1e-12,
                  "%s cosine_min = 1 - %g x worst(1 - cos) (%r)" % (cn, hr, e["cosine_min"]))
            check(close(e["p99_abs_max"], hr * o["p99_abs"][0]), "%s p99_abs_max = %g x worst" % (cn, hr))
            check(close(e["max_abs_max"], hr * o["max_abs"][0]), "%s max_abs_max = %g x worst" % (cn, hr))
            check(close(e["mismatch_fraction_max"], min(1.0, hr * o["mismatch_fraction"][0])),
                  "%s mismatch_fraction_max = min(1, %g x worst) (%r)" % (cn, hr, e["mismatch_fraction_max"]))
            check(e["atol"] == ATOL and e["rtol"] == RTOL, "%s atol/rtol as stated" % cn)
            ob = e["observed"]
            ntens = sum(1 for k in SHAPES if comp(k) == cn)
            check(ob["runs"] == 3 and ob["tensors"] == 3 * ntens, "%s observed runs 3, tensors %d" % (cn, 3 * ntens))
            for m in ("rel_l2", "one_minus_cosine", "p99_abs", "max_abs", "mismatch_fraction"):
                check(close(ob[m]["max"], o[m][0], 1e-9 if m == "one_minus_cosine" else 1e-12)
                      and close(ob[m]["mean"], o[m][1], 1e-9 if m == "one_minus_cosine" else 1e-12),
                      "%s observed %s max/mean = numpy" % (cn, m))
            fo = flo[cn]
            fl = ob["floor"]
            check(fl["runs"] == 2 and close(fl["rel_l2"]["max"], fo["rel_l2"][0]),
                  "%s floor: 2 runs, worst rel_l2 = numpy (%r)" % (cn, fl["rel_l2"]["max"]))
            ch = ob["t1_floor_check"]
            check(ob["t1_above_floor"] is True and close(ch["floor_rel_l2_x_headroom"], hr * fo["rel_l2"][0])
                  and ch["t1_rel_l2_max"] == 1e-2 and close(ch["t1_one_minus_cosine_max"], 1e-4, 1e-9)
                  and abs(ch["floor_one_minus_cosine_x_headroom"] - hr * fo["one_minus_cosine"][0]) <= 1e-12,
                  "%s t1_above_floor true with the numbers" % cn)
        ev = cal["evidence"]
        check(ev["runs"] == 3 and ev["floor_runs"] == 2 and ev["headroom"] == hr and ev["probe_version"]
              and ev["date"].endswith("Z") and ev["t1_above_floor"] is True,
              "evidence: runs, floor runs, headroom, probe version, date")
        check(sorted(ev["architectures"]) == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"],
              "evidence: architectures = distinct GPU names (%r)" % ev["architectures"])
        check(ev["machine"] == ["gpu01"], "evidence: machine")
        check([f["label"] for f in ev["files"]] == ["ref0", "ref1", "ref2", "cand0", "cand1", "cand2"]
              and all(f["torch"] == "2.5.1" and f["command"] == ["python3", "gen.py"] for f in ev["files"]),
              "evidence: every input file with its manifest's label, command, torch")
        check(ev["pairs"] == [["ref%d.h5" % i, "cand%d.h5" % i] for i in range(3)]
              and ev["floor_pairs"] == [["ref0.h5", "ref1.h5"], ["ref0.h5", "ref2.h5"]],
              "evidence: pairs and floor pairs")
        check("T1 sits above the determinism floor" in so and "dit.step" in so, "stdout: summary and floor check")
        ho = ev.get("held_out", {})
        check(ho.get("pairs") == 3 and ho.get("failed") == 0
              and [(x["reference"], x["candidate"], x["verdict"]) for x in ho.get("results", [])]
              == [("ref%d.h5" % i, "cand%d.h5" % i, "pass") for i in range(3)]
              and "held out: 0 of 3 feature pair(s) fail T2 calibrated on the other pairs\n" in so,
              "held out: three runs of one feature each pass T2 calibrated on the other two (%r)" % ho)

    # --- the held-out check finds a run the others do not cover ---
    outlier = write(P("cand2-loud.h5"), noisy(refs[2], lambda c: 3.0 * SIGMA[c]))
    rc, so, se = run(CAL, "--feature", "fp8", *sum((["--reference", P("ref%d.h5" % i)] for i in range(3)), []),
                     "--candidate", P("cand0.h5"), "--candidate", P("cand1.h5"),
                     "--candidate", P("cand2-loud.h5"), "--out", P("cal-ho.json"))
    ho = json.load(open(P("cal-ho.json")))["evidence"]["held_out"] if rc != 2 else {}
    res = ho.get("results", [{}] * 3)
    path = res[2].get("first_failure", "/none/x")
    want = None
    if path in outlier:
        a = metrics(refs[2][path], outlier[path])["rel_l2"]
        b = 1.5 * oracle([(refs[0], cands[0]), (refs[1], cands[1])])[comp(path)]["rel_l2"][0]
        for prec in range(4, 18):  # the gate's reason: the shortest %g that tells them apart
            va, vb = "%.*g" % (prec, a), "%.*g" % (prec, b)
            if va != vb:
                break
        want = "rel_l2 %s > %s" % (va, vb)
    check(rc == 0 and ho.get("failed") == 1 and [x.get("verdict") for x in res] == ["pass", "pass", "fail"]
          and res[2].get("reason") == want and res[2].get("tensors_failed") == len(SHAPES),
          "held out: a run at 3x the drift fails T2 calibrated on the other two, at numpy's rel_l2 "
          "against 1.5 x their worst (%r vs %r)" % (res[2], want))
    check("held out: 1 of 3 feature pair(s) fail T2 calibrated on the other pairs: the calibration "
          "does not cover the feature's run-to-run variation; calibrate on more runs\n" in so
          and ("  pair 2: %d of %d tensors fail; %s: %s\n" % (len(SHAPES), len(SHAPES), path, want)) in so,
          "held out: stdout names the pair, its first failing tensor and the reason [%s]" % so[-400:])
    rc, so, se = run(CAL, *args, "--no-held-out", "--out", P("cal-noho.json"))
    check(rc == 0 and "held_out" not in json.load(open(P("cal-noho.json")))["evidence"]
          and "held out" not in so, "--no-held-out: no check, no key")

    # --- the file gates a 4th pair ---
    cal15 = P("cal-1.5.json")
    rc, so, se = run(COMPARE, P("ref3.h5"), P("within.h5"), "--gate", "T2", "--calibration", cal15)
    check(rc == 0, "T2 with the calibration: a 4th pair within the drift passes [rc=%d %s%s]"
          % (rc, so[-300:], se.strip()))
    rc, so, se = run(COMPARE, P("ref3.h5"), P("beyond.h5"), "--gate", "T2", "--calibration", cal15,
                     "--json", P("beyond.json"))
    res = json.load(open(P("beyond.json"))) if rc != 2 else {"tensors": []}
    check(rc == 1 and all(t["verdict"] == "fail" for t in res["tensors"]),
          "T2: a 4th pair at 3x the drift fails every tensor [rc=%d]" % rc)

    # --- --references-differ: the floor comes only from the repeats ---
    other = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    r1 = write(P("seed2-ref.h5"), noisy(other, floor_sigma))
    c1 = write(P("seed2-cand.h5"), noisy(r1, lambda c: SIGMA[c]))
    rep0 = write(P("ref0-again.h5"), noisy(refs[0], lambda c: 1e-5))
    rc, so, se = run(CAL, "--feature", "fp8", "--references-differ", "--reference", P("ref0.h5"),
                     "--reference", P("seed2-ref.h5"), "--candidate", P("cand0.h5"),
                     "--candidate", P("seed2-cand.h5"), "--reference-repeat", P("ref0-again.h5"),
                     "--out", P("cal-differ.json"))
    check(rc == 0, "--references-differ with a repeat: exit 0 [%s]" % se.strip())
    if rc == 0:
        cal = json.load(open(P("cal-differ.json")))
        flo = oracle([(refs[0], rep0)])
        feat = oracle([(refs[0], cands[0]), (r1, c1)])
        e = cal["components"]["dit.step"]
        check(e["observed"]["floor"]["runs"] == 1
              and close(e["observed"]["floor"]["rel_l2"]["max"], flo["dit.step"]["rel_l2"][0])
              and close(e["rel_l2_max"], 1.5 * feat["dit.step"]["rel_l2"][0]),
              "--references-differ: floor = reference 0 vs its repeat only; thresholds from both pairs")
        check(cal["evidence"]["floor_pairs"] == [["ref0.h5", "ref0-again.h5"]], "evidence: floor pair is the repeat")

    # --- a floor above T1: exit 1, file written with t1_above_floor false ---
    loud = [write(P("loud%d.h5" % i), noisy(base, lambda c: 1e-2)) for i in range(2)]
    write(P("loud-cand.h5"), noisy(loud[0], lambda c: 5e-2))
    rc, so, se = run(CAL, "--feature", "fp8", "--reference", P("loud0.h5"), "--reference", P("loud1.h5"),
                     "--candidate", P("loud-cand.h5"), "--out", P("cal-loud.json"))
    check(rc == 1, "floor above T1: exit 1 [rc=%d %s]" % (rc, se.strip()))
    check("does NOT sit above the determinism floor" in so, "floor above T1: stdout says so")
    if os.path.exists(P("cal-loud.json")):
        cal = json.load(open(P("cal-loud.json")))
        fo = oracle([(loud[0], loud[1])])
        e = cal["components"]["dit.step"]["observed"]
        check(e["t1_above_floor"] is False and cal["evidence"]["t1_above_floor"] is False
              and close(e["t1_floor_check"]["floor_rel_l2_x_headroom"], 1.5 * fo["dit.step"]["rel_l2"][0])
              and e["t1_floor_check"]["floor_rel_l2_x_headroom"] >= 1e-2,
              "floor above T1: t1_above_floor false with the floor's numbers")
    else:
        check(False, "floor above T1: the file is still written")

    # --- bad input: exit 2, one line, nothing written ---
    write(P("unknown.h5"), {"/foo.bar/0000/out": np.ones((4,))})
    write(P("missing-tensor.h5"), {k: v for k, v in cands[0].items() if "0002" not in k})
    nan = {k: v.copy() for k, v in cands[0].items()}
    nan["/dit.step/0001/out.sample"].flat[3] = np.nan
    write(P("nan.h5"), nan)
    nanref = {k: v.copy() for k, v in refs[0].items()}
    nanref["/dit.step/0001/out.sample"][...] = np.nan  # an all-NaN reference tensor
    write(P("nanref.h5"), nanref)
    open(P("not-hdf5.h5"), "w").write("hello\n")
    R = lambda i: ["--reference", P("ref%d.h5" % i)]  # noqa: E731
    C = lambda n: ["--candidate", P(n)]  # noqa: E731
    bad = [
        ("missing file", ["--feature", "x", *R(0), *R(1), *C("nope.h5")], "nope.h5"),
        ("not an HDF5 file", ["--feature", "x", *R(0), *R(1), *C("not-hdf5.h5")], "not-hdf5.h5"),
        ("more candidates than references", ["--feature", "x", *R(0), *C("cand0.h5"), *C("cand1.h5")],
         "2 candidates but 1 references"),
        ("unknown component", ["--feature", "x", "--reference", P("unknown.h5"), *R(1), *C("unknown.h5")],
         "unknown component 'foo.bar'"),
        ("tensor missing in a candidate", ["--feature", "x", *R(0), *R(1), *C("missing-tensor.h5")],
         "/dit.step/0002/out.sample"),
        ("NaN in a candidate", ["--feature", "x", *R(0), *R(1), *C("nan.h5")], "NaN"),
        ("all-NaN reference, finite candidate",
         ["--feature", "x", "--reference", P("nanref.h5"), *R(1), *C("cand0.h5")],
         "NaN in the reference where the candidate is not NaN"),
        ("candidate identical to its reference", ["--feature", "x", *R(0), *R(1), *C("ref0.h5")],
         "feature not active"),
        ("no floor", ["--feature", "x", *R(0), *C("cand0.h5")], "determinism floor"),
        ("a repeat that is its own reference", ["--feature", "x", "--references-differ", *R(0), *R(1),
                                                *C("cand0.h5"), "--reference-repeat", P("ref0.h5")],
         "--reference-repeat 0 (%s) is the same file as --reference 0" % P("ref0.h5")),
        ("references differ, no repeat", ["--feature", "x", "--references-differ", *R(0), *R(1), *C("cand0.h5")],
         "determinism floor"),
        ("no --feature", [*R(0), *R(1), *C("cand0.h5")], "--feature"),
        ("headroom below 1", ["--feature", "x", "--headroom", "0.5", *R(0), *R(1), *C("cand0.h5")], "--headroom"),
        ("negative atol", ["--feature", "x", "--atol", "-1", *R(0), *R(1), *C("cand0.h5")], "--atol"),
        ("stray argument", ["--feature", "x", *R(0), *R(1), *C("cand0.h5"), P("cand1.h5")], "unexpected argument"),
        ("unknown option", ["--feature", "x", "--bogus", *R(0), *R(1), *C("cand0.h5")], "--bogus"),
        ("--held-out with one candidate", ["--feature", "x", "--held-out", *R(0), *R(1), *C("cand0.h5")],
         "--held-out needs at least 2 --candidate runs (got 1)"),
        ("--held-out and --no-held-out", ["--feature", "x", "--held-out", "--no-held-out", *R(0), *R(1),
                                          *C("cand0.h5"), *C("cand1.h5")], "exclude each other"),
        ("--held-out with records", ["--feature", "x", "--held-out", "--records", P("none.jsonl")],
         "--held-out applies to runs, not --records"),
    ]
    for what, a, needle in bad:
        out = P("bad.json")
        if os.path.exists(out):
            os.unlink(out)
        rc, so, se = run(CAL, *a, "--out", out)
        lines = se.strip().splitlines()
        check(rc == 2 and lines and lines[0].startswith("probe-calibrate: ") and needle in lines[0]
              and not os.path.exists(out) and (len(lines) == 1 or lines[1].startswith("usage:")),
              "bad input (%s): exit 2, one line naming it [rc=%d %r]" % (what, rc, se.strip()[:200]))
    rc, so, se = run(CAL, *args, "--out", P("ref0.h5"))
    check(rc == 2 and "refusing to overwrite" in se, "--out naming an input file: exit 2")
    rc, so, se = run(CAL, *args)
    check(rc == 2 and "--out" in se, "no --out: exit 2")
    rc, so, se = run(CAL, *args, "--out", P("no/dir/cal.json"))
    check(rc == 2 and se.count("\n") == 1 and
          se.startswith("probe-calibrate: cannot write ") and "cannot create a temporary file" in se
          and so == "" and not os.path.exists(P("no")),
          "--out in a missing directory: exit 2 before calibrating, one line, nothing created "
          "[rc=%d %r]" % (rc, se.strip()[:200]))

    structure(P, rng)

    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
