#!/usr/bin/env bash
# Red team: a user's half-finished handshakes must not take most of an API server's limit of
# open files. A Rust or Go listener keeps rendezvous connections without a HELLO and CARRIER
# offers waiting for their TCP connection for 5 s, 1024 of each (Go: of both) and a quarter of
# that per uid; each holds descriptors (its control socket, an offer also its memfd), where over
# TCP a client that has not finished its handshake holds none of the server's. nobody
# (colo_attack.py half_handshakes) opens 300 silent rendezvous connections and 300 offers to
# root's echo server (the Rust API's peer example, then Go's colo-peer) under `ulimit -n 1024`,
# and keeps them. Before: the Rust server held 768 descriptors of them (three quarters of its
# limit: four such users left it none, its accepts failing with EMFILE). Now a listener keeps
# an eighth of a low soft limit of each kind (halfopen::bound, Go's halfOpenBound: 128 here, 32
# per uid) and refuses the rest with REJECT(NO_RESOURCES). Must hold: the server's descriptors
# within 120 of its baseline while nobody holds everything, root's client accelerated. ~15 s.
source "$(dirname "$0")/lib.sh"
# half_open L: nobody's 300 silent rendezvous connections and 300 offers to the server on P.
half_open() {
local L=$1 base; base=$(fds "$SRV")
as_nobody timeout 60 /usr/bin/python3 "$HERE/colo_attack.py" half_handshakes "$P" 300 300 20 >"$WORK/att-$L.out" 2>&1 & ATT=$!; PIDS+=($ATT)
for _ in $(seq 300); do grep -q RESULT "$WORK/att-$L.out" && break; sleep 0.1; done
sleep 0.5
echo "    nobody: $(cat "$WORK/att-$L.out")"
check "$L: nobody made its 600 connections" grep -q "RESULT held=" "$WORK/att-$L.out"
local now; now=$(fds "$SRV")
check "$L: the server's descriptors: at most $((base + 120)) ($now, baseline $base)" test "$now" -le $((base + 120))
}
against_api_servers half_open
finish
