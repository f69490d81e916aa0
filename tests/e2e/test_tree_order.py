#!/usr/bin/env python3
"""End-to-end: the canonical tree order (docs/file-format.md "Tree order")
against an independent oracle written here from the definition: a pure-Python
XXH64 (checked on the xxHash reference vectors) and the sums done with numpy
float64 scalars in the tree's order. libprobe's probe_summary_tree and
probe_tree_hash (through ctypes) must give the same bits: sum, sum_sq, counts,
min, max, abs_max and the tree hash, for every element type on the tree's
edges (no bytes, part of a piece, one piece, 32 and 33 pieces, 1025 pieces:
three levels), bool bytes other than 0/1, NaN/inf, -0/+0. A case built so
that the butterfly order and a plain sequential sum differ shows that the
check can tell orders apart. probe_file_summary of a full tensor read back
from a capture (more than one read chunk) gives the same bits, and the
probe_summary_compute sums equal probe_summary_tree's. Bad input: an unknown
dtype and NULL pointers are PROBE_EINVAL with a message."""
import ctypes
import os
import struct
import sys
import tempfile

import h5py
import numpy as np

from xxh64_oracle import xxh64  # pure Python, from the xxHash specification

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
np.seterr(over="ignore", invalid="ignore")  # random bytes overflow fp64 sums: part of the definition
LIB = ctypes.CDLL(os.path.join(BUILD, "lib", "libprobe.so"))
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


# ---- element types: probe's numbering (include/probe/dtype.h) and decoding ----
DT = {"bool": (1, 1), "int8": (2, 1), "int16": (3, 2), "int32": (4, 4), "int64": (5, 8),
      "uint8": (6, 1), "uint16": (7, 2), "uint32": (8, 4), "uint64": (9, 8),
      "float16": (10, 2), "bfloat16": (11, 2), "float32": (12, 4), "float64": (13, 8),
      "float8_e4m3fn": (14, 1), "float8_e5m2": (15, 1)}


def minifloat(b, ebits, mbits, bias, ieee):
    sign = -1.0 if (b >> (ebits + mbits)) & 1 else 1.0
    e, m = (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
    emax = (1 << ebits) - 1
    if e == emax and (ieee or m == (1 << mbits) - 1):
        return sign * np.inf if ieee and m == 0 else np.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / 2.0 ** mbits) * 2.0 ** (e - bias)


def decode(name, raw):
    if name == "bool":
        return [1.0 if b else 0.0 for b in raw]
    if name == "bfloat16":
        u = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
        return [float(v) for v in u.view(np.float32)]
    if name in ("float8_e4m3fn", "float8_e5m2"):
        args = (4, 3, 7, False) if name == "float8_e4m3fn" else (5, 2, 15, True)
        return [minifloat(b, *args) for b in raw]
    np_t = {"int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8", "uint8": "<u1",
            "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "float16": "<f2",
            "float32": "<f4", "float64": "<f8"}[name]
    a = np.frombuffer(raw, np_t)
    return [float(v) for v in a]  # int64/uint64: rounded to nearest, as C's conversion


def tree_oracle(name, raw):
    """(n_finite, nan, inf, min, max, abs_max, sum, sum_sq, tree hash) by the definition."""
    hashed = bytes(1 if b else 0 for b in raw) if name == "bool" else raw
    nodes = []  # level 0: (hash, nf, nan, inf, mn, mx, am, s, q)
    for at in range(0, len(raw), 256):
        piece = raw[at:at + 256]
        s = q = np.float64(0.0)
        nf = nn = ni = 0
        mn, mx, am = np.inf, -np.inf, 0.0
        for e in decode(name, piece):  # overflow to inf is part of the definition
            if np.isnan(e):
                nn += 1
            elif np.isinf(e):
                ni += 1
            else:
                e = np.float64(e)
                nf += 1
                s = s + e
                q = q + e * e
                if e < mn or (e == mn and np.signbit(e) and not np.signbit(mn)):
                    mn = e
                if e > mx or (e == mx and not np.signbit(e) and np.signbit(mx)):
                    mx = e
                am = max(am, abs(e))
        nodes.append((xxh64(hashed[at:at + 256], 0), nf, nn, ni, mn, mx, am, s, q))
    level = 0
    while len(nodes) > 1:
        level += 1
        up = []
        for j in range(0, len(nodes), 32):
            kids = nodes[j:j + 32]
            vs = [k[7] for k in kids] + [np.float64(0.0)] * (32 - len(kids))
            vq = [k[8] for k in kids] + [np.float64(0.0)] * (32 - len(kids))
            off = 16
            while off:
                for i in range(off):
                    vs[i] = vs[i] + vs[i + off]
                    vq[i] = vq[i] + vq[i + off]
                off //= 2
            mn, mx = np.inf, -np.inf
            for k in kids:
                if k[4] < mn or (k[4] == mn and np.signbit(k[4]) and not np.signbit(mn)):
                    mn = k[4]
                if k[5] > mx or (k[5] == mx and not np.signbit(k[5]) and np.signbit(mx)):
                    mx = k[5]
            h = xxh64(b"".join(struct.pack("<Q", k[0]) for k in kids), level)
            up.append((h, sum(k[1] for k in kids), sum(k[2] for k in kids),
                       sum(k[3] for k in kids), mn, mx, max(k[6] for k in kids), vs[0], vq[0]))
        nodes = up
    if nodes:
        root = nodes[0]
    else:
        root = (xxh64(b"", 0), 0, 0, 0, np.inf, -np.inf, 0.0, np.float64(0.0), np.float64(0.0))
    th = xxh64(struct.pack("<QQ", root[0], len(raw)), 0)
    nf = root[1]
    mn, mx, am = (root[4], root[5], root[6]) if nf else (np.nan, np.nan, np.nan)
    return (nf, root[2], root[3], mn, mx, am, root[7], root[8], th)


class Summary(ctypes.Structure):
    _fields_ = [("n", ctypes.c_uint64), ("n_finite", ctypes.c_uint64), ("nan", ctypes.c_uint64),
                ("inf", ctypes.c_uint64), ("min", ctypes.c_double), ("max", ctypes.c_double),
                ("abs_max", ctypes.c_double), ("sum", ctypes.c_double),
                ("sum_sq", ctypes.c_double)]


LIB.probe_summary_tree.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.POINTER(Summary), ctypes.POINTER(ctypes.c_uint64)]
LIB.probe_summary_compute.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.POINTER(Summary)]
LIB.probe_tree_hash.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
LIB.probe_tree_hash.restype = ctypes.c_uint64
LIB.probe_last_error.restype = ctypes.c_char_p


def bits(x):
    return struct.pack("<d", float(x))


def same(a, b):
    return bits(a) == bits(b) or (np.isnan(a) and np.isnan(b))


def library(name, raw):
    code, size = DT[name]
    buf = ctypes.create_string_buffer(raw, len(raw) or 1)
    s, h = Summary(), ctypes.c_uint64(0)
    st = LIB.probe_summary_tree(code, buf, len(raw) // size, ctypes.byref(s), ctypes.byref(h))
    return st, s, h.value, buf


def compare(label, name, raw):
    st, s, h, buf = library(name, raw)
    want = tree_oracle(name, raw)
    got = (s.n_finite, s.nan, s.inf, s.min, s.max, s.abs_max, s.sum, s.sum_sq, h)
    ok = st == 0 and s.n == len(raw) // DT[name][1] and got[:3] == want[:3] and \
        all(same(a, b) for a, b in zip(got[3:8], want[3:8])) and got[8] == want[8]
    hashed = bytes(1 if b else 0 for b in raw) if name == "bool" else raw
    hb = ctypes.create_string_buffer(hashed, len(hashed) or 1)
    ok = ok and LIB.probe_tree_hash(hb, len(hashed)) == want[8]
    c = Summary()
    ok = ok and LIB.probe_summary_compute(DT[name][0], buf, len(raw) // DT[name][1],
                                          ctypes.byref(c)) == 0 and \
        same(c.sum, s.sum) and same(c.sum_sq, s.sum_sq)
    check(ok, "%s: %s (%d bytes): library %s, oracle %s" % (label, name, len(raw), got, want))


rng = np.random.default_rng(7)
sizes = [0, 8, 104, 256, 264, 8192, 8200, 1025 * 256]
for name in DT:
    for nb in sizes:
        if name not in ("bfloat16", "float32", "uint8") and nb == sizes[-1]:
            continue  # the three-level case for three types (the oracle is slow)
        raw = rng.integers(0, 256, nb, dtype=np.uint8).tobytes()
        compare("random bytes", name, raw)

# -0 and +0, NaN and inf in one piece; every value -0 (the sum stays +0)
compare("signed zeros", "float32", np.array([0.0, -0.0, 1.5, -0.0, np.nan, -np.inf, 2.0],
                                            dtype="<f4").tobytes())
compare("all -0", "float64", np.full(70, -0.0, dtype="<f8").tobytes())

# the butterfly's order changes the sum: 33 pieces of float64, piece p holding
# 1e16 at its start when p is even and -1e16 when odd, and 1.0 elsewhere
x = np.ones(33 * 32, dtype="<f8")
for p in range(33):
    x[32 * p] = 1e16 if p % 2 == 0 else -1e16
st, s, h, _ = library("float64", x.tobytes())
seq = np.float64(0.0)
for v in x:
    seq = seq + v
check(st == 0 and not same(s.sum, seq) and same(s.sum, tree_oracle("float64", x.tobytes())[6]),
      "the tree order is not the sequential order: tree %r, sequential %r" % (s.sum, float(seq)))

# probe_file_summary of a full tensor read back (3 x 2^20 + 5 elements of
# float32: more than one read chunk) gives probe_summary_tree's bits
with tempfile.TemporaryDirectory() as tmp:
    n = 3 * (1 << 20) + 5
    raw = rng.integers(0, 256, 4 * n, dtype=np.uint8).tobytes()
    path = os.path.join(tmp, "c.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("/dit.step/0000/out", data=np.frombuffer(raw, "<f4"))
    LIB.probe_file_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    LIB.probe_file_summary.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(Summary)]
    LIB.probe_file_close.argtypes = [ctypes.c_void_p]
    fh = ctypes.c_void_p()
    st = LIB.probe_file_open(path.encode(), ctypes.byref(fh))
    fs = Summary()
    st2 = LIB.probe_file_summary(fh, 0, ctypes.byref(fs)) if st == 0 else -1
    if st == 0:
        LIB.probe_file_close(fh)
    st3, s, h, _ = library("float32", raw)
    check(st == 0 and st2 == 0 and st3 == 0 and bytes(fs) == bytes(s),
          "probe_file_summary of %d float32 read back (status %d/%d; %s) is probe_summary_tree's"
          % (n, st, st2, LIB.probe_last_error()))

# bad input
s, h = Summary(), ctypes.c_uint64(5)
st = LIB.probe_summary_tree(99, None, 0, ctypes.byref(s), ctypes.byref(h))
check(st != 0 and b"unknown element type" in LIB.probe_last_error() and h.value == 0,
      "an unknown element type: refused (%s)" % LIB.probe_last_error())
st = LIB.probe_summary_tree(12, None, 4, ctypes.byref(s), None)
check(st != 0 and b"x is NULL" in LIB.probe_last_error(), "x NULL with n > 0: refused")
st = LIB.probe_summary_tree(12, None, 0, None, None)
check(st != 0 and b"out is NULL" in LIB.probe_last_error(), "out NULL: refused")

if failures:
    print("%d checks failed" % len(failures))
    sys.exit(1)
print("all checks passed")
