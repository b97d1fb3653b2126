#!/usr/bin/env bash
# claim() verifies who sent the offer (issue 21, "Must have"). nobody reads the 4-tuple of a
# connection root is about to make (or has made: /proc/net/tcp) and sends the server a CARRIER
# offer for it, with a valid segment. A server that claimed it would move root's plain TCP
# connection onto nobody's segment: root's client never hears back, nobody talks to the server
# in root's name. The offer's sender must own the client end of that connection: it gets
# REJECT(NOT_CLAIMED) (5), and root's connection stays plain TCP and is answered. Against the
# Rust API listener, the Go listener and the shim (redis under colo run), which share claim().
source "$(dirname "$0")/lib.sh"
cp "$(dirname "$0")/forge_offer.py" "$WORK/forge_offer.py"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
# forged WHAT PORT PAYLOAD EXPECT: root's victim against the server on 127.0.0.1:PORT.
forged() {
  local what=$1 port=$2 out=$WORK/forged-$1.out
  timeout 30 /usr/bin/python3 "$WORK/forge_offer.py" victim "colo/1/127.0.0.1:$port" "$port" "$3" "$4" >"$out" 2>&1
  check "$what: the forger sent its offer" grep -q "FORGER SENT" "$out"
  check "$what: the offer is not claimed (REJECT NOT_CLAIMED)" grep -q "FORGER REJECT 5" "$out"
  check "$what: root's connection stays plain TCP and is answered" grep -q "VICTIM GOT .*$4" "$out"
  grep -q "FORGER WELCOME" "$out" && bad "$what: the server claimed nobody's offer for root's connection"
}
P=$(free_port)
COLO_LOG=info $PEER server "127.0.0.1:$P" stream >"$WORK/api.log" 2>&1 & PIDS+=($!)
wait_port "$P"
forged "Rust API listener" "$P" "secret-from-root" "secret-from-root"
check "... which logged why" grep -q "not claimed: offer from uid 65534" "$WORK/api.log"
out=$(timeout 10 $PEER client "127.0.0.1:$P" stream 100000 2>&1)
check "... and keeps serving others over shared memory" test "$out" = "OK 100000 colo"

PG=$(free_port)
COLO_DEBUG=1 $GOPEER server "127.0.0.1:$PG" stream >"$WORK/go.log" 2>&1 & PIDS+=($!)
wait_port "$PG"
forged "Go listener" "$PG" "secret-from-root" "secret-from-root"
check "... which logged why" grep -q "not claimed: offer from uid 65534" "$WORK/go.log"

PR=$(free_port)
start_redis "$PR" colo --bind 127.0.0.1
forged "redis under colo run (the shim)" "$PR" 'PING\r\n' "PONG"
out=$(timeout 10 $COLORUN redis-cli -p "$PR" ping 2>&1)
check "... and keeps serving others" test "$out" = PONG
finish
