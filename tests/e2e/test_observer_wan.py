#!/usr/bin/env python3
"""End-to-end: the observer effect of capture is zero on a real diffusers
WanPipeline (docs/observer.md).

The pipeline is scripts/gpu/lib/wan_run.py (diffusers WanPipeline, T5 text
encoder from a small T5Config, WanTransformer3DModel in bfloat16,
AutoencoderKLWan, FlowMatchEulerDiscreteScheduler; random weights, tiny
configuration, 32 x 32, 5 frames, 2 steps, guidance 5.0 so both CFG branches
run), on the CPU with deterministic algorithms and 2 threads. It runs with
the venv of scripts/setup (torch 2.11 + diffusers + transformers,
$PROBE_VENV, default ~/.cache/probe-venv): this test re-executes itself with
that interpreter, and exits 77 (skipped) with the reason when it is absent.

Runs:
  a  plain python, no probe; the script's own hooks (wan_pipe.SaveHooks)
     torch.save every component input and output: the reference values;
  b  under probe-run, capturing everything;
  c  under probe-run --capture '/dit.step/*' (one component);
  d  with the shim preloaded and PROBE_OUT under a regular file (cannot be
     created): capture disabled with exactly one `probe:` line.
Asserted:
  * the decoded video (np.save of the pipeline's output) is byte-identical
    in a, b, c, d; stdout is byte-identical; every exit status is 0; stderr
    is a's plus, in d only, the one `probe:` line;
  * b holds exactly the hand-derived set of datasets: text_encoder x 2
    (prompt, negative prompt), dit.step x 2 steps x 2 CFG branches,
    scheduler.step x 2, vae.decode x 1, and the roots latents.init,
    timesteps, prompt_embeds; each tensor a's hooks saved is bit-identical
    (dtype, shape, bytes) to b's dataset at the same path, bfloat16 included;
    the roots equal the values the pipeline used (first DiT input, the
    timesteps the scheduler was stepped with, the text encoder's outputs);
    dit.step's probe.step / probe.cfg_branch are i // 2 and i % 2;
  * the video equals the captured VAE output postprocessed by hand
    (x / 2 + 0.5 clamped to [0, 1], [C, F, H, W] -> [F, H, W, C]);
  * c holds exactly b's dit.step datasets, with the same bytes.
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import reexec_in_diffusers_venv  # noqa: E402

STEPS, FRAMES, SIZE = 2, 5, 32


def reexec_in_venv():
    reexec_in_diffusers_venv("PROBE_OBSERVER_IN_VENV")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    reexec_in_venv()
    import h5py
    import numpy as np
    import torch

    build = os.environ.get("PROBE_BUILD_DIR")
    src = os.environ.get("PROBE_SOURCE_DIR")
    if not build or not src:
        fail("PROBE_BUILD_DIR and PROBE_SOURCE_DIR must be set (ctest sets them)")
    probe_run = os.path.join(build, "bin", "probe-run")
    shim = os.path.join(build, "lib", "libprobe_intercept.so")
    script = os.path.join(src, "scripts", "gpu", "lib", "wan_run.py")
    py = sys.executable
    tmp = tempfile.mkdtemp(prefix="probe-observer-")
    args = ["--device", "cpu", "--dtype", "bf16", "--steps", str(STEPS), "--frames", str(FRAMES),
            "--size", str(SIZE), "--deterministic", "--threads", "2", "--no-time"]

    def run(name, prefix, extra=(), env_add=None):
        video = os.path.join(tmp, name + ".npy")
        env = dict(os.environ)
        env.pop("PROBE_OUT", None)
        env.update(env_add or {})
        p = subprocess.run(list(prefix) + [py, script] + args + ["--out", video] + list(extra),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=600)
        print("run %s: exit %d, stdout %r" % (name, p.returncode, p.stdout.decode()[-200:]))
        return p, video

    hooks = os.path.join(tmp, "hooks")
    b_h5, c_h5 = os.path.join(tmp, "b.h5"), os.path.join(tmp, "c.h5")
    blocker = os.path.join(tmp, "a-regular-file")
    open(blocker, "w").close()
    pa, va = run("a", [], ["--hooks", hooks])
    pb, vb = run("b", [probe_run, "--out", b_h5, "--label", "observer", "--"])
    pc, vc = run("c", [probe_run, "--out", c_h5, "--capture", "/dit.step/*", "--"])
    # d: what probe-run sets, by hand, with a PROBE_OUT that cannot be created
    # (a path under a regular file: ENOTDIR, also for root).
    pre = [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    pd, vd = run("d", [], env_add={
        "PROBE_OUT": os.path.join(blocker, "x.h5"),
        "PROBE_COMPONENTS": os.path.join(build, "share", "probe", "components.json"),
        "PYTHONPATH": os.path.join(build, "share", "probe", "python"),
        "LD_PRELOAD": ":".join(pre + [shim])})

    errors = []
    runs = {"a": (pa, va), "b": (pb, vb), "c": (pc, vc), "d": (pd, vd)}
    for name, (p, v) in runs.items():
        if p.returncode != 0:
            errors.append("run %s exited %d; stderr tail: %s"
                          % (name, p.returncode, p.stderr.decode()[-2000:]))
    if errors:
        fail("; ".join(errors))

    # --- the observer effect: outputs, stdout, stderr -----------------------
    ref_video = open(va, "rb").read()
    for name in "bcd":
        if open(runs[name][1], "rb").read() != ref_video:
            errors.append("run %s: the decoded video differs from the run without probe" % name)
        if runs[name][0].stdout != pa.stdout:
            errors.append("run %s: stdout differs: %r vs %r" % (name, runs[name][0].stdout, pa.stdout))

    def lines(p):
        return p.stderr.decode(errors="replace").splitlines()

    def non_probe(p):
        return [ln for ln in lines(p) if not ln.startswith("probe:")]

    for name in "bc":
        if lines(runs[name][0]) != lines(pa):
            errors.append("run %s: stderr differs from the run without probe: %r vs %r"
                          % (name, lines(runs[name][0])[-5:], lines(pa)[-5:]))
    d_probe = [ln for ln in lines(pd) if ln.startswith("probe:")]
    if len(d_probe) != 1 or "x.h5" not in d_probe[0] or "disabled" not in d_probe[0]:
        errors.append("run d: expected one `probe:` line naming the file and 'disabled', got %r" % d_probe)
    if non_probe(pd) != lines(pa):
        errors.append("run d: stderr besides the probe line differs: %r" % non_probe(pd)[-5:])
    if os.path.exists(os.path.join(blocker, "x.h5")):
        errors.append("run d: a capture file exists")

    # --- run b: the capture holds exactly the expected datasets ------------
    def datasets(path):
        out = {}
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out["/" + name] = (obj[()], dict(obj.attrs))
            f.visititems(visit)
        return out

    b = datasets(b_h5)
    hook_files = {}
    for root, _, files in os.walk(hooks):
        for fn in files:
            rel = os.path.relpath(os.path.join(root, fn), hooks)
            hook_files["/" + rel[:-len(".pt")]] = os.path.join(root, fn)

    # Hand-derived: which calls the pipeline makes (2 prompts encoded outside
    # the pipeline; 2 CFG branches per step; one scheduler step per step).
    expected_calls = {"text_encoder": 2, "dit.step": 2 * STEPS, "scheduler.step": STEPS,
                      "vae.decode": 1}
    slots = {"text_encoder": ["in.input_ids", "out.last_hidden_state"],
             "dit.step": ["in.hidden_states", "in.timestep", "in.encoder_hidden_states", "out.0"],
             "scheduler.step": ["in.model_output", "in.timestep", "in.sample", "out.0"],
             "vae.decode": ["in.z", "out.0"]}
    expected = set()
    for comp, n in expected_calls.items():
        for i in range(n):
            for s in slots[comp]:
                expected.add("/%s/%04d/%s" % (comp, i, s))
    roots = {"/latents.init/0000/in.latents", "/latents.init/0000/out",
             "/timesteps/0000/out.timesteps", "/timesteps/0000/out.sigmas",
             "/prompt_embeds/0000/in.prompt_embeds", "/prompt_embeds/0000/in.negative_prompt_embeds",
             "/prompt_embeds/0000/out.0", "/prompt_embeds/0000/out.1"}
    if set(hook_files) != expected:
        errors.append("the script's hooks saved %s, expected %s (the test's assumption about the "
                      "pipeline is wrong)" % (sorted(set(hook_files) ^ expected), "the hand-derived set"))
    if set(b) != expected | roots:
        errors.append("capture b: missing %s, extra %s"
                      % (sorted((expected | roots) - set(b)), sorted(set(b) - (expected | roots))))

    def carr(a):
        """A C-contiguous copy that keeps 0-d arrays 0-d (np.ascontiguousarray
        makes them 1-d)."""
        return np.array(a, order="C", copy=True)

    def bits(t):
        """(dtype name, shape, bytes) of a torch tensor; bfloat16 as float32
        (how h5py reads probe's bfloat16: exactly the value)."""
        t = t.detach().contiguous()
        name = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            t = t.float()
        return name, tuple(t.shape), t.numpy().tobytes()

    compared = 0
    for path, fn in sorted(hook_files.items()):
        if path not in b:
            continue
        ref = torch.load(fn)
        dname, shape, raw = bits(ref)
        arr, attrs = b[path]
        got_dtype = attrs.get("probe.dtype")
        if isinstance(got_dtype, bytes):
            got_dtype = got_dtype.decode()
        if got_dtype is not None and got_dtype != dname:
            errors.append("%s: probe.dtype %s, the pipeline's tensor is %s" % (path, got_dtype, dname))
        arr = carr(arr)
        if tuple(arr.shape) != shape or arr.tobytes() != raw:
            errors.append("%s: captured %s %s differs from the pipeline's own %s %s"
                          % (path, arr.dtype, arr.shape, dname, shape))
        compared += 1
    print("compared %d captured tensors with the pipeline's own copies" % compared)
    if compared != len(expected):
        errors.append("only %d of %d expected tensors compared" % (compared, len(expected)))

    def val(path):
        return carr(b[path][0]) if path in b else None

    def hook(path):
        return torch.load(hook_files[path]).detach().float().numpy()

    def same(x, y):
        return x is not None and y is not None and x.shape == y.shape and x.tobytes() == y.tobytes()

    # Roots: the values the pipeline actually used. The initial latents as
    # wan_pipe.make_inputs draws them (seed 1: two prompts of 16 token ids,
    # then the noise), and the first DiT input is them rounded to bfloat16.
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (1, 16), generator=g)
    neg_ids = torch.randint(0, 256, (1, 16), generator=g)
    lat = torch.randn(1, 16, (FRAMES - 1) // 4 + 1, SIZE // 8, SIZE // 8, generator=g)
    for path, want in (("/latents.init/0000/out", lat), ("/text_encoder/0000/in.input_ids", ids),
                       ("/text_encoder/0001/in.input_ids", neg_ids)):
        if not same(val(path), want.numpy()):
            errors.append("%s is not the value the script drew from its seed" % path)
    if not same(hook("/dit.step/0000/in.hidden_states"), lat.to(torch.bfloat16).float().numpy()):
        errors.append("the first DiT input is not the initial latents in bfloat16")
    ts = np.array([hook("/scheduler.step/%04d/in.timestep" % i).reshape(()) for i in range(STEPS)],
                  dtype=np.float32)
    if not same(val("/timesteps/0000/out.timesteps"), ts):
        errors.append("/timesteps/0000/out.timesteps %r is not the scheduler's steps %r"
                      % (val("/timesteps/0000/out.timesteps"), ts))
    sig = val("/timesteps/0000/out.sigmas")
    if sig is None or sig.shape != (STEPS + 1,) or sig[-1] != 0.0:
        errors.append("/timesteps/0000/out.sigmas %r: expected %d sigmas ending in 0" % (sig, STEPS + 1))
    for i, name in ((0, "out.0"), (1, "out.1")):
        if not same(val("/prompt_embeds/0000/" + name),
                    hook("/text_encoder/%04d/out.last_hidden_state" % i)):
            errors.append("/prompt_embeds/0000/%s is not the text encoder's output %d" % (name, i))
    for i in range(2 * STEPS):
        attrs = b.get("/dit.step/%04d/out.0" % i, (None, {}))[1]
        st, cfg = attrs.get("probe.step"), attrs.get("probe.cfg_branch")
        if st is None or cfg is None or int(st) != i // 2 or int(cfg) != i % 2:
            errors.append("/dit.step/%04d: probe.step %r probe.cfg_branch %r, expected %d %d"
                          % (i, st, cfg, i // 2, i % 2))

    # The video is the captured VAE output, postprocessed (by hand here).
    dec = val("/vae.decode/0000/out.0")
    if dec is not None:
        by_hand = np.clip(dec[0] / np.float32(2) + np.float32(0.5), 0, 1).transpose(1, 2, 3, 0)
        video = np.load(va)
        if video.shape != by_hand.shape or np.abs(video - by_hand).max() != 0:
            errors.append("the video is not the captured VAE output postprocessed: max diff %r"
                          % (np.abs(video - by_hand).max() if video.shape == by_hand.shape else "shape"))

    # --- run c: one component, the same bytes -----------------------------
    c = datasets(c_h5)
    want = {p for p in b if p.startswith("/dit.step/")}
    if set(c) != want:
        errors.append("capture c (--capture '/dit.step/*'): missing %s, extra %s"
                      % (sorted(want - set(c)), sorted(set(c) - want)))
    for p in want & set(c):
        if carr(c[p][0]).tobytes() != carr(b[p][0]).tobytes():
            errors.append("%s differs between captures b and c" % p)

    if errors:
        fail("\n  ".join(errors))
    print("PASS: video, stdout, stderr and exit status identical in 4 runs; %d tensors + roots "
          "bit-identical to the pipeline's values" % compared)
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
