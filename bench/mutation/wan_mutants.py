"""One run of a diffusers WanPipeline (random weights, scripts/gpu/lib/wan_pipe.py)
with at most one feature (transparent or lossy) and at most one planted bug on:
the program the mutation study (bench/mutation/study.py) runs under probe-run
for the reference, the oracle, and every candidate.

  python3 wan_mutants.py --device cpu --dtype bf16                      # reference
  python3 wan_mutants.py --device cpu --dtype fp32 --weights-from bf16  # oracle
  python3 wan_mutants.py --device cpu --dtype bf16 --feature sdpa-math
  python3 wan_mutants.py --device cpu --dtype bf16 --bug chanbias:1:0.3
  python3 wan_mutants.py --device cpu --dtype bf16 --feature fp8-storage --bug chanbias:2:1

Features (transparent: the same function, computed another way):
  sdpa-math, sdpa-flash, sdpa-efficient   diffusers attention backend (the
                                 reference uses the default dispatch)
  compile                        torch.compile of the transformer
  fused-qkv                      one QKV projection GEMM per attention
                                 (diffusers fuse_projections)
  tp-merge                       every FFN down projection as two partial
                                 GEMMs over halves of its input features,
                                 summed in the element type (what a 2-way
                                 tensor-parallel all-reduce computes)
  cuda-graphs                    torch.compile mode reduce-overhead (CUDA
                                 graphs; GPU only)
Lossy features (another function, close to the reference's by design):
  fp8-storage                    the transformer's weights stored in
                                 float8_e4m3fn and cast to bfloat16 for each
                                 layer's compute (diffusers
                                 enable_layerwise_casting; its default skip
                                 patterns keep the patch embedding, the
                                 condition embedder and the norms in bf16)
  fp8-gemm                       every nn.Linear of the transformer blocks as
                                 an FP8 GEMM with per-tensor scales:
                                 y = (q(x) * sx) @ (q(W) * sw)^T + b, with
                                 q(t) = round_e4m3(t / s), s = amax(|t|) / 448
                                 (the weight's scale once, the activation's
                                 per call, as TensorRT and torchao compute
                                 them). An emulation: the quantized operands
                                 are dequantized to bfloat16 and multiplied
                                 there (torch._scaled_mm runs on GPUs only),
                                 so it runs on the CPU and on CUDA alike
  fp8-scaled-mm                  every nn.Linear of the transformer blocks as
                                 a real FP8 GEMM, torch._scaled_mm on
                                 float8_e4m3fn operands with per-tensor
                                 scales (the weight's w * (448 / amax) once,
                                 the activation's per call, torchao's way),
                                 bfloat16 out; GPUs with FP8 (sm89+) only
  fbcache                        First Block Cache (diffusers
                                 FirstBlockCacheConfig, --fbcache-threshold):
                                 a step whose first block's residual moved
                                 less than the threshold (relative absmean)
                                 since the last computed step reuses the
                                 cached residual of the remaining blocks;
                                 needs 8 or more --steps to cache anything
Bugs (BLOCK is the index of a transformer block):
  chanbias:BLOCK:S   one channel (0) of block BLOCK's FFN output shifted by S
                     times that channel's standard deviation
  attnscale:BLOCK:E  block BLOCK's self-attention logits scaled by 1 + E
                     (the query multiplied by 1 + E after its norm)
  gain:BLOCK:E       block BLOCK's FFN output multiplied by 1 + E
  normeps:BLOCK:EPS  block BLOCK's FFN LayerNorm (norm3) with eps EPS
  fp8:BLOCK          block BLOCK's FFN down-projection weight rounded to
                     float8_e4m3fn (one per-tensor scale, amax / 448)
  wscale:BLOCK:E     block BLOCK's FFN down-projection weight multiplied by
                     1 + E (a wrong weight: another checkpoint's, or a
                     dequantization scale off by 1 + E)
  rope:BLOCK         block BLOCK's self-attention RoPE tables shifted by one
                     token
Every bug but the timestep one acts inside its block's forward (hooks on the
block's submodules), so a capture of the block's inputs and outputs sees it
as the block's own; the timestep bug changes the DiT's input.
  mask:BLOCK         block BLOCK's cross-attention leaves out the last text
                     token (a mask off by one)
  timestep:D         the timestep given to the transformer plus D

--weights-from bf16 (the oracle): the transformer is built as the reference
builds it, rounded to bfloat16 and then held in --dtype, so the oracle
evaluates the reference's function (the same weight values) in higher
precision.
"""
import argparse
import contextlib
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts", "gpu", "lib"))
import wan_pipe  # noqa: E402

FEATURES = ("sdpa-math", "sdpa-flash", "sdpa-efficient", "compile", "fused-qkv", "tp-merge",
            "cuda-graphs")
LOSSY_FEATURES = ("fp8-storage", "fp8-gemm", "fp8-scaled-mm", "fbcache")
E4M3_MAX = 448.0


def parse_bug(text):
    """'name:arg:arg' -> (name, [args]); raises SystemExit on a bad spec."""
    if not text:
        return None, []
    name, *rest = text.split(":")
    arity = {"chanbias": 2, "attnscale": 2, "gain": 2, "normeps": 2, "fp8": 1, "rope": 1,
             "mask": 1, "timestep": 1, "wscale": 2}
    if name not in arity or len(rest) != arity[name]:
        sys.exit("wan_mutants: bad --bug %r (see the docstring)" % text)
    return name, rest


def plant(transformer, name, args):
    """Plant bug `name` into the transformer (hooks and attribute changes)."""
    blocks = transformer.blocks
    if name == "timestep":
        delta = float(args[0])

        def pre(mod, a, kw):
            if "timestep" in kw:
                kw["timestep"] = kw["timestep"] + delta
            else:
                a = (a[0], a[1] + delta) + tuple(a[2:])
            return a, kw
        transformer.register_forward_pre_hook(pre, with_kwargs=True)
        return
    b = int(args[0])
    if not 0 <= b < len(blocks):
        sys.exit("wan_mutants: block %d out of range (0..%d)" % (b, len(blocks) - 1))
    blk = blocks[b]
    if name == "chanbias":
        s = float(args[1])

        def hook(mod, a, out):
            out = out.clone()
            ch = out[..., 0].float()
            out[..., 0] = (ch + s * ch.std()).to(out.dtype)
            return out
        blk.ffn.register_forward_hook(hook)
    elif name == "attnscale":
        e = float(args[1])
        blk.attn1.norm_q.register_forward_hook(lambda mod, a, out: out * (1.0 + e))
    elif name == "gain":
        e = float(args[1])
        blk.ffn.register_forward_hook(lambda mod, a, out: out * (1.0 + e))
    elif name == "normeps":
        blk.norm3.eps = float(args[1])
    elif name == "fp8":
        lin = blk.ffn.net[2]
        with torch.no_grad():
            w = lin.weight.float()
            scale = w.abs().max() / 448.0
            lin.weight.copy_(((w / scale).to(torch.float8_e4m3fn).float() * scale)
                             .to(lin.weight.dtype))
    elif name == "wscale":
        with torch.no_grad():
            blk.ffn.net[2].weight.mul_(1.0 + float(args[1]))
    elif name == "rope":
        def pre(mod, a, kw):
            a = list(a)
            cos, sin = a[3]
            a[3] = (cos.roll(1, dims=1), sin.roll(1, dims=1))
            return tuple(a), kw
        blk.attn1.register_forward_pre_hook(pre, with_kwargs=True)
    elif name == "mask":
        def pre(mod, a, kw):
            a = list(a)
            if len(a) > 1 and a[1] is not None:
                a[1] = a[1][:, :-1]
            return tuple(a), kw
        blk.attn2.register_forward_pre_hook(pre, with_kwargs=True)


def tp_merge(transformer):
    """Every FFN down projection as two partial GEMMs over halves of the input
    features, summed in the element type (bias added once)."""
    for blk in transformer.blocks:
        lin = blk.ffn.net[2]
        half = lin.in_features // 2

        def fwd(x, lin=lin, half=half):
            w = lin.weight
            p0 = torch.nn.functional.linear(x[..., :half], w[:, :half])
            p1 = torch.nn.functional.linear(x[..., half:], w[:, half:])
            return p0 + p1 + lin.bias
        lin.forward = fwd


def block_linears(transformer):
    """Every nn.Linear inside the transformer blocks, in module order."""
    return [m for blk in transformer.blocks for m in blk.modules() if isinstance(m, torch.nn.Linear)]


def e4m3_dequant(t):
    """t quantized to float8_e4m3fn with one per-tensor scale amax(|t|) / 448,
    returned dequantized in t's dtype (the scale applied in float32)."""
    tf = t.float()
    scale = tf.abs().amax().clamp(min=1e-12) / E4M3_MAX
    return ((tf / scale).to(torch.float8_e4m3fn).float() * scale).to(t.dtype)


def fp8_gemm(transformer):
    """Every nn.Linear inside the transformer blocks computes on FP8-quantized
    operands (per-tensor amax scales), dequantized to the layer's dtype for the
    product: an emulation of a scaled FP8 GEMM."""
    n = 0
    for lin in block_linears(transformer):
        with torch.no_grad():
            wq = e4m3_dequant(lin.weight)

        def fwd(x, lin=lin, wq=wq):
            return torch.nn.functional.linear(e4m3_dequant(x), wq, lin.bias)
        lin.forward = fwd
        n += 1
    return n


def fp8_scaled_mm(transformer):
    """Every nn.Linear inside the transformer blocks as torch._scaled_mm on
    float8_e4m3fn operands: W quantized once as W * (448 / amax(|W|)), the input
    per call the same way, both scales passed as their reciprocals, out in the
    layer's dtype with its bias."""
    n = 0
    for lin in block_linears(transformer):
        with torch.no_grad():
            w = lin.weight.float()
            r = E4M3_MAX / w.abs().amax()
            wq = (w * r).to(torch.float8_e4m3fn)
            sw = (1.0 / r).reshape(())

        def fwd(x, lin=lin, wq=wq, sw=sw):
            shp = x.shape
            x2 = x.reshape(-1, shp[-1]).float()
            rx = E4M3_MAX / x2.abs().amax().clamp(min=1e-12)
            xq = (x2 * rx).to(torch.float8_e4m3fn)
            y = torch._scaled_mm(xq, wq.t(), scale_a=(1.0 / rx).reshape(()), scale_b=sw,
                                 bias=lin.bias, out_dtype=x.dtype)
            return y.reshape(*shp[:-1], y.shape[-1])
        lin.forward = fwd
        n += 1
    return n


def count_block_passes(transformer):
    """Forward pre-hooks counting how often the first and the last block's
    FFN ran: under First Block Cache, the last one runs only on computed steps."""
    counts = {"first": 0, "last": 0}
    transformer.blocks[0].ffn.register_forward_pre_hook(
        lambda mod, a: counts.__setitem__("first", counts["first"] + 1))
    transformer.blocks[-1].ffn.register_forward_pre_hook(
        lambda mod, a: counts.__setitem__("last", counts["last"] + 1))
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--weights-from", choices=["bf16"], default=None,
                    help="round the transformer's weights to this type first (the oracle)")
    ap.add_argument("--feature", choices=FEATURES + LOSSY_FEATURES, default=None)
    ap.add_argument("--fbcache-threshold", type=float, default=0.12,
                    help="fbcache: First Block Cache's threshold (diffusers defaults to 0.05; the "
                    "first block's residual of the tiny random-weight model moves by 0.1 to 0.2 per step, "
                    "so 0.12 caches about 2 of 8 steps)")
    ap.add_argument("--bug", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    bug, bug_args = parse_bug(args.bug)

    dev = args.device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    if args.threads:
        torch.set_num_threads(args.threads)
    wan_pipe.CONFIGS["tiny"]["transformer"]["num_layers"] = args.layers
    build_dtype = args.weights_from or args.dtype
    pipe, te, cfg = wan_pipe.build("tiny", device=dev, dtype=build_dtype)
    if args.weights_from:
        pipe.transformer.to(dtype=wan_pipe.DTYPES[args.dtype])
    tr = pipe.transformer
    if bug:
        plant(tr, bug, bug_args)
    if args.feature == "fused-qkv":
        for blk in tr.blocks:
            blk.attn1.fuse_projections()
            blk.attn2.fuse_projections()
    elif args.feature == "tp-merge":
        tp_merge(tr)
    elif args.feature == "fp8-storage":
        tr.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn,
                                    compute_dtype=wan_pipe.DTYPES[args.dtype])
    elif args.feature == "fp8-gemm":
        print("wan_mutants: fp8-gemm on %d linear layers" % fp8_gemm(tr))
    elif args.feature == "fp8-scaled-mm":
        print("wan_mutants: fp8-scaled-mm on %d linear layers" % fp8_scaled_mm(tr))
    elif args.feature == "fbcache":
        from diffusers.hooks import FirstBlockCacheConfig
        tr.enable_cache(FirstBlockCacheConfig(threshold=args.fbcache_threshold))
    elif args.feature in ("compile", "cuda-graphs"):
        mode = "reduce-overhead" if args.feature == "cuda-graphs" else None
        pipe.transformer = torch.compile(tr, mode=mode)
    attn = {"sdpa-math": "math", "sdpa-flash": "flash",
            "sdpa-efficient": "efficient"}.get(args.feature, "default")
    passes = count_block_passes(tr)
    ids, neg, latents = wan_pipe.make_inputs(cfg, args.seed, args.frames, args.size, args.size,
                                             dev)
    pe, npe = wan_pipe.encode(te, ids, neg)
    ctx = wan_pipe.attention_context(attn) if attn != "default" else contextlib.nullcontext()
    with ctx:
        video = wan_pipe.run(pipe, pe, npe, latents, args.steps, args.frames, args.size,
                             args.size)
    print("wan_mutants: dtype=%s feature=%s bug=%s video %s" %
          (args.dtype, args.feature, args.bug, tuple(video.shape)))
    print("wan_mutants: block passes: first block %d, last block %d" %
          (passes["first"], passes["last"]))


if __name__ == "__main__":
    main()
