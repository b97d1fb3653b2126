#!/usr/bin/env bash
# Connections an exec hands on as standard input and output (issue 22): an inetd-style server
# of ours (fork, dup2 onto 0 and 1, exec a filter) and socat's EXEC, both under `colo run`, with
# clients under `colo run`. glibc's stdio in the filter reads and writes through calls the shim
# never sees: every byte must still come back, in order (the shim relays the connection over a
# loopback TCP connection, logged), for sizes from 1 byte to 4 MB; also with SIGCHLD ignored
# across the exec (as inetd-style servers that let the kernel reap their children have it).
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0
SIZES="1 1000 65536 300000 4000000"
for n in $SIZES; do head -c "$n" /dev/urandom | od -An -tx1 -v | head -c "$n" > "$WORK/in.$n"; done
# roundtrip NAME PORT SIZE EXPECTED-TRANSFORM: a client under colo run sends the file and reads
# until the server's end of file.
roundtrip() {
  local out=$WORK/out.$1.$3
  timeout 60 env COLO_LOG=info $COLORUN socat -t30 - "TCP:127.0.0.1:$2" <"$WORK/in.$3" >"$out" 2>>"$WORK/$1-client.log" || return 1
  cmp -s "$out" "$4"
}
gcc -O2 -o "$WORK/inetd" "$HERE/servers/inetd.c" || bad "compile inetd.c"
# cat reads and writes with read(2)/write(2) through libc's wrappers; sed -u through stdio.
for filter in cat "sed -u s/x/x/"; do
  P=$(free_port); name=inetd${filter%% *}
  COLO_LOG=info timeout 120 $COLORUN "$WORK/inetd" "$P" "$(echo $SIZES | wc -w)" $filter >"$WORK/$name.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do grep -qs READY "$WORK/$name.log" && break; sleep 0.05; done
  for n in $SIZES; do
    check "inetd-style server, $filter as stdin/stdout: $n bytes back in order (client under colo run)" roundtrip "$name" "$P" "$n" "$WORK/in.$n"
  done
  check "... its connections were accelerated, then relayed" sh -c "
    [ \$(grep -c ': accelerated (shared memory)' '$WORK/$name.log') -ge 5 ] && [ \$(grep -c 'is standard I/O: relayed over loopback TCP' '$WORK/$name.log') -ge 5 ]"
done
# SIGCHLD ignored (kept by exec): the relay's start is not told by an exit status.
P=$(free_port)
IGNORE_CHLD=1 COLO_LOG=info timeout 120 $COLORUN "$WORK/inetd" "$P" 1 sed -u s/a/b/ >"$WORK/inetd-ign.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/inetd-ign.log" && break; sleep 0.05; done
sed 's/a/b/' "$WORK/in.300000" >"$WORK/exp.ign"
check "inetd-style server with SIGCHLD ignored, sed -u: 300000 bytes back in order" roundtrip inetd-ign "$P" 300000 "$WORK/exp.ign"
check "... relayed" grep -q 'is standard I/O: relayed over loopback TCP' "$WORK/inetd-ign.log"

# The program sees the connection's addresses on its relayed standard I/O, not the relay's
# (inetd-style services and sshd read them: its log, SSH_CONNECTION, Match LocalPort).
P=$(free_port)
COLO_LOG=info timeout 120 $COLORUN "$WORK/inetd" "$P" 3 python3 "$HERE/py/relayed_names.py" filter >"$WORK/inetd-names.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/inetd-names.log" && break; sleep 0.05; done
for i in 1 2 3; do
  check "inetd-style server, python as stdin/stdout: getsockname/getpeername name the connection ($i)" \
    timeout 30 $COLORUN python3 "$HERE/py/relayed_names.py" client "$P"
done
check "... relayed" grep -q 'is standard I/O: relayed over loopback TCP' "$WORK/inetd-names.log"
# ... also when the client closed before the exec (its reset carrier answers no getpeername).
P=$(free_port)
EXEC_DELAY_MS=300 NAMES_FILE="$WORK/names.gone" COLO_LOG=info timeout 120 $COLORUN "$WORK/inetd" "$P" 1 python3 "$HERE/py/relayed_names.py" filter >"$WORK/inetd-gone.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/inetd-gone.log" && break; sleep 0.05; done
check "inetd-style server, the client gone before the exec: getpeername names the client" \
  timeout 30 $COLORUN python3 "$HERE/py/relayed_names.py" gone "$P" "$WORK/names.gone"
check "... accelerated, then relayed" sh -c "grep -q ': accelerated (shared memory)' '$WORK/inetd-gone.log' && grep -q 'is standard I/O: relayed over loopback TCP' '$WORK/inetd-gone.log'"

if command -v socat >/dev/null; then
  S=$(free_port)
  COLO_LOG=info timeout 120 $COLORUN socat TCP-LISTEN:$S,bind=127.0.0.1,reuseaddr,fork EXEC:'sed -u s/a/b/',nofork >"$WORK/socat.log" 2>&1 & PIDS+=($!)
  wait_port "$S"
  for n in $SIZES; do
    sed 's/a/b/' "$WORK/in.$n" >"$WORK/exp.$n"
    check "socat EXEC:'sed -u', $n bytes back in order, transformed (client under colo run)" roundtrip socat "$S" "$n" "$WORK/exp.$n"
  done
  check "... the client's connections were accelerated" test "$(grep -c ': accelerated (shared memory)' "$WORK/socat-client.log")" -ge 5
  check "... and relayed" test "$(grep -c 'is standard I/O: relayed over loopback TCP' "$WORK/socat.log")" -ge 5
else
  bad "socat is not installed (tests/apps/packages.txt)"
fi
# A close-on-exec connection (Python's) handed to `cat` by subprocess (vfork, dup2 in the child):
# the shim relays it at the dup2 (it closed the memfd an exec'd image would map it from), and
# leaves the server's own standard output alone.
check "python subprocess with an accepted socket as cat's stdin/stdout: 3 MB back in order, the server's stdout its own" sh -c \
  "timeout 60 env COLO_LOG=info $COLORUN python3 '$HERE/py/subprocess_sock.py' >'$WORK/pysub.out' 2>'$WORK/pysub.err' && grep -qx parent-after '$WORK/pysub.out'"
check "... accelerated, then relayed" sh -c "grep -q 'accept .*: accelerated (shared memory)' '$WORK/pysub.err' && grep -q 'made inheritable: relayed over loopback TCP' '$WORK/pysub.err'"
[ $FAIL = 0 ] && echo "tests/apps/stdio_exec.sh: all passed" || echo "tests/apps/stdio_exec.sh: FAILURES"
exit $FAIL
