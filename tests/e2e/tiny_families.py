"""Tiny diffusers pipelines of many families, with random weights and offline
tokenizers (a tokenizers WordLevel model in a transformers
PreTrainedTokenizerFast; no hub access), for tests/e2e/test_families.py.

FAMILIES: name -> (build(), call kwargs, expected components). build()
seeds torch and returns the pipeline on the CPU in float32; every process
that builds a family gets the same weights.
"""

import torch

WORDS = ["a", "cat", "dog", "on", "the", "moon", "red", "blue", "photo", "of"]


def tokenizer(max_length=16):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", model_max_length=max_length)


def t5(d=32):
    from transformers import T5Config, T5EncoderModel
    return T5EncoderModel(T5Config(vocab_size=32, d_model=d, d_kv=8, d_ff=37, num_layers=1, num_heads=2,
                                   relative_attention_num_buckets=8)).eval()


def clip(d=32, proj=False, **kw):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
    c = CLIPTextConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_size=d, intermediate_size=37,
                       num_attention_heads=2, num_hidden_layers=2, vocab_size=32, max_position_embeddings=77,
                       **kw)
    return (CLIPTextModelWithProjection if proj else CLIPTextModel)(c).eval()


def vae_kl(latent=4, blocks=(4,), groups=1, **kw):
    from diffusers import AutoencoderKL
    return AutoencoderKL(block_out_channels=blocks, in_channels=3, out_channels=3,
                         down_block_types=["DownEncoderBlock2D"] * len(blocks),
                         up_block_types=["UpDecoderBlock2D"] * len(blocks), latent_channels=latent,
                         norm_num_groups=groups, layers_per_block=1, **kw).eval()


def _unet(cross=16):
    from diffusers import UNet2DConditionModel
    return UNet2DConditionModel(block_out_channels=(4, 8), layers_per_block=1, sample_size=8, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=cross,
                                norm_num_groups=2, attention_head_dim=2).eval()


def sd():
    from diffusers import DDIMScheduler, StableDiffusionPipeline
    torch.manual_seed(0)
    return StableDiffusionPipeline(vae=vae_kl(blocks=(4, 8), groups=2), text_encoder=clip(16),
                                   tokenizer=tokenizer(77), unet=_unet(16), scheduler=DDIMScheduler(),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def sd_controlnet():
    from diffusers import ControlNetModel, DDIMScheduler, StableDiffusionControlNetPipeline
    torch.manual_seed(0)
    cn = ControlNetModel(block_out_channels=(4, 8), layers_per_block=1, in_channels=4,
                         down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), cross_attention_dim=16,
                         conditioning_embedding_out_channels=(16, 32), norm_num_groups=2,
                         attention_head_dim=2).eval()
    return StableDiffusionControlNetPipeline(vae=vae_kl(blocks=(4, 8), groups=2), text_encoder=clip(16),
                                             tokenizer=tokenizer(77), unet=_unet(16), controlnet=cn,
                                             scheduler=DDIMScheduler(), safety_checker=None,
                                             feature_extractor=None, requires_safety_checker=False)


def flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    torch.manual_seed(0)
    tr = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]).eval()
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae_kl(latent=1, use_quant_conv=False,
                        use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035),
                        text_encoder=clip(32), tokenizer=tokenizer(77), text_encoder_2=t5(32),
                        tokenizer_2=tokenizer(16), transformer=tr)


def sd3():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    torch.manual_seed(0)
    tr = SD3Transformer2DModel(sample_size=32, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8,
                               num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                               pooled_projection_dim=64, out_channels=4).eval()
    return StableDiffusion3Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae_kl(
        use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035),
        text_encoder=clip(32, proj=True, projection_dim=32), tokenizer=tokenizer(77),
        text_encoder_2=clip(32, proj=True, projection_dim=32), tokenizer_2=tokenizer(77),
        text_encoder_3=t5(32), tokenizer_3=tokenizer(16), transformer=tr)


def cogvideox():
    from diffusers import (AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline,
                           CogVideoXTransformer3DModel)
    torch.manual_seed(0)
    tr = CogVideoXTransformer3DModel(num_attention_heads=4, attention_head_dim=8, in_channels=4, out_channels=4,
                                     time_embed_dim=2, text_embed_dim=32, num_layers=1, sample_width=2,
                                     sample_height=2, sample_frames=9, patch_size=2,
                                     temporal_compression_ratio=4, max_text_seq_length=16).eval()
    vae = AutoencoderKLCogVideoX(in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
                                 up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
                                 latent_channels=4, layers_per_block=1, norm_num_groups=2,
                                 temporal_compression_ratio=4).eval()
    return CogVideoXPipeline(tokenizer=tokenizer(16), text_encoder=t5(32), vae=vae, transformer=tr,
                             scheduler=CogVideoXDDIMScheduler())


def ltx():
    from diffusers import (AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline,
                           LTXVideoTransformer3DModel)
    torch.manual_seed(0)
    tr = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1,
                                    num_attention_heads=4, attention_head_dim=8, cross_attention_dim=32,
                                    num_layers=1, caption_channels=32).eval()
    vae = AutoencoderKLLTXVideo(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                                decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                                decoder_layers_per_block=(1, 1, 1, 1, 1),
                                spatio_temporal_scaling=(True, True, False, False),
                                decoder_spatio_temporal_scaling=(True, True, False, False),
                                decoder_inject_noise=(False,) * 5, upsample_residual=(False,) * 4,
                                upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1,
                                patch_size_t=1, encoder_causal=True, decoder_causal=False).eval()
    return LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=t5(32),
                       tokenizer=tokenizer(16), transformer=tr)


def hunyuan_video():
    from transformers import LlamaConfig, LlamaModel
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
                           HunyuanVideoTransformer3DModel)
    torch.manual_seed(0)
    tr = HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10,
                                        num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=1,
                                        patch_size_t=1, guidance_embeds=True, text_embed_dim=16,
                                        pooled_projection_dim=8, rope_axes_dim=(2, 4, 4)).eval()
    vae = AutoencoderKLHunyuanVideo(in_channels=3, out_channels=3, latent_channels=4,
                                    down_block_types=("HunyuanVideoDownBlock3D",) * 4,
                                    up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
                                    layers_per_block=1, act_fn="silu", norm_num_groups=4, scaling_factor=0.476986,
                                    spatial_compression_ratio=8, temporal_compression_ratio=4,
                                    mid_block_add_attention=True).eval()
    llama = LlamaModel(LlamaConfig(hidden_size=16, intermediate_size=37, num_attention_heads=4,
                                   num_key_value_heads=4, num_hidden_layers=2, vocab_size=32,
                                   max_position_embeddings=64)).eval()
    return HunyuanVideoPipeline(text_encoder=llama, tokenizer=tokenizer(32), transformer=tr, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                                text_encoder_2=clip(8, proj=False), tokenizer_2=tokenizer(77))


def sana():
    from transformers import Gemma2Config, Gemma2Model
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    torch.manual_seed(0)
    tr = SanaTransformer2DModel(patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_attention_heads=2,
                                attention_head_dim=4, num_cross_attention_heads=2, cross_attention_head_dim=4,
                                cross_attention_dim=8, caption_channels=8, sample_size=32).eval()
    vae = AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=2,
                        encoder_block_types=("ResBlock", "EfficientViTBlock"),
                        decoder_block_types=("ResBlock", "EfficientViTBlock"),
                        encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
                        encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                        encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1],
                        downsample_block_type="conv", upsample_block_type="interpolate",
                        decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407).eval()
    gemma = Gemma2Model(Gemma2Config(head_dim=16, hidden_size=8, intermediate_size=64, max_position_embeddings=64,
                                     num_attention_heads=2, num_hidden_layers=1, num_key_value_heads=2,
                                     vocab_size=32)).eval()
    return SanaPipeline(tokenizer=tokenizer(16), text_encoder=gemma, vae=vae, transformer=tr,
                        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


def pixart_sigma():
    from diffusers import DDIMScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel
    torch.manual_seed(0)
    tr = PixArtTransformer2DModel(sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8,
                                  num_attention_heads=3, caption_channels=32, in_channels=4, cross_attention_dim=24,
                                  out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
                                  num_embeds_ada_norm=1000, norm_type="ada_norm_single",
                                  norm_elementwise_affine=False, norm_eps=1e-6).eval()
    return PixArtSigmaPipeline(tokenizer=tokenizer(16), text_encoder=t5(32), vae=vae_kl(), transformer=tr,
                               scheduler=DDIMScheduler())


def qwen_image():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)
    torch.manual_seed(0)
    tr = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=1,
                                     attention_head_dim=16, num_attention_heads=3, joint_attention_dim=16,
                                     guidance_embeds=False, axes_dims_rope=(8, 4, 4)).eval()
    vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.0] * 4,
                                 latents_std=[1.0] * 4).eval()
    cfg = Qwen2_5_VLConfig(text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2,
                                        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1000,
                                        "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default",
                                                         "type": "default"}, "rope_theta": 1000000.0},
                           vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                                          "out_hidden_size": 16},
                           hidden_size=16, vocab_size=1000, vision_start_token_id=990, image_token_id=991,
                           video_token_id=992)
    te = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    pipe = QwenImagePipeline(transformer=tr, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                             text_encoder=te, tokenizer=tokenizer(64))
    pipe.prompt_template_encode = "{}"
    pipe.prompt_template_encode_start_idx = 0
    return pipe


def _wan_parts(in_channels=16, **tr_kw):
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    tr = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                               in_channels=in_channels, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=32,
                               num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                               rope_max_seq_len=32, **tr_kw).eval()
    return tr


def _wan_vae():
    from diffusers import AutoencoderKLWan
    return AutoencoderKLWan(base_dim=16, z_dim=16, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                            temperal_downsample=[False, True, True]).eval()


def wan():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    torch.manual_seed(0)
    return WanPipeline(tokenizer=tokenizer(16), text_encoder=t5(32), transformer=_wan_parts(), vae=_wan_vae(),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


def wan22():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    torch.manual_seed(0)
    return WanPipeline(tokenizer=tokenizer(16), text_encoder=t5(32), transformer=_wan_parts(), vae=_wan_vae(),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), transformer_2=_wan_parts(),
                       boundary_ratio=0.5)


def wan_i2v():
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
    torch.manual_seed(0)
    enc = CLIPVisionModelWithProjection(CLIPVisionConfig(hidden_size=4, projection_dim=4, num_hidden_layers=2,
                                                         num_attention_heads=2, image_size=32, intermediate_size=16,
                                                         patch_size=1)).eval()
    proc = CLIPImageProcessor(crop_size=32, size=32)
    import diffusers.pipelines.wan.pipeline_wan_i2v as m
    if not hasattr(m, "ftfy"):  # ftfy (prompt clean-up) is not installed: the prompt as it is
        m.prompt_clean = lambda text: text.strip()
    return WanImageToVideoPipeline(tokenizer=tokenizer(16), text_encoder=t5(32),
                                   transformer=_wan_parts(in_channels=36, image_dim=4), vae=_wan_vae(),
                                   scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), image_encoder=enc,
                                   image_processor=proc)


def mochi():
    from diffusers import (AutoencoderKLMochi, FlowMatchEulerDiscreteScheduler, MochiPipeline,
                           MochiTransformer3DModel)
    torch.manual_seed(0)
    tr = MochiTransformer3DModel(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1,
                                 pooled_projection_dim=16, in_channels=12, out_channels=None, qk_norm="rms_norm",
                                 text_embed_dim=32, time_embed_dim=4, activation_fn="swiglu",
                                 max_sequence_length=16).eval()
    vae = AutoencoderKLMochi(latent_channels=12, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
                             decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1)).eval()
    return MochiPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=t5(32),
                         tokenizer=tokenizer(16), transformer=tr)


def allegro():
    from diffusers import (AllegroPipeline, AllegroTransformer3DModel, AutoencoderKLAllegro,
                           CogVideoXDDIMScheduler)
    torch.manual_seed(0)
    tr = AllegroTransformer3DModel(num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                                   num_layers=1, cross_attention_dim=24, sample_width=8, sample_height=8,
                                   sample_frames=8, caption_channels=24).eval()
    vae = AutoencoderKLAllegro(in_channels=3, out_channels=3, down_block_types=("AllegroDownBlock3D",) * 4,
                               up_block_types=("AllegroUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
                               latent_channels=4, layers_per_block=1, norm_num_groups=2,
                               temporal_compression_ratio=4).eval()
    vae.enable_tiling()
    return AllegroPipeline(tokenizer=tokenizer(16), text_encoder=t5(24), vae=vae, transformer=tr,
                           scheduler=CogVideoXDDIMScheduler())


def _image():
    import PIL.Image
    import numpy as np
    return PIL.Image.fromarray((np.arange(32 * 32 * 3) % 251).astype("uint8").reshape(32, 32, 3))


IMG = dict(height=32, width=32)
VID = dict(height=16, width=16, num_frames=5)
# name -> (builder, call kwargs, {component: class name that must be tapped})
FAMILIES = {
    "sd": (sd, dict(**IMG), {"text_encoder": "CLIPTextModel", "dit.step": "UNet2DConditionModel",
                            "scheduler.step": "DDIMScheduler", "vae.decode": "AutoencoderKL"}),
    "sd-controlnet": (sd_controlnet, dict(image=None, **IMG),
                      {"text_encoder": "CLIPTextModel", "controlnet": "ControlNetModel",
                       "dit.step": "UNet2DConditionModel", "vae.decode": "AutoencoderKL"}),
    "flux": (flux, dict(height=16, width=16, max_sequence_length=16),
             {"text_encoder": "CLIPTextModel|T5EncoderModel", "dit.step": "FluxTransformer2DModel",
              "scheduler.step": "FlowMatchEulerDiscreteScheduler", "vae.decode": "AutoencoderKL"}),
    "flux-true-cfg": (flux, dict(height=16, width=16, max_sequence_length=16, negative_prompt="dog",
                                 true_cfg_scale=2.0),
                      {"text_encoder": "CLIPTextModel|T5EncoderModel", "dit.step": "FluxTransformer2DModel"}),
    "sd3": (sd3, dict(height=16, width=16, max_sequence_length=16),
            {"text_encoder": "CLIPTextModelWithProjection|T5EncoderModel", "dit.step": "SD3Transformer2DModel",
             "vae.decode": "AutoencoderKL"}),
    "cogvideox": (cogvideox, dict(height=16, width=16, num_frames=5, max_sequence_length=16),
                  {"text_encoder": "T5EncoderModel", "dit.step": "CogVideoXTransformer3DModel",
                   "scheduler.step": "CogVideoXDDIMScheduler", "vae.decode": "AutoencoderKLCogVideoX"}),
    "ltx": (ltx, dict(height=32, width=32, num_frames=9, max_sequence_length=16),
            {"text_encoder": "T5EncoderModel", "dit.step": "LTXVideoTransformer3DModel",
             "vae.decode": "AutoencoderKLLTXVideo"}),
    "hunyuan-video": (hunyuan_video, dict(height=16, width=16, num_frames=5, max_sequence_length=16,
                                          prompt_template={"template": "{}", "crop_start": 0}),
                      {"text_encoder": "LlamaModel|CLIPTextModel", "dit.step": "HunyuanVideoTransformer3DModel",
                       "vae.decode": "AutoencoderKLHunyuanVideo"}),
    "sana": (sana, dict(height=32, width=32, max_sequence_length=16, complex_human_instruction=None),
             {"text_encoder": "Gemma2Model", "dit.step": "SanaTransformer2DModel", "vae.decode": "AutoencoderDC"}),
    "pixart-sigma": (pixart_sigma, dict(height=16, width=16, max_sequence_length=16, use_resolution_binning=False),
                     {"text_encoder": "T5EncoderModel", "dit.step": "PixArtTransformer2DModel",
                      "vae.decode": "AutoencoderKL"}),
    "qwen-image": (qwen_image, dict(height=32, width=32, max_sequence_length=16, negative_prompt="dog",
                                    true_cfg_scale=2.0),
                   {"text_encoder": "Qwen2_5_VLForConditionalGeneration", "dit.step": "QwenImageTransformer2DModel",
                    "vae.decode": "AutoencoderKLQwenImage"}),
    "wan": (wan, dict(max_sequence_length=16, **VID),
            {"text_encoder": "T5EncoderModel", "dit.step": "WanTransformer3DModel",
             "vae.decode": "AutoencoderKLWan"}),
    "wan2.2": (wan22, dict(max_sequence_length=16, **VID),
               {"text_encoder": "T5EncoderModel", "dit.step": "WanTransformer3DModel"}),
    "wan-i2v": (wan_i2v, dict(image=None, max_sequence_length=16, height=32, width=32, num_frames=5),
                {"text_encoder": "T5EncoderModel", "image_encoder": "CLIPVisionModelWithProjection",
                 "dit.step": "WanTransformer3DModel", "vae.encode": "AutoencoderKLWan",
                 "vae.decode": "AutoencoderKLWan"}),
    "mochi": (mochi, dict(height=16, width=16, num_frames=7, max_sequence_length=16),
              {"text_encoder": "T5EncoderModel", "dit.step": "MochiTransformer3DModel",
               "vae.decode": "AutoencoderKLMochi"}),
    "allegro": (allegro, dict(height=16, width=16, num_frames=8, max_sequence_length=16),
                {"text_encoder": "T5EncoderModel", "dit.step": "AllegroTransformer3DModel",
                 "vae.decode": "AutoencoderKLAllegro"}),
}


def call_kwargs(name):
    kw = dict(FAMILIES[name][1])
    if "image" in kw:
        kw["image"] = _image()
    return dict(prompt="a photo of a cat", num_inference_steps=2, guidance_scale=3.0, output_type="np",
                generator=torch.Generator().manual_seed(1), **kw)


class Hooks:
    """The capture written by hand: torch forward (pre-)hooks on the
    pipeline's text encoders, image encoder, denoisers and ControlNet, and
    wrappers of the scheduler's step/set_timesteps, the VAE's encode/decode
    and the pipeline's encode_prompt/prepare_latents, that copy every tensor
    argument (before the call) and result (after it) to numpy under probe's
    path rules (/<component>/<call:04>/in.<arg>..., out...). Call indices
    count per component over the whole process, as probe's do."""

    def __init__(self):
        self.calls, self.saved, self.family_calls, self.modules = {}, {}, {}, {}

    def _call(self, comp, family, module=None):
        c = self.calls.get(comp, 0)
        self.calls[comp] = c + 1
        self.family_calls.setdefault(family, []).append("/%s/%04d" % (comp, c))
        self.modules["/%s/%04d" % (comp, c)] = module
        return c

    def _put(self, comp, call, slot, v, depth=0):
        import dataclasses
        if isinstance(v, torch.Tensor):
            v = v.detach().cpu().contiguous().clone()
            if v.dtype == torch.bfloat16:  # h5py reads probe's bfloat16 datasets as float32 (exact)
                v = v.float()
            self.saved["/%s/%04d/%s" % (comp, call, slot)] = v.numpy()
            return
        if depth >= 2 and slot.startswith("out"):
            return
        if isinstance(v, dict):
            items = list(v.items())
        elif isinstance(v, (list, tuple)):
            items = list(enumerate(v))
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            items = [(f.name, getattr(v, f.name, None)) for f in dataclasses.fields(v)]
        elif type(v).__name__.endswith("Distribution"):
            items = [(k, getattr(v, k, None)) for k in ("mean", "logvar")]
        else:
            return
        for k, x in items:
            if isinstance(x, torch.Tensor) or slot.startswith("out"):
                self._put(comp, call, "%s.%s" % (slot, k), x, depth + 1)

    def _inputs(self, comp, call, func, args, kwargs):
        import inspect
        sig = inspect.signature(func)
        b = sig.bind(*args, **kwargs)
        for name, v in b.arguments.items():
            kind = sig.parameters[name].kind
            if kind == inspect.Parameter.VAR_KEYWORD:
                for k, x in v.items():
                    self._put(comp, call, "in." + k, x)
            else:
                self._put(comp, call, "in." + name, v)

    def module(self, mod, comp, family, key=None):
        state = {}

        def pre(m, args, kwargs):
            state["call"] = c = self._call(comp, family, key)
            self._inputs(comp, c, m.forward, args, kwargs)

        def post(m, args, kwargs, out):
            self._put(comp, state["call"], "out", out)
        mod.register_forward_pre_hook(pre, with_kwargs=True)
        mod.register_forward_hook(post, with_kwargs=True)

    def method(self, obj, name, comp, family, attrs=(), key=None):
        import functools
        func = getattr(obj, name)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            c = self._call(comp, family, key)
            self._inputs(comp, c, func, args, kwargs)
            out = func(*args, **kwargs)
            self._put(comp, c, "out", out)
            for a in attrs:
                if isinstance(getattr(obj, a, None), torch.Tensor):
                    self._put(comp, c, "out." + a, getattr(obj, a))
            return out
        setattr(obj, name, wrapper)

    def attach(self, pipe, family):
        for key, value in pipe.components.items():
            if not isinstance(value, torch.nn.Module):
                continue
            comp = ("text_encoder" if key.startswith("text_encoder") else
                    "image_encoder" if key == "image_encoder" else
                    "controlnet" if key == "controlnet" else
                    "dit.step" if key.startswith("transformer") or key == "unet" else None)
            if comp:
                self.module(value, comp, family, key)
        self.method(pipe.scheduler, "step", "scheduler.step", family, key="scheduler")
        self.method(pipe.scheduler, "set_timesteps", "timesteps", family, attrs=("timesteps", "sigmas"),
                    key="scheduler")
        self.method(pipe.vae, "decode", "vae.decode", family, key="vae")
        self.method(pipe.vae, "encode", "vae.encode", family, key="vae")
        self.method(pipe, "prepare_latents", "latents.init", family)
        self.method(pipe, "encode_prompt", "prompt_embeds", family)


def main(argv):
    """python tiny_families.py OUT_DIR hooks|plain FAMILY...: run each family
    once (one thread); OUT_DIR/outputs.npz holds each family's output, with
    hooks OUT_DIR/hooks.npz every tensor they saw, OUT_DIR/calls.json the
    calls of each family and OUT_DIR/modules.json each call's module: the
    pipeline's component name of the module the hook is on (None for the
    pipeline's own methods). PROBE_FAMILIES_DEVICE (default cpu) and
    PROBE_FAMILIES_DTYPE (a torch dtype name, default float32) move each
    pipeline there (scripts/gpu/families.sh runs them on a GPU in bfloat16)."""
    import json
    import os
    import numpy as np
    out_dir, mode, names = argv[1], argv[2], argv[3:]
    device = os.environ.get("PROBE_FAMILIES_DEVICE", "cpu")
    dtype = getattr(torch, os.environ.get("PROBE_FAMILIES_DTYPE", "float32"))
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    hooks = Hooks() if mode == "hooks" else None
    outputs = {}
    for name in names:
        pipe = FAMILIES[name][0]()
        if device != "cpu" or dtype != torch.float32:
            pipe.to(device, dtype)
        pipe.set_progress_bar_config(disable=True)
        if hooks:
            hooks.attach(pipe, name)
        with torch.no_grad():
            out = pipe(**call_kwargs(name))[0]
            if isinstance(out, torch.Tensor):
                out = out.float().cpu()
            outputs[name] = np.asarray(out)
    np.savez(os.path.join(out_dir, "outputs.npz"), **outputs)
    if hooks:
        np.savez(os.path.join(out_dir, "hooks.npz"), **{k.replace("/", "|"): v for k, v in hooks.saved.items()})
        with open(os.path.join(out_dir, "calls.json"), "w") as f:
            json.dump(hooks.family_calls, f)
        with open(os.path.join(out_dir, "modules.json"), "w") as f:
            json.dump(hooks.modules, f)


if __name__ == "__main__":
    import sys
    main(sys.argv)
