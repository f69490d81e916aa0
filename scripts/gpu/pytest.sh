#!/usr/bin/env bash
# scripts/gpu/pytest.sh - same-process pairing (probe.pair, docs/pairing.md)
# on a GPU: the device path against the host path, then the worked example
# tests/pytest/test_wan_parity.py on cuda, with its measured statistics.
#
#   scripts/gpu/pytest.sh [--build-dir DIR] [--out DIR]
#
# python3 must have torch with CUDA, diffusers and pytest (wheels in .whl/
# are installed first, as in scripts/gpu-selftest: put pytest's wheels
# there on a machine without it).
# 1. Builds probe into build-gpu (or --build-dir; reused when it exists;
#    headers a bare GPU machine lacks come from .debs/): libprobe,
#    libprobe_cuda and the Python module in share/probe/python.
# 2. tests/gpu/check_pairing_cuda.py: probe_cuda_metrics through probe.pair's
#    binding against the CPU engine on the same tensors (bit-equal counts,
#    max_abs, p99; sums within docs/device.md's tolerance), no host copy,
#    stream order, torch's allocator untouched.
# 3. pytest on tests/pytest/test_wan_parity.py with PROBE_PAIR_DEVICE=cuda
#    (bf16 Wan block and DiT step; SDPA math against _native_flash,
#    _native_efficient, _native_cudnn under T1-relaxed:backend-swap; the
#    backends active by call count and by their kernels in torch.profiler;
#    the same swaps judged by the oracle verdict (oracle=True: no less
#    accurate than the math backend against the fp32 oracle);
#    bf16 against the fp32 oracle under T2 with the CPU-measured calibration
#    file; a planted defect that must fail) and PROBE_PAIR_REPEAT=1 (each
#    reference is run twice: the determinism floor). Every pair's slot
#    statistics go to OUT/pair-stats.jsonl and are printed as a table.
# Exit 0 when every check and test passed, 1 when one failed, 2 when it could
# not build or run. Logs go to --out (default $OUT/pytest-selftest when OUT
# is set, else a new temporary folder).
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$src/build-gpu
out=
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "pytest-selftest: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out=$OUT/pytest-selftest; else out=$(mktemp -d /tmp/probe-pytest-selftest.XXXX); fi
fi
mkdir -p "$out" || exit 2
note() { echo "pytest-selftest: $*"; }
. "$src"/scripts/gpu/lib/preamble.sh && probe_debs_env "$src" && probe_wheels "$src"
probe_machine
echo "$(probe_versions)"
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
  || { note "python3 has no torch with CUDA"; exit 2; }
python3 -c 'import diffusers, pytest' 2>/dev/null \
  || { note "python3 lacks diffusers or pytest ($(python3 -c 'import diffusers, pytest' 2>&1 | tail -1)); put their wheels in .whl/"; exit 2; }
gen=; command -v ninja >/dev/null && gen="-G Ninja"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$build" $gen -DPROBE_REQUIRE_CRITERION=OFF -DPROBE_BUILD_TESTS=OFF -DPROBE_CUDA=ON \
    > "$out/cmake.log" 2>&1 || { note "cmake configure failed (see $out/cmake.log)"; tail -20 "$out/cmake.log"; exit 2; }
fi
cmake --build "$build" -j "$(nproc)" --target probe probe_cuda probe_share >> "$out/cmake.log" 2>&1 \
  || { note "build failed (see $out/cmake.log)"; tail -30 "$out/cmake.log"; exit 2; }
[ -f "$build/lib/libprobe_cuda.so" ] || { note "no $build/lib/libprobe_cuda.so (configured without CUDA?)"; exit 2; }
export PROBE_BUILD_DIR=$build
fail=0

PYTHONUNBUFFERED=1 python3 "$src/tests/gpu/check_pairing_cuda.py" 2>&1 | tee "$out/check_pairing_cuda.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 2 ] && { note "check_pairing_cuda could not run"; exit 2; }
[ "$rc" -eq 0 ] || fail=1

stats=$out/pair-stats.jsonl
rm -f "$stats"
( cd "$out" && PROBE_PAIR_DEVICE=cuda PROBE_PAIR_STATS=$stats PROBE_PAIR_REPEAT=1 PYTHONUNBUFFERED=1 \
    python3 -m pytest "$src/tests/pytest/test_wan_parity.py" -v -s -p no:cacheprovider \
    --junitxml "$out/junit.xml" ) > "$out/pytest.log" 2>&1
rc=$?
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E " "$out/pytest.log" | tail -40
[ "$rc" -eq 0 ] || { echo "FAIL pytest tests/pytest/test_wan_parity.py exited $rc (log: $out/pytest.log)"; fail=1; }

python3 - "$stats" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if sys.argv[1] and __import__("os").path.exists(sys.argv[1]) else []
print("measured statistics (%d slots; reference vs candidate, per pair):" % len(rows))
hdr = ("test", "component", "feature", "slot", "dtypes", "rel_l2", "cosine", "max_abs", "p99_abs",
       "chan_z", "gain_z", "oracle_ratio", "floor", "verdict")
print("  ".join(hdr))
for r in rows:
    t = r["test"].split("::", 1)[-1]
    floor = ("identical" if r.get("floor_identical") else "rel_l2 %.3g" % r["floor_rel_l2"]) \
        if "floor_identical" in r else "-"
    print("  ".join([t, r["component"], r["feature"], r["slot"], "%s/%s" % (r["dtype"], r["dtype_candidate"]),
                     "%.4g" % r["rel_l2"], "%.9f" % r["cosine"], "%.4g" % r["max_abs"], "%.4g" % r["p99_abs"],
                     "%.3g" % r.get("channel_z_max", float("nan")), "%.3g" % r["gain_z"],
                     ("%.4g (limit %.4g; gate alone: %s)" % (r["oracle"]["ratio"], r["oracle"]["limit"],
                                                            r["gate_verdict"])) if "oracle" in r else "-",
                     floor,
                     r["verdict"] + ("" if r["verdict"] == "pass" else " (%s)" % "; ".join(r["reasons"]))]))
print("arch: %s" % sorted({r["arch"] for r in rows}))
EOF

if [ $fail -eq 0 ]; then
  echo "pytest-selftest: PASS (logs in $out)"
  exit 0
fi
echo "pytest-selftest: FAIL (logs in $out)"
exit 1
