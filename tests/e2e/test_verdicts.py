"""probe-compare's verdicts beyond the gate (docs/gates.md "Verdicts"), on captures
written with h5py that mimic a two-step CFG pipeline with nested DiT blocks:

- the systematic statistics in the JSON (gain, its HC0 standard error and z; the
  channel with the largest z, its shift and size) equal numpy's on the same data;
  the systematic test fails a planted channel bias that rel_l2/cosine pass, and
  passes independent noise of the same size;
- attribution: noise on the DiT outputs amplified by the CFG combination is
  "introduced between dit.step/0001 and scheduler.step/0000" with the
  amplification numpy gives, never the scheduler's failure; a bias planted in
  block 1 of the first DiT call is introduced by /dit.block/0001, its dit.step is
  "inside" via that block, later calls inherit it;
- the oracle: per tensor rel_l2 of each side against the oracle, their ratio and
  the gain/channel excesses equal numpy's; a candidate as accurate as the
  reference passes although T1 fails, one twice as far fails "less accurate";
- probe-matrix marks a cell whose failures are all inherited "inherited";
- T2 with a calibration that lacks the text encoder: an identical text-encoder
  output fails the run (no thresholds) but attribution names no call; a
  differing one is named, and the line and JSON ("no_thresholds") say why; the
  header and the JSON ("calibration") name the calibration file; a reference
  labelled "on" against a candidate labelled "off" gets one note;
- bad input: --oracle missing / the reference itself / a bad headroom: exit 2,
  one line; an oracle identical to the reference fails the run (exit 1).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import check, finish, need_build  # noqa: E402

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
MATRIX = os.path.join(BUILD, "bin", "probe-matrix")
G = 5.0  # CFG guidance scale
C, F, H, W = 4, 3, 16, 16  # latent channels, frames, height, width
T, D = 48, 32  # tokens and width of a block's [1, T, D] activations


class Capture:
    """Tensors in execution order with the attributes probe's writer gives them."""

    def __init__(self):
        self.items = []

    def add(self, comp, call, slot, x, step=-1, branch=-1):
        self.items.append((comp, call, slot, np.asarray(x), step, branch))

    def write(self, path):
        with h5py.File(path, "w") as f:
            f.attrs["probe.manifest"] = json.dumps({"probe_version": "test"})
            for seq, (comp, call, slot, x, step, branch) in enumerate(self.items):
                d = f.create_dataset("/%s/%04d/%s" % (comp, call, slot), data=x)
                d.attrs["probe.component"] = comp
                d.attrs["probe.slot"] = slot
                d.attrs["probe.call"] = np.int64(call)
                d.attrs["probe.seq"] = np.uint64(seq)
                if step >= 0:
                    d.attrs["probe.step"] = np.int64(step)
                if branch >= 0:
                    d.attrs["probe.cfg_branch"] = np.int32(branch)


def pipeline(noise=0.0, bias=0.0, seed=0, base_seed=1):
    """Two steps of a CFG loop: per step two dit.step calls (branches), each with two
    dit.block calls inside, then the scheduler. `noise` adds independent noise (relative
    to each output's rms) to every block and dit output; `bias` shifts channel 0 of
    block 1's output in the first dit.step call by bias x the noise's sd there."""
    base = np.random.default_rng(base_seed)
    lat = base.standard_normal((1, C, F, H, W))
    cond = base.standard_normal((1, C, F, H, W))
    rng = np.random.default_rng(seed)
    cap = Capture()
    calls = {"dit.step": 0, "dit.block": 0, "scheduler.step": 0}

    def noisy(x):
        return x + noise * np.sqrt(np.mean(x * x)) * rng.standard_normal(x.shape)

    for step in range(2):
        outs = []
        for branch in range(2):
            k = calls["dit.step"]
            calls["dit.step"] += 1
            cap.add("dit.step", k, "in.hidden_states", lat.astype(np.float32), step, branch)
            h = np.tanh(lat.reshape(T, -1)[:, :D] + (branch + 1) * 0.3).reshape(1, T, D)
            for b in range(2):
                j = calls["dit.block"]
                calls["dit.block"] += 1
                cap.add("dit.block", j, "in.hidden_states", h.astype(np.float32), step, branch)
                h = noisy(np.tanh(h * 1.1 + 0.05 * (b + 1)))
                if bias and k == 0 and b == 1:
                    h = h.copy()
                    h[..., 0] += bias * noise * np.sqrt(np.mean(h * h))
                cap.add("dit.block", j, "out", h.astype(np.float32), step, branch)
            # the last block's per-channel token means reach the output's channels
            out = noisy(cond * (1.0 + 0.2 * branch) + 0.5 * lat +
                        0.5 * h[0].mean(0)[:C].reshape(1, C, 1, 1, 1))
            cap.add("dit.step", k, "out.sample", out.astype(np.float32), step, branch)
            outs.append(out.astype(np.float32).astype(np.float64))
        mo = outs[0] + G * (outs[1] - outs[0])  # pipeline code between the calls
        s = calls["scheduler.step"]
        calls["scheduler.step"] += 1
        cap.add("scheduler.step", s, "in.model_output", mo.astype(np.float32), step)
        cap.add("scheduler.step", s, "in.sample", lat.astype(np.float32), step)
        lat = lat - 0.25 * mo
        cap.add("scheduler.step", s, "out.prev_sample", lat.astype(np.float32), step)
    return cap


def compare(*args):
    p = subprocess.run([COMPARE, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def load(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][()].astype(np.float64) for k in _paths(f)}


def _paths(f):
    out = []
    f.visititems(lambda n, o: out.append("/" + n) if isinstance(o, h5py.Dataset) else None)
    return out


def gain_np(r, c):
    r, d = r.ravel(), (c - r).ravel()
    rr = r @ r
    a = (d @ r) / rr
    se = math.sqrt(np.sum(r * r * (d - a * r) ** 2)) / rr
    return a, se


def channels_np(r, c, axis):
    d = np.moveaxis(c - r, axis, 0).reshape(r.shape[axis], -1)
    n = d.shape[1]
    m = d.mean(1)
    se = d.std(1, ddof=1) / math.sqrt(n)
    return m, se, n


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-300)


def main():
    need_build()
    d = tempfile.mkdtemp(prefix="probe-verdicts-")
    P = lambda n: os.path.join(d, n)  # noqa: E731
    pipeline().write(P("ref.h5"))
    pipeline(noise=2e-3, seed=5).write(P("noise.h5"))
    pipeline(noise=2e-3, seed=5, bias=3.0).write(P("bias.h5"))
    ref, noise = load(P("ref.h5")), load(P("noise.h5"))

    # --- systematic statistics against numpy ---
    rc, out, err = compare(P("ref.h5"), P("noise.h5"), "--gate", "T1-relaxed:backend-swap",
                           "--json", P("noise.json"))
    res = json.load(open(P("noise.json")))
    byp = {t["path"]: t for t in res["tensors"]}
    ok_gain = ok_chan = True
    for path, t in byp.items():
        r, c = ref[path], noise[path]
        if t["rel_l2"] is None or t["systematic"] is None:
            continue
        y = t["systematic"]
        a, se = gain_np(r, c)
        ok_gain &= close(y["gain"], a, 1e-8) and close(y["gain_se"], se, 1e-8)
        axis = 1 if r.ndim >= 4 else r.ndim - 1
        if r.ndim >= 2 and y["channels"]:
            m, sek, n = channels_np(r, c, axis)
            z = np.where(sek > 0, m / sek, 0.0)
            k = y["channel"]
            ok_chan &= close(y["channel_shift"], m[k], 1e-8) and close(y["channel_z"], z[k], 1e-7)
            ok_chan &= abs(z[k]) >= np.max(np.abs(z)) - 1e-9  # no channel above the floor is ignored here
            ok_chan &= close(y["channel_size"], math.sqrt(n) * abs(m[k]) / np.linalg.norm(r), 1e-8)
    check(ok_gain, "gain and its HC0 standard error equal numpy's on every tensor")
    check(ok_chan, "the reported channel's shift, z and size equal numpy's on every tensor")
    check(res["headline"] == "gate+systematic", "headline rule without an oracle: gate+systematic")

    # --- attribution: the CFG combination amplifies the DiT outputs' noise ---
    intro = res["introduced"]
    mo = "/scheduler.step/0000/in.model_output"
    # every output that ran before the scheduler's first call
    outs = ["/dit.step/0000/out.sample", "/dit.step/0001/out.sample"] + \
           ["/dit.block/%04d/out" % j for j in range(4)]

    def rel(p):
        return np.linalg.norm(noise[p] - ref[p]) / np.linalg.norm(ref[p])
    since = [p for p in outs if p in byp]
    amp = rel(mo) / max(rel(p) for p in since)
    check(rc == 1 and byp[mo]["verdict"] == "fail" and all(byp[p]["verdict"] == "pass" for p in since),
          "T1-relaxed: the DiT outputs pass, the CFG combination fails (rc=%d)" % rc)
    check(intro and intro["kind"] == "between" and intro["after"] == "/dit.step/0001" and
          intro["call"] == "/scheduler.step/0000" and intro["path"] == mo and
          close(intro["amplification"], amp, 1e-6),
          "introduced between dit.step/0001 and scheduler.step/0000, amplification %.4g: %s" % (amp, intro))
    calls = {c["call"]: c for c in res["calls"]}
    check(calls["/scheduler.step/0000"]["status"] == "inherited",
          "the scheduler only inherits it: %s" % calls["/scheduler.step/0000"]["status"])
    check(calls["/dit.block/0001"]["parent"] == "/dit.step/0000" and calls["/dit.block/0001"]["block"] == 1
          and calls["/dit.block/0002"]["parent"] == "/dit.step/0001" and calls["/dit.block/0002"]["block"] == 0,
          "blocks nest in their dit.step call with their block index")
    check("introduced between dit.step/0001 and scheduler.step/0000 (step 0), in pipeline code" in out,
          "the terminal names it between the calls")

    # --- a planted channel bias in block 1 of the first DiT call ---
    rc, out, err = compare(P("ref.h5"), P("bias.h5"), "--gate", "T1-relaxed:backend-swap", "--json",
                           P("bias.json"))
    b = json.load(open(P("bias.json")))
    bt = {t["path"]: t for t in b["tensors"]}
    blk = bt["/dit.block/0001/out"]
    check(blk["verdict"] == "fail" and blk["systematic"]["channel_fail"] and blk["systematic"]["channel"] == 0
          and blk["rel_l2"] < 1e-2 and blk["cosine"] > 0.9999,
          "the biased block fails the systematic test on channel 0 although rel_l2/cosine pass T1's bounds")
    check(bt["/dit.block/0000/out"]["systematic"]["channel_fail"] is False and
          bt["/dit.block/0000/out"]["systematic"]["gain_fail"] is False,
          "noise alone (block 0): no systematic failure")
    bc = {c["call"]: c for c in b["calls"]}
    check(b["introduced"]["kind"] == "call" and b["introduced"]["call"] == "/dit.block/0001",
          "introduced by /dit.block/0001: %s" % b["introduced"])
    check(bc["/dit.step/0000"]["status"] == "inside" and bc["/dit.step/0000"]["via"] == "/dit.block/0001",
          "its dit.step is 'inside' via the block: %s" % bc["/dit.step/0000"])
    check("introduced by dit.block/0001 (block 1 of dit.step/0000, step 0, branch 0)" in out,
          "the terminal names the block and its parent")

    # --- the oracle ---
    pipeline(noise=0.0).write(P("oracle-src.h5"))
    # oracle = the exact pipeline; the reference and an equally accurate candidate each
    # carry their own noise of the same size; a worse candidate carries twice as much
    pipeline(noise=2e-3, seed=11).write(P("ref_n.h5"))
    pipeline(noise=2e-3, seed=12).write(P("same_acc.h5"))
    pipeline(noise=4e-3, seed=13).write(P("worse.h5"))
    o, rn, sa = load(P("oracle-src.h5")), load(P("ref_n.h5")), load(P("same_acc.h5"))
    rc, out, err = compare(P("ref_n.h5"), P("same_acc.h5"), "--oracle", P("oracle-src.h5"),
                           "--json", P("or.json"))
    orr = json.load(open(P("or.json")))
    check(rc == 0 and orr["verdict"] == "pass" and orr["headline"] == "oracle" and
          orr["gate_verdict"] == "fail",
          "equally accurate candidate: PASS against the oracle while T1 fails (rc=%d)" % rc)
    ok = True
    for t in orr["tensors"]:
        p, x = t["path"], t["oracle"]
        er = np.linalg.norm(rn[p] - o[p]) / np.linalg.norm(o[p])
        ec = np.linalg.norm(sa[p] - o[p]) / np.linalg.norm(o[p])
        if er == 0:  # the oracle holds the reference's bytes: it cannot judge this tensor
            ok &= x is None and t.get("oracle_same_as_reference") is True
            continue
        ok &= close(x["rel_l2_reference"], er, 1e-9) and close(x["rel_l2_candidate"], ec, 1e-9)
        ok &= close(x["ratio"], ec / er, 1e-9)
        ar, _ = gain_np(o[p], rn[p])
        ac, _ = gain_np(o[p], sa[p])
        _, se = gain_np(rn[p], sa[p])
        ok &= close(x["gain_excess"], (abs(ac) - abs(ar)) / se, 1e-6)
        if rn[p].ndim >= 2:
            axis = 1 if rn[p].ndim >= 4 else rn[p].ndim - 1
            br, _, _ = channels_np(o[p], rn[p], axis)
            bcn, _, _ = channels_np(o[p], sa[p], axis)
            _, sek, _ = channels_np(rn[p], sa[p], axis)
            exc = (np.abs(bcn) - np.abs(br)) / sek
            ok &= close(x["channel_excess"], exc[x["channel"]], 1e-6)
    check(ok, "oracle rel_l2 of each side, ratio, gain and channel excess equal numpy's")
    rc, out, err = compare(P("ref_n.h5"), P("worse.h5"), "--oracle", P("oracle-src.h5"),
                           "--json", P("worse.json"))
    w = json.load(open(P("worse.json")))
    dit0 = {t["path"]: t for t in w["tensors"]}["/dit.block/0000/out"]
    check(rc == 1 and dit0["verdict"] == "fail" and dit0["oracle"]["ratio_fail"] and
          1.7 < dit0["oracle"]["ratio"] < 2.3 and "less accurate than the reference" in dit0["reasons"][-1],
          "a candidate twice as far from the oracle fails 'less accurate' (ratio %s)" % dit0["oracle"]["ratio"])

    # --- probe-matrix: inherited is not FAIL ---
    p = subprocess.run([MATRIX, "noise=" + P("noise.json"), "--out", P("m.json")], capture_output=True,
                       text=True)
    mj = json.load(open(P("m.json")))
    st = {c["id"]: c["status"] for c in mj["cells"]}
    check(p.returncode == 1 and st.get("scheduler.step/noise") == "inherited" and
          st.get("dit.step/noise") in ("passed", "inherited") and "failed" not in st.values(),
          "probe-matrix: scheduler.step inherited, no cell failed (rc=%d, %s)" % (p.returncode, st))

    # --- bad input ---
    for what, args, needle in [
        ("missing oracle", ["--oracle", P("nope.h5")], "nope.h5"),
        ("oracle is the reference", ["--oracle", P("ref.h5")], "is the reference file"),
        ("headroom below 1", ["--oracle", P("oracle-src.h5"), "--oracle-headroom", "0.5"], "--oracle-headroom"),
        ("headroom not a number", ["--oracle", P("oracle-src.h5"), "--oracle-headroom", "x"], "--oracle-headroom"),
        ("headroom without oracle", ["--oracle-headroom", "1.2"], "needs --oracle"),
    ]:
        rc, so, se = compare(P("ref.h5"), P("noise.h5"), *args)
        lines = se.strip().splitlines()
        check(rc == 2 and len(lines) == 1 and lines[0].startswith("probe-compare: ") and needle in lines[0],
              "bad input (%s): exit 2, one line [%d %r]" % (what, rc, se.strip()[:160]))
    rc, so, se = compare(P("ref.h5"), P("noise.h5"), "--oracle", P("oracle-src.h5"), "--oracle",
                         P("oracle-src.h5"))
    check(rc == 2 and "--oracle given twice" in se, "--oracle twice: exit 2 (%d %r)" % (rc, se.strip()))
    # an oracle whose run was killed half-way (its run_end says so; it lacks step 1)
    half = pipeline(noise=0.0)
    half.items = [x for x in half.items if x[4] != 1]
    half.write(P("oracle-half.h5"))
    with h5py.File(P("oracle-half.h5"), "a") as f:
        f.attrs["probe.manifest"] = json.dumps({"probe_version": "test", "run_end": {
            "exit_status": None, "signal": "SIGKILL", "capture": "journal", "capture_complete": False}})
    rc, so, se = compare(P("ref_n.h5"), P("same_acc.h5"), "--oracle", P("oracle-half.h5"), "--json",
                         P("half.json"))
    hj = json.load(open(P("half.json")))
    check(rc == 1 and hj["incomplete_oracle"] and hj["introduced"] is None and
          any(r.startswith("incomplete capture: the oracle run did not complete (killed by signal "
                           "SIGKILL") for r in hj["reasons"]),
          "an oracle killed half-way fails the run as incomplete and names no place of introduction")
    pipeline().write(P("oracle-copy.h5"))
    rc, so, se = compare(P("ref.h5"), P("noise.h5"), "--oracle", P("oracle-copy.h5"))
    check(rc == 1 and "is identical to the reference in every tensor it holds" in so,
          "an oracle identical to the reference fails the run (rc=%s)" % rc)

    # --- NaN in the reference, identity ---
    def pair(name, r, c, dtype_r=None, dtype_c=None):
        for side, x, dt in (("r", r, dtype_r), ("c", c, dtype_c)):
            with h5py.File(P("%s_%s.h5" % (name, side)), "w") as f:
                f.create_dataset("/x/0000/out", data=np.asarray(x, dtype=dt))
        return P(name + "_r.h5"), P(name + "_c.h5")
    a, b2 = pair("nanref", [np.nan, np.nan, np.nan], [1.0, 2.0, 3.0], np.float32, np.float32)
    rc, so, se = compare(a, b2, "--json", P("nan.json"))
    t = json.load(open(P("nan.json")))["tensors"][0]
    check(rc == 1 and t["nan_ref_only"] == 3 and any("NaN in reference" in x for x in t["reasons"]),
          "an all-NaN reference against a finite candidate fails")
    for name, r, c, dr, dc in [("int64", [2**62 + 1], [2**62 + 2], np.int64, np.int64),
                               ("zero", [0.0, 1.0], [-0.0, 1.0], np.float32, np.float32),
                               ("f64f32", [1.5, 2.0], [1.5, 2.0], np.float64, np.float32),
                               ("i32f32", [1, 2], [1, 2], np.int32, np.float32)]:
        a, b2 = pair(name, r, c, dr, dc)
        rc, so, se = compare(a, b2, "--expect-identical")
        check(rc == 1 and "not identical" in so, "--expect-identical: %s is not bit-identical (rc=%d)" % (name, rc))
    a, b2 = pair("same", [2**62 + 1, 5], [2**62 + 1, 5], np.int64, np.int64)
    rc, so, se = compare(a, b2, "--expect-identical")
    check(rc == 0, "--expect-identical: the same int64 bytes are identical (rc=%d)" % rc)

    # --- T2 without thresholds for a component: not judged, never "introduced" by identity ---
    # The calibration holds dit.step, dit.block and scheduler.step but not the text encoder,
    # whose output comes first. Identical there: the run still fails (no thresholds), but
    # attribution names no call. Differing there: it is named, and the line says why.
    def with_text_encoder(cap, delta):
        x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(4, 16)
        y = x.copy()
        y[0, 0] += delta
        cap.items.insert(0, ("text_encoder", 0, "out", y, -1, -1))
        return cap
    with_text_encoder(pipeline(), 0.0).write(P("te_ref.h5"))
    with_text_encoder(pipeline(), 0.0).write(P("te_same.h5"))
    with_text_encoder(pipeline(), 0.25).write(P("te_diff.h5"))
    loose = {"rel_l2_max": 1.0, "cosine_min": -1.0, "max_abs_max": 1e9, "p99_abs_max": 1e9}
    with open(P("te_cal.json"), "w") as f:
        json.dump({"format": "probe-calibration", "version": 1,
                   "components": {"dit.step": loose, "dit.block": loose, "scheduler.step": loose}}, f)
    rc, so, se = compare(P("te_ref.h5"), P("te_same.h5"), "--gate", "T2", "--calibration",
                         P("te_cal.json"), "--json", P("te_same.json"))
    j = json.load(open(P("te_same.json")))
    te = [t for t in j["tensors"] if t["path"] == "/text_encoder/0000/out"][0]
    check(rc == 1 and te["identical"] and any("no T2 thresholds for component 'text_encoder'" in x
                                             for x in te["reasons"])
          and j["introduced"] is None and "introduced" not in so.split("first failure")[-1],
          "T2: an identical tensor without thresholds fails the run but is introduced by nothing "
          "(rc=%d, introduced %r)" % (rc, j["introduced"]))
    rc, so, se = compare(P("te_ref.h5"), P("te_diff.h5"), "--gate", "T2", "--calibration",
                         P("te_cal.json"), "--json", P("te_diff.json"))
    j = json.load(open(P("te_diff.json")))
    i = j["introduced"] or {}
    check(rc == 1 and i.get("call") == "/text_encoder/0000" and i.get("no_thresholds") is True
          and "introduced by text_encoder/0000: /text_encoder/0000/out differs while its inputs pass; "
              "it has no T2 thresholds in the calibration file" in so,
          "T2: a differing tensor without thresholds is named, with the reason (rc=%d, %r)" % (rc, i))
    check(j["calibration"] == P("te_cal.json") and
          "thresholds from the calibration file %s (" % P("te_cal.json") in so,
          "T2: the text header and the JSON name the calibration file (%r)" % j.get("calibration"))
    rc, so, se = compare(P("te_ref.h5"), P("te_same.h5"), "--json", P("te_t1.json"))
    check(json.load(open(P("te_t1.json")))["calibration"] is None,
          "without --calibration the JSON's calibration is null")

    # --- labels the wrong way round: a note, nothing else changes ---
    def labelled(src, dst, label):
        import shutil
        shutil.copy(src, dst)
        with h5py.File(dst, "a") as f:
            f.attrs["probe.manifest"] = json.dumps({"probe_version": "test", "label": label})
    for name, label in (("lab_on", "On"), ("lab_off", "off"), ("lab_x", "fp8")):
        labelled(P("te_ref.h5"), P(name + ".h5"), label)
    rc1, swapped, _ = compare(P("lab_on.h5"), P("lab_off.h5"))
    rc2, right, _ = compare(P("lab_off.h5"), P("lab_on.h5"))
    rc3, other, _ = compare(P("lab_on.h5"), P("lab_x.h5"))
    note = "note: the reference is labelled 'On' and the candidate 'off'"
    # identical runs: each fails as "feature not active", the same way in every order
    check(rc1 == rc2 == rc3 == 1 and note in swapped and "note: the reference is labelled" not in right
          and "note: the reference is labelled" not in other,
          "labels on/off swapped: one note; in order or other labels: none (rc %d %d %d)" % (rc1, rc2, rc3))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
