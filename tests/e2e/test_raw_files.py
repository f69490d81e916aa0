"""The raw files layout (docs/file-format.md "Raw files"): a tensor whose
bytes are in <capture>.raw/NN, listed as HDF5 external storage named
"<folder>.raw/NN" relative to the capture's folder.

Checked against libhdf5 itself (h5py) and numpy, not against probe:
- a capture written by probe's writer with raw files (a C program built here
  against libprobe) reads back in h5py, through libhdf5's own external
  storage with HDF5_EXTFILE_PREFIX='${ORIGIN}', equal to the values numpy
  computes from the same formula; probe-compare of it against the same
  tensors written inside a file (h5py) is exact, from any working directory;
- a file that h5py writes in the same form (external storage
  "ref.h5.raw/00", "ref.h5.raw/01") is read by probe equal to numpy's array;
- hostile forms exit 2 with one line, without hanging: a name outside the
  form (absolute, "../", lane 99, two folders), a raw file that is a
  symbolic link (to /etc/passwd), a FIFO, a short file, a missing folder,
  and a folder that is a symbolic link."""
import os
import shutil
import subprocess
import sys
import tempfile

import json

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
SRC = os.environ.get("PROBE_SOURCE_DIR", ".")
BUILD = os.path.abspath(BUILD)
SRC = os.path.abspath(SRC)
BIN = os.path.join(BUILD, "bin")
TIMEOUT = 30
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


tmp = tempfile.mkdtemp(prefix="probe-raw-files-")
j = lambda *p: os.path.join(tmp, *p)  # noqa: E731


def run(cmd, cwd=None, env=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd,
                           env=env or os.environ)
    except subprocess.TimeoutExpired:
        return None, "", "timeout (hung)"
    return p.returncode, p.stdout, p.stderr


# --- a capture written by probe's writer with 3 raw files -----------------
N = 3 * 1000 * 1000 + 17  # float32: 12,000,068 bytes, two 4 MiB pieces and a shorter one
prog = j("raw_capture.c")
with open(prog, "w") as fh:
    fh.write(r'''
#include <stdio.h>
#include <stdlib.h>
#include "probe/capture.h"
int main(int argc, char **argv)
{
    size_t n = (size_t)strtoull(argv[2], NULL, 10);
    float *x = malloc(n * sizeof *x);
    for (size_t k = 0; k < n; k++)
        x[k] = (float)(k % 1009) * 0.25f - 100.0f;
    int64_t shape[1] = {(int64_t)n};
    probe_record r = {.path = "/dit.step/0000/out", .component = "dit", .slot = "out", .call = 0,
                      .step = 0, .cfg_branch = -1, .timestep = 0.0, .block = -1,
                      .dtype = PROBE_DTYPE_FLOAT32, .rank = 1, .shape = shape};
    probe_writer *w;
    probe_put *p;
    size_t nb = n * sizeof *x, part = 3u << 20;
    if (probe_writer_open(argv[1], "{}", &w) || probe_writer_set_raw_files(w, 3) ||
        probe_writer_put_begin(w, &r, nb, &p))
        goto fail;
    for (size_t at = 0; at < nb; at += part)
        if (probe_writer_put_part(p, (char *)x + at, nb - at < part ? nb - at : part))
            goto fail;
    if (probe_writer_put_end(p) || probe_writer_close(w))
        goto fail;
    return 0;
fail:
    fprintf(stderr, "raw_capture: %s\n", probe_last_error());
    return 1;
}
''')
exe = j("raw_capture")
# under the sanitizer build (libasan preloaded) the program is built with the same sanitizers: a
# plain one, its libprobe sanitized, hangs at exit in a library destructor (libp11-kit's freelocale)
san = ["-fsanitize=address,undefined"] if "libasan" in os.environ.get("LD_PRELOAD", "") else []
cc = subprocess.run(["cc"] + san + ["-std=c11", "-D_GNU_SOURCE", "-I", os.path.join(SRC, "include"), "-o", exe,
                     prog, "-L", os.path.join(BUILD, "lib"), "-lprobe",
                     "-Wl,-rpath," + os.path.abspath(os.path.join(BUILD, "lib"))],
                    capture_output=True, text=True)
check(cc.returncode == 0, "raw_capture built (%s)" % cc.stderr[-300:])
want = (np.arange(N, dtype=np.int64) % 1009).astype(np.float32) * np.float32(0.25) - np.float32(100.0)
cap = j("cap.h5")
rc, out, err = run([exe, cap, str(N)])
check(rc == 0, "probe's writer wrote a capture with 3 raw files (rc=%s %s)" % (rc, err[-300:]))
check(sorted(os.listdir(cap + ".raw")) == ["00", "01", "02"], "cap.h5.raw holds 00 01 02: %s"
      % sorted(os.listdir(cap + ".raw")))
check(sum(os.path.getsize(os.path.join(cap + ".raw", n)) for n in os.listdir(cap + ".raw")) == 4 * N,
      "the raw files hold the tensor's 4N bytes")
check(os.path.getsize(cap) < 4 * N // 10, "the capture file itself is small (%d bytes)" % os.path.getsize(cap))

code = ("import h5py, numpy, sys\n"
        "with h5py.File(sys.argv[1], 'r') as f:\n"
        "    d = f['/dit.step/0000/out']\n"
        "    print(d.id.get_create_plist().get_external_count())\n"
        "    numpy.save(sys.argv[2], d[()])\n")
env = dict(os.environ, HDF5_EXTFILE_PREFIX="${ORIGIN}")
rc, out, err = run([sys.executable, "-c", code, cap, j("h5py.npy")], cwd="/", env=env)
got = np.load(j("h5py.npy")) if rc == 0 else None
check(rc == 0 and out.split() == ["3"] and np.array_equal(got, want),
      "h5py (libhdf5's external storage, HDF5_EXTFILE_PREFIX=${ORIGIN}, cwd /) reads the 3 pieces equal to "
      "numpy's values (rc=%s out=%r %s)" % (rc, out, err[-300:]))

inside = j("inside.h5")
with h5py.File(inside, "w") as f:
    f["/dit.step/0000/out"] = want
for cwd in (tmp, "/"):
    rc, out, err = run([os.path.join(BIN, "probe-compare"), "--expect-identical", "--json", j("cmp.json"), cap, inside], cwd=cwd)
    check(rc == 0, "probe-compare --expect-identical cap.h5 (raw files) inside.h5 exits 0 from cwd %s (rc=%s %s)" % (cwd, rc, err[-300:]))
    try:
        doc = json.load(open(j("cmp.json")))
        rows = [t for t in doc.get("tensors", []) if t.get("path") == "/dit.step/0000/out"]
        exact = bool(rows) and rows[0]["rel_l2"] == 0 and rows[0]["max_abs"] == 0
    except Exception:
        exact = False
    check(bool(exact), "  and the tensor's relative L2 is exactly 0 (cwd %s)" % cwd)

# --- a file h5py writes in probe's form -----------------------------------
x = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
NB = x.nbytes
D = "/dit.step/0000/out"


def ext_file(name, ext, data=x):
    p = j(name + ".h5")
    os.makedirs(j(name + ".h5.raw"), exist_ok=True)
    cwd = os.getcwd()
    os.chdir(tmp)  # h5py writes the external files relative to the working directory
    with h5py.File(p, "w") as f:
        f.create_dataset(D, shape=data.shape, dtype=data.dtype, external=ext)
        f[D][...] = data
    os.chdir(cwd)
    return p


h = NB // 2
good = ext_file("good", [("good.h5.raw/00", 0, h), ("good.h5.raw/01", 0, NB - h)])
plain = j("plain.h5")
with h5py.File(plain, "w") as f:
    f[D] = x
rc, out, err = run([os.path.join(BIN, "probe-compare"), "--expect-identical", "--json", j("cmp2.json"), good, plain], cwd="/")
try:
    doc = json.load(open(j("cmp2.json")))
    row = [t for t in doc["tensors"] if t["path"] == D][0]
    exact = row["rel_l2"] == 0 and row["max_abs"] == 0
except Exception:
    exact = False
check(rc == 0 and exact, "probe reads h5py's raw-file tensor equal to the array inside plain.h5 (rc=%s %s)"
      % (rc, err[-300:]))

INSIDE = "refused, probe reads only data inside the capture file"


def refused(path, text, what):
    rc, out, err = run([os.path.join(BIN, "probe-compare"), path, plain], cwd=tmp)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    check(rc == 2 and any(text in ln for ln in lines),
          "%s: exit 2 with '%s' (rc=%s, %r)" % (what, text, rc, err[-300:]))


# names outside the form: refused at open, as any external storage
for name, ext, what in [
    ("abs", [(j("abs.h5.raw/00"), 0, NB)], "an absolute name"),
    ("up", [("../up.h5.raw/00", 0, NB)], "a name with ../"),
    ("lane99", [("lane99.h5.raw/99", 0, NB)], "lane 99"),
    ("two", [("two.h5.raw/00", 0, h), ("other.raw/01", 0, NB - h)], "two folders"),
    ("noraw", [("noraw.h5.bin/00", 0, NB)], "a folder not named .raw"),
]:
    p = j(name + ".h5")
    with h5py.File(p, "w") as f:
        f.create_dataset(D, shape=x.shape, dtype=x.dtype, external=ext)
    refused(p, "external storage (", what)

# probe's form, damaged raw files: one line naming the file, no hang
p = ext_file("link", [("link.h5.raw/00", 0, NB)])
os.unlink(j("link.h5.raw", "00"))
os.symlink("/etc/passwd", j("link.h5.raw", "00"))
refused(p, "a symbolic link", "a raw file that is a symbolic link to /etc/passwd")
p = ext_file("fifo", [("fifo.h5.raw/00", 0, NB)])
os.unlink(j("fifo.h5.raw", "00"))
os.mkfifo(j("fifo.h5.raw", "00"))
refused(p, "not a regular file", "a raw file that is a FIFO")
check(os.path.exists(j("fifo.h5.raw", "00")), "  the FIFO is still there, nobody blocked on it")
p = ext_file("short", [("short.h5.raw/00", 0, NB)])
os.truncate(j("short.h5.raw", "00"), NB // 3)
refused(p, "truncated", "a raw file cut short")
p = ext_file("gone", [("gone.h5.raw/00", 0, NB)])
shutil.rmtree(j("gone.h5.raw"))
refused(p, "raw files folder gone.h5.raw", "a missing raw files folder")
p = ext_file("dirlink", [("dirlink.h5.raw/00", 0, NB)])
os.rename(j("dirlink.h5.raw"), j("elsewhere"))
os.symlink(j("elsewhere"), j("dirlink.h5.raw"))
refused(p, "symbolic link or not a folder", "a raw files folder that is a symbolic link")

shutil.rmtree(tmp)
print("test_raw_files: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
