#!/usr/bin/env bash
# Red team: a client's choice of message pool must not cost a server memory it never uses. The
# client chooses the segment's geometry, a pool of up to 65536 slots a direction included; the
# Rust core and the Go package made, for every connection with a pool, their per-slot
# bookkeeping of both directions at once (the slots free to loan, those in flight, those the
# application holds: about 384 KiB for 65536 slots, most of it written), whether or not the
# program ever used a message. The shim never does. nobody (py/pool_heap.py) opens 200 CARRIER
# connections with 65536-slot pools (sparse memfds of 10 MB, which cost it nothing) to root's
# redis under colo run, the Rust API example server and the Go one (stream echo, no message
# ever), and holds them: their anonymous memory grew by 52, 77 and 48 MB more than for 200
# connections without a pool (0.75 MB for redis). Now the bookkeeping is made at a side's first
# loan or receive (colo::shm MsgTx::free_slots and Messages::held; Go's poolState): the growth
# must stay within 8 MB of the pool-less control.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/pool_heap.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
rss() { awk '/^RssAnon/ {print $2}' "/proc/$1/status"; }
# grow PID SLOTS: kB of RssAnon the server took for nobody's 200 connections (echoed).
grow() {
  local out=$WORK/ph.out r0 r1
  r0=$(rss "$1")
  rm -f "$out.leave"
  as_nobody env LEAVE="$out.leave" timeout 100 /usr/bin/python3 "$WORK/pool_heap.py" "$P" 200 "$2" 30 >"$out" 2>&1 &
  local att=$!; PIDS+=($!)
  for _ in $(seq 600); do grep -qs "SET\|Traceback" "$out" && break; sleep 0.1; done
  grep -q "SET {'WELCOME': 200}" "$out" || { echo "    attacker: $(head -c 300 "$out")" >&2; echo 999999; return; }
  sleep 1
  r1=$(rss "$1")
  touch "$out.leave"
  wait "$att"
  sleep 2
  echo $((r1 - r0))
}
# attack LABEL PID SERVED-CMD...
attack() {
  local label=$1 pid=$2 plain pool; shift 2
  "$@" || bad "$label: root's client before"
  plain=$(grow "$pid" 0)
  pool=$(grow "$pid" 65536)
  check "$label: 200 connections with 65536-slot pools cost the server ${pool} kB, without a pool ${plain} kB" test "$pool" -le $((plain + 8192))
  check "$label: the server is alive" kill -0 "$pid"
  check "$label: root's client is served after" "$@"
}
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || exit 1
SRV=${PIDS[-1]}
redis_client() { [ "$(timeout 5 $COLORUN redis-cli -p "$P" ping 2>/dev/null)" = PONG ]; }
attack redis "$SRV" redis_client
P=$(free_port)
"$PEER" server "127.0.0.1:$P" stream >"$WORK/peer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || exit 1
rust_client() { timeout 10 "$PEER" client "127.0.0.1:$P" stream 100000 | grep -q "^OK 100000 "; }
attack rust "$SRV" rust_client
P=$(free_port)
"$GOPEER" server "127.0.0.1:$P" stream >"$WORK/gopeer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || exit 1
go_client() { timeout 10 "$GOPEER" client "127.0.0.1:$P" stream 100000 | grep -q "^OK 100000 "; }
attack go "$SRV" go_client
finish
