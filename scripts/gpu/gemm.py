"""GEMM interposition on a real GPU (docs/gemm.md): run by the lead on the
H200 with torch 2.11+cu130 at `python3`:

    python3 scripts/gpu/gemm.py [--build-dir build] [--out DIR]

It runs itself (`work` mode) under `BUILD/bin/probe-run --capture '*gemm*'
--scope gblock=GemmCheckBlock.forward`, then checks the capture against the
results torch computed in that process, and prints PASS/FAIL lines (exit 0
when every check passed, 1 otherwise; 2 when the run itself failed).

The work: (1) a bf16 nn.Linear with bias inside GemmCheckBlock.forward
(called twice: scope calls 0 and 1; expected cublasLtMatmul, epilogue BIAS),
(2) a bf16 mm (cublasGemmEx), (3) a bf16 bmm (cublasGemmStridedBatchedEx),
(4) a fp32 mm with TF32 off (cublasSgemm_v2), (5) torch._scaled_mm with
float8_e4m3fn operands and per-tensor scales (cublasLtMatmul with A/B scale
pointers), when it runs on this GPU. Each result is saved (torch.save) with
its inputs.

Checked per op: one captured GEMM of the expected API (probe.op "api") has
an `out` bit-identical to torch's result; its `a` and `b` are torch's
operands (W / x for Linear; for `p @ q` cuBLAS gets A = q, B = p, so a == q,
b == p) bit for bit; Linear's `bias` equals the module's bias; the row-major
formula of docs/gemm.md in float64 over the captured operands reproduces
`out` within the output type's rounding; the manifest's "gemm" counts the
call and, for the scoped Linear, "weights" has component gblock with one
operand [48, 32] bfloat16 whose xxh64 equals the captured
/gblock/0000/gemm.0000.a's probe.hash.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
failures = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


def work(result_path):
    import torch
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    res = {}

    class GemmCheckBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 48, bias=True)

        def forward(self, x):
            return self.lin(x)

    blk = GemmCheckBlock().to(dev, torch.bfloat16)
    x0 = torch.randn(7, 32, device=dev, dtype=torch.bfloat16)
    x1 = torch.randn(7, 32, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        y0 = blk(x0)
        y1 = blk(x1)
    res["linear"] = dict(W=blk.lin.weight.detach(), bias=blk.lin.bias.detach(), x=x0, out=y0, x1=x1, out1=y1)
    p = torch.randn(16, 24, device=dev, dtype=torch.bfloat16)
    q = torch.randn(24, 40, device=dev, dtype=torch.bfloat16)
    res["mm"] = dict(p=p, q=q, out=p @ q)
    bp = torch.randn(3, 8, 16, device=dev, dtype=torch.bfloat16)
    bq = torch.randn(3, 16, 12, device=dev, dtype=torch.bfloat16)
    res["bmm"] = dict(p=bp, q=bq, out=torch.bmm(bp, bq))
    fp = torch.randn(9, 13, device=dev, dtype=torch.float32)
    fq = torch.randn(13, 11, device=dev, dtype=torch.float32)
    res["mm32"] = dict(p=fp, q=fq, out=fp @ fq)
    try:
        a8 = (torch.randn(16, 32, device=dev) * 0.5).to(torch.float8_e4m3fn)
        b8 = (torch.randn(16, 32, device=dev) * 0.5).to(torch.float8_e4m3fn).t()  # column-major [32, 16]
        sa = torch.tensor(0.5, device=dev)
        sb = torch.tensor(2.0, device=dev)
        o8 = torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        res["fp8"] = dict(p=a8, q=b8, sa=sa, sb=sb, out=o8)
    except Exception as e:  # not every GPU/torch build has it
        res["fp8_error"] = repr(e)
    torch.cuda.synchronize()
    cpu = {k: ({n: t.detach().cpu() for n, t in v.items()} if isinstance(v, dict) else v) for k, v in res.items()}
    torch.save(cpu, result_path)


def f64(t):
    import torch
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        t = t.float()
    return t.double().numpy()


def ds_f64(ds):
    import numpy as np
    dt = ds.attrs["probe.dtype"]
    dt = dt.decode() if isinstance(dt, bytes) else dt
    if dt == "float8_e4m3fn":
        import torch
        return torch.from_numpy(ds[()].astype(np.uint8)).view(torch.float8_e4m3fn).double().numpy()
    return ds[()].astype(np.float64)


def same_bits(ds, t):
    """Captured dataset == torch tensor, bit for bit (bf16/fp16 widened
    exactly to float32 as h5py reads probe's bfloat16; fp8 as raw bytes)."""
    import numpy as np
    import torch
    t = t.contiguous()
    if tuple(ds.shape) != tuple(t.shape):
        return False
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return ds[()].astype(np.uint8).tobytes() == t.view(torch.uint8).numpy().tobytes()
    if t.dtype in (torch.bfloat16, torch.float16):
        return np.array_equal(ds[()].astype(np.float32), t.float().numpy())
    return ds[()].tobytes() == t.numpy().tobytes()


def formula_ok(g, op):
    import numpy as np
    a, b, out = ds_f64(g["a"]), ds_f64(g["b"]), ds_f64(g["out"])
    if out.ndim == 2:
        a, b, out = a[None], b[None], out[None]
    opA = a if op["transa"] == "T" else np.swapaxes(a, 1, 2)
    opB = b if op["transb"] == "T" else np.swapaxes(b, 1, 2)
    scale = 1.0
    for s in ("scale_a", "scale_b"):
        if s in g:
            scale *= float(ds_f64(g[s]).ravel()[0])
    alpha = op["alpha"] if op["alpha"] is not None else 1.0
    ref = alpha * scale * np.swapaxes(opA @ opB, 1, 2)
    if "bias" in g:
        ref = ref + ds_f64(g["bias"])[None, None, :]
    err = float(np.max(np.abs(ref - out) / np.maximum(np.abs(ref), 1.0)))
    return err <= 2.0 ** -7, err


def verify(cap, results):
    import h5py
    import torch
    r = torch.load(results, weights_only=False)
    with h5py.File(cap, "r") as f:
        m = f.attrs["probe.manifest"]
        man = json.loads(m.decode() if isinstance(m, bytes) else m)
        gemms = []  # (group path, group)

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.endswith("out") and "probe.op" in obj.attrs:
                gemms.append(("/" + name, obj))
        f.visititems(visit)
        print("captured GEMM outputs: %d" % len(gemms))

        def group_of(path, ds):
            """operand datasets of the GEMM that produced ds: {operand: dataset}"""
            op = json.loads(ds.attrs["probe.op"])
            parent = f[os.path.dirname(path)]
            return op, {k: parent[v] for k, v in op["operands"].items() if v in parent}

        def find(api, out):
            for path, ds in gemms:
                op = json.loads(ds.attrs["probe.op"])
                if (api is None or op["api"] == api) and same_bits(ds, out):
                    return path, group_of(path, ds)
            return None, None

        cases = [("linear", "cublasLtMatmul"), ("mm", "cublasGemmEx"), ("bmm", "cublasGemmStridedBatchedEx"),
                 ("mm32", "cublasSgemm_v2"), ("fp8", "cublasLtMatmul")]
        if "fp8_error" in r:
            print("NOTE torch._scaled_mm did not run here: %s" % r["fp8_error"])
        for name, api in cases:
            if name not in r:
                continue
            t = r[name]
            path, og = find(api, t["out"])
            if path is None:  # captured through another API than docs/gemm.md says?
                path, og = find(None, t["out"])
                if path is not None:
                    check(False, "%s: expected %s, captured through %s" % (name, api, og[0]["api"]))
            if not check(path is not None, "%s: a captured GEMM whose out is bit-identical to torch's" % name):
                others = [(p, json.loads(d.attrs["probe.op"])["api"], tuple(d.shape)) for p, d in gemms]
                print("   captured: %s" % others[:20])
                continue
            op, g = og
            print("   %s -> %s %s" % (name, path, json.dumps({k: op[k] for k in ("transa", "transb", "m", "n", "k", "batch", "compute", "epilogue")})))
            if name == "linear":
                check(same_bits(g["a"], t["W"]), "linear: a == weight [48, 32]")
                check(same_bits(g["b"], t["x"]), "linear: b == x [7, 32]")
                check("bias" in g and same_bits(g["bias"], t["bias"]), "linear: bias == module bias")
                check(op["epilogue"] in ("BIAS", "GELU_BIAS", "RELU_BIAS") and op["transa"] == "T",
                      "linear: epilogue %s, transa %s" % (op["epilogue"], op["transa"]))
                check(path.startswith("/gblock/0000/gemm."), "linear: inside scope gblock call 0 (%s)" % path)
            elif name == "fp8":
                # torch swaps the operands for cuBLAS (C^T = B^T A^T): scale_a may be torch's scale_b
                sc = sorted(float(ds_f64(g[s]).ravel()[0]) for s in ("scale_a", "scale_b") if s in g)
                check(sc == [0.5, 2.0], "fp8: the scales 0.5 and 2.0 captured (%s)" % sc)
                ok_ab = (same_bits(g["a"], t["q"].t()) or same_bits(g["a"], t["q"])) and \
                        (same_bits(g["b"], t["p"]) or same_bits(g["b"], t["p"].t()))
                check(ok_ab, "fp8: a/b are torch's fp8 operands")
            else:
                check(same_bits(g["a"], t["q"]) or same_bits(g["a"], t["q"].transpose(-1, -2)),
                      "%s: a == q (cuBLAS A is the right operand)" % name)
                check(same_bits(g["b"], t["p"]) or same_bits(g["b"], t["p"].transpose(-1, -2)),
                      "%s: b == p" % name)
            ok, err = formula_ok(g, op)
            check(ok, "%s: row-major formula over the captured operands reproduces out (max rel err %.3g)" % (name, err))
        gm = man.get("gemm", {})
        check(gm.get("total", 0) >= 5, "manifest gemm.total %s >= 5" % gm.get("total"))
        print("   gemm signatures: %s" % json.dumps(gm.get("components", {}))[:2000])
        w = man.get("weights", {}).get("components", {}).get("gblock")
        if check(w is not None, "manifest weights has component gblock"):
            ops = w["operands"]
            check(len(ops) == 1 and ops[0]["shape"] == [48, 32] and ops[0]["dtype"] == "bfloat16",
                  "weights gblock: one operand [48, 32] bfloat16 (%s)" % ops)
            a = f.get("/gblock/0000/gemm.0000.a")
            if a is not None:
                h = a.attrs["probe.hash"]
                h = h.decode() if isinstance(h, bytes) else h
                check(ops[0]["xxh64"] == h, "weights gblock k 0: xxh64 == probe.hash of the captured weight")
        sk = f.attrs.get("probe.skips", "[]")
        sk = json.loads(sk.decode() if isinstance(sk, bytes) else sk)
        check(not sk, "no skipped captures (%s)" % sk[:3])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "work":
        work(sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="/tmp/probe-gemm-check")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cap = os.path.join(a.out, "gemm.h5")
    res = os.path.join(a.out, "results.pt")
    run = os.path.join(a.build_dir, "bin", "probe-run")
    cmd = [run, "--out", cap, "--label", "gemm-check", "--capture", "*gemm*",
           "--scope", "gblock=GemmCheckBlock.forward", "--", sys.executable, os.path.abspath(__file__), "work", res]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(p.stdout[-3000:], p.stderr[-3000:])
    probe_lines = [l for l in p.stderr.splitlines() if l.startswith("probe:")]
    check(p.returncode == 0, "work run under probe-run: exit %d" % p.returncode)
    check(not probe_lines, "no probe: warnings (%s)" % probe_lines[:3])
    if p.returncode != 0 or not os.path.exists(cap):
        sys.exit(2)
    verify(cap, res)
    print("%d check(s) failed" % len(failures) if failures else "ALL PASS")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
