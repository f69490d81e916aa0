#!/usr/bin/env bash
# Packaging: `cmake --install` into a fresh prefix; a tiny outside C project
# finds libprobe once through the CMake package config
# (find_package(probe CONFIG) -> probe::probe) and once through pkg-config
# (probe.pc), writes a capture with probe_writer_open/put, reads it back,
# compares it against itself and computes metrics; both binaries run against
# the prefix's libprobe and print the values computed independently here.
set -u
fails=0; checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }
py=${PROBE_PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/probe-packaging.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

cmake --install "$PROBE_BUILD_DIR" --prefix "$work/prefix" >"$work/install.log" 2>&1 && ok ||
    fail "cmake --install failed: $(tail -3 "$work/install.log")"
p=$work/prefix
version=$(sed -n 's/^project(probe VERSION \([0-9.]*\).*/\1/p' "$PROBE_SOURCE_DIR/CMakeLists.txt")
[ -n "$version" ] && ok || fail "cannot read the project version from CMakeLists.txt"

cfg=$(find "$p" -name probeConfig.cmake | head -1)
pc=$(find "$p" -name probe.pc | head -1)
[ -n "$cfg" ] && ok || fail "probeConfig.cmake not installed"
[ -n "$pc" ] && ok || fail "probe.pc not installed"
[ -n "$(find "$p" -name probeConfigVersion.cmake)" ] && ok || fail "probeConfigVersion.cmake not installed"
libdir=$(dirname "$(find "$p" -name 'libprobe.so' | head -1)")
[ -e "$libdir/libprobe.so" ] && ok || fail "libprobe.so (development link) not installed"

# The exported target must not drag libprobe's private dependencies into a
# consumer's link (the public headers include none of theirs).
targets=$(dirname "$cfg")/probeTargets.cmake
if grep -Eqi 'jansson|xxhash|hdf5' "$targets"; then
    fail "probeTargets.cmake names a private dependency: $(grep -Ei 'jansson|xxhash|hdf5' "$targets")"
else ok; fi
grep -q 'probe::probe' "$targets" && ok || fail "probeTargets.cmake does not define probe::probe"
if grep -rEq 'jansson\.h|hdf5\.h|xxhash\.h' "$p/include/probe"; then
    fail "a public header includes a private dependency's header"
else ok; fi

# --- the outside project ---
mkdir -p "$work/consumer"
cat >"$work/consumer/main.c" <<'C'
#include <math.h>
#include <stdio.h>
#include "probe/capture.h"
#include "probe/compare.h"

static int die(const char *what, probe_status s)
{
    fprintf(stderr, "consumer: %s: %s (%s)\n", what, probe_last_error(), probe_status_str(s));
    return 2;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    const char *path = argv[1];
    probe_writer *w;
    probe_status s = probe_writer_open(path, "{\"tool\":\"consumer\"}", &w);
    if (s) return die("open", s);
    float a[6] = {1.5f, -2.0f, 3.25f, 4.0f, 0.5f, -6.0f};
    int64_t shape[2] = {2, 3};
    probe_record rec = {.path = "/dit.step/0000/out", .component = "dit.step", .slot = "out",
                        .call = 0, .step = 0, .cfg_branch = -1, .timestep = NAN, .scope = "",
                        .device = "cpu", .seq = 0, .dtype = PROBE_DTYPE_FLOAT32, .rank = 2,
                        .shape = shape};
    if ((s = probe_writer_put(w, &rec, a, sizeof a))) return die("put", s);
    if ((s = probe_writer_close(w))) return die("close", s);

    probe_file *f;
    if ((s = probe_file_open(path, &f))) return die("file_open", s);
    const probe_tensor_info *t = probe_file_tensor(f, 0);
    double v[6], sum = 0;
    if ((s = probe_file_read_f64(f, 0, v))) return die("read", s);
    for (int i = 0; i < 6; i++) sum += v[i];
    printf("read %zu %s %s %lldx%lld sum=%.17g\n", probe_file_count(f), t->path,
           probe_dtype_name(t->dtype), (long long)t->shape[0], (long long)t->shape[1], sum);
    probe_file_close(f);

    probe_compare_opts o = {0};
    if ((s = probe_gate_parse("T1", &o.gate))) return die("gate", s);
    probe_compare_result *r;
    if ((s = probe_compare_files(path, path, &o, &r))) return die("compare", s);
    printf("self %zu compared=%d identical=%d active=%d rel_l2=%.17g cosine=%.17g\n",
           r->ntensors, r->tensors[0].compared, r->tensors[0].m.identical, r->feature_active,
           r->tensors[0].m.rel_l2, r->tensors[0].m.cosine);
    probe_compare_result_free(r);

    double c[6];
    for (int i = 0; i < 6; i++) c[i] = v[i];
    c[5] = -5.0;
    probe_metrics m;
    probe_metrics_opts mo = {1e-3, 1e-3};
    if ((s = probe_metrics_compute(v, c, 6, &mo, &m))) return die("metrics", s);
    printf("metrics rel_l2=%.17g max_abs=%.17g mismatch=%llu\n", m.rel_l2, m.max_abs,
           (unsigned long long)m.mismatch_count);
    return 0;
}
C
cat >"$work/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(probe_consumer C)
find_package(probe CONFIG REQUIRED)
message(STATUS "probe_VERSION=${probe_VERSION}")
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE probe::probe)
CM

# Expected output, computed here (fp64): sum of the values; rel_l2 of
# changing -6 to -5 = 1/||a||; max_abs 1; one mismatching element.
expected=$("$py" - <<'PY'
import math
a = [1.5, -2.0, 3.25, 4.0, 0.5, -6.0]
print("read 1 /dit.step/0000/out float32 2x3 sum=%.17g" % sum(a))
print("self 1 compared=1 identical=1 active=0 rel_l2=0 cosine=1")
print("metrics rel_l2=%.17g max_abs=1 mismatch=1" % (1.0 / math.sqrt(sum(x * x for x in a))))
PY
)

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
# A sanitizer build's libprobe (PROBE_SANITIZE=ON) needs the consumer built
# with the same flags: an uninstrumented program with the ASan runtime only
# preloaded deadlocks at exit in libp11-kit's finalizer (pulled in by HDF5's
# libcurl). An ordinary build's libprobe does not need libasan.
san=()
readelf -d "$libdir/libprobe.so" 2>/dev/null | grep -q 'NEEDED.*libasan' &&
    san=(-fsanitize=address,undefined -fno-omit-frame-pointer)
# 1) CMake package config
if cmake -S "$work/consumer" -B "$work/consumer/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$p" \
        -DCMAKE_C_FLAGS="${san[*]}" >"$work/cmake.log" 2>&1 && cmake --build "$work/consumer/build" >>"$work/cmake.log" 2>&1; then
    ok
    grep -q "probe_VERSION=$version" "$work/cmake.log" && ok ||
        fail "find_package(probe) did not set probe_VERSION=$version"
    out=$(timeout 120 "$work/consumer/build/consumer" "$work/cm.h5" 2>&1)
    [ "$out" = "$expected" ] && ok || fail "CMake-built consumer printed:
$out
expected:
$expected"
    lib=$(ldd "$work/consumer/build/consumer" | awk '/libprobe\.so/ {print $3}')
    [ "$(readlink -f "$lib")" = "$(readlink -f "$libdir/libprobe.so")" ] && ok ||
        fail "CMake-built consumer loads $lib, not the prefix's libprobe"
else
    fail "CMake consumer did not configure/build: $(tail -15 "$work/cmake.log")"
fi

# A version the package does not provide is refused by probeConfigVersion.cmake.
sed 's/find_package(probe CONFIG REQUIRED)/find_package(probe 99.0 CONFIG REQUIRED)/' \
    "$work/consumer/CMakeLists.txt" >"$work/consumer/v.txt"
mkdir -p "$work/consumer99" && cp "$work/consumer/main.c" "$work/consumer99/" &&
    mv "$work/consumer/v.txt" "$work/consumer99/CMakeLists.txt"
if cmake -S "$work/consumer99" -B "$work/consumer99/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$p" \
        >"$work/cmake99.log" 2>&1; then
    fail "find_package(probe 99.0) succeeded against version $version"
else
    grep -q "$version" "$work/cmake99.log" && ok || fail "version refusal does not name $version"
fi

# 2) pkg-config, from a copy of the prefix elsewhere (probe.pc is relocatable)
cp -a "$p" "$work/moved"
mpc=$work/moved/${pc#"$p"/}
mlibdir=$work/moved/${libdir#"$p"/}
export PKG_CONFIG_PATH=$(dirname "$mpc")
[ "$(pkg-config --modversion probe)" = "$version" ] && ok ||
    fail "pkg-config --modversion probe: $(pkg-config --modversion probe 2>&1), expected $version"
flags=$(pkg-config --cflags --libs probe 2>&1)
case "$flags" in
    *"$work/moved"*) ok ;;
    *) fail "pkg-config flags do not point into the moved prefix: $flags" ;;
esac
# shellcheck disable=SC2046
if ${CC:-cc} -std=c11 "${san[@]}" -o "$work/consumer_pc" "$work/consumer/main.c" $(pkg-config --cflags --libs probe) \
        >"$work/cc.log" 2>&1; then
    ok
    out=$(LD_LIBRARY_PATH=$mlibdir timeout 120 "$work/consumer_pc" "$work/pc.h5" 2>&1)
    [ "$out" = "$expected" ] && ok || fail "pkg-config-built consumer printed:
$out
expected:
$expected"
    lib=$(LD_LIBRARY_PATH=$mlibdir ldd "$work/consumer_pc" | awk '/libprobe\.so/ {print $3}')
    [ "$(readlink -f "$lib")" = "$(readlink -f "$mlibdir/libprobe.so")" ] && ok ||
        fail "pkg-config-built consumer loads $lib, not the moved prefix's libprobe"
else
    fail "cc \$(pkg-config --cflags --libs probe) failed: $(tail -15 "$work/cc.log")"
fi

# The captures the consumers wrote are ordinary probe files: the installed
# probe-compare reads them and finds the same tensor, identical, in both
# (its exit status for identical files is the verdict's business, not ours;
# 2 would mean it could not read them).
if [ -e "$work/pc.h5" ] && [ -e "$work/cm.h5" ]; then
    "$p/bin/probe-compare" --json "$work/pc.json" "$work/pc.h5" "$work/cm.h5" >/dev/null 2>&1
    rc=$?
    [ "$rc" != 2 ] && ok || fail "installed probe-compare could not read the consumers' captures"
    "$py" - "$work/pc.json" <<'PY' && ok || fail "probe-compare JSON of the consumers' captures"
import json, sys
t = json.load(open(sys.argv[1]))["tensors"]
assert [x["path"] for x in t] == ["/dit.step/0000/out"], t
assert t[0]["identical"] is True and t[0]["shape"] == [2, 3] and t[0]["dtype"] == "float32", t[0]
PY
else
    fail "the consumers did not write their captures"
fi

echo "test_packaging: $checks checks passed, $fails failed"
[ "$fails" = 0 ]
