#!/usr/bin/env bash
# Red team: a client of another user's IPV6_V6ONLY listener must not get, over colo, an IPv4
# connection TCP would refuse. nobody listens on [::]:P with IPV6_V6ONLY and binds colo/1/[::]:P;
# nothing listens for IPv4 on P (root's own server there is down, say, between two runs).
# root's Rust and Go API clients dialing 127.0.0.1:P must be refused as its TCP connect is, and send
# nobody nothing (connecting to the rendezvous and hanging up is all it may do). The shim's
# clients are safe: their CARRIER offer waits for a real TCP connect, which is refused. Before: the client's peer check found nobody's [::]:P listener in the kernel's
# table (which does not say V6ONLY), trusted it, and relied on that very server to answer
# NOT_SERVED; nobody answered WELCOME and read the client's bytes.
source "$(dirname "$0")/lib.sh"
mkdir -p "$WORK/py" && cp "$HERE/py/v6only_squatter.py" "$WORK/py/" && cp "$HERE/colo_attack.py" "$WORK/"
P=$(free_port)
as_nobody timeout 30 /usr/bin/python3 "$WORK/py/v6only_squatter.py" "$P" 12 >"$WORK/squat.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/squat.out" && break; sleep 0.05; done
check "nobody listens on [::]:$P (V6ONLY) with its rendezvous" grep -q READY "$WORK/squat.out"
check "root's plain TCP connect to 127.0.0.1:$P is refused" sh -c "! timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$P' 2>/dev/null"
out=$(timeout 15 env COLO_LOG=info $PEER client "127.0.0.1:$P" stream 1000 2>"$WORK/client.err")
check "root's Rust API client is refused too (got: ${out:-nothing}; $(tail -1 "$WORK/client.err"))" sh -c "! echo '$out' | grep -q '^OK'"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
out=$(timeout 15 env COLO_DEBUG=1 $GOPEER client "127.0.0.1:$P" stream 1000 2>"$WORK/go-client.err")
check "root's Go API client is refused too (got: ${out:-nothing}; $(tail -1 "$WORK/go-client.err"))" sh -c "! echo '$out' | grep -q '^OK'"
sleep 0.5
check "nobody got no HELLO, no descriptor ($(grep -c HELLO "$WORK/squat.out"))" sh -c "! grep -q HELLO '$WORK/squat.out'"
check "... and no byte ($(grep -c GOT "$WORK/squat.out"))" sh -c "! grep -q GOT '$WORK/squat.out'"
finish
