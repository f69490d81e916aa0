#!/usr/bin/env bash
# The 16-family capture test (tests/e2e/test_families.py) on the GPU: every tiny
# diffusers pipeline moved to CUDA in PROBE_FAMILIES_DTYPE (default bfloat16), run once
# with forward hooks and once under probe-run; the captured tensors (device copies on
# probe's stream) must be bit-identical to the hooks' copies, the outputs unchanged and
# every call's class and module path right. Run from the repository root on the GPU
# machine; ./.whl holds the diffusers (and importlib_metadata, zipp) wheels, ./.debs the
# jansson/xxhash headers' packages when the machine lacks them. Results: $OUT/summary.txt
# and $OUT/families.log.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
. scripts/gpu/lib/preamble.sh && probe_debs_env .
probe_wheels . python3
log "$(probe_machine)"
log "$(probe_versions python3)"
if [ ! -x build-gpu/bin/probe-run ]; then
  probe_build build-gpu "$OUT/build.log"
  log "build: exit $?"
fi
export PROBE_FAMILIES_DEVICE=${PROBE_FAMILIES_DEVICE:-cuda} PROBE_FAMILIES_DTYPE=${PROBE_FAMILIES_DTYPE:-bfloat16}
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PROBE_FAMILIES_IN_VENV=1 PROBE_BUILD_DIR=$PWD/build-gpu
t0=$(date +%s)
timeout 500 python3 tests/e2e/test_families.py > "$OUT/families.log" 2>&1
log "test_families on $PROBE_FAMILIES_DEVICE in $PROBE_FAMILIES_DTYPE: exit $? ($(( $(date +%s) - t0 )) s)"
tail -25 "$OUT/families.log" | tee -a "$OUT/summary.txt"
