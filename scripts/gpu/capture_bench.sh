#!/usr/bin/env bash
# GPU capture benchmark and observer-effect proof (docs/observer.md), run on
# the device machine from the repo root (about 6-8 minutes on one H200):
#   bash scripts/gpu/capture_bench.sh
# bench/capture_wan.py on the diffusers Wan pipeline at the Wan2.1-T2V-1.3B
# transformer configuration (random bf16 weights), 480 x 832, 33 frames,
# 8 steps, CFG 5.0: interleaved processes A (no probe), B (probe capturing
# nothing), C (probe capturing all component I/O), D (forward hooks + .cpu()
# + torch.save), 3 rounds after a warm-up. Prints the table (B/A, C/A, C/D,
# captured bytes, stall estimate vs bytes / 40 GB/s, video identical in
# A, B, C) and writes $OUT/capture_wan.json, $OUT/capture_wan.txt and
# $OUT/capture-bench-logs.tar.gz (every run's log).
# Uses probe from ./build (built here when build/bin/probe-run is missing,
# with the jansson/xxhash headers from ./.debs), diffusers from ./.whl (pip
# --target /tmp/site), python3 from PATH (/opt/torch/.venv/bin on the GPU
# machine). PYTHON, BUILD (build folder) and BENCH_ARGS (extra
# bench/capture_wan.py arguments, e.g. "--steps 10 --reps 4", or for a dry
# run without a GPU "--device cpu --config tiny --height 32 --width 32
# --frames 5 --steps 2 --reps 1 --threads 2") may be set.
set -uo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-build}
WORK=$(mktemp -d /tmp/probe-capture-bench.XXXX)
mkdir -p "$OUT"
. scripts/gpu/lib/preamble.sh && probe_debs_env .
probe_wheels . "$PY"
{
  probe_machine
  probe_versions "$PY"
} | tee "$WORK/capture_wan.txt"
if [ ! -x "$BUILD/bin/probe-run" ]; then
  echo "building probe into $BUILD" | tee -a "$WORK/capture_wan.txt"
  probe_build "$BUILD" "$WORK/build.log" "$PY" ||
    { tail -20 "$WORK/build.log"; cp "$WORK/build.log" "$OUT/"; exit 1; }
fi
mkdir -p "$WORK/logs"
# shellcheck disable=SC2086
"$PY" bench/capture_wan.py --build-dir "$BUILD" --python "$(command -v "$PY")" --out "$WORK" \
  --logs "$WORK/logs" --scratch /tmp ${BENCH_ARGS:-} 2>&1 | tee -a "$WORK/capture_wan.txt"
rc=${PIPESTATUS[0]}
cp "$WORK/capture_wan.txt" "$WORK/capture_wan.json" "$OUT/" 2>/dev/null
tar czf "$OUT/capture-bench-logs.tar.gz" -C "$WORK" logs
echo "capture-bench: exit $rc; results in $OUT"
exit "$rc"
