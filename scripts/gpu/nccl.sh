#!/usr/bin/env bash
# GPU check of NCCL interposition and per-rank capture files (docs/nccl.md),
# run on a host with 2 GPUs from the repo root (about a minute):
#   bash scripts/gpu/nccl.sh
# torchrun --nproc_per_node 2 scripts/gpu/nccl.py (NCCL backend) runs
# once without probe and once under
#   probe-run --out on.h5 --capture '*nccl*' --shard '/nccl/*/all_gather.out=0'
# Each rank makes all_reduce (in place), all_gather_into_tensor (bf16),
# reduce_scatter_tensor, broadcast, send/recv, batch_isend_irecv (a group)
# and all_to_all_single, and saves what torch passed and returned;
# nccl.py verify then checks, per rank, that on.rank<R>.h5 holds every
# op's in/out bit-exact, the manifest's rank/world_size/"nccl", that on.h5 is
# the index of the rank files, and that the results equal the run without
# probe. Output: PASS/FAIL/INFO lines on stdout and in $OUT/nccl-check.txt,
# logs in $OUT/nccl-check-logs.tar.gz. Uses probe from ./build (built when
# build/bin/probe-run is missing), python3 and torchrun from PATH (PYTHON,
# TORCHRUN and BUILD may be set).
set -uo pipefail
PY=${PYTHON:-python3}
TORCHRUN=${TORCHRUN:-torchrun}
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-build}
WORK=$(mktemp -d /tmp/probe-nccl-check.XXXX)
W=$WORK/logs
mkdir -p "$OUT" "$W" "$WORK/plain" "$WORK/probe"
REPORT=$WORK/nccl-check.txt
log() { echo "== $*" | tee -a "$REPORT"; }
. scripts/gpu/lib/preamble.sh && probe_debs_env .
log "$(probe_machine 2)"
log "torch $("$PY" -c 'import torch;print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())' 2>&1 | tail -1)"
if [ ! -x "$BUILD/bin/probe-run" ]; then
  log "building probe into $BUILD"
  probe_build "$BUILD" "$W/build.log" "$PY" ||
    { tail -20 "$W/build.log"; tar czf "$OUT/nccl-check-logs.tar.gz" -C "$WORK" logs; exit 1; }
fi
B=$PWD/$BUILD/bin
[ -x "$B/probe-run" ] || B=$BUILD/bin
rc=0
TR=("$TORCHRUN" --nproc_per_node 2 --master_port 29533)

timeout 300 "${TR[@]}" scripts/gpu/nccl.py run "$WORK/plain" > "$W/plain.log" 2>&1
log "no probe: exit $? $(grep -c 'ops done' "$W/plain.log") ranks done"
timeout 300 "$B/probe-run" --out "$WORK/on.h5" --label nccl --capture '*nccl*' \
  --shard '/nccl/*/all_gather.out=0' -- "${TR[@]}" scripts/gpu/nccl.py run "$WORK/probe" \
  > "$W/probe.log" 2>&1
log "probe-run: exit $? $(grep -c 'ops done' "$W/probe.log") ranks done; $(grep -c '^probe:' "$W/probe.log") probe: lines"
grep '^probe:' "$W/probe.log" | head -5 | tee -a "$REPORT"
"$PY" scripts/gpu/nccl.py verify "$WORK/probe" "$WORK/on.h5" "$WORK/plain" 2>&1 | tee -a "$REPORT"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

log "nccl-check: exit $rc"
cp "$REPORT" "$OUT/"
cp "$WORK"/on*.h5 "$OUT/" 2>/dev/null
tar czf "$OUT/nccl-check-logs.tar.gz" -C "$WORK" logs
exit $rc
