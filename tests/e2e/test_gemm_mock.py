"""The shim's cuBLAS / cuBLASLt GEMM hooks (intercept/hooks/gemm.c) on a CPU.

tests/fakes/fake_cublas.c and fake_cublaslt.c are built here as
libcublas.so.13 / libcublasLt.so.13 (real sonames; loaded RTLD_LOCAL by
tests/programs/shim_gemm, as torch loads them, so the shim finds them with
RTLD_NOLOAD), and tests/fakes/mock_cudart.c as libcudart.so.13 for the device
copies. The program's GEMMs (bf16 cublasGemmEx with transa=T and ldb > rows,
fp32 cublasSgemm_v2 with beta != 0, fp16 strided batched Ex, cublasLtMatmul
with the BIAS epilogue, with FP8 A/B and scale pointers, with BATCH_COUNT,
fp64 Dgemm, strided batched Sgemm, an in-place call whose output overwrites
A, a call the library rejects, and two cublasLtMatmul with ORDER_ROW
layouts, an Sgemm in device pointer mode) run outside any scope, so GEMM k is stored under /gemm/<k:04>/.
Checked:
- PROBE_CAPTURE unset ('*'): no operand is captured; the manifest's "gemm"
  counts all 13 calls by signature (the two ORDER_ROW calls under one
  signature with count 2); one `probe:` warning for the ORDER_ROW layouts;
- '*gemm*': every operand of the 9 decodable calls is in the file with its
  logical row-major shape and bit-exact bytes (numpy as_strided over the
  buffer the program saved: inputs before the call, out after it, C before
  it); the probe.op JSON is identical on every operand of a call and names
  exactly the captured slots; and the row-major formula of docs/gemm.md
  applied in float64 to the captured a/b/c/bias/scales reproduces out within
  the output type's rounding;
- the in-place call's A is the value before the call (captured first);
- the rejected call returned the library's status (7) and captured nothing;
  every hook passed its arguments through unchanged (the fake records them);
- selection by path: '/gemm/0001/*,/gemm/0003/out' captures exactly those;
- a forked child's GEMM is forwarded, the child captures nothing;
- scopes (probe_scope_enter_v1: dit.step calls 0..2 = steps 0..2, two weight
  GEMMs and an activation product each, then one GEMM outside):
  '*,*gemm*@step=1' captures exactly /dit.step/0001/gemm.000[012].* (probe.step
  1) and nothing of steps 0/2 or outside; the manifest "weights" has dit.step
  with 2 operands (the activation product, transa N, is not a weight)
  (k 0: [6, 4], k 1: [5, 6], bfloat16, 108 bytes) whose XXH64 equal the
  probe.hash of the same tensors captured in full, whose combined hash is
  the XXH64 of the documented records, and which are identical across runs
  with the same weights and differ when the weights differ; each operand's
  "levels" and "rounded" fingerprints equal the XXH64 of torch's
  float8_e4m3fn codes of its bytes (plain cast and amax scale);
  PROBE_WEIGHTS=hash gives the same hashes without them; PROBE_WEIGHTS=0
  leaves "weights" out;
- blocks nested in a dit.step scope (probe_scope_v1 with parent and block):
  '*gemm*@block=1-' captures exactly blocks 1 and 2's operands, each with
  probe.parent /dit.step/0000, its probe.block and the dit.step's step and
  branch; a block scope of the first v1 size is not nested (not selected);
- 4 threads x 100 GEMMs, each thread in its own scope instance, with
  '*/gemm.*.out': 400 outputs at /worker/<t>/gemm.<i>.out, each equal to its
  thread's result and carrying its step; one signature counted 400 times.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (need_torch_float8, SOURCE, attr_str, check, expected_bytes, finish, need_build,  # noqa: E402
                              preload_env, probe_lines, program, read_raw, run, tmpdir)

from test_h5py_interop import xxh64  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402


def build(d):
    cc = os.environ.get("CC", "cc")
    fakes = os.path.join(SOURCE, "tests", "fakes")
    libs = {}
    for src, so in (("mock_cudart.c", "libcudart.so.13"), ("fake_cublaslt.c", "libcublasLt.so.13"),
                    ("fake_cublas.c", "libcublas.so.13")):
        out = os.path.join(d, so)
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror",
                        "-I", fakes, "-Wl,-soname," + so, "-o", out, os.path.join(fakes, src),
                        "-lpthread", "-lm", "-ldl"], check=True)
        libs[so] = out
    return libs


def e4m3_to_f64(u8):
    u = u8.astype(np.int64)
    s = np.where(u >> 7, -1.0, 1.0)
    e = (u >> 3) & 15
    m = u & 7
    v = np.where(e == 0, m * 2.0 ** -9, (m + 8) * np.exp2(e - 10.0))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return s * v


def as_f64(ds):
    dt = ds.attrs["probe.dtype"]
    dt = dt.decode() if isinstance(dt, bytes) else dt
    if dt == "float8_e4m3fn":
        return e4m3_to_f64(ds[()]).reshape(ds.shape)
    return ds[()].astype(np.float64)


RTOL = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float32": 1e-6, "float64": 1e-12}


def formula_check(f, k, op):
    """out[b][j][i] = alpha*sa*sb*sum_l opA(i,l) opB(l,j) + beta*c[b][j][i] + bias[i]."""
    g = f["/gemm/%04d" % k]
    a, b, out = as_f64(g["a"]), as_f64(g["b"]), as_f64(g["out"])
    batched = out.ndim == 3
    if not batched:
        a, b, out = a[None], b[None], out[None]
    opA = a if op["transa"] == "T" else np.swapaxes(a, 1, 2)  # [B, m, k]
    opB = b if op["transb"] == "T" else np.swapaxes(b, 1, 2)  # [B, k, n]
    scale = 1.0
    for s in ("scale_a", "scale_b"):
        if s in g:
            scale *= float(as_f64(g[s])[0])
    # device pointer mode (GEMM 12): alpha/beta are null; the program used 1 and 0
    alpha = 1.0 if op["alpha"] is None else op["alpha"]
    beta = 0.0 if op["beta"] is None else op["beta"]
    ref = alpha * scale * np.swapaxes(opA @ opB, 1, 2)  # [B, n, m]
    if "c" in g:
        c = as_f64(g["c"])
        ref = ref + beta * (c if batched else c[None])
    if "bias" in g:
        ref = ref + as_f64(g["bias"])[None, None, :]
    dt = g["out"].attrs["probe.dtype"]
    dt = dt.decode() if isinstance(dt, bytes) else dt
    err = np.max(np.abs(ref - out) / np.maximum(np.abs(ref), 1.0))
    return err <= RTOL[dt], err


def manifest(path):
    with h5py.File(path, "r") as f:
        m = f.attrs["probe.manifest"]
    return json.loads(m.decode() if isinstance(m, bytes) else m)


def main():
    need_torch_float8()
    need_build()
    d = tmpdir("probe-gemm-mock-")
    libs = build(d)
    args = [program("shim_gemm"), libs["libcudart.so.13"], libs["libcublasLt.so.13"],
            libs["libcublas.so.13"], d]

    # 1. default selection: nothing captured, every call counted
    out1 = os.path.join(d, "default.h5")
    r = run(args + ["main"], preload_env(out1, leaks=False))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "default run: every hook returned the library's status and forwarded "
          "its arguments unchanged (rc=%d)" % r.returncode)
    warn = probe_lines(r.stderr)
    check(len(warn) == 1 and "ORDER" in warn[0], "exactly one probe: warning, for the ORDER_ROW layout "
          "(got %s)" % warn)
    if check(os.path.exists(out1), "default run wrote a capture file"):
        with h5py.File(out1, "r") as f:
            check("gemm" not in f, "PROBE_CAPTURE='*' captures no GEMM operand")
        g = manifest(out1).get("gemm")
        if check(g is not None, "manifest has the \"gemm\" key"):
            check(g["total"] == 13 and g["overflow"] == 0, "gemm.total == 13 calls (got %s)" % g["total"])
            sigs = g["components"].get("gemm", [])
            check(sum(s["count"] for s in sigs) == 13, "signature counts add up to 13")
            row = [s for s in sigs if s["api"] == "cublasLtMatmul" and s["m"] == 2]
            check(len(row) == 1 and row[0]["count"] == 2 and row[0]["first_k"] == 10,
                  "the two ORDER_ROW calls share one signature, count 2, first_k 10 (%s)" % row)
            lin = [s for s in sigs if s["first_k"] == 3]
            check(len(lin) == 1 and lin[0]["epilogue"] == "BIAS" and lin[0]["transa"] == "T"
                  and (lin[0]["m"], lin[0]["n"], lin[0]["k"]) == (6, 3, 4) and lin[0]["a"] == "16BF",
                  "cublasLtMatmul with bias: signature m=6 n=3 k=4 T/N BIAS 16BF (%s)" % lin)
            sb = [s for s in sigs if s["first_k"] == 2]
            check(len(sb) == 1 and sb[0]["batch"] == 3 and sb[0]["api"] == "cublasGemmStridedBatchedEx",
                  "strided batched Ex: batch 3")

    # 2. every GEMM operand
    out2 = os.path.join(d, "all.h5")
    r = run(args + ["main"], preload_env(out2, leaks=False, PROBE_CAPTURE="*gemm*"))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "'*gemm*' run: hooks returned the library's status, arguments unchanged")
    check(len(probe_lines(r.stderr)) == 1, "'*gemm*' run: only the ORDER_ROW warning")
    cases = [json.loads(l) for l in open(os.path.join(d, "cases.jsonl"))]
    ops = [c for c in cases if "path" in c]
    with h5py.File(out2, "r") as f:
        for c in ops:
            p = c["path"]
            if not check(p in f, "%s present" % p):
                continue
            ds = f[p]
            check(tuple(ds.shape) == tuple(c["shape"]), "%s shape %s" % (p, c["shape"]))
            check(read_raw(ds).tobytes() == expected_bytes(c, d), "%s bit-exact" % p)
        expected_paths = {c["path"] for c in ops}
        got = set()
        f["gemm"].visititems(lambda n, o: got.add("/gemm/" + n) if isinstance(o, h5py.Dataset) else None)
        check(got == expected_paths, "exactly the decodable calls' operands are captured "
              "(extra %s, missing %s)" % (sorted(got - expected_paths), sorted(expected_paths - got)))
        check("/gemm/0009" not in f and "/gemm/0010" not in f and "/gemm/0011" not in f,
              "rejected call and ORDER_ROW calls: nothing captured")
        for k in sorted({c["k"] for c in ops}):
            g = f["/gemm/%04d" % k]
            texts = {g[n].attrs["probe.op"] for n in g}
            if not check(len(texts) == 1, "gemm %d: one probe.op text on all operands" % k):
                continue
            t = texts.pop()
            op = json.loads(t.decode() if isinstance(t, bytes) else t)
            check(set(op["operands"]) == set(g.keys()) and
                  all(op["operands"][n] == n for n in g), "gemm %d: probe.op operands %s" % (k, op["operands"]))
            ok, err = formula_check(f, k, op)
            check(ok, "gemm %d (%s %s%s): row-major formula reproduces out (max rel err %.3g)"
                  % (k, op["api"], op["transa"], op["transb"], err))
        op3 = json.loads(f["/gemm/0003/out"].attrs["probe.op"])
        check(op3["epilogue"] == "BIAS" and op3["api"] == "cublasLtMatmul" and op3["m"] == 6 and
              op3["alpha"] == 1.0 and op3["beta"] == 0.0 and op3["compute"] == "32F",
              "probe.op of the Linear-like Lt call: %s" % op3)
        op1 = json.loads(f["/gemm/0001/out"].attrs["probe.op"])
        check(op1["beta"] == 0.5 and op1["alpha"] == 2.0 and "c" in op1["operands"],
              "Sgemm with beta 0.5: alpha/beta read, c captured")
        check(json.loads(f["/gemm/0004/a"].attrs["probe.op"])["operands"].get("scale_b") == "scale_b",
              "fp8 call: scale pointers captured")
        check(tuple(f["/gemm/0003/bias"].shape) == (6,), "bias has m elements")
        op12 = json.loads(f["/gemm/0012/out"].attrs["probe.op"])
        check(op12["alpha"] is None and op12["beta"] is None and "c" in op12["operands"],
              "device pointer mode: alpha/beta null, C captured (%s)" % op12)

    # 3. selection by path
    out3 = os.path.join(d, "sel.h5")
    r = run(args + ["main"], preload_env(out3, leaks=False, PROBE_CAPTURE="/gemm/0001/*,/gemm/0003/out"))
    check(r.returncode == 0, "selection run rc 0")
    with h5py.File(out3, "r") as f:
        got = set()
        f.visititems(lambda n, o: got.add("/" + n) if isinstance(o, h5py.Dataset) else None)
        want = {"/gemm/0001/a", "/gemm/0001/b", "/gemm/0001/c", "/gemm/0001/out", "/gemm/0003/out"}
        check(got == want, "'/gemm/0001/*,/gemm/0003/out' selects exactly %s (got %s)" % (sorted(want), sorted(got)))
        op = json.loads(f["/gemm/0003/out"].attrs["probe.op"])
        check(set(op["operands"]) == {"out"}, "probe.op names only the captured operand")

    # 4. fork
    out4 = os.path.join(d, "fork.h5")
    r = run(args + ["fork"], preload_env(out4, leaks=False, PROBE_CAPTURE="*gemm*"))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "fork: the child's GEMM was forwarded, the parent's computed (rc=%d)" % r.returncode)
    check(probe_lines(r.stderr) == [], "fork: no probe: warnings")
    with h5py.File(out4, "r") as f:
        got = set()
        f.visititems(lambda n, o: got.add("/" + n) if isinstance(o, h5py.Dataset) else None)
        check(got == {"/gemm/0000/a", "/gemm/0000/b", "/gemm/0000/out"},
              "fork: only the parent's GEMM is captured (%s)" % sorted(got))
        check(manifest(out4)["gemm"]["total"] == 1, "fork: the parent counted one GEMM")

    # 5. scopes, step selection, weights
    def rounded_oracle(raw):
        """The rounded fingerprints of bfloat16 bytes by torch's casts (include/probe/dtype.h
        probe_rounding): XXH64 of the float8_e4m3fn codes, plain and with the amax scale."""
        import torch
        t = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float()
        amax = t.abs().amax()
        codes = {"float8_e4m3fn": t.to(torch.float8_e4m3fn)}
        if torch.isfinite(amax):
            codes["float8_e4m3fn/amax"] = (t / (amax / 448.0 if amax > 0 else 1.0)).to(torch.float8_e4m3fn)
        return {k: "%016x" % xxh64(v.view(torch.uint8).numpy().tobytes()) for k, v in codes.items()}

    def scope_run(name, capture=None, **env):
        out = os.path.join(d, name)
        extra = dict(env)
        if capture:
            extra["PROBE_CAPTURE"] = capture
        r = run(args + ["scope"], preload_env(out, leaks=False, **extra))
        print(r.stdout, r.stderr)
        check(r.returncode == 0 and probe_lines(r.stderr) == [],
              "scope run %s: rc 0, no probe: warnings (rc=%d)" % (name, r.returncode))
        return out

    s1 = scope_run("s1.h5", "*,*gemm*@step=1")
    with h5py.File(s1, "r") as f:
        got = set()
        f.visititems(lambda n, o: got.add("/" + n) if isinstance(o, h5py.Dataset) else None)
        want = {"/dit.step/0001/gemm.0000.%s" % o for o in ("a", "b", "bias", "out")} | \
               {"/dit.step/0001/gemm.%04d.%s" % (k, o) for k in (1, 2) for o in ("a", "b", "out")}
        check(got == want, "'*gemm*@step=1' captures exactly step 1's GEMM operands (got %s)" % sorted(got))
        if "/dit.step/0001/gemm.0000.out" in f:
            ds = f["/dit.step/0001/gemm.0000.out"]
            check(int(ds.attrs["probe.step"]) == 1 and int(ds.attrs["probe.cfg_branch"]) == 0 and
                  int(ds.attrs["probe.call"]) == 1, "scoped operand carries the scope's call/step/branch")
            op = json.loads(ds.attrs["probe.op"])
            check(op["operands"]["out"] == "gemm.0000.out", "scoped probe.op names slots gemm.0000.*")
    m1 = manifest(s1)
    sigs = m1["gemm"]["components"]
    check(sorted(sigs) == ["dit.step", "gemm"] and sum(x["count"] for x in sigs["dit.step"]) == 9,
          "manifest gemm: 9 calls under dit.step, 1 outside (%s)" % sorted(sigs))
    w = m1.get("weights", {}).get("components", {})
    ws = w.get("dit.step")
    if check(ws is not None and list(w) == ["dit.step"], "manifest weights: dit.step only (%s)" % list(w)):
        check(ws["gemms"] == 2 and ws["bytes"] == (24 + 30) * 2 and ws["dtypes"] == ["bfloat16"] and ws["complete"],
              "weights: 2 operands, 108 bytes, bfloat16 (%s)" % {k: ws[k] for k in ("gemms", "bytes", "dtypes")})
        ops_ = ws["operands"]
        check([(o["k"], o["shape"]) for o in ops_] == [(0, [6, 4]), (1, [5, 6])],
              "weights operands: k 0 [6, 4], k 1 [5, 6] (not the activation product k 2)")
        import struct
        rec = b"".join(struct.pack("<qi", o["k"], len(o["shape"])) + b"".join(struct.pack("<q", x) for x in o["shape"])
                       + struct.pack("<iQ", 11, int(o["xxh64"], 16)) for o in ops_)
        full = scope_run("s_full.h5", "*gemm*@step=0")
        with h5py.File(full, "r") as f:
            for o in ops_:
                h = f["/dit.step/0000/gemm.%04d.a" % o["k"]].attrs["probe.hash"]
                h = h.decode() if isinstance(h, bytes) else h
                raw = read_raw(f["/dit.step/0000/gemm.%04d.a" % o["k"]]).tobytes()
                check(h == o["xxh64"] == "%016x" % xxh64(raw),
                      "weights k %d: xxh64 equals the XXH64 of the captured bytes and their probe.hash" % o["k"])
                tw = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
                check(o.get("amax") == float(np.abs(tw.view(np.float32)).max()),
                      "weights k %d: amax %s = max |w|" % (o["k"], o.get("amax")))
                av = o.get("amax_variants") or []
                check(len(av) == 5 and av[0] == (o.get("rounded") or {}).get("float8_e4m3fn/amax"),
                      "weights k %d: 5 amax_variants, the first the amax rounding's (%s)" % (o["k"], av))
                check(o.get("rounded") == rounded_oracle(raw) and
                      o.get("levels") == (lambda n: n if n <= 256 else None)(len(set(np.frombuffer(raw, "<u2")))),
                      "weights k %d: levels and rounded fingerprints equal torch's float8_e4m3fn codes, "
                      "hashed (%s)" % (o["k"], o.get("rounded")))
        check("%016x" % xxh64(rec) == ws["xxh64"], "combined hash = XXH64 of the (k, rank, shape, "
              "dtype, xxh64) records (%s)" % ws["xxh64"])
        same = manifest(scope_run("s2.h5"))["weights"]["components"]["dit.step"]
        check(same["xxh64"] == ws["xxh64"], "same weights in another run: same combined hash")
        other = manifest(scope_run("s3.h5", SHIM_GEMM_SEED="1"))["weights"]["components"]["dit.step"]
        check(other["xxh64"] != ws["xxh64"] and other["operands"][0]["xxh64"] != ops_[0]["xxh64"],
              "different weights: different hashes")
        plain = manifest(scope_run("s5.h5", PROBE_WEIGHTS="hash"))["weights"]["components"]["dit.step"]
        check(plain["xxh64"] == ws["xxh64"] and
              all("rounded" not in o and "levels" not in o for o in plain["operands"]),
              "PROBE_WEIGHTS=hash: the same hashes, no rounded fingerprints")
    off = manifest(scope_run("s4.h5", PROBE_WEIGHTS="0"))
    check("weights" not in off, "PROBE_WEIGHTS=0: no weights key")

    # 5b. `gemm.last`: the last GEMM of each scope instance (docs/gemm.md
    # "Selection"). Blocks make 3, 3, 4, 3, 3 GEMMs inside one dit.step that
    # makes one GEMM before them and one after.
    out5 = os.path.join(d, "last.h5")
    r = run(args[:-1] + [d, "last"], preload_env(out5, leaks=False, PROBE_CAPTURE="*/gemm.last.*"))
    print(r.stdout, r.stderr)
    warn = probe_lines(r.stderr)
    check(r.returncode == 0, "last: rc 0 (rc=%d)" % r.returncode)
    check(len(warn) == 1 and "dit.block call 2 made 4 GEMMs, the instance before it 3" in warn[0],
          "last: one probe: line, naming the block whose count changed (%s)" % warn)
    # first instance of each component: whole; then the previous count - 1
    want_k = {("dit.step", 0): [0, 1], ("dit.block", 0): [0, 1, 2], ("dit.block", 1): [2],
              ("dit.block", 2): [2], ("dit.block", 4): [2]}
    want = {"/%s/%04d/gemm.%04d.%s" % (c, call, k, o)
            for (c, call), ks in want_k.items() for k in ks for o in ("a", "b", "out")}
    with h5py.File(out5, "r") as f:
        got = set()
        f.visititems(lambda n, o: got.add("/" + n) if isinstance(o, h5py.Dataset) else None)
        check(got == want, "last: captured exactly %s (got %s)" % (sorted(want), sorted(got)))
        for (c, call), ks in want_k.items():
            for k in ks:
                base = "/%s/%04d/gemm.%04d." % (c, call, k)
                if base + "out" not in f:
                    continue
                outv = f[base + "out"][()]
                ref = np.fromfile(os.path.join(d, "last.%s.%d.%d.out.bin" % (c, call, k)), dtype=np.float32)
                a = f[base + "a"][()].astype(np.float64)
                b = f[base + "b"][()].astype(np.float64)
                check(outv.shape == (2, 2) and a.shape == (3, 2) and b.shape == (2, 3) and
                      np.array_equal(outv.reshape(-1), ref) and np.allclose(b @ a, outv, rtol=1e-6, atol=0),
                      "last: %s holds GEMM %d of %s call %d (bytes as computed; out = b @ a in float64)"
                      % (base + "*", k, c, call))
    cl = manifest(out5).get("capture_last", {})
    check(cl.get("dit.block") == {"instances": 5, "first_call": 0,
                                  "gemm": {"n": 3, "mismatched": 2, "mismatched_calls": [2, 3]}},
          "manifest capture_last dit.block: 5 instances, calls 2 and 3 mismatched (%s)" % cl.get("dit.block"))
    check(cl.get("dit.step") == {"instances": 1, "first_call": 0,
                                 "gemm": {"n": 2, "mismatched": 0, "mismatched_calls": []}},
          "manifest capture_last dit.step: its own 2 GEMMs, not the blocks' (%s)" % cl.get("dit.step"))
    check("capture_last" not in manifest(s1), "no capture_last key when no item names .last")

    # 5c. @block=: operands of GEMMs inside nested scopes carry the scope's
    # parent and block index (probe_scope_v1.parent/.block) and are selected
    # by them; a scope of the first v1 size is not nested
    out6 = os.path.join(d, "blocks.h5")
    r = run(args[:-1] + [d, "blocks"], preload_env(out6, leaks=False, PROBE_CAPTURE="*gemm*@block=1-"))
    check(r.returncode == 0 and probe_lines(r.stderr) == [],
          "blocks: rc 0, no probe: line (rc=%d, %r)" % (r.returncode, probe_lines(r.stderr)))
    want = {"/dit.block/%04d/gemm.%04d.%s" % (c, k, o) for c in (1, 2) for k in (0, 1) for o in ("a", "b", "out")}
    with h5py.File(out6, "r") as f:
        got = set()
        f.visititems(lambda n, o: got.add("/" + n) if isinstance(o, h5py.Dataset) else None)
        check(got == want, "blocks: '*gemm*@block=1-' captured exactly blocks 1 and 2's operands, "
              "not the dit.step's own GEMM nor the block without a parent (%s)" % sorted(got))
        for c in (1, 2):
            for o in ("a", "b", "out"):
                p = "/dit.block/%04d/gemm.0000.%s" % (c, o)
                if p not in f:
                    continue
                at = f[p].attrs
                check(attr_str(f[p], "probe.parent") == "/dit.step/0000" and int(at["probe.block"]) == c
                      and int(at["probe.step"]) == 2 and int(at["probe.cfg_branch"]) == 1
                      and int(at["probe.call"]) == c,
                      "blocks: %s carries parent /dit.step/0000, block %d, the dit.step's step 2 and "
                      "branch 1" % (p, c))
                if o == "out":
                    ref = np.fromfile(os.path.join(d, "last.dit.block.%d.0.out.bin" % c), dtype=np.float32)
                    check(np.array_equal(f[p][()].reshape(-1), ref), "blocks: %s holds block %d's GEMM" % (p, c))
        # every block's weights: call 0 under "dit.block", block B > 0 of the first
        # dit.step call under "dit.block@block=B"; not the block without a parent
        wb = manifest(out6).get("weights", {}).get("components", {})
        check(sorted(wb) == ["dit.block", "dit.block@block=1", "dit.block@block=2"],
              "blocks: weights of block 0 (dit.block) and blocks 1, 2 by block index (%s)" % sorted(wb))
        for c in (1, 2):
            e = wb.get("dit.block@block=%d" % c, {})
            o = (e.get("operands") or [{}])[0]
            raw = read_raw(f["/dit.block/%04d/gemm.0001.a" % c]).tobytes()
            check(e.get("gemms") == 1 and o.get("k") == 1 and o.get("xxh64") == "%016x" % xxh64(raw),
                  "blocks: block %d's weight (GEMM k=1) hashed, equal to its captured operand (%s)" % (c, o))

    # 6. 4 threads x 100 GEMMs, each thread in its own scope instance
    out6 = os.path.join(d, "threads.h5")
    r = run(args[:-1] + [d, "threads"], preload_env(out6, leaks=False, PROBE_CAPTURE="*/gemm.*.out"))
    print(r.stdout, r.stderr)
    check(r.returncode == 0 and probe_lines(r.stderr) == [], "threads: rc 0, no probe: warnings")
    with h5py.File(out6, "r") as f:
        ok = True
        for t in range(4):
            want = np.fromfile(os.path.join(d, "thread%d.out.bin" % t), np.float32).reshape(2, 2)
            for i in range(100):
                p = "/worker/%04d/gemm.%04d.out" % (t, i)
                if p not in f or not np.array_equal(f[p][()], want) or int(f[p].attrs["probe.step"]) != t:
                    ok = False
                    print("bad", p)
                    break
        n = [0]
        f.visititems(lambda name, o: n.__setitem__(0, n[0] + isinstance(o, h5py.Dataset)))
        check(ok and n[0] == 400, "threads: 400 outs, /worker/<t>/gemm.0000..0099.out each thread t's result "
              "with step t (%d datasets)" % n[0])
    g = manifest(out6)["gemm"]
    w = g["components"].get("worker", [])
    check(g["total"] == 400 and len(w) == 1 and w[0]["count"] == 400,
          "threads: one signature counted 400 times under worker (%s)" % w)
    finish()


if __name__ == "__main__":
    main()
