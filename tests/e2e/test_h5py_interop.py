#!/usr/bin/env python3
"""The capture file as other tools see it (docs/file-format.md).

(a) tests/tools/capture_write_all writes one tensor of every probe element
    type with known values; h5py must read the values and attributes exactly
    as documented, and h5dump must accept the file and print the bfloat16
    values.
(b) h5py writes float16/32/64 (also big-endian), int8..64, uint8..64, bool,
    a chunked+gzip dataset, nested groups, a 0-d and an empty dataset, a
    string and a compound dataset; tests/tools/capture_dump prints what the
    probe reader sees, which must equal numpy's values exactly, with the
    string and compound datasets counted as ignored.
(c) unreadable inputs give the documented one-line errors.

Expected values come from numpy/torch and from the bit patterns, and hashes
from an XXH64 written here from the specification. Exit 0 = pass.
Finds the build through PROBE_BUILD_DIR (tools in $PROBE_BUILD_DIR/tests).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from xxh64_oracle import xxh64  # pure Python, from the xxHash specification

BUILD = os.environ.get("PROBE_BUILD_DIR")
if not BUILD:
    sys.exit("PROBE_BUILD_DIR is not set")
WRITE_ALL = os.path.join(BUILD, "tests", "capture_write_all")
DUMP = os.path.join(BUILD, "tests", "capture_dump")
CHECKS = 0


def check(cond, what):
    global CHECKS
    if not cond:
        raise AssertionError(what)
    CHECKS += 1


# --- FP8 decoders (OCP 8-bit floating point specification v1.0) --------------
def e4m3fn(b):
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    v = math.nan if (e == 15 and m == 7) else (math.ldexp(m, -9) if e == 0 else math.ldexp(8 + m, e - 10))
    return -v if s else v


def e5m2(b):
    s, e, m = b >> 7, (b >> 2) & 31, b & 3
    if e == 31:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(m, -16) if e == 0 else math.ldexp(4 + m, e - 17)
    return -v if s else v


def same(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


# --- (a) probe writes, h5py and h5dump read ----------------------------------
# The table of tools/capture_write_all.c: slot -> (probe dtype, shape, stored
# little-endian bytes, numpy dtype h5py must report)
BF16 = [0x3f80, 0xc020, 0x4049, 0x7e96, 0x0001, 0x7f80, 0xff80, 0x7fc0, 0x8000, 0x7f7f]
TABLE = {
    "float32": ("float32", (2, 3), np.array([0x3f800000, 0xc0200000, 0x40490fdb, 0x00000001, 0x7f800000, 0x7fc00000],
                                           "<u4").tobytes(), np.dtype("<f4")),
    "float64": ("float64", (6,), np.array([0x3fb999999999999a, 0xfe37e43c8800759c, 0x1, 0x8000000000000000,
                                          0x7ff0000000000000, 0x7ff8000000000000], "<u8").tobytes(), np.dtype("<f8")),
    "float16": ("float16", (2, 4), np.array([0x3c00, 0xc100, 0x0001, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x8000],
                                           "<u2").tobytes(), np.dtype("<f2")),
    "bfloat16": ("bfloat16", (10,), np.array(BF16, "<u2").tobytes(), np.dtype("<f4")),
    "float8_e4m3fn": ("float8_e4m3fn", (16, 16), bytes(range(256)), np.dtype("u1")),
    "float8_e5m2": ("float8_e5m2", (16, 16), bytes(range(256)), np.dtype("u1")),
    "int8": ("int8", (5,), np.array([-128, -1, 0, 1, 127], "<i1").tobytes(), np.dtype("i1")),
    "int16": ("int16", (5,), np.array([-32768, -1, 0, 1, 32767], "<i2").tobytes(), np.dtype("<i2")),
    "int32": ("int32", (5,), np.array([-2**31, -1, 0, 1, 2**31 - 1], "<i4").tobytes(), np.dtype("<i4")),
    "int64": ("int64", (5,), np.array([-2**63, -1, 0, 1, 2**63 - 1], "<i8").tobytes(), np.dtype("<i8")),
    "uint8": ("uint8", (5,), np.array([0, 1, 127, 128, 255], "u1").tobytes(), np.dtype("u1")),
    "uint16": ("uint16", (5,), np.array([0, 1, 32767, 32768, 65535], "<u2").tobytes(), np.dtype("<u2")),
    "uint32": ("uint32", (5,), np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 1], "<u4").tobytes(), np.dtype("<u4")),
    "uint64": ("uint64", (5,), np.array([0, 1, 2**53 + 1, 2**63, 2**64 - 1], "<u8").tobytes(), np.dtype("<u8")),
    "bool": ("bool", (5,), bytes([1, 0, 1, 1, 0]), np.dtype("bool")),  # written as 1,0,2,255,0
    "scalar": ("float32", (), np.array([42.5], "<f4").tobytes(), np.dtype("<f4")),
    "empty": ("float32", (0, 3), b"", np.dtype("<f4")),
}


def part_a(tmp):
    path = os.path.join(tmp, "all.h5")
    r = subprocess.run([WRITE_ALL, path], capture_output=True, text=True)
    check(r.returncode == 0, f"capture_write_all failed: {r.stderr}")
    with h5py.File(path, "r") as f:
        check(f.attrs["probe.format"] == "probe-capture" and isinstance(f.attrs["probe.format"], str),
              "root probe.format is the str 'probe-capture'")
        check(int(f.attrs["probe.version"]) == 1, "root probe.version == 1")
        check(json.loads(f.attrs["probe.manifest"]) == {"label": "all", "argv": ["capture_write_all"]},
              "root probe.manifest is the JSON given")
        check(json.loads(f.attrs["probe.skips"]) ==
              [{"path": "/all/0000/skipped", "reason": "stream capturing a CUDA graph"}], "root probe.skips")
        names = sorted(f["all/0000"].keys())
        check(names == sorted(TABLE), f"datasets {names}")
        for seq, slot in enumerate(TABLE):
            dtype_name, shape, raw, np_dtype = TABLE[slot]
            d = f["all/0000/" + slot]
            v = d[()]
            check(d.dtype == np_dtype, f"{slot}: h5py dtype {d.dtype}, want {np_dtype}")
            check(d.shape == shape, f"{slot}: shape {d.shape}")
            a = d.attrs
            check(a["probe.dtype"] == dtype_name and isinstance(a["probe.dtype"], str), f"{slot}: probe.dtype")
            check(a["probe.shape"].dtype == np.int64 and tuple(a["probe.shape"].tolist()) == shape,
                  f"{slot}: probe.shape {a['probe.shape']!r}")
            for key, want in (("probe.component", "all"), ("probe.slot", slot), ("probe.scope", "outer/inner"),
                              ("probe.device", "cpu")):
                check(a[key] == want and isinstance(a[key], str), f"{slot}: {key}")
            check(int(a["probe.call"]) == 0 and int(a["probe.step"]) == 3 and int(a["probe.cfg_branch"]) == 1,
                  f"{slot}: call/step/cfg_branch")
            check(float(a["probe.timestep"]) == 999.5, f"{slot}: timestep")
            check(int(a["probe.seq"]) == seq, f"{slot}: seq")
            check(a["probe.hash"] == format(xxh64(raw), "016x"), f"{slot}: probe.hash is xxh64 of the stored bytes")
            # values
            if slot == "bfloat16":
                want = np.array(BF16, "<u4") << 16
                got = np.asarray(v, "<f4").view("<u4")
                for k, (g, w) in enumerate(zip(got.tolist(), want.tolist())):
                    if (w & 0x7f800000) == 0x7f800000 and (w & 0x007fffff):
                        check(math.isnan(v[k]), f"bfloat16[{k}] is NaN")
                    else:
                        check(g == w, f"bfloat16[{k}]: float32 bits {g:08x}, want {w:08x}")
                try:
                    import torch
                    ref = torch.tensor(np.array(BF16, "<u2").view("<i2")).view(torch.bfloat16).float().numpy()
                    check(all(same(float(x), float(y)) for x, y in zip(v, ref)),
                          "bfloat16 values equal torch's bfloat16 -> float32")
                except ImportError:
                    pass
            elif slot == "bool":
                check(v.tolist() == [True, False, True, True, False], "bool values (nonzero stored as TRUE)")
            else:
                check(np.ascontiguousarray(v).tobytes() == raw, f"{slot}: bytes equal the bytes written")
        fp8 = f["all/0000/float8_e4m3fn"][()].reshape(-1).tolist()
        check(fp8 == list(range(256)), "fp8 stored as the raw encodings 0..255")

    r = subprocess.run(["h5dump", path], capture_output=True, text=True)
    check(r.returncode == 0, f"h5dump exits 0 ({r.stderr})")
    bf = subprocess.run(["h5dump", "-d", "/all/0000/bfloat16", path], capture_output=True, text=True).stdout
    check("16-bit little-endian floating-point 16-bit precision" in bf, "h5dump names the bfloat16 type")
    check("1, -2.5, 3.14062, 9.96921e+37, 9.18355e-41, inf, -inf, nan, -0" in bf,
          "h5dump prints the bfloat16 values (%g)")
    bf9 = subprocess.run(["h5dump", "-m", "%.9g", "-d", "/all/0000/bfloat16", path], capture_output=True,
                         text=True).stdout
    check("(2): 3.140625," in bf9 and "(9): 3.38953139e+38" in bf9, "h5dump -m %.9g prints 3.140625")
    print(f"(a) probe writer -> h5py/h5dump: {len(TABLE)} tensors, values and attributes as documented")

    # the probe reader reads its own file back (every fp8 code decoded)
    dump = parse_dump(path)
    check(dump["ignored"] == 0, "no ignored datasets in a probe file")
    e4 = dump["tensors"]["/all/0000/float8_e4m3fn"]["values"]
    e5 = dump["tensors"]["/all/0000/float8_e5m2"]["values"]
    check(all(same(e4[b], e4m3fn(b)) for b in range(256)), "reader decodes every float8_e4m3fn code")
    check(all(same(e5[b], e5m2(b)) for b in range(256)), "reader decodes every float8_e5m2 code")
    check([t["path"] for t in dump["order"]] == ["/all/0000/" + s for s in TABLE], "reader order = probe.seq")
    check(dump["skips"] == [("/all/0000/skipped", "stream capturing a CUDA graph")], "reader skips")
    return path


# --- (b) h5py writes, the probe reader reads ----------------------------------
def parse_dump(path):
    r = subprocess.run([DUMP, path], capture_output=True, text=True)
    check(r.returncode == 0, f"capture_dump {path}: {r.stderr}")
    out = {"tensors": {}, "order": [], "skips": [], "ignored": None, "manifest": None}
    for line in r.stdout.splitlines():
        f = line.split("\t")
        if f[0] == "tensor":
            shape = tuple(int(x) for x in f[3].split(",")) if f[3] else ()
            t = {"path": f[1], "dtype": f[2], "shape": shape, "n": int(f[4]), "seq": int(f[5]),
                 "values": [float(x) for x in f[8].split()] if f[8] else []}
            out["tensors"][f[1]] = t
            out["order"].append(t)
        elif f[0] == "raw":
            out["tensors"][f[1]]["raw"] = bytes.fromhex(f[2])
        elif f[0] == "ignored":
            out["ignored"] = int(f[1])
        elif f[0] == "skip":
            out["skips"].append((f[1], f[2]))
        elif f[0] == "manifest":
            out["manifest"] = f[1]
    return out


NP_TO_PROBE = {"f2": "float16", "f4": "float32", "f8": "float64", "i1": "int8", "i2": "int16", "i4": "int32",
               "i8": "int64", "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64", "b1": "bool"}


def part_b(tmp):
    path = os.path.join(tmp, "h5py.h5")
    rng = np.random.default_rng(2024)
    data = {}
    special = [0.0, -0.0, 1.0, -2.5, math.inf, -math.inf, math.nan]
    data["/float/f2"] = np.array(special + [6e-8, 65504, 1e-5], "<f2")
    data["/float/f4"] = np.concatenate([np.array(special + [1e-45, 3.4e38], "<f4"),
                                        rng.standard_normal(48).astype("<f4")]).reshape(3, 19)
    data["/float/f8"] = np.concatenate([np.array(special + [5e-324, 1.7e308]), rng.standard_normal(41)])
    data["/float/f4_big_endian"] = rng.standard_normal((4, 5)).astype(">f4")
    data["/float/f8_big_endian"] = np.array([0.1, -1e300, math.nan], ">f8")
    for bits in (8, 16, 32, 64):
        for kind in "iu":
            dt = np.dtype(f"<{kind}{bits // 8}")
            info = np.iinfo(dt)
            vals = [info.min, info.max, 0, 1] + rng.integers(info.min, info.max, 12, dtype=dt, endpoint=True).tolist()
            data[f"/int/{kind}{bits}"] = np.array(vals, dt)
    data["/int/i4_big_endian"] = np.array([-5, 7, 2**31 - 1], ">i4")
    data["/int/u8_beyond_2_53"] = np.array([2**53 + 1, 2**63 + 1, 2**64 - 1], "<u8")
    data["/bool"] = np.array([[True, False, True], [False, False, True]])
    data["/a/b/c/deep"] = np.arange(24, dtype="<f8").reshape(2, 3, 4) / 7.0
    data["/zero_d"] = np.array(3.25, "<f8")
    data["/empty"] = np.zeros((0, 4), "<f4")
    with h5py.File(path, "w") as f:
        for p, v in data.items():
            f.create_dataset(p, data=v)
        gz = rng.standard_normal((64, 33)).astype("<f4")
        f.create_dataset("/chunked/gzip", data=gz, chunks=(16, 8), compression="gzip", compression_opts=4)
        data["/chunked/gzip"] = gz
        f.create_dataset("/text", data=np.array(["alpha", "beta"], dtype=h5py.string_dtype()))
        f.create_dataset("/compound", data=np.array([(1, 2.0), (3, 4.0)], dtype=[("a", "<i4"), ("b", "<f8")]))
        # storage layouts other than allocated contiguous: compact (elements in
        # the object header) and contiguous never written (the fill value)
        cv = rng.standard_normal((3, 4)).astype("<f4")
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        f.require_group("/layout")
        ds = h5py.h5d.create(f.id, b"/layout/compact", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple(cv.shape),
                             dcpl=dcpl)
        ds.write(h5py.h5s.ALL, h5py.h5s.ALL, cv)
        data["/layout/compact"] = cv
        f.create_dataset("/layout/unwritten", shape=(2, 3), dtype="<f4", fillvalue=7.5)
        data["/layout/unwritten"] = np.full((2, 3), 7.5, "<f4")
        f["/soft_link"] = h5py.SoftLink("/float/f4")
        f["/external_link"] = h5py.ExternalLink("elsewhere.h5", "/x")
    with h5py.File(path, "r") as f:
        check(f["/chunked/gzip"].compression == "gzip" and f["/float/f4_big_endian"].dtype.byteorder == ">",
              "h5py wrote gzip and big-endian datasets")
        check(f["/layout/compact"].id.get_create_plist().get_layout() == h5py.h5d.COMPACT and
              f["/layout/unwritten"].id.get_offset() is None and
              f["/float/f4"].id.get_offset() is not None,
              "h5py wrote a compact dataset, an unallocated one and allocated contiguous ones")

    dump = parse_dump(path)
    check(dump["ignored"] == 2, f"string and compound datasets are ignored (ignored = {dump['ignored']})")
    check(sorted(dump["tensors"]) == sorted(data), f"tensors {sorted(dump['tensors'])}")
    check([t["path"] for t in dump["order"]] == sorted(data), "no probe.seq: path order")
    for p, v in data.items():
        t = dump["tensors"][p]
        want_dtype = NP_TO_PROBE[v.dtype.str[1:]]
        check(t["dtype"] == want_dtype, f"{p}: dtype {t['dtype']}, want {want_dtype}")
        check(t["shape"] == v.shape and t["n"] == v.size, f"{p}: shape {t['shape']}, want {v.shape}")
        want = v.astype(np.float64).reshape(-1).tolist()  # numpy's conversion: exact, or nearest for u8/i8
        check(len(t["values"]) == len(want) and all(same(a, b) for a, b in zip(t["values"], want)),
              f"{p}: values differ from numpy")
        little = v.astype(v.dtype.newbyteorder("<")) if v.dtype != bool else v.astype("u1")
        check(t["raw"] == np.ascontiguousarray(little).tobytes(), f"{p}: raw bytes are the little-endian values")
    print(f"(b) h5py -> probe reader: {len(data)} tensors equal numpy exactly "
          f"(f2/f4/f8, >f4/>f8, i1..i8, u1..u8, >i4, bool, gzip, compact, unwritten, nested, 0-d, "
          f"empty); "
          f"string and compound ignored; links not followed")


# --- (c) errors -----------------------------------------------------------------
def part_c(tmp, good):
    def dump_err(p):
        r = subprocess.run([DUMP, p], capture_output=True, text=True)
        return r.returncode, r.stderr.strip()

    rc, err = dump_err(os.path.join(tmp, "missing.h5"))
    check(rc == 2 and err.endswith("missing.h5: No such file or directory (not found)"), f"missing file: {err}")
    txt = os.path.join(tmp, "text.h5")
    with open(txt, "w") as fp:
        fp.write("not hdf5\n")
    rc, err = dump_err(txt)
    check(rc == 2 and "text.h5: not an HDF5 file" in err, f"text file: {err}")
    cut = os.path.join(tmp, "cut.h5")
    with open(good, "rb") as src, open(cut, "wb") as dst:
        b = src.read()
        dst.write(b[: len(b) // 2])
    rc, err = dump_err(cut)
    check(rc == 2 and "cut.h5: truncated or corrupt HDF5 file (" in err, f"truncated file: {err}")
    check("HDF5-DIAG" not in err, "no HDF5 error stack printed")
    print("(c) missing, text and truncated files give one-line errors, no HDF5 error stack")


def main():
    for tool in (WRITE_ALL, DUMP):
        if not os.access(tool, os.X_OK):
            sys.exit(f"missing tool {tool} (build tests/tools first)")
    with tempfile.TemporaryDirectory(prefix="probe-h5py-") as tmp:
        good = part_a(tmp)
        part_b(tmp)
        part_c(tmp, good)
    print(f"PASS: {CHECKS} checks")


if __name__ == "__main__":
    main()
