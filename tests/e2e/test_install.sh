#!/usr/bin/env bash
# `cmake --install` into a fresh prefix gives working tools: probe-run finds its
# library and adapter under the prefix, probe-compare loads the installed
# libprobe (RPATH $ORIGIN/../lib), and a capture made there compares clean.
set -u
fails=0; checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }
py=${PROBE_PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/probe-install.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

cmake --install "$PROBE_BUILD_DIR" --prefix "$work/prefix" >"$work/install.log" 2>&1 && ok ||
    fail "cmake --install failed: $(tail -3 "$work/install.log")"
p=$work/prefix
for f in bin/probe-run bin/probe-compare include/probe/tap.h include/probe/compare.h \
         share/probe/components.json share/probe/python/sitecustomize.py; do
    [ -e "$p/$f" ] && ok || fail "$f not installed"
done
lib=$(ldd "$p/bin/probe-compare" | awk '/libprobe\.so/ {print $3}')
[ "$(readlink -f "$lib")" = "$(readlink -f "$p"/lib*/libprobe.so.0* | head -1)" ] && ok ||
    fail "installed probe-compare loads $lib, not the prefix's libprobe"

cat >"$work/prog.py" <<'PY'
import torch
class InstallTextEncoder(torch.nn.Module):
    def forward(self, x):
        return x * 3
print(InstallTextEncoder()(torch.arange(4, dtype=torch.float32)).tolist())
PY
out=$(cd "$work" && "$p/bin/probe-run" --out "$work/c.h5" -- "$py" prog.py 2>"$work/run.err")
[ "$out" = "[0.0, 3.0, 6.0, 9.0]" ] && ok || fail "program output through the installed probe-run: $out $(cat "$work/run.err")"
"$p/bin/probe-compare" --expect-identical --json "$work/c.json" "$work/c.h5" "$work/c.h5" >/dev/null 2>&1 && ok ||
    fail "installed probe-compare on the installed capture"
grep -q '"/text_encoder/0000/out"' "$work/c.json" && ok || fail "the capture holds /text_encoder/0000/out"

echo "test_install: $checks checks passed, $fails failed"
[ "$fails" = 0 ]
