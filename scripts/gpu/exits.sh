#!/usr/bin/env bash
# Abnormal exits with device tensors on the GPU (scripts/gpu/exits.py): builds probe
# if needed, then runs the check. Run from the repository root on the GPU machine; ./.debs
# holds the jansson/xxhash headers' packages when the machine lacks them.
# Results: $OUT/exits.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
. scripts/gpu/lib/preamble.sh && probe_debs_env .
if [ ! -x build-gpu/bin/probe-run ]; then
  probe_build build-gpu "$OUT/build.log" || { echo "build failed"; exit 2; }
fi
{ probe_machine
  probe_torch python3
  python3 scripts/gpu/exits.py "$PWD/build-gpu" /tmp/probe-exits "${EXITS_STEPS:-60}"
  echo "exits_check: exit $?"; } 2>&1 | tee "$OUT/exits.txt"
