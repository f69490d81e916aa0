#!/usr/bin/env python3
"""End-to-end: adapter scopes (probe_scope_enter_v1/exit_v1, probe-run --scope).

A torch model whose forward calls three blocks runs twice under probe-run
with `--tap dit.step=ScopeModel.forward --scope blk=ScopeBlock.forward`.
Requires: the manifest's "scopes" counts exactly the component calls the
script itself counted (dit.step 2, blk 6), no tensor of the scope-only
component is captured while dit.step's are, the program's stdout equals a
run without probe, and a malformed --scope is refused before the command
runs (exit 2, one line). Which library calls land in which scope is tested
with the interposed calls (test_gemm*, test_kernels*, test_nccl*).
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import h5py

BUILD = os.environ.get("PROBE_BUILD_DIR")
PYTHON = os.environ.get("PROBE_PYTHON", sys.executable)

SCRIPT = textwrap.dedent('''
    import torch

    calls = {"model": 0, "block": 0}

    class ScopeBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            calls["block"] += 1
            return torch.relu(self.lin(x))

    class ScopeModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([ScopeBlock() for _ in range(3)])

        def forward(self, hidden_states):
            calls["model"] += 1
            for b in self.blocks:
                hidden_states = b(hidden_states)
            return hidden_states

    torch.manual_seed(0)
    m = ScopeModel()
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(2):
            x = m(x)
    print("out", [round(v, 6) for v in x.flatten().tolist()])
    print("calls", calls["model"], calls["block"])
''')

failures = 0


def check(ok, what):
    global failures
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        failures += 1
    return ok


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR not set")
        return 2
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP: torch not importable by %s" % PYTHON)
        return 77
    d = tempfile.mkdtemp(prefix="probe-scopes-")
    script = os.path.join(d, "scoped.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    plain = subprocess.run([PYTHON, script], capture_output=True, text=True)
    check(plain.returncode == 0, "the script runs without probe (%s)" % plain.stderr[-200:])
    run = os.path.join(BUILD, "bin", "probe-run")
    out = os.path.join(d, "cap.h5")
    r = subprocess.run([run, "--out", out, "--tap", "dit.step=ScopeModel.forward",
                        "--scope", "blk=ScopeBlock.forward", "--", PYTHON, script],
                       capture_output=True, text=True)
    check(r.returncode == 0, "probe-run exits 0 (%s)" % r.stderr[-300:])
    check(r.stdout == plain.stdout, "stdout identical to the run without probe")
    check("calls 2 6" in r.stdout, "the script counted 2 model and 6 block calls")
    with h5py.File(out, "r") as f:
        m = json.loads(f.attrs["probe.manifest"])
        check(m.get("scopes") == {"dit.step": 2, "blk": 6},
              "manifest scopes == {'dit.step': 2, 'blk': 6}: %r" % m.get("scopes"))
        names = []
        f.visit(names.append)
        check("blk" not in f and any(n.startswith("dit.step/0001/") for n in names),
              "dit.step tensors captured, none of the scope-only blk: %r" % sorted(names)[:6])

    check("matched no method" not in r.stderr, "patterns that matched say nothing at exit")

    # a --scope / --tap naming a class the program does not have: one line each at exit
    out3 = os.path.join(d, "typo.h5")
    r = subprocess.run([run, "--out", out3, "--tap", "dit.step=ScopeModel.forward",
                        "--scope", "blk=ScopeBlok.forward", "--tap", "vae.decode=NoVae.decode",
                        "--", PYTHON, script], capture_output=True, text=True)
    lines = [l for l in r.stderr.splitlines() if l.startswith("probe: ")]
    scope_l = [l for l in lines if "--scope blk=ScopeBlok.forward matched no method" in l]
    check(r.returncode == 0 and r.stdout == plain.stdout and len(lines) == 2
          and len(scope_l) == 1 and "'ScopeBlok'" in scope_l[0]
          and any("--tap vae.decode=NoVae.decode matched no method" in l for l in lines),
          "unmatched --scope and --tap: the run is unchanged, one probe: line each (%r)" % lines)

    for bad, why in (("blk", "expected NAME=PATTERN"), ("a/b=ScopeBlock.forward", "not a valid"),
                     ("blk=ScopeBlock", "malformed pattern")):
        out2 = os.path.join(d, "bad.h5")
        r = subprocess.run([run, "--out", out2, "--scope", bad, "--", PYTHON, "-c",
                            "open(%r, 'w').write('ran')" % os.path.join(d, "ran")],
                           capture_output=True, text=True)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        check(r.returncode == 2 and len(lines) == 1 and why in lines[0]
              and not os.path.exists(os.path.join(d, "ran")),
              "--scope %r refused before the command runs: %r" % (bad, lines))
    print("%d failure(s)" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
