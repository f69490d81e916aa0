#!/usr/bin/env python3
"""How a run ended (the manifest key run_end, docs/file-format.md) and
probe-compare's verdict on a capture that did not complete
(docs/compare-json.md "Incomplete captures"), on the embedded example
(scripts/example/toy_pipeline.py) under probe-run.

 (1) a complete run: run_end {"exit_status": 0, "signal": null, "capture":
     "closed", "capture_complete": true}; two complete identical runs are
     still "feature not active" (exit 1);
 (2) a candidate that crashes half-way (SIGSEGV at its second scheduler step; SIGABRT under
     a preloaded sanitizer runtime, which reports a SIGSEGV itself): probe-run ends by it like the
     command alone (exit 139, the same
     stdout/stderr bytes), run_end {"signal": "SIGSEGV", "capture":
     "journal"}; probe-compare exits 1 with exactly one run-level reason
     "incomplete capture: the candidate run did not complete (killed by signal
     SIGSEGV; its writer did not close the capture): it lacks N of the
     reference's M tensors" with N = the missing tensors, M = N + compared,
     never "feature not active"; JSON incomplete_candidate, run_end.candidate;
     the JUnit verdict test case fails with that message; the sides swapped
     name the reference; probe-recover keeps run_end and the verdict;
 (3) a command that exits 3 after a complete capture: "(exit status 3)";
 (4) a command killed before any process wrote the file: a capture with no
     tensors, run_end "not written", "lacks M of the reference's M tensors";
 (5) signals sent to probe-run's pid reach the command (SIGTERM, SIGINT), and
     probe-run ends by the same signal, recorded in run_end;
 (6) files without run_end (h5py): every compared tensor identical but one
     missing is a failure without "feature not active"; nothing incomplete;
 (7) bad input: a command that removes its capture (one probe-run line, its
     exit status kept), a run_end that is not an object (incomplete, exit 1,
     "its run_end does not say that it completed"), a capture still held by a
     background process of the run (one line, status kept), a missing file
     (exit 2).
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR")
SRC = os.environ.get("PROBE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PY = os.environ.get("PROBE_PYTHON") or sys.executable
TOY_DIR = os.path.join(SRC, "scripts", "example")
ARGS = ["--steps", "3", "--frames", "2", "--height", "32", "--width", "32"]
FAILURES = []
# The crash: SIGSEGV, except where a sanitizer runtime preloaded into every process (the ASan
# build of these tests) turns a SIGSEGV into its own report and exit status 1.
SIG = "SIGABRT" if "san.so" in os.environ.get("LD_PRELOAD", "") else "SIGSEGV"

# The toy pipeline, killed by a signal at its CRASH_AT-th scheduler step (or
# exiting with EXIT_WITH after a complete run).
CRASH = r'''
import os, signal, sys
sys.path.insert(0, os.environ["TOY_DIR"])
import toy_pipeline as tp
orig = tp.ToyVideoPipeline._call
n = [0]
def _call(self, component, fn, args, out_fields):
    if component == "scheduler.step":
        n[0] += 1
        if n[0] == int(os.environ.get("CRASH_AT", "0")):
            sys.stdout.write("crashing\n"); sys.stdout.flush()
            os.kill(os.getpid(), getattr(signal, os.environ.get("CRASH_SIG", "SIGSEGV")))
    return orig(self, component, fn, args, out_fields)
tp.ToyVideoPipeline._call = _call
rc = tp.main(sys.argv[1:])
sys.exit(int(os.environ.get("EXIT_WITH", rc)))
'''


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def run(cmd, env=None, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=300, **kw)
    return p


def manifest(path):
    with h5py.File(path, "r") as f:
        m = f.attrs["probe.manifest"]
    return json.loads(m.decode() if isinstance(m, bytes) else m)


def reader_manifest(cmp_, ref, path):
    """The manifest as the probe reader gives it (from the journal when there is one)."""
    p = run([cmp_, ref, path, "--json", "-", "--quiet"])
    return json.loads(p.stdout)["manifests"]["candidate"]


def compare(cmp_, a, b, *extra):
    p = run([cmp_, a, b, "--json", "-", "--quiet", *extra])
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = {}
    return p.returncode, doc, p.stderr.decode()


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR is not set", file=sys.stderr)
        return 1
    run_ = os.path.join(BUILD, "bin", "probe-run")
    cmp_ = os.path.join(BUILD, "bin", "probe-compare")
    rec_ = os.path.join(BUILD, "bin", "probe-recover")
    d = tempfile.mkdtemp(prefix="probe-run-end-")
    j = lambda *p: os.path.join(d, *p)  # noqa: E731
    prog = j("crash.py")
    with open(prog, "w") as fh:
        fh.write(CRASH)
    env = dict(os.environ, TOY_DIR=TOY_DIR)

    # (1) complete runs
    p = run([run_, "--out", j("ref.h5"), "--", PY, prog] + ARGS, env=env)
    check(p.returncode == 0, "(1) reference run exits 0 (%s)" % p.stderr.decode()[-300:])
    re0 = manifest(j("ref.h5")).get("run_end", {})
    check(re0.get("exit_status") == 0 and re0.get("signal") is None and re0.get("capture") == "closed"
          and re0.get("capture_complete") is True and re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$",
                                                                 re0.get("end_time", "")),
          "(1) run_end of a complete run: %r" % re0)
    check(manifest(j("ref.h5")).get("command", [None, None])[1] == prog,
          "(1) the writer's manifest is kept next to run_end")
    p = run([run_, "--out", j("same.h5"), "--", PY, prog] + ARGS, env=env)
    rc, doc, err = compare(cmp_, j("ref.h5"), j("same.h5"))
    check(rc == 1 and doc.get("feature_not_active") is True and doc.get("incomplete_candidate") is False
          and doc["reasons"] == ["feature not active: the candidate is identical to the reference in every "
                                 "compared tensor"],
          "(1) two complete identical runs: still feature not active (%r)" % doc.get("reasons"))

    # (2) a candidate that crashes half-way
    cenv = dict(env, CRASH_AT="2", CRASH_SIG=SIG)
    signum = getattr(signal, SIG)
    plain = run([PY, prog] + ARGS, env=cenv)
    p = run([run_, "--out", j("cand.h5"), "--", PY, prog] + ARGS, env=cenv)
    check(plain.returncode == -signum and p.returncode == -signum,
          "(2) probe-run ends by %s as the command alone (%d, %d)" % (SIG, p.returncode, plain.returncode))
    check(p.stdout == plain.stdout == b"crashing\n" and p.stderr == plain.stderr,
          "(2) the command's stdout and stderr bytes are unchanged (%r %r)" % (p.stdout, p.stderr[-200:]))
    check(os.path.exists(j("cand.h5.journal")), "(2) the killed writer left its journal")
    rc, doc, err = compare(cmp_, j("ref.h5"), j("cand.h5"), "--junit", j("cand.xml"))
    recand = (doc.get("run_end") or {}).get("candidate") or {}
    check(recand.get("signal") == SIG and recand.get("exit_status") is None
          and recand.get("capture") == "journal" and recand.get("capture_complete") is False,
          "(2) run_end of the crashed run, read through its journal: %r" % recand)
    nmiss, ncmp = len(doc.get("missing_in_candidate", [])), len(doc.get("tensors", []))
    want = ("incomplete capture: the candidate run did not complete (killed by signal %s; its writer "
            "did not close the capture): it lacks %d of the reference's %d tensors" % (SIG, nmiss, nmiss + ncmp))
    check(rc == 1 and nmiss > 0 and doc.get("reasons") == [want], "(2) exit 1, one reason: %r" % doc.get("reasons"))
    check(doc.get("incomplete_candidate") is True and doc.get("incomplete_reference") is False
          and doc.get("feature_not_active") is False and doc.get("verdict") == "fail"
          and (doc.get("run_end") or {}).get("reference", {}).get("capture_complete") is True,
          "(2) JSON: incomplete_candidate, not feature_not_active, both run_end objects")
    check(all(t["identical"] for t in doc.get("tensors", [])),
          "(2) every tensor the candidate has is identical (the case that used to read 'feature not active')")
    tree = ET.parse(j("cand.xml"))
    v = [tc for tc in tree.iter("testcase") if tc.get("classname") == "probe-compare" and tc.get("name") == "verdict"]
    check(len(v) == 1 and v[0].find("failure") is not None and v[0].find("failure").get("message") == want
          and v[0].find("failure").get("type") == "verdict", "(2) JUnit: the verdict test case fails with the reason")
    p = run([cmp_, j("ref.h5"), j("cand.h5")])
    out = p.stdout.decode()
    check(want in out and "feature not active" not in out and re.search(r"\* run end +exit status 0, capture "
                                                                       r"complete +signal %s, capture journal" % SIG, out),
          "(2) terminal: the reason line and the runs table's run end row")
    rc, doc2, err = compare(cmp_, j("cand.h5"), j("ref.h5"))
    want2 = ("incomplete capture: the reference run did not complete (killed by signal %s; its writer "
             "did not close the capture): it lacks %d of the candidate's %d tensors" % (SIG, nmiss, nmiss + ncmp))
    check(rc == 1 and doc2.get("reasons") == [want2] and doc2.get("incomplete_reference") is True,
          "(2) sides swapped: the reference is named (%r)" % doc2.get("reasons"))
    p = run([rec_, j("cand.h5"), "-o", j("recovered.h5")])
    rc, doc3, err = compare(cmp_, j("ref.h5"), j("recovered.h5"))
    check(p.returncode == 0 and manifest(j("recovered.h5")).get("run_end", {}).get("signal") == SIG
          and rc == 1 and doc3.get("reasons") == [want], "(2) probe-recover keeps run_end and the verdict")

    # (3) a complete capture, then exit status 3
    p = run([run_, "--out", j("exit3.h5"), "--", PY, prog] + ARGS, env=dict(env, EXIT_WITH="3"))
    rc, doc, err = compare(cmp_, j("ref.h5"), j("exit3.h5"))
    check(p.returncode == 3 and rc == 1 and doc.get("reasons") == [
        "incomplete capture: the candidate run did not complete (exit status 3): it lacks 0 of the "
        "reference's %d tensors" % len(doc.get("tensors", []))] and not doc.get("feature_not_active"),
        "(3) exit status 3: incomplete, not feature not active (%r)" % doc.get("reasons"))

    # (4) killed before any process wrote the file
    p = run([run_, "--out", j("never.h5"), "--", "sh", "-c", "kill -KILL $$"])
    m = manifest(j("never.h5"))
    with h5py.File(j("never.h5"), "r") as f:
        nds = len(f.keys())
    check(p.returncode == -signal.SIGKILL and nds == 0 and m.get("command") == ["sh", "-c", "kill -KILL $$"]
          and m.get("run_end", {}).get("capture") == "not written"
          and m["run_end"].get("signal") == "SIGKILL", "(4) never written: a capture with no tensors: %r" % m)
    rc, doc, err = compare(cmp_, j("ref.h5"), j("never.h5"))
    n = len(doc.get("missing_in_candidate", []))
    check(rc == 1 and n > 0 and doc.get("reasons") == [
        "incomplete capture: the candidate run did not complete (killed by signal SIGKILL; no process of the "
        "run wrote the capture): it lacks %d of the reference's %d tensors" % (n, n)],
        "(4) probe-compare: one reason, not 'not the same experiment' (%r)" % doc.get("reasons"))
    roots = [r for r in doc.get("root_inputs") or [] if r["path"].startswith("/")]
    check(roots and doc.get("same_experiment") is True and all(
        r["incomplete"] and not r["same"] and r["why"] == "missing in the candidate, whose capture is incomplete"
        for r in roots), "(4) roots missing from the incomplete candidate are 'incomplete', not differences")
    p = run([cmp_, j("ref.h5"), j("never.h5")])
    check(re.search(r"\n  unknown   /latents.init/0000/out: missing in the candidate, whose capture is incomplete\n",
                    p.stdout.decode()) and "not the same experiment" not in p.stdout.decode(),
          "(4) terminal: the roots are listed as unknown")

    # (5) signals sent to probe-run's pid are forwarded
    for sig in (signal.SIGTERM, signal.SIGINT):
        name = signal.Signals(sig).name
        out = j("sig-%s.h5" % name)
        sp = subprocess.Popen([run_, "--out", out, "--", "sh", "-c",
                               "trap - INT; echo ready; while :; do sleep 0.05; done"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        check(sp.stdout.readline() == b"ready\n", "(5) %s: the command runs" % name)
        sp.send_signal(sig)
        try:
            rc = sp.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sp.kill()
            rc = None
        sp.stdout.close()
        sp.stderr.close()
        m = manifest(out) if os.path.exists(out) and os.path.getsize(out) else {}
        check(rc == -sig and m.get("run_end", {}).get("signal") == name,
              "(5) %s to probe-run's pid reaches the command; probe-run ends by it (%r, %r)"
              % (name, rc, m.get("run_end")))

    # (6) files without run_end: identical tensors with one missing
    rng = np.random.default_rng(5)
    a = {"/dit.step/0000/out": rng.standard_normal((2, 3)), "/vae.decode/0000/out": rng.standard_normal(4)}
    with h5py.File(j("h_ref.h5"), "w") as f:
        for k, v in a.items():
            f[k] = v
    with h5py.File(j("h_cand.h5"), "w") as f:
        f["/dit.step/0000/out"] = a["/dit.step/0000/out"]
    rc, doc, err = compare(cmp_, j("h_ref.h5"), j("h_cand.h5"))
    check(rc == 1 and doc.get("feature_not_active") is False and doc.get("reasons") == []
          and doc.get("missing_in_candidate") == ["/vae.decode/0000/out"]
          and doc.get("incomplete_candidate") is False and doc.get("run_end") == {"reference": None,
                                                                                  "candidate": None},
          "(6) no run_end, one tensor missing: fail without 'feature not active' (%r)" % doc.get("reasons"))
    p = run([cmp_, j("h_ref.h5"), j("h_cand.h5")])
    check("feature not active" not in p.stdout.decode() and "missing in candidate" in p.stdout.decode(),
          "(6) terminal: no 'feature not active'")
    rc, doc, err = compare(cmp_, j("h_ref.h5"), j("h_ref.h5"))
    check(rc == 1 and doc.get("feature_not_active") is True, "(6) identical and complete: still feature not active")

    # (7) bad input
    p = run([run_, "--out", j("gone.h5"), "--", "sh", "-c", 'rm -f "$PROBE_OUT"; exit 4'])
    lines = p.stderr.decode().splitlines()
    check(p.returncode == 4 and lines == ["probe-run: %s: run_end not recorded: No such file or directory"
                                          % j("gone.h5")] and not os.path.exists(j("gone.h5")),
          "(7) capture removed by the command: exit 4 kept, one line (%r)" % lines)
    with h5py.File(j("h_bad.h5"), "w") as f:
        f["/dit.step/0000/out"] = a["/dit.step/0000/out"]
        f["/vae.decode/0000/out"] = a["/vae.decode/0000/out"]
        f.attrs["probe.manifest"] = json.dumps({"run_end": "done"})
    rc, doc, err = compare(cmp_, j("h_ref.h5"), j("h_bad.h5"))
    check(rc == 1 and doc.get("reasons") == [
        "incomplete capture: the candidate run did not complete (its run_end does not say that it completed): "
        "it lacks 0 of the reference's 2 tensors"] and doc.get("run_end", {}).get("candidate") == "done",
        "(7) a run_end that is not an object: incomplete (%r)" % doc.get("reasons"))
    # a background process of the run taps (claims the file) and outlives the command
    tapper = ("import ctypes, os, sys, time\n"
              "sys.path.insert(0, os.environ['PYTHONPATH'].split(':')[0])\n"
              "from probe_adapter import _abi\n"
              "lib = ctypes.CDLL(None)\n"
              "lib.probe_tap_v1.argtypes = [ctypes.POINTER(_abi.ProbeTapTensorV1)]\n"
              "a = (ctypes.c_float * 4)(1, 2, 3, 4)\n"
              "shape = (ctypes.c_int64 * 1)(4)\n"
              "strides = (ctypes.c_int64 * 1)(1)\n"
              "t = _abi.ProbeTapTensorV1(struct_size=ctypes.sizeof(_abi.ProbeTapTensorV1), abi_version=1,\n"
              "    component=b'x', slot=b'out', call=0, step=-1, cfg_branch=-1, device=-1, dtype=12, rank=1,\n"
              "    shape=shape, strides=strides, data=ctypes.addressof(a), stream=None, timestep=float('nan'))\n"
              "assert lib.probe_tap_v1(ctypes.byref(t)) == 0\n"
              "lib.probe_tap_flush_v1()\n"
              "time.sleep(3)\n")
    with open(j("bg.py"), "w") as fh:
        fh.write(tapper)
    t0 = time.monotonic()
    p = run([run_, "--out", j("bg.h5"), "--", "sh", "-c",
             '%s %s >/dev/null 2>&1 & sleep 1; exit 5' % (PY, j("bg.py"))])
    lines = p.stderr.decode().splitlines()
    check(p.returncode == 5 and time.monotonic() - t0 < 3 and lines and all(
        l.startswith("probe-run: %s: run_end not recorded: another process of the run still writes it"
                     % j("bg.h5")) for l in lines),
          "(7) a background process still holds the capture: one line, exit status 5 (%r)" % lines)
    rc, doc, err = compare(cmp_, j("ref.h5"), j("nosuch.h5"))
    check(rc == 2 and err.strip().splitlines() == ["probe-compare: %s: No such file or directory" % j("nosuch.h5")],
          "(7) a missing file: exit 2, one line (%r)" % err)

    if FAILURES:
        print("\n%d check(s) failed" % len(FAILURES))
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
