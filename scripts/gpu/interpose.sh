#!/usr/bin/env bash
# Library-call interception and parallel captures on the GPU machine
# (docs/evidence/), run from the repo root with .debs and .whl carried:
#   bash scripts/gpu/interpose.sh [SECTION...]
# Sections (default: all that apply; "parallel" and "nccl" need 2 GPUs):
#   checks    scripts/gpu/gemm.py and kernel_log.py under probe-run
#   wan       the diffusers Wan pipeline (tiny config, bf16) with GEMM capture
#             on the first DiT block (--scope dit.block=WanTransformerBlock.forward)
#             then probe-oracle on it; and the kernel log of SDPA math vs flash
#             (probe-compare --kernels, then interpose.py kernel-diff)
#   last      the same Wan run with --capture 'dit.block/*/gemm.last.*' (the last
#             GEMM of every DiT block): interpose.py last, then probe-oracle
#   bench     bench/interpose_overhead and bench/launch_overhead, if built
#   nccl      scripts/gpu/nccl.sh (torchrun, 2 ranks) and
#             scripts/gpu/rankset.sh (probe-compare over those rank sets)
#   parallel  scripts/gpu/parallel.sh (2-way sequence-parallel block vs 1 GPU)
# Everything is logged under $OUT/interpose (default ./gpu-out/interpose); the
# summary table is printed last. Exit 0 when every section passed.
set -uo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-build}
LOG=$OUT/interpose
mkdir -p "$LOG"
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(checks wan last bench nccl parallel)
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
. scripts/gpu/lib/preamble.sh && probe_debs_env .
probe_wheels . "$PY"
{
  echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1) x $ngpu; $(date -u +%FT%TZ)"
  probe_versions "$PY"
} | tee "$LOG/summary.txt"
if [ ! -x "$BUILD/bin/probe-run" ]; then
  echo "building probe into $BUILD"
  probe_build "$BUILD" "$LOG/build.log" "$PY" ||
    { tail -30 "$LOG/build.log"; exit 2; }
fi
BIN=$(cd "$BUILD/bin" && pwd)
results=()
record() { results+=("$1: $2"); echo "== $1: $2" | tee -a "$LOG/summary.txt"; }
run_section() { # NAME COMMAND... : run, log, record pass/fail by exit status
  local name=$1; shift
  echo "== $name: $*" >> "$LOG/summary.txt"
  "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  tail -40 "$LOG/$name.log"
  if [ $rc -eq 0 ]; then record "$name" "PASS"; else record "$name" "FAIL (exit $rc)"; fi
}
want() { local s; for s in "${sections[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

if want checks; then
  [ -f scripts/gpu/gemm.py ] && run_section gemm_check "$PY" scripts/gpu/gemm.py --build-dir "$BUILD"
  [ -f scripts/gpu/kernel_log.py ] && run_section kernels_check "$PY" scripts/gpu/kernel_log.py --build "$BUILD"
  [ -f scripts/gpu/oracle.sh ] && run_section oracle_selftest bash scripts/gpu/oracle.sh --build-dir "$BUILD"
fi

if want wan; then
  W=$LOG/wan
  mkdir -p "$W"
  wan=(scripts/gpu/lib/wan_run.py --config tiny --dtype bf16 --steps 4 --no-time)
  # GEMM capture on the first DiT block of the first DiT call; all component I/O too
  run_section wan_gemm_capture "$BIN/probe-run" --force --out "$W/gemm.h5" --label gemm \
    --scope dit.block=WanTransformerBlock.forward --capture '*' --capture 'dit.block/0000/gemm.*' \
    -- "$PY" "${wan[@]}" --attn math --out "$W/video_gemm.npy"
  run_section wan_oracle "$BIN/probe-oracle" "$W/gemm.h5" --json "$W/oracle.json"
  # kernel log: SDPA math vs flash (same weights, same inputs), with a scope
  # around each attention call (the processor: projections, norms, RoPE, SDPA)
  scopes=(--scope dit.block=WanTransformerBlock.forward --scope dit.attn=WanAttnProcessor.__call__)
  run_section wan_math "$BIN/probe-run" --force --out "$W/math.h5" --label math \
    "${scopes[@]}" -- "$PY" "${wan[@]}" --attn math
  run_section wan_flash "$BIN/probe-run" --force --out "$W/flash.h5" --label flash \
    "${scopes[@]}" -- "$PY" "${wan[@]}" --attn flash
  "$BIN/probe-compare" "$W/math.h5" "$W/flash.h5" --gate T1 --kernels --json "$W/math_flash.json" \
    > "$LOG/wan_kernels.log" 2>&1
  echo "probe-compare math vs flash: exit $?" >> "$LOG/wan_kernels.log"
  "$PY" scripts/gpu/interpose.py kernel-diff "$W/math_flash.json" --scope dit.attn >> "$LOG/wan_kernels.log" 2>&1
  krc=$?
  tail -60 "$LOG/wan_kernels.log"
  if [ $krc -eq 0 ]; then record wan_kernels PASS; else record wan_kernels "FAIL (exit $krc)"; fi
fi

if want last; then
  W=$LOG/wan
  mkdir -p "$W"
  run_section wan_last_capture "$BIN/probe-run" --force --out "$W/last.h5" --label last \
    --scope dit.block=WanTransformerBlock.forward --capture 'dit.block/*/gemm.last.*' \
    -- "$PY" scripts/gpu/lib/wan_run.py --config tiny --dtype bf16 --steps 4 --no-time --attn math \
    --out "$W/video_last.npy"
  run_section wan_last_check "$PY" scripts/gpu/interpose.py last "$W/last.h5" --component dit.block
  run_section wan_last_oracle "$BIN/probe-oracle" "$W/last.h5" --json "$W/last_oracle.json"
fi

if want bench; then
  # CPU-side costs on this machine's CPU (fake libraries: the hook's cost alone)
  run_section bench_interpose_overhead bash bench/interpose_overhead.sh "$BUILD"
  B=$(mktemp -d)
  cc -shared -fPIC -O2 -std=c11 -D_GNU_SOURCE -Wl,-soname,libcudart.so.13 -o "$B/libcudart.so.13" \
    tests/fakes/mock_cudart.c -lpthread &&
    cc -shared -fPIC -O2 -std=c11 -D_GNU_SOURCE -Wl,-soname,libcuda.so.1 \
      -o "$B/libcuda.so.1" tests/fakes/fake_libcuda.c -lpthread &&
    cc -O2 -std=c11 -D_GNU_SOURCE -o "$B/launch_overhead" bench/launch_overhead.c -ldl -lpthread &&
    run_section bench_launch_overhead "$BIN/probe-run" --force --out "$B/lo.h5" -- \
      "$B/launch_overhead" "$B/libcudart.so.13" "$B/libcuda.so.1"
fi

# PROBE_SHARE_GPU=1: both ranks on GPU 0 of a one-GPU host (nccl.py and
# sp_block.py give each rank its own NCCL_HOSTID, so NCCL joins them with its
# socket transport on loopback); the probe side is the same, the transport is not
if [ "$ngpu" -ge 2 ] || [ "${PROBE_SHARE_GPU:-0}" = 1 ]; then
  [ "$ngpu" -ge 2 ] || echo "nccl/parallel: PROBE_SHARE_GPU=1, 2 ranks on 1 GPU" | tee -a "$LOG/summary.txt"
  want nccl && [ -f scripts/gpu/nccl.sh ] && run_section nccl_check bash scripts/gpu/nccl.sh
  want nccl && [ -f scripts/gpu/rankset.sh ] && run_section rankset_check bash scripts/gpu/rankset.sh
  want parallel && [ -f scripts/gpu/parallel.sh ] && run_section parallel_check bash scripts/gpu/parallel.sh
else
  { want nccl || want parallel; } && record "nccl/parallel" "not run: $ngpu GPU(s)"
fi

echo "---- summary ($(date -u +%FT%TZ))" | tee -a "$LOG/summary.txt"
bad=0
for r in "${results[@]}"; do echo "$r" | tee -a "$LOG/summary.txt"; case $r in *FAIL*) bad=1 ;; esac; done
exit $bad
