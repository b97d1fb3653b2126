#!/usr/bin/env bash
# Issue 21, finding 7 (b): a DIRECT connection has no TCP handshake, so no firewall (netfilter),
# cgroup BPF or Landlock rule ever sees it. A listener takes DIRECT only from a client of its
# own uid; nobody's client is told NEED_CARRIER and comes back with a CARRIER offer over a real
# TCP connection (Rust and Go clients, against Rust and Go listeners), which an iptables rule
# for uid nobody then stops exactly as it stops plain TCP (REJECT: ECONNREFUSED; DROP: no
# connection). A listener that opts in (COLO_DIRECT_ANY_UID=1) takes DIRECT from anyone.
source "$(dirname "$0")/lib.sh"
command -v iptables >/dev/null || { bad "iptables is not installed (tests/apps/packages.txt)"; finish; }
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
RULES=()
rule() { iptables -I OUTPUT "$@" && RULES+=("$*"); }
unrule() { for r in "${RULES[@]}"; do iptables -D OUTPUT $r 2>/dev/null; done; RULES=(); }
trap 'unrule; cleanup' EXIT
# plain_as_nobody PORT: a plain TCP connect as nobody; prints ok, refused or timeout.
plain_as_nobody() { as_nobody /usr/bin/python3 -c "
import socket, sys
try:
    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3); print('ok')
except ConnectionRefusedError: print('refused')
except OSError: print('timeout')" "$1"; }
server_up() { for _ in $(seq 100); do grep -qs READY "$1" && return 0; sleep 0.05; done; return 1; }

P=$(free_port)
COLO_LOG=info $PEER server "127.0.0.1:$P" stream >"$WORK/rust-server.log" 2>&1 & PIDS+=($!)
server_up "$WORK/rust-server.log"
PG=$(free_port)
COLO_DEBUG=1 $GOPEER server "127.0.0.1:$PG" stream >"$WORK/go-server.log" 2>&1 & PIDS+=($!)
server_up "$WORK/go-server.log"

out=$(as_nobody timeout 10 $PEER client "127.0.0.1:$P" stream 100000 2>&1)
check "nobody's Rust client to root's Rust listener: shared memory" test "$out" = "OK 100000 colo"
check "... told NEED_CARRIER for DIRECT" grep -q "DIRECT HELLO from uid 65534: a carrier is required" "$WORK/rust-server.log"
check "... and claimed as a carrier" grep -q "shared memory (carrier" "$WORK/rust-server.log"
out=$(as_nobody timeout 10 $GOPEER client "127.0.0.1:$P" stream 100000 2>&1)
check "nobody's Go client to root's Rust listener: shared memory" test "$out" = "OK 100000 colo"
out=$(as_nobody timeout 10 $PEER client "127.0.0.1:$PG" stream 100000 2>&1)
check "nobody's Rust client to root's Go listener: shared memory" test "$out" = "OK 100000 colo"
out=$(as_nobody timeout 10 $GOPEER client "127.0.0.1:$PG" stream 100000 2>&1)
check "nobody's Go client to root's Go listener: shared memory" test "$out" = "OK 100000 colo"
check "... the Go listener told them NEED_CARRIER for DIRECT" grep -q "DIRECT from another uid: a carrier is required" "$WORK/go-server.log"
before=$(grep -c "shared memory with pid" "$WORK/rust-server.log")
out=$(timeout 10 $PEER client "127.0.0.1:$P" stream 100000 2>&1)
check "root's own client stays DIRECT" sh -c "test '$out' = 'OK 100000 colo' && test \$(grep -c 'shared memory with pid' '$WORK/rust-server.log') -gt $before"

# A firewall rule for uid nobody: REJECT.
for port in $P $PG; do rule -p tcp -d 127.0.0.1 --dport $port -m owner --uid-owner nobody -j REJECT --reject-with tcp-reset; done
check "REJECT for nobody: plain TCP is refused" test "$(plain_as_nobody $P)" = refused
for c in "Rust:$PEER" "Go:$GOPEER"; do
  for s in "Rust:$P" "Go:$PG"; do
    out=$(as_nobody timeout 10 ${c#*:} client "127.0.0.1:${s#*:}" halfclose 2>&1)
    check "REJECT for nobody: nobody's ${c%%:*} client to root's ${s%%:*} listener is refused too" sh -c "echo '$out' | grep -qi 'connection refused'"
  done
done
out=$(timeout 10 $PEER client "127.0.0.1:$P" stream 100000 2>&1)
check "... while root's client is not" test "$out" = "OK 100000 colo"
unrule
# DROP: the SYN goes nowhere; the client must not get a connection (it waits, like TCP).
for port in $P $PG; do rule -p tcp -d 127.0.0.1 --dport $port -m owner --uid-owner nobody -j DROP; done
check "DROP for nobody: plain TCP gets no connection" test "$(plain_as_nobody $P)" = timeout
for c in "Rust:$PEER" "Go:$GOPEER"; do
  for s in "Rust:$P" "Go:$PG"; do
    out=$(as_nobody timeout 4 ${c#*:} client "127.0.0.1:${s#*:}" halfclose 2>&1)
    check "DROP for nobody: nobody's ${c%%:*} client to root's ${s%%:*} listener gets no connection" sh -c "! echo '$out' | grep -q '^OK'"
  done
done
unrule
out=$(as_nobody timeout 10 $PEER client "127.0.0.1:$P" stream 100000 2>&1)
check "rules gone: nobody's client is served again (the listener kept serving)" test "$out" = "OK 100000 colo"

# The opt-in: DIRECT from any uid, which the firewall then does not see.
P3=$(free_port)
COLO_LOG=info COLO_DIRECT_ANY_UID=1 $PEER server "127.0.0.1:$P3" stream >"$WORK/optin.log" 2>&1 & PIDS+=($!)
server_up "$WORK/optin.log"
out=$(as_nobody timeout 10 $PEER client "127.0.0.1:$P3" stream 100000 2>&1)
check "COLO_DIRECT_ANY_UID=1: nobody's client is taken DIRECT" sh -c "test '$out' = 'OK 100000 colo' && grep -q 'shared memory with pid' '$WORK/optin.log' && ! grep -q carrier '$WORK/optin.log'"
finish
