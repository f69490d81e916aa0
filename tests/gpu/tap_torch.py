"""The shim's device path from PyTorch on a real GPU (run by
scripts/gpu-selftest when python3 has torch with CUDA).

usage:
  python3 tap_torch.py run OUT_DIR            under LD_PRELOAD=libprobe_intercept.so, PROBE_OUT set
  python3 tap_torch.py check OUT_DIR FILE.h5  without the preload; needs h5py
  python3 tap_torch.py big                    under the preload with PROBE_PINNED_MB=256: a 1 GiB
                                              int32 tensor (4 pools) and a transposed 384 MiB
                                              float32 view stream through the staging ring
  python3 tap_torch.py checkbig FILE.h5       their values, recomputed with numpy
  python3 tap_torch.py stress                 under the preload: 8 threads, each on its own CUDA
                                              stream, tap 60 int32 tensors of 0.25..10 MiB (a
                                              128 MiB pool they contend for) and overwrite each in
                                              place right after its tap
  python3 tap_torch.py checkstress FILE.h5    every one of the 480 tensors, recomputed

run: torch CUDA tensors are tapped through ctypes exactly as the Python
adapter does (pointer, shape, strides, producer stream; then
record_stream on probe_tap_stream_v1's stream so the caching allocator does
not reuse the memory before probe's copy has read it):
  - contiguous fp32, bf16, a transposed and a sliced fp32 view, fp16
    channels-last, on a side stream;
  - 200 tensors freed right after their tap (the allocator would hand the
    same memory to the next one at once: record_stream must prevent it);
  - a 128 MiB tensor tapped twice on an idle device (the first grows the
    pinned pool, the second reuses it; both times printed), then tapped while
    ~100 matmuls are queued on the producer stream: returns in well under
    their run time, the stream still busy;
  - 8 taps of 64 MiB tensors overwritten in place right after the tap on
    the same stream: the capture holds the values at the tap (the producer
    stream waits on probe's copy);
  - a tap inside torch.cuda.graph capture: recorded as skipped, and the graph
    still replays with the right result (no copy node was added); each of the
    3 replays is recorded as a skip naming the replay.
The expected values (host copies taken by torch after the tap) go to
OUT_DIR/expected.npz. check compares the capture with them bit for bit.
Prints one PASS/FAIL line per check; exit 0 when none failed.
"""
import ctypes
import json
import os
import sys
import time

failures = []


def result(ok, what):
    print("%s %s" % ("PASS" if ok else "FAIL", what))
    if not ok:
        failures.append(what)


class T(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("abi_version", ctypes.c_uint32),
                ("component", ctypes.c_char_p), ("slot", ctypes.c_char_p),
                ("call", ctypes.c_int64), ("step", ctypes.c_int64),
                ("cfg_branch", ctypes.c_int32), ("device", ctypes.c_int32),
                ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("data", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("timestep", ctypes.c_double)]


def run(out_dir):
    import numpy as np
    import torch

    lib = ctypes.CDLL(None)
    lib.probe_tap_v1.argtypes = [ctypes.POINTER(T)]
    lib.probe_tap_stream_v1.argtypes = [ctypes.c_int32]
    lib.probe_tap_stream_v1.restype = ctypes.c_void_p
    codes = {torch.float32: 12, torch.bfloat16: 11, torch.float16: 10}
    ext_streams = {}
    expected = {}

    def tap(component, call, t, stream=None):
        stream = stream or torch.cuda.current_stream()
        rank = t.dim()
        shape = (ctypes.c_int64 * max(rank, 1))(*t.shape)
        strides = (ctypes.c_int64 * max(rank, 1))(*t.stride())
        d = T(ctypes.sizeof(T), 1, component.encode(), b"out", call, -1, -1, t.device.index, codes[t.dtype],
              rank, shape, strides, t.data_ptr(), stream.cuda_stream, float("nan"))
        rc = lib.probe_tap_v1(ctypes.byref(d))
        h = lib.probe_tap_stream_v1(t.device.index)
        if rc == 0 and h and not torch.cuda.is_current_stream_capturing():
            ext = ext_streams.get(h) or torch.cuda.ExternalStream(h, device=t.device)
            ext_streams[h] = ext
            t.record_stream(ext)
        return rc

    def keep(path, t):
        if t.dtype in (torch.bfloat16, torch.float16):
            expected[path] = t.contiguous().view(torch.int16).cpu().numpy()
        else:
            expected[path] = t.contiguous().cpu().numpy()

    torch.manual_seed(0)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        views = {
            "contig_f32": torch.randn(64, 128, device="cuda"),
            "bf16": torch.randn(3, 77, 64, device="cuda", dtype=torch.bfloat16),
            "transposed_f32": torch.randn(128, 96, device="cuda").t(),
            "sliced_f32": torch.randn(50, 80, device="cuda")[5:45:2, 3:70:3],
            "channels_last_f16": torch.randn(2, 16, 12, 20, device="cuda", dtype=torch.float16)
            .to(memory_format=torch.channels_last),
        }
        for i, (name, t) in enumerate(views.items()):
            rc = tap("torch", i, t)
            result(rc == 0, "tap %s (stride %s) returned %d" % (name, tuple(t.stride()), rc))
            keep("/torch/%04d/out" % i, t)
        del views

        bad = 0
        for i in range(200):  # freed at once: record_stream keeps the memory from the allocator
            x = torch.full((256, 1024), float(i), device="cuda")
            bad += tap("reuse", i, x) != 0
            del x
        result(bad == 0, "200 taps of tensors freed right after the tap returned 0")

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        # The staging pool was allocated once, at the first device tap: a
        # 128 MiB tap (two 64 MiB pieces) only enqueues copies.
        t0 = time.perf_counter()
        rc = tap("warm", 0, a)
        first_ms = (time.perf_counter() - t0) * 1e3
        keep("/warm/0000/out", a)
        lib.probe_tap_flush_v1()
        t0 = time.perf_counter()
        rc2 = tap("warm", 1, a)
        again_ms = (time.perf_counter() - t0) * 1e3
        keep("/warm/0001/out", a)
        lib.probe_tap_flush_v1()
        print("128 MiB tensor on an idle device: taps returned in %.3f ms and %.3f ms" % (first_ms, again_ms))
        result(rc == 0 and rc2 == 0 and first_ms < 5 and again_ms < 5,
               "128 MiB taps only enqueue copies (%.3f ms, %.3f ms < 5 ms)" % (first_ms, again_ms))
        # In-place update right after the tap, on the same stream: the
        # producer stream waits for probe's copy, so the capture holds the
        # values at the tap (64 MiB: the copy takes ~1.2 ms, the fill kernels
        # would overtake it without that wait).
        bad = 0
        for i in range(8):
            x = torch.full((16 << 20,), float(i), device="cuda")
            bad += tap("inplace", i, x) != 0
            x.fill_(-1.0)
            x.add_(1.0)
            del x
        result(bad == 0, "8 taps of 64 MiB tensors overwritten in place right after the tap returned 0")
        t0 = time.perf_counter()
        for _ in range(100):
            b = a @ a
        t_launch = time.perf_counter()
        rc = tap("busy", 0, b)
        t_tap = time.perf_counter()
        busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        t_done = time.perf_counter()
        keep("/busy/0000/out", b)
        tap_ms, queued_ms = (t_tap - t_launch) * 1e3, (t_done - t_launch) * 1e3
        print("100 bf16 8192^3 matmuls queued in %.1f ms, ran %.1f ms more; probe_tap_v1 returned in %.3f ms"
              % ((t_launch - t0) * 1e3, queued_ms, tap_ms))
        result(rc == 0 and queued_ms > 50 and tap_ms < 0.1 * queued_ms and busy,
               "tap behind %.0f ms of queued work returned in %.3f ms, producer still busy after it"
               % (queued_ms, tap_ms))
        del a, b

    static = torch.zeros(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static.add_(0)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    rc = None
    with torch.cuda.graph(g):
        static.add_(1)
        rc = tap("graph", 0, static)
    g.replay()
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    result(rc == 0, "tap inside torch.cuda.graph returned %s" % rc)
    result(bool(torch.all(static == 3).item()), "graph replayed 3 times: every element is 3 (no copy node added)")

    rc = lib.probe_tap_flush_v1()
    result(rc == 0, "probe_tap_flush_v1 returned %d" % rc)
    np.savez(os.path.join(out_dir, "expected.npz"), **{k.replace("/", "|"): v for k, v in expected.items()})


def big():
    import torch
    lib = ctypes.CDLL(None)
    lib.probe_tap_v1.argtypes = [ctypes.POINTER(T)]
    n = 1 << 28
    x = torch.arange(n, dtype=torch.int32, device="cuda")
    y = torch.arange(96 << 20, dtype=torch.float32, device="cuda").reshape(8192, 12288).t()
    s = torch.cuda.current_stream()
    for name, t, code in (("big", x, 4), ("bigt", y, 12)):  # probe_dtype int32, float32
        shape = (ctypes.c_int64 * t.dim())(*t.shape)
        strides = (ctypes.c_int64 * t.dim())(*t.stride())
        d = T(ctypes.sizeof(T), 1, name.encode(), b"out", 0, -1, -1, 0, code, t.dim(), shape, strides,
              t.data_ptr(), s.cuda_stream, float("nan"))
        t0 = time.perf_counter()
        rc = lib.probe_tap_v1(ctypes.byref(d))
        print("tap of %s (%d MiB) returned %d in %.1f ms" % (name, t.numel() * 4 >> 20, rc,
                                                          (time.perf_counter() - t0) * 1e3))
        result(rc == 0, "tap of %s returned 0" % name)
        t.add_(1)  # in place, right after: must not show in the capture
    result(lib.probe_tap_flush_v1() == 0, "flush")


def checkbig(path):
    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        ds, ok = f["/big/0000/out"], True
        for i in range(0, 1 << 28, 1 << 24):
            got, want = ds[i:i + (1 << 24)], np.arange(i, i + (1 << 24), dtype=np.int32)
            if not np.array_equal(got, want):
                bad = np.nonzero(got != want)[0]
                print("block at %d: %d differ, first at %d (got %d, want %d), %d equal want+1"
                      % (i, bad.size, i + bad[0], got[bad[0]], want[bad[0]], int(np.sum(got[bad] == want[bad] + 1))))
                ok = False
        result(ok, "1 GiB tensor through a 256 MiB pool, overwritten in place after the tap: bit-exact")
        want = np.arange(96 << 20, dtype=np.float32).reshape(8192, 12288).T
        result(np.array_equal(f["/bigt/0000/out"][()], want), "transposed 384 MiB view: bit-exact")
        m = json.loads(f.attrs["probe.manifest"])
        st = m.get("staging", {})
        print("manifest staging:", st)
        result(st.get("segment_bytes") == 64 << 20 and st.get("pool_bytes", 1) % (64 << 20) == 0
               and 0 < st.get("pool_bytes", 0) <= 256 << 20 and st.get("chunked_tensors") == 2
               and st.get("waits", 0) >= 1,
               "staging: 64 MiB segments, at most 256 MiB, 2 chunked tensors, the producer waited for pool space")


def stress_case(t, i):
    n = (1 + (t * 131 + i * 71) % 40) << 16  # 64 Ki .. 2.6 Mi int32 elements
    return n, t << 24 | i << 16


def stress():
    import threading
    import torch
    lib = ctypes.CDLL(None)
    lib.probe_tap_v1.argtypes = [ctypes.POINTER(T)]
    bad = []

    def worker(t):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for i in range(60):
                n, base = stress_case(t, i)
                x = torch.arange(n, dtype=torch.int32, device="cuda") + base
                shape = (ctypes.c_int64 * 1)(n)
                d = T(ctypes.sizeof(T), 1, ("st%d" % t).encode(), b"out", i, -1, -1, 0, 4, 1, shape, None,
                      x.data_ptr(), s.cuda_stream, float("nan"))
                if lib.probe_tap_v1(ctypes.byref(d)) != 0:
                    bad.append((t, i))
                x.add_(1)  # the capture must hold the value at the tap
                del x
        s.synchronize()

    th = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    t0 = time.perf_counter()
    for x in th:
        x.start()
    for x in th:
        x.join()
    result(not bad and lib.probe_tap_flush_v1() == 0,
           "8 threads x 60 taps on 8 streams returned 0 (%.2f s)" % (time.perf_counter() - t0))


def checkstress(path):
    import h5py
    import numpy as np
    bad = []
    with h5py.File(path, "r") as f:
        for t in range(8):
            for i in range(60):
                n, base = stress_case(t, i)
                p = "/st%d/%04d/out" % (t, i)
                if p not in f or not np.array_equal(f[p][()], np.arange(n, dtype=np.int32) + base):
                    bad.append(p)
        st = json.loads(f.attrs["probe.manifest"]).get("staging", {})
    print("stress staging:", st)
    result(not bad, "480 tensors from 8 threads/streams, overwritten after the tap: bit-exact (bad: %s)" % bad[:5])


def read_raw(ds):
    import h5py
    import numpy as np
    tid = ds.id.get_type()
    arr = np.empty(ds.shape, dtype=np.dtype("V%d" % tid.get_size()))
    ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, arr, mtype=tid)
    return arr.tobytes()


def check(out_dir, path):
    import h5py
    import numpy as np
    exp = np.load(os.path.join(out_dir, "expected.npz"))
    with h5py.File(path, "r") as f:
        for key in exp.files:
            p = key.replace("|", "/")
            if p not in f:
                result(False, "%s present" % p)
                continue
            result(read_raw(f[p]) == exp[key].tobytes(), "%s bit-exact (%s %s)" % (p, exp[key].dtype, exp[key].shape))
        bad = [i for i in range(200) if "/reuse/%04d/out" % i not in f
               or not np.all(f["/reuse/%04d/out" % i][()] == float(i))]
        result(not bad, "200 freed-after-tap tensors hold their own values (bad: %s)" % bad[:5])
        bad = [i for i in range(8) if "/inplace/%04d/out" % i not in f
               or not np.all(f["/inplace/%04d/out" % i][()] == float(i))]
        result(not bad, "64 MiB tensors overwritten in place after the tap hold the values at the tap (bad: %s)"
               % bad)
        skips = [(s["path"], s["reason"]) for s in json.loads(f.attrs["probe.skips"])]
        graph = [r for p, r in skips if p == "/graph/0000/out"]
        print("graph skips:", graph)
        result(graph[:1] == ["stream is capturing a CUDA graph"],
               "tap inside torch.cuda.graph recorded as skipped (%s)" % graph[:1])
        result(len(graph) == 4 and all(r.startswith("replay %d by cudaGraphLaunch" % k)
                                       for k, r in zip((1, 2, 3), graph[1:])),
               "each of the 3 g.replay() calls recorded as a replay skip")
        m = json.loads(f.attrs["probe.manifest"])
        print("manifest staging:", m.get("staging"), "taps:", m.get("taps"))
        cuda = m.get("cuda", {})
        print("manifest cuda:", cuda)
        result(cuda.get("runtime_version", 0) > 0 and len(cuda.get("devices", [])) > 0,
               "manifest records the CUDA runtime/driver and device names")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 2 and sys.argv[1] == "big":
        big()
    elif len(sys.argv) == 3 and sys.argv[1] == "checkbig":
        checkbig(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "stress":
        stress()
    elif len(sys.argv) == 3 and sys.argv[1] == "checkstress":
        checkstress(sys.argv[2])
    else:
        print(__doc__)
        return 2
    print("tap_torch %s: %d failure(s)" % (sys.argv[1], len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
