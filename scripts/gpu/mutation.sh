#!/usr/bin/env bash
# The mutation study on the GPU (docs/mutation.md): builds probe, runs the device
# metrics self-test, then bench/mutation/study.py on the diffusers Wan pipeline in
# bfloat16 on CUDA with the DiT blocks captured. Run from the repository root on the
# GPU machine; ./.whl holds the diffusers (and importlib_metadata) wheels, ./.debs the
# jansson/xxhash headers' packages when the machine lacks them. Results:
# $OUT/study.md, $OUT/study.json, $OUT/summary.txt and $OUT/logs.tar.gz.
#   STUDY_ARGS   extra study.py arguments (e.g. --quick)
#   STUDY_JOBS   candidate runs at a time (default 6)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/probe-study.XXXX)
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
. scripts/gpu/lib/preamble.sh && probe_debs_env .
probe_wheels . python3
log "$(probe_machine)"
log "$(probe_versions python3)"
t0=$(date +%s)
probe_build build-gpu "$WORK/build.log"
log "build: exit $? ($(( $(date +%s) - t0 )) s)"
if [ -f scripts/gpu/metrics.sh ]; then
  bash scripts/gpu/metrics.sh --quick --build-dir "$PWD/build-gpu" --out "$WORK/ms" > "$WORK/metrics-selftest.log" 2>&1
  log "metrics-selftest: exit $?"; grep -cE "^PASS" "$WORK/metrics-selftest.log" | sed 's/^/PASS lines: /' | tee -a "$OUT/summary.txt"
  grep -E "^FAIL" "$WORK/metrics-selftest.log" | head -20 | tee -a "$OUT/summary.txt"
fi
if [ -f tests/gpu/compare_device.py ]; then
  timeout 120 python3 tests/gpu/compare_device.py "$PWD/build-gpu" "$WORK/cmpdev" > "$WORK/compare-device.log" 2>&1
  log "compare_device (probe-compare --device cuda against the CPU): exit $?"
  grep -cE "^PASS" "$WORK/compare-device.log" | sed 's/^/PASS lines: /' | tee -a "$OUT/summary.txt"
  grep -E "^FAIL" "$WORK/compare-device.log" | head -10 | tee -a "$OUT/summary.txt"
fi
t0=$(date +%s)
python3 bench/mutation/study.py --python python3 --bin build-gpu/bin --device cuda --size 256 \
  --frames 17 --steps 4 --layers 4 --blocks --jobs "${STUDY_JOBS:-6}" --out "$WORK/study" \
  ${STUDY_ARGS:-} > "$WORK/study.log" 2>&1
log "study: exit $? ($(( $(date +%s) - t0 )) s)"
cp "$WORK/study/study.md" "$WORK/study/study.json" "$OUT/" 2>/dev/null
gzip -c "$WORK/study/details.json" > "$OUT/details.json.gz" 2>/dev/null
tail -30 "$WORK/study.log" >> "$OUT/summary.txt"
rm -f "$WORK"/study/*.h5 "$WORK"/study/*.json
tar -C "$WORK" -czf "$OUT/logs.tar.gz" . 2>/dev/null
log "done"
