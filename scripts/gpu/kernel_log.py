#!/usr/bin/env python3
"""Kernel-path evidence on a GPU (docs/kernels.md), for the H200 with
torch 2.11 + CUDA 13 at `python3`:

    python3 scripts/gpu/kernel_log.py [--build build] [--out DIR]

Runs a small attention module twice under probe-run, tapped as dit.step
(`--tap 'dit.step=__main__:Attn.forward'`): once under
sdpa_kernel(MATH), once under sdpa_kernel(FLASH_ATTENTION). Attn.forward is
F.scaled_dot_product_attention (bf16), an nn.Linear with bias (cuBLASLt,
whose kernels are launched through the driver API from its own statically
linked runtime) and a torch.compile'd elementwise function (a Triton kernel,
launched by Triton's launcher through cuLaunchKernelEx). Prints each run's
kernel set in dit.step, probe-compare's per-component difference, and
PASS/FAIL lines:
  - both runs logged kernels inside dit.step, and the children exited 0;
  - a flash-attention kernel (name matching *flash*) only in the flash run;
  - a cuBLAS/cuBLASLt GEMM kernel (gemm|xmma|cutlass|cublas|sm90 in the name)
    in both runs (only the driver-API route sees these);
  - a Triton kernel (triton_*) in both runs;
  - probe-compare MATH FLASH --expect-kernel 'dit.step:*flash*' matches (its
    expect_kernel says so), and FLASH MATH with the same option reports the
    feature not active with exit 1.
Exit 0 when every check passed. Output files stay in DIR (default
/tmp/probe-kernels-check).
"""
import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys


def child(mode):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    post = torch.compile(lambda x: F.gelu(x) * 2.0 + 1.0)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 64, bias=True)

        def forward(self, q, k, v):
            o = F.scaled_dot_product_attention(q, k, v)
            return post(self.proj(o))

    torch.manual_seed(0)
    m = Attn().to("cuda", torch.bfloat16)
    q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    backend = SDPBackend.MATH if mode == "math" else SDPBackend.FLASH_ATTENTION
    with torch.no_grad(), sdpa_kernel(backend):
        for _ in range(2):
            out = m(q, k, v)
    torch.cuda.synchronize()
    print("child %s: out %s %.6f" % (mode, tuple(out.shape), out.float().abs().mean().item()))


failures = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


def names_in(kernels, comp, pattern):
    by = (kernels or {}).get(comp, {}).get("by_name", {})
    return sorted(n for n in by if re.search(pattern, n, re.I))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", choices=["math", "flash"])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="/tmp/probe-kernels-check")
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return
    bindir = os.path.join(os.path.abspath(a.build), "bin")
    probe_run, compare = os.path.join(bindir, "probe-run"), os.path.join(bindir, "probe-compare")
    if not os.access(probe_run, os.X_OK):
        print("FAIL no %s: build probe first (cmake -S . -B build -G Ninja && cmake --build build)" % probe_run)
        sys.exit(1)
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    here = os.path.abspath(__file__)
    files = {}
    for mode in ("math", "flash"):
        out = os.path.join(a.out, mode + ".h5")
        cmd = [probe_run, "--out", out, "--label", mode, "--tap", "dit.step=__main__:Attn.forward",
               "--", sys.executable, here, "--child", mode]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        print("$ " + " ".join(cmd))
        print(r.stdout.strip())
        probe_lines = [l for l in r.stderr.splitlines() if l.startswith("probe:")]
        if r.returncode:
            print(r.stderr[-4000:])
        print("probe: lines: %s" % probe_lines)
        check(r.returncode == 0, "%s run exits 0 under probe-run" % mode)
        files[mode] = out
    r = subprocess.run([compare, files["math"], files["flash"], "--json", "-", "--kernels",
                        "--expect-kernel", "dit.step:*flash*"], capture_output=True, text=True)
    print(r.stderr)
    if not check(r.returncode in (0, 1), "probe-compare MATH FLASH ran (rc=%d)" % r.returncode):
        print(r.stdout)
        sys.exit(1)
    doc = json.loads(r.stdout)
    km = (doc["manifests"]["reference"] or {}).get("kernels")
    kf = (doc["manifests"]["candidate"] or {}).get("kernels")
    for mode, k in (("math", km), ("flash", kf)):
        print("== %s run, kernels per component ==" % mode)
        for comp, c in sorted((k or {}).items()):
            print("  %s: %d launches, %d unnamed" % (comp, c["launches"], c["unnamed_launches"]))
            for n, cnt in sorted(c["by_name"].items()):
                print("    %6d  %s" % (cnt, n))
    print("== probe-compare: only in one run ==")
    print(json.dumps(doc.get("kernels"), indent=1))
    check(bool(km and km.get("dit.step", {}).get("by_name")) and bool(kf and kf.get("dit.step", {}).get("by_name")),
          "both runs logged kernels inside dit.step")
    flash_f, flash_m = names_in(kf, "dit.step", "flash"), names_in(km, "dit.step", "flash")
    check(flash_f and not flash_m, "a flash kernel only in the flash run (flash: %s; math: %s)" % (flash_f[:2], flash_m[:2]))
    gemm = "gemm|xmma|cutlass|cublas|sm90"
    gm, gf = names_in(km, "dit.step", gemm), names_in(kf, "dit.step", gemm)
    check(gm and gf, "a cuBLAS(Lt) GEMM kernel (driver-API launch) in both runs (math: %s; flash: %s)" % (gm[:1], gf[:1]))
    tm = [n for n in names_in(km, "dit.step", "triton") if fnmatch.fnmatch(n, "triton_*")]
    tf = [n for n in names_in(kf, "dit.step", "triton") if fnmatch.fnmatch(n, "triton_*")]
    check(tm and tf, "a Triton kernel in both runs (math: %s; flash: %s)" % (tm[:1], tf[:1]))
    ek = doc.get("expect_kernel") or [{}]
    check(ek[0].get("matched") is True, "--expect-kernel 'dit.step:*flash*' on the flash candidate matches: %s" % ek)
    r2 = subprocess.run([compare, files["flash"], files["math"], "--json", "-", "--expect-kernel", "dit.step:*flash*"],
                        capture_output=True, text=True)
    d2 = json.loads(r2.stdout) if r2.returncode in (0, 1) else {}
    check(r2.returncode == 1 and d2.get("feature_active") is False and
          any("expect-kernel" in x for x in d2.get("reasons", [])),
          "--expect-kernel 'dit.step:*flash*' on the math candidate: feature not active, exit 1 (rc=%d, reasons %s)"
          % (r2.returncode, d2.get("reasons")))
    print("files in %s" % a.out)
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
