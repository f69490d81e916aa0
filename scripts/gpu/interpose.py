#!/usr/bin/env python3
"""The Python parts of scripts/gpu/interpose.sh, one subcommand each.

kernel-diff: reads probe-compare's JSON (--kernels) for a reference/candidate pair that
differs only by the attention backend, prints per component the kernels only
one run launched, and checks that the difference is confined to attention.

  python3 interpose.py kernel-diff math_vs_flash.json [--scope COMPONENT]

With --scope (the runs were made with a scope around the attention call,
e.g. probe-run --scope dit.attn=WanAttnProcessor.__call__): PASS when at
least one kernel differs and every kernel only one run launched was
launched inside COMPONENT's scopes; the components outside it launched the
same kernels in both runs. Without --scope, a kernel counts as attention
when its name matches ATTENTION (flash/fmha/softmax...): a weaker check,
since SDPA's math path is made of generic GEMM and element-wise kernels.
Exit 0 PASS, 1 FAIL, 2 bad input.

last: checks a capture made with `--capture 'COMPONENT/*/gemm.last.*'`
(docs/gemm.md, "gemm.last") against what that selection promises:

- the manifest's capture_last[COMPONENT] has 0 mismatched instances and one
  completed instance per call index present in the manifest's scope counts;
- the first instance (first_call) holds every GEMM 0..n-1 (captured whole);
- every other instance holds exactly GEMM n-1 (its last), with a, b and out;
- the GEMM count n equals the manifest "gemm" table's count of COMPONENT's
  GEMMs divided by its instances (every instance made n GEMMs).

  python3 interpose.py last FILE [--component dit.block]

Prints one line per check and exits 0 when all pass, 1 otherwise."""
import argparse
import json
import re
import sys

ATTENTION = re.compile(r"flash|fmha|attention|attn|softmax|sdpa|efficient_attention|mem_eff",
                       re.IGNORECASE)


def kernel_diff(a):
    try:
        with open(a.json) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print("kernel_diff: %s: %s" % (a.json, e))
        return 2
    k = doc.get("kernels")
    if not isinstance(k, dict):
        print("kernel_diff: no \"kernels\" key in %s" % a.json)
        return 2
    if a.scope is not None and a.scope not in k:
        print("kernel_diff: component %r has no kernel log in %s (components: %s)"
              % (a.scope, a.json, ", ".join(sorted(k))))
        return 2
    bad = seen = 0
    for comp, d in sorted(k.items()):
        if not isinstance(d, dict):
            continue
        for side in ("only_candidate", "only_reference"):
            for name, count in sorted((d.get(side) or {}).items()):
                seen += 1
                ok = comp == a.scope if a.scope is not None else bool(ATTENTION.search(name))
                bad += not ok
                print("%-5s %-16s %-15s %6s  %s" % ("attn" if ok else "OTHER", comp, side,
                                                   count, name[:160]))
    what = "outside the %s scope" % a.scope if a.scope else "not attention-named"
    print("kernels only one run launched: %d, %s: %d" % (seen, what, bad))
    if seen == 0:
        print("FAIL no kernel differs between the runs: the feature did not change the kernel path")
        return 1
    ok = bad == 0
    print(("PASS" if ok else "FAIL") + (" every differing kernel was launched inside the %s scope"
                                        % a.scope if a.scope else
                                        " every differing kernel is an attention kernel"))
    return 0 if ok else 1



def last(a):
    import h5py

    bad = 0

    def check(ok, what):
        nonlocal bad
        print("%s %s" % ("PASS" if ok else "FAIL", what))
        bad += not ok
        return ok

    with h5py.File(a.file, "r") as f:
        m = json.loads(f.attrs["probe.manifest"])
        calls = {}
        pat = re.compile(r"^gemm\.(\d{4})\.(\w+)$")
        grp = f.get(a.component)
        if grp is not None:
            for call, g in grp.items():
                for name in g:
                    mm = pat.match(name)
                    if mm:
                        calls.setdefault(int(call), {}).setdefault(int(mm.group(1)), set()).add(mm.group(2))
    cl = m.get("capture_last", {}).get(a.component)
    if not check(cl is not None, "manifest capture_last has %s (%s)" % (a.component, m.get("capture_last"))):
        return 1
    n = cl["gemm"]["n"]
    total = sum(e["count"] for e in m.get("gemm", {}).get("components", {}).get(a.component, []))
    check(cl["gemm"]["mismatched"] == 0, "no instance changed its GEMM count (mismatched %d)" % cl["gemm"]["mismatched"])
    check(n > 0 and total == n * cl["instances"],
          "%d instances x %d GEMMs = the manifest's %d GEMMs under %s" % (cl["instances"], n, total, a.component))
    check(sorted(calls) == list(range(cl["instances"])),
          "a capture in every instance 0..%d (%d present)" % (cl["instances"] - 1, len(calls)))
    first = cl["first_call"]
    check(sorted(calls.get(first, {})) == list(range(n)),
          "first instance (call %d) captured whole: GEMMs %s" % (first, sorted(calls.get(first, {}))))
    others = {c: sorted(ks) for c, ks in calls.items() if c != first}
    check(all(ks == [n - 1] for ks in others.values()),
          "every other instance: exactly GEMM %d, its last (%d instances)" % (n - 1, len(others)))
    check(all({"a", "b", "out"} <= ops for ks in calls.values() for ops in ks.values()),
          "each captured GEMM has a, b and out")
    print("ALL PASS" if bad == 0 else "%d FAILED" % bad)
    return 1 if bad else 0



def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    kd = sub.add_parser("kernel-diff", help="kernels only one run launched, confined to attention?")
    kd.add_argument("json")
    kd.add_argument("--scope", default=None, help="the attention scope's component name")
    kd.set_defaults(fn=kernel_diff)
    la = sub.add_parser("last", help="a --capture 'COMPONENT/*/gemm.last.*' capture")
    la.add_argument("file")
    la.add_argument("--component", default="dit.block")
    la.set_defaults(fn=last)
    a = ap.parse_args()
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
