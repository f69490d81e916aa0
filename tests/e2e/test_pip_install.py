"""`pip install .` of the source tree into a fresh venv (docs/packaging.md
"pip"): one CMake build through scikit-build-core (pyproject.toml), then from
the venv only: `import probe` (probe.__version__ is the CMake project
version, libprobe is the wheel's own), probe.compare against numpy, every
command-line tool from the venv's bin, probe-run capturing a small torch
program and probe-compare on the capture, and pytest finding the plugin
through its pytest11 entry point (options in --help, the feature table and
probe_session in a test, without -p).

The venv is made with --system-site-packages (numpy, torch and pytest come
from the interpreter in PROBE_PYTHON); pip downloads the build backend
(scikit-build-core) from the package index: when the index cannot be
reached the test is skipped (exit 77). The build leaves out the CUDA
metrics plugin (PROBE_CUDA=OFF) to keep the test to one plain C build."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

SRC = os.path.abspath(os.environ.get("PROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
PY = os.environ.get("PROBE_PYTHON", sys.executable)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(argv, **kw):
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PROBE_LIBPROBE", "PROBE_COMPONENTS", "LD_PRELOAD"):
        env.pop(k, None)
    env.update(kw.pop("env", {}))
    return subprocess.run(argv, capture_output=True, text=True, env=env, **kw)


tmp = tempfile.mkdtemp(prefix="probe-pip.")
venv = os.path.join(tmp, "venv")
p = run([PY, "-m", "venv", "--system-site-packages", venv])
if p.returncode != 0:
    print("FAIL python -m venv: %s" % p.stderr[-500:])
    sys.exit(1)
vpy = os.path.join(venv, "bin", "python")
vbin = os.path.join(venv, "bin")

# the build backend comes from the index; without one there is nothing to test
p = run([vpy, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
         "-d", os.path.join(tmp, "dl"), "scikit-build-core>=0.10"])
if p.returncode != 0:
    print("skip: the package index cannot be reached for scikit-build-core: %s" % p.stderr[-300:])
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(77)

# a copy of the source tree without build folders, so the build cannot touch the checkout
src = os.path.join(tmp, "src")
shutil.copytree(SRC, src, ignore=lambda d, names: [n for n in names if (
    d == SRC and (n.startswith("build") or n in (".git", ".venv", ".whl", ".debs", ".ext")))
    or n == "__pycache__"])
t0 = time.time()
p = run([vpy, "-m", "pip", "install", "--disable-pip-version-check", src],
        env={"SKBUILD_CMAKE_DEFINE": "PROBE_CUDA=OFF"}, cwd=tmp)
dt = time.time() - t0
check(p.returncode == 0, "pip install . succeeds (%.0f s)%s" % (dt, "" if p.returncode == 0 else
                                                                  "\n" + (p.stdout + p.stderr)[-3000:]))
if p.returncode != 0:
    sys.exit(1)

p = run([vpy, "-m", "pip", "show", "-f", "probe-parity"], cwd=tmp)
check(p.returncode == 0 and "Name: probe-parity" in p.stdout, "the distribution is probe-parity")
files = p.stdout

# --- the module, from the venv only ---------------------------------------------
want_ver = re.search(r"project\(probe VERSION ([0-9.]+)", open(os.path.join(SRC, "CMakeLists.txt")).read()).group(1)
script = r"""
import json, numpy as np, probe, probe._lib, probe_adapter
r = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
c = r.copy(); c[1, 2] = 7.0
m = probe.compare(r, c)
print(json.dumps({"version": probe.__version__, "file": probe.__file__, "lib": probe._lib.get().path,
                  "adapter": probe_adapter.__file__, "rel_l2": m["rel_l2"], "max_abs": m["max_abs"],
                  "index": m["max_abs_index"], "cosine": m["cosine"], "verdict": m["verdict"]}))
"""
p = run([vpy, "-c", script], cwd=tmp)
check(p.returncode == 0, "import probe from the venv%s" % ("" if p.returncode == 0 else ": " + p.stderr[-800:]))
if p.returncode == 0:
    out = json.loads(p.stdout)
    site = os.path.realpath(venv) + os.sep
    check(out["version"] == want_ver, "probe.__version__ %r == CMake's project version %r" % (out["version"], want_ver))
    check(os.path.realpath(out["file"]).startswith(site) and os.path.realpath(out["adapter"]).startswith(site),
          "probe and probe_adapter are the venv's (%s)" % out["file"])
    check(os.path.realpath(out["lib"]).startswith(site) and "/probe/_prefix/lib" in out["lib"],
          "libprobe.so is the wheel's (%s)" % out["lib"])
    r = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    c = r.copy()
    c[1, 2] = 7.0
    rel = float(np.linalg.norm(c - r) / np.linalg.norm(r))
    cos = float(np.dot(r.ravel(), c.ravel()) / (np.linalg.norm(r) * np.linalg.norm(c)))
    check(abs(out["rel_l2"] - rel) <= 1e-15 and abs(out["cosine"] - cos) <= 1e-15 and out["max_abs"] == 1.0
          and out["index"] == [1, 2] and out["verdict"] == "fail",
          "probe.compare through the installed libprobe == numpy (rel_l2 %r, cosine %r)" % (rel, cos))

# --- the command-line tools from the venv's bin -----------------------------------
for tool in ("probe-compare", "probe-calibrate", "probe-matrix", "probe-recover", "probe-oracle", "probe-run"):
    exe = os.path.join(vbin, tool)
    p = run([exe, "--help"], cwd=tmp)
    check(p.returncode == 0 and "usage: %s" % tool in (p.stdout + p.stderr),
          "%s --help from the venv's bin: exit 0, its usage (%d)" % (tool, p.returncode))
p = run([os.path.join(vbin, "probe-compare"), "--version"], cwd=tmp)
check(p.returncode == 0 and p.stdout.strip() == "probe-compare %s" % want_ver,
      "probe-compare --version: %r" % p.stdout.strip())
p = run([os.path.join(vbin, "probe-matrix")], cwd=tmp)
check(p.returncode == 2 and p.stderr.startswith("probe-matrix: "), "a tool's own exit status comes through (2)")
check("probe/_prefix/lib/libprobe_intercept.so" in files and "probe/_prefix/share/probe/components.json" in files,
      "the wheel holds the shim and the component table")

# probe-run with the wheel's shim and adapter, probe-compare on the capture
has_torch = run([vpy, "-c", "import torch"]).returncode == 0
if has_torch:
    with open(os.path.join(tmp, "gen.py"), "w") as f:
        f.write("import torch\n"
                "class ToyDiT(torch.nn.Module):\n"
                "    def forward(self, x):\n"
                "        return x * 2\n"
                "m = ToyDiT()\n"
                "for i in range(2):\n"
                "    m(torch.arange(6, dtype=torch.float32).reshape(2, 3) + i)\n")
    cap = os.path.join(tmp, "a.h5")
    p = run([os.path.join(vbin, "probe-run"), "--out", cap, "--", vpy, "gen.py"], cwd=tmp)
    check(p.returncode == 0 and os.path.exists(cap), "probe-run from the venv captures a torch program (%d %s)"
          % (p.returncode, p.stderr[-400:]))
    p = run([os.path.join(vbin, "probe-compare"), cap, cap, "--expect-identical", "--json", "-", "--quiet"], cwd=tmp)
    doc = json.loads(p.stdout) if p.returncode == 0 else {}
    paths = sorted(t["path"] for t in doc.get("tensors", []))
    check(p.returncode == 0 and paths == ["/dit.step/0000/in.x", "/dit.step/0000/out",
                                          "/dit.step/0001/in.x", "/dit.step/0001/out"],
          "probe-compare --expect-identical on it: the two dit.step calls (%r)" % paths)
else:
    print("note: %s has no torch: the probe-run capture is not checked" % PY)

# --- pytest finds the plugin through the entry point ---------------------------------
p = run([vpy, "-m", "pytest", "--help"], cwd=tmp)
check(p.returncode == 0 and all(o in p.stdout for o in ("--probe-matrix-out", "--probe-repeat",
                                                         "--probe-record")),
      "pytest --help lists the plugin's options (%d)" % p.returncode)
t = os.path.join(tmp, "ptest")
os.makedirs(t)
with open(os.path.join(t, "conftest.py"), "w") as f:
    f.write("import probe\nprobe.register_feature('flash', capabilities={'attention'})\n")
with open(os.path.join(t, "test_a.py"), "w") as f:
    f.write("import numpy as np, probe, pytest\n"
            "@probe.parametrize_features('attention')\n"
            "@pytest.mark.probe_cell('dit.step/{feature}')\n"
            "def test_a(feature, probe_session):\n"
            "    out = probe_session.run(lambda: np.ones(3))\n"
            "    probe.assert_parity(out, np.ones(3))\n")
cells = os.path.join(t, "cells.json")
p = run([vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--probe-repeat", "--probe-matrix-out", cells],
        cwd=t)
check(p.returncode == 0 and "1 passed" in p.stdout, "a test using the plugin runs without -p (%d)%s"
      % (p.returncode, "" if p.returncode == 0 else "\n" + p.stdout[-1500:]))
doc = json.load(open(cells)) if os.path.exists(cells) else {}
check([(c["id"], c["status"]) for c in doc.get("cells", [])] == [("dit.step/flash", "passed")],
      "the plugin wrote the cell dit.step/flash passed")

shutil.rmtree(tmp, ignore_errors=True)
print("test_pip_install: %d failed (pip install %.0f s)" % (len(failures), dt))
sys.exit(1 if failures else 0)
