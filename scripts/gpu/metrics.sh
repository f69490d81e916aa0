#!/usr/bin/env bash
# scripts/gpu/metrics.sh - libprobe_cuda (probe/device.h) on a real GPU.
#
#   scripts/gpu/metrics.sh [--quick] [--bench] [--sanitize] [--build-dir DIR] [--out DIR]
#
# 1. Builds libprobe, libprobe_cuda and tests/gpu/check_device_metrics with
#    CMake into build-gpu-metrics (or --build-dir; reused when it exists).
#    Headers a bare GPU machine lacks (jansson, xxhash) are taken from .debs/
#    as in scripts/gpu-selftest.
# 2. Runs check_device_metrics: the GPU path against the CPU path on many
#    cases (PASS/FAIL line each; --quick: smaller large cases).
# 3. --bench: builds bench/gpu_metrics.cu with nvcc and runs it (2^28
#    bfloat16 pairs: each pass timed; BENCH_GROUPS="4 32" also times the fused
#    pass with other tile sizes), then bench/gpu_metrics_torch.py (torch
#    baseline, same tensors through ctypes) when python3 has torch with CUDA.
# 4. --sanitize: check_device_metrics --small under compute-sanitizer
#    (memcheck, then racecheck), when it is installed.
# Exit 0 when every check passed, 1 when one failed, 2 when it could not
# build or run. Logs go to --out (default $OUT/metrics-selftest when OUT is
# set, else a new temporary folder).
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$src/build-gpu-metrics
out=
quick=
bench=0
sanitize=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=--quick; shift ;;
    --bench) bench=1; shift ;;
    --sanitize) sanitize=1; shift ;;
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "metrics-selftest: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out=$OUT/metrics-selftest; else out=$(mktemp -d /tmp/probe-metrics-selftest.XXXX); fi
fi
mkdir -p "$out" || exit 2
note() { echo "metrics-selftest: $*"; }
. "$src"/scripts/gpu/lib/preamble.sh && probe_debs_env "$src"
gen=; command -v ninja >/dev/null && gen="-G Ninja"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$build" $gen -DPROBE_REQUIRE_CRITERION=OFF -DPROBE_CUDA=ON > "$out/cmake.log" 2>&1 \
    || { note "cmake configure failed (see $out/cmake.log)"; tail -20 "$out/cmake.log"; exit 2; }
fi
cmake --build "$build" -j "$(nproc)" --target probe probe_cuda check_device_metrics >> "$out/cmake.log" 2>&1 \
  || { note "build failed (see $out/cmake.log)"; tail -30 "$out/cmake.log"; exit 2; }
fail=0
"$build/tests/check_device_metrics" $quick > "$out/check_device_metrics.log" 2>&1
rc=$?
cat "$out/check_device_metrics.log"
[ $rc -eq 0 ] || { echo "FAIL check_device_metrics exited $rc"; fail=1; }

if [ $bench = 1 ]; then
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$nvcc" -O3 -arch="${NVCC_ARCH:-sm_90}" -std=c++17 -I"$src/include" -o "$out/gpu_metrics" \
    "$src/bench/gpu_metrics.cu" -L"$build/lib" -lprobe -Xlinker -rpath="$build/lib" > "$out/nvcc.log" 2>&1 \
    || { note "nvcc bench failed"; cat "$out/nvcc.log"; exit 2; }
  "$out/gpu_metrics" 2>&1 | tee "$out/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL bench/gpu_metrics"; fail=1; }
  # the fused pass with other tile sizes (BENCH_GROUPS="4 8 32")
  for g in ${BENCH_GROUPS:-}; do
    "$nvcc" -O3 -arch="${NVCC_ARCH:-sm_90}" -std=c++17 -DPROBE_CUDA_GROUPS=$g -I"$src/include" \
      -o "/tmp/gpu_metrics_g$g" "$src/bench/gpu_metrics.cu" -L"$build/lib" -lprobe -Xlinker -rpath="$build/lib" \
      && "/tmp/gpu_metrics_g$g" $((1 << 28)) fused 2>&1 | grep -E "GROUPS|fused|tile" | tee -a "$out/bench.log"
  done
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PYTHONUNBUFFERED=1 python3 "$src/bench/gpu_metrics_torch.py" "$build/lib" 2>&1 | tee "$out/bench_torch.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL bench/gpu_metrics_torch.py"; fail=1; }
  else
    note "SKIP torch baseline: python3 has no torch with CUDA"
  fi
fi
if [ $sanitize = 1 ]; then
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -n "$cs" ]; then
    for tool in memcheck racecheck; do
      timeout "${SANITIZE_TIMEOUT:-120}" "$cs" --tool $tool --error-exitcode 9 \
        "$build/tests/check_device_metrics" --small > "$out/sanitize-$tool.txt" 2>&1
      rc=$?
      tail -3 "$out/sanitize-$tool.txt"
      if [ $rc -eq 0 ]; then echo "PASS compute-sanitizer $tool (check_device_metrics --small)"
      elif [ $rc -eq 124 ]; then echo "metrics-selftest: compute-sanitizer $tool timed out (not a result)"
      else echo "FAIL compute-sanitizer $tool exited $rc"; fail=1; fi
    done
  else
    note "SKIP compute-sanitizer: not installed"
  fi
fi
n_pass=$(cat "$out"/*.log | grep -c '^PASS' || true)
n_fail=$(cat "$out"/*.log | grep -c '^FAIL' || true)
if [ $fail -eq 0 ]; then
  echo "metrics-selftest: PASS ($n_pass checks; logs in $out)"
  exit 0
fi
echo "metrics-selftest: FAIL ($n_fail failed, $n_pass passed; logs in $out)"
exit 1
