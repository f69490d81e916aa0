#!/usr/bin/env python3
"""Every way the capturing process can end keeps what it tapped
(intercept/capture/exits.c; docs/file-format.md "Exec continuation", docs/hardening.md).

With tests/exits_proc (N float32 tensors /exits/<i:04>/out, element k of
tensor i = image * 4e6 + i * 1000 + k % 1000, computed here with numpy) under
build/bin/probe-run:

 (1) _exit, _Exit, quick_exit, abort, self-SIGTERM, SIGINT (default
     disposition), SIGHUP: the exit status / signal probe-run reports is the
     one the same program reports with the shim inactive (PROBE_OUT unset);
     SIGTERM and SIGINT sent to probe-run's pid (forwarded) likewise;
     the file holds exactly the N tapped tensors, bit-exact, no journal, no
     `probe:` line, run_end "closed" with that status or signal;
 (2) exec into a second image of the same pid (which taps N more and
     _exits): one closed file with 2N tensors, the second image's calls
     numbered N..2N-1 with its own values, probe.seq 0..2N-1 in order, the
     manifest's "exec" {"image": 2, "previous": [{"pid", "tensors": N, ...}]};
     the second image SIGKILLed: probe-compare recovers at least the first
     image's N from the journal (re-listed in it), bit-exact, and every other
     tapped tensor is named as lost (a skip "lost: tapped, but the process
     ended before the writer wrote it", recovered.candidate.lost, the stderr
     line), exactly the missing ones;
     an exec that fails after the drain (ENOEXEC): one `probe:` line, the N
     tensors kept, later taps refused;
 (3) a forked child that calls _exit, and a vfork child that execs /bin/true:
     the parent's file is intact (2N tensors), nothing waits on the child;
 (4) bad cases: a writer that cannot finish within PROBE_EXIT_TIMEOUT_S
     (0.01 s, 192 MiB queued): _exit and SIGTERM are bounded, keep their
     status, and either the file is complete or one `probe:` line says it may
     be incomplete and the journal recovers a bit-exact prefix, the rest
     named as lost; a malformed
     PROBE_EXIT_TIMEOUT_S: one line; a PROBE_EXEC_CAPTURE that is garbage or
     names another inode: the file is not continued (today's one line, the
     file unchanged); disk full during the drain (a tmpfs in a
     private mount namespace, root only): one line naming ENOSPC, status
     kept, a readable bit-exact prefix, no journal;
 (5) the toy pipeline (scripts/example/toy_pipeline.py): os._exit after 200
     steps keeps every tensor the pipeline saved itself (--save: count and
     bytes); os.abort, self-SIGTERM and SIGINT (Python's KeyboardInterrupt,
     which ends by re-raising SIGINT without the exit handlers) keep the
     complete capture; os.execv into a second run of the pipeline gives the
     file that two runs in one process give (paths, bytes, probe.seq,
     probe.parent, probe.call, probe.step).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import asan_runtime  # noqa: E402

BUILD = os.environ.get("PROBE_BUILD_DIR")
SRC = os.environ.get("PROBE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PY = os.environ.get("PROBE_PYTHON") or "/usr/bin/python3"
TOY_DIR = os.path.join(SRC, "scripts", "example")
FAILURES = []


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def probe_lines(err):
    return [l for l in err.splitlines() if l.startswith("probe:")]


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda k, v: out.__setitem__("/" + k, v[()]) if isinstance(v, h5py.Dataset) else None)
    return out


def attrs(path, name):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(k, v):
            if isinstance(v, h5py.Dataset) and name in v.attrs:
                a = v.attrs[name]
                out["/" + k] = a.decode() if isinstance(a, bytes) else (a.item() if hasattr(a, "item") else a)
        f.visititems(visit)
    return out


def manifest(path):
    with h5py.File(path, "r") as f:
        m = f.attrs["probe.manifest"]
    return json.loads(m.decode() if isinstance(m, bytes) else m)


def expected(i, kb, image):
    k = np.arange(kb * 256, dtype=np.int64)
    return (image * 4000000 + i * 1000 + k % 1000).astype(np.float32)


def exact(got, paths_values):
    """got holds exactly the given {path: array}, bit for bit."""
    if set(got) != set(paths_values):
        return False
    return all(got[p].dtype == v.dtype and got[p].tobytes() == v.tobytes() for p, v in paths_values.items())


def run(cmd, env=None, timeout=300, **kw):
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=timeout, **kw)
    p.wall = time.monotonic() - t0
    return p


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR is not set", file=sys.stderr)
        return 1
    probe_run = os.path.join(BUILD, "bin", "probe-run")
    compare = os.path.join(BUILD, "bin", "probe-compare")
    prog = os.path.join(BUILD, "tests", "exits_proc")
    shim = os.path.join(BUILD, "lib", "libprobe_intercept.so")
    if asan_runtime():  # a sanitizer-built shim needs its runtime preloaded first
        shim = asan_runtime() + ":" + shim
    d = tempfile.mkdtemp(prefix="probe-exits-")
    j = lambda *p: os.path.join(d, *p)  # noqa: E731
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE_")}
    try:
        # (1) every exit of one image
        N, KB = 300, 16
        want = {"/exits/%04d/out" % i: expected(i, KB, 1) for i in range(N)}
        status_of = {"_exit": 7, "_Exit": 7, "quick_exit": 7, "abort": -signal.SIGABRT,
                     "term": -signal.SIGTERM, "int": -signal.SIGINT, "hup": -signal.SIGHUP}
        for how, status in status_of.items():
            inactive = run([prog, how, str(N), str(KB), "1"],
                           env=dict(base_env, LD_PRELOAD=shim))
            out = j("one-%s.h5" % how)
            p = run([probe_run, "--out", out, "--", prog, how, str(N), str(KB), "1"], env=base_env)
            check(inactive.returncode == status and p.returncode == status,
                  "(1) %s: status %d under probe-run, %d with the shim inactive, %d expected"
                  % (how, p.returncode, inactive.returncode, status))
            check(p.stdout == inactive.stdout == "tapped %d\n" % N, "(1) %s: stdout unchanged" % how)
            check(probe_lines(p.stderr) == [], "(1) %s: no probe: line (%r)" % (how, probe_lines(p.stderr)))
            check(not os.path.exists(out + ".journal"), "(1) %s: no journal: the file was closed" % how)
            got = tensors(out)
            check(exact(got, want), "(1) %s: the file holds exactly the %d tapped tensors, bit-exact (%d)"
                  % (how, N, len(got)))
            re_ = manifest(out).get("run_end", {})
            sig = None if status >= 0 else signal.Signals(-status).name
            check(re_.get("capture") == "closed" and re_.get("signal") == sig
                  and re_.get("exit_status") == (status if status >= 0 else None),
                  "(1) %s: run_end %r" % (how, re_))

        # (1b) SIGTERM / SIGINT sent to probe-run's pid (kill, timeout): forwarded, drained
        for sig in (signal.SIGTERM, signal.SIGINT):
            out = j("sent-%s.h5" % signal.Signals(sig).name)
            sp = subprocess.Popen([probe_run, "--out", out, "--", prog, "wait", str(N), str(KB), "1"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env)
            line = sp.stdout.readline()
            sp.send_signal(sig)
            try:
                rc = sp.wait(timeout=60)
            except subprocess.TimeoutExpired:
                sp.kill()
                rc = None
            err = sp.stderr.read()
            sp.stdout.close()
            sp.stderr.close()
            re_ = manifest(out).get("run_end", {}) if os.path.getsize(out) else {}
            check(line == "tapped %d\n" % N and rc == -sig and probe_lines(err) == []
                  and exact(tensors(out), want) and re_.get("capture") == "closed"
                  and re_.get("signal") == signal.Signals(sig).name,
                  "(1b) %s sent to probe-run: ends by it, all %d tensors in a closed file (%r, %r)"
                  % (signal.Signals(sig).name, N, rc, re_))

        # (2) exec: the second image continues the capture
        out = j("exec.h5")
        p = run([probe_run, "--out", out, "--", prog, "exec", str(N), str(KB), "1"], env=base_env)
        check(p.returncode == 7 and probe_lines(p.stderr) == [],
              "(2) exec then _exit: status 7, no probe: line (%d, %r)" % (p.returncode, probe_lines(p.stderr)))
        want2 = dict(want)
        want2.update({"/exits/%04d/out" % (N + i): expected(i, KB, 2) for i in range(N)})
        got = tensors(out)
        check(exact(got, want2), "(2) both images' tensors, the second's at calls %d..%d (%d tensors)"
              % (N, 2 * N - 1, len(got)))
        seq = attrs(out, "probe.seq")
        order = [p_ for p_, _ in sorted(seq.items(), key=lambda kv: kv[1])]
        check(sorted(seq.values()) == list(range(2 * N)) and order == sorted(want2),
              "(2) probe.seq runs 0..%d across both images, in tap order" % (2 * N - 1))
        calls = attrs(out, "probe.call")
        check(all(calls[p_] == int(p_.split("/")[2]) for p_ in want2), "(2) probe.call follows the path")
        m = manifest(out)
        ex = m.get("exec", {})
        prev = ex.get("previous", [{}])
        check(ex.get("image") == 2 and len(prev) == 1 and prev[0].get("tensors") == N
              and prev[0].get("pid") == m.get("pid") and prev[0].get("command", [None])[0] == prog,
              "(2) manifest exec %r" % ex)
        check(m.get("command", [None, None])[1] == "_exit", "(2) the manifest is the second image's")
        check(m.get("run_end", {}).get("capture") == "closed", "(2) run_end closed")

        out = j("exec-killed.h5")
        p = run([probe_run, "--out", out, "--", prog, "exec", str(N), str(KB), "1"],
                env=dict(base_env, EXITS_NEXT="kill"))
        check(p.returncode == -signal.SIGKILL and os.path.exists(out + ".journal"),
              "(2) second image SIGKILLed: status %d, journal left" % p.returncode)
        c = run([compare, j("exec.h5"), out, "--json", "-", "--quiet", "--expect-identical"])
        try:
            doc = json.loads(c.stdout)
        except ValueError:
            doc = {}
        rec = doc.get("recovered", {}).get("candidate", {})
        done = rec.get("complete", -1)
        missing = doc.get("missing_in_candidate", [])
        check(c.returncode in (0, 1) and N <= done <= 2 * N and len(doc.get("tensors", [])) == done
              and len(missing) == 2 * N - done and all(t["identical"] for t in doc.get("tensors", [])),
              "(2) the killed continuation's journal recovers the first image's %d tensors and %d of the "
              "second's, bit-exact; the rest listed missing (rc %d, %r)"
              % (N, done - N, c.returncode, rec))
        check_lost(doc, c.stderr, missing, "(2) killed continuation")

        bad = j("not-a-program")
        with open(bad, "wb") as fh:
            fh.write(b"\x01\x02\x03 not a program\n")
        os.chmod(bad, 0o755)
        out = j("execfail.h5")
        p = run([probe_run, "--out", out, "--", prog, "execfail", str(N), str(KB), "1"],
                env=dict(base_env, EXITS_BAD_EXEC=bad))
        lines = probe_lines(p.stderr)
        check(p.returncode == 5 and len(lines) == 1 and "exec of %s failed" % bad in lines[0]
              and "captures nothing more" in lines[0],
              "(2) a failed exec after the drain: one line, later taps refused (%d, %r)" % (p.returncode, lines))
        check(exact(tensors(out), want), "(2) failed exec: the %d tensors before it kept" % N)

        # (3) fork and vfork children
        for how, child in (("fork", 3), ("vfork", 0)):
            out = j("%s.h5" % how)
            p = run([probe_run, "--out", out, "--", prog, how, str(N), str(KB), "1"], env=base_env, timeout=60)
            want3 = {"/exits/%04d/out" % i: expected(i, KB, 1) for i in range(2 * N)}
            check(p.returncode == 0 and "child status %d\n" % child in p.stdout and p.wall < 20,
                  "(3) %s: child status %d, parent exits 0 in %.1f s" % (how, child, p.wall))
            check(exact(tensors(out), want3) and probe_lines(p.stderr) == [],
                  "(3) %s: the child's exit left the parent's file intact (2N tensors)" % how)

        # (4) bad cases: a writer that cannot finish in time
        NB, KBB = 24, 8192
        ref = j("big-ref.h5")
        p = run([probe_run, "--out", ref, "--", prog, "exit", str(NB), str(KBB), "1"], env=base_env)
        check(p.returncode == 0 and len(tensors(ref)) == NB, "(4) reference of %d x 8 MiB" % NB)
        for how, status in (("_exit", 7), ("term", -signal.SIGTERM)):
            out = j("hung-%s.h5" % how)
            p = run([probe_run, "--out", out, "--", prog, how, str(NB), str(KBB), "1"],
                    env=dict(base_env, PROBE_EXIT_TIMEOUT_S="0.01"), timeout=120)
            lines = probe_lines(p.stderr)
            check(p.returncode == status and p.wall < 30,
                  "(4) %s with a 0.01 s bound: status %d, %.2f s" % (how, p.returncode, p.wall))
            if lines:
                check(len(lines) == 1 and "may be incomplete" in lines[0] and "0.01 s" in lines[0],
                      "(4) %s: one line says the capture may be incomplete (%r)" % (how, lines))
                c = run([compare, ref, out, "--json", "-", "--quiet", "--expect-identical"])
                try:
                    doc = json.loads(c.stdout)
                except ValueError:
                    doc = {}
                n = len(doc.get("tensors", []))
                missing = doc.get("missing_in_candidate", [])
                check(c.returncode == 1 and n + len(missing) == NB
                      and all(t["identical"] for t in doc.get("tensors", [])),
                      "(4) %s: %d tensors recovered bit-exact, the other %d listed missing (rc %d)"
                      % (how, n, NB - n, c.returncode))
                check_lost(doc, c.stderr, missing, "(4) %s" % how)
            else:
                check(len(tensors(out)) == NB, "(4) %s: the writer finished in time: complete" % how)
        out = j("badtimeout.h5")
        p = run([probe_run, "--out", out, "--", prog, "_exit", "3", "1", "1"],
                env=dict(base_env, PROBE_EXIT_TIMEOUT_S="soon"))
        lines = probe_lines(p.stderr)
        check(p.returncode == 7 and len(lines) == 1 and "PROBE_EXIT_TIMEOUT_S=soon" in lines[0]
              and len(tensors(out)) == 3, "(4) malformed PROBE_EXIT_TIMEOUT_S: one line (%r)" % lines)

        # (4) a marker that does not name this very file is ignored: today's ownership rules
        out = j("forged.h5")
        run([probe_run, "--out", out, "--", prog, "exit", "3", "1", "1"], env=base_env)
        before = open(out, "rb").read()
        st = os.stat(out)
        for marker in ("garbage", "1 %d %d %d %d %d 0 0 1 0" % (0, st.st_dev, st.st_ino + 1, st.st_size,
                                                                st.st_mtime_ns)):
            p = run(["sh", "-c", 'exec env PROBE_EXEC_CAPTURE="$(echo "$1" | sed "s/^1 0 /1 $$ /")" "$2" '
                     'exit 2 1 1', "sh", marker, prog], env=dict(base_env, PROBE_OUT=out, LD_PRELOAD=shim))
            lines = probe_lines(p.stderr)
            check(p.returncode == 0 and len(lines) == 1 and "already holds a capture" in lines[0]
                  and open(out, "rb").read() == before,
                  "(4) marker %r (another inode): not continued, one line, the file unchanged (%r)"
                  % (marker[:12], lines))

        disk_full(probe_run, prog, d, base_env)
        toy(probe_run, d, base_env)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("%d failures" % len(FAILURES))
    return 1 if FAILURES else 0


LOST = "lost: tapped, but the process ended before the writer wrote it"


def check_lost(doc, stderr, missing, what):
    """Every tensor the killed run tapped and never wrote is named: a skip with the lost reason
    for exactly the missing paths, the count in recovered.candidate.lost and on the stderr line."""
    lost = sorted(s["path"] for s in doc.get("skipped", []) if s["side"] == "candidate" and s["reason"] == LOST)
    n = doc.get("recovered", {}).get("candidate", {}).get("lost")
    lines = [l for l in stderr.splitlines() if "was not closed by its writer" in l]
    check(lost == sorted(missing) and n == len(missing) and len(missing) > 0
          and any(("%d tapped tensor" % n) in l and "lost" in l for l in lines),
          "%s: the %d tapped but unwritten tensors are listed as lost (%d skips, recovered.lost %r)"
          % (what, len(missing), len(lost), n))


def disk_full(probe_run, prog, d, env):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("skip - (4) disk full: needs root and unshare(1)")
        return
    mnt, kept = os.path.join(d, "mnt"), os.path.join(d, "kept")
    os.mkdir(mnt)
    os.mkdir(kept)
    t = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$1" && umount "$1"',
                        "sh", mnt], capture_output=True, text=True)
    if t.returncode != 0:
        print("skip - (4) disk full: no tmpfs in a private mount namespace: %s" % t.stderr.strip())
        return
    N, KB = 64, 256
    script = ('mount -t tmpfs -o size=6m tmpfs "$1" || exit 99; shift; "$@"; rc=$?; '
              'cp -a "$MNT"/. "$KEPT"/; exit $rc')
    out = os.path.join(mnt, "full.h5")
    p = run(["unshare", "-m", "sh", "-c", script, "sh", mnt, probe_run, "--out", out, "--", prog, "_exit",
             str(N), str(KB), "1"], env=dict(env, MNT=mnt, KEPT=kept))
    lines = probe_lines(p.stderr)
    check(p.returncode == 7, "(4) disk full: status 7 kept (%d)" % p.returncode)
    check(len(lines) == 1 and "full.h5" in lines[0] and "No space left on device" in lines[0],
          "(4) disk full: one probe: line naming the file and ENOSPC (%r)" % lines)
    got_path = os.path.join(kept, "full.h5")
    got = tensors(got_path) if os.path.exists(got_path) else {}
    prefix = {"/exits/%04d/out" % i: expected(i, KB, 1) for i in range(len(got))}
    check(0 < len(got) < N and exact(got, prefix),
          "(4) disk full: a readable bit-exact prefix of %d of %d tensors" % (len(got), N))
    check(not os.path.exists(got_path + ".journal"), "(4) disk full: no journal left (the writer closed the file)")


TOY_END = r'''
import os, signal, sys
sys.path.insert(0, os.environ["TOY_DIR"])
import toy_pipeline as tp
how = os.environ.get("END", "exit")
if how == "sigint-dfl":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
rc = tp.main(sys.argv[1:])
if os.environ.get("TWICE"):
    rc = tp.main(sys.argv[1:])
sys.stdout.flush()
if how == "_exit":
    os._exit(7)
if how == "abort":
    os.abort()
if how == "term":
    os.kill(os.getpid(), signal.SIGTERM)
if how in ("int", "sigint-dfl"):
    os.kill(os.getpid(), signal.SIGINT)
    signal.pause()
if how == "execv":
    os.environ["END"] = "exit"
    os.execv(sys.executable, [sys.executable] + sys.argv)
sys.exit(rc)
'''


def toy(probe_run, d, env):
    script = os.path.join(d, "toy_end.py")
    with open(script, "w") as fh:
        fh.write(TOY_END)
    env = dict(env, TOY_DIR=TOY_DIR)
    args = ["--steps", "200", "--frames", "2", "--height", "16", "--width", "16"]
    ref = os.path.join(d, "toy-ref.h5")
    p = run([probe_run, "--out", ref, "--", PY, script] + args, env=env)
    if not check(p.returncode == 0, "(5) toy reference (%s)" % p.stderr[-300:]):
        return
    want = tensors(ref)
    save = os.path.join(d, "saved")
    out = os.path.join(d, "toy-_exit.h5")
    p = run([probe_run, "--out", out, "--", PY, script] + args + ["--save", save], env=dict(env, END="_exit"))
    check(p.returncode == 7 and probe_lines(p.stderr) == [], "(5) os._exit(7) after 200 steps: status 7, no line")
    got = tensors(out)
    with open(os.path.join(save, "index.json")) as fh:
        index = json.load(fh)["tensors"]
    saved = {e["path"]: np.load(os.path.join(save, e["file"])) for e in index}
    check(len(got) == len(saved) == len(want) and set(got) == set(saved),
          "(5) os._exit: %d tensors in the file, %d saved by the pipeline itself" % (len(got), len(saved)))
    check(all(got[k].tobytes() == saved[k].tobytes() for k in saved if k in got),
          "(5) os._exit: every tensor's bytes equal the pipeline's own .npy")
    check(sum(v.nbytes for v in got.values()) == sum(v.nbytes for v in saved.values()),
          "(5) os._exit: %d bytes kept" % sum(v.nbytes for v in got.values()))
    for how, status in (("abort", -signal.SIGABRT), ("term", -signal.SIGTERM), ("int", -signal.SIGINT),
                        ("sigint-dfl", -signal.SIGINT)):
        out = os.path.join(d, "toy-%s.h5" % how)
        p = run([probe_run, "--out", out, "--", PY, script] + args, env=dict(env, END=how))
        got = tensors(out)
        check(p.returncode == status and not os.path.exists(out + ".journal")
              and exact(got, want), "(5) %s: status %d, the complete capture (%d of %d)"
              % (how, p.returncode, len(got), len(want)))
    short = ["--steps", "3", "--frames", "2", "--height", "16", "--width", "16"]
    twice, chain = os.path.join(d, "toy-twice.h5"), os.path.join(d, "toy-execv.h5")
    run([probe_run, "--out", twice, "--", PY, script] + short, env=dict(env, TWICE="1"))
    p = run([probe_run, "--out", chain, "--", PY, script] + short, env=dict(env, END="execv"))
    a, b = tensors(twice), tensors(chain)
    check(p.returncode == 0 and len(a) > 0 and exact(b, a),
          "(5) os.execv into a second run: the tensors of two runs in one process (%d, %d)" % (len(b), len(a)))
    for name in ("probe.seq", "probe.parent", "probe.call", "probe.step", "probe.module", "probe.class"):
        check(attrs(chain, name) == attrs(twice, name), "(5) os.execv: %s as in one process" % name)


if __name__ == "__main__":
    sys.exit(main())
