"""A capture file that cannot be written must not harm the run.

For each unwritable PROBE_OUT -- a missing directory, a path below a regular
file (ENOTDIR), a read-only directory (run as an unprivileged user when the
test runs as root, since root ignores permissions), and /dev/full (ENOSPC on
the first write) -- the program (tests/programs/shim_tap_proc simple) must
print exactly the same stdout as a normal run and exit with its own status
(7), stderr must hold exactly one `probe:` line of the form
`probe: cannot write capture file PATH: REASON; capture disabled, the run
continues`, and afterwards taps return PROBE_EIO (3) quietly, enabled is 0,
flush returns 3.
"""
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import check, finish, need_build, preload_env, probe_lines, program, run, tmpdir  # noqa: E402

STDOUT = "program output: line one\nprogram output: line two\n"


def expect_failure(name, path, cmd_prefix, env, eio_from=0):
    prog = program("shim_tap_proc")
    r = run(cmd_prefix + [prog, "simple", "io", "5", "7"], env)
    print("---", name, "\n", r.stderr)
    check(r.returncode == 7, "%s: exit status is the program's own (7), got %d" % (name, r.returncode))
    check(r.stdout == STDOUT, "%s: stdout unchanged (%r)" % (name, r.stdout))
    lines = probe_lines(r.stderr)
    pat = r"^probe: cannot write capture file %s: .+; capture disabled, the run continues$" % re.escape(path)
    check(len(lines) == 1 and re.match(pat, lines[0]) is not None, "%s: exactly one probe: line (%s)" % (name, lines))
    rcs = [int(x) for x in re.findall(r"^rc io \d+ = (-?\d+)$", r.stderr, re.M)]
    check(len(rcs) == 5 and all(rc == 3 for rc in rcs[eio_from:]) and all(rc in (0, 3) for rc in rcs),
          "%s: taps return PROBE_EIO once disabled (%s)" % (name, rcs))
    check("rc enabled = 0" in r.stderr and "rc flush = 3" in r.stderr, "%s: enabled 0, flush EIO" % name)
    others = [l for l in r.stderr.splitlines() if l and not l.startswith("probe:") and not l.startswith("rc ")]
    if others:
        print("WARN %s: other text on stderr (from HDF5, not the shim): %r" % (name, others[:2]))
    return r


def main():
    need_build()
    d = tmpdir("probe-shim-io-")
    os.chmod(d, 0o755)

    missing = os.path.join(d, "no", "such", "dir", "cap.h5")
    expect_failure("missing directory", missing, [], preload_env(missing))

    afile = os.path.join(d, "afile")
    open(afile, "w").close()
    notdir = os.path.join(afile, "cap.h5")
    expect_failure("parent is a file", notdir, [], preload_env(notdir))

    ro = os.path.join(d, "ro")
    os.mkdir(ro)
    os.chmod(ro, 0o555)
    rofile = os.path.join(ro, "cap.h5")
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv:
            prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        else:
            print("SKIP read-only directory: running as root without setpriv")
    if os.geteuid() != 0 or prefix:
        expect_failure("read-only directory", rofile, prefix, preload_env(rofile))
        check(not os.path.exists(rofile), "read-only directory: nothing created")

    if os.path.exists("/dev/full"):
        # HDF5 keeps the half-created file open and leaks it: no LeakSanitizer
        expect_failure("disk full (/dev/full)", "/dev/full", [], preload_env("/dev/full", leaks=False))

    # A write that fails mid-run (the file size limit, EFBIG): the tensors
    # written before stay readable, one warning, the later taps get EIO.
    mid = os.path.join(d, "mid.h5")
    env = preload_env(None)
    env["PROBE_OUT"] = mid
    env["PROBE_QUEUE_MB"] = "1"  # taps stay close behind the writer, so later ones see the failure
    r = run(["bash", "-c", "ulimit -f 4096; trap '' XFSZ; exec \"$0\" 1 40 4096", program("shim_tap_threads")], env)
    lines = probe_lines(r.stderr)
    print("--- mid-run failure\n", r.stdout, r.stderr)
    check(len(lines) == 1 and lines[0].startswith("probe: cannot write capture file %s: " % mid)
          and lines[0].endswith("; capture disabled, the run continues"),
          "mid-run write failure: exactly one probe: line (%s)" % lines)
    m = re.search(r"failures=(\d+)", r.stdout)
    check(m is not None and 0 < int(m.group(1)) < 40 and r.returncode == 1,
          "mid-run write failure: taps after it return an error, the program goes on (%s)" % r.stdout.strip())
    import h5py
    import numpy as np
    with h5py.File(mid, "r") as f:
        names = sorted(n for n in f.get("thr0", {}))
        good = all(np.array_equal(f["thr0"][n]["out"][()],
                                  (int(n) * 1009 + np.arange(4096 * 17).reshape(4096, 17)).astype(np.int32))
                   for n in names)
    check(len(names) > 0 and names == ["%04d" % i for i in range(len(names))] and good,
          "mid-run write failure: the %d tensors written before it are readable and correct" % len(names))

    # The same program with a writable file: same stdout and status, no warning.
    ok = os.path.join(d, "ok.h5")
    r = run([program("shim_tap_proc"), "simple", "io", "5", "7"], preload_env(ok))
    check(r.returncode == 7 and r.stdout == STDOUT and probe_lines(r.stderr) == [],
          "writable file: same stdout/status, no warning")
    check(all("rc io %d = 0" % i in r.stderr for i in range(5)), "writable file: taps return 0")
    finish()


if __name__ == "__main__":
    main()
