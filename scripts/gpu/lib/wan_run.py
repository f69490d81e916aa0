"""One run of a Hugging Face diffusers WanPipeline (random weights, prompt
embeddings from a T5 encoder passed in directly, no downloads; the pipeline
is built by wan_pipe.py next to this file), for feature-off / feature-on
experiments, observer-effect checks and capture benchmarks under probe-run.

  python3 wan_run.py --dtype bf16 --attn math --seed 1 --out video.npy

Every run builds the same weights and the same initial latents and prompt
tokens (from --seed), so two runs differ only by the feature switches
(--dtype, --attn, --compile). Options added for the observer-effect test
and the capture benchmark (docs/observer.md):
  --config tiny|wan2.1-1.3b   pipeline size (default tiny)
  --deterministic             torch.use_deterministic_algorithms(True), and
                              with --threads N a fixed number of CPU threads
  --hooks DIR                 the capture users write today: forward hooks /
                              wrappers that .cpu() and torch.save every
                              component input and output (wan_pipe.SaveHooks)
  --compile MODE              torch.compile the transformer (e.g. reduce-overhead)
  --clone-dit FILE            clone the transformer's output after each call
                              (a forward hook) and torch.save the clones
  --repeat N                  run the pipeline N times in this process
                              (the first ones warm up; the last is timed and saved)
  --json FILE                 timings of the last run: pipeline seconds (the
                              device synchronized), flush seconds (probe's
                              queue drained, when probe is preloaded), the
                              hooks' bytes and the video's SHA-256
Needs torch >= 2.6, transformers and diffusers (the GPU machine has all but
diffusers, which is carried as a wheel)."""
import argparse
import ctypes
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wan_pipe  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--config", choices=sorted(wan_pipe.CONFIGS), default="tiny")
ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16", help="transformer dtype")
ap.add_argument("--attn", choices=["default", "math", "flash", "efficient"], default="default",
                help="attention backend (diffusers attention_backend)")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--device", default="cuda")
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--frames", type=int, default=17)
ap.add_argument("--size", type=int, default=256, help="height and width unless given")
ap.add_argument("--height", type=int, default=None)
ap.add_argument("--width", type=int, default=None)
ap.add_argument("--deterministic", action="store_true")
ap.add_argument("--threads", type=int, default=None, help="CPU intra-op threads")
ap.add_argument("--compile", default=None, metavar="MODE",
                help="torch.compile the transformer with this mode (e.g. reduce-overhead)")
ap.add_argument("--hooks", default=None, metavar="DIR", help="save component I/O with hooks")
ap.add_argument("--clone-dit", default=None, metavar="FILE",
                help="a forward hook on the (compiled) transformer clones its output right after "
                     "each call; the clones are torch.save'd to FILE (host copies, a list)")
ap.add_argument("--repeat", type=int, default=1)
ap.add_argument("--no-time", action="store_true",
                help="leave the time out of the stdout line (stdout then depends only on the run)")
ap.add_argument("--out", default=None, help="save the decoded video (np.save)")
ap.add_argument("--json", default=None, help="write timings of the last run")
args = ap.parse_args()
height = args.height or args.size
width = args.width or args.size
dev = args.device

if args.deterministic:
    wan_pipe.set_deterministic(dev, args.threads)
else:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if args.threads:
        torch.set_num_threads(args.threads)

pipe, text_encoder, cfg = wan_pipe.build(args.config, dev, args.dtype)
if args.compile:
    pipe.transformer = torch.compile(pipe.transformer, mode=args.compile)
    if args.compile == "reduce-overhead":
        # What a user must add for CUDA graphs under CFG (two transformer
        # calls per step): outputs of a graph replay live in the graph's
        # memory and the next replay overwrites them, so mark each call as a
        # new step and clone its output (torch's own advice in the error it
        # raises otherwise).
        def new_step(module, inputs):
            torch.compiler.cudagraph_mark_step_begin()

        def keep_output(module, inputs, output):
            return type(output)(o.clone() if torch.is_tensor(o) else o for o in output) \
                if isinstance(output, (tuple, list)) else output

        pipe.transformer.register_forward_pre_hook(new_step)
        pipe.transformer.register_forward_hook(keep_output)
hooks = wan_pipe.SaveHooks(pipe, args.hooks) if args.hooks else None
dit_clones = []
if args.clone_dit:
    def clone_output(module, inputs, output):
        out = output[0] if isinstance(output, (tuple, list)) else getattr(output, "sample", output)
        dit_clones.append(out.detach().clone())
    pipe.transformer.register_forward_hook(clone_output)
ids, neg_ids, latents = wan_pipe.make_inputs(cfg, args.seed, args.frames, height, width, dev)
prompt_embeds, negative_prompt_embeds = wan_pipe.encode(text_encoder, ids, neg_ids)


def sync():
    if dev != "cpu":
        torch.cuda.synchronize()


# probe's flush (preloaded shim): waits until every capture so far is in the
# file. Called after each repetition, untimed, so that a timed repetition
# does not share the machine with the previous one's writing; its time after
# the last one is the part of the capture that did not overlap the pipeline.
flush = getattr(ctypes.CDLL(None), "probe_tap_flush_v1", None) if os.environ.get("PROBE_OUT") else None
flush_rc = t_flush = None
times = []
for i in range(args.repeat):
    sync()
    t0 = time.perf_counter()
    with wan_pipe.attention_context(args.attn):
        video = wan_pipe.run(pipe, prompt_embeds, negative_prompt_embeds, latents.clone(),
                             args.steps, args.frames, height, width)
    sync()
    t_pipe = time.perf_counter() - t0
    times.append(t_pipe)
    if flush is not None:
        t0 = time.perf_counter()
        flush_rc = flush()
        t_flush = time.perf_counter() - t0
print("wan_run: dtype=%s attn=%s seed=%d video %s%s" % (
    args.dtype, args.attn, args.seed, tuple(video.shape), "" if args.no_time else " %.3f s" % t_pipe))
if args.out:
    np.save(args.out, video)
if args.clone_dit:
    torch.save([c.cpu() for c in dit_clones], args.clone_dit)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"pipeline_s": t_pipe, "pipeline_s_all": times, "repeat": args.repeat,
                   "flush_s": t_flush,
                   "flush_rc": flush_rc, "hook_bytes": hooks.bytes if hooks else None,
                   "hook_files": hooks.files if hooks else None,
                   "video_shape": list(video.shape),
                   "video_sha256": hashlib.sha256(np.ascontiguousarray(video).tobytes()).hexdigest()},
                  f)
