"""NVTX injection: the shim is the NVTX injection library (its constructor
sets NVTX_INJECTION64_PATH to itself), header-only nvtx3 calls in
tests/programs/shim_tap_nvtx reach its callbacks, and each tap carries the
calling thread's range stack joined by '/' as probe.scope.

Expected scopes are written out by hand from the program's sequence of
pushes and pops. A second run with NVTX_INJECTION64_PATH already set to
another library checks that the shim leaves it and says so in the manifest.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import attr_str, check, finish, need_build, preload_env, program, run, tmpdir  # noqa: E402

import h5py  # noqa: E402

WIDE = "wide \u00e9\U0001F600"
EXPECTED = {
    0: "",
    1: "outer",
    2: "outer/denoise_step 3",
    3: "outer/denoise_step 3/registered step",
    4: "outer/denoise_step 3/registered step/" + WIDE,
    5: "outer/denoise_step 3/" + WIDE,
    6: "outer/denoise_step 3",
    7: "outer/ex range",
    8: "",
    9: "x" * 127,
    10: "a" * 126,
    11: "/".join("d%d" % i for i in range(64)),
    12: "",
    13: "",
    14: "/".join(chr(ord("A") + i) * 100 for i in range(10))[:511],
    15: "worker",
    16: "main only",
    17: "",
}


def main():
    need_build()
    d = tmpdir("probe-shim-nvtx-")
    out = os.path.join(d, "cap.h5")
    r = run([program("shim_tap_nvtx")], preload_env(out))
    check(r.returncode == 0, "shim_tap_nvtx ran, every tap returned 0 (rc=%d %s)" % (r.returncode, r.stderr))
    with h5py.File(out, "r") as f:
        for i, want in EXPECTED.items():
            p = "/nvtx/%04d/out" % i
            if not check(p in f, "%s present" % p):
                continue
            got = attr_str(f[p], "probe.scope") or ""
            check(got == want, "%s scope %r" % (p, want if len(want) < 60 else want[:57] + "..."))
            if got != want:
                print("   got %r" % got)
            check(list(f[p][()]) == [float(i), float(-i)], "%s values" % p)
        m = json.loads(attr_str(f, "probe.manifest"))
        check(m["nvtx"] == "injected (1 module initialized)", "manifest nvtx: %s" % m["nvtx"])

    out2 = os.path.join(d, "other.h5")
    other = os.path.join(d, "libsome-other-tool.so")
    r = run([program("shim_tap_nvtx")], preload_env(out2, NVTX_INJECTION64_PATH=other))
    check(r.returncode == 0, "run with a foreign NVTX_INJECTION64_PATH exits 0")
    with h5py.File(out2, "r") as f:
        m = json.loads(attr_str(f, "probe.manifest"))
        check(m["nvtx"] == "not injected: NVTX_INJECTION64_PATH already set to " + other,
              "manifest says NVTX is not injected: %s" % m["nvtx"])
        check(all((attr_str(f["/nvtx/%04d/out" % i], "probe.scope") or "") == "" for i in EXPECTED),
              "without injection every scope is empty")
    finish()


if __name__ == "__main__":
    main()
