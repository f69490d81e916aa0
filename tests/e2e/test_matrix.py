"""probe-matrix end to end: several features compared by the real probe-compare
on files written by h5py, merged into one components x features matrix.
Cell statuses are checked against what each feature was built to do (not
against probe-matrix's own reading), with failed > skipped > passed, the
run-level "feature not active" failure, requested cells (--cells/--cell), the
JSON and HTML outputs, and bad input (unknown component or feature, malformed
ids, unreadable or foreign files): exit 2 with one line, never dropped."""
import html.parser
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
MATRIX = os.path.join(BUILD, "bin", "probe-matrix")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(tool, *args):
    p = subprocess.run([tool, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def write(path, tensors, skips=None):
    with h5py.File(path, "w") as f:
        for k, v in tensors.items():
            f.create_dataset(k, data=v)
        if skips is not None:
            f.attrs["probe.skips"] = json.dumps(skips)


tmp = tempfile.mkdtemp(prefix="probe-matrix-")
j = lambda name: os.path.join(tmp, name)
rng = np.random.default_rng(5)
ref = {
    "/text_encoder/0000/out": rng.standard_normal((4, 8)).astype(np.float32),
    "/text_encoder/0001/out": rng.standard_normal((4, 8)).astype(np.float32),
    "/dit.step/0000/out": rng.standard_normal((2, 4, 8)),
    "/dit.step/0001/out": rng.standard_normal((2, 4, 8)),
    "/scheduler.step/0000/out.prev_sample": rng.standard_normal((2, 4, 8)).astype(np.float32),
    "/vae.decode/0000/out": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
}
write(j("ref.h5"), ref)
COMPS = ["text_encoder", "dit.step", "scheduler.step", "vae.decode"]

# chunked: dit.step differs by 1e-9 relative (passes T1), everything else identical.
chunked = {k: v.copy() for k, v in ref.items()}
chunked["/dit.step/0000/out"] = ref["/dit.step/0000/out"] * (1 + 1e-9)
write(j("chunked.h5"), chunked)
# bf16: dit.step/0001 off by 5% (fails T1), vae.decode missing, vae.encode skipped at run time.
bf16 = {k: v.copy() for k, v in ref.items() if k != "/vae.decode/0000/out"}
bf16["/dit.step/0001/out"] = ref["/dit.step/0001/out"] * 1.05
write(j("bf16.h5"), bf16, [{"path": "/vae.encode/0000/out", "reason": "stream capturing a CUDA graph"}])
# noop: the candidate equals the reference: feature not active.
write(j("noop.h5"), ref)

for feat in ["chunked", "bf16", "noop"]:
    rc, out, err = run(COMPARE, j("ref.h5"), j(feat + ".h5"), "--json", j(feat + ".json"), "--quiet")
    check(rc in (0, 1) and os.path.exists(j(feat + ".json")), "probe-compare %s: JSON written (rc=%d)" % (feat, rc))

FEATS = ["chunked", "bf16", "noop"]
expected = {}
for c in COMPS + ["vae.encode"]:
    expected[c + "/chunked"] = "absent" if c == "vae.encode" else "passed"
    expected[c + "/noop"] = "failed"   # the run failed: feature not active
expected.update({"text_encoder/bf16": "passed", "dit.step/bf16": "failed",
                 "scheduler.step/bf16": "passed", "vae.decode/bf16": "failed",
                 "vae.encode/bf16": "skipped"})
args = ["chunked=" + j("chunked.json"), "bf16=" + j("bf16.json"), "noop=" + j("noop.json")]

rc, out, err = run(MATRIX, *args, "--out", j("m.json"), "--html", j("m.html"))
check(rc == 1, "a failed cell: exit 1 (rc=%d, %s)" % (rc, err.strip()))
doc = json.load(open(j("m.json")))
check(doc["format"] == "probe-matrix" and doc["version"] == 1 and doc["verdict"] == "fail",
      "JSON: format probe-matrix, version 1, verdict fail")
check(set(doc["components"]) == set(COMPS + ["vae.encode"]) and len(doc["components"]) == 5,
      "components: the union over features, each once: %r" % doc["components"])
check([f["name"] for f in doc["features"]] == FEATS and [f["source"] for f in doc["features"]]
      == [j(f + ".json") for f in FEATS], "features in argument order with their sources")
cells = {c["id"]: c for c in doc["cells"]}
check(len(doc["cells"]) == 15 and set(cells) == set(expected), "15 cells, ids COMPONENT/FEATURE")
for cid, want in sorted(expected.items()):
    got = cells.get(cid, {})
    comp, feat = cid.split("/")
    check(got.get("status") == want and got.get("component") == comp and got.get("feature") == feat,
          "cell %s: %s (got %s)" % (cid, want, got.get("status")))
check(cells["dit.step/bf16"]["tensors"] == 2 and cells["dit.step/bf16"]["failed"] == 1
      and cells["dit.step/bf16"]["passed"] == 1
      and cells["dit.step/bf16"]["reasons"][0].startswith("/dit.step/0001/out: "),
      "dit.step/bf16: 2 tensors, 1 failed, reason names /dit.step/0001/out")
check(cells["vae.decode/bf16"]["missing"] == 1 and cells["vae.decode/bf16"]["tensors"] == 0
      and cells["vae.decode/bf16"]["reasons"] == ["/vae.decode/0000/out: missing in candidate"],
      "vae.decode/bf16: failed because missing in candidate")
check(cells["vae.encode/bf16"]["skipped"] == 1, "vae.encode/bf16: one skipped capture")
check(all(c["reasons"][-1].startswith("feature not active") for k, c in cells.items() if k.endswith("/noop")),
      "noop cells carry the run-level reason 'feature not active'")
check(cells["text_encoder/chunked"]["tensors"] == 2 and cells["text_encoder/chunked"]["passed"] == 2,
      "text_encoder/chunked: 2 tensors passed")
s = doc["summary"]
want = {st: sum(v == st for v in expected.values()) for st in ["passed", "failed", "skipped", "absent"]}
check(s["cells"] == 15 and all(s[k] == v for k, v in want.items()), "summary counts %r == %r" % (s, want))
check(doc["requested"] is None, "no --cells: requested is null")
lines = out.splitlines()
check(lines[0].split() == ["component"] + FEATS, "terminal table header: component + features")
row = [l for l in lines if l.startswith("dit.step ")]
check(row and row[0].split() == ["dit.step", "pass", "FAIL", "FAIL"], "terminal row dit.step: %r" % row)
row = [l for l in lines if l.startswith("vae.encode ")]
check(row and row[0].split() == ["vae.encode", "-", "skip", "FAIL"], "terminal row vae.encode: %r" % row)
check(lines[-1].startswith("FAIL: 5 components x 3 features"), "summary line: %r" % lines[-1])


class Cells(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells, self.data, self._in = {}, "", False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "td" and "data-id" in a:
            self.cells[a["data-id"]] = a.get("class")
        if tag == "script" and a.get("id") == "probe-matrix-data":
            self._in = True

    def handle_endtag(self, tag):
        if tag == "script":
            self._in = False

    def handle_data(self, d):
        if self._in:
            self.data += d


h = Cells()
page = open(j("m.html")).read()
h.feed(page)
cls = {"passed": "pass", "failed": "fail", "skipped": "skip", "absent": "absent"}
check(h.cells == {k: cls[v] for k, v in expected.items()}, "HTML: one td per cell, class from its status")
check(json.loads(h.data) == json.loads(json.dumps(doc)), "HTML: the inline JSON equals --out's JSON")
check("http://" not in page and "https://" not in page, "HTML: self-contained (no network)")

# only the feature that passes: exit 0
rc, out, err = run(MATRIX, args[0], "--out", "-")
check(rc == 0 and json.loads(out)["verdict"] == "pass", "chunked alone: exit 0, verdict pass (rc=%d)" % rc)
check("PASS:" in err, "--out -: the table goes to stderr")

# requested cells
for cells_arg, want_rc in [(["--cells", "dit.step/chunked,text_encoder/bf16"], 0),
                           (["--cell", "dit.step/chunked", "--cell", "dit.step/bf16"], 1),
                           (["--cells", "vae.encode/bf16"], 0),      # skipped is not a failure
                           (["--cells", "vae.encode/chunked"], 1),   # asked for, no data
                           (["--cells", "text_encoder/noop"], 1)]:
    rc, out, err = run(MATRIX, *args, *cells_arg, "--out", j("r.json"))
    r = json.load(open(j("r.json")))
    ids = ",".join(cells_arg[1::2]).split(",")
    check(rc == want_rc and [x["id"] for x in r["requested"]] == ids
          and all(x["status"] == expected[x["id"]] for x in r["requested"]),
          "requested %s: exit %d (rc=%d), statuses %r" % (ids, want_rc, rc, r["requested"]))

# bad input: one line, exit 2
# --tests: the cells of a pytest run (probe-pytest-cells, pytest --probe-matrix-out)
def tcell(comp, feat, status, p=0, f=0, sk=0, reasons=()):
    return {"id": comp + "/" + feat, "component": comp, "feature": feat, "status": status,
            "tests": {"passed": p, "failed": f, "skipped": sk}, "nodeids": [],
            "reasons": list(reasons)}


tests_doc = {"format": "probe-pytest-cells", "version": 1, "cells": [
    tcell("dit.step", "chunked", "failed", 1, 1, reasons=["test_x.py::test_chunk: boom"]),
    tcell("text_encoder", "chunked", "skipped", sk=1),
    tcell("scheduler.step", "chunked", "passed", 2),
    tcell("dit.step", "sdpa-flash", "passed", 1),
    tcell("vae.decode", "sdpa-flash", "failed", 0, 1),
    tcell("controlnet", "sdpa-flash", "passed", 1),
]}
json.dump(tests_doc, open(j("tests.json"), "w"))
json.dump({"format": "probe-pytest-cells", "version": 1,
           "cells": [tcell("text_encoder", "chunked", "passed", 3)]}, open(j("tests2.json"), "w"))
rc, out, err = run(MATRIX, *args, "--tests", j("tests.json"), "--tests", j("tests2.json"),
                   "--out", j("mt.json"), "--html", j("mt.html"))
check(rc == 1, "--tests: a failed cell, exit 1 (rc=%d, %s)" % (rc, err.strip()))
mt = json.load(open(j("mt.json")))
check([f["name"] for f in mt["features"]] == FEATS + ["sdpa-flash"]
      and mt["features"][-1]["source"] == j("tests.json") and mt["features"][-1]["from_tests"] is True
      and mt["features"][-1]["verdict"] == "fail" and mt["features"][-1]["run_failure"] is None
      and not any(f["from_tests"] for f in mt["features"][:-1]),
      "--tests: a feature only the tests name becomes the last column, from_tests, verdict fail")
check(mt["tests"] == [j("tests.json"), j("tests2.json")], "--tests: the files are listed under tests")
check(mt["components"] == doc["components"] + ["controlnet"], "--tests: a component only the tests name "
      "becomes the last row: %r" % mt["components"])
mc = {c["id"]: c for c in mt["cells"]}
want_t = dict(expected)
want_t.update({"dit.step/chunked": "failed",        # compare passes, a test fails: failed
               "text_encoder/chunked": "skipped",   # compare passes, one test skipped: skipped
               "scheduler.step/chunked": "passed", "dit.step/sdpa-flash": "passed",
               "vae.decode/sdpa-flash": "failed", "controlnet/sdpa-flash": "passed"})
for comp in mt["components"]:
    want_t.setdefault(comp + "/sdpa-flash", "absent")
    for feat in FEATS:
        want_t.setdefault(comp + "/" + feat, "failed" if feat == "noop" else "absent")
check(len(mt["cells"]) == 6 * 4 and {k: c["status"] for k, c in mc.items()} == want_t,
      "--tests: each cell the worse of compare and tests (%r)"
      % {k: (c["status"], want_t.get(k)) for k, c in mc.items() if c["status"] != want_t.get(k)})
check(mc["dit.step/chunked"]["pytest"] == {"status": "failed", "passed": 1, "failed": 1, "skipped": 0}
      and mc["dit.step/chunked"]["tensors"] == 2 and mc["dit.step/chunked"]["passed"] == 2
      and "test test_x.py::test_chunk: boom" in mc["dit.step/chunked"]["reasons"],
      "dit.step/chunked: pytest counts beside the tensor counts, the test's reason (%r)" % mc["dit.step/chunked"])
check(mc["text_encoder/chunked"]["pytest"] == {"status": "skipped", "passed": 3, "failed": 0, "skipped": 1},
      "two --tests files: counts add up, the worst status wins")
check(mc["vae.decode/sdpa-flash"]["reasons"] == ["a test failed (%s)" % j("tests.json")],
      "a failed test cell without reasons says which file failed it")
check(mc["dit.step/bf16"]["pytest"] is None, "a cell no test proved: pytest is null")
check(mt["summary"]["cells"] == 24 and mt["summary"]["failed"] == sum(v == "failed" for v in want_t.values()),
      "--tests: summary counts the merged cells")
h = Cells()
h.feed(open(j("mt.html")).read())
check(h.cells.get("dit.step/chunked") == "fail" and h.cells.get("controlnet/sdpa-flash") == "pass"
      and json.loads(h.data) == mt, "--tests: the HTML shows the merged cells, inline JSON = --out")
rc, out, err = run(MATRIX, "--tests", j("tests.json"), "--cells", "dit.step/sdpa-flash,controlnet/sdpa-flash",
                   "--out", "-")
check(rc == 0 and [f["name"] for f in json.loads(out)["features"]] == ["chunked", "sdpa-flash"],
      "--tests alone (no compare result), requested passing cells: exit 0 (rc=%d %s)" % (rc, err.strip()))
rc, out, err = run(MATRIX, "--tests", j("tests.json"), "--cells", "vae.decode/sdpa-flash")
check(rc == 1 and "requested vae.decode/sdpa-flash: failed" in out, "a requested cell a test failed: exit 1")
for name, bad in [("fmt", {"format": "probe-matrix", "version": 1, "cells": []}),
                  ("ver", {"format": "probe-pytest-cells", "version": 2, "cells": []}),
                  ("nocells", {"format": "probe-pytest-cells", "version": 1}),
                  ("status", {"format": "probe-pytest-cells", "version": 1,
                              "cells": [tcell("dit.step", "x", "bogus")]}),
                  ("nocomp", {"format": "probe-pytest-cells", "version": 1,
                              "cells": [{"feature": "x", "status": "passed"}]}),
                  ("slash", {"format": "probe-pytest-cells", "version": 1,
                             "cells": [tcell("dit.step", "a/b", "passed")]})]:
    json.dump(bad, open(j("bad-%s.json" % name), "w"))
for argv, needle in [(["--tests", j("bad-fmt.json")], "not a probe-pytest-cells JSON"),
                     (["--tests", j("bad-ver.json")], "version 2 is not supported"),
                     (["--tests", j("bad-nocells.json")], "\"cells\" must be a list"),
                     (["--tests", j("bad-status.json")], "status 'bogus' is not passed, skipped or failed"),
                     (["--tests", j("bad-nocomp.json")], "cells[0] lacks a string \"component\""),
                     (["--tests", j("bad-slash.json")], "feature 'a/b'"),
                     (["--tests", j("missing-tests.json")], "missing-tests.json"),
                     (["--tests", j("text.json")], "not valid JSON"),
                     (["--tests"], "--tests")]:
    if argv[-1] == j("text.json"):
        open(j("text.json"), "w").write("not json")
    rc, out, err = run(MATRIX, *args, *argv)
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and el[0].startswith("probe-matrix: ") and needle in el[0],
          "bad --tests input %r: exit 2, one line naming %r (rc=%d, %r)" % (argv[-1:], needle, rc, err))

bad_json = j("other.json")
json.dump({"format": "something-else", "version": 1}, open(bad_json, "w"))
open(j("text.json"), "w").write("not json")
for argv, needle in [
    (args + ["--cells", "vae.encoder/bf16"], "unknown component 'vae.encoder'"),
    (args + ["--cell", "dit.step/bf32"], "unknown feature 'bf32'"),
    (args + ["--cells", "dit.step/chunked,nope/noop"], "unknown component 'nope'"),
    (args + ["--cells", "dit.step"], "not COMPONENT/FEATURE"),
    (args + ["--cells", ""], "empty"),
    (["chunked=" + j("missing.json")], "missing.json"),
    (["chunked=" + j("text.json")], "text.json"),
    (["chunked=" + bad_json], "not a probe-compare JSON"),
    (["chunked=" + j("chunked.json"), "chunked=" + j("bf16.json")], "given twice"),
    ([j("chunked.json")], "not FEATURE=COMPARE.json"),
    (["a/b=" + j("chunked.json")], "may not contain"),
    ([], "expected FEATURE=COMPARE.json arguments or --tests FILE"),
    (args + ["--frobnicate"], "--frobnicate"),
    (args + ["--out", "-", "--html", "-"], "stdout"),
]:
    rc, out, err = run(MATRIX, *argv)
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and el[0].startswith("probe-matrix: ") and needle in el[0],
          "bad input %r: exit 2, one line naming %r (rc=%d, %r)" % (argv[-2:], needle, rc, err))

print("test_matrix: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
