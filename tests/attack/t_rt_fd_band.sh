#!/usr/bin/env bash
# Red team: another user must not push root's connections to plain TCP by using up the
# descriptor numbers the shim keeps to. Under a fixed limit of open files (soft = hard: here
# `ulimit -n 1024`) the shim holds its descriptors (five an accelerated connection, two a pending
# offer, one a silent rendezvous connection) in the top sixteenth of the limit, 64 numbers
# (colo_sys::preload::band); the per-uid quarter of COLO_MAX_SEGMENTS bounded segments, not
# those. nobody holds 30 connections to root's redis (under colo run, maxclients 100), then 200
# CARRIER offers never claimed and 300 rendezvous connections that never send a HELLO: root's
# own redis-cli under colo run went plain TCP ("a client of uid 0 left on TCP: ... no descriptor
# number free for it"). Now a uid other than the server's holds the segments of as many
# connections, and as many pending offers, as a quarter of those numbers holds
# (colo::budget::descriptor_share, the shim's offers::most_from); the rest of nobody's
# connections are served over TCP. Must hold: nobody's 30 connections are all answered, at most
# 3 of them accelerated; root's client is accelerated throughout. About 10 s.
source "$(dirname "$0")/lib.sh"
need redis-server || finish
P=$(free_port)
( ulimit -n 1024 && exec env COLO_LOG=info $COLORUN redis-server --port "$P" --bind 127.0.0.1 --save '' --appendonly no \
  --maxclients 100 --dir "$WORK" ) >"$WORK/redis.log" 2>&1 & PIDS+=($!)
wait_port "$P" || finish
colo_pong() { local o; o=$(COLO_LOG=info timeout 10 $COLORUN redis-cli -p "$P" ping 2>&1); grep -q "accelerated (shared memory)" <<<"$o" && grep -q "^PONG$" <<<"$o" || { echo "    client: $o" | tail -2; return 1; }; }
check "root's client accelerated before" colo_pong
as_nobody env COLO_LOG=info timeout 40 $COLORUN /usr/bin/python3 -c '
import socket, sys, time
held = []
for i in range(30):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    s.sendall(b"PING\r\n")
    if s.recv(100) == b"+PONG\r\n":
        held.append(s)
print("RESULT answered=%d" % len(held), flush=True)
time.sleep(30)' "$P" >"$WORK/live.out" 2>&1 & PIDS+=($!)
for _ in $(seq 200); do grep -q RESULT "$WORK/live.out" && break; sleep 0.1; done
A=$(grep -c "accelerated (shared memory)" "$WORK/live.out")
check "nobody's 30 connections are answered ($(grep RESULT "$WORK/live.out"))" grep -q "RESULT answered=30$" "$WORK/live.out"
check "at most 3 of them accelerated, a quarter of the 64 numbers ($A)" test "$A" -le 3
check "the refusal's log line names the descriptors" grep -q "descriptors: uid 65534 holds 3 connections, its quarter of the 64 numbers" "$WORK/redis.log"
check "root's client accelerated while nobody holds its connections" colo_pong
as_nobody timeout 40 /usr/bin/python3 "$HERE/colo_attack.py" half_handshakes "$P" 300 200 25 >"$WORK/half.out" 2>&1 & PIDS+=($!)
for _ in $(seq 200); do grep -q RESULT "$WORK/half.out" && break; sleep 0.1; done
echo "    nobody: $(cat "$WORK/half.out")"
for i in 1 2 3; do
  check "root's client accelerated while nobody holds 200 offers and 300 silent connections too ($i)" colo_pong
done
check "the per-uid bound of pending offers is a quarter of the numbers" grep -q "8 offers pending from uid 65534 (the limit per uid)" "$WORK/redis.log"
check "redis alive" sh -c "redis-cli -p $P ping | grep -q PONG"
finish
