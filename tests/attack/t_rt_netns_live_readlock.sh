#!/usr/bin/env bash
# Red team: a reader of COLO_NETNS_DIR must not keep a restarted server from serving other
# namespaces. A server in a container is its pid namespace's pid 1, so its rendezvous is
# `colo-1-<port>` at every start, and a killed one leaves its files. Any reader of the directory
# (a client tenant with the read-only mount; here nobody, py/live_rdlock.py) can take an open
# file description read lock on the dead server's `colo-1-<port>.live`. The restarted server
# opened that same file and asked for the write lock, which the read lock refused: it served
# its own namespace only, for as long as the reader held the lock, and no client of another
# namespace was accelerated. Each server here runs as pid 1 (unshare --pid --fork) in its
# namespace, is killed (SIGKILL: its files stay), nobody read-locks the stale `.live`, and the
# server starts again on the same port.
# Must hold: root's colo client in another namespace gets its 1000 bytes back over shared
# memory (`OK 1000 colo`) from the restarted server: 1. the Rust API example server; 2. the Go
# one (cmd/colo-peer).
source "$(dirname "$0")/lib.sh"
source "$HERE/netns_lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && timeout 240 go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
ns_up atkl 22 || { bad "could not make the namespaces"; finish; }
cp "$HERE/py/live_rdlock.py" "$WORK/" && chmod 644 "$WORK/live_rdlock.py"
D=$WORK/ns && mkdir "$D" && chmod 755 "$D"
SRV=
# start LOG BINARY PORT: BINARY's server on IP_S:PORT as pid 1 of a pid namespace of its own;
# waits for its READY.
start() {
  "${IN_S[@]}" timeout -s KILL 60 unshare --pid --fork --kill-child env COLO_LOG=info COLO_NETNS_DIR="$D" \
    COLO_NETNS_CLIENTS="10.77.$N.0/24" "$2" server "$IP_S:$3" stream >"$1" 2>&1 &
  SRV=$!
  for _ in $(seq 100); do grep -qs READY "$1" && break; sleep 0.05; done
  grep -qs READY "$1" || bad "the server did not start: $(tr '\n' ' ' <"$1")"
}
# stop: SIGKILL to unshare, which (--kill-child) kills the server: nothing of it cleans up.
stop() {
  [ -n "$SRV" ] || return 0
  local u; u=$(pgrep -P "$SRV")
  [ -n "$u" ] && kill -KILL $u 2>/dev/null
  wait "$SRV" 2>/dev/null
  SRV=
}
trap 'trap "" INT TERM; stop; ns_exit' EXIT
PORT=7021
for impl in rust go; do
  if [ $impl = rust ]; then BIN=$PEER; else BIN=$GOPEER; fi
  [ -x "$BIN" ] || { bad "$impl: no $BIN"; continue; }
  PORT=$((PORT + 1)) L=$D/colo-1-$PORT.live
  start "$WORK/$impl-first.log" "$BIN" "$PORT"
  check "$impl: the first server, pid 1, has its rendezvous colo-1-$PORT" test -S "$D/colo-1-$PORT" -a -f "$L"
  stop
  check "$impl: the killed server left colo-1-$PORT.live" test -f "$L"
  "${IN_C[@]}" "${NOBODY[@]}" timeout 60 /usr/bin/python3 "$WORK/live_rdlock.py" "$L" 60 >"$WORK/$impl-rdlock.out" 2>&1 &
  ATK=$!; PIDS+=($ATK)
  for _ in $(seq 100); do grep -qs "LOCKED\|FAILED\|Error" "$WORK/$impl-rdlock.out" && break; sleep 0.05; done
  check "$impl: nobody read-locked the stale colo-1-$PORT.live ($(cat "$WORK/$impl-rdlock.out"))" grep -q "^LOCKED" "$WORK/$impl-rdlock.out"
  start "$WORK/$impl-second.log" "$BIN" "$PORT"
  out=$("${IN_C[@]}" env COLO_NETNS_PEERS="$IP_S" COLO_NETNS_PEER_DIR="$D" timeout 20 "$PEER" client "$IP_S:$PORT" stream 1000 2>&1)
  check "$impl: the restarted server serves another namespace over shared memory ($(echo "$out" | tail -n 1); $(grep -h "namespace only" "$WORK/$impl-second.log"))" \
    grep -q "^OK 1000 colo" <<<"$out"
  stop
  kill "$ATK" 2>/dev/null; wait "$ATK" 2>/dev/null
done
finish
