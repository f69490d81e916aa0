#!/usr/bin/env python3
"""End-to-end test of the main job on the embedded example.

Runs scripts/example/toy_pipeline.py under build/bin/probe-run (reference,
second reference, perturb-denoiser and bf16-denoiser candidates, each but one
also saving its own tensors with --save), then checks, with values computed
here independently of probe:

 (a) every expected dataset /<component>/<call:04>/<slot> is in the capture
     file, and nothing else;
 (b) captured values are bit-exact copies of what the pipeline saved, with
     the logical dtype (probe.dtype) and shape, in execution order;
 (c) probe-compare --json: every metric of docs/metrics.md recomputed in fp64
     with numpy / math.fsum from the saved arrays, for every tensor;
 (d) the perturbed denoiser is the first failure, text encoder passes,
     exit 1; reference vs second reference: exit 0 with --expect-identical,
     identical everywhere (exit 1, feature not active, without it);
     all JSON v1 keys present;
 (e) bf16-denoiser (the demo's feature): bfloat16 captures bit-exact, first
     failure /dit.step/0000/out.sample, metrics recomputed across dtypes;
 (f) scripts/demo runs the same job, finds the expected first failure, then judges a bf16
     kernel swap under T1 (fails) and against a float32 oracle (passes), and exits 0;
 (g) chunked-attention (transparent): passes T1, feature active, metrics
     recomputed.

Environment: PROBE_BUILD_DIR (build tree, required), PROBE_SOURCE_DIR
(source tree; default: two levels above this file), PROBE_PYTHON (python for
the pipeline; default this interpreter). Prints each check; exits 1 if any
failed.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR")
SRC = os.environ.get("PROBE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PY = os.environ.get("PROBE_PYTHON") or sys.executable
STEPS = 3          # not the default (4): the call counts below follow from it
FRAMES = 3
PIPE_ARGS = ["--steps", str(STEPS), "--frames", str(FRAMES), "--height", "32", "--width", "48"]

FAILURES = []


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


class Fatal(Exception):
    pass


def require(cond, what):
    if not check(cond, what):
        raise Fatal(what)


def run(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=600, **kw)
    if p.stderr.strip():
        print("  stderr: " + p.stderr.strip().replace("\n", "\n  stderr: ")[:4000])
    return p


# --------------------------------------------------------------------------
# what the pipeline must produce, derived from its description (not from it)

def expected_paths(steps):
    slots = {
        "text_encoder": (2, ["in.input_ids", "in.attention_mask", "out.last_hidden_state"]),
        "dit.step": (2 * steps, ["in.hidden_states", "in.timestep", "in.encoder_hidden_states",
                                 "out.sample"]),
        "scheduler.step": (steps, ["in.model_output", "in.timestep", "in.sample",
                                   "out.prev_sample"]),
        "vae.decode": (1, ["in.latents", "out.sample"]),
        # root inputs (source components): encode_prompt, prepare_latents, set_timesteps
        "prompt_embeds": (2, ["out"]),
        "latents.init": (1, ["out"]),
        "timesteps": (1, ["out.timesteps", "out.sigmas"]),
    }
    out = set()
    for comp, (ncalls, names) in slots.items():
        for call in range(ncalls):
            for s in names:
                out.add(f"/{comp}/{call:04d}/{s}")
    return out


def expected_call_order(steps):
    """(component, call) in execution order: prompt, negative prompt, then per
    step cond + uncond denoiser and one scheduler step, then the VAE."""
    order = [("text_encoder", 0), ("prompt_embeds", 0), ("text_encoder", 1), ("prompt_embeds", 1),
             ("latents.init", 0), ("timesteps", 0)]
    for i in range(steps):
        order += [("dit.step", 2 * i), ("dit.step", 2 * i + 1), ("scheduler.step", i)]
    return order + [("vae.decode", 0)]


SOURCES = ("prompt_embeds", "latents.init", "timesteps")  # root inputs: outputs only


def expected_groups(steps):
    """[(component, call, 'in'|'out')] in execution order; a source has no tensor input."""
    return [(c, k, io) for c, k in expected_call_order(steps)
            for io in (("out",) if c in SOURCES else ("in", "out"))]


def group_sequence(paths):
    """[(component, call, 'in'|'out')] with consecutive repeats merged."""
    seq = []
    for p in paths:
        _, comp, call, slot = p.split("/")
        g = (comp, int(call), slot.split(".")[0])
        if not seq or seq[-1] != g:
            seq.append(g)
    return seq


# --------------------------------------------------------------------------
# saved tensors and capture files

def load_saved(root):
    with open(os.path.join(root, "index.json")) as fh:
        index = json.load(fh)["tensors"]
    arrays = {}
    for e in index:
        arrays[e["path"]] = np.load(os.path.join(root, e["file"]))
    return index, arrays


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def as_f64(entry, arr):
    if entry["dtype"] == "bfloat16":
        return bf16_bits_to_f32(arr).astype(np.float64)
    return arr.astype(np.float64)


def h5_datasets(path):
    found = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                found["/" + name] = {k: obj.attrs[k] for k in obj.attrs}
        f.visititems(visit)
        root = {k: f.attrs[k] for k in f.attrs}
    return found, root


def attr_str(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.shape == ():
        return attr_str(v[()])
    return str(v)


def find_value(obj, key):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            yield from find_value(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from find_value(v, key)


def check_capture(name, h5path, save_root, steps, label):
    """(a) and (b) for one run."""
    index, arrays = load_saved(save_root)
    want = expected_paths(steps)
    saved_paths = [e["path"] for e in index]
    require(set(saved_paths) == want and len(saved_paths) == len(want),
            f"{name}: the pipeline saved exactly the {len(want)} expected tensors")
    require(os.path.exists(h5path), f"{name}: capture file {os.path.basename(h5path)} exists")
    found, root = h5_datasets(h5path)
    missing = sorted(want - set(found))
    extra = sorted(set(found) - want)
    check(not missing, f"{name}: (a) every expected dataset captured ({len(want)}); missing: {missing[:8]}")
    check(not extra, f"{name}: (a) no unexpected dataset; extra: {extra[:8]}")

    check(attr_str(root.get("probe.format", "")) == "probe-capture",
          f"{name}: root probe.format = probe-capture")
    check(int(np.asarray(root.get("probe.version", -1))) == 1, f"{name}: root probe.version = 1")
    try:
        manifest = json.loads(attr_str(root.get("probe.manifest", "")))
        check(label in list(find_value(manifest, "label")),
              f"{name}: manifest JSON carries label {label!r}")
    except ValueError as e:
        check(False, f"{name}: root probe.manifest is JSON ({e})")

    bad_dtype, bad_shape, bad_value, bad_attr = [], [], [], []
    with h5py.File(h5path, "r") as f:
        for e in index:
            p = e["path"]
            if p not in f:
                continue
            ds = f[p]
            a = ds.attrs
            if attr_str(a.get("probe.dtype", "")) != e["dtype"]:
                bad_dtype.append(f"{p}: {attr_str(a.get('probe.dtype', ''))} != {e['dtype']}")
            pshape = a.get("probe.shape")
            # a 0-d tensor's probe.shape is an empty array (h5py may give Empty)
            pshape = [int(x) for x in np.atleast_1d(pshape)] if e["shape"] else e["shape"]
            if list(ds.shape) != e["shape"] or pshape != e["shape"]:
                bad_shape.append(f"{p}: {ds.shape} / {a.get('probe.shape')} != {e['shape']}")
            if (attr_str(a.get("probe.component", "")) != e["component"]
                    or attr_str(a.get("probe.slot", "")) != e["slot"]
                    or int(np.asarray(a.get("probe.call", -1))) != e["call"]):
                bad_attr.append(p)
            got = ds[()]
            ref = arrays[p]
            if e["dtype"] == "bfloat16":
                # h5py reads probe's bfloat16 type as float32, exactly
                same = (np.asarray(got).dtype == np.float32 and got.shape == ref.shape
                        and np.asarray(got).tobytes() == bf16_bits_to_f32(ref).tobytes())
            else:
                got = np.asarray(got)
                same = (got.dtype == ref.dtype and got.shape == ref.shape
                        and got.tobytes() == ref.tobytes())
            if not same:
                bad_value.append(p)
    check(not bad_dtype, f"{name}: (b) probe.dtype is the logical dtype for every tensor {bad_dtype[:4]}")
    check(not bad_shape, f"{name}: (b) dataset shape and probe.shape match {bad_shape[:4]}")
    check(not bad_attr, f"{name}: (b) probe.component/slot/call match the path {bad_attr[:4]}")
    # step / CFG branch / timestep of the denoiser and scheduler calls
    # (dit.step call k is step k // 2, branch k % 2; scheduler.step call i is
    # step i; the timestep is the value the pipeline passed, as saved)
    bad_step = []
    with h5py.File(h5path, "r") as f:
        for e in index:
            p = e["path"]
            if p not in f or e["component"] not in ("dit.step", "scheduler.step"):
                continue
            a = f[p].attrs
            k = e["call"]
            step, cfg = (k // 2, k % 2) if e["component"] == "dit.step" else (k, None)
            ts = float(np.asarray(arrays[f"/{e['component']}/{k:04d}/in.timestep"]).ravel()[0])
            got = (int(np.asarray(a.get("probe.step", -99))),
                   int(np.asarray(a.get("probe.cfg_branch", -99))) if cfg is not None else None,
                   float(np.asarray(a.get("probe.timestep", np.nan))))
            if got != (step, cfg, ts):
                bad_step.append(f"{p}: (step, cfg_branch, timestep) {got} != {(step, cfg, ts)}")
    check(not bad_step, f"{name}: (b) probe.step, probe.cfg_branch, probe.timestep of dit.step and "
          f"scheduler.step are the pipeline's {bad_step[:3]}")
    check(not bad_value, f"{name}: (b) {len(index) - len(bad_value)}/{len(index)} captured tensors "
          f"bit-exact to the pipeline's own copies; differing: {bad_value[:4]}")

    seqs = {p: a.get("probe.seq") for p, a in found.items()}
    if check(all(s is not None for s in seqs.values()), f"{name}: (b) every dataset has probe.seq"):
        by_seq = sorted(seqs, key=lambda p: int(np.asarray(seqs[p])))
        got_groups = group_sequence(by_seq)
        want_groups = expected_groups(steps)
        check(got_groups == want_groups,
              f"{name}: (b) probe.seq orders calls in execution order, inputs before outputs")
    return index, arrays


# --------------------------------------------------------------------------
# the fp64 oracle for docs/metrics.md's metrics

def oracle(r, c, atol, rtol):
    shape = r.shape
    r = r.astype(np.float64).ravel()
    c = c.astype(np.float64).ravel()
    n = r.size
    nan_r, nan_c = np.isnan(r), np.isnan(c)
    inf_r, inf_c = np.isinf(r), np.isinf(c)
    fin = np.isfinite(r) & np.isfinite(c)
    rf, cf = r[fin], c[fin]
    ad = np.abs(cf - rf)
    nr2 = math.fsum((rf * rf).tolist())
    nc2 = math.fsum((cf * cf).tolist())
    nd2 = math.fsum(((cf - rf) ** 2).tolist())
    dot = math.fsum((rf * cf).tolist())
    nr, nc = math.sqrt(nr2), math.sqrt(nc2)
    m = {"n": n, "shape": list(shape)}
    same = (r == c) | (nan_r & nan_c)
    m["identical"] = bool(same.all())
    m["zero_norm_reference"] = nr2 == 0.0
    if nr2 == 0.0:
        m["rel_l2"] = 0.0 if np.array_equal(rf, cf) else None
    else:
        m["rel_l2"] = math.sqrt(nd2) / nr
    if nr == 0.0 and nc == 0.0:
        m["cosine"] = 1.0
    elif nr == 0.0 or nc == 0.0:
        m["cosine"] = 0.0
    else:
        m["cosine"] = min(1.0, max(-1.0, dot / (nr * nc)))
    if ad.size:
        full = np.full(n, -1.0)
        full[fin] = ad
        k = int(np.argmax(full))            # first occurrence, row-major
        m["max_abs"] = float(full[k])
        m["max_abs_index"] = [int(i) for i in np.unravel_index(k, shape)] if shape else []
        m["p99_abs"] = float(np.percentile(ad, 99, method="inverted_cdf"))
        m["mean_abs"] = math.fsum(ad.tolist()) / ad.size
    else:
        m["max_abs"], m["p99_abs"], m["mean_abs"] = 0.0, None, None
    mism = np.zeros(n, dtype=bool)
    mism[fin] = ad > atol + rtol * np.abs(rf)
    nonfin = ~fin
    both_nan = nan_r & nan_c
    same_inf = inf_r & inf_c & (r == c)
    mism[nonfin] = ~(both_nan | same_inf)[nonfin]
    m["mismatch_fraction"] = float(mism.sum()) / n if n else 0.0
    m["nan_ref"], m["nan_cand"] = int(nan_r.sum()), int(nan_c.sum())
    m["inf_ref"], m["inf_cand"] = int(inf_r.sum()), int(inf_c.sum())
    return m


def gate_pass(m, g):
    if m["nan_cand"] or m["rel_l2"] is None or m["cosine"] is None:
        return False
    return (m["mismatch_fraction"] <= g.get("mismatch_fraction_max", 0.0)
            and m["rel_l2"] <= g["rel_l2_max"] and m["cosine"] >= g["cosine_min"])


def close(a, b, rel=1e-12):
    if a is None or b is None:
        return a is None and b is None
    if a == b:
        return True
    return abs(a - b) <= rel * max(abs(a), abs(b))


TOP_KEYS = ["format", "version", "reference", "candidate", "gate", "verdict", "first_failure",
            "feature_active", "missing_in_candidate", "missing_in_reference", "tensors"]
GATE_KEYS = ["name", "atol", "rtol", "rel_l2_max", "cosine_min"]
TENSOR_KEYS = ["path", "component", "dtype", "shape", "n", "rel_l2", "cosine", "max_abs",
               "max_abs_index", "p99_abs", "mean_abs", "mismatch_fraction", "nan_ref", "nan_cand",
               "inf_ref", "inf_cand", "zero_norm_reference", "identical", "verdict", "reasons"]


def compare(name, ref_h5, cand_h5, *extra):
    p = run([os.path.join(BUILD, "bin", "probe-compare"), ref_h5, cand_h5, "--gate", "T1",
             "--json", "-", *extra])
    try:
        doc = json.loads(p.stdout)
    except ValueError as e:
        require(False, f"{name}: probe-compare --json - writes JSON on stdout ({e}); "
                f"stdout starts {p.stdout[:200]!r}")
    check(True, f"{name}: probe-compare --json - writes JSON on stdout")
    missing = [k for k in TOP_KEYS if k not in doc]
    check(not missing, f"{name}: JSON v1 top-level keys present; missing {missing}")
    check(doc.get("format") == "probe-compare" and doc.get("version") == 1,
          f"{name}: format probe-compare, version 1")
    gm = [k for k in GATE_KEYS if k not in doc.get("gate", {})]
    check(not gm, f"{name}: JSON gate keys present; missing {gm}")
    tm = sorted({k for t in doc.get("tensors", []) for k in TENSOR_KEYS if k not in t})
    check(not tm, f"{name}: JSON tensor keys present in every tensor; missing {tm}")
    return p.returncode, doc


def check_metrics(name, doc, ref, cand, steps):
    """(c): every metric of every tensor recomputed from the saved arrays."""
    ref_index, ref_arrays = ref
    cand_index, cand_arrays = cand
    g = doc["gate"]
    check(g["name"] == "T1" and g["atol"] == 1e-3 and g["rtol"] == 1e-3 and g["rel_l2_max"] == 1e-2
          and g["cosine_min"] == 0.9999, f"{name}: gate T1 = atol 1e-3, rtol 1e-3, rel_l2 1e-2, cosine 0.9999")
    ref_e = {e["path"]: e for e in ref_index}
    cand_e = {e["path"]: e for e in cand_index}
    tensors = doc["tensors"]
    paths = [t["path"] for t in tensors]
    check(set(paths) == expected_paths(steps) and len(paths) == len(set(paths)),
          f"{name}: JSON lists each of the {len(expected_paths(steps))} tensors once")
    want_groups = expected_groups(steps)
    check(group_sequence(paths) == want_groups, f"{name}: JSON tensors in execution order")

    exact = ["n", "shape", "max_abs", "max_abs_index", "p99_abs", "mismatch_fraction", "nan_ref",
             "nan_cand", "inf_ref", "inf_cand", "zero_norm_reference", "identical"]
    approx = ["rel_l2", "cosine", "mean_abs"]
    bad = []
    nchecked = 0
    verdicts = {}
    for t in tensors:
        p = t["path"]
        if p not in ref_e or p not in cand_e:
            bad.append(f"{p}: not saved by the pipeline")
            continue
        r = as_f64(ref_e[p], ref_arrays[p]).reshape(ref_e[p]["shape"])
        c = as_f64(cand_e[p], cand_arrays[p]).reshape(cand_e[p]["shape"])
        m = oracle(r, c, g["atol"], g["rtol"])
        for k in exact:
            if k in m and t.get(k) != m[k]:
                bad.append(f"{p}: {k} {t.get(k)!r} != {m[k]!r}")
        for k in approx:
            if not close(t.get(k), m[k]):
                bad.append(f"{p}: {k} {t.get(k)!r} != {m[k]!r}")
        if t.get("component") != ref_e[p]["component"]:
            bad.append(f"{p}: component {t.get('component')!r}")
        if t.get("dtype") != ref_e[p]["dtype"]:
            bad.append(f"{p}: dtype {t.get('dtype')!r} != reference's {ref_e[p]['dtype']!r}")
        if "dtype_candidate" in t and t["dtype_candidate"] != cand_e[p]["dtype"]:
            bad.append(f"{p}: dtype_candidate {t['dtype_candidate']!r} != {cand_e[p]['dtype']!r}")
        verdicts[p] = "pass" if gate_pass(m, g) else "fail"
        if t.get("verdict") != verdicts[p]:
            bad.append(f"{p}: verdict {t.get('verdict')!r}, the T1 rule on the oracle's metrics "
                       f"gives {verdicts[p]!r}")
        if t.get("verdict") == "fail" and not t.get("reasons"):
            bad.append(f"{p}: fails without reasons")
        nchecked += 1
    for b in bad[:20]:
        print("    " + b)
    check(not bad, f"{name}: (c) {nchecked} tensors x {len(exact) + len(approx)} metrics equal the "
          f"fp64 oracle (exact, or 1e-12 relative for rel_l2/cosine/mean_abs), and the T1 verdicts; "
          f"{len(bad)} differences")
    first = next((e["path"] for e in ref_index if verdicts.get(e["path"]) == "fail"), None)
    return verdicts, first


def pipeline_cmd(out_h5, label, *args):
    return [os.path.join(BUILD, "bin", "probe-run"), "--out", out_h5, "--label", label, "--",
            PY, os.path.join(SRC, "scripts", "example", "toy_pipeline.py")] + PIPE_ARGS + list(args)


def main():
    if not BUILD:
        print("FAIL - PROBE_BUILD_DIR is not set")
        return 1
    for tool in ("probe-run", "probe-compare"):
        require(os.access(os.path.join(BUILD, "bin", tool), os.X_OK), f"{BUILD}/bin/{tool} exists")
    tmp = tempfile.mkdtemp(prefix="probe-main-job-")
    print(f"# work directory {tmp}")
    try:
        j = lambda *a: os.path.join(tmp, *a)  # noqa: E731
        runs = {
            "ref": ("ref", []),
            "ref2": ("ref2", []),
            "perturb": ("perturb", ["--feature", "perturb-denoiser"]),
            "bf16": ("bf16", ["--feature", "bf16-denoiser"]),
            "chunked": ("chunked", ["--feature", "chunked-attention"]),
        }
        for name, (label, extra) in runs.items():
            save = [] if name == "ref2" else ["--save", j(name + "_save")]
            p = run(pipeline_cmd(j(name + ".h5"), label, *extra, *save))
            require(p.returncode == 0, f"{name}: pipeline under probe-run exits 0 (got {p.returncode})")
            check("toy_pipeline: feature=" in p.stdout,
                  f"{name}: the pipeline's stdout passes through probe-run")

        # (a), (b)
        ref = check_capture("ref", j("ref.h5"), j("ref_save"), STEPS, "ref")
        perturb = check_capture("perturb", j("perturb.h5"), j("perturb_save"), STEPS, "perturb")
        bf16 = check_capture("bf16", j("bf16.h5"), j("bf16_save"), STEPS, "bf16")
        bf16_types = sorted({(e["component"], e["slot"], e["dtype"]) for e in bf16[0]
                             if e["dtype"] != {"in.input_ids": "int64",
                                               "in.attention_mask": "int64"}.get(e["slot"], "float32")})
        check(bf16_types == [("dit.step", "out.sample", "bfloat16")],
              f"bf16: dit.step out.sample is bfloat16, every other tensor has the reference's dtype "
              f"({bf16_types})")

        # (c), (d): perturbed denoiser
        rc, doc = compare("ref-vs-perturb", j("ref.h5"), j("perturb.h5"))
        check(rc == 1, f"ref-vs-perturb: probe-compare exits 1 (got {rc})")
        verdicts, first = check_metrics("ref-vs-perturb", doc, ref, perturb, STEPS)
        check(first is not None and first.startswith("/dit.step/"),
              f"ref-vs-perturb: the oracle's first T1 failure is in dit.step ({first})")
        check(doc.get("first_failure") == first and str(first).startswith("/dit.step/"),
              f"ref-vs-perturb: first_failure {doc.get('first_failure')!r} == {first!r}")
        te = [t for t in doc["tensors"] if t["path"].startswith("/text_encoder/")]
        check(len(te) == 6 and all(t["verdict"] == "pass" and t["identical"] for t in te),
              f"ref-vs-perturb: all {len(te)} /text_encoder/ tensors pass (identical)")
        check(doc.get("verdict") == "fail", f"ref-vs-perturb: verdict {doc.get('verdict')!r} == 'fail'")
        check(doc.get("feature_active") is True, "ref-vs-perturb: feature_active is true")
        check(doc.get("missing_in_candidate") == [] and doc.get("missing_in_reference") == [],
              "ref-vs-perturb: nothing missing")

        # (d): determinism floor, reference vs a second reference run
        rc, doc = compare("ref-vs-ref2", j("ref.h5"), j("ref2.h5"), "--expect-identical")
        check(rc == 0, f"ref-vs-ref2 --expect-identical: probe-compare exits 0 (got {rc})")
        check(doc.get("verdict") == "pass", f"ref-vs-ref2: verdict {doc.get('verdict')!r} == 'pass'")
        ts = doc.get("tensors", [])
        check(len(ts) == len(expected_paths(STEPS)) and all(
            t.get("identical") is True and t.get("verdict") == "pass" and t.get("rel_l2") == 0.0
            and t.get("max_abs") == 0.0 for t in ts),
            f"ref-vs-ref2: all {len(ts)} tensors identical (CPU run is deterministic)")
        check(doc.get("first_failure") is None, "ref-vs-ref2: first_failure is null")
        check(doc.get("feature_active") is False,
              "ref-vs-ref2: feature_active is false (candidate identical to the reference)")
        # without --expect-identical the identical candidate is "feature not active"
        rc, doc = compare("ref-vs-ref2-plain", j("ref.h5"), j("ref2.h5"))
        check(rc == 1 and doc.get("verdict") == "fail" and doc.get("feature_not_active") is True
              and any(r.startswith("feature not active:") for r in doc.get("reasons", [])),
              f"ref-vs-ref2 without --expect-identical: exit 1 (got {rc}), feature not active")

        # (e): bf16 denoiser, the demo's feature (float32 reference vs bfloat16 candidate)
        rc, doc = compare("ref-vs-bf16", j("ref.h5"), j("bf16.h5"))
        check(rc == 1, f"ref-vs-bf16: probe-compare exits 1 (got {rc})")
        verdicts, first = check_metrics("ref-vs-bf16", doc, ref, bf16, STEPS)
        check(doc.get("first_failure") == "/dit.step/0000/out.sample" == first,
              f"ref-vs-bf16: first_failure {doc.get('first_failure')!r} == oracle's {first!r}")
        te = [t for t in doc["tensors"] if t["path"].startswith("/text_encoder/")]
        check(len(te) == 6 and all(t["verdict"] == "pass" and t["identical"] for t in te),
              "ref-vs-bf16: the text encoder is untouched (identical)")

        # (g): chunked (online-softmax) attention, a transparent kernel swap:
        # differs by rounding only, passes T1, and the feature is active
        # The text encoder's attention is swapped too: the prompt embeddings,
        # a root input, differ (by rounding), so the pair is "not the same
        # experiment" until the difference is allowed as the feature's own.
        rc, doc = compare("ref-vs-chunked-roots", j("ref.h5"), j("chunked.h5"))
        differ = sorted(r["path"] for r in doc.get("root_inputs") or [] if not r["same"])
        ref_arr, chk_arr = ref[1], load_saved(j("chunked_save"))[1]
        want = sorted(p for p in ref_arr if p.split("/")[1] in SOURCES
                      and not np.array_equal(ref_arr[p], chk_arr[p]))
        check(rc == 1 and doc.get("same_experiment") is False and differ == want
              and want and all(p.startswith("/prompt_embeds/") for p in want)
              and any(x.startswith("not the same experiment: root input /prompt_embeds/")
                      for x in doc.get("reasons", [])),
              f"ref-vs-chunked: the changed prompt embeddings make it not the same experiment "
              f"(exit {rc}, differing roots {differ}, saved arrays differ at {want})")
        rc, doc = compare("ref-vs-chunked", j("ref.h5"), j("chunked.h5"),
                          "--allow-root-diff", "prompt_embeds")
        check(rc == 0, f"ref-vs-chunked: probe-compare --allow-root-diff prompt_embeds exits 0 (got {rc})")
        check_metrics("ref-vs-chunked", doc, ref, load_saved(j("chunked_save")), STEPS)
        ts = doc.get("tensors", [])
        worst = max((t.get("rel_l2") or 0.0 for t in ts), default=None)
        check(doc.get("verdict") == "pass" and doc.get("feature_active") is True
              and any(not t.get("identical") for t in ts) and worst is not None and 0 < worst < 1e-5,
              f"ref-vs-chunked: pass, feature active, differs only by rounding (max rel_l2 {worst})")

        # probe-run passes a failing pipeline's status through
        p = run(pipeline_cmd(j("bad.h5"), "bad", "--height", "30"))
        check(p.returncode == 2 and "height and width" in p.stderr,
              f"bad --height: status 2 and the pipeline's message pass through probe-run (got {p.returncode})")

        # (f): the demo
        env = dict(os.environ, PROBE_BUILD_DIR=BUILD, PROBE_PYTHON=PY)
        p = run(["bash", os.path.join(SRC, "scripts", "demo"), j("demo")], env=env)
        check(p.returncode == 0, f"demo: exits 0 (T1 failed first at the denoiser; the bf16 kernel "
              f"swap fails T1 and passes against the oracle, as expected), got {p.returncode}")
        lines = [l for l in p.stdout.splitlines() if l.startswith("demo: as expected")]
        check(len(lines) == 2 and lines[0].startswith("demo: as expected, T1") and "/dit.step/" in lines[0],
              f"demo: explains part 1: {lines[:1]!r}")
        check(len(lines) == 2 and "no less accurate than the bf16 reference" in lines[1],
              f"demo: explains part 2: {lines[1:]!r}")
        try:
            with open(j("demo", "swap-T1.json")) as fh:
                t1 = json.load(fh)
            with open(j("demo", "swap-oracle.json")) as fh:
                orc = json.load(fh)
            check(t1.get("verdict") == "fail" and orc.get("verdict") == "pass" and
                  orc.get("headline") == "oracle" and orc.get("gate_verdict") == "fail",
                  "demo part 2: T1 fails the kernel swap, the oracle verdict passes it (gate still fails)")
        except (OSError, ValueError) as e:
            check(False, f"demo: part 2's JSON readable ({e})")
        try:
            with open(j("demo", "compare.json")) as fh:
                demo = json.load(fh)
            check(str(demo.get("first_failure")).startswith("/dit.step/") and demo.get("verdict") == "fail",
                  f"demo: compare.json first_failure {demo.get('first_failure')!r}, verdict fail")
        except (OSError, ValueError) as e:
            check(False, f"demo: compare.json readable ({e})")
    except Fatal:
        pass
    finally:
        if FAILURES:
            print(f"# kept {tmp} for inspection")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {len(FAILURES)} check(s) failed" if FAILURES else "# all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
