#!/usr/bin/env bash
# Red team: a rendezvous name another user squats must cost a client no more than a refusal.
# nobody binds colo/1/127.0.0.1:P with a SOCK_SEQPACKET listener that never accepts and fills its
# backlog itself (py/backlog_squatter.py). A client's connect(2) to a Unix socket whose backlog
# is full waits for room without a bound unless SO_SNDTIMEO is set; the same-namespace lookup
# (colo::carrier::connect_rendezvous -> colo_sys::seqpacket::connect) sets none (the cross-
# namespace one and Go's dial do bound it). Two victims: root's redis under colo run bound to the
# wildcard 0.0.0.0:P (its rendezvous colo/1/0.0.0.0:P comes after the squatted name in the lookup
# order), and root's plain redis (no colo listener at all). root's `colo run redis-cli ping`
# must answer PONG (watchdog 10 s). Before: both hung until the squatter let go (98 s of 100 by
# hand; here killed by the watchdog).
source "$(dirname "$0")/lib.sh"
COLORUN=${ATTACK_COLORUN:-$COLORUN}
cp "$HERE/py/backlog_squatter.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port); Q=$(free_port)
start_redis "$P" colo --bind 0.0.0.0 --protected-mode no || exit 1
start_redis "$Q" "" --bind 127.0.0.1 || exit 1
pong() { [ "$(timeout 10 $COLORUN redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; }
check "root's colo client reaches the wildcard colo server before the squat" pong "$P"
for port in "$P" "$Q"; do
  as_nobody timeout 60 /usr/bin/python3 "$WORK/backlog_squatter.py" "colo/1/127.0.0.1:$port" 60 >"$WORK/sq-$port.out" 2>&1 &
  PIDS+=($!)
done
for _ in $(seq 100); do [ "$(grep -c READY "$WORK"/sq-*.out 2>/dev/null | awk -F: '{s+=$2} END {print s}')" = 2 ] && break; sleep 0.05; done
check "the squatter holds both names with full backlogs ($(cat "$WORK"/sq-*.out | tr '\n' ' '))" test "$(cat "$WORK"/sq-*.out | grep -c READY)" = 2
check "root's colo client still reaches root's wildcard colo server" pong "$P"
check "root's colo client still reaches root's plain server" pong "$Q"
finish
