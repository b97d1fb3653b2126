#!/usr/bin/env bash
# Red team: a peer must not make any thread of root's server wait by handing it a socket it
# keeps a reference to. A HELLO's segment slot (py/rearm_gift.py) carries a TCP socket with bytes
# it cannot send (nobody's own peer never reads); the server turns its lingering off as it
# receives it (t_rt_linger_gift.sh), but lingering is the socket's, and nobody, who kept its own
# reference, turns it back on the moment it reads off through it and closes that reference: the
# server's close of the refused descriptor is then the last, and waits out the linger (600 s) in
# the thread that reads HELLOs. Against root's redis under colo run (its offers thread, which
# holds the service's lock that redis's own accepts wait for), the Rust API example server (its
# accept loop) and Go's colo-peer: after nobody's wins, root's client is served (10 s watchdog),
# no thread of the server waits in a socket's close, and redis's descriptors come back.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/rearm_gift.py" "$HERE/colo_attack.py" "$HERE/doorbell_attacker.py" "$WORK/" && chmod 644 "$WORK"/*.py
# lingering PID: no thread of PID sleeps in a TCP socket's close (sk_stream_wait_close waits in
# wait_woken; the servers' idle threads sleep in epoll or a futex).
lingering() { grep -l wait_woken /proc/"$1"/task/*/wchan 2>/dev/null | grep -q .; }
not_lingering() { ! lingering "$1" || { echo "    a thread of pid $1 waits in a close"; return 1; }; }
# attack P NAME: nobody races the server at 127.0.0.1:P until it won twice (or 40 tries).
attack() {
  rm -f "$WORK/leave"
  LEAVE=$WORK/leave as_nobody timeout 60 /usr/bin/python3 "$WORK/rearm_gift.py" "$1" 2 40 30 >"$WORK/$2.out" 2>&1 &
  ATT=$!; PIDS+=($ATT)
  for _ in $(seq 300); do grep -qs "TRIES\|Traceback" "$WORK/$2.out" && break; sleep 0.1; done
  check "$2: nobody's race ran ($(tr '\n' ' ' <"$WORK/$2.out"))" grep -q "TRIES" "$WORK/$2.out"
}
leave() { touch "$WORK/leave"; wait "$ATT" 2>/dev/null; }
pong() { [ "$(timeout 10 "$@" 2>/dev/null)" = PONG ]; }
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || exit 1
REDIS=${PIDS[-1]}
pong $COLORUN redis-cli -p "$P" ping # the shim's threads and descriptors, before the baseline
sleep 0.5
F0=$(fds "$REDIS")
attack "$P" redis
check "redis: no thread waits in a close" not_lingering "$REDIS"
check "redis: a colo client is answered" pong $COLORUN redis-cli -p "$P" ping
check "redis: a plain client is answered" pong redis-cli -p "$P" ping
leave
check "redis: descriptors back to baseline $F0" fds_back "$REDIS" "$F0"
served() { local o; o=$(timeout 10 "$PEER" client "127.0.0.1:$1" stream 100000 2>&1); grep -q "^OK 100000 colo$" <<<"$o" || { echo "    client: $(tail -1 <<<"$o")"; return 1; }; }
GOPEER=$WORK/colo-peer-go
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go: cannot build go/cmd/colo-peer"
for L in rust go; do
  bin=$PEER; [ "$L" = go ] && bin=$GOPEER
  [ -x "$bin" ] || continue
  P=$(free_port)
  COLO_LOG=info "$bin" server "127.0.0.1:$P" stream >"$WORK/srv-$L.log" 2>&1 & SRV=$!; PIDS+=($SRV)
  wait_port "$P" || { bad "$L: server did not start"; continue; }
  attack "$P" "$L"
  check "$L: no thread waits in a close" not_lingering "$SRV"
  check "$L: root's client is served over shared memory" served "$P"
  leave
  check "$L: server alive" kill -0 "$SRV"
  kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
done
finish
