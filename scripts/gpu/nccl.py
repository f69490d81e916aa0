"""GPU check of NCCL interposition and per-rank files (docs/nccl.md), used
by scripts/gpu/nccl.sh on a host with 2 GPUs:

  torchrun --nproc_per_node 2 nccl.py run DIR
      Each rank (NCCL backend, one GPU per rank) makes, with inputs that
      differ per rank and sizes that differ per op (so each dataset is
      recognisable by its length):
        all_reduce (f32, 1003, in place), all_gather_into_tensor (bf16, 517),
        reduce_scatter_tensor (f32, 2 x 301), broadcast (f32, 211, from 0),
        send/recv (f32, 97, rank 0 -> 1), batch_isend_irecv (f32, 53 each
        way: ncclGroupStart/End), all_to_all_single (f32, 2 x 41)
      and saves what it passed and what torch returned (CPU copies) as
      DIR/rankR.pt.
  nccl.py verify DIR CAPTURE.h5 [PLAIN_DIR]
      For each rank: CAPTURE's rank file (<stem>.rank<R><ext>) must hold,
      for every saved op, an `in` and an `out` dataset under /nccl/ with the
      op's name whose bytes equal torch's tensors bit-exact (in: the value
      before the call, for in-place ones too); the manifest must carry rank,
      world_size 2 and "nccl" with rank/nranks; CAPTURE itself must be the
      index ("ranks"). With PLAIN_DIR (the same run without probe): every
      result must be bit-identical (no observer effect).
Prints PASS/FAIL/INFO lines; exit 0 when nothing failed.
"""
import json
import os
import sys

FAILS = []


def say(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        FAILS.append(what)
    return ok


def run(d):
    import torch
    import torch.distributed as dist
    r = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    if os.environ.get("PROBE_SHARE_GPU") == "1":
        # every rank on GPU 0; NCCL refuses two ranks on one GPU of one host,
        # so each rank is its own host for NCCL (socket transport on loopback)
        dev = torch.device("cuda", 0)
        os.environ["NCCL_HOSTID"] = "probe-share-gpu-rank%d" % r
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", r)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rec = []

    def vals(count, dtype=torch.float32, k=0):
        return (torch.arange(count, device=dev, dtype=torch.float32) * 0.5 + 1000 * r + k).to(dtype)

    def add(op, inp, out):
        rec.append({"op": op, "in": None if inp is None else inp.detach().cpu().clone(),
                    "out": None if out is None else out.detach().cpu().clone()})

    # all_reduce, in place: the input is the value before the call
    t = vals(1003, k=1)
    before = t.clone()
    dist.all_reduce(t)
    torch.cuda.synchronize()
    add("all_reduce", before, t)
    # all_gather_into_tensor, bf16
    x = vals(517, torch.bfloat16, k=2)
    y = torch.empty(n * 517, device=dev, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(y, x)
    torch.cuda.synchronize()
    add("all_gather", x, y)
    # reduce_scatter_tensor
    x = vals(n * 301, k=3)
    y = torch.empty(301, device=dev)
    dist.reduce_scatter_tensor(y, x)
    torch.cuda.synchronize()
    add("reduce_scatter", x, y)
    # broadcast from 0 (the root's input only)
    t = vals(211, k=4)
    before = t.clone()
    dist.broadcast(t, src=0)
    torch.cuda.synchronize()
    add("broadcast", before if r == 0 else None, t)
    # send / recv
    if r == 0:
        x = vals(97, k=5)
        dist.send(x, dst=1)
        torch.cuda.synchronize()
        add("send", x, None)
    else:
        y = torch.empty(97, device=dev)
        dist.recv(y, src=0)
        torch.cuda.synchronize()
        add("recv", None, y)
    # batch_isend_irecv: one group of a send and a recv per rank
    x = vals(53, k=6)
    y = torch.empty(53, device=dev)
    peer = (r + 1) % n
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)])
    for q in reqs:
        q.wait()
    torch.cuda.synchronize()
    add("send", x, None)
    add("recv", None, y)
    # all_to_all_single (NCCL AlltoAll, or grouped send/recv)
    x = vals(n * 41, k=7)
    y = torch.empty(n * 41, device=dev)
    dist.all_to_all_single(y, x)
    torch.cuda.synchronize()
    add("all_to_all", x, y)
    torch.save(rec, os.path.join(d, "rank%d.pt" % r))
    dist.destroy_process_group()
    print("rank %d: %d ops done" % (r, len(rec)))


def raw(ds):
    import h5py
    import numpy as np
    tid = ds.id.get_type()
    arr = np.empty(ds.shape, dtype=np.dtype("V%d" % tid.get_size()))
    if arr.size:
        ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, arr, mtype=tid)
    return arr.tobytes()


def tbytes(t):
    import torch
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy().tobytes()


def verify(d, cap, plain=None):
    import h5py
    import torch
    base = os.path.basename(cap)
    stem, ext = os.path.splitext(cap)
    names = []
    for r in (0, 1):
        path = "%s.rank%d%s" % (stem, r, ext)
        names.append(os.path.basename(path))
        if not say(os.path.isfile(path), "rank %d: %s exists" % (r, os.path.basename(path))):
            continue
        rec = torch.load(os.path.join(d, "rank%d.pt" % r))
        with h5py.File(path, "r") as f:
            m = json.loads(f.attrs["probe.manifest"])
            say(m.get("rank") == r and m.get("world_size") == 2, "rank %d: manifest rank/world_size" % r)
            nc = m.get("nccl", {})
            say(nc.get("rank") == r and nc.get("nranks") == 2,
                "rank %d: manifest nccl rank %s nranks %s" % (r, nc.get("rank"), nc.get("nranks")))
            print("INFO rank %d nccl calls: %s" % (r, json.dumps(nc.get("calls"))))
            data = {}

            def keep(k, o):  # returns None: visititems stops at the first non-None return
                if isinstance(o, h5py.Dataset):
                    data["/" + k] = o
            f.visititems(keep)
            by_op = {}
            for p, ds in data.items():
                slot = p.rsplit("/", 1)[1]
                by_op.setdefault(slot, []).append((p, raw(ds)))
            skips = json.loads(f.attrs["probe.skips"]) if "probe.skips" in f.attrs else []
            if skips:
                print("INFO rank %d skips: %s" % (r, skips[:5]))
            for i, e in enumerate(rec):
                for kind in ("in", "out"):
                    t = e[kind]
                    if t is None:
                        continue
                    want = tbytes(t)
                    ops = [e["op"]] if e["op"] != "all_to_all" else ["all_to_all", "send", "recv"]
                    hit = [p for op in ops for p, b in by_op.get("%s.%s" % (op, kind), []) if b == want]
                    if e["op"] == "all_to_all" and not hit:
                        print("INFO rank %d: all_to_all_single %s not found as one dataset (torch may "
                              "split it into grouped send/recv)" % (r, kind))
                        continue
                    say(bool(hit), "rank %d: %s.%s (%d elements, %s) bit-exact in %s"
                        % (r, e["op"], kind, t.numel(), str(t.dtype).replace("torch.", ""),
                           hit[0] if hit else "no dataset"))
        if plain:
            ref = torch.load(os.path.join(plain, "rank%d.pt" % r))
            same = len(ref) == len(rec) and all(
                (a[k] is None and b[k] is None) or (a[k] is not None and b[k] is not None and
                                                    tbytes(a[k]) == tbytes(b[k]))
                for a, b in zip(ref, rec) for k in ("in", "out"))
            say(same, "rank %d: every result bit-identical to the run without probe" % r)
    if say(os.path.isfile(cap), "%s exists" % base):
        with h5py.File(cap, "r") as f:
            m = json.loads(f.attrs["probe.manifest"])
            say(m.get("ranks") == names, "%s is the index: ranks %s" % (base, m.get("ranks")))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2])
        return 0
    if len(sys.argv) in (4, 5) and sys.argv[1] == "verify":
        verify(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else None)
        print("nccl_check: %s" % ("FAIL (%d)" % len(FAILS) if FAILS else "PASS"))
        return 1 if FAILS else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
