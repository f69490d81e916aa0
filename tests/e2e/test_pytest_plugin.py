"""probe's pytest plugin (probe.pytest_plugin, docs/pytest.md), run as a real
pytest in a subprocess on small generated test files: the feature table and
parametrize_features (cases per capability; a capability no feature has is a
collection error, --collect-only included), probe_cell ids (unknown component
or feature, malformed ids, {feature} outside a feature parametrization: usage
errors at collection), the cells JSON of --probe-matrix-out (worst outcome of
a cell's tests: failed > skipped > passed; counts, node ids), --probe-repeat
(a nondeterministic function fails with the measured difference, computed
here with numpy; a deterministic one passes), --probe-record (JSON lines with
the statistics of probe.compare, checked against numpy), probe_session's bad
input, hidden library frames in a failure, and the feature table's own
errors in-process."""
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

BUILD = os.path.abspath(os.environ.get("PROBE_BUILD_DIR", "build"))
PY = os.environ.get("PROBE_PYTHON", sys.executable)
PYDIR = os.path.join(BUILD, "share", "probe", "python")
sys.path.insert(0, PYDIR)
import probe  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def raises(exc, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except exc as e:
        return str(e)
    except Exception as e:  # the wrong exception type
        return "WRONG %s: %s" % (type(e).__name__, e)
    return None


p = subprocess.run([PY, "-c", "import pytest; print(pytest.__version__)"], capture_output=True,
                   text=True)
if p.returncode != 0:
    print("FAIL pytest is not importable by %s (scripts/setup installs python3-pytest): %s"
          % (PY, p.stderr.strip()[-300:]))
    sys.exit(1)
print("pytest %s" % p.stdout.strip())

tmp = tempfile.mkdtemp(prefix="probe-pytest.")

CONFTEST = '''
import contextlib
import probe

STATE = {"attn": "sdpa"}


@contextlib.contextmanager
def attn(name):
    old = STATE["attn"]
    STATE["attn"] = name
    try:
        yield
    finally:
        STATE["attn"] = old


probe.register_feature("flash", enable=lambda: attn("flash"), gate="T1-relaxed:backend-swap",
                       capabilities={"attention", "kernel-swap"})
probe.register_feature("sage", enable=lambda: attn("sage"), gate="T1",
                       capabilities={"attention"})
probe.register_feature("bf16", gate="T2", capabilities={"lossy"})
'''


def project(name, test_src, conftest=CONFTEST, ini="probe_features =\n    fp8\n"):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    with open(os.path.join(d, "conftest.py"), "w") as f:
        f.write(conftest)
    with open(os.path.join(d, "test_it.py"), "w") as f:
        f.write(textwrap.dedent(test_src))
    with open(os.path.join(d, "pytest.ini"), "w") as f:
        f.write("[pytest]\n" + ini)
    return d


def pytest(d, *args):
    env = dict(os.environ, PYTHONPATH=PYDIR, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PROBE_LIBPROBE", None)
    p = subprocess.run([PY, "-m", "pytest", "-p", "probe.pytest_plugin", "-p", "no:cacheprovider",
                        "-rA", *args], capture_output=True, text=True, cwd=d, env=env)
    return p.returncode, p.stdout + p.stderr


def outcomes(out):
    """{"passed": n, "failed": n, ...} from pytest's last summary line."""
    last = [ln for ln in out.splitlines() if ln.startswith("=")][-1:]
    return {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", last[0] if last else "")}


# --- the feature table, parametrization and the cells JSON ----------------------
d = project("cells", '''
    import probe
    import pytest
    from conftest import STATE

    @probe.parametrize_features("attention")
    @pytest.mark.probe_cell("dit.step/{feature}", "text_encoder/{feature}")
    def test_attention(feature):
        assert STATE["attn"] == "sdpa"
        with feature.enable():
            assert STATE["attn"] == feature.id
            # the sage kernel is built to fail its parity check
            assert feature.id != "sage", "sage diverged"
        assert STATE["attn"] == "sdpa"

    @probe.parametrize_features("attention", "kernel-swap")
    def test_two_capabilities(feature):
        assert feature.id == "flash" and feature.gate == "T1-relaxed:backend-swap"

    @pytest.mark.probe_cell("vae.decode/bf16")
    def test_vae_passes():
        pass

    @pytest.mark.probe_cell("vae.decode/bf16")
    def test_vae_skipped():
        pytest.skip("no GPU for the bf16 VAE")

    @pytest.mark.probe_cell("scheduler.step/fp8")
    def test_ini_feature():
        pass

    @pytest.mark.probe_cell("scheduler.step/bf16")
    @pytest.mark.xfail(reason="known drift", strict=True)
    def test_expected_failure():
        assert False

    def test_not_a_cell():
        pass
''')
out_json = os.path.join(d, "cells.json")
rc, out = pytest(d, "--probe-matrix-out", out_json)
got = outcomes(out)
check(rc == 1 and got == {"failed": 1, "passed": 5, "skipped": 1, "xfailed": 1},
      "cells run: 1 failed (sage), 5 passed, 1 skipped, 1 xfailed, exit 1 (%d %r)\n%s"
      % (rc, got, out[-1500:] if rc != 1 else ""))
check("test_attention[flash] PASSED" in out.replace("::", " ").replace("test_it.py ", "")
      or "PASSED test_it.py::test_attention[flash]" in out,
      "parametrize_features gives the case id flash")
check("test_two_capabilities[flash]" in out and "test_two_capabilities[sage]" not in out,
      "two capabilities select the feature that has both")
doc = json.load(open(out_json))
check(doc["format"] == "probe-pytest-cells" and doc["version"] == 1
      and doc["probe_version"] == probe.__version__, "cells JSON: format, version, probe_version")
cells = {c["id"]: c for c in doc["cells"]}
want = {"dit.step/flash": ("passed", 1, 0, 0), "text_encoder/flash": ("passed", 1, 0, 0),
        "dit.step/sage": ("failed", 0, 1, 0), "text_encoder/sage": ("failed", 0, 1, 0),
        "vae.decode/bf16": ("skipped", 1, 0, 1), "scheduler.step/fp8": ("passed", 1, 0, 0),
        "scheduler.step/bf16": ("skipped", 0, 0, 1)}
check(sorted(cells) == sorted(want), "cells JSON: exactly the declared cells (%s)" % sorted(cells))
for cid, (st, np_, nf, ns) in want.items():
    c = cells.get(cid, {})
    check(c.get("status") == st and c.get("tests") == {"passed": np_, "failed": nf, "skipped": ns},
          "cell %s: %s with tests passed=%d failed=%d skipped=%d (%r)"
          % (cid, st, np_, nf, ns, {k: c.get(k) for k in ("status", "tests")}))
c = cells.get("dit.step/sage", {})
check(c.get("component") == "dit.step" and c.get("feature") == "sage"
      and c.get("nodeids") == ["test_it.py::test_attention[sage]"]
      and any("sage diverged" in r for r in c.get("reasons", [])),
      "failed cell: component, feature, node id and the failure's first line (%r)" % c.get("reasons"))
c = cells.get("vae.decode/bf16", {})
check(c.get("nodeids") == ["test_it.py::test_vae_passes", "test_it.py::test_vae_skipped"]
      and any("no GPU for the bf16 VAE" in r for r in c.get("reasons", [])),
      "skipped cell lists both tests and the skip reason (%r)" % c.get("reasons"))
check(doc["summary"] == {"passed": 3, "failed": 2, "skipped": 2}, "cells JSON summary %r" % doc["summary"])
check(not any(n.startswith(".") for n in os.listdir(d)), "no temporary file left next to the JSON")

# the plugin's JSON is what probe-matrix --tests reads: the same statuses in its HTML's inline JSON
html_path = os.path.join(d, "matrix.html")
p = subprocess.run([os.path.join(BUILD, "bin", "probe-matrix"), "--tests", out_json, "--html", html_path,
                    "--quiet"], capture_output=True, text=True)
m = re.search(r'<script type="application/json" id="probe-matrix-data">(.*?)</script>',
              open(html_path).read() if os.path.exists(html_path) else "", re.S)
mdoc = json.loads(m.group(1)) if m else {"cells": []}
got = {c["id"]: c["status"] for c in mdoc["cells"] if c["status"] != "absent"}
check(p.returncode == 1 and got == {k: v[0] for k, v in want.items()}
      and all(c["pytest"]["status"] == c["status"] for c in mdoc["cells"] if c["status"] != "absent"),
      "probe-matrix --tests on the plugin's JSON: the matrix HTML carries every cell's status "
      "(exit %d, %r)" % (p.returncode, got))

# -k deselects: a cell whose tests did not run is not written
rc, out = pytest(d, "--probe-matrix-out", out_json, "-k", "vae_passes")
doc = json.load(open(out_json))
check(rc == 0 and [(c["id"], c["status"]) for c in doc["cells"]] == [("vae.decode/bf16", "passed")],
      "a deselected test's cells are not written (%r)" % [c["id"] for c in doc["cells"]])

# --- collection errors ----------------------------------------------------------------
d = project("nocap", '''
    import probe

    @probe.parametrize_features("teleport")
    def test_never(feature):
        pass

    def test_other():
        pass
''')
for extra in ([], ["--collect-only"]):
    rc, out = pytest(d, *extra)
    check(rc not in (0, 5) and "no registered feature has the capabilities 'teleport'" in out
          and "flash, sage, bf16" in out and "attention, kernel-swap, lossy" in out
          and "test_never" in out and "passed" not in outcomes(out),
          "unknown capability %s: collection error naming it, the features and their capabilities "
          "(exit %d)%s" % (" ".join(extra), rc, "" if rc == 2 else "\n" + out[-800:]))
    check("pytest_plugin.py" not in out and "Traceback" not in out,
          "the collection error is the message alone, without the plugin's traceback")

bad_cells = [
    ('"dit.stp/flash"', "unknown component 'dit.stp'"),
    ('"dit.step/teleport"', "unknown feature 'teleport'"),
    ('"dit.step"', "is not COMPONENT/FEATURE"),
    ('"dit.step/flash/x"', "is not COMPONENT/FEATURE"),
    ('"dit.step/{feature}"', "uses {feature} but the test is not parametrized"),
    ('', "probe_cell() names no cell"),
]
for i, (arg, msg) in enumerate(bad_cells):
    d = project("badcell%d" % i, '''
        import pytest

        @pytest.mark.probe_cell(%s)
        def test_cell():
            pass

        def test_fine():
            pass
    ''' % arg)
    for extra in ([], ["--collect-only"]):
        rc, out = pytest(d, *extra)
        check(rc == 4 and msg in out and "test_it.py::test_cell" in out and "passed" not in out,
              "probe_cell(%s) %s: usage error %r (exit %d)%s"
              % (arg, " ".join(extra), msg, rc, "" if rc == 4 else "\n" + out[-800:]))
rc, out = pytest(os.path.join(tmp, "badcell0"))
check("text_encoder, image_encoder" in out and "vae.decode" in out,
      "an unknown component's error lists the component table's names")

# --- --probe-repeat ----------------------------------------------------------------
d = project("repeat", '''
    import json
    import os
    import numpy as np

    CALLS = {"n": 0}

    def flaky(x):
        CALLS["n"] += 1
        y = x * 2.0
        if CALLS["n"] % 2 == 0:
            y[1, 2] += 0.5          # every second call differs by 0.5 at [1, 2]
        return y

    def steady(x):
        return {"out": x * 2.0, "aux": [x + 1.0]}

    X = np.arange(12, dtype=np.float32).reshape(3, 4)

    def test_flaky(probe_session):
        with open(os.environ["PROBE_T_OUT"], "w") as f:
            json.dump({"repeat": probe_session.repeat}, f)
        out = probe_session.run(flaky, X, side="candidate")
        assert out[1, 2] == X[1, 2] * 2

    def test_steady(probe_session):
        out = probe_session.run(steady, X)
        assert out["out"][0, 1] == 2.0

    def test_current(probe_session, request):
        import probe.pytest_plugin
        assert probe.pytest_plugin.current() is probe_session
        assert probe_session.nodeid == request.node.nodeid
''')
flag = os.path.join(d, "flag.json")
os.environ["PROBE_T_OUT"] = flag
rc, out = pytest(d)
check(rc == 0 and outcomes(out) == {"passed": 3} and json.load(open(flag)) == {"repeat": False},
      "without --probe-repeat: each function runs once, both pass, repeat is False (%d)" % rc)
rc, out = pytest(d, "--probe-repeat")
x = np.arange(12, dtype=np.float32).reshape(3, 4) * 2.0
x2 = x.copy()
x2[1, 2] += 0.5
d_abs = np.abs(x2.astype(np.float64) - x.astype(np.float64))
rel = float(np.linalg.norm(d_abs) / np.linalg.norm(x.astype(np.float64)))
want = ("nondeterministic candidate: two runs of the same side differ: rel_l2=%.6g max_abs=%.6g at "
        "[1, 2] (run 1 %r, run 2 %r), 1 of 12 elements differ" % (rel, d_abs.max(), float(x[1, 2]),
                                                                  float(x2[1, 2])))
check(rc == 1 and outcomes(out) == {"failed": 1, "passed": 2} and want in out
      and json.load(open(flag)) == {"repeat": True},
      "--probe-repeat: the nondeterministic function fails with the measured difference %r, the "
      "deterministic one (dict and list results) passes; current() is probe_session\n%s" % (want, out[-1200:] if want not in out else ""))

# --- --probe-record ------------------------------------------------------------------
d = project("record", '''
    import numpy as np
    import probe
    import pytest

    R = np.linspace(-1, 1, 64).reshape(8, 8)
    C = R + 1e-3 * np.cos(np.arange(64)).reshape(8, 8)

    def test_record(probe_session):
        m = probe.compare(R, C, gate="T1-relaxed:backend-swap")
        probe_session.record("dit.step", "bf16", m)
        probe_session.record("vae.decode", probe.FEATURES["flash"], m, arch="sm_100", kind="floor")

    def test_bad_component(probe_session):
        with pytest.raises(ValueError, match="unknown component 'dit.stp'"):
            probe_session.record("dit.stp", "bf16", probe.compare(R, C))
        with pytest.raises(TypeError, match="stats must be a dict"):
            probe_session.record("dit.step", "bf16", [1.0])
        with pytest.raises(ValueError, match="lacks 'rel_l2'"):
            probe_session.record("dit.step", "bf16", {"cosine": 1.0})
        with pytest.raises(ValueError, match="not finite"):
            probe_session.record("dit.step", "bf16", {"rel_l2": float("nan"), "cosine": 1.0,
                                                      "max_abs": 0.0})
        with pytest.raises(ValueError, match="kind must be"):
            probe_session.record("dit.step", "bf16", probe.compare(R, C), kind="other")
        with pytest.raises(ValueError, match="feature id"):
            probe_session.record("dit.step", "a/b", probe.compare(R, C))
''')
rec = os.path.join(d, "rec.jsonl")
with open(rec, "w") as f:
    f.write('{"earlier": "line"}\n')
rc, out = pytest(d, "--probe-record", rec, "--probe-arch", "sm_90")
lines = open(rec).read().splitlines()
check(rc == 0 and outcomes(out) == {"passed": 2} and len(lines) == 3 and lines[0] == '{"earlier": "line"}',
      "--probe-record appends one line per record (%d, %d lines)\n%s" % (rc, len(lines), out[-800:] if rc else ""))
if len(lines) == 3:
    r1, r2 = json.loads(lines[1]), json.loads(lines[2])
    R = np.linspace(-1, 1, 64).reshape(8, 8)
    C = R + 1e-3 * np.cos(np.arange(64)).reshape(8, 8)
    dd = np.abs(C - R)
    rel = np.linalg.norm(C - R) / np.linalg.norm(R)
    cos = float(np.dot(R.ravel(), C.ravel()) / (np.linalg.norm(R) * np.linalg.norm(C)))
    s = r1["stats"]
    check(r1["format"] == "probe-record" and r1["version"] == 1 and r1["component"] == "dit.step"
          and r1["feature"] == "bf16" and r1["kind"] == "feature" and r1["arch"] == "sm_90"
          and r1["test"] == "test_it.py::test_record", "record 1: identity fields (%r)"
          % {k: v for k, v in r1.items() if k != "stats"})
    check(abs(s["rel_l2"] - rel) <= 1e-12 * rel and abs(s["cosine"] - cos) <= 1e-12
          and s["max_abs"] == dd.max() and s["n"] == 64
          and s["atol"] == 1e-2 and s["rtol"] == 1e-2,
          "record 1: rel_l2, cosine, max_abs against numpy; the gate's atol/rtol (%r)" % s)
    check(set(s) <= {"rel_l2", "cosine", "max_abs", "p99_abs", "mean_abs", "mismatch_fraction",
                     "gain_z", "n", "atol", "rtol"}, "record 1 keeps numbers only: %s" % sorted(s))
    check(r2["feature"] == "flash" and r2["arch"] == "sm_100" and r2["kind"] == "floor"
          and r2["component"] == "vae.decode", "record 2: a Feature, an explicit arch, kind floor")

    # the plugin's records are probe-calibrate's input; a line of another format is refused
    cal = os.path.join(d, "cal.json")
    p = subprocess.run([os.path.join(BUILD, "bin", "probe-calibrate"), "--feature", "bf16", "--records", rec,
                        "--out", cal], capture_output=True, text=True)
    check(p.returncode == 2 and "rec.jsonl:1: not a probe-record" in p.stderr,
          "probe-calibrate --records refuses the foreign first line, naming FILE:LINE (%r)" % p.stderr)
    with open(rec, "w") as f:
        f.write("\n".join(lines[1:]) + "\n")
    p = subprocess.run([os.path.join(BUILD, "bin", "probe-calibrate"), "--feature", "bf16", "--records", rec,
                        "--out", cal], capture_output=True, text=True)
    cdoc = json.load(open(cal)) if os.path.exists(cal) else {"components": {}}
    e = cdoc["components"].get("dit.step", {})
    check(p.returncode == 1 and sorted(cdoc["components"]) == ["dit.step"]
          and abs(e.get("rel_l2_max", 0) - 1.5 * rel) <= 1e-12 * rel
          and abs(e.get("max_abs_max", 0) - 1.5 * dd.max()) <= 1e-15
          and cdoc["evidence"]["architectures"] == ["sm_90"] and "floor not measured" in p.stdout,
          "probe-calibrate --records on the plugin's records: bf16's dit.step thresholds = 1.5 x the "
          "recorded statistics, sm_90, exit 1 for the unmeasured floor (%d %s)" % (p.returncode, p.stderr))

# --- failures hide probe's frames -----------------------------------------------------
d = project("tb", '''
    import numpy as np
    import probe

    def test_fails():
        probe.assert_parity(np.zeros(4), np.array([0.0, 0.0, 0.25, 0.0]))
''')
rc, out = pytest(d, "--tb=long")
check(rc == 1 and "max_abs=0.25 at [2] (reference 0.0, candidate 0.25)" in out
      and "probe/__init__.py" not in out and "test_it.py:6" in out,
      "an assert_parity failure shows the test's line and no frame of probe's module\n%s"
      % (out[-1500:] if "probe/__init__.py" in out else ""))

# --- the feature table's errors (in process) -----------------------------------------
check(raises(ValueError, probe.Feature, "f", gate="T9") not in (None,) and "T9"
      in (raises(ValueError, probe.Feature, "f", gate="T9") or ""), "an unknown gate: ValueError")
msg = raises(ValueError, probe.Feature, "f", gate="T1-relaxed:magic")
check(msg is not None and not msg.startswith("WRONG") and "magic" in msg, "an unknown cause: ValueError")
msg = raises(TypeError, probe.Feature, "f", capabilities="attention")
check(msg is not None and not msg.startswith("WRONG") and "{'attention'}" in msg,
      "capabilities given as one string: TypeError suggesting a set (%r)" % msg)
msg = raises(TypeError, probe.Feature, "f", capabilities={1})
check(msg is not None and not msg.startswith("WRONG"), "a capability that is not a string: TypeError")
for bad in ("a/b", "a,b", "", " a", "{a}"):
    msg = raises(ValueError, probe.Feature, bad)
    check(msg is not None and not msg.startswith("WRONG") and "feature id" in msg,
          "feature id %r: ValueError" % bad)
msg = raises(TypeError, probe.Feature, 3)
check(msg is not None and not msg.startswith("WRONG"), "a feature id that is not a string: TypeError")
msg = raises(TypeError, probe.Feature, "f", enable="on")
check(msg is not None and not msg.startswith("WRONG") and "callable" in msg, "enable not callable: TypeError")
msg = raises(TypeError, lambda: probe.Feature("f", enable=lambda: 42).enable())
check(msg is not None and not msg.startswith("WRONG") and "not a context manager" in msg,
      "enable() returning no context manager: TypeError")
f = probe.register_feature("t-one", gate="T1", capabilities=["a", "b"])
check(probe.FEATURES["t-one"] is f and f.capabilities == frozenset({"a", "b"}),
      "register_feature adds to probe.FEATURES")
msg = raises(ValueError, probe.register_feature, "t-one")
check(msg is not None and not msg.startswith("WRONG") and "already registered" in msg,
      "a second feature of the same id: ValueError")
g = probe.register_feature(probe.Feature("t-one", capabilities={"c"}), replace=True)
check(probe.FEATURES["t-one"] is g and probe.features_with("c") == [g] and probe.features_with("a") == [],
      "replace=True replaces; features_with selects by capability")
with f.enable():
    pass
probe.unregister_feature("t-one")
check("t-one" not in probe.FEATURES, "unregister_feature removes it")
msg = raises(TypeError, probe.parametrize_features)
check(msg is not None and not msg.startswith("WRONG"), "parametrize_features() with no capability: TypeError")

# --- output paths that cannot be written: a usage error before any test runs ----------
d = project("unwritable", '''
    def test_ran():
        open("ran", "w").close()
''')
for opt in ("--probe-matrix-out", "--probe-record"):
    bad = os.path.join(tmp, "no-such-folder", "out.json")
    rc, out = pytest(d, opt, bad)
    want = "probe: %s %s: the folder %s does not exist" % (opt, bad, os.path.dirname(bad))
    check(rc == 4 and want in out and "Traceback" not in out and not os.path.exists(os.path.join(d, "ran")),
          "%s in a missing folder: exit 4, '%s', no test run (%d)\n%s" % (opt, want, rc, out[-600:]))
rc, out = pytest(d, "--probe-matrix-out", tmp)
check(rc == 4 and ("probe: --probe-matrix-out %s: %s is a folder" % (tmp, tmp)) in out,
      "--probe-matrix-out naming a folder: exit 4 (%d)" % rc)

# --- probe.pair records the determinism floor under --probe-repeat ----------------------
try:
    import torch  # noqa: F401
    have_torch = True
except ImportError:
    have_torch = False
if have_torch:
    d = project("pairfloor", '''
        import contextlib
        import torch
        import probe

        K = {"s": 1.0}

        @contextlib.contextmanager
        def scaled():
            K["s"] = 1.0 + 1e-3
            try:
                yield
            finally:
                K["s"] = 1.0

        def test_pair():
            x = torch.linspace(-1, 1, 64).reshape(8, 8)
            probe.assert_pair(lambda t: t * K["s"], (x,), component="dit.step",
                              feature=probe.feature("fp8", on=scaled), gate="T1-relaxed:backend-swap")
    ''')
    rec = os.path.join(d, "rec.jsonl")
    rc, out = pytest(d, "--probe-record", rec, "--probe-repeat")
    recs = [json.loads(x) for x in open(rec)] if os.path.exists(rec) else []
    kinds = sorted(r["kind"] for r in recs)
    fl = [r for r in recs if r["kind"] == "floor"]
    check(rc == 0 and kinds == ["feature", "floor"] and fl and fl[0]["stats"]["rel_l2"] == 0.0
          and fl[0]["stats"]["max_abs"] == 0.0,
          "pair under --probe-repeat --probe-record: one feature and one floor record, the floor 0 "
          "(%d %r)\n%s" % (rc, kinds, out[-600:] if rc else ""))
    cal = os.path.join(d, "cal.json")
    p = subprocess.run([os.path.join(BUILD, "bin", "probe-calibrate"), "--feature", "fp8", "--records", rec,
                        "--out", cal], capture_output=True, text=True)
    check(p.returncode == 0, "probe-calibrate --records with the floor record: exit 0, T1 above the floor "
          "(%d %s %s)" % (p.returncode, p.stdout[-300:], p.stderr[-300:]))

import shutil  # noqa: E402
shutil.rmtree(tmp, ignore_errors=True)
print("test_pytest_plugin: %d failed" % len(failures))
sys.exit(1 if failures else 0)
