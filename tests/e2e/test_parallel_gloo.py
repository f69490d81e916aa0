"""A 2-way sequence-parallel transformer block against its single-process
run, on the CPU with gloo ranks (docs/parallel.md).

tests/programs/sp_block.py (SPBlockDiT, tapped as dit.step; SPScheduler,
tapped as scheduler.step) runs float32 on the CPU, 2 steps, sequence 16,
width 32, 4 heads:
  ref.h5  one process, the whole sequence, under probe-run;
  on.h5   torchrun --nproc_per_node 2 (gloo) under probe-run --shard ...
          --capture '*' --capture '*nccl*': each rank holds its half of the sequence
          (axis 1), all_gathers K and V, and writes on.rank<R>.h5.
Checked on the capture side (always):
  - rank files with rank / world_size / shard in their manifests, on.h5 the
    index of them;
  - the sequence-sharded tensors joined along axis 1 (numpy) have the
    reference's shape; replicated tensors (the timestep) are bit-identical
    on both ranks; rel_l2 / max_abs of the joined tensors against ref.h5
    computed in fp64 here; the joined last scheduler output equals what the
    program itself saved (np.save), bit for bit;
  - gloo does not go through libnccl: even with '*nccl*' selected, no rank
    file holds a /nccl... or nccl.* dataset and the manifests have no "nccl"
    counts (the collectives list of the compare is therefore empty);
  - --attn blockwise (each rank merges one softmax partial sum per K/V
    block, as ring attention does): not bit-identical, rel_l2 > 0 and
    within float32 rounding (<= 1e-5);
  - SP_BLOCK_PERTURB_RANK=1 (rank 1 scales its fc2 by 1.05): at step 0 rank
    0's half of the output is still bit-identical to the reference, and the
    largest difference lies in rank 1's half.
Checked on the compare side, once probe-compare accepts a rank set
(`probe-compare REF on.h5` and `probe-compare REF on.rank0.h5 on.rank1.h5`;
skipped with a message while it does not): the verdict (T1; a candidate
bit-identical to the reference is "feature not active" under T1 and is
then required to pass --expect-identical; a T1 failure must pass
T1-relaxed:parallel-partial-sum), ranks 2 and shard_axis 1 (null for the
replicated timestep) on every dit.step tensor, rel_l2 / max_abs equal to
numpy's to 1e-12 relative, an empty "collectives_unmatched", the blockwise
run passing T1 with non-zero metrics equal to numpy's, the gather run's
rank set against the blockwise run's (rank r against rank r, per-rank
metrics equal to numpy's), the perturbed run failing with its
max_abs_index in rank 1's half, and scripts/gpu/parallel.py verify
(the GPU check's verifier) on the gloo rank files with NCCL all_gather
captures added here with h5py: passing when consistent, failing (its own
check and probe-compare's collective_divergence) when one rank's output
differs.
Runs with the venv's torch (torch 2.x + torchrun, $PROBE_VENV, default
~/.cache/probe-venv); exits 77 (skipped) when it is absent.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

STEPS, SEQ, DIM, HEADS = 2, 16, 32, 4
SHARD = ["/dit.step/*/out=1", "/dit.step/*/in.hidden_states=1", "/scheduler.step/*/out=1",
         "/scheduler.step/*/in.sample=1", "/scheduler.step/*/in.model_output=1"]
CAUSE = "T1-relaxed:parallel-partial-sum"


def datasets(f):
    import h5py
    n = []
    f.visititems(lambda k, o: n.append("/" + k) if isinstance(o, h5py.Dataset) else None)
    return sorted(n)


def sharded(path):
    import fnmatch
    return any(fnmatch.fnmatchcase(path, s.rsplit("=", 1)[0]) for s in SHARD)


def metrics(r, c):
    """rel_l2 = ||c - r||2 / ||r||2 and max_abs = max |c - r| in fp64
    (docs/metrics.md), and the row-major index of the first maximum."""
    import numpy as np
    r = np.asarray(r, np.float64).ravel()
    c = np.asarray(c, np.float64).ravel()
    d = np.abs(c - r)
    nr = np.sqrt(np.sum(r * r))
    return {"rel_l2": float(np.sqrt(np.sum(d * d)) / nr) if nr > 0 else (0.0 if not d.any() else float("inf")),
            "max_abs": float(d.max()) if d.size else 0.0,
            "max_abs_index": int(np.argmax(d)) if d.size else 0}


def free_port():
    """A TCP port nobody listens on now (the kernel's pick), for torchrun's rendezvous:
    several test suites may run on one machine at once."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def close(a, b, rel=1e-12):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= rel * max(abs(a), abs(b)) or a == b


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from test_shim_common import reexec_in_venv
    py = reexec_in_venv()
    import h5py
    import numpy as np
    from test_shim_common import BUILD, SOURCE, asan_runtime, check, clean_env, finish, need_build

    need_build()
    src = SOURCE or os.path.dirname(os.path.dirname(here))
    prog = os.path.join(src, "tests", "programs", "sp_block.py")
    probe_run = os.path.join(BUILD, "bin", "probe-run")
    compare = os.path.join(BUILD, "bin", "probe-compare")
    torchrun = os.path.join(os.path.dirname(py), "torchrun")
    d = tempfile.mkdtemp(prefix="probe-parallel-")
    env = clean_env()
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    if asan_runtime():  # a sanitizer build's shim needs its runtime first (probe-run keeps it first)
        env["LD_PRELOAD"] = asan_runtime()
    env["OMP_NUM_THREADS"] = "1"  # what torchrun sets for its workers; the same for the reference
    env.pop("PROBE_TORCHRUN_REEXEC", None)
    env.pop("SP_BLOCK_PERTURB_RANK", None)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    args = ["--steps", str(STEPS), "--seq", str(SEQ), "--dim", str(DIM), "--heads", str(HEADS)]
    shard_opts = [x for s in SHARD for x in ("--shard", s)]

    # -- the single-process reference ------------------------------------
    ref = os.path.join(d, "ref.h5")
    r = subprocess.run([probe_run, "--out", ref, "--label", "single", "--", py, prog] + args +
                       ["--save", os.path.join(d, "ref")], env=env, capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr[-2000:])
    check(r.returncode == 0 and "sp_block rank 0/1" in r.stdout, "single-process run under probe-run exits 0")

    # -- the 2-rank gloo run ------------------------------------------------
    def parallel(out, save, extra_env=None, extra_args=()):
        e = dict(env)
        if extra_env:
            e.update(extra_env)
        cmd = [torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()),
               prog] + args + list(extra_args) + ["--save", save]
        return subprocess.run([probe_run, "--out", out, "--label", "sp2", "--capture", "*", "--capture", "*nccl*"] + shard_opts +
                              ["--"] + cmd, env=e, capture_output=True, text=True, timeout=300)

    on = os.path.join(d, "on.h5")
    r = parallel(on, os.path.join(d, "on"))
    print(r.stdout, r.stderr[-3000:])
    lines = sorted(re.findall(r"sp_block rank (\d)/2", r.stdout))
    check(r.returncode == 0 and lines == ["0", "1"], "2-rank gloo torchrun under probe-run exits 0, both ranks report (%s)" % lines)

    with h5py.File(ref, "r") as f:
        ref_paths = datasets(f)
        ref_t = {p: f[p][()] for p in ref_paths}
    want = ["/%s/%04d/%s" % (c, i, s) for i in range(STEPS) for c, s in
            (("dit.step", "in.hidden_states"), ("dit.step", "in.timestep"), ("dit.step", "out"),
             ("scheduler.step", "in.model_output"), ("scheduler.step", "in.sample"),
             ("scheduler.step", "in.timestep"), ("scheduler.step", "out"))]
    check(ref_paths == sorted(want), "ref.h5 holds the dit.step and scheduler.step tensors of %d steps (%d)" % (STEPS, len(ref_paths)))

    def read_ranks(stem):
        files = []
        for rank in (0, 1):
            p = os.path.join(d, "%s.rank%d.h5" % (stem, rank))
            if not check(os.path.isfile(p), "%s.rank%d.h5 exists" % (stem, rank)):
                return None
            with h5py.File(p, "r") as f:
                m = json.loads(f.attrs["probe.manifest"])
                files.append({"m": m, "paths": datasets(f), "t": {q: f[q][()] for q in datasets(f)}})
        return files

    files = read_ranks("on")
    joined = {}
    if files:
        want_shard = [{"glob": s.rsplit("=", 1)[0], "axis": 1} for s in SHARD]
        for rank, fr in enumerate(files):
            m = fr["m"]
            check(m.get("rank") == rank and m.get("world_size") == 2 and m.get("shard") == want_shard,
                  "on.rank%d.h5 manifest: rank %s world_size %s shard %s" % (rank, m.get("rank"), m.get("world_size"), m.get("shard")))
            check(fr["paths"] == ref_paths, "on.rank%d.h5 holds the same paths as ref.h5 (%d)" % (rank, len(fr["paths"])))
            nccl = [q for q in fr["paths"] if "nccl" in q]
            check(nccl == [] and "nccl" not in m,
                  "gloo does not go through libnccl: on.rank%d.h5 has no NCCL datasets (%s) and no \"nccl\" counts "
                  "although '*nccl*' is selected" % (rank, nccl))
        for p in ref_paths:
            a, b = files[0]["t"].get(p), files[1]["t"].get(p)
            if a is None or b is None:
                continue
            if sharded(p):
                ok = a.shape == b.shape and a.shape[1] == SEQ // 2
                if not check(ok, "%s: each rank holds its half of the sequence (%s, %s)" % (p, a.shape, b.shape)):
                    continue
                joined[p] = np.concatenate([a, b], axis=1)
            else:
                check(a.dtype == b.dtype and np.array_equal(a, b),
                      "%s: replicated (not sharded), bit-identical on both ranks" % p)
                joined[p] = a
        check(sorted(joined) == ref_paths and all(joined[p].shape == ref_t[p].shape for p in joined),
              "every reassembled tensor has the reference's shape")
        saved = np.concatenate([np.load(os.path.join(d, "on.rank%d.npy" % k)) for k in (0, 1)], axis=1)
        last = "/scheduler.step/%04d/out" % (STEPS - 1)
        check(last in joined and np.array_equal(joined[last], saved),
              "the joined last scheduler output equals the ranks' own results (np.save), bit for bit")
    if check(os.path.isfile(on), "on.h5 exists"):
        with h5py.File(on, "r") as f:
            m = json.loads(f.attrs["probe.manifest"])
            check(datasets(f) == [] and m.get("ranks") == ["on.rank0.h5", "on.rank1.h5"],
                  "on.h5 is the index (tensors %s, ranks %s)" % (datasets(f), m.get("ranks")))

    np_m = {p: metrics(ref_t[p], joined[p]) for p in joined}
    ident = bool(joined) and all(np.array_equal(ref_t[p], joined[p]) for p in joined)
    for p in sorted(np_m):
        print("INFO numpy %-36s rel_l2 %.6g max_abs %.6g%s" % (p, np_m[p]["rel_l2"], np_m[p]["max_abs"],
              " (identical)" if np.array_equal(ref_t[p], joined[p]) else ""))
    print("INFO the 2-rank float32 run is %s the single-process run"
          % ("bit-identical to" if ident else "not bit-identical to"))
    worst = max((np_m[p]["rel_l2"] for p in np_m), default=float("inf"))
    check(worst <= 1e-2, "numpy: every reassembled tensor within T1's rel_l2 1e-2 of the reference (worst %.3g)" % worst)

    # -- the negative case: rank 1 perturbed ----------------------------------
    bad = os.path.join(d, "bad.h5")
    r = parallel(bad, os.path.join(d, "bad"), {"SP_BLOCK_PERTURB_RANK": "1"})
    check(r.returncode == 0, "perturbed 2-rank run exits 0 (%s)" % r.stderr[-300:])
    bfiles = read_ranks("bad")
    p0 = "/dit.step/0000/out"
    bad_idx = None
    pert_m = {}
    if bfiles and all(bfiles[0]["t"].get(p) is not None and bfiles[1]["t"].get(p) is not None for p in ref_paths):
        for p in ref_paths:
            a, b = bfiles[0]["t"][p], bfiles[1]["t"][p]
            pert_m[p] = metrics(ref_t[p], np.concatenate([a, b], axis=1) if sharded(p) else a)
    for p in sorted(pert_m):
        print("INFO numpy perturbed %-36s rel_l2 %.6g max_abs %.6g" % (p, pert_m[p]["rel_l2"], pert_m[p]["max_abs"]))
    if bfiles and p0 in bfiles[0]["t"] and p0 in bfiles[1]["t"]:
        bj = np.concatenate([bfiles[0]["t"][p0], bfiles[1]["t"][p0]], axis=1)
        half = SEQ // 2
        check(np.array_equal(bj[:, :half], ref_t[p0][:, :half]) and not np.array_equal(bj[:, half:], ref_t[p0][:, half:]),
              "perturbed: at step 0 rank 0's half equals the reference, rank 1's half does not")
        bad_idx = metrics(ref_t[p0], bj)["max_abs_index"]
        check((bad_idx // DIM) % SEQ >= half, "perturbed: numpy's max |c - r| of %s lies in rank 1's half "
              "(flat index %d = token %d)" % (p0, bad_idx, (bad_idx // DIM) % SEQ))

    # -- a real partial-sum merge: --attn blockwise (ring attention's softmax merge) --
    blk = os.path.join(d, "blk.h5")
    r = parallel(blk, os.path.join(d, "blk"), extra_args=["--attn", "blockwise"])
    check(r.returncode == 0, "blockwise 2-rank run exits 0 (%s)" % r.stderr[-300:])
    bl = read_ranks("blk")
    blk_m = {}
    if bl and all(bl[0]["t"].get(p) is not None and bl[1]["t"].get(p) is not None for p in ref_paths):
        for p in ref_paths:
            a, b = bl[0]["t"][p], bl[1]["t"][p]
            blk_m[p] = metrics(ref_t[p], np.concatenate([a, b], axis=1) if sharded(p) else a)
            print("INFO numpy blockwise %-36s rel_l2 %.6g max_abs %.6g" % (p, blk_m[p]["rel_l2"], blk_m[p]["max_abs"]))
        worst = max(m["rel_l2"] for m in blk_m.values())
        check(0 < worst <= 1e-5, "blockwise: the merged softmax partial sums differ from the single softmax, "
              "within float32 rounding (worst rel_l2 %.3g)" % worst)

    # -- the compare side: probe-compare REF RANKSET --------------------------
    probe_try = subprocess.run([compare, ref, os.path.join(d, "on.rank0.h5"), os.path.join(d, "on.rank1.h5"),
                                "--json", os.path.join(d, "try.json")], capture_output=True, text=True)
    if probe_try.returncode == 2 and "expected 2 files" in probe_try.stderr:
        print("SKIP compare half: this probe-compare does not accept a rank set yet "
              "(REF CAND0 CAND1 ... / REF on.h5 with rank files; branch ranks): %s" % probe_try.stderr.strip()[:200])
        finish()

    def run_compare(cands, gate, extra=()):
        j = os.path.join(d, "cmp-%d.json" % run_compare.n)
        run_compare.n += 1
        r = subprocess.run([compare, ref] + cands + ["--gate", gate, "--json", j] + list(extra),
                           capture_output=True, text=True, timeout=300)
        print(r.stdout[-3000:], r.stderr[-1000:])
        try:
            with open(j) as f:
                return r.returncode, json.load(f)
        except (OSError, ValueError):
            return r.returncode, None
    run_compare.n = 0

    for form, cands in (("index", [on]), ("explicit", [os.path.join(d, "on.rank%d.h5" % k) for k in (0, 1)])):
        rc, js = run_compare(cands, "T1")
        if not check(js is not None, "%s form: probe-compare wrote its JSON (exit %d)" % (form, rc)):
            continue
        how = "T1"
        if js.get("feature_not_active"):
            check(ident, "%s form: T1 says \"feature not active\" only because the candidate is bit-identical" % form)
            rc, js2 = run_compare(cands, "T1", ["--expect-identical"])
            how = "T1 --expect-identical (the 2-rank run is bit-identical to the single process)"
            check(rc == 0 and js2 is not None and js2.get("verdict") == "pass",
                  "%s form: bit-identical rank set passes T1 --expect-identical (exit %d)" % (form, rc))
        elif rc != 0:
            rc, js2 = run_compare(cands, CAUSE)
            how = CAUSE
            check(rc == 0 and js2 is not None and js2.get("verdict") == "pass",
                  "%s form: fails T1 (%s) and passes %s (exit %d)" % (form, js.get("first_failure"), CAUSE, rc))
        else:
            check(js.get("verdict") == "pass", "%s form: passes T1" % form)
        print("INFO %s form verdict: %s" % (form, how))
        tens = {t["path"]: t for t in js.get("tensors", [])}
        check(sorted(tens) == ref_paths and js.get("missing_in_candidate") == [] and js.get("missing_in_reference") == [],
              "%s form: every reference tensor matched in the rank set (%d)" % (form, len(tens)))
        dit = [t for p, t in tens.items() if p.startswith("/dit.step/")]
        check(dit and all(t.get("ranks") == 2 and t.get("shard_axis") == (1 if sharded(t["path"]) else None) for t in dit),
              "%s form: every dit.step tensor reports ranks 2 and shard_axis 1 (null for the replicated timestep): %s"
              % (form, [(t["path"], t.get("ranks"), t.get("shard_axis")) for t in dit if
                        t.get("ranks") != 2 or t.get("shard_axis") != (1 if sharded(t["path"]) else None)]))
        off_m = [p for p, t in tens.items() if p in np_m and not (
            close(t.get("rel_l2"), np_m[p]["rel_l2"]) and close(t.get("max_abs"), np_m[p]["max_abs"]))]
        check(not off_m, "%s form: rel_l2 and max_abs equal numpy's on the reassembled tensors to 1e-12 (%s)" % (form, off_m[:3]))
        check(js.get("collectives_unmatched") == [],
              "%s form: collectives_unmatched is empty (gloo makes no NCCL calls): %s" % (form, js.get("collectives_unmatched")))

    rc, js = run_compare([blk], "T1")
    if check(js is not None, "blockwise: probe-compare wrote its JSON (exit %d)" % rc):
        tens = {x["path"]: x for x in js.get("tensors", [])}
        check(rc == 0 and js.get("verdict") == "pass" and js.get("feature_active") is True,
              "blockwise: the rank set differs from the single process (feature active) and passes T1 (exit %d)" % rc)
        off = [p for p in blk_m if not (p in tens and close(tens[p].get("rel_l2"), blk_m[p]["rel_l2"]) and
                                        close(tens[p].get("max_abs"), blk_m[p]["max_abs"]))]
        check(blk_m and not off, "blockwise: rel_l2 and max_abs of every tensor equal numpy's on the reassembled "
              "tensors to 1e-12 (%d tensors, %d non-zero; off: %s)"
              % (len(blk_m), sum(m["rel_l2"] > 0 for m in blk_m.values()), off[:3]))

    # rank set against rank set: the gather run as the reference of the blockwise run, rank by rank
    if files and bl:
        j = os.path.join(d, "sets.json")
        r = subprocess.run([compare, on, blk, "--gate", "T1", "--json", j], capture_output=True, text=True, timeout=300)
        print(r.stdout[-1500:], r.stderr[-500:])
        try:
            with open(j) as f:
                js = json.load(f)
        except (OSError, ValueError):
            js = {}
        ts = js.get("tensors", [])
        per = {(t.get("rank"), t["path"]): t for t in ts}
        want_keys = {(k, p) for k in (0, 1) for p in ref_paths}
        check(r.returncode == 0 and js.get("verdict") == "pass" and set(per) == want_keys,
              "rank set vs rank set (gather vs blockwise): rank r against rank r, %d tensors, passes T1 (exit %d)"
              % (len(ts), r.returncode))
        off = []
        for (k, p), t in per.items():
            if (k, p) in want_keys:
                mm = metrics(files[k]["t"][p], bl[k]["t"][p])
                if not (close(t.get("rel_l2"), mm["rel_l2"]) and close(t.get("max_abs"), mm["max_abs"])):
                    off.append((k, p))
        check(per and not off, "rank set vs rank set: per-rank rel_l2 and max_abs equal numpy's to 1e-12 (off: %s)" % off[:3])
        check(js.get("collective_divergence") == [] and js.get("collectives_unmatched") == [],
              "rank set vs rank set: no collective divergence, nothing unmatched (%s, %s)"
              % (js.get("collective_divergence"), js.get("collectives_unmatched")))

    # scripts/gpu/parallel.py (the GPU check's verifier) on NCCL captures made here: the
    # gloo rank files plus all_gather datasets and "nccl" counts as an NCCL run writes them
    # (docs/nccl.md), once consistent and once with one rank's all_gather output changed
    if files:
        import shutil
        checker = os.path.join(src, "scripts", "gpu", "parallel.py")
        rng = np.random.default_rng(5)
        n_el = SEQ // 2 * DIM
        ins = {(k, c, g): rng.standard_normal(n_el).astype(np.float32)
               for k in (0, 1) for c in range(STEPS) for g in (0, 1)}
        for case, broken in (("ok", None), ("diverged", (1, STEPS - 1, 1))):
            fd = os.path.join(d, "fake-" + case)
            os.mkdir(fd)
            for name in ("on.h5", "on.rank0.h5", "on.rank1.h5"):
                shutil.copy(os.path.join(d, name), fd)
            for k in (0, 1):
                with h5py.File(os.path.join(fd, "on.rank%d.h5" % k), "a") as f:
                    m = json.loads(f.attrs["probe.manifest"])
                    m["nccl"] = {"rank": k, "nranks": 2, "communicators": 1, "calls": {
                        "dit.step": {"all_gather": {"count": 2 * STEPS, "bytes": 2 * STEPS * n_el * 4}}}}
                    f.attrs["probe.manifest"] = json.dumps(m)
                    for c in range(STEPS):
                        for g in (0, 1):
                            base = "/dit.step/%04d/nccl.%04d.all_gather." % (c, g)
                            f[base + "in"] = ins[(k, c, g)]
                            out = np.concatenate([ins[(0, c, g)], ins[(1, c, g)]])
                            if broken == (k, c, g):
                                out[7] += 1.0
                            f[base + "out"] = out
            j = os.path.join(fd, "cmp.json")
            subprocess.run([compare, ref, os.path.join(fd, "on.h5"), "--expect-identical", "--json", j],
                           capture_output=True, text=True, timeout=300)
            r = subprocess.run([sys.executable, checker, "verify", ref, os.path.join(fd, "on.h5"), str(STEPS), j],
                               capture_output=True, text=True, timeout=300)
            fails = [l for l in r.stdout.splitlines() if l.startswith("FAIL")]
            if broken is None:
                check(r.returncode == 0 and not fails and "PASS %d all_gather outputs captured" % (2 * STEPS) in r.stdout,
                      "parallel.py verify passes consistent NCCL captures (%s)" % (fails or r.stderr[-300:]))
            else:
                path = "/dit.step/%04d/nccl.%04d.all_gather.out" % broken[1:]
                check(r.returncode == 1 and len(fails) == 2 and fails[0].startswith("FAIL " + path) and
                      "collective_divergence" in fails[1] and path in fails[1],
                      "parallel.py verify fails an all_gather output changed on rank 1, by its own "
                      "check and by probe-compare's collective_divergence (%s)" % fails)

    rc, js = run_compare([bad], CAUSE)
    if check(js is not None, "perturbed: probe-compare wrote its JSON (exit %d)" % rc):
        t = {x["path"]: x for x in js.get("tensors", [])}.get(p0, {})
        check(rc == 1 and js.get("verdict") == "fail" and t.get("verdict") == "fail",
              "perturbed: the rank set fails even %s (exit %d, first failure %s)" % (CAUSE, rc, js.get("first_failure")))
        tens = {x["path"]: x for x in js.get("tensors", [])}
        off = [p for p in pert_m if not (p in tens and close(tens[p].get("rel_l2"), pert_m[p]["rel_l2"]) and
                                         close(tens[p].get("max_abs"), pert_m[p]["max_abs"]))]
        check(pert_m and not off, "perturbed: rel_l2 and max_abs of every tensor equal numpy's on the reassembled "
              "tensors to 1e-12 (%d tensors, %d non-zero; off: %s)"
              % (len(pert_m), sum(m["rel_l2"] > 0 for m in pert_m.values()), off[:3]))
        idx = t.get("max_abs_index")  # the multi-index [b, token, channel] of the logical tensor
        if isinstance(idx, list) and len(idx) == 3:
            idx = int(np.ravel_multi_index(tuple(idx), (1, SEQ, DIM)))
        check(isinstance(idx, int) and idx == bad_idx and (idx // DIM) % SEQ >= SEQ // 2,
              "perturbed: %s max_abs_index %s lies in rank 1's half of the logical tensor (numpy: %s)" % (p0, idx, bad_idx))
    finish()


if __name__ == "__main__":
    main()
