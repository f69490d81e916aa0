"""Worked example: parity tests of a diffusers Wan transformer with probe.pair.

    PYTHONPATH=build/share/probe/python python -m pytest tests/pytest/test_wan_parity.py

Components (the boundaries probe-run captures under the same names):
  dit.block  one WanTransformerBlock (blocks[1]) on the inputs the model
             gives it (captured by a forward pre-hook), output slot "out";
  dit.step   the whole WanTransformer3DModel forward (one denoiser call),
             output Transformer2DModelOutput, slot "out.sample".
The model is a tiny configuration (2 layers, 4 heads x 32, ffn 256) with
random weights (torch.manual_seed(0)) on latents [1, 16, 3, 8, 8].

Device: cuda when torch has one, else cpu (PROBE_PAIR_DEVICE=cpu|cuda
overrides). The cases:
  attention backend swap, reference feature-off (SDPA's math backend):
    cpu   float32, _native_math -> native (SDPA's fused CPU kernel), gate T1;
    cuda  bfloat16, _native_math -> _native_flash / _native_efficient /
          _native_cudnn, gate T1-relaxed:backend-swap;
  feature active (one call each): the backend's function is called inside
    the component with the feature on (twice: self- and cross-attention),
    the outputs differ from the math backend's, and on cuda a kernel of that
    backend ran (torch.profiler's kernel events);
  the same swap in bfloat16 on both devices judged by the oracle verdict
    (oracle=True: no less accurate than the math backend against the fp32
    oracle);
  bf16 vs fp32, reference fp32-oracle (the same weights held in float32 on
    float32 copies of the inputs), gate T2 with wan_bf16_calibration.json;
  a planted defect (the attention output scaled by 1.25): the gate fails
    and names the slot.
"""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import probe  # noqa: E402
from diffusers import WanTransformer3DModel  # noqa: E402
from diffusers.models import attention_dispatch  # noqa: E402
from diffusers.models.attention_dispatch import AttentionBackendName, attention_backend  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CALIBRATION = os.path.join(HERE, "wan_bf16_calibration.json")
DEVICE = os.environ.get("PROBE_PAIR_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=16,
              out_channels=16, text_dim=64, freq_dim=64, ffn_dim=256, num_layers=2,
              cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64)

# The reference runs SDPA's math backend (the unfused reference
# implementation); the candidate another backend: on the CPU "native" (SDPA's
# choice there, its fused CPU kernel), on CUDA each fused backend by name (SDPA's
# own choice on CUDA is one of them, which would compare a backend with itself).
REFERENCE_BACKEND = "_native_math"
if DEVICE == "cuda":
    DTYPE, GATE = torch.bfloat16, "T1-relaxed:backend-swap"
    BACKENDS = ["_native_flash", "_native_efficient", "_native_cudnn"]
    KERNELS = {"_native_flash": "*flash*", "_native_efficient": "*fmha*"}
else:
    DTYPE, GATE = torch.float32, "T1"
    BACKENDS = ["native"]
    KERNELS = {}


def backend_feature(name):
    """The attention-backend swap as a probe feature: diffusers'
    attention_backend context manager, with `name` on the candidate side and
    the math backend on the reference side."""
    return probe.feature("attn:" + name, on=lambda: attention_backend(name),
                         off=lambda: attention_backend(REFERENCE_BACKEND), gate=GATE)


class Wan:
    """The model in float32 and in bfloat16 (the float32 weights cast), the
    inputs, and each model's inputs to blocks[1]."""

    def __init__(self):
        if DEVICE == "cpu":
            torch.set_num_threads(2)
        torch.manual_seed(0)
        fp32 = WanTransformer3DModel(**CONFIG).eval()
        bf16 = WanTransformer3DModel(**CONFIG).eval()
        bf16.load_state_dict(fp32.state_dict())
        self.fp32 = fp32.to(DEVICE)
        self.bf16 = bf16.to(DEVICE, torch.bfloat16)
        g = torch.Generator().manual_seed(100)
        self.latents = torch.randn(1, 16, 3, 8, 8, generator=g).to(DEVICE)
        self.text = torch.randn(1, 16, 64, generator=g).to(DEVICE)
        self.timestep = torch.tensor([500.0], device=DEVICE)

    def model(self, dtype):
        return self.fp32 if dtype == torch.float32 else self.bf16

    def step_args(self, dtype):
        return (self.latents.to(dtype), self.timestep, self.text.to(dtype))

    def block_args(self, dtype):
        """blocks[1]'s positional inputs (hidden_states, encoder_hidden_states,
        temb, rotary_emb) as the model of that dtype gives them."""
        model = self.model(dtype)
        seen = {}
        h = model.blocks[1].register_forward_pre_hook(lambda m, a: seen.__setitem__("args", a))
        try:
            with torch.no_grad():
                model(*self.step_args(dtype))
        finally:
            h.remove()
        return seen["args"]


@pytest.fixture(scope="module")
def wan():
    return Wan()


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_attention_backend(wan, backend, pair_stats):
    res = probe.assert_pair(wan.model(DTYPE).blocks[1], wan.block_args(DTYPE),
                            component="dit.block", feature=backend_feature(backend),
                            reference="feature-off", gate=GATE, channel_axis=-1,
                            session=pair_stats)
    print(res.report())
    assert list(res.slots) == ["out"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dit_step_attention_backend(wan, backend, pair_stats):
    res = probe.assert_pair(wan.model(DTYPE), wan.step_args(DTYPE), component="dit.step",
                            feature=backend_feature(backend), reference="feature-off", gate=GATE,
                            channel_axis=1, session=pair_stats)
    print(res.report())
    assert list(res.slots) == ["out.sample"]  # Transformer2DModelOutput.sample, as captured


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_backend_is_active(wan, backend):
    backends = attention_dispatch._AttentionBackendRegistry._backends
    res = probe.assert_active(wan.model(DTYPE).blocks[1], wan.block_args(DTYPE),
                              component="dit.block", feature=backend_feature(backend),
                              called=(backends, AttentionBackendName(backend)),
                              min_calls=2,  # self-attention and cross-attention
                              differs=True, kernel=KERNELS.get(backend))
    print("calls with the feature on: %s; differing slots: %s; matching kernels: %s"
          % (res.calls_on, res.differing, res.kernels_matched))


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_bf16_attention_backend_oracle_verdict(wan, backend, pair_stats):
    """The bf16 backend swap judged as gates.md recommends for bf16: no less
    accurate than the math backend against the fp32 oracle (oracle=True); the
    gate's own verdict is reported beside it."""
    res = probe.assert_pair(wan.bf16.blocks[1], wan.block_args(torch.bfloat16),
                            component="dit.block", feature=backend_feature(backend),
                            reference="feature-off", oracle=True,
                            gate="T1-relaxed:backend-swap", session=pair_stats)
    print(res.report())
    s = res["out"]
    print("gate alone: %s %s" % (s["gate_verdict"], s["gate_reasons"]))
    assert not s["oracle"]["same_as_reference"]


def test_block_bf16_against_fp32_oracle(pair_stats):
    wan = Wan()
    res = probe.assert_pair(wan.bf16.blocks[1], wan.block_args(torch.bfloat16),
                            component="dit.block", feature="bf16", reference="fp32-oracle",
                            gate="T2", calibration=CALIBRATION, channel_axis=-1,
                            session=pair_stats)
    print(res.report())
    s = res["out"]
    assert (s["dtype"], s["dtype_candidate"]) == ("float32", "bfloat16")


def test_dit_step_bf16_against_fp32_oracle(wan, pair_stats):
    res = probe.assert_pair(wan.bf16, wan.step_args(torch.bfloat16), component="dit.step",
                            feature="bf16", reference="fp32-oracle", gate="T2",
                            calibration=CALIBRATION, channel_axis=1, session=pair_stats)
    print(res.report())


def test_planted_attention_defect_fails(wan):
    """A 'feature' that scales the default backend's attention output by
    1.25 (switched with enable=/disable= plain callables): the gate must fail
    and the message name the component, feature and slot."""
    backends = attention_dispatch._AttentionBackendRegistry._backends
    native = AttentionBackendName.NATIVE
    orig = backends[native]

    def scaled(**kw):
        return orig(**kw) * 1.25

    bug = probe.feature("attn:scaled-1.25", enable=lambda: backends.__setitem__(native, scaled),
                        disable=lambda: backends.__setitem__(native, orig))
    with pytest.raises(AssertionError) as err:
        probe.assert_pair(wan.model(DTYPE).blocks[1], wan.block_args(DTYPE), component="dit.block",
                          feature=bug, reference="feature-off", gate=GATE)
    msg = str(err.value)
    print(msg)
    assert backends[native] is orig
    assert "dit.block" in msg and "attn:scaled-1.25" in msg and "slot out:" in msg
    assert "rel_l2=" in msg and "max_abs=" in msg and "(reference " in msg
