#!/usr/bin/env python3
"""End-to-end: a feature that skips nested calls (a step cache such as First Block
Cache runs only the first DiT block of a cached step).

Captures written with h5py as probe writes them (probe.component, probe.call,
probe.parent, probe.block): 3 dit.step calls of 2 dit.block calls each in the
reference; a candidate that skipped some blocks has its later block calls renumbered.

  pairing   probe-compare pairs the blocks by (parent call, block index): every
            compared block tensor equals the reference's of the same step and block
            (rel_l2 0), whereas the same dataset path holds another block (checked with
            numpy); the skipped call is missing in the candidate; the JSON says
            identity.paired_by "parent_and_block" with the moved and unpaired counts
            and the terminal names the pairing;
  calibrate probe-calibrate refuses a candidate that lacks tensors, naming
            --skips-calls (exit 2, no file); with --skips-calls it writes
            skipped_fraction_max = min(1, h x the worst fraction of dit.block tensors
            a candidate lacked) and the observed fractions; a floor pair that lacks a
            tensor is still refused;
  T2        a candidate that skips as many calls as the feature did passes, its lacking
            tensors listed under skipped_by_feature (not missing_in_candidate); one
            that skips more fails with the run reason naming the component, the counts
            and the limit; a calibration without the key fails the missing tensor.

Environment: PROBE_BUILD_DIR (required).
"""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
CAL = os.path.join(BUILD, "bin", "probe-calibrate")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
SHAPE = (1, 16, 8)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def base(seed):
    """The reference's values: per (step, block) and per step."""
    rng = np.random.default_rng(seed)
    return ({(s, b): rng.standard_normal(SHAPE) for s in range(3) for b in range(2)},
            {s: rng.standard_normal(SHAPE) for s in range(3)})


def write(path, blocks, steps, skip=(), noise=0.0, seed=0):
    """Blocks (step, block) not in skip, numbered in call order as the capture would."""
    rng = np.random.default_rng(seed)
    seq, call = 0, 0
    out = {}
    with h5py.File(path, "w") as f:
        for s in range(3):
            for b in range(2):
                if (s, b) in skip:
                    continue
                p = "/dit.block/%04d/out" % call
                v = (blocks[(s, b)] + noise * rng.standard_normal(SHAPE)).astype(np.float32)
                d = f.create_dataset(p, data=v)
                for k, x in (("probe.component", "dit.block"), ("probe.slot", "out"),
                             ("probe.parent", "/dit.step/%04d" % s)):
                    d.attrs[k] = x
                d.attrs["probe.call"] = np.int64(call)
                d.attrs["probe.block"] = np.int64(b)
                d.attrs["probe.step"] = np.int64(s)
                d.attrs["probe.seq"] = np.uint64(seq)
                out[p] = v
                seq += 1
                call += 1
            p = "/dit.step/%04d/out" % s
            v = (steps[s] + noise * rng.standard_normal(SHAPE)).astype(np.float32)
            d = f.create_dataset(p, data=v)
            d.attrs["probe.component"] = "dit.step"
            d.attrs["probe.slot"] = "out"
            d.attrs["probe.call"] = np.int64(s)
            d.attrs["probe.step"] = np.int64(s)
            d.attrs["probe.seq"] = np.uint64(seq)
            out[p] = v
            seq += 1
    return out


def pairing(P):
    blocks, steps = base(1)
    ref = write(P("ref.h5"), blocks, steps)
    cand = write(P("cand.h5"), blocks, steps, skip={(1, 1)})
    check(not np.array_equal(ref["/dit.block/0003/out"], cand["/dit.block/0003/out"]),
          "pairing: the same dataset path holds another block in the candidate")
    rc, so, se = run(COMPARE, P("ref.h5"), P("cand.h5"), "--json", P("pair.json"))
    j = json.load(open(P("pair.json"))) if os.path.exists(P("pair.json")) else {}
    t = {x["path"]: x for x in j.get("tensors", [])}
    check(rc == 1 and j.get("missing_in_candidate") == ["/dit.block/0003/out"],
          "pairing: exit 1, the skipped call (step 1, block 1) is missing in the candidate "
          "[rc=%d %r]" % (rc, j.get("missing_in_candidate")))
    blk = [x for p, x in t.items() if p.startswith("/dit.block/")]
    check(len(blk) == 5 and all(x["rel_l2"] == 0 for x in blk),
          "pairing: the 5 blocks the candidate ran equal the reference's of the same step and block")
    check(t.get("/dit.block/0004/out", {}).get("candidate_path") == "/dit.block/0003/out",
          "pairing: /dit.block/0004 (step 2, block 0) is paired with the candidate's /dit.block/0003")
    ident = j.get("identity", {})
    check(ident.get("paired_by") == "parent_and_block" and ident.get("calls_paired_by_module") == 2
          and ident.get("calls_unpaired_by_module") == 1 and ident.get("by_module_component") == "dit.block",
          "pairing: identity says parent_and_block, 2 moved, 1 unpaired (%r)" % ident)
    check("paired by parent call and block index: the candidate skipped calls of dit.block" in so
          and "1 without a call at the same step and block in the candidate" in so,
          "pairing: the terminal names the pairing [%s]" % so[-400:])
    # the same captures without probe.parent pair by path and compare different blocks
    for src, dst in (("ref.h5", "ref-np.h5"), ("cand.h5", "cand-np.h5")):
        with h5py.File(P(src)) as a, h5py.File(P(dst), "w") as b:
            for k in ("dit.block", "dit.step"):
                a.copy(k, b)
            for g in b["dit.block"].values():
                for d in g.values():
                    del d.attrs["probe.parent"]
                    del d.attrs["probe.block"]
    rc, so, se = run(COMPARE, P("ref-np.h5"), P("cand-np.h5"), "--json", P("np.json"))
    j = json.load(open(P("np.json"))) if os.path.exists(P("np.json")) else {}
    check(rc == 1 and j.get("missing_in_candidate") == ["/dit.block/0005/out"]
          and j.get("identity", {}).get("paired_by") == "module",
          "pairing: without probe.parent, by path: the last block is the one missing [rc=%d]" % rc)


def calibrate_and_gate(P):
    h = 1.5
    skips = [set(), {(1, 1)}, {(1, 1), (2, 1)}]   # 0, 1 and 2 of 6 block calls
    args = ["--feature", "cache", "--headroom", str(h), "--references-differ"]
    for i, sk in enumerate(skips):
        blocks, steps = base(10 + i)
        write(P("r%d.h5" % i), blocks, steps)
        write(P("c%d.h5" % i), blocks, steps, skip=sk, noise=1e-3, seed=20 + i)
        args += ["--reference", P("r%d.h5" % i), "--candidate", P("c%d.h5" % i)]
    blocks, steps = base(10)
    write(P("r0b.h5"), blocks, steps)
    args += ["--reference-repeat", P("r0b.h5")]
    rc, so, se = run(CAL, *args, "--out", P("no.json"))
    check(rc == 2 and not os.path.exists(P("no.json")) and "--skips-calls" in se
          and "is missing in the second file" in se,
          "calibrate: a candidate that lacks tensors is refused, naming --skips-calls [rc=%d %s]"
          % (rc, se.strip()))
    rc, so, se = run(CAL, *args, "--skips-calls", "--out", P("cal.json"))
    check(rc in (0, 1) and os.path.exists(P("cal.json")), "calibrate --skips-calls writes the file "
          "[rc=%d %s]" % (rc, se.strip()))
    if not os.path.exists(P("cal.json")):
        return
    cal = json.load(open(P("cal.json")))
    e = cal["components"]["dit.block"]
    # fractions of the reference's 6 dit.block tensors each candidate lacked: 0, 1/6, 2/6
    check(abs(e.get("skipped_fraction_max", -1) - min(1.0, h * 2 / 6)) < 1e-12
          and abs(e["observed"]["skipped_fraction"]["max"] - 2 / 6) < 1e-12
          and abs(e["observed"]["skipped_fraction"]["mean"] - 1 / 6) < 1e-12,
          "calibrate: skipped_fraction_max = 1.5 x 2/6, observed max 2/6 mean 1/6 (%r)"
          % e.get("skipped_fraction_max"))
    check("skipped_fraction_max" not in cal["components"]["dit.step"],
          "calibrate: dit.step, never skipped, has no skipped_fraction_max")
    # a floor pair lacking a tensor is refused
    write(P("r0c.h5"), blocks, steps, skip={(0, 1)})
    rc, so, se = run(CAL, *args[:-1], P("r0c.h5"), "--skips-calls", "--out", P("fl.json"))
    check(rc == 2 and "floor pair" in se and not os.path.exists(P("fl.json")),
          "calibrate: a floor pair that lacks a tensor is refused [rc=%d %s]" % (rc, se.strip()))

    blocks, steps = base(40)
    write(P("t-ref.h5"), blocks, steps)
    write(P("t-ok.h5"), blocks, steps, skip={(1, 1), (2, 1)}, noise=1e-3, seed=41)
    rc, so, se = run(COMPARE, P("t-ref.h5"), P("t-ok.h5"), "--gate", "T2", "--calibration",
                     P("cal.json"), "--json", P("t-ok.json"))
    j = json.load(open(P("t-ok.json"))) if os.path.exists(P("t-ok.json")) else {}
    check(rc == 0 and j.get("missing_in_candidate") == []
          and j.get("skipped_by_feature") == ["/dit.block/0003/out", "/dit.block/0005/out"],
          "T2: skipping 2 of 6 as the feature did passes, listed under skipped_by_feature "
          "[rc=%d %r %r]" % (rc, j.get("skipped_by_feature"), j.get("reasons")))
    check("skipped by the feature (its calibration lets it skip these calls): 2 tensors" in so,
          "T2: the terminal says what the feature skipped")
    write(P("t-more.h5"), blocks, steps, skip={(0, 1), (1, 1), (2, 1), (2, 0)}, noise=1e-3, seed=42)
    rc, so, se = run(COMPARE, P("t-ref.h5"), P("t-more.h5"), "--gate", "T2", "--calibration",
                     P("cal.json"), "--json", P("t-more.json"))
    j = json.load(open(P("t-more.json"))) if os.path.exists(P("t-more.json")) else {}
    want = "dit.block: the candidate skipped 4 of 6 tensors (fraction 0.6667 > 0.5, the feature's own, calibrated)"
    check(rc == 1 and want in j.get("reasons", []), "T2: skipping 4 of 6 fails with '%s' [rc=%d %r]"
          % (want, rc, j.get("reasons")))
    del cal["components"]["dit.block"]["skipped_fraction_max"]
    json.dump(cal, open(P("cal-noskip.json"), "w"))
    rc, so, se = run(COMPARE, P("t-ref.h5"), P("t-ok.h5"), "--gate", "T2", "--calibration",
                     P("cal-noskip.json"), "--json", P("t-ns.json"))
    j = json.load(open(P("t-ns.json"))) if os.path.exists(P("t-ns.json")) else {}
    check(rc == 1 and j.get("missing_in_candidate") == ["/dit.block/0003/out", "/dit.block/0005/out"]
          and j.get("skipped_by_feature") == [],
          "T2: without skipped_fraction_max the lacking tensors are missing (exit 1) [rc=%d]" % rc)
    bad = dict(cal)
    bad["components"] = dict(cal["components"])
    bad["components"]["dit.block"] = dict(cal["components"]["dit.block"], skipped_fraction_max=1.5)
    json.dump(bad, open(P("cal-bad.json"), "w"))
    rc, so, se = run(COMPARE, P("t-ref.h5"), P("t-ok.h5"), "--gate", "T2", "--calibration", P("cal-bad.json"))
    check(rc == 2 and "skipped_fraction_max 1.5 is a fraction and must be in [0, 1]" in se
          and len(se.strip().splitlines()) == 1,
          "T2: a skipped_fraction_max above 1 is a one-line error, exit 2 [%s]" % se.strip())


def main():
    d = tempfile.mkdtemp(prefix="probe-skips-")

    def P(name):
        return os.path.join(d, name)
    pairing(P)
    calibrate_and_gate(P)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
