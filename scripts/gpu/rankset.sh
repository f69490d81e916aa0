#!/usr/bin/env bash
# GPU check of probe-compare over rank sets (docs/nccl.md "Comparing rank
# sets"), on a host with 2 GPUs, from the repo root (about a minute):
#   bash scripts/gpu/rankset.sh
# Runs scripts/gpu/nccl.py (torchrun, 2 ranks, NCCL backend: all_reduce,
# all_gather, reduce_scatter, broadcast, send/recv, all_to_all) twice under
#   probe-run --out A.h5|B.h5 --capture '*nccl*'
# and then checks with probe-compare:
#  1. the 2-rank run A against the 2-rank run B (--reference-rank A's files,
#     B's index file): compared rank by rank, every collective operand of
#     each rank present on both sides and bit-identical (--expect-identical),
#     no collective output differing across ranks (real NCCL all_gather /
#     all_reduce / broadcast outputs are equal on every rank);
#  2. B with rank 1's all_gather output changed in one element (h5py): the
#     run fails and collective_divergence names that path on rank 1;
#  3. A's rank 0 file alone against B's index: B is joined; its collectives
#     have no counterpart: listed per rank under collectives_unmatched, not
#     missing.
# Output: PASS/FAIL lines on stdout and in $OUT/rankset-check.txt, logs in
# $OUT/rankset-check-logs.tar.gz. Uses probe from ./build (built when
# build/bin/probe-run is missing), python3 (with h5py) and torchrun from PATH
# (PYTHON, TORCHRUN and BUILD may be set; RUNS=DIR takes the two runs' captures
# a.h5, a.rank*.h5, b.h5, b.rank*.h5 from DIR instead of running them).
set -uo pipefail
PY=${PYTHON:-python3}
TORCHRUN=${TORCHRUN:-torchrun}
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-build}
WORK=$(mktemp -d /tmp/probe-rankset-check.XXXX)
W=$WORK/logs
mkdir -p "$OUT" "$W" "$WORK/a" "$WORK/b"
REPORT=$WORK/rankset-check.txt
log() { echo "== $*" | tee -a "$REPORT"; }
say() { echo "$1 $2" | tee -a "$REPORT"; [ "$1" = PASS ] || rc=1; }
. scripts/gpu/lib/preamble.sh && probe_debs_env .
log "$(probe_machine 2)"
if [ ! -x "$BUILD/bin/probe-run" ]; then
  log "building probe into $BUILD"
  probe_build "$BUILD" "$W/build.log" "$PY" ||
    { tail -20 "$W/build.log"; tar czf "$OUT/rankset-check-logs.tar.gz" -C "$WORK" logs; exit 1; }
fi
B=$PWD/$BUILD/bin
[ -x "$B/probe-run" ] || B=$BUILD/bin
rc=0
TR=("$TORCHRUN" --nproc_per_node 2 --master_port 29534)

for run in a b; do
  if [ -n "${RUNS:-}" ]; then  # captures made elsewhere: RUNS holds a.h5 a.rank*.h5 b.h5 b.rank*.h5
    cp "$RUNS/$run".h5 "$RUNS/$run".rank*.h5 "$WORK/" && say PASS "run $run: captures from $RUNS"
    continue
  fi
  timeout 300 "$B/probe-run" --out "$WORK/$run.h5" --label "rankset-$run" --capture '*nccl*' \
    -- "${TR[@]}" scripts/gpu/nccl.py run "$WORK/$run" > "$W/$run.log" 2>&1
  e=$?
  [ $e = 0 ] && [ -f "$WORK/$run.rank0.h5" ] && [ -f "$WORK/$run.rank1.h5" ] && [ -f "$WORK/$run.h5" ]
  say "$([ $? = 0 ] && echo PASS || echo FAIL)" "run $run under probe-run: exit $e, rank files and index"
done

# 1. rank set against rank set, rank by rank
"$B/probe-compare" --quiet --expect-identical --json "$WORK/ab.json" \
  --reference-rank "$WORK/a.rank0.h5" --reference-rank "$WORK/a.rank1.h5" "$WORK/b.h5" \
  > "$W/ab.txt" 2>&1
e=$?
say "$([ $e = 0 ] && echo PASS || echo FAIL)" "A vs B rank by rank, --expect-identical: exit $e ($(tail -1 "$W/ab.txt"))"
"$PY" - "$WORK/ab.json" <<'EOF' 2>&1 | tee -a "$REPORT"
import json, sys
j = json.load(open(sys.argv[1]))
t = j["tensors"]
per = {r: [x for x in t if x.get("rank") == r] for r in (0, 1)}
ops = sorted({x["path"].split("/")[-1].split(".")[0] for x in t})
ok = (j["rank_sets"]["per_rank"] is True and per[0] and per[1] and len(per[0]) + len(per[1]) == len(t)
      and all(x["identical"] for x in t) and j["collective_divergence"] == []
      and j["missing_in_candidate"] == [] and j["missing_in_reference"] == []
      and {"all_gather", "all_reduce", "broadcast"} <= set(ops))
print("%s per rank: %d + %d collective operands compared, ops %s, all identical, no divergence" % (
    "PASS" if ok else "FAIL", len(per[0]), len(per[1]), ops))
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

# 2. rank 1's all_gather output changed in one element
cp "$WORK/b.rank0.h5" "$WORK/c.rank0.h5"
cp "$WORK/b.rank1.h5" "$WORK/c.rank1.h5"
AG=$("$PY" - "$WORK/c.rank1.h5" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    paths = []
    f.visititems(lambda n, o: paths.append("/" + n) if isinstance(o, h5py.Dataset) else None)
    p = sorted(x for x in paths if x.endswith("all_gather.out"))[0]
    d = f[p]
    raw = d[...].view(np.uint8).copy() if d.dtype.kind != "f" else None
    if raw is None:
        a = d[...]
        a.flat[0] += 1
        d[...] = a
    else:  # bfloat16 stored as a 2-byte float type: flip one mantissa bit
        raw.flat[0] ^= 1
        d.id.write(h5py.h5s.ALL, h5py.h5s.ALL, raw)
    for k in [k for k in d.attrs if k == "probe.hash"]:
        del d.attrs[k]
print(p)
EOF
)
"$B/probe-compare" --quiet --json "$WORK/c.json" "$WORK/a.rank0.h5" "$WORK/c.rank0.h5" "$WORK/c.rank1.h5" \
  > "$W/c.txt" 2>&1
e=$?
"$PY" - "$WORK/c.json" "$AG" "$e" <<'EOF' 2>&1 | tee -a "$REPORT"
import json, sys
j = json.load(open(sys.argv[1]))
d = j.get("collective_divergence")
ok = sys.argv[3] == "1" and d == [{"side": "candidate", "path": sys.argv[2], "ranks": [1]}]
print("%s changed %s on rank 1: exit %s, collective_divergence %s" % ("PASS" if ok else "FAIL", sys.argv[2], sys.argv[3], d))
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

# 3. one file against a rank set: collectives unmatched, not missing
"$B/probe-compare" --quiet --json "$WORK/ob.json" "$WORK/a.rank0.h5" "$WORK/b.h5" > "$W/ob.txt" 2>&1
"$PY" - "$WORK/ob.json" <<'EOF' 2>&1 | tee -a "$REPORT"
import json, sys
j = json.load(open(sys.argv[1]))
cu = j.get("collectives_unmatched") or []
ok = ([c["rank"] for c in cu] == [0, 1] and all(c["count"] > 0 for c in cu)
      and j["missing_in_reference"] == [] and not any("nccl" in t["path"] for t in j["tensors"]))
print("%s one file vs rank set: collectives_unmatched %s, none missing in reference" % ("PASS" if ok else "FAIL", cu))
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

log "rankset-check: exit $rc"
cp "$REPORT" "$OUT/"
cp "$WORK"/*.json "$OUT/" 2>/dev/null
tar czf "$OUT/rankset-check-logs.tar.gz" -C "$WORK" logs
exit $rc
