#!/usr/bin/env bash
# The lossy mutation study on the GPU (docs/mutation.md "Lossy features"): builds
# probe, runs bench/mutation/study.py --lossy on the diffusers Wan pipeline in
# bfloat16 on CUDA with the DiT blocks captured, and prints per tensor path the
# feature's own per-channel z and what each planted bug changes
# (scripts/gpu/lossy_channels.py). Run from the repository root on the GPU machine;
# ./.whl and ./.debs as for scripts/gpu/mutation.sh. Results under $OUT/lossy/.
#   LOSSY_FEATURES  comma-separated (default fp8-storage)
#   LOSSY_ARGS      study.py arguments (default: 256x256, 17 frames, 4 steps, 4 blocks,
#                   3 calibration and 3 unseen seeds)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/lossy"
WORK=$(mktemp -d /tmp/probe-lossy.XXXX)
. scripts/gpu/lib/preamble.sh && probe_debs_env .
probe_wheels . python3
echo "== $(probe_machine)"
echo "== $(probe_versions python3)"
probe_build build-gpu "$WORK/build.log" || { tail -30 "$WORK/build.log"; exit 1; }
features=${LOSSY_FEATURES:-fp8-storage}
args=${LOSSY_ARGS:---size 256 --frames 17 --steps 4 --layers 4 --calib-seeds 3 --test-seeds 3}
t0=$(date +%s)
# shellcheck disable=SC2086
python3 bench/mutation/study.py --python python3 --bin build-gpu/bin --device cuda --blocks \
    --jobs 4 --quick --lossy "$features" $args --out "$WORK/study" > "$OUT/lossy/study.log" 2>&1
echo "== study: exit $? ($(( $(date +%s) - t0 )) s)"
cp "$WORK/study/lossy.json" "$WORK/study/lossy.md" "$OUT/lossy/" 2>/dev/null
for f in ${features//,/ }; do
  cp "$WORK/study/lossy/$f/calibration.json" "$OUT/lossy/calibration-$f.json" 2>/dev/null
  python3 scripts/gpu/lossy_channels.py "$WORK/study/lossy" "$f" > "$OUT/lossy/channels-$f.txt" 2>&1
done
sed -n '/^Summary/,$p' "$OUT/lossy/study.log"
cat "$OUT"/lossy/channels-*.txt
