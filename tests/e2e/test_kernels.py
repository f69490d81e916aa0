"""Kernel-path evidence on a CPU (intercept/hooks/kernels.c, docs/kernels.md).

tests/fakes/mock_cudart.c (libcudart.so.13) and tests/fakes/fake_libcuda.c
(libcuda.so.1) are built here; tests/programs/shim_kernels launches through
every route the shim logs (runtime hooks, dlsym'd and cuGetProcAddress'd
driver entry points, cudaGetDriverEntryPointByVersion, threads, a forked
child) and checks on its side that every call reached the right function
with its arguments and that its result came back. Checked here:
- the manifest's "kernels" equals the hand-counted launches of the program
  (names demangled with the process's libstdc++, runtime launches that go
  on to the driver counted once, failed name queries as unnamed launches);
  with the shim's scopes, the launches inside dit.step are under it;
- without libstdc++ the mangled name is kept; with libstdc++ loaded only
  RTLD_LOCAL (how python loads torch's) names are demangled;
- PROBE_KERNELS=0: no "kernels" key, every launch still forwarded;
  no PROBE_OUT: the program runs unchanged;
- the exported dlsym keeps RTLD_NEXT relative to its caller: a second
  preloaded library (also from its constructor, before the shim's ran) gets
  the definition after itself, NULL and a dlerror() text for a name with none
  after it, the C library's malloc; the same answers as without the shim.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shim_common import (SOURCE, asan_runtime, attr_str, check, clean_env, finish, need_build,  # noqa: E402
                              preload_env, probe_lines, program, run, tmpdir)

import h5py  # noqa: E402

CC = os.environ.get("CC", "cc")


def build(d):
    rt = os.path.join(d, "libcudart.so.13")
    drv = os.path.join(d, "libcuda.so.1")
    flags = ["-shared", "-fPIC", "-O1", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror"]
    subprocess.run([CC] + flags + ["-Wl,-soname,libcudart.so.13", "-o", rt,
                                   os.path.join(SOURCE, "tests", "fakes", "mock_cudart.c"), "-lpthread"],
                   check=True)
    subprocess.run([CC] + flags + ["-Wl,-soname,libcuda.so.1", "-o", drv,
                                   os.path.join(SOURCE, "tests", "fakes", "fake_libcuda.c"),
                                   "-lpthread"], check=True)
    return rt, drv


def kernels_of(path):
    with h5py.File(path, "r") as f:
        return json.loads(attr_str(f, "probe.manifest")).get("kernels")


def launch_cases(d, rt, drv):
    out = os.path.join(d, "k.h5")
    r = run([program("shim_kernels"), rt, drv, "main"], preload_env(out, leaks=False, PROBE_KERNELS="1"))
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "launch program: every call forwarded with its result (rc=%d)" % r.returncode)
    check(probe_lines(r.stderr) == [], "no probe: warnings")
    scopes = "scopes: yes" in r.stdout
    k = kernels_of(out)
    print("kernels:", json.dumps(k, indent=1))
    # Hand count (tests/programs/shim_kernels.c): runtime k_a 3 + 1 (ptsz) + 4 x 1000 threads,
    # k_b 2, k_c 1, k_p 2 (the first while an error was pending: name deferred -> unnamed),
    # k_u 1 unnamed; driver d_x 5 + 1 (empty grid) + 1 (via cuGetProcAddress'd
    # cuGetProcAddress), d_y 2 (ptsz), d_z 2 (Ex, one failing), d_w 1 (cooperative),
    # d_v 1 (cudaGetDriverEntryPointByVersion), d_u 3 unnamed (its name asked once);
    # CUkernel handles named by cuKernelGetName only: d_k 2 (driver), k_k 1 (__cudaLaunchKernel).
    none = {"kernel_a(float*, int)": 4004, "plain_kernel_b": 2, "kernel_c": 1, "pending_kernel": 1,
            "triton_poi_fused_add_0": 7, "void cutlass::Kernel<Gemm>(Gemm::Params)": 2,
            "sm90_xmma_gemm_bf16": 2, "coop_kernel": 1, "entry_point_kernel": 1,
            "library_kernel_d": 2, "library_kernel_k": 1}
    want = {"(none)": {"launches": sum(none.values()) + 5, "by_name": none, "unnamed_launches": 5}}
    if scopes:
        want["dit.step"] = {"launches": 4, "unnamed_launches": 0,
                            "by_name": {"kernel_a(float*, int)": 2, "triton_poi_fused_add_0": 1,
                                        "void cutlass::Kernel<Gemm>(Gemm::Params)": 1}}
    check(k == want, "manifest kernels = the hand count%s" % (" (with dit.step scopes)" if scopes else
                                                              " (outside scopes; no scope API yet)"))
    check(not any("fork_kernel" in n for c in (k or {}).values() for n in c["by_name"]),
          "the forked child's launches are not in the parent's log")
    check(list(k or {}) == sorted(k or {}), "components in name order")

    out = os.path.join(d, "m.h5")
    r = run([program("shim_kernels"), rt, drv, "mangled"], preload_env(out, leaks=False))
    check(r.returncode == 0, "mangled: rc 0")
    k = kernels_of(out)
    names = ["_Z8kernel_aPfi"]
    if asan_runtime():  # the sanitizer runtime exports a __cxa_demangle of its own
        names.append("kernel_a(float*, int)")
    check(any(k == {"(none)": {"launches": 1, "by_name": {n: 1}, "unnamed_launches": 0}} for n in names),
          "without __cxa_demangle in the process the mangled name is kept: %s" % k)

    out = os.path.join(d, "l.h5")
    r = run([program("shim_kernels"), rt, drv, "local"], preload_env(out, leaks=False))
    check(r.returncode == 0, "local: rc 0")
    k = kernels_of(out)
    check(k == {"(none)": {"launches": 1, "by_name": {"kernel_a(float*, int)": 1}, "unnamed_launches": 0}},
          "libstdc++ loaded only as a local library (python importing torch): names demangled: %s" % k)

    out = os.path.join(d, "off.h5")
    r = run([program("shim_kernels"), rt, drv, "main"], preload_env(out, leaks=False, PROBE_KERNELS="0"))
    check(r.returncode == 0, "PROBE_KERNELS=0: every launch forwarded (rc=%d)" % r.returncode)
    with h5py.File(out, "r") as f:
        check("kernels" not in json.loads(attr_str(f, "probe.manifest")), "PROBE_KERNELS=0: no kernels key")
    r = run([program("shim_kernels"), rt, drv, "main"], preload_env(None, leaks=False))
    check(r.returncode == 0, "no PROBE_OUT: the program runs unchanged (rc=%d)" % r.returncode)


LIB_A = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
const char *kt_hello(void) { return "A"; }
static const char *early = "unset";
__attribute__((constructor)) static void init(void)
{
    const char *(*f)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "kt_hello");
    early = f ? f() : "NULL";
}
/* What RTLD_NEXT gives this library, as one line of text. */
void kt_report(char *buf, size_t cap)
{
    const char *(*f)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "kt_hello");
    void *only = dlsym(RTLD_NEXT, "kt_only_in_a");
    const char *err = only ? "none" : (dlerror() ? "set" : "none");
    void *m = dlsym(RTLD_NEXT, "malloc");
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    void *m_libc = libc ? dlsym(libc, "malloc") : NULL;
    snprintf(buf, cap, "next=%s early=%s only_in_a=%s dlerror=%s malloc_is_libc=%d",
             f ? f() : "NULL", early, only ? "found" : "NULL", err, m != NULL && m == m_libc);
}
int kt_only_in_a(void) { return 1; }
"""
LIB_B = r"""
const char *kt_hello(void) { return "B"; }
"""
MAIN = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(void)
{
    void (*report)(char *, size_t) = (void (*)(char *, size_t))dlsym(RTLD_DEFAULT, "kt_report");
    if (!report) { printf("no kt_report\n"); return 1; }
    char buf[256];
    report(buf, sizeof buf);
    printf("%s\n", buf);
    return 0;
}
"""


def dlsym_next(d):
    srcs = {"kt_a.c": LIB_A, "kt_b.c": LIB_B, "kt_main.c": MAIN}
    for name, text in srcs.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    a, b, m = (os.path.join(d, x) for x in ("libkt_a.so", "libkt_b.so", "kt_main"))
    subprocess.run([CC, "-shared", "-fPIC", "-o", a, os.path.join(d, "kt_a.c"), "-ldl"], check=True)
    subprocess.run([CC, "-shared", "-fPIC", "-o", b, os.path.join(d, "kt_b.c")], check=True)
    subprocess.run([CC, "-o", m, os.path.join(d, "kt_main.c"), "-ldl"], check=True)
    base = clean_env()
    base["LD_PRELOAD"] = "%s:%s" % (a, b)
    r0 = run([m], base)
    env = preload_env(os.path.join(d, "dl.h5"), leaks=False)
    env["LD_PRELOAD"] = env["LD_PRELOAD"] + ":%s:%s" % (a, b)
    r1 = run([m], env)
    print("without shim:", r0.stdout.strip(), r0.stderr.strip())
    print("with shim:   ", r1.stdout.strip(), r1.stderr.strip())
    want = "next=B early=B only_in_a=NULL dlerror=set malloc_is_libc=1"
    check(r0.stdout.strip() == want, "baseline without the shim: %s" % want)
    check(r1.returncode == 0 and r1.stdout.strip() == want,
          "dlsym(RTLD_NEXT) from a second preloaded library, under the shim: %s" % want)


def main():
    need_build()
    d = tmpdir("probe-kernels-")
    rt, drv = build(d)
    launch_cases(d, rt, drv)
    dlsym_next(d)
    finish()


if __name__ == "__main__":
    main()
