#!/usr/bin/env python3
"""Injection with --convert and isolation verdicts (docs/inject.md), on a
small pipeline that taps through the ABI (ctypes, as the adapter does): a
root input (latents.init), a denoiser call (dit.step: out = 1.5 x + 0.25) and
a decoder call (vae.decode: out = z * z), each computed in float32 and stored
in the run's dtype (float32, or bfloat16 rounded to nearest even).

 (1) converted roots: a bfloat16 candidate run with --inject REF --convert is
     the same experiment: the root is "same", "converted", why "converted
     from the reference (float32 -> bfloat16)"; the bytes are checked against
     the reference converted here in numpy; terminal line "same ...";
     not the same experiment when: the candidate holds the same values but
     was not injected (its manifest records no conversion); it was injected
     and then changed one element; its manifest's record names another
     reference hash;
 (2) a replay with --convert: every output gets isolated_inputs_converted
     true, isolated_inputs_rel_l2 = numpy's fp64 rel_l2 of the reference's
     input against its bfloat16 rounding, isolated_inputs_worst = the input's
     slot; the terminal isolation table says "inputs converted: rel_l2 X
     (in.SLOT)"; a float32 replay has isolated_inputs_converted false;
 (3) a failed replay (dtype mismatch without --convert) and a replay killed
     half-way: exit 1 with "isolated run ISO is not a complete replay of the
     reference: WHY", isolated_complete false, no isolated key on any tensor,
     no isolation table (terminal and HTML);
 (4) bad input: --isolated naming the candidate or a missing file: exit 2,
     one line.
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR")
PY = os.environ.get("PROBE_PYTHON") or sys.executable
FAILURES = []

PIPE = r'''
import ctypes, os, signal, sys
import numpy as np
sys.path.insert(0, os.environ["PYTHONPATH"].split(":")[0])
from probe_adapter import _abi
lib = ctypes.CDLL(None)
lib.probe_tap_v1.argtypes = lib.probe_inject_v1.argtypes = [ctypes.POINTER(_abi.ProbeTapTensorV1)]
F32, BF16 = 12, 11

def bf16_bits(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)

def bf16_float(b):
    return (b.astype(np.uint32) << 16).view(np.float32)

def desc(comp, call, slot, arr, code):
    shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
    strides = (ctypes.c_int64 * arr.ndim)(*[s // arr.itemsize for s in arr.strides])
    return _abi.ProbeTapTensorV1(struct_size=ctypes.sizeof(_abi.ProbeTapTensorV1), abi_version=1,
        component=comp.encode(), slot=slot.encode(), call=call, step=-1, cfg_branch=-1, device=-1,
        dtype=code, rank=arr.ndim, shape=shape, strides=strides, data=arr.ctypes.data, stream=None,
        timestep=float("nan"))

dtype, seed, mode = sys.argv[1], int(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else "")
code = F32 if dtype == "float32" else BF16
make = (lambda x: np.ascontiguousarray(x, np.float32)) if code == F32 else bf16_bits
value = (lambda a: a) if code == F32 else bf16_float

def inject(comp, call, slot, a):
    return lib.probe_inject_v1(ctypes.byref(desc(comp, call, slot, a, code)))

def tap(comp, call, slot, a):
    assert lib.probe_tap_v1(ctypes.byref(desc(comp, call, slot, a, code))) == 0

rng = np.random.default_rng(seed)
lat = make(rng.standard_normal((2, 3, 8)))
inject("latents.init", 0, "out", lat)
if mode == "perturb-root":
    lat.view(np.uint16 if code == BF16 else np.uint32).flat[5] ^= 1
tap("latents.init", 0, "out", lat)
x = lat.copy()
inject("dit.step", 0, "in.hidden_states", x)
y = make(value(x) * np.float32(1.5) + np.float32(0.25))
tap("dit.step", 0, "in.hidden_states", x)
tap("dit.step", 0, "out", y)
if mode == "crash":
    lib.probe_tap_flush_v1()
    os.kill(os.getpid(), signal.SIGKILL)
z = y.copy()
inject("vae.decode", 0, "in.latents", z)
w = make(value(z) * value(z))
tap("vae.decode", 0, "in.latents", z)
tap("vae.decode", 0, "out.sample", w)
'''


def check(cond, what):
    print(("ok   - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    return p


def bf16_round(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint32)
    return (b << 16).astype(np.uint32).view(np.float32)


def rel_l2(r, c):
    r = np.asarray(r, np.float64).ravel()
    c = np.asarray(c, np.float64).ravel()
    return math.sqrt(math.fsum((c - r) ** 2)) / math.sqrt(math.fsum(r * r))


def close(a, b):
    return a is not None and b is not None and abs(a - b) <= 1e-12 * abs(b)


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR is not set", file=sys.stderr)
        return 1
    run_ = os.path.join(BUILD, "bin", "probe-run")
    cmp_ = os.path.join(BUILD, "bin", "probe-compare")
    d = tempfile.mkdtemp(prefix="probe-iso-conv-")
    j = lambda *p: os.path.join(d, *p)  # noqa: E731
    prog = j("pipe.py")
    with open(prog, "w") as fh:
        fh.write(PIPE)

    def probe_run(out, *opts, args=()):
        return run([run_, "--out", out, *opts, "--", PY, prog, *args])

    def compare(*args):
        p = run([cmp_, *args, "--json", j("out.json")])
        try:
            doc = json.load(open(j("out.json")))
        except (OSError, ValueError):
            doc = {}
        if os.path.exists(j("out.json")):
            os.unlink(j("out.json"))
        return p.returncode, doc, p.stdout, p.stderr

    p = probe_run(j("ref.h5"), args=("float32", "0"))
    check(p.returncode == 0, "reference run (%s)" % p.stderr[-300:])
    with h5py.File(j("ref.h5"), "r") as f:
        ref = {k: f[k][()] for k in ("/latents.init/0000/out", "/dit.step/0000/in.hidden_states",
                                     "/vae.decode/0000/in.latents", "/dit.step/0000/out")}

    # (1) converted roots
    p = probe_run(j("cand.h5"), "--inject", j("ref.h5"), "--convert", args=("bfloat16", "1"))
    check(p.returncode == 0, "(1) bfloat16 candidate with --inject --convert (%s)" % p.stderr[-300:])
    with h5py.File(j("cand.h5"), "r") as f:
        croot = f["/latents.init/0000/out"][()]
        cdt = f["/latents.init/0000/out"].attrs["probe.dtype"]
    check((cdt.decode() if isinstance(cdt, bytes) else cdt) == "bfloat16"
          and np.array_equal(croot.astype(np.float32).view(np.uint32),
                             bf16_round(ref["/latents.init/0000/out"]).view(np.uint32)),
          "(1) the candidate's root is the reference's rounded to bfloat16 (numpy, bit for bit)")
    rc, doc, out, err = compare(j("ref.h5"), j("cand.h5"))
    root = [r for r in doc.get("root_inputs") or [] if r["path"] == "/latents.init/0000/out"]
    check(doc.get("same_experiment") is True and root and root[0]["same"] is True and root[0]["converted"] is True
          and root[0]["why"] == "converted from the reference (float32 -> bfloat16)"
          and not any("not the same experiment" in x for x in doc.get("reasons", [])),
          "(1) the same experiment: %r" % root)
    check("  same      /latents.init/0000/out: converted from the reference (float32 -> bfloat16)\n" in out
          and "root inputs: 1 checked, 0 identical, 1 converted from the reference, 0 differ" in out
          and "not the same experiment" not in out, "(1) terminal lists the converted root")

    def root_why(path):
        rc, doc, out, err = compare(j("ref.h5"), path)
        r = [x for x in doc.get("root_inputs") or [] if x["path"] == "/latents.init/0000/out"]
        return rc, doc, (r[0] if r else {})

    p = probe_run(j("noinj.h5"), args=("bfloat16", "0"))
    rc, doc, r = root_why(j("noinj.h5"))
    check(rc == 1 and doc.get("same_experiment") is False and r.get("same") is False and r.get("converted") is False
          and r.get("why") == "dtype float32 vs bfloat16"
          and "not the same experiment: root input /latents.init/0000/out differs (dtype float32 vs bfloat16)"
          in doc.get("reasons", []), "(1) the same values, not injected: not the same experiment (%r)" % r)
    p = probe_run(j("pert.h5"), "--inject", j("ref.h5"), "--convert", args=("bfloat16", "1", "perturb-root"))
    rc, doc, r = root_why(j("pert.h5"))
    check(rc == 1 and doc.get("same_experiment") is False and r.get("same") is False and r.get("why") ==
          "dtype float32 vs bfloat16 (injected with conversion, but the values are not the reference's "
          "converted to bfloat16)", "(1) injected, then one element changed: not the same (%r)" % r.get("why"))
    with h5py.File(j("cand.h5"), "r") as f:
        m = json.loads(f.attrs["probe.manifest"])
    for t in m["inject"]["tensors"]:
        t["reference_hash"] = "0123456789abcdef"
    subprocess.run(["cp", j("cand.h5"), j("forged.h5")], check=True)
    with h5py.File(j("forged.h5"), "a") as f:
        f.attrs["probe.manifest"] = json.dumps(m)
    rc, doc, r = root_why(j("forged.h5"))
    check(rc == 1 and r.get("same") is False and r.get("why") == "dtype float32 vs bfloat16",
          "(1) a record that names another reference's hash: not recognised (%r)" % r.get("why"))

    # (2) replay with --convert: the isolated inputs are converted
    p = probe_run(j("iso.h5"), "--replay", j("ref.h5"), "--convert", args=("bfloat16", "1"))
    check(p.returncode == 0, "(2) --replay --convert run (%s)" % p.stderr[-300:])
    rc, doc, out, err = compare(j("ref.h5"), j("cand.h5"), "--isolated", j("iso.h5"))
    t = {x["path"]: x for x in doc.get("tensors", [])}
    want_x = rel_l2(ref["/dit.step/0000/in.hidden_states"], bf16_round(ref["/dit.step/0000/in.hidden_states"]))
    want_z = rel_l2(ref["/vae.decode/0000/in.latents"], bf16_round(ref["/vae.decode/0000/in.latents"]))
    o = t.get("/dit.step/0000/out", {})
    v = t.get("/vae.decode/0000/out.sample", {})
    check(doc.get("isolated_complete") is True and o.get("isolated_inputs_converted") is True
          and close(o.get("isolated_inputs_rel_l2"), want_x) and o.get("isolated_inputs_worst") == "in.hidden_states",
          "(2) dit.step out: inputs converted, rel_l2 %r == numpy %r" % (o.get("isolated_inputs_rel_l2"), want_x))
    check(v.get("isolated_inputs_converted") is True and close(v.get("isolated_inputs_rel_l2"), want_z)
          and v.get("isolated_inputs_worst") == "in.latents", "(2) vae.decode out: its own input's rel_l2")
    check(all("isolated_inputs_converted" not in x for p_, x in t.items() if "/in." in p_),
          "(2) input tensors carry no isolated_inputs_* keys")
    with h5py.File(j("iso.h5"), "r") as f:
        iso_y = f["/dit.step/0000/out"][()]
    check(close(o.get("rel_l2_isolated"), rel_l2(ref["/dit.step/0000/out"], iso_y)),
          "(2) rel_l2_isolated of the denoiser = numpy's (%r)" % o.get("rel_l2_isolated"))
    iso_table = out.split("\nisolation (", 1)[-1]
    row = [l for l in iso_table.splitlines() if l.startswith("/dit.step/0000/out ")]
    check(row and row[0].endswith("inputs converted: rel_l2 %.3e (in.hidden_states)" % want_x)
          and "its rel_l2 iso includes the rounding of its inputs" in out,
          "(2) terminal isolation row: %r" % (row[0] if row else None))
    p = probe_run(j("iso32.h5"), "--replay", j("ref.h5"), args=("float32", "1"))
    rc, doc, out, err = compare(j("ref.h5"), j("cand.h5"), "--isolated", j("iso32.h5"))
    o = {x["path"]: x for x in doc.get("tensors", [])}.get("/dit.step/0000/out", {})
    check(doc.get("isolated_complete") is True and o.get("isolated_inputs_converted") is False
          and o.get("isolated_inputs_rel_l2") is None and "inputs converted" not in out,
          "(2) a float32 replay: inputs not converted")

    # (3) a failed replay and a killed one: no isolation
    p = probe_run(j("isofail.h5"), "--replay", j("ref.h5"), args=("bfloat16", "1"))
    p2 = probe_run(j("isokill.h5"), "--replay", j("ref.h5"), "--convert", args=("bfloat16", "1", "crash"))
    check(p2.returncode == -9, "(3) the killed replay ends by SIGKILL (%d)" % p2.returncode)
    for name, why in (("isofail.h5", "/dit.step/0000/in.hidden_states: dtype mismatch: reference float32, "
                                     "candidate bfloat16 (probe-run --convert converts floating types)"),
                      ("isokill.h5", "the run did not complete (killed by signal SIGKILL; its writer did not "
                                     "close the capture)")):
        rc, doc, out, err = compare(j("ref.h5"), j("cand.h5"), "--isolated", j(name), "--html", j("r.html"))
        reason = "isolated run %s is not a complete replay of the reference: %s" % (j(name), why)
        check(rc == 1 and reason in doc.get("reasons", []) and doc.get("isolated_complete") is False
              and doc.get("isolated") == j(name), "(3) %s: exit 1 with the reason (%r)" % (name, doc.get("reasons")))
        keys = ("rel_l2_isolated", "cosine_isolated", "max_abs_isolated", "identical_isolated", "amplification",
                "isolated_inputs_converted")
        check(doc.get("tensors") and all(k not in x for x in doc["tensors"] for k in keys),
              "(3) %s: no isolated metric on any tensor" % name)
        check("\nisolation (" not in out and "rel_l2 iso" not in out
              and ("isolation: no table: %s is not a complete replay of the reference" % j(name)) in out
              and reason in out, "(3) %s: no isolation table in the terminal" % name)
        html = open(j("r.html")).read()
        data = json.loads(html.split('id="probe-data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))
        check(data.get("isolated_complete") is False and "D.isolated&&D.isolated_complete" in html,
              "(3) %s: the HTML report draws no isolation table" % name)

    # (4) bad input
    rc, doc, out, err = compare(j("ref.h5"), j("cand.h5"), "--isolated", j("cand.h5"))
    check(rc == 2 and len(err.strip().splitlines()) == 1 and "is the candidate file" in err,
          "(4) --isolated naming the candidate: exit 2, one line (%r)" % err)
    rc, doc, out, err = compare(j("ref.h5"), j("cand.h5"), "--isolated", j("nosuch.h5"))
    check(rc == 2 and err.strip() == "probe-compare: %s: No such file or directory" % j("nosuch.h5"),
          "(4) --isolated missing: exit 2, one line (%r)" % err)

    if FAILURES:
        print("\n%d check(s) failed" % len(FAILURES))
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
