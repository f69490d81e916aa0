"""NCCL interposition with real NCCL on ONE GPU (a world of 1): what can be
checked when no 2-GPU machine is available. Under
  probe-run --out one.h5 --capture '*nccl*' -- python3 nccl_one_gpu.py run DIR
it makes all_reduce (out of place via all_reduce on a copy, in place), an
all_gather_into_tensor (bf16) and a broadcast through torch.distributed's NCCL
backend and saves what it passed and got back; `verify DIR one.h5` then checks
that the capture holds each collective's in/out bit-exact and the manifest's
"nccl" counts. A world of 1 makes every collective a copy: this shows the
hooks reach torch's RTLD_LOCAL libnccl and capture on the GPU, not 2-rank
semantics (scripts/gpu/nccl.sh does those on 2 GPUs).
"""
import json
import os
import sys

from nccl import raw as dataset_bytes  # same folder (scripts/gpu)


def run(d):
    import torch
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(1024, device="cuda", generator=g)
    ar = x.clone()
    dist.all_reduce(ar)
    y = torch.randn(512, device="cuda", generator=g).to(torch.bfloat16)
    ag = torch.empty(512, device="cuda", dtype=torch.bfloat16)
    dist.all_gather_into_tensor(ag, y)
    b = torch.arange(64, device="cuda", dtype=torch.float32)
    dist.broadcast(b, src=0)
    torch.cuda.synchronize()
    torch.save({"x": x.cpu(), "ar": ar.cpu(), "y": y.cpu(), "ag": ag.cpu(), "b": b.cpu()},
               os.path.join(d, "values.pt"))
    dist.destroy_process_group()
    print("nccl_one_gpu: ops done")


def verify(d, cap):
    import h5py
    import torch
    v = {}
    for k, t in torch.load(os.path.join(d, "values.pt")).items():
        v[k] = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).contiguous().numpy().tobytes()
    bad = 0

    def say(ok, what):
        nonlocal bad
        bad += not ok
        print("%s %s" % ("PASS" if ok else "FAIL", what))

    with h5py.File(cap, "r") as f:
        paths = []
        f.visititems(lambda n, o: paths.append("/" + n) if isinstance(o, h5py.Dataset) else None)
        print("captured:", paths)
        m = json.loads(f.attrs["probe.manifest"])
        print("manifest nccl:", json.dumps(m.get("nccl")))

        def raw(p):  # the stored bytes, whatever the element type (bf16 is a custom HDF5 float)
            return dataset_bytes(f[p])

        def one(prefix):
            return sorted(p for p in paths if p.startswith("/nccl/") and p.endswith(prefix))

        ar_in, ar_out = one("all_reduce.in"), one("all_reduce.out")
        say(len(ar_in) == 1 and raw(ar_in[0]) == v["x"],
            "all_reduce in (in place: the value before the call) == x")
        say(len(ar_out) == 1 and raw(ar_out[0]) == v["ar"], "all_reduce out == torch's result")
        ag_in, ag_out = one("all_gather.in"), one("all_gather.out")
        say(len(ag_in) == 1 and raw(ag_in[0]) == v["y"], "all_gather in (bf16) == y")
        say(len(ag_out) == 1 and raw(ag_out[0]) == v["ag"], "all_gather out (bf16) == torch's result")
        bc = one("broadcast.out")
        say(len(bc) == 1 and raw(bc[0]) == v["b"],
            "one broadcast recorded (NCCL's ncclBcast -> ncclBroadcast counted once), out == torch's result")
        nc = m.get("nccl") or {}
        say(nc.get("rank") == 0 and nc.get("nranks") == 1, "manifest nccl rank 0 of 1")
    print("ALL PASS" if bad == 0 else "%d FAIL" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "verify":
        sys.exit(verify(sys.argv[2], sys.argv[3]))
    else:
        print(__doc__)
        sys.exit(2)
