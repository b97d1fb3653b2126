#!/usr/bin/env bash
# Red team: a peer must not make any thread of root's server wait by handing it a Unix socket
# whose queue holds a lingering TCP socket (t_rt_linger_gift.sh's gift, one level down). The
# server disarms every descriptor it receives (lingering off), but a Unix socket's close
# releases what its queue holds, in the closing thread, undisarmed. And SO_PASSRIGHTS, which the
# server turns off on its doorbell end, is that socket's own option: the client made the pair,
# kept a copy of the server's end, and turns it back on. nobody (py/nested_gift.py) so hands
# root's redis under colo run, then the Rust API example server (WHERE in the script):
#   nested  on the doorbell of a welcomed connection, then rings (redis's event loop drains);
#   deep    a chain of 40 Unix sockets, the lingering socket at the bottom;
#   early   queued on the doorbell before the HELLO (the claim takes the doorbell's queue);
#   slot    in the HELLO's segment slot (refused);
#   expire  queued on the doorbell after the server read a HELLO whose TCP connection never
#           comes (the offer expires after 5 s and is dropped, in redis under the offers' lock).
# After each, the server must answer a plain and a colo client (5 s watchdog; the gift lingers
# 600 s) and, once the attacker left, have its descriptors back. Each redis case failed before
# the fix (nested, deep, early: no PONG for a plain client; slot, expire: none for a colo one).
# The Rust API example server held already (its HELLOs are read off the accepting thread): kept
# as a regression test. The Go server kept serving, but each nested gift held one of its
# threads in the lingering close (nested and early failed before).
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/nested_gift.py" "$HERE/doorbell_attacker.py" "$WORK/" && chmod 644 "$WORK"/*.py
pong() { [ "$(timeout 5 "$@" 2>/dev/null)" = PONG ]; }
nfds() { ls "/proc/$1/fd" | wc -l; }
attack() { # PORT WHERE HOLD OUT: the attacker, until it says GIVEN (or fails)
  as_nobody timeout 60 /usr/bin/python3 "$WORK/nested_gift.py" "$1" "$2" 600 "$3" >"$4" 2>&1 &
  ATT=$!; PIDS+=($!)
  for _ in $(seq 150); do grep -qs "GIVEN\|Traceback" "$4" && break; sleep 0.1; done
  check "$2: the attacker's gift was given ($(tr '\n' ' ' <"$4"))" grep -q "GIVEN $2" "$4"
}
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || exit 1
REDIS=${PIDS[-1]}
pong $COLORUN redis-cli -p "$P" ping # the shim's threads and descriptors, before the baseline
sleep 0.5
F0=$(nfds "$REDIS")
for w in nested deep early slot expire; do
  attack "$P" "$w" 8 "$WORK/$w.out"
  sleep 1
  check "$w: redis answers a plain client while nobody holds the gift's peer" pong redis-cli -p "$P" ping
  check "$w: ... and a colo client" pong $COLORUN redis-cli -p "$P" ping
  kill "$ATT" 2>/dev/null; wait "$ATT"
done
for _ in $(seq 100); do [ "$(nfds "$REDIS")" -le "$F0" ] && break; sleep 0.1; done
check "redis's descriptors back to baseline ($(nfds "$REDIS"), baseline $F0)" test "$(nfds "$REDIS")" -le "$F0"
P=$(free_port)
"$PEER" server "127.0.0.1:$P" stream >"$WORK/peer.log" 2>&1 & PIDS+=($!)
wait_port "$P" || exit 1
for w in slot expire; do
  attack "$P" "$w" 8 "$WORK/peer-$w.out"
  check "peer $w: another client is served, on shared memory" sh -c "timeout 10 '$PEER' client 127.0.0.1:$P stream 1000 | grep -q '^OK 1000 colo'"
  kill "$ATT" 2>/dev/null; wait "$ATT"
done
# The Go server: a gift's close held one of its threads for the linger (the runtime starts
# another, up to its limit of 10,000 threads, at which it ends the program).
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
P=$(free_port)
$GOPEER server "127.0.0.1:$P" stream >"$WORK/go-server.log" 2>&1 & PIDS+=($!)
GOSRV=$!
wait_port "$P" || exit 1
lingering() { grep -l sk_stream_wait_close /proc/"$GOSRV"/task/*/stack 2>/dev/null | wc -l; }
for w in nested early slot expire; do
  attack "$P" "$w" 8 "$WORK/go-$w.out"
  sleep 1
  check "go $w: no thread of the Go server waits in a lingering close ($(lingering))" test "$(lingering)" = 0
  check "go $w: another client is served, on shared memory" sh -c "timeout 10 '$GOPEER' client 127.0.0.1:$P stream 1000 | grep -q '^OK 1000 colo'"
  kill "$ATT" 2>/dev/null; wait "$ATT"
done
finish
