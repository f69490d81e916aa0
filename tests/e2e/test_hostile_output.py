#!/usr/bin/env python3
"""Output files that survive a full disk, and a terminal that a capture cannot rewrite
(docs/hardening.md "Hardening table").

Full disk: for each output kind (probe-compare --json, --html, --junit; probe-calibrate --out;
probe-matrix --out, --html) an earlier valid file sits on a tmpfs that is then filled
(unshare -m + mount -t tmpfs: needs root; otherwise those checks are skipped and said so). The
tool exits 2 with one line "TOOL: cannot write PATH: No space left on device (the file is
unchanged)", the earlier file keeps every byte, and no temporary file is left.

Atomic replacement on a normal disk: an existing file's mode is kept, a new file gets 0666 minus
the umask, a symbolic link is written through (its target replaced, the link kept), a dangling
link is refused (exit 2), /dev/null is written in place.

Hostile capture (h5py): dataset names, probe.component and the manifest label with ESC, CR,
BEL, a newline and invalid UTF-8. Every byte probe-compare (table, verdict, runs), probe-matrix
and probe-calibrate write to stdout and stderr is free of control characters other than "\\n",
and the escaped text is the expected one.

Small cases: an option after "--", --cells ',,,' / 'a,,b', --only '', --atol 0x10, each with its
exact message and exit 2.
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
BIN = lambda n: os.path.join(BUILD, "bin", n)  # noqa: E731
FAILURES = []


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def run(*args, **kw):
    return subprocess.run(list(args), capture_output=True, timeout=120, **kw)


def write(path, tensors, attrs=None, manifest=None):
    with h5py.File(path, "w") as f:
        for k, v in tensors.items():
            d = f.create_dataset(k, data=v)
            for a, av in (attrs or {}).get(k, {}).items():
                d.attrs[a] = av
        if manifest is not None:
            f.attrs["probe.manifest"] = json.dumps(manifest)


CTRL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]")


def clean_terminal(b):
    """No control byte other than \\n, and no C1 control (U+0080..U+009F) either."""
    return CTRL.search(b) is None and re.search(rb"\xc2[\x80-\x9f]", b) is None


def full_disk_case(tmp, name, old_bytes, cmd_of):
    """Run cmd_of(target) with target (holding old_bytes) on a full tmpfs. Returns
    (rc, stderr, target bytes after, names left on the tmpfs) or None when no tmpfs."""
    mnt = os.path.join(tmp, "mnt-" + name)
    kept = os.path.join(tmp, "kept-" + name)
    os.mkdir(mnt)
    os.mkdir(kept)
    target = os.path.join(mnt, name)
    old = os.path.join(tmp, "old-" + name)
    with open(old, "wb") as f:
        f.write(old_bytes)
    cmd = cmd_of(target)
    script = ('mount -t tmpfs -o size=256k tmpfs "$MNT" || exit 99; cp "$OLD" "$TARGET"; '
              'dd if=/dev/zero of="$MNT/fill" bs=4096 2>/dev/null; dd if=/dev/zero of="$MNT/fill2" '
              'bs=1 2>/dev/null; "$@" 2>"$KEPT/.stderr"; rc=$?; ls -A "$MNT" > "$KEPT/.names"; '
              'cp "$TARGET" "$KEPT/target"; exit $rc')
    env = dict(os.environ, MNT=mnt, KEPT=kept, OLD=old, TARGET=target)
    r = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh"] + cmd, env=env,
                       capture_output=True, timeout=120)
    if r.returncode == 99:
        return None
    with open(os.path.join(kept, ".stderr"), "rb") as f:
        err = f.read()
    with open(os.path.join(kept, ".names")) as f:
        names = sorted(f.read().split())
    with open(os.path.join(kept, "target"), "rb") as f:
        after = f.read()
    return r.returncode, err, after, names


def main():
    tmp = tempfile.mkdtemp(prefix="probe-hostile-out-")
    P = lambda n: os.path.join(tmp, n)  # noqa: E731
    rng = np.random.default_rng(7)
    base = {"/dit.step/0000/out": rng.standard_normal((4, 8)),
            "/vae.decode/0000/out": rng.standard_normal((2, 8))}
    for n, s in [("r0", 0.0), ("r1", 1e-9), ("c0", 1e-3), ("c1", 2e-3)]:
        write(P(n + ".h5"), {k: v + s * rng.standard_normal(v.shape) for k, v in base.items()})
    cal_args = ["--feature", "f", "--reference", P("r0.h5"), "--reference", P("r1.h5"),
                "--candidate", P("c0.h5"), "--candidate", P("c1.h5")]

    # Earlier good outputs: the tools' own, from another comparison (r0 vs r1).
    r = run(BIN("probe-compare"), P("r0.h5"), P("r1.h5"), "--json", P("good.json"), "--html",
            P("good.html"), "--junit", P("good.xml"), "--quiet")
    check(r.returncode in (0, 1), "earlier probe-compare outputs written (rc %d)" % r.returncode)
    r = run(BIN("probe-calibrate"), *cal_args, "--out", P("good.cal.json"))
    check(r.returncode in (0, 1), "earlier calibration written (rc %d) %s" % (r.returncode, r.stderr))
    r = run(BIN("probe-matrix"), "f=" + P("good.json"), "--out", P("good.matrix.json"), "--html",
            P("good.matrix.html"), "--quiet")
    check(r.returncode in (0, 1), "earlier matrix written (rc %d)" % r.returncode)
    goods = {k: open(P(k), "rb").read() for k in
             ["good.json", "good.html", "good.xml", "good.cal.json", "good.matrix.json",
              "good.matrix.html"]}
    check(all(len(v) > 100 for v in goods.values()), "every earlier output is non-trivial")

    # ---- full disk -----------------------------------------------------------------------
    cases = [
        ("probe-compare", "out.json", "good.json",
         lambda t: [BIN("probe-compare"), P("r0.h5"), P("c0.h5"), "--json", t, "--quiet"]),
        ("probe-compare", "out.html", "good.html",
         lambda t: [BIN("probe-compare"), P("r0.h5"), P("c0.h5"), "--html", t, "--quiet"]),
        ("probe-compare", "out.xml", "good.xml",
         lambda t: [BIN("probe-compare"), P("r0.h5"), P("c0.h5"), "--junit", t, "--quiet"]),
        ("probe-calibrate", "cal.json", "good.cal.json",
         lambda t: [BIN("probe-calibrate")] + cal_args + ["--out", t]),
        ("probe-matrix", "m.json", "good.matrix.json",
         lambda t: [BIN("probe-matrix"), "f=" + P("good.json"), "--out", t, "--quiet"]),
        ("probe-matrix", "m.html", "good.matrix.html",
         lambda t: [BIN("probe-matrix"), "f=" + P("good.json"), "--html", t, "--quiet"]),
    ]
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("SKIP: full-disk checks need root and unshare(1) (a private tmpfs)")
    else:
        for tool, name, good, cmd_of in cases:
            res = full_disk_case(tmp, name, goods[good], cmd_of)
            if res is None:
                print("SKIP: mount -t tmpfs does not work here")
                break
            rc, err, after, names = res
            lines = err.decode(errors="replace").splitlines()
            want = r"%s: cannot write .*/%s: No space left on device \(the file is unchanged\)" % (
                tool, re.escape(name))
            check(rc == 2, "%s %s on a full disk: exit 2 (got %d)" % (tool, name, rc))
            check(len(lines) == 1 and re.fullmatch(want, lines[0]) is not None,
                  "%s %s: one line %r (got %r)" % (tool, name, want, lines))
            check(after == goods[good], "%s %s: the earlier file is intact byte for byte (%d bytes)"
                  % (tool, name, len(goods[good])))
            check(names == sorted([name, "fill", "fill2"]),
                  "%s %s: no temporary file left (%s)" % (tool, name, names))

    # ---- atomic replacement on a normal disk -----------------------------------------------
    out = P("mode.json")
    shutil.copy(P("good.json"), out)
    os.chmod(out, 0o600)
    ino = os.stat(out).st_ino
    r = run(BIN("probe-compare"), P("r0.h5"), P("c0.h5"), "--json", out, "--quiet")
    st = os.stat(out)
    check(r.returncode == 1 and stat.S_IMODE(st.st_mode) == 0o600,
          "an existing file's mode is kept (0600, got %o)" % stat.S_IMODE(st.st_mode))
    check(st.st_ino != ino and json.load(open(out))["format"] == "probe-compare",
          "the file was replaced by rename (a new inode) and holds the new JSON")
    r = subprocess.run(["sh", "-c", 'umask 027; exec "$@"', "sh", BIN("probe-compare"), P("r0.h5"),
                        P("c0.h5"), "--json", P("new.json"), "--quiet"], capture_output=True)
    check(stat.S_IMODE(os.stat(P("new.json")).st_mode) == 0o640, "a new file: 0666 minus umask 027")
    os.mkdir(P("linkdir"))
    real = P("linkdir/real.json")
    shutil.copy(P("good.json"), real)
    os.symlink(real, P("link.json"))
    r = run(BIN("probe-compare"), P("r0.h5"), P("c0.h5"), "--json", P("link.json"), "--quiet")
    check(os.path.islink(P("link.json")) and os.readlink(P("link.json")) == real,
          "a symbolic link target: the link is kept")
    check(open(real, "rb").read() != goods["good.json"] and
          json.load(open(real))["reference"].endswith("r0.h5") and
          json.load(open(real))["candidate"].endswith("c0.h5"),
          "a symbolic link target: its target holds the new JSON")
    check(sorted(os.listdir(P("linkdir"))) == ["real.json"], "no temporary file next to the target")
    os.symlink(P("nowhere/x.json"), P("dangling.json"))
    r = run(BIN("probe-compare"), P("r0.h5"), P("c0.h5"), "--json", P("dangling.json"), "--quiet")
    lines = r.stderr.decode().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and re.fullmatch(
        r"probe-compare: cannot write .*dangling\.json: it is a symbolic link whose target cannot "
        r"be resolved \(No such file or directory\)", lines[0]) is not None,
        "a dangling symbolic link: exit 2, one line (%r)" % lines)
    r = run(BIN("probe-compare"), P("r0.h5"), P("c0.h5"), "--json", "/dev/null", "--quiet")
    check(r.returncode == 1 and os.path.exists("/dev/null") and
          stat.S_ISCHR(os.stat("/dev/null").st_mode), "--json /dev/null is written in place")
    before = sorted(os.listdir(tmp))
    r = run(BIN("probe-compare"), P("r0.h5"), P("c0.h5"), "--json", P("ro/x.json"), "--quiet")
    lines = r.stderr.decode().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and re.fullmatch(
        r"probe-compare: cannot write .*ro/x\.json: cannot create a temporary file in .*ro/: "
        r"No such file or directory", lines[0]) is not None,
        "a missing directory: exit 2, one line with strerror (%r)" % lines)
    check(sorted(os.listdir(tmp)) == before, "nothing created")

    # ---- hostile capture -----------------------------------------------------------------
    bad_comp = "dit.step\x1b]0;owned\x07"
    names = {
        "/dit.step/0000/out\rPASS: all good\x1b[8m": "dit.step\\x1b",
        "/vae.decode/0000/out\nFAIL \x07": None,
    }
    hostile = {k: rng.standard_normal((4, 8)) for k in names}
    bad_utf8 = b"/dit.step/0001/out\xff\xfe"
    label = "PASS\x1b[2J\r\x9b31m"
    man = lambda lb: {"format": "probe-manifest", "version": 1, "label": lb, "host": "h\x1b[1m"}
    for fn, scale in [("h_ref.h5", 0.0), ("h_cand.h5", 0.1)]:
        with h5py.File(P(fn), "w") as f:
            for k, v in hostile.items():
                d = f.create_dataset(k, data=v * (1 + scale))
                d.attrs["probe.component"] = bad_comp
            f.create_dataset(bad_utf8, data=np.ones(3) * (1 + scale))
            f.attrs["probe.manifest"] = json.dumps(man(label if scale else "ref\x1b[0m"))
    r = run(BIN("probe-compare"), P("h_ref.h5"), P("h_cand.h5"), "--json", P("h.json"))
    both = r.stdout + r.stderr
    check(r.returncode == 1, "hostile capture compared: exit 1 (got %d)" % r.returncode)
    check(clean_terminal(both), "probe-compare: no control byte but \\n on the terminal "
          "(%r)" % CTRL.findall(both)[:5])
    text = r.stdout.decode()
    check("/dit.step/0000/out\\rPASS: all good\\x1b[8m" in text,
          "the table shows the dataset name with \\r and \\x1b escaped")
    check("/vae.decode/0000/out\\nFAIL \\x07" in text, "a newline and BEL in a name shown as \\n, \\x07")
    check("/dit.step/0001/out\\xff\\xfe" in text, "invalid UTF-8 shown as \\xff\\xfe")
    ff = [ln for ln in text.splitlines() if ln.startswith("first failure:")]
    check(len(ff) == 1 and ff[0].startswith("first failure: component dit.step\\x1b]0;owned\\x07 at "),
          "the first-failure line names the escaped component (%r)" % ff)
    check(not any(ln.startswith("PASS") for ln in text.splitlines()),
          "no line of the output reads PASS")
    runs = [ln for ln in text.splitlines() if ln.startswith("* label")]
    check(len(runs) == 1 and "ref\\x1b[0m" in runs[0] and "PASS\\x1b[2J\\r\\xc2\\x9b31m" in runs[0],
          "the runs table shows both labels escaped, the C1 CSI as \\xc2\\x9b (%r)" % runs)
    j = json.load(open(P("h.json")))
    paths = [t.get("path") for t in j["tensors"]]
    check("/dit.step/0000/out\rPASS: all good\x1b[8m" in paths, "the JSON keeps the exact name")
    # A result without the invalid-UTF-8 name (its JSON tensor has no "path": jansson takes
    # UTF-8 only), which probe-matrix would refuse.
    r = run(BIN("probe-compare"), P("h_ref.h5"), P("h_cand.h5"), "--only", "/dit.step/0000/*",
            "--only", "/vae.decode/*", "--json", P("h2.json"), "--quiet")
    check(r.returncode == 1 and clean_terminal(r.stdout + r.stderr), "probe-compare --only on the "
          "hostile capture: exit 1, a clean terminal")
    r = run(BIN("probe-matrix"), "feat\x1b[5m=" + P("h2.json"), "--cells",
            bad_comp + "/feat\x1b[5m")
    both = r.stdout + r.stderr
    check(r.returncode == 1 and clean_terminal(both),
          "probe-matrix on the hostile result: exit 1, no control byte but \\n (rc %d, %r)"
          % (r.returncode, CTRL.findall(both)[:5]))
    check("dit.step\\x1b]0;owned\\x07" in r.stdout.decode() and
          "requested dit.step\\x1b]0;owned\\x07/feat\\x1b[5m: failed" in r.stdout.decode(),
          "probe-matrix shows the component and feature escaped")
    r = run(BIN("probe-calibrate"), "--feature", "x\x1b[8m", "--reference", P("h_ref.h5"),
            "--reference", P("h_ref.h5"), "--candidate", P("h_cand.h5"), "--out", P("h.cal.json"))
    both = r.stdout + r.stderr
    err = r.stderr.decode().splitlines()
    check(r.returncode == 2 and clean_terminal(both) and len(err) == 1 and
          "unknown component 'dit.step\\x1b]0;owned\\x07'" in err[0],
          "probe-calibrate: the unknown hostile component quoted escaped, one line (%r)" % err)
    check(not os.path.exists(P("h.cal.json")), "probe-calibrate wrote nothing")

    # ---- small cases ---------------------------------------------------------------------
    small = [
        ([BIN("probe-compare"), "--", P("r0.h5"), P("c0.h5"), "--quiet"],
         "probe-compare: '--quiet' is taken as a file name (it follows '--') and there is no such "
         "file; options go before '--'"),
        ([BIN("probe-compare"), "--only", "", P("r0.h5"), P("c0.h5")],
         "probe-compare: --only needs a non-empty GLOB"),
        ([BIN("probe-compare"), "--atol", "0x10", P("r0.h5"), P("c0.h5")],
         "probe-compare: --atol '0x10': not a finite non-negative decimal number"),
        ([BIN("probe-compare"), "--rtol", "inf", P("r0.h5"), P("c0.h5")],
         "probe-compare: --rtol 'inf': not a finite non-negative decimal number"),
        ([BIN("probe-matrix"), "f=" + P("good.json"), "--cells", ",,,"],
         "probe-matrix: --cells ',,,': empty list"),
        ([BIN("probe-matrix"), "f=" + P("good.json"), "--cells", ""],
         "probe-matrix: --cells '': empty list"),
        ([BIN("probe-matrix"), "f=" + P("good.json"), "--cells", "dit.step/f,,vae.decode/f"],
         "probe-matrix: --cells 'dit.step/f,,vae.decode/f': empty cell id"),
    ]
    for cmd, want in small:
        r = run(*cmd)
        lines = r.stderr.decode().splitlines()
        check(r.returncode == 2 and lines == [want], "%r: exit 2, %r (got %d %r)"
              % (cmd[1:], want, r.returncode, lines))
    r = run(BIN("probe-compare"), P("r0.h5"), P("c0.h5"), P("c1.h5"))
    lines = r.stderr.decode().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and re.fullmatch(
        r"probe-compare: 2 candidate files, read as the per-rank captures of one run: .*c0\.h5: "
        r"not a per-rank capture .*", lines[0]) is not None,
        "three positional files: the message says two candidates are read as a rank set (%r)"
        % lines)

    shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
