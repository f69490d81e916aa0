"""probe-compare's kernel-path evidence (probe/compare/kernel_diff.c, docs/kernels.md):
the kernels only one run launched, per component (text and JSON "kernels"),
and --expect-kernel as the feature-active check, on files written by h5py
whose manifests carry hand-written "kernels" objects. Exit codes: 0 pass,
1 feature not active (verdict fail, feature_active false, the reason named),
2 with one line when the candidate has no kernel log or the option/log is bad.
"""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
failures = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run([COMPARE, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def write(path, tensors, manifest):
    with h5py.File(path, "w") as f:
        for k, v in tensors.items():
            f.create_dataset(k, data=v)
        if manifest is not None:
            f.attrs["probe.manifest"] = json.dumps(manifest)


FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4> >(Flash_fwd_params)"
MATH = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(float*, float const*, int)"
REF_K = {"(none)": {"launches": 3, "by_name": {"elementwise_kernel": 3}, "unnamed_launches": 0},
         "dit.step": {"launches": 32, "by_name": {MATH: 10, "gemm_bf16": 20, "shared": 2},
                      "unnamed_launches": 0}}
CAND_K = {"(none)": {"launches": 3, "by_name": {"elementwise_kernel": 3}, "unnamed_launches": 0},
          "dit.step": {"launches": 32, "by_name": {FLASH: 10, "gemm_bf16": 20, "shared": 2},
                       "unnamed_launches": 0},
          "vae.decode": {"launches": 8, "by_name": {"triton_poi_fused_%d" % i: 1 for i in range(8)},
                         "unnamed_launches": 0}}


def main():
    d = tempfile.mkdtemp(prefix="probe-kcompare-")
    j = lambda n: os.path.join(d, n)  # noqa: E731
    rng = np.random.default_rng(5)
    ref = {"/dit.step/0000/out": rng.standard_normal((4, 16)), "/vae.decode/0000/out": rng.standard_normal(32)}
    cand = {k: v * (1 + 1e-12) for k, v in ref.items()}  # differs (feature active), passes T1
    write(j("ref.h5"), ref, {"format": "probe-manifest", "kernels": REF_K})
    write(j("cand.h5"), cand, {"format": "probe-manifest", "kernels": CAND_K})
    write(j("cand_nolog.h5"), cand, {"format": "probe-manifest"})
    write(j("cand_bad.h5"), cand, {"format": "probe-manifest", "kernels": {"dit.step": {"by_name": {"k": -1}}}})
    write(j("ref_copy.h5"), ref, {"format": "probe-manifest", "kernels": CAND_K})

    # 1. the diff, text and JSON
    rc, out, err = run(j("ref.h5"), j("cand.h5"), "--json", j("r.json"))
    print(out, err)
    check(rc == 0, "kernel logs differ, tensors pass: exit 0 (rc=%d)" % rc)
    doc = json.load(open(j("r.json")))
    want = {"(none)": {"only_candidate": {}, "only_reference": {}},
            "dit.step": {"only_candidate": {FLASH: 10}, "only_reference": {MATH: 10}},
            "vae.decode": {"only_candidate": {"triton_poi_fused_%d" % i: 1 for i in range(8)},
                           "only_reference": {}}}
    check(doc.get("kernels") == want, "JSON kernels: per component, only_candidate / only_reference with counts")
    check(doc["verdict"] == "pass" and doc["feature_active"] is True, "JSON verdict pass, feature_active")
    check("expect_kernel" not in doc, "no expect_kernel key without --expect-kernel")
    check("+ " + FLASH + "  x10" in out and "- " + MATH[:60] in out,
          "text: + the flash kernel, - the math kernel")
    check("vae.decode (launches: reference 0, candidate 8)" in out, "text: component header with launch counts")
    check("(3 more: --kernels lists them all)" in out and out.count("+ triton_poi_fused_") == 5,
          "text: 5 names per side, the rest counted")
    rc, out, err = run(j("ref.h5"), j("cand.h5"), "--kernels")
    check(rc == 0 and out.count("+ triton_poi_fused_") == 8 and "more: --kernels" not in out,
          "--kernels lists all 8")
    check("elementwise_kernel" not in out, "a kernel both runs launched is not listed")

    # 2. --expect-kernel
    def expect(*globs, cand_file="cand.h5", ref_file="ref.h5"):
        args = [j(ref_file), j(cand_file), "--json", "-"]
        for g in globs:
            args += ["--expect-kernel", g]
        rc, out, err = run(*args)
        return rc, (json.loads(out) if rc in (0, 1) else None), err

    rc, doc, err = expect("*flash_fwd*")
    check(rc == 0 and doc["expect_kernel"] == [{"expect": "*flash_fwd*", "matched": True, "kernels": 1,
                                                "first": FLASH}],
          "--expect-kernel '*flash_fwd*': exit 0, matched (rc=%d)" % rc)
    rc, doc, err = expect("dit.step:*flash*")
    check(rc == 0 and doc["expect_kernel"][0]["matched"], "COMPONENT:GLOB in the right component: exit 0")
    rc, doc, err = expect("*pytorch_flash::flash_fwd*")
    check(rc == 0 and doc["expect_kernel"][0]["kernels"] == 1,
          "a glob with '::' is a glob over every component, not COMPONENT:GLOB")
    rc, doc, err = expect("triton_*")
    check(rc == 0 and doc["expect_kernel"][0]["kernels"] == 8, "triton_* matches the 8 Triton kernels")
    reason = "feature not active: the candidate launched no kernel matching --expect-kernel 'vae.decode:*flash*'"
    rc, doc, err = expect("vae.decode:*flash*")
    check(rc == 1 and doc["verdict"] == "fail" and doc["feature_active"] is False and
          doc["feature_not_active"] is True and doc["reasons"] == [reason],
          "COMPONENT:GLOB in another component: exit 1, feature not active, the reason (rc=%d)" % rc)
    check(reason in err and "FAIL:" in err, "the reason and FAIL on the terminal")
    rc, doc, err = expect("*flash*", "*cutlass*")
    check(rc == 1 and doc["expect_kernel"][1] == {"expect": "*cutlass*", "matched": False, "kernels": 0,
                                                  "first": None},
          "every --expect-kernel must match: one missing fails (rc=%d)" % rc)
    rc, doc, err = expect("*flash*", ref_file="ref.h5", cand_file="ref_copy.h5")
    check(rc == 1 and doc["feature_not_active"] is True,
          "expected kernel ran but the tensors are identical: still feature not active (rc=%d)" % rc)
    rc, doc, err = expect("*flash*", cand_file="cand_nolog.h5")
    check(rc == 2 and len(err.strip().splitlines()) == 1 and "no" in err and "kernel log" in err,
          "candidate without a kernel log: exit 2, one line: %r" % err.strip())
    rc, out, err = run(j("ref.h5"), j("cand_nolog.h5"))
    check(rc == 0 and "kernels: only the reference logged kernel launches" in out,
          "without --expect-kernel a missing log is only noted (rc=%d)" % rc)
    rc, doc, err = expect("*", cand_file="cand_bad.h5")
    check(rc == 2 and len(err.strip().splitlines()) == 1 and "candidate manifest" in err,
          "a malformed kernels object: exit 2, one line: %r" % err.strip())
    rc, out, err = run(j("ref.h5"), j("cand_bad.h5"))
    check(rc == 0 and "note: ignoring the kernel log" in err and "kernels" not in out.split("root inputs")[-1],
          "a malformed kernels object without --expect-kernel: noted, not used, exit 0 (rc=%d)" % rc)
    write(j("ref_empty.h5"), ref, {"format": "probe-manifest", "kernels": {}})
    write(j("cand_empty.h5"), cand, {"format": "probe-manifest", "kernels": {}})
    rc, out, err = run(j("ref_empty.h5"), j("cand_empty.h5"))
    check(rc == 0 and "kernel" not in out.split("root inputs")[-1],
          "both kernel logs empty (a CPU run): the text says nothing about kernels (rc=%d)" % rc)
    rc, out, err = run(j("ref.h5"), j("cand.h5"), "--expect-kernel", "")
    check(rc == 2 and len(err.strip().splitlines()) == 1, "--expect-kernel '': exit 2")
    rc, out, err = run(j("ref.h5"), j("cand.h5"), "--expect-kernel", "dit.step:")
    check(rc == 2 and "empty GLOB" in err, "--expect-kernel 'dit.step:': exit 2, empty GLOB")

    # 3. HTML carries the same keys
    rc, out, err = run(j("ref.h5"), j("cand.h5"), "--expect-kernel", "*flash*", "--html", j("r.html"))
    html = open(j("r.html")).read()
    check(rc == 0 and '"kernels": {' in html and '"expect_kernel": [' in html, "HTML report data has the keys")

    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
