"""Bad input to the tap ABI: every bad descriptor / manifest key / value
returns PROBE_EINVAL without a crash (tests/programs/shim_tap_bad checks each
return value), and the file then holds exactly the valid tensors, the device
tensor recorded as skipped with its reason (no CUDA runtime here), and the
manifest keys the program added.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (attr_str, check, finish, need_build, preload_env, probe_lines,  # noqa: E402
                              program, run, tmpdir)

import h5py  # noqa: E402
import numpy as np  # noqa: E402


def main():
    need_build()
    d = tmpdir("probe-shim-bad-")
    out = os.path.join(d, "cap.h5")
    r = run([program("shim_tap_bad")], preload_env(out, PROBE_LABEL="orig"))
    print(r.stdout)
    check(r.returncode == 0, "every bad call returned the expected status, no crash (rc=%d)" % r.returncode)
    check(probe_lines(r.stderr) == [], "bad descriptors print nothing (stderr %r)" % r.stderr)
    with h5py.File(out, "r") as f:
        paths = []
        f.visititems(lambda n, o: paths.append("/" + n) if isinstance(o, h5py.Dataset) else None)
        check(sorted(paths) == ["/good/0000/out", "/good/0001/in.hidden_states", "/good/0002/out",
                                "/good/0004/out", "/good/0005/out", "/good/0006/out",
                                "/good/0007/out"],
              "only the valid tensors are in the file (%s)" % sorted(paths))
        nest = {p: (attr_str(f[p], "probe.parent"), f[p].attrs.get("probe.block"),
                    attr_str(f[p], "probe.class")) for p in paths}
        check(attr_str(f["/good/0005/out"], "probe.module") == "transformer.blocks.1"
              and all(attr_str(f[p], "probe.module") is None for p in paths if p != "/good/0005/out"),
              "probe.module of the one call that gave it (%r)" % attr_str(f["/good/0005/out"], "probe.module"))
        check(nest["/good/0005/out"] == ("/dit.step/0003", 1, "toy.ToyDiTBlock")
              and f["/good/0005/out"].attrs["probe.block"].dtype == np.int64,
              "a nested call's probe.parent, probe.block (int64) and probe.class (%r)"
              % (nest["/good/0005/out"],))
        check(all(nest[p] == (None, None, None) for p in ("/good/0000/out", "/good/0004/out",
                                                          "/good/0006/out")),
              "no nesting attribute for a call that is not nested, nor from the first v1 size (%r)"
              % ({p: nest[p] for p in ("/good/0000/out", "/good/0004/out", "/good/0006/out")},))
        check(nest["/good/0007/out"] == ("/dit.step/0000", 0, None),
              "a struct_size that ends before class_name: nesting kept, no class (%r)"
              % (nest["/good/0007/out"],))
        want = (np.arange(16, dtype=np.float32) * 0.5).reshape(4, 4)
        check(np.array_equal(f["/good/0000/out"][()], want), "valid tensor values")
        check("probe.timestep" not in f["/good/0000/out"].attrs, "NaN (unknown) timestep is not written")
        skips = json.loads(attr_str(f, "probe.skips"))
        check(len(skips) == 1 and skips[0]["path"] == "/good/0003/out"
              and "CUDA runtime is not loaded" in skips[0]["reason"],
              "device tensor without CUDA recorded as skipped (%s)" % skips)
        m = json.loads(attr_str(f, "probe.manifest"))
        check(m["torch"] == {"version": "1.13.0", "cuda": None, "x": [1, -2.5e3, True, False, "\u00e9"]},
              "manifest key replaced by the last value (%s)" % m.get("torch"))
        check(m["label"] == "overridden", "adapter key overrides the built-in label")
        check(m["pipeline.name"] == "toy", "manifest key with a dot")
        check(m["format"] == "probe-manifest" and m["version"] == 1, "format/version untouched")
        check(m["taps"]["accepted"] == 7 and m["taps"]["skipped"] == 1, "manifest counts: %s" % m["taps"])
        pairs = json.loads(attr_str(f, "probe.manifest"), object_pairs_hook=lambda kv: kv)
        keys = [k for k, _ in pairs]
        check(len(keys) == len(set(keys)), "no duplicate keys in the manifest JSON text (%s)" % keys)
    finish()


if __name__ == "__main__":
    main()
