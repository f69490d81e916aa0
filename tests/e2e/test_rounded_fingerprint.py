"""probe_rounded_fingerprint_compute (include/probe/capture.h, docs/gemm.md
"Quantized from the same weights") against torch, the oracle: the codes of
each rounding are computed by torch's own casts, hashed by libxxhash itself,
and compared with libprobe's fingerprints.

Checked:
- float8_e4m3fn: every one of the 65536 bfloat16 and float16 bit patterns
  (inf, NaN, subnormals, values past 448 and 480 included), the same patterns
  in a short tensor (the element-by-element path), and float32 values around
  every rounding boundary and tie of the format plus random ones;
- float8_e4m3fn/amax: torch's recipe scale = amax(|x|) / 448 (float32),
  (x.float() / scale).to(float8_e4m3fn), on random bfloat16/float16/float32
  weights of both paths, and the codes of the five scale conventions
  (amax_variants) against torch computing each; an all-zero tensor is the cast (scale 1); a tensor
  holding inf or NaN has no amax fingerprint;
- the fingerprints of W, of W stored in float8 and cast back (layerwise
  casting) and of W quantized with the amax scale and dequantized in
  bfloat16 (an FP8 GEMM's weight): the cast's codes agree for the first pair,
  the amax codes for the second; levels <= 256 for both quantized tensors,
  -1 for W; different weights give different codes; the amax codes of 2W
  equal W's (the documented blind spot of a per-tensor scale);
- levels: the number of distinct bit patterns (torch.unique), -1 above 256,
  0 for an empty tensor; amax = torch's abs().amax(), NaN/inf when present;
- bad input: an integer type, NULL data with elements, NULL out -> PROBE_EINVAL
  with a message, out cleared.
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import check, finish, need_torch_float8  # noqa: E402

need_torch_float8()
import torch  # noqa: E402

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
lib = ctypes.CDLL(os.path.join(BUILD, "lib", "libprobe.so"))
xxh = ctypes.CDLL("libxxhash.so.0")  # libxxhash itself, not probe's use of it
xxh.XXH64.restype = ctypes.c_uint64
xxh.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]


class FP(ctypes.Structure):
    _fields_ = [("levels", ctypes.c_int), ("amax", ctypes.c_float), ("valid", ctypes.c_uint),
                ("xxh64", ctypes.c_uint64 * 2), ("amax_variants", ctypes.c_uint64 * 5)]


lib.probe_rounded_fingerprint_compute.restype = ctypes.c_int
lib.probe_rounded_fingerprint_compute.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                                  ctypes.POINTER(FP)]
lib.probe_last_error.restype = ctypes.c_char_p
lib.probe_rounding_name.restype = ctypes.c_char_p
DT = {torch.bfloat16: 11, torch.float16: 10, torch.float32: 12}  # probe_dtype values
ITYPE = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def dtype_codes():
    """probe_dtype numbers from the library's own names, so DT above is checked."""
    lib.probe_dtype_name.restype = ctypes.c_char_p
    return {lib.probe_dtype_name(v).decode(): v for v in range(0, 20)}


def fingerprint(t):
    t = t.contiguous()
    fp = FP()
    st = lib.probe_rounded_fingerprint_compute(DT[t.dtype], t.data_ptr(), t.numel(),
                                               ctypes.byref(fp))
    assert st == 0, lib.probe_last_error()
    return fp


def codes_hash(codes):
    b = codes.contiguous().view(torch.uint8).numpy().tobytes()
    return xxh.XXH64(b, len(b), 0)


def cast_codes(t):
    return t.float().to(torch.float8_e4m3fn)


def amax_codes(t):
    tf = t.float()
    scale = tf.abs().amax() / 448.0
    return (tf / scale).to(torch.float8_e4m3fn)


def amax_variant_codes(t):
    """The amax codes under the four float32 scale conventions of
    include/probe/capture.h, each written as torch code would compute it."""
    tf = t.float()
    amax = tf.abs().amax()
    s0 = amax / torch.tensor(448.0)
    s1 = amax * torch.tensor(1 / 448, dtype=torch.float32)
    r2 = torch.tensor(448.0) / amax
    r3 = torch.reciprocal(amax) * 448.0
    r4 = torch.tensor(1.0) / s0
    return [(tf / s0).to(torch.float8_e4m3fn), (tf / s1).to(torch.float8_e4m3fn),
            (tf * r2).to(torch.float8_e4m3fn), (tf * r3).to(torch.float8_e4m3fn),
            (tf * r4).to(torch.float8_e4m3fn)]


def levels(t):
    n = torch.unique(t.contiguous().view(ITYPE[t.dtype])).numel()
    return n if n <= 256 else -1


def all_patterns(dtype):
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)


names = dtype_codes()
check(all(names.get(str(t).split(".")[1]) == v for t, v in DT.items()),
      "probe_dtype numbers of bfloat16, float16, float32 (%s)" % names)
check(lib.probe_rounding_name(0) == b"float8_e4m3fn" and
      lib.probe_rounding_name(1) == b"float8_e4m3fn/amax" and lib.probe_rounding_name(2) is None,
      "rounding names")

# --- the cast over every 16-bit pattern, both paths ---
for dtype in (torch.bfloat16, torch.float16):
    t = all_patterns(dtype)
    fp = fingerprint(t)
    check(fp.valid & 1 and fp.xxh64[0] == codes_hash(cast_codes(t)),
          "float8_e4m3fn codes of all 65536 %s patterns equal torch's" % dtype)
    check(not fp.valid & 2, "a tensor with inf/NaN has no amax fingerprint (%s)" % dtype)
    check(fp.levels == -1, "levels of 65536 distinct patterns: -1")
    # the element-by-element path: pieces below the table threshold
    for lo in range(0, 65536, 8192):
        piece = t[lo:lo + 8192]
        f2 = fingerprint(piece)
        if f2.xxh64[0] != codes_hash(cast_codes(piece)):
            check(False, "element path: %s patterns %d.. equal torch's" % (dtype, lo))
            break
    else:
        check(True, "element path: %s patterns in 8 pieces of 8192 equal torch's" % dtype)

# --- float32: boundaries and ties of e4m3fn, then random values ---
vals = []
for e in range(-12, 10):
    for m in range(16):  # every half step between e4m3 values of this binade, and 1 ulp around
        x = (1 + m / 16) * 2.0 ** e
        for d in (-1, 0, 1):
            vals.append(x)
            vals.append(-x)
vals = torch.tensor(vals, dtype=torch.float64).float()
vals = torch.cat([vals, vals.view(torch.int32).add(1).view(torch.float32),
                  vals.view(torch.int32).sub(1).view(torch.float32),
                  torch.tensor([0.0, -0.0, 448.0, 464.0, 479.99, 480.0, 1e30,
                                float("inf"), float("-inf"), float("nan"), 2.0 ** -9, 2.0 ** -10,
                                3 * 2.0 ** -11, 2.0 ** -7 * 1.0625])])
fp = fingerprint(vals)
check(fp.xxh64[0] == codes_hash(cast_codes(vals)),
      "float32 around every e4m3 boundary and tie (%d values) equal torch's cast" % vals.numel())
gen = torch.Generator().manual_seed(7)
r32 = torch.randn(300000, generator=gen) * 0.05
check(fingerprint(r32).xxh64[0] == codes_hash(cast_codes(r32)), "300000 random float32: cast")

# --- the amax recipe ---
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for n in (5000, 200000):  # element path, table path (16-bit)
        w = (torch.randn(n, generator=gen) * 0.02).to(dtype)
        fp = fingerprint(w)
        check(fp.valid == 3 and fp.xxh64[1] == codes_hash(amax_codes(w)) and
              fp.xxh64[0] == codes_hash(cast_codes(w)),
              "amax and cast codes of %d random %s equal torch's" % (n, dtype))
        want = [codes_hash(c) for c in amax_variant_codes(w)]
        check(list(fp.amax_variants) == want and fp.amax_variants[0] == fp.xxh64[1],
              "amax codes of %d random %s under the 5 scale conventions equal torch's (%d distinct)"
              % (n, dtype, len(set(want))))
        check(fp.levels == levels(w), "levels of %d random %s: %d" % (n, dtype, fp.levels))
        check(fp.amax == w.float().abs().amax().item(), "amax of %d random %s" % (n, dtype))
# a weight on which the conventions disagree (found by search: thousands of codes differ)
gw = torch.Generator().manual_seed(1)
wc = (torch.randn(1536 * 1536, generator=gw) * 0.02).to(torch.bfloat16)
fc = fingerprint(wc)
want = [codes_hash(c) for c in amax_variant_codes(wc)]
check(list(fc.amax_variants) == want and len(set(want)) >= 2,
      "a weight whose scale conventions disagree: 5 variants equal torch's, %d distinct" % len(set(want)))
# tensors of 2^22 elements or more are fingerprinted by several threads (rounded.c PARALLEL):
# the same codes, levels and amax as torch's, with the largest value and the only NaN in the
# last slice of the six
big_n = (1 << 22) + 12345
for dtype in (torch.bfloat16, torch.float16):
    wb = (torch.randn(big_n, generator=gw) * 0.02).to(dtype)
    wb[-3] = 0.5
    fb = fingerprint(wb)
    want = [codes_hash(c) for c in amax_variant_codes(wb)]
    check(fb.valid == 3 and fb.xxh64[0] == codes_hash(cast_codes(wb)) and
          list(fb.amax_variants) == want and fb.amax == 0.5 and fb.levels == levels(wb),
          "%d random %s (threads): cast and 5 amax codes equal torch's, amax 0.5 from the last slice"
          % (big_n, dtype))
    q = wb.to(torch.float8_e4m3fn).to(dtype)
    fq = fingerprint(q)
    check(fq.levels == levels(q) and 0 < fq.levels <= 256 and fq.xxh64[0] == codes_hash(cast_codes(q)),
          "%d float8-rounded %s (threads): %d levels, cast codes equal torch's" % (big_n, dtype, fq.levels))
    wb[-1] = float("nan")
    fn = fingerprint(wb)
    check(fn.valid == 1 and fn.amax != fn.amax and fn.xxh64[0] == codes_hash(cast_codes(wb)),
          "%d %s with a NaN in the last slice (threads): no amax fingerprint, cast codes equal torch's"
          % (big_n, dtype))
z = torch.zeros(70000, dtype=torch.bfloat16)
fz = fingerprint(z)
check(fz.valid == 3 and fz.xxh64[1] == fz.xxh64[0] == codes_hash(cast_codes(z)) and fz.levels == 1,
      "all zeros: amax fingerprint is the cast's, 1 level")
nan = torch.full((20000,), 0.5, dtype=torch.bfloat16)
nan[123] = float("nan")
fnan = fingerprint(nan)
check(fnan.valid == 1 and fnan.amax != fnan.amax, "a NaN: no amax fingerprint, amax NaN")
inf = torch.full((300,), 0.5, dtype=torch.float16)
inf[7] = float("-inf")
finf = fingerprint(inf)
check(finf.valid == 1 and finf.amax == float("inf"), "an infinity: no amax fingerprint, amax inf")
fe = FP()
check(lib.probe_rounded_fingerprint_compute(11, None, 0, ctypes.byref(fe)) == 0 and
      fe.levels == 0 and fe.amax == 0 and fe.xxh64[0] == xxh.XXH64(b"", 0, 0), "empty tensor: 0 levels, XXH64 of nothing")

# --- what the comparison relies on ---
W = (torch.randn(1536, 1536, generator=gen) * 0.02).to(torch.bfloat16)
Wstore = W.to(torch.float8_e4m3fn).to(torch.bfloat16)             # layerwise casting
scale = W.float().abs().amax() / 448.0
Wdq = ((W.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(torch.bfloat16)  # FP8 GEMM
Wother = (torch.randn(1536, 1536, generator=gen) * 0.02).to(torch.bfloat16)
Wnudge = (W.float() * 1.01).to(torch.bfloat16)
fw, fs, fd, fo, fn = (fingerprint(x) for x in (W, Wstore, Wdq, Wother, Wnudge))
check(fw.levels == -1 and 0 < fs.levels <= 256 and 0 < fd.levels <= 256,
      "levels: W -1, stored-in-float8 %d, dequantized %d" % (fs.levels, fd.levels))
check(fs.xxh64[0] == fw.xxh64[0], "layerwise casting: the cast codes of W and of W stored in float8 agree")
check(fd.xxh64[1] == fw.xxh64[1], "FP8 GEMM weight: the amax codes of W and of its dequantized bf16 agree")
check(fd.xxh64[0] != fw.xxh64[0] and fs.xxh64[1] != fw.xxh64[1],
      "each quantization agrees in its own rounding only")
check(fo.xxh64[0] != fw.xxh64[0] and fo.xxh64[1] != fw.xxh64[1],
      "different weights: different codes in both roundings")
check(fn.xxh64[0] != fw.xxh64[0], "W scaled by 1.01: the cast codes differ")
f2 = fingerprint((W.float() * 2).to(torch.bfloat16))
check(f2.xxh64[1] == fw.xxh64[1] and f2.xxh64[0] != fw.xxh64[0],
      "the amax codes do not see a power-of-two scale of the whole tensor; the cast codes do")

# --- bad input ---
fb = FP(5, 1.0, 3, (ctypes.c_uint64 * 2)(1, 2), (ctypes.c_uint64 * 5)(1, 2, 3, 4, 5))
buf = ctypes.create_string_buffer(8)
st = lib.probe_rounded_fingerprint_compute(6, buf, 2, ctypes.byref(fb))  # int32
check(st != 0 and b"not bfloat16, float16 or float32" in lib.probe_last_error() and fb.valid == 0,
      "an integer type: error, out cleared (%s)" % lib.probe_last_error().decode())
st = lib.probe_rounded_fingerprint_compute(11, None, 4, ctypes.byref(fb))
check(st != 0 and b"NULL" in lib.probe_last_error(), "NULL data with elements: error")
check(lib.probe_rounded_fingerprint_compute(11, buf, 2, None) != 0, "NULL out: error")
finish()
