#!/usr/bin/env bash
# scripts/gpu/oracle.sh - probe-oracle's error bounds against real
# cuBLAS / cuBLASLt results (docs/oracle.md "On a GPU").
#
#   scripts/gpu/oracle.sh [--build-dir DIR] [--out DIR]
#
# Builds probe-oracle with CMake into build-gpu-oracle (or --build-dir;
# reused when it exists; headers a bare GPU machine lacks come from .debs/
# as in scripts/gpu-selftest), then runs tests/gpu/oracle_gpu.py with
# python3 (torch with CUDA, h5py): bf16 linear + bias, fp16, fp32 with TF32
# off and on, batched bf16 bmm, FP8 e4m3 torch._scaled_mm (with and without
# fast accumulation), and negative controls that must fail. One PASS/FAIL
# line each. Exit 0 all PASS, 1 a FAIL, 2 it could not build or run.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$src/build-gpu-oracle
out=
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "oracle-selftest: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out=$OUT/oracle-selftest; else out=$(mktemp -d /tmp/probe-oracle-selftest.XXXX); fi
fi
mkdir -p "$out" || exit 2
. "$src"/scripts/gpu/lib/preamble.sh && probe_debs_env "$src"
gen=; command -v ninja >/dev/null && gen="-G Ninja"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$build" $gen -DPROBE_REQUIRE_CRITERION=OFF -DPROBE_BUILD_TESTS=OFF > "$out/cmake.log" 2>&1 \
    || { echo "oracle-selftest: cmake configure failed (see $out/cmake.log)"; tail -20 "$out/cmake.log"; exit 2; }
fi
cmake --build "$build" -j "$(nproc)" --target probe-oracle >> "$out/cmake.log" 2>&1 \
  || { echo "oracle-selftest: build failed (see $out/cmake.log)"; tail -30 "$out/cmake.log"; exit 2; }
python3 "$src/tests/gpu/oracle_gpu.py" "$build/bin/probe-oracle" "$out" 2>&1 | tee "$out/oracle_gpu.log"
exit "${PIPESTATUS[0]}"
