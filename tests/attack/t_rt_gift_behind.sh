#!/usr/bin/env bash
# Red team: a rendezvous connection the server refuses must not be closed with a descriptor
# still queued on it. Before the server reads a HELLO its control socket takes descriptors; the
# server then refuses them and empties the socket, but it stopped at a zero-length datagram
# (which recv cannot tell from the end) and after 64 datagrams, and closed the socket with the
# rest queued: the kernel released them in the server's thread, and the last close of a
# lingering TCP socket waits up to its linger time there (the shim's service thread, which holds
# the lock redis's accepts need; the Rust listener's accepting thread). nobody
# (py/gift_behind.py) queues such sockets behind a zero-length datagram, or behind 80 rings, or
# sends as its HELLO's descriptor a Unix socket holding one behind a zero-length datagram (taken
# as it was received, with the same stop); root's other clients, colo and plain, must be served
# within 5 s while it holds them.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/gift_behind.py" "$HERE/doorbell_attacker.py" "$WORK/" && chmod 644 "$WORK"/*.py
pong() { [ "$(timeout 5 "$@" 2>/dev/null)" = PONG ]; }
# give PORT HOW: runs the attacker as nobody in the background until its gifts are queued (the
# server may read before they are: then it tries again, at most 5 times).
give() {
  local i
  for i in 1 2 3 4 5; do
    as_nobody timeout 60 /usr/bin/python3 "$WORK/gift_behind.py" "$1" "$2" 600 30 >"$WORK/$2-$1.log" 2>&1 &
    ATTACK=$!
    for _ in $(seq 100); do grep -qs GIVEN "$WORK/$2-$1.log" && break; sleep 0.1; done
    grep -q "GIVEN [1-9]" "$WORK/$2-$1.log" && { sleep 0.5; return 0; }
    kill "$ATTACK" 2>/dev/null; wait "$ATTACK" 2>/dev/null
  done
  echo "    the gifts were never queued: $(cat "$WORK/$2-$1.log")"
  return 1
}
stop() { kill "$ATTACK" 2>/dev/null; wait "$ATTACK" 2>/dev/null; }

GOPEER=$WORK/colo-peer
(cd "${GOSRC:-$ROOT/go}" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
# Each case against servers of its own (a server that failed one stays stuck for a while).
for how in zero many nested; do
  P=$(free_port)
  start_redis "$P" colo --bind 127.0.0.1 || exit 1
  pong $COLORUN redis-cli -p "$P" ping
  check "redis ($how): the attacker queued its gifts" give "$P" "$how"
  check "redis ($how): a colo client is answered while the attacker holds them" pong $COLORUN redis-cli -p "$P" ping
  check "redis ($how): a plain client is answered while the attacker holds them" pong redis-cli -p "$P" ping
  stop

  P=$(free_port)
  "$PEER" server "127.0.0.1:$P" stream >"$WORK/peer-$how.log" 2>&1 &
  PIDS+=($!)
  wait_port "$P" || exit 1
  check "peer ($how): the attacker queued its gifts" give "$P" "$how"
  check "peer ($how): another client is served while the attacker holds them" \
    eval "timeout 5 $PEER client 127.0.0.1:$P stream 1000 | grep -q '^OK 1000 '"
  stop

  # The Go server serves other clients from other threads: none of its threads may wait in a
  # socket's close (sk_stream_wait_close sleeps in wait_woken) for the attacker.
  P=$(free_port)
  $GOPEER server "127.0.0.1:$P" stream >"$WORK/go-$how.log" 2>&1 &
  PIDS+=($!); GO=$!
  wait_port "$P" || exit 1
  check "go ($how): the attacker queued its gifts" give "$P" "$how"
  check "go ($how): no thread of the server waits in a close for the attacker" \
    eval "! grep -qs wait_woken /proc/$GO/task/*/wchan"
  check "go ($how): another client is served while the attacker holds them" \
    eval "timeout 5 $GOPEER client 127.0.0.1:$P stream 1000 | grep -q '^OK 1000 '"
  stop
done
finish
