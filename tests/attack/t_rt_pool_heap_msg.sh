#!/usr/bin/env bash
# Red team (pending: fails today): a client's choice of message pool must not cost a server that
# uses messages memory in proportion to the slot count rather than to its use. t_rt_pool_heap.sh
# made the per-slot bookkeeping wait for a side's first loan or receive, so a server that never
# uses a message pays none; a message server still pays all of it at its first one: the Rust
# core's `MsgTx::free_slots` (a u32 a slot), `in_flight` and `Messages::held` (a byte a slot),
# Go's poolState `free`, `state` and `held` likewise, about 384 KiB for 65536 slots. nobody
# (py/pool_heap.py ... send) opens 200 CARRIER connections with 65536-slot pools to root's
# message echo servers (the Rust API example and Go colo-peer, `msg`) and sends one 8-byte
# message on each: their anonymous memory grew by 36 MB (Rust) and 58 MB (Go), where TCP
# connections that carried the same bytes cost a few KiB each.
# Fix directions: bitsets for in_flight and held (65536 slots: 8 KiB each), and the free slots
# as a count of slots never loaned (`fresh`: slots fresh.. are free) plus a stack of the slots
# taken back, which grows only with slots actually in use; or a per-uid budget of bookkeeping.
# Run: bash tests/attack/pending/t_rt_pool_heap_msg.sh (as root).
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$HERE/../../.." && pwd); TARGET=${CARGO_TARGET_DIR:-$ROOT/rust/target}; PEER=$TARGET/release/examples/peer
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/../py/pool_heap.py" "$HERE/../colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
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
