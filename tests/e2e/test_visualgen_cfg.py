#!/usr/bin/env python3
"""End-to-end: TensorRT-LLM VisualGen conventions (batched CFG, NVTX steps).

TensorRT-LLM cannot be installed here, so this test writes a stand-in
package with VisualGen's module paths, class and method names and call
conventions (tensorrt_llm._utils.nvtx_range = nvtx.annotate(domain=
"TensorRT-LLM"); tensorrt_llm._torch.visual_gen.pipeline.BasePipeline with
denoise / _denoise_step_standard (torch.cat([latents] * 2), prompt embeds
[neg, pos], one transformer call, noise_pred.chunk(2) -> uncond, text) /
_scheduler_step, NVTX ranges `denoise_step {i}` and `_scheduler_step`;
models.wan.pipeline_wan.WanPipeline with _encode_prompt / _prepare_latents;
models.wan.transformer_wan.WanTransformer3DModel with WanBlock blocks) into
a temp dir on PYTHONPATH. The real `nvtx` package and diffusers'
FlowMatchEulerDiscreteScheduler are used. A diffusers-style reference
pipeline (user code, RefPipeline) runs the same model with one call per
branch, conditional first (diffusers' two-call order).

Runs (probe-run, the venv's python):
  vg     the stand-in VisualGen pipeline, 3 steps, after a 2-step warmup
         denoise (steps restart at 0: NVTX gives them, not a call counter);
  ref    RefPipeline, 3 steps, two calls per step;
  vgc    VisualGen, 3 steps, no warmup (compared with ref);
  swap   vgc with a planted bug: the batch is [pos, neg] but still split
         as [uncond, cond].
Asserted: steps and branches of every dit.step / dit.block / scheduler.step
call against the pipeline's own log; the manifest's cfg_batch; probe-compare
ref vgc pairs each reference dit.step/dit.block tensor with the right half of
the batched call (JSON cfg_split; rel_l2 recomputed with numpy on the split
tensors: 0), exits 0 with --expect-identical; ref vs swap exits 1 with the
first failure in dit.step, its rel_l2 equal to numpy's on the halves; a
malformed cfg_batch key leaves path pairing as it is. The stand-in's ranges
use TensorRT-LLM's default color "grey", which the nvtx package cannot
resolve without matplotlib once a tool is attached: every run exiting 0
under probe-run shows that probe's NVTX injection does not make the
pipeline fail.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import BUILD, check, finish, need_build, reexec_in_diffusers_venv  # noqa: E402

FILES = {
    "tensorrt_llm/__init__.py": "__version__ = '0.0.0-standin'\n",
    "tensorrt_llm/_utils.py": '''
        import nvtx
        # TensorRT-LLM's default color "grey": with a tool attached, nvtx
        # resolves it only with matplotlib (not installed here)
        def nvtx_range(msg, color="grey", domain="TensorRT-LLM", category=None):
            return nvtx.annotate(msg, color=color, domain=domain, category=category)
        ''',
    "tensorrt_llm/_torch/__init__.py": "",
    "tensorrt_llm/_torch/visual_gen/__init__.py": "",
    "tensorrt_llm/_torch/visual_gen/models/__init__.py": "",
    "tensorrt_llm/_torch/visual_gen/models/wan/__init__.py": "",
    "tensorrt_llm/_torch/visual_gen/pipeline.py": '''
        import torch, torch.nn as nn
        from tensorrt_llm._utils import nvtx_range
        LOG = []
        class BasePipeline(nn.Module):
            swap = False
            def _denoise_step_standard(self, latents, step_index, timestep, prompt_embeds, forward_fn, guidance_scale):
                latent_input = torch.cat([latents] * 2)
                t = timestep.expand(latent_input.shape[0])
                LOG.append(("dit", step_index, "batched"))
                noise_pred = forward_fn(latent_input, t, prompt_embeds)
                u, c = noise_pred.chunk(2)
                return u + guidance_scale * (c - u)
            @nvtx_range("_scheduler_step")
            def _scheduler_step(self, latents, noise_pred, timestep, scheduler):
                LOG.append(("sched",))
                return scheduler.step(noise_pred, timestep, latents, return_dict=False)[0]
            @nvtx_range("denoise_loop", color="blue")
            def denoise(self, latents, scheduler, prompt_embeds, neg_prompt_embeds, guidance_scale, forward_fn):
                pe = torch.cat([prompt_embeds, neg_prompt_embeds]) if self.swap else torch.cat([neg_prompt_embeds, prompt_embeds])
                for i, t in enumerate(scheduler.timesteps):
                    with nvtx_range(f"denoise_step {i}"):
                        noise_pred = self._denoise_step_standard(latents, i, t, pe, forward_fn, guidance_scale)
                    latents = self._scheduler_step(latents, noise_pred, t, scheduler)
                return latents
        ''',
    "tensorrt_llm/_torch/visual_gen/models/wan/transformer_wan.py": '''
        import torch, torch.nn as nn
        class WanBlock(nn.Module):
            def __init__(self, d):
                super().__init__(); self.lin = nn.Linear(d, d); self.ctx = nn.Linear(d, d)
            def forward(self, x, encoder_hidden_states, temb):
                # per sample, so batch 2 computes exactly what two batch-1 calls do
                return torch.stack([x[b] + torch.tanh(self.lin(x[b]) + self.ctx(encoder_hidden_states[b]).mean(0) + temb[b])
                                    for b in range(x.shape[0])])
        class WanTransformer3DModel(nn.Module):
            def __init__(self, c=4, d=8, layers=2):
                super().__init__()
                self.inp = nn.Linear(c, d); self.out = nn.Linear(d, c)
                self.blocks = nn.ModuleList([WanBlock(d) for _ in range(layers)])
            def forward(self, hidden_states, timestep, encoder_hidden_states):
                B, C, F, H, W = hidden_states.shape
                x = hidden_states.permute(0, 2, 3, 4, 1).reshape(B, F * H * W, C)
                x = torch.stack([self.inp(x[b]) for b in range(B)])
                temb = (timestep.float() / 1000.0).view(B, 1).expand(B, x.shape[-1])
                for blk in self.blocks:
                    x = blk(x, encoder_hidden_states, temb)
                x = torch.stack([self.out(x[b]) for b in range(B)])
                return x.reshape(B, F, H, W, C).permute(0, 4, 1, 2, 3).contiguous()
        ''',
    "tensorrt_llm/_torch/visual_gen/models/wan/pipeline_wan.py": '''
        import torch
        from diffusers import FlowMatchEulerDiscreteScheduler
        from tensorrt_llm._torch.visual_gen.pipeline import BasePipeline
        from tensorrt_llm._utils import nvtx_range
        from .transformer_wan import WanTransformer3DModel
        class WanPipeline(BasePipeline):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.transformer = WanTransformer3DModel()
                self.embed = torch.nn.Embedding(16, 8)
                self.scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
            @nvtx_range("_encode_prompt", color="blue")
            def _encode_prompt(self, prompt, negative_prompt, max_sequence_length):
                return self.embed(torch.tensor([prompt])), self.embed(torch.tensor([negative_prompt]))
            @nvtx_range("_prepare_latents", color="blue")
            def _prepare_latents(self, height, width, num_frames, generator):
                return torch.randn((1, 4, num_frames, height, width), generator=generator)
            @torch.no_grad()
            def forward(self, steps, seed=0, guidance_scale=5.0):
                pe, npe = self._encode_prompt([1, 2, 3], [4, 5, 6], 3)
                latents = self._prepare_latents(2, 2, 2, torch.Generator().manual_seed(seed))
                self.scheduler.set_timesteps(steps)
                def forward_fn(latents, timestep, encoder_hidden_states):
                    return self.transformer(hidden_states=latents, timestep=timestep,
                                            encoder_hidden_states=encoder_hidden_states)
                return self.denoise(latents, self.scheduler, pe, npe, guidance_scale, forward_fn)
        ''',
    "refpipe.py": '''
        import torch
        from tensorrt_llm._torch.visual_gen.models.wan.pipeline_wan import WanPipeline
        from tensorrt_llm._torch.visual_gen.pipeline import LOG
        class RefPipeline:
            """diffusers-style: two calls per step, conditional first (WanPipeline of diffusers)."""
            def __init__(self):
                vg = WanPipeline()
                self.transformer, self.embed, self.scheduler = vg.transformer, vg.embed, vg.scheduler
            def encode_prompt(self, prompt, negative_prompt):
                return self.embed(torch.tensor([prompt])), self.embed(torch.tensor([negative_prompt]))
            def prepare_latents(self, seed):
                return torch.randn((1, 4, 2, 2, 2), generator=torch.Generator().manual_seed(seed))
            @torch.no_grad()
            def __call__(self, steps, seed=0, guidance_scale=5.0):
                pe, npe = self.encode_prompt([1, 2, 3], [4, 5, 6])
                latents = self.prepare_latents(seed)
                self.scheduler.set_timesteps(steps)
                for i, t in enumerate(self.scheduler.timesteps):
                    ts = t.expand(1)
                    LOG.append(("dit", i, "cond"))
                    c = self.transformer(hidden_states=latents, timestep=ts, encoder_hidden_states=pe)
                    LOG.append(("dit", i, "uncond"))
                    u = self.transformer(hidden_states=latents, timestep=ts, encoder_hidden_states=npe)
                    LOG.append(("sched",))
                    latents = self.scheduler.step(u + guidance_scale * (c - u), t, latents, return_dict=False)[0]
                return latents
        ''',
    "gen.py": '''
        import json, sys
        import numpy as np
        mode, out = sys.argv[1], sys.argv[2]
        from tensorrt_llm._torch.visual_gen.pipeline import LOG, BasePipeline
        if mode == "ref":
            from refpipe import RefPipeline
            lat = RefPipeline()(3)
        else:
            from tensorrt_llm._torch.visual_gen.models.wan.pipeline_wan import WanPipeline
            p = WanPipeline()
            BasePipeline.swap = mode == "swap"
            if mode == "vg":
                p.forward(2)
                LOG.append(("warmup-end",))
            lat = p.forward(3)
        np.save(out + ".npy", lat.numpy())
        json.dump(LOG, open(out + ".log.json", "w"))
        ''',
}


def attr(ds, name, default=None):
    v = ds.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def calls(h5, comp):
    """{call: {slot: dataset}} of a component."""
    out = {}
    if comp in h5:
        for c in h5[comp]:
            out[int(c)] = {s: h5[comp][c][s] for s in h5[comp][c]}
    return out


def rel_l2(r, c):
    import numpy as np
    r, c = r.astype(np.float64).ravel(), c.astype(np.float64).ravel()
    n = np.linalg.norm(r)
    return np.linalg.norm(c - r) / n if n else (0.0 if not np.linalg.norm(c) else float("inf"))


def main():
    reexec_in_diffusers_venv("PROBE_VISUALGEN_IN_VENV")
    need_build()
    import h5py
    import numpy as np
    py = sys.executable
    if subprocess.run([py, "-c", "import nvtx"], capture_output=True).returncode != 0:
        print("SKIP: the venv lacks the nvtx package (scripts/setup installs it)")
        sys.exit(77)
    d = tempfile.mkdtemp(prefix="probe-visualgen-")
    pkg = os.path.join(d, "pkg")
    for rel, text in FILES.items():
        path = os.path.join(pkg, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text).lstrip())
    env = dict(os.environ, PYTHONPATH=pkg, OMP_NUM_THREADS="1")
    prun = os.path.join(BUILD, "bin", "probe-run")
    pcmp = os.path.join(BUILD, "bin", "probe-compare")

    def capture(mode, *opts):
        out = os.path.join(d, mode)
        r = subprocess.run([prun, "--out", out + ".h5", *opts, "--", py, os.path.join(pkg, "gen.py"),
                            mode, out], env=env, capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, "%s: probe-run exits 0 (%s)" % (mode, r.stderr.strip()[-300:]))
        return out

    # the nvtx package imports and emits without a GPU (no tool attached, and under the shim)
    r = subprocess.run([py, "-c", "import nvtx\nwith nvtx.annotate('x', domain='TensorRT-LLM'): pass\n"
                        "nvtx.push_range('y'); nvtx.pop_range(); print('ok')"],
                       capture_output=True, text=True)
    check(r.stdout.strip() == "ok", "nvtx imports and emits ranges without a GPU")

    vg = capture("vg", "--blocks")
    with h5py.File(vg + ".h5") as h:
        log = json.load(open(vg + ".log.json"))
        want = [e[1] for e in log if e[0] == "dit"]  # step index of each transformer call
        dit = calls(h, "dit.step")
        check(sorted(dit) == list(range(5)), "vg: 5 dit.step calls (2 warmup + 3), got %s" % sorted(dit))
        check([attr(dit[k]["out"], "probe.step") for k in sorted(dit)] == want == [0, 1, 0, 1, 2],
              "vg: dit.step probe.step from the NVTX ranges, %s" % want)
        check(all(attr(dit[k]["out"], "probe.cfg_branch") == 0 for k in dit),
              "vg: every batched call is cfg_branch 0")
        blk = calls(h, "dit.block")
        check(len(blk) == 10 and all(
            attr(blk[k]["out"], "probe.step") == want[k // 2] and
            attr(blk[k]["out"], "probe.parent") == "/dit.step/%04d" % (k // 2) for k in blk),
            "vg: 10 dit.block calls carry their dit.step call's step and parent")
        sch = calls(h, "scheduler.step")
        check([attr(sch[k]["out.0"], "probe.step") for k in sorted(sch)] == [0, 1, 0, 1, 2],
              "vg: scheduler.step steps follow the denoise_step ranges")
        man = json.loads(attr(h, "probe.manifest"))
        cb = man.get("cfg_batch", {})
        check(cb.get("calls") == [0, 1, 2, 3, 4] and cb.get("order") == ["uncond", "cond"] and
              cb.get("latent_batch") == 1, "vg: manifest cfg_batch %s" % cb)
        check(tuple(dit[0]["in.hidden_states"].shape) == (2, 4, 2, 2, 2), "vg: batch 2 in the call")

    ref = capture("ref", "--blocks")
    with h5py.File(ref + ".h5") as h:
        dit = calls(h, "dit.step")
        check([(attr(dit[k]["out"], "probe.step"), attr(dit[k]["out"], "probe.cfg_branch"))
               for k in sorted(dit)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)],
              "ref: 6 calls, step x branch as the pipeline made them")
        check("cfg_batch" not in json.loads(attr(h, "probe.manifest")), "ref: no cfg_batch")

    vgc = capture("vgc", "--blocks")
    swap = capture("swap", "--blocks")
    check(np.array_equal(np.load(ref + ".npy"), np.load(vgc + ".npy")),
          "the batched and the two-call pipelines give the same latents")

    r = subprocess.run([pcmp, ref + ".h5", vgc + ".h5", "--expect-identical", "--json",
                        os.path.join(d, "c.json")], capture_output=True, text=True)
    check(r.returncode == 0, "compare ref vgc --expect-identical exits 0 (%s)" % r.stdout[-600:])
    check("<- /dit.step/0000/out[1] cond" in r.stdout, "the table names split pairs")
    res = json.load(open(os.path.join(d, "c.json")))
    splits = [t for t in res["tensors"] if "cfg_split" in t]
    with h5py.File(ref + ".h5") as hr, h5py.File(vgc + ".h5") as hc:
        ok, n = True, 0
        for t in splits:
            rd = hr[t["path"]]
            step, br = attr(rd, "probe.step"), attr(rd, "probe.cfg_branch")
            half = 1 if br == 0 else 0  # [uncond, cond]: cond is half 1
            cd = hc[t["cfg_split"]["candidate"]]
            cv = cd[()]
            if cv.shape[0] == 2 * rd.shape[0]:
                cv = cv[half * rd.shape[0]:(half + 1) * rd.shape[0]]
            ok &= (t["cfg_split"]["half"] == half and t["cfg_split"]["branch"] == ("cond" if br == 0 else "uncond")
                   and attr(cd, "probe.step") == step and t["rel_l2"] == rel_l2(rd[()], cv) == 0.0)
            n += 1
        nref = sum(1 for c in ("dit.step", "dit.block") for k in calls(hr, c).values() for _ in k)
        check(ok and n == nref, "every ref dit tensor (%d) is paired with its half: %d split pairs" % (nref, n))
    others = [t for t in res["tensors"] if "cfg_split" not in t]
    check(others and all(not t["path"].startswith(("/dit.step/", "/dit.block/")) for t in others),
          "other components are paired by path as before (%d)" % len(others))
    check(not res.get("missing_in_candidate") and not res.get("missing_in_reference"),
          "nothing missing on either side")

    r = subprocess.run([pcmp, ref + ".h5", swap + ".h5", "--json", os.path.join(d, "s.json")],
                       capture_output=True, text=True)
    check(r.returncode == 1, "compare ref swap exits 1")
    res = json.load(open(os.path.join(d, "s.json")))
    bad = [t for t in res["tensors"] if "cfg_split" in t and t["verdict"] != "pass"]
    with h5py.File(ref + ".h5") as hr, h5py.File(swap + ".h5") as hc:
        t = next((t for t in bad if t["path"] == "/dit.step/0000/in.encoder_hidden_states"), None)
        if check(t is not None, "the swapped prompt halves fail"):
            want = rel_l2(hr[t["path"]][()], hc["/dit.step/0000/in.encoder_hidden_states"][1:2])
            check(abs(t["rel_l2"] - want) <= 1e-12 * max(1.0, want) and want > 0.1,
                  "its rel_l2 %.6g is numpy's on the half %.6g" % (t["rel_l2"], want))
    first = res.get("first_failure")
    first = first.get("path") if isinstance(first, dict) else first
    check(str(first).startswith("/dit."), "the first failure is in the denoiser: %s" % first)
    finish()


if __name__ == "__main__":
    main()
