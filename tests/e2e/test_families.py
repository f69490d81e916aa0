#!/usr/bin/env python3
"""End-to-end: the component table on 16 diffusers pipelines of their own.

tests/e2e/tiny_families.py builds each family (SD, SD + ControlNet, Flux,
Flux true-CFG, SD3, CogVideoX, LTX, HunyuanVideo, Sana, PixArt-Sigma,
Qwen-Image, Wan, Wan 2.2 (two transformers), Wan image-to-video, Mochi,
Allegro) with tiny random-weight configurations and offline tokenizers, on
the CPU in float32 with one thread, 2 steps. Needs the venv of
scripts/setup (torch 2.11 + diffusers + transformers, $PROBE_VENV): the
test re-executes itself with that interpreter and exits 77 (skipped) when it
is absent. Two processes run every family in sequence:
  a  plain python with forward hooks (tiny_families.Hooks) that copy every
     tensor argument and result of the text/image encoders, denoisers,
     ControlNet, scheduler, VAE and pipeline sources, under probe's paths;
  b  the same pipelines under probe-run, without hooks.
Asserted for each family: its calls in b include the expected components
with the expected probe.class (text encoder(s), dit.step, scheduler.step,
vae.decode, ControlNet, image encoder, root inputs); every tensor b
captured is one the hooks saw at the same path, bit-identical (dtype, shape,
bytes), and every tensor the hooks saw is in b except the slots the table
excludes (the text encoder's out.logits); every captured tensor's
probe.module is the pipeline's component name of the module the hooks were
on (text_encoder, text_encoder_2, text_encoder_3, transformer, transformer_2,
unet, controlnet, image_encoder, scheduler, vae; none for the pipeline's own
prepare_latents and encode_prompt); the pipeline output of b is
byte-identical to a's.
"""

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import reexec_in_diffusers_venv  # noqa: E402

NAMES = ["sd", "sd-controlnet", "flux", "flux-true-cfg", "sd3", "cogvideox", "ltx", "hunyuan-video", "sana",
         "pixart-sigma", "qwen-image", "wan", "wan2.2", "wan-i2v", "mochi", "allegro"]
ROOTS = ("latents.init", "timesteps", "prompt_embeds")


def main():
    reexec_in_diffusers_venv("PROBE_FAMILIES_IN_VENV")
    import h5py
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tiny_families
    build = os.environ.get("PROBE_BUILD_DIR")
    if not build:
        print("FAIL: PROBE_BUILD_DIR must be set (ctest sets it)")
        return 1
    work = tempfile.mkdtemp(prefix="probe-families-")
    errors = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE_OUT")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    pre = env.get("LD_PRELOAD", "")
    if "libasan" in pre:
        # sanitizer build: libstdc++ right after the ASan runtime, so that ASan's __cxa_throw
        # interceptor finds the real one when it starts (python does not link libstdc++);
        # otherwise the C++ exception torch throws and catches inside
        # torch.cuda.is_current_stream_capturing() (called by transformers) aborts the run
        import ctypes.util
        cxx = ctypes.util.find_library("stdc++")
        if cxx:
            first, _, rest = pre.replace(" ", ":").partition(":")
            env["LD_PRELOAD"] = ":".join(x for x in (first, cxx, rest) if x)
    script = os.path.abspath(tiny_families.__file__)
    dirs = {}
    for run, prefix, mode in (("a", [], "hooks"),
                              ("b", [os.path.join(build, "bin", "probe-run"), "--out",
                                     os.path.join(work, "b.h5"), "--"], "plain")):
        d = dirs[run] = os.path.join(work, run)
        os.makedirs(d)
        p = subprocess.run(prefix + [sys.executable, script, d, mode] + NAMES, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
        if p.returncode != 0:
            print("FAIL: run %s exited %d:\n%s" % (run, p.returncode, p.stderr[-4000:]))
            return 1
        if run == "b":
            lines = [l for l in p.stderr.splitlines() if l.startswith("probe:")]
            if lines:
                errors.append("probe-run printed %r" % lines)
    outs = [np.load(os.path.join(dirs[r], "outputs.npz")) for r in "ab"]
    hooks = {k.replace("|", "/"): v for k, v in np.load(os.path.join(dirs["a"], "hooks.npz")).items()}
    with open(os.path.join(dirs["a"], "calls.json")) as f:
        family_calls = json.load(f)
    with open(os.path.join(dirs["a"], "modules.json")) as f:
        hook_modules = json.load(f)
    captured = {}
    with h5py.File(os.path.join(work, "b.h5"), "r") as h:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                cls = obj.attrs.get("probe.class", b"")
                mod = obj.attrs.get("probe.module")
                captured["/" + name] = (obj[()], cls.decode() if isinstance(cls, bytes) else str(cls),
                                        mod.decode() if isinstance(mod, bytes) else mod)
        h.visititems(visit)
    ntensors = 0
    for fam in NAMES:
        if outs[0][fam].tobytes() != outs[1][fam].tobytes() or outs[0][fam].shape != outs[1][fam].shape:
            errors.append("%s: the pipeline output differs between the plain run and probe-run" % fam)
        calls = set(family_calls.get(fam, []))
        classes = {}
        for path, (_, cls, _m) in captured.items():
            call = path.rsplit("/", 1)[0]
            if call in calls:
                classes.setdefault(call.split("/")[1], set()).add(cls.rsplit(".", 1)[-1])
        want = dict(tiny_families.FAMILIES[fam][2])
        want.setdefault("scheduler.step", None)
        want.setdefault("vae.decode", None)
        for comp, names in want.items():
            got = classes.get(comp, set())
            if not got:
                errors.append("%s: no %s call captured" % (fam, comp))
            elif names and set(names.split("|")) - got:
                errors.append("%s: %s classes %s, expected %s" % (fam, comp, sorted(got), names))
        for root in ROOTS:
            if root not in classes:
                errors.append("%s: root input %s not captured" % (fam, root))
        if "dit.step" in classes and "controlnet" not in want and "controlnet" in classes:
            errors.append("%s: a controlnet call without a ControlNet" % fam)
    nmod = 0
    for path, (_, _c, mod) in sorted(captured.items()):
        call = path.rsplit("/", 1)[0]
        if call in hook_modules:
            nmod += 1
            if mod != hook_modules[call]:
                errors.append("%s: probe.module %r, the hooks' module is the pipeline's %r"
                              % (path, mod, hook_modules[call]))
    if nmod != len(captured):
        errors.append("%d of %d captured tensors belong to a call the hooks saw" % (nmod, len(captured)))
    for path, (arr, _, _m) in sorted(captured.items()):
        ref = hooks.get(path)
        if ref is None:
            errors.append("%s: captured, but the hooks never saw it" % path)
            continue
        ntensors += 1
        a = np.asarray(arr)
        b = ref.astype(a.dtype) if ref.dtype != a.dtype and ref.dtype == np.bool_ else ref
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            errors.append("%s: %s %s differs from the hooks' %s %s" % (path, a.dtype, a.shape, ref.dtype, ref.shape))
    for path in sorted(set(hooks) - set(captured)):
        if path.startswith("/text_encoder/") and path.endswith("/out.logits"):
            continue
        errors.append("%s: the hooks saw it, probe-run did not capture it" % path)
    logits = [p for p in hooks if p.endswith("/out.logits")]
    if not logits or any(p in captured for p in logits):
        errors.append("out.logits of the Qwen text encoder: hooks %d, captured %d"
                      % (len(logits), sum(p in captured for p in logits)))
    # probe-compare's channel axis follows the class (the table's class_layouts):
    # CogVideoX latents [B, F, C, H, W] -> axis 2; Flux packed tokens [B, L, C] -> 2 (last)
    js = os.path.join(work, "cmp.json")
    p = subprocess.run([os.path.join(build, "bin", "probe-compare"), os.path.join(work, "b.h5"),
                        os.path.join(work, "b.h5"), "--json", js], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    try:
        with open(js) as f:
            tens = {t["path"]: t for t in json.load(f)["tensors"]}
    except (OSError, ValueError, KeyError) as e:
        tens = {}
        errors.append("probe-compare b b: no JSON (%s; exit %d: %s)" % (e, p.returncode, p.stderr[-500:]))
    for fam, comp, slot, axis in (("cogvideox", "dit.step", "out.0", 2),
                                  ("cogvideox", "scheduler.step", "out.0", 2),
                                  ("cogvideox", "latents.init", "out", 2),
                                  ("flux", "dit.step", "out.0", 2), ("wan", "dit.step", "out.0", 1),
                                  ("sd", "dit.step", "out.0", 1)):
        calls = [c for c in family_calls.get(fam, []) if c.startswith("/%s/" % comp)]
        t = tens.get("%s/%s" % (calls[0], slot)) if calls else None
        if tens and (t is None or t.get("channel_axis") != axis or t.get("channel_axis_from") != "table"):
            errors.append("%s %s %s: channel axis %r from %r, expected %d from the table"
                          % (fam, comp, slot, t and t.get("channel_axis"), t and t.get("channel_axis_from"), axis))
    for e in errors[:60]:
        print("FAIL: " + e)
    if errors:
        print("%d failures" % len(errors))
        return 1
    print("test_families: %d families, %d tensors bit-identical to forward hooks, outputs identical"
          % (len(NAMES), ntensors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
