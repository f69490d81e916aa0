"""One run of a small Hugging Face diffusers WanPipeline (random weights from
small configs, prompt embeddings from a small T5 encoder passed in directly,
no downloads), for feature-off / feature-on experiments under probe-run.

  python3 wan_run.py --dtype bf16 --attn math --seed 1 --out video.npy

Every run builds the same weights (torch.manual_seed(0) before construction)
and the same initial latents and prompt tokens (from --seed), so two runs
differ only by the feature switches (--dtype, --attn). Needs torch >= 2.6,
transformers and diffusers (the GPU machine has all but diffusers, which is
carried as a wheel)."""
import argparse
import contextlib
import time

import numpy as np
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16", help="transformer dtype")
ap.add_argument("--attn", choices=["default", "math", "flash", "efficient"], default="default",
                help="attention backend (diffusers attention_backend)")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--device", default="cuda")
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--frames", type=int, default=17)
ap.add_argument("--size", type=int, default=256)
ap.add_argument("--out", default=None, help="save the decoded video (np.save)")
args = ap.parse_args()

from transformers import T5Config, T5EncoderModel  # noqa: E402
from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler,  # noqa: E402
                       WanPipeline, WanTransformer3DModel)
from diffusers.models.attention_dispatch import attention_backend  # noqa: E402

dev = args.device
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False

torch.manual_seed(0)
text_encoder = T5EncoderModel(T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                       num_heads=4, relative_attention_num_buckets=8)).to(dev).eval()
transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32,
                                    in_channels=16, out_channels=16, text_dim=64, freq_dim=64,
                                    ffn_dim=256, num_layers=2, cross_attn_norm=True,
                                    qk_norm="rms_norm_across_heads", rope_max_seq_len=64)
vae = AutoencoderKLWan(base_dim=16, z_dim=16, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                       temperal_downsample=[False, True, True])
transformer = transformer.to(dev, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32).eval()
vae = vae.to(dev).eval()
pipe = WanPipeline(tokenizer=None, text_encoder=text_encoder, transformer=transformer, vae=vae,
                   scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))

g = torch.Generator().manual_seed(args.seed)
ids = torch.randint(0, 256, (1, 16), generator=g).to(dev)
neg_ids = torch.randint(0, 256, (1, 16), generator=g).to(dev)
lat_frames = (args.frames - 1) // 4 + 1
latents = torch.randn(1, 16, lat_frames, args.size // 8, args.size // 8, generator=g).to(dev)

with torch.no_grad():
    prompt_embeds = text_encoder(ids).last_hidden_state
    negative_prompt_embeds = text_encoder(neg_ids).last_hidden_state

backend = {"default": None, "math": "_native_math", "flash": "_native_flash",
           "efficient": "_native_efficient"}[args.attn]
ctx = attention_backend(backend) if backend else contextlib.nullcontext()
t0 = time.time()
with ctx, torch.no_grad():
    video = pipe(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_prompt_embeds,
                 latents=latents, height=args.size, width=args.size, num_frames=args.frames,
                 num_inference_steps=args.steps, guidance_scale=5.0, output_type="np").frames[0]
if dev == "cuda":
    torch.cuda.synchronize()
print("wan_run: dtype=%s attn=%s seed=%d video %s %.3f s" % (args.dtype, args.attn, args.seed,
                                                            tuple(video.shape), time.time() - t0))
if args.out:
    np.save(args.out, video)
