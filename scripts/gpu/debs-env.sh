# scripts/gpu/debs-env.sh - sourced by the GPU scripts (gpu-selftest,
# gpu/metrics-selftest, gpu/evidence.sh, gpu/isolation.sh):
#
#   . scripts/gpu/debs-env.sh; probe_debs_env SRC
#
# A bare GPU machine has the jansson and xxhash runtimes but not their
# headers. When SRC/.debs holds Debian packages of them (apt-get download
# libjansson-dev libxxhash-dev), they are unpacked into a private root, the
# development symlinks are pointed at the machine's runtimes, and
# PKG_CONFIG_PATH / PKG_CONFIG_SYSROOT_DIR are exported for CMake's
# pkg-config. Nothing happens when PKG_CONFIG_PATH is already set or there
# are no packages.
probe_debs_env() {
  local src=$1 root=/tmp/probe-debroot d l real libdir
  [ -z "${PKG_CONFIG_PATH:-}" ] || return 0
  ls "$src"/.debs/*.deb >/dev/null 2>&1 || return 0
  for d in "$src"/.debs/*.deb; do dpkg -x "$d" "$root"; done
  libdir=$root/usr/lib/x86_64-linux-gnu
  for l in jansson xxhash; do
    real=$(ls /usr/lib/x86_64-linux-gnu/lib$l.so.* 2>/dev/null | head -1)
    [ -n "$real" ] && ln -sf "$real" "$libdir/lib$l.so"
  done
  export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
}
