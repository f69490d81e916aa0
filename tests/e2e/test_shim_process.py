"""Process-level behaviour of the preloaded shim.

- fork: children forked while the writer thread is inside HDF5 exit
  normally (60 of them, none may hang), and the parent's file is intact;
- fork: a forked child that taps gets 0, writes nothing, prints one
  `probe: pid N does not capture` line, and its normal exit (atexit handlers,
  destructors, HDF5's own exit hooks) leaves the parent's file intact; an
  exec'd grandchild (different pid) does not capture either.
- the first process of the run that taps claims the file: `bash -c 'exec
  prog'` captures, and so does `bash -c 'prog; true'` (bash forks and execs
  prog, which taps), with no warning; bash, which never tapped, leaves the
  file alone at its exit.
- a root process that never taps still creates the file (manifest, zero tensors).
- PROBE_OUT unset (or empty): inactive, taps return 0, no file anywhere in cwd.
- a file that already holds a capture is never overwritten: one warning.
- a second run with the same output while the first is capturing: probe-run
  refuses it (exit 2) and the first run's file is intact.
- probe_tap_flush_v1: after it returns, a copy of the file taken while the
  program is still running holds every tensor tapped before it.
- a relative PROBE_OUT is made absolute by the owner, so a later cd does not move it.
"""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (asan_runtime, attr_str, check, clean_env, finish, need_build,  # noqa: E402
                              preload_env, probe_lines, program, run, tmpdir)

import h5py  # noqa: E402
import numpy as np  # noqa: E402


def datasets(path):
    names = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: names.append("/" + n) if isinstance(o, h5py.Dataset) else None)
    return sorted(names)


def value_ok(path, ds, i):
    with h5py.File(path, "r") as f:
        return np.array_equal(f[ds][()], np.float32([i, i + 0.25, i + 0.5, i + 0.75]))


def main():
    need_build()
    prog = program("shim_tap_proc")
    d = tmpdir("probe-shim-proc-")

    # --- fork and exec'd grandchild ---
    out = os.path.join(d, "fork.h5")
    # LeakSanitizer (sanitizer build) can deadlock in a child forked from a
    # multithreaded process (its allocator lock is copied held): off here.
    r = run([prog, "fork"], preload_env(out, leaks=False))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "fork program exits 0")
    parent = int(re.search(r"parent pid (\d+)", r.stdout).group(1))
    m = re.search(r"child pid (\d+) rc=(-?\d+),(-?\d+) enabled=(\d+) flush=(-?\d+)", r.stdout)
    child = int(m.group(1))
    check(m.group(2) == "0" and m.group(3) == "0", "taps in the forked child return 0")
    check(m.group(4) == "0" and m.group(5) == "0", "forked child: enabled 0, flush 0")
    check("child status 0" in r.stdout and "grandchild status 0" in r.stdout, "children exit 0")
    lines = probe_lines(r.stderr)
    want_child = ("probe: pid %d does not capture: it was forked from pid %d, and a forked child never "
                  "captures" % (child, parent))
    check(lines.count(want_child) == 1, "exactly one warning from the forked child: %r" % want_child)
    gc = [l for l in lines if l != want_child]
    check(len(gc) == 1 and re.match(r"probe: pid (\d+) does not capture: the capture file %s is being written "
                                    r"by another process$" % re.escape(out), gc[0]) is not None
          and int(gc[0].split()[2]) not in (parent, child),
          "exactly one warning from the exec'd grandchild (%s)" % gc)
    check("rc grandchild 0 = 0" in r.stderr, "grandchild taps return 0")
    check(all("parent tap%d rc=0" % i in r.stdout for i in range(3)), "parent taps return 0")
    check(datasets(out) == ["/parent/0000/out", "/parent/0001/out", "/parent/0002/out"],
          "only the parent's tensors in the file (%s)" % datasets(out))
    check(all(value_ok(out, "/parent/%04d/out" % i, i) for i in range(3)), "parent values intact after the child exited")
    with h5py.File(out, "r") as f:
        man = json.loads(attr_str(f, "probe.manifest"))
    check(man["pid"] == parent, "manifest pid is the owner's")

    # --- children forked while the writer is inside HDF5 still exit ---
    # (a thread-safe HDF5 copied into the child with its lock held would make
    # the child's exit wait forever; fork() waits for the writer instead)
    out = os.path.join(d, "storm.h5")
    r = run([prog, "forkstorm", "60"], preload_env(out, leaks=False))
    check(r.returncode == 0 and "60 children, 0 hung" in r.stdout,
          "60 children forked during writes exit normally (%s)" % r.stdout.strip())
    with h5py.File(out, "r") as f:
        ok = all(np.array_equal(f["/storm/%04d/out" % i][()],
                                (i * 65536 + np.arange(65536)).astype(np.float32)) for i in range(150))
    check(ok, "all 150 tensors tapped during the fork storm are intact")

    # --- exec chain keeps the pid ---
    out = os.path.join(d, "exec.h5")
    r = run(["bash", "-c", "exec \"$0\" simple viaexec 3 0", prog], preload_env(out))
    check(r.returncode == 0 and probe_lines(r.stderr) == [], "bash -c 'exec prog' runs without warnings")
    check(datasets(out) == ["/viaexec/%04d/out" % i for i in range(3)], "exec'd program (same pid) captures")
    with h5py.File(out, "r") as f:
        man = json.loads(attr_str(f, "probe.manifest"))
    check(man["command"] == [prog, "simple", "viaexec", "3", "0"], "manifest command is the exec'd image's argv")

    out = os.path.join(d, "bashfork.h5")
    r = run(["bash", "-c", "\"$0\" simple forked 2 0; true", prog], preload_env(out))
    check(r.returncode == 0, "bash -c 'prog; true' exits 0")
    check(probe_lines(r.stderr) == [], "the program bash forked and exec'd claims the file, no warning (%s)"
          % probe_lines(r.stderr))
    check("rc forked 0 = 0" in r.stderr, "its taps return 0")
    check(datasets(out) == ["/forked/0000/out", "/forked/0001/out"],
          "its tensors are in the file; bash, which never tapped, left it alone (%s)" % datasets(out))

    # --- owner that never taps ---
    out = os.path.join(d, "notap.h5")
    r = run([prog, "notap"], preload_env(out, PROBE_LABEL="quiet"))
    check(r.returncode == 0 and r.stderr == "", "never-tapping owner runs silently")
    check(os.path.exists(out) and datasets(out) == [], "never-tapping owner still creates the file, no tensors")
    with h5py.File(out, "r") as f:
        man = json.loads(attr_str(f, "probe.manifest"))
        check(man["label"] == "quiet" and man["command"] == [prog, "notap"] and man["taps"]["accepted"] == 0,
              "its manifest: label, command, zero taps")
        check(attr_str(f, "probe.format") == "probe-capture", "it is a probe capture file")
    out = os.path.join(d, "true.h5")
    r = run(["/bin/true"], preload_env(out))
    check(r.returncode == 0 and os.path.exists(out) and datasets(out) == [], "/bin/true under the shim leaves an empty capture")

    # --- inactive ---
    for name, env in (("unset", preload_env(None)), ("empty", preload_env(""))):
        cwd = tmpdir("probe-shim-inactive-")
        r = run([prog, "simple", "inactive", "3", "5"], env, cwd=cwd)
        check(r.returncode == 5, "PROBE_OUT %s: exit status is the program's own (5)" % name)
        check(r.stdout == "program output: line one\nprogram output: line two\n", "PROBE_OUT %s: stdout unchanged" % name)
        check(all("rc inactive %d = 0" % i in r.stderr for i in range(3)) and "rc enabled = 0" in r.stderr
              and "rc flush = 0" in r.stderr, "PROBE_OUT %s: taps and flush return 0, enabled 0" % name)
        check(probe_lines(r.stderr) == [], "PROBE_OUT %s: no warnings" % name)
        check(os.listdir(cwd) == [], "PROBE_OUT %s: no file created" % name)
        check("NVTX_INJECTION64_PATH" not in env, "PROBE_OUT %s: the test env has no NVTX path" % name)

    # --- an existing capture is never overwritten ---
    out = os.path.join(d, "kept.h5")
    r = run([prog, "simple", "first", "2", "0"], preload_env(out))
    check(r.returncode == 0 and datasets(out) == ["/first/0000/out", "/first/0001/out"], "first run captures")
    r = run([prog, "simple", "second", "2", "0"], preload_env(out))
    check(r.returncode == 0 and len(probe_lines(r.stderr)) == 1
          and "already holds a capture" in probe_lines(r.stderr)[0],
          "second run on the same file: one warning (%s)" % probe_lines(r.stderr))
    check(datasets(out) == ["/first/0000/out", "/first/0001/out"] and value_ok(out, "/first/0001/out", 1),
          "the first capture is intact")

    # --- a second probe-run with the same --out while the first captures ---
    probe_run = os.path.join(os.environ["PROBE_BUILD_DIR"], "bin", "probe-run")
    out = os.path.join(d, "busy.h5")
    env = clean_env()  # probe-run preloads the shim itself (after libasan in the sanitizer build)
    if asan_runtime():
        env["LD_PRELOAD"] = asan_runtime()
    p = subprocess.Popen([probe_run, "--out", out, "--", prog, "flushwait", "5"], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    r2 = subprocess.run([probe_run, "--out", out, "--", "echo", "ran"], env=env, capture_output=True, text=True)
    check(r2.returncode == 2 and r2.stdout == "" and "being written by another process" in r2.stderr,
          "second probe-run on a file being captured: exit 2, command not run (%r)" % r2.stderr.strip())
    o, e = p.communicate("go\n", timeout=60)
    check(first.strip() == "flushed rc=0 bad=0" and p.returncode == 0, "first run finishes (%r)" % e)
    check(len(datasets(out)) == 6 and value_ok(out, "/flushed/0004/out", 4), "first run's file intact")

    # --- flush: the file is complete up to the flush while the program runs ---
    out = os.path.join(d, "flush.h5")
    p = subprocess.Popen([prog, "flushwait", "50"], env=preload_env(out), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    check(line.strip() == "flushed rc=0 bad=0", "flush returned 0 (%r)" % line)
    snap = os.path.join(d, "flush-snapshot.h5")
    shutil.copyfile(out, snap)
    got = datasets(snap)
    check(got == ["/flushed/%04d/out" % i for i in range(50)], "snapshot after flush holds all 50 tensors (%d)" % len(got))
    check(all(value_ok(snap, "/flushed/%04d/out" % i, i) for i in range(50)), "snapshot values correct")
    o, e = p.communicate("go\n", timeout=60)
    check(p.returncode == 0, "program continues tapping after flush (rc=%s %s)" % (p.returncode, e))
    check(len(datasets(out)) == 51, "final file has 51 tensors")

    # --- relative PROBE_OUT ---
    cwd = tmpdir("probe-shim-rel-")
    os.mkdir(os.path.join(cwd, "sub"))
    r = run(["bash", "-c", "cd sub && exec \"$0\" simple rel 1 0", prog], preload_env("rel.h5"), cwd=cwd)
    check(r.returncode == 0 and os.path.exists(os.path.join(cwd, "rel.h5"))
          and not os.path.exists(os.path.join(cwd, "sub", "rel.h5")),
          "relative PROBE_OUT resolved against the owner's starting directory")
    finish()


if __name__ == "__main__":
    main()
