"""Per-rank capture files (docs/nccl.md "Per-rank files").

Processes started by one probe-run under a launcher-like shell, each with
RANK/WORLD_SIZE (or Open MPI's / Slurm's variables), tap through the tap
ABI (ctypes, host tensors). Checked:
- rank 0 and rank 1 write on.rank0.h5 / on.rank1.h5 (bit-exact tensors,
  manifest rank, world_size, shard), rank 1 exiting 2 s after rank 0; the
  launcher (the run's root, which never tapped) writes on.h5 as the index:
  no tensors, manifest "ranks": ["on.rank0.h5", "on.rank1.h5"];
- a rank killed with SIGKILL after its taps leaves a file whose journal
  recovers every tensor (probe-recover, then h5py, bit-exact);
- OMPI_COMM_WORLD_RANK/SIZE and SLURM_PROCID/NTASKS are used when RANK is
  absent (manifest rank/world_size/rank_source); WORLD_SIZE=1: the plain file;
- probe-run refuses stale rank files (exit 2, one line) and --force removes
  them; --shard with a bad spec exits 2 with one line; PROBE_SHARD bad in
  the environment: one probe: line, no "shard" key ("shard_error" says why);
- a rank that never taps still writes its (empty) file with its manifest.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (BUILD, asan_runtime, check, clean_env, finish, need_build, preload_env,  # noqa: E402
                              run, tmpdir)

import h5py  # noqa: E402
import numpy as np  # noqa: E402

TAPPER = r'''
import ctypes, os, sys, time
import numpy as np
class T(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("abi_version", ctypes.c_uint32),
                ("component", ctypes.c_char_p), ("slot", ctypes.c_char_p), ("call", ctypes.c_int64),
                ("step", ctypes.c_int64), ("cfg_branch", ctypes.c_int32), ("device", ctypes.c_int32),
                ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("data", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("timestep", ctypes.c_double)]
lib = ctypes.CDLL(None)
rank, ntaps, delay, kill = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "kill"
keep = []
for i in range(ntaps):
    a = (np.arange(12, dtype=np.float32) + 100 * rank + i).reshape(3, 4)
    keep.append(a)
    shape = (ctypes.c_int64 * 2)(3, 4)
    t = T(ctypes.sizeof(T), 1, b"toy", b"out", i, -1, -1, -1, 12, 2, shape, None,
          a.ctypes.data, None, float("nan"))
    rc = lib.probe_tap_v1(ctypes.byref(t))
    assert rc == 0, rc
assert lib.probe_tap_flush_v1() == 0
time.sleep(delay)
if kill:
    os.kill(os.getpid(), 9)
'''


def expected(rank, i):
    return (np.arange(12, dtype=np.float32) + 100 * rank + i).reshape(3, 4)


def probe_run(args, env=None):
    return run([os.path.join(BUILD, "bin", "probe-run")] + args, env or clean_env(), timeout=120)


def manifest(path):
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["probe.manifest"]), sorted(f.keys())


def check_rank_file(path, rank, ntaps, world=2, shard=True):
    if not check(os.path.isfile(path), "%s exists" % os.path.basename(path)):
        return
    with h5py.File(path, "r") as f:
        ok = all(np.array_equal(f["/toy/%04d/out" % i][()], expected(rank, i)) for i in range(ntaps))
        n = sum(1 for _ in f["/toy"]) if "toy" in f else 0
        check(ok and n == ntaps, "%s: %d tensors bit-exact" % (os.path.basename(path), ntaps))
        m = json.loads(f.attrs["probe.manifest"])
    check(m.get("rank") == rank and m.get("world_size") == world,
          "%s: manifest rank %s world_size %s" % (os.path.basename(path), m.get("rank"), m.get("world_size")))
    if shard:
        check(m.get("shard") == [{"glob": "/toy/*/out", "axis": 0}, {"glob": "dit.step/*/out", "axis": 1}],
              "%s: manifest shard %s" % (os.path.basename(path), m.get("shard")))


def main():
    need_build()
    d = tmpdir("probe-ranks-")
    tap = os.path.join(d, "tapper.py")
    with open(tap, "w") as f:
        f.write(TAPPER)
    py = "/usr/bin/python3"
    env = clean_env()
    asan = preload_env().get("ASAN_OPTIONS")
    if asan is not None:
        env["ASAN_OPTIONS"] = asan + ":detect_leaks=0"
    if asan_runtime():  # the sanitizer build's shim needs its runtime first; probe-run keeps it there
        env["LD_PRELOAD"] = asan_runtime()
    shard = ["--shard", "/toy/*/out=0", "--shard", "dit.step/*/out=1"]

    # 1. two ranks finishing 2 s apart; the launcher shell writes the index
    out = os.path.join(d, "on.h5")
    script = ("RANK=0 WORLD_SIZE=2 %s %s 0 3 0 run & RANK=1 WORLD_SIZE=2 %s %s 1 3 2 run & wait"
              % (py, tap, py, tap))
    t0 = time.time()
    r = probe_run(["--out", out] + shard + ["--", "bash", "-c", script], env)
    print(r.stdout, r.stderr)
    check(r.returncode == 0 and time.time() - t0 >= 2, "two ranks ran, rank 1 exiting 2 s after rank 0")
    check_rank_file(os.path.join(d, "on.rank0.h5"), 0, 3)
    check_rank_file(os.path.join(d, "on.rank1.h5"), 1, 3)
    m, keys = manifest(out)
    check(keys == [] and m.get("ranks") == ["on.rank0.h5", "on.rank1.h5"],
          "on.h5 is the index: no tensors, ranks %s" % m.get("ranks"))
    check(m.get("shard") is not None and "rank" not in m, "index manifest: shard, no rank of its own")
    check(not [x for x in os.listdir(d) if x.endswith(".journal")], "clean exits leave no journal")

    # 2. stale rank files: refused, then removed with --force
    os.unlink(out)  # (a non-empty --out is refused first, with its own line)
    r = probe_run(["--out", out, "--", "true"], env)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and "per-rank capture files" in lines[0],
          "stale rank files: probe-run exits 2 with one line (%s)" % lines)
    open(os.path.join(d, "on.rankx.h5"), "w").close()  # not a rank file: left alone
    r = probe_run(["--out", out, "--force", "--", "true"], env)
    left = sorted(x for x in os.listdir(d) if x.startswith("on."))
    check(r.returncode == 0 and left == ["on.h5", "on.rankx.h5"],
          "--force removes on.rank<R>.h5 (and only those): %s" % left)

    # 3. a rank killed after its taps: its journal recovers the tensors
    out2 = os.path.join(d, "k.h5")
    script = ("RANK=0 WORLD_SIZE=2 %s %s 0 2 0 run & RANK=1 WORLD_SIZE=2 %s %s 1 4 0.5 kill & wait"
              % (py, tap, py, tap))
    r = probe_run(["--out", out2] + shard + ["--", "bash", "-c", script], env)
    check(r.returncode == 0, "killed-rank run: the launcher exits 0 (%s)" % r.stderr.strip())
    killed = os.path.join(d, "k.rank1.h5")
    check(os.path.exists(killed + ".journal"), "the killed rank left its journal")
    rec = os.path.join(d, "k.rank1.recovered.h5")
    rr = run([os.path.join(BUILD, "bin", "probe-recover"), killed, "-o", rec], clean_env())
    print(rr.stdout, rr.stderr)
    check(rr.returncode == 0, "probe-recover reads the killed rank's file (%s)" % rr.stderr.strip())
    if os.path.exists(rec):
        with h5py.File(rec, "r") as f:
            ok = all(np.array_equal(f["/toy/%04d/out" % i][()], expected(1, i)) for i in range(4))
            check(ok, "the killed rank's 4 tensors recovered bit-exact")
    check_rank_file(os.path.join(d, "k.rank0.h5"), 0, 2)
    m, keys = manifest(out2)
    check(m.get("ranks") == ["k.rank0.h5", "k.rank1.h5"], "index lists both ranks (%s)" % m.get("ranks"))

    # 4. fallbacks and WORLD_SIZE=1, directly under the shim
    for extra, name, src in (({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "o.rank1.h5",
                              "OMPI_COMM_WORLD_RANK"),
                             ({"SLURM_PROCID": "1", "SLURM_NTASKS": "3"}, "s.rank1.h5", "SLURM_PROCID")):
        base = name.split(".")[0]
        e = preload_env(os.path.join(d, base + ".h5"), leaks=False, PROBE_SHARD="/toy/*/out=0,dit.step/*/out=1",
                        **extra)
        r = run([py, tap, "1", "1", "0", "run"], e)
        check(r.returncode == 0, "%s: ran" % src)
        check_rank_file(os.path.join(d, name), 1, 1, world=int(list(extra.values())[1]))
        m, _ = manifest(os.path.join(d, name))
        check(m.get("rank_source") == src, "%s: manifest rank_source %s" % (src, m.get("rank_source")))
    e = preload_env(os.path.join(d, "w1.h5"), leaks=False, RANK="0", WORLD_SIZE="1")
    r = run([py, tap, "0", "1", "0", "run"], e)
    check(r.returncode == 0 and os.path.isfile(os.path.join(d, "w1.h5")) and
          not os.path.exists(os.path.join(d, "w1.rank0.h5")), "WORLD_SIZE=1: the plain file")

    # 5. a rank that never taps writes its empty file; bad PROBE_SHARD
    e = preload_env(os.path.join(d, "n.h5"), leaks=False, RANK="1", WORLD_SIZE="2", PROBE_SHARD="/x/*=99")
    r = run([py, "-c", "pass"], e)
    lines = [l for l in r.stderr.splitlines() if l.startswith("probe:")]
    check(len(lines) == 1 and "PROBE_SHARD" in lines[0], "bad PROBE_SHARD: one probe: line (%s)" % lines)
    m, keys = manifest(os.path.join(d, "n.rank1.h5"))
    check(keys == [] and m.get("rank") == 1 and "shard" not in m and "shard_error" in m,
          "a rank that never tapped: empty n.rank1.h5 with its manifest, no shard key, shard_error")
    check(not os.path.exists(os.path.join(d, "n.h5")), "no index without a launcher root")
    r = probe_run(["--out", out, "--shard", "/x/*=16", "--", "true"], env)
    check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, "--shard GLOB=16: exit 2, one line")
    finish()


if __name__ == "__main__":
    main()
