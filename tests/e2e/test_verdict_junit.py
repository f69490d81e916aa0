"""probe-compare's run-level verdict, JUnit XML and terminal progress, on files
written by h5py:
 - a candidate identical to the reference fails as "feature not active" (exit 1)
   unless --expect-identical, which passes it and fails any difference with
   "not identical";
 - --junit: parsed with xml.etree, one test case per tensor, counts, names,
   failure messages and metric text checked against the JSON and numpy;
   missing tensors fail, skipped captures are <skipped/>, XML escaping of
   paths with & < > " ';
 - progress: nothing on a non-terminal stderr, an in-place line on a pty;
 - bad input: exit 2 with one line."""
import json
import os
import pty
import re
import select
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run([COMPARE, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def write(path, tensors, skips=None):
    with h5py.File(path, "w") as f:
        for k, v in tensors.items():
            f.create_dataset(k, data=v)
        if skips is not None:
            f.attrs["probe.skips"] = json.dumps(skips)


tmp = tempfile.mkdtemp(prefix="probe-verdict-")
j = lambda name: os.path.join(tmp, name)
rng = np.random.default_rng(11)
WEIRD = '/we&ird<comp>"x\'/0000/out'
ref = {
    "/text_encoder/0000/out": rng.standard_normal((4, 8)).astype(np.float32),
    "/dit.step/0000/out": rng.standard_normal((2, 3, 8)),
    "/dit.step/0001/out": rng.standard_normal((2, 3, 8)),
    "/vae.decode/0000/out": rng.standard_normal((3, 5)).astype(np.float32),
    WEIRD: rng.standard_normal(6),
}
write(j("ref.h5"), ref)
write(j("ref_copy.h5"), ref)

# --- 1. feature-active verdict -------------------------------------------------
NOT_ACTIVE = "feature not active: the candidate is identical to the reference in every compared tensor"
rc, out, err = run(j("ref.h5"), j("ref_copy.h5"), "--json", "-")
doc = json.loads(out)
check(rc == 1, "identical candidate: exit 1 (rc=%d)" % rc)
check(doc["verdict"] == "fail" and doc["feature_active"] is False and doc["feature_not_active"] is True,
      "identical candidate: verdict fail, feature_active false, feature_not_active true")
check(doc["reasons"] == [NOT_ACTIVE], "identical candidate: top-level reasons %r" % doc["reasons"])
check(all(t["verdict"] == "pass" and t["identical"] for t in doc["tensors"]),
      "identical candidate: every tensor itself passes (identical)")
check(doc["first_failure"] is None and doc["expect_identical"] is False,
      "identical candidate: no first failing tensor, expect_identical false")
check(NOT_ACTIVE in err and "FAIL:" in err, "identical candidate: the reason and FAIL on the terminal")

rc, out, err = run(j("ref.h5"), j("ref_copy.h5"), "--expect-identical", "--json", "-")
doc = json.loads(out)
check(rc == 0 and doc["verdict"] == "pass" and doc["reasons"] == [] and doc["expect_identical"] is True
      and doc["feature_not_active"] is False,
      "--expect-identical on identical files: exit 0, pass, no reasons (rc=%d)" % rc)

# one tensor differs by one ulp-sized step: still within T1, but not identical
cand1 = {k: v.copy() for k, v in ref.items()}
cand1["/dit.step/0001/out"][1, 2, 3] += 1e-12
write(j("ulp.h5"), cand1)
rc, out, err = run(j("ref.h5"), j("ulp.h5"), "--expect-identical", "--json", "-")
doc = json.loads(out)
check(rc == 1 and doc["verdict"] == "fail", "--expect-identical with one tiny difference: exit 1 (rc=%d)" % rc)
check(doc["reasons"] == ["not identical: 1 of 5 compared tensors differ from the reference "
                         "(first: /dit.step/0001/out)"], "not-identical reason: %r" % doc["reasons"])
bad = [t for t in doc["tensors"] if t["verdict"] == "fail"]
check([t["path"] for t in bad] == ["/dit.step/0001/out"] and doc["first_failure"] == "/dit.step/0001/out"
      and bad[0]["reasons"][-1].startswith("not identical"),
      "--expect-identical: only the differing tensor fails, with a 'not identical' reason")
# without --expect-identical the same pair passes T1 (the feature is active)
rc, out, err = run(j("ref.h5"), j("ulp.h5"), "--json", "-")
doc = json.loads(out)
check(rc == 0 and doc["feature_active"] is True and doc["reasons"] == [],
      "tiny difference without --expect-identical: exit 0, feature active (rc=%d)" % rc)

# --- 2. JUnit ------------------------------------------------------------------
cand = {k: v.copy() for k, v in ref.items() if k != "/vae.decode/0000/out"}
cand["/dit.step/0000/out"] = ref["/dit.step/0000/out"] * 1.05          # fails T1
cand[WEIRD] = ref[WEIRD] + 0.3                                           # fails T1
cand["/extra/0000/out"] = np.ones(3, np.float32)                        # missing in reference
skips = [{"path": "/vae.encode/0000/out", "reason": "stream capturing a <CUDA> graph & more"}]
write(j("cand.h5"), cand, skips)

rc, out, err = run(j("ref.h5"), j("cand.h5"), "--json", j("c.json"), "--junit", j("c.xml"))
check(rc == 1, "JUnit run: exit 1 (rc=%d)" % rc)
doc = json.load(open(j("c.json")))
root = ET.parse(j("c.xml")).getroot()
suites = root.findall("testsuite") if root.tag == "testsuites" else [root]
check(len(suites) == 1 and suites[0].get("name") == "probe-compare", "one testsuite named probe-compare")
suite = suites[0]
cases = suite.findall("testcase")
by_name = {c.get("name"): c for c in cases}
ntens = len(doc["tensors"])
nmiss = len(doc["missing_in_candidate"]) + len(doc["missing_in_reference"])
check(ntens == 4 and nmiss == 2 and len(doc["skipped"]) == 1, "JSON: 4 compared, 2 missing, 1 skipped")
check(len(cases) == ntens + nmiss + 1, "one test case per tensor, missing and skipped capture (%d)" % len(cases))
nfail_json = sum(t["verdict"] == "fail" for t in doc["tensors"]) + nmiss
check(int(suite.get("tests")) == len(cases) and int(suite.get("failures")) == nfail_json
      and int(suite.get("skipped")) == 1,
      "testsuite counts: tests %s failures %s (JSON %d) skipped %s" % (
          suite.get("tests"), suite.get("failures"), nfail_json, suite.get("skipped")))
for t in doc["tensors"]:
    c = by_name.get(t["path"])
    if c is None:
        check(False, "test case for %s" % t["path"])
        continue
    check(c.get("classname") == t["component"], "%s: classname %r == component" % (t["path"], c.get("classname")))
    f = c.find("failure")
    if t["verdict"] == "pass":
        check(f is None and c.find("skipped") is None, "%s: passing test case has no failure" % t["path"])
        continue
    check(f is not None and f.get("message") == t["reasons"][0],
          "%s: failure message is the first reason %r" % (t["path"], t["reasons"][0]))
    text = f.text or ""
    check(all(r in text for r in t["reasons"]), "%s: failure text holds every reason" % t["path"])
    m = re.search(r"rel_l2=(\S+)", text)
    r64 = ref[t["path"]].astype(np.float64).ravel()
    c64 = cand[t["path"]].astype(np.float64).ravel()
    want = np.linalg.norm(c64 - r64) / np.linalg.norm(r64)
    check(m is not None and abs(float(m.group(1)) - want) <= 1e-8 * want,
          "%s: rel_l2 in the failure text %s == numpy %.9g" % (t["path"], m and m.group(1), want))
    m = re.search(r"max_abs=(\S+)", text)
    want = np.abs(c64 - r64).max()
    check(m is not None and abs(float(m.group(1)) - want) <= 1e-8 * want,
          "%s: max_abs in the failure text == numpy %.9g" % (t["path"], want))
weird = by_name.get(WEIRD)
check(weird is not None and weird.get("classname") == 'we&ird<comp>"x\'',
      "path with & < > \" ' survives XML escaping as name and classname")
for p, what in [("/vae.decode/0000/out", "missing in candidate"), ("/extra/0000/out", "missing in reference")]:
    c = by_name.get(p)
    check(c is not None and c.find("failure") is not None and c.find("failure").get("message") == what
          and c.get("classname") == p.split("/")[1], "%s: failing test case '%s'" % (p, what))
c = by_name.get("/vae.encode/0000/out")
check(c is not None and c.find("skipped") is not None and c.find("failure") is None
      and "stream capturing a <CUDA> graph & more" in c.find("skipped").get("message"),
      "skipped capture: <skipped/> with the reason")
check(by_name.get("verdict") is None, "no run-level verdict case when the feature is active")

# JUnit of the identical pair: tensors pass, a run-level case carries the failure
rc, out, err = run(j("ref.h5"), j("ref_copy.h5"), "--junit", "-")
root = ET.fromstring(out)
suite = root.find("testsuite")
cases = suite.findall("testcase")
v = [c for c in cases if c.get("classname") == "probe-compare" and c.get("name") == "verdict"]
check(rc == 1 and len(cases) == 6 and len(v) == 1 and v[0].find("failure").get("message") == NOT_ACTIVE
      and int(suite.get("failures")) == 1,
      "--junit - on an identical pair: XML on stdout, 5 passing cases + failing 'verdict' (rc=%d)" % rc)
check("FAIL:" in err and "FAIL:" not in out, "--junit -: the human text goes to stderr")
rc, out, err = run(j("ref.h5"), j("ref_copy.h5"), "--junit", "-", "--expect-identical")
suite = ET.fromstring(out).find("testsuite")
check(rc == 0 and int(suite.get("failures")) == 0 and len(suite.findall("testcase")) == 5,
      "--junit with --expect-identical on identical files: 5 passing cases (rc=%d)" % rc)

# --- 3. progress ---------------------------------------------------------------
rc, out, err = run(j("ref.h5"), j("cand.h5"))
check("\r" not in err and "tensors," not in err and "\033" not in err and "\r" not in out,
      "stderr not a terminal: no progress output")

def run_pty(*args):
    master, slave = pty.openpty()
    p = subprocess.Popen([COMPARE, *args], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    buf = b""
    while True:
        r, _, _ = select.select([master], [], [], 30)
        if not r:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    os.close(master)
    out = p.stdout.read()
    p.wait()
    return p.returncode, out.decode(), buf.decode(errors="replace")

rc, out, tty = run_pty(j("ref.h5"), j("cand.h5"))
total_mib = sum(v.nbytes for v in ref.values()) / 1048576.0
m = re.findall(r"\rprobe-compare: (\d+)/(\d+) tensors, ([0-9.]+)/([0-9.]+) MiB", tty)
check(rc == 1 and m and m[-1][0] == "5" and m[-1][1] == "5", "terminal: progress line reaches 5/5 tensors (%r)" % tty[:200])
check(m and all(b == "%.1f" % total_mib for _, _, _, b in m),
      "terminal: progress counts the reference bytes (%.1f MiB)" % total_mib)
check(tty.rstrip().endswith("\r\x1b[K") or "\r\x1b[K" in tty, "terminal: the progress line is cleared at the end")
check("\r" not in out and "PASS" not in out and "FAIL:" in out, "terminal progress stays off stdout")
rc, out, tty = run_pty(j("ref.h5"), j("cand.h5"), "--quiet")
check("tensors," not in tty, "--quiet: no progress even on a terminal")

# --- 4. bad input --------------------------------------------------------------
for args, needle in [
    (("--junit", "-", "--json", "-"), "stdout"),
    (("--junit", j("ref.h5")), "refusing to overwrite"),
    (("--junit", j("no/dir/x.xml")), "x.xml"),
    (("--junit",), "option needs an argument"),
]:
    rc, out, err = run(j("ref.h5"), j("cand.h5"), *args) if args != ("--junit",) else run(j("ref.h5"), j("cand.h5"), "--junit")
    lines = err.strip().splitlines()
    check(rc == 2 and lines and needle in lines[0] and lines[0].startswith("probe-compare: "),
          "bad input %r: exit 2, one line naming %r (rc=%d, %r)" % (args, needle, rc, err))

print("test_verdict_junit: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
