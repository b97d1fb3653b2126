#!/usr/bin/env bash
# Red team: t_rt_squat_backlog.sh with root's Go API client. nobody binds colo/1/127.0.0.1:P
# with a SOCK_SEQPACKET listener that never accepts and fills its backlog itself
# (py/backlog_squatter.py). Root's Go server listens on the wildcard 0.0.0.0:P, whose own
# rendezvous colo/1/0.0.0.0:P comes after the squatted name in the lookup (spec/WIRE.md
# section 2). Go's connectRendezvous retried a full backlog for about 200 ms and then failed the
# whole colo dial (EAGAIN is not ECONNREFUSED): every dial of root's Go client to 127.0.0.1:P
# waited that long and went plain TCP, kept off its own server's shared memory by a name anyone
# may bind. A name whose backlog stays full is no listener, as the Rust core takes it
# (colo_sys::seqpacket::CONNECT_WAIT, 10 ms): the lookup goes on to the next name. Must hold:
# root's Go client reaches root's wildcard Go server over shared memory during the squat.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/backlog_squatter.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
COLO_LOG=info $GOPEER server "0.0.0.0:$P" stream >"$WORK/go-server.log" 2>&1 & PIDS+=($!)
wait_port "$P" || exit 1
# dial_ms: root's Go client sends and reads back 100000 bytes through 127.0.0.1:P; prints the
# client's last line and how long it took.
go_client() {
  local t0 t1 out
  t0=$(date +%s%N)
  out=$(COLO_LOG=info timeout 20 "$GOPEER" client "127.0.0.1:$P" stream 100000 2>"$WORK/client.err" | tail -1)
  t1=$(date +%s%N)
  echo "$out ($(((t1 - t0) / 1000000)) ms)"
}
r=$(go_client); echo "     before the squat: $r"
check "root's Go client reaches the wildcard Go server over shared memory before the squat" grep -q "^OK 100000 colo" <<<"$r"
as_nobody timeout 60 /usr/bin/python3 "$WORK/backlog_squatter.py" "colo/1/127.0.0.1:$P" 60 >"$WORK/sq.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/sq.out" && break; sleep 0.05; done
check "nobody holds colo/1/127.0.0.1:$P with a full backlog ($(cat "$WORK/sq.out"))" grep -q READY "$WORK/sq.out"
for i in 1 2 3; do
  r=$(go_client); echo "     during the squat: $r"
  check "root's Go client still reaches its wildcard Go server over shared memory ($i)" grep -q "^OK 100000 colo" <<<"$r"
done
grep -h "127.0.0.1:$P" "$WORK/client.err" | tail -2 | sed 's/^/     client log: /'
check "root's Go server alive" kill -0 "${PIDS[0]}"
finish
