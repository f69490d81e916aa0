"""probe-compare's streaming engine on files written by h5py: values against a
numpy fp64 oracle for the storage layouts the range reader must handle
(contiguous, chunked + gzip, big-endian, a file with a user block, odd N-D
shapes whose rows straddle the reading chunks), the radix-select p99 of large
tensors with heavy ties, results that do not depend on --threads, the
per-channel mean shift (option, component table, layout rule) against numpy,
a bf16-as-float32 vs float16 pair, and the new options' bad input."""
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run([COMPARE, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def compare_json(ref, cand, *opts):
    rc, out, err = run("--json", "-", "--quiet", *opts, ref, cand)
    if rc == 2:
        print(err)
        return rc, None
    return rc, {t["path"]: t for t in json.loads(out)["tensors"]}


def oracle(r, c):
    r = r.astype(np.float64).ravel()
    c = c.astype(np.float64).ravel()
    fin = np.isfinite(r) & np.isfinite(c)
    rf, cf = r[fin], c[fin]
    d = np.abs(cf - rf)
    nr, nc = math.sqrt(math.fsum(rf * rf)), math.sqrt(math.fsum(cf * cf))
    nd = math.sqrt(math.fsum((cf - rf) ** 2))
    return {
        "rel_l2": nd / nr,
        "cosine": math.fsum(rf * cf) / (nr * nc),
        "max_abs": float(d.max()),
        "max_abs_flat": int(np.flatnonzero(fin)[int(np.argmax(d))]),
        "p99_abs": float(np.percentile(d, 99, method="inverted_cdf")),
        "mean_abs": math.fsum(d) / d.size,
    }


def close(a, b, rel=1e-12):
    return a is not None and abs(a - b) <= rel * max(abs(b), 1e-300)


def check_values(t, o, shape, what):
    check(close(t["rel_l2"], o["rel_l2"]), f"{what}: rel_l2 {t['rel_l2']!r} vs {o['rel_l2']!r}")
    check(close(t["cosine"], o["cosine"], 1e-14), f"{what}: cosine {t['cosine']!r} vs {o['cosine']!r}")
    check(t["max_abs"] == o["max_abs"], f"{what}: max_abs exact")
    check(t["p99_abs"] == o["p99_abs"], f"{what}: p99_abs exact ({t['p99_abs']!r} vs {o['p99_abs']!r})")
    check(close(t["mean_abs"], o["mean_abs"]), f"{what}: mean_abs")
    want_idx = list(np.unravel_index(o["max_abs_flat"], shape))
    check(t["max_abs_index"] == [int(i) for i in want_idx], f"{what}: max_abs_index {t['max_abs_index']} == {want_idx}")


def channel_oracle(r, c, axis):
    r = np.moveaxis(r.astype(np.float64), axis, 0).reshape(r.shape[axis], -1)
    c = np.moveaxis(c.astype(np.float64), axis, 0).reshape(c.shape[axis], -1)
    shift = (c - r).mean(axis=1)
    std = r.std(axis=1)  # population (ddof 0)
    k = int(np.argmax(np.abs(shift)))
    return k, float(shift[k]), float(shift[k] / std[k])


def main():
    tmp = tempfile.mkdtemp(prefix="probe-stream-")
    rng = np.random.default_rng(3)

    # 1. layouts: one odd 4-D shape (rows straddle the 128Ki-element chunks)
    shape = (3, 7, 129, 131)
    r = rng.standard_normal(shape).astype(np.float32)
    c = (r + rng.standard_normal(shape).astype(np.float32) * np.float32(1e-3)).astype(np.float32)
    c[1, 2, 3, 4] += np.float32(0.25)  # a known maximum
    o = oracle(r, c)
    layouts = {
        "contiguous": dict(),
        "chunked_gzip": dict(chunks=(1, 3, 50, 131), compression="gzip"),
        "big_endian": dict(dtype=">f4"),
        "odd_chunks": dict(chunks=(2, 5, 17, 19)),
    }
    for name, kw in layouts.items():
        files = []
        for side, arr in (("ref", r), ("cand", c)):
            p = os.path.join(tmp, f"{name}_{side}.h5")
            ub = {"userblock_size": 512} if name == "contiguous" and side == "cand" else {}
            with h5py.File(p, "w", **ub) as f:
                f.create_dataset("/x/0000/out", data=arr.astype(kw.get("dtype", "<f4")),
                                 **{k: v for k, v in kw.items() if k != "dtype"})
            files.append(p)
        rc, ts = compare_json(*files)
        check(rc in (0, 1) and ts is not None, f"{name}: compared (exit {rc})")
        if ts:
            check_values(ts["/x/0000/out"], o, shape, name + (" (+ user block)" if name == "contiguous" else ""))

    # 2. large tensor (radix select, n > 2^23) with heavy ties, NaN/Inf at known places
    n = (1 << 23) + 12345
    r = np.ones(n, np.float32)
    k = (np.arange(n) % 1000).astype(np.float32)
    c = (r + k * np.float32(2.0 ** -20)).astype(np.float32)
    c[5] = np.nan
    r[7] = np.inf
    c[7] = np.inf  # same infinity: equal, excluded from the metrics
    c[9] = np.inf  # candidate infinity: a mismatch, excluded
    rp, cp = os.path.join(tmp, "big_ref.h5"), os.path.join(tmp, "big_cand.h5")
    for p, a in ((rp, r), (cp, c)):
        with h5py.File(p, "w") as f:
            f.create_dataset("/dit.step/0000/out", data=a)
    o = oracle(r, c)
    outs = {}
    for th in ("1", "2", "5"):
        rc, ts = compare_json(rp, cp, "--threads", th)
        outs[th] = ts["/dit.step/0000/out"] if ts else None
    t = outs["1"]
    check(t is not None, "large: compared")
    if t:
        check_values(t, o, (n,), "large (radix p99, ties)")
        check(t["nan_cand"] == 1 and t["inf_ref"] == 1 and t["inf_cand"] == 2,
              f"large: NaN/Inf counts {t['nan_cand']}, {t['inf_ref']}, {t['inf_cand']}")
        check(all(outs[x] == t for x in outs), "large: --threads 1, 2, 5 give identical JSON")

    # 3. channel shift: a [1, 16, 3, 17, 19] tensor with a bias on channel 11
    shape = (1, 16, 3, 17, 19)
    r = rng.standard_normal(shape).astype(np.float32)
    r[:, 4] *= 3.0
    c = (r + rng.standard_normal(shape).astype(np.float32) * np.float32(1e-3)).astype(np.float32)
    c[:, 11] += np.float32(0.02)
    rp, cp = os.path.join(tmp, "ch_ref.h5"), os.path.join(tmp, "ch_cand.h5")
    for p, a in ((rp, r), (cp, c)):
        with h5py.File(p, "w") as f:
            f.create_dataset("/dit.step/0000/out", data=a)
            f.create_dataset("/mystery/0000/out", data=a.reshape(16, 3 * 17 * 19))
            f.create_dataset("/mystery/0000/vec", data=a.ravel()[:100])
    rc, ts = compare_json(rp, cp)
    if ts:
        t = ts["/dit.step/0000/out"]
        kk, sh, rel = channel_oracle(r, c, 1)
        check(t["channel_axis"] == 1 and t["channel_axis_from"] == "table",
              f"channel: dit.step axis 1 from the table ({t['channel_axis']}, {t['channel_axis_from']})")
        check(t["channel_shift_argmax"] == kk == 11, f"channel: argmax {t['channel_shift_argmax']} == {kk}")
        check(close(t["channel_shift_max"], sh, 1e-12), f"channel: shift {t['channel_shift_max']!r} vs {sh!r}")
        check(close(t["channel_shift_max_rel"], rel, 1e-12),
              f"channel: shift/std {t['channel_shift_max_rel']!r} vs {rel!r}")
        m = ts["/mystery/0000/out"]
        kk2, sh2, _ = channel_oracle(r.reshape(16, -1), c.reshape(16, -1), 1)
        check(m["channel_axis"] == 1 and m["channel_axis_from"] == "layout"
              and m["channel_shift_argmax"] == kk2 and close(m["channel_shift_max"], sh2),
              f"channel: rank-2 tensor uses the last axis by the layout rule ({m['channel_axis']}, {m['channel_axis_from']})")
        v = ts["/mystery/0000/vec"]
        check(v["channel_axis"] is None and v["channel_shift_max"] is None,
              "channel: a rank-1 tensor has no channel axis (null keys)")
    rc, ts = compare_json(rp, cp, "--channel-axis", "-1")
    if ts:
        t = ts["/dit.step/0000/out"]
        kk, sh, rel = channel_oracle(r, c, 4)
        check(t["channel_axis"] == 4 and t["channel_axis_from"] == "option"
              and t["channel_shift_argmax"] == kk and close(t["channel_shift_max"], sh)
              and close(t["channel_shift_max_rel"], rel),
              f"channel: --channel-axis -1 -> axis 4 ({t['channel_axis']}, argmax {t['channel_shift_argmax']} vs {kk})")
        check(ts["/mystery/0000/vec"]["channel_axis"] == 0,
              "channel: --channel-axis -1 on a rank-1 tensor is its axis 0")

    # 4. float16 candidate vs float32 reference (compared in fp64)
    r = rng.standard_normal((64, 33)).astype(np.float32)
    c = r.astype(np.float16)
    rp, cp = os.path.join(tmp, "h_ref.h5"), os.path.join(tmp, "h_cand.h5")
    with h5py.File(rp, "w") as f:
        f["/t/0000/out"] = r
    with h5py.File(cp, "w") as f:
        f["/t/0000/out"] = c
    rc, ts = compare_json(rp, cp)
    if ts:
        t = ts["/t/0000/out"]
        check(t["dtype"] == "float32" and t["dtype_candidate"] == "float16", "mixed: dtypes reported")
        check_values(t, oracle(r, c.astype(np.float64)), r.shape, "float16 vs float32")

    # 4b. tensor bytes that spell a global-heap signature ("GCOL", version 1,
    # then garbage) are data, not HDF5 metadata: the file is not "corrupt"
    raw = np.frombuffer((b"GCOL\x01\x00\x00\x00" + b"\xff" * 8) * 64, dtype=np.uint8)
    for kw in ({}, {"chunks": (256,), "compression": "gzip"}, {"chunks": (200,)}):
        gp, gc = os.path.join(tmp, "gcol_ref.h5"), os.path.join(tmp, "gcol_cand.h5")
        for p, a in ((gp, raw), (gc, raw ^ np.uint8(1))):
            with h5py.File(p, "w") as f:
                f.create_dataset("/img/0000/out", data=a, **kw)
                f["/img/0000/out"].attrs["probe.component"] = "img"  # a vlen string attribute
        rc, ts = compare_json(gp, gc)
        check(rc == 1 and ts is not None and ts["/img/0000/out"]["max_abs"] == 1.0,
              f"data spelling GCOL\\1 ({kw or 'contiguous'}): compared, not refused (exit {rc})")

    # 5. bad input for the new options: exit 2, one line naming the option
    for args, needle in ((["--channel-axis", "x"], "--channel-axis"),
                         (["--channel-axis", "16"], "--channel-axis"),
                         (["--threads", "0"], "--threads"),
                         (["--threads", "17"], "--threads"),
                         (["--device", "gpu"], "--device"),
                         (["--device", "cuda:x"], "--device")):
        rc, out, err = run(*args, rp, cp)
        check(rc == 2 and needle in err and err.count("\n") == 1,
              f"bad {' '.join(args)}: exit {rc}, {err.strip()!r}")
    # --device cuda without a usable GPU (CI): a clear error, not a crash
    rc, out, err = run("--device", "cuda", rp, cp)
    if rc == 2:
        check("CUDA" in err or "cuda" in err, f"--device cuda without a GPU: {err.strip()!r}")
    else:
        check(rc in (0, 1), f"--device cuda ran on a GPU (exit {rc})")

    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
