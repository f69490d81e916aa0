#!/usr/bin/env python3
"""Toy text-to-video diffusion pipeline: probe's embedded example.

    python3 toy_pipeline.py [--feature NAME] [--save DIR] [--out video.npy]
                            [--steps N] [--frames F] [--height H] [--width W]
                            [--seed S] [--prompt TEXT] [--negative-prompt TEXT]

Random weights (seeded), CPU, deterministic, a few seconds on 2 cores. The
flow follows diffusers' Wan pipeline: encode prompt and negative prompt
(encode_prompt: prompt_embeds calls 0 and 1, each running the text encoder:
text_encoder calls 0 and 1), create the initial latents from --seed
(prepare_latents: latents.init call 0), set the scheduler's timesteps
(set_timesteps: timesteps call 0), then per step run the denoiser twice
(conditional, then unconditional: dit.step calls 2i and 2i+1), combine with
classifier-free guidance, one scheduler step (scheduler.step call i), and
finally decode the latents with the VAE (vae.decode call 0).

encode_prompt, prepare_latents and set_timesteps are the pipeline's root
inputs (probe's source components prompt_embeds, latents.init, timesteps):
the weights come from --weight-seed (default 0), the initial noise from
--seed, so two runs with different --seed are different experiments until
probe-run --inject gives the candidate the reference's initial latents.

Features (`--feature`), the thing probe is asked to judge:
  chunked-attention  every attention layer uses the online-softmax (flash
                     style) recurrence over key chunks: a transparent kernel
                     swap, differs from the reference only by rounding.
  bf16-denoiser      the denoiser computes in bfloat16 (weights cast; it
                     casts its float32 inputs itself and returns bfloat16,
                     which the pipeline upcasts for guidance): lossy.
  perturb-denoiser   a deliberate bug: the denoiser's self-attention scale
                     is off by 10% (text encoder, scheduler, VAE untouched).
  refactor-patchify  a pure refactor: the denoiser patchifies with
                     Tensor.unfold instead of reshape/permute (the same
                     elements in the same order): bit-identical outputs.

`--save DIR` makes the pipeline itself write every component input and output
it produced with numpy, independently of probe: the tensor that probe's
adapter would capture at /<component>/<call:04>/<slot> is DIR/<component>/
<call:04>/<slot>.npy, and DIR/index.json lists them in execution order with
their logical dtype and shape. bfloat16 tensors are stored as their raw
uint16 bit patterns (numpy has no bfloat16). With `--save-blocks` as well,
forward hooks on the denoiser's blocks (ToyDiTBlock) save every block call
as probe's opt-in component dit.block would capture it (probe-run --blocks):
DIR/dit.block/<call:04>/in.x, in.temb, in.context, out, where call counts
the block calls of the run; their index.json entries also carry the
pipeline's own bookkeeping: step and cfg_branch (the denoising step and the
CFG branch, 0 conditional, 1 unconditional), parent (the denoiser call,
"/dit.step/<call:04>") and block (the block's index in the denoiser).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy_modules as tm  # noqa: E402

FEATURES = ("none", "chunked-attention", "bf16-denoiser", "perturb-denoiser", "refactor-patchify")
PERTURB_SCALE_FACTOR = 1.10


class TensorSaver:
    """Writes component inputs/outputs as .npy under a directory, named by
    probe's dataset path scheme, and an index.json in execution order."""

    def __init__(self, root):
        self.root = root
        self.calls = {}
        self.index = []

    def next_call(self, component):
        n = self.calls.get(component, 0)
        self.calls[component] = n + 1
        return n

    def save(self, component, call, slot, t, meta=None):
        path = f"/{component}/{call:04d}/{slot}"
        t = t.detach()
        dtype = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            arr = t.contiguous().view(torch.int16).numpy().view(np.uint16)
        else:
            arr = t.contiguous().numpy()
        fname = os.path.join(self.root, component, f"{call:04d}", slot + ".npy")
        os.makedirs(os.path.dirname(fname), exist_ok=True)
        np.save(fname, arr)
        entry = {"path": path, "component": component, "call": call, "slot": slot,
                 "dtype": dtype, "shape": list(t.shape), "file": os.path.relpath(fname, self.root)}
        entry.update(meta or {})
        self.index.append(entry)

    def close(self):
        with open(os.path.join(self.root, "index.json"), "w") as fh:
            json.dump({"format": "toy-pipeline-save", "version": 1, "tensors": self.index},
                      fh, indent=1)


class ToyVideoPipeline:
    def __init__(self, weight_seed=0, feature="none", saver=None, scheduler_shift=3.0,
                 save_blocks=False, attention=None, bf16_weights=False):
        if feature not in FEATURES:
            raise ValueError(f"unknown feature {feature!r}; one of {', '.join(FEATURES)}")
        torch.manual_seed(weight_seed)
        self.text_encoder = tm.ToyTextEncoder(dim=32, heads=4, layers=2, max_length=16).eval()
        self.transformer = tm.ToyDiTDenoiser(in_channels=4, dim=64, heads=4, blocks=2,
                                             text_dim=32, patch=2).eval()
        self.vae = tm.ToyVAE(latent_channels=4).eval()
        self.scheduler = tm.ToyFlowMatchScheduler(shift=scheduler_shift)
        self.feature = feature
        self.saver = saver
        chunked = feature == "chunked-attention" or attention == "chunked"
        tm.set_attention_impl("chunked" if chunked else "dense", chunk=32)
        if bf16_weights:  # the bf16 denoiser's weights, held and computed in float32
            self.transformer.to(torch.bfloat16).to(torch.float32)
        if feature == "bf16-denoiser":
            self.transformer.to(torch.bfloat16)
        if feature == "perturb-denoiser":
            self.transformer.set_attention_scale_factor(PERTURB_SCALE_FACTOR)
        self.transformer.patchify_impl = "unfold" if feature == "refactor-patchify" else "reshape"
        self._dit = None  # the denoiser call running now: step, branch, its call, blocks so far
        if saver is not None and save_blocks:
            for blk in self.transformer.blocks:
                blk.register_forward_hook(self._block_hook)

    def _block_hook(self, module, inputs, output):
        """Forward hook of a ToyDiTBlock: save its call as dit.block."""
        d = self._dit
        meta = {"step": d["step"], "cfg_branch": d["branch"],
                "parent": "/dit.step/%04d" % d["call"], "block": d["blocks"]}
        d["blocks"] += 1
        call = self.saver.next_call("dit.block")
        for name, t in zip(("x", "temb", "context"), inputs):
            self.saver.save("dit.block", call, "in." + name, t, meta)
        self.saver.save("dit.block", call, "out", output, meta)

    def _denoise(self, step, branch, latents, tb, embeds):
        """One denoiser call (CFG branch `branch` of denoising step `step`)."""
        if self.saver is not None:
            self._dit = {"step": step, "branch": branch, "call": self.saver.calls.get("dit.step", 0),
                         "blocks": 0}
        try:
            return self._call("dit.step", self.transformer,
                              [("hidden_states", latents), ("timestep", tb),
                               ("encoder_hidden_states", embeds)], ["sample"]).sample
        finally:
            self._dit = None

    # Each component call goes through one of these, so that --save records
    # exactly what the component received and returned, under the argument
    # names of its signature.
    def _call(self, component, fn, args, out_fields):
        saver = self.saver
        if saver is not None:
            call = saver.next_call(component)
            for name, t in args:
                saver.save(component, call, "in." + name, t)
        out = fn(*[t for _, t in args])
        if saver is not None:
            for f in out_fields:
                saver.save(component, call, "out." + f, getattr(out, f))
        return out

    # The root inputs (probe's source components): what they return is saved
    # under prompt_embeds/, latents.init/ and timesteps/.
    def encode_prompt(self, prompt):
        call = self.saver.next_call("prompt_embeds") if self.saver else None
        ids, mask = tm.byte_tokenize([prompt], self.text_encoder.max_length)
        out = self._call("text_encoder", self.text_encoder,
                         [("input_ids", ids), ("attention_mask", mask)], ["last_hidden_state"])
        embeds = out.last_hidden_state
        if self.saver:
            self.saver.save("prompt_embeds", call, "out", embeds)
        return embeds

    def prepare_latents(self, batch, channels, frames, height, width, generator):
        call = self.saver.next_call("latents.init") if self.saver else None
        latents = torch.randn(batch, channels, frames, height, width, generator=generator)
        if self.saver:
            self.saver.save("latents.init", call, "out", latents)
        return latents

    def set_timesteps(self, steps):
        call = self.saver.next_call("timesteps") if self.saver else None
        self.scheduler.set_timesteps(steps)
        if self.saver:
            self.saver.save("timesteps", call, "out.timesteps", self.scheduler.timesteps)
            self.saver.save("timesteps", call, "out.sigmas", self.scheduler.sigmas)

    @torch.no_grad()
    def __call__(self, prompt, negative_prompt="", steps=4, frames=4, height=64, width=64,
                 guidance_scale=5.0, seed=0):
        s = self.vae.scale_factor_spatial * self.transformer.patch
        if height % s or width % s or height <= 0 or width <= 0:
            raise ValueError(f"height and width must be positive multiples of {s}")
        if frames < 1 or steps < 1:
            raise ValueError("frames and steps must be >= 1")
        prompt_embeds = self.encode_prompt(prompt)
        negative_embeds = self.encode_prompt(negative_prompt)

        gen = torch.Generator().manual_seed(seed)
        latents = self.prepare_latents(1, self.transformer.in_channels, frames,
                                       height // self.vae.scale_factor_spatial,
                                       width // self.vae.scale_factor_spatial, gen)
        self.set_timesteps(steps)
        for i, t in enumerate(self.scheduler.timesteps):
            tb = t.expand(latents.shape[0]).contiguous()
            # The denoiser takes float32 inputs and casts them to its own
            # dtype; its output is in that dtype (bfloat16 under
            # bf16-denoiser) and is upcast here for guidance.
            cond = self._denoise(i, 0, latents, tb, prompt_embeds)
            uncond = self._denoise(i, 1, latents, tb, negative_embeds)
            cond, uncond = cond.float(), uncond.float()
            noise_pred = uncond + guidance_scale * (cond - uncond)
            latents = self._call("scheduler.step", self.scheduler.step,
                                 [("model_output", noise_pred), ("timestep", t),
                                  ("sample", latents)], ["prev_sample"]).prev_sample
        video = self._call("vae.decode", self.vae.decode, [("latents", latents)], ["sample"]).sample
        return video


def main(argv=None):
    ap = argparse.ArgumentParser(description="Toy text-to-video diffusion pipeline (probe's example)")
    ap.add_argument("--feature", default="none", choices=FEATURES)
    ap.add_argument("--prompt", default="a red fox running through fresh snow")
    ap.add_argument("--negative-prompt", default="")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--height", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--guidance-scale", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial latents (noise)")
    ap.add_argument("--weight-seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--scheduler-shift", type=float, default=3.0,
                    help="the flow-matching scheduler's timestep shift (its configuration)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: the same reduction order on every host)")
    ap.add_argument("--save", metavar="DIR", help="save every component input/output as .npy")
    ap.add_argument("--save-blocks", action="store_true",
                    help="with --save: also every DiT block's input/output (forward hooks), "
                         "as dit.block")
    ap.add_argument("--out", metavar="FILE", help="save the video [1, 3, F, H, W] float32 as .npy")
    ap.add_argument("--attention", choices=("dense", "chunked"), default=None,
                    help="the attention kernel whatever the feature (chunked: as chunked-attention), "
                         "e.g. a kernel swap of the bf16 denoiser")
    ap.add_argument("--bf16-weights", action="store_true",
                    help="round the denoiser's weights to bfloat16 and compute in float32: the "
                         "float32 oracle of a bf16-denoiser run (docs/gates.md)")
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    saver = None
    if a.save:
        os.makedirs(a.save, exist_ok=True)
        saver = TensorSaver(a.save)
    t0 = time.time()
    try:
        pipe = ToyVideoPipeline(weight_seed=a.weight_seed, feature=a.feature, saver=saver,
                                scheduler_shift=a.scheduler_shift, save_blocks=a.save_blocks,
                                attention=a.attention, bf16_weights=a.bf16_weights)
        video = pipe(a.prompt, a.negative_prompt, steps=a.steps, frames=a.frames, height=a.height,
                     width=a.width, guidance_scale=a.guidance_scale, seed=a.seed)
    except ValueError as e:
        print(f"toy_pipeline: {e}", file=sys.stderr)
        return 2
    if saver is not None:
        saver.close()
    if a.out:
        np.save(a.out, video.numpy())
    print(f"toy_pipeline: feature={a.feature} steps={a.steps} video={list(video.shape)} "
          f"mean={video.double().mean().item():.6f} std={video.double().std().item():.6f} "
          f"({time.time() - t0:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
