"""Host tensors through the preloaded shim, checked bit for bit.

tests/programs/shim_tap_host taps every dtype and many layouts (contiguous,
transposed, sliced with an offset, channels-last 4-D, permuted 5-D,
broadcast, rank 0, zero-size) and leaves each base buffer as raw bytes. Here
numpy rebuilds each expected tensor independently (as_strided over the base
buffer, then ascontiguousarray) and the captured dataset's stored bytes must
match exactly; attributes, execution order and the manifest are checked too.
A second run checks the PROBE_CAPTURE filter.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (NAMES, attr_str, check, expected_bytes, finish, need_build,  # noqa: E402
                              preload_env, probe_lines, program, read_raw, run, tmpdir)

import h5py  # noqa: E402

def main():
    need_build()
    d = tmpdir("probe-shim-host-")
    out = os.path.join(d, "cap.h5")
    env = preload_env(out, PROBE_LABEL="host \"layouts\"\n")
    r = run([program("shim_tap_host"), d], env)
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "shim_tap_host: every tap returned 0 (rc=%d)" % r.returncode)
    check(probe_lines(r.stderr) == [], "no probe: warnings on a good run")
    cases = [json.loads(l) for l in open(os.path.join(d, "cases.jsonl"))]
    check(len(cases) == 13 + 2 * 15, "program described %d cases" % len(cases))

    with h5py.File(out, "r") as f:
        seqs = []
        for c in cases:
            p = c["path"]
            if not check(p in f, "%s present" % p):
                continue
            ds = f[p]
            got = read_raw(ds).tobytes()
            exp = expected_bytes(c, d)
            check(got == exp, "%s bytes bit-exact (%d bytes, dtype %s)" % (p, len(exp), NAMES[c["dtype"]]))
            check(tuple(ds.shape) == tuple(c["shape"]), "%s dataset shape %s" % (p, c["shape"]))
            check(attr_str(ds, "probe.dtype") == NAMES[c["dtype"]], "%s probe.dtype" % p)
            check(list(ds.attrs["probe.shape"]) == c["shape"], "%s probe.shape" % p)
            comp, call, slot = p.split("/")[1:]
            check(attr_str(ds, "probe.component") == comp and attr_str(ds, "probe.slot") == slot,
                  "%s component/slot attrs" % p)
            check(int(ds.attrs["probe.call"]) == int(call) and int(ds.attrs["probe.step"]) == c["step"]
                  and int(ds.attrs["probe.cfg_branch"]) == c["cfg_branch"]
                  and float(ds.attrs["probe.timestep"]) == c["timestep"],
                  "%s call/step/cfg_branch/timestep attrs" % p)
            check(attr_str(ds, "probe.device") == "cpu", "%s probe.device == cpu" % p)
            check(attr_str(ds, "probe.scope") in ("", None), "%s empty scope (no NVTX ranges)" % p)
            seqs.append(int(ds.attrs["probe.seq"]))
        check(seqs == sorted(seqs) and len(set(seqs)) == len(seqs),
              "probe.seq unique and increasing in tap order")
        check(attr_str(f, "probe.format") == "probe-capture", "root probe.format")
        m = json.loads(attr_str(f, "probe.manifest"))
        check(m["format"] == "probe-manifest" and m["version"] == 1, "manifest format/version")
        check(m["command"] == [program("shim_tap_host"), d], "manifest command is argv (%s)" % m["command"])
        check(m["label"] == "host \"layouts\"\n", "manifest label round-trips quotes and newline")
        check(m["pid"] > 0 and isinstance(m["pid"], int), "manifest pid")
        check(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", m["start_time"]) is not None,
              "manifest start_time ISO 8601 UTC (%s)" % m["start_time"])
        check(isinstance(m["probe_version"], str) and m["probe_version"], "manifest probe_version")
        check(m["nvtx"].startswith("injected"), "manifest nvtx: %s" % m["nvtx"])
        check(m["taps"]["accepted"] == len(cases), "manifest taps.accepted == %d" % len(cases))
        check("rank" not in m, "manifest has no rank when RANK is unset")
        skips = attr_str(f, "probe.skips")
        check(skips in (None, "[]") or json.loads(skips) == [], "no skips recorded")

    # PROBE_CAPTURE: comma-separated fnmatch globs on the dataset path.
    d2 = tmpdir("probe-shim-filter-")
    out2 = os.path.join(d2, "cap.h5")
    env = preload_env(out2, PROBE_CAPTURE="/layout/000[0-2]/*, dtype/*/transposed", RANK="3",
                      WORLD_SIZE="8", LOCAL_RANK="1")
    r = run([program("shim_tap_host"), d2], env)
    check(r.returncode == 0, "filtered run exits 0")
    # rank 3 of 8: the process writes its rank file (docs/nccl.md, "Per-rank files")
    check(not os.path.exists(out2), "a rank of a world of 8 does not write PROBE_OUT itself")
    with h5py.File(os.path.join(d2, "cap.rank3.h5"), "r") as f:
        paths = []
        f.visititems(lambda n, o: paths.append("/" + n) if isinstance(o, h5py.Dataset) else None)
        want = sorted(["/layout/0000/contiguous", "/layout/0001/contiguous_strided", "/layout/0002/transposed"]
                      + ["/dtype/%04d/transposed" % dt for dt in range(1, 16)])
        check(sorted(paths) == want, "PROBE_CAPTURE keeps exactly the matching paths (%d)" % len(paths))
        m = json.loads(attr_str(f, "probe.manifest"))
        check(m["taps"]["filtered"] == 43 - len(want), "manifest counts filtered taps")
        check(m["rank"] == 3 and m["world_size"] == 8 and m["local_rank"] == 1,
              "manifest rank/world_size/local_rank from env")
    finish()


if __name__ == "__main__":
    main()
