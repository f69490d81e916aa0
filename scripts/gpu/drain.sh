#!/usr/bin/env bash
# How fast the capture writer drains device tensors into a file, on the GPU
# machine (docs/intercept.md "PROBE_HASH_THREAD", bench/README.md). Run from
# the repository root (./.debs as for the other checks):
#   bash scripts/gpu/drain.sh
# 1. bench/writer_drain.c into /dev/shm (tmpfs) and /tmp (the disk's page
#    cache): the writer's streamed put with the hash inline and beside and
#    with 2, 4 and 8 raw files (probe_writer_set_raw_files), against one
#    thread's pwrite of the same bytes, in one run each;
# 2. bench/staging_throughput.py (2 GiB of bf16 tensors through the preloaded
#    shim into tmpfs) with PROBE_HASH_THREAD=0, with the default, and with
#    PROBE_RAW_FILES=4 and 8: the writer's drain after the last tap, end to end;
# 3. dd into both, with fdatasync (the file systems' own write rates).
# Results under $OUT/drain/.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
out=$OUT/drain
mkdir -p "$out"
. scripts/gpu/lib/preamble.sh && probe_debs_env .
echo "== $(probe_machine)"
echo "== $(probe_torch python3)"
echo "== $(nproc) cores, kernel $(uname -r)"
BUILD=${BUILD:-build}
if [ ! -x "$BUILD/bin/probe-run" ]; then
  probe_build "$BUILD" "$out/build.log" python3 || { tail -30 "$out/build.log"; exit 2; }
fi
cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -I/tmp/probe-debroot/usr/include -o "$out/writer_drain" \
  bench/writer_drain.c -L"$BUILD/lib" -lprobe -Wl,-rpath,"$PWD/$BUILD/lib" ||
  { echo "== writer_drain does not build"; exit 2; }
rc=0
for d in /dev/shm /tmp; do
  echo "== $(findmnt -no FSTYPE,SOURCE --target "$d" | head -1) at $d"
  "$out/writer_drain" "$d" 2 256 64 2>&1 | tee "$out/writer_drain$(echo "$d" | tr / _).txt" || rc=1
done
for ht in 0 1; do
  echo "== staging_throughput, PROBE_HASH_THREAD=$ht"
  PROBE_HASH_THREAD=$ht python3 bench/staging_throughput.py --shim "$BUILD/lib/libprobe_intercept.so" \
    --mib 256 --count 8 --reps 3 --json "$out/staging_ht$ht.json" 2>&1 | tee "$out/staging_ht$ht.txt" || rc=1
done
for rf in 4 8; do
  echo "== staging_throughput, PROBE_RAW_FILES=$rf"
  PROBE_RAW_FILES=$rf python3 bench/staging_throughput.py --shim "$BUILD/lib/libprobe_intercept.so" \
    --mib 256 --count 8 --reps 3 --json "$out/staging_raw$rf.json" 2>&1 | tee "$out/staging_raw$rf.txt" || rc=1
done
for d in /dev/shm /tmp; do
  echo "== dd into $d (conv=fdatasync)"
  dd if=/dev/zero of="$d/probe-dd.$$" bs=64M count=32 conv=fdatasync 2>&1 | tail -1
  rm -f "$d/probe-dd.$$"
done
echo "== drain: exit $rc"
exit $rc
