# scripts/gpu/lib/preamble.sh - the shared preamble of the GPU checks, sourced
# by every check in scripts/gpu/ and by scripts/gpu-selftest:
#
#   . scripts/gpu/lib/preamble.sh && probe_debs_env .
#
# probe_debs_env SRC: a bare GPU machine has the jansson and xxhash runtimes
# but not their headers. When SRC/.debs holds Debian packages of them
# (apt-get download libjansson-dev libxxhash-dev), they are unpacked into a
# private root, the development symlinks are pointed at the machine's
# runtimes, and PKG_CONFIG_PATH / PKG_CONFIG_SYSROOT_DIR are exported for
# CMake's pkg-config. Nothing happens when PKG_CONFIG_PATH is already set or
# there are no packages.
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

# probe_wheels SRC [PYTHON]: when SRC/.whl holds wheels (the diffusers and
# importlib_metadata/zipp wheels a bare GPU machine lacks), install them without
# their dependencies into /tmp/site with PYTHON (default python3) and put
# /tmp/site first on PYTHONPATH. Nothing happens when there are none.
probe_wheels() {
  local src=$1 py=${2:-python3}
  ls "$src"/.whl/*.whl >/dev/null 2>&1 || return 0
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$src"/.whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
}

# probe_build BUILD LOG [PYTHON]: configure (Ninja, no Criterion, PROBE_PYTHON =
# PYTHON, default python3) and build probe from the current folder into BUILD,
# with CMake's output in LOG; returns the build's exit status.
probe_build() {
  local build=$1 log=$2 py=${3:-python3}
  cmake -S . -B "$build" -G Ninja -DPROBE_REQUIRE_CRITERION=OFF -DPROBE_PYTHON="$(command -v "$py")" \
    > "$log" 2>&1 && cmake --build "$build" >> "$log" 2>&1
}

# probe_machine [N]: "machine: NAME, DRIVER; DATE" for the first N GPUs (default 1).
probe_machine() {
  echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
    head -"${1:-1}" | paste -sd' '); $(date -u +%FT%TZ)"
}

# probe_torch [PYTHON]: "torch VERSION CUDA" of PYTHON (default python3).
probe_torch() {
  echo "torch $("${1:-python3}" -c 'import torch;print(torch.__version__, torch.version.cuda)' 2>&1 | tail -1)"
}

# probe_versions [PYTHON]: "torch VERSION CUDA; diffusers VERSION" of PYTHON.
probe_versions() {
  echo "$(probe_torch "${1:-python3}"); diffusers $("${1:-python3}" -c 'import diffusers;print(diffusers.__version__)' 2>&1 | tail -1)"
}
