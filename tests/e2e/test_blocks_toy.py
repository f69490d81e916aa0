#!/usr/bin/env python3
"""End-to-end: DiT blocks as nested components (probe-run --blocks, --tap
dit.block=..., @block=) on the toy pipeline (scripts/example/).

The toy denoiser runs 2 ToyDiTBlock modules per call. Its own bookkeeping is
`toy_pipeline.py --save DIR --save-blocks`: forward hooks on the blocks save
every block call's inputs and output as dit.block would capture them, with
the step, CFG branch, parent (the denoiser call) and block index the
pipeline's loop knows (index.json), independently of probe.

Runs and what they must show:
  a  plain, with --save --save-blocks: the reference values and bookkeeping;
  b  probe-run --blocks, no --save: the video is byte-identical to a's, the
     stdout too (but for the timing); the capture holds exactly the paths a
     saved (every component, and dit.block 4 calls per step x 2 blocks);
     every dataset is bit-identical to a's copy; each dit.block call's
     probe.step, probe.cfg_branch, probe.parent, probe.block equal a's
     bookkeeping and probe.class is toy_modules.ToyDiTBlock; dit.step has
     its class and no parent; the text encoder, called inside encode_prompt,
     is nested in /prompt_embeds/<call> as block 0; the manifest's scopes
     count the block calls;
  c  probe-run --tap dit.block=ToyDiTBlock.forward with --save --save-blocks
     (no --blocks): the same dit.block datasets and attributes, values
     bit-identical to the forward hooks of the same run;
  d  --capture '*@block=1' and (stats-only) 'dit.block/*/out@block=0+5-'
     with @step=: exactly the selected paths (a tap that is not nested never
     matches @block=); an item '@block=7' that matches nothing is named at
     exit in one probe: line with the block indices seen;
  g  --blocks --stats-only-for 'dit.block/*@block=1': exactly block 1's
     tensors are stats-only records whose hash and summary are b's bytes',
     the rest bit-identical to b; probe-compare b g --expect-identical exits
     0; a bad spec exits 2 with one line;
  e  --blocks on a program without any block class: one probe: line at
     exit naming dit.block, the program's stdout unchanged;
  p  --blocks --pack-small 1048576: stdout unchanged; h5py sees only the
     pack chunks; probe-compare b p --expect-identical exits 0; the chunked
     attention run compared in both layouts gives the same verdict, summary
     and per-tensor JSON;
  f  bad input (--tap 'a/b=X.forward', --tap '=X.f', --capture
     'dit.block/*@block=x', --pack-small 0 / 2k): exit 2, one `probe-run:` line naming the
     problem, the command not run and nothing written.

Environment: PROBE_BUILD_DIR (required), PROBE_SOURCE_DIR, PROBE_PYTHON.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR")
SRC = os.environ.get("PROBE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PY = os.environ.get("PROBE_PYTHON") or sys.executable
STEPS, BLOCKS = 2, 2
TOY = os.path.join(SRC, "scripts", "example", "toy_pipeline.py")
ARGS = ["--steps", str(STEPS), "--frames", "2", "--height", "64", "--width", "64"]
FAILURES = []


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.stderr.strip():
        print("  stderr: " + p.stderr.strip().replace("\n", "\n  stderr: ")[:3000])
    return p


def probe_run(out, opts, cmd):
    return run([os.path.join(BUILD, "bin", "probe-run"), "--out", out, *opts, "--", *cmd])


def toy(*extra):
    return [PY, TOY, *ARGS, *extra]


def untimed(stdout):
    return re.sub(r"\(\d+\.\d+ s\)", "(T s)", stdout)


def a_str(v):
    return v.decode() if isinstance(v, bytes) else v


def read_capture(path):
    """{path: (array, attrs)} of every dataset."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out["/" + name] = (obj[()], {k: obj.attrs[k] for k in obj.attrs})
        f.visititems(visit)
    return out


def read_saved(root):
    """{path: (array, index entry)} of what toy_pipeline --save wrote."""
    with open(os.path.join(root, "index.json")) as fh:
        index = json.load(fh)["tensors"]
    return {e["path"]: (np.load(os.path.join(root, e["file"])), e) for e in index}


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def block_attrs(attrs):
    return (int(attrs.get("probe.step", -1)), int(attrs.get("probe.cfg_branch", -1)),
            a_str(attrs.get("probe.parent")), int(attrs.get("probe.block", -1)),
            a_str(attrs.get("probe.class")))


def manifest(path):
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["probe.manifest"])


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR not set")
        return 2
    tmp = tempfile.mkdtemp(prefix="probe-blocks-toy-")
    save_a = os.path.join(tmp, "save-a")
    pa = run(toy("--save", save_a, "--save-blocks", "--out", os.path.join(tmp, "a.npy")))
    if not check(pa.returncode == 0, "(a) the toy pipeline runs with --save --save-blocks"):
        return 1
    saved = read_saved(save_a)
    blocks = {p: e for p, (_, e) in saved.items() if p.startswith("/dit.block/")}
    ncalls = 2 * STEPS * BLOCKS
    want_blocks = {"/dit.block/%04d/%s" % (k, s) for k in range(ncalls)
                   for s in ("in.x", "in.temb", "in.context", "out")}
    check(set(blocks) == want_blocks,
          "(a) the pipeline's hooks saw %d block calls of 4 tensors each (%d paths)"
          % (ncalls, len(blocks)))
    # the pipeline's bookkeeping, per call: (step, branch, parent, block)
    book = {}
    for p, e in blocks.items():
        book.setdefault(p.rsplit("/", 1)[0], (e["step"], e["cfg_branch"], e["parent"], e["block"]))
    want_book = {"/dit.block/%04d" % (BLOCKS * d + j): (d // 2, d % 2, "/dit.step/%04d" % d, j)
                 for d in range(2 * STEPS) for j in range(BLOCKS)}
    check(book == want_book, "(a) the pipeline's bookkeeping: block call 2d+j is block j of "
          "dit.step call d, step d // 2, branch d %% 2 (%r)" % sorted(book.items())[:3])

    # (b) --blocks: the video and stdout unchanged, the capture = a's tensors
    b_h5 = os.path.join(tmp, "b.h5")
    pb = probe_run(b_h5, ["--blocks"], toy("--out", os.path.join(tmp, "b.npy")))
    check(pb.returncode == 0, "(b) probe-run --blocks exits 0")
    check(open(os.path.join(tmp, "a.npy"), "rb").read() == open(os.path.join(tmp, "b.npy"), "rb").read(),
          "(b) the video is byte-identical to the run without probe")
    check(untimed(pb.stdout) == untimed(pa.stdout), "(b) stdout identical (but for the timing)")
    check(not [ln for ln in pb.stderr.splitlines() if ln.startswith("probe")],
          "(b) nothing on stderr from probe (%r)" % pb.stderr[-300:])
    cap = read_capture(b_h5)
    check(set(cap) == set(saved), "(b) the capture holds exactly the %d paths the pipeline saved "
          "(missing %s, extra %s)" % (len(saved), sorted(set(saved) - set(cap))[:4],
                                      sorted(set(cap) - set(saved))[:4]))
    diff = [p for p in set(cap) & set(saved) if not same_bits(cap[p][0], saved[p][0])]
    check(not diff, "(b) every dataset bit-identical to the pipeline's copy (differ: %s)" % diff[:4])
    bad = []
    for p in want_blocks & set(cap):
        call = p.rsplit("/", 1)[0]
        want = book[call] + ("toy_modules.ToyDiTBlock",)
        if block_attrs(cap[p][1]) != want or a_str(cap[p][1].get("probe.component")) != "dit.block":
            bad.append((p, block_attrs(cap[p][1]), want))
    check(not bad, "(b) every dit.block tensor: probe.step, probe.cfg_branch, probe.parent, "
          "probe.block as the pipeline's bookkeeping, probe.class toy_modules.ToyDiTBlock (%s)"
          % bad[:3])
    dit = [cap[p][1] for p in cap if p.startswith("/dit.step/")]
    check(dit and all(a_str(at.get("probe.class")) == "toy_modules.ToyDiTDenoiser"
                      and "probe.parent" not in at and "probe.block" not in at for at in dit),
          "(b) dit.step tensors: class toy_modules.ToyDiTDenoiser, not nested")
    te = {p: block_attrs(cap[p][1]) for p in cap if p.startswith("/text_encoder/")}
    check(te and all(v == (-1, -1, "/prompt_embeds/%s" % p.split("/")[2], 0,
                           "toy_modules.ToyTextEncoder") for p, v in te.items()),
          "(b) the text encoder inside encode_prompt: parent /prompt_embeds/<same call>, block 0, "
          "no step (%r)" % sorted(te.items())[:2])
    sched = [cap[p][1] for p in cap if p.startswith("/scheduler.step/")]
    check(sched and all("probe.parent" not in at and a_str(at.get("probe.class"))
                        == "toy_modules.ToyFlowMatchScheduler" for at in sched),
          "(b) scheduler.step: not nested, its class")
    sc = manifest(b_h5).get("scopes", {})
    check(sc.get("dit.block") == ncalls and sc.get("dit.step") == 2 * STEPS,
          "(b) manifest scopes: dit.block %d, dit.step %d (%r)" % (ncalls, 2 * STEPS, sc))

    # (c) --tap dit.block=ToyDiTBlock.forward (no --blocks), hooks in the same run
    c_h5, save_c = os.path.join(tmp, "c.h5"), os.path.join(tmp, "save-c")
    pc = probe_run(c_h5, ["--tap", "dit.block=ToyDiTBlock.forward"],
                   toy("--save", save_c, "--save-blocks", "--out", os.path.join(tmp, "c.npy")))
    check(pc.returncode == 0 and untimed(pc.stdout) == untimed(pa.stdout),
          "(c) --tap dit.block=ToyDiTBlock.forward: exit 0, stdout unchanged")
    capc, savedc = read_capture(c_h5), read_saved(save_c)
    cb = {p for p in capc if p.startswith("/dit.block/")}
    check(cb == want_blocks, "(c) the same %d dit.block paths (%d)" % (len(want_blocks), len(cb)))
    diff = [p for p in cb if p not in savedc or not same_bits(capc[p][0], savedc[p][0])]
    check(not diff, "(c) every dit.block tensor bit-identical to the forward hooks of the same "
          "run (differ: %s)" % diff[:4])
    check(all(block_attrs(capc[p][1]) == block_attrs(cap[p][1]) for p in cb & set(cap)),
          "(c) the same step/cfg_branch/parent/block/class as with --blocks")

    # (d) selection by block index
    d_h5 = os.path.join(tmp, "d.h5")
    pd = probe_run(d_h5, ["--blocks", "--capture", "*@block=1"], toy())
    got = set(read_capture(d_h5)) if pd.returncode == 0 else set()
    want = {p for p in want_blocks if book[p.rsplit("/", 1)[0]][3] == 1}
    check(pd.returncode == 0 and got == want,
          "(d) --capture '*@block=1': exactly block 1 of every dit.step call, nothing that is not "
          "nested (missing %s, extra %s)" % (sorted(want - got)[:3], sorted(got - want)[:3]))
    s_h5 = os.path.join(tmp, "s.h5")
    ps = probe_run(s_h5, ["--blocks", "--stats-only", "--capture", "dit.block/*/out@block=0+5-@step=1",
                          "--capture", "dit.block/*@block=7"], toy())
    want = {p for p in want_blocks if p.endswith("/out") and book[p.rsplit("/", 1)[0]][3] == 0
            and book[p.rsplit("/", 1)[0]][0] == 1}
    with h5py.File(s_h5, "r") as f:
        got = set()
        f.visititems(lambda n, o: got.add("/" + n) if isinstance(o, h5py.Dataset) else None)
        stats = all(int(f[p].attrs.get("probe.stats_only", 0)) == 1
                    and int(f[p].attrs["probe.block"]) == 0 for p in got)
    check(ps.returncode == 0 and got == want and stats,
          "(d) --stats-only --capture 'dit.block/*/out@block=0+5-@step=1': exactly %d stats-only "
          "records of block 0 in step 1 (%s)" % (len(want), sorted(got)))
    warn = [ln for ln in ps.stderr.splitlines() if ln.startswith("probe: ")]
    check(len(warn) == 1 and "'dit.block/*@block=7' matched no tensor" in warn[0]
          and "block indices 0-1" in warn[0],
          "(d) the @block=7 item that matched nothing is named at exit, with the block indices "
          "seen (%r)" % warn)
    ci = manifest(s_h5).get("capture_items")
    check(ci == [{"item": "dit.block/*/out@block=0+5-@step=1", "matched": len(want)},
                 {"item": "dit.block/*@block=7", "matched": 0}],
          "(d) manifest capture_items (%r)" % ci)

    # (g) --stats-only-for: block 1's tensors as stats-only records, everything else in full;
    # each record's hash and summary are those of the full capture's bytes (b)
    g_h5 = os.path.join(tmp, "g.h5")
    pg = probe_run(g_h5, ["--blocks", "--stats-only-for", "dit.block/*@block=1"],
                   toy("--out", os.path.join(tmp, "g.npy")))
    check(pg.returncode == 0 and not [ln for ln in pg.stderr.splitlines() if ln.startswith("probe")],
          "(g) --stats-only-for exits 0, nothing on stderr")
    capg = read_capture(g_h5)
    stat = {p for p, (_, at) in capg.items() if int(at.get("probe.stats_only", 0)) == 1}
    want = {p for p, (_, at) in cap.items() if p.startswith("/dit.block/") and int(at.get("probe.block", -1)) == 1}
    check(set(capg) == set(cap) and stat == want and len(want) == 4 * 2 * STEPS,
          "(g) exactly block 1's %d tensors are stats-only records, the other %d full"
          % (len(want), len(cap) - len(want)))
    ok = True
    for p in sorted(set(capg) & set(cap)):
        (ga, gat), (ba, bat) = capg[p], cap[p]
        if p in stat:
            x = np.asarray(ba, dtype=np.float64).ravel()
            rec = ga
            ok &= (a_str(gat["probe.hash"]) == a_str(bat["probe.hash"]) and int(rec["n"]) == x.size
                   and np.isclose(float(rec["sum"]), x.sum(), rtol=1e-12, atol=1e-12)
                   and float(rec["abs_max"]) == float(np.abs(x).max()))
        else:
            ok &= same_bits(ga, ba)
    check(ok, "(g) each record's hash, n, sum and abs_max are the full capture's; the rest bit-identical")
    check(manifest(g_h5).get("stats_only_for") == "dit.block/*@block=1" and "stats_only" not in manifest(g_h5),
          "(g) the manifest records stats_only_for")
    pc = run([os.path.join(BUILD, "bin", "probe-compare"), b_h5, g_h5, "--expect-identical", "--quiet"])
    check(pc.returncode == 0, "(g) probe-compare full vs --stats-only-for --expect-identical exits 0 "
          "(identical by hash) (%d)" % pc.returncode)
    # a transparent change (chunked attention) with every block stats-only: the full tensors
    # pass, the differing block records fail as not provable, and no block is blamed
    h_h5 = os.path.join(tmp, "h.h5")
    ph = probe_run(h_h5, ["--blocks", "--stats-only-for", "dit.block/*"],
                   toy("--attention", "chunked", "--out", os.path.join(tmp, "h.npy")))
    js = os.path.join(tmp, "gh.json")
    pc = run([os.path.join(BUILD, "bin", "probe-compare"), b_h5, h_h5, "--json", js, "--quiet"])
    doc = json.load(open(js)) if os.path.exists(js) else {}
    tens = doc.get("tensors", [])
    full = [t for t in tens if not t.get("stats_only")]
    diff = [t for t in tens if t.get("stats_only") and t.get("verdict") == "fail"]
    check(ph.returncode == 0 and pc.returncode == 1 and full and all(t["verdict"] == "pass" for t in full)
          and diff and doc.get("introduced") is None
          and not any(c.get("status") == "introduced" for c in doc.get("calls", [])),
          "(g) chunked attention, blocks stats-only: every full tensor passes, %d differing block "
          "records fail, no call is named as introducing it (introduced %r)"
          % (len(diff), doc.get("introduced")))
    pbad = probe_run(os.path.join(tmp, "gbad.h5"), ["--stats-only-for", "dit.block/*@blk=1"], [PY, "-c", "pass"])
    lines = [ln for ln in pbad.stderr.splitlines() if ln.strip()]
    check(pbad.returncode == 2 and len(lines) == 1 and "--stats-only-for 'dit.block/*@blk=1'" in lines[0],
          "(g) a bad --stats-only-for spec: exit 2, one line (%r)" % lines)

    # (e) --blocks where no class matches dit.block's patterns
    prog = os.path.join(tmp, "noblocks.py")
    with open(prog, "w") as fh:
        fh.write("import torch\n\nclass PlainDenoiser(torch.nn.Module):\n"
                 "    def forward(self, x):\n        return x * 2\n\n"
                 "print(PlainDenoiser()(torch.ones(2)).tolist())\n")
    plain = run([PY, prog])
    pe = probe_run(os.path.join(tmp, "e.h5"), ["--blocks"], [PY, prog])
    warn = [ln for ln in pe.stderr.splitlines() if ln.startswith("probe: ")]
    check(pe.returncode == 0 and pe.stdout == plain.stdout and len(warn) == 1
          and "opt-in component dit.block (probe-run --blocks) matched no method" in warn[0]
          and "*DiTBlock.forward" in warn[0],
          "(e) --blocks without a block class: the run unchanged, one probe: line naming "
          "dit.block and its patterns (%r)" % warn)

    # (p) --pack-small: the same capture in the packed layout (every tensor of the toy fits)
    p_h5, q_h5, r_h5 = (os.path.join(tmp, n) for n in ("p.h5", "q.h5", "r.h5"))
    pp = probe_run(p_h5, ["--blocks", "--pack-small", "1048576"], toy("--out", os.path.join(tmp, "p.npy")))
    check(pp.returncode == 0 and untimed(pp.stdout) == untimed(pa.stdout)
          and not [ln for ln in pp.stderr.splitlines() if ln.startswith("probe")],
          "(p) probe-run --blocks --pack-small: exit 0, stdout unchanged, nothing from probe (%r)"
          % pp.stderr[-300:])
    packed = read_capture(p_h5)
    check(packed and all(k.startswith("/probe.pack/") for k in packed),
          "(p) h5py sees only the pack chunks' datasets (%r)" % sorted(packed)[:3])
    pc = run([os.path.join(BUILD, "bin", "probe-compare"), b_h5, p_h5, "--expect-identical", "--quiet"])
    check(pc.returncode == 0, "(p) probe-compare default-layout vs packed capture of the same run "
          "--expect-identical exits 0 (%d: %s)" % (pc.returncode, pc.stderr[-300:]))
    # the chunked-attention change, compared in both layouts: the same verdicts and metrics
    pq = probe_run(q_h5, ["--blocks", "--pack-small", "1048576"],
                   toy("--attention", "chunked", "--out", os.path.join(tmp, "q.npy")))
    pr = probe_run(r_h5, ["--blocks"], toy("--attention", "chunked", "--out", os.path.join(tmp, "r.npy")))
    js_br, js_pq = os.path.join(tmp, "br.json"), os.path.join(tmp, "pq.json")
    c1 = run([os.path.join(BUILD, "bin", "probe-compare"), b_h5, r_h5, "--json", js_br, "--quiet"])
    c2 = run([os.path.join(BUILD, "bin", "probe-compare"), p_h5, q_h5, "--json", js_pq, "--quiet"])

    def verdicts(path):
        doc = json.load(open(path)) if os.path.exists(path) else {}
        return (doc.get("verdict"), doc.get("summary"), doc.get("tensors"))
    vb, vp = verdicts(js_br), verdicts(js_pq)
    check(pq.returncode == 0 and pr.returncode == 0 and c1.returncode == c2.returncode and vb[2]
          and vb == vp, "(p) chunked attention: the packed pair's verdict, summary and tensors (every "
          "key) equal the default-layout pair's (exit %d vs %d; %r vs %r)" % (c1.returncode, c2.returncode,
                                                                  vb[:2], vp[:2]))

    # (f) bad input: refused before the command runs, nothing written
    marker = os.path.join(tmp, "ran")
    for opts, why in ((["--tap", "a/b=X.forward"], "component name 'a/b' contains '/'"),
                      (["--tap", "=X.f"], "component name '' is empty"),
                      (["--capture", "dit.block/*@block=x"], "block='x' is not RANGES"),
                      (["--pack-small", "0"], "--pack-small 0: outside 1..1048576 bytes"),
                      (["--pack-small", "2k"], "--pack-small '2k': not a byte count")):
        out = os.path.join(tmp, "bad.h5")
        p = probe_run(out, opts, [PY, "-c", "open(%r, 'w').write('ran')" % marker])
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        check(p.returncode == 2 and len(lines) == 1 and lines[0].startswith("probe-run: ")
              and why in lines[0] and not os.path.exists(marker) and not os.path.exists(out),
              "(f) %s: exit 2 (%d), one probe-run: line naming the problem (%r), the command not "
              "run, nothing written" % (" ".join(opts), p.returncode, lines))

    if FAILURES:
        print("%d failure(s); files kept in %s" % (len(FAILURES), tmp))
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
