"""A hand-built transformer block, run whole in one process or 2-way (N-way)
sequence parallel under torch.distributed: the program behind
tests/e2e/test_parallel_gloo.py (CPU, gloo) and scripts/gpu/parallel.sh
(CUDA, NCCL). docs/parallel.md walks through both.

    python sp_block.py [--device cpu|cuda] [--dtype float32|bfloat16] [--attn gather|blockwise]
                       [--steps N] [--seq L] [--dim D] [--heads H] [--batch B]
                       [--seed S] [--save PREFIX]
    torchrun --nproc_per_node 2 sp_block.py ...        (sequence parallel)

The block (class SPBlockDiT, tapped by probe's Python adapter as a dit.step
through the component table's "*DiT*.forward"), on hidden_states [B, L, D]:

    x   = hidden_states + timestep * t_emb                    t_emb [D]
    q,k,v = LayerNorm(x) @ Wq.T, @ Wk.T, @ Wv.T (+ biases)     [B, L, D]
    a   = softmax(q_h k_h^T / sqrt(D/H)) v_h per head h        (no mask)
    x   = x + a @ Wo.T + bo
    out = x + fc2(gelu(fc1(RMSNorm(x))))                      fc1: D -> 4D

Sequence parallel (WORLD_SIZE = W > 1): rank R holds the R-th of W equal
pieces of the sequence (axis 1, L/W tokens) and computes everything on it;
only attention needs the other tokens, so each rank all_gathers its K and V
over the process group (NCCL's ncclAllGather on CUDA through
all_gather_into_tensor, gloo's allgather on the CPU) and attends its own
queries against the full K/V. The block's output on rank R is therefore the
R-th sequence piece of the single-process output: captures are sharded along
axis 1 (probe-run --shard '/dit.step/*/out=1' ...).

--attn gather (default) attends against the gathered K/V at once: the same
reductions as one process. --attn blockwise computes one softmax partial sum
per K/V block (one block per rank; ring attention's merge, running maximum
m, normaliser l and output o rescaled by exp(m_old - m_new)) and merges them:
a parallel partial-sum merge, whose rounding differs from the single
softmax (in one process it is one block).

Steps: the block runs --steps times as a denoising loop; SPScheduler.step
(tapped as scheduler.step by "*Scheduler.step") mixes the block's output
into the sample, sample' = sample + (out - sample) / steps, and the next step
feeds sample' back. timestep is a one-element tensor (replicated on every
rank), t_i = 1 - i/steps.

Weights and the input are drawn on the CPU in float32 from torch.Generator
seeds (weights: --seed, input: --seed + 1), identical on every rank, then
cast to --dtype and moved to --device, so the single-process run and every
rank of the parallel run use the same numbers.

SP_BLOCK_PERTURB_RANK=R (a negative test): rank R (R=0 in a single process)
multiplies its MLP output weight fc2 by 1.05 after building the block, so its
own sequence piece of the output differs from the single-process run.

Each rank prints one line:
    sp_block rank R/W device DEV dtype DT attn A steps N out [B, L/W, D] sum S l2 E
--save PREFIX also writes the last output as PREFIX.rank<R>.npy (float32).
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F


class SPBlockDiT(torch.nn.Module):
    """The transformer block; group = None runs on the whole sequence."""

    def __init__(self, dim, heads, seed, group=None, attn="gather"):
        super().__init__()
        if dim % heads:
            raise ValueError("--dim %d is not a multiple of --heads %d" % (dim, heads))
        if attn not in ("gather", "blockwise"):
            raise ValueError("attn must be gather or blockwise, not %r" % attn)
        self.dim, self.heads, self.group, self.attn = dim, heads, group, attn
        g = torch.Generator().manual_seed(seed)

        def w(*shape, scale):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * scale, requires_grad=False)

        s = 1.0 / math.sqrt(dim)
        self.t_emb = w(dim, scale=0.5)
        self.ln_w, self.ln_b = w(dim, scale=0.1), w(dim, scale=0.1)
        with torch.no_grad():
            self.ln_w += 1.0
        self.wq, self.bq = w(dim, dim, scale=s), w(dim, scale=0.02)
        self.wk, self.bk = w(dim, dim, scale=s), w(dim, scale=0.02)
        self.wv, self.bv = w(dim, dim, scale=s), w(dim, scale=0.02)
        self.wo, self.bo = w(dim, dim, scale=s), w(dim, scale=0.02)
        self.rms_w = w(dim, scale=0.1)
        with torch.no_grad():
            self.rms_w += 1.0
        self.fc1, self.b1 = w(4 * dim, dim, scale=s), w(4 * dim, scale=0.02)
        self.fc2, self.b2 = w(dim, 4 * dim, scale=0.5 / math.sqrt(dim)), w(dim, scale=0.02)

    def _gather_seq(self, t):
        """[B, Lr, D] on each rank -> the W ranks' pieces [B, Lr, D], in rank order."""
        import torch.distributed as dist
        n = dist.get_world_size(self.group)
        t = t.contiguous()
        if dist.get_backend(self.group) == "nccl":
            buf = torch.empty((n,) + tuple(t.shape), dtype=t.dtype, device=t.device)
            dist.all_gather_into_tensor(buf, t, group=self.group)  # one ncclAllGather
            pieces = list(buf.unbind(0))
        else:
            pieces = [torch.empty_like(t) for _ in range(n)]
            dist.all_gather(pieces, t, group=self.group)
        return pieces

    def forward(self, hidden_states, timestep):
        B, L, D = hidden_states.shape
        H = self.heads
        x = hidden_states + timestep.reshape(1, 1, 1).to(hidden_states.dtype) * self.t_emb
        h = F.layer_norm(x, (D,), self.ln_w, self.ln_b, eps=1e-6)
        q = F.linear(h, self.wq, self.bq)
        k = F.linear(h, self.wk, self.bk)
        v = F.linear(h, self.wv, self.bv)
        if self.group is not None:
            kb, vb = self._gather_seq(k), self._gather_seq(v)
        else:
            kb, vb = [k], [v]
        hd = D // H

        def heads(t):  # [B, Lt, D] -> [B, H, Lt, hd]
            return t.reshape(B, t.shape[1], H, hd).transpose(1, 2)

        q = heads(q)
        if self.attn == "gather":
            k, v = heads(torch.cat(kb, dim=1)), heads(torch.cat(vb, dim=1))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
            p = torch.softmax(scores.float(), dim=-1).to(v.dtype)
            a = torch.matmul(p, v)
        else:
            # ring-attention style: one softmax partial sum per K/V block (rank), merged with
            # the running maximum (Milakov & Gimelshein 2018, "Online normalizer calculation
            # for softmax"; Liu et al. 2023, "Ring Attention"): a reordered reduction
            m = l = o = None
            for kt, vt in zip(kb, vb):
                kt, vt = heads(kt), heads(vt)
                sc = (torch.matmul(q, kt.transpose(-1, -2)) / math.sqrt(hd)).float()
                mb = sc.amax(-1, keepdim=True)
                pb = torch.exp(sc - mb)
                lb = pb.sum(-1, keepdim=True)
                ob = torch.matmul(pb.to(vt.dtype), vt).float()
                if m is None:
                    m, l, o = mb, lb, ob
                else:
                    mn = torch.maximum(m, mb)
                    ca, cb = torch.exp(m - mn), torch.exp(mb - mn)
                    m, l, o = mn, l * ca + lb * cb, o * ca + ob * cb
            a = (o / l).to(v.dtype)
        a = a.transpose(1, 2).reshape(B, L, D)
        x = x + F.linear(a, self.wo, self.bo)
        hf = x.float()
        r = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.rms_w
        return x + F.linear(F.gelu(F.linear(r, self.fc1, self.b1)), self.fc2, self.b2)


class SPScheduler:
    """Euler-like mixing step: sample' = sample + (model_output - sample) / steps."""

    def __init__(self, steps):
        self.steps = steps

    def step(self, model_output, timestep, sample):
        return sample + (model_output - sample) / self.steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", choices=("gather", "blockwise"), default="gather")
    ap.add_argument("--save", default=None)
    a = ap.parse_args(argv)
    if a.steps < 1 or a.seq < 1 or a.dim < 1 or a.heads < 1 or a.batch < 1:
        ap.error("--steps, --seq, --dim, --heads and --batch must be positive")

    world = int(os.environ.get("WORLD_SIZE", "1") or "1")
    rank, group = 0, None
    if world > 1:
        import torch.distributed as dist
        if a.device == "cuda" and os.environ.get("PROBE_SHARE_GPU") == "1":
            # every rank on GPU 0 (scripts/gpu/parallel.sh, one-GPU mode): NCCL
            # refuses two ranks on one GPU of one host, so each rank is its own host
            # for NCCL (socket transport on loopback)
            torch.cuda.set_device(0)
            os.environ["NCCL_HOSTID"] = "probe-share-gpu-rank%s" % os.environ.get("RANK", "0")
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        elif a.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        group = dist.group.WORLD
        if a.seq % world:
            sys.exit("sp_block: --seq %d is not a multiple of the world size %d" % (a.seq, world))
    dev = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    dt = getattr(torch, a.dtype)

    model = SPBlockDiT(a.dim, a.heads, a.seed, group, a.attn)
    perturb = os.environ.get("SP_BLOCK_PERTURB_RANK")
    if perturb is not None and perturb.strip() == str(rank):
        with torch.no_grad():
            model.fc2.mul_(1.05)
    model = model.to(device=dev, dtype=dt)
    sched = SPScheduler(a.steps)

    g = torch.Generator().manual_seed(a.seed + 1)
    full = torch.randn(a.batch, a.seq, a.dim, generator=g)
    piece = a.seq // world
    sample = full[:, rank * piece:(rank + 1) * piece].contiguous().to(device=dev, dtype=dt)
    with torch.no_grad():
        for i in range(a.steps):
            t = torch.tensor([1.0 - i / a.steps], dtype=torch.float32, device=dev)
            out = model(sample, t)
            sample = sched.step(out, t, sample)
    res = sample.float().cpu()
    if a.save:
        import numpy as np
        np.save("%s.rank%d.npy" % (a.save, rank), res.numpy())
    print("sp_block rank %d/%d device %s dtype %s attn %s steps %d out %s sum %.9g l2 %.9g"
          % (rank, world, dev.type, a.dtype, a.attn, a.steps, list(res.shape), float(res.sum()),
             float(res.norm())), flush=True)
    if group is not None:
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
