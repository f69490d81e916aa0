#!/usr/bin/env python3
"""probe-oracle's bounds against real cuBLAS/cuBLASLt results on a GPU
(docs/oracle.md "On a GPU"). Run by scripts/gpu/oracle.sh:

    python3 tests/gpu/oracle_gpu.py PROBE_ORACLE OUT_DIR

Each case computes a GEMM on the device with torch, writes the operands and
the output as the probe writer stores them (bfloat16 as the probe HDF5
bfloat16 type, FP8 as uint8 codes with probe.dtype) with the probe.op record
of shared convention #4, runs probe-oracle on it and prints PASS/FAIL with
the worst err/bound ratio (how tight the bound is on this hardware). The
negative controls must FAIL the oracle (they PASS here when it does).
Needs torch with CUDA, h5py, numpy. Exit 0 all PASS, 1 a FAIL, 2 no GPU.
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from test_shim_common import bf16_type  # noqa: E402

ORACLE, OUT = sys.argv[1], sys.argv[2]
os.makedirs(OUT, exist_ok=True)
if not torch.cuda.is_available():
    print("oracle_gpu: no CUDA device")
    sys.exit(2)
dev = "cuda"
torch.manual_seed(0)
fails = 0



NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
         torch.float64: "float64"}
if hasattr(torch, "float8_e4m3fn"):
    NAMES[torch.float8_e4m3fn] = "float8_e4m3fn"
    NAMES[torch.float8_e5m2] = "float8_e5m2"


def put(f, path, t, text):
    t = t.detach().contiguous().cpu()
    name = NAMES[t.dtype]
    f.require_group(path.rsplit("/", 1)[0])
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().view(np.uint16)
        ty = bf16_type()
        dsid = h5py.h5d.create(f.id, path.encode(), ty, h5py.h5s.create_simple(bits.shape))
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(bits), mtype=ty)
        d = f[path]
    elif name.startswith("float8"):
        d = f.create_dataset(path, data=t.view(torch.uint8).numpy())
    else:
        d = f.create_dataset(path, data=t.numpy())
    d.attrs["probe.dtype"] = name
    d.attrs["probe.shape"] = np.array(list(t.shape), dtype=np.int64)
    d.attrs["probe.op"] = text


def gemm_file(name, rec, tensors):
    path = os.path.join(OUT, name + ".h5")
    rec = dict(rec, op="gemm")
    rec["operands"] = {slot: "gemm.0000." + slot for slot in tensors}
    text = json.dumps(rec)
    with h5py.File(path, "w") as f:
        for slot, t in tensors.items():
            put(f, "/case/0000/gemm.0000." + slot, t, text)
    return path


def oracle(path):
    p = subprocess.run([ORACLE, "--json", "-", path], capture_output=True, text=True)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = None
    return p.returncode, doc, p.stderr.strip()


def case(name, rec, tensors, expect=0):
    global fails
    rc, doc, err = oracle(gemm_file(name, rec, tensors))
    o = doc["ops"][0] if doc and doc["ops"] else {}
    ok = rc == expect
    print(f"{'PASS' if ok else 'FAIL'} {name}: probe-oracle exit {rc} (want {expect}), "
          f"max err/bound {o.get('max_ratio')}, rel_l2 {o.get('rel_l2')}, "
          f"violations {o.get('violations')} {o.get('reason') or ''} {err if rc == 2 else ''}")
    fails += not ok
    return o


def linear_rec(x, W, bias, compute="32F"):
    return {"api": "cublasLtMatmul", "transa": "T", "transb": "N", "m": W.shape[0],
            "n": x.shape[0], "k": x.shape[1], "batch": 1, "alpha": 1.0, "beta": 0.0,
            "compute": compute, "scale_type": "32F",
            "epilogue": "BIAS" if bias is not None else "DEFAULT"}


F = torch.nn.functional
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")

# 1. bf16 nn.Linear with bias (cuBLASLt bias epilogue), long k
T_, K_, M_ = 256, 4096, 512
x = torch.randn(T_, K_, device=dev, dtype=torch.bfloat16)
W = (torch.randn(M_, K_, device=dev) / K_ ** 0.5).to(torch.bfloat16)
b = torch.randn(M_, device=dev, dtype=torch.bfloat16)
y = F.linear(x, W, b)
case("bf16_linear_bias", linear_rec(x, W, b), {"a": W, "b": x, "bias": b, "out": y})
# negative control: 4 ulps on the largest element
yb = y.clone().view(torch.int16)
j = int(y.float().abs().argmax())
yb.view(-1)[j] += 4
case("bf16_linear_bias_4ulp_must_fail", linear_rec(x, W, b),
     {"a": W, "b": x, "bias": b, "out": yb.view(torch.bfloat16)}, expect=1)

# 2. fp16 linear without bias (fp32 accumulation requested)
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
xh, Wh = x.half(), W.half()
case("fp16_linear", linear_rec(xh, Wh, None), {"a": Wh, "b": xh, "out": F.linear(xh, Wh)})

# 3. fp32 matmul, TF32 off (32F) and on (32F_FAST_TF32)
xf, Wf = x.float(), W.float() + 1e-3 * torch.randn(M_, K_, device=dev)
torch.backends.cuda.matmul.allow_tf32 = False
case("fp32_linear_32F", linear_rec(xf, Wf, None), {"a": Wf, "b": xf, "out": F.linear(xf, Wf)})
torch.backends.cuda.matmul.allow_tf32 = True
yt = F.linear(xf, Wf)
case("fp32_linear_tf32", linear_rec(xf, Wf, None, "32F_FAST_TF32"), {"a": Wf, "b": xf, "out": yt})
# negative control: a TF32 result labelled as full fp32 must fail. Only with a
# short k: the bound's gamma_k(2^-23) * sum|a||b| grows with k, and TF32's
# input rounding (2^-11 per product, random signs) stays below it for k ~ 4096
xs, Ws = torch.randn(64, 16, device=dev), torch.randn(32, 16, device=dev)
case("tf32_k16_labelled_32F_must_fail", linear_rec(xs, Ws, None),
     {"a": Ws, "b": xs, "out": F.linear(xs, Ws)}, expect=1)
case("tf32_k16_labelled_TF32", linear_rec(xs, Ws, None, "32F_FAST_TF32"),
     {"a": Ws, "b": xs, "out": F.linear(xs, Ws)})
torch.backends.cuda.matmul.allow_tf32 = False

# 4. batched bf16 bmm: out[b] = X[b] @ Y[b]: a = Y [k, m] (N), b = X [n, k] (N)
B_, N2, K2, M2 = 4, 128, 1024, 96
X = torch.randn(B_, N2, K2, device=dev, dtype=torch.bfloat16)
Y = torch.randn(B_, K2, M2, device=dev, dtype=torch.bfloat16)
case("bf16_bmm", {"api": "cublasGemmStridedBatchedEx", "transa": "N", "transb": "N", "m": M2,
                  "n": N2, "k": K2, "batch": B_, "alpha": 1.0, "beta": 0.0, "compute": "32F",
                  "epilogue": "DEFAULT"}, {"a": Y, "b": X, "out": torch.bmm(X, Y)})

# 5. FP8 e4m3 with per-tensor scales, bf16 out: torch._scaled_mm(A [M,K], B [K,N] col-major)
#    out [M, N] = sa*sb*A@B -> "n" = M, "m" = N; a = B as [K, N] (N), b = A [M, K] (N)
if hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
    Mq, Kq, Nq = 256, 4096, 512
    A8 = (torch.randn(Mq, Kq, device=dev) * 8).to(torch.float8_e4m3fn)
    B8 = (torch.randn(Nq, Kq, device=dev) * 8).to(torch.float8_e4m3fn).t()  # [K, N] column-major
    sa = torch.tensor(0.02, device=dev)
    sb = torch.tensor(0.03, device=dev)
    for fast in (False, True):
        try:
            out = torch._scaled_mm(A8, B8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                   use_fast_accum=fast)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"SKIP fp8_scaled_mm fast_accum={fast}: {e}")
            continue
        if isinstance(out, tuple):
            out = out[0]
        case(f"fp8_e4m3_scaled_mm_fast_accum_{int(fast)}",
             {"api": "cublasLtMatmul", "transa": "N", "transb": "N", "m": Nq, "n": Mq, "k": Kq,
              "batch": 1, "alpha": 1.0, "beta": 0.0, "compute": "32F", "epilogue": "DEFAULT"},
             {"a": B8.contiguous(), "b": A8, "scale_a": sb.reshape(1).float(),
              "scale_b": sa.reshape(1).float(), "out": out})
else:
    print("SKIP fp8: this torch has no _scaled_mm / float8_e4m3fn")

print(f"oracle_gpu: {'all PASS' if fails == 0 else f'{fails} FAIL'}")
sys.exit(1 if fails else 0)
