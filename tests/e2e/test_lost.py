#!/usr/bin/env python3
"""A capture that lost tensors says so (docs/file-format.md "Lost tensors",
docs/compare-json.md "lost"), and small hostile-output cases of probe-run.

With tests/exits_proc (N float32 tensors /exits/<i:04>/out, KB KiB each)
under build/bin/probe-run:

 (1) disk full (a 6 MiB tmpfs in a private mount namespace; root only, else
     skipped): the closed file's manifest "lost" has count = N minus the
     tensors in the file (every tap is written or lost), first = the lowest
     missing index, a reason naming ENOSPC, listed = count; probe.skips holds
     exactly the missing paths with the lost reason; run_end says closed,
     capture_complete false, lost = count. probe-compare against a complete
     capture: exit 1, JSON "lost".candidate {count, first, source
     "manifest"}, one stderr line, an "incomplete capture" reason naming the
     count, the missing paths listed as skipped;
 (2) SIGKILL after the taps: probe-recover in place writes a clean file
     whose manifest "recovered" names the journal, the complete count (the
     datasets in the file) and lost (= N minus them); its stderr line says
     so; probe-compare then reports "recovered".candidate from the manifest
     with one line;
 (2s) the same under --stats-only: the killed run leaves a journal (SUMMARY
     records); probe-recover writes a clean file of stats-only records
     (probe.stats_only 1) whose fields are the summary of the known tensor
     contents (exact integer sums computed here), whose probe.hash is the hash a
     full capture of the same run stores, and the paths it lacks are in
     probe.skips as lost; and with --stats-only-for 'exits/000*' (a run mixing
     both): /exits/0000..0009 recovered as those records, the rest as full
     tensors holding the known values;
 (3) probe-run --out on a read-only file system (root only): exit 2, one
     line ending with the OS's reason "Read-only file system";
 (4) PROBE_PINNED_MB=-5 / abc / 0 with a CPU-only command (`true`): exactly
     one `probe:` line naming the value; 64: none.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR")
FAILURES = []
LOST_SHIM = "lost: tapped, but not written: a write error disabled capture"
LOST_JOURNAL = "lost: tapped, but the process ended before the writer wrote it"


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def run(cmd, env=None, timeout=300):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=timeout)


def probe_lines(err):
    return [l for l in err.splitlines() if l.startswith("probe:")]


def contents(path):
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda n, o: names.append("/" + n) if isinstance(o, h5py.Dataset) else None)
        m = json.loads(f.attrs["probe.manifest"])
        skips = json.loads(f.attrs["probe.skips"]) if "probe.skips" in f.attrs else []
    return set(names), m, skips


def can_mount(d):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    mnt = os.path.join(d, "probe-mnt")
    os.makedirs(mnt, exist_ok=True)
    t = run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$1" && umount "$1"', "sh", mnt])
    return t.returncode == 0


def disk_full(probe_run, compare, prog, d):
    N, KB = 64, 256
    mnt, kept = os.path.join(d, "mnt"), os.path.join(d, "kept")
    os.mkdir(mnt)
    os.mkdir(kept)
    script = ('mount -t tmpfs -o size=6m tmpfs "$1" || exit 99; shift; "$@"; rc=$?; '
              'cp -a "$MNT"/. "$KEPT"/; exit $rc')
    p = run(["unshare", "-m", "sh", "-c", script, "sh", mnt, probe_run, "--out", os.path.join(mnt, "full.h5"),
             "--", prog, "_exit", str(N), str(KB), "1"], env=dict(os.environ, MNT=mnt, KEPT=kept))
    check(p.returncode == 7 and len(probe_lines(p.stderr)) == 1, "(1) status 7, one probe: line (%r)"
          % probe_lines(p.stderr))
    got = os.path.join(kept, "full.h5")
    names, m, skips = contents(got)
    want_all = ["/exits/%04d/out" % i for i in range(N)]
    missing = [p_ for p_ in want_all if p_ not in names]
    lost = m.get("lost") or {}
    check(0 < len(names) < N, "(1) a prefix of %d of %d tensors written" % (len(names), N))
    check(lost.get("count") == len(missing) == N - len(names) and lost.get("listed") == len(missing),
          "(1) manifest lost.count %r = %d tensors not in the file" % (lost.get("count"), len(missing)))
    check(bool(missing) and lost.get("first") == missing[0], "(1) lost.first %r is the first missing %r"
          % (lost.get("first"), missing[:1]))
    check("No space left on device" in (lost.get("reason") or ""), "(1) lost.reason names ENOSPC (%r)"
          % lost.get("reason"))
    check(0 <= lost.get("refused", -1) <= lost.get("count", 0), "(1) lost.refused %r within count"
          % lost.get("refused"))
    lost_skips = sorted(s["path"] for s in skips if s["reason"] == LOST_SHIM)
    check(lost_skips == sorted(missing), "(1) probe.skips lists exactly the %d missing paths as lost (%d)"
          % (len(missing), len(lost_skips)))
    re_ = m.get("run_end") or {}
    check(re_.get("capture") == "closed" and re_.get("capture_complete") is False
          and re_.get("lost") == len(missing), "(1) run_end: closed, not complete, lost %r" % re_)
    ref = os.path.join(d, "ref.h5")
    r = run([probe_run, "--out", ref, "--", prog, "_exit", str(N), str(KB), "1"])
    check(r.returncode == 7 and len(contents(ref)[0]) == N, "(1) a complete reference of %d tensors" % N)
    c = run([compare, ref, got, "--json", "-", "--quiet"])
    check(c.returncode == 1, "(1) probe-compare exit 1 (%d: %s)" % (c.returncode, c.stderr[-300:]))
    if c.returncode != 1:
        return
    doc = json.loads(c.stdout)
    lj = doc.get("lost", {})
    check(lj.get("reference") is None and (lj.get("candidate") or {}).get("count") == len(missing)
          and lj["candidate"].get("first") == missing[0] and lj["candidate"].get("source") == "manifest",
          "(1) JSON lost.candidate %r" % lj.get("candidate"))
    check("recovered" not in doc, "(1) a closed file: no \"recovered\" key")
    lines = [l for l in c.stderr.splitlines() if "tapped tensor" in l and "never written" in l]
    check(len(lines) == 1 and ("lost %d tapped tensor" % len(missing)) in lines[0],
          "(1) one stderr line (%r)" % lines)
    check(any(x.startswith("incomplete capture: the candidate run") and ("%d tapped tensor" % len(missing)) in x
              for x in doc["reasons"]), "(1) an incomplete-capture reason names the lost (%r)" % doc["reasons"])
    sk = sorted(s["path"] for s in doc["skipped"] if s["side"] == "candidate" and s["reason"] == LOST_SHIM)
    check(sk == sorted(missing) and sorted(doc["missing_in_candidate"]) == sorted(missing),
          "(1) the lost paths are listed as skipped (and missing)")


def recover(probe_run, compare, prog, d):
    N, KB = 48, 1024
    out = os.path.join(d, "killed.h5")
    p = run([probe_run, "--out", out, "--", prog, "kill", str(N), str(KB), "1"])
    check(p.returncode != 0 and os.path.exists(out + ".journal"), "(2) killed: a journal is left (%d)"
          % p.returncode)
    rec = run([os.path.join(BUILD, "bin", "probe-recover"), out])
    check(rec.returncode == 0 and "recorded in its manifest as \"recovered\"" in rec.stderr
          and not os.path.exists(out + ".journal"), "(2) probe-recover in place: exit 0, its line (%s)"
          % rec.stderr.strip())
    names, m, skips = contents(out)
    r = m.get("recovered") or {}
    nlost = N - len(names)
    check(r.get("journal") == "killed.h5.journal" and r.get("complete") == len(names)
          and r.get("lost") == nlost and r.get("by") == "probe-recover",
          "(2) manifest recovered %r (%d in the file, %d lost)" % (r, len(names), nlost))
    check(sorted(s["path"] for s in skips if s["reason"] == LOST_JOURNAL)
          == sorted("/exits/%04d/out" % i for i in range(N) if "/exits/%04d/out" % i not in names),
          "(2) the lost paths stay in probe.skips")
    if nlost:
        check(("; %d tapped tensor" % nlost) in rec.stderr, "(2) the stderr line counts %d lost" % nlost)
    c = run([compare, out, out, "--json", "-", "--quiet"])
    doc = json.loads(c.stdout) if c.returncode in (0, 1) else {}
    rc_ = (doc.get("recovered") or {}).get("candidate") or {}
    lines = [l for l in c.stderr.splitlines() if "rewritten by probe-recover from killed.h5.journal" in l]
    check(rc_.get("by") == "probe-recover" and rc_.get("complete") == len(names) and len(lines) == 2,
          "(2) probe-compare: recovered.candidate from the manifest, a line per side (%r)" % lines)


def recover_stats(probe_run, prog, d, mixed):
    N, KB = 48, 1024
    tag = "(2s%s)" % (" mixed" if mixed else "")
    opt = ["--stats-only-for", "exits/000*"] if mixed else ["--stats-only"]
    out = os.path.join(d, "killed_stats%d.h5" % mixed)
    full = os.path.join(d, "full_stats_ref%d.h5" % mixed)
    p = run([probe_run] + opt + ["--out", out, "--", prog, "kill", str(N), str(KB), "1"])
    check(p.returncode != 0 and os.path.exists(out + ".journal"),
          "%s %s killed: a journal is left (%d)" % (tag, opt[0], p.returncode))
    r = run([probe_run, "--out", full, "--", prog, "exit", str(N), str(KB), "1"])
    check(r.returncode == 0, "%s a full capture of the same run (%d)" % (tag, r.returncode))
    rec = run([os.path.join(BUILD, "bin", "probe-recover"), out])
    check(rec.returncode == 0 and not os.path.exists(out + ".journal"),
          "%s probe-recover in place: exit 0 (%s)" % (tag, rec.stderr.strip()))
    if rec.returncode != 0 or r.returncode != 0:
        return
    names, m, skips = contents(out)
    n = KB * 256
    bad = []
    nstats = 0
    with h5py.File(out, "r") as S, h5py.File(full, "r") as F:
        for name in sorted(names):
            i = int(name.split("/")[2])
            ds = S[name]
            v = ds[()]
            # element k = base + k % 1000 (exits_proc)
            base = 4000000 + i * 1000
            if mixed and i >= 10:
                if ds.dtype.names is not None or "probe.stats_only" in ds.attrs or ds.shape != (n,) \
                        or not np.array_equal(v, (base + np.arange(n) % 1000).astype(np.float32)):
                    bad.append("%s: not the full tensor" % name)
                continue
            if int(ds.attrs.get("probe.stats_only", 0)) != 1 or ds.dtype.names is None:
                bad.append("%s: not a stats-only record" % name)
                continue
            nstats += 1
            # the summary's sums as exact integers
            full_reps, rest = divmod(n, 1000)
            vals = [(base + k, full_reps + (1 if k < rest else 0)) for k in range(1000)]
            want = {"n": n, "n_finite": n, "nan": 0, "inf": 0, "min": float(base),
                    "max": float(base + min(n, 1000) - 1), "abs_max": float(base + min(n, 1000) - 1),
                    "sum": float(sum(x_ * c for x_, c in vals))}
            for k, w in want.items():
                if float(v[k]) != w:
                    bad.append("%s: %s %r != %r" % (name, k, float(v[k]), w))
            ss = float(sum(x_ * x_ * c for x_, c in vals))
            if abs(float(v["sum_sq"]) - ss) > 1e-14 * ss:
                bad.append("%s: sum_sq %r != %r" % (name, float(v["sum_sq"]), ss))
            h, hf = ds.attrs["probe.hash"], F[name].attrs["probe.hash"]
            h, hf = (x_.decode() if isinstance(x_, bytes) else str(x_) for x_ in (h, hf))
            if h != hf:
                bad.append("%s: probe.hash %s != the full capture's %s" % (name, h, hf))
    check(nstats > 0 and not bad, "%s %d recovered records (%d stats-only) equal the known "
          "contents and summaries and the full capture's hashes (%r)" % (tag, len(names), nstats, bad[:3]))
    lost = sorted(s_["path"] for s_ in skips if s_["reason"] == LOST_JOURNAL)
    rr = m.get("recovered") or {}
    partial = [rr["partial"]] if rr.get("partial") else []
    check(sorted(set(lost) | set(partial)) == sorted("/exits/%04d/out" % i for i in range(N) if "/exits/%04d/out" % i not in names),
          "%s every path not recovered is in probe.skips as lost or is the partial capture "
          "(%d recovered, %d lost, partial %r)" % (tag, len(names), len(lost), partial))
    check(rr.get("complete") == len(names) and rr.get("lost") == len(lost),
          "%s manifest recovered %r" % (tag, rr))


def read_only(probe_run, d):
    ro = os.path.join(d, "ro")
    os.mkdir(ro)
    p = run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k,ro tmpfs "$1" || exit 99; shift; "$@"',
             "sh", ro, probe_run, "--out", os.path.join(ro, "x.h5"), "--", "true"])
    lines = [l for l in p.stderr.splitlines() if l]
    check(p.returncode == 2 and len(lines) == 1 and lines[0].startswith("probe-run: cannot create the capture file")
          and lines[0].endswith(": Read-only file system"), "(3) read-only: exit 2, one line with the reason (%r)"
          % lines)


def pinned(probe_run, d):
    for v, n in (("-5", 1), ("abc", 1), ("0", 1), ("64", 0)):
        p = run([probe_run, "--force", "--out", os.path.join(d, "pinned.h5"), "--", "true"],
                env=dict(os.environ, PROBE_PINNED_MB=v))
        lines = probe_lines(p.stderr)
        check(p.returncode == 0 and len(lines) == n and all(("PROBE_PINNED_MB=%s " % v) in l for l in lines),
              "(4) PROBE_PINNED_MB=%s, a CPU run: %d probe: line(s) (%r)" % (v, n, lines))


def main():
    if not BUILD:
        print("FAIL - PROBE_BUILD_DIR is not set")
        return 1
    probe_run = os.path.join(BUILD, "bin", "probe-run")
    compare = os.path.join(BUILD, "bin", "probe-compare")
    prog = os.path.join(BUILD, "tests", "exits_proc")
    d = tempfile.mkdtemp(prefix="probe-lost-")
    try:
        if can_mount(d):
            disk_full(probe_run, compare, prog, d)
            read_only(probe_run, d)
        else:
            print("skip - (1) disk full, (3) read-only: need root and a tmpfs in a private mount namespace")
        recover(probe_run, compare, prog, d)
        recover_stats(probe_run, prog, d, False)
        recover_stats(probe_run, prog, d, True)
        pinned(probe_run, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("%d failures" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
