#!/usr/bin/env python3
"""Check a capture made with `--capture 'COMPONENT/*/gemm.last.*'`
(docs/gemm.md, "gemm.last") against what that selection promises:

- the manifest's capture_last[COMPONENT] has 0 mismatched instances and one
  completed instance per call index present in the manifest's scope counts;
- the first instance (first_call) holds every GEMM 0..n-1 (captured whole);
- every other instance holds exactly GEMM n-1 (its last), with a, b and out;
- the GEMM count n equals the manifest "gemm" table's count of COMPONENT's
  GEMMs divided by its instances (every instance made n GEMMs).

usage: last_check.py FILE [--component dit.block]
Prints one line per check and exits 0 when all pass, 1 otherwise.
"""
import argparse
import json
import re
import sys

import h5py


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--component", default="dit.block")
    a = ap.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
