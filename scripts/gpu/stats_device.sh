#!/usr/bin/env bash
# Stats-only capture with the summaries made on the GPU (docs/probe-run.md
# "Stats-only capture"), checked on a real diffusers Wan pipeline and timed.
# Run from the repository root on the GPU machine (./.debs and ./.whl as for
# scripts/gpu/capture_bench.sh):
#   bash scripts/gpu/stats_device.sh [--check-only] [--time-only]
# Runs of scripts/gpu/lib/wan_run.py (Wan2.1-1.3B transformer shape, random
# bf16 weights, CFG; STATS_ARGS sets the size, default 480x832, 33 frames,
# 4 steps; STATS_CONFIG and STATS_DEVICE a dry run, e.g. tiny and cpu), each a separate process, with --scope dit.block=WanTransformerBlock.forward:
#   full   probe-run capturing 'dit.block/*/gemm.*.out@step=0@branch=0' in full;
#   dev    the same paths --stats-only (device summaries, the default);
#   host   the same --stats-only with PROBE_DEVICE_SUMMARY=0 (staging copy,
#          host summary: the path before device summaries);
#   plain  no probe, and every   stats-only of every GEMM output of every
#          block, step and CFG branch ('dit.block/*/gemm.*.out'), for the
#          time ratio every/plain.
# The checks (exit 1 when one fails):
#   - probe-compare full.h5 dev.h5 --expect-identical and host.h5 dev.h5
#     --expect-identical exit 0 (identity by tree hash);
#   - every record of dev.h5 equals host.h5's in every summary field, bit for
#     bit, and in probe.tree_hash; dev.h5's records carry no probe.hash;
#   - dev.h5's manifest device_summary.tensors is the record count,
#     host_fallbacks 0; host.h5 made none on the device;
#   - the decoded video is the same in every run.
# Results and logs under $OUT/stats-device/.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
out=$OUT/stats-device
mkdir -p "$out"
WORK=$(mktemp -d /tmp/probe-stats-device.XXXX)
check=1
timing=1
case ${1:-} in
  --check-only) timing=0 ;;
  --time-only) check=0 ;;
  "") ;;
  *) echo "stats-device: unknown argument $1" >&2; exit 2 ;;
esac
. scripts/gpu/lib/preamble.sh && probe_debs_env .
probe_wheels . python3
echo "== $(probe_machine)"
echo "== $(probe_versions python3)"
BUILD=${BUILD:-build}
if [ ! -x "$BUILD/bin/probe-run" ] || [ ! -f "$BUILD/lib/libprobe_cuda.so" ]; then
  probe_build "$BUILD" "$WORK/build.log" python3 || { tail -30 "$WORK/build.log"; exit 2; }
fi
[ -f "$BUILD/lib/libprobe_cuda.so" ] || { echo "stats-device: $BUILD/lib/libprobe_cuda.so was not built"; exit 2; }
# shellcheck disable=SC2206
size=(${STATS_ARGS:---height 480 --width 832 --frames 33 --steps 4})
wan=(python3 scripts/gpu/lib/wan_run.py --config "${STATS_CONFIG:-wan2.1-1.3b}" --dtype bf16
     --device "${STATS_DEVICE:-cuda}" "${size[@]}"
     --seed 1 --deterministic --attn default --no-time)
scope=(--scope dit.block=WanTransformerBlock.forward)
sel='dit.block/*/gemm.*.out@step=0@branch=0'
every='dit.block/*/gemm.*.out'
fail=0
run() { # NAME REPEAT [ENV=V...] -- probe-run args (or "plain")
  local name=$1 rep=$2; shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local cmd=("${wan[@]}" --repeat "$rep" --json "$WORK/$name.json")
  if [ "${1:-}" != plain ]; then
    cmd=("$BUILD/bin/probe-run" --out "$WORK/$name.h5" --label "$name" "${scope[@]}" "$@" -- "${cmd[@]}")
  fi
  local t0; t0=$(date +%s.%N)
  env "${envs[@]}" "${cmd[@]}" > "$out/$name.log" 2>&1
  local rc=$?
  printf '== %-6s exit %d, %.1f s process; %s\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" \
    "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("pipeline %.3f s (calls %s), drain %s s" % (d["pipeline_s"], " ".join("%.3f" % t for t in d["pipeline_s_all"]), d.get("flush_s")))' "$WORK/$name.json" 2>/dev/null)"
  [ $rc -eq 0 ] || { tail -20 "$out/$name.log"; fail=1; }
}
if [ $check = 1 ]; then
  run full 1 -- --capture "$sel"
  run dev 1 -- --capture "$sel" --stats-only
  run host 1 PROBE_DEVICE_SUMMARY=0 -- --capture "$sel" --stats-only
  for pair in "full dev" "host dev"; do
    set -- $pair
    "$BUILD/bin/probe-compare" "$WORK/$1.h5" "$WORK/$2.h5" --expect-identical > "$out/compare-$1-$2.txt" 2>&1
    rc=$?
    echo "== probe-compare $1.h5 $2.h5 --expect-identical: exit $rc"
    [ $rc -eq 0 ] || { tail -15 "$out/compare-$1-$2.txt"; fail=1; }
  done
  python3 - "$WORK" > "$out/records.txt" 2>&1 <<'EOF'
import json, sys, h5py
work = sys.argv[1]
def records(name):
    recs = {}
    with h5py.File("%s/%s.h5" % (work, name), "r") as f:
        man = json.loads(f.attrs["probe.manifest"])
        def visit(path, obj):
            if isinstance(obj, h5py.Dataset) and obj.dtype.names:
                recs[path] = (obj[()].tobytes(), obj.attrs.get("probe.tree_hash"),
                              obj.attrs.get("probe.hash"))
        f.visititems(visit)
    return recs, man
dev, mdev = records("dev")
host, mhost = records("host")
bad = []
if not dev or set(dev) != set(host):
    bad.append("record sets differ: dev %d, host %d" % (len(dev), len(host)))
for p in sorted(set(dev) & set(host)):
    d, h = dev[p], host[p]
    if d[0] != h[0]:
        bad.append("%s: summary fields differ" % p)
    if d[1] is None or d[1] != h[1]:
        bad.append("%s: tree hash %s (dev) vs %s (host)" % (p, d[1], h[1]))
    if d[2] is not None:
        bad.append("%s: a device record carries probe.hash" % p)
ds = mdev.get("device_summary", {})
if ds.get("tensors") != len(dev) or ds.get("host_fallbacks") != 0:
    bad.append("dev manifest device_summary %s, %d records" % (ds, len(dev)))
hs = mhost.get("device_summary", {})
if hs.get("tensors", 0) != 0:
    bad.append("host manifest device_summary %s" % hs)
print("records: dev %d, host %d; dev device_summary %s; host device_summary %s; host staging %s"
      % (len(dev), len(host), ds, hs, {k: mhost.get("staging", {}).get(k) for k in ("copied_bytes", "waits", "wait_s")}))
for b in bad[:20]:
    print("MISMATCH " + b)
print("records equal: %s" % (not bad))
sys.exit(1 if bad else 0)
EOF
  rc=$?
  cat "$out/records.txt"
  [ $rc -eq 0 ] || fail=1
fi
if [ $timing = 1 ]; then
  run plain 2 -- plain
  run every 2 -- --capture "$every" --stats-only
  run plain2 2 -- plain
  python3 - "$WORK" <<'EOF' | tee "$out/timing.txt"
import json, sys, h5py
w = sys.argv[1]
t = {n: json.load(open("%s/%s.json" % (w, n)))["pipeline_s"] for n in ("plain", "every", "plain2")}
with h5py.File(w + "/every.h5", "r") as f:
    man = json.loads(f.attrs["probe.manifest"])
base = min(t["plain"], t["plain2"])
print("pipeline s (second call): plain %.3f / %.3f, stats-only every GEMM output %.3f; every/plain %.4f (goal <= 1.05)"
      % (t["plain"], t["plain2"], t["every"], t["every"] / base))
print("every: device_summary %s, staging %s" % (man.get("device_summary"), man.get("staging")))
EOF
fi
for n in full dev host plain every plain2; do
  [ -f "$WORK/$n.json" ] && python3 -c 'import json,sys; print(sys.argv[2], json.load(open(sys.argv[1]))["video_sha256"])' "$WORK/$n.json" "$n"
done > "$out/videos.txt"
nv=$(awk '{print $2}' "$out/videos.txt" | sort -u | wc -l)
echo "== decoded video: $nv distinct over $(wc -l < "$out/videos.txt") runs"
[ "$nv" -le 1 ] || { cat "$out/videos.txt"; fail=1; }
echo "stats-device: exit $fail"
exit $fail
