#!/usr/bin/env bash
# Red team: a client's choice of message pool must not cost a server that uses messages memory
# in proportion to the slot count rather than to its use. The client chooses the pool's slot
# count (up to 65536 a direction); a side's first loan or receive makes its per-slot bookkeeping:
# bitsets of the slots in flight and held (Rust colo::shm `MsgTx::in_flight`, `Messages::held`;
# Go's poolState `loaned`, `inFlight`, `held`: 8 KiB each for 65536 slots), and the free slots
# as the count of slots never loaned plus a stack of the slots taken back, which grows only with
# the slots loaned. nobody (py/pool_heap.py ... send) opens 200 CARRIER connections with
# 65536-slot pools to root's message echo servers (the Rust API example and Go colo-peer, `msg`)
# and sends one 8-byte message on each, which each server receives and echoes: the servers'
# anonymous memory must grow by at most 8 MB (40 KiB a connection).
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/pool_heap.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
rss() { awk '/^RssAnon/ {print $2}' "/proc/$1/status"; }
attack() { # LABEL PID
  local out=$WORK/ph.out r0 r1
  r0=$(rss "$2")
  as_nobody timeout 100 /usr/bin/python3 "$WORK/pool_heap.py" "$P" 200 65536 4 send >"$out" 2>&1 &
  local att=$!; PIDS+=($!)
  for _ in $(seq 600); do grep -qs "SET\|Traceback" "$out" && break; sleep 0.1; done
  check "$1: nobody's 200 connections were answered ($(head -1 "$out"))" grep -q "SET {'WELCOME': 200}" "$out"
  sleep 1
  r1=$(rss "$2")
  wait "$att"
  check "$1: one message on each of 200 connections with 65536-slot pools cost the server $((r1 - r0)) kB" test $((r1 - r0)) -le 8192
}
P=$(free_port)
"$PEER" server "127.0.0.1:$P" msg >"$WORK/peer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || exit 1
attack rust "$SRV"
P=$(free_port)
"$GOPEER" server "127.0.0.1:$P" msg >"$WORK/gopeer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || exit 1
attack go "$SRV"
finish
