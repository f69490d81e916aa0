"""Datasets whose elements HDF5 would read from outside the capture file
(docs/hardening.md, "Hardening table"): external storage (a FIFO with no
writer, /etc/passwd, a raw file next to the capture), a virtual dataset whose
source is another file (or a FIFO, or the file itself), a filter that is not built into libhdf5
(HDF5 would dlopen plugins from HDF5_PLUGIN_PATH). Every entry point that
opens captures refuses such a file before any element is read, with one line
naming the file, the dataset and the target:

    TOOL: FILE: /dit.step/0000/out: external storage (TARGET): refused, probe reads only data inside the capture file

probe-compare (either side), probe-calibrate, probe-oracle and probe-recover
exit 2; probe-run --replay/--inject runs the program (its output and status
its own) and the shim prints one "probe: inject: cannot open the reference
..." line, the capture's manifest records the injection as failed; the
library that the Python module loads (probe._lib) returns PROBE_EUNSUPPORTED
(6) with the same text. An external link is not refused: it is never
followed, so its path is simply not a tensor of the file.

A FIFO with no writer blocks whoever opens it for reading: each run finishing
within its timeout proves that no process opened it. A plugin folder holding
a shared object whose constructor writes a marker file proves that no plugin
was dlopened (a control run shows that libhdf5 loads it when asked for an
unknown filter)."""
import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
SRC = os.environ.get("PROBE_SOURCE_DIR", ".")
PY = os.environ.get("PROBE_PYTHON") or sys.executable
BIN = os.path.join(BUILD, "bin")
LIBPROBE = os.path.join(BUILD, "lib", "libprobe.so")
TOY = os.path.join(SRC, "scripts", "example", "toy_pipeline.py")
TOY_ARGS = ["--steps", "2", "--frames", "2", "--height", "32", "--width", "32"]
TIMEOUT = 30
INSIDE = "refused, probe reads only data inside the capture file"
PLUGIN = "refused, probe loads no filter plugins"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


tmp = tempfile.mkdtemp(prefix="probe-hostile-storage-")
j = lambda *p: os.path.join(tmp, *p)  # noqa: E731
marker = j("plugin-loaded")
plugdir = j("plugins")
os.makedirs(plugdir)
# every run gets the marker plugin folder: a dlopen of any plugin writes the marker
ENV = dict(os.environ, HDF5_PLUGIN_PATH=plugdir, PROBE_TEST_PLUGIN_MARKER=marker,
           PROBE_LIBPROBE=os.path.abspath(LIBPROBE))


def run(cmd, timeout=TIMEOUT, cwd=None):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, "", "timeout (hung)", time.time() - t0
    return p.returncode, p.stdout, p.stderr, time.time() - t0


# --- the plugin folder: a shared object that records being loaded ---------
src = j("marker.c")
with open(src, "w") as fh:
    fh.write(r'''
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void)
{
    const char *p = getenv("PROBE_TEST_PLUGIN_MARKER");
    int fd = p ? open(p, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
    if (fd >= 0) {
        if (write(fd, "loaded\n", 7) < 0) {}
        close(fd);
    }
}
''')
cc = subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(plugdir, "libmarker.so"), src],
                    capture_output=True, text=True)
check(cc.returncode == 0, "marker plugin built (%s)" % cc.stderr[-200:])

# --- the files -------------------------------------------------------------
rng = np.random.default_rng(11)
x = rng.standard_normal((64, 64)).astype(np.float32)
ref = j("ref.h5")
with h5py.File(ref, "w") as f:
    f["/dit.step/0000/out"] = x
    f["/vae.decode/0000/out"] = np.ones((2, 3), np.float32)
ref2 = j("ref2.h5")
shutil.copy(ref, ref2)
fifo = j("fifo")
os.mkfifo(fifo)
side = j("side.bin")
x.tofile(side)  # the reference's own bytes: read, they would pass
other = j("other.h5")
with h5py.File(other, "w") as f:
    f["/x"] = x


def hostile(name, make):
    p = j(name + ".h5")
    with h5py.File(p, "w") as f:
        f["/vae.decode/0000/out"] = np.ones((2, 3), np.float32)
        make(f)
    return p


def vds(source):
    def make(f):
        lay = h5py.VirtualLayout(shape=(64, 64), dtype="f4")
        lay[:] = h5py.VirtualSource(source, "/x", shape=(64, 64))
        f.create_virtual_dataset("/dit.step/0000/out", lay)
    return make


D = "/dit.step/0000/out"
NB = 64 * 64 * 4
cases = [  # (name, file, the expected text after "FILE: ")
    ("external storage to a FIFO",
     hostile("ext_fifo", lambda f: f.create_dataset(D, shape=(64, 64), dtype="f4", external=[(fifo, 0, NB)])),
     "%s: external storage (%s): %s" % (D, fifo, INSIDE)),
    ("external storage to /etc/passwd",
     hostile("ext_passwd", lambda f: f.create_dataset(D, shape=(4,), dtype="f4", external=[("/etc/passwd", 0, 16)])),
     "%s: external storage (/etc/passwd): %s" % (D, INSIDE)),
    ("external storage to a file next to the capture",
     hostile("ext_side", lambda f: f.create_dataset(D, shape=(64, 64), dtype="f4", external=[("side.bin", 0, NB)])),
     "%s: external storage (side.bin): %s" % (D, INSIDE)),
    ("virtual dataset whose source is another file",
     hostile("vds_other", vds(other)), "%s: virtual dataset source (%s:/x): %s" % (D, other, INSIDE)),
    ("virtual dataset whose source is a FIFO",
     hostile("vds_fifo", vds(fifo)), "%s: virtual dataset source (%s:/x): %s" % (D, fifo, INSIDE)),
    ("external storage whose file name holds a newline and an escape",
     hostile("ext_newline", lambda f: f.create_dataset(D, shape=(4,), dtype="f4",
                                                       external=[("a\nprobe: b\x1b[2J", 0, 16), ("c", 0, 16)])),
     "%s: external storage (a?probe: b?[2J, ...): %s" % (D, INSIDE)),
    ("virtual dataset whose source is the file itself ('.')",
     hostile("vds_self", lambda f: (f.create_dataset("/x", data=x), vds(".")(f))),
     "%s: virtual dataset source (.:/x): %s" % (D, INSIDE)),
    ("a filter that is not built into HDF5 (lzf, a plugin)",
     hostile("filter_lzf", lambda f: f.create_dataset(D, data=np.zeros((64, 64), np.float32), chunks=(32, 32),
                                                       compression="lzf")),
     "%s: filter 32000 (lzf) is not built into HDF5 (a plugin): %s" % (D, PLUGIN)),
]
with h5py.File(j("filter_lzf.h5"), "r") as f:  # the file holds the filter as written (id, compressed chunks)
    pl = f[D].id.get_create_plist()
    check(pl.get_nfilters() == 1 and pl.get_filter(0)[0] == 32000 and f[D].id.get_storage_size() < NB // 4,
          "the lzf file holds filter 32000 and compressed chunks")
# what the refused files would give if read: /etc/passwd's bytes as floats, the side file the reference
cwd = os.getcwd()
os.chdir(tmp)  # HDF5 resolves a relative external file name against the working directory
with h5py.File(j("ext_side.h5"), "r") as f:
    check(np.array_equal(f[D][()], x), "control: h5py reads the side file's bytes as the tensor (= the reference)")
with h5py.File(j("ext_passwd.h5"), "r") as f:
    check(f[D][()].tobytes() == open("/etc/passwd", "rb").read(16),
          "control: h5py reads /etc/passwd's first 16 bytes as 4 float32")
os.chdir(cwd)

# control: the same libhdf5 that libprobe links dlopens the marker plugin when asked for an unknown filter
ctl = subprocess.run([PY, "-c", "import ctypes,sys; L=ctypes.CDLL(sys.argv[1]); h=ctypes.CDLL(None);"
                      "h5=[l for l in open('/proc/self/maps').read().split() if 'libhdf5' in l][0];"
                      "H=ctypes.CDLL(h5); H.H5open(); print(H.H5Zfilter_avail(32004))", LIBPROBE],
                     capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
check(ctl.returncode == 0 and ctl.stdout.strip() == "0" and os.path.exists(marker),
      "control: libhdf5 asked for an unknown filter dlopens HDF5_PLUGIN_PATH's objects (marker written) %r"
      % (ctl.stderr[-300:],))
if os.path.exists(marker):
    os.unlink(marker)

# --- every entry point, every case -----------------------------------------
libcode = r'''
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
import probe._lib
lib = probe._lib.get()
op = lib.handle.probe_file_open
op.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
f = ctypes.c_void_p()
s = op(sys.argv[2].encode(), ctypes.byref(f))
print(json.dumps({"status": s, "error": lib.last_error(), "handle": bool(f.value)}))
'''
pymod = os.path.join(SRC, "components", "python")
for what, path, tail in cases:
    want = "%s: %s" % (path, tail)
    for tool, cmd in [
        ("probe-compare", [os.path.join(BIN, "probe-compare"), ref, path]),
        ("probe-compare", [os.path.join(BIN, "probe-compare"), path, ref, "--json", "-"]),
        ("probe-calibrate", [os.path.join(BIN, "probe-calibrate"), "--feature", "x", "--reference", ref,
                             "--reference-repeat", ref2, "--candidate", path, "--out", j("cal.json")]),
        ("probe-oracle", [os.path.join(BIN, "probe-oracle"), path]),
        ("probe-recover", [os.path.join(BIN, "probe-recover"), path, "-o", j("recovered.h5")]),
    ]:
        rc, out, err, dt = run(cmd)
        lines = err.splitlines()
        check(rc == 2 and lines == ["%s: %s" % (tool, want)] and out == "",
              "%s: %s exits 2 with one line (rc=%s, %.1fs, stderr=%r)" % (what, " ".join(
                  os.path.basename(c) for c in cmd[:3]), rc, dt, err[:400]))
    check(not os.path.exists(j("cal.json")) and not os.path.exists(j("recovered.h5")),
          "%s: probe-calibrate and probe-recover wrote nothing" % what)
    rc, out, err, dt = run([PY, "-c", libcode, pymod, path])
    res = json.loads(out) if rc == 0 and out.strip() else {}
    check(res == {"status": 6, "error": want, "handle": False},
          "%s: the Python module's libprobe: probe_file_open returns PROBE_EUNSUPPORTED with the line (%r %r)"
          % (what, res, err[-300:]))
    for opt in ("--replay", "--inject"):
        cap = j("cand.h5")
        if os.path.exists(cap):
            os.unlink(cap)
        rc, out, err, dt = run([os.path.join(BIN, "probe-run"), "--out", cap, opt, path, "--", PY, TOY] + TOY_ARGS,
                               timeout=120)
        plines = [l for l in err.splitlines() if l.startswith("probe:")]
        wline = ("probe: inject: cannot open the reference %s: %s; injection stopped for the rest of the run "
                 "(the capture file records the failure and probe-compare refuses it)" % (path, want))
        inj = {}
        if rc == 0 and os.path.exists(cap):
            with h5py.File(cap, "r") as f:
                m = f.attrs["probe.manifest"]
                inj = json.loads(m.decode() if isinstance(m, bytes) else m).get("inject", {})
        check(rc == 0 and "toy_pipeline: feature=none" in out and plines == [wline]
              and inj.get("status") == "failed" and inj.get("injected") == 0
              and inj.get("error") == "cannot open the reference %s: %s" % (path, want),
              "%s: probe-run %s: the program runs to its end, one probe: line, manifest 'failed' (rc=%s, %.1fs, %r)"
              % (what, opt, rc, dt, plines or err[-300:]))
    check(stat.S_ISFIFO(os.stat(fifo).st_mode), "%s: the FIFO is still a FIFO" % what)
check(not os.path.exists(marker), "no plugin was dlopened by any probe tool (marker absent)")

# probe-compare reads the injected candidate as refused ("injection failed")
rc, out, err, dt = run([os.path.join(BIN, "probe-run"), "--out", j("good.h5"), "--", PY, TOY] + TOY_ARGS, timeout=120)
rc, out, err, dt = run([os.path.join(BIN, "probe-compare"), j("good.h5"), j("cand.h5"), "--json", "-"])
doc = json.loads(out) if out.startswith("{") else {}
check(rc == 1 and any("injection failed" in r for r in doc.get("reasons", [])),
      "probe-compare refuses the candidate whose injection was refused (rc=%s %r)" % (rc, doc.get("reasons")))

# an external link (to the FIFO, to another file) is not refused: never followed, its path is no tensor
links = hostile("ext_link", lambda f: None)
with h5py.File(links, "a") as f:
    f[D] = h5py.ExternalLink(fifo, "/x")
    f["/dit.step/0001/out"] = h5py.ExternalLink(other, "/x")
rc, out, err, dt = run([os.path.join(BIN, "probe-compare"), ref, links, "--json", "-"])
doc = json.loads(out) if out.startswith("{") else {}
check(rc == 1 and doc.get("missing_in_candidate") == [D] and [t["path"] for t in doc.get("tensors", [])]
      == ["/vae.decode/0000/out"], "external links: not followed, %s missing in the candidate (rc=%s, %.1fs, %r)"
      % (D, rc, dt, err[-200:]))
rc, out, err, dt = run([os.path.join(BIN, "probe-run"), "--out", j("cand_link.h5"), "--replay", links, "--", PY, TOY]
                       + TOY_ARGS, timeout=120)
check(rc == 0 and "toy_pipeline: feature=none" in out, "external links: probe-run --replay runs (rc=%s, %.1fs)"
      % (rc, dt))

if failures:
    print("%d checks failed (files kept in %s)" % (len(failures), tmp))
    sys.exit(1)
shutil.rmtree(tmp)
print("all checks passed")
