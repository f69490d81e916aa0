#!/bin/sh
# bench/interpose_overhead.sh [BUILD_DIR] [CALLS]: build the fake cuBLAS
# and bench/interpose_overhead.c into a temporary directory and time
# cublasSgemm_v2 direct vs through the preloaded shim (nothing selected).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
calls=${2:-1000000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc=${CC:-cc}
$cc -shared -fPIC -O2 -std=c11 -D_GNU_SOURCE -I "$here/tests/gpu" -Wl,-soname,libcublas.so.13 \
    -o "$tmp/libcublas.so.13" "$here/tests/fakes/fake_cublas.c" -lm -ldl
$cc -O2 -std=c11 -o "$tmp/interpose_overhead" "$here/bench/interpose_overhead.c" -ldl
LD_PRELOAD="$build/lib/libprobe_intercept.so" PROBE_OUT="$tmp/cap.h5" \
    "$tmp/interpose_overhead" "$tmp/libcublas.so.13" "$calls"
