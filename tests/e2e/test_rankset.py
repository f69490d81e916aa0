"""probe-compare over per-rank candidates (docs/nccl.md "Comparing rank sets").

Rank files are written with h5py (probe.* attributes and a manifest with
rank, world_size and shard, as docs/file-format.md and docs/nccl.md say) from
numpy tensors split along an axis. Checked against independent values:
- a sharded candidate (axes 0, 1 and the last, unequal pieces, a glob without
  its leading '/') gives bit for bit the metrics of the same tensors compared
  whole, and those match a numpy fp64 oracle; JSON "ranks" and "shard_axis";
- a perturbed piece fails with max_abs_index in the LOGICAL tensor;
- a replicated tensor differing on rank 1 is named (and rank 0 when it is the
  odd one of three); a path only one rank holds lists "ranks_present";
- bad sets: duplicate rank, missing rank, world size mismatch, a file without
  rank -> exit 2 naming the file; pieces whose shapes differ off the shard axis
  -> that tensor fails with the reason;
- the index file form; --reference-rank with a rank set of the same size:
  rank-by-rank comparison; different sizes: both joined;
- collectives (/nccl/0000/all_gather.out): unmatched against a single-file
  reference (counted per rank, not missing), compared per rank between two rank
  sets, and an all_gather output that differs across ranks names the rank.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
from urllib.parse import quote

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def write(path, tensors, manifest):
    """tensors: list of (dataset path, numpy array); seq = list order."""
    with h5py.File(path, "w") as f:
        f.attrs["probe.format"] = "probe-capture"
        f.attrs["probe.version"] = np.int64(1)
        f.attrs["probe.manifest"] = json.dumps(manifest)
        for seq, (p, a) in enumerate(tensors):
            d = f.create_dataset(p, data=a)
            parts = p.strip("/").split("/")
            d.attrs["probe.dtype"] = {"float32": "float32", "float64": "float64"}[str(a.dtype)]
            d.attrs["probe.shape"] = np.array(a.shape, dtype=np.int64)
            d.attrs["probe.component"] = parts[0]
            d.attrs["probe.slot"] = parts[-1]
            if len(parts) == 3 and parts[1].isdigit():
                d.attrs["probe.call"] = np.int64(int(parts[1]))
            d.attrs["probe.seq"] = np.uint64(seq)


def run(*args):
    p = subprocess.run([COMPARE, "--quiet", *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def compare(*args):
    rc, out, err = run("--json", "-", *args)
    if rc == 2:
        print("exit 2: " + err.strip())
        return rc, None, err
    return rc, json.loads(out), err


def by_path(j, rank=None):
    return {t["path"]: t for t in j["tensors"] if rank is None or t.get("rank") == rank}


def oracle(r, c):
    r = r.astype(np.float64).ravel()
    c = c.astype(np.float64).ravel()
    d = np.abs(c - r)
    nr, nc = math.sqrt(math.fsum(r * r)), math.sqrt(math.fsum(c * c))
    return {
        "rel_l2": math.sqrt(math.fsum((c - r) ** 2)) / nr,
        "cosine": math.fsum(r * c) / (nr * nc),
        "max_abs": float(d.max()),
        "max_abs_flat": int(np.argmax(d)),
        "p99_abs": float(np.percentile(d, 99, method="inverted_cdf")),
        "mean_abs": math.fsum(d) / d.size,
    }


def close(a, b, rel=1e-9):
    return a is not None and abs(a - b) <= rel * max(abs(b), 1e-300)


METRICS = ("rel_l2", "cosine", "max_abs", "max_abs_index", "p99_abs", "mean_abs",
           "mismatch_fraction", "mismatch_count", "identical", "n", "shape")

SHARD = [{"glob": "/dit.step/*/out", "axis": 1},
         {"glob": "dit.step/*/y", "axis": 0},       # no leading '/': tried without it
         {"glob": "/vae/*/z", "axis": 2}]           # the last axis


def split(a, axis, sizes):
    cuts = np.cumsum(sizes)[:-1]
    return np.split(a, cuts, axis=axis)


def main():
    rng = np.random.default_rng(7)
    d = tempfile.mkdtemp(prefix="probe-rankset-")
    P = lambda n: os.path.join(d, n)

    ref = {
        "/dit.step/0000/out": rng.standard_normal((2, 8, 6)).astype(np.float32),
        "/dit.step/0000/y": rng.standard_normal((5, 4)).astype(np.float32),
        "/vae/0000/z": rng.standard_normal((3, 4, 7)),                 # float64
        "/text_encoder/0000/out": rng.standard_normal(16).astype(np.float32),
    }
    cand = {k: (v + (rng.standard_normal(v.shape) * 1e-6).astype(v.dtype)) for k, v in ref.items()}
    # Pieces: axis 1 split 5 + 3, axis 0 split 2 + 3, last axis split 3 + 4; replicated encoder.
    pieces = {
        "/dit.step/0000/out": split(cand["/dit.step/0000/out"], 1, [5, 3]),
        "/dit.step/0000/y": split(cand["/dit.step/0000/y"], 0, [2, 3]),
        "/vae/0000/z": split(cand["/vae/0000/z"], 2, [3, 4]),
    }
    order = ["/text_encoder/0000/out", "/dit.step/0000/out", "/dit.step/0000/y", "/vae/0000/z"]

    def rank_tensors(r, extra=()):
        t = []
        for p in order:
            t.append((p, pieces[p][r] if p in pieces else cand[p]))
        return t + list(extra)

    def man(r, w=2, shard=SHARD):
        m = {"rank": r, "world_size": w, "label": "on"}
        if shard is not None:
            m["shard"] = shard
        return m

    write(P("ref.h5"), [(p, ref[p]) for p in order], {"label": "off"})
    write(P("full.h5"), [(p, cand[p]) for p in order], {"label": "on, one file"})
    write(P("on.rank0.h5"), rank_tensors(0), man(0))
    write(P("on.rank1.h5"), rank_tensors(1), man(1))

    # --- 1. joined candidate == the same tensors compared whole, == numpy ---
    rc_full, jfull, _ = compare(P("ref.h5"), P("full.h5"))
    rc, j, err = compare(P("ref.h5"), P("on.rank0.h5"), P("on.rank1.h5"))
    check(rc == 0 and j is not None and j["verdict"] == "pass",
          "joined rank set passes T1 (rc=%s, %s)" % (rc, j and j["reasons"]))
    if j:
        tf, tj = by_path(jfull), by_path(j)
        check(sorted(tf) == sorted(tj), "same tensors as the whole-file compare: %s" % sorted(tj))
        for p in order:
            same = all(tf[p].get(k) == tj[p].get(k) for k in METRICS)
            check(same, "%s: metrics bit-identical to the whole tensors (%s)" % (
                p, {k: (tf[p].get(k), tj[p].get(k)) for k in METRICS if tf[p].get(k) != tj[p].get(k)}))
            o = oracle(ref[p], cand[p])
            idx = list(np.unravel_index(o["max_abs_flat"], ref[p].shape))
            check(all(close(tj[p][k], o[k]) for k in ("rel_l2", "cosine", "mean_abs"))
                  and tj[p]["max_abs"] == o["max_abs"] and tj[p]["p99_abs"] == o["p99_abs"]
                  and tj[p]["max_abs_index"] == [int(i) for i in idx],
                  "%s: numpy oracle %s vs %s" % (p, o, {k: tj[p][k] for k in METRICS}))
        check(tj["/dit.step/0000/out"].get("ranks") == 2 and
              tj["/dit.step/0000/out"].get("shard_axis") == 1 and
              tj["/dit.step/0000/y"].get("shard_axis") == 0 and
              tj["/vae/0000/z"].get("shard_axis") == 2 and
              tj["/vae/0000/z"]["shape"] == [3, 4, 7] and
              "shard_axis" not in tj["/text_encoder/0000/out"] and
              tj["/text_encoder/0000/out"].get("ranks") == 2,
              "JSON ranks / shard_axis / joined shape")
        rsj = j.get("rank_sets") or {}
        check(rsj.get("reference") is None and (rsj.get("candidate") or {}).get("world_size") == 2
              and rsj["candidate"]["files"] == [P("on.rank0.h5"), P("on.rank1.h5")]
              and rsj.get("per_rank") is False,
              "rank_sets: %s" % rsj)
    # Rank order, not argument order.
    rc2, j2, _ = compare(P("ref.h5"), P("on.rank1.h5"), P("on.rank0.h5"))
    check(rc2 == 0 and j2 and by_path(j2) == by_path(j), "files given 1, 0: same result (rank order)")
    # Text output shows the set.
    p = subprocess.run([COMPARE, P("ref.h5"), P("on.rank0.h5"), P("on.rank1.h5")],
                       capture_output=True, text=True)
    check(p.returncode == 0 and "rank set of 2 files" in p.stdout and "rank set (2 files)" in p.stdout,
          "text output names the rank set")

    # The HTML report carries the same JSON (rank_sets, shard_axis) and shows the set.
    p = subprocess.run([COMPARE, "--quiet", "--html", P("r.html"), P("ref.h5"), P("on.rank0.h5"),
                        P("on.rank1.h5")], capture_output=True, text=True)
    html = open(P("r.html")).read() if os.path.exists(P("r.html")) else ""
    check(p.returncode == 0 and '"rank_sets"' in html and '"shard_axis": 1' in html.replace('":1', '": 1')
          and "rank set (" in html, "HTML report: rank_sets and shard_axis in its data, a files row")

    # A root input (latents.init) sharded too: the root-input check sees the joined tensor.
    lat = rng.standard_normal((4, 3)).astype(np.float32)
    shard_l = SHARD + [{"glob": "/latents.init/*", "axis": 0}]
    write(P("ref_l.h5"), [("/latents.init/0000/out", lat)] + [(p, ref[p]) for p in order], {})
    for r in range(2):
        write(P("l.rank%d.h5" % r), [("/latents.init/0000/out", lat[2 * r:2 * r + 2])] +
              rank_tensors(r), man(r, 2, shard_l))
    rc, j, _ = compare(P("ref_l.h5"), P("l.rank0.h5"), P("l.rank1.h5"))
    check(rc == 0 and j and j["same_experiment"] is True and
          [x["same"] for x in j["root_inputs"]] == [True],
          "sharded root input: the same experiment when the joined latents equal the reference's "
          "(%s)" % (j and j["root_inputs"]))
    lat_b = lat.copy()
    lat_b[3, 1] += 1
    write(P("lb.rank1.h5"), [("/latents.init/0000/out", lat_b[2:4])] + rank_tensors(1),
          man(1, 2, shard_l))
    rc, j, _ = compare(P("ref_l.h5"), P("l.rank0.h5"), P("lb.rank1.h5"))
    check(rc == 1 and j and j["same_experiment"] is False and
          any("not the same experiment: root input /latents.init/0000/out" in x for x in j["reasons"]),
          "sharded root input differing on rank 1: not the same experiment (%s)" % (j and j["reasons"]))

    # --- 2. a perturbed piece: max_abs_index in the logical tensor ---
    bad = [a.copy() for a in pieces["/dit.step/0000/out"]]
    bad[1][1, 2, 4] += 1.0          # rank 1's piece starts at logical row 5 of axis 1
    pieces_b = dict(pieces)
    pieces_b["/dit.step/0000/out"] = bad
    write(P("pb.rank0.h5"), [(p, pieces_b[p][0] if p in pieces_b else cand[p]) for p in order], man(0))
    write(P("pb.rank1.h5"), [(p, pieces_b[p][1] if p in pieces_b else cand[p]) for p in order], man(1))
    rc, j, _ = compare(P("ref.h5"), P("pb.rank0.h5"), P("pb.rank1.h5"))
    t = j and by_path(j)["/dit.step/0000/out"]
    check(rc == 1 and t and t["verdict"] == "fail" and t["max_abs_index"] == [1, 7, 4]
          and j["first_failure"] == "/dit.step/0000/out",
          "perturbed shard fails at logical index [1, 7, 4] (%s)" % (t and t["max_abs_index"]))

    # --- 3. replicated tensor differing on rank 1; rank 0 the odd one of 3 ---
    enc_bad = cand["/text_encoder/0000/out"].copy()
    enc_bad[3] += 0.5
    t1 = rank_tensors(1)
    t1[0] = ("/text_encoder/0000/out", enc_bad)
    write(P("rp.rank0.h5"), rank_tensors(0), man(0))
    write(P("rp.rank1.h5"), t1, man(1))
    rc, j, _ = compare(P("ref.h5"), P("rp.rank0.h5"), P("rp.rank1.h5"))
    t = j and by_path(j)["/text_encoder/0000/out"]
    check(rc == 1 and t and t["verdict"] == "fail" and t.get("replica_mismatch_ranks") == [1]
          and "replicated tensor differs on rank 1 (from rank 0)" in t["reasons"]
          and close(t["rel_l2"], oracle(ref["/text_encoder/0000/out"],
                                        cand["/text_encoder/0000/out"])["rel_l2"]),
          "replicated tensor differing on rank 1 named, rank 0's copy compared (%s)" % (t and t["reasons"]))
    # three ranks, only replicated tensors, rank 0 differs from ranks 1 and 2 (which agree)
    enc = cand["/text_encoder/0000/out"]
    for r in range(3):
        write(P("r3.rank%d.h5" % r), [("/text_encoder/0000/out", enc_bad if r == 0 else enc),
                                      ("/text_encoder/0000/x%d" % r, enc)], man(r, 3, None))
    write(P("ref3.h5"), [("/text_encoder/0000/out", ref["/text_encoder/0000/out"]),
                         ("/text_encoder/0000/x1", ref["/text_encoder/0000/out"])], {})
    rc, j, _ = compare(P("ref3.h5"), P("r3.rank0.h5"), P("r3.rank1.h5"), P("r3.rank2.h5"))
    t = j and by_path(j)
    check(rc == 1 and t and t["/text_encoder/0000/out"].get("replica_mismatch_ranks") == [0]
          and any("replicated tensor differs on rank 0" in x for x in t["/text_encoder/0000/out"]["reasons"]),
          "rank 0 the odd one of three is named (%s)" % (t and t["/text_encoder/0000/out"]["reasons"]))
    # a path only rank 1 holds: compared from it, ranks_present [1]; x0/x2 missing in reference
    check(t and t["/text_encoder/0000/x1"].get("ranks_present") == [1]
          and t["/text_encoder/0000/x1"]["verdict"] == "pass"
          and sorted(j["missing_in_reference"]) == ["/text_encoder/0000/x0", "/text_encoder/0000/x2"],
          "partial path: ranks_present [1], others missing in reference (%s)" % (
              j and j["missing_in_reference"]))

    # --- 4. bad sets: exit 2, one line naming the file ---
    write(P("dup.h5"), rank_tensors(0), man(0))
    write(P("w3.h5"), rank_tensors(1), man(1, 3))
    write(P("norank.h5"), rank_tensors(1), {"label": "x"})
    for files, want, what in [
        ([P("on.rank0.h5"), P("dup.h5")], ["dup.h5", "rank 0 appears twice"], "duplicate rank"),
        ([P("on.rank0.h5"), P("w3.h5")], ["w3.h5", "world_size 3", "world_size 2"], "world size mismatch"),
        ([P("r3.rank0.h5"), P("r3.rank1.h5")], ["r3.rank0.h5", "rank 2 is missing"], "missing rank"),
        ([P("on.rank0.h5"), P("norank.h5")], ["norank.h5", "not a per-rank capture"], "no rank"),
        ([P("on.rank0.h5"), P("nosuch.h5")], ["nosuch.h5"], "no such file"),
    ]:
        rc, _, err = run(P("ref.h5"), *files)
        check(rc == 2 and all(w in err for w in want) and err.count("\n") == 1
              and err.startswith("probe-compare: "), "%s -> exit 2: %r" % (what, err))
    # shapes differing off the shard axis: that tensor fails with the reason, the rest compares
    sh1 = rank_tensors(1)
    sh1[1] = ("/dit.step/0000/out", np.zeros((3, 3, 6), np.float32))
    write(P("sh.rank0.h5"), rank_tensors(0), man(0))
    write(P("sh.rank1.h5"), sh1, man(1))
    rc, j, _ = compare(P("ref.h5"), P("sh.rank0.h5"), P("sh.rank1.h5"))
    t = j and by_path(j)
    check(rc == 1 and t and t["/dit.step/0000/out"]["verdict"] == "fail"
          and any("shape differs on axis 0 (not the shard axis 1): 2 on rank 0, 3 on rank 1" in x
                  for x in t["/dit.step/0000/out"]["reasons"])
          and t["/dit.step/0000/y"]["verdict"] == "pass",
          "shape mismatch off the shard axis: reason (%s)" % (t and t["/dit.step/0000/out"]["reasons"]))

    # --- 5. the index file ---
    write(P("on.h5"), [], {"label": "index", "ranks": ["on.rank0.h5", "on.rank1.h5"], "shard": SHARD})
    rc, ji, _ = compare(P("ref.h5"), P("on.h5"))
    rc0, j0, _ = compare(P("ref.h5"), P("on.rank0.h5"), P("on.rank1.h5"))
    check(rc == 0 and ji and by_path(ji) == by_path(j0) and
          ji["rank_sets"]["candidate"]["index"] == P("on.h5"),
          "index file on.h5 expands to its rank files (rc=%s)" % rc)
    # no index file (its writer never ran): the rank files next to where it would be
    rc, jx, _ = compare(P("ref.h5"), P("on_noindex.h5"))
    check(rc == 2, "no index and no rank files -> exit 2")
    for r in range(2):
        write(P("sib.rank%d.h5" % r), rank_tensors(r), man(r))
    rc, jx, _ = compare(P("ref.h5"), P("sib.h5"))
    check(rc == 0 and jx and by_path(jx) == by_path(j0) and jx["rank_sets"]["candidate"]["files"] ==
          [P("sib.rank0.h5"), P("sib.rank1.h5")], "no index: sib.h5 finds sib.rank0.h5, sib.rank1.h5 (rc=%s)" % rc)
    # rank files without "shard": the index's list is used
    for r in range(2):
        write(P("ns.rank%d.h5" % r), rank_tensors(r), man(r, 2, None))
    write(P("ns.h5"), [], {"ranks": ["ns.rank0.h5", "ns.rank1.h5"], "shard": SHARD})
    rc, jn, _ = compare(P("ref.h5"), P("ns.h5"))
    check(rc == 0 and jn and by_path(jn) == by_path(j0), "rank files without shard: the index's (rc=%s)" % rc)
    # without any shard list the pieces are not joined: partial paths, shapes differ
    rc, jn, _ = compare(P("ref.h5"), P("ns.rank0.h5"), P("ns.rank1.h5"))
    t = jn and by_path(jn)["/dit.step/0000/out"]
    check(rc == 1 and t and t["verdict"] == "fail" and "shard_axis" not in t,
          "no shard list: pieces not joined, tensor fails (%s)" % (t and t["reasons"]))
    write(P("badidx.h5"), [], {"ranks": ["on.rank0.h5", "gone.rank1.h5"]})
    rc, _, err = run(P("ref.h5"), P("badidx.h5"))
    check(rc == 2 and "gone.rank1.h5" in err, "index naming a missing file -> exit 2: %r" % err)

    # --- 6. collectives ---
    ag = np.arange(12, dtype=np.float32)
    write(P("c.rank0.h5"), rank_tensors(0, [("/nccl/0000/all_gather.in", ag[:6]),
                                            ("/nccl/0000/all_gather.out", ag)]), man(0))
    write(P("c.rank1.h5"), rank_tensors(1, [("/nccl/0000/all_gather.in", ag[6:]),
                                            ("/nccl/0000/all_gather.out", ag)]), man(1))
    rc, j, _ = compare(P("ref.h5"), P("c.rank0.h5"), P("c.rank1.h5"))
    check(rc == 0 and j and j["collectives_unmatched"] == [
        {"side": "candidate", "rank": 0, "count": 2}, {"side": "candidate", "rank": 1, "count": 2}]
          and j["missing_in_reference"] == [] and j["collective_divergence"] == []
          and not any("nccl" in t["path"] for t in j["tensors"]),
          "collectives against one file: unmatched per rank, not missing (%s)" % (
              j and j.get("collectives_unmatched")))
    ag_bad = ag.copy()
    ag_bad[0] = 99
    write(P("cb.rank1.h5"), rank_tensors(1, [("/nccl/0000/all_gather.in", ag[6:]),
                                             ("/nccl/0000/all_gather.out", ag_bad)]), man(1))
    rc, j, _ = compare(P("ref.h5"), P("c.rank0.h5"), P("cb.rank1.h5"))
    check(rc == 1 and j and j["collective_divergence"] == [
        {"side": "candidate", "path": "/nccl/0000/all_gather.out", "ranks": [1]}]
          and any("all_gather.out on rank 1 (from rank 0)" in x for x in j["reasons"]),
          "all_gather output differing across ranks names rank 1 (%s)" % (j and j["reasons"]))

    # --- 7. two rank sets of the same size: rank by rank, collectives per rank and call ---
    refp = {p: split(ref[p], SHARD_AX[p][0], SHARD_AX[p][1]) for p in pieces}
    for r in range(2):
        write(P("off.rank%d.h5" % r),
              [(p, refp[p][r] if p in refp else ref[p]) for p in order] +
              [("/nccl/0000/all_gather.in", ag[6 * r:6 * r + 6]), ("/nccl/0000/all_gather.out", ag)],
              man(r))
    rc, j, _ = compare("--reference-rank", P("off.rank0.h5"), "--reference-rank", P("off.rank1.h5"),
                       P("c.rank0.h5"), P("c.rank1.h5"))
    ok = rc == 0 and j and j["rank_sets"]["per_rank"] is True and len(j["tensors"]) == 2 * 6
    for r in range(2):
        t = j and by_path(j, r)
        for p in pieces:
            o = oracle(refp[p][r], pieces[p][r])
            ok = ok and close(t[p]["rel_l2"], o["rel_l2"]) and t[p]["max_abs"] == o["max_abs"] \
                and list(t[p]["shape"]) == list(pieces[p][r].shape)
        ok = ok and t["/nccl/0000/all_gather.out"]["identical"] is True
    check(ok, "rank sets of equal size: compared rank r vs rank r, per-rank numpy metrics, "
              "collectives per rank (rc=%s)" % rc)
    rc, j, _ = compare("--reference-rank", P("off.rank0.h5"), "--reference-rank", P("off.rank1.h5"),
                       P("c.rank0.h5"), P("cb.rank1.h5"))
    t = j and by_path(j, 1)
    check(rc == 1 and t and t["/nccl/0000/all_gather.out"]["verdict"] == "fail"
          and j["collective_divergence"][0]["ranks"] == [1],
          "per rank: rank 1's all_gather output fails and is named")
    p = subprocess.run([COMPARE, "--reference-rank", P("off.rank0.h5"), "--reference-rank",
                        P("off.rank1.h5"), P("c.rank0.h5"), P("cb.rank1.h5")], capture_output=True, text=True)
    check(p.returncode == 1 and "/nccl/0000/all_gather.out (rank 1)   " in p.stdout and
          "first failure: component nccl at /nccl/0000/all_gather.out (rank 1): " in p.stdout and
          "compared rank by rank" in p.stdout, "text: per-rank rows and the first failure name the rank")
    p = subprocess.run([COMPARE, "--quiet", "--junit", "-", "--reference-rank", P("off.rank0.h5"),
                        "--reference-rank", P("off.rank1.h5"), P("c.rank0.h5"), P("cb.rank1.h5")],
                       capture_output=True, text=True)
    check('name="/nccl/0000/all_gather.out (rank 1)">\n   <failure message="mismatch' in p.stdout and
          'name="/nccl/0000/all_gather.out (rank 0)"/>' in p.stdout,
          "JUnit: one test case per rank, rank 1's fails")
    # HTML: rank 1's pair is selectable by itself (the same path is on both ranks)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        subprocess.run([COMPARE, "--quiet", "--html", P("pr.html"), "--reference-rank", P("off.rank0.h5"),
                        "--reference-rank", P("off.rank1.h5"), P("c.rank0.h5"), P("cb.rank1.h5")],
                       capture_output=True)
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
        for frag, want in [("/nccl/0000/all_gather.out (rank 1)", "FAIL"),
                           ("/nccl/0000/all_gather.out (rank 0)", "PASS")]:
            url = "file://" + quote(P("pr.html")) + "#tensor=" + quote(frag)
            dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                                  "--user-data-dir=" + P("profile"), "--dump-dom", url],
                                 capture_output=True, text=True, timeout=120, env=env).stdout
            m = re.search(r'id="detail-path">([^<]*)</code>.*?id="detail-verdict"[^>]*>([A-Z]+)<', dom, re.S)
            check(m is not None and m.group(1) == frag and m.group(2) == want,
                  "HTML: %s selected, verdict %s (%s)" % (frag, want, m and m.groups()))
    else:
        print("skip HTML rendering: no chromium")
    rc, _, err = run("--reference-rank", P("off.rank0.h5"), "--reference-rank", P("off.rank0.h5"),
                     P("c.rank0.h5"), P("c.rank1.h5"))
    check(rc == 2 and "rank 0 appears twice" in err, "--reference-rank set with rank 0 twice -> exit 2")
    # different sizes: the 3-rank reference (replicated only) against a 2-rank candidate: joined
    write(P("e.rank0.h5"), [("/text_encoder/0000/out", enc)], man(0, 2, None))
    write(P("e.rank1.h5"), [("/text_encoder/0000/out", enc)], man(1, 2, None))
    write(P("f.rank0.h5"), [("/text_encoder/0000/out", ref["/text_encoder/0000/out"])], man(0, 3, None))
    write(P("f.rank1.h5"), [("/text_encoder/0000/out", ref["/text_encoder/0000/out"])], man(1, 3, None))
    write(P("f.rank2.h5"), [("/text_encoder/0000/out", ref["/text_encoder/0000/out"])], man(2, 3, None))
    rc, j, _ = compare(*sum([["--reference-rank", P("f.rank%d.h5" % r)] for r in range(3)], []),
                       P("e.rank0.h5"), P("e.rank1.h5"))
    check(rc == 0 and j and j["rank_sets"]["per_rank"] is False and len(j["tensors"]) == 1
          and "rank" not in j["tensors"][0],
          "rank sets of sizes 3 and 2: both joined (rc=%s)" % rc)

    # --- 8. the weights check reads rank 0's manifest (the index records none) ---
    def wts(h):
        o = [{"k": 0, "shape": [16, 16], "dtype": "bfloat16", "xxh64": h}]
        return {"overflow": 0, "components": {"dit.step": {
            "gemms": 1, "bytes": 512, "complete": True, "dtypes": ["bfloat16"],
            "xxh64": h, "operands": o}}}
    write(P("wref.h5"), [(p, ref[p]) for p in order], {"weights": wts("00000000000000aa")})
    for r in range(2):
        m = man(r)
        m["weights"] = wts("00000000000000bb")
        write(P("w.rank%d.h5" % r), rank_tensors(r), m)
    write(P("w.h5"), [], {"ranks": ["w.rank0.h5", "w.rank1.h5"], "shard": SHARD})
    rc, out, err = run(P("wref.h5"), P("w.h5"))
    check(rc == 2 and "different weights" in err,
          "index form: the weight fingerprints of rank 0 are checked (rc=%s, %r)" % (rc, err))

    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


SHARD_AX = {"/dit.step/0000/out": (1, [5, 3]), "/dit.step/0000/y": (0, [2, 3]),
            "/vae/0000/z": (2, [3, 4])}

if __name__ == "__main__":
    sys.exit(main())
