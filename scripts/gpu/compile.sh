#!/usr/bin/env bash
# GPU check of capture under CUDA graphs (docs/observer.md), run on the
# device machine from the repo root (a few minutes; most of it torch.compile):
#   bash scripts/gpu/compile.sh
# 1. torch.compile(mode="reduce-overhead"): the diffusers Wan pipeline
#    (scripts/gpu/lib/wan_run.py, tiny configuration, bf16, 256 x 256, 17 frames,
#    4 steps) with its transformer compiled, once without probe and once
#    under probe-run with a forward hook that clones the transformer's output
#    right after each call (--clone-dit). Checked (compile.py
#    verify-compile): every /dit.step/NNNN/out.0 is bit-identical to clone
#    NNNN or is in probe.skips with a reason; the videos are identical.
# 2. torch.cuda.graph: a small module tapped as dit.step, captured manually
#    into a CUDA graph and replayed 8 times, without and under probe-run;
#    compile.py verify-graph reports what the capture file holds
#    (datasets and which call or replay they equal, skips, replays without
#    a dataset) and whether the replays' outputs are identical.
# Output: the report on stdout and in $OUT/compile-check.txt, logs in
# $OUT/compile-check-logs.tar.gz. Uses probe from ./build (built when
# build/bin/probe-run is missing; jansson/xxhash headers from ./.debs),
# diffusers from ./.whl, python3 from PATH. PYTHON, BUILD and WAN_ARGS (extra
# wan_run.py arguments, e.g. "--config wan2.1-1.3b --height 480 --width 832
# --frames 33") may be set.
set -uo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-build}
WORK=$(mktemp -d /tmp/probe-compile-check.XXXX)
W=$WORK/logs
mkdir -p "$OUT" "$W"
REPORT=$WORK/compile-check.txt
log() { echo "== $*" | tee -a "$REPORT"; }
. scripts/gpu/lib/preamble.sh && probe_debs_env .
probe_wheels . "$PY"
log "$(probe_machine)"
log "$(probe_versions "$PY")"
if [ ! -x "$BUILD/bin/probe-run" ]; then
  log "building probe into $BUILD"
  probe_build "$BUILD" "$W/build.log" "$PY" ||
    { tail -20 "$W/build.log"; tar czf "$OUT/compile-check-logs.tar.gz" -C "$WORK" logs; exit 1; }
fi
B=$PWD/$BUILD/bin
[ -x "$B/probe-run" ] || B=$BUILD/bin
rc=0
# shellcheck disable=SC2206
WAN=(--dtype bf16 --steps 4 --frames 17 --size 256 --deterministic --compile reduce-overhead
     --no-time ${WAN_ARGS:-})

timeout 600 "$PY" scripts/gpu/lib/wan_run.py "${WAN[@]}" --json "$W/plain.json" > "$W/plain.log" 2>&1
log "compile, no probe: exit $? $(grep wan_run: "$W/plain.log")"
timeout 600 "$B/probe-run" --out "$WORK/compile.h5" --label compile -- \
  "$PY" scripts/gpu/lib/wan_run.py "${WAN[@]}" --clone-dit "$WORK/clones.pt" --json "$W/probe.json" \
  > "$W/probe.log" 2>&1
log "compile, probe-run: exit $? $(grep wan_run: "$W/probe.log"); $(grep -c '^probe:' "$W/probe.log") probe: lines"
grep '^probe:' "$W/probe.log" | head -5 | tee -a "$REPORT"
"$PY" scripts/gpu/compile.py verify-compile "$WORK/compile.h5" "$WORK/clones.pt" \
  "$W/plain.json" "$W/probe.json" 2>&1 | tee -a "$REPORT"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

timeout 300 "$PY" scripts/gpu/compile.py graph --out "$WORK/graph-plain.pt" > "$W/graph-plain.log" 2>&1
log "cuda graph, no probe: exit $? $(tail -1 "$W/graph-plain.log")"
timeout 300 "$B/probe-run" --out "$WORK/graph.h5" --label graph -- \
  "$PY" scripts/gpu/compile.py graph --out "$WORK/graph.pt" > "$W/graph.log" 2>&1
log "cuda graph, probe-run: exit $? $(tail -1 "$W/graph.log"); $(grep -c '^probe:' "$W/graph.log") probe: lines"
grep '^probe:' "$W/graph.log" | head -5 | tee -a "$REPORT"
"$PY" scripts/gpu/compile.py verify-graph "$WORK/graph.h5" "$WORK/graph.pt" "$WORK/graph-plain.pt" \
  2>&1 | tee -a "$REPORT"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

log "compile-check: exit $rc"
cp "$REPORT" "$OUT/"
tar czf "$OUT/compile-check-logs.tar.gz" -C "$WORK" logs
exit $rc
