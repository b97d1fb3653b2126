#!/usr/bin/env bash
# Issue 21, finding 7 (a): IPV6_V6ONLY. In a network namespace of its own with
# net.ipv6.bindv6only=1, a server on [::]:P refuses TCP to 127.0.0.1:P; a colo client dialing
# 127.0.0.1:P reaches its rendezvous colo/1/[::]:P (the dual-stack fallback of the lookup) and
# must be refused the same way: ECONNREFUSED, not a connection (the listener answers
# REJECT(NOT_SERVED), spec/WIRE.md section 3). Its IPv6 clients keep shared memory. Not an
# attack by nobody: root's own clients must not connect where the kernel refuses them.
source "$(dirname "$0")/lib.sh"
unshare -n sleep 300 & NSPID=$!; PIDS+=($NSPID)
sleep 0.2
in_ns() { timeout 15 nsenter --net=/proc/$NSPID/ns/net "$@"; }
in_ns sh -c "ip link set lo up && sysctl -qw net.ipv6.bindv6only=1" || bad "namespace set-up"
check "the namespace has bindv6only=1" test "$(in_ns cat /proc/sys/net/ipv6/bindv6only)" = 1
P=7000
# refused HOSTPORT: a plain TCP connect there is refused in the namespace.
refused() { in_ns /usr/bin/python3 -c "
import socket, sys
h, p = sys.argv[1].rsplit(':', 1)
try:
    socket.create_connection((h.strip('[]'), int(p)), timeout=5)
except ConnectionRefusedError:
    sys.exit(0)
sys.exit(1)" "$1"; }

# The Rust API listener (std's bind follows bindv6only).
nsenter --net=/proc/$NSPID/ns/net env COLO_LOG=info $PEER server "[::]:$P" stream >"$WORK/server.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/server.out" && break; sleep 0.05; done
check "the Rust API server is up on [::]:$P" grep -q READY "$WORK/server.out"
check "plain TCP to 127.0.0.1:$P is refused by the kernel" refused "127.0.0.1:$P"
in_ns env COLO_LOG=info $PEER client "127.0.0.1:$P" halfclose >"$WORK/v4.out" 2>"$WORK/v4.err"
check "the Rust API client to 127.0.0.1:$P is refused too" grep -q "Connection refused" "$WORK/v4.err"
check "... having been told NOT_SERVED" grep -q "refused: its TCP socket does not take connections to that address" "$WORK/v4.err"
check "... which the listener logged" grep -q "which this TCP socket does not serve" "$WORK/server.out"
out=$(in_ns $PEER client "[::1]:$P" stream 100000 2>&1)
check "its IPv6 clients keep shared memory" test "$out" = "OK 100000 colo"

# The shim on both sides: redis under colo run on [::] (redis sets IPV6_V6ONLY itself).
P2=7001
nsenter --net=/proc/$NSPID/ns/net env COLO_LOG=info $COLORUN redis-server --bind :: --port $P2 --save '' --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do [ "$(in_ns redis-cli -h ::1 -p $P2 ping 2>/dev/null)" = PONG ] && break; sleep 0.05; done
check "redis under colo run is up on [::]:$P2" test "$(in_ns redis-cli -h ::1 -p $P2 ping 2>/dev/null)" = PONG
check "plain TCP to 127.0.0.1:$P2 is refused by the kernel" refused "127.0.0.1:$P2"
out=$(in_ns env COLO_LOG=info $COLORUN redis-cli -h 127.0.0.1 -p $P2 ping 2>&1)
check "redis-cli under colo run to 127.0.0.1:$P2 is refused too" bash -c 'grep -q "Connection refused" <<<"$1"' _ "$out"
out=$(in_ns env COLO_LOG=info $COLORUN redis-cli -h ::1 -p $P2 ping 2>"$WORK/v6cli.err")
check "... and over IPv6 gets its answer" test "$out" = PONG
check "... over shared memory" grep -q ": accelerated (shared memory)" "$WORK/v6cli.err"
finish
