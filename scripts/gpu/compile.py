"""CUDA-graph checks of probe's capture (docs/observer.md), used by
scripts/gpu/compile.sh:

  compile.py verify-compile CAPTURE.h5 CLONES.pt [PLAIN.json PROBE.json]
      The Wan transformer ran under torch.compile(mode="reduce-overhead")
      (CUDA graphs) under probe-run, with a forward hook that cloned its
      output right after each call (wan_run.py --clone-dit). Every
      /dit.step/NNNN/out.0 of the capture must be bit-identical to clone NNNN,
      or be listed in probe.skips with a reason; a clone without either is
      a failure. With the two wan_run.py --json files (the same run without
      probe, and with it) the decoded videos' SHA-256 must agree.
  compile.py graph --out RESULT.pt [--replays N]
      A small module whose class matches the component table's *DiT*.forward
      (so the adapter taps it as dit.step): 3 eager warm-up calls on a side
      stream, one call captured into a torch.cuda.graph, N replays with new
      inputs copied into the static input; each replay's output is cloned.
      Saves the inputs, the clones, the warm-up output and any error.
  compile.py verify-graph CAPTURE.h5 RESULT.pt [PLAIN_RESULT.pt]
      Reports what the capture holds for that run: each dit.step dataset
      and which eager call or replay it equals, the skips and their reasons,
      the replays without a dataset. With the result of the same run without
      probe: whether the replays' outputs are bit-identical (observer effect).
      Exit 0 unless the run failed or the outputs differ from the run without
      probe: missing replays are reported for the lead to interpret (graph
      replay support is being added to the shim).
"""

import json
import sys


def _h5_tensors(path):
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out["/" + name] = obj[()]
        f.visititems(visit)
        skips = f.attrs.get("probe.skips", "[]")
    if isinstance(skips, bytes):
        skips = skips.decode()
    return out, json.loads(skips)


def _bits(t):
    """Host float32 bytes of a tensor (bfloat16 widened exactly: how h5py
    reads probe's bfloat16)."""
    import torch
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return tuple(t.shape), t.numpy().tobytes()


def _arr_bits(a):
    import numpy as np
    a = np.array(a, order="C", copy=True)
    if a.dtype == np.float16:
        a = a.astype(np.float32)
    return tuple(a.shape), a.tobytes()


def verify_compile(h5, clones_pt, plain_json=None, probe_json=None):
    import torch
    tensors, skips = _h5_tensors(h5)
    clones = torch.load(clones_pt)
    skipped = {s.get("path"): s.get("reason") for s in skips}
    ok = bad = sk = 0
    lines = []
    for i, c in enumerate(clones):
        path = "/dit.step/%04d/out.0" % i
        if path in tensors:
            if _arr_bits(tensors[path]) == _bits(c):
                ok += 1
            else:
                bad += 1
                lines.append("  %s: DIFFERS from the clone taken right after the call" % path)
        elif path in skipped:
            sk += 1
            lines.append("  %s: skipped: %s" % (path, skipped[path]))
        else:
            bad += 1
            lines.append("  %s: MISSING, and not in probe.skips" % path)
    extra = sorted(p for p in tensors if p.startswith("/dit.step/") and p.endswith("/out.0")
                   and int(p.split("/")[2]) >= len(clones))
    if extra:
        bad += len(extra)
        lines.append("  datasets beyond the %d calls: %s" % (len(clones), extra))
    print("compile (reduce-overhead): %d transformer calls; %d captured bit-identical to the clone, "
          "%d skipped with a reason, %d wrong or missing; %d skips in the file"
          % (len(clones), ok, sk, bad, len(skips)))
    for ln in lines[:40]:
        print(ln)
    if skips:
        reasons = {}
        for s in skips:
            reasons[s.get("reason")] = reasons.get(s.get("reason"), 0) + 1
        print("  skip reasons: %s" % json.dumps(reasons))
    same_video = None
    if plain_json and probe_json:
        a, b = (json.load(open(p)) for p in (plain_json, probe_json))
        same_video = a.get("video_sha256") == b.get("video_sha256") and a.get("video_sha256")
        print("compile: decoded video without probe %s, with probe %s: %s"
              % (a.get("video_sha256", "?")[:16], b.get("video_sha256", "?")[:16],
                 "IDENTICAL" if same_video else "DIFFERENT"))
    return 0 if bad == 0 and len(clones) > 0 and same_video is not False else 1


def graph(out, replays):
    import torch

    class GraphDiT(torch.nn.Module):
        """Matches the component table's *DiT*.forward: tapped as dit.step."""

        def __init__(self):
            super().__init__()
            self.lin1 = torch.nn.Linear(64, 256)
            self.lin2 = torch.nn.Linear(256, 64)

        def forward(self, hidden_states):
            return self.lin2(torch.nn.functional.gelu(self.lin1(hidden_states)))

    res = {"replays": replays, "warmup": 3, "error": None, "clones": [], "inputs": []}
    try:
        torch.manual_seed(0)
        dev = torch.device("cuda")
        m = GraphDiT().to(dev).eval()
        g0 = torch.Generator().manual_seed(1)
        inputs = [torch.randn(8, 64, generator=g0).to(dev) for _ in range(replays)]
        res["inputs"] = [x.cpu() for x in inputs]
        static_in = inputs[0].clone()
        with torch.no_grad():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(res["warmup"]):
                    warm = m(static_in)
            torch.cuda.current_stream().wait_stream(s)
            res["warm_out"] = warm.detach().cpu()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = m(static_in)
            for i in range(replays):
                static_in.copy_(inputs[i])
                g.replay()
                res["clones"].append(static_out.clone())
            torch.cuda.synchronize()
            # The eager values, without calling forward (not tapped).
            res["eager"] = [m.lin2(torch.nn.functional.gelu(m.lin1(x))).cpu() for x in inputs]
        res["clones"] = [c.cpu() for c in res["clones"]]
    except Exception as e:  # reported, not raised: the file may still tell something
        res["error"] = "%s: %s" % (type(e).__name__, e)
        res["clones"] = [c.cpu() for c in res["clones"]]
    torch.save(res, out)
    print("graph: %d replays, error: %s" % (len(res["clones"]), res["error"]))
    return 0 if res["error"] is None else 1


def verify_graph(h5, result_pt, plain_pt=None):
    import torch
    tensors, skips = _h5_tensors(h5)
    res = torch.load(result_pt)
    rc = 0
    if res.get("error"):
        print("graph: the run under probe FAILED: %s" % res["error"])
        rc = 1
    clones = {_bits(c): i for i, c in enumerate(res["clones"])}
    ins = {_bits(x): i for i, x in enumerate(res["inputs"])}
    warm = _bits(res["warm_out"]) if "warm_out" in res else None
    eager_ok = all(_bits(a) == _bits(b) for a, b in zip(res.get("eager", []), res["clones"]))
    print("graph: %d warm-up calls, 1 captured call, %d replays; replay outputs %s the eager values"
          % (res["warmup"], len(res["clones"]), "equal" if eager_ok else "DIFFER FROM"))
    seen_replays = set()
    for path in sorted(p for p in tensors if p.startswith("/dit.step/")):
        b = _arr_bits(tensors[path])
        what = []
        if path.endswith("/out") or "/out." in path:
            if b in clones:
                what.append("output of replay %d" % clones[b])
                seen_replays.add(clones[b])
            if b == warm:
                what.append("the warm-up output")
        elif b in ins:
            what.append("input of replay %d" % ins[b])
        print("  %-32s %-16s %s" % (path, str(tensors[path].shape), ", ".join(what) or "(no match)"))
    for s in skips:
        print("  skip: %s: %s" % (s.get("path"), s.get("reason")))
    missing = [i for i in range(len(res["clones"])) if i not in seen_replays]
    print("graph: replays with a captured output: %d of %d; without: %s; skips: %d"
          % (len(seen_replays), len(res["clones"]), missing or "none", len(skips)))
    if plain_pt:
        plain = torch.load(plain_pt)
        same = (len(plain["clones"]) == len(res["clones"]) and
                all(_bits(a) == _bits(b) for a, b in zip(plain["clones"], res["clones"])))
        print("graph: replay outputs with probe vs without: %s" % ("IDENTICAL" if same else "DIFFERENT"))
        if not same:
            rc = 1
    return rc


def main(argv):
    if len(argv) >= 3 and argv[0] == "verify-compile":
        return verify_compile(*argv[1:5])
    if len(argv) >= 3 and argv[0] == "graph" and argv[1] == "--out":
        n = int(argv[4]) if len(argv) >= 5 and argv[3] == "--replays" else 8
        return graph(argv[2], n)
    if len(argv) >= 3 and argv[0] == "verify-graph":
        return verify_graph(*argv[1:4])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
