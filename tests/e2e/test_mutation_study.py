"""The quick mutation study on the CPU (bench/mutation/study.py --quick: the real
diffusers WanPipeline of the probe venv in bfloat16, 4 blocks captured as dit.block,
a float32 oracle, two transparent features and six planted bugs), and the claims
docs/mutation.md makes from it:

- the reference repeat is bit-identical (the determinism floor is 0);
- T1 fails every transparent feature that is not identical to the reference (why
  a bf16 verdict needs more than the gate), the oracle verdict fails none;
- the oracle verdict detects every bug of the quick set, names a bug planted in
  block 1 at /dit.block/0001 (block 1 of the first dit.step call) and the timestep
  bug at /dit.step/0000, whose input it changes;
- the embedded toy pipeline in float32 (scripts/example, --blocks): its transparent
  chunked attention passes T1 and the systematic test in every tensor, its planted
  attention-scale bug fails and is introduced by /dit.block/0000.

Skipped (77) when the venv of scripts/setup ($PROBE_VENV, default
~/.cache/probe-venv) has no torch/diffusers.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import BUILD, check, finish, need_build, diffusers_venv_python  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    need_build()
    build = os.path.abspath(BUILD)
    py = diffusers_venv_python()
    out = tempfile.mkdtemp(prefix="probe-mutation-")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "mutation", "study.py"), "--python", py,
                        "--bin", os.path.join(build, "bin"), "--device", "cpu", "--size", "128",
                        "--frames", "17", "--steps", "4", "--layers", "4", "--blocks", "--quick",
                        "--jobs", "2", "--out", out], capture_output=True, text=True, timeout=3000)
    print(p.stdout[-4000:])
    if p.returncode != 0:
        print(p.stderr[-3000:])
    check(p.returncode == 0, "the study ran (exit %d)" % p.returncode)
    if p.returncode != 0:
        return finish()
    s = json.load(open(os.path.join(out, "study.json")))
    rows = {r["name"]: r for r in s["rows"]}
    check(rows["ref2"]["identical"], "the reference repeat is bit-identical")
    tr = [r for r in s["rows"] if r["kind"] == "transparent" and not r["identical"]]
    check(len(tr) >= 1, "a transparent feature differs from the reference: %s" % [r["what"] for r in tr])
    for r in tr:
        check(r["verdicts"]["T1"]["fail"], "T1 fails %s (bf16 rounding)" % r["what"])
        check(not r["verdicts"]["oracle"]["fail"], "no false alarm of the oracle verdict on %s: %s"
              % (r["what"], r["verdicts"]["oracle"]["reason"]))
    for r in (x for x in s["rows"] if x["kind"] == "bug"):
        v = r["verdicts"]["oracle"]
        check(v["fail"], "the oracle verdict detects %s" % r["what"])
        check(v["introduced"] == r["named_at"], "%s is named at %s (got %s)"
              % (r["what"], r["named_at"], v["introduced"]))
    toy(build, out)
    return finish()


def toy(build, out):
    run, cmp = os.path.join(build, "bin", "probe-run"), os.path.join(build, "bin", "probe-compare")
    prog = [os.environ.get("PROBE_PYTHON") or sys.executable,
            os.path.join(ROOT, "scripts", "example", "toy_pipeline.py"), "--steps", "3", "--frames", "4",
            "--height", "32", "--width", "48"]
    for f in ("none", "chunked-attention", "perturb-denoiser"):
        inject = [] if f == "none" else ["--inject", os.path.join(out, "toy-none.h5")]
        p = subprocess.run([run, "--out", os.path.join(out, "toy-%s.h5" % f), "--blocks", *inject, "--",
                            *prog, "--feature", f], capture_output=True, text=True, timeout=600)
        check(p.returncode == 0, "toy pipeline %s under probe-run (exit %d: %s)" % (f, p.returncode, p.stderr[-300:]))
    res = {}
    for f in ("chunked-attention", "perturb-denoiser"):
        js = os.path.join(out, "toy-%s.json" % f)
        p = subprocess.run([cmp, os.path.join(out, "toy-none.h5"), os.path.join(out, "toy-%s.h5" % f),
                            "--json", js, "--quiet"], capture_output=True, text=True)
        res[f] = (p.returncode, json.load(open(js)) if os.path.exists(js) else None)
    rc, j = res["chunked-attention"]
    check(rc == 0 and j and j["headline"] == "gate+systematic" and
          all(t["verdict"] == "pass" for t in j["tensors"]),
          "toy fp32 chunked attention: T1 and the systematic test pass every tensor (rc=%d)" % rc)
    rc, j = res["perturb-denoiser"]
    check(rc == 1 and j and (j.get("introduced") or {}).get("call") == "/dit.block/0000",
          "toy attention-scale bug: introduced by /dit.block/0000 (%s)" % ((j or {}).get("introduced")))


if __name__ == "__main__":
    sys.exit(main())
