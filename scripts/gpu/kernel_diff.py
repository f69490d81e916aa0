"""Read probe-compare's JSON (--kernels) for a reference/candidate pair that
differs by the attention backend, print per component the kernels only one
run launched, and check that every one of them belongs to the attention path.

  python3 kernel_diff.py math_vs_flash.json

A kernel name is "attention" when it matches ATTENTION below (flash/fmha/
memory-efficient attention kernels, softmax, and the batched GEMMs and
element-wise kernels SDPA's math path is made of are NOT assumed: the GEMMs
of the math path use the same cuBLAS kernels as the linear layers, so they
show up as count differences, which are printed too). Exit 0 when every
kernel only one side launched matches ATTENTION, 1 otherwise, 2 on bad input.
"""
import json
import re
import sys

ATTENTION = re.compile(r"flash|fmha|attention|attn|softmax|sdpa|efficient_attention|mem_eff",
                       re.IGNORECASE)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    try:
        with open(sys.argv[1]) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print("kernel_diff: %s: %s" % (sys.argv[1], e))
        return 2
    k = doc.get("kernels")
    if not isinstance(k, dict):
        print("kernel_diff: no \"kernels\" key in %s" % sys.argv[1])
        return 2
    bad = 0
    seen = 0
    for comp, d in sorted(k.items()):
        if not isinstance(d, dict):
            continue
        for side in ("only_candidate", "only_reference"):
            for name, count in sorted((d.get(side) or {}).items()):
                seen += 1
                ok = bool(ATTENTION.search(name))
                bad += not ok
                print("%-5s %-16s %-15s %6s  %s" % ("attn" if ok else "OTHER", comp, side,
                                                   count, name[:160]))
    print("kernels only one run launched: %d, not attention-related: %d" % (seen, bad))
    if seen == 0:
        print("FAIL no kernel differs between the runs: the feature did not change the kernel path")
        return 1
    print(("PASS" if bad == 0 else "FAIL") + " every differing kernel is an attention kernel")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
