"""Checks of scripts/gpu/parallel.sh (docs/parallel.md): a 2-rank
NCCL sequence-parallel run of tests/programs/sp_block.py against its
single-GPU capture, from the capture files alone (h5py + numpy, fp64).

    python3 parallel.py verify REF.h5 ON.h5 STEPS [CMP.json]
    python3 parallel.py summary CMP.json

REF.h5 is the single-process capture, ON.h5 the index of the 2-rank run
(its rank files ON.rank0.h5, ON.rank1.h5 next to it). Prints PASS / FAIL /
INFO lines; exit 1 when a check failed.
  - the index lists the two rank files; each rank file's manifest has its
    rank, world_size 2, the "shard" spec, and "nccl" counts of rank R of 2
    with 2*STEPS all_gathers under dit.step (K and V of every step);
  - every captured all_gather (/dit.step/<call>/nccl.<k>.all_gather.out) is
    bit-identical on both ranks and equals the ranks' all_gather.in joined
    in rank order (what ncclAllGather promises, nccl.h);
  - the tensors of REF.h5 reassembled from the ranks (sharded ones joined
    along their "shard" axis, replicated ones bit-identical on both ranks)
    have REF's shapes; rel_l2 and max_abs against REF are printed;
  - with CMP.json (probe-compare REF ON --json CMP.json): each compared
    tensor's rel_l2 and max_abs equal the numbers computed here to 1e-12
    relative, its "ranks" is 2 and "shard_axis" the manifest's axis (null
    for a replicated tensor), and "collectives_unmatched" lists the NCCL
    captures (the single-GPU reference has none).
"""
import fnmatch
import json
import os
import sys

FAILS = []


def say(ok, what):
    print("%s %s" % ("PASS" if ok else "FAIL", what), flush=True)
    if not ok:
        FAILS.append(what)
    return ok


def datasets(f):
    import h5py
    out = []
    f.visititems(lambda k, o: out.append("/" + k) if isinstance(o, h5py.Dataset) else None)
    return sorted(out)


def shard_axis(shard, path):
    for s in shard or []:
        g = s["glob"]
        if fnmatch.fnmatchcase(path, g) or (not g.startswith("/") and fnmatch.fnmatchcase(path[1:], g)):
            return s["axis"]
    return None


def metrics(r, c):
    import numpy as np
    r = np.asarray(r, np.float64).ravel()
    c = np.asarray(c, np.float64).ravel()
    d = np.abs(c - r)
    nr = float(np.sqrt(np.sum(r * r)))
    rel = float(np.sqrt(np.sum(d * d))) / nr if nr > 0 else (0.0 if not d.any() else float("inf"))
    return rel, (float(d.max()) if d.size else 0.0)


def close(a, b, rel=1e-12):
    if a is None or b is None:
        return a is None and b is None
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


def verify(ref, on, steps, cmp_json=None):
    import h5py
    import numpy as np
    stem, ext = os.path.splitext(on)
    names = ["%s.rank%d%s" % (stem, r, ext) for r in (0, 1)]
    with h5py.File(on, "r") as f:
        m = json.loads(f.attrs["probe.manifest"])
        say(datasets(f) == [] and m.get("ranks") == [os.path.basename(n) for n in names],
            "%s is the index of %s" % (os.path.basename(on), m.get("ranks")))
    ranks = []
    for r, n in enumerate(names):
        if not say(os.path.isfile(n), "%s exists" % os.path.basename(n)):
            return
        with h5py.File(n, "r") as f:
            m = json.loads(f.attrs["probe.manifest"])
            t = {p: f[p][()] for p in datasets(f)}
        nc = m.get("nccl") or {}
        ag = (((nc.get("calls") or {}).get("dit.step") or {}).get("all_gather") or {}).get("count")
        say(m.get("rank") == r and m.get("world_size") == 2 and bool(m.get("shard")) and
            nc.get("rank") == r and nc.get("nranks") == 2 and ag == 2 * steps,
            "rank %d manifest: rank %s world_size %s shard %s; nccl rank %s nranks %s, dit.step all_gathers %s (want %d)"
            % (r, m.get("rank"), m.get("world_size"), json.dumps(m.get("shard")), nc.get("rank"),
               nc.get("nranks"), ag, 2 * steps))
        print("INFO rank %d nccl: %s" % (r, json.dumps(nc)))
        ranks.append((m, t))
    shard = ranks[0][0].get("shard")

    # the collectives: identical on both ranks, and the gather of the inputs
    outs = sorted(p for p in ranks[0][1] if p.endswith("all_gather.out"))  # in a scope or /nccl/K/
    say(len(outs) == 2 * steps, "%d all_gather outputs captured per rank (want %d: K and V of %d steps)"
        % (len(outs), 2 * steps, steps))
    for p in outs:
        a, b = ranks[0][1].get(p), ranks[1][1].get(p)
        pin = p[:-len("out")] + "in"
        i0, i1 = ranks[0][1].get(pin), ranks[1][1].get(pin)
        same = b is not None and a.shape == b.shape and a.tobytes() == b.tobytes()
        gathered = i0 is not None and i1 is not None and np.concatenate([i0, i1]).tobytes() == a.tobytes()
        say(same and gathered, "%s: bit-identical on both ranks (%s) and equal to the ranks' inputs joined (%s), "
            "%d elements" % (p, same, gathered, a.size))

    # the reference's tensors from the rank set
    with h5py.File(ref, "r") as f:
        ref_paths = datasets(f)
        ref_t = {p: f[p][()] for p in ref_paths}
    mine = {}
    for p in ref_paths:
        a, b = ranks[0][1].get(p), ranks[1][1].get(p)
        if not say(a is not None and b is not None, "%s captured on both ranks" % p):
            continue
        ax = shard_axis(shard, p)
        if ax is None:
            say(a.tobytes() == b.tobytes(), "%s (replicated) bit-identical on both ranks" % p)
            joined = a
        else:
            joined = np.concatenate([a, b], axis=ax)
        if not say(joined.shape == ref_t[p].shape, "%s reassembled (shard axis %s) to %s, reference %s"
                   % (p, ax, joined.shape, ref_t[p].shape)):
            continue
        mine[p] = metrics(ref_t[p], joined) + (ax,)
        print("INFO numpy %-38s rel_l2 %.6g max_abs %.6g" % (p, mine[p][0], mine[p][1]))

    if cmp_json is None:
        return
    try:
        with open(cmp_json) as f:
            js = json.load(f)
    except (OSError, ValueError) as e:
        say(False, "%s readable (%s)" % (cmp_json, e))
        return
    tens = {t["path"]: t for t in js.get("tensors", [])}
    off = [p for p in mine if p not in tens or not (close(tens[p].get("rel_l2"), mine[p][0]) and
                                                    close(tens[p].get("max_abs"), mine[p][1]))]
    say(not off, "probe-compare's rel_l2 and max_abs equal numpy's on the reassembled tensors to 1e-12 "
        "(%d tensors; off: %s)" % (len(mine), off[:3]))
    bad = [(p, tens[p].get("ranks"), tens[p].get("shard_axis")) for p in mine if p in tens and
           (tens[p].get("ranks") != 2 or tens[p].get("shard_axis") != mine[p][2])]
    say(not bad, "every compared tensor reports ranks 2 and the manifest's shard_axis (%s)" % bad[:3])
    cd = js.get("collective_divergence")
    say(cd == [], "collective_divergence is empty: every all_gather output identical on both ranks "
        "by probe-compare's check too (%s)" % cd)
    cu = js.get("collectives_unmatched")
    want = [{"side": "candidate", "rank": r, "count": 4 * steps} for r in (0, 1)]
    got = sorted(cu, key=lambda e: e.get("rank", -1)) if isinstance(cu, list) else cu
    say(got == want, "collectives_unmatched lists each rank's NCCL captures against the single-GPU reference "
        "(all_gather in + out, K and V, %d steps: %s; want %s)" % (steps, got, want))


def summary(cmp_json):
    """One line about a probe-compare JSON: worst rel_l2, lowest cosine, the
    tensors with element-wise mismatches; exit 0 when rel_l2 <= 5e-2 and
    cosine >= 0.999 everywhere (T1-relaxed's aggregate bounds, docs/gates.md),
    i.e. when only the element-wise test can have failed the relaxed gate."""
    with open(cmp_json) as f:
        js = json.load(f)
    ts = [t for t in js.get("tensors", []) if t.get("rel_l2") is not None]
    rel = max((t["rel_l2"] for t in ts), default=float("nan"))
    cos = min((t["cosine"] for t in ts if t.get("cosine") is not None), default=float("nan"))
    mis = [t for t in ts if (t.get("mismatch_fraction") or 0) > 0]
    worst = max(mis, key=lambda t: t["mismatch_fraction"]) if mis else None
    print("worst rel_l2 %.4g, lowest cosine %.8f, %d of %d tensors with element-wise mismatches%s"
          % (rel, cos, len(mis), len(ts), " (most: %s %.4g of the elements, max_abs %.4g)"
             % (worst["path"], worst["mismatch_fraction"], worst["max_abs"]) if worst else ""))
    return 0 if ts and rel <= 5e-2 and cos >= 0.999 else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "summary":
        sys.exit(summary(sys.argv[2]))
    if len(sys.argv) not in (5, 6) or sys.argv[1] != "verify":
        sys.exit("usage: parallel.py verify REF.h5 ON.h5 STEPS [CMP.json] | summary CMP.json")
    verify(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) == 6 else None)
    print("parallel_check: %d check(s) failed" % len(FAILS) if FAILS else "parallel_check: all checks passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
