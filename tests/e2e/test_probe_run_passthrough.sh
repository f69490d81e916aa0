#!/usr/bin/env bash
# probe-run passes the command's stdout, stderr and exit status through
# unchanged (also death by a signal), and rejects bad options with exit 2 and
# one line naming the problem, without running the command.
#
# Needs PROBE_BUILD_DIR (set by tests/CMakeLists.txt): the build tree with
# bin/probe-run, lib/libprobe_intercept.so and share/probe/.
set -u

: "${PROBE_BUILD_DIR:?PROBE_BUILD_DIR must name the build directory}"
RUN="$PROBE_BUILD_DIR/bin/probe-run"
[ -x "$RUN" ] || { echo "FAIL: $RUN is not executable" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/probe-run-test.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
fails=0
checks=0

fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }

# --- pass-through: bytes and exit status --------------------------------------
cmd='printf "out line\n"; printf "err line\n" >&2; printf "no newline"; exit 7'
sh -c "$cmd" >"$work/ref.out" 2>"$work/ref.err"
ref_rc=$?
"$RUN" --out "$work/p1.h5" -- sh -c "$cmd" >"$work/run.out" 2>"$work/run.err"
rc=$?
[ "$ref_rc" = 7 ] || fail "reference run of the command exited $ref_rc, expected 7"
[ "$rc" = 7 ] && ok || fail "exit status $rc through probe-run, expected 7"
cmp -s "$work/ref.out" "$work/run.out" && ok || fail "stdout differs: $(od -c "$work/run.out" | head -3)"
cmp -s "$work/ref.err" "$work/run.err" && ok || fail "stderr differs: $(od -c "$work/run.err" | head -3)"

# Binary bytes (all 256 values) on stdout are passed through unchanged.
bin_cmd='i=0; while [ $i -lt 256 ]; do printf "\\$(printf %03o $i)"; i=$((i+1)); done'
sh -c "$bin_cmd" >"$work/bin.ref"
"$RUN" --out "$work/p2.h5" -- sh -c "$bin_cmd" >"$work/bin.run"
[ "$(wc -c <"$work/bin.ref")" = 256 ] || fail "reference binary output is not 256 bytes"
cmp -s "$work/bin.ref" "$work/bin.run" && ok || fail "binary stdout differs"

# Exit status 0 and the largest status 255.
"$RUN" --out "$work/p3.h5" -- sh -c 'exit 0'
rc=$?; [ "$rc" = 0 ] && ok || fail "exit 0 came back as $rc"
"$RUN" --out "$work/p4.h5" -- sh -c 'exit 255'
rc=$?; [ "$rc" = 255 ] && ok || fail "exit 255 came back as $rc"

# Death by SIGTERM: the waiting shell reports 128 + 15 = 143, as without
# probe-run. (An outer sh collects the status; its own stderr, which only
# carries its "Terminated" notice, is discarded.)
ref_rc=$(sh -c 'sh -c "kill -TERM \$\$"; echo $?' 2>/dev/null)
rc=$(sh -c '"$0" --out "$1" -- sh -c "kill -TERM \$\$"; echo $?' "$RUN" "$work/p5.h5" 2>/dev/null)
[ "$ref_rc" = 143 ] || fail "reference SIGTERM run gave $ref_rc, expected 143"
[ "$rc" = "$ref_rc" ] && ok || fail "SIGTERM through probe-run gave $rc, expected $ref_rc"

# SIGKILL as well (137).
rc=$(sh -c '"$0" --out "$1" -- sh -c "kill -KILL \$\$"; echo $?' "$RUN" "$work/p6.h5" 2>/dev/null)
[ "$rc" = 137 ] && ok || fail "SIGKILL through probe-run gave $rc, expected 137"

# Arguments with spaces, quotes and glob characters arrive unchanged.
"$RUN" --out "$work/p7.h5" -- printf '[%s]\n' 'a b' '"q"' '*' '' >"$work/args.out"
printf '[%s]\n' 'a b' '"q"' '*' '' >"$work/args.ref"
cmp -s "$work/args.ref" "$work/args.out" && ok || fail "arguments changed: $(cat "$work/args.out")"

# stdin is the command's stdin.
printf 'from stdin\n' | "$RUN" --out "$work/p8.h5" -- cat >"$work/stdin.out"
[ "$(cat "$work/stdin.out")" = "from stdin" ] && ok || fail "stdin not passed: $(cat "$work/stdin.out")"

# --- bad options: exit 2, one line naming the problem, command not run ----
marker="$work/marker"
expect_reject() {
    # $1: text the message must contain; rest: probe-run arguments
    local want=$1
    shift
    rm -f -- "$marker"
    "$RUN" "$@" >"$work/rej.out" 2>"$work/rej.err"
    local rc=$?
    local lines
    lines=$(wc -l <"$work/rej.err")
    if [ "$rc" != 2 ]; then
        fail "probe-run $* exited $rc, expected 2"
    elif [ -e "$marker" ]; then
        fail "probe-run $* ran the command"
    elif [ "$lines" != 1 ]; then
        fail "probe-run $* wrote $lines lines on stderr, expected 1: $(cat "$work/rej.err")"
    elif ! grep -q '^probe-run: ' "$work/rej.err"; then
        fail "probe-run $* message does not start with 'probe-run: ': $(cat "$work/rej.err")"
    elif ! grep -qF -- "$want" "$work/rej.err"; then
        fail "probe-run $* message does not name '$want': $(cat "$work/rej.err")"
    elif [ -s "$work/rej.out" ]; then
        fail "probe-run $* wrote to stdout: $(cat "$work/rej.out")"
    else
        ok
    fi
}
touch_cmd=(touch "$marker")

expect_reject "--bogus" --bogus -- "${touch_cmd[@]}"
expect_reject "-x" -x -- "${touch_cmd[@]}"
expect_reject "missing '--'" "${touch_cmd[@]}"
expect_reject "missing '--'" --out "$work/x.h5"
expect_reject "missing COMMAND" --out "$work/x.h5" --
expect_reject "--out needs a value" --out
expect_reject "component name 'a/b' contains '/'" --tap a/b=Foo.forward -- "${touch_cmd[@]}"
expect_reject "component name '' is empty" --tap =Foo.forward -- "${touch_cmd[@]}"
expect_reject "component name '..' is '.' or '..'" --tap ..=Foo.forward -- "${touch_cmd[@]}"
expect_reject "is 128 bytes long" --tap "$(printf 'c%.0s' {1..128})=Foo.forward" -- "${touch_cmd[@]}"
expect_reject "NAME=PATTERN" --tap dit.step -- "${touch_cmd[@]}"
expect_reject "malformed pattern" --tap dit.step=NoMethod -- "${touch_cmd[@]}"
expect_reject "malformed pattern" --tap 'dit.step=a:b:C.f' -- "${touch_cmd[@]}"
expect_reject "malformed pattern" --tap 'dit.step=C.1x' -- "${touch_cmd[@]}"
expect_reject "$work/no/such/dir" --out "$work/no/such/dir/x.h5" -- "${touch_cmd[@]}"
expect_reject "is a directory" --out "$work" -- "${touch_cmd[@]}"
expect_reject "--label" --label '' -- "${touch_cmd[@]}"
expect_reject "--capture" --capture '' -- "${touch_cmd[@]}"

# A valid --tap is accepted (the command runs).
rm -f -- "$marker"
"$RUN" --out "$work/tap.h5" --tap 'text_encoder=mymod:Thing.run' --tap 'dit.step=*Net.forward' -- "${touch_cmd[@]}"
rc=$?
{ [ "$rc" = 0 ] && [ -e "$marker" ]; } && ok || fail "valid --tap options rejected (rc $rc)"

# --help: usage on stdout, exit 0, command not run.
rm -f -- "$marker"
"$RUN" --help -- "${touch_cmd[@]}" >"$work/help.out" 2>"$work/help.err"
rc=$?
{ [ "$rc" = 0 ] && grep -q '^usage: probe-run' "$work/help.out" && [ ! -e "$marker" ]; } && ok ||
    fail "--help: rc $rc, stdout: $(head -1 "$work/help.out")"

# A command that does not exist: exit 127 like a shell, one probe-run line,
# no capture file created.
"$RUN" --out "$work/nocmd.h5" -- "$work/no/such/cmd" >"$work/nocmd.out" 2>"$work/nocmd.err"
rc=$?
{ [ "$rc" = 127 ] && [ "$(cat "$work/nocmd.err")" = "probe-run: $work/no/such/cmd: command not found" ] &&
  [ ! -e "$work/nocmd.h5" ]; } && ok || fail "missing command: rc $rc, stderr: $(cat "$work/nocmd.err")"

# --version
{ [ "$("$RUN" --version)" != "" ] && "$RUN" --version | grep -Eq '^probe-run [0-9]+\.[0-9]+\.[0-9]+$'; } && ok ||
    fail "--version: $("$RUN" --version 2>&1)"

echo "test_probe_run_passthrough: $checks checks passed, $fails failed"
[ "$fails" = 0 ]
