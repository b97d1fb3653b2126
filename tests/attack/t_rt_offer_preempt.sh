#!/usr/bin/env bash
# Red team: another user's offer for a 4-tuple must not keep the real client of that 4-tuple off
# shared memory. The shim's client binds its port before it offers (spec/WIRE.md section 3); a
# program may choose the port itself, and on Linux 6.10+ sock_diag lists bound sockets before
# they connect. nobody offers first for root's client's 4-tuple and keeps its offer open; the
# shim's offer service then refused root's real offer as "a second offer" (NOT_CLAIMED: plain
# TCP), and the claim found only nobody's, which its owner check refuses. Root's client must be
# accelerated, and nobody must get NOT_CLAIMED and nothing of the client's bytes: through the
# listening process's own service (1) and through a forked worker asking it (2).
source "$(dirname "$0")/lib.sh"
[ -e "$SHIM" ] || { echo "FAIL $SHIM not built (run tests/attack/run.sh)"; exit 1; }
cp "$HERE/py/preempt_offer.py" "$HERE/colo_attack.py" "$WORK/"
A=$WORK/att; mkdir -p "$A"; chown nobody:nogroup "$A"
# client PORT SRCPORT SECRET ERR: root's client under colo run from 127.0.0.1:SRCPORT.
client() {
  timeout 15 env COLO_LOG=info COLO_CARRIER_TIMEOUT_MS=4000 COLO_SHORT_LIVED=accelerate $COLORUN python3 -c "
import socket
s = socket.create_connection(('127.0.0.1', $1), source_address=('127.0.0.1', $2))
s.sendall(b'$3\n')
print(s.recv(64).decode().strip())
" 2>"$4"
}
# An odd port nothing is bound to (a port left in TIME_WAIT by earlier tests would fail the
# client's bind): tried by binding it.
odd_port() { python3 -c '
import random, socket
while True:
    p = random.randrange(40001, 60000, 2)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    break
'; }
# preempt PORT SRCPORT OUT: nobody offers for 127.0.0.1:SRCPORT -> 127.0.0.1:PORT and waits
# (6 s at most) for the answer.
preempt() {
  as_nobody timeout 20 /usr/bin/python3 "$WORK/preempt_offer.py" "$1" "$2" 6 >"$3" 2>&1 &
  PREEMPT=$!; PIDS+=($!)
  for _ in $(seq 100); do grep -qs READY "$3" && break; sleep 0.05; done
  sleep 0.2 # the service has read it
}

# 1. A server that accepts in the process that listens.
P=$(free_port)
COLO_LOG=info $COLORUN python3 -c "
import socket
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', $P)); l.listen(64)
while True:
    c, _ = l.accept(); d = b''
    while not d.endswith(b'\n'):
        b = c.recv(4096)
        if not b: break
        d += b
    open('$WORK/got1', 'ab').write(d); c.sendall(b'OK\n'); c.close()
" >"$WORK/srv1.out" 2>"$WORK/srv1.err" & PIDS+=($!)
wait_port "$P"
check "warm-up client answered" test "$(client "$P" "$(odd_port)" warmup "$WORK/c0.err")" = OK
SRC=$(odd_port); SECRET="secret-$RANDOM$RANDOM"
preempt "$P" "$SRC" "$A/one.out"
check "root's client answered" test "$(client "$P" "$SRC" "$SECRET" "$WORK/c1.err")" = OK
check "... over shared memory, past nobody's earlier offer" grep -q ": accelerated (shared memory)" "$WORK/c1.err"
wait "$PREEMPT"
check "nobody's offer was refused NOT_CLAIMED ($(grep ANSWER "$A/one.out"))" grep -qx "ANSWER REJECT(NOT_CLAIMED)" "$A/one.out"
check "the server got the client's line" grep -qx "$SECRET" "$WORK/got1"

# 2. A forked worker that accepts late and asks the listening process's service.
S=$(free_port)
COLO_LOG=info $COLORUN python3 "$HERE/py/shim_forked_server.py" "$S" "$WORK/got2" 1 >"$WORK/srv2.out" 2>"$WORK/srv2.err" & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/srv2.out" && break; sleep 0.05; done
read -r _ _ WORKER < "$WORK/srv2.out"; PIDS+=("$WORKER")
check "warm-up client of the forked worker answered" test "$(client "$S" "$(odd_port)" warmup "$WORK/c2.err")" = OK
SRC=$(odd_port); SECRET="secret-$RANDOM$RANDOM"
preempt "$S" "$SRC" "$A/two.out"
check "root's client of the forked worker answered" test "$(client "$S" "$SRC" "$SECRET" "$WORK/c3.err")" = OK
check "... over shared memory, past nobody's earlier offer" grep -q ": accelerated (shared memory)" "$WORK/c3.err"
wait "$PREEMPT"
check "nobody's offer was refused NOT_CLAIMED ($(grep ANSWER "$A/two.out"))" grep -qx "ANSWER REJECT(NOT_CLAIMED)" "$A/two.out"
check "the worker got the client's line" grep -qx "$SECRET" "$WORK/got2"
finish
