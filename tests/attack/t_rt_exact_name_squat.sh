#!/usr/bin/env bash
# Red team: a name nobody binds must not keep root's clients off root's own rendezvous. Root's
# servers listen on the wildcard 0.0.0.0:P (redis under colo run, the Rust API example, Go's
# colo-peer), each with its rendezvous colo/1/0.0.0.0:P; nobody binds the free name of the
# exact address, colo/1/127.0.0.1:P, which a client dialing 127.0.0.1:P tries first (spec/WIRE.md
# section 2, "Lookup"). The peer check refuses it (the TCP listener the kernel would give the
# connection to is the wildcard, whose name that is not), and the client went to plain TCP
# though the listener's own name came next in its lookup: any user could so take shared memory
# from every client of any wildcard listener. It must pass over that name to the listener's own
# (checked the same way), be accelerated, and send the squatter nothing.
source "$(dirname "$0")/lib.sh"
cp "$HERE/squatter.py" "$WORK/squatter.py"
squat() {
  as_nobody /usr/bin/python3 "$WORK/squatter.py" "colo/1/127.0.0.1:$1" >"$2" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do grep -qs READY "$2" && return 0; sleep 0.05; done
  echo "squatter never ready: $(cat "$2")"; return 1
}
got_nothing() { sleep 0.3; ! grep GOT "$1" | grep -vq "GOT 0 0 "; }
P=$(free_port)
squat "$P" "$WORK/squat-redis.out" || bad "squatter for redis"
start_redis "$P" colo --bind 0.0.0.0 || exit 1
colo_pong() { local o; o=$(COLO_LOG=info timeout 10 $COLORUN redis-cli -p "$P" ping 2>&1); grep -q "accelerated (shared memory)" <<<"$o" && grep -q "^PONG$" <<<"$o" || { echo "    client: $(tail -2 <<<"$o")"; return 1; }; }
check "redis: root's redis-cli under colo run reaches root's wildcard redis over shared memory" colo_pong
check "redis: ... and sends the squatter nothing" got_nothing "$WORK/squat-redis.out"
GOPEER=$WORK/colo-peer-go
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go: cannot build go/cmd/colo-peer"
served() { local o; o=$(COLO_LOG=info timeout 10 "$1" client "127.0.0.1:$P" stream 100000 2>&1); grep -q "^OK 100000 colo$" <<<"$o" || { echo "    client: $(tail -1 <<<"$o")"; return 1; }; }
for L in rust go; do
  bin=$PEER; [ "$L" = go ] && bin=$GOPEER
  [ -x "$bin" ] || continue
  P=$(free_port)
  squat "$P" "$WORK/squat-$L.out" || bad "squatter for $L"
  COLO_LOG=info "$bin" server "0.0.0.0:$P" stream >"$WORK/srv-$L.log" 2>&1 & SRV=$!; PIDS+=($SRV)
  wait_port "$P" || { bad "$L: server did not start"; continue; }
  # Each client against each server: the Rust API's and Go's.
  check "$L server: the Rust API client is served over shared memory" served "$PEER"
  check "$L server: the Go client is served over shared memory" served "$GOPEER"
  check "$L server: ... and neither sends the squatter anything" got_nothing "$WORK/squat-$L.out"
  kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
done
finish
