"""NCCL interposition (intercept/hooks/nccl.c) on a CPU, against a fake NCCL.

tests/fakes/fake_nccl.c is built here as libnccl.so.2 (pnccl* entry points,
ncclX weak aliases; one process simulating rank 1 of 4) and
tests/fakes/mock_cudart.c as libcudart.so.13; tests/programs/shim_nccl makes
the calls listed in its header, outside and inside a component scope, with
and without (nested) groups, and checks every result itself. Checked here:
- the program's own checks hold with and without the shim, for NCCL loaded
  RTLD_GLOBAL and RTLD_LOCAL (the shim then finds it by
  dlopen(RTLD_NOLOAD)); every call reached the fake with exactly the
  arguments the program passed (the fake's log) and returned its result
  (ncclInvalidArgument, ncclInProgress pass through);
- with --capture '*,*nccl*': exactly the expected datasets (paths per the
  shared convention, 1-D shapes: all_gather out = nranks x count,
  reduce_scatter in = nranks x recvcount), each bit-exact against values
  computed here with numpy from the fake's semantics; the grouped outputs
  hold the collective's result, not the 0xAB bytes the buffer had before
  the outermost ncclGroupEnd (the copy comes after it); the in-place
  all_reduce's input is the value before the call; the broadcast root's
  input is captured, a non-root's is not;
- the fake's Bcast goes on to the exported ncclBroadcast, as NCCL's own
  does: that nested call reaches the shim's hook too and is not recorded
  (one broadcast dataset and count, not two);
- the scope's step/branch on the in-scope datasets; the ncclInProgress
  group recorded as skipped with the reason; the forked child's call not
  captured; the manifest's "nccl" counts, bytes, rank and nranks;
- the default selection ('*') captures no NCCL operand but counts the calls;
  '*nccl*@step=1' captures only the in-scope ones; PROBE_OUT unset: no file.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (SOURCE, check, finish, need_build, preload_env, probe_lines, program,  # noqa: E402
                              read_raw, run, tmpdir, clean_env)

import h5py  # noqa: E402
import numpy as np  # noqa: E402

R, N = 1, 4  # the simulated rank and world size


def build(d):
    cc = os.environ.get("CC", "cc")
    libs = {}
    for src, soname in (("mock_cudart.c", "libcudart.so.13"), ("fake_nccl.c", "libnccl.so.2")):
        out = os.path.join(d, soname)
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror",
                        "-Wl,-soname," + soname, "-o", out, os.path.join(SOURCE, "tests", "fakes", src),
                        "-lpthread"], check=True)
        libs[soname] = out
    return libs


def fb(n, base):
    return (np.float32(base) + np.arange(n, dtype=np.float32) * np.float32(0.25)).astype(np.float32)


def expected():
    """path -> (numpy array of the expected values) from the fake's semantics."""
    e = {}
    a0 = fb(64, 0)
    e["/nccl/0000/all_reduce.in"] = a0
    e["/nccl/0000/all_reduce.out"] = a0 * np.float32(N)
    a1 = (0x3f80 + np.arange(32)).astype(np.uint16)  # bf16 raw bits
    e["/nccl/0001/all_gather.in"] = a1
    e["/nccl/0001/all_gather.out"] = np.tile(a1, N)
    a2 = fb(64, 2)
    e["/nccl/0002/reduce_scatter.in"] = a2
    e["/nccl/0002/reduce_scatter.out"] = a2[R * 16:(R + 1) * 16] * np.float32(N)
    a3 = fb(8, 3)
    e["/nccl/0003/broadcast.in"] = a3
    e["/nccl/0003/broadcast.out"] = a3
    b4 = fb(16, 4)
    e["/nccl/0004/all_reduce.in"] = b4  # in place: the value before the call
    e["/nccl/0004/all_reduce.out"] = b4 * np.float32(N)
    e["/nccl/0005/send.in"] = fb(8, 5)
    e["/nccl/0006/recv.out"] = np.arange(8, dtype=np.float32) + np.float32(0 * 100)  # from peer 0
    a7 = fb(4, 7)
    e["/nccl/0007/all_gather.in"] = a7
    e["/nccl/0007/all_gather.out"] = np.tile(a7, N)
    a8 = (3 * np.arange(8) + 1).astype(np.int32)
    e["/nccl/0008/all_to_all.in"] = a8
    e["/nccl/0008/all_to_all.out"] = a8
    a20 = fb(8, 20)
    e["/dit.step/0003/nccl.0000.all_reduce.in"] = a20
    e["/dit.step/0003/nccl.0000.all_reduce.out"] = a20 * np.float32(N)
    # Bcast in place from root 0 (this is rank 1): no input; out[j] = 0*1000 + j
    e["/dit.step/0003/nccl.0001.broadcast.out"] = np.arange(8, dtype=np.float32)
    a11 = fb(8, 11)
    e["/nccl/0011/all_reduce.in"] = a11
    e["/nccl/0011/all_reduce.out"] = a11 * np.float32(N)
    return e


def datasets(f):
    out = []
    f.visititems(lambda n, o: out.append("/" + n) if isinstance(o, h5py.Dataset) else None)
    return out


def run_prog(libs, d, mode, env, tag):
    log = os.path.join(d, "fake-%s.log" % tag)
    exp = os.path.join(d, "expect-%s.log" % tag)
    for p in (log, exp):
        if os.path.exists(p):
            os.unlink(p)
    env = dict(env, FAKE_NCCL_LOG=log)
    r = run([program("shim_nccl"), libs["libcudart.so.13"], libs["libnccl.so.2"], mode, exp], env)
    print(r.stdout, r.stderr)
    check(r.returncode == 0 and r.stdout.strip().endswith("OK"),
          "%s: every call returned and computed what the fake defines (rc=%d)" % (tag, r.returncode))
    got = [l for l in open(log).read().splitlines() if not l.startswith("Group")]
    want = open(exp).read().splitlines()
    check(sorted(got) == sorted(want) and len(got) == 16,
          "%s: the fake received exactly the arguments the program passed (%d calls)" % (tag, len(got)))
    glog = [l for l in open(log).read().splitlines() if l.startswith("Group")]
    check(glog.count("GroupExec 2") == 2 and "GroupExec 1" in glog,
          "%s: groups reached the fake (nested group executed once, at the outermost GroupEnd)" % tag)
    return r


def main():
    need_build()
    d = tmpdir("probe-nccl-fake-")
    libs = build(d)
    exp = expected()

    # reference: no shim
    run_prog(libs, d, "global", clean_env(), "no-shim")
    # shim preloaded, PROBE_OUT unset: forwarding only, no file
    r = run_prog(libs, d, "local", preload_env(None, leaks=False), "inactive")
    check(probe_lines(r.stderr) == [], "inactive: no probe: line")

    for mode in ("global", "local"):
        out = os.path.join(d, "cap-%s.h5" % mode)
        env = preload_env(out, leaks=False, PROBE_CAPTURE="*,*nccl*")
        r = run_prog(libs, d, mode, env, mode)
        check(probe_lines(r.stderr) == [], "%s: no probe: line (%s)" % (mode, probe_lines(r.stderr)))
        with h5py.File(out, "r") as f:
            names = datasets(f)
            check(sorted(names) == sorted(exp), "%s: exactly the expected datasets (extra %s, missing %s)"
                  % (mode, sorted(set(names) - set(exp)), sorted(set(exp) - set(names))))
            for p, want in exp.items():
                if p not in f:
                    continue
                ds = f[p]
                raw = read_raw(ds).tobytes()
                check(tuple(ds.shape) == want.shape and raw == want.tobytes(),
                      "%s: %s shape %s bit-exact" % (mode, p, want.shape))
                poison = b"\xab" * len(raw)
                if "/0006/" in p or "/0007/" in p or "/0008/" in p:
                    check(raw != poison, "%s: %s copied after the outermost ncclGroupEnd" % (mode, p))
            for p in ("/dit.step/0003/nccl.0000.all_reduce.out", "/dit.step/0003/nccl.0001.broadcast.out"):
                if p in f:
                    check(int(f[p].attrs["probe.step"]) == 1 and int(f[p].attrs["probe.cfg_branch"]) == 1,
                          "%s: %s carries the scope's step 1 / branch 1" % (mode, p))
            skips = json.loads(f.attrs["probe.skips"]) if "probe.skips" in f.attrs else []
            sk = {s["path"]: s["reason"] for s in skips}
            check(set(sk) == {"/nccl/0010/all_reduce.in", "/nccl/0010/all_reduce.out"} and
                  all("ncclInProgress" in v for v in sk.values()),
                  "%s: the ncclInProgress group is recorded as skipped with the reason (%s)" % (mode, sk))
            m = json.loads(f.attrs["probe.manifest"])
            n = m.get("nccl", {})
            check(n.get("rank") == R and n.get("nranks") == N and n.get("communicators") == 1,
                  "%s: manifest nccl rank %s nranks %s" % (mode, n.get("rank"), n.get("nranks")))
            calls = n.get("calls", {})
            want_calls = {
                "nccl": {"all_reduce": {"count": 5, "bytes": (64 + 16 + 0 + 8 + 8) * 4},
                         "all_gather": {"count": 2, "bytes": 32 * 2 + 4 * 4},
                         "reduce_scatter": {"count": 1, "bytes": 64 * 4},
                         "broadcast": {"count": 1, "bytes": 8 * 4},
                         "send": {"count": 1, "bytes": 32}, "recv": {"count": 1, "bytes": 32},
                         "all_to_all": {"count": 1, "bytes": 8 * 4}},
                "dit.step": {"all_reduce": {"count": 1, "bytes": 32}, "broadcast": {"count": 1, "bytes": 32}}}
            check(calls == want_calls, "%s: manifest nccl calls per component (%s)" % (mode, calls))
            check(n.get("groups") == 3 and n.get("in_progress_skips") == 1 and n.get("failed_calls") == 1,
                  "%s: manifest groups 3, in_progress_skips 1, failed_calls 1 (%s)" % (mode, n))

    # default selection: no operand, calls still counted
    out = os.path.join(d, "cap-default.h5")
    run_prog(libs, d, "global", preload_env(out, leaks=False), "default")
    if os.path.exists(out) and os.path.getsize(out) > 0:
        with h5py.File(out, "r") as f:
            check(datasets(f) == [], "default '*': no NCCL operand captured (%s)" % datasets(f))
            m = json.loads(f.attrs["probe.manifest"])
            check(m.get("nccl", {}).get("calls", {}).get("nccl", {}).get("all_reduce", {}).get("count") == 5,
                  "default '*': the calls are counted in the manifest")
    else:
        check(False, "default '*': the root wrote the (empty) capture file")

    # step selector: only the in-scope (step 1) operands
    out = os.path.join(d, "cap-step.h5")
    run_prog(libs, d, "global", preload_env(out, leaks=False, PROBE_CAPTURE="*nccl*@step=1"), "step")
    with h5py.File(out, "r") as f:
        want = sorted(p for p in exp if p.startswith("/dit.step/"))
        check(sorted(datasets(f)) == want, "'*nccl*@step=1': only the scope's operands (%s)" % datasets(f))

    # `nccl.last` (docs/gemm.md "Selection"): the scope's only instance is its
    # first, so both of its calls may be the last; calls outside scopes never
    out = os.path.join(d, "cap-last.h5")
    run_prog(libs, d, "global", preload_env(out, leaks=False, PROBE_CAPTURE="*/nccl.last.*.out"), "last")
    with h5py.File(out, "r") as f:
        want = ["/dit.step/0003/nccl.0000.all_reduce.out", "/dit.step/0003/nccl.0001.broadcast.out"]
        check(sorted(datasets(f)) == want, "'*/nccl.last.*.out': the scope's outputs only (%s)" % datasets(f))
        for p in want:
            if p in f:
                check(np.array_equal(f[p][()], exp[p]), "%s: the value the fake computed" % p)
        m = json.loads(f.attrs["probe.manifest"])
        check(m.get("capture_last", {}).get("dit.step") ==
              {"instances": 1, "first_call": 3, "nccl": {"n": 2, "mismatched": 0, "mismatched_calls": []}},
              "manifest capture_last: dit.step call 3 made 2 NCCL calls (%s)" % m.get("capture_last"))
    finish()


if __name__ == "__main__":
    main()
