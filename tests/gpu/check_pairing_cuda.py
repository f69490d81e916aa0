#!/usr/bin/env python3
"""check_pairing_cuda.py - probe.pair's device path (probe._cuda,
libprobe_cuda.so's probe_cuda_metrics on torch CUDA tensors) against its host
path (libprobe's CPU engine on copies of the same tensors), on a GPU.

    PROBE_BUILD_DIR=build-gpu python3 tests/gpu/check_pairing_cuda.py

Per case, probe.pairing._compare_slot on the CUDA tensors must report
computed_on "device" and, against the same call on .cpu() copies (computed
on the host):
  - bit-equal: n, n_finite, max_abs, max_abs_index, p99_abs, mismatch_count,
    mismatch_fraction, the NaN/Inf counts, identical, the values at the
    max-abs index, the verdict, the channel count;
  - within docs/device.md's stated tolerance: rel_l2 relative 2e-12, cosine
    absolute 2e-12, mean_abs relative 1e-12, channel shift relative 1e-10 (of
    the channel's shift; the channel itself equal unless two channels are
    within 1e-9 of each other);
  - no host copy: probe._view (the host path's entry) is made to raise
    while the device path runs;
  - torch's allocator peak does not grow for contiguous inputs (the library
    uses its own bounded pool).
Cases: bfloat16/bfloat16, float32/bfloat16, float16/float32,
float32/float32 and float64/float32 at n = 1, 7, 100003 and 2^22 + 5; a
transposed (non-contiguous) candidate; a channel axis; NaN and Inf at known
places; identical tensors; tensors written on a side stream that is the
current stream during the call, right after a long kernel (stream order);
tensors on cuda:1 while cuda:0 is current (when there are two GPUs).
Then probe.pair end to end on a CUDA module (computed_on "device", the same
statistics as the host path on its outputs).
One PASS/FAIL line each; exit 0 when all pass, 1 when one fails, 2 when it
cannot run (no CUDA, no libprobe_cuda.so).
"""
import math
import os
import sys

BUILD = os.path.abspath(os.environ.get("PROBE_BUILD_DIR", "build-gpu"))
sys.path.insert(0, os.path.join(BUILD, "share", "probe", "python"))

import torch  # noqa: E402

import probe  # noqa: E402
from probe import _cuda, _lib, pairing  # noqa: E402

fails = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what)
    if not cond:
        fails.append(what)
    return cond


EXACT = ("n", "n_finite", "max_abs", "max_abs_index", "p99_abs", "mismatch_count",
         "mismatch_fraction", "nan_ref", "nan_cand", "inf_ref", "inf_cand", "inf_mismatch",
         "identical", "zero_norm_reference", "reference_at_max_abs", "candidate_at_max_abs",
         "verdict", "channels")


def rel(a, b):
    if a == b:
        return 0.0
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def compare_paths(name, r, c, gate="T1", axis=None, sync=True):
    lib = _lib.get()
    orig_view = probe._view

    def no_host(*a, **k):
        raise AssertionError("host path used for CUDA tensors")

    if sync:
        torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(r.device)
    base = torch.cuda.max_memory_allocated(r.device)
    probe._view = no_host
    try:
        d = pairing._compare_slot(lib, "out", r, c, gate, None, None, None, "check", "/check/0000/out", axis)
    except AssertionError as e:
        check(False, "%s: %s" % (name, e))
        return
    finally:
        probe._view = orig_view
    peak = torch.cuda.max_memory_allocated(r.device) - base
    h = pairing._compare_slot(lib, "out", r.cpu(), c.cpu(), gate, None, None, None, "check",
                              "/check/0000/out", axis)
    ok = d["computed_on"] == "device" and h["computed_on"] == "host"
    bad = [k for k in EXACT if d.get(k) != h.get(k)
           and not (isinstance(d.get(k), float) and math.isnan(d[k]) and math.isnan(h[k]))]
    tol = {"rel_l2": rel(d["rel_l2"], h["rel_l2"]) <= 2e-12,
           "cosine": abs(d["cosine"] - h["cosine"]) <= 2e-12 or (math.isnan(d["cosine"]) and math.isnan(h["cosine"])),
           "mean_abs": rel(d["mean_abs"], h["mean_abs"]) <= 1e-12}
    if axis is not None and "channels" in h:
        tol["channel_shift_max"] = rel(d["channel_shift_max"], h["channel_shift_max"]) <= 1e-10
        if d["channel_shift_channel"] != h["channel_shift_channel"]:
            bad.append("channel_shift_channel")
    contiguous = r.is_contiguous() and c.is_contiguous()
    mem_ok = (peak == 0) if contiguous else True
    check(ok and not bad and all(tol.values()) and mem_ok,
          "%s: device == host (exact: %s; tolerance: %s; computed on %s/%s; torch peak +%d bytes%s)"
          % (name, "ok" if not bad else "differ in %s: %s vs %s" % (bad, [d.get(k) for k in bad],
                                                                     [h.get(k) for k in bad]),
             "ok" if all(tol.values()) else {k: v for k, v in tol.items() if not v},
             d["computed_on"], h["computed_on"], peak, "" if contiguous else ", non-contiguous"))


def main():
    if not torch.cuda.is_available():
        print("check_pairing_cuda: torch has no CUDA device")
        return 2
    try:
        _cuda.get()
    except OSError as e:
        print("check_pairing_cuda: %s" % e)
        return 2
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(0)
    pairs = [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
             (torch.float16, torch.float32), (torch.float32, torch.float32),
             (torch.float64, torch.float32)]
    for n in (1, 7, 100003, (1 << 22) + 5):
        for rt, ct in pairs:
            x = torch.randn(n, device=dev, generator=g, dtype=torch.float64)
            u = torch.rand(n, device=dev, generator=g, dtype=torch.float64) * 2 - 1
            r = x.to(rt)
            c = (x * (1 + 1e-3 * u)).to(ct)
            compare_paths("n=%d %s/%s" % (n, str(rt)[6:], str(ct)[6:]), r, c)
    x = torch.randn(64, 96, 40, device=dev, generator=g)
    y = x + 1e-3 * torch.randn(64, 96, 40, device=dev, generator=g) + 2e-4 * torch.arange(40, device=dev)
    compare_paths("channel axis -1 (40 channels, a planted per-channel shift)", x, y, axis=-1)
    compare_paths("channel axis 1 (96 channels)", x, y, axis=1)
    compare_paths("transposed candidate", x.transpose(0, 1).contiguous(), y.transpose(0, 1))
    compare_paths("identical", x, x.clone())
    z = y.clone().view(-1)
    z[5] = float("nan")
    z[77] = float("inf")
    compare_paths("NaN and Inf in the candidate", x, z.view_as(x))
    xb = x.to(torch.bfloat16)
    compare_paths("bfloat16, channel axis -1", xb, (y * 1.001).to(torch.bfloat16), gate="T1-relaxed:backend-swap", axis=-1)

    # stream order: the tensors are written on a side stream right before the call
    s = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(s):
        big = torch.randn(4096, 4096, device=dev)
        for _ in range(20):
            big = big @ big / 64.0
        r = torch.randn(1 << 20, device=dev) + big.flatten()[:1 << 20] * 0
        c = r * (1 + 2e-3)
        compare_paths("tensors written on the current side stream just before the call", r, c,
                      sync=False)

    if torch.cuda.device_count() > 1:
        d1 = torch.device("cuda:1")
        r = torch.randn(300001, device=d1)
        compare_paths("tensors on cuda:1 while cuda:0 is current", r, r * (1 + 1e-3))
        check(torch.cuda.current_device() == 0, "the current device is still cuda:0")

    # probe.pair end to end
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
    xin = torch.randn(32, 256, device=dev)
    flag = {"on": False}

    class Scaled(torch.nn.Module):
        def forward(self, x):
            y = lin(x)
            return {"y": y * (1 + 1e-4) if flag["on"] else y, "skip": x}

    class On:
        def __enter__(self):
            flag["on"] = True

        def __exit__(self, *a):
            flag["on"] = False

    res = probe.pair(Scaled(), (xin,), component="toy", feature=probe.feature("scale", on=On),
                     gate="T1", channel_axis=-1, require_active=False)
    with torch.no_grad():
        ref = lin(xin)
        cand = ref * (1 + 1e-4)
    h = probe.compare(ref.cpu(), cand.cpu(), gate="T1")
    s = res["out.y"]
    check(s["computed_on"] == "device" and s["device"] == "cuda:0" and res.arch.startswith("sm_"),
          "pair on a CUDA module: computed on the device (%s, %s, %s)" % (s["computed_on"], s["device"], res.arch))
    check(s["max_abs"] == h["max_abs"] and s["p99_abs"] == h["p99_abs"] and rel(s["rel_l2"], h["rel_l2"]) <= 2e-12,
          "pair's device statistics == probe.compare on host copies (max_abs %r/%r, p99 %r/%r, rel_l2 %r/%r)"
          % (s["max_abs"], h["max_abs"], s["p99_abs"], h["p99_abs"], s["rel_l2"], h["rel_l2"]))
    check(res["out.skip"]["identical"], "the pass-through slot is identical on the device")

    print("check_pairing_cuda: %s (%d failed)" % ("PASS" if not fails else "FAIL", len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
