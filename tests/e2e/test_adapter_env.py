#!/usr/bin/env python3
"""End-to-end: the Python adapter lives peacefully in the user's interpreter.

Each case runs a small program once without probe-run and once under it and
compares what the user sees:
  * chaining: a sitecustomize.py in another PYTHONPATH directory still runs
    (and the adapter is active too); without one, the interpreter's own
    sitecustomize (Debian's, or none) is the one that ends up imported;
  * `import h5py` still writes and reads a file under probe-run;
  * a program with no matching classes: unchanged stdout, its stderr plus
    exactly one `probe:` line saying nothing matched, a capture file with
    zero tensors;
  * PROBE_TAPS with an invalid component name: one `probe:` line naming it,
    the valid line, a component name not in the table, still taps (a new
    component);
  * an unreadable PROBE_COMPONENTS: one `probe:` line naming the path, the
    program runs unchanged (its own exit status 3 passes through);
  * an exception raised inside a tapped method reaches the caller unchanged;
  * a Python child process (subprocess) is not captured into the parent's
    file and runs normally.
"""

import os
import re
import subprocess
import sys
import tempfile
import textwrap

import h5py

BUILD = os.environ.get("PROBE_BUILD_DIR")
PYTHON = os.environ.get("PROBE_PYTHON", sys.executable)
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def tensors_in(path):
    names = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "biuf":
            names.append("/" + name)
    with h5py.File(path, "r") as h5:
        h5.visititems(visit)
    return sorted(names)


def run(args, cwd, env, probe=None):
    """Run args; with probe = (run, out, extra options) under probe-run."""
    if probe is not None:
        args = [probe[0], "--out", probe[1]] + list(probe[2]) + ["--"] + list(args)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)


def probe_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("probe:")]


def main():
    if not BUILD:
        print("PROBE_BUILD_DIR is not set", file=sys.stderr)
        return 1
    probe_run = os.path.join(BUILD, "bin", "probe-run")
    with tempfile.TemporaryDirectory(prefix="probe-adapter-env-") as work:
        base_env = dict(os.environ)
        base_env.pop("PYTHONPATH", None)
        base_env["PYTHONDONTWRITEBYTECODE"] = "1"

        def write(name, text):
            p = os.path.join(work, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(textwrap.dedent(text))
            return p

        # --- 1. chaining to a sitecustomize in another PYTHONPATH dir --------
        write("other/sitecustomize.py", """
            import sys
            MARK = "other sitecustomize ran"
            sys.stdout.write("chained: other sitecustomize executed\\n")
        """)
        write("chain_prog.py", """
            import sitecustomize
            import torch
            class DemoTextEncoder(torch.nn.Module):
                def forward(self, x):
                    return x + 1
            print(sitecustomize.MARK)
            print(DemoTextEncoder()(torch.ones(2)).tolist())
        """)
        env = dict(base_env, PYTHONPATH=os.path.join(work, "other"))
        plain = run([PYTHON, "chain_prog.py"], work, env)
        out = os.path.join(work, "chain.h5")
        probed = run([PYTHON, "chain_prog.py"], work, env, (probe_run, out, []))
        check(plain.returncode == 0, "chain: plain run failed: %s" % plain.stderr)
        check(probed.returncode == 0, "chain: probe-run run failed: %s" % probed.stderr)
        check(probed.stdout == plain.stdout,
              "chain: stdout differs: %r vs %r" % (probed.stdout, plain.stdout))
        check("other sitecustomize ran" in probed.stdout, "chain: other sitecustomize did not run")
        if os.path.exists(out):
            check(tensors_in(out) == ["/text_encoder/0000/in.x", "/text_encoder/0000/out"],
                  "chain: adapter not active next to the chained sitecustomize: %s" % tensors_in(out))
        else:
            check(False, "chain: no capture file")

        # --- 2. the interpreter's own sitecustomize (Debian's) is chained -----
        write("which_site.py", """
            import os
            try:
                import sitecustomize
                f = getattr(sitecustomize, "__file__", None)
                print(os.path.realpath(f) if f else "no file")
            except ImportError:
                print("none")
        """)
        plain = run([PYTHON, "which_site.py"], work, base_env)
        probed = run([PYTHON, "which_site.py"], work, base_env,
                     (probe_run, os.path.join(work, "site.h5"), []))
        check(probed.returncode == 0 and probed.stdout == plain.stdout,
              "system sitecustomize: %r under probe-run vs %r plain (%s)"
              % (probed.stdout, plain.stdout, probed.stderr))

        # --- 3. h5py works under probe-run -----------------------------------
        write("h5_prog.py", """
            import h5py, numpy as np, sys
            p = sys.argv[1]
            with h5py.File(p, "w") as f:
                f["x"] = np.arange(5, dtype=np.float32) * 1.5
                f["x"].attrs["a"] = 7
            with h5py.File(p, "r") as f:
                print(f["x"][()].tolist(), int(f["x"].attrs["a"]))
        """)
        probed = run([PYTHON, "h5_prog.py", os.path.join(work, "user.h5")], work, base_env,
                     (probe_run, os.path.join(work, "h5.h5"), []))
        check(probed.returncode == 0 and probed.stdout == "[0.0, 1.5, 3.0, 4.5, 6.0] 7\n",
              "h5py under probe-run: rc %d stdout %r stderr %r"
              % (probed.returncode, probed.stdout, probed.stderr))

        # --- 4. no matching classes: zero tensors, same output ----------------
        write("nomatch_prog.py", """
            import torch
            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.l = torch.nn.Linear(3, 2)
                def forward(self, x):
                    return self.l(x)
            torch.manual_seed(0)
            y = Net()(torch.randn(4, 3))
            print("%.9e" % y.double().sum().item())
        """)
        plain = run([PYTHON, "nomatch_prog.py"], work, base_env)
        out = os.path.join(work, "nomatch.h5")
        probed = run([PYTHON, "nomatch_prog.py"], work, base_env, (probe_run, out, []))
        # stderr: the program's own, then the one line naming the empty match
        nomatch_line = re.compile(
            r"probe: pid \d+ imported torch but no class matched the component table \(.*components\.json\): "
            r"nothing of this process was captured; name the classes with --tap COMPONENT=Class\.method\n$")
        tail = probed.stderr[len(plain.stderr):]
        check(probed.returncode == 0 and probed.stdout == plain.stdout
              and probed.stderr.startswith(plain.stderr) and nomatch_line.match(tail) is not None,
              "no-match: output changed, or not exactly one line naming the empty match: %r/%r vs %r/%r"
              % (probed.stdout, probed.stderr, plain.stdout, plain.stderr))
        check(os.path.exists(out) and tensors_in(out) == [],
              "no-match: capture file missing or not empty: %s"
              % (tensors_in(out) if os.path.exists(out) else "no file"))

        # --- 5. PROBE_TAPS with an invalid and a new component name ------------
        write("taps_prog.py", """
            import torch
            class Widget:
                def go(self, x):
                    return x * 2
            print(Widget().go(torch.arange(3.0)).tolist())
        """)
        out = os.path.join(work, "taps.h5")
        probed = run(["env", "PROBE_TAPS=bo/gus=Widget.go\nwidget.go=Widget.go",
                      PYTHON, "taps_prog.py"], work, base_env, (probe_run, out, []))
        notes = probe_lines(probed.stderr)
        check(probed.returncode == 0 and probed.stdout == "[0.0, 2.0, 4.0]\n",
              "PROBE_TAPS: program changed: rc %d %r" % (probed.returncode, probed.stdout))
        check(len(notes) == 1 and "'bo/gus'" in notes[0] and "contains '/'" in notes[0]
              and "ignored" in notes[0],
              "PROBE_TAPS: expected one probe: line naming 'bo/gus' and why, got %r" % notes)
        check(os.path.exists(out) and tensors_in(out) == ["/widget.go/0000/in.x", "/widget.go/0000/out"],
              "PROBE_TAPS: the tap of a new component did not capture: %s"
              % (tensors_in(out) if os.path.exists(out) else "no file"))

        # --- 6. unreadable component table -----------------------------------
        write("exit3_prog.py", """
            import sys, torch
            class DemoTextEncoder(torch.nn.Module):
                def forward(self, x):
                    return x
            print(DemoTextEncoder()(torch.ones(1)).tolist())
            sys.exit(3)
        """)
        bad = os.path.join(work, "no-such-table.json")
        out = os.path.join(work, "badtable.h5")
        probed = run(["env", "PROBE_COMPONENTS=" + bad, PYTHON, "exit3_prog.py"], work, base_env,
                     (probe_run, out, []))
        notes = probe_lines(probed.stderr)
        check(probed.returncode == 3 and probed.stdout == "[1.0]\n",
              "bad table: program changed: rc %d %r" % (probed.returncode, probed.stdout))
        check(len(notes) == 1 and bad in notes[0],
              "bad table: expected one probe: line naming %s, got %r" % (bad, notes))
        check(not os.path.exists(out) or tensors_in(out) == [],
              "bad table: tensors captured without a table")

        # --- 7. an exception inside a tapped method passes through -------------
        write("raise_prog.py", """
            import torch
            class DemoVAE(torch.nn.Module):
                def decode(self, z):
                    raise ValueError("bad latent shape %s" % (tuple(z.shape),))
            try:
                DemoVAE().decode(torch.zeros(1, 2))
            except ValueError as e:
                print("caught:", e)
            DemoVAE().decode(torch.zeros(3))
        """)
        plain = run([PYTHON, "raise_prog.py"], work, base_env)
        probed = run([PYTHON, "raise_prog.py"], work, base_env,
                     (probe_run, os.path.join(work, "raise.h5"), []))
        check(plain.returncode == 1 and probed.returncode == 1,
              "exception: exit status %d vs %d plain" % (probed.returncode, plain.returncode))
        check(probed.stdout == plain.stdout == "caught: bad latent shape (1, 2)\n",
              "exception: stdout %r vs %r" % (probed.stdout, plain.stdout))
        check(probed.stderr.strip().splitlines()[-1:] == plain.stderr.strip().splitlines()[-1:],
              "exception: last stderr line differs: %r vs %r"
              % (probed.stderr.strip().splitlines()[-1:], plain.stderr.strip().splitlines()[-1:]))

        # --- 8. a Python child process is not captured into the parent's file --
        write("child_prog.py", """
            import subprocess, sys, torch
            class DemoTextEncoder(torch.nn.Module):
                def forward(self, x):
                    return x * 3
            print("parent", DemoTextEncoder()(torch.ones(2)).tolist(), flush=True)
            code = ("import torch\\n"
                    "class DemoTextEncoder(torch.nn.Module):\\n"
                    "    def forward(self, x):\\n"
                    "        return x * 5\\n"
                    "print('child', DemoTextEncoder()(torch.ones(2)).tolist())\\n")
            r = subprocess.run([sys.executable, "-c", code])
            sys.exit(r.returncode)
        """)
        out = os.path.join(work, "child.h5")
        probed = run([PYTHON, "child_prog.py"], work, base_env, (probe_run, out, []))
        check(probed.returncode == 0 and probed.stdout == "parent [3.0, 3.0]\nchild [5.0, 5.0]\n",
              "child: rc %d stdout %r stderr %r" % (probed.returncode, probed.stdout, probed.stderr))
        notes = probe_lines(probed.stderr)
        check(len(notes) == 1 and "does not capture: the capture file" in notes[0]
              and "being written by another process" in notes[0], "child: one probe: note %r" % notes)
        check(os.path.exists(out) and tensors_in(out) == ["/text_encoder/0000/in.x", "/text_encoder/0000/out"],
              "child: expected only the parent's call in the file, got %s"
              % (tensors_in(out) if os.path.exists(out) else "no file"))

    if failures:
        for f in failures:
            print("FAIL: " + f, file=sys.stderr)
        return 1
    print("test_adapter_env: 8 cases passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
