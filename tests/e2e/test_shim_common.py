"""Helpers shared by the shim's end-to-end tests (tests/e2e/test_shim_*.py),
and, run as a test itself, the check of what libprobe_intercept.so exports
and links: only the tap ABI, InitializeInjectionNvtx2 and the interposed CUDA
graph calls are exported, and
its only dependencies are libc/libdl/libpthread (plus libasan/libubsan in a
sanitizer build) -- never HDF5 or the CUDA runtime (docs/intercept.md).

Environment: PROBE_BUILD_DIR (build tree), PROBE_SOURCE_DIR (source tree).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

BUILD = os.environ.get("PROBE_BUILD_DIR", "")
SOURCE = os.environ.get("PROBE_SOURCE_DIR", "")

EXPORTS = {
    "probe_tap_v1",
    "probe_tap_enabled_v1",
    "probe_tap_manifest_v1",
    "probe_tap_stream_v1",
    "probe_tap_flush_v1",
    "probe_tap_sidecar_v1",
    "probe_tap_sidecar_if_taken_v1",
    "probe_tap_close_v1",
    "InitializeInjectionNvtx2",
    "probe_inject_v1",
    "probe_scope_enter_v1",
    # intercept/hooks/nccl.c
    "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclBcast",
    "ncclSend", "ncclRecv", "ncclAlltoAll", "ncclGroupStart", "ncclGroupEnd",
    # intercept/capture/exits.c
    "_exit", "_Exit", "quick_exit", "abort", "execve", "execv", "execvp", "execvpe", "execl",
    "execle", "execlp", "fexecve", "sigaction", "signal",
    "probe_scope_exit_v1",
    # CUDA graph calls interposed to record replays of graphs with skipped taps (graphs.c)
    "cudaStreamEndCapture",
    "cudaGraphInstantiate",
    "cudaGraphInstantiateWithFlags",
    "cudaGraphInstantiateWithParams",
    "cudaGraphLaunch",
    "cudaGraphExecDestroy",
    "cudaGraphDestroy",
    # cuBLAS / cuBLASLt GEMMs interposed for operand capture (gemm.c, docs/gemm.md)
    "cublasGemmEx",
    "cublasGemmStridedBatchedEx",
    "cublasSgemm_v2",
    "cublasDgemm_v2",
    "cublasHgemm",
    "cublasSgemmStridedBatched",
    "cublasHgemmStridedBatched",
    "cublasLtMatmul",
    # kernel-path evidence (intercept/hooks/kernels.c, hooks/dlsym_x86_64.S)
    "dlsym",
    "__cudaLaunchKernel",
    "__cudaLaunchKernel_ptsz",
    "cudaLaunchKernel",
    "cudaLaunchKernel_ptsz",
    "cudaLaunchKernelExC",
    "cudaLaunchKernelExC_ptsz",
    "cudaGetDriverEntryPoint",
    "cudaGetDriverEntryPoint_ptsz",
    "cudaGetDriverEntryPointByVersion",
    "cudaGetDriverEntryPointByVersion_ptsz",
}

# probe_dtype values (include/probe/dtype.h) -> name, element size
NAMES = {1: "bool", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "uint8", 7: "uint16",
         8: "uint32", 9: "uint64", 10: "float16", 11: "bfloat16", 12: "float32", 13: "float64",
         14: "float8_e4m3fn", 15: "float8_e5m2"}
SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 2, 12: 4, 13: 8, 14: 1, 15: 1}

_failures = []


def check(cond, what):
    """Record one assertion; print PASS/FAIL with what was checked."""
    if cond:
        print("PASS", what)
    else:
        print("FAIL", what)
        _failures.append(what)
    return cond


def finish():
    """Exit 0 if every check passed, else 1 (after listing the failures)."""
    if _failures:
        print("%d check(s) failed:" % len(_failures))
        for f in _failures:
            print("  -", f)
        sys.exit(1)
    print("all checks passed")
    sys.exit(0)


def need_build():
    if not BUILD or not os.path.isdir(BUILD):
        print("PROBE_BUILD_DIR is not set to a build tree")
        sys.exit(2)


def shim_path():
    return os.path.join(BUILD, "lib", "libprobe_intercept.so")


def program(name):
    return os.path.join(BUILD, "tests", name)


def _needed(lib):
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)



def venv_python():
    """The probe venv's python ($PROBE_VENV, default ~/.cache/probe-venv):
    torch 2.11 with torchrun, numpy and h5py (scripts/setup makes it)."""
    return os.path.join(os.environ.get("PROBE_VENV") or os.path.expanduser("~/.cache/probe-venv"),
                        "bin", "python")


def reexec_in_venv():
    """Run the calling test again under the venv's python unless it already
    runs there; exit 77 (skipped) when the venv or its torchrun, numpy or
    h5py is missing. Returns the venv's python."""
    py = venv_python()
    venv = os.path.dirname(os.path.dirname(py))
    # sys.prefix, not the executable: a venv's python may resolve to the base interpreter
    if os.path.realpath(sys.prefix) != os.path.realpath(venv) and os.environ.get("PROBE_TORCHRUN_REEXEC") != "1":
        if not os.path.exists(py):
            print("SKIP: no venv python at %s (scripts/setup creates it; PROBE_VENV names another)" % py)
            sys.exit(77)
        r = subprocess.run([py, "-c", "import torch, torch.distributed, numpy, h5py"], capture_output=True)
        if r.returncode != 0 or not os.path.exists(os.path.join(os.path.dirname(py), "torchrun")):
            print("SKIP: the venv at %s lacks torch/torchrun/numpy/h5py" % py)
            sys.exit(77)
        os.environ["PROBE_TORCHRUN_REEXEC"] = "1"
        os.execv(py, [py] + sys.argv)
    return py


def need_torch_float8():
    """Run the calling test under a torch with float8 types (the oracle of the rounded
    weight fingerprints): this interpreter's when it has torch.float8_e4m3fn, else the
    script again under the venv's (diffusers_venv_python: exit 77 without it)."""
    try:
        import torch
        if hasattr(torch, "float8_e4m3fn"):
            return
    except ImportError:
        pass
    if os.environ.get("PROBE_TEST_REEXEC") == "float8":
        print("SKIP: no torch with float8_e4m3fn, even in the venv")
        sys.exit(77)
    py = diffusers_venv_python()
    os.environ["PROBE_TEST_REEXEC"] = "float8"
    sys.stdout.flush()
    os.execv(py, [py] + sys.argv)


def diffusers_venv_python():
    """The venv's python when it has torch 2.11 + diffusers + transformers, numpy and
    h5py; exit 77 (skipped) with the reason when the venv or one of them is missing."""
    py = venv_python()
    if not os.access(py, os.X_OK):
        print("SKIP: no venv python at %s (scripts/setup creates it; PROBE_VENV names another)" % py)
        sys.exit(77)
    chk = subprocess.run([py, "-c", "import torch, diffusers, transformers, numpy, h5py"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if chk.returncode != 0:
        print("SKIP: the venv at %s lacks torch/diffusers/transformers/numpy/h5py: %s"
              % (py, (chk.stdout.strip().splitlines() or ["(no output)"])[-1]))
        sys.exit(77)
    return py


def reexec_in_diffusers_venv(flag):
    """Run the calling test again under the venv's python (diffusers_venv_python)
    unless the environment variable `flag` says it already does."""
    if os.environ.get(flag) == "1":
        return
    py = diffusers_venv_python()
    os.execve(py, [py, os.path.abspath(sys.argv[0])], dict(os.environ, **{flag: "1"}))


def bf16_type():
    """The HDF5 file type probe's writer gives bfloat16 (probe/capture/h5types.c):
    IEEE binary32 cut to its upper 16 bits (sign 15, exponent 7..14, bias 127,
    mantissa 0..6), little-endian."""
    import h5py
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)
    t.set_precision(16)
    t.set_size(2)
    t.set_ebias(127)
    return t

def asan_runtime():
    """Path of the sanitizer runtime (libasan.so, or libtsan.so in the TSan
    build) when the shim was built with one, else None: a sanitizer-built
    preload needs its runtime preloaded before it."""
    needed = _needed(shim_path())
    lib = next((l for l in ("libasan", "libtsan") if any(n.startswith(l) for n in needed)), None)
    if lib is None:
        return None
    cc = os.environ.get("CC", "cc")
    p = subprocess.run([cc, "-print-file-name=%s.so" % lib], capture_output=True, text=True).stdout.strip()
    return p if os.path.isabs(p) else None


def clean_env(extra=None):
    """The caller's environment without any probe/NVTX/preload settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PROBE_OUT") and k not in (
               "PROBE_ROOT_PID", "PROBE_RANK_ROOT_PID", "PROBE_SHARD", "PROBE_LABEL", "PROBE_CAPTURE", "PROBE_QUEUE_MB",
               "PROBE_LIBPROBE", "NVTX_INJECTION64_PATH", "LD_PRELOAD")}
    env["PROBE_BUILD_DIR"] = BUILD
    env["PROBE_SOURCE_DIR"] = SOURCE
    if extra:
        env.update(extra)
    return env


def preload_env(out=None, leaks=True, **extra):
    """Environment that preloads the shim, with PROBE_OUT=out when given.
    In a sanitizer build, leaks=False turns LeakSanitizer off for programs
    whose other libraries leak at exit (Python itself, HDF5 after a failed
    create); the shim's own programs run with it on."""
    env = clean_env()
    pre = [shim_path()]
    asan = asan_runtime()
    if asan:
        pre.insert(0, asan)
        if not leaks:
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    env["LD_PRELOAD"] = ":".join(pre)
    if out is not None:
        env["PROBE_OUT"] = out
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run(cmd, env, timeout=300, **kw):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def probe_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("probe:")]


def tmpdir(prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    return d


def read_raw(ds):
    """The dataset's stored bytes, read in its own file type (no conversion
    at all): a numpy uint8 array of n * element-size bytes."""
    import h5py
    import numpy as np
    tid = ds.id.get_type()
    shape = ds.shape
    if shape is None:
        return np.empty(0, np.uint8)
    n = int(np.prod(shape)) if shape else 1
    if n == 0:
        return np.empty(0, np.uint8)
    arr = np.empty(shape, dtype=np.dtype("V%d" % tid.get_size()))
    ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, arr, mtype=tid)
    return np.frombuffer(arr.tobytes(), np.uint8)


def expected_bytes(case, d):
    """Contiguous row-major bytes of the view a test program described:
    numpy's as_strided over the raw base buffer it saved (case: dtype, bin,
    offset and strides in elements, shape), as unsigned integers of the
    element size so nothing is converted."""
    import numpy as np
    from numpy.lib.stride_tricks import as_strided
    es = SIZES[case["dtype"]]
    base = np.fromfile(os.path.join(d, case["bin"]), dtype=np.dtype("u%d" % es))
    shape = tuple(case["shape"])
    n = int(np.prod(shape)) if shape else 1
    if n == 0:
        return b""
    off = case["offset"]
    if case["strides"] is None:
        view = base[off:off + n].reshape(shape)
    else:
        view = as_strided(base[off:], shape=shape, strides=tuple(s * es for s in case["strides"]))
    return np.ascontiguousarray(view).tobytes()


def attr_str(obj, name):
    v = obj.attrs.get(name)
    if isinstance(v, bytes):
        v = v.decode()
    return v


def main():
    need_build()
    lib = shim_path()
    check(os.path.isfile(lib), "libprobe_intercept.so exists at %s" % lib)
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWwDdBbRrVvi":
            syms.add(parts[2])
    # sanitizer runtimes may add their own interceptors only in the sanitizer runtime itself
    check(syms == EXPORTS, "exported symbols are exactly the tap ABI + InitializeInjectionNvtx2 (got %s)"
          % sorted(syms))
    needed = _needed(lib)
    allowed = re.compile(r"^(libc\.so\.6|libdl\.so\.2|libpthread\.so\.0|ld-linux[-\w]*\.so\.\d|"
                         r"libasan\.so\.\d+|libubsan\.so\.\d+)$")
    bad = [n for n in needed if not allowed.match(n)]
    check(not bad, "shim links only libc/libdl/libpthread (NEEDED: %s)" % needed)
    check(not any("hdf5" in n or "cudart" in n or "probe" in n for n in needed),
          "shim does not link HDF5, cudart or libprobe")
    finish()


if __name__ == "__main__":
    main()
