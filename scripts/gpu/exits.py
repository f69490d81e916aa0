#!/usr/bin/env python3
"""Abnormal exits with device tensors (docs/intercept.md "Abnormal exits"), on a GPU.

Usage: exits.py BUILD_DIR WORK_DIR [STEPS]

A small CUDA pipeline (a *Denoiser* module and a *Scheduler*, classes the
component table matches) runs STEPS denoising steps on [4, 64, 64, 64]
float32 latents (4 MiB per tensor, 4 tensors per step) and then ends by
os._exit(7), os.abort(), a self-SIGTERM or a normal exit, under probe-run.
Before ending it writes the SHA-256 of every tensor it handed to a tapped
call (copied to the host after a synchronize), so the check does not depend
on probe. Asserted per ending: the exit status (or signal) probe-run returns
is the program's, the capture holds exactly those paths, and each dataset's
bytes hash to the program's value. Prints one PASS/FAIL line per ending.
"""
import hashlib
import json
import os
import signal
import subprocess
import sys

PROGRAM = r'''
import hashlib, json, os, signal, sys
import torch

how, steps, book = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
dev = "cuda"


class ExitDenoiser(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64, device=dev) / 8)

    def forward(self, hidden_states, timestep):
        return torch.tanh(hidden_states @ self.w) * (1 + timestep)


class ExitScheduler:
    def step(self, model_output, timestep, sample):
        return sample - 0.05 * model_output


den, sch = ExitDenoiser(), ExitScheduler()
seen = []
x = torch.randn(4, 64, 64, 64, device=dev)
with torch.no_grad():
    for i in range(steps):
        t = float(i) / steps
        v = den(x, t)
        seen.append(("/dit.step/%04d/in.hidden_states" % i, x))
        seen.append(("/dit.step/%04d/out" % i, v))
        x_new = sch.step(v, t, x)
        seen.append(("/scheduler.step/%04d/in.model_output" % i, v))
        seen.append(("/scheduler.step/%04d/in.sample" % i, x))
        seen.append(("/scheduler.step/%04d/out" % i, x_new))
        x = x_new
torch.cuda.synchronize()
with open(book, "w") as f:
    json.dump({p: hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
               for p, t in seen}, f)
sys.stdout.flush()
if how == "_exit":
    os._exit(7)
if how == "abort":
    os.abort()
if how == "term":
    os.kill(os.getpid(), signal.SIGTERM)
'''


def main():
    build, work = sys.argv[1], sys.argv[2]
    steps = sys.argv[3] if len(sys.argv) > 3 else "60"
    os.makedirs(work, exist_ok=True)
    prog = os.path.join(work, "exit_prog.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    import h5py
    bad = 0
    for how, want in (("normal", 0), ("_exit", 7), ("abort", -signal.SIGABRT), ("term", -signal.SIGTERM)):
        out, book = os.path.join(work, how + ".h5"), os.path.join(work, how + ".json")
        p = subprocess.run([os.path.join(build, "bin", "probe-run"), "--force", "--out", out, "--",
                            sys.executable, prog, how, steps, book],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        exp = json.load(open(book))
        got = {}
        try:
            with h5py.File(out, "r") as f:
                f.visititems(lambda n, o: got.__setitem__("/" + n, hashlib.sha256(
                    o[()].tobytes()).hexdigest()) if isinstance(o, h5py.Dataset) else None)
        except OSError as e:
            print("  %s: cannot read %s: %s" % (how, out, e))
        tapped = {k: v for k, v in got.items() if k.startswith(("/dit.step/", "/scheduler.step/"))}
        same = sum(1 for k, v in exp.items() if tapped.get(k) == v)
        ok = p.returncode == want and same == len(exp) and set(tapped) == set(exp)
        bad += not ok
        print("%s %-6s status %d (program's %d); %d of %d tensors in the file, %d bit-identical to "
              "the program's copies; journal left: %s; probe lines: %r"
              % ("PASS" if ok else "FAIL", how, p.returncode, want, len(tapped), len(exp), same,
                 os.path.exists(out + ".journal"),
                 [l for l in p.stderr.splitlines() if l.startswith("probe")][:3]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
