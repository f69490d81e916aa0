#!/usr/bin/python3
"""Regenerate the fuzz seed corpus in tests/fuzz/corpus/ (committed; run this
only to change it): small valid capture files written by probe's own writer
(build-fuzz/fuzz/make_seeds) and by h5py, and calibration JSON files.

    /usr/bin/python3 tests/fuzz/make_corpus.py BUILD_DIR   (BUILD_DIR/fuzz/make_seeds)

corpus/reader and corpus/compare hold the same HDF5 seeds (the compare seeds
keep the reference's dataset paths, so that mutations reach the metrics);
corpus/calibration holds JSON."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
build = sys.argv[1] if len(sys.argv) > 1 else "build-fuzz"
out = {k: os.path.join(here, "corpus", k) for k in ("reader", "compare", "calibration")}
for d in out.values():
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)

tmp = tempfile.mkdtemp()
subprocess.run([os.path.join(build, "fuzz", "make_seeds"), tmp], check=True)
h5 = [os.path.join(tmp, f) for f in sorted(os.listdir(tmp))]


def h5py_file(name, fill):
    p = os.path.join(tmp, name)
    with h5py.File(p, "w", libver="earliest" if "v0" in name else "latest") as f:
        fill(f)
    h5.append(p)


rng = np.random.default_rng(1)


def same_paths(f):
    """The reference's paths (fuzz_common.h) in h5py's own types."""
    f["/text_encoder/0000/out"] = rng.standard_normal((2, 3, 8))
    f["/dit.step/0000/in.hidden_states"] = rng.standard_normal((1, 4, 2, 3, 3)).astype(np.float32)
    f["/dit.step/0000/in.timestep"] = np.float32(500)
    f["/dit.step/0000/out"] = rng.standard_normal((4, 4)).astype(np.float16)
    f["/scheduler.step/0000/out.prev_sample"] = np.arange(-3, 4, dtype=np.int32)
    f["/vae.decode/0000/out"] = np.arange(12, dtype=np.uint8).reshape(3, 4)


def layouts(f):
    """Chunked, compressed, big-endian, bool, fill-only and non-numeric datasets."""
    f.create_dataset("/dit.step/0000/in.hidden_states", data=rng.standard_normal((1, 4, 2, 3, 3)).astype(np.float32),
                     chunks=(1, 2, 1, 3, 2), compression="gzip", shuffle=True)
    f.create_dataset("/text_encoder/0000/out", data=rng.standard_normal((2, 3, 8)).astype(">f8"), chunks=(1, 3, 4))
    f["/misc/bool"] = np.array([True, False, True])
    f["/misc/u64"] = np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)
    f.create_dataset("/misc/unwritten", shape=(5, 5), dtype=np.float32)          # fill value only
    f.create_dataset("/misc/sparse", shape=(64,), dtype=np.float32, chunks=(8,))  # no chunk written
    f.create_dataset("/misc/resizable", data=np.ones(6, np.int16), maxshape=(None,), chunks=(4,))
    f["/misc/string"] = "text"
    f["/misc/compound"] = np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")])
    f.create_dataset("/misc/vlen", data=[np.arange(3), np.arange(1)], dtype=h5py.vlen_dtype(np.int32))
    f["/misc/soft"] = h5py.SoftLink("/text_encoder/0000/out")
    f["/misc/dangling"] = h5py.SoftLink("/nowhere")
    f["/misc/external"] = h5py.ExternalLink("/etc/passwd", "/x")
    f.attrs["probe.format"] = "probe-capture"
    f.attrs["probe.version"] = 1
    f.attrs["probe.manifest"] = json.dumps({"label": "h5py", "argv": ["x"]})
    f.attrs["probe.skips"] = json.dumps([{"path": "/a/0000/out", "reason": "why"}])
    f["/text_encoder/0000/out"].attrs["probe.seq"] = 3
    f["/text_encoder/0000/out"].attrs["probe.dtype"] = "float64"
    f["/text_encoder/0000/out"].attrs["probe.hash"] = "0123456789abcdef"


def outside(kind):
    """The reference's paths plus one dataset stored outside the file, which
    the reader refuses (docs/hardening.md, "Hardening table"): external
    storage (/etc/passwd, a FIFO's name next to the file), a virtual dataset
    whose source is another file, a plugin filter (lzf)."""
    def fill(f):
        f["/text_encoder/0000/out"] = np.arange(48, dtype=np.float64).reshape(2, 3, 8)
        f["/vae.decode/0000/out"] = np.arange(12, dtype=np.uint8).reshape(3, 4)
        d = "/dit.step/0000/out"
        if kind == "passwd":
            f.create_dataset(d, shape=(4, 4), dtype=np.float16, external=[("/etc/passwd", 0, 32)])
        elif kind == "fifo":
            f.create_dataset(d, shape=(4, 4), dtype=np.float16, external=[("fifo", 0, 16), ("side.bin", 0, 16)])
        elif kind == "virtual":
            lay = h5py.VirtualLayout(shape=(4, 4), dtype=np.float16)
            lay[:] = h5py.VirtualSource("other.h5", "/x", shape=(4, 4))
            f.create_virtual_dataset(d, lay)
        else:
            f.create_dataset(d, data=np.zeros((64, 64), np.float16), chunks=(32, 32), compression="lzf")
    return fill


h5py_file("h5py_same_paths.h5", same_paths)
h5py_file("h5py_same_paths_v0.h5", same_paths)
h5py_file("h5py_layouts.h5", layouts)
for kind in ("passwd", "fifo", "virtual", "lzf"):
    h5py_file("h5py_outside_%s.h5" % kind, outside(kind))

for p in h5:
    for k in ("reader", "compare"):
        shutil.copy(p, os.path.join(out[k], os.path.basename(p)))
shutil.rmtree(tmp)

cal = {
    "full": {"format": "probe-calibration", "version": 1, "feature": "fp8", "headroom": 2.0,
             "components": {"dit.step": {"rel_l2_max": 0.05, "cosine_min": 0.99, "atol": 0.01,
                                         "rtol": 0.01, "mismatch_fraction_max": 0.1,
                                         "p99_abs_max": 0.2, "max_abs_max": 1.0,
                                         "observed": {"rel_l2": [0.01]}, "x-note": "n"},
                            "vae.decode": {"cosine_min": 0.9}},
             "tensors": {"/dit.step/*/out": {"rel_l2_max": 0.1}, "/vae.decode/[0-9]*/out.?": {"atol": 1}},
             "evidence": {"runs": 3}, "x-extra": [1, 2]},
    "tensors_only": {"format": "probe-calibration", "version": 1, "tensors": {"*": {"rel_l2_max": 1e-3}}},
    "structure": {"format": "probe-calibration", "version": 1, "feature": "fp8", "headroom": 1.5,
                  "components": {"dit.block": {"rel_l2_max": 0.04, "channel_z_max": 180.0,
                                               "gain_z_max": 9.0}},
                  "structure": {"/dit.block/0002/out": {"channel_z_max": 176.0, "gain_z_max": 6.0,
                                                        "observed": {"component": "dit.block",
                                                                     "runs": 3}, "x-n": 1},
                                "/dit.block/0003/out": {"gain_z_max": 4.5}}},
    "structure_by_channel": {"format": "probe-calibration", "version": 1, "headroom": 1.5,
                             "components": {"dit.block": {"rel_l2_max": 0.04}},
                             "structure": {"/dit.block/0002/out": {
                                 "channel_z_max": 176.0, "channel_z_max_by_channel": [31, 0, None, 176.5],
                                 "observed": {"channel_z_spread": 3.2, "channel_t": 5.33}}}},
    "bad_version": {"format": "probe-calibration", "version": 2, "components": {}},
    "unknown_component": {"format": "probe-calibration", "version": 1, "components": {"x": {}}},
}
for name, obj in cal.items():
    with open(os.path.join(out["calibration"], name + ".json"), "w") as f:
        json.dump(obj, f, indent=1)
shutil.copy(os.path.join(here, "..", "data", "calibration", "valid.json"),
            os.path.join(out["calibration"], "valid.json"))
