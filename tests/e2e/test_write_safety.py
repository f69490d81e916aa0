"""Capture output is written only where it should be.

probe-run:
- an existing non-empty --out is refused (exit 2, one line naming --force,
  the file's bytes unchanged, the command not run); with --force it is
  overwritten by the new capture;
- an --out that is a symbolic link is refused even with --force, and the
  link's target keeps its bytes;
- an empty existing --out (e.g. made by `touch`) is used.
The shim with PROBE_OUT set directly (no probe-run):
- a symbolic link (to a file, or dangling) is never written through: one
  `probe:` line, the target unchanged / not created, the program's stdout and
  exit status its own;
- a FIFO is refused without blocking, a directory too;
- the file is created with the process's umask applied to 0666 (022 -> 0644,
  027 -> 0640, 077 -> 0600).
"""
import os
import re
import stat
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (BUILD, check, finish, need_build, preload_env, probe_lines, program, run,  # noqa: E402
                              tmpdir)

STDOUT = "program output: line one\nprogram output: line two\n"


def probe_run(args, cwd):
    env = dict(os.environ)
    env.pop("PROBE_OUT", None)
    env.pop("PROBE_ROOT_PID", None)
    return subprocess.run([os.path.join(BUILD, "bin", "probe-run")] + args, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def shim_run(path, umask=None):
    prog = program("shim_tap_proc")
    env = preload_env(path)

    def pre():
        if umask is not None:
            os.umask(umask)
    return subprocess.run([prog, "simple", "ws", "3", "7"], env=env, capture_output=True, text=True,
                          timeout=60, preexec_fn=pre)


def refused_by_shim(name, r, path, why):
    lines = probe_lines(r.stderr)
    check(r.returncode == 7 and r.stdout == STDOUT, "%s: the program's stdout and status are its own" % name)
    pat = r"^probe: cannot write capture file %s: .*%s.*; capture disabled, the run continues$" % (
        re.escape(path), why)
    check(len(lines) == 1 and re.match(pat, lines[0]) is not None, "%s: one probe: line (%s)" % (name, lines))


def main():
    need_build()
    d = tmpdir("probe-write-safety-")
    prog = program("shim_tap_proc")

    # --- probe-run: an earlier capture is kept unless --force -------------
    out = os.path.join(d, "cap.h5")
    r = probe_run(["--out", out, "--", prog, "simple", "a", "2", "0"], d)
    check(r.returncode == 0 and os.path.getsize(out) > 0, "first capture written (rc=%d)" % r.returncode)
    before = open(out, "rb").read()
    r = probe_run(["--out", out, "--", "sh", "-c", "echo ran"], d)
    check(r.returncode == 2 and r.stdout == "", "existing capture: refused with exit 2, command not run")
    check(re.fullmatch(r"probe-run: --out '.*cap\.h5' already exists and is not empty \(an earlier capture\?\); "
                       r"pass --force to overwrite it\n", r.stderr) is not None,
          "existing capture: one line naming --force (%r)" % r.stderr)
    check(open(out, "rb").read() == before, "existing capture: bytes unchanged")
    r = probe_run(["--force", "--out", out, "--", prog, "simple", "b", "1", "0"], d)
    import h5py
    with h5py.File(out, "r") as f:
        names = sorted(f.keys())
    check(r.returncode == 0 and names == ["b"], "--force: overwritten by the new capture (%s)" % names)

    empty = os.path.join(d, "empty.h5")
    open(empty, "w").close()
    r = probe_run(["--out", empty, "--", prog, "simple", "c", "1", "0"], d)
    check(r.returncode == 0 and os.path.getsize(empty) > 0, "an empty existing --out is used")

    # --- probe-run: never through a symbolic link ---------------------------
    target = os.path.join(d, "precious.txt")
    with open(target, "w") as f:
        f.write("keep me\n")
    link = os.path.join(d, "link.h5")
    os.symlink(target, link)
    for extra in ([], ["--force"]):
        r = probe_run(extra + ["--out", link, "--", "sh", "-c", "echo ran"], d)
        check(r.returncode == 2 and "is a symbolic link" in r.stderr and r.stdout == "",
              "probe-run %s--out symlink: refused (%r)" % (" ".join(extra) + " " if extra else "", r.stderr))
    check(open(target).read() == "keep me\n", "symlink target unchanged after probe-run")

    # --- the shim with PROBE_OUT set directly --------------------------------
    r = shim_run(link)
    refused_by_shim("PROBE_OUT symlink to a file", r, link, "symbolic link")
    check(open(target).read() == "keep me\n", "PROBE_OUT symlink: target unchanged")
    dangling = os.path.join(d, "dangling.h5")
    os.symlink(os.path.join(d, "would-be-created.h5"), dangling)
    r = shim_run(dangling)
    refused_by_shim("PROBE_OUT dangling symlink", r, dangling, "symbolic link")
    check(not os.path.exists(os.path.join(d, "would-be-created.h5")), "dangling symlink: target not created")

    fifo = os.path.join(d, "fifo.h5")
    os.mkfifo(fifo)
    r = shim_run(fifo)
    refused_by_shim("PROBE_OUT FIFO", r, fifo, "not a regular file")
    sub = os.path.join(d, "adir")
    os.mkdir(sub)
    r = shim_run(sub)
    refused_by_shim("PROBE_OUT directory", r, sub, "")

    # --- umask -----------------------------------------------------------------
    for mask, mode in ((0o022, 0o644), (0o027, 0o640), (0o077, 0o600)):
        p = os.path.join(d, "umask%03o.h5" % mask)
        r = shim_run(p, umask=mask)
        got = stat.S_IMODE(os.stat(p).st_mode) if os.path.exists(p) else None
        check(r.returncode == 7 and probe_lines(r.stderr) == [] and got == mode,
              "umask %03o: file mode %s, want %03o" % (mask, oct(got) if got is not None else None, mode))
    finish()


if __name__ == "__main__":
    main()
