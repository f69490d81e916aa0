"""probe-compare and the runs' weight fingerprints (manifest key "weights",
docs/gemm.md "Weights"), on files written by h5py whose probe.manifest holds
hand-written fingerprints, and on a real pair of shim captures (the fake
cuBLAS of test_gemm_mock.py, loaded with different weights).

Checked:
- same combined hash -> exit 0, one line "weights: same in both runs (3 GEMM
  operands, 600 bytes)", JSON "weights": {"status": "same"};
- same shapes/dtypes, different hashes -> exit 2, one line naming the
  component and the first differing GEMM (k=1, its shape and dtype), nothing
  else on stdout; --allow-weight-diff -> compared (exit 0), "weights: DIFFER"
  line and JSON status "differ" with first_differing_gemm 1;
- different shapes or dtypes (quantized weights) -> informational line, JSON
  "format_differs", exit 0;
- one run without fingerprints -> "unknown", nothing refused; neither run ->
  no "weights" key and no line (the JSON is the library's);
- a malformed "weights" value counts as no fingerprints;
- shim captures: same weights -> "same", different -> exit 2;
- a lossy feature and its weights, one rule for probe-calibrate and probe-compare --gate T2:
  probe-calibrate refuses a feature pair whose weights differ (exit 2, one line, no file)
  unless --weights quantized, which it writes into the file ("weights": "quantized", what
  differs under evidence); probe-compare --gate T2 with that file compares the pair (exit 0,
  the "weights: DIFFER" line), with a calibration of a feature that keeps the weights refuses
  it; a bad --weights and a bad "weights" in the file are one-line errors, exit 2;
- weights quantized from the reference's (docs/gemm.md "Quantized from the same weights"), on
  manifests whose rounded fingerprints torch and libxxhash computed: a layerwise cast ->
  "quantized" float8_e4m3fn, an amax-scaled quantize-dequantize and float8 operands of the
  amax codes -> float8_e4m3fn/amax, each with one line; one weight of other values under the
  cast, and one dequantized at twice its scale -> "differ" naming GEMM k=1 as no rounding;
  float8 operands of other weights -> "format_differs" with one unproven GEMM; quantized
  weights under T1 refused, naming the rounding; probe-calibrate --weights quantized writes
  "weights_rounding" when every pair is proven in one rounding, and not for pairs in two;
  --gate T2 with it compares the proven pair and refuses, in one line, the wrong weight, the
  wrong scale, the other rounding and the unproven float8 operands; without a named rounding,
  or with a reference that has no rounded fingerprints, the earlier rule; a weight on which
  the float32 scale conventions disagree: float8 operands scaled the torchao way (x * 448 /
  amax) and a dequantization with the scale amax * fl(1/448) are proven through the
  reference's amax_variants, and without them the float8 operands are unproven; a bad
  "weights_rounding", and one without "weights": "quantized", are one-line errors.
"""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import need_torch_float8, check, finish, need_build, preload_env, program, run  # noqa: E402

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")


def ops(hashes, shapes=((10, 10), (20, 5), (5, 20)), dtype="bfloat16"):
    return [{"k": k, "shape": list(s), "dtype": dtype, "xxh64": h} for k, (s, h) in enumerate(zip(shapes, hashes))]


def weights(hashes, combined, **kw):
    o = ops(hashes, **kw)
    esz = 2 if kw.get("dtype", "bfloat16") == "bfloat16" else 1
    return {"overflow": 0, "components": {"dit.step": {
        "gemms": len(o), "bytes": sum(int(np.prod(x["shape"])) * esz for x in o), "complete": True,
        "dtypes": [o[0]["dtype"]], "xxh64": combined, "operands": o}}}


def write(path, w, value=1.0):
    with h5py.File(path, "w") as f:
        m = {"probe_version": "test"}
        if w is not None:
            m["weights"] = w
        f.attrs["probe.manifest"] = json.dumps(m)
        # value plus a zero-mean alternating +-1e-6 (rounding-like, no systematic part)
        noise = np.where(np.arange(16).reshape(4, 4) % 2 == 0, 1e-6, -1e-6) * (value != 1.0)
        d = f.create_dataset("/dit.step/0000/out", data=(np.full((4, 4), 1.0) + noise).astype(np.float32))
        d.attrs["probe.dtype"] = "float32"


def compare(*args):
    p = subprocess.run([COMPARE, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


QSHAPES = ((64, 64), (128, 32), (32, 128))


def fingerprint(t):
    """An operand's manifest entry for bfloat16 tensor t, its rounded fingerprints
    computed by torch's casts and libxxhash (the oracle of include/probe/capture.h):
    levels (distinct patterns, null above 256), amax, and the XXH64 of the
    float8_e4m3fn codes, plain and with scale amax / 448."""
    import ctypes
    import torch
    xxh = ctypes.CDLL("libxxhash.so.0")
    xxh.XXH64.restype = ctypes.c_uint64
    xxh.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]

    def h(b):
        return "%016x" % xxh.XXH64(b, len(b), 0)
    def hc(codes):
        return h(codes.to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes())
    tf = t.float()
    amax = tf.abs().amax()
    n = torch.unique(t.view(torch.int16)).numel()
    s0 = amax / torch.tensor(448.0)
    variants = [hc(tf / s0), hc(tf / (amax * torch.tensor(1 / 448, dtype=torch.float32))),
                hc(tf * (torch.tensor(448.0) / amax)), hc(tf * (torch.reciprocal(amax) * 448.0)),
                hc(tf * (torch.tensor(1.0) / s0))]
    return {"xxh64": h(t.view(torch.uint8).numpy().tobytes()), "levels": n if n <= 256 else None,
            "amax": amax.item(), "rounded": {"float8_e4m3fn": hc(tf), "float8_e4m3fn/amax": variants[0]},
            "amax_variants": variants}


def qweights(tensors, combined, plain=False):
    """A "weights" key for bfloat16 (or float8_e4m3fn) tensors of QSHAPES; plain: no
    rounded fingerprints (PROBE_WEIGHTS=hash)."""
    import torch
    o = []
    for k, t in enumerate(tensors):
        if t.dtype == torch.float8_e4m3fn:
            import ctypes
            xxh = ctypes.CDLL("libxxhash.so.0")
            xxh.XXH64.restype = ctypes.c_uint64
            xxh.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
            b = t.view(torch.uint8).numpy().tobytes()
            e = {"xxh64": "%016x" % xxh.XXH64(b, len(b), 0)}
            dt = "float8_e4m3fn"
        else:
            e = fingerprint(t)
            dt = "bfloat16"
            if plain == "no-variants":
                del e["amax_variants"]
            elif plain:
                e = {"xxh64": e["xxh64"]}
        o.append(dict({"k": k, "shape": list(t.shape), "dtype": dt}, **e))
    return {"overflow": 0, "components": {"dit.step": {
        "gemms": len(o), "bytes": sum(t.numel() * t.element_size() for t in tensors), "complete": True,
        "dtypes": sorted({x["dtype"] for x in o}), "xxh64": combined, "operands": o}}}


def quantized_weights(d, calibrate, ref_a, ref_b):
    """Weights quantized from the reference's (docs/gemm.md "Quantized from the same weights")."""
    import torch
    gen = torch.Generator().manual_seed(3)
    W = [(torch.randn(*s, generator=gen) * 0.02).to(torch.bfloat16) for s in QSHAPES]

    def cast(w):  # layerwise casting: stored in float8, computed in bfloat16
        return w.to(torch.float8_e4m3fn).to(torch.bfloat16)

    def amax_q(w, gain=1.0):  # an FP8 GEMM's weight: amax scale, dequantized in bfloat16
        sc = w.float().abs().amax() / 448.0
        return ((w.float() / sc).to(torch.float8_e4m3fn).float() * sc * gain).to(torch.bfloat16)

    def codes(w):  # the float8 operand of a scaled GEMM
        return (w.float() / (w.float().abs().amax() / 448.0)).to(torch.float8_e4m3fn)

    other = [(w.float() * 1.01).to(torch.bfloat16) for w in W]
    files = {}
    for name, ts, plain in (("qref", W, False), ("qref2", W, False), ("qref_plain", W, True),
                            ("qcast", [cast(w) for w in W], False),
                            ("qcast2", [cast(w) for w in W], False),
                            ("qamax", [amax_q(w) for w in W], False),
                            ("qbug", [cast(W[0]), cast(other[1]), cast(W[2])], False),
                            ("qscale", [amax_q(W[0]), amax_q(W[1], 2.0), amax_q(W[2])], False),
                            ("qfp8", [codes(w) for w in W], False),
                            ("qfp8bug", [codes(W[0]), codes(other[1] * 3), codes(W[2])], False)):
        files[name] = os.path.join(d, name + ".h5")
        combined = "00000000000000aa" if name.startswith("qref") else "%016x" % (len(files) + 0x100)
        write(files[name], qweights(ts, combined, plain),
              value=1.0 if name.startswith("qref") else 1.00001)
    ref = files["qref"]

    def wline(out):
        return [l for l in out.splitlines() if l.startswith("weights")]

    # the verdicts
    for name, status, rounding, line in (
            ("qcast", "quantized", "float8_e4m3fn", "weights: quantized from the reference's: 3 GEMM operands in "
             "1 component are its weights rounded to float8_e4m3fn"),
            ("qamax", "quantized", "float8_e4m3fn/amax", "weights: quantized from the reference's: 3 GEMM operands "
             "in 1 component are its weights rounded to float8_e4m3fn/amax"),
            ("qfp8", "quantized", "float8_e4m3fn/amax", "weights: quantized from the reference's: 3 GEMM operands "
             "in 1 component are its weights rounded to float8_e4m3fn/amax"),
            ("qbug", "differ", None, "weights: DIFFER: component dit.step, first differing GEMM k=1 (weight "
             "[128, 32] bfloat16), not a float8_e4m3fn rounding of the reference's"),
            ("qscale", "differ", None, "weights: DIFFER: component dit.step, first differing GEMM k=1 (weight "
             "[128, 32] bfloat16), not a float8_e4m3fn rounding of the reference's"),
            ("qfp8bug", "format_differs", None, "weights: dit.step (and 0 other components) has GEMM weights of "
             "different shapes or dtypes in the two runs (e.g. quantized): not compared; 1 float8 GEMM operand "
             "proven no rounding of the reference's weight, the first component dit.step, float8 GEMM k=1 "
             "(weight [128, 32] float8_e4m3fn)")):
        js = os.path.join(d, name + ".json")
        rc, out, err = compare(ref, files[name], "--allow-weight-diff", "--json", js)
        w = json.load(open(js)).get("weights", {}) if rc != 2 else {}
        check(rc == 0 and w.get("status") == status and w.get("rounding") == rounding and wline(out) == [line],
              "%s: weights %s %s, one line (rc=%d, %s, %s)" % (name, status, rounding, rc, wline(out), err.strip()))
    w = json.load(open(os.path.join(d, "qfp8bug.json")))["weights"]["components"]["dit.step"]
    check(w.get("unproven_float8_gemms") == 1, "qfp8bug: 1 unproven float8 GEMM in the JSON (%s)" % w)
    w = json.load(open(os.path.join(d, "qcast.json")))["weights"]["components"]["dit.step"]
    check(w.get("quantized_gemms") == 3 and w.get("rounding") == "float8_e4m3fn",
          "qcast: the component's JSON names 3 quantized GEMMs and the rounding (%s)" % w)

    # quantized weights under a feature that keeps them: refused, saying what they are
    rc, out, err = compare(ref, files["qcast"])
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and "are its weights rounded to float8_e4m3fn" in el[0] and
          "--gate T2 and a calibration made with --weights quantized" in el[0] and out == "",
          "T1 of quantized weights: refused, one line naming the rounding and the way (%s)" % el)

    # probe-calibrate --weights quantized writes the proven rounding
    cal_cast = os.path.join(d, "cal-cast.json")
    ref_args = ["--reference", ref, "--reference", files["qref2"]]
    p = subprocess.run([os.path.join(BUILD, "bin", "probe-calibrate"), "--feature", "fp8-storage", *ref_args,
                        "--candidate", files["qcast"], "--candidate", files["qcast2"], "--weights", "quantized",
                        "--out", cal_cast], capture_output=True, text=True)
    cc = json.load(open(cal_cast)) if p.returncode == 0 else {}
    check(p.returncode == 0 and cc.get("weights") == "quantized" and cc.get("weights_rounding") == "float8_e4m3fn"
          and "weights_rounding: float8_e4m3fn" in p.stdout,
          "probe-calibrate: two proven pairs -> weights_rounding float8_e4m3fn (rc=%d, %s)"
          % (p.returncode, p.stderr.strip()))
    cal_any = os.path.join(d, "cal-any.json")
    p = subprocess.run([os.path.join(BUILD, "bin", "probe-calibrate"), "--feature", "fp8-mixed", *ref_args,
                        "--candidate", files["qcast"], "--candidate", files["qamax"], "--weights", "quantized",
                        "--out", cal_any], capture_output=True, text=True)
    ca = json.load(open(cal_any)) if p.returncode == 0 else {}
    check(p.returncode == 0 and "weights_rounding" not in ca and "weights_rounding: none" in p.stdout,
          "probe-calibrate: pairs in two roundings -> no weights_rounding (rc=%d, %s)" % (p.returncode, p.stderr))

    # probe-compare --gate T2 with it
    rc, out, err = compare(ref, files["qcast"], "--gate", "T2", "--calibration", cal_cast)
    check(rc != 2 and wline(out) == ["weights: quantized from the reference's: 3 GEMM operands in 1 component are "
                                     "its weights rounded to float8_e4m3fn"],
          "T2, weights_rounding float8_e4m3fn: the cast pair compared (rc=%d, %s)" % (rc, err.strip()))
    for name, why in (("qbug", "first differing GEMM k=1 (weight [128, 32] bfloat16), not a float8_e4m3fn "
                               "rounding of the reference's (the calibration's feature rounds the weights to "
                               "float8, and these are not the reference's weights so rounded"),
                      ("qscale", "first differing GEMM k=1"),
                      ("qamax", "rounded to float8_e4m3fn/amax (the calibration's feature rounds the weights "
                                "differently")):
        rc, out, err = compare(ref, files[name], "--gate", "T2", "--calibration", cal_cast)
        el = err.strip().splitlines()
        check(rc == 2 and len(el) == 1 and why in el[0] and
              'the calibration\'s "weights_rounding" is "float8_e4m3fn"' in el[0] and out == "",
              "T2, weights_rounding float8_e4m3fn: %s refused in one line (%s)" % (name, el))
    cal_amax = dict(cc, weights_rounding="float8_e4m3fn/amax")
    cal_amax_path = os.path.join(d, "cal-amax.json")
    json.dump(cal_amax, open(cal_amax_path, "w"))
    rc, out, err = compare(ref, files["qfp8"], "--gate", "T2", "--calibration", cal_amax_path)
    check(rc != 2, "T2, weights_rounding float8_e4m3fn/amax: float8 operands proven, compared (rc=%d)" % rc)
    rc, out, err = compare(ref, files["qfp8bug"], "--gate", "T2", "--calibration", cal_amax_path)
    check(rc == 2 and "not the reference's weights so rounded" in err and
          "the first component dit.step, float8 GEMM k=1 (weight [128, 32] float8_e4m3fn)" in err,
          "T2, weights_rounding float8_e4m3fn/amax: a float8 operand of other weights refused (%s)" % err.strip())
    # without a named rounding, or without the fingerprints to check it: the earlier rule
    rc, out, err = compare(ref, files["qbug"], "--gate", "T2", "--calibration", cal_any)
    check(rc != 2, "T2 without weights_rounding: any change of the weights compared (rc=%d)" % rc)
    rc, out, err = compare(files["qref_plain"], files["qbug"], "--gate", "T2", "--calibration", cal_cast)
    check(rc != 2 and any(l.startswith("weights: DIFFER: component dit.step, first differing GEMM k=0 (weight "
                                       "[64, 64] bfloat16)") and "not a float8" not in l for l in wline(out)),
          "a reference without rounded fingerprints: not proven either way, compared (rc=%d, %s)"
          % (rc, wline(out)))

    # scale conventions: a weight on which x / (amax / 448) and x * (448 / amax) disagree in
    # thousands of codes; float8 operands made the torchao way are proven by amax_variants
    gw = torch.Generator().manual_seed(1)
    wc = (torch.randn(1536, 1536, generator=gw) * 0.02).to(torch.bfloat16)
    wcf = wc.float()
    rcp = (wcf * (448.0 / wcf.abs().amax())).to(torch.float8_e4m3fn)  # torchao: reciprocal * 448
    s1 = wcf.abs().amax() * torch.tensor(1 / 448, dtype=torch.float32)
    deq1 = ((wcf / s1).to(torch.float8_e4m3fn).float() * s1).to(torch.bfloat16)
    for name, ts, plain in (("vref", [wc], False), ("vref_novar", [wc], "no-variants"),
                            ("vrcp", [rcp], False), ("vdeq1", [deq1], False)):
        files[name] = os.path.join(d, name + ".h5")
        write(files[name], qweights(ts, "%016x" % (0x200 + len(files)), plain),
              value=1.0 if name.startswith("vref") else 1.00001)
    for refname, name, status in (("vref", "vrcp", "quantized"), ("vref", "vdeq1", "quantized"),
                                  ("vref_novar", "vrcp", "format_differs")):
        js = os.path.join(d, "%s-%s.json" % (refname, name))
        rc, out, err = compare(files[refname], files[name], "--allow-weight-diff", "--json", js)
        w = json.load(open(js)).get("weights", {}) if rc != 2 else {}
        check(rc != 2 and w.get("status") == status and
              (status != "quantized" or w.get("rounding") == "float8_e4m3fn/amax"),
              "scale conventions: %s against %s: %s (rc=%d, %s)" % (name, refname, w.get("status"), rc,
                                                                    err.strip()))

    # bad weights_rounding in a calibration file
    for value, msg in (("float8_e5m2", '"weights_rounding" must be "float8_e4m3fn" or "float8_e4m3fn/amax"'),
                       (7, '"weights_rounding" must be "float8_e4m3fn" or "float8_e4m3fn/amax"')):
        bad = os.path.join(d, "cal-bad-rounding.json")
        json.dump(dict(cc, weights_rounding=value), open(bad, "w"))
        rc, out, err = compare(ref, files["qcast"], "--gate", "T2", "--calibration", bad)
        el = err.strip().splitlines()
        check(rc == 2 and len(el) == 1 and msg in el[0], "weights_rounding %r: one line, exit 2 (%s)" % (value, el))
    bad = os.path.join(d, "cal-bad-rounding2.json")
    json.dump(dict(cc, weights="same"), open(bad, "w"))
    rc, out, err = compare(ref, files["qcast"], "--gate", "T2", "--calibration", bad)
    check(rc == 2 and '"weights_rounding" needs "weights": "quantized"' in err,
          "weights_rounding with weights same: one line, exit 2 (%s)" % err.strip())


def main():
    need_torch_float8()
    need_build()
    d = tempfile.mkdtemp(prefix="probe-weights-")
    H = ["%016x" % (0x1111 * (i + 1)) for i in range(3)]
    ref = os.path.join(d, "ref.h5")
    write(ref, weights(H, "00000000000000aa"))

    # same
    same = os.path.join(d, "same.h5")
    write(same, weights(H, "00000000000000aa"), value=1.00001)
    js = os.path.join(d, "same.json")
    rc, out, err = compare(ref, same, "--json", js)
    check(rc == 0, "same weights: compared, exit 0 (rc=%d, %s)" % (rc, err.strip()))
    lines = [l for l in out.splitlines() if l.startswith("weights:")]
    check(lines == ["weights: same in both runs (3 GEMM operands, 600 bytes)"], "same: one line %s" % lines)
    res = json.load(open(js))
    check(res.get("weights", {}).get("status") == "same" and
          res["weights"]["components"]["dit.step"]["status"] == "same", "same: JSON weights.status 'same'")

    # differ
    diff = os.path.join(d, "diff.h5")
    write(diff, weights([H[0], "00000000deadbeef", H[2]], "00000000000000bb"), value=1.00001)
    rc, out, err = compare(ref, diff)
    el = err.strip().splitlines()
    check(rc == 2, "different weights: exit 2 (rc=%d)" % rc)
    check(len(el) == 1 and el[0].startswith("probe-compare: the runs loaded different weights: component "
                                            "dit.step, first differing GEMM k=1 (weight [20, 5] bfloat16)"),
          "different weights: one line naming component and GEMM: %s" % el)
    check(out == "", "different weights: nothing compared (stdout empty)")
    js = os.path.join(d, "diff.json")
    rc, out, err = compare(ref, diff, "--allow-weight-diff", "--json", js)
    check(rc == 0, "--allow-weight-diff: compared (rc=%d)" % rc)
    check(any(l.startswith("weights: DIFFER: component dit.step, first differing GEMM k=1") for l in out.splitlines()),
          "--allow-weight-diff: a 'weights: DIFFER' line")
    res = json.load(open(js))
    w = res.get("weights", {})
    check(w.get("status") == "differ" and w["components"]["dit.step"]["first_differing_gemm"] == 1 and
          w["components"]["dit.step"]["candidate_xxh64"] == "00000000000000bb",
          "--allow-weight-diff: JSON status differ, first_differing_gemm 1")

    # format differs (quantized)
    quant = os.path.join(d, "quant.h5")
    write(quant, weights(H, "00000000000000cc", dtype="float8_e4m3fn"), value=1.00001)
    js = os.path.join(d, "quant.json")
    rc, out, err = compare(ref, quant, "--json", js)
    check(rc == 0, "quantized weights: not refused (rc=%d %s)" % (rc, err.strip()))
    check(any(l.startswith("weights: dit.step (and 0 other components) has GEMM weights of different shapes or dtypes")
              for l in out.splitlines()), "quantized: informational line")
    check(json.load(open(js))["weights"]["status"] == "format_differs", "quantized: JSON format_differs")

    # unknown / absent / malformed
    none = os.path.join(d, "none.h5")
    write(none, None, value=1.00001)
    js = os.path.join(d, "unk.json")
    rc, out, err = compare(ref, none, "--json", js)
    check(rc == 0 and "weights: unknown (the candidate run has no weight fingerprints)" in out,
          "one run without fingerprints: unknown, not refused")
    check(json.load(open(js))["weights"]["status"] == "unknown", "unknown: JSON status")
    none2 = os.path.join(d, "none2.h5")
    write(none2, None)
    js = os.path.join(d, "none.json")
    rc, out, err = compare(none2, none, "--json", js)
    check(rc == 0 and not any(l.startswith("weights") for l in out.splitlines()) and "weights" not in json.load(open(js)),
          "neither run has fingerprints: no line, no JSON key")
    bad = os.path.join(d, "bad.h5")
    write(bad, {"components": {"dit.step": {"operands": "x", "xxh64": 5}}}, value=1.00001)
    rc, out, err = compare(ref, bad)
    check(rc == 0 and "weights: unknown" in out, "malformed weights: unknown, not refused (rc=%d)" % rc)

    # a lossy feature that changes the weights: one rule in probe-calibrate and probe-compare
    CAL = os.path.join(BUILD, "bin", "probe-calibrate")
    ref2 = os.path.join(d, "ref2.h5")
    write(ref2, weights(H, "00000000000000aa"))

    def calibrate(out, cand, *extra):
        p = subprocess.run([CAL, "--feature", "fp8", "--reference", ref, "--reference", ref2,
                            "--candidate", cand, "--out", out, *extra], capture_output=True, text=True)
        return p.returncode, p.stdout, p.stderr

    cal_refused = os.path.join(d, "cal-refused.json")
    rc, out, err = calibrate(cal_refused, diff)
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and "loaded different weights: component dit.step, first differing GEMM k=1"
          in el[0] and "--weights quantized" in el[0],
          "probe-calibrate refuses a pair whose weights differ, as probe-compare does (rc=%d, %s)" % (rc, el))
    check(not os.path.exists(cal_refused), "refused: no calibration file")
    cal_q = os.path.join(d, "cal-quantized.json")
    rc, out, err = calibrate(cal_q, diff, "--weights", "quantized")
    check(rc == 0, "--weights quantized: calibrated (rc=%d, %s)" % (rc, err.strip()))
    cq = json.load(open(cal_q))
    check(cq.get("weights") == "quantized", "the file says weights: quantized (%s)" % cq.get("weights"))
    check(cq.get("evidence", {}).get("weights", "").startswith("the runs loaded different weights: component dit.step"),
          "the evidence says which weights differ: %s" % cq.get("evidence", {}).get("weights"))
    check("weights: quantized (--weights quantized): the runs loaded different weights" in out,
          "probe-calibrate's summary says so")
    rc, out, err = compare(ref, diff, "--gate", "T2", "--calibration", cal_q)
    check(rc == 0 and "weights: DIFFER: component dit.step" in out,
          "T2 with the quantized calibration compares the pair and reports the weights (rc=%d, %s)"
          % (rc, err.strip()))
    cal_s = os.path.join(d, "cal-same.json")
    rc, out, err = calibrate(cal_s, same)
    check(rc == 0 and json.load(open(cal_s)).get("weights") == "same",
          "a feature that keeps the weights: the file says weights: same (rc=%d)" % rc)
    rc, out, err = compare(ref, diff, "--gate", "T2", "--calibration", cal_s)
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and "loaded different weights" in el[0] and out == "",
          "T2 with a same-weights calibration refuses the pair (rc=%d, %s)" % (rc, el))
    rc, out, err = calibrate(os.path.join(d, "cal-bad.json"), diff, "--weights", "fp8")
    check(rc == 2 and err.strip() == "probe-calibrate: --weights fp8: must be same or quantized",
          "bad --weights: one line, exit 2 (%s)" % err.strip())
    cq["weights"] = "maybe"
    bad_cal = os.path.join(d, "cal-bad-weights.json")
    json.dump(cq, open(bad_cal, "w"))
    rc, out, err = compare(ref, diff, "--gate", "T2", "--calibration", bad_cal)
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and '"weights" must be "same" or "quantized"' in el[0],
          "a calibration with a bad weights value: one line, exit 2 (%s)" % el)

    quantized_weights(d, calibrate, ref, ref2)

    # real shim captures through the fake cuBLAS
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_gemm_mock import build
    libs = build(d)
    args = [program("shim_gemm"), libs["libcudart.so.13"], libs["libcublasLt.so.13"], libs["libcublas.so.13"], d,
            "scope"]
    outs = []
    for name, seed in (("r0.h5", "0"), ("r1.h5", "0"), ("r2.h5", "1")):
        o = os.path.join(d, name)
        r = run(args, preload_env(o, leaks=False, PROBE_CAPTURE="*gemm*@step=2", SHIM_GEMM_SEED=seed))
        check(r.returncode == 0, "shim run %s (seed %s)" % (name, seed))
        outs.append(o)
    rc, out, err = compare(outs[0], outs[1], "--expect-identical")
    print(out, err)
    check(rc == 0 and "weights: same in both runs (2 GEMM operands, 108 bytes)" in out,
          "shim runs with the same weights: same (rc=%d)" % rc)
    rc, out, err = compare(outs[0], outs[2])
    check(rc == 2 and "the runs loaded different weights: component dit.step, first differing GEMM k=0" in err,
          "shim runs with different weights: refused (rc=%d, %s)" % (rc, err.strip()))
    finish()


if __name__ == "__main__":
    main()
