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
    ([], "expected FEATURE=COMPARE.json"),
    (args + ["--frobnicate"], "--frobnicate"),
    (args + ["--out", "-", "--html", "-"], "stdout"),
]:
    rc, out, err = run(MATRIX, *argv)
    el = err.strip().splitlines()
    check(rc == 2 and len(el) == 1 and el[0].startswith("probe-matrix: ") and needle in el[0],
          "bad input %r: exit 2, one line naming %r (rc=%d, %r)" % (argv[-2:], needle, rc, err))

print("test_matrix: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
