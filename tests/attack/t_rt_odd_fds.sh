#!/usr/bin/env bash
# Red team: odd descriptors in a HELLO (py/odd_fds.py, as nobody, CARRIER): a pipe, a directory,
# /dev/zero, an O_PATH or read-only descriptor of a valid segment, a segment sealed against
# writing (F_SEAL_WRITE, F_SEAL_FUTURE_WRITE) or not against more seals, a listening, an
# unconnected, an O_PATH or a half-shut socket as the doorbell, a dup of it in the second slot,
# two or four descriptors. Each is refused or served like any connection (its end of the doorbell
# at end of stream or in error is a hang-up); root's server stays up, serves another client, and
# has its descriptors back once nobody left.
#   1. the Rust API example server;  2. the Go one (cmd/colo-peer);  3. redis under colo run.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/odd_fds.py" "$HERE/doorbell_attacker.py" "$WORK/" && chmod 644 "$WORK"/*.py
nfds() { ls "/proc/$1/fd" | wc -l; }
back_to() { for _ in $(seq 100); do [ "$(nfds "$1")" -le "$2" ] && return 0; sleep 0.1; done; echo "    $(nfds "$1") descriptors, baseline $2"; return 1; }
# attack LABEL PID SERVED-CMD...
attack() {
  local label=$1 pid=$2 f0; shift 2
  "$@" || bad "$label: root's client before"
  sleep 1.5
  f0=$(nfds "$pid")
  as_nobody timeout 120 /usr/bin/python3 "$WORK/odd_fds.py" "$P" >"$WORK/$label.out" 2>&1
  check "$label: every case was tried ($(tail -1 "$WORK/$label.out"))" grep -q "RESULT cases=" "$WORK/$label.out"
  check "$label: the honest HELLO among them was welcomed" grep -q "CASE honest ('welcome'" "$WORK/$label.out"
  check "$label: no odd segment was welcomed" sh -c "! grep -E 'CASE (pipe|fifo|o_path_memfd|read_only|write_sealed|future_write|seals_open|dev_zero|directory|listening|unconnected|o_path_socket|dup_of|half_shut|four|two).*welcome' '$WORK/$label.out'"
  check "$label: the server is alive" kill -0 "$pid"
  check "$label: root's client is served after" "$@"
  sleep 1.5
  check "$label: descriptors back to baseline" back_to "$pid" "$f0"
}
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
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || exit 1
SRV=${PIDS[-1]}
redis_client() { [ "$(timeout 5 $COLORUN redis-cli -p "$P" ping 2>/dev/null)" = PONG ]; }
attack redis "$SRV" redis_client
finish
