#!/usr/bin/env python3
"""End-to-end: every process and every thread of a run is captured or named
(docs/probe-run.md "Processes and threads"), with the toy pipeline's modules
(scripts/example/) in real processes and threads (tests/e2e/procs_program.py,
which saves with numpy what each component returned).

  mp       the toy pipeline inside multiprocessing.Process (fork and spawn),
           the parent tapping nothing: the file holds exactly the paths the
           pipeline saved, bit-identical, no probe: line; an unmatched --tap
           is one line (the child's; the parent called no component);
  pool     a multiprocessing pool (fork and spawn) whose 2 processes each run
           the pipeline: the first to tap writes the run's file, the other
           its own per-process file, each holding a full run;
  loader   DataLoader workers (fork and spawn, 2 workers) run the text encoder,
           the main process the DiT: the main file holds the DiT calls only,
           equal to what the main process computed; each worker wrote
           <stem>.proc<N>.h5 (manifest "process"), listed in the main file's
           manifest ("processes"), holding its two text-encoder calls, equal to
           the worker's own results; fork and spawn runs compare identical, and
           probe-compare names the per-process files;
           Workers calling the pipeline's encode_prompt write their own
           files too (a DataLoader worker is always a worker);
  late     workers forked after the main process opened the file: one exact
           probe: line per worker naming its text_encoder calls, no file;
  osfork   os.fork() after the capture began, the child exiting normally
           or by os._exit: the same line;
  threads  4 threads x 3 text-encoder calls, two runs: every call at
           /text_encoder@enc-<j>/<call>, equal to that thread's result;
           probe-compare --expect-identical exits 0 with nothing unpaired and
           names the threads; two threads each running the pipeline keep their
           own step and CFG-branch counters;
  lines    python -I / -E / -S (no adapter), a class made by type(), a torch
           program with no class of the table: one exact probe: line each;
  bad      the ABI with bad names (EINVAL), a second name or a name after the
           first tap (ESTATE), taps after probe_tap_close_v1 refused; probe-run
           refuses stale per-process files (exit 2) and removes them with --force.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (BUILD, asan_runtime, check, clean_env, finish, need_build,  # noqa: E402
                              probe_lines, reexec_in_venv, tmpdir)

PY = reexec_in_venv()

import h5py  # noqa: E402
import numpy as np  # noqa: E402

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "procs_program.py")


def run(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    # a sanitizer-built shim needs its runtime loaded first (probe-run keeps it first)
    asan = asan_runtime()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600,
                       env=clean_env({"LD_PRELOAD": asan} if asan else None), **kw)
    if r.stderr.strip():
        print("  stderr: " + r.stderr.strip().replace("\n", "\n  stderr: ")[:3000])
    return r


def probe_run(out, cmd, *opts):
    return run([os.path.join(BUILD, "bin", "probe-run"), "--out", out, *opts, "--", *cmd])


def compare(*args):
    return run([os.path.join(BUILD, "bin", "probe-compare"), *args])


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__("/" + n, (o[()], dict(o.attrs)))
                     if isinstance(o, h5py.Dataset) else None)
    return out


def manifest(path):
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["probe.manifest"])


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def saved_index(d):
    with open(os.path.join(d, "index.json")) as fh:
        return {e["path"]: np.load(os.path.join(d, e["file"])) for e in json.load(fh)["tensors"]}


def test_mp(d):
    for method in ("fork", "spawn"):
        save = os.path.join(d, "mp-" + method)
        os.makedirs(save)
        out = os.path.join(d, "mp-%s.h5" % method)
        r = probe_run(out, [PY, PROG, "mp", method, save])
        check(r.returncode == 0 and "mp: child exit 0" in r.stdout, "mp %s: runs, the child exits 0" % method)
        check(probe_lines(r.stderr) == [], "mp %s: no probe: line (%s)" % (method, probe_lines(r.stderr)))
        got, want = datasets(out), saved_index(save)
        check(set(got) == set(want) and len(want) > 30,
              "mp %s: the file holds exactly the %d paths the pipeline saved (%d; only in file: %s, "
              "only saved: %s)" % (method, len(want), len(got), sorted(set(got) - set(want))[:3],
                                   sorted(set(want) - set(got))[:3]))
        check(all(same(got[p][0], want[p]) for p in want if p in got),
              "mp %s: every tensor is bit-identical to the pipeline's own copy" % method)
        # a --tap that matches nothing: said once, by the child that ran the
        # pipeline, not by the parent that called no component
        save2 = save + "-tap"
        os.makedirs(save2)
        r = probe_run(os.path.join(d, "mp-%s-tap.h5" % method), [PY, PROG, "mp", method, save2],
                      "--tap", "text_encoder=NoSuchEncoder.forward")
        lines = probe_lines(r.stderr)
        check(r.returncode == 0 and len(lines) == 1 and lines[0].startswith(
            "probe: --tap text_encoder=NoSuchEncoder.forward matched no method in this run"),
            "mp %s: an unmatched --tap is one line (%s)" % (method, lines))


def test_pool(d):
    for method in ("fork", "spawn"):
        save = os.path.join(d, "pool-" + method)
        os.makedirs(save)
        out = os.path.join(d, "pool-%s.h5" % method)
        r = probe_run(out, [PY, PROG, "pool", method, save])
        check(r.returncode == 0 and "pool: done" in r.stdout and probe_lines(r.stderr) == [],
              "pool %s: runs, no probe: line (%s)" % (method, probe_lines(r.stderr)))
        # which of the two claims the run's file first is a race: the other one
        # writes its own, maybe after the run's file was closed (so it may be
        # missing from "processes"; probe-compare finds it next to the file)
        side = sorted(f for f in os.listdir(d) if f.startswith("pool-%s.proc" % method))
        check(len(side) == 1 and re.match(r"pool-%s\.proc[12]\.h5$" % method, side[0])
              and set(manifest(out).get("processes") or side) == set(side)
              and manifest(os.path.join(d, side[0]))["process"]["main"] == os.path.basename(out),
              "pool %s: the first pipeline process writes the run's file, the other its own (%s)"
              % (method, side))
        files = [datasets(out)] + [datasets(os.path.join(d, s)) for s in side]
        want = [saved_index(os.path.join(save, "task-%d" % k)) for k in range(2)]
        # the two tasks ran the same pipeline: each file holds one task's tensors, bit-identical
        check(len(files) == 2 and all(set(f) == set(want[0]) and all(same(f[p][0], want[0][p]) for p in f)
                                      for f in files) and all(set(w) == set(want[0]) for w in want),
              "pool %s: each file holds one pipeline run, %d tensors, equal to the task's own" % (method, len(want[0])))
        r = compare("--expect-identical", out, out)
        name = side[0][len("pool-%s." % method):-3] if side else "?"
        check(r.returncode == 0 and [l for l in r.stdout.splitlines() if l.startswith("processes:")] == [
            "processes: %s (%s vs %s): PASS: %d tensors compared, 0 fail, 0 missing in candidate, 0 missing in "
            "reference" % (name, os.path.join(d, side[0]) if side else "", os.path.join(d, side[0]) if side else "",
                           len(want[0]))], "pool %s: probe-compare finds and compares the per-process file" % method)


def worker_values(save):
    return {i: np.load(os.path.join(save, "worker.text_encoder.%d.npy" % i)) for i in range(4)}


def test_loader(d):
    outs = {}
    for method in ("fork", "spawn"):
        save = os.path.join(d, "ld-" + method)
        os.makedirs(save)
        out = os.path.join(d, "ld-%s.h5" % method)
        outs[method] = out
        r = probe_run(out, [PY, PROG, "loader", method, save])
        check(r.returncode == 0 and "loader: 2 DiT calls" in r.stdout, "loader %s: runs" % method)
        check(probe_lines(r.stderr) == [], "loader %s: no probe: line (%s)" % (method, probe_lines(r.stderr)))
        got = datasets(out)
        want = {"/dit.step/%04d/%s" % (k, s) for k in range(2)
                for s in ("in.hidden_states", "in.timestep", "in.encoder_hidden_states", "out.sample")}
        check(set(got) == want, "loader %s: the main file holds the DiT's 2 calls only (%s)" % (method, sorted(got)))
        check(all(same(got["/dit.step/%04d/out.sample" % k][0],
                       np.load(os.path.join(save, "main.dit.%d.npy" % k))) for k in range(2)),
              "loader %s: the DiT outputs equal the main process's own" % method)
        stem = os.path.basename(out)[:-3]
        side = ["%s.proc1.h5" % stem, "%s.proc2.h5" % stem]
        check(manifest(out).get("processes") == side,
              "loader %s: the main manifest lists the per-process files %s (%s)"
              % (method, side, manifest(out).get("processes")))
        wv = worker_values(save)
        for w, name in enumerate(side):
            path = os.path.join(d, name)
            if not check(os.path.exists(path), "loader %s: %s exists" % (method, name)):
                continue
            m = manifest(path)
            check(m.get("process", {}).get("name") == "proc%d" % (w + 1)
                  and m["process"].get("main") == os.path.basename(out),
                  "loader %s: %s's manifest names it and its main file (%s)" % (method, name, m.get("process")))
            got = datasets(path)
            want = {"/text_encoder/%04d/%s" % (k, s) for k in range(2)
                    for s in ("in.input_ids", "in.attention_mask", "out.last_hidden_state")}
            check(set(got) == want, "loader %s: %s holds its 2 text-encoder calls (%s)" % (method, name, sorted(got)))
            # worker w gets batch w (items 2w, 2w+1), one text-encoder call per item
            check(all(same(got["/text_encoder/%04d/out.last_hidden_state" % k][0][0], wv[2 * w + k])
                      for k in range(2) if "/text_encoder/%04d/out.last_hidden_state" % k in got),
                  "loader %s: %s's outputs equal the worker's own results" % (method, name))
    r = compare("--expect-identical", outs["fork"], outs["spawn"])
    lines = [l for l in r.stdout.splitlines() if l.startswith("processes:")]
    want = ["processes: proc%d (%s/ld-fork.proc%d.h5 vs %s/ld-spawn.proc%d.h5): PASS: 6 tensors compared, 0 fail, "
            "0 missing in candidate, 0 missing in reference" % (k, d, k, d, k) for k in (1, 2)]
    check(r.returncode == 0 and lines == want, "loader: fork vs spawn compare identical, their per-process "
          "files pair by pair (rc %d, %s)" % (r.returncode, lines))
    for k in (1, 2):
        r = compare("--expect-identical", os.path.join(d, "ld-fork.proc%d.h5" % k),
                    os.path.join(d, "ld-spawn.proc%d.h5" % k))
        check(r.returncode == 0, "loader: worker %d's files of the fork and spawn runs compare identical" % k)
    # a worker file that differs (worker 2's file of the fork run in place of worker 1's)
    p1 = os.path.join(d, "ld-spawn.proc1.h5")
    os.rename(p1, p1 + ".keep")
    os.link(os.path.join(d, "ld-fork.proc2.h5"), p1)
    a, b = datasets(os.path.join(d, "ld-fork.proc1.h5")), datasets(p1)
    ndiff = sum(not same(a[k][0], b[k][0]) for k in a)
    r = compare("--expect-identical", outs["fork"], outs["spawn"])
    lines = [l for l in r.stdout.splitlines() if l.startswith("processes: proc1")]
    check(ndiff > 0 and r.returncode == 1 and len(lines) == 1
          and ": FAIL: 6 tensors compared, %d fail," % ndiff in lines[0]
          and "FAIL: the run's own files pass, but a per-process file fails or has no counterpart "
          "(processes: above)" in r.stdout, "loader: a worker whose tensors differ fails the comparison (%s)" % lines)
    os.remove(p1)
    r = compare(outs["fork"], outs["spawn"])
    check(r.returncode == 2 and r.stderr.startswith("probe-compare: per-process file proc1: ")
          and len(r.stderr.splitlines()) == 1, "loader: a listed per-process file that is gone: exit 2, one line")
    os.rename(p1 + ".keep", p1)


def test_loader_encode(d):
    save = os.path.join(d, "le")
    os.makedirs(save)
    out = os.path.join(d, "le.h5")
    r = probe_run(out, [PY, PROG, "loader-encode", save])
    check(r.returncode == 0 and probe_lines(r.stderr) == [], "loader-encode: runs, no probe: line")
    check({p.split("/")[1] for p in datasets(out)} == {"dit.step"},
          "loader-encode: workers calling the pipeline's encode_prompt leave the main file to the DiT")
    wv = worker_values(save)
    for w in range(2):
        got = datasets(os.path.join(d, "le.proc%d.h5" % (w + 1)))
        check(sorted({p.split("/")[1] for p in got}) == ["prompt_embeds", "text_encoder"]
              and all(same(got["/prompt_embeds/%04d/out" % k][0][0], wv[2 * w + k]) for k in range(2)),
              "loader-encode: worker %d's file holds its prompt_embeds and text_encoder calls" % w)


def test_late(d):
    save = os.path.join(d, "late")
    os.makedirs(save)
    out = os.path.join(d, "late.h5")
    r = probe_run(out, [PY, PROG, "late-fork", save])
    check(r.returncode == 0 and "loader: 3 DiT calls" in r.stdout, "late: runs")
    pat = (r"probe: pid (\d+) did not capture text_encoder \(2 calls\): it was forked from pid (\d+) after "
           r"that process opened the capture file, and such a child never captures \(start it with the "
           r"spawn start method, or before the first capture\)$")
    lines = probe_lines(r.stderr)
    ms = [re.match(pat, l) for l in lines]
    check(len(lines) == 2 and all(ms) and ms[0].group(2) == ms[1].group(2) and ms[0].group(1) != ms[1].group(1),
          "late: one exact line per forked worker (%s)" % lines)
    check(set(datasets(out)) == {"/dit.step/%04d/%s" % (k, s) for k in range(3) for s in
                                  ("in.hidden_states", "in.timestep", "in.encoder_hidden_states", "out.sample")},
          "late: the main file holds the 3 DiT calls")
    check("processes" not in manifest(out) and not [f for f in os.listdir(d) if f.startswith("late.proc")],
          "late: no per-process file")


def test_osfork(d):
    for mode in ("osfork", "osfork-exit"):
        out = os.path.join(d, mode + ".h5")
        r = probe_run(out, [PY, PROG, mode, d])
        lines = probe_lines(r.stderr)
        m = re.match(r"probe: pid (\d+) did not capture text_encoder \(3 calls\): it was forked from pid (\d+) "
                     r"after that process opened the capture file", lines[0]) if len(lines) == 1 else None
        check(r.returncode == 0 and "osfork: child status 0" in r.stdout and m is not None,
              "%s: os.fork after the capture began, the child ending by %s names what it did not capture (%s)"
              % (mode, "os._exit" if mode == "osfork-exit" else "sys.exit", lines))
        check({p.split("/")[1] for p in datasets(out)} == {"dit.step"}, "%s: the parent's file is intact" % mode)


def test_threads(d):
    outs = []
    for k in ("a", "b"):
        save = os.path.join(d, "th-" + k)
        os.makedirs(save)
        out = os.path.join(d, "th-%s.h5" % k)
        outs.append(out)
        r = probe_run(out, [PY, PROG, "threads", save])
        check(r.returncode == 0 and probe_lines(r.stderr) == [], "threads %s: runs, no probe: line" % k)
        got = datasets(out)
        want = {"/text_encoder@enc-%d/%04d/%s" % (j, i, s) for j in range(4) for i in range(3)
                for s in ("in.input_ids", "in.attention_mask", "out.last_hidden_state")}
        check(set(got) == want, "threads %s: 4 threads x 3 calls at /text_encoder@enc-<j>/<call> (%d paths)"
              % (k, len(got)))
        check(all(same(got["/text_encoder@enc-%d/%04d/out.last_hidden_state" % (j, i)][0],
                       np.load(os.path.join(save, "thread%d.text_encoder.%d.npy" % (j, i))))
                  for j in range(4) for i in range(3)),
              "threads %s: every call's output equals its thread's own result" % k)
        check(all(int(a["probe.call"]) == int(p.split("/")[2]) for p, (_, a) in got.items()),
              "threads %s: probe.call is the per-thread index" % k)
        th = manifest(out).get("threads")
        check(th == {"enc-%d" % j: {"name": "enc-%d" % j, "calls": {"text_encoder": 3}} for j in range(4)},
              "threads %s: manifest threads (%s)" % (k, th))
    r = compare("--expect-identical", *outs)
    check(r.returncode == 0 and "36 tensors compared, 36 pass, 0 fail, 0 missing in candidate, 0 missing in "
          "reference" in r.stdout, "threads: the two runs pair exactly (rc %d)" % r.returncode)
    want = ("threads: text_encoder was called on 4 threads besides the main one in the reference (enc-0, enc-1, "
            "enc-2, enc-3): their calls are /text_encoder@<thread>/<call>, paired by thread name")
    check([l for l in r.stdout.splitlines() if l.startswith("threads:")] == [want], "threads: probe-compare says so")

    save = os.path.join(d, "pt")
    os.makedirs(save)
    out = os.path.join(d, "pt.h5")
    r = probe_run(out, [PY, PROG, "pipe-threads", save])
    check(r.returncode == 0, "pipe-threads: runs")
    got = datasets(out)
    for j in range(2):
        want = saved_index(os.path.join(save, "pipe-%d" % j))
        tagged = {"/%s@pipe-%d/%s" % (p.split("/")[1], j, "/".join(p.split("/")[2:])): v for p, v in want.items()}
        check(all(p in got and same(got[p][0], v) for p, v in tagged.items()),
              "pipe-threads: thread %d's %d tensors at /<component>@pipe-%d/..., equal to its own" % (j, len(want), j))
        dit = sorted(p for p in got if p.startswith("/dit.step@pipe-%d/" % j) and p.endswith("/out.sample"))
        sc = [(int(got[p][1]["probe.step"]), int(got[p][1]["probe.cfg_branch"])) for p in dit]
        check(sc == [(0, 0), (0, 1), (1, 0), (1, 1)], "pipe-threads: thread %d's step and CFG branch (%s)" % (j, sc))
    roots = [p for p in got if p.split("/")[1].split("@")[0] in ("latents.init", "timesteps", "prompt_embeds")]
    r = compare("--expect-identical", out, out)
    n = len(roots) + 1  # and the scheduler's configuration (manifest "scheduler")
    check(r.returncode == 0 and len(roots) == 10 and "root inputs: %d checked, %d identical, 0 differ" % (n, n)
          in r.stdout, "pipe-threads: the threads' root inputs are root inputs to probe-compare")


def test_lines(d):
    out = os.path.join(d, "iso.h5")
    for flag in ("-I", "-E", "-S"):
        r = probe_run(out, [PY, flag, "-c", "print(7)"], "--force")
        lines = probe_lines(r.stderr)
        check(r.returncode == 0 and r.stdout == "7\n" and len(lines) == 1 and re.match(
            r"probe: pid \d+ \(python[0-9.]*\) ran without probe's Python adapter: Python did not import "
            r"probe's sitecustomize \(python -I, -E or -S\), so no Python component of this process was "
            r"captured$", lines[0]), "python %s: one exact line (%s)" % (flag, lines))
    r = probe_run(out, [PY, "-c", "print(7)"], "--force")
    check(probe_lines(r.stderr) == [], "plain python: no line")
    script = os.path.join(d, "ty.py")
    with open(script, "w") as fh:
        fh.write("import torch\nToyTextEncoder = type('ToyTextEncoder', (torch.nn.Module,), "
                 "{'forward': lambda self, x: x * 2})\nprint(ToyTextEncoder()(torch.ones(2)).sum().item())\n")
    r = probe_run(out, [PY, script], "--force")
    check(r.stdout == "4.0\n" and probe_lines(r.stderr) == [
        "probe: classes created without a class statement (type()) match the component table but were never "
        "wrapped, so their calls were not captured: __main__.ToyTextEncoder.forward -> text_encoder"],
        "type(): one exact line (%s)" % probe_lines(r.stderr))
    with open(script, "w") as fh:
        fh.write("import torch\nclass Net(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
                 "print(Net()(torch.ones(2)).sum().item())\n")
    r = probe_run(out, [PY, script], "--force")
    lines = probe_lines(r.stderr)
    check(r.stdout == "4.0\n" and len(lines) == 1 and re.match(
        r"probe: pid \d+ imported torch but no class matched the component table \(.*components\.json\): "
        r"nothing of this process was captured; name the classes with --tap COMPONENT=Class\.method$",
        lines[0]), "no class of the table: one exact line (%s)" % lines)


def test_bad(d):
    out = os.path.join(d, "abi.h5")
    r = probe_run(out, [PY, PROG, "abi", d])
    check(r.returncode == 0 and r.stdout.splitlines()[1] == "if_taken b'procZ' = 8"
          and r.stdout.splitlines()[9] == "sidecar b'procA_1-x' = 8",
          "abi: the run's first process never writes a per-process file (%s)" % r.stdout.splitlines()[:10])
    os.remove(out)
    # bash is the run's first process; the program, its child, may name itself
    r = probe_run(out, ["bash", "-c", '"$0" "$@"; true', PY, PROG, "abi", d])
    want = ["if_taken b'bad/' = 1", "if_taken b'procZ' = 0"]
    want += ["sidecar %r = 1" % n for n in (None, b"", b"x1", b"proc/1", b"proc 1", b"proc" + b"a" * 61, b"rank0")]
    want += ["sidecar b'procA_1-x' = 0", "sidecar again same = 0", "sidecar again other = 8", "tap = 0",
             "sidecar after tap = 8", "close = 0", "tap after close = 8", "close again = 0"]
    check(r.returncode == 0 and r.stdout.splitlines() == want, "abi: return codes (%s)" % r.stdout.splitlines())
    side = os.path.join(d, "abi.procA_1-x.h5")
    check(os.path.exists(side) and list(datasets(side)) == ["/abi/0000/out"]
          and same(datasets(side)["/abi/0000/out"][0], np.arange(6, dtype=np.float32).reshape(2, 3)),
          "abi: the per-process file holds the one tap made before close")
    check(datasets(out) == {} and manifest(out).get("processes") == ["abi.procA_1-x.h5"],
          "abi: the main file is empty and lists it")
    os.remove(out)
    r = probe_run(out, [PY, "-c", "print(1)"])
    check(r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        "per-process capture files of an earlier run exist ('%s/abi.proc<N>.h5'); pass --force to remove them"
        % d), "probe-run: stale per-process files refused, exit 2")
    check(os.path.exists(side), "probe-run: the refused run removed nothing")
    r = probe_run(out, [PY, "-c", "print(1)"], "--force")
    check(r.returncode == 0 and not os.path.exists(side), "probe-run --force removes them")
    # a rank's worker file (<stem>.rank<R>.proc<N><ext>) of an earlier run; other names stay
    os.remove(out)
    keep = [os.path.join(d, n) for n in ("abi.rank0.procX.y.h5", "abi.rankA.proc1.h5", "abi.proc1.h5.txt")]
    for n in ["abi.rank0.proc1.h5"] + [os.path.basename(k) for k in keep]:
        open(os.path.join(d, n), "w").write("x")
    r = probe_run(out, [PY, "-c", "print(1)"])
    check(r.returncode == 2 and "per-process capture files of an earlier run exist" in r.stderr,
          "probe-run: a stale per-rank worker file is refused, exit 2")
    r = probe_run(out, [PY, "-c", "print(1)"], "--force")
    check(r.returncode == 0 and not os.path.exists(os.path.join(d, "abi.rank0.proc1.h5"))
          and all(os.path.exists(k) for k in keep), "probe-run --force removes it and nothing else")


def main():
    need_build()
    d = tmpdir("probe-procs-")
    for t in (test_mp, test_pool, test_loader, test_loader_encode, test_late, test_osfork, test_threads, test_lines, test_bad):
        sub = os.path.join(d, t.__name__)
        os.makedirs(sub)
        t(sub)
    finish()


if __name__ == "__main__":
    main()
