#!/usr/bin/env bash
# Abnormal exits with device tensors on the GPU (scripts/gpu/exits_check.py): builds probe
# if needed, then runs the check. Run from the repository root on the GPU machine; ./.debs
# holds the jansson/xxhash headers' packages when the machine lacks them.
# Results: $OUT/exits.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
. scripts/gpu/debs-env.sh && probe_debs_env .
if [ ! -x build-gpu/bin/probe-run ]; then
  cmake -S . -B build-gpu -G Ninja -DPROBE_REQUIRE_CRITERION=OFF -DPROBE_PYTHON="$(command -v python3)" \
    > "$OUT/build.log" 2>&1 && cmake --build build-gpu >> "$OUT/build.log" 2>&1 || { echo "build failed"; exit 2; }
fi
{ echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(date -u +%FT%TZ)"
  echo "torch $(python3 -c 'import torch;print(torch.__version__, torch.version.cuda)')"
  python3 scripts/gpu/exits_check.py "$PWD/build-gpu" /tmp/probe-exits "${EXITS_STEPS:-60}"
  echo "exits_check: exit $?"; } 2>&1 | tee "$OUT/exits.txt"
