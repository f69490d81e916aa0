#!/usr/bin/env python3
"""Disk full under probe-run (docs/file-format.md "Journal"): the toy
pipeline (scripts/example/toy_pipeline.py) under build/bin/probe-run with its
capture on a tmpfs too small for it (1200 KiB, the whole capture needs its
~270 KiB plus the writer's 1 MiB reservation ahead of each tensor).

Checks: exactly one `probe:` warning line naming the file and the full disk;
the pipeline's stdout (less its wall-clock time) and exit status are those of
the same pipeline run without probe; the capture is readable and holds a
non-empty prefix of the complete run's tensors, each bit-identical
(probe-compare --expect-identical against a complete capture: exit 1, the
rest listed as missing); no journal is left behind (the writer closed the
file after the failure).

Needs root and a private mount namespace (unshare -m) in which a tmpfs can
be mounted; otherwise exits 77 (ctest SKIP) and says why.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

BUILD = os.environ.get("PROBE_BUILD_DIR")
SRC = os.environ.get("PROBE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PY = os.environ.get("PROBE_PYTHON") or "/usr/bin/python3"
ARGS = ["--steps", "3", "--frames", "3", "--height", "32", "--width", "48"]
FAILURES = []


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def untimed(s):
    return re.sub(r"\(\d+\.\d+ s\)", "(T s)", s)


def main():
    if not BUILD:
        print("FAIL - PROBE_BUILD_DIR is not set")
        return 1
    if os.geteuid() != 0:
        print("SKIP: not root: a tmpfs cannot be mounted")
        return 77
    if shutil.which("unshare") is None:
        print("SKIP: no unshare(1)")
        return 77
    tmp = tempfile.mkdtemp(prefix="probe-enospc-")
    try:
        mnt = os.path.join(tmp, "mnt")
        os.mkdir(mnt)
        t = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs \"$1\" && umount \"$1\"",
                            "sh", mnt], capture_output=True, text=True)
        if t.returncode != 0:
            print("SKIP: unshare -m + mount -t tmpfs does not work here: %s" % t.stderr.strip())
            return 77
        toy = os.path.join(SRC, "scripts", "example", "toy_pipeline.py")
        plain = subprocess.run([PY, toy] + ARGS, capture_output=True, text=True, timeout=300)
        check(plain.returncode == 0, "the pipeline without probe exits 0")
        ref = os.path.join(tmp, "ref.h5")
        p = subprocess.run([os.path.join(BUILD, "bin", "probe-run"), "--out", ref, "--", PY, toy] + ARGS,
                           capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, "a complete capture (ref.h5)")
        kept = os.path.join(tmp, "kept")
        os.mkdir(kept)
        script = ('mount -t tmpfs -o size=1200k tmpfs "$1" || exit 99; shift; "$@"; rc=$?; '
                  'cp -a "$MNT"/. "$KEPT"/; exit $rc')
        env = dict(os.environ, MNT=mnt, KEPT=kept)
        out = os.path.join(mnt, "full.h5")
        r = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", mnt,
                            os.path.join(BUILD, "bin", "probe-run"), "--out", out, "--", PY, toy] + ARGS,
                           capture_output=True, text=True, timeout=300, env=env)
        print("stderr of the disk-full run:\n" + r.stderr)
        check(r.returncode == plain.returncode, "exit status %d is the pipeline's own (%d)"
              % (r.returncode, plain.returncode))
        check(untimed(r.stdout) == untimed(plain.stdout), "stdout as without probe (%r)" % r.stdout)
        lines = [l for l in r.stderr.splitlines() if l.startswith("probe:")]
        check(len(lines) == 1, "exactly one probe: line (%d)" % len(lines))
        check(bool(lines) and out in lines[0] and "No space left on device" in lines[0]
              and lines[0].endswith("capture disabled, the run continues"), "the line names the file and ENOSPC")
        got = os.path.join(kept, "full.h5")
        check(os.path.exists(got), "the capture file exists")
        check(not os.path.exists(got + ".journal"), "no journal left: the writer closed the file")
        c = subprocess.run([os.path.join(BUILD, "bin", "probe-compare"), ref, got, "--json", "-", "--quiet",
                            "--expect-identical"], capture_output=True, text=True, timeout=300)
        check(c.returncode == 1, "probe-compare: exit 1 (tensors missing), got %d: %s" % (c.returncode, c.stderr[-300:]))
        if c.returncode in (0, 1):
            res = json.loads(c.stdout)
            n, miss = len(res["tensors"]), len(res["missing_in_candidate"])
            check(n > 0 and miss > 0, "%d tensors written before the disk filled, %d missing" % (n, miss))
            check(all(t["identical"] for t in res["tensors"]), "every written tensor is bit-identical")
            check(res["missing_in_reference"] == [], "nothing extra")
            check("recovered" not in res, "not a recovered file: no JSON key \"recovered\"")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failures" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
