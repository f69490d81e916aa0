#!/usr/bin/env bash
# scripts/gpu-run against a real sshd (Debian openssh-server) that this test
# starts as the current user on a free 127.0.0.1 port, with its own host key,
# client key, known_hosts and ssh config in a temporary directory (~/.ssh is
# never read or written). The "remote" workspace is a temporary directory on
# this machine, so every remote file can be compared with the local tree.
# Checks: what is synced (tracked, untracked-not-ignored, not ignored, not
# tracked-but-deleted; names with spaces; modes), exact argument quoting,
# streamed stdout/stderr, exit statuses 0/1/7/255 passed through, forwarded
# PROBE_* variables, build/bin on PATH, results brought back (a real capture
# written by probe-run remotely comes back byte-identical; only files created
# or changed by the run; not from CMake build trees; --fetch globs), --keep,
# an unreachable host and bad arguments (exit 2, one line).
# Skips (exit 0, one SKIP line) only when sshd cannot be started at all.
set -u

: "${PROBE_BUILD_DIR:?PROBE_BUILD_DIR must name the build directory}"
: "${PROBE_SOURCE_DIR:?PROBE_SOURCE_DIR must name the source directory}"
GPU_RUN="$PROBE_SOURCE_DIR/scripts/gpu-run"
SSHD=/usr/sbin/sshd

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run-test.XXXXXX")
sshd_pid=
cleanup() {
    if [ -n "$sshd_pid" ]; then
        kill "$sshd_pid" 2>/dev/null
        wait "$sshd_pid" 2>/dev/null
    fi
    rm -rf -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fails=0
checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }
expect_eq() { # $1 what, $2 got, $3 want
    if [ "$2" = "$3" ]; then ok; else fail "$1: got '$2', want '$3'"; fi
}
skip() { echo "SKIP: $*"; exit 0; }

free_port() {
    /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- a real sshd on loopback -------------------------------------------------
[ -x "$SSHD" ] || skip "no $SSHD (Debian openssh-server)"
for t in ssh ssh-keygen rsync git; do
    command -v "$t" >/dev/null || { echo "FAIL: $t not found (scripts/setup installs it)" >&2; exit 1; }
done
me=$(id -un)
# Run as root, sshd needs its privilege separation directory (the Debian
# package creates it only when the service is started).
if [ "$(id -u)" = 0 ] && [ ! -d /run/sshd ]; then
    mkdir -p -m 0755 /run/sshd 2>/dev/null || skip "cannot create /run/sshd"
fi
ssh-keygen -q -t ed25519 -N '' -C gpu-run-test-host -f "$work/host_key" || skip "ssh-keygen failed"
ssh-keygen -q -t ed25519 -N '' -C gpu-run-test-client -f "$work/client_key" || exit 1
cp "$work/client_key.pub" "$work/authorized_keys"

started=0
for attempt in 1 2 3 4 5; do
    port=$(free_port)
    cat >"$work/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $work/host_key
PidFile $work/sshd.pid
AuthorizedKeysFile $work/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
AllowUsers $me
X11Forwarding no
AllowTcpForwarding no
PrintMotd no
EOF
    "$SSHD" -t -f "$work/sshd_config" 2>"$work/sshd_t.err" || skip "sshd -t: $(tail -n 1 "$work/sshd_t.err")"
    "$SSHD" -f "$work/sshd_config" -D -e 2>"$work/sshd.log" &
    sshd_pid=$!
    for _ in $(seq 100); do
        grep -q "Server listening on 127.0.0.1 port $port" "$work/sshd.log" && { started=1; break; }
        kill -0 "$sshd_pid" 2>/dev/null || break
        sleep 0.1
    done
    [ $started = 1 ] && break
    kill "$sshd_pid" 2>/dev/null; wait "$sshd_pid" 2>/dev/null; sshd_pid=
done
[ $started = 1 ] || skip "sshd could not be started: $(tail -n 1 "$work/sshd.log")"

echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$work/host_key.pub")" >"$work/known_hosts"
cat >"$work/ssh_config" <<EOF
Host *
  UserKnownHostsFile $work/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  IdentitiesOnly yes
  LogLevel ERROR
EOF
# The server must accept us: from here on a failure is a FAIL, not a skip.
if ! ssh -F "$work/ssh_config" -p "$port" -i "$work/client_key" -o BatchMode=yes 127.0.0.1 true </dev/null; then
    echo "FAIL: cannot log in to the test sshd; its log:" >&2
    cat "$work/sshd.log" >&2
    exit 1
fi

unset PROBE_GPU_HOST
G() { "$GPU_RUN" --host 127.0.0.1 --port "$port" --identity "$work/client_key" --ssh-config "$work/ssh_config" "$@"; }

# --- the local working tree --------------------------------------------------
repo=$work/repo
mkdir -p "$repo/dir with space" "$repo/sub"
cd "$repo" || exit 1
git init -q . && git config user.email t@example.invalid && git config user.name test
printf 'ignored.txt\n*.log\nbuild/\n' >.gitignore
echo tracked-a >a.txt
echo "tracked b c" >"dir with space/b c.txt"
printf '#!/bin/sh\necho exec-ok\n' >tool.sh && chmod 755 tool.sh
echo gone >gone.txt
printf 'OLD' >old.h5
git add -A && git commit -q -m init || exit 1
rm gone.txt                                  # tracked but deleted: not synced, no error
echo untracked >"sub/new file.txt"           # untracked, not ignored: synced
echo ign >ignored.txt; echo log >run.log     # ignored: not synced
mkdir -p build && echo b >build/x

ws="$work/remote ws/repo"                    # the host's workspace (with a space)
cd "$repo/sub" || exit 1                     # gpu-run finds the repository root

# --- sync, exact arguments, stdout -------------------------------------------
args=('a b' "it's" '$HOME' 'x;y' '"q"' '' $'l1\nl2' '*' '\' '`id`' '$(id)' '-n')
G --workspace "$ws" --keep -- printf '<%s>\n' "${args[@]}" >"$work/out1" 2>"$work/err1"
expect_eq "exit status (printf)" $? 0
printf '<%s>\n' "${args[@]}" >"$work/want1"
if cmp -s "$work/out1" "$work/want1"; then ok; else fail "arguments not preserved: $(cat "$work/out1")"; fi
expect_eq "stderr (nothing to bring back)" "$(cat "$work/err1")" ""
for f in .gitignore a.txt "dir with space/b c.txt" tool.sh old.h5 "sub/new file.txt"; do
    if cmp -s "$repo/$f" "$ws/$f"; then ok; else fail "not synced or different: $f"; fi
done
for f in gone.txt ignored.txt run.log build .git; do
    if [ -e "$ws/$f" ]; then fail "must not be synced: $f"; else ok; fi
done
[ -x "$ws/tool.sh" ] && ok || fail "mode of tool.sh not kept"

# --- stdout and stderr apart; exit statuses ----------------------------------
G --workspace "$ws" --keep -- sh -c 'echo to-out; echo to-err >&2; exit 7' >"$work/out2" 2>"$work/err2"
expect_eq "exit status 7" $? 7
expect_eq "stdout streamed" "$(cat "$work/out2")" to-out
expect_eq "stderr streamed" "$(cat "$work/err2")" to-err
G --workspace "$ws" --keep -- false >/dev/null 2>&1
expect_eq "exit status 1" $? 1
G --workspace "$ws" --keep -- sh -c 'exit 255' >/dev/null 2>"$work/err255"
expect_eq "exit status 255 from the command (not an ssh failure)" $? 255
expect_eq "no message for the command's 255" "$(cat "$work/err255")" ""
G --workspace "$ws" --keep -- no-such-command-xyz >/dev/null 2>&1
expect_eq "command not found" $? 127
expect_eq "stdin reaches the command" "$(printf 'in put\n' | G --workspace "$ws" --keep -- cat 2>&1)" "in put"

# --- environment: cwd, PROBE_* forwarded, PROBE_GPU_* not, build/bin on PATH --
out=$(PROBE_GPU_HOST=127.0.0.1 PROBE_T_VAR=$'a b\n$x \'q\'' "$GPU_RUN" --port "$port" \
      --identity "$work/client_key" --ssh-config "$work/ssh_config" --workspace "$ws" --keep -- \
      sh -c 'pwd -P; printf "[%s]\n" "$PROBE_T_VAR" "${PROBE_GPU_HOST-unset}"' 2>&1)
expect_eq "host from PROBE_GPU_HOST, cwd, PROBE_* forwarded" "$out" \
    "$(cd "$ws" && pwd -P)"$'\n'"[a b"$'\n'"\$x 'q']"$'\n'"[unset]"
G --workspace "$ws" --keep -- sh -c 'mkdir -p build/bin && cp tool.sh build/bin/probe-tool-x'
expect_eq "install a tool into the workspace's build/bin" $? 0
expect_eq "build/bin on PATH" "$(G --workspace "$ws" --keep -- probe-tool-x 2>&1)" exec-ok
[ ! -e "$repo/build/bin/probe-tool-x" ] && ok || fail "an ignored build/bin file came back"
[ -e "$repo/build/x" ] && ok || fail "the local ignored build/x was touched"

# --- a real capture written remotely comes back byte-identical ---------------
pre=()
[ -z "${LD_PRELOAD:-}" ] || pre=(env "LD_PRELOAD=$LD_PRELOAD" "ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}")
mkdir -p "$work/expect"
G --workspace "$ws" --keep -- sh -c 'mkdir -p "results dir"' && ok || fail "mkdir results dir"
G --workspace "$ws" --keep -- "${pre[@]}" "$PROBE_BUILD_DIR/bin/probe-run" --out "results dir/cap.h5" \
    --label remote -- "$PROBE_BUILD_DIR/tests/shim_tap_host" "$work/expect" >/dev/null 2>"$work/err3"
expect_eq "capture run exit status" $? 0
expect_eq "capture run message" "$(cat "$work/err3")" "gpu-run: brought back 1 file(s) into $repo"
if [ -s "$ws/results dir/cap.h5" ] && cmp -s "$ws/results dir/cap.h5" "$repo/results dir/cap.h5"; then
    ok
else
    fail "capture not brought back byte-identical"
fi
expect_eq "HDF5 signature of the brought-back capture" \
    "$(head -c 8 "$repo/results dir/cap.h5" 2>/dev/null | od -An -tx1 | tr -d ' \n')" 894844460d0a1a0a

# --- only files the run created or changed come back -------------------------
rm -f "$repo/results dir/cap.h5"
G --workspace "$ws" --keep -- sh -c 'printf NEW >> old.h5; echo "<r/>" > report.xml; echo t > notes.txt
    mkdir -p bt/sub && : > bt/CMakeCache.txt && echo "{}" > bt/sub/compile_commands.json' \
    >/dev/null 2>"$work/err4"
expect_eq "second run exit status" $? 0
expect_eq "second run message" "$(cat "$work/err4")" "gpu-run: brought back 2 file(s) into $repo"
expect_eq "changed tracked capture brought back" "$(cat "$repo/old.h5")" OLDNEW
expect_eq "new report brought back" "$(cat "$repo/report.xml" 2>&1)" "<r/>"
[ ! -e "$repo/results dir/cap.h5" ] && ok || fail "an unchanged remote capture came back"
[ ! -e "$repo/notes.txt" ] && ok || fail "a .txt came back without --fetch"
[ ! -e "$repo/bt" ] && ok || fail "a file from a CMake build tree came back"
# --fetch: those files come back whatever their time
G --workspace "$ws" --keep --fetch 'notes.txt' --fetch='results dir/*.h5' -- true >/dev/null 2>&1
expect_eq "--fetch run exit status" $? 0
expect_eq "--fetch notes.txt" "$(cat "$repo/notes.txt" 2>&1)" t
cmp -s "$ws/results dir/cap.h5" "$repo/results dir/cap.h5" && ok || fail "--fetch 'results dir/*.h5'"

# --- --keep: a workspace this run created is removed without it --------------
G --workspace "$work/ws2" -- sh -c 'test -f a.txt' >/dev/null 2>&1
expect_eq "fresh workspace run" $? 0
[ ! -e "$work/ws2" ] && ok || fail "a fresh workspace was kept without --keep"
G --workspace "$work/ws3" --keep -- true >/dev/null 2>&1
[ -f "$work/ws3/a.txt" ] && ok || fail "--keep did not keep the workspace"
G --workspace "$ws" -- true >/dev/null 2>&1
[ -f "$ws/a.txt" ] && ok || fail "an existing workspace was removed"

# --- failures: exit 2, one line ---------------------------------------------
one_line() { # $1 what, $2 rc, $3 stderr file, $4 expected prefix
    expect_eq "$1: exit status" "$2" 2
    expect_eq "$1: one line" "$(wc -l <"$3")" 1
    case $(head -n 1 "$3") in "$4"*) ok ;; *) fail "$1: message '$(head -n 1 "$3")', want '$4...'" ;; esac
}
dead=$(free_port)
"$GPU_RUN" --host 127.0.0.1 --port "$dead" --identity "$work/client_key" --ssh-config "$work/ssh_config" \
    --workspace "$ws" -- touch "$work/must-not-exist" >"$work/o" 2>"$work/e"
one_line "unreachable host" $? "$work/e" "gpu-run: ssh failed: "
[ ! -e "$work/must-not-exist" ] && ok || fail "command ran though the host was unreachable"
expect_eq "unreachable host: stdout" "$(cat "$work/o")" ""
"$GPU_RUN" -- true 2>"$work/e"; one_line "no host" $? "$work/e" "gpu-run: no host"
G --workspace "$ws" true 2>"$work/e"; one_line "missing --" $? "$work/e" "gpu-run: missing --"
G --workspace "$ws" -- 2>"$work/e"; one_line "missing command" $? "$work/e" "gpu-run: missing command"
G --bogus -- true 2>"$work/e"; one_line "unknown option" $? "$work/e" "gpu-run: unknown option"
G --port x -- true 2>"$work/e"; one_line "bad port" $? "$work/e" "gpu-run: --port"
G --workspace 2>"$work/e"; one_line "option without value" $? "$work/e" "gpu-run: --workspace needs a value"
(cd "$work" && G --workspace "$ws" -- touch "$work/must-not-exist") 2>"$work/e"
one_line "outside a git tree" $? "$work/e" "gpu-run: not inside a git working tree"
[ ! -e "$work/must-not-exist" ] && ok || fail "command ran outside a git tree"

echo "$checks passed, $fails failed"
[ $fails = 0 ]
