#!/usr/bin/env python3
"""The kill experiment of docs/evidence/2026-11-30-crash.md (not a test).

    bench/crash_kill.py BUILD_DIR [KILLS] [LIBDIR]

Runs BUILD_DIR/tests/crash_loop write (float32 tensors of 1..2^20 random
elements, put in a loop) and SIGKILLs it after a random 0..300 ms, KILLS
times (default 200); then `crash_loop check` on each file. With LIBDIR, both
run against LIBDIR/libprobe.so (LD_LIBRARY_PATH; the tool has a RUNPATH),
e.g. the lib/ of a build of an older commit whose writer has no journal.
Prints how many files were readable, unreadable (with the first error
texts), empty/absent (killed before the first flush), and the tensor counts.
"""
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

build = sys.argv[1]
kills = int(sys.argv[2]) if len(sys.argv) > 2 else 200
env = dict(os.environ)
if len(sys.argv) > 3:
    env["LD_LIBRARY_PATH"] = sys.argv[3]
tool = os.path.join(build, "tests", "crash_loop")
rng = random.Random(int(os.environ.get("SEED", "1")))
counts = collections.Counter()
errors = collections.Counter()
tensors = []
t0 = time.monotonic()
with tempfile.TemporaryDirectory(prefix="probe-crash-kill-") as d:
    for k in range(kills):
        out = os.path.join(d, "k.h5")
        for f in (out, out + ".journal"):
            if os.path.exists(f):
                os.unlink(f)
        p = subprocess.Popen([tool, "write", out, str(rng.getrandbits(63))], env=env)
        time.sleep(rng.uniform(0, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not os.path.exists(out) or os.path.getsize(out) == 0:
            counts["absent or empty"] += 1
            continue
        c = subprocess.run([tool, "check", out], env=env, capture_output=True, text=True)
        if c.returncode == 0:
            counts["readable"] += 1
            tensors.append(int(c.stdout.split()[1]))
        else:
            counts["unreadable"] += 1
            msg = (c.stdout + c.stderr).strip()
            errors[msg.split("(", 1)[-1][:70] if "(" in msg else msg[:70]] += 1
print("%d kills in %.0f s: %s" % (kills, time.monotonic() - t0, dict(counts)))
if tensors:
    print("tensors per readable file: min %d, median %d, max %d" % (min(tensors), sorted(tensors)[len(tensors) // 2], max(tensors)))
for e, n in errors.most_common(8):
    print("  %3d x %s" % (n, e))
