#!/usr/bin/env bash
# probe-run's environment and default output path (docs/probe-run.md):
# PROBE_OUT (absolute), PROBE_LABEL, PROBE_CAPTURE (comma-joined),
# PROBE_TAPS (newline-joined), PROBE_COMPONENTS, PYTHONPATH and LD_PRELOAD
# (ours first, existing entries kept after), PROBE_ROOT_PID not inherited;
# default file $PROBE_SCRATCH | $SCRATCH/probe | $TMPDIR as <label or pid>.h5,
# announced once on stderr; probe-run works through a symlink.
set -u

: "${PROBE_BUILD_DIR:?PROBE_BUILD_DIR must name the build directory}"
RUN="$PROBE_BUILD_DIR/bin/probe-run"
work=$(mktemp -d "${TMPDIR:-/tmp}/probe-run-env.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
fails=0
checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
expect_eq() { # $1 what, $2 got, $3 want
    if [ "$2" = "$3" ]; then checks=$((checks + 1)); else fail "$1: got '$2', want '$3'"; fi
}
# value of VAR in an `env -0` dump (NUL-separated, so newlines survive)
envval() { tr '\0' '\n' <"$1" | awk -v k="$2=" 'BEGIN{n=length(k)} f&&/^[A-Za-z_][A-Za-z0-9_]*=/{exit} f{print;next} substr($0,1,n)==k{print substr($0,n+1);f=1}'; }
has_var() { tr '\0' '\n' <"$1" | grep -q "^$2="; }

share=$(cd "$PROBE_BUILD_DIR/share/probe" && pwd -P)
shim=$(cd "$PROBE_BUILD_DIR/lib" && pwd -P)/libprobe_intercept.so

# A sanitizer runtime preloaded by the caller (the ASan build of these tests)
# must stay first, ahead of the shim.
san=${LD_PRELOAD:-}

# --- every variable, relative --out made absolute ------------------------
mkdir -p "$work/cwd"
(
    cd "$work/cwd" &&
    PYTHONPATH=/x/one:/x/two LD_PRELOAD="${san:+$san:}libc.so.6" PROBE_ROOT_PID=1 \
    "$RUN" --out rel.h5 --label "run A" --capture '/dit.step/*' --capture='*/out' \
        --tap 'text_encoder=mymod:Thing.run' --tap='vae.decode=*Dec.decode' -- env -0 >"$work/env1" 2>"$work/err1"
)
expect_eq "exit status" $? 0
expect_eq "stderr with --out" "$(cat "$work/err1")" ""
expect_eq PROBE_OUT "$(envval "$work/env1" PROBE_OUT)" "$work/cwd/rel.h5"
expect_eq PROBE_LABEL "$(envval "$work/env1" PROBE_LABEL)" "run A"
expect_eq PROBE_CAPTURE "$(envval "$work/env1" PROBE_CAPTURE)" '/dit.step/*,*/out'
expect_eq PROBE_TAPS "$(envval "$work/env1" PROBE_TAPS)" "$(printf 'text_encoder=mymod:Thing.run\nvae.decode=*Dec.decode')"
expect_eq PROBE_COMPONENTS "$(cd "$(dirname "$(envval "$work/env1" PROBE_COMPONENTS)")" && pwd -P)" "$share"
expect_eq "PYTHONPATH" "$(envval "$work/env1" PYTHONPATH | sed "s|^[^:]*|X|")" "X:/x/one:/x/two"
expect_eq "PYTHONPATH first" "$(cd "$(envval "$work/env1" PYTHONPATH | cut -d: -f1)" && pwd -P)" "$share/python"
pre=$(envval "$work/env1" LD_PRELOAD)
if [ -n "$san" ]; then
    expect_eq "LD_PRELOAD sanitizer runtime first" "$(echo "$pre" | cut -d: -f1)" "$san"
    pre=$(echo "$pre" | cut -d: -f2-)
fi
expect_eq "LD_PRELOAD rest" "$(echo "$pre" | cut -d: -f2-)" "libc.so.6"
expect_eq "LD_PRELOAD first" "$(readlink -f "$(echo "$pre" | cut -d: -f1)")" "$(readlink -f "$shim")"
# The shim's constructor may set PROBE_ROOT_PID for the command itself; the
# stale value from probe-run's caller must never arrive.
[ "$(envval "$work/env1" PROBE_ROOT_PID)" != 1 ] && checks=$((checks + 1)) ||
    fail "PROBE_ROOT_PID=1 from the caller reached the command"

# --- without options: no stale variables from the caller ------------------
env -u PYTHONPATH PROBE_LABEL=stale PROBE_CAPTURE=stale PROBE_TAPS=stale "$RUN" --out "$work/e2.h5" -- env -0 >"$work/env2"
has_var "$work/env2" PROBE_LABEL && fail "stale PROBE_LABEL kept" || checks=$((checks + 1))
has_var "$work/env2" PROBE_CAPTURE && fail "stale PROBE_CAPTURE kept" || checks=$((checks + 1))
has_var "$work/env2" PROBE_TAPS && fail "stale PROBE_TAPS kept" || checks=$((checks + 1))
expect_eq "PYTHONPATH alone" "$(cd "$(envval "$work/env2" PYTHONPATH)" && pwd -P)" "$share/python"

# --- default output path ---------------------------------------------------
# $PROBE_SCRATCH wins, file named after the label (sanitised), announced once.
mkdir -p "$work/ps"
PROBE_SCRATCH="$work/ps" SCRATCH="$work/s" TMPDIR="$work/t" \
    "$RUN" --label 'lab/el 1' -- sh -c 'printf "%s" "$PROBE_OUT"' >"$work/o3" 2>"$work/e3"
expect_eq "PROBE_SCRATCH path" "$(cat "$work/o3")" "$work/ps/lab_el_1.h5"
expect_eq "announcement" "$(cat "$work/e3")" "probe-run: capture file: $work/ps/lab_el_1.h5"
# (--force: the first run left its capture there, with run_end)
expect_eq "label kept verbatim" "$(PROBE_SCRATCH="$work/ps" "$RUN" --force --label 'lab/el 1' -- sh -c 'printf "%s" "$PROBE_LABEL"' 2>/dev/null)" "lab/el 1"

# $SCRATCH/probe (created) when PROBE_SCRATCH is unset; no label: <pid>.h5
# where pid is probe-run's own pid (it execs probe-run-wait, the command's parent).
mkdir -p "$work/s"
env -u PROBE_SCRATCH SCRATCH="$work/s" TMPDIR="$work/t" \
    "$RUN" -- sh -c 'printf "%s %s" "$PROBE_OUT" "$PPID"' >"$work/o4" 2>"$work/e4"
read -r path4 pid4 <"$work/o4"
expect_eq "SCRATCH path" "$path4" "$work/s/probe/$pid4.h5"
expect_eq "SCRATCH announcement" "$(cat "$work/e4")" "probe-run: capture file: $work/s/probe/$pid4.h5"

# TMPDIR when neither is set.
mkdir -p "$work/t"
env -u PROBE_SCRATCH -u SCRATCH TMPDIR="$work/t" \
    "$RUN" --label x -- sh -c 'printf "%s" "$PROBE_OUT"' >"$work/o5" 2>/dev/null
expect_eq "TMPDIR path" "$(cat "$work/o5")" "$work/t/x.h5"

# An uncreatable scratch directory is an option error (exit 2, not run).
touch "$work/afile"
PROBE_SCRATCH="$work/afile/sub" "$RUN" -- touch "$work/marker6" 2>"$work/e6"
rc=$?
expect_eq "bad scratch exit" "$rc" 2
[ ! -e "$work/marker6" ] && grep -qF "$work/afile/sub" "$work/e6" && checks=$((checks + 1)) ||
    fail "bad scratch: command ran or message does not name the directory: $(cat "$work/e6")"

# --- through a symlink to probe-run (e.g. ~/bin/probe-run) ---------------
ln -s "$RUN" "$work/probe-run-link"
"$work/probe-run-link" --out "$work/l.h5" -- env -0 >"$work/env7"
expect_eq "symlink: PROBE_COMPONENTS" "$(cd "$(dirname "$(envval "$work/env7" PROBE_COMPONENTS)")" && pwd -P)" "$share"

# --- the capture file is written where PROBE_OUT says -----------------------
"$RUN" --out "$work/written.h5" -- true
[ -s "$work/written.h5" ] && checks=$((checks + 1)) || fail "no capture file at --out after a run of 'true'"

echo "test_probe_run_env: $checks checks passed, $fails failed"
[ "$fails" = 0 ]
