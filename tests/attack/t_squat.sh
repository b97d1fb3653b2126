#!/usr/bin/env bash
# Issue 21, finding 3: a rendezvous name squatted by another user. nobody binds the name of root's
# TCP address (colo/1/127.0.0.1:P) before root's server starts, plus a decoy TCP listener of its
# own on the same port (127.0.0.2:P) that a port-only peer check took for proof. root's clients
# (redis-cli under colo run, the Rust API peer) must reach the real server, over plain TCP, and
# send the squatter nothing (spec/WIRE.md section 2, "Peer check"). The variant: root's plain
# TCP server on the exact address, nobody's name for the wildcard (colo/1/0.0.0.0:P).
source "$(dirname "$0")/lib.sh"
PASSWORD=attack-squat-$RANDOM$RANDOM
SQUATTER="$(dirname "$0")/squatter.py"
cp "$SQUATTER" "$WORK/squatter.py"
# squat NAME DECOY OUT: starts the squatter as nobody and waits for it.
squat() {
  as_nobody /usr/bin/python3 "$WORK/squatter.py" "$1" "$2" >"$3" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do grep -qs READY "$3" && return 0; sleep 0.05; done
  echo "squatter never ready: $(cat "$3")"; return 1
}
# got_nothing OUT: the squatter received no byte and no descriptor (connecting and hanging up
# without a word is all a client may do).
got_nothing() { ! grep GOT "$1" | grep -vq "GOT 0 0 "; }

# 1. root's redis under colo run on 127.0.0.1:P, with a password.
P=$(free_port)
squat "colo/1/127.0.0.1:$P" "127.0.0.2:$P" "$WORK/squat-redis.out" || bad "squatter for redis"
start_redis "$P" colo --bind 127.0.0.1 --requirepass "$PASSWORD"
out=$(timeout 10 env COLO_LOG=info $COLORUN redis-cli -p "$P" --no-auth-warning -a "$PASSWORD" ping 2>"$WORK/redis-cli.err")
check "redis-cli under colo run reaches root's redis past the squatter" test "$out" = PONG
check "... refusing the squatter's rendezvous (logged)" grep -q "owned by uid 65534" "$WORK/redis-cli.err"
sleep 0.3
check "... and sends the squatter nothing (no AUTH, no HELLO, no descriptor)" got_nothing "$WORK/squat-redis.out"
check "... not the password" sh -c "! grep -q '$PASSWORD' '$WORK/squat-redis.out'"

# 2. root's Rust API server on 127.0.0.1:P2 (it finds its name taken and serves TCP only).
P2=$(free_port)
squat "colo/1/127.0.0.1:$P2" "127.0.0.2:$P2" "$WORK/squat-api.out" || bad "squatter for the API server"
COLO_LOG=info $PEER server "127.0.0.1:$P2" stream >"$WORK/api-server.out" 2>&1 & PIDS+=($!)
wait_port "$P2"
out=$(timeout 10 env COLO_LOG=info $PEER client "127.0.0.1:$P2" stream 100000 2>"$WORK/api-client.err")
check "the Rust API client reaches root's API server past the squatter, over TCP" test "$out" = "OK 100000 tcp"
check "... refusing the squatter's rendezvous (logged)" grep -q "owned by uid 65534" "$WORK/api-client.err"
sleep 0.3
check "... and sends the squatter nothing" got_nothing "$WORK/squat-api.out"

# 3. The variant: root's plain redis on the exact address 127.0.0.1:P3 (no colo, so no name of
# its own); nobody holds the wildcard's name colo/1/0.0.0.0:P3 and a decoy on 127.0.0.2:P3.
P3=$(free_port)
squat "colo/1/0.0.0.0:$P3" "127.0.0.2:$P3" "$WORK/squat-wild.out" || bad "squatter for the wildcard"
start_redis "$P3" "" --bind 127.0.0.1 --requirepass "$PASSWORD"
out=$(timeout 10 env COLO_LOG=info $COLORUN redis-cli -p "$P3" --no-auth-warning -a "$PASSWORD" ping 2>"$WORK/redis-cli-wild.err")
check "an exact plain listener and a squatted wildcard name: redis-cli reaches root's redis" test "$out" = PONG
check "... refusing the wildcard's rendezvous (logged)" grep -q "owned by uid 65534" "$WORK/redis-cli-wild.err"
out=$(timeout 10 env COLO_LOG=info $PEER client "127.0.0.1:$P3" halfclose 2>"$WORK/api-client-wild.err")
check "... the Rust API client does not reach the squatter either" grep -q "owned by uid 65534" "$WORK/api-client-wild.err"
sleep 0.3
check "... and both send the squatter nothing" got_nothing "$WORK/squat-wild.out"

# 4. What the check must still allow: a server run as nobody, owning its port, is trusted by
# root's client (shared memory).
P4=$(free_port)
(cd "$WORK" && exec setpriv --reuid=nobody --regid=nogroup --clear-groups env COLO_LOG=info $PEER server "127.0.0.1:$P4" stream) >"$WORK/nobody-server.out" 2>&1 & PIDS+=($!)
wait_port "$P4"
out=$(timeout 10 $PEER client "127.0.0.1:$P4" stream 100000 2>&1)
check "a server of another user that owns its port: root's client uses shared memory" test "$out" = "OK 100000 colo"
# ... and root's Go client too (it asks sock_diag, which shows the listener bound to no device).
GOPEER=$WORK/colo-peer-go
if (cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer); then
  out=$(timeout 10 "$GOPEER" client "127.0.0.1:$P4" stream 100000 2>&1)
  check "... and root's Go client uses shared memory" test "$out" = "OK 100000 colo"
else
  bad "go build colo-peer"
fi
finish
