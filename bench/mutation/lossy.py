"""The lossy side of the mutation study (study.py --lossy, docs/mutation.md "Lossy
features"): for each lossy feature of wan_mutants.py, a T2 calibration on seeds
1..S (references feature off, candidates feature on, one repeat of seed 1's
reference for the determinism floor; probe-calibrate), then on unseen seeds
S+1..S+T the reference, the feature alone (a T2 failure is a false alarm) and
the feature with each planted bug (a T2 failure is a detection), each compared
with its seed's reference under T2 (the calibration) and T1-relaxed, and each bug
candidate also with the feature-alone candidate of its seed (what the bug alone
changed, and where it changed first).

Writes OUT/lossy.json and OUT/lossy.md. The verdicts are whatever the current
probe-compare says; per block output the JSON keeps the tensor's `systematic`
object and any per-tensor key this harness does not know, so statistics that T2
gains later are recorded without a change here.
"""
import concurrent.futures
import json
import os
import re
import sys

LOSSY = {  # feature -> how its runs differ from the study's defaults
    "fp8-storage": {"weights_differ": True},
    "fp8-gemm": {"weights_differ": True},
    "fp8-scaled-mm": {"weights_differ": True},
    # First Block Cache needs 8+ steps to cache anything; a cached step skips the
    # blocks after the first, so their calls are missing from the candidate's --blocks
    # capture: calibrated with probe-calibrate --skips-calls
    "fbcache": {"min_steps": 8, "skips_calls": True},
}
# (family, size, --bug spec with BLOCK for the bug's block; None: not in a block)
LOSSY_BUGS = [
    ("chanbias", 0.3, "chanbias:BLOCK:0.3"), ("chanbias", 1.0, "chanbias:BLOCK:1"),
    ("attnscale", 0.1, "attnscale:BLOCK:0.1"), ("attnscale", 0.3, "attnscale:BLOCK:0.3"),
    ("gain", 0.03, "gain:BLOCK:0.03"), ("gain", 0.1, "gain:BLOCK:0.1"),
    ("timestep", 0.1, "timestep:0.1"), ("timestep", 1.0, "timestep:1"),
]
QUICK_LOSSY_BUGS = ["chanbias:BLOCK:1", "gain:BLOCK:0.1", "timestep:1"]
# bugs that change a weight the GEMMs read: probe-compare may refuse the pair on the weight
# fingerprints alone (exit 2 naming the GEMM, docs/gemm.md "Quantized from the same weights")
WEIGHT_BUGS = ("wscale", "fp8")
LOSSY_BUG_BLOCK = 2
GATES = ("T2", "T1-relaxed")
RELAXED_CAUSE = "backend-swap"
DIT_OUT = "/dit.step/0000/out.0"
# per-tensor keys of probe-compare's JSON (docs/compare-json.md) that are not
# statistics of the pair; every other key of a block output is recorded
BASE_TENSOR_KEYS = {
    "path", "component", "dtype", "shape", "n", "rel_l2", "cosine", "max_abs", "max_abs_index",
    "p99_abs", "mean_abs", "mismatch_fraction", "nan_ref", "nan_cand", "inf_ref", "inf_cand",
    "zero_norm_reference", "identical", "verdict", "reasons", "dtype_candidate", "shape_candidate",
    "mismatch_count", "mismatch_ulps_max", "max_abs_ulps_scale", "nan_ref_only", "class", "module",
    "candidate_path", "class_candidate", "module_candidate", "parent", "block", "call", "cfg_branch",
    "step", "seq", "gate", "gate_verdict", "oracle", "oracle_same_as_reference", "channel_axis",
    "channel_axis_from", "channel_shift_max", "channel_shift_max_rel", "channel_shift_argmax", "stats_only",
}


def weight_diff_opts(tool, feature):
    """The options a comparison of a feature-off with a feature-on run needs when the
    feature changes the weights the GEMMs read (FP8 storage or quantization):
    probe-calibrate and probe-compare refuse runs whose GEMM weight fingerprints differ
    at the same shapes and dtypes (exit 2, docs/gemm.md) unless the feature is declared
    to change them: probe-calibrate --weights quantized writes that into the calibration
    file, which probe-compare --gate T2 then applies; T1-relaxed has no calibration, so
    it needs --allow-weight-diff. The one place that rule lives here."""
    if not LOSSY[feature].get("weights_differ"):
        return []
    if tool == "probe-calibrate":
        return ["--weights", "quantized"]
    return [] if tool == "probe-compare T2" else ["--allow-weight-diff"]


def bug_spec(spec, block):
    return spec.replace("BLOCK", str(block))


def bug_block(spec):
    """The block a --bug spec sits in, or None (the timestep bug)."""
    parts = spec.split(":")
    return int(parts[1]) if parts[0] != "timestep" else None


def run(a, sh, run_bin, cmp_bin, cal_bin, P):
    features = a.lossy.split(",")
    for f in features:
        if f not in LOSSY:
            sys.exit("study: --lossy %r: not a lossy feature (%s)" % (f, ", ".join(LOSSY)))
    calib = list(range(1, a.calib_seeds + 1))
    test = list(range(a.calib_seeds + 1, a.calib_seeds + a.test_seeds + 1))
    specs = a.lossy_bugs.split(",") if a.lossy_bugs else \
        [b[2] for b in LOSSY_BUGS if not a.quick or b[2] in QUICK_LOSSY_BUGS]
    known = {b[2]: b for b in LOSSY_BUGS}
    bugs = []
    for s in specs:
        fam, size = (known[s][0], known[s][1]) if s in known else (s.split(":")[0], None)
        bugs.append((fam, size, bug_spec(s, LOSSY_BUG_BLOCK)))
    os.makedirs(P("lossy"), exist_ok=True)

    def group(f):
        """The run settings feature f needs: (steps, blocks captured)."""
        steps = max(a.steps, LOSSY[f].get("min_steps", 0))
        return steps, a.blocks

    def gname(g):
        return "n%d%s" % (g[0], "-blocks" if g[1] else "")

    def prog(g):
        p = [a.python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "wan_mutants.py"),
             "--device", a.device, "--size", str(a.size), "--frames", str(a.frames), "--steps",
             str(g[0]), "--layers", str(a.layers), "--dtype", "bf16"]
        return p + (["--threads", str(a.threads)] if a.threads else [])

    def capture(name, g, extra, inject=None):
        h5 = P("lossy/%s.h5" % name)
        if a.reuse and os.path.exists(h5) and os.path.exists(h5[:-3] + ".log"):
            return 0.0
        cmd = [run_bin, "--out", h5, "--force", "--label", name] + (["--blocks"] if g[1] else [])
        cmd += ["--inject", inject] if inject else []
        rc, secs = sh(cmd + ["--", *prog(g), *extra], h5[:-3] + ".log", a.timeout)
        if rc != 0:
            sys.exit("study: run %s failed (exit %d): see %s" % (name, rc, h5[:-3] + ".log"))
        return secs

    def ref(g, seed):
        return "%s/ref-%d" % (gname(g), seed)

    groups = sorted({group(f) for f in features})
    for g in groups:
        os.makedirs(P("lossy/" + gname(g)), exist_ok=True)
    for f in features:
        os.makedirs(P("lossy/" + f), exist_ok=True)
    runs = []  # (name, group, extra args, injected reference name or None)
    for g in groups:
        runs += [(ref(g, s), g, ["--seed", str(s)], None) for s in calib + test]
        runs.append((ref(g, 1) + "-repeat", g, ["--seed", "1"], None))
    cands = []  # (feature, seed, role, family, size, spec, name)
    for f in features:
        g = group(f)
        for s in calib:
            cands.append((f, s, "calibration", None, None, None, "%s/cal-%d" % (f, s)))
        for s in test:
            cands.append((f, s, "feature", None, None, None, "%s/feature-%d" % (f, s)))
            for fam, size, spec in bugs:
                cands.append((f, s, "bug", fam, size, spec, "%s/bug-%s-%d" % (f, spec.replace(":", "_"), s)))
    for f, s, role, fam, size, spec, name in cands:
        g = group(f)
        runs.append((name, g, ["--seed", str(s), "--feature", f] + (["--bug", spec] if spec else []),
                     P("lossy/%s.h5" % ref(g, s))))
    timings = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        futs = {n: ex.submit(capture, n, g, extra) for n, g, extra, inj in runs if not inj}
        timings.update({n: fu.result() for n, fu in futs.items()})
        futs = {n: ex.submit(capture, n, g, extra, inj) for n, g, extra, inj in runs if inj}
        timings.update({n: fu.result() for n, fu in futs.items()})

    def calibrate(f, seeds, out):
        """probe-calibrate feature f on the calibration runs of `seeds` into out: (exit, seconds, file)."""
        g = group(f)
        cmd = [cal_bin, "--feature", f, "--references-differ", "--out", out]
        for s in seeds:
            cmd += ["--reference", P("lossy/%s.h5" % ref(g, s))]
        for s in seeds:
            cmd += ["--candidate", P("lossy/%s/cal-%d.h5" % (f, s))]
        cmd += ["--reference-repeat", P("lossy/%s-repeat.h5" % ref(g, 1))]
        cmd += weight_diff_opts("probe-calibrate", f)
        cmd += ["--skips-calls"] if LOSSY[f].get("skips_calls") else []
        cmd += ["--held-out"] if len(seeds) >= 2 else []
        rc, secs = sh(cmd, out + ".log", 600)
        if rc not in (0, 1) or not os.path.exists(out):
            sys.exit("study: probe-calibrate %s failed (exit %d): see %s.log" % (f, rc, out))
        return rc, secs, json.load(open(out))

    subsets = sorted({int(k) for k in a.calib_subsets.split(",") if k.strip()}) if a.calib_subsets else []
    for k in subsets:
        if not 1 <= k < len(calib):
            sys.exit("study: --calib-subsets %d: must be in [1, %d)" % (k, len(calib)))

    # calibration: one file per feature
    calibration = {}
    for f in features:
        out = P("lossy/%s/calibration.json" % f)
        rc, secs, cal = calibrate(f, calib, out)
        calibration[f] = {"file": os.path.relpath(out, a.out), "exit": rc, "seconds": secs,
                          "t1_above_floor": rc == 0, "weights": cal.get("weights"),
                          "weights_rounding": cal.get("weights_rounding"),
                          "held_out": cal.get("evidence", {}).get("held_out"),
                          "thresholds": {c: {k: v for k, v in e.items() if k not in ("observed",)
                                             and not k.startswith("x-")}
                                         for c, e in cal.get("components", {}).items()}}

    # the same on the first K calibration seeds alone
    subset_cal = {}
    for f in features:
        for k in subsets:
            out = P("lossy/%s/calibration-%d.json" % (f, k))
            rc, secs, cal = calibrate(f, calib[:k], out)
            subset_cal[(f, k)] = {"file": out, "held_out": cal.get("evidence", {}).get("held_out")}

    def compare(refname, name, key, feature, *opts):
        js = P("lossy/%s.%s.json" % (name, key))
        if os.path.exists(js):
            os.remove(js)
        cmd = [cmp_bin, P("lossy/%s.h5" % refname), P("lossy/%s.h5" % name), "--json", js, "--quiet",
               *opts]
        rc, secs = sh(cmd, js + ".log", 600)
        log = open(js + ".log").read() if os.path.exists(js + ".log") else ""
        if rc == 2 and "not comparing" in log:
            return refused(log)
        if rc == 2 or not os.path.exists(js):
            sys.exit("study: probe-compare %s %s failed: see %s.log" % (name, key, js))
        return json.load(open(js))

    def refused(log):
        """A comparison probe-compare refused on the weight fingerprints: a failing verdict
        whose first call is the one the refusal names (component C -> /C/0000,
        C@block=B -> /C/B)."""
        line = next((l for l in log.splitlines() if "not comparing" in l), log.strip())
        m = re.search(r"component ([^,@ ]+)(?:@block=(\d+))?,", line)
        call = "/%s/%04d" % (m.group(1), int(m.group(2) or 0)) if m else None
        return {"verdict": "fail", "refused": line, "tensors": [], "feature_active": None,
                "first_failure": None, "reasons": [line], "missing_in_candidate": [],
                "introduced": {"call": call, "kind": "weights"} if call else None}

    def judge(c):
        f, s, role, fam, size, spec, name = c
        g = group(f)
        r = ref(g, s)
        res = {"T2": compare(r, name, "T2", f, "--gate", "T2", "--calibration",
                             P("lossy/%s/calibration.json" % f), *weight_diff_opts("probe-compare T2", f)),
               "T1-relaxed": compare(r, name, "T1-relaxed", f, "--gate", "T1-relaxed:" + RELAXED_CAUSE,
                                     *weight_diff_opts("probe-compare", f))}
        if role == "bug":
            # the bug alone: against the feature-alone candidate of its seed (the same weights)
            res["vs_feature"] = compare("%s/feature-%d" % (f, s), name, "vs-feature", f,
                                        *(["--allow-weight-diff"] if fam in WEIGHT_BUGS else []))
        for k in subsets:
            res["T2@%d" % k] = compare(r, name, "T2-%d" % k, f, "--gate", "T2", "--calibration",
                                       subset_cal[(f, k)]["file"], *weight_diff_opts("probe-compare T2", f))
        return res

    judged = [c for c in cands if c[2] != "calibration"]
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        results = [r.result() for r in [ex.submit(judge, c) for c in judged]]

    rows = []
    for (f, s, role, fam, size, spec, name), res in zip(judged, results):
        g = group(f)
        blk = bug_block(spec) if spec else None
        named_at = ("/dit.block/%04d" % blk) if (blk is not None and g[1]) else "/dit.step/0000"
        row = {"feature": f, "seed": s, "role": role, "family": fam, "size": size, "bug": spec,
               "name": name, "steps": g[0], "blocks": g[1], "named_at": named_at if role == "bug" else None,
               "verdicts": {}}
        for gate in GATES:
            j = res[gate]
            t = {x["path"]: x for x in j["tensors"] if "path" in x}
            intro = j.get("introduced") or {}
            ff = j.get("first_failure")
            row["verdicts"][gate] = {
                "fail": j["verdict"] == "fail",
                "feature_active": j["feature_active"],
                "first_failure": ff,
                "first_failure_component": (t.get(ff) or {}).get("component"),
                "reason": next(iter((t.get(ff) or {}).get("reasons") or []), None) or
                next(iter(j.get("reasons") or []), None),
                "introduced": intro.get("call"),
                "introduced_kind": intro.get("kind"),
                "named": role == "bug" and intro.get("call") == named_at,
                "missing_in_candidate": len(j["missing_in_candidate"]),
                "failed_tensors": (j.get("summary") or {}).get("failed"),
                "refused": j.get("refused"),
            }
        row["subsets"] = {}
        for k in subsets:
            j = res["T2@%d" % k]
            row["subsets"][str(k)] = {"fail": j["verdict"] == "fail",
                                      "named": role == "bug" and (j.get("introduced") or {}).get("call") == named_at,
                                      "first_failure": j.get("first_failure")}
        t2 = {x["path"]: x for x in res["T2"]["tensors"] if "path" in x}
        row["dit_rel_l2"] = (t2.get(DIT_OUT) or {}).get("rel_l2")
        steps = [x["rel_l2"] for x in res["T2"]["tensors"] if x.get("component") == "dit.step"
                 and "/out" in x.get("path", "") and x.get("rel_l2") is not None]
        row["dit_rel_l2_max"] = max(steps) if steps else None
        row["blocks_stats"] = block_stats(res["T2"]["tensors"])
        if role == "bug":
            v = res["vs_feature"]
            vt = {x["path"]: x for x in v["tensors"] if "path" in x}
            row["vs_feature"] = {
                "dit_rel_l2": (vt.get(DIT_OUT) or {}).get("rel_l2"),
                "first_differing": next((x["path"] for x in v["tensors"]
                                         if "path" in x and not x.get("identical")), None),
                "block_rel_l2": (vt.get("%s/out" % named_at) or {}).get("rel_l2") if blk is not None else None,
                "introduced": (v.get("introduced") or {}).get("call"),
                "fail": v["verdict"] == "fail",
                "named": (v.get("introduced") or {}).get("call") == named_at,
            }
        rows.append(row)
    summary = {"device": a.device, "size": a.size, "frames": a.frames, "layers": a.layers,
               "steps": a.steps, "blocks": a.blocks, "features": features, "calib_seeds": calib,
               "test_seeds": test, "bug_block": LOSSY_BUG_BLOCK, "bugs": [b[2] for b in bugs],
               "gates": list(GATES), "relaxed_cause": RELAXED_CAUSE,
               "groups": {f: {"steps": group(f)[0], "blocks": group(f)[1]} for f in features},
               "calibration": calibration, "seconds": timings, "rows": rows,
               "calib_subsets": {"%s@%d" % fk: {"seeds": calib[:fk[1]], "held_out": v["held_out"]}
                                 for fk, v in subset_cal.items()}}
    json.dump(summary, open(P("lossy.json"), "w"), indent=1)
    md = tables(summary)
    open(P("lossy.md"), "w").write(md)
    print(md)
    return 0


def block_stats(tensors):
    """Per dit.block output: rel_l2, the systematic statistics (channel z, gain z) and
    every per-tensor key this harness does not know (statistics added to T2 later)."""
    out = []
    for x in tensors:
        if x.get("component") != "dit.block" or "/out" not in x.get("path", ""):
            continue
        y = x.get("systematic") or {}
        e = {"path": x["path"], "rel_l2": x.get("rel_l2"), "verdict": x.get("verdict"),
             "channel_z": y.get("channel_z"), "channel": y.get("channel"), "gain_z": y.get("gain_z"),
             "systematic": y or None}
        extra = {k: v for k, v in x.items() if k not in BASE_TENSOR_KEYS and k != "systematic"}
        if extra:
            e["extra"] = extra
        out.append(e)
    return out


def fmt(x):
    return "-" if x is None else "%.3g" % x


def tables(s):
    rows = s["rows"]
    out = ["Lossy features on %s, %dx%d, %d frames, %d blocks; calibration seeds %s, unseen seeds %s; "
           "bugs planted in block %d (the timestep bug: the DiT's input); 'named' = introduced at the "
           "bug's block of the first DiT call (/dit.step/0000 without blocks or for the timestep bug). "
           "T1-relaxed uses the cause %s." %
           (s["device"], s["size"], s["size"], s["frames"], s["layers"], s["calib_seeds"], s["test_seeds"],
            s["bug_block"], s["relaxed_cause"]), ""]
    out += ["| feature | steps | blocks captured | calibration (probe-calibrate exit) | dit.step rel_l2_max | "
            "dit.block rel_l2_max | held out (calibration pairs failing T2 calibrated on the others) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in s["features"]:
        c, g = s["calibration"][f], s["groups"][f]
        th = c["thresholds"]
        ho = c.get("held_out")
        hos = "not run" if not ho else "%d/%d%s" % (ho["failed"], ho["pairs"], "".join(
            "; seed %d: %s: %s" % (s["calib_seeds"][x["pair"]], x.get("first_failure"), x.get("reason"))
            for x in ho["results"] if x["verdict"] == "fail"))
        out.append("| %s | %d | %s | %d%s%s | %s | %s | %s |" % (
            f, g["steps"], "yes" if g["blocks"] else "no", c["exit"],
            "" if c["t1_above_floor"] else " (T1 not above the floor)",
            "; weights %s, weights_rounding %s" % (c.get("weights"), c.get("weights_rounding"))
            if c.get("weights") == "quantized" else "",
            fmt((th.get("dit.step") or {}).get("rel_l2_max")), fmt((th.get("dit.block") or {}).get("rel_l2_max")),
            hos))
    out += ["", "Per candidate on the unseen seeds (rel_l2 against the seed's reference at %s and the largest "
            "over the dit.step outputs; 'bug alone': against the feature-alone candidate of the seed at %s, "
            "and the first tensor that differs):" % (DIT_OUT, DIT_OUT), "",
            "| feature | candidate | seed | rel_l2 (call 0, max) | " + " | ".join(s["gates"]) +
            " | introduced (T2) | bug alone: rel_l2, first differing |",
            "| --- | --- | --- | --- |" + " --- |" * len(s["gates"]) + " --- | --- |"]
    for r in rows:
        cells = []
        for gate in s["gates"]:
            v = r["verdicts"][gate]
            if r["role"] == "feature":
                cells.append("**false alarm**" if v["fail"] else "pass")
            else:
                cells.append(("detected" + (", named" if v["named"] else "") +
                              (" (refused on the weights)" if v.get("refused") else ""))
                             if v["fail"] else "missed")
        vf = r.get("vs_feature") or {}
        out.append("| %s | %s | %d | %s, %s | %s | %s | %s |" % (
            r["feature"], r["bug"] or "feature alone", r["seed"], fmt(r["dit_rel_l2"]),
            fmt(r["dit_rel_l2_max"]), " | ".join(cells),
            r["verdicts"]["T2"]["introduced"] or "-",
            ("%s, %s" % (fmt(vf.get("dit_rel_l2")), vf.get("first_differing"))) if vf else "-"))
    out += ["", "Summary per feature and gate (false alarms: feature alone failing on an unseen seed; "
            "detections: bug candidates failing, of the unseen seeds; named: at the bug's place):", "",
            "| feature | gate | false alarms | " + " | ".join(s["bugs"]) + " |",
            "| --- | --- | --- |" + " --- |" * len(s["bugs"])]
    for f in s["features"]:
        for gate in s["gates"]:
            fr = [r for r in rows if r["feature"] == f and r["role"] == "feature"]
            fa = sum(r["verdicts"][gate]["fail"] for r in fr)
            cells = []
            for b in s["bugs"]:
                cells.append(detections([r["verdicts"][gate] for r in rows if r["feature"] == f and r["bug"] == b]))
            out.append("| %s | %s | %d/%d | %s |" % (f, gate, fa, len(fr), " | ".join(cells)))
        # the feature's own implementation as the reference (the feature-alone run of the seed)
        cells = []
        for b in s["bugs"]:
            cells.append(detections([r["vs_feature"] for r in rows
                                     if r["feature"] == f and r["bug"] == b and r.get("vs_feature")]))
        out.append("| %s | T1 against the feature alone | - | %s |" % (f, " | ".join(cells)))
    out += seeds_table(s)
    return "\n".join(out) + "\n"


def detections(vs):
    """'D/N (named M)' of the verdicts vs (dicts with fail, named) of one bug's candidates."""
    return "%d/%d (named %d)" % (sum(v["fail"] for v in vs), len(vs), sum(v["fail"] and v["named"] for v in vs))


def seeds_table(s):
    """How many calibration seeds each feature needs: per feature and number of seeds K, the
    held-out check of that calibration and T2 with it on the unseen seeds."""
    subs = s.get("calib_subsets") or {}
    if not subs:
        return []
    rows = s["rows"]
    out = ["", "Calibration seeds: T2 calibrated on the first K calibration seeds (held out: calibration "
           "pairs failing T2 calibrated on the other K - 1; then the unseen seeds):", "",
           "| feature | K | held out | false alarms | " + " | ".join(s["bugs"]) + " |",
           "| --- | --- | --- | --- |" + " --- |" * len(s["bugs"])]
    for f in s["features"]:
        ks = sorted(int(x.split("@")[1]) for x in subs if x.split("@")[0] == f)
        for k in ks + [len(s["calib_seeds"])]:
            full = k == len(s["calib_seeds"])
            ho = (s["calibration"][f] if full else subs["%s@%d" % (f, k)]).get("held_out")

            def verdict(r):
                return r["verdicts"]["T2"] if full else r["subsets"][str(k)]
            fr = [r for r in rows if r["feature"] == f and r["role"] == "feature"]
            cells = []
            for b in s["bugs"]:
                cells.append(detections([verdict(r) for r in rows if r["feature"] == f and r["bug"] == b]))
            out.append("| %s | %d | %s | %d/%d | %s |" % (
                f, k, "%d/%d" % (ho["failed"], ho["pairs"]) if ho else "not run",
                sum(verdict(r)["fail"] for r in fr), len(fr), " | ".join(cells)))
    return out
