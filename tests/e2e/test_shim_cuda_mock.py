"""The shim's device path on a CPU, against a mock CUDA runtime.

tests/fakes/mock_cudart.c is compiled here into libcudart.so.13 (the real
soname) and loaded by tests/programs/shim_tap_device_mock the way torch
loads its runtime. The mock runs every stream through one FIFO worker
thread (copies really are asynchronous), and counts forbidden calls and rule
violations. Checked:
- device tensors of several layouts/dtypes (transposed, sliced with offset,
  channels-last fp16, bf16, broadcast int8, rank 0, zero-size, the legacy
  stream) are bit-exact against numpy's as_strided over the saved base buffer;
- a tap behind a 300 ms "kernel" returns at once and captures what the
  kernel wrote (event ordering), both times printed;
- taps on a capturing stream, and on the legacy stream during a capture,
  enqueue nothing and are recorded as skipped with a reason;
- a device-1 tensor from a device-0 thread: current device restored, a
  private stream per device;
- 4 threads x 50 taps: all present and correct;
- no cudaFreeHost / cudaStreamSynchronize / cudaDeviceSynchronize /
  cudaMalloc, no cudaEventSynchronize on a tapping thread, pinned buffers
  pooled, manifest "cuda" filled;
- PROBE_PINNED_MB=16 (4 MiB pieces): tensors larger than a piece and than the
  whole pool (contiguous, transposed, behind a 300 ms kernel) and 4 threads
  tapping two-piece tensors at once are bit-exact; one cudaHostAlloc; the
  manifest's "staging" reports the pool, the piece size, the chunked tensors
  and the waits of the tensor larger than the pool;
- CUDA graphs: a tap inside a capture is skipped and each launch of that
  graph adds a skip naming the replay (interposed cudaStreamEndCapture /
  cudaGraphInstantiateWithFlags / cudaGraphLaunch, forwarded to the runtime
  whether or not the shim captures);
- a copy still pending when main returns and the runtime tears down first
  is recorded as skipped, and exit does not wait for the 2 s kernel;
- when the runtime's teardown ran before the shim's finalizer and no device
  tensor was tapped, the finalizer calls nothing in it (a strict mock aborts
  on any late call; this crashed with torch on the GPU machine).
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (NAMES, SOURCE, attr_str, check, expected_bytes, finish, need_build,  # noqa: E402
                              preload_env, probe_lines, program, read_raw, run, tmpdir)

import ctypes  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402

_xxhash = ctypes.CDLL("libxxhash.so.0")  # libxxhash itself, not probe's use of it
_xxhash.XXH64.restype = ctypes.c_uint64
_xxhash.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]


def xxh64(data):
    return _xxhash.XXH64(data, len(data), 0)


def build_mock(d):
    src = os.path.join(SOURCE, "tests", "fakes", "mock_cudart.c")
    lib = os.path.join(d, "libcudart.so.13")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror",
                    "-Wl,-soname,libcudart.so.13", "-o", lib, src, "-lpthread"], check=True)
    return lib


def main():
    need_build()
    d = tmpdir("probe-shim-cudamock-")
    lib = build_mock(d)
    out = os.path.join(d, "cap.h5")
    # the mock runtime never frees its streams: no LeakSanitizer
    r = run([program("shim_tap_device_mock"), lib, d, "main"], preload_env(out, leaks=False))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "device program: every expectation held (rc=%d)" % r.returncode)
    check(probe_lines(r.stderr) == [], "no probe: warnings")
    cases = [json.loads(l) for l in open(os.path.join(d, "cases.jsonl"))]
    with h5py.File(out, "r") as f:
        for c in cases:
            p = c["path"]
            if not check(p in f, "%s present" % p):
                continue
            ds = f[p]
            exp = expected_bytes(c, d)
            check(read_raw(ds).tobytes() == exp, "%s bit-exact (%s, %d bytes)" % (p, NAMES[c["dtype"]], len(exp)))
            check(tuple(ds.shape) == tuple(c["shape"]), "%s shape" % p)
            check(attr_str(ds, "probe.device") == "cuda:%d" % c["device"], "%s probe.device" % p)
        bad = 0
        for t in range(4):
            for i in range(50):
                p = "/dthr%d/%04d/out" % (t, i)
                rows = 3 + i % 5
                want = (t * 1000003 + i * 1009 + np.arange(rows * 11)).astype(np.int32).reshape(rows, 11)
                if p not in f or not np.array_equal(f[p][()], want):
                    bad += 1
        check(bad == 0, "4 threads x 50 device taps present and correct (%d bad)" % bad)
        skips = {s["path"]: s["reason"] for s in json.loads(attr_str(f, "probe.skips"))}
        print("skips:", skips)
        check(skips.get("/cap/0000/out") == "stream is capturing a CUDA graph",
              "tap on a capturing stream recorded as skipped")
        check("treated as capturing" in skips.get("/cap/0001/out", ""),
              "legacy-stream tap during a capture recorded as skipped")
        check(len(skips) == 2, "exactly those two skips")
        m = json.loads(attr_str(f, "probe.manifest"))
        check(m.get("cuda") == {"runtime_version": 13000, "driver_version": 13000,
                                "devices": ["Mock GPU 0", "Mock GPU 1"], "runtime_library": "libcudart.so.13"},
              "manifest cuda: %s" % m.get("cuda"))
        check(m["taps"]["pinned_pool_bytes"] > 0, "manifest reports the pinned pool size")

    dc = tmpdir("probe-shim-cudamock-chunked-")
    outc = os.path.join(dc, "cap.h5")
    r = run([program("shim_tap_device_mock"), lib, dc, "chunked"],
            preload_env(outc, leaks=False, PROBE_PINNED_MB="16"))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "chunked program: every expectation held (rc=%d)" % r.returncode)
    check(probe_lines(r.stderr) == [], "chunked: no probe: warnings")
    cases = [json.loads(l) for l in open(os.path.join(dc, "cases.jsonl"))]
    with h5py.File(outc, "r") as f:
        bad = [c["path"] for c in cases if c["path"] not in f or read_raw(f[c["path"]]).tobytes() != expected_bytes(c, dc)]
        check(len(cases) == 27 and not bad, "chunked: %d tensors bit-exact (bad: %s)" % (len(cases), bad[:5]))
        m = json.loads(attr_str(f, "probe.manifest"))
        stg = m.get("staging", {})
        print("staging:", stg)
        check(stg.get("pool_bytes") == 16 << 20 and stg.get("piece_bytes") == 4 << 20,
              "chunked: 16 MiB pool in 4 MiB pieces")
        # big/0000 (10 pieces), big/0001 (6), bigspin (5), 24 x two pieces
        check(stg.get("chunked_tensors") == 27 and stg.get("tensors") == 27,
              "chunked: 27 tensors, all in several pieces")
        # every one but the transposed big/0001 (gathered after assembly)
        # written piece by piece as the copies arrived (the streamed put)
        check(stg.get("streamed_tensors") == 26, "chunked: 26 row-major tensors streamed, not assembled")
        bad = [c["path"] for c in cases
               if attr_str(f[c["path"]], "probe.hash") != "%016x" % xxh64(expected_bytes(c, dc))]
        check(not bad, "chunked: probe.hash is the XXH64 of the expected bytes (bad: %s)" % bad[:5])
        check(stg.get("copied_bytes") == (40 + 24 + 20 + 24 * 6) << 20, "chunked: bytes copied")
        check(stg.get("waits", 0) >= 1 and stg.get("peak_bytes", 0) <= 16 << 20,
              "chunked: the 40 MiB tensor waited for pool space; peak within the pool")
        check(m["taps"]["pinned_pool_bytes"] == 16 << 20, "chunked: pinned_pool_bytes is the pool")
    shutil.rmtree(dc, ignore_errors=True)
    # PROBE_PINNED_MB=256: 64 MiB segments, 16 MiB pieces; the first segment
    # at the first tap, the others added by the writer thread while idle.
    dc = tmpdir("probe-shim-cudamock-grow-")
    outc = os.path.join(dc, "cap.h5")
    r = run([program("shim_tap_device_mock"), lib, dc, "chunked"],
            preload_env(outc, leaks=False, PROBE_PINNED_MB="256"))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "grow: every expectation held (rc=%d)" % r.returncode)
    cases = [json.loads(l) for l in open(os.path.join(dc, "cases.jsonl"))]
    with h5py.File(outc, "r") as f:
        bad = [c["path"] for c in cases if c["path"] not in f or read_raw(f[c["path"]]).tobytes() != expected_bytes(c, dc)]
        check(len(cases) == 27 and not bad, "grow: %d tensors bit-exact (bad: %s)" % (len(cases), bad[:5]))
        stg = json.loads(attr_str(f, "probe.manifest")).get("staging", {})
        print("staging:", stg)
        check(stg.get("segment_bytes") == 64 << 20 and stg.get("piece_bytes") == 16 << 20
              and stg.get("requested_bytes") == 256 << 20, "grow: 64 MiB segments, 16 MiB pieces")
        check((64 << 20) <= stg.get("pool_bytes", 0) <= (256 << 20) and stg.get("pool_bytes", 1) % (64 << 20) == 0,
              "grow: the pool holds whole segments, at most the requested size")
        check(stg.get("chunked_tensors") == 3, "grow: 40, 24 and 20 MiB tensors in several 16 MiB pieces")
        check(stg.get("streamed_tensors") == 2, "grow: the 40 and 20 MiB row-major tensors streamed")
    shutil.rmtree(dc, ignore_errors=True)

    # CUDA graphs: the tap inside the capture is skipped; each of the 3
    # launches of that graph adds a skip naming the replay; the second graph
    # (no taps) adds nothing; all 5 launches reach the runtime, also when the
    # shim is inactive.
    dg = tmpdir("probe-shim-cudamock-graph-")
    outg = os.path.join(dg, "cap.h5")
    r = run([program("shim_tap_device_mock"), lib, dg, "graph"], preload_env(outg, leaks=False))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "graph program: launches forwarded (rc=%d)" % r.returncode)
    with h5py.File(outg, "r") as f:
        skips = [(s["path"], s["reason"]) for s in json.loads(attr_str(f, "probe.skips"))]
        m = json.loads(attr_str(f, "probe.manifest"))
    print("graph skips:", skips)
    want = [("/gdit/0000/out", "stream is capturing a CUDA graph")] + [
        ("/gdit/0000/out", "replay %d by cudaGraphLaunch of the CUDA graph captured with this tap inside: "
         "not captured" % k) for k in (1, 2, 3)]
    check(skips == want, "graph: the capture-time skip and one skip per replay, in order")
    check(m["taps"]["graph_replays"] == 3, "graph: manifest taps.graph_replays = 3")
    env = preload_env(outg, leaks=False)
    env.pop("PROBE_OUT", None)
    r = run([program("shim_tap_device_mock"), lib, dg, "graph"], env)
    check(r.returncode == 0, "graph program with the shim inactive: every call forwarded (rc=%d)" % r.returncode)
    shutil.rmtree(dg, ignore_errors=True)

    d2 = tmpdir("probe-shim-cudamock-exit-")
    out2 = os.path.join(d2, "cap.h5")
    t0 = time.monotonic()
    r = run([program("shim_tap_device_mock"), lib, d2, "exitpending"], preload_env(out2, leaks=False))
    wall = time.monotonic() - t0
    print(r.stdout, r.stderr, "wall %.3f s" % wall)
    check(r.returncode == 0, "exitpending program exits 0")
    check(wall < 1.8, "exit does not wait for the 2 s kernel (%.3f s)" % wall)
    with h5py.File(out2, "r") as f:
        check(list(f["/first/0000/out"][()]) == [1.0, 2.0, 3.0, 4.0], "tensor flushed before exit is intact")
        check("/pending/0000/out" not in f, "pending device tensor not written")
        skips = {s["path"]: s["reason"] for s in json.loads(attr_str(f, "probe.skips"))}
        reason = skips.get("/pending/0000/out", "")
        check(reason == "process exited before the device copy completed" or reason.startswith("device copy failed"),
              "pending device tensor recorded as skipped (%r)" % reason)
    # The runtime torn down before the finalizer, no device tap made (torch
    # imported and used, nothing tapped on the GPU): no CUDA call at exit.
    for mode in ("lateexit-notap", "lateexit-host"):
        d3 = tmpdir("probe-shim-cudamock-late-")
        out3 = os.path.join(d3, "cap.h5")
        r = run([program("shim_tap_device_mock"), lib, d3, mode],
                preload_env(out3, leaks=False, MOCK_CUDART_STRICT_TEARDOWN="1"))
        print(r.stdout, r.stderr)
        check(r.returncode == 0 and "called after its teardown" not in r.stderr,
              "%s: the shim does not call the CUDA runtime after its teardown (rc=%d)" % (mode, r.returncode))
        with h5py.File(out3, "r") as f:
            m = json.loads(attr_str(f, "probe.manifest"))
            n = len([1 for _ in f.get("host", {})])
        check("cuda" not in m and n == (1 if mode == "lateexit-host" else 0),
              "%s: file closed with its manifest (no CUDA facts gathered late)" % mode)
    finish()


if __name__ == "__main__":
    main()
