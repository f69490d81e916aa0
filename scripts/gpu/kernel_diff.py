"""Read probe-compare's JSON (--kernels) for a reference/candidate pair that
differs only by the attention backend, print per component the kernels only
one run launched, and check that the difference is confined to attention.

  python3 kernel_diff.py math_vs_flash.json [--scope COMPONENT]

With --scope (the runs were made with a scope around the attention call,
e.g. probe-run --scope dit.attn=WanAttnProcessor.__call__): PASS when at
least one kernel differs and every kernel only one run launched was
launched inside COMPONENT's scopes; the components outside it launched the
same kernels in both runs. Without --scope, a kernel counts as attention
when its name matches ATTENTION (flash/fmha/softmax...): a weaker check,
since SDPA's math path is made of generic GEMM and element-wise kernels.
Exit 0 PASS, 1 FAIL, 2 bad input.
"""
import argparse
import json
import re
import sys

ATTENTION = re.compile(r"flash|fmha|attention|attn|softmax|sdpa|efficient_attention|mem_eff",
                       re.IGNORECASE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--scope", default=None, help="the attention scope's component name")
    a = ap.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
