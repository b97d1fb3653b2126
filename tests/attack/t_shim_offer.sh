#!/usr/bin/env bash
# Issue 21 finding 2: taking a pending offer from the shim's offer service. Root runs, under colo
# run, a server whose worker (a fork child of the process that listens) accepts each connection
# late, so the offer waits in the listening process's service. nobody reads the pending 4-tuple
# from /proc/net/tcp and tries every colo/ name /proc/net/unix shows, in the old request format
# and the new one's shape. The client's bytes must reach only the real server, over shared
# memory; the attacker gets no descriptor. (Before the fix: it took the offer from
# colo/1/shim/<pid> and read the client's password from the segment; the server got nothing.)
source "$(dirname "$0")/lib.sh"
[ -e "$SHIM" ] || { echo "FAIL $SHIM not built (run tests/attack/run.sh)"; exit 1; }
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }

S=$(free_port)
COLO_LOG=info $COLORUN python3 "$HERE/py/shim_forked_server.py" "$S" "$WORK/got" 1.5 >"$WORK/srv.out" 2>"$WORK/srv.err" &
PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/srv.out" && break; sleep 0.05; done
read -r _ MASTER WORKER < "$WORK/srv.out"
PIDS+=("$WORKER")  # the forked worker outlives its master: `cleanup` ends it too
client() { # $1 secret: sends it as a line, prints the answer
  timeout 15 env COLO_LOG=info COLO_CARRIER_TIMEOUT_MS=4000 COLO_SHORT_LIVED=accelerate $COLORUN python3 -c "
import socket
s = socket.create_connection(('127.0.0.1', $S))
s.sendall(b'$1\n')
print(s.recv(64).decode().strip())
"
}
check "warm-up client answered" test "$(client warmup 2>"$WORK/c0.err")" = OK
base_m=$(fds "$MASTER") base_w=$(fds "$WORKER")

SECRET="password=$(head -c 9 /dev/urandom | od -An -tx1 | tr -d ' \n')"
T=$WORK/thief; mkdir -p "$T"; chown nobody:nogroup "$T"
as_nobody /usr/bin/python3 "$HERE/py/shim_offer_thief.py" "$S" 4 "password=" "$T/log" 2>"$T/err" &
THIEF=$!; PIDS+=($!)
sleep 0.3
check "the client got its answer while the attacker tried" test "$(client "$SECRET" 2>"$WORK/c1.err")" = OK
wait $THIEF
check "the attacker saw the pending connection's 4-tuple" grep -q "^KEY 127.0.0.1:[0-9]*|127.0.0.1:$S" "$T/log"
check "... and tried the colo names it could see" grep -q "^NAME colo/1/127.0.0.1:$S" "$T/log"
check "the attacker got no descriptor" sh -c "! grep -q STOLE '$T/log'"
check "the attacker read nothing" sh -c "! grep -q READ '$T/log'"
check "the real server got the client's bytes" grep -qx "$SECRET" "$WORK/got"
check "... over shared memory (client)" grep -q ": accelerated (shared memory)" "$WORK/c1.err"
check "... over shared memory (the forked worker)" sh -c "grep -c 'accept .*: accelerated (shared memory)' '$WORK/srv.err' | grep -qx 2"
check "another client is still served" test "$(client again 2>"$WORK/c2.err")" = OK
check "... accelerated" grep -q ": accelerated (shared memory)" "$WORK/c2.err"
sleep 0.5
m=$(fds "$MASTER") w=$(fds "$WORKER")
check "descriptors back to baseline (listening process $base_m -> $m, worker $base_w -> $w)" \
  test "$m" -le "$((base_m + 1))" -a "$w" -le "$((base_w + 1))"
finish
