#!/usr/bin/env bash
# What the weight fingerprints cost and cover on a real diffusers Wan pipeline
# (docs/gemm.md "Weights", "Quantized from the same weights"). Run from the
# repository root on the GPU machine (./.debs and ./.whl as for
# scripts/gpu/capture_bench.sh):
#   bash scripts/gpu/weights_cost.sh
# Runs of scripts/gpu/lib/wan_run.py (Wan2.1-1.3B transformer shape, random
# bf16 weights, CFG; WEIGHTS_ARGS sets the size, default 480x832, 33 frames,
# 2 steps; WEIGHTS_CONFIG and WEIGHTS_DEVICE a dry run, e.g. tiny and cpu),
# each a separate process under probe-run --blocks capturing one DiT output
# (the DiT blocks' scopes carry parent and block), with PROBE_WEIGHTS=0
# (none), hash (hashes only) and unset (hashes and rounded fingerprints):
# the process wall time, the second pipeline call, probe's drain at exit,
# and per run the manifest's weight components, operands and bytes. A second
# fingerprinted run must give the same fingerprints (exit 1 otherwise).
# Results under $OUT/weights-cost/.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
out=$OUT/weights-cost
mkdir -p "$out"
WORK=$(mktemp -d /tmp/probe-weights-cost.XXXX)
. scripts/gpu/lib/preamble.sh && probe_debs_env .
probe_wheels . python3
echo "== $(probe_machine)"
echo "== $(probe_versions python3)"
BUILD=${BUILD:-build}
if [ ! -x "$BUILD/bin/probe-run" ]; then
  probe_build "$BUILD" "$WORK/build.log" python3 || { tail -30 "$WORK/build.log"; exit 2; }
fi
# shellcheck disable=SC2206
size=(${WEIGHTS_ARGS:---height 480 --width 832 --frames 33 --steps 2})
wan=(python3 scripts/gpu/lib/wan_run.py --config "${WEIGHTS_CONFIG:-wan2.1-1.3b}" --dtype bf16
     --device "${WEIGHTS_DEVICE:-cuda}" "${size[@]}"
     --seed 1 --deterministic --attn default --no-time --repeat 2)
fail=0
run() { # NAME PROBE_WEIGHTS-value ("" unset)
  local name=$1 w=$2
  local envs=()
  [ -n "$w" ] && envs=(PROBE_WEIGHTS="$w")
  local t0; t0=$(date +%s.%N)
  env "${envs[@]}" "$BUILD/bin/probe-run" --out "$WORK/$name.h5" --label "$name" --blocks \
      --capture 'dit.step/0000/out*' -- "${wan[@]}" --json "$WORK/$name.json" > "$out/$name.log" 2>&1
  local rc=$?
  printf '== %-8s PROBE_WEIGHTS=%-5s exit %d, %.1f s process; %s\n' "$name" "${w:-unset}" "$rc" \
    "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" \
    "$(python3 - "$WORK" "$name" <<'EOF' 2>&1
import json, sys, h5py
w, n = sys.argv[1:3]
d = json.load(open("%s/%s.json" % (w, n)))
with h5py.File("%s/%s.h5" % (w, n), "r") as f:
    man = json.loads(f.attrs["probe.manifest"])
c = man.get("weights", {}).get("components", {})
ops = [o for e in c.values() for o in e["operands"]]
print("pipeline %.3f s (second call), drain %s s; weights: %d components, %d operands, %.2f GB, "
      "%d with rounded fingerprints, complete %s"
      % (d["pipeline_s"], d.get("flush_s"), len(c), len(ops), sum(e["bytes"] for e in c.values()) / 1e9,
         sum("rounded" in o for o in ops), all(e["complete"] for e in c.values())))
EOF
)"
  [ $rc -eq 0 ] || { tail -20 "$out/$name.log"; fail=1; }
}
run none 0
run hash hash
run rounded ""
run none2 0
run rounded2 ""
python3 - "$WORK" <<'EOF' | tee "$out/fingerprints.txt"
import json, sys, h5py
w = sys.argv[1]
def weights(n):
    with h5py.File("%s/%s.h5" % (w, n), "r") as f:
        return json.loads(f.attrs["probe.manifest"]).get("weights", {}).get("components", {})
a, b, h = weights("rounded"), weights("rounded2"), weights("hash")
same = a == b and a
print("rounded vs rounded2: fingerprints identical: %s (%d components: %s ...)"
      % (bool(same), len(a), ", ".join(sorted(a)[:4])))
print("hash vs rounded: combined hashes equal: %s"
      % all(h.get(k, {}).get("xxh64") == v["xxh64"] for k, v in a.items()))
lv = [o.get("levels") for e in a.values() for o in e["operands"]]
print("levels: %d operands, %d with levels <= 256 (bf16 weights of random values: expect 0)"
      % (len(lv), sum(x is not None for x in lv)))
sys.exit(0 if same else 1)
EOF
[ $? -eq 0 ] || fail=1
exit $fail
