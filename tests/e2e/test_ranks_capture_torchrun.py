"""Per-rank capture files with real ranks: torchrun --nproc_per_node 2
(gloo backend, CPU) under probe-run, the Python adapter tapping a small
sequence-parallel denoiser (docs/nccl.md "Per-rank files").

Each rank runs ShardDiT (matched by the table's "*DiT*.forward") on its half
of the sequence (axis 1) for 2 steps, with an all_reduce over gloo between
them. Checked:
- on.rank0.h5 and on.rank1.h5 exist, each with /dit.step/0000..0001/out
  and in.hidden_states, and a manifest with rank, world_size = 2 and
  shard = [{"glob": "/dit.step/*/out", "axis": 1}];
- concatenating the two ranks' outputs along axis 1 gives, bit-exact, the
  single-process output computed here with the same weights (float32,
  the same torch ops, one process);
- on.h5 (written by the torchrun agent, the run's root) is the index:
  no tensors, "ranks": ["on.rank0.h5", "on.rank1.h5"];
- the workers print the same results as without probe.
Runs with the venv's torch (torch 2.11 + torchrun, $PROBE_VENV, default
~/.cache/probe-venv); exits 77 (skipped) when it is absent.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

WORKER = r'''
import os, sys
import numpy as np
import torch
import torch.distributed as dist

class ShardDiT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.w = torch.nn.Parameter(torch.randn(8, 8, generator=g) * 0.25)
    def forward(self, hidden_states):
        return torch.tanh(hidden_states @ self.w)

def full_input():
    g = torch.Generator().manual_seed(3)
    return torch.randn(1, 6, 8, generator=g)

def main():
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    model = ShardDiT()
    x = full_input()
    L = x.shape[1] // n
    h = x[:, r * L:(r + 1) * L].contiguous()
    with torch.no_grad():
        for step in range(2):
            h = model(h)
            s = h.sum().reshape(1)
            dist.all_reduce(s)
            h = h + 0.0 * s  # the collective feeds the next step, value unchanged
    print("rank %d done %s" % (r, float(s)))
    dist.destroy_process_group()

if __name__ == "__main__":
    if sys.argv[1:] == ["reference"]:
        model = ShardDiT()
        h = full_input()
        outs = []
        with torch.no_grad():
            for step in range(2):
                h = model(h)
                outs.append(h.numpy().copy())
        np.save(sys.argv[0] + ".ref.npy", np.stack(outs))
    else:
        main()
'''


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_shim_common import reexec_in_venv
    py = reexec_in_venv()

    import h5py
    import numpy as np
    from test_shim_common import BUILD, asan_runtime, check, clean_env, finish, need_build

    need_build()
    d = tempfile.mkdtemp(prefix="probe-torchrun-")
    worker = os.path.join(d, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    env = clean_env()
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    env.pop("PROBE_TORCHRUN_REEXEC", None)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    r = subprocess.run([py, worker, "reference"], env=env, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "single-process reference ran (%s)" % r.stderr[-300:])
    ref = np.load(worker + ".ref.npy")

    torchrun = os.path.join(os.path.dirname(py), "torchrun")
    out = os.path.join(d, "on.h5")
    cmd = [torchrun, "--nproc_per_node", "2", "--master_port", str(29400 + os.getpid() % 500), worker]
    plain = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    penv = dict(env)
    if asan_runtime():  # the sanitizer build's shim needs its runtime first; probe-run keeps it there
        penv["LD_PRELOAD"] = asan_runtime()
    r = subprocess.run([os.path.join(BUILD, "bin", "probe-run"), "--out", out, "--label", "sp",
                        "--shard", "/dit.step/*/out=1", "--"] + cmd,
                       env=penv, capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr[-3000:])
    check(r.returncode == 0 and plain.returncode == 0, "torchrun under probe-run exits 0 (%d)" % r.returncode)
    def done(text):  # the workers' results (torchrun may add its own notes around them, and
        # two workers writing to one pipe can interleave their lines)
        return sorted(re.findall(r"rank \d+ done -?[0-9.e+-]+?(?=rank|\s|$)", text))
    check(done(r.stdout) == done(plain.stdout) and len(done(plain.stdout)) == 2,
          "the workers' results are the same as without probe (%s / %s)"
          % (done(r.stdout), done(plain.stdout)))
    outs = []
    for rank in (0, 1):
        p = os.path.join(d, "on.rank%d.h5" % rank)
        if not check(os.path.isfile(p), "on.rank%d.h5 exists" % rank):
            continue
        with h5py.File(p, "r") as f:
            m = json.loads(f.attrs["probe.manifest"])
            check(m.get("rank") == rank and m.get("world_size") == 2 and
                  m.get("shard") == [{"glob": "/dit.step/*/out", "axis": 1}],
                  "on.rank%d.h5 manifest: rank %s world_size %s shard %s"
                  % (rank, m.get("rank"), m.get("world_size"), m.get("shard")))
            have = all("/dit.step/%04d/%s" % (i, s) in f for i in (0, 1) for s in ("out", "in.hidden_states"))
            check(have, "on.rank%d.h5 holds dit.step calls 0 and 1 (in and out)" % rank)
            if have:
                outs.append(np.stack([f["/dit.step/%04d/out" % i][()] for i in (0, 1)]))
    if len(outs) == 2:
        joined = np.concatenate(outs, axis=2)  # [step] + [1, L, 8]: the shard axis 1 is axis 2 here
        check(joined.shape == ref.shape and np.array_equal(joined, ref),
              "rank outputs joined along the shard axis equal the single-process output bit-exact")
    if check(os.path.isfile(out), "on.h5 exists"):
        with h5py.File(out, "r") as f:
            m = json.loads(f.attrs["probe.manifest"])
            n = []
            f.visititems(lambda k, o: n.append(k) if isinstance(o, h5py.Dataset) else None)
            check(n == [] and m.get("ranks") == ["on.rank0.h5", "on.rank1.h5"],
                  "on.h5 is the index (tensors %s, ranks %s)" % (n, m.get("ranks")))
    finish()


if __name__ == "__main__":
    main()
