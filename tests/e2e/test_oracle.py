"""probe-oracle end to end (docs/oracle.md) on capture files written by h5py
the way the probe writer stores tensors (bfloat16 as the probe bfloat16 HDF5
type, FP8 as uint8 codes with probe.dtype), each op carrying its probe.op
record.

Outputs come from torch 1.13 on the CPU (bf16 nn.functional.linear, fp32
norms/activations/RoPE/attention) or from numpy emulation (FP8 GEMM, fp32
batched GEMM): they must pass. Perturbed outputs (4 bf16 ulps, 64 fp32 ulps)
must fail naming the element; malformed records and files exit 2 with one
line; ops whose inputs are missing are "not checkable" (exit 0). The fp64
values behind rel_l2/cosine/max_ratio are recomputed here in numpy and compared
with the tool's JSON. Exit 0 = pass.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import bf16_type  # noqa: E402

try:
    import torch
except ImportError:  # Debian's /usr/bin/python3 has torch; another interpreter may not
    print("torch not available: skipped")
    sys.exit(77)

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
ORACLE = os.path.join(BUILD, "bin", "probe-oracle")
failures = []
torch.manual_seed(0)
rng = np.random.default_rng(1)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run([ORACLE, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def run_json(path, *args):
    p = subprocess.run([ORACLE, "--json", "-", *args, path], capture_output=True, text=True,
                       timeout=300)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = None
    return p.returncode, doc, p.stderr


# --- writing tensors as the probe writer does (docs/file-format.md) ----------


SEQ = [0]


def put(f, path, value, dtype, op=None):
    """value: a torch tensor (bfloat16/float32/...) or numpy array; dtype: the
    probe dtype name; for float8 value is the uint8 code array."""
    parent = path.rsplit("/", 1)[0]
    if parent:
        f.require_group(parent)
    if dtype == "bfloat16":
        bits = value.contiguous().view(torch.int16).numpy().view(np.uint16)
        t = bf16_type()
        space = h5py.h5s.create_simple(bits.shape if bits.ndim else ())
        dsid = h5py.h5d.create(f.id, path.encode(), t, space)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(bits), mtype=t)
        d = f[path]
    else:
        arr = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        d = f.create_dataset(path, data=arr)
        shape = arr.shape
    shape = value.shape
    comp = path.strip("/").split("/")[0]
    d.attrs["probe.dtype"] = dtype
    d.attrs["probe.shape"] = np.array(list(shape), dtype=np.int64)
    d.attrs["probe.component"] = comp
    d.attrs["probe.slot"] = path.rsplit("/", 1)[1]
    d.attrs["probe.seq"] = np.uint64(SEQ[0])
    SEQ[0] += 1
    if op is not None:
        d.attrs["probe.op"] = op


def put_op(f, group, record, tensors):
    """tensors: slot -> (dataset name, value, dtype); record gets 'operands'."""
    rec = dict(record)
    rec["operands"] = {slot: name for slot, (name, _, _) in tensors.items()}
    text = json.dumps(rec)
    for slot, (name, value, dtype) in tensors.items():
        put(f, group + "/" + name, value, dtype, text)
    return text


def bf16_to_f64(t):
    return t.to(torch.float64).numpy()


# --- FP8 e4m3fn (OCP spec): decode all codes, encode by round-to-nearest-even --

def e4m3_decode(code):
    s = -1.0 if code & 0x80 else 1.0
    e = (code >> 3) & 0xF
    m = code & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return s * m * 2.0 ** -9
    return s * (1 + m / 8) * 2.0 ** (e - 7)


E4M3 = np.array([e4m3_decode(c) for c in range(256)])


def e4m3_encode(x):
    """nearest e4m3 code (ties to even code) of each value, saturating at 448"""
    x = np.clip(np.asarray(x, dtype=np.float64), -448, 448)
    finite = np.array([c for c in range(256) if not math.isnan(E4M3[c])])
    vals = E4M3[finite]
    d = np.abs(x[..., None] - vals)
    best = d.min(axis=-1, keepdims=True)
    cand = np.where(d == best, finite, 1 << 20)
    even = np.where(cand % 2 == 0, cand, 1 << 20).min(axis=-1)
    return np.where(even < (1 << 20), even, cand.min(axis=-1)).astype(np.uint8)


def round_bf16(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(torch.bfloat16)


def gemm_ref(rec, a, b, c=None, bias=None, sa=1.0, sb=1.0):
    """shared convention #4 in numpy fp64 (independent of references/)"""
    m, n, k, B = rec["m"], rec["n"], rec["k"], rec.get("batch", 1)
    a = a.reshape(-1, *(a.shape[-2:]))
    b = b.reshape(-1, *(b.shape[-2:]))
    out = np.empty((B, n, m))
    for i in range(B):
        A = a[i if a.shape[0] > 1 else 0]
        Bm = b[i if b.shape[0] > 1 else 0]
        opA = A.T if rec["transa"] == "N" else A          # [m, k]
        opB = Bm.T if rec["transb"] == "N" else Bm        # [k, n]
        D = rec.get("alpha", 1.0) * sa * sb * (opA @ opB)  # [m, n]
        if c is not None:
            D = D + rec.get("beta", 0.0) * c.reshape(B, n, m)[i].T
        if bias is not None:
            D = D + bias[:, None]
        out[i] = D.T
    return out.reshape(B, n, m) if B > 1 else out.reshape(n, m)


def metrics(ref, cand):
    ref, cand = ref.ravel(), cand.ravel()
    d = cand - ref
    return (np.linalg.norm(d) / np.linalg.norm(ref),
            float(np.dot(ref, cand) / (np.linalg.norm(ref) * np.linalg.norm(cand))))


tmp = os.environ.get("ORACLE_TEST_DIR") or tempfile.mkdtemp(prefix="probe-oracle-")

# ---- 1. bf16 nn.Linear with bias (cublasLt BIAS epilogue shape) -------------
TOK, IN, OUTF = 9, 96, 40
x = torch.randn(TOK, IN).to(torch.bfloat16)
W = (torch.randn(OUTF, IN) / math.sqrt(IN)).to(torch.bfloat16)
bias = torch.randn(OUTF).to(torch.bfloat16)
y = torch.nn.functional.linear(x, W, bias)
check(y.dtype == torch.bfloat16, "torch computed the linear in bf16")
REC = {"op": "gemm", "api": "cublasLtMatmul", "transa": "T", "transb": "N", "m": OUTF, "n": TOK,
       "k": IN, "batch": 1, "alpha": 1.0, "beta": 0.0, "compute": "32F", "scale_type": "32F",
       "epilogue": "BIAS"}


def write_linear(path, out_tensor):
    with h5py.File(path, "w") as f:
        put_op(f, "/dit.step/0000", REC, {
            "a": ("gemm.0000.a", W, "bfloat16"), "b": ("gemm.0000.b", x, "bfloat16"),
            "bias": ("gemm.0000.bias", bias, "bfloat16"), "out": ("gemm.0000.out", out_tensor,
                                                                 "bfloat16")})
        put(f, "/dit.step/0000/out", torch.zeros(3), "float32")  # an ordinary tap, no record


ok_file = os.path.join(tmp, "linear.h5")
write_linear(ok_file, y)
ref = gemm_ref(REC, bf16_to_f64(W), bf16_to_f64(x), bias=bf16_to_f64(bias))
rc, doc, err = run_json(ok_file)
check(rc == 0 and doc is not None and doc["verdict"] == "pass", f"bf16 linear passes (rc {rc}, {err.strip()})")
if doc:
    check(doc["format"] == "probe-oracle" and doc["version"] == 1 and doc["checked"] == 1
          and doc["not_checkable"] == 0 and len(doc["ops"]) == 1, "JSON header keys, one op")
    o = doc["ops"][0]
    check(o["path"] == "/dit.step/0000/gemm.0000.out" and o["op"] == "gemm"
          and o["api"] == "cublasLtMatmul" and o["dtype"] == "bfloat16" and o["shape"] == [TOK, OUTF],
          "op path/op/api/dtype/shape")
    rl2, cos = metrics(ref, bf16_to_f64(y))
    check(abs(o["rel_l2"] - rl2) <= 1e-12 * max(rl2, 1e-30) + 1e-15, f"rel_l2 {o['rel_l2']} = numpy {rl2}")
    check(abs(o["cosine"] - cos) <= 1e-12, f"cosine {o['cosine']} = numpy {cos}")
    check(0 < o["max_ratio"] <= 1, f"max err/bound {o['max_ratio']} in (0, 1]")
    check(o["u_out"] == 2.0 ** -8 and o["u_compute"] == 2.0 ** -23, "u_out 2^-8, u_acc 2^-23")
    # the worst element's numbers are the fp64 reference and the bf16 output
    j, i = o["max_ratio_index"]
    check(o["max_ratio_reference"] == ref[j, i] or abs(o["max_ratio_reference"] - ref[j, i])
          <= 4e-16 * abs(ref[j, i]), "worst element's reference = numpy fp64")
    check(o["max_ratio_captured"] == float(y[j, i]), "worst element's captured value")
    check("t1" in o and o["t1"]["verdict"] in ("pass", "fail"), "T1 reported as information")
rc, out, err = run(ok_file)
check(rc == 0 and "pass" in out and "/dit.step/0000/gemm.0000.out" in out
      and "1 pass, 0 fail, 0 not checkable" in out, "table and summary line")

# ---- 2. the same with one element perturbed by 4 bf16 ulps -> fail ----------
yb = y.clone().view(torch.int16)
flat = int(np.argmax(np.abs(bf16_to_f64(y)).ravel()))
J, I = divmod(flat, OUTF)
yb[J, I] += 4
y_bad = yb.view(torch.bfloat16)
bad_file = os.path.join(tmp, "linear_bad.h5")
write_linear(bad_file, y_bad)
rc, out, err = run(bad_file)
check(rc == 1, f"4-ulp perturbation fails (rc {rc})")
check(f"[{J}, {I}]" in out and "FAIL" in out, f"failure names the element [{J}, {I}]")
rc, doc, _ = run_json(bad_file)
if doc:
    o = doc["ops"][0]
    check(o["verdict"] == "fail" and o["max_ratio_index"] == [J, I] and o["violations"] == 1
          and o["max_ratio"] > 1, "JSON: fail, index, 1 violation, ratio > 1")
    e = abs(float(y_bad[J, I]) - ref[J, I])
    check(abs(o["max_ratio_err"] - e) <= 1e-12 * e, f"|err| {o['max_ratio_err']} = numpy {e}")

# ---- 3. FP8 e4m3 operands with scales, bf16 out, transa=N transb=T ----------
M, N, K = 24, 10, 64
sa, sb = np.float32(0.0125), np.float32(0.04)
A8 = e4m3_encode(rng.normal(size=(K, M)) * 60)   # stored [k, m] (transa N)
B8 = e4m3_encode(rng.normal(size=(K, N)) * 20)   # stored [k, n] (transb T)
Af, Bf = E4M3[A8], E4M3[B8]
check(np.all(np.isfinite(Af)) and np.all(np.isfinite(Bf)), "fp8 codes finite")
# emulation: exact products, fp32 accumulation in k order, fp32 scaling, bf16 rounding
acc = np.zeros((N, M), dtype=np.float32)
for l in range(K):
    acc = (acc + (np.outer(Bf[l], Af[l])).astype(np.float32)).astype(np.float32)
out8 = round_bf16(acc * np.float32(sa * sb))
REC8 = {"op": "gemm", "api": "cublasLtMatmul", "transa": "N", "transb": "T", "m": M, "n": N, "k": K,
        "batch": 1, "alpha": 1.0, "beta": 0.0, "compute": "32F", "scale_type": "32F",
        "epilogue": "DEFAULT"}
fp8_file = os.path.join(tmp, "fp8.h5")
with h5py.File(fp8_file, "w") as f:
    put_op(f, "/dit.step/0002", REC8, {
        "a": ("gemm.0001.a", A8, "float8_e4m3fn"), "b": ("gemm.0001.b", B8, "float8_e4m3fn"),
        "scale_a": ("gemm.0001.scale_a", np.array([sa], np.float32), "float32"),
        "scale_b": ("gemm.0001.scale_b", np.array([sb], np.float32), "float32"),
        "out": ("gemm.0001.out", out8, "bfloat16")})
rc, doc, err = run_json(fp8_file)
check(rc == 0 and doc and doc["verdict"] == "pass", f"FP8 e4m3 GEMM with scales passes (rc {rc} {err.strip()})")
if doc:
    o = doc["ops"][0]
    ref8 = gemm_ref(REC8, Af, Bf, sa=float(sa), sb=float(sb))
    rl2, _ = metrics(ref8, bf16_to_f64(out8))
    check(o["u_compute"] == 2.0 ** -13, "FP8 operands: u_acc 2^-13 (DeepSeek-V3 3.3.2)")
    check(abs(o["rel_l2"] - rl2) <= 1e-12 * rl2, f"FP8 rel_l2 {o['rel_l2']} = numpy {rl2}")
# the fp8 output with the scales swapped for 1: fails
with h5py.File(fp8_file, "r+") as f:
    f["/dit.step/0002/gemm.0001.scale_b"][0] = np.float32(0.05)
rc, out, _ = run(fp8_file)
check(rc == 1 and "FAIL" in out, "FP8 GEMM with a wrong scale_b fails")

# ---- 4. batched fp32 GEMM, transa=N transb=N, beta != 0 with C, outside scope
BATCH, M, N, K = 3, 7, 5, 33
Ab = rng.normal(size=(BATCH, K, M)).astype(np.float32)
Bb = rng.normal(size=(BATCH, N, K)).astype(np.float32)
Cb = rng.normal(size=(BATCH, N, M)).astype(np.float32)
alpha, beta = 0.75, -0.5
RECB = {"op": "gemm", "api": "cublasGemmStridedBatchedEx", "transa": "N", "transb": "N", "m": M,
        "n": N, "k": K, "batch": BATCH, "alpha": alpha, "beta": beta, "compute": "32F",
        "scale_type": "32F", "epilogue": "DEFAULT"}
outb = np.empty((BATCH, N, M), np.float32)
for bi in range(BATCH):   # fp32 arithmetic: numpy float32 matmul (pairwise/BLAS sums)
    outb[bi] = (np.float32(alpha) * (Bb[bi] @ Ab[bi]) + np.float32(beta) * Cb[bi]).astype(np.float32)
bat_file = os.path.join(tmp, "batched.h5")
with h5py.File(bat_file, "w") as f:
    put_op(f, "/gemm/0000", RECB, {"a": ("a", Ab, "float32"), "b": ("b", Bb, "float32"),
                                   "c": ("c", Cb, "float32"), "out": ("out", outb, "float32")})
rc, doc, err = run_json(bat_file)
check(rc == 0 and doc and doc["verdict"] == "pass", f"batched fp32 GEMM with beta*C passes (rc {rc} {err.strip()})")
if doc:
    o = doc["ops"][0]
    refb = gemm_ref(RECB, Ab.astype(np.float64), Bb.astype(np.float64), c=Cb.astype(np.float64))
    rl2, _ = metrics(refb, outb.astype(np.float64))
    check(o["path"] == "/gemm/0000/out" and o["shape"] == [BATCH, N, M], "outside-scope path, [B, n, m]")
    check(abs(o["rel_l2"] - rl2) <= 1e-9 * rl2, f"batched rel_l2 {o['rel_l2']} = numpy {rl2}")
# one element of batch 2 off by 2^-10 relative -> fail naming [2, j, i] (an fp32
# output's bound is gamma_k(2^-23) * sum|a||b|: ~1e-5 relative here, so a few
# ulps are inside it; docs/oracle.md "What the gate can see")
with h5py.File(bat_file, "r+") as f:
    d = f["/gemm/0000/out"]
    v = d[2, 3, 4]
    d[2, 3, 4] = np.float32(v) * np.float32(1 + 2 ** -10)
rc, out, _ = run(bat_file)
check(rc == 1 and "[2, 3, 4]" in out, "2^-10 relative fp32 perturbation fails naming [2, 3, 4]")
with h5py.File(bat_file, "r+") as f:
    d = f["/gemm/0000/out"]
    d[2, 3, 4] = v
rc, _, _ = run(bat_file)
check(rc == 0, "restored element passes again")

# ---- 5. non-GEMM ops from torch fp32 ----------------------------------------
F = torch.nn.functional
ops_file = os.path.join(tmp, "ops.h5")
D = 64
xs = torch.randn(2, 6, D) * 3
wn = torch.randn(D)
bn = torch.randn(D)
eps = 1e-6
rms = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps) * wn
ln = F.layer_norm(xs, (D,), wn, bn, 1e-5)
xa = torch.randn(200) * 4
S, H, HD = 5, 3, 16
xr = torch.randn(2, H, S, HD)
theta = torch.outer(torch.arange(S, dtype=torch.float64),
                    1.0 / (10000 ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)))
cos_h = torch.cat([theta.cos(), theta.cos()], -1).float()
sin_h = torch.cat([theta.sin(), theta.sin()], -1).float()
rot_half = torch.cat([-xr[..., HD // 2:], xr[..., :HD // 2]], -1)
rope_half = xr * cos_h + rot_half * sin_h
cos_i = theta.cos().repeat_interleave(2, -1).float()
sin_i = theta.sin().repeat_interleave(2, -1).float()
rot_int = torch.stack([-xr[..., 1::2], xr[..., 0::2]], -1).flatten(-2)
rope_int = xr * cos_i + rot_int * sin_i
q = torch.randn(2, 3, 7, 16)
k = torch.randn(2, 3, 9, 16)
v = torch.randn(2, 3, 9, 12)
scale = 0.3
att = torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v
qc = torch.randn(1, 2, 8, 16)
kc = torch.randn(1, 2, 8, 16)
vc = torch.randn(1, 2, 8, 16)
mask = torch.randn(8, 8)
s = qc @ kc.transpose(-1, -2) / 4.0 + mask
s = s.masked_fill(torch.triu(torch.ones(8, 8, dtype=torch.bool), 1), float("-inf"))
attc = torch.softmax(s, -1) @ vc
with h5py.File(ops_file, "w") as f:
    put_op(f, "/dit.step/0001", {"op": "rmsnorm", "eps": eps},
           {"x": ("rms.x", xs, "float32"), "weight": ("rms.w", wn, "float32"),
            "out": ("rms.out", rms, "float32")})
    put_op(f, "/dit.step/0001", {"op": "layernorm", "eps": 1e-5},
           {"x": ("ln.x", xs, "float32"), "weight": ("ln.w", wn, "float32"),
            "bias": ("ln.b", bn, "float32"), "out": ("ln.out", ln, "float32")})
    put_op(f, "/dit.step/0001", {"op": "silu"},
           {"x": ("silu.x", xa, "float32"), "out": ("silu.out", F.silu(xa), "float32")})
    put_op(f, "/dit.step/0001", {"op": "gelu", "approximate": "none"},
           {"x": ("gelu.x", xa, "float32"), "out": ("gelu.out", F.gelu(xa), "float32")})
    put_op(f, "/dit.step/0001", {"op": "gelu", "approximate": "tanh"},
           {"x": ("gelut.x", xa, "float32"),
            "out": ("gelut.out", F.gelu(xa, approximate="tanh"), "float32")})
    put_op(f, "/dit.step/0001", {"op": "rope", "convention": "half"},
           {"x": ("ropeh.x", xr, "float32"), "cos": ("ropeh.cos", cos_h, "float32"),
            "sin": ("ropeh.sin", sin_h, "float32"), "out": ("ropeh.out", rope_half, "float32")})
    put_op(f, "/dit.step/0001", {"op": "rope", "convention": "interleaved"},
           {"x": ("ropei.x", xr, "float32"), "cos": ("ropei.cos", cos_i.reshape(1, 1, S, HD), "float32"),
            "sin": ("ropei.sin", sin_i.reshape(1, 1, S, HD), "float32"),
            "out": ("ropei.out", rope_int, "float32")})
    put_op(f, "/dit.step/0001", {"op": "attention", "scale": scale, "causal": False},
           {"q": ("att.q", q, "float32"), "k": ("att.k", k, "float32"),
            "v": ("att.v", v, "float32"), "out": ("att.out", att, "float32")})
    put_op(f, "/dit.step/0001", {"op": "attention", "causal": True},
           {"q": ("attc.q", qc, "float32"), "k": ("attc.k", kc, "float32"),
            "v": ("attc.v", vc, "float32"), "mask": ("attc.mask", mask, "float32"),
            "out": ("attc.out", attc, "float32")})
rc, doc, err = run_json(ops_file)
check(rc == 0 and doc and doc["verdict"] == "pass" and doc["checked"] == 9,
      f"9 non-GEMM ops from torch fp32 pass (rc {rc} {err.strip()})")
# independent fp64 values: rel_l2 of each against a numpy fp64 formula
if doc:
    by = {o["path"].rsplit("/", 1)[1]: o for o in doc["ops"]}
    x64 = xs.double().numpy()
    w64, b64 = wn.double().numpy(), bn.double().numpy()
    r_rms = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * w64
    mu = x64.mean(-1, keepdims=True)
    r_ln = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w64 + b64
    xa64 = xa.double().numpy()
    r_silu = xa64 / (1 + np.exp(-xa64))
    r_gelu = 0.5 * xa64 * (1 + np.array([math.erf(t / math.sqrt(2)) for t in xa64]))
    r_gelut = 0.5 * xa64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (xa64 + 0.044715 * xa64 ** 3)))
    xr64 = xr.double().numpy()
    r_ropeh = xr64 * cos_h.double().numpy() + np.concatenate(
        [-xr64[..., HD // 2:], xr64[..., :HD // 2]], -1) * sin_h.double().numpy()
    ri = np.empty_like(xr64)
    ri[..., 0::2], ri[..., 1::2] = -xr64[..., 1::2], xr64[..., 0::2]
    r_ropei = xr64 * cos_i.double().numpy() + ri * sin_i.double().numpy()

    def np_att(q, k, v, scale, mask=None, causal=False):
        s = q @ np.swapaxes(k, -1, -2) * scale
        if mask is not None:
            s = s + mask
        if causal:
            s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
        s = s - s.max(-1, keepdims=True)
        p = np.exp(s)
        return (p / p.sum(-1, keepdims=True)) @ v
    r_att = np_att(q.double().numpy(), k.double().numpy(), v.double().numpy(), scale)
    r_attc = np_att(qc.double().numpy(), kc.double().numpy(), vc.double().numpy(), 0.25,
                    mask.double().numpy(), True)
    for name, r, c in [("rms.out", r_rms, rms), ("ln.out", r_ln, ln), ("silu.out", r_silu, F.silu(xa)),
                       ("gelu.out", r_gelu, F.gelu(xa)),
                       ("gelut.out", r_gelut, F.gelu(xa, approximate="tanh")),
                       ("ropeh.out", r_ropeh, rope_half), ("ropei.out", r_ropei, rope_int),
                       ("att.out", r_att, att), ("attc.out", r_attc, attc)]:
        rl2, _ = metrics(r, c.double().numpy())
        o = by.get(name)
        check(o is not None and o["verdict"] == "pass" and
              abs(o["rel_l2"] - rl2) <= 1e-6 * rl2 + 1e-300,
              f"{name}: pass, rel_l2 {o and o['rel_l2']} = numpy fp64 {rl2}")
# a wrong convention (half-split output labelled interleaved) fails; a perturbed rmsnorm fails
with h5py.File(ops_file, "r+") as f:
    f["/dit.step/0001/ropei.out"][...] = rope_half.numpy()
    d = f["/dit.step/0001/rms.out"]
    d[1, 2, 3] = np.float32(d[1, 2, 3]) * np.float32(1 + 2 ** -16)
rc, doc, _ = run_json(ops_file)
if doc:
    by = {o["path"].rsplit("/", 1)[1]: o for o in doc["ops"]}
    check(rc == 1 and by["ropei.out"]["verdict"] == "fail", "rope with the wrong convention fails")
    check(by["rms.out"]["verdict"] == "fail" and by["rms.out"]["max_ratio_index"] == [1, 2, 3],
          "rmsnorm off by 2^-16 relative fails at [1, 2, 3]")
    check(by["att.out"]["verdict"] == "pass", "the untouched ops still pass")
rc, doc, _ = run_json(ops_file, "--only", "*/att*")
check(rc == 0 and doc and doc["checked"] == 2, "--only selects ops by output path")

# ---- 5b. many records in one file: each op checked once ---------------------
many_file = os.path.join(tmp, "many.h5")
with h5py.File(many_file, "w") as f:
    for g in range(150):
        a_ = rng.normal(size=(4, 3)).astype(np.float32)      # [k, m] transa N
        b_ = rng.normal(size=(2, 4)).astype(np.float32)      # [n, k] transb N
        put_op(f, f"/dit.step/{g // 50:04d}", dict(RECB, batch=1, m=3, n=2, k=4, beta=0.0,
                                                  api="cublasSgemm_v2"),
               {"a": (f"gemm.{g:04d}.a", a_, "float32"), "b": (f"gemm.{g:04d}.b", b_, "float32"),
                "out": (f"gemm.{g:04d}.out", (b_ @ a_).astype(np.float32) * np.float32(alpha),
                        "float32")})
rc, doc, err = run_json(many_file)
check(rc == 0 and doc and doc["checked"] == 150 and len(doc["ops"]) == 150
      and len({o["path"] for o in doc["ops"]}) == 150, f"150 GEMM records: 150 ops, each once (rc {rc})")

# ---- 6. not checkable: an operand was not captured ---------------------------
nc_file = os.path.join(tmp, "nc.h5")
with h5py.File(nc_file, "w") as f:
    put_op(f, "/dit.step/0000", REC, {"a": ("gemm.0000.a", W, "bfloat16"),
                                      "out": ("gemm.0000.out", y, "bfloat16")})
    put_op(f, "/dit.step/0000", {"op": "softmax"}, {"x": ("sm.x", xa, "float32"),
                                                    "out": ("sm.out", xa, "float32")})
rc, out, err = run(nc_file)
check(rc == 0 and "not-checkable" in out and "operand 'b' was not captured" in out
      and "0 pass, 0 fail, 2 not checkable" in out and "not known" in out,
      f"missing input / unknown op are not checkable, exit 0 (rc {rc})")
rc, out, _ = run(ok_file, "--max-flops", "100")
check(rc == 0 and "above --max-flops" in out, "--max-flops refuses a large GEMM (not checkable)")

# ---- 7. bad input: exit 2, one line naming file and path ---------------------


def one_line_2(args, must, what):
    rc, out, err = run(*args)
    lines = err.strip().splitlines()
    check(rc == 2 and len(lines) == 1 and lines[0].startswith("probe-oracle: ")
          and all(m in lines[0] for m in must), f"{what}: exit 2, one line ({rc}, {err.strip()!r})")


miss_file = os.path.join(tmp, "missing.h5")
with h5py.File(miss_file, "w") as f:
    put(f, "/dit.step/0000/gemm.0000.out", y, "bfloat16",
        json.dumps(dict(REC, operands={"a": "gemm.0000.a", "b": "gemm.0000.b",
                                       "out": "gemm.0000.out"})))
one_line_2([miss_file], [miss_file, "/dit.step/0000/gemm.0000.out", "/dit.step/0000/gemm.0000.a"],
           "operand named but not in the file")
json_file = os.path.join(tmp, "badjson.h5")
with h5py.File(json_file, "w") as f:
    put(f, "/dit.step/0000/gemm.0000.out", y, "bfloat16", '{"op": "gemm", "operands": {')
one_line_2([json_file], [json_file, "/dit.step/0000/gemm.0000.out", "not valid JSON"], "bad JSON")
field_file = os.path.join(tmp, "badfield.h5")
with h5py.File(field_file, "w") as f:
    put_op(f, "/g/0000", {"op": "gemm", "transa": "X", "transb": "N", "m": 1, "n": 1, "k": 1},
           {"out": ("out", torch.zeros(1, 1), "float32")})
one_line_2([field_file], [field_file, "/g/0000/out", "transa"], "bad gemm field")
shape_file = os.path.join(tmp, "badshape.h5")
with h5py.File(shape_file, "w") as f:
    put_op(f, "/g/0000", dict(REC, m=OUTF + 1), {
        "a": ("a", W, "bfloat16"), "b": ("b", x, "bfloat16"), "bias": ("bias", bias, "bfloat16"),
        "out": ("out", y, "bfloat16")})
one_line_2([shape_file], [shape_file, "/g/0000/a", "m*k"], "element counts inconsistent with m,n,k")
txt = os.path.join(tmp, "not.h5")
with open(txt, "w") as fh:
    fh.write("this is not HDF5\n")
one_line_2([txt], [txt], "not an HDF5 file")
one_line_2([os.path.join(tmp, "nope.h5")], ["nope.h5"], "no such file")
one_line_2([tmp], [tmp], "a directory")
one_line_2(["--bogus", ok_file], ["--bogus"], "unknown option")
one_line_2(["--max-flops", "-3", ok_file], ["--max-flops"], "bad --max-flops")

# an HDF5 file without any record: nothing to check, exit 0
plain = os.path.join(tmp, "plain.h5")
with h5py.File(plain, "w") as f:
    put(f, "/vae.decode/0000/out", torch.ones(4), "float32")
rc, out, _ = run(plain)
check(rc == 0 and "0 ops" in out and "nothing checked" in out and "pass" not in out.split("->")[-1],
      "a capture without op records: 0 ops, nothing checked (not 'pass'), exit 0")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all checks passed")
