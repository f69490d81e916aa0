#!/usr/bin/env python3
"""gpu_metrics_torch.py - probe_cuda_metrics against what a PyTorch user would write.

    python3 bench/gpu_metrics_torch.py LIBDIR [N]

Two bfloat16 tensors of N elements (default 2^28) on the GPU: r ~ N(0,1) in
bf16, c = bf16(r * (1 + 2^-9 u)). Times, in the same process with CUDA events
(3 warm-ups, median of 10):
  - torch baseline, as a user would write it:
      (c - r).norm() / r.norm()
      torch.nn.functional.cosine_similarity(r.flatten(), c.flatten(), dim=0)
      (c - r).abs().max()
  - probe_cuda_metrics (LIBDIR/libprobe_cuda.so through ctypes, on the same
    device pointers and torch's current stream): all metrics incl. exact p99
  - exact p99 the torch way: torch.sort of |c - r| (in float64, as probe's
    definition), element ceil(0.99 n) - 1; torch.quantile is tried and its
    refusal printed.
Prints the ratio torch / probe and checks probe's p99 bit for bit against the
sorted value, and its rel_l2/cosine against a float64 torch evaluation.
"""
import ctypes
import math
import os
import sys

import torch


class Metrics(ctypes.Structure):
    _fields_ = [("n", ctypes.c_uint64), ("n_finite", ctypes.c_uint64),
                ("rel_l2", ctypes.c_double), ("cosine", ctypes.c_double),
                ("max_abs", ctypes.c_double), ("max_abs_offset", ctypes.c_uint64),
                ("p99_abs", ctypes.c_double), ("mean_abs", ctypes.c_double),
                ("mismatch_count", ctypes.c_uint64), ("mismatch_fraction", ctypes.c_double),
                ("nan_ref", ctypes.c_uint64), ("nan_cand", ctypes.c_uint64),
                ("inf_ref", ctypes.c_uint64), ("inf_cand", ctypes.c_uint64),
                ("zero_norm_reference", ctypes.c_int), ("identical", ctypes.c_int),
                ("norm_ref", ctypes.c_double), ("norm_cand", ctypes.c_double),
                ("norm_diff", ctypes.c_double), ("dot", ctypes.c_double),
                ("inf_mismatch", ctypes.c_uint64),
                ("gain", ctypes.c_double), ("gain_se", ctypes.c_double),
                ("gain_z", ctypes.c_double), ("nan_ref_only", ctypes.c_uint64),
                ("mismatch_ulps_max", ctypes.c_double), ("max_abs_ulps_scale", ctypes.c_double)]


class Opts(ctypes.Structure):
    _fields_ = [("atol", ctypes.c_double), ("rtol", ctypes.c_double)]


BF16 = 11
WARM, REPS = 3, 10


def timed(fn):
    ts = []
    for i in range(WARM + REPS):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        out = fn()
        b.record()
        b.synchronize()
        if i >= WARM:
            ts.append(a.elapsed_time(b))
    ts.sort()
    return (ts[REPS // 2 - 1] + ts[REPS // 2]) / 2, ts[0], ts[-1], out


def main():
    libdir = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 28
    lib = ctypes.CDLL(os.path.join(libdir, "libprobe_cuda.so"))
    lib.probe_cuda_metrics.restype = ctypes.c_int
    lib.probe_cuda_metrics.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_uint64, ctypes.POINTER(Opts), ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.POINTER(Metrics), ctypes.c_void_p]
    core = ctypes.CDLL(os.path.join(libdir, "libprobe.so"))
    core.probe_last_error.restype = ctypes.c_char_p

    torch.manual_seed(0)
    dev = torch.device("cuda")
    x = torch.randn(n, device=dev, dtype=torch.float32)
    u = torch.rand(n, device=dev, dtype=torch.float32) * 2 - 1
    r = x.to(torch.bfloat16)
    c = (x * (1 + u * 2.0 ** -9)).to(torch.bfloat16)
    del x, u
    gb = 2 * 2 * n / 1e9
    print(f"gpu_metrics_torch: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"n = {n} bfloat16 per side ({gb:.3f} GB read for both)")

    def torch_user():
        rel = (c - r).norm() / r.norm()
        cos = torch.nn.functional.cosine_similarity(r.flatten(), c.flatten(), dim=0)
        mx = (c - r).abs().max()
        return rel, cos, mx

    t_torch, lo, hi, (rel_t, cos_t, max_t) = timed(torch_user)
    print(f"torch rel_l2 + cosine + max_abs       median {t_torch:8.3f} ms (min {lo:.3f}, max {hi:.3f})"
          f"  {gb / (t_torch * 1e-3):7.1f} GB/s of input")

    m = Metrics()
    opts = Opts(1e-3, 1e-3)
    stream = torch.cuda.current_stream().cuda_stream

    def probe():
        s = lib.probe_cuda_metrics(BF16, r.data_ptr(), BF16, c.data_ptr(), n, ctypes.byref(opts),
                                   None, ctypes.c_void_p(stream), ctypes.byref(m), None)
        if s != 0:
            raise RuntimeError(core.probe_last_error().decode())
        return s

    t_probe, lo, hi, _ = timed(probe)
    print(f"probe_cuda_metrics (all, exact p99)   median {t_probe:8.3f} ms (min {lo:.3f}, max {hi:.3f})"
          f"  {gb / (t_probe * 1e-3):7.1f} GB/s of input")
    print(f"ratio torch 3-metric time / probe all-metric time: {t_torch / t_probe:.2f}")

    def torch_sort():
        d = (c.double() - r.double()).abs()
        v, _ = torch.sort(d)
        return v

    t_sort, lo, hi, v = timed(torch_sort)
    k = math.ceil(99 * n / 100)
    p99_sort = v[k - 1].item()
    print(f"torch.sort |c-r| (float64) for p99    median {t_sort:8.3f} ms (min {lo:.3f}, max {hi:.3f})")
    del v
    try:
        q = torch.quantile((c.float() - r.float()).abs(), 0.99, interpolation="higher")
        print(f"torch.quantile: {q.item()!r}")
    except Exception as e:  # noqa: BLE001 - we print what torch says
        print(f"torch.quantile refuses: {type(e).__name__}: {str(e).splitlines()[0]}")

    # agreement
    rd, cd = r.double(), c.double()
    rel64 = ((cd - rd).norm() / rd.norm()).item()
    cos64 = (torch.dot(rd, cd) / (rd.norm() * cd.norm())).item()
    print(f"probe: rel_l2 {m.rel_l2:.17g} cosine {m.cosine:.17g} max_abs {m.max_abs:.9g} "
          f"p99 {m.p99_abs:.17g} mismatch {m.mismatch_count}")
    print(f"torch: rel_l2 {rel_t.item():.9g} (bf16 arithmetic) / {rel64:.17g} (float64); cosine "
          f"{cos_t.item():.9g} / {cos64:.17g}; max_abs {max_t.item():.9g}; sorted p99 {p99_sort:.17g}")
    ok = (m.p99_abs == p99_sort and abs(m.rel_l2 - rel64) <= 1e-9 * rel64
          and abs(m.cosine - cos64) <= 1e-9 and m.max_abs == (cd - rd).abs().max().item())
    print(("PASS" if ok else "FAIL") + " probe p99 == sorted float64 |c-r|[ceil(0.99n)-1] bit for bit; "
          "rel_l2/cosine within 1e-9 of torch float64; max_abs equal")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
