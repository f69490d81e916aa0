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

EINVAL, ESTATE = 1, 8  # include/probe/status.h

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
        # "denoise_step 3" (tap 2's range) and "denoise_step 7"/"8" open
        # denoise.step scopes under the default PROBE_NVTX_SCOPES
        sc = m.get("nvtx_scopes", {})
        check(sc.get("calls") == {"denoise.step": 3} and sc.get("set") is False,
              "manifest nvtx_scopes counts 3 denoise.step ranges: %r" % sc)
    # status values: include/probe/status.h
    check("scope rc ok=0 exit=0 stray=%d null=%d slash=%d call=%d size=%d"
          % (ESTATE, EINVAL, EINVAL, EINVAL, EINVAL) in r.stdout,
          "scope ABI: enter/exit 0, stray exit ESTATE, bad descriptors EINVAL: %s"
          % [l for l in r.stdout.splitlines() if l.startswith("scope")])

    # a mapping of our own; and a bad one (one warning, no scopes, reason in the manifest)
    out3 = os.path.join(d, "mapped.h5")
    r = run([program("shim_tap_nvtx")], preload_env(out3, PROBE_NVTX_SCOPES="outer.c=outer, steps=denoise_step [0-7]"))
    check(r.returncode == 0, "run with PROBE_NVTX_SCOPES set exits 0")
    with h5py.File(out3, "r") as f:
        sc = json.loads(attr_str(f, "probe.manifest")).get("nvtx_scopes", {})
        check(sc.get("calls") == {"outer.c": 1, "steps": 2} and sc.get("set") is True,
              "PROBE_NVTX_SCOPES maps 'outer' once and 'denoise_step [0-7]' twice: %r" % sc)
    out4 = os.path.join(d, "badmap.h5")
    r = run([program("shim_tap_nvtx")], preload_env(out4, PROBE_NVTX_SCOPES="denoise_step *"))
    warn = [l for l in r.stderr.splitlines() if "PROBE_NVTX_SCOPES" in l]
    check(r.returncode == 0 and len(warn) == 1 and "not COMPONENT=GLOB" in warn[0],
          "a bad PROBE_NVTX_SCOPES: one warning line, the run goes on: %r" % warn)
    with h5py.File(out4, "r") as f:
        sc = json.loads(attr_str(f, "probe.manifest")).get("nvtx_scopes", {})
        check(sc.get("calls") == {} and "not COMPONENT=GLOB" in sc.get("error", ""),
              "no scope is opened and the manifest says why: %r" % sc)

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
