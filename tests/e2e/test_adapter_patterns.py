#!/usr/bin/env python3
"""The component table finds the classes it must find, and nothing else.

Loads components.json and the adapter's matcher from the build tree
(share/probe) and checks, with stand-in classes carrying the real module and
class names of diffusers, transformers and TensorRT-LLM VisualGen (as found
in their sources) and of user code, which (method, component) pairs the
table selects. Also checks the table's schema, the --tap precedence and
exclusion rules, and that probe-run and the adapter accept exactly the same
pattern grammar. Needs no preloaded library.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

BUILD = os.environ.get("PROBE_BUILD_DIR")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def fake(module, name, *methods):
    cls = type(name, (), {m: (lambda self, *a, **k: None) for m in methods})
    cls.__module__ = module
    return cls


# (module, class, methods it has, expected {method: component})
CASES = [
    # transformers text encoders
    ("transformers.models.t5.modeling_t5", "T5EncoderModel", ["forward"], {"forward": "text_encoder"}),
    ("transformers.models.umt5.modeling_umt5", "UMT5EncoderModel", ["forward"], {"forward": "text_encoder"}),
    ("transformers.models.clip.modeling_clip", "CLIPTextModel", ["forward"], {"forward": "text_encoder"}),
    ("transformers.models.clip.modeling_clip", "CLIPTextModelWithProjection", ["forward"],
     {"forward": "text_encoder"}),
    ("transformers.models.gemma2.modeling_gemma2", "Gemma2Model", ["forward"], {"forward": "text_encoder"}),
    ("transformers.models.llama.modeling_llama", "LlamaModel", ["forward"], {"forward": "text_encoder"}),
    ("transformers.models.bert.modeling_bert", "BertModel", ["forward"], {"forward": "text_encoder"}),
    ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration",
     ["forward"], {"forward": "text_encoder"}),
    ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLTextModel", ["forward"],
     {"forward": "text_encoder"}),
    ("transformers.models.llama.modeling_llama", "LlamaForCausalLM", ["forward"], {"forward": "text_encoder"}),
    ("transformers.models.llama.modeling_llama", "LlamaPreTrainedModel", ["forward"], {}),
    # transformers image encoders (vision towers)
    ("transformers.models.clip.modeling_clip", "CLIPVisionModel", ["forward"], {"forward": "image_encoder"}),
    ("transformers.models.clip.modeling_clip", "CLIPVisionModelWithProjection", ["forward"],
     {"forward": "image_encoder"}),
    ("transformers.models.siglip.modeling_siglip", "SiglipVisionModel", ["forward"], {"forward": "image_encoder"}),
    ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel",
     ["forward"], {"forward": "image_encoder"}),
    # ControlNets are their own component, not dit.step (*DiT*.forward)
    ("diffusers.models.controlnets.controlnet_hunyuan", "HunyuanDiT2DControlNetModel", ["forward"],
     {"forward": "controlnet"}),
    ("diffusers.models.controlnets.controlnet_hunyuan", "HunyuanDiT2DMultiControlNetModel", ["forward"],
     {"forward": "controlnet"}),
    ("diffusers.models.controlnets.controlnet", "ControlNetModel", ["forward"], {"forward": "controlnet"}),
    ("diffusers.models.controlnets.controlnet_flux", "FluxControlNetModel", ["forward"], {"forward": "controlnet"}),
    ("diffusers.models.controlnets.controlnet_sd3", "SD3ControlNetModel", ["forward"], {"forward": "controlnet"}),
    ("diffusers.models.controlnets.controlnet_xs", "UNetControlNetXSModel", ["forward"], {"forward": "dit.step"}),
    ("user.models", "MyControlNetModel", ["forward"], {"forward": "controlnet"}),
    ("user.models", "MyDiTControlNetModel", ["forward"], {"forward": "controlnet"}),  # row order
    # VAE parts named *DiT* are not dit.step; the VAE's own encode/decode are the VAE's
    ("diffusers.models.autoencoders.autoencoder_longcat_audio_dit", "AudioDiTVaeDecoder", ["forward"], {}),
    ("diffusers.models.autoencoders.autoencoder_longcat_audio_dit", "AudioDiTVaeEncoder", ["forward"], {}),
    ("diffusers.models.autoencoders.autoencoder_longcat_audio_dit", "LongCatAudioDiTVae",
     ["encode", "decode", "forward"], {"encode": "vae.encode", "decode": "vae.decode"}),
    ("diffusers.models.transformers.transformer_longcat_audio_dit", "LongCatAudioDiTTransformer", ["forward"],
     {"forward": "dit.step"}),
    ("diffusers.models.transformers.hunyuan_transformer_2d", "HunyuanDiT2DModel", ["forward"],
     {"forward": "dit.step"}),
    # diffusers denoisers
    ("diffusers.models.transformers.transformer_wan", "WanTransformer3DModel", ["forward"], {"forward": "dit.step"}),
    ("diffusers.models.transformers.transformer_flux", "FluxTransformer2DModel", ["forward"], {"forward": "dit.step"}),
    ("diffusers.models.transformers.transformer_sd3", "SD3Transformer2DModel", ["forward"], {"forward": "dit.step"}),
    ("diffusers.models.transformers.transformer_hunyuan_video", "HunyuanVideoTransformer3DModel", ["forward"],
     {"forward": "dit.step"}),
    ("diffusers.models.transformers.transformer_2d", "Transformer2DModel", ["forward"], {"forward": "dit.step"}),
    ("diffusers.models.unets.unet_2d_condition", "UNet2DConditionModel", ["forward"], {"forward": "dit.step"}),
    ("diffusers.models.unets.unet_3d_condition", "UNet3DConditionModel", ["forward"], {"forward": "dit.step"}),
    # diffusers schedulers
    ("diffusers.schedulers.scheduling_flow_match_euler_discrete", "FlowMatchEulerDiscreteScheduler",
     ["step", "set_timesteps"], {"step": "scheduler.step", "set_timesteps": "timesteps"}),
    ("diffusers.schedulers.scheduling_unipc_multistep", "UniPCMultistepScheduler", ["step"],
     {"step": "scheduler.step"}),
    ("diffusers.schedulers.scheduling_dpmsolver_multistep", "DPMSolverMultistepScheduler", ["step"],
     {"step": "scheduler.step"}),
    # diffusers VAEs
    ("diffusers.models.autoencoders.autoencoder_kl", "AutoencoderKL", ["encode", "decode", "forward"],
     {"encode": "vae.encode", "decode": "vae.decode"}),
    ("diffusers.models.autoencoders.autoencoder_kl_wan", "AutoencoderKLWan", ["encode", "decode"],
     {"encode": "vae.encode", "decode": "vae.decode"}),
    ("diffusers.models.autoencoders.autoencoder_kl_hunyuan_video", "AutoencoderKLHunyuanVideo",
     ["encode", "decode"], {"encode": "vae.encode", "decode": "vae.decode"}),
    # TensorRT-LLM VisualGen (tensorrt_llm/_torch/visual_gen/models/...)
    ("tensorrt_llm._torch.visual_gen.models.wan.transformer_wan", "WanTransformer3DModel", ["forward"],
     {"forward": "dit.step"}),
    ("tensorrt_llm._torch.visual_gen.models.flux.transformer_flux", "FluxTransformer2DModel", ["forward"],
     {"forward": "dit.step"}),
    ("tensorrt_llm._torch.visual_gen.models.wan.wan_vae", "WanVAE", ["encode", "decode", "forward"],
     {"encode": "vae.encode", "decode": "vae.decode"}),
    # user code (generic patterns), e.g. the toy example's classes
    ("__main__", "ToyTextEncoder", ["forward"], {"forward": "text_encoder"}),
    ("toy_modules", "ToyDiTDenoiser", ["forward"], {"forward": "dit.step"}),
    ("toy_modules", "MyDenoiser", ["forward"], {"forward": "dit.step"}),
    ("toy_modules", "ToyFlowMatchScheduler", ["step"], {"step": "scheduler.step"}),
    ("toy_modules", "ToyVAE", ["encode", "decode"], {"encode": "vae.encode", "decode": "vae.decode"}),
    ("user.models", "TinyAutoencoder", ["encode", "decode"], {"encode": "vae.encode", "decode": "vae.decode"}),
    # must NOT match
    ("torch.optim.lr_scheduler", "LRScheduler", ["step"], {}),
    ("torch.optim.lr_scheduler", "_LRScheduler", ["step"], {}),
    ("transformers.models.t5.modeling_t5", "T5Stack", ["forward"], {}),
    ("transformers.models.clip.modeling_clip", "CLIPTextTransformer", ["forward"], {}),
    ("diffusers.models.attention", "BasicTransformerBlock", ["forward"], {}),
    ("diffusers.models.transformers.transformer_wan", "WanTransformerBlock", ["forward"], {}),
    ("diffusers.image_processor", "VaeImageProcessor", ["postprocess", "preprocess"], {}),
    ("diffusers.schedulers.scheduling_utils", "SchedulerMixin", ["save_pretrained"], {}),
    ("__main__", "Net", ["forward"], {}),
    ("__main__", "MyScheduler", ["set_timesteps"], {"set_timesteps": "timesteps"}),  # a root source, no step
    # root inputs (source components): diffusers pipelines, TensorRT-LLM VisualGen, user pipelines
    ("diffusers.pipelines.wan.pipeline_wan", "WanPipeline", ["encode_prompt", "prepare_latents", "__call__"],
     {"encode_prompt": "prompt_embeds", "prepare_latents": "latents.init"}),
    ("diffusers.pipelines.flux.pipeline_flux", "FluxPipeline", ["encode_prompt", "prepare_latents"],
     {"encode_prompt": "prompt_embeds", "prepare_latents": "latents.init"}),
    ("tensorrt_llm._torch.visual_gen.pipelines.wan", "WanVisualGen", ["_encode_prompt", "_prepare_latents"],
     {"_encode_prompt": "prompt_embeds", "_prepare_latents": "latents.init"}),
    ("toy_pipeline", "ToyVideoPipeline", ["encode_prompt", "prepare_latents", "set_timesteps"],
     {"encode_prompt": "prompt_embeds", "prepare_latents": "latents.init"}),
    ("user.gen", "Generator", ["prepare_latents", "encode_prompt"], {}),  # not a *Pipeline
    ("torch.utils.data", "DataPipeline", ["prepare_latents"], {}),         # excluded module
    ("__main__", "MyVaeDecoder", ["decode"], {}),        # globs are case-sensitive: Vae != VAE
]


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR is not set", file=sys.stderr)
        return 1
    share = os.path.join(BUILD, "share", "probe")
    sys.path.insert(0, os.path.join(share, "python"))
    from probe_adapter import _table  # noqa: E402

    table_path = os.path.join(share, "components.json")
    with open(table_path) as f:
        doc = json.load(f)

    # --- schema --------------------------------------------------------------
    check(doc.get("format") == "probe-components" and doc.get("version") == 1, "format/version")
    names = [c.get("name") for c in doc["components"]]
    check(names == ["text_encoder", "image_encoder", "controlnet", "dit.step", "dit.block", "scheduler.step", "vae.encode",
                     "vae.decode", "latents.init", "timesteps", "prompt_embeds"],
          "component names/order: %s" % names)
    opt_in = [c["name"] for c in doc["components"] if c.get("opt_in") is True]
    check(opt_in == ["dit.block"], "opt-in rows: %s" % opt_in)
    blk = doc["components"][names.index("dit.block")]
    check(blk.get("layout") == "[B, T, D]" and blk.get("channel_axis") == -1,
          "dit.block: layout [B, T, D], channel axis -1")
    roots = [c["name"] for c in doc["components"] if c.get("root") is True]
    check(roots == ["latents.init", "timesteps", "prompt_embeds"], "root inputs: %s" % roots)
    check(doc["components"][names.index("timesteps")].get("output_attrs") == ["timesteps", "sigmas"],
          "timesteps: output_attrs")
    for c in doc["components"]:
        for key, typ in (("name", str), ("description", str), ("patterns", list), ("output_slot", str),
                         ("layout", str), ("channel_axis", int), ("default_gate", str)):
            check(isinstance(c.get(key), typ) and not isinstance(c.get(key), bool),
                  "%s: %r is missing or not %s" % (c.get("name"), key, typ.__name__))
        check(c.get("default_gate") == "T1", "%s: default_gate %r" % (c.get("name"), c.get("default_gate")))
        check(str(c.get("output_slot", "")).startswith("out"), "%s: output_slot" % c.get("name"))
        rank = len(str(c.get("layout", "")).strip("[]").split(","))
        ax = c.get("channel_axis", 0)
        check(-rank <= ax < rank, "%s: channel_axis %r outside layout %r" % (c.get("name"), ax, c.get("layout")))
        for e in c.get("class_layouts", []):
            r = len(str(e.get("layout", "")).strip("[]").split(","))
            check(isinstance(e.get("classes"), list) and e["classes"]
                  and all(isinstance(g, str) for g in e["classes"])
                  and isinstance(e.get("channel_axis"), int) and -r <= e["channel_axis"] < r,
                  "%s: class_layouts entry %r" % (c.get("name"), e))
        check(all(isinstance(g, str) and g.startswith(("in.", "out."))
                  for g in c.get("exclude_slots", [])), "%s: exclude_slots" % c.get("name"))
    te = doc["components"][names.index("text_encoder")]
    check("out.logits" in te.get("exclude_slots", []), "text_encoder: out.logits excluded")

    table = _table.Table(table_path)

    # --- matching --------------------------------------------------------------
    for module, name, methods, want in CASES:
        got = dict(table.match(fake(module, name, *methods)))
        check(got == want, "%s:%s -> %s, expected %s" % (module, name, got, want))

    # An inherited method is found on the subclass.
    base = fake("user.base", "Stepper", "step")
    sub = type("MyScheduler", (base,), {})
    sub.__module__ = "user.sched"
    check(dict(table.match(sub)) == {"step": "scheduler.step"}, "inherited step not matched")

    # --- extra taps -------------------------------------------------------------
    t2 = _table.Table(table_path)
    t2.add_tap("text_encoder", "mymod:Thing.run")
    check(dict(t2.match(fake("mymod", "Thing", "run"))) == {"run": "text_encoder"}, "--tap mymod:Thing.run")
    check(dict(t2.match(fake("othermod", "Thing", "run"))) == {}, "--tap module glob ignored")
    # --tap wins over the table for the same method
    t2.add_tap("vae.decode", "*DiT*.forward")
    check(dict(t2.match(fake("m", "MyDiT", "forward"))) == {"forward": "vae.decode"}, "--tap precedence")
    # exclude_modules keeps the table away from torch, not an explicit --tap
    t2.add_tap("dit.step", "torch.nn.modules.linear:Linear.forward")
    check(dict(t2.match(fake("torch.nn.modules.linear", "Linear", "forward"))) == {"forward": "dit.step"},
          "--tap into torch.* was excluded")
    # a name that is not in the table makes a new component; an invalid one is refused
    t2.add_tap("dit.block.attn", "mymod:Attn.forward")
    check(dict(t2.match(fake("mymod", "Attn", "forward"))) == {"forward": "dit.block.attn"},
          "--tap of a component name that is not in the table")
    for bad_name, why in (("", "is empty"), ("a/b", "contains '/'"), ("..", "'.' or '..'"),
                          ("x\ty", "control character"), ("c" * 128, "128 bytes")):
        try:
            t2.add_tap(bad_name, "A.b")
            check(False, "add_tap accepted component %r" % bad_name)
        except _table.TableError as e:
            check(why in str(e) and "--tap" in str(e), "bad-name error says why: %s" % e)
    # the opt-in row dit.block finds nothing until enabled, then wins over *DiT*.forward
    t3 = _table.Table(table_path)
    blk = fake("diffusers.models.transformers.transformer_wan", "WanTransformerBlock", "forward")
    user_blk = fake("__main__", "MyDiTBlock", "forward")
    vae_blk = fake("diffusers.models.autoencoders.autoencoder_same", "TransformerBlock", "forward")
    check(dict(t3.match(blk)) == {} and dict(t3.match(user_blk)) == {"forward": "dit.step"},
          "dit.block is off by default (a *DiTBlock is only dit.step's *DiT*.forward)")
    t3.enable("dit.block")
    check(dict(t3.match(blk)) == {"forward": "dit.block"}
          and dict(t3.match(user_blk)) == {"forward": "dit.block"}
          and dict(t3.match(vae_blk)) == {}
          and dict(t3.match(fake("diffusers.models.transformers.transformer_wan",
                                 "WanTransformer3DModel", "forward"))) == {"forward": "dit.step"},
          "--blocks: diffusers and user blocks are dit.block, a VAE's TransformerBlock is not, the "
          "model is still dit.step")
    try:
        t3.enable("dit.step")
        check(False, "enable accepted a row that is not opt-in")
    except _table.TableError as e:
        check("no opt-in component 'dit.step'" in str(e), "enable of a row that is not opt-in: %s" % e)

    # an exclusion ('!') holds wherever it stands in its row and lets a later row take the method
    work0 = tempfile.mkdtemp(prefix="probe-excl-")
    tp = os.path.join(work0, "t.json")
    with open(tp, "w") as f:
        json.dump({"format": "probe-components", "version": 1, "components": [
            {"name": "a", "patterns": ["*Thing*.forward", "!*Vae*.forward"]},
            {"name": "b", "patterns": ["*Vae*.forward"], "exclude_slots": ["out.logits"]}]}, f)
    t4 = _table.Table(tp)
    check(dict(t4.match(fake("m", "ThingVae", "forward"))) == {"forward": "b"}
          and dict(t4.match(fake("m", "Thing", "forward"))) == {"forward": "a"},
          "exclusion after the positive pattern; the next row takes the method")
    check(t4.slot_excluded("b", "out.logits") and not t4.slot_excluded("b", "out.last_hidden_state")
          and not t4.slot_excluded("a", "out.logits"), "exclude_slots per row")
    t4.add_tap("a", "*Vae*.forward")
    check(dict(t4.match(fake("m", "ThingVae", "forward"))) == {"forward": "a"},
          "a --tap is not subject to the row's exclusions")
    try:
        t4.add_tap("a", "!*Thing*.forward")
        check(False, "add_tap accepted an exclusion")
    except _table.TableError as e:
        check("only for the component table" in str(e), "--tap '!': %s" % e)
    with open(tp, "w") as f:
        json.dump({"format": "probe-components", "version": 1, "components": [
            {"name": "a", "patterns": ["*.forward"], "exclude_slots": "out.logits"}]}, f)
    try:
        _table.Table(tp)
        check(False, "exclude_slots that is not a list was accepted")
    except _table.TableError as e:
        check("exclude_slots" in str(e), "bad exclude_slots: %s" % e)
    r = subprocess.run([os.path.join(BUILD, "bin", "probe-run"), "--out", os.path.join(work0, "p.h5"),
                        "--tap", "dit.step=!A.b", "--", "true"], capture_output=True, text=True)
    check(r.returncode == 2 and r.stderr.count("probe") == 1 and "only for the component table" in r.stderr,
          "probe-run --tap '!A.b': exit 2 with one line (%d, %r)" % (r.returncode, r.stderr))
    shutil.rmtree(work0, ignore_errors=True)

    # --- one grammar in probe-run and in the adapter ------------------------------
    patterns = {
        "A.b": True, "mymod:Thing.run": True, "*DiT*.forward": True, "a.b.*:C?[xy].f_1": True,
        "diffusers.*:AutoencoderKL*.decode": True, "[!_]*.step": True,
        "NoMethod": False, "a:b:C.f": False, "C.1x": False, ".f": False, "C.": False,
        "mod:.f": False, ":C.f": False, "C.f g": False, "C.f()": False, "A.b.c": False,
    }
    run = os.path.join(BUILD, "bin", "probe-run")
    work = tempfile.mkdtemp(prefix="probe-patterns-")
    for pat, good in patterns.items():
        try:
            _table.Pattern("dit.step", pat, False)
            py_ok = True
        except _table.TableError:
            py_ok = False
        r = subprocess.run([run, "--out", os.path.join(work, "p.h5"), "--tap", "dit.step=" + pat, "--", "true"],
                           capture_output=True, text=True)
        sh_ok = not (r.returncode == 2 and "malformed pattern" in r.stderr)
        check(py_ok == good, "adapter: pattern %r accepted=%s, expected %s" % (pat, py_ok, good))
        check(sh_ok == good, "probe-run: pattern %r accepted=%s, expected %s (%s)"
              % (pat, sh_ok, good, r.stderr.strip()))

    shutil.rmtree(work, ignore_errors=True)
    if failures:
        for f in failures:
            print("FAIL: " + f, file=sys.stderr)
        return 1
    print("test_adapter_patterns: %d classes, %d patterns checked" % (len(CASES) + 1, len(patterns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
