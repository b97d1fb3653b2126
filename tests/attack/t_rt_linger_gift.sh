#!/usr/bin/env bash
# Red team: a peer must not make any thread of root's server wait by handing it a descriptor.
# The last close of a TCP socket with SO_LINGER {1, N} and bytes it cannot send (its peer, kept
# by the attacker, never reads) waits up to N seconds in the thread that drops it, whatever
# O_NONBLOCK says; the kernel drops a passed descriptor in the receiving thread when it discards
# it (a recv without room in a control buffer, the close of a socket whose queue holds it).
# nobody (py/linger_gift.py) hands such sockets (N = 600) to root's redis under colo run:
#   bell          on its doorbell end after the handshake, then rings (redis's event loop drains
#                 the doorbell: before the fix, with recv and no control buffer, and waited);
#   control       on the control socket after the handshake;
#   hello         in a HELLO's segment slot (refused, then closed);
#   bell_early    20 queued on the doorbell before the HELLO, then a hang-up (redis closes the
#                 connection with them queued);
#   control_early one queued right behind the HELLO, then a hang-up.
# After each, redis must answer a plain and a colo client at once (5 s watchdog), and once the
# attacker left, have its descriptors back. Then the Rust API example server (its listener
# thread reads HELLOs): a HELLO with a gift in a slot, or one queued behind it, is answered
# (refused) at once, not after the gift's linger, and another client is served.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/linger_gift.py" "$HERE/doorbell_attacker.py" "$WORK/" && chmod 644 "$WORK"/*.py
pong() { [ "$(timeout 5 "$@" 2>/dev/null)" = PONG ]; }
nfds() { ls "/proc/$1/fd" | wc -l; }
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || exit 1
REDIS=${PIDS[-1]}
pong $COLORUN redis-cli -p "$P" ping # the shim's threads and descriptors, before the baseline
sleep 0.5
F0=$(nfds "$REDIS")
for w in bell control hello bell_early control_early; do
  as_nobody timeout 60 /usr/bin/python3 "$WORK/linger_gift.py" "$P" "$w" 600 8 >"$WORK/$w.out" 2>&1 &
  ATT=$!; PIDS+=($!)
  for _ in $(seq 150); do grep -qs "GIVEN\|Traceback" "$WORK/$w.out" && break; sleep 0.1; done
  check "$w: the attacker's connection was made ($(tr '\n' ' ' <"$WORK/$w.out"))" grep -q "GIVEN $w" "$WORK/$w.out"
  sleep 1
  check "$w: redis answers a plain client while nobody holds the gifts' peers" pong redis-cli -p "$P" ping
  check "$w: ... and a colo client" pong $COLORUN redis-cli -p "$P" ping
  kill "$ATT" 2>/dev/null; wait "$ATT"
done
for _ in $(seq 100); do [ "$(nfds "$REDIS")" -le "$F0" ] && break; sleep 0.1; done
check "redis's descriptors back to baseline ($(nfds "$REDIS"), baseline $F0)" test "$(nfds "$REDIS")" -le "$F0"
P=$(free_port)
"$PEER" server "127.0.0.1:$P" stream >"$WORK/peer.log" 2>&1 & PIDS+=($!)
wait_port "$P" || exit 1
for w in hello control_early; do
  as_nobody timeout 60 /usr/bin/python3 "$WORK/linger_gift.py" "$P" "$w" 600 3 >"$WORK/peer-$w.out" 2>&1
  # Refused (a gift queued behind the HELLO), or welcomed when the server had read the HELLO
  # first and the kernel then refused the gift (SO_PASSRIGHTS): either way an answer, not a wait.
  answered() { grep -q "answer ('reject'" "$1" || { grep -q "refused" "$1" && grep -q "answer ('welcome'" "$1"; }; }
  check "peer $w: answered at once ($(tr '\n' ' ' <"$WORK/peer-$w.out"))" answered "$WORK/peer-$w.out"
  check "peer $w: another client is served" sh -c "timeout 10 '$PEER' client 127.0.0.1:$P stream 1000 | grep -q '^OK 1000 '"
done
finish
