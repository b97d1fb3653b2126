#!/usr/bin/env bash
# Red team: one silent rendezvous connection must not slow every TCP accept of a Go listener.
# The Go listener waits (up to 100 ms, claimWait) for HELLOs of accepted rendezvous connections
# before it decides that a TCP connection from an odd port has no offer. nobody holds one
# rendezvous connection to root's Go server that never sends a HELLO (renewed before its 5 s
# timeout): every plain TCP client from an odd port (any local program, colo or not) then waited
# 100 ms in Accept, one after the other. A silent connection cannot carry the offer of a TCP
# connection being accepted (a client's HELLO is queued before its SYN), so the listener must not
# wait for it. Asserted relative to the even-port clients of the same run, interleaved with them.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/silent_rendezvous.py" "$HERE/py/odd_even_rtt.py" "$WORK/"
P=$(free_port)
$GOPEER server "127.0.0.1:$P" stream >"$WORK/go-server.log" 2>&1 & PIDS+=($!)
wait_port "$P"
as_nobody timeout 60 /usr/bin/python3 "$WORK/silent_rendezvous.py" "$P" 1 40 >"$WORK/silent.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs HELD "$WORK/silent.out" && break; sleep 0.05; done
check "nobody holds a silent rendezvous connection" grep -q "HELD 1" "$WORK/silent.out"
sleep 0.3
r=$(timeout 120 python3 "$WORK/odd_even_rtt.py" "$P" 30)
echo "     $r"
odd=$(echo "$r" | sed -n 's/.*odd_ms=\([0-9.]*\).*/\1/p'); even=$(echo "$r" | sed -n 's/.*even_ms=\([0-9.]*\).*/\1/p')
check "plain TCP clients from odd ports are served like those from even ports ($odd ms vs $even ms)" \
  awk -v o="${odd:-1e9}" -v e="${even:-0}" 'BEGIN { exit !(o <= 10 * e + 0.5) }'
# What the wait is for still works: a CARRIER client (the shim's) is accelerated meanwhile.
out=$(timeout 15 env COLO_LOG=info COLO_SHORT_LIVED=accelerate $COLORUN python3 -c "
import socket
s = socket.create_connection(('127.0.0.1', $P))
s.sendall(b'ping')
print(s.recv(4).decode())
" 2>"$WORK/shim-client.err")
check "a CARRIER client of the shim is answered during the attack" test "$out" = ping
check "... over shared memory" grep -q ": accelerated (shared memory)" "$WORK/shim-client.err"
finish
