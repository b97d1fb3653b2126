#!/usr/bin/env bash
# Red team: another user must not push root's connections to plain TCP by using up the
# descriptor numbers the shim keeps to with handshakes it never finishes. Under a fixed limit of
# open files (soft = hard: here `ulimit -n 1024`) the shim holds its descriptors (two a pending
# offer, one a silent rendezvous connection) in the top sixteenth of the limit, 64 numbers
# (colo_sys::preload::band). nobody makes 200 CARRIER offers never claimed and 300 rendezvous
# connections that never send a HELLO: root's own redis-cli under colo run went plain TCP ("a
# client of uid 0 left on TCP: ... no descriptor number free for it"). Now a uid other than the
# server's holds as many pending offers and silent connections as a quarter of those numbers
# holds (the shim's offers::most_from). Must hold: root's client is accelerated throughout.
# (Another user's established connections are the server's program's own, as over TCP: not
# bounded so.) About 5 s.
source "$(dirname "$0")/lib.sh"
need redis-server || finish
P=$(free_port)
( ulimit -n 1024 && exec env COLO_LOG=info $COLORUN redis-server --port "$P" --bind 127.0.0.1 --save '' --appendonly no \
  --maxclients 100 --dir "$WORK" ) >"$WORK/redis.log" 2>&1 & PIDS+=($!)
wait_port "$P" || finish
colo_pong() { local o; o=$(COLO_LOG=info timeout 10 $COLORUN redis-cli -p "$P" ping 2>&1); grep -q "accelerated (shared memory)" <<<"$o" && grep -q "^PONG$" <<<"$o" || { echo "    client: $o" | tail -2; return 1; }; }
check "root's client accelerated before" colo_pong
as_nobody timeout 40 /usr/bin/python3 "$HERE/colo_attack.py" half_handshakes "$P" 300 200 25 >"$WORK/half.out" 2>&1 & PIDS+=($!)
for _ in $(seq 200); do grep -q RESULT "$WORK/half.out" && break; sleep 0.1; done
echo "    nobody: $(cat "$WORK/half.out")"
for i in 1 2 3; do
  check "root's client accelerated while nobody holds 200 offers and 300 silent connections too ($i)" colo_pong
done
check "the per-uid bound of pending offers is a quarter of the numbers" grep -q "8 offers pending from uid 65534 (the limit per uid)" "$WORK/redis.log"
check "redis alive" sh -c "redis-cli -p $P ping | grep -q PONG"
finish
