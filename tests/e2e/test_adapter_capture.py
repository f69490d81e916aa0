#!/usr/bin/env python3
"""End-to-end: the Python adapter captures component inputs and outputs.

A small "pipeline" of plain torch classes whose names match the component
table (DemoTextEncoder in __main__; DemoDiT, DemoScheduler, DemoVAE in an
imported module; extra taps on mymod classes) runs under probe-run. The
pipeline records, independently of probe, every tensor the adapter must
capture (np.save of its own copy, taken before/after each call) with the
expected call index, step, CFG branch and timestep. The test then requires:

  * the set of numeric datasets in the capture file == the expected set
    (so nested same-component calls were tapped once, non-tensors and
    unmatched classes were not tapped, nothing is missing);
  * every dataset is bit-identical to the pipeline's copy (strided and offset
    views included: a transposed input is captured with its logical values);
  * probe.call / probe.step / probe.cfg_branch / probe.timestep / probe.dtype
    attributes equal the expected values;
  * the program's stdout is byte-identical to a run without probe-run, its
    exit status is 0, and stderr carries exactly one `probe:` note for the
    two complex tensors it could not capture.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR")
PYTHON = os.environ.get("PROBE_PYTHON", sys.executable)

DEMO_COMPONENTS = textwrap.dedent('''
    """Component-like classes in an imported module (not __main__)."""
    import functools
    from collections import OrderedDict
    from dataclasses import dataclass

    import torch


    class DemoOutput(OrderedDict):
        """A dict with attribute access, like diffusers' BaseOutput."""
        def __getattr__(self, k):
            try:
                return self[k]
            except KeyError:
                raise AttributeError(k)


    @dataclass
    class DemoSchedulerOutput:
        prev_sample: torch.Tensor
        pred_original_sample: torch.Tensor
        note: str = "not a tensor"


    class DemoGaussianDistribution:
        """Like diffusers' DiagonalGaussianDistribution: mean/logvar are chunk views."""
        def __init__(self, parameters):
            self.parameters = parameters
            self.mean, self.logvar = torch.chunk(parameters, 2, dim=1)
            self.std = torch.exp(0.5 * self.logvar)


    def apply_forward_hook(method):
        """Like diffusers.utils.accelerate_utils.apply_forward_hook."""
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            return method(self, *args, **kwargs)
        return wrapper


    class DemoDiTInner(torch.nn.Module):
        """Matches *DiT* too, but only ever runs inside DemoDiT.forward."""
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)


    class DemoDiT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = DemoDiTInner()
            self.proj = torch.nn.Linear(8, 4)

        def forward(self, hidden_states, timestep, encoder_hidden_states, controls=None, **extra):
            h = self.inner(hidden_states.permute(0, 2, 3, 1))
            ctx = self.proj(encoder_hidden_states).mean(dim=1)
            ts = torch.as_tensor(timestep, dtype=h.dtype).reshape(-1, 1, 1, 1)
            h = h + ctx[:, None, None, :] * ts / 1000.0
            for c in controls or []:
                if c is not None:
                    h = h + c.mean()
            if "extra_scale" in extra:
                h = h * extra["extra_scale"]
            out = h.permute(0, 3, 1, 2).contiguous()
            return (out, {"aux": out.mean(dim=1), "scale": 2.0})


    class DemoDiTChild(DemoDiT):
        """Overrides forward with (*args, **kwargs) and calls the base: tapped once."""
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)


    class DemoScheduler:
        def step(self, model_output, timestep, sample, return_dict=True):
            prev = sample - 0.1 * model_output
            x0 = sample - model_output
            if not return_dict:
                return (prev,)
            return DemoSchedulerOutput(prev_sample=prev, pred_original_sample=x0)


    class StepperBase:
        """Does not match *Scheduler: its own calls are never tapped."""
        def step(self, model_output, timestep, sample):
            return sample + model_output


    class InheritingScheduler(StepperBase):
        """Matches *Scheduler.step through the inherited method."""
        pass


    class DemoVAE(torch.nn.Module):
        def encode(self, x):
            params = torch.cat([x * 0.5, x * 0.0 - 1.0], dim=1)
            return DemoOutput(latent_dist=DemoGaussianDistribution(params))

        @apply_forward_hook
        def decode(self, z, return_dict=True):
            s = z * 2.0 + 1.0
            out = DemoOutput(
                sample=s,
                mask=s > 1.0,
                ids=(s * 10).to(torch.int64),
                i32=(s * 10).to(torch.int32),
                i16=(s * 10).to(torch.int16),
                i8=(s * 10).to(torch.int8),
                u8=(s * 10).abs().to(torch.uint8),
                half=s.to(torch.float16),
                bf=s.to(torch.bfloat16),
                dbl=s.to(torch.float64),
            )
            return out if return_dict else tuple(out.values())
''')

MYMOD = textwrap.dedent('''
    """Classes found only through probe-run --tap."""
    import torch


    class Thing:
        @staticmethod
        def run(x, scale=1.0):
            return x * scale


    class ClsMaker:
        @classmethod
        def make(cls, z):
            return (cls.__name__, z * 3.0)
''')

PIPELINE = textwrap.dedent('''
    import json
    import math
    import os
    import sys

    import numpy as np
    import torch

    import demo_components as dc
    import mymod

    EXPECT_DIR = sys.argv[1]
    os.makedirs(EXPECT_DIR, exist_ok=True)
    index = []


    def expect(path, t, step=-1, cfg=-1, timestep=None):
        """Save this program's own copy of a tensor probe must capture at path."""
        t = t.detach()
        dtype = str(t.dtype).replace("torch.", "")
        arr = (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()
        fname = "%03d.npy" % len(index)
        np.save(os.path.join(EXPECT_DIR, fname), arr)
        index.append({"path": path, "file": fname, "dtype": dtype, "step": step,
                      "cfg_branch": cfg, "timestep": timestep,
                      "call": int(path.split("/")[2])})


    class DemoTextEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)

        def forward(self, input_ids, attention_mask=None):
            h = self.emb(input_ids) * attention_mask[..., None]
            return dc.DemoOutput(last_hidden_state=h, pooler_output=h.mean(dim=1))


    torch.manual_seed(1234)
    te = DemoTextEncoder()
    dit = dc.DemoDiT()
    child = dc.DemoDiTChild()
    child.load_state_dict(dit.state_dict())
    sched = dc.DemoScheduler()
    vae = dc.DemoVAE()

    # --- text encoder: two calls, kwargs -----------------------------------
    embs = []
    for call, prompt in enumerate([[3, 4, 5, 6, 7], [1, 2, 0, 0, 0]]):
        ids = torch.tensor([prompt, prompt[::-1]])
        mask = (ids > 0).to(torch.float32)
        out = te(ids, attention_mask=mask)
        p = "/text_encoder/%04d/" % call
        expect(p + "in.input_ids", ids)
        expect(p + "in.attention_mask", mask)
        expect(p + "out.last_hidden_state", out.last_hidden_state)
        expect(p + "out.pooler_output", out.pooler_output)
        embs.append(out.last_hidden_state)

    # --- extra tap text_encoder=mymod:Thing.run (a staticmethod) ---------
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    r1 = mymod.Thing.run(x, scale=2.0)      # through the class
    r2 = mymod.Thing().run(x)               # through an instance
    expect("/text_encoder/0002/in.x", x)
    expect("/text_encoder/0002/out", r1)
    expect("/text_encoder/0003/in.x", x)
    expect("/text_encoder/0003/out", r2)
    assert torch.equal(r1, x * 2.0) and torch.equal(r2, x)

    # --- denoising loop: 3 steps x 2 CFG branches ------------------------
    lat = torch.randn(2, 4, 3, 3)
    c0, c1 = torch.randn(2, 2), torch.randn(3)
    phase = torch.ones(2, dtype=torch.complex64)   # not capturable: one probe: note
    dit_call = 0
    sched_call = 0
    timesteps = [torch.tensor(900.0), torch.tensor(600.0), torch.tensor(300.0)]
    for k, t in enumerate(timesteps):
        preds = []
        for branch, emb in enumerate(embs):
            p = "/dit.step/%04d/" % dit_call
            if k == 0:
                # expanded CPU timestep [2] (all equal), list argument with a
                # non-tensor, **extra kwargs (one real, one complex)
                tt = t.expand(2)
                scale = torch.tensor(1.5)
                expect(p + "in.hidden_states", lat, k, branch, float(t))
                expect(p + "in.timestep", tt, k, branch, float(t))
                expect(p + "in.encoder_hidden_states", emb, k, branch, float(t))
                expect(p + "in.controls.0", c0, k, branch, float(t))
                expect(p + "in.controls.2", c1, k, branch, float(t))
                expect(p + "in.extra_scale", scale, k, branch, float(t))
                out = dit(lat, tt, emb, controls=[c0, None, c1], extra_scale=scale, phase=phase)
            elif k == 1:
                # the subclass with forward(*args, **kwargs); a transposed
                # (strided) hidden_states; a 0-dim timestep passed by keyword
                lt = lat.transpose(2, 3)
                expect(p + "in.args.0", lt, k, branch, float(t))
                expect(p + "in.timestep", t, k, branch, float(t))
                expect(p + "in.encoder_hidden_states", emb, k, branch, float(t))
                out = child(lt, timestep=t, encoder_hidden_states=emb)
            else:
                # a Python float timestep
                expect(p + "in.hidden_states", lat, k, branch, 300.0)
                expect(p + "in.encoder_hidden_states", emb, k, branch, 300.0)
                out = dit(lat, 300.0, emb)
            expect(p + "out.0", out[0], k, branch, float(t) if k < 2 else 300.0)
            expect(p + "out.1.aux", out[1]["aux"], k, branch, float(t) if k < 2 else 300.0)
            preds.append(out[0])
            dit_call += 1
        pred = preds[1] + 2.0 * (preds[0] - preds[1])
        p = "/scheduler.step/%04d/" % sched_call
        expect(p + "in.model_output", pred, k, -1, float(t))
        expect(p + "in.timestep", t, k, -1, float(t))
        expect(p + "in.sample", lat, k, -1, float(t))
        if k < 2:
            so = sched.step(pred, t, lat)
            expect(p + "out.prev_sample", so.prev_sample, k, -1, float(t))
            expect(p + "out.pred_original_sample", so.pred_original_sample, k, -1, float(t))
            lat = so.prev_sample
        else:
            so = sched.step(pred, t, lat, return_dict=False)
            expect(p + "out.0", so[0], k, -1, float(t))
            lat = so[0]
        sched_call += 1

    # --- inherited step: StepperBase (no match) vs InheritingScheduler ---
    base_out = dc.StepperBase().step(lat, None, lat)               # not tapped
    tv = torch.tensor([1.0, 2.0])                                 # not one value: NaN
    inh_out = dc.InheritingScheduler().step(lat, tv, base_out)
    p = "/scheduler.step/%04d/" % sched_call
    expect(p + "in.model_output", lat, 3, -1, None)
    expect(p + "in.timestep", tv, 3, -1, None)
    expect(p + "in.sample", base_out, 3, -1, None)
    expect(p + "out", inh_out, 3, -1, None)

    # --- VAE: encode (distribution output), decode (decorated, many dtypes)
    img = torch.randn(2, 3, 4, 4)
    enc = vae.encode(img)
    expect("/vae.encode/0000/in.x", img)
    expect("/vae.encode/0000/out.latent_dist.mean", enc.latent_dist.mean)
    expect("/vae.encode/0000/out.latent_dist.logvar", enc.latent_dist.logvar)
    dec = vae.decode(lat)
    expect("/vae.decode/0000/in.z", lat)
    for key, value in dec.items():
        expect("/vae.decode/0000/out." + key, value)
    # extra tap vae.decode=mymod:Cls*.make (a classmethod)
    name, made = mymod.ClsMaker.make(lat)
    assert name == "ClsMaker"
    expect("/vae.decode/0001/in.z", lat)
    expect("/vae.decode/0001/out.1", made)

    with open(os.path.join(EXPECT_DIR, "index.json"), "w") as f:
        json.dump(index, f)
    # stdout: a digest of the results, compared with a run without probe-run
    print("final latent sum %.9e" % lat.double().sum().item())
    print("decoded sum %.9e" % dec["sample"].double().sum().item())
    print("made sum %.9e" % made.double().sum().item())
''')


def bits_equal(expected, got):
    if expected.shape != got.shape:
        return False, "shape %s != %s" % (got.shape, expected.shape)
    if expected.dtype == np.bool_:
        return bool(np.array_equal(expected, got.astype(np.bool_))), "bool values differ"
    if expected.dtype != got.dtype:
        return False, "dtype %s != %s" % (got.dtype, expected.dtype)
    if expected.dtype.kind == "f":
        ui = {2: np.uint16, 4: np.uint32, 8: np.uint64}[expected.dtype.itemsize]
        same = np.array_equal(np.ascontiguousarray(expected).view(ui), np.ascontiguousarray(got).view(ui))
    else:
        same = np.array_equal(expected, got)
    return bool(same), "values differ (max |diff| %s)" % (
        np.max(np.abs(expected.astype(np.float64) - got.astype(np.float64))) if expected.size else 0)


def numeric_datasets(h5):
    found = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "biuf":
            found["/" + name] = obj
    h5.visititems(visit)
    return found


def attr(ds, key):
    v = ds.attrs.get(key)
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, np.ndarray) and v.size == 1:
        v = v.reshape(-1)[0]
    if isinstance(v, np.generic):
        v = v.item()
    return v


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR is not set", file=sys.stderr)
        return 1
    run = os.path.join(BUILD, "bin", "probe-run")
    failures = []
    with tempfile.TemporaryDirectory(prefix="probe-adapter-") as work:
        for name, text in (("demo_components.py", DEMO_COMPONENTS), ("mymod.py", MYMOD),
                           ("pipeline.py", PIPELINE)):
            with open(os.path.join(work, name), "w") as f:
                f.write(text)
        env = dict(os.environ)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPATH", None)

        plain = subprocess.run([PYTHON, "pipeline.py", os.path.join(work, "exp_plain")],
                               cwd=work, env=env, capture_output=True, text=True)
        if plain.returncode != 0:
            print(plain.stderr, file=sys.stderr)
            print("FAIL: the pipeline itself fails without probe-run", file=sys.stderr)
            return 1

        h5path = os.path.join(work, "cap.h5")
        probed = subprocess.run(
            [run, "--out", h5path, "--label", "adapter-capture",
             "--tap", "text_encoder=mymod:Thing.run", "--tap", "vae.decode=mymod:Cls*.make",
             "--", PYTHON, "pipeline.py", os.path.join(work, "exp")],
            cwd=work, env=env, capture_output=True, text=True)
        if probed.returncode != 0:
            print(probed.stderr, file=sys.stderr)
            print("FAIL: pipeline under probe-run exited %d" % probed.returncode, file=sys.stderr)
            return 1
        if probed.stdout != plain.stdout:
            failures.append("stdout differs under probe-run:\n%r\n%r" % (probed.stdout, plain.stdout))
        notes = [l for l in probed.stderr.splitlines() if l.startswith("probe:")]
        others = [l for l in probed.stderr.splitlines() if not l.startswith("probe:")]
        if others:
            failures.append("unexpected stderr lines: %r" % others)
        complex_notes = [l for l in notes if "complex" in l]
        if len(complex_notes) != 1 or len(notes) != 1:
            failures.append("expected exactly one probe: note (complex tensors), got %r" % notes)

        with open(os.path.join(work, "exp", "index.json")) as f:
            index = json.load(f)
        expected = {e["path"]: e for e in index}
        if len(expected) != len(index):
            failures.append("the pipeline expects a path twice (test bug)")

        with h5py.File(h5path, "r") as h5:
            found = numeric_datasets(h5)
            missing = sorted(set(expected) - set(found))
            extra = sorted(set(found) - set(expected))
            if missing:
                failures.append("missing datasets: %s" % missing)
            if extra:
                failures.append("unexpected datasets: %s" % extra)
            checked = 0
            for path, e in expected.items():
                if path not in found:
                    continue
                ds = found[path]
                want = np.load(os.path.join(work, "exp", e["file"]))
                got = ds[()]
                got = np.asarray(got)
                same, why = bits_equal(want, got)
                if not same:
                    failures.append("%s: %s" % (path, why))
                checks = {
                    "probe.call": e["call"],
                    "probe.step": e["step"],
                    "probe.cfg_branch": e["cfg_branch"],
                    "probe.dtype": e["dtype"],
                }
                for key, value in checks.items():
                    a = attr(ds, key)
                    if a is None and key in ("probe.step", "probe.cfg_branch"):
                        a = -1  # the writer omits unknown values (capture.h: -1 if absent)
                    if a != value:
                        failures.append("%s: %s = %r, expected %r" % (path, key, a, value))
                ts = attr(ds, "probe.timestep")
                if e["timestep"] is None:
                    if ts is not None and not (isinstance(ts, float) and math.isnan(ts)):
                        failures.append("%s: probe.timestep = %r, expected NaN/absent" % (path, ts))
                elif ts != e["timestep"]:
                    failures.append("%s: probe.timestep = %r, expected %r" % (path, ts, e["timestep"]))
                checked += 1

    if failures:
        for f in failures:
            print("FAIL: " + f, file=sys.stderr)
        return 1
    print("test_adapter_capture: %d datasets bit-identical with expected attributes" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
