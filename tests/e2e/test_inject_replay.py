#!/usr/bin/env python3
"""End-to-end test of injection, replay (isolation) and the root-input check
on the embedded example (scripts/example/toy_pipeline.py under probe-run).

Checked against values computed here (numpy, h5py, and the toy's own torch
modules), never just "it ran":
 (1) seeds 0 and 1: probe-compare exits 1, "not the same experiment", and the
     differing roots are exactly the root datasets whose saved arrays differ
     (the initial latents); probe.hash equal <=> bytes equal for every root;
 (2) --inject REF.h5 (default: the table's root inputs): the seed-1 candidate's
     initial latents, timesteps and prompt embeddings are the reference's
     bytes, the manifest lists each injected path with the reference's
     probe.hash, the pipeline's own video equals the reference's, and a pure
     refactor (refactor-patchify) passes T1 bit-exactly (--expect-identical);
     without injection the same refactor is "not the same experiment";
 (3) --replay REF.h5 with the perturbed denoiser: every component input of the
     isolated run is the reference's, the isolated denoiser outputs equal the
     perturbed denoiser (rebuilt here from toy_modules) applied to the
     reference's recorded inputs, bit for bit; rel_l2_isolated of the denoiser
     > 0 and equal to numpy's fp64 value; scheduler, VAE and text encoder
     isolated errors are exactly 0; amplification = rel_l2 / rel_l2_isolated
     (null where the isolated error is 0); --only dit.step injects only the
     denoiser's inputs;
 (4) bad input: shape, dtype and count mismatches (more and fewer calls) stop
     the injection with one probe: line naming the path, the manifest says
     "failed", nothing is injected after the error, and probe-compare refuses
     the candidate (exit 1, "injection failed"); a missing reference file, a
     glob that matches nothing (warning, nothing injected), --only without
     --replay, an unknown --only component, --out naming the reference,
     --isolated naming a run that was not replayed;
 (5) the scheduler configuration is a root input (manifest "scheduler"),
     --allow-root-diff by component name and by path;
 (6) host injection honours strides: a transposed and a sliced (offset,
     step 2) numpy destination receive the reference's values (ctypes tap
     ABI, no adapter);
 (7) both manifests side by side in the JSON ("manifests") and the HTML;
 (8) --convert: a float32 reference injected into a bfloat16 tensor holds
     torch's round-to-nearest-even of it, recorded as converted.
"""

import json
import math
import os
import re
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
TOY = os.path.join(SRC, "scripts", "example", "toy_pipeline.py")
ARGS = ["--steps", "2", "--frames", "2", "--height", "32", "--width", "32"]
ROOTS = ("latents.init", "timesteps", "prompt_embeds")

FAILURES = []


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def run(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300, **kw)
    if p.stderr.strip():
        print("  stderr: " + p.stderr.strip().replace("\n", "\n  stderr: ")[:3000])
    return p


def probe_run(out, *opts, pipe_args=(), label=None):
    cmd = [os.path.join(BUILD, "bin", "probe-run"), "--out", out]
    if label:
        cmd += ["--label", label]
    return run(cmd + list(opts) + ["--", PY, TOY] + ARGS + list(pipe_args))


def compare(ref, cand, *extra):
    p = run([os.path.join(BUILD, "bin", "probe-compare"), ref, cand, "--json", "-", *extra])
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = {}
    return p.returncode, doc, p.stderr


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                a = obj.attrs
                out["/" + name] = (obj[()], str(a["probe.hash"].decode() if isinstance(a["probe.hash"], bytes)
                                               else a["probe.hash"]), str(obj.attrs.get("probe.dtype")))
        f.visititems(visit)
    return out


def manifest(path):
    with h5py.File(path, "r") as f:
        m = f.attrs["probe.manifest"]
    return json.loads(m.decode() if isinstance(m, bytes) else m)


def rel_l2(r, c):
    r = np.asarray(r, np.float64).ravel()
    c = np.asarray(c, np.float64).ravel()
    nr = math.sqrt(math.fsum(r * r))
    return math.sqrt(math.fsum((c - r) ** 2)) / nr


def probe_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("probe:")]


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR is not set", file=sys.stderr)
        return 1
    d = tempfile.mkdtemp(prefix="probe-inject-")
    j = lambda *p: os.path.join(d, *p)  # noqa: E731

    # ---- runs ---------------------------------------------------------------
    p = probe_run(j("ref.h5"), label="ref", pipe_args=["--out", j("ref.npy")])
    check(p.returncode == 0, "reference run exits 0")
    p = probe_run(j("s1.h5"), label="seed1", pipe_args=["--seed", "1", "--feature", "refactor-patchify"])
    check(p.returncode == 0, "seed-1 refactor run exits 0")
    ref = datasets(j("ref.h5"))
    s1 = datasets(j("s1.h5"))

    # (1) different seeds: not the same experiment
    rc, doc, err = compare(j("ref.h5"), j("s1.h5"), "--expect-identical")
    roots_ref = sorted(k for k in ref if k.split("/")[1] in ROOTS)
    want_diff = sorted(k for k in roots_ref if not np.array_equal(ref[k][0], s1[k][0]))
    got_diff = sorted(r["path"] for r in doc.get("root_inputs") or [] if not r["same"])
    check(want_diff == ["/latents.init/0000/out"], f"(1) seeds 0/1: only the initial latents differ ({want_diff})")
    check(rc == 1 and doc.get("same_experiment") is False and got_diff == want_diff,
          f"(1) probe-compare: exit 1, not the same experiment, differing roots {got_diff}")
    check(any(r.startswith("not the same experiment: root input /latents.init/0000/out differs")
              for r in doc.get("reasons", [])), "(1) the run-level reason names the differing input")
    hash_ok = all((ref[k][1] == s1[k][1]) == np.array_equal(ref[k][0], s1[k][0]) for k in roots_ref)
    check(hash_ok and len(roots_ref) == 5, f"(1) probe.hash equal <=> bytes equal for the {len(roots_ref)} roots")
    byroot = {r["path"]: r for r in doc.get("root_inputs") or []}
    check(all(byroot[k]["hash_reference"] == ref[k][1] and byroot[k]["hash_candidate"] == s1[k][1]
              for k in roots_ref), "(1) JSON root_inputs carry both files' probe.hash")

    # (2) --inject the roots: comparable, the refactor passes T1 bit-exactly
    p = probe_run(j("inj.h5"), "--inject", j("ref.h5"), label="seed1-injected",
                  pipe_args=["--seed", "1", "--feature", "refactor-patchify", "--out", j("inj.npy")])
    check(p.returncode == 0 and probe_lines(p.stderr) == [], "(2) injected run exits 0, no probe: lines")
    inj = datasets(j("inj.h5"))
    check(all(np.array_equal(inj[k][0], ref[k][0]) for k in roots_ref),
          "(2) every root input of the candidate is the reference's bytes")
    check(np.array_equal(inj["/dit.step/0000/in.hidden_states"][0], ref["/latents.init/0000/out"][0]),
          "(2) the denoiser's first input is the injected latents (replaced before use)")
    m = manifest(j("inj.h5"))["inject"]
    check(m["status"] == "ok" and m["reference"] == j("ref.h5") and m["injected"] == 5 and m["selected"] == 5
          and sorted(m["globs"]) == sorted("/%s/*" % r for r in ROOTS),
          f"(2) manifest inject: ok, 5 of 5, globs of the root components ({m.get('globs')})")
    check(sorted((e["path"], e["reference_hash"]) for e in m["tensors"]) ==
          sorted((k, ref[k][1]) for k in roots_ref), "(2) manifest lists each injected path with the reference's hash")
    check(np.array_equal(np.load(j("inj.npy")), np.load(j("ref.npy"))),
          "(2) the pipeline's own video equals the reference's bit for bit")
    rc, doc, err = compare(j("ref.h5"), j("inj.h5"), "--expect-identical")
    check(rc == 0 and doc.get("verdict") == "pass" and doc.get("same_experiment") is True
          and all(t["identical"] and t["verdict"] == "pass" for t in doc["tensors"])
          and len(doc["tensors"]) == len(ref), f"(2) refactor + inject: T1 pass, all {len(ref)} tensors identical")
    check(all(np.array_equal(inj[k][0], ref[k][0]) for k in ref) and set(inj) == set(ref),
          "(2) h5py: every dataset of the candidate equals the reference's")
    rc, doc, err = compare(j("ref.h5"), j("inj.h5"))
    check(rc == 1 and doc.get("feature_not_active") is True,
          "(2) without --expect-identical the identical refactor is 'feature not active'")

    # (3) replay: isolate the perturbed denoiser
    p = probe_run(j("pert.h5"), label="perturb", pipe_args=["--feature", "perturb-denoiser"])
    p2 = probe_run(j("iso.h5"), "--replay", j("ref.h5"), label="perturb-isolated",
                   pipe_args=["--feature", "perturb-denoiser"])
    check(p.returncode == 0 and p2.returncode == 0 and probe_lines(p2.stderr) == [],
          "(3) perturbed and replayed runs exit 0, no probe: lines")
    pert, iso = datasets(j("pert.h5")), datasets(j("iso.h5"))
    ins = sorted(k for k in ref if k.split("/")[3].startswith("in."))
    check(all(np.array_equal(iso[k][0], ref[k][0]) for k in ins),
          f"(3) all {len(ins)} component inputs of the isolated run are the reference's")
    mi = manifest(j("iso.h5"))["inject"]
    check(mi["status"] == "ok" and mi["injected"] == len(ins) and mi["globs"] == ["/*/*/in.*"],
          f"(3) manifest: {mi['injected']} of {len(ins)} inputs injected")
    # The perturbed denoiser, rebuilt here, on the reference's recorded inputs.
    sys.path.insert(0, os.path.dirname(TOY))
    import torch  # noqa: E402
    import toy_pipeline  # noqa: E402
    torch.set_num_threads(1)
    pipe = toy_pipeline.ToyVideoPipeline(weight_seed=0, feature="perturb-denoiser")
    bad = []
    with torch.no_grad():
        for k in range(4):
            base = "/dit.step/%04d/" % k
            out = pipe.transformer(torch.from_numpy(ref[base + "in.hidden_states"][0]),
                                   torch.from_numpy(ref[base + "in.timestep"][0]),
                                   torch.from_numpy(ref[base + "in.encoder_hidden_states"][0])).sample
            if not np.array_equal(out.numpy(), iso[base + "out.sample"][0]):
                bad.append(base)
    check(not bad, f"(3) isolated denoiser outputs == perturbed denoiser(reference inputs), bit-exact; differ: {bad}")
    rc, doc, err = compare(j("ref.h5"), j("pert.h5"), "--isolated", j("iso.h5"))
    check(rc == 1 and doc.get("isolated") == j("iso.h5"), f"(3) probe-compare --isolated: exit 1 (T1 fails), got {rc}")
    by = {t["path"]: t for t in doc.get("tensors", [])}
    bad = []
    for path, t in by.items():
        want_iso = rel_l2(ref[path][0], iso[path][0]) if np.any(ref[path][0]) else 0.0
        want_run = rel_l2(ref[path][0], pert[path][0]) if np.any(ref[path][0]) else 0.0
        got = t.get("rel_l2_isolated")
        if got is None or abs(got - want_iso) > 1e-12 * max(1.0, want_iso):
            bad.append(f"{path}: rel_l2_isolated {got} != {want_iso}")
        amp = t.get("amplification")
        if want_iso > 0:
            if amp is None or abs(amp - want_run / want_iso) > 1e-9 * (want_run / want_iso):
                bad.append(f"{path}: amplification {amp} != {want_run / want_iso}")
        elif amp is not None:
            bad.append(f"{path}: amplification {amp} where the isolated error is 0 (want null)")
    check(not bad, f"(3) rel_l2_isolated and amplification of {len(by)} tensors equal numpy's; {bad[:4]}")
    dit = [by[k]["rel_l2_isolated"] for k in by if k.startswith("/dit.step/") and "/out" in k]
    down = [by[k]["rel_l2_isolated"] for k in by if k.split("/")[1] in ("scheduler.step", "vae.decode", "text_encoder")
            and "/out" in k]
    down_run = [by[k]["rel_l2"] for k in by if k.split("/")[1] in ("scheduler.step", "vae.decode") and "/out" in k]
    check(len(dit) == 4 and all(x > 1e-4 for x in dit), f"(3) the perturbed denoiser's isolated error is nonzero: {dit}")
    check(len(down) == 5 and all(x == 0.0 for x in down) and all(x > 0 for x in down_run),
          f"(3) downstream (scheduler, VAE) and text encoder: isolated 0.0, as run > 0 ({down_run})")
    p = run([os.path.join(BUILD, "bin", "probe-compare"), j("ref.h5"), j("pert.h5"), "--isolated", j("iso.h5")])
    check("rel_l2 iso" in p.stdout and "amplification" in p.stdout and "/scheduler.step/0000/out.prev_sample" in p.stdout,
          "(3) the terminal shows the isolation table")
    # --only dit.step
    p = probe_run(j("only.h5"), "--replay", j("ref.h5"), "--only", "dit.step", pipe_args=["--feature", "perturb-denoiser"])
    mo = manifest(j("only.h5"))["inject"]
    want = sorted(k for k in ins if k.startswith("/dit.step/"))
    check(p.returncode == 0 and mo["status"] == "ok" and sorted(e["path"] for e in mo["tensors"]) == want,
          f"(3) --only dit.step injects exactly the {len(want)} denoiser inputs")

    # (4) bad input
    p = probe_run(j("shape.h5"), "--inject", j("ref.h5"), pipe_args=["--frames", "3"])
    lines = probe_lines(p.stderr)
    ms = manifest(j("shape.h5"))["inject"]
    check(p.returncode == 0 and len(lines) == 1 and "/latents.init/0000/out: shape mismatch: reference "
          "[1, 4, 2, 8, 8], candidate [1, 4, 3, 8, 8]" in lines[0], f"(4) shape mismatch: one probe: line naming the path {lines}")
    check(ms["status"] == "failed" and "/latents.init/0000/out" in ms["error"]
          and [e["path"] for e in ms["tensors"]] == ["/prompt_embeds/0000/out", "/prompt_embeds/0001/out"],
          "(4) manifest failed; only the tensors before the failure were injected, none after")
    rc, doc, err = compare(j("ref.h5"), j("shape.h5"))
    check(rc == 1 and doc.get("inject_failed", {}).get("candidate") is True
          and any(r.startswith("injection failed in the candidate run: /latents.init/0000/out: shape mismatch")
                  for r in doc.get("reasons", [])), "(4) probe-compare refuses the candidate (exit 1, reason)")
    # dtype: the bf16 denoiser's output is bfloat16 in its reference
    p = probe_run(j("bf16.h5"), pipe_args=["--feature", "bf16-denoiser"])
    p = probe_run(j("dtype.h5"), "--inject", j("bf16.h5") + ":/dit.step/0000/out.sample")
    lines = probe_lines(p.stderr)
    check(len(lines) == 1 and "/dit.step/0000/out.sample: dtype mismatch: reference bfloat16, candidate float32" in lines[0]
          and manifest(j("dtype.h5"))["inject"]["status"] == "failed", f"(4) dtype mismatch named {lines}")
    # count: more calls than the reference, fewer calls
    p = probe_run(j("more.h5"), "--replay", j("ref.h5"), "--only", "dit.step", pipe_args=["--steps", "3"])
    mm = manifest(j("more.h5"))["inject"]
    check(p.returncode == 0 and mm["status"] == "failed" and (mm["error"] or "").startswith("/dit.step/0004/in.")
          and "not in the reference" in mm["error"] and len(mm["tensors"]) == 12,
          f"(4) more calls: {mm['error']!r}, the 12 reference inputs injected before it")
    p = probe_run(j("fewer.h5"), "--replay", j("ref.h5"), "--only", "scheduler.step", pipe_args=["--steps", "1"])
    mf = manifest(j("fewer.h5"))["inject"]
    lines = probe_lines(p.stderr)
    check(mf["status"] == "failed" and "count mismatch: 3 tensor(s)" in mf["error"]
          and "/scheduler.step/0001/in.model_output" in mf["error"] and len(lines) == 1,
          f"(4) fewer calls: count mismatch at exit names the first missed path: {mf['error']!r}")
    rc, doc, err = compare(j("ref.h5"), j("fewer.h5"))
    check(rc == 1 and any("injection failed in the candidate run: count mismatch" in r for r in doc.get("reasons", [])),
          "(4) probe-compare refuses the fewer-calls candidate")
    # missing reference, glob matching nothing, option errors
    marker = j("ran")
    r = run([os.path.join(BUILD, "bin", "probe-run"), "--out", j("x.h5"), "--inject", j("nosuch.h5"), "--",
             "touch", marker])
    check(r.returncode == 2 and "nosuch.h5" in r.stderr and "does not exist" in r.stderr and not os.path.exists(marker),
          "(4) missing reference: exit 2 naming the file, command not run")
    with open(j("text.h5"), "w") as fh:
        fh.write("not hdf5")
    open(j("empty.h5"), "w").close()
    for opt, f, why in (("--inject", "text.h5", "is not an HDF5 file (no HDF5 signature)"),
                        ("--replay", "text.h5", "is not an HDF5 file (no HDF5 signature)"),
                        ("--inject", "empty.h5", "is empty (not a capture file)")):
        r = run([os.path.join(BUILD, "bin", "probe-run"), "--out", j("x.h5"), opt, j(f), "--",
                 "touch", marker])
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        check(r.returncode == 2 and len(lines) == 1 and why in lines[0] and not os.path.exists(marker),
              "(4) %s %s: exit 2 before the run, one line (%r)" % (opt, f, lines))
    p = probe_run(j("glob.h5"), "--inject", j("ref.h5") + ":/nosuch/*")
    lines = probe_lines(p.stderr)
    mg = manifest(j("glob.h5"))["inject"]
    check(p.returncode == 0 and len(lines) == 1 and "glob '/nosuch/*' matches no tensor" in lines[0]
          and mg["status"] == "ok" and mg["injected"] == 0 and "/nosuch/*" in (mg["warning"] or ""),
          "(4) a glob that matches nothing: one warning, recorded, nothing injected")
    for opts, what in ((["--only", "dit.step"], "--only needs --replay"),
                       (["--replay", j("ref.h5"), "--only", "nosuch"], "unknown component"),
                       (["--inject", j("ref.h5") + ":"], "empty GLOB")):
        r = run([os.path.join(BUILD, "bin", "probe-run"), "--out", j("y.h5")] + opts + ["--", "touch", marker])
        check(r.returncode == 2 and what in r.stderr and not os.path.exists(marker), f"(4) probe-run {opts}: exit 2, {what!r}")
    before = open(j("ref.h5"), "rb").read()
    r = run([os.path.join(BUILD, "bin", "probe-run"), "--out", j("ref.h5"), "--inject", j("ref.h5"), "--", "true"])
    check(r.returncode == 2 and "refusing to overwrite" in r.stderr and open(j("ref.h5"), "rb").read() == before,
          "(4) --out naming the reference: exit 2, reference untouched")
    rc, doc, err = compare(j("ref.h5"), j("pert.h5"), "--isolated", j("s1.h5"))
    check(rc == 1 and any("is not a complete replay of the reference" in x for x in doc.get("reasons", [])),
          "(4) --isolated with a run that was not replayed: exit 1 with the reason")
    rc, doc, err = compare(j("ref.h5"), j("pert.h5"), "--isolated", j("nosuch.h5"))
    check(rc == 2 and "nosuch.h5" in err, "(4) --isolated with a missing file: exit 2 naming it")

    # (5) the scheduler configuration is a root input
    p = probe_run(j("shift.h5"), "--inject", j("ref.h5") + ":/latents.init/*", pipe_args=["--scheduler-shift", "2.0"])
    rc, doc, err = compare(j("ref.h5"), j("shift.h5"), "--allow-root-diff", "/timesteps/*")
    diff = {r["path"]: r for r in doc.get("root_inputs") or [] if not r["same"]}
    check(rc == 1 and diff.get("manifest:scheduler", {}).get("allowed") is False
          and all(diff[k]["allowed"] for k in diff if k.startswith("/timesteps/")) and len(diff) == 3,
          f"(5) another scheduler shift: timesteps allowed by path, the scheduler configuration still differs {sorted(diff)}")
    rc, doc, err = compare(j("ref.h5"), j("shift.h5"), "--allow-root-diff", "timesteps", "--allow-root-diff",
                           "scheduler", "--only", "/timesteps/*")
    check(doc.get("same_experiment") is True and all(r["same"] or r["allowed"] for r in doc["root_inputs"]),
          "(5) --allow-root-diff by component name (timesteps, scheduler): the same experiment")

    # (6) host injection honours strides (tap ABI through ctypes, no adapter)
    prog = j("strided.py")
    with open(prog, "w") as fh:
        fh.write(STRIDED)
    env = dict(os.environ)
    p = run([os.path.join(BUILD, "bin", "probe-run"), "--out", j("sref.h5"), "--", PY, prog, "write"], env=env)
    p2 = run([os.path.join(BUILD, "bin", "probe-run"), "--out", j("scand.h5"), "--inject", j("sref.h5") + ":/x/*",
              "--", PY, prog, "inject"], env=env)
    check(p.returncode == 0 and p2.returncode == 0 and "strided: ok" in p2.stdout,
          f"(6) transposed and sliced host destinations receive the reference's values ({p2.stdout.strip()})")

    # (8) --convert: a float32 reference into the bf16 denoiser's output (RNE, as torch)
    p = probe_run(j("conv.h5"), "--inject", j("ref.h5") + ":/dit.step/0000/out.sample", "--convert",
                  pipe_args=["--feature", "bf16-denoiser"])
    conv = datasets(j("conv.h5"))
    mc = manifest(j("conv.h5"))["inject"]
    want = torch.from_numpy(ref["/dit.step/0000/out.sample"][0]).to(torch.bfloat16).float().numpy()
    check(p.returncode == 0 and mc["status"] == "ok" and mc["convert"] is True
          and mc["tensors"] == [{"path": "/dit.step/0000/out.sample", "reference_hash":
                                 ref["/dit.step/0000/out.sample"][1], "converted_from": "float32"}],
          "(8) --convert: injected, recorded as converted from float32")
    check(conv["/dit.step/0000/out.sample"][2] == "bfloat16"
          and np.array_equal(conv["/dit.step/0000/out.sample"][0], want),
          "(8) the bf16 tensor holds torch's round-to-nearest-even of the float32 reference")
    p = probe_run(j("noconv.h5"), "--inject", j("ref.h5") + ":/dit.step/0000/out.sample",
                  pipe_args=["--feature", "bf16-denoiser"])
    check(any("dtype mismatch: reference float32, candidate bfloat16 (probe-run --convert" in l
              for l in probe_lines(p.stderr)), "(8) without --convert: dtype mismatch, pointing at --convert")

    # (7) manifests side by side
    rc, doc, err = compare(j("ref.h5"), j("inj.h5"), "--expect-identical")
    mr, mc = doc.get("manifests", {}).get("reference", {}), doc.get("manifests", {}).get("candidate", {})
    check(mr.get("label") == "ref" and mc.get("label") == "seed1-injected" and "--seed" in mc.get("command", [])
          and mc.get("inject", {}).get("status") == "ok" and mr.get("scheduler") == mc.get("scheduler")
          and mr.get("dtypes", {}).get("outputs", {}).get("dit.step") == "float32",
          "(7) JSON manifests: both labels, commands, dtypes, scheduler, injection")
    r = run([os.path.join(BUILD, "bin", "probe-compare"), j("ref.h5"), j("inj.h5"), "--expect-identical",
             "--html", j("r.html")])
    html = open(j("r.html")).read()
    check("runs (from each file's manifest" in r.stdout and "seed1-injected" in r.stdout
          and 'id="runs"' in html and '"seed1-injected"' in html, "(7) terminal and HTML show both runs")

    # (7) the HTML report, rendered by headless Chromium (its scripts draw the tables)
    r = run([os.path.join(BUILD, "bin", "probe-compare"), j("ref.h5"), j("pert.h5"), "--isolated", j("iso.h5"),
             "--html", j("iso.html"), "--json", j("iso.json")])
    doc = json.load(open(j("iso.json")))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if check(chromium is not None, "(7) chromium found (scripts/setup installs it)"):
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
        p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                            "--user-data-dir=" + j("profile"), "--dump-dom", "file://" + j("iso.html")],
                           capture_output=True, text=True, timeout=120, env=env)
        dom = p.stdout
        runs = re.findall(r'<tr class="run-row" data-key="([^"]+)"[^>]*>(.*?)</tr>', dom)
        label = [row for key, row in runs if key == "label"]
        check(label and ">ref<" in label[0] and ">perturb<" in label[0],
              "(7) rendered runs table: the label row shows both labels")
        check(len(re.findall(r'<tr class="root-row"', dom)) == len(doc["root_inputs"]) > 0,
              "(7) rendered root-inputs table: one row per root input (%d)" % len(doc["root_inputs"]))
        iso_rows = dict(re.findall(r'<tr class="iso-row" data-path="([^"]+)"[^>]*>(.*?)</tr>', dom))
        outs = [t for t in doc["tensors"] if t["path"].split("/")[3].startswith("out")]
        amp = next(t for t in outs if t["path"] == "/dit.step/0002/out.sample")["amplification"]
        check(len(iso_rows) == len(outs) and ("<td>%s</td>" % ("%#.4g" % amp)) in iso_rows["/dit.step/0002/out.sample"]
              and "<td>n/a</td>" in iso_rows["/vae.decode/0000/out.sample"],
              "(7) rendered isolation table: %d output rows, the denoiser's amplification %#.4g, the VAE's n/a"
              % (len(outs), amp))

    if FAILURES:
        print("\n%d check(s) failed" % len(FAILURES))
        return 1
    print("\nall checks passed")
    return 0


# A program that taps (write) or injects (inject) through the ABI directly:
# the reference holds a 3x4 float32 and a 5-element int16; the candidate's
# destinations are a transposed view and a strided slice of bigger buffers.
STRIDED = r'''
import ctypes, sys
import numpy as np
sys.path.insert(0, __import__("os").environ["PYTHONPATH"].split(":")[0])
from probe_adapter import _abi
lib = ctypes.CDLL(None)
lib.probe_tap_v1.argtypes = lib.probe_inject_v1.argtypes = [ctypes.POINTER(_abi.ProbeTapTensorV1)]

def desc(comp, slot, arr, code):
    shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
    strides = (ctypes.c_int64 * arr.ndim)(*[s // arr.itemsize for s in arr.strides])
    return _abi.ProbeTapTensorV1(struct_size=ctypes.sizeof(_abi.ProbeTapTensorV1), abi_version=1,
        component=comp.encode(), slot=slot.encode(), call=0, step=-1, cfg_branch=-1, device=-1,
        dtype=code, rank=arr.ndim, shape=shape, strides=strides, data=arr.ctypes.data, stream=None,
        timestep=float("nan"))

a = np.arange(12, dtype=np.float32).reshape(3, 4) * 1.5 - 4
b = np.array([7, -3, 12, 0, 31000], dtype=np.int16)
if sys.argv[1] == "write":
    assert lib.probe_tap_v1(ctypes.byref(desc("x", "out.a", a, 12))) == 0
    assert lib.probe_tap_v1(ctypes.byref(desc("x", "out.b", b, 3))) == 0
else:
    big = np.zeros((4, 3), dtype=np.float32)
    da = big.T                      # 3x4 view with strides (1, 3)
    bb = np.full(12, 99, dtype=np.int16)
    db = bb[1:11:2]                 # offset 1, stride 2
    ra = lib.probe_inject_v1(ctypes.byref(desc("x", "out.a", da, 12)))
    rb = lib.probe_inject_v1(ctypes.byref(desc("x", "out.b", db, 3)))
    untouched = np.all(bb[0::2] == 99) and bb[11] == 99
    ok = ra == 1 and rb == 1 and np.array_equal(da, a) and np.array_equal(db, b) and untouched
    print("strided: %s (rc %d %d)" % ("ok" if ok else "WRONG", ra, rb))
    assert lib.probe_tap_v1(ctypes.byref(desc("x", "out.a", da, 12))) == 0
    assert lib.probe_tap_v1(ctypes.byref(desc("x", "out.b", db, 3))) == 0
'''

if __name__ == "__main__":
    sys.exit(main())
