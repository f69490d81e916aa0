#!/usr/bin/env python3
"""A probe-run pipeline killed with SIGKILL at random points (docs/file-format.md
"Journal").

Runs scripts/example/toy_pipeline.py under build/bin/probe-run once to the
end (the reference), then 32 times killed (SIGKILL to its process group)
once its capture file has grown past a random fraction (0..1.03) of the
complete capture's size, plus 0..3 ms: kill points spread over the whole
write pattern whatever the machine's load. For every killed run whose capture file exists:

 - probe-compare REF KILLED prints exactly one recovery line naming the
   killed file and its journal (when the journal is still there), exits 0
   (nothing missing: the kill came after the close) or 1 (missing tensors),
   never 2; its JSON "recovered" key says the same;
 - every tensor it returns is bit-exact to the complete run's: checked here
   independently of probe's reader, by parsing the journal in Python (the
   format of docs/file-format.md, XXH64 written from its specification) and
   reading the bytes at the recorded offsets, against h5py's read of REF;
 - the returned tensors are a prefix of REF's execution order, the rest are
   listed as missing_in_candidate, nothing is missing_in_reference.
A clean run leaves no journal. Prints how many kills landed before the
capture file, during capture, and after the close. Last, probe-recover
rewrites one killed capture (-o, and in place): h5py reads exactly the
recovered tensors, bit-exact, with the complete run's probe.hash.
"""
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import shutil

import h5py
import numpy as np

from xxh64_oracle import xxh64  # pure Python, from the xxHash specification

BUILD = os.environ.get("PROBE_BUILD_DIR")
SRC = os.environ.get("PROBE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PY = os.environ.get("PROBE_PYTHON") or "/usr/bin/python3"
KILLS = int(os.environ.get("PROBE_CRASH_E2E_KILLS", "32"))
ARGS = ["--steps", "3", "--frames", "3", "--height", "32", "--width", "48"]
FAILURES = []


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def parse_journal(data):
    """Complete TENSOR records as {path: (offset, nbytes, hash, seq)}, in journal order."""
    assert data[:8] == b"PRBJRNL\n", "journal magic"
    at, out = 8, {}
    while at + 4 <= len(data):
        rlen, rtype = struct.unpack_from("<II", data, at)
        if rlen < 16 or at + rlen > len(data):
            break  # torn tail
        if xxh64(data[at:at + rlen - 8]) != struct.unpack_from("<Q", data, at + rlen - 8)[0]:
            break
        p = at + 8
        if rtype == 3:
            strs = []
            for _ in range(6):
                (n,) = struct.unpack_from("<I", data, p)
                p += 4
                if n == 0xFFFFFFFF:
                    strs.append(None)
                else:
                    strs.append(data[p:p + n].decode())
                    p += n
            seq = struct.unpack_from("<Q", data, p)[0]
            p += 8 + 8 + 8 + 4 + 8
            (rank,) = struct.unpack_from("<I", data, p)
            p += 4 + 8 * rank
            off, nb, h = struct.unpack_from("<QQQ", data, p)
            out[strs[0]] = (off, nb, h, seq)
        at += rlen
    return out


def ref_order(path):
    with h5py.File(path, "r") as f:
        items = []
        f.visititems(lambda n, o: items.append(("/" + n, int(o.attrs["probe.seq"])))
                     if isinstance(o, h5py.Dataset) else None)
    return [p for p, _ in sorted(items, key=lambda x: x[1])]


def h5_tensors(path):
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda n, o: out.__setitem__("/" + n, (np.ascontiguousarray(o[()]), o.attrs["probe.hash"]))
                     if isinstance(o, h5py.Dataset) else None)
        return out


def recover_checks(tmp, ref, want, killed, got):
    """probe-recover: a clean HDF5 capture h5py reads, with exactly the recovered tensors."""
    rec = os.path.join(BUILD, "bin", "probe-recover")
    out = os.path.join(tmp, "recovered.h5")
    r = subprocess.run([rec, killed, "-o", out], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and "probe-recover: wrote %s: %d complete captures" % (out, len(got)) in r.stderr,
          "probe-recover -o: exit 0 and its line (%d: %s)" % (r.returncode, r.stderr.strip()))
    check(not os.path.exists(out + ".journal") and os.path.exists(killed + ".journal"),
          "probe-recover -o leaves the input and its journal, and no journal of its own")
    with h5py.File(ref, "r") as f:
        ref_hash = {p: f[p].attrs["probe.hash"] for p in got}
    t = h5_tensors(out)
    check(sorted(t) == got and all(np.array_equal(t[p][0], want[p]) and t[p][0].dtype == want[p].dtype
                                   and t[p][1] == ref_hash[p] for p in got),
          "h5py reads the %d recovered tensors bit-exact, with the complete run's probe.hash" % len(got))
    r = subprocess.run([rec, killed], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and not os.path.exists(killed + ".journal"), "probe-recover in place: exit 0, journal removed")
    t = h5_tensors(killed)
    check(sorted(t) == got and all(np.array_equal(t[p][0], want[p]) for p in got), "in place: h5py reads the same tensors")
    r = subprocess.run([rec, ref], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and "nothing to recover" in r.stderr, "probe-recover of a closed file: nothing to do")
    r = subprocess.run([rec, os.path.join(tmp, "absent.h5")], capture_output=True, text=True, timeout=300)
    check(r.returncode == 2 and r.stderr.startswith("probe-recover: ") and r.stderr.count("\n") == 1,
          "probe-recover of a missing file: exit 2, one line")


def main():
    if not BUILD:
        print("FAIL - PROBE_BUILD_DIR is not set")
        return 1
    run_ = os.path.join(BUILD, "bin", "probe-run")
    cmp_ = os.path.join(BUILD, "bin", "probe-compare")
    toy = os.path.join(SRC, "scripts", "example", "toy_pipeline.py")
    tmp = tempfile.mkdtemp(prefix="probe-crash-kill-")
    try:
        ref = os.path.join(tmp, "ref.h5")
        t0 = time.monotonic()
        p = subprocess.run([run_, "--out", ref, "--", PY, toy] + ARGS, capture_output=True, text=True,
                           timeout=300)
        check(p.returncode == 0, "reference run exits 0 (%d: %s)" % (p.returncode, p.stderr[-500:]))
        check(not os.path.exists(ref + ".journal"), "a clean run leaves no journal")
        order = ref_order(ref)
        check(len(order) > 20, "reference holds %d tensors" % len(order))
        with h5py.File(ref, "r") as f:
            want = {k: np.ascontiguousarray(f[k][()]) for k in order}
        full_size = os.path.getsize(ref)
        rng = random.Random(int(os.environ.get("PROBE_CRASH_SEED", str(time.time_ns()))))
        phases = {"no capture file yet": 0, "capture in progress": 0, "after close": 0}
        partial_seen = 0
        last_recovered = None
        for k in range(KILLS):
            out = os.path.join(tmp, "k%d.h5" % k)
            proc = subprocess.Popen([run_, "--out", out, "--", PY, toy] + ARGS, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            # kill once the capture file has grown past a random fraction of
            # the complete capture's size (robust to the machine's load, unlike
            # a delay), a little later still at random
            target = rng.uniform(0, 1.03) * full_size
            while proc.poll() is None:
                try:
                    if os.path.getsize(out) >= target:
                        break
                except OSError:
                    pass
                time.sleep(0.0003)
            time.sleep(rng.uniform(0, 0.003))
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            if not os.path.exists(out):
                phases["no capture file yet"] += 1
                continue
            has_journal = os.path.exists(out + ".journal")
            phases["capture in progress" if has_journal else "after close"] += 1
            c = subprocess.run([cmp_, ref, out, "--json", "-", "--quiet", "--expect-identical"], capture_output=True,
                               text=True, timeout=300)
            name = "kill %d" % k
            if not check(c.returncode in (0, 1), "%s: probe-compare exits 0 or 1 (%d: %s)"
                         % (name, c.returncode, c.stderr.strip()[-300:].replace("\n", " | "))):
                continue
            lines = [l for l in c.stderr.splitlines() if "was not closed by its writer" in l]
            res = json.loads(c.stdout)
            if has_journal:  # the HTML report's inline JSON carries the same key
                html = os.path.join(tmp, "k.html")
                h = subprocess.run([cmp_, ref, out, "--html", html, "--quiet", "--expect-identical"],
                                   capture_output=True, text=True, timeout=300)
                with open(html) as f:
                    page = f.read()
                m = page.split('id="probe-data">', 1)[1].split("</script>", 1)[0]
                check(h.returncode == c.returncode and json.loads(m.replace("<\\/", "</")) == res,
                      "%s: the HTML's inline JSON equals --json" % ("kill %d" % k))
            rec = res.get("recovered", {}).get("candidate")
            if has_journal:
                check(len(lines) == 1 and lines[0].startswith("probe-compare: %s was not closed by its "
                      "writer (process killed?): " % out) and (out + ".journal") in lines[0],
                      "%s: one recovery line (%s)" % (name, lines))
                check(rec is not None and rec["journal"] == out + ".journal", "%s: JSON recovered.candidate" % name)
                check(res["recovered"]["reference"] is None, "%s: JSON recovered.reference is null" % name)
                if rec and rec["partial"]:
                    partial_seen += 1
                    check(rec["partial"] in order, "%s: partial %s is a tensor of the run" % (name, rec["partial"]))
                    check(rec["partial"] + " ignored" in lines[0], "%s: the line names the partial capture" % name)
            else:
                check(not lines and "recovered" not in res, "%s: no recovery line or key after a clean close" % name)
            got = [t["path"] for t in res["tensors"]]
            n = len(got)
            check(sorted(got) == sorted(order[:n]), "%s: the %d tensors returned are the first %d of the run"
                  % (name, n, n))
            check(res["missing_in_candidate"] == [] if n == len(order) else
                  sorted(res["missing_in_candidate"]) == sorted(order[n:]), "%s: the rest are missing" % name)
            check(res["missing_in_reference"] == [], "%s: nothing extra" % name)
            check(all(t["identical"] for t in res["tensors"]), "%s: probe-compare finds every tensor identical" % name)
            check(c.returncode == (0 if n == len(order) else 1), "%s: exit %d with %d of %d tensors"
                  % (name, c.returncode, n, len(order)))
            if has_journal:  # the same bytes, read without probe
                with open(out + ".journal", "rb") as f:
                    recs = parse_journal(f.read())
                with open(out, "rb") as f:
                    data = f.read()
                bad = []
                for path in got:
                    off, nb, h, _ = recs[path]
                    b = data[off:off + nb] if nb else b""
                    w = want[path]
                    if xxh64(b) != h or b != w.tobytes():
                        bad.append(path)
                check(set(got) <= set(recs) and not bad, "%s: %d tensors bit-exact to the complete run "
                      "(journal parsed here, bytes at its offsets)%s" % (name, n, bad[:3]))
            if has_journal and 0 < n < len(order):
                last_recovered = (out, sorted(got))
        print("# kills: %s; partial capture reported %d times" % (phases, partial_seen))
        if check(last_recovered is not None, "a killed capture with some tensors to recover"):
            recover_checks(tmp, ref, want, *last_recovered)
        check(phases["capture in progress"] >= KILLS // 3, "at least a third of the kills landed mid-capture")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failures" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
