"""Build and run a Hugging Face diffusers WanPipeline with random weights
(no downloads), shared by scripts/gpu/lib/wan_run.py (the GPU evidence scripts),
bench/capture_wan.py and tests/e2e/test_observer_wan.py.

Configurations (CONFIGS):
  tiny         the small pipeline of the evidence scripts: 2-layer T5
               (d_model 64), 2-layer WanTransformer3DModel (4 heads x 32),
               a 16-channel AutoencoderKLWan; under a second per run on the
               H200 at 256 x 256, a few seconds on 2 CPU cores at 32 x 32.
  wan2.1-1.3b  the Wan2.1-T2V-1.3B transformer configuration (30 layers,
               12 heads x 128, text_dim 4096, ffn 8960) and the Wan 2.1 VAE
               configuration (base_dim 96, dim_mult 1,2,4,4, 2 res blocks),
               both with random weights; the text encoder is a 2-layer T5
               with d_model 4096 (the real UMT5-XXL has 24 layers: it runs
               once per prompt, outside the denoising loop, and only its
               output shape matters to the pipeline). For benchmarks.

Weights: torch.manual_seed(weight_seed) before construction (tiny: built on
the CPU, then moved; larger configurations directly on the device, in a
torch.device context), so every process builds the same weights. Inputs (prompt token ids, initial latents) come from a CPU
generator seeded with the run's seed, then moved to the device.
Needs torch >= 2.6, transformers and diffusers."""

import contextlib

import torch

CONFIGS = {
    "tiny": {
        "text": dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=8),
        "text_len": 16,
        "transformer": dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32,
                            in_channels=16, out_channels=16, text_dim=64, freq_dim=64, ffn_dim=256,
                            num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                            rope_max_seq_len=64),
        "vae": dict(base_dim=16, z_dim=16, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                    temperal_downsample=[False, True, True]),
    },
    "wan2.1-1.3b": {
        "text": dict(vocab_size=256, d_model=4096, d_kv=64, d_ff=10240, num_layers=2, num_heads=64,
                     relative_attention_num_buckets=32),
        "text_len": 512,
        "transformer": dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                            in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
                            ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
        "vae": dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                    temperal_downsample=[False, True, True]),
    },
}

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def set_deterministic(device, threads=None):
    """Settings under which two runs of the same process give bit-identical
    results: deterministic algorithms, no TF32, no cuDNN autotuning, and on
    the CPU a fixed number of intra-op threads (threads, when given). On
    CUDA, cuBLAS gets a fixed workspace (CUBLAS_WORKSPACE_CONFIG, which
    deterministic algorithms require; set before the first cuBLAS call) and
    an operation without a deterministic kernel warns instead of failing
    (the benchmark then shows whether repeated runs still agree)."""
    import os
    if device != "cpu":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=device != "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if threads:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set or parallel work already started


def build(config="tiny", device="cuda", dtype="bf16", weight_seed=0):
    """The pipeline and its text encoder: (pipe, text_encoder, cfg).
    dtype ("fp32"/"bf16") is the transformer's; the text encoder and the VAE
    stay in float32. The scheduler is FlowMatchEulerDiscreteScheduler
    (shift 7.0), fresh for this pipeline."""
    from transformers import T5Config, T5EncoderModel
    from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline,
                           WanTransformer3DModel)

    cfg = CONFIGS[config]
    torch.manual_seed(weight_seed)
    if device != "cpu":
        torch.cuda.manual_seed_all(weight_seed)
    dev = torch.device(device)
    # The tiny configuration is built on the CPU and moved (the weights the
    # recorded evidence used); larger ones directly on the device (fast init).
    with (contextlib.nullcontext() if config == "tiny" else dev):
        text_encoder = T5EncoderModel(T5Config(**cfg["text"])).eval()
        transformer = WanTransformer3DModel(**cfg["transformer"])
        vae = AutoencoderKLWan(**cfg["vae"]).eval()
    transformer = transformer.to(dev, dtype=DTYPES[dtype]).eval()
    text_encoder = text_encoder.to(dev)
    vae = vae.to(dev)
    pipe = WanPipeline(tokenizer=None, text_encoder=text_encoder, transformer=transformer, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    pipe.set_progress_bar_config(disable=True)
    return pipe, text_encoder, cfg


def make_inputs(cfg, seed, frames, height, width, device):
    """Prompt token ids (positive, negative) of cfg["text_len"] tokens and the
    initial latents [1, 16, (frames-1)//4+1, height//8, width//8], all from a
    CPU generator seeded with seed, moved to device."""
    g = torch.Generator().manual_seed(seed)
    n = cfg["text_len"]
    vocab = cfg["text"]["vocab_size"]
    ids = torch.randint(0, vocab, (1, n), generator=g).to(device)
    neg_ids = torch.randint(0, vocab, (1, n), generator=g).to(device)
    lat_frames = (frames - 1) // 4 + 1
    latents = torch.randn(1, 16, lat_frames, height // 8, width // 8, generator=g).to(device)
    return ids, neg_ids, latents


def encode(text_encoder, ids, neg_ids):
    """Prompt embeddings from the text encoder (its last hidden state)."""
    with torch.no_grad():
        return text_encoder(ids).last_hidden_state, text_encoder(neg_ids).last_hidden_state


def attention_context(name):
    """diffusers' attention backend for "default" / "math" / "flash" / "efficient"."""
    backend = {"default": None, "math": "_native_math", "flash": "_native_flash",
               "efficient": "_native_efficient"}[name]
    if backend is None:
        return contextlib.nullcontext()
    from diffusers.models.attention_dispatch import attention_backend
    return attention_backend(backend)


def run(pipe, prompt_embeds, negative_prompt_embeds, latents, steps, frames, height, width,
        guidance_scale=5.0, output_type="np"):
    """One call of the pipeline; returns the first video of .frames
    (numpy [F, H, W, 3] for output_type "np", a tensor for "pt")."""
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_prompt_embeds,
                    latents=latents, height=height, width=width, num_frames=frames,
                    num_inference_steps=steps, guidance_scale=guidance_scale,
                    output_type=output_type).frames[0]


class SaveHooks:
    """The capture a user writes today: forward hooks on the text encoder and
    the transformer, and wrappers of scheduler.step and vae.decode, that copy
    every tensor input and output to the host (.cpu()) and torch.save it,
    one file per tensor: DIR/<component>/<call:04>/<slot>.pt, named like
    probe's dataset paths (component names of components.json; slots
    in.<argument> and out / out.<i>). Tensors only; nested tuples/lists are
    flattened as out.<i>.<j>."""

    def __init__(self, pipe, out_dir):
        import os
        self.os = os
        self.dir = out_dir
        self.calls = {}
        self.bytes = 0
        self.files = 0
        self.handles = []
        self.handles.append(pipe.text_encoder.register_forward_hook(
            self._module_hook("text_encoder"), with_kwargs=True))
        self.handles.append(pipe.transformer.register_forward_hook(
            self._module_hook("dit.step"), with_kwargs=True))
        pipe.scheduler.step = self._wrap("scheduler.step", pipe.scheduler.step)
        pipe.vae.decode = self._wrap("vae.decode", pipe.vae.decode)

    def _next_call(self, component):
        c = self.calls.get(component, 0)
        self.calls[component] = c + 1
        return c

    def _save(self, component, call, slot, t):
        if isinstance(t, torch.Tensor):
            d = self.os.path.join(self.dir, component, "%04d" % call)
            self.os.makedirs(d, exist_ok=True)
            h = t.detach().cpu()
            torch.save(h, self.os.path.join(d, slot + ".pt"))
            self.bytes += h.numel() * h.element_size()
            self.files += 1
        elif isinstance(t, (tuple, list)):
            for i, x in enumerate(t):
                self._save(component, call, "%s.%d" % (slot, i), x)
        elif hasattr(t, "to_tuple"):  # diffusers BaseOutput / transformers ModelOutput
            for k, v in t.items():
                self._save(component, call, "%s.%s" % (slot, k), v)

    def _module_hook(self, component):
        import inspect

        def hook(module, args, kwargs, output):
            call = self._next_call(component)
            params = list(inspect.signature(module.forward).parameters)
            for i, a in enumerate(args):
                self._save(component, call, "in." + (params[i] if i < len(params) else str(i)), a)
            for k, v in kwargs.items():
                self._save(component, call, "in." + k, v)
            self._save(component, call, "out", output)
        return hook

    def _wrap(self, component, method):
        import functools
        import inspect
        params = list(inspect.signature(method).parameters)

        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            call = self._next_call(component)
            for i, a in enumerate(args):
                self._save(component, call, "in." + (params[i] if i < len(params) else str(i)), a)
            for k, v in kwargs.items():
                self._save(component, call, "in." + k, v)
            out = method(*args, **kwargs)
            self._save(component, call, "out", out)
            return out
        return wrapper
