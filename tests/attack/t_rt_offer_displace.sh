#!/usr/bin/env bash
# Red team: another user's later offer for a 4-tuple must not displace the real client's offer.
# A TCP connection that waits in a server's backlog shows in /proc/net/tcp, 4-tuple and all.
# nobody watches for root's connection to root's busy Rust API server (it accepts 1.5 s late),
# and offers for that 4-tuple as soon as it appears: after root's client's own offer, before
# the accept. The Rust listener kept the later offer for a 4-tuple in place of the earlier one,
# so root's client was dropped to plain TCP and the claim then refused nobody's by its owner
# check. Root's client must be accelerated, and nobody's offer never welcomed.
source "$(dirname "$0")/lib.sh"
[ -e "$SHIM" ] || { echo "FAIL $SHIM not built (run tests/attack/run.sh)"; exit 1; }
cp "$HERE/py/preempt_offer.py" "$HERE/colo_attack.py" "$WORK/"
# displaced NAME SERVER...: the attack against the server started by SERVER... on a free port.
displaced() {
  local name=$1; shift
  local P SRC out
  P=$(free_port)
  PEER_ACCEPT_DELAY_MS=1500 COLO_LOG=info "$@" "127.0.0.1:$P" stream >"$WORK/server-$name.log" 2>&1 & PIDS+=($!)
  wait_port "$P"
  SRC=$(python3 -c 'import random; print(random.randrange(40001, 60000, 2))')
  as_nobody timeout 20 /usr/bin/python3 "$WORK/preempt_offer.py" "$P" "$SRC" 8 after >"$WORK/att-$name.out" 2>&1 & ATT=$!; PIDS+=($!)
  for _ in $(seq 100); do grep -qs WATCHING "$WORK/att-$name.out" && break; sleep 0.05; done
  out=$(timeout 20 env COLO_LOG=info COLO_CARRIER_TIMEOUT_MS=5000 COLO_SHORT_LIVED=accelerate $COLORUN python3 -c "
import socket
s = socket.create_connection(('127.0.0.1', $P), source_address=('127.0.0.1', $SRC))
s.sendall(b'ping')
print(s.recv(4).decode())
" 2>"$WORK/client-$name.err")
  check "$name: root's client was answered" test "$out" = ping
  wait "$ATT"
  check "$name: nobody offered after root's client, before the accept" grep -q READY "$WORK/att-$name.out"
  check "$name: root's client is accelerated past nobody's later offer" grep -q ": accelerated (shared memory)" "$WORK/client-$name.err"
  check "$name: nobody's offer was not welcomed ($(grep ANSWER "$WORK/att-$name.out"))" \
    sh -c "grep -q '^ANSWER' '$WORK/att-$name.out' && ! grep -q 'ANSWER WELCOME' '$WORK/att-$name.out'"
}
displaced "Rust API listener" "$PEER" server
# (The Go listener accepts TCP connections in the background as they come, claiming each at
# once: a connection never waits in the kernel's backlog for another user to see it.)
finish
