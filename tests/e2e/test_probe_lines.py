#!/usr/bin/env python3
"""`probe:` lines start a line of their own, and a configuration warning is
printed once per run (docs/intercept.md "probe: lines").

  1  stderr a regular file after a progress bar drawn without a newline
     (tqdm's "\r 50%|#####" style): the shim's line (a --capture item that
     matched nothing) and the adapter's line (a --tap that matched nothing),
     both printed at exit, each start after a "\n", so the file reads
     "...#####\nprobe: ..."; a stderr that already ends in "\n" gets no
     blank line;
  2  stderr a terminal (a pseudo-terminal): each line starts with
     "\r\033[K" (back to the first column, erase the bar);
  3  a launcher chain (probe-run -- sh -c 'sh -c "python ..."', three
     preloaded processes) with PROBE_QUEUE_MB=abc: the warning about it
     is printed once, not once per process; a second run with
     PROBE_CONFIG_WARNED unset in a child (env -u) prints it again there
     (the marker is what decides).
  4  PROBE_HASH_THREAD=0 and =1 print nothing; =yes prints one probe: line
     naming it.
  5  probe-run --raw-files 4 prints nothing and leaves the capture's
     FILE.h5.raw/ with its 4 raw files (00..03); --raw-files 0, 17, x and
     -1 exit 2 with one probe-run: line, the command not run.

Environment: PROBE_BUILD_DIR (required), PROBE_PYTHON.
"""
import os
import pty
import select
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import check, finish, need_build  # noqa: E402

BUILD = os.environ.get("PROBE_BUILD_DIR")
PY = os.environ.get("PROBE_PYTHON") or sys.executable
PROG = r'''
import sys, torch

class BarDenoiser(torch.nn.Module):
    def forward(self, x):
        return x * 2

sys.stderr.write("warm-up\n" if sys.argv[1] == "nl" else "\r 50%|#####")
sys.stderr.flush()
BarDenoiser()(torch.ones(4))
sys.stderr.write("\r100%|##########" if sys.argv[1] != "nl" else "done\n")
sys.stderr.flush()
'''


def main():
    need_build()
    d = tempfile.mkdtemp(prefix="probe-lines-")
    prog = os.path.join(d, "bar.py")
    with open(prog, "w") as f:
        f.write(PROG)
    probe_run = os.path.join(BUILD, "bin", "probe-run")
    out = os.path.join(d, "cap.h5")
    # at exit, after the bar: the shim's line (a --capture item that matched nothing) and the
    # adapter's (a --tap that matched nothing)
    cmd = [probe_run, "--force", "--out", out, "--capture", "/dit.step/*", "--capture", "/nomatch/*",
           "--tap", "dit.step=NoSuchClass.forward", "--", PY, prog]

    # 1 regular file
    for mode in ("bar", "nl"):
        err = os.path.join(d, "err-%s.txt" % mode)
        with open(err, "wb") as fe:
            p = subprocess.run(cmd + [mode], stdout=subprocess.PIPE, stderr=fe, timeout=300)
        text = open(err, "rb").read().decode(errors="replace")
        lines = [ln for ln in text.split("\n") if "probe: " in ln]
        if mode == "bar":
            check(p.returncode == 0 and len(lines) >= 2 and all(ln.startswith("probe: ") for ln in lines)
                  and "#####\nprobe: " in text,
                  "1 after a bar with no newline, every probe: line starts a line of its own (%r)" % text[-400:])
        else:
            check("\n\nprobe: " not in text and "done\nprobe: " in text,
                  "1 after a newline, no blank line is added (%r)" % text[-300:])

    # 2 terminal
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(cmd[0], cmd + ["bar"])
    buf = b""
    while True:
        r, _, _ = select.select([fd], [], [], 60)
        if not r:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    os.waitpid(pid, 0)
    shown = buf.decode(errors="replace")
    n = shown.count("probe: ")
    check(n >= 2 and shown.count("\r\x1b[Kprobe: ") == n,
          "2 on a terminal every probe: line starts with \\r ESC[K (%d of %d; %r)"
          % (shown.count("\r\x1b[Kprobe: "), n, shown[-300:]))

    # 3 a launcher chain prints a configuration warning once
    env = dict(os.environ, PROBE_QUEUE_MB="abc")
    chain = [probe_run, "--force", "--out", os.path.join(d, "chain.h5"), "--", "sh", "-c",
             'sh -c "\\"$0\\" -c \\"print(1)\\""', PY]
    p = subprocess.run(chain, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    warn = [ln for ln in p.stderr.splitlines() if "PROBE_QUEUE_MB=abc" in ln]
    check(p.returncode == 0 and p.stdout.strip() == "1" and len(warn) == 1,
          "3 a chain of 3 preloaded processes prints the PROBE_QUEUE_MB warning once (%r)" % warn)
    chain2 = [probe_run, "--force", "--out", os.path.join(d, "chain2.h5"), "--", "sh", "-c",
              'env -u PROBE_CONFIG_WARNED "$0" -c "print(1)"', PY]
    p = subprocess.run(chain2, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    warn = [ln for ln in p.stderr.splitlines() if "PROBE_QUEUE_MB=abc" in ln]
    check(len(warn) == 2, "3 without the marker a child prints it again (%d lines)" % len(warn))

    # 4 PROBE_HASH_THREAD takes 0 or 1; anything else is one warning and the default
    for value, lines in (("0", 0), ("1", 0), ("yes", 1)):
        env = dict(os.environ, PROBE_HASH_THREAD=value)
        p = subprocess.run([probe_run, "--force", "--out", os.path.join(d, "ht.h5"), "--", PY, "-c",
                            "print(1)"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=300)
        warn = [ln for ln in p.stderr.splitlines() if "PROBE_HASH_THREAD" in ln]
        check(p.returncode == 0 and p.stdout.strip() == "1" and len(warn) == lines and
              all(ln.startswith("probe: PROBE_HASH_THREAD=yes is not 0 or 1") for ln in warn),
              "4 PROBE_HASH_THREAD=%s: exit 0, %d probe: line(s) (%r)" % (value, lines, warn))

    # 5 --raw-files N: 1..16 raw files next to the capture; anything else exits 2
    rf = os.path.join(d, "rf.h5")
    p = subprocess.run([probe_run, "--force", "--raw-files", "4", "--out", rf, "--", PY, "-c", "print(1)"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    raw = sorted(os.listdir(rf + ".raw")) if os.path.isdir(rf + ".raw") else None
    check(p.returncode == 0 and p.stdout.strip() == "1" and "probe:" not in p.stderr and
          raw == ["00", "01", "02", "03"],
          "5 --raw-files 4: exit 0, no probe: line, rf.h5.raw holds %r (%r)" % (raw, p.stderr[-300:]))
    for value in ("0", "17", "x", "-1"):
        p = subprocess.run([probe_run, "--force", "--raw-files", value, "--out", os.path.join(d, "rfb.h5"),
                            "--", PY, "-c", "print(1)"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        check(p.returncode == 2 and p.stdout == "" and len(lines) == 1 and
              lines[0].startswith("probe-run: --raw-files"),
              "5 --raw-files %s: exit 2, one probe-run: line, not run (%r)" % (value, lines))
    finish()


if __name__ == "__main__":
    main()
