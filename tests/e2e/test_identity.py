#!/usr/bin/env python3
"""End-to-end: every call's class and module path (probe.class, probe.module),
and probe-compare's pairing by module path and class check.

The program (written by this test) is a two-encoder pipeline like SD3's or
Flux's: a pipeline object holding text_encoder and text_encoder_2 (two
TinyTextEncoder modules with different weights), a denoiser TinyDiT that
runs two TinyDiTBlock modules, and a scheduler, all real torch. Its options
choose the order in which the two encoders are called, whether
text_encoder_2 is another class (OtherTextEncoder, the same computation and
weights), and whether text_encoder_2 is called at all. It saves, with its
own forward hooks, every encoder call's output in call order together with
the attribute name it called (the program's bookkeeping).

Runs and what they must show:
  a  order 1,2 under probe-run --blocks: probe.module is text_encoder /
     text_encoder_2 for the two encoder calls in the order the program called
     them, transformer for dit.step, transformer.blocks.<i> for the blocks,
     scheduler for scheduler.step; probe.class is each module's class; the
     captured encoder outputs are bit-identical to the hooks' copies;
  b  order 2,1: probe-compare a b --expect-identical exits 0: the encoder
     calls are paired by module path (/text_encoder/0000 of a with
     /text_encoder/0001 of b), the JSON says so (identity.calls_paired_by_module
     2, candidate_path on those tensors), every pair is bit-identical, and
     the terminal has the "paired by module path" line. Pairing by dataset
     path would pair different encoders: a's /text_encoder/0000 output and
     b's differ (checked with h5py), so a pass proves the pairing;
  c  text_encoder_2 of class OtherTextEncoder: exit 0 with
     --expect-identical (same values), JSON class_candidate on that call's
     tensors, identity.class_mismatches = their count, the "class differs"
     line naming both classes, and the class column of the table;
  d  text_encoder_2 never called: /text_encoder/0001/* of a are missing in
     the candidate (exit 1), and nothing else is; that call is counted in
     identity.calls_unpaired_by_module;
  k  the transformer wrapped by torch.compile (backend "eager") on the
     pipeline: dit.step is still "transformer" and its blocks
     "transformer.blocks.<i>";
  e  captures without probe.module (h5py copies of a and b with the
     attribute removed): pairing by path as before, so the two encoder
     calls of a and b are compared crosswise and fail.

Runs under the venv of scripts/setup (re-executes itself there; exit 77,
skipped, without it). Environment: PROBE_BUILD_DIR (required).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import reexec_in_venv  # noqa: E402

reexec_in_venv()  # torch.compile (case k) needs the venv's torch 2.11

import h5py  # noqa: E402
import numpy as np  # noqa: E402

BUILD = os.environ.get("PROBE_BUILD_DIR")

PROGRAM = textwrap.dedent('''
    import json, sys
    import torch

    order, other, out = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.manual_seed(0)

    class TinyTextEncoder(torch.nn.Module):
        def __init__(self, seed):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.emb = torch.nn.Parameter(torch.randn(16, 8, generator=g))
        def forward(self, input_ids):
            return torch.tanh(self.emb[input_ids])

    class OtherTextEncoder(TinyTextEncoder):
        pass

    class TinyDiTBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
        def forward(self, x):
            return x + torch.tanh(self.lin(x))

    class TinyDiT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([TinyDiTBlock(), TinyDiTBlock()])
        def forward(self, hidden_states, encoder_hidden_states):
            x = hidden_states + encoder_hidden_states.mean(1, keepdim=True)
            for b in self.blocks:
                x = b(x)
            return x

    class TinyScheduler:
        def step(self, model_output, timestep, sample):
            return sample - 0.1 * model_output

    class TinyPipeline:
        def __init__(self):
            self.text_encoder = TinyTextEncoder(1)
            self.text_encoder_2 = (OtherTextEncoder if other == "other" else TinyTextEncoder)(2)
            self.transformer = TinyDiT()
            if other == "compile":
                self.transformer = torch.compile(self.transformer, backend="eager")
            self.scheduler = TinyScheduler()
        def __call__(self, ids):
            embs = {}
            for name in order.split(","):
                embs[name] = getattr(self, name)(ids)
            e = sum(embs.values())
            x = torch.zeros(1, 3, 8)
            for t in range(2):
                x = self.scheduler.step(self.transformer(x, e), t, x)
            return x

    pipe = TinyPipeline()
    book = []
    def hook(name):
        def h(module, args, output):
            book.append({"module": name, "out": output.detach().numpy().tolist()})
        return h
    for name in ("text_encoder", "text_encoder_2"):
        getattr(pipe, name).register_forward_hook(hook(name))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        x = pipe(ids)
    with open(out, "w") as fh:
        json.dump({"book": book, "x": x.numpy().tolist()}, fh)
''')

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def s(v):
    return v.decode() if isinstance(v, bytes) else v


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)


def read(path):
    got = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                got["/" + name] = (np.array(obj[()]), {k: s(obj.attrs[k]) for k in obj.attrs})
        f.visititems(visit)
    return got


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR not set")
        return 1
    tmp = tempfile.mkdtemp(prefix="probe-identity-")
    prog = os.path.join(tmp, "pipe.py")
    with open(prog, "w") as fh:
        fh.write(PROGRAM)
    probe_run = os.path.join(BUILD, "bin", "probe-run")
    compare = os.path.join(BUILD, "bin", "probe-compare")

    def capture(name, order, other="same"):
        out, book = os.path.join(tmp, name + ".h5"), os.path.join(tmp, name + ".json")
        p = run([probe_run, "--out", out, "--blocks", "--", sys.executable, prog, order, other, book])
        check(p.returncode == 0, "(%s) probe-run exits 0 (%d: %s)" % (name, p.returncode,
                                                                    p.stderr.decode()[-400:]))
        with open(book) as fh:
            return out, json.load(fh)

    a, book_a = capture("a", "text_encoder,text_encoder_2")
    b, book_b = capture("b", "text_encoder_2,text_encoder")
    c, _ = capture("c", "text_encoder,text_encoder_2", "other")
    d, _ = capture("d", "text_encoder")
    k, _ = capture("k", "text_encoder,text_encoder_2", "compile")

    # (a) what each call records
    ga = read(a)
    enc = sorted(p for p in ga if p.startswith("/text_encoder/") and p.endswith("/out"))
    check([ga[p][1].get("probe.module") for p in enc] == [e["module"] for e in book_a["book"]],
          "(a) probe.module of the encoder calls is the attribute the program called, in order")
    check(all(np.array_equal(ga[p][0], np.array(e["out"], dtype=np.float32))
              for p, e in zip(enc, book_a["book"])) and len(enc) == 2,
          "(a) both encoder outputs are bit-identical to the hooks' copies")
    mods = {}
    for p, (_, at) in ga.items():
        mods.setdefault(p.split("/")[1], set()).add((at.get("probe.module"), at.get("probe.class")))
    check(mods.get("dit.step") == {("transformer", "__main__.TinyDiT")}, "(a) dit.step: transformer, TinyDiT")
    check(mods.get("dit.block") == {("transformer.blocks.0", "__main__.TinyDiTBlock"),
                                    ("transformer.blocks.1", "__main__.TinyDiTBlock")},
          "(a) dit.block: transformer.blocks.0/1, TinyDiTBlock (%r)" % mods.get("dit.block"))
    check(mods.get("scheduler.step") == {("scheduler", "__main__.TinyScheduler")},
          "(a) scheduler.step: scheduler")

    # (k) torch.compile: the pipeline holds the compiled wrapper; the modules keep their paths
    gk = read(k)
    mk = {}
    for p_, (_, at) in gk.items():
        mk.setdefault(p_.split("/")[1], set()).add(at.get("probe.module"))
    check(mk.get("dit.step") == {"transformer"}
          and mk.get("dit.block") == {"transformer.blocks.0", "transformer.blocks.1"},
          "(k) under torch.compile dit.step is still transformer and its blocks transformer.blocks.<i> (%r)"
          % ((mk.get("dit.step"), mk.get("dit.block")),))

    # (b) pairing by module path
    gb = read(b)
    check(not np.array_equal(ga["/text_encoder/0000/out"][0], gb["/text_encoder/0000/out"][0]),
          "(b) a's and b's /text_encoder/0000/out differ (different encoders at that index)")
    js = os.path.join(tmp, "ab.json")
    p = run([compare, a, b, "--expect-identical", "--json", js])
    out = p.stdout.decode()
    check(p.returncode == 0, "(b) probe-compare a b --expect-identical exits 0 (%d)%s"
          % (p.returncode, "" if p.returncode == 0 else "\n" + out[-1500:]))
    j = json.load(open(js))
    ident = j.get("identity", {})
    check(ident.get("calls_paired_by_module") == 2 and ident.get("calls_unpaired_by_module") == 0
          and ident.get("by_module_component") == "text_encoder",
          "(b) identity: 2 calls of text_encoder paired by module path (%r)" % ident)
    tj = {t["path"]: t for t in j["tensors"]}
    check(tj["/text_encoder/0000/out"].get("candidate_path") == "/text_encoder/0001/out"
          and tj["/text_encoder/0001/in.input_ids"].get("candidate_path") == "/text_encoder/0000/in.input_ids"
          and tj["/text_encoder/0000/out"]["module"] == "text_encoder"
          and "candidate_path" not in tj["/dit.step/0000/out"],
          "(b) candidate_path on the re-paired encoder tensors only")
    check(all(t["rel_l2"] == 0 for t in j["tensors"]), "(b) every pair is identical")
    check("paired by module path: the runs called the modules of text_encoder in another order; 2 "
          "reference calls paired with a candidate call of another index (first: "
          "/text_encoder/0000/in.input_ids [text_encoder] with /text_encoder/0001/in.input_ids)" in out,
          "(b) the terminal says how the calls were paired")

    # (c) class mismatch
    js = os.path.join(tmp, "ac.json")
    p = run([compare, a, c, "--expect-identical", "--json", js])
    out = p.stdout.decode()
    j = json.load(open(js))
    mism = [t["path"] for t in j["tensors"] if "class_candidate" in t]
    check(p.returncode == 0, "(c) exit 0: a class mismatch alone does not fail (%d)" % p.returncode)
    check(sorted(mism) == ["/text_encoder/0001/in.input_ids", "/text_encoder/0001/out"]
          and all(t["class_candidate"] == "__main__.OtherTextEncoder" and t["class"] == "__main__.TinyTextEncoder"
                  for t in j["tensors"] if "class_candidate" in t),
          "(c) class_candidate on text_encoder_2's tensors only (%r)" % mism)
    check(j["identity"]["class_mismatches"] == 2
          and j["identity"]["first_class_mismatch"] == "/text_encoder/0001/in.input_ids",
          "(c) identity.class_mismatches 2")
    check("class differs: 2 compared tensors ran in a module of another class in the candidate (first: "
          "/text_encoder/0001/in.input_ids: reference __main__.TinyTextEncoder, candidate "
          "__main__.OtherTextEncoder)" in out, "(c) the class-differs line")
    header = [ln for ln in out.splitlines() if ln.startswith("path")]
    row = [ln for ln in out.splitlines() if ln.startswith("/dit.block/0000/out ")]
    check(header and header[0].split()[:3] == ["path", "class", "dtype"] and row
          and row[0].split()[1] == "TinyDiTBlock", "(c) the table's class column")

    # (d) a module the candidate never called
    js = os.path.join(tmp, "ad.json")
    p = run([compare, a, d, "--expect-identical", "--json", js])
    j = json.load(open(js))
    check(p.returncode == 1 and sorted(j["missing_in_candidate"]) ==
          ["/text_encoder/0001/in.input_ids", "/text_encoder/0001/out"] and not j["missing_in_reference"]
          and j["identity"]["calls_unpaired_by_module"] == 1 and j["identity"]["calls_paired_by_module"] == 0,
          "(d) text_encoder_2's call is missing in the candidate, nothing else (%r)"
          % ((j["missing_in_candidate"], j["identity"]),))

    # (e) no probe.module: pairing by path
    plain = []
    for src in (a, b):
        dst = src[:-3] + "-plain.h5"
        shutil.copy(src, dst)
        with h5py.File(dst, "r+") as f:
            f.visititems(lambda n, o: o.attrs.__delitem__("probe.module")
                         if isinstance(o, h5py.Dataset) and "probe.module" in o.attrs else None)
        plain.append(dst)
    js = os.path.join(tmp, "plain.json")
    p = run([compare, plain[0], plain[1], "--expect-identical", "--json", js])
    j = json.load(open(js))
    tj = {t["path"]: t for t in j["tensors"]}
    check(p.returncode == 1 and j["identity"]["calls_paired_by_module"] == 0
          and tj["/text_encoder/0000/out"]["rel_l2"] > 0 and "candidate_path" not in tj["/text_encoder/0000/out"],
          "(e) without probe.module the calls pair by path (and differ)")

    if failures:
        print("%d failure(s); files kept in %s" % (len(failures), tmp))
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
