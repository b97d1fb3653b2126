#!/usr/bin/env bash
# Red team: a peer that does not read must not make a non-blocking send block. Once a connection
# has been held by two processes, each write takes the connection's turn (conn/turns.rs) so that
# its bytes stay contiguous; a blocking writer keeps it while it waits for room. nobody's client
# (colo run) connects to root's server (colo run) and never reads; one of the server's writers
# blocks in a large send; a non-blocking send on the same connection must still return at once,
# as over TCP (EAGAIN or a count), in each of py/turn_server.py's modes: a fork child's blocking
# send, a thread's (the process forked once), a relayed subprocess's output. Watchdog: 15 s.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/turn_server.py" "$WORK/" && chmod 644 "$WORK/turn_server.py"
for mode in fork thread relay; do
  P=$(free_port) out=$WORK/turn_$mode.out
  COLO_LOG=info timeout 60 "$COLO" run -- python3 "$WORK/turn_server.py" "$P" "$mode" >"$out" 2>&1 & srv=$!
  PIDS+=($srv)
  for _ in $(seq 100); do grep -q LISTENING "$out" && break; sleep 0.1; done
  as_nobody timeout 60 "$COLO" run -- python3 -c "import socket, time; s = socket.create_connection(('127.0.0.1', $P)); time.sleep(60)" & cl=$!
  PIDS+=($cl)
  for _ in $(seq 100); do grep -q SENDING "$out" && break; sleep 0.1; done
  for _ in $(seq 150); do grep -q RETURNED "$out" && break; sleep 0.1; done
  if ! grep -q "accepted .*accelerated\|accept .*accelerated" "$out"; then
    bad "$mode: the connection was not accelerated: $(grep colo "$out" | head -2)"
  elif grep -q RETURNED "$out"; then
    ok "$mode: the non-blocking send returned while nobody's client does not read ($(grep RETURNED "$out"))"
  else
    bad "$mode: the non-blocking send blocked while nobody's client does not read"
  fi
  kill "$cl" "$srv" 2>/dev/null; wait "$srv" "$cl" 2>/dev/null
done
finish
