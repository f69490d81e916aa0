#!/usr/bin/env python3
"""End-to-end: probe-run --blocks on a real diffusers WanPipeline.

The pipeline is scripts/gpu/lib/wan_pipe.py's tiny configuration (2-layer
WanTransformer3DModel in bfloat16, T5 text encoder, AutoencoderKLWan,
FlowMatchEulerDiscreteScheduler; random weights), on the CPU with
deterministic algorithms and 2 threads, 2 steps, guidance 5.0 (both CFG
branches run). It needs the venv of scripts/setup (torch 2.11 + diffusers +
transformers, $PROBE_VENV, default ~/.cache/probe-venv): this test
re-executes itself with that interpreter, and exits 77 (skipped) with the
reason when it is absent.

The driver (written by this test) registers torch forward hooks on every
transformer block that save each block call's tensor inputs and output with
the program's own bookkeeping (the denoiser call it runs in, counted by a
forward pre-hook on the transformer; the step, counted by a wrapper of
scheduler.step; the CFG branch, the call's index within its step; the
block's index in transformer.blocks). Runs:
  a  plain python with the hooks: the reference video;
  b  the same under probe-run --blocks.
Asserted:
  * the video is byte-identical in a and b, both exit 0;
  * b holds dit.block calls for 2 blocks x 2 steps x 2 CFG branches = 8,
    each with exactly the tensors the hooks saw (in.hidden_states,
    in.encoder_hidden_states, in.temb, in.rotary_emb.0/1, out), and every
    one is bit-identical (dtype, shape, bytes; bfloat16 included) to the
    hooks' copy of the same run;
  * each call's probe.step, probe.cfg_branch, probe.parent, probe.block
    equal the hooks' bookkeeping, and probe.class is diffusers'
    WanTransformerBlock: nothing else (attention processors, the VAE's
    parts) was tapped as dit.block;
  * the other components' datasets are those of a capture without --blocks
    (text_encoder, dit.step, scheduler.step, vae.decode and the roots).
"""

import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import reexec_in_diffusers_venv  # noqa: E402

STEPS, FRAMES, SIZE, BLOCKS = 2, 5, 32, 2

DRIVER = textwrap.dedent('''
    import inspect, json, os, sys
    import numpy as np
    import torch
    sys.path.insert(0, sys.argv[1])
    import wan_pipe

    out_video, hook_dir, steps, frames, size = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
    wan_pipe.set_deterministic("cpu", threads=2)
    pipe, text_encoder, cfg = wan_pipe.build("tiny", "cpu", "bf16")
    ids, neg_ids, latents = wan_pipe.make_inputs(cfg, 1, frames, size, size, "cpu")
    pe, npe = wan_pipe.encode(text_encoder, ids, neg_ids)

    book = {"dit": -1, "steps_done": 0, "in_step": 0, "cfg": -1, "blocks": 0}
    calls = []  # per block call: step, cfg_branch, parent, block, module index

    def dit_pre(module, args):
        book["dit"] += 1
        book["cfg"] = book["in_step"]
        book["in_step"] += 1
        book["blocks"] = 0

    pipe.transformer.register_forward_pre_hook(dit_pre)
    step = pipe.scheduler.step

    def counted_step(*a, **k):
        r = step(*a, **k)
        book["steps_done"] += 1
        book["in_step"] = 0
        return r

    pipe.scheduler.step = counted_step

    def save(d, slot, v):
        if isinstance(v, torch.Tensor):
            torch.save(v.detach().clone(), os.path.join(d, slot + ".pt"))
        elif isinstance(v, (tuple, list)):
            for i, x in enumerate(v):
                save(d, "%s.%d" % (slot, i), x)

    def block_hook(index):
        def hook(module, args, kwargs, output):
            n = len(calls)
            d = os.path.join(hook_dir, "dit.block", "%04d" % n)
            os.makedirs(d)
            params = list(inspect.signature(module.forward).parameters)
            for i, a in enumerate(args):
                save(d, "in." + params[i], a)
            for k, v in kwargs.items():
                save(d, "in." + k, v)
            save(d, "out", output)
            calls.append({"step": book["steps_done"], "cfg_branch": book["cfg"],
                          "parent": "/dit.step/%04d" % book["dit"], "block": book["blocks"],
                          "module": index})
            book["blocks"] += 1
        return hook

    for i, blk in enumerate(pipe.transformer.blocks):
        blk.register_forward_hook(block_hook(i), with_kwargs=True)
    video = wan_pipe.run(pipe, pe, npe, latents, steps, frames, size, size)
    np.save(out_video, video)
    with open(os.path.join(hook_dir, "calls.json"), "w") as fh:
        json.dump({"calls": calls, "block_class": "%s.%s" % (type(pipe.transformer.blocks[0]).__module__,
                                                            type(pipe.transformer.blocks[0]).__qualname__)}, fh)
    print("blocks", len(calls))
''')


def reexec_in_venv():
    reexec_in_diffusers_venv("PROBE_BLOCKS_IN_VENV")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    reexec_in_venv()
    import json
    import shutil

    import h5py
    import numpy as np
    import torch

    build = os.environ.get("PROBE_BUILD_DIR")
    src = os.environ.get("PROBE_SOURCE_DIR")
    if not build or not src:
        fail("PROBE_BUILD_DIR and PROBE_SOURCE_DIR must be set (ctest sets them)")
    tmp = tempfile.mkdtemp(prefix="probe-blocks-wan-")
    driver = os.path.join(tmp, "driver.py")
    with open(driver, "w") as fh:
        fh.write(DRIVER)

    def run(name, prefix):
        hooks = os.path.join(tmp, "hooks-" + name)
        os.makedirs(hooks)
        video = os.path.join(tmp, name + ".npy")
        env = dict(os.environ)
        env.pop("PROBE_OUT", None)
        p = subprocess.run(list(prefix) + [sys.executable, driver, os.path.join(src, "scripts", "gpu", "lib"),
                                           video, hooks, str(STEPS), str(FRAMES), str(SIZE)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=600)
        print("run %s: exit %d, stdout %r" % (name, p.returncode, p.stdout.decode()[-200:]))
        if p.returncode != 0:
            fail("run %s exited %d: %s" % (name, p.returncode, p.stderr.decode()[-2000:]))
        return p, video, hooks

    cap = os.path.join(tmp, "b.h5")
    pa, va, _ = run("a", [])
    pb, vb, hb = run("b", [os.path.join(build, "bin", "probe-run"), "--out", cap, "--blocks", "--"])
    errors = []
    if open(va, "rb").read() != open(vb, "rb").read():
        errors.append("the decoded video differs between the plain run and probe-run --blocks")
    probe_lines = [ln for ln in pb.stderr.decode(errors="replace").splitlines() if ln.startswith("probe")]
    if probe_lines:
        errors.append("probe-run --blocks printed %r" % probe_lines)

    with open(os.path.join(hb, "calls.json")) as fh:
        meta = json.load(fh)
    calls = meta["calls"]
    want_book = [{"step": d // 2, "cfg_branch": d % 2, "parent": "/dit.step/%04d" % d, "block": j,
                  "module": j} for d in range(2 * STEPS) for j in range(BLOCKS)]
    if calls != want_book:
        errors.append("the hooks' bookkeeping %r is not 2 blocks per denoiser call, 2 calls per step "
                      "(the test's assumption about the pipeline is wrong)" % calls[:3])
    hooks = {}
    for root, _, files in os.walk(os.path.join(hb, "dit.block")):
        for fn in files:
            rel = os.path.relpath(os.path.join(root, fn), hb)
            hooks["/" + rel[:-len(".pt")]] = os.path.join(root, fn)

    got = {}
    with h5py.File(cap, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                got["/" + name] = (np.array(obj[()], order="C", copy=True),
                                   {k: obj.attrs[k] for k in obj.attrs})
        f.visititems(visit)
    blocks = {p for p in got if p.startswith("/dit.block/")}
    slots = {"in.hidden_states", "in.encoder_hidden_states", "in.temb", "in.rotary_emb.0",
             "in.rotary_emb.1", "out"}
    want = {"/dit.block/%04d/%s" % (k, s) for k in range(len(want_book)) for s in slots}
    if set(hooks) != want:
        errors.append("the hooks saved %s, expected %s" % (sorted(set(hooks) ^ want)[:6],
                                                           "6 tensors per block call"))
    if blocks != want:
        errors.append("dit.block datasets: missing %s, extra %s"
                      % (sorted(want - blocks)[:4], sorted(blocks - want)[:4]))

    def bits(t):
        t = t.detach().contiguous()
        name = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            t = t.float()
        return name, tuple(t.shape), t.numpy().tobytes()

    def s(v):
        return v.decode() if isinstance(v, bytes) else v

    compared = 0
    for p in sorted(blocks & set(hooks)):
        arr, attrs = got[p]
        dname, shape, raw = bits(torch.load(hooks[p]))
        if s(attrs.get("probe.dtype")) != dname or tuple(arr.shape) != shape or arr.tobytes() != raw:
            errors.append("%s: captured %s %s differs from the forward hook's %s %s"
                          % (p, s(attrs.get("probe.dtype")), arr.shape, dname, shape))
        k = int(p.split("/")[2])
        b = want_book[k] if k < len(want_book) else {}
        have = (int(attrs.get("probe.step", -1)), int(attrs.get("probe.cfg_branch", -1)),
                s(attrs.get("probe.parent")), int(attrs.get("probe.block", -1)), s(attrs.get("probe.class")))
        expect = (b.get("step"), b.get("cfg_branch"), b.get("parent"), b.get("block"),
                  "diffusers.models.transformers.transformer_wan.WanTransformerBlock")
        if have != expect:
            errors.append("%s: step/cfg_branch/parent/block/class %r, the hooks say %r" % (p, have, expect))
        if s(attrs.get("probe.module")) != "transformer.blocks.%d" % b.get("module", -1):
            errors.append("%s: probe.module %r, the hooks saw transformer.blocks[%s] run"
                          % (p, s(attrs.get("probe.module")), b.get("module")))
        compared += 1
    if meta["block_class"] != "diffusers.models.transformers.transformer_wan.WanTransformerBlock":
        errors.append("the pipeline's blocks are %s" % meta["block_class"])
    print("compared %d dit.block tensors with the forward hooks' copies" % compared)
    if compared != len(want):
        errors.append("only %d of %d dit.block tensors compared" % (compared, len(want)))

    comps = sorted({p.split("/")[1] for p in got})
    if comps != ["dit.block", "dit.step", "latents.init", "prompt_embeds", "scheduler.step",
                 "text_encoder", "timesteps", "vae.decode"]:
        errors.append("components in the capture: %s" % comps)
    dit = [got[p][1] for p in got if p.startswith("/dit.step/")]
    if len(dit) != 4 * 2 * STEPS or any("probe.parent" in a for a in dit):
        errors.append("dit.step: %d tensors (expected %d), nested: %r"
                      % (len(dit), 4 * 2 * STEPS, [a.get("probe.parent") for a in dit][:2]))

    want_module = {"dit.step": "transformer", "scheduler.step": "scheduler", "timesteps": "scheduler",
                   "vae.decode": "vae", "text_encoder": None}
    for p, (_, attrs) in sorted(got.items()):
        comp = p.split("/")[1]
        if comp in want_module and s(attrs.get("probe.module")) != want_module[comp]:
            errors.append("%s: probe.module %r, expected %r" % (p, s(attrs.get("probe.module")),
                                                               want_module[comp]))
            break

    if errors:
        fail("\n  ".join(errors))
    print("PASS: video identical; %d dit.block tensors (%d calls) bit-identical to forward hooks, "
          "with the hooks' step/cfg_branch/parent/block" % (compared, len(want_book)))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
