"""The worked example tests/pytest/test_wan_parity.py, run by pytest under
the venv of scripts/setup (torch 2.11 + diffusers; $PROBE_VENV, default
~/.cache/probe-venv). Exit 77 (skipped) with the reason when the venv, its
diffusers or its pytest is missing.

pytest runs in a fresh folder with PROBE_BUILD_DIR (probe from the build
tree), PROBE_PAIR_DEVICE=cpu unless PROBE_PAIR_DEVICE is set, and
PROBE_PAIR_STATS (the session records of every pair). Asserted:
  * pytest exits 0, and its JUnit report lists every test of the file for
    the device (cpu: 6; cuda: 12) with no failure, error or skip;
  * the records hold, per case, the component and feature the test
    declares, the slot the capture names ("out" for dit.block, "out.sample"
    for dit.step), verdict pass, and element types float32/float32 for the
    backend swap on the CPU, float32/bfloat16 for the fp32 oracle;
  * the backend swap on the CPU is not bit-identical (rel_l2 > 0) and within
    T1 (rel_l2 <= 1e-2); bf16 against the oracle is within the calibration
    file's rel_l2_max;
  * the complete example of docs/pairing.md, taken from the page, passes its
    3 tests under pytest.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import check, finish, need_build, reexec_in_diffusers_venv  # noqa: E402

FLAG = "PROBE_PYTEST_WAN_IN_VENV"


def main():
    need_build()
    reexec_in_diffusers_venv(FLAG)
    build = os.path.abspath(os.environ["PROBE_BUILD_DIR"])
    src = os.path.abspath(os.environ.get("PROBE_SOURCE_DIR")
                          or os.path.join(os.path.dirname(__file__), "..", ".."))
    r = subprocess.run([sys.executable, "-c", "import pytest"], capture_output=True, text=True)
    if r.returncode != 0:
        print("SKIP: the venv's python %s has no pytest (pip install pytest)" % sys.executable)
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="probe-pytest-wan-")
    stats = os.path.join(tmp, "stats.jsonl")
    junit = os.path.join(tmp, "junit.xml")
    device = os.environ.get("PROBE_PAIR_DEVICE") or "cpu"
    env = dict(os.environ, PROBE_BUILD_DIR=build, PROBE_PAIR_STATS=stats, PROBE_PAIR_DEVICE=device)
    env.pop("PROBE_OUT", None)
    test = os.path.join(src, "tests", "pytest", "test_wan_parity.py")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider",
                        "--junitxml", junit], cwd=tmp, env=env, capture_output=True, text=True,
                       timeout=600)
    print(p.stdout[-4000:])
    print(p.stderr[-2000:])
    print("pytest took %.1f s" % (time.time() - t0))
    check(p.returncode == 0, "pytest exits 0 (exit %d)" % p.returncode)
    want = 7 if device == "cpu" else 15
    try:
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    except (OSError, ET.ParseError) as e:
        counts = {"error": str(e)}
    check(counts == {"tests": want, "failures": 0, "errors": 0, "skipped": 0},
          "JUnit: %d tests, none failed, errored or skipped (%s)" % (want, counts))

    recs = []
    if os.path.exists(stats):
        with open(stats) as fh:
            recs = [json.loads(line) for line in fh if line.strip()]
    by_test = {}
    for rec in recs:
        by_test.setdefault(rec["test"].split("::", 1)[-1], []).append(rec)
    print("records: %s" % sorted(by_test))
    with open(os.path.join(src, "tests", "pytest", "wan_bf16_calibration.json")) as fh:
        cal = json.load(fh)["components"]
    backend = "native" if device == "cpu" else "_native_flash"
    cases = [
        ("test_block_attention_backend[%s]" % backend, "dit.block", "attn:" + backend, "out"),
        ("test_dit_step_attention_backend[%s]" % backend, "dit.step", "attn:" + backend, "out.sample"),
        ("test_block_bf16_against_fp32_oracle", "dit.block", "bf16", "out"),
        ("test_dit_step_bf16_against_fp32_oracle", "dit.step", "bf16", "out.sample"),
    ]
    for name, component, feature, slot in cases:
        got = by_test.get(name, [])
        check(len(got) == 1, "%s: one record (%d)" % (name, len(got)))
        if len(got) != 1:
            continue
        s = got[0]
        check((s["component"], s["feature"], s["slot"], s["verdict"]) == (component, feature, slot, "pass"),
              "%s: component %s, feature %s, slot %s, verdict %s" % (name, s["component"], s["feature"],
                                                                     s["slot"], s["verdict"]))
        check(s["arch"] == "cpu" if device == "cpu" else s["arch"].startswith("sm_"),
              "%s: arch %s" % (name, s["arch"]))
        if feature == "bf16":
            check((s["dtype"], s["dtype_candidate"]) == ("float32", "bfloat16"),
                  "%s: the oracle is float32, the candidate bfloat16 (%s/%s)"
                  % (name, s["dtype"], s["dtype_candidate"]))
            check(0 < s["rel_l2"] <= cal[component]["rel_l2_max"],
                  "%s: 0 < rel_l2 %.4g <= calibrated %.4g" % (name, s["rel_l2"], cal[component]["rel_l2_max"]))
        elif device == "cpu":
            check((s["dtype"], s["dtype_candidate"]) == ("float32", "float32"),
                  "%s: float32 on both sides" % name)
            check(0 < s["rel_l2"] <= 1e-2 and not s["identical"],
                  "%s: the swap changes the output (rel_l2 %.3g > 0) within T1" % (name, s["rel_l2"]))

    # the complete example of docs/pairing.md, as it stands on the page
    with open(os.path.join(src, "docs", "pairing.md")) as fh:
        doc = fh.read()
    start = doc.find("```python", doc.find("## Complete example"))
    end = doc.find("```", start + 9)
    check(start >= 0 and end > start, "docs/pairing.md has a complete example")
    example = os.path.join(tmp, "test_doc_example.py")
    with open(example, "w") as fh:
        fh.write(doc[start + len("```python\n"):end])
    env2 = dict(env, WAN_CALIBRATION=os.path.join(src, "tests", "pytest", "wan_bf16_calibration.json"),
                PYTHONPATH=os.path.join(build, "share", "probe", "python"))
    env2.pop("PROBE_PAIR_STATS", None)
    p = subprocess.run([sys.executable, "-m", "pytest", example, "-q", "-p", "no:cacheprovider",
                        "--junitxml", junit + ".doc"], cwd=tmp, env=env2, capture_output=True,
                       text=True, timeout=600)
    print(p.stdout[-3000:])
    try:
        suite = ET.parse(junit + ".doc").getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    except (OSError, ET.ParseError) as e:
        counts = {"error": str(e)}
    check(p.returncode == 0 and counts == {"tests": 3, "failures": 0, "errors": 0, "skipped": 0},
          "the example of docs/pairing.md passes its 3 tests (exit %d, %s)" % (p.returncode, counts))
    finish()


if __name__ == "__main__":
    main()
