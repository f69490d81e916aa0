#!/usr/bin/env python3
"""End-to-end on a CUDA machine: the adapter's device path.

Skipped (exit 0, one SKIP line) where the Python in PROBE_PYTHON has no CUDA
device. Two programs run under probe-run:

1. plain torch classes on the GPU (bf16 and float32), one denoising step on a
   side stream, CUDA timesteps (must give NaN, never a synchronizing read),
   a non-contiguous output. After every call the program frees the outputs
   and at once overwrites freshly allocated memory of the same size many
   times on the producing stream: without the adapter's record_stream on
   probe's copy stream, the caching allocator would hand the freed blocks to
   those writes before probe's asynchronous copy read them. The program
   keeps device clones of every tensor (no host copy, so no synchronization
   before the end) and saves them; every dataset must be bit-identical.
2. (when diffusers and transformers are importable) a tiny Hugging Face
   WanPipeline with random weights: T5EncoderModel, WanTransformer3DModel,
   FlowMatchEulerDiscreteScheduler and AutoencoderKLWan must be found by the
   default table with the expected paths, step and cfg_branch; the
   transformer's input/output (taken independently by a torch forward hook)
   must be bit-identical to the capture.
3. a module run through torch.compile: its calls are still tapped once each,
   with the values the compiled module computed.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap

BUILD = os.environ.get("PROBE_BUILD_DIR")
PYTHON = os.environ.get("PROBE_PYTHON", sys.executable)

PLAIN = textwrap.dedent('''
    import contextlib, json, os, sys
    import numpy as np
    import torch

    out_dir = sys.argv[1]
    dev = "cuda"
    keep, meta = {}, {}

    def expect(path, t, step=-1, cfg=-1):
        keep[path] = t.detach().clone()        # device copy on the current stream
        meta[path] = {"step": step, "cfg_branch": cfg}

    class DemoDiT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1024, 1024)
        def forward(self, hidden_states, timestep, encoder_hidden_states):
            h = self.lin(hidden_states) * (timestep[:, None, None] / 1000.0).to(hidden_states.dtype)
            return (h + encoder_hidden_states.mean(dim=1, keepdim=True),)

    class DemoScheduler:
        def step(self, model_output, timestep, sample, return_dict=False):
            return (sample - 0.125 * model_output,)

    class DemoVAE(torch.nn.Module):
        def decode(self, z):
            return {"sample": (z.float() * 2.0).transpose(1, 2)}   # non-contiguous

    def clobber(like, n=8):
        # allocate blocks of the freed size and write them at once, on the
        # current stream
        for i in range(n):
            torch.empty_like(like).fill_(float(i + 7))

    torch.manual_seed(0)
    dit = DemoDiT().to(dev, torch.bfloat16)
    sched = DemoScheduler()
    vae = DemoVAE()
    side = torch.cuda.Stream()
    lat = torch.randn(4, 4096, 1024, device=dev, dtype=torch.bfloat16)   # 32 MiB
    embs = [torch.randn(4, 64, 1024, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    call = 0
    for k in range(3):
        ctx = torch.cuda.stream(side) if k == 1 else contextlib.nullcontext()
        with ctx:
            if k == 1:
                side.wait_stream(torch.cuda.default_stream())
            t = torch.full((4,), 1000.0 - 300.0 * k, device=dev)   # CUDA timestep: NaN
            preds = []
            for branch in range(2):
                p = "/dit.step/%04d/" % call
                expect(p + "in.hidden_states", lat, k, branch)
                expect(p + "in.timestep", t, k, branch)
                expect(p + "in.encoder_hidden_states", embs[branch], k, branch)
                out = dit(lat, t, embs[branch])
                expect(p + "out.0", out[0], k, branch)
                preds.append(out[0] * 1.0)
                del out
                clobber(preds[-1])
                call += 1
            pred = preds[1] + 3.0 * (preds[0] - preds[1])
            p = "/scheduler.step/%04d/" % k
            expect(p + "in.model_output", pred, k)
            expect(p + "in.timestep", t, k)
            expect(p + "in.sample", lat, k)
            new = sched.step(pred, t, lat)[0]
            expect(p + "out.0", new, k)
            del preds, pred
            lat = new
            clobber(lat)
        if k == 1:
            torch.cuda.default_stream().wait_stream(side)
    dec = vae.decode(lat)
    expect("/vae.decode/0000/in.z", lat)
    expect("/vae.decode/0000/out.sample", dec["sample"])
    del dec
    clobber(lat.float())

    os.makedirs(out_dir, exist_ok=True)
    index = []
    for i, (path, t) in enumerate(keep.items()):
        a = (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()
        np.save(os.path.join(out_dir, "%03d.npy" % i), a)
        index.append(dict(meta[path], path=path, file="%03d.npy" % i,
                          dtype=str(t.dtype).replace("torch.", "")))
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f)
    print("ok")
''')

WAN = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import torch
    from transformers import T5Config, T5EncoderModel
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    out_dir = sys.argv[1]
    steps = 3
    dev = "cuda"
    torch.manual_seed(0)
    te = T5EncoderModel(T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                 relative_attention_num_buckets=8)).to(dev).eval()
    tr = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32,
                               in_channels=16, out_channels=16, text_dim=64, freq_dim=64, ffn_dim=256,
                               num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                               rope_max_seq_len=64).to(dev, torch.bfloat16).eval()
    vae = AutoencoderKLWan(base_dim=16, z_dim=16, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True]).to(dev).eval()
    pipe = WanPipeline(tokenizer=None, text_encoder=te, transformer=tr, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    hooked = []
    def hook(mod, args, kwargs, output):
        hooked.append((kwargs["hidden_states"].detach().clone(), output[0].detach().clone()))
    tr.register_forward_hook(hook, with_kwargs=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (1, 16), generator=g).to(dev)
    neg = torch.randint(0, 256, (1, 16), generator=g).to(dev)
    latents = torch.randn(1, 16, 3, 8, 8, generator=g).to(dev)
    with torch.no_grad():
        pe = te(ids).last_hidden_state
        ne = te(neg).last_hidden_state
        video = pipe(prompt_embeds=pe, negative_prompt_embeds=ne, latents=latents, height=64, width=64,
                     num_frames=9, num_inference_steps=steps, guidance_scale=5.0, output_type="np").frames
    os.makedirs(out_dir, exist_ok=True)
    for i, (h, o) in enumerate(hooked):
        np.save(os.path.join(out_dir, "hs%d.npy" % i), h.float().cpu().numpy())
        np.save(os.path.join(out_dir, "out%d.npy" % i), o.float().cpu().numpy())
    json.dump({"calls": len(hooked), "steps": steps}, open(os.path.join(out_dir, "wan.json"), "w"))
    print("wan ok", np.asarray(video).shape)
''')


COMPILED = textwrap.dedent('''
    import os, sys
    import numpy as np
    import torch

    class DemoDiT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)
        def forward(self, hidden_states, timestep):
            return torch.nn.functional.gelu(self.lin(hidden_states)) * timestep

    torch.manual_seed(0)
    m = DemoDiT().cuda()
    cm = torch.compile(m)
    x = torch.randn(8, 64, device="cuda")
    outs = [cm(x, 0.5 * (i + 1)).detach().clone() for i in range(3)]
    np.save(os.path.join(sys.argv[1], "x.npy"), x.cpu().numpy())
    np.save(os.path.join(sys.argv[1], "outs.npy"), torch.stack(outs).cpu().numpy())
    print("compiled ok")
''')


def main():
    probe_cuda = subprocess.run([PYTHON, "-c", "import torch; print(int(torch.cuda.is_available()))"],
                                capture_output=True, text=True)
    if probe_cuda.returncode != 0 or probe_cuda.stdout.strip() != "1":
        print("SKIP test_adapter_cuda: no CUDA device for %s" % PYTHON)
        return 0
    if not BUILD:
        print("PROBE_BUILD_DIR is not set", file=sys.stderr)
        return 1
    import h5py
    import numpy as np

    run = os.path.join(BUILD, "bin", "probe-run")
    failures = []

    def bits_equal(a, b):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind == "f":
            ui = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
            return np.array_equal(np.ascontiguousarray(a).view(ui), np.ascontiguousarray(b).view(ui))
        return np.array_equal(a, b)

    def attr(ds, key, default=None):
        v = ds.attrs.get(key, default)
        if isinstance(v, bytes):
            v = v.decode()
        if isinstance(v, np.generic):
            v = v.item()
        return v

    with tempfile.TemporaryDirectory(prefix="probe-adapter-cuda-") as work:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        # --- 1. plain torch on the GPU ------------------------------------------
        with open(os.path.join(work, "plain.py"), "w") as f:
            f.write(PLAIN)
        h5path = os.path.join(work, "plain.h5")
        r = subprocess.run([run, "--out", h5path, "--", PYTHON, "plain.py", os.path.join(work, "exp")],
                           cwd=work, env=env, capture_output=True, text=True)
        if r.returncode != 0 or r.stdout != "ok\n":
            failures.append("plain: rc %d stdout %r stderr %s" % (r.returncode, r.stdout, r.stderr[-3000:]))
        else:
            notes = [l for l in r.stderr.splitlines() if l.startswith("probe:")]
            if notes:
                failures.append("plain: probe: notes %r" % notes)
            index = json.load(open(os.path.join(work, "exp", "index.json")))
            with h5py.File(h5path, "r") as h5:
                found = set()
                h5.visititems(lambda n, o: found.add("/" + n) if isinstance(o, h5py.Dataset) else None)
                want = {e["path"] for e in index}
                if found != want:
                    failures.append("plain: missing %s, unexpected %s"
                                    % (sorted(want - found), sorted(found - want)))
                for e in index:
                    if e["path"] not in found:
                        continue
                    ds = h5[e["path"]]
                    a = np.load(os.path.join(work, "exp", e["file"]))
                    b = np.asarray(ds[()])
                    if not bits_equal(a, b):
                        bad = int(np.sum(a != b)) if a.shape == b.shape else -1
                        failures.append("plain: %s differs (%d elements)" % (e["path"], bad))
                    for key in ("step", "cfg_branch"):
                        got = attr(ds, "probe." + key, -1)
                        if got != e[key]:
                            failures.append("plain: %s probe.%s = %r, want %r" % (e["path"], key, got, e[key]))
                    if attr(ds, "probe.dtype") != e["dtype"]:
                        failures.append("plain: %s dtype %r, want %r" % (e["path"], attr(ds, "probe.dtype"), e["dtype"]))
                    ts = attr(ds, "probe.timestep", float("nan"))
                    if not (isinstance(ts, float) and math.isnan(ts)):
                        failures.append("plain: %s timestep %r from a CUDA tensor, want NaN" % (e["path"], ts))
                    dev = attr(ds, "probe.device")
                    if dev is not None and dev != "cuda:0":
                        failures.append("plain: %s device %r" % (e["path"], dev))
            print("plain: %d tensors checked" % len(index))

        # --- 2. a real diffusers WanPipeline ---------------------------------------
        have = subprocess.run([PYTHON, "-c", "import diffusers, transformers"], capture_output=True)
        if have.returncode != 0:
            print("SKIP part 2: diffusers/transformers not importable")
        else:
            with open(os.path.join(work, "wan.py"), "w") as f:
                f.write(WAN)
            h5path = os.path.join(work, "wan.h5")
            r = subprocess.run([run, "--out", h5path, "--", PYTHON, "wan.py", os.path.join(work, "wexp")],
                               cwd=work, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                failures.append("wan: rc %d stderr %s" % (r.returncode, r.stderr[-3000:]))
            else:
                info = json.load(open(os.path.join(work, "wexp", "wan.json")))
                steps, calls = info["steps"], info["calls"]
                with h5py.File(h5path, "r") as h5:
                    found = set()
                    h5.visititems(lambda n, o: found.add("/" + n) if isinstance(o, h5py.Dataset) else None)
                    comps = sorted({p.split("/")[1] for p in found})
                    print("wan: components %s, %d datasets" % (comps, len(found)))
                    need = ["/text_encoder/0000/in.input_ids", "/text_encoder/0000/out.last_hidden_state",
                            "/text_encoder/0001/out.last_hidden_state", "/vae.decode/0000/in.z"]
                    for k in range(steps):
                        need.append("/scheduler.step/%04d/out.0" % k)
                    for c in range(calls):
                        need += ["/dit.step/%04d/in.hidden_states" % c, "/dit.step/%04d/out.0" % c]
                    for p in need:
                        if p not in found:
                            failures.append("wan: missing %s" % p)
                    if calls != 2 * steps:
                        failures.append("wan: transformer ran %d times, expected %d" % (calls, 2 * steps))
                    ndit = len({p.split("/")[2] for p in found if p.startswith("/dit.step/")})
                    if ndit != calls:
                        failures.append("wan: %d dit.step calls captured, transformer ran %d" % (ndit, calls))
                    for c in range(calls):
                        p = "/dit.step/%04d/" % c
                        if p + "out.0" not in found:
                            continue
                        ds = h5[p + "out.0"]
                        if attr(ds, "probe.step", -1) != c // 2 or attr(ds, "probe.cfg_branch", -1) != c % 2:
                            failures.append("wan: %s step/cfg %r/%r" % (p, attr(ds, "probe.step"),
                                                                        attr(ds, "probe.cfg_branch")))
                        for slot, fname in (("out.0", "out%d.npy" % c), ("in.hidden_states", "hs%d.npy" % c)):
                            a = np.load(os.path.join(work, "wexp", fname))
                            if not bits_equal(a, np.asarray(h5[p + slot][()], dtype=a.dtype)):
                                failures.append("wan: %s%s differs from the forward hook's copy" % (p, slot))

        # --- 3. a torch.compile'd module -----------------------------------------
        with open(os.path.join(work, "compiled.py"), "w") as f:
            f.write(COMPILED)
        h5path = os.path.join(work, "compiled.h5")
        os.makedirs(os.path.join(work, "cexp"))
        r = subprocess.run([run, "--out", h5path, "--", PYTHON, "compiled.py", os.path.join(work, "cexp")],
                           cwd=work, env=env, capture_output=True, text=True)
        if r.returncode != 0 or r.stdout != "compiled ok\n":
            failures.append("compiled: rc %d stdout %r stderr %s" % (r.returncode, r.stdout, r.stderr[-3000:]))
        else:
            notes = [l for l in r.stderr.splitlines() if l.startswith("probe:")]
            if notes:
                failures.append("compiled: probe: notes %r" % notes)
            x = np.load(os.path.join(work, "cexp", "x.npy"))
            outs = np.load(os.path.join(work, "cexp", "outs.npy"))
            with h5py.File(h5path, "r") as h5:
                found = set()
                h5.visititems(lambda n, o: found.add("/" + n) if isinstance(o, h5py.Dataset) else None)
                want = {"/dit.step/%04d/%s" % (i, s) for i in range(3) for s in ("in.hidden_states", "out")}
                if found != want:
                    failures.append("compiled: datasets %s, want %s" % (sorted(found), sorted(want)))
                for i in range(3):
                    p = "/dit.step/%04d/" % i
                    if p + "out" in found and not bits_equal(outs[i], np.asarray(h5[p + "out"][()])):
                        failures.append("compiled: %sout differs" % p)
                    if p + "in.hidden_states" in found and not bits_equal(x, np.asarray(h5[p + "in.hidden_states"][()])):
                        failures.append("compiled: %sin.hidden_states differs" % p)
                    if p + "out" in found and attr(h5[p + "out"], "probe.timestep") != 0.5 * (i + 1):
                        failures.append("compiled: %s timestep %r" % (p, attr(h5[p + "out"], "probe.timestep")))
            print("compiled: checked")

    if failures:
        for f in failures:
            print("FAIL: " + f, file=sys.stderr)
        return 1
    print("test_adapter_cuda: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
