"""Components of the toy text-to-video diffusion pipeline (plain torch, CPU).

Every component is a real torch module (or, for the scheduler, a plain class
like diffusers' schedulers) with the class and method names that probe's
component table matches by default:

    ToyTextEncoder.forward(input_ids, attention_mask)      -> ToyTextEncoderOutput(last_hidden_state)
    ToyDiTDenoiser.forward(hidden_states, timestep,
                           encoder_hidden_states)           -> ToyDenoiserOutput(sample)
    ToyFlowMatchScheduler.step(model_output, timestep,
                               sample)                      -> ToySchedulerOutput(prev_sample)
    ToyVAE.decode(latents)                                  -> ToyDecoderOutput(sample)

Internal building blocks are deliberately named so that they do NOT match
those patterns (no "TextEncoder", "DiT", "Denoiser", "Scheduler" or "VAE" in
their class names): only the four component boundaries are captured. The
one exception is the denoiser's transformer block, ToyDiTBlock.forward(x,
temb, context) -> x: the opt-in component dit.block (probe-run --blocks)
finds it by its name (*DiTBlock.forward). Without --blocks it matches
dit.step's *DiT*.forward, but it only runs inside ToyDiTDenoiser.forward,
so the re-entrancy guard (docs/components.md) never taps it as dit.step.

Attention is written out by hand (torch 1.13 has no
scaled_dot_product_attention). Two implementations exist:
  * "dense":   softmax(q k^T * scale) v, as one matrix product each;
  * "chunked": the online-softmax (flash-attention style) recurrence over key
               chunks (Milakov & Gimelshein 2018, "Online normalizer
               calculation for softmax"; Dao et al. 2022, "FlashAttention"),
               mathematically identical, different rounding.
The implementation is chosen globally with set_attention_impl(), which is how
the pipeline's `--feature chunked-attention` swaps the "kernel".
"""

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# attention "backend"

_ATTENTION = {"impl": "dense", "chunk": 32}


def set_attention_impl(impl: str, chunk: int = 32) -> None:
    """Select the attention implementation for every attention layer:
    "dense" or "chunked" (online softmax over key chunks of `chunk` keys)."""
    if impl not in ("dense", "chunked"):
        raise ValueError(f"unknown attention implementation {impl!r}")
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    _ATTENTION["impl"] = impl
    _ATTENTION["chunk"] = int(chunk)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Scaled dot-product attention.

    q [B, H, Lq, d], k and v [B, H, Lk, d] (same dtype); key_mask [B, Lk] bool,
    True = the key may be attended to (None = all). Returns [B, H, Lq, d].
    Every query must have at least one valid key.
    """
    if _ATTENTION["impl"] == "dense":
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        if key_mask is not None:
            s = s.masked_fill(~key_mask[:, None, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, v)
    return _attention_chunked(q, k, v, scale, key_mask, _ATTENTION["chunk"])


def _attention_chunked(q, k, v, scale, key_mask, chunk):
    # Online softmax: running max m, running normaliser l, running output acc.
    # For each chunk j: m' = max(m, max_j s); acc = acc*e^(m-m') + e^(s-m') v_j;
    # l = l*e^(m-m') + sum e^(s-m'). Output acc / l.
    shape = q.shape[:-1] + (1,)
    m = torch.full(shape, float("-inf"), dtype=q.dtype)
    l = torch.zeros(shape, dtype=q.dtype)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    lk = k.shape[-2]
    for j in range(0, lk, chunk):
        kj = k[..., j:j + chunk, :]
        vj = v[..., j:j + chunk, :]
        s = torch.matmul(q, kj.transpose(-1, -2)) * scale
        if key_mask is not None:
            s = s.masked_fill(~key_mask[:, None, None, j:j + chunk], float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        # rows whose keys so far are all masked: keep exp() finite (it gives 0)
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + torch.matmul(p, vj)
        m = m_new
    return acc / l


class MultiHeadAttention(nn.Module):
    """Multi-head attention, self (context None) or cross. x [B, L, D],
    context [B, Lc, Dc]; key_mask [B, Lk] bool. The q/k weights are scaled
    by qk_gain at init (see below). scale_factor multiplies the
    usual 1/sqrt(head_dim) scale (1.0 normally; the deliberate bug of
    `--feature perturb-denoiser` sets it slightly off)."""

    def __init__(self, dim: int, heads: int, context_dim: Optional[int] = None,
                 qk_gain: float = 2.5):
        super().__init__()
        if dim % heads:
            raise ValueError("dim must be divisible by heads")
        self.heads = heads
        self.head_dim = dim // heads
        self.scale_factor = 1.0
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(context_dim or dim, dim)
        self.to_v = nn.Linear(context_dim or dim, dim)
        self.to_out = nn.Linear(dim, dim)
        # Random-init attention is almost uniform (logit std ~0.35); a trained
        # model's is peaked. Scaling the q/k weights by qk_gain gives logits
        # of std ~2, so attention (and a bug in it) matters as in a real model.
        with torch.no_grad():
            self.to_q.weight.mul_(qk_gain)
            self.to_k.weight.mul_(qk_gain)

    def forward(self, x, context=None, key_mask=None):
        ctx = x if context is None else context
        b, lq, _ = x.shape
        lk = ctx.shape[1]
        q = self.to_q(x).view(b, lq, self.heads, self.head_dim).transpose(1, 2)
        k = self.to_k(ctx).view(b, lk, self.heads, self.head_dim).transpose(1, 2)
        v = self.to_v(ctx).view(b, lk, self.heads, self.head_dim).transpose(1, 2)
        scale = self.scale_factor / math.sqrt(self.head_dim)
        o = attention(q, k, v, scale, key_mask)
        return self.to_out(o.transpose(1, 2).reshape(b, lq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim * mult)
        self.fc2 = nn.Linear(dim * mult, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


# ---------------------------------------------------------------------------
# tokenizer + text encoder

def byte_tokenize(prompts, max_length: int):
    """Trivial deterministic tokenizer: [BOS=1] + (UTF-8 byte + 2)..., padded
    with 0 (PAD) or truncated to max_length. Returns (input_ids int64 [B, L],
    attention_mask int64 [B, L], 1 = real token)."""
    if max_length < 1:
        raise ValueError("max_length must be >= 1")
    ids = torch.zeros(len(prompts), max_length, dtype=torch.int64)
    mask = torch.zeros(len(prompts), max_length, dtype=torch.int64)
    for i, p in enumerate(prompts):
        toks = [1] + [b + 2 for b in p.encode("utf-8")]
        toks = toks[:max_length]
        ids[i, :len(toks)] = torch.tensor(toks, dtype=torch.int64)
        mask[i, :len(toks)] = 1
    return ids, mask


BYTE_VOCAB = 258


@dataclass
class ToyTextEncoderOutput:
    last_hidden_state: torch.Tensor  # [B, L, D] float32


class ToyEncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer (self-attention + MLP)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x, key_mask):
        x = x + self.attn(self.norm1(x), key_mask=key_mask)
        return x + self.ff(self.norm2(x))


class ToyTextEncoder(nn.Module):
    """Token + position embedding, `layers` pre-norm encoder layers, final
    LayerNorm. forward(input_ids int64 [B, L], attention_mask int64 [B, L])
    -> ToyTextEncoderOutput(last_hidden_state float32 [B, L, dim])."""

    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2, max_length: int = 16):
        super().__init__()
        self.dim = dim
        self.max_length = max_length
        self.token_embedding = nn.Embedding(BYTE_VOCAB, dim)
        self.position_embedding = nn.Parameter(torch.randn(max_length, dim) * 0.02)
        self.layers = nn.ModuleList([ToyEncoderLayer(dim, heads) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(dim)

    def forward(self, input_ids, attention_mask):
        x = self.token_embedding(input_ids) + self.position_embedding[: input_ids.shape[1]]
        key_mask = attention_mask.bool()
        for layer in self.layers:
            x = layer(x, key_mask)
        return ToyTextEncoderOutput(last_hidden_state=self.final_norm(x))


# ---------------------------------------------------------------------------
# denoiser (DiT)

def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of timesteps t [B] (float32) -> [B, dim]
    (Vaswani et al. 2017; the cos/sin layout of diffusers' get_timestep_embedding)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None, :]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


@dataclass
class ToyDenoiserOutput:
    sample: torch.Tensor  # [B, C, F, H, W], in the denoiser's parameter dtype


class ToyDiTBlock(nn.Module):
    """DiT block: adaLN modulation from the timestep embedding, self-attention
    over all video tokens, cross-attention to the text, MLP (Peebles & Xie
    2023, "Scalable Diffusion Models with Transformers"; Wan 2.1 layout)."""

    def __init__(self, dim: int, heads: int, text_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.self_attn = MultiHeadAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = MultiHeadAttention(dim, heads, context_dim=text_dim)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=False)
        self.ff = FeedForward(dim)
        self.modulation = nn.Linear(dim, 6 * dim)

    def forward(self, x, temb, context):
        sh1, sc1, g1, sh2, sc2, g2 = self.modulation(F.silu(temb))[:, None, :].chunk(6, dim=-1)
        x = x + g1 * self.self_attn(self.norm1(x) * (1 + sc1) + sh1)
        x = x + self.cross_attn(self.norm2(x), context=context)
        return x + g2 * self.ff(self.norm3(x) * (1 + sc2) + sh2)


class ToyDiTDenoiser(nn.Module):
    """Video diffusion transformer. forward(hidden_states [B, C, F, H, W],
    timestep [B] float32 in [0, 1000], encoder_hidden_states [B, L, text_dim])
    -> ToyDenoiserOutput(sample [B, C, F, H, W]): the flow-matching velocity.
    Patchify (1 x p x p), `blocks` ToyDiTBlocks, adaLN final layer, unpatchify.
    Computes in the dtype of its parameters: float inputs of any dtype are
    cast to it, and the output is in it."""

    def __init__(self, in_channels: int = 4, dim: int = 64, heads: int = 4, blocks: int = 2,
                 text_dim: int = 32, patch: int = 2):
        super().__init__()
        self.in_channels = in_channels
        self.patch = patch
        self.dim = dim
        self.patch_embed = nn.Linear(in_channels * patch * patch, dim)
        self.time_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList([ToyDiTBlock(dim, heads, text_dim) for _ in range(blocks)])
        self.norm_out = nn.LayerNorm(dim, elementwise_affine=False)
        self.mod_out = nn.Linear(dim, 2 * dim)
        self.proj_out = nn.Linear(dim, in_channels * patch * patch)
        self.patchify_impl = "reshape"  # or "unfold" (the refactor-patchify feature)

    def set_attention_scale_factor(self, factor: float) -> None:
        """Multiply the self-attention scale of every block by factor."""
        for blk in self.blocks:
            blk.self_attn.scale_factor = float(factor)

    def forward(self, hidden_states, timestep, encoder_hidden_states):
        b, c, f, h, w = hidden_states.shape
        p = self.patch
        if c != self.in_channels or h % p or w % p:
            raise ValueError(f"hidden_states shape {tuple(hidden_states.shape)} does not fit "
                             f"{self.in_channels} channels and patch {p}")
        dtype = self.patch_embed.weight.dtype
        # [B, C, F, H, W] -> [B, F*(H/p)*(W/p), C*p*p]
        if self.patchify_impl == "unfold":
            # the same elements in the same order, through unfold: a pure refactor
            x = hidden_states.unfold(3, p, p).unfold(4, p, p)  # [B, C, F, H/p, W/p, p, p]
            x = x.permute(0, 2, 3, 4, 1, 5, 6).reshape(b, f * (h // p) * (w // p), c * p * p)
        else:
            x = hidden_states.reshape(b, c, f, h // p, p, w // p, p)
            x = x.permute(0, 2, 3, 5, 1, 4, 6).reshape(b, f * (h // p) * (w // p), c * p * p)
        x = self.patch_embed(x.to(dtype))
        temb = self.time_mlp(timestep_embedding(timestep, self.dim).to(dtype))
        context = encoder_hidden_states.to(dtype)
        for blk in self.blocks:
            x = blk(x, temb, context)
        shift, scale = self.mod_out(F.silu(temb))[:, None, :].chunk(2, dim=-1)
        x = self.proj_out(self.norm_out(x) * (1 + scale) + shift)
        # unpatchify
        x = x.reshape(b, f, h // p, w // p, c, p, p).permute(0, 4, 1, 2, 5, 3, 6)
        return ToyDenoiserOutput(sample=x.reshape(b, c, f, h, w).contiguous())


# ---------------------------------------------------------------------------
# scheduler

@dataclass
class ToySchedulerOutput:
    prev_sample: torch.Tensor  # [B, C, F, H, W] float32


class ToyFlowMatchScheduler:
    """Euler sampler for rectified flow / flow matching (Lipman et al. 2023;
    Esser et al. 2024, SD3), the shape of diffusers'
    FlowMatchEulerDiscreteScheduler: sigmas go from 1 (noise) to 0 (data),
    optionally shifted by sigma' = shift*s / (1 + (shift-1)*s), timesteps =
    sigma * num_train_timesteps, and
        x_{i+1} = x_i + (sigma_{i+1} - sigma_i) * v_i.
    """

    def __init__(self, num_train_timesteps: int = 1000, shift: float = 3.0):
        self.num_train_timesteps = num_train_timesteps
        self.shift = shift
        self.timesteps = torch.zeros(0)
        self.sigmas = torch.zeros(0)
        self._step_index = None

    def set_timesteps(self, num_inference_steps: int) -> None:
        if num_inference_steps < 1:
            raise ValueError("num_inference_steps must be >= 1")
        s = torch.linspace(1.0, 0.0, num_inference_steps + 1, dtype=torch.float64)[:-1]
        s = self.shift * s / (1.0 + (self.shift - 1.0) * s)
        self.sigmas = torch.cat([s, torch.zeros(1, dtype=torch.float64)]).float()
        self.timesteps = (s * self.num_train_timesteps).float()
        self._step_index = None

    def step(self, model_output, timestep, sample):
        """One Euler step. model_output (velocity) and sample [B, C, F, H, W]
        (any float dtype; computed in float32), timestep a 0-d tensor equal
        to one of self.timesteps. Returns ToySchedulerOutput(prev_sample
        float32). Raises ValueError for a timestep not in the schedule."""
        hits = (self.timesteps == timestep).nonzero()
        if len(hits) == 0:
            raise ValueError(f"timestep {float(timestep)} is not in the schedule")
        i = int(hits[0, 0]) if self._step_index is None else self._step_index
        dt = self.sigmas[i + 1] - self.sigmas[i]
        prev = sample.float() + dt * model_output.float()
        self._step_index = i + 1
        return ToySchedulerOutput(prev_sample=prev)


# ---------------------------------------------------------------------------
# VAE (decoder only)

@dataclass
class ToyDecoderOutput:
    sample: torch.Tensor  # [B, 3, F, H*s, W*s] float32 in [-1, 1]


class ConvUpDecoder(nn.Module):
    """3-D conv decoder: conv, then `ups` x (nearest 2x spatial upsample, conv,
    SiLU), conv to 3 channels, tanh."""

    def __init__(self, latent_channels: int = 4, width: int = 32, ups: int = 2):
        super().__init__()
        self.conv_in = nn.Conv3d(latent_channels, width, 3, padding=1)
        self.ups = nn.ModuleList()
        ch = width
        for _ in range(ups):
            self.ups.append(nn.Conv3d(ch, ch // 2, 3, padding=1))
            ch //= 2
        self.conv_out = nn.Conv3d(ch, 3, 3, padding=1)

    def forward(self, z):
        x = F.silu(self.conv_in(z))
        for conv in self.ups:
            x = F.interpolate(x, scale_factor=(1, 2, 2), mode="nearest")
            x = F.silu(conv(x))
        return torch.tanh(self.conv_out(x))


class ToyVAE(nn.Module):
    """Video autoencoder (decode side only). decode(latents float32
    [B, C, F, H, W]) -> ToyDecoderOutput(sample float32 [B, 3, F, 4H, 4W])."""

    scale_factor_spatial = 4

    def __init__(self, latent_channels: int = 4, scaling_factor: float = 0.5):
        super().__init__()
        self.scaling_factor = scaling_factor
        self.decoder = ConvUpDecoder(latent_channels)

    def decode(self, latents):
        return ToyDecoderOutput(sample=self.decoder(latents / self.scaling_factor))
