"""The user's own h5py keeps working under the preloaded shim (docs/intercept.md:
a preloaded libhdf5 breaks `import h5py`; the shim links no HDF5 and
dlopens libprobe RTLD_LOCAL). A Python process imports h5py, writes and
reads its own files before and after tapping numpy arrays through ctypes
(a transposed float64 view and a bool array), and leaves one h5py file
open at exit for HDF5's own exit handling to close; then the capture and
the user's files are checked.
"""
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import check, finish, need_build, preload_env, probe_lines, run, tmpdir  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402

SCRIPT = textwrap.dedent(r'''
    import ctypes, sys
    import h5py, numpy as np

    class T(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("abi_version", ctypes.c_uint32),
                    ("component", ctypes.c_char_p), ("slot", ctypes.c_char_p),
                    ("call", ctypes.c_int64), ("step", ctypes.c_int64),
                    ("cfg_branch", ctypes.c_int32), ("device", ctypes.c_int32),
                    ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                    ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                    ("data", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("timestep", ctypes.c_double)]

    lib = ctypes.CDLL(None)
    lib.probe_tap_v1.argtypes = [ctypes.POINTER(T)]

    def tap(component, call, arr, dtype_code):
        shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
        strides = (ctypes.c_int64 * max(arr.ndim, 1))(*[s // arr.itemsize for s in arr.strides])
        t = T(ctypes.sizeof(T), 1, component.encode(), b"out", call, -1, -1, -1, dtype_code, arr.ndim,
              shape, strides, arr.ctypes.data, None, float("nan"))
        return lib.probe_tap_v1(ctypes.byref(t))

    before, after, left_open = sys.argv[1:4]
    with h5py.File(before, "w") as f:
        f["a"] = np.arange(10, dtype=np.int32)
    base = np.arange(12, dtype=np.float64).reshape(3, 4) * 1.5
    rc1 = tap("py", 0, base.T, 13)          # transposed float64 view
    rc2 = tap("py", 1, np.array([True, False, True]), 1)
    with h5py.File(after, "w") as f:
        f["b"] = np.ones(5)
        f.attrs["note"] = "written after probe opened its file"
    with h5py.File(before, "r") as f:
        ok = list(f["a"][()]) == list(range(10))
    keep = h5py.File(left_open, "w")       # closed by HDF5 at exit
    keep["c"] = np.full(4, 7.0)
    keep.flush()
    print("rc", rc1, rc2, "readback", ok)
''')


def main():
    need_build()
    d = tmpdir("probe-shim-h5py-")
    out = os.path.join(d, "cap.h5")
    before, after, left = (os.path.join(d, n) for n in ("before.h5", "after.h5", "left-open.h5"))
    r = run([sys.executable, "-c", SCRIPT, before, after, left], preload_env(out, leaks=False))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "python with h5py under the shim exits 0")
    check("rc 0 0 readback True" in r.stdout, "taps return 0 and h5py reads its own file back")
    check(probe_lines(r.stderr) == [] and "HDF5-DIAG" not in r.stderr, "no warnings, no HDF5 error stack")
    with h5py.File(out, "r") as f:
        check(np.array_equal(f["/py/0000/out"][()], (np.arange(12, dtype=np.float64).reshape(3, 4) * 1.5).T),
              "captured transposed float64 view")
        check(list(f["/py/0001/out"][()].astype(bool)) == [True, False, True], "captured bool array")
    with h5py.File(after, "r") as f:
        check(list(f["b"][()]) == [1.0] * 5 and f.attrs["note"] == "written after probe opened its file",
              "user's h5py file written after the first tap is intact")
    with h5py.File(left, "r") as f:
        check(list(f["c"][()]) == [7.0] * 4, "user's file left open at exit is intact")
    finish()


if __name__ == "__main__":
    main()
