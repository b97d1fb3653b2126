#!/bin/bash
# colo across network namespaces (issue 26, spec/WIRE.md section 11), on this host, as root.
# Namespaces A (client), B (server), C (attacker), routed through the host over veth pairs.
# B's rendezvous directory is a directory of root's (0755): A uses it as configured, C is
# nobody, or root behind a read-only bind mount. Asserts outcomes (bytes, which connections are
# on shared memory per the shim's log and `colo stat`), then measures redis -c 50 GET across the
# namespaces, colo against plain TCP over the same veth path (printed, not asserted).
# Every command that can hang runs under `timeout`; everything is removed on exit. NETNS_ONLY=14
# runs stanza 14 alone (connect.sh); NETNS_KEEP=1 keeps the logs; NETNS_BENCH=0 skips the bench.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
COLO=${COLO:-$ROOT/rust/target/release/colo}
PROBE="python3 $HERE/nsprobe.py"
[ "$(id -u)" = 0 ] || { echo "tests/netns: needs root (network namespaces)"; exit 1; }
for t in ip iptables redis-server redis-benchmark redis-cli python3 setpriv unshare; do
    command -v $t >/dev/null || { echo "tests/netns: $t is missing"; exit 1; }
done
[ -x "$COLO" ] || { echo "tests/netns: $COLO is missing (make build)"; exit 1; }

. "$HERE/setup.sh"
WORK=$(mktemp -d /tmp/colo-netns.XXXXXX) && chmod 755 "$WORK"
DIR=$WORK/b && mkdir -m 755 "$DIR"
PIDS=()
cleanup() {
    local p
    # TERM first: nginx's master then stops its workers (a killed master orphans them).
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    netns_down
    [ -n "${NETNS_KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
FAILED=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAILED=1; }
netns_up || { echo "tests/netns: could not set up namespaces"; exit 1; }

# B's nginx has a directory of its own, writable by its workers (nobody): each binds its own.
NDIR=$WORK/nginx-colo
mkdir -m 755 "$NDIR" && chown nobody "$NDIR"
CENV=(env COLO_LOG=info COLO_NETNS_PEERS=10.231.2.0/24,$VIP:80,$IP_B:8080=$NDIR COLO_NETNS_PEER_DIR=$DIR)
in_a() { ip netns exec "$NS_A" "${CENV[@]}" timeout 60 "$COLO" run -- "$@"; }
in_a_plain() { ip netns exec "$NS_A" timeout 60 "$@"; }
# For the background (a command, not a function: `$!` is then the program itself, as (`ip netns exec`, `env` and `colo run`
# exec it); each bounds its own life.
BG_A=(ip netns exec "$NS_A" "${CENV[@]}" "$COLO" run --)
REDIS_ARGS=(--bind 0.0.0.0 --protected-mode no --save '' --appendonly no)

start_redis() {
    ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16 "$COLO" run -- \
        redis-server --port 6379 "${REDIS_ARGS[@]}" >"$WORK/redis.log" 2>&1 </dev/null &
    REDIS=$!
    PIDS+=("$REDIS")
    local i
    for i in $(seq 100); do
        ls "$DIR"/colo-*-6379.live >/dev/null 2>&1 &&
            [ "$(ip netns exec "$NS_B" timeout 5 redis-cli -p 6379 ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.1
    done
    echo "redis did not start"; cat "$WORK/redis.log"; exit 1
}
accepted() { grep -c "accelerated (shared memory, other namespace)" "$WORK/redis.log"; }

start_redis

# 14. The connect path of `colo run` to another namespace: tests/netns/connect.sh.
. "$HERE/connect.sh"
if [ "${NETNS_ONLY:-}" = 14 ]; then
    [ $FAILED = 0 ] && echo "tests/netns: 14 passed" || echo "tests/netns: FAILED"
    exit $FAILED
fi

# 1. Pod to pod: redis-benchmark -c 50 across the namespaces, every connection on shared memory.
before=$(accepted)
out=$(in_a redis-benchmark -h $IP_B -p 6379 -c 50 -n 20000 -t get,set -q 2>"$WORK/bench.err" | tr '\r' '\n')
n=$(( $(accepted) - before ))
if echo "$out" | grep -q "^SET: .* requests per second" && echo "$out" | grep -q "^GET: .* requests per second" && [ "$n" -ge 100 ]; then
    ok "1 pod-to-pod: redis-benchmark -c 50 -t get,set completed, $n connections accelerated"
else
    bad "1 pod-to-pod: $n accelerated; output: $out $(tail -3 "$WORK/bench.err")"
fi
# `colo stat` (from the host, which sees both pids) marks both ends as crossing namespaces.
"${BG_A[@]}" $PROBE hold $IP_B 6379 4 >"$WORK/hold1" 2>&1 &
PIDS+=($!)
for i in $(seq 50); do grep -qs PONG "$WORK/hold1" && break; sleep 0.1; done
crossed=$(timeout 10 "$COLO" stat --json | python3 -c '
import json, sys
v = json.load(sys.stdin)
print(sum(1 for c in v["connections"] if c.get("other_netns") and c["program"] in ("python3", "redis-server")))')
if [ "$crossed" -ge 2 ]; then ok "1 colo stat: $crossed connection ends marked other_netns"; else bad "1 colo stat: $crossed ends marked"; fi
wait $! 2>/dev/null

# 2. Through a Service VIP (DNAT VIP:80 -> B:6379), then with masquerading (B sees the host).
before=$(accepted)
r=$(in_a redis-cli -h $VIP -p 80 set k dnat-value 2>/dev/null; in_a redis-cli -h $VIP -p 80 get k 2>/dev/null)
if [ "$r" = "$(printf 'OK\ndnat-value')" ] && [ $(( $(accepted) - before )) -eq 2 ]; then
    ok "2 DNAT VIP:80 -> B:6379: bytes intact, accelerated"
else
    bad "2 DNAT: got '$r', $(( $(accepted) - before )) accelerated"
fi
ipt -t nat -A POSTROUTING -s 10.231.1.0/24 -d 10.231.2.0/24 -j MASQUERADE -m comment --comment "$P"
before=$(accepted)
r=$(in_a redis-cli -h $IP_B -p 6379 get k 2>/dev/null)
last=$(grep "other namespace" "$WORK/redis.log" | tail -1)
if [ "$r" = dnat-value ] && [ $(( $(accepted) - before )) -eq 1 ] && echo "$last" | grep -q "accept 10.231.2.1:"; then
    ok "2 MASQUERADE: B saw the host's address, bytes intact, accelerated"
else
    bad "2 MASQUERADE: got '$r', $(( $(accepted) - before )) accelerated, last: $last"
fi
# A NodePort (or a container's host port): the node's own address, here A's gateway, port
# 30079 DNAT'd to B:6379, masqueraded as above.
ipt -t nat -A PREROUTING -d 10.231.1.1 -p tcp --dport 30079 -j DNAT --to-destination $IP_B:6379 -m comment --comment "$P"
before=$(accepted)
r=$(ip netns exec "$NS_A" env COLO_LOG=info COLO_NETNS_PEERS=10.231.1.1:30079=$DIR timeout 20 "$COLO" run -- redis-cli -h 10.231.1.1 -p 30079 get k 2>/dev/null)
if [ "$r" = dnat-value ] && [ $(( $(accepted) - before )) -eq 1 ]; then
    ok "2 NodePort (the node's address:30079 -> B:6379, masqueraded): bytes intact, accelerated"
else
    bad "2 NodePort: got '$r', $(( $(accepted) - before )) accelerated"
fi
ipt -t nat -D POSTROUTING -s 10.231.1.0/24 -d 10.231.2.0/24 -j MASQUERADE -m comment --comment "$P"

# 3. FORWARD DROP between A and B: the TCP connection fails, and no colo connection either.
ipt -I FORWARD 1 -s $IP_A -d $IP_B -j DROP -m comment --comment "$P"
before=$(accepted)
if ip netns exec "$NS_A" "${CENV[@]}" timeout 3 "$COLO" run -- redis-cli -h $IP_B -p 6379 ping >/dev/null 2>&1; then
    bad "3 FORWARD DROP: the client got through"
elif [ "$(accepted)" -ne "$before" ]; then
    bad "3 FORWARD DROP: a colo connection was made"
else
    ok "3 FORWARD DROP: TCP fails, no colo connection"
fi
ipt -D FORWARD -s $IP_A -d $IP_B -j DROP -m comment --comment "$P"

# 7. The Rust API (C and Python go through it): the cross-language peer, server in B, client
# in A.
PEER=$ROOT/rust/target/release/examples/peer
if [ -x "$PEER" ]; then
    ip netns exec "$NS_B" env COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16 "$PEER" server 0.0.0.0:7100 stream >"$WORK/peer.out" 2>&1 &
    PIDS+=($!)
    for i in $(seq 50); do grep -qs READY "$WORK/peer.out" && break; sleep 0.1; done
    r=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 30 "$PEER" client $IP_B:7100 stream 1000000 2>&1)
    r2=$(ip netns exec "$NS_A" timeout 30 "$PEER" client $IP_B:7100 stream 100000 2>&1)
    if [ "$r" = "OK 1000000 colo" ] && [ "$r2" = "OK 100000 tcp" ]; then
        ok "7 Rust API across namespaces: configured client on shared memory, unconfigured on TCP"
    else
        bad "7 Rust API: configured '$r', unconfigured '$r2'"
    fi
    # A server whose program accepts 1.5 s late (past the client's answer wait): the dial goes on
    # over plain TCP on its one connection, and the answer that comes first on the stream then
    # is taken off it before the application reads (the echo is intact). late_server PORT OUT.
    late_server() {
        ip netns exec "$NS_B" env COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_LOG=info PEER_ACCEPT_DELAY_MS=1500 \
            "$PEER" server 0.0.0.0:$1 stream >"$2" 2>&1 & PIDS+=($!)
        for i in $(seq 50); do grep -qs READY "$2" && break; sleep 0.1; done
    }
    late_server 7102 "$WORK/peer-late.out"
    r=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 30 "$PEER" client $IP_B:7102 stream 100000 2>"$WORK/peer-late.err")
    if [ "$r" = "OK 100000 tcp" ] && grep -q "dial $IP_B:7102: cross-namespace: no answer within" "$WORK/peer-late.err" &&
        [ "$(grep -c "declined: the client went on without waiting" "$WORK/peer-late.out")" = 1 ]; then
        ok "7 Rust API client of a server accepting 1.5 s late: one connection, plain TCP, the echo intact"
    else
        bad "7 Rust API client of a late server: '$r'; $(tail -2 "$WORK/peer-late.err") / $(grep -c accept "$WORK/peer-late.out") accepts"
    fi
    # The Go client (the Go listener does not serve other namespaces).
    if command -v go >/dev/null && (cd "$ROOT/go" && timeout 300 go build -o "$WORK/colo-peer-go" ./cmd/colo-peer); then
        r=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 30 "$WORK/colo-peer-go" client $IP_B:7100 stream 1000000 2>&1)
        r2=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 30 "$WORK/colo-peer-go" client $IP_B:7100 halfclose 2>&1)
        if [ "$r" = "OK 1000000 colo" ] && [ "$r2" = "OK 5 colo" ]; then
            ok "7 Go client across namespaces: shared memory"
        else
            bad "7 Go client: '$r' '$r2'"
        fi
        # A late server of its own (the first one's delay may be over by now on a loaded host).
        late_server 7103 "$WORK/peer-late2.out"
        r=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 30 "$WORK/colo-peer-go" client $IP_B:7103 stream 100000 2>"$WORK/gopeer-late.err")
        if [ "$r" = "OK 100000 tcp" ] && [ "$(grep -c "declined: the client went on without waiting" "$WORK/peer-late2.out")" = 1 ]; then
            ok "7 Go client of a server accepting 1.5 s late: one connection, plain TCP, the echo intact"
        else
            bad "7 Go client of a late server: '$r'; $(tail -2 "$WORK/gopeer-late.err") / $(grep -c accept "$WORK/peer-late2.out") accepts"
        fi
        # The Go listener, with Rust, Go and unconfigured clients.
        ip netns exec "$NS_B" env COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16 "$WORK/colo-peer-go" server 0.0.0.0:7200 stream >"$WORK/gopeer.out" 2>&1 &
        PIDS+=($!)
        for i in $(seq 50); do grep -qs READY "$WORK/gopeer.out" && break; sleep 0.1; done
        r=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 30 "$PEER" client $IP_B:7200 stream 1000000 2>&1)
        r2=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 30 "$WORK/colo-peer-go" client $IP_B:7200 writefirst 300000 2>&1)
        r3=$(ip netns exec "$NS_A" timeout 30 "$WORK/colo-peer-go" client $IP_B:7200 halfclose 2>&1)
        if [ "$r" = "OK 1000000 colo" ] && [ "$r2" = "OK 300000 colo" ] && [ "$r3" = "OK 5 tcp" ]; then
            ok "7 Go listener across namespaces: Rust and Go clients on shared memory, unconfigured on TCP"
        else
            bad "7 Go listener: Rust '$r', Go '$r2', unconfigured '$r3'"
        fi
    fi
else
    bad "7 Rust API: $PEER missing (make build)"
fi

# 10. Listed peers that make a server wait (C is inside COLO_NETNS_CLIENTS' 10.231.0.0/16): one
# connection silent, one whose PROPOSAL was answered ACCEPT and whose HELLO never comes, against
# listeners whose waits are 20 s. The Rust API and Go listeners resolve such connections off
# their accept path: A's connection, made meanwhile, is accepted on shared memory within its
# client's 10 s watchdog. Under colo run too (after these): redis, nginx and a blocking accept.
stalled() {
    local name=$1 port=$2; shift 2
    ip netns exec "$NS_B" env COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_NETNS_WAIT_MS=20000 \
        COLO_CARRIER_TIMEOUT_MS=20000 "$@" server 0.0.0.0:$port stream >"$WORK/$name-slow.out" 2>&1 &
    PIDS+=($!)
    for i in $(seq 50); do grep -qs READY "$WORK/$name-slow.out" && break; sleep 0.1; done
    ip netns exec "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 $PROBE stall $IP_B $port 40 >"$WORK/$name-stall" 2>&1 &
    local staller=$!
    PIDS+=("$staller")
    for i in $(seq 100); do grep -qs STALL "$WORK/$name-stall" && break; sleep 0.1; done
    local r
    r=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 10 "$PEER" client $IP_B:$port stream 100000 2>&1)
    if [ "$(cat "$WORK/$name-stall")" = "STALL ACCEPT" ] && [ "$r" = "OK 100000 colo" ]; then
        ok "10 $name listener: a silent listed peer and one that never sends its HELLO delay no other accept"
    else
        bad "10 $name listener: staller '$(cat "$WORK/$name-stall")', client '$r'"
    fi
    kill "$staller" 2>/dev/null
    # More silent connections than the listener holds (256): the oldest go on as plain TCP, and
    # A's connection made after them is still accepted on shared memory within its watchdog.
    ip netns exec "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 $PROBE silent $IP_B $port 300 40 >"$WORK/$name-silent" 2>&1 &
    local silent=$!
    PIDS+=("$silent")
    for i in $(seq 100); do grep -qs SILENT "$WORK/$name-silent" && break; sleep 0.1; done
    r=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 10 "$PEER" client $IP_B:$port stream 100000 2>&1)
    if [ "$(cat "$WORK/$name-silent")" = "SILENT 300" ] && [ "$r" = "OK 100000 colo" ]; then
        ok "10 $name listener: 300 silent listed connections (more than it holds) delay no other accept"
    else
        bad "10 $name listener, 300 silent: '$(cat "$WORK/$name-silent")', client '$r'"
    fi
    kill "$silent" 2>/dev/null
}
[ -x "$PEER" ] && stalled "Rust API" 7101 "$PEER"
[ -x "$WORK/colo-peer-go" ] && stalled Go 7201 "$WORK/colo-peer-go"

# 10 under colo run: the same attack against redis (level-triggered epoll), nginx (one worker:
# epoll, an accept per report) and Python servers (a blocking accept, edge-triggered epoll,
# poll, select), each with 20 s waits. The shim holds such connections aside and reports the
# listener readable when one is decided: the staller's PROPOSAL is answered while its silent
# connection waits, A's client made meanwhile is accepted on shared memory, and an unconfigured
# client in C (listed, so held too) gets its bytes intact over TCP, all within their 10 s
# watchdogs.
SLOW=(env COLO_LOG=info COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_NETNS_WAIT_MS=20000 COLO_CARRIER_TIMEOUT_MS=20000)
shim_stall() {
    local port=$1 out=$2
    ip netns exec "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 $PROBE stall $IP_B $port 40 >"$out" 2>&1 &
    STALLER=$!
    PIDS+=("$STALLER")
    for i in $(seq 100); do grep -qs STALL "$out" && break; sleep 0.1; done
}
# name, the staller's line, whether A's colo client and C's plain one got their bytes, how many
# connections the server accelerated.
shim_verdict() {
    local name=$1 stall=$2 colo=$3 plain=$4 n=$5
    if [ "$stall" = "STALL ACCEPT" ] && [ "$colo" = yes ] && [ "$plain" = yes ] && [ "$n" -ge 1 ]; then
        ok "10 colo run -- $name: a silent listed peer and one that never sends its HELLO delay no other accept ($n accelerated meanwhile, a plain client byte-exact)"
    else
        bad "10 colo run -- $name: staller '$stall', colo client $colo, plain client $plain, $n accelerated"
    fi
    kill "$STALLER" 2>/dev/null
}
yes_if() { [ "$1" = "$2" ] && echo yes || echo "'${1:0:60}'"; }
ip netns exec "$NS_B" "${SLOW[@]}" COLO_NETNS_DIR="$DIR" "$COLO" run -- \
    redis-server --port 6392 "${REDIS_ARGS[@]}" >"$WORK/redis-slow.log" 2>&1 </dev/null &
PIDS+=($!)
for i in $(seq 100); do
    ls "$DIR"/colo-*-6392.live >/dev/null 2>&1 && [ "$(ip netns exec "$NS_B" timeout 5 redis-cli -p 6392 ping 2>/dev/null)" = PONG ] && break
    sleep 0.1
done
shim_stall 6392 "$WORK/redis-stall"
c=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 10 "$COLO" run -- redis-cli -h $IP_B -p 6392 ping 2>/dev/null)
p=$(ip netns exec "$NS_C" timeout 10 redis-cli -h $IP_B -p 6392 ping 2>/dev/null)
shim_verdict redis-server "$(cat "$WORK/redis-stall")" "$(yes_if "$c" PONG)" "$(yes_if "$p" PONG)" \
    "$(grep -c "accelerated (shared memory, other namespace)" "$WORK/redis-slow.log")"
# More silent connections than a listener holds (256): the oldest go on to redis as plain TCP,
# A's client made after them is still held and accelerated, C's plain one byte-exact.
before=$(grep -c "accelerated (shared memory, other namespace)" "$WORK/redis-slow.log")
ip netns exec "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 $PROBE silent $IP_B 6392 300 40 >"$WORK/redis-silent" 2>&1 &
SILENT=$!
PIDS+=("$SILENT")
for i in $(seq 100); do grep -qs SILENT "$WORK/redis-silent" && break; sleep 0.1; done
c=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 10 "$COLO" run -- redis-cli -h $IP_B -p 6392 ping 2>/dev/null)
p=$(ip netns exec "$NS_C" timeout 10 redis-cli -h $IP_B -p 6392 ping 2>/dev/null)
n=$(( $(grep -c "accelerated (shared memory, other namespace)" "$WORK/redis-slow.log") - before ))
clients=$(ip netns exec "$NS_B" timeout 5 redis-cli -p 6392 info clients 2>/dev/null | tr -d '\r' | sed -n 's/^connected_clients://p')
if [ "$(cat "$WORK/redis-silent")" = "SILENT 300" ] && [ "$c" = PONG ] && [ "$p" = PONG ] && [ "$n" = 1 ] && [ "${clients:-0}" -ge 40 ]; then
    ok "10 colo run -- redis-server: 300 silent listed connections: the oldest beyond 256 reach redis as plain TCP ($clients clients), a colo client made after them is accelerated, a plain one byte-exact"
else
    bad "10 colo run -- redis-server, 300 silent: '$(cat "$WORK/redis-silent")', colo client '$c', plain client '$p', $n accelerated, $clients clients"
fi
kill "$SILENT" 2>/dev/null
if command -v nginx >/dev/null && command -v curl >/dev/null; then
    mkdir -p "$WORK/ngx2/www" "$WORK/ngx2/logs"
    head -c 3000 /dev/urandom | base64 >"$WORK/ngx2/www/3k.txt"
    cat >"$WORK/ngx2/nginx.conf" <<NGX
worker_processes 1;
daemon off;
pid $WORK/ngx2/nginx.pid;
error_log $WORK/ngx2/logs/error.log info;
env COLO_NETNS_WAIT_MS;
env COLO_CARRIER_TIMEOUT_MS;
events { worker_connections 1024; }
http { access_log off; server { listen 0.0.0.0:8082; root $WORK/ngx2/www; } }
NGX
    ip netns exec "$NS_B" "${SLOW[@]}" COLO_NETNS_DIR="$NDIR" "$COLO" run -- \
        nginx -c "$WORK/ngx2/nginx.conf" -p "$WORK/ngx2" >"$WORK/ngx2.log" 2>&1 </dev/null &
    NGINX2=$!
    PIDS+=("$NGINX2")
    # The master's rendezvous and the worker's (bound when it watches the listener).
    for i in $(seq 100); do [ "$(ls "$NDIR"/colo-*-8082.live 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
    shim_stall 8082 "$WORK/ngx2-stall"
    want=$(cat "$WORK/ngx2/www/3k.txt")
    c=$(ip netns exec "$NS_A" env COLO_LOG=info COLO_NETNS_PEERS=$IP_B:8082=$NDIR timeout 10 "$COLO" run -- curl -s -m 9 http://$IP_B:8082/3k.txt 2>/dev/null)
    p=$(ip netns exec "$NS_C" timeout 10 curl -s -m 9 http://$IP_B:8082/3k.txt 2>/dev/null)
    shim_verdict "nginx (1 worker)" "$(cat "$WORK/ngx2-stall")" "$(yes_if "$c" "$want")" "$(yes_if "$p" "$want")" \
        "$(cat "$WORK/ngx2.log" "$WORK/ngx2/logs/error.log" 2>/dev/null | grep -c "accelerated (shared memory, other namespace)")"
    kill "$NGINX2"
    timeout 10 tail --pid="$NGINX2" -f /dev/null
fi
# Python servers that echo a line, with a banner first if given: accepting blocking, or from a
# non-blocking listener watched by edge-triggered epoll (an accept loop until EAGAIN), by
# poll or by select (one accept per report).
cat >"$WORK/echo.py" <<'PY'
import select, signal, socket, sys
signal.alarm(120)  # watchdog
port, banner, mode = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen()
print("READY", flush=True)

def serve(c):
    # A client that leaves without reading the banner resets the connection: that ends the
    # connection, not the server (a worker that died so would leave its rendezvous behind).
    try:
        c.setblocking(True)
        if banner:
            c.sendall(banner)
        got = b""
        while not got.endswith(b"\n"):
            b = c.recv(65536)
            if not b:
                break
            got += b
        c.sendall(got)
    except OSError:
        pass
    c.close()

if mode == "block":
    while True:
        serve(s.accept()[0])
if mode == "prefork":
    import os
    for _ in range(3):
        if os.fork() == 0:
            signal.alarm(120)  # a child's own watchdog (alarms are not inherited)
            while True:
                c, peer = s.accept()
                print("CONN", os.getpid(), peer[0], flush=True)
                serve(c)
    signal.pause()
if mode == "threads":
    import threading
    def loop():
        while True:
            serve(s.accept()[0])
    for _ in range(2):
        threading.Thread(target=loop, daemon=True).start()
    signal.pause()
s.setblocking(False)
if mode == "et":
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN | select.EPOLLET)
    while True:
        ep.poll()
        while True:
            try:
                c, _ = s.accept()
            except BlockingIOError:
                break
            serve(c)
else:
    p = select.poll()
    p.register(s.fileno(), select.POLLIN)
    while True:
        if mode == "poll":
            p.poll()
        else:
            select.select([s], [], [])
        try:
            c, _ = s.accept()
        except BlockingIOError:
            continue
        serve(c)
PY
# Sends a line, then reads the banner and the line back.
cat >"$WORK/say.py" <<'PY'
import socket, sys
host, port, banner, line = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4].encode() + b"\n"
s = socket.create_connection((host, port), timeout=9)
if banner:
    got = b""
    while len(got) < len(banner):
        got += s.recv(65536)
    s.sendall(line)
else:
    s.sendall(line)
    got = b""
want = banner + line
while len(got) < len(want):
    b = s.recv(65536)
    if not b:
        break
    got += b
print("EXACT" if got == want else "DIFFERENT %r" % got)
PY
port=7003
for mode in block et poll select; do
    ip netns exec "$NS_B" "${SLOW[@]}" COLO_NETNS_DIR="$DIR" "$COLO" run -- python3 "$WORK/echo.py" $port "" $mode >"$WORK/echo-$mode.log" 2>&1 </dev/null &
    PIDS+=($!)
    for i in $(seq 100); do grep -qs READY "$WORK/echo-$mode.log" && ls "$DIR"/colo-*-$port.live >/dev/null 2>&1 && break; sleep 0.1; done
    shim_stall $port "$WORK/echo-$mode-stall"
    c=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 10 "$COLO" run -- python3 "$WORK/say.py" $IP_B $port "" "colo from A" 2>/dev/null)
    p=$(ip netns exec "$NS_C" timeout 10 python3 "$WORK/say.py" $IP_B $port "" "plain from C" 2>/dev/null)
    shim_verdict "python3 ($mode)" "$(cat "$WORK/echo-$mode-stall")" "$(yes_if "$c" EXACT)" "$(yes_if "$p" EXACT)" \
        "$(grep -c "accelerated (shared memory, other namespace)" "$WORK/echo-$mode.log")"
    port=$((port + 1))
done
# Two threads in a blocking accept on one listener: a plain client of C that waits for the
# banner is held (its wait 1.5 s); a client of B's own namespace connects meanwhile, takes one
# thread and keeps it. The held connection, handed over when its wait ends, must reach the other
# thread, asleep in the kernel's accept (the one holding it lost the race for B's client, or
# returned it): its client gets the banner and its line back within its 9 s watchdog.
ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_NETNS_DIR="$DIR" COLO_NETNS_WAIT_MS=1500 "$COLO" run -- \
    python3 "$WORK/echo.py" 7009 "220 banner" threads >"$WORK/echo-threads.log" 2>&1 </dev/null &
PIDS+=($!)
for i in $(seq 100); do grep -qs READY "$WORK/echo-threads.log" && ls "$DIR"/colo-*-7009.live >/dev/null 2>&1 && break; sleep 0.1; done
ip netns exec "$NS_C" timeout 10 python3 "$WORK/say.py" $IP_B 7009 "220 banner" "held, then to a sleeping accept" >"$WORK/threads-c" 2>&1 &
TC=$!
sleep 0.5
ip netns exec "$NS_B" timeout 15 python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', 7009), timeout=9)
time.sleep(12)" &
PIDS+=($!)
timeout 15 tail --pid="$TC" -f /dev/null
if [ "$(cat "$WORK/threads-c")" = EXACT ]; then
    ok "10 colo run -- python3 (two threads in a blocking accept): a held connection reaches the thread asleep in the kernel's accept"
else
    bad "10 colo run -- python3 (two threads in a blocking accept): held client '$(cat "$WORK/threads-c")'"
fi

# The same with three forked processes in a blocking accept: a process that holds a connection
# leaves the listener's queue to the others while one of them sleeps in the kernel's accept
# (else it could take B's client and keep its held one waiting until that ends), and a
# wake-up connection one makes for its own sleeping accept is dropped by whichever process of
# the server the kernel gives it to (the lineage records it). The held client gets its banner
# and line back; the application sees two connections, the held client's and B's (failed
# before in 2 of 3 runs: the holder took B's client, and the held one timed out).
ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_NETNS_DIR="$DIR" COLO_NETNS_WAIT_MS=1500 "$COLO" run -- \
    python3 "$WORK/echo.py" 7012 "220 banner" prefork >"$WORK/echo-prefork.log" 2>&1 </dev/null &
PREFORK=$!
PIDS+=("$PREFORK")
for i in $(seq 100); do grep -qs READY "$WORK/echo-prefork.log" && ls "$DIR"/colo-*-7012.live >/dev/null 2>&1 && break; sleep 0.1; done
sleep 0.3
ip netns exec "$NS_C" timeout 10 python3 "$WORK/say.py" $IP_B 7012 "220 banner" "held, then to a sleeping accept" >"$WORK/prefork-c" 2>&1 &
TC=$!
sleep 0.5
ip netns exec "$NS_B" timeout 15 python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', 7012), timeout=9)
time.sleep(12)" &
PIDS+=($!)
timeout 15 tail --pid="$TC" -f /dev/null
sleep 0.3
conns=$(grep -c "^CONN" "$WORK/echo-prefork.log")
if [ "$(cat "$WORK/prefork-c")" = EXACT ] && [ "$conns" = 2 ]; then
    ok "10 colo run -- python3 (three processes in a blocking accept): a held connection reaches its process's sleeping accept; the application sees no other connection"
else
    bad "10 colo run -- python3 (three processes in a blocking accept): held client '$(cat "$WORK/prefork-c")', $conns connections seen (2 made)"
fi
kill -9 "$PREFORK" $(pgrep -P "$PREFORK") 2>/dev/null

# A worker killed while asleep in the kernel's accept no longer counts as asleep there: three
# forked processes in a blocking accept; one holds a plain client of C (its wait 3 s), and the
# other two are killed -9 (left zombies: the server never reaps them). A client of B's own
# namespace then connects: the holder, which leaves the listener's queue to the lineage's other
# sleepers, sees none alive and takes it before the held connection is decided (before, it
# waited for the dead: the held one came first, 3 s later). Both byte-exact.
ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_NETNS_DIR="$DIR" COLO_NETNS_WAIT_MS=3000 "$COLO" run -- \
    python3 "$WORK/echo.py" 7013 "220 banner" prefork >"$WORK/echo-dead.log" 2>&1 </dev/null &
DEADSRV=$!
PIDS+=("$DEADSRV")
for i in $(seq 100); do grep -qs READY "$WORK/echo-dead.log" && ls "$DIR"/colo-*-7013.live >/dev/null 2>&1 && break; sleep 0.1; done
sleep 0.3
ip netns exec "$NS_C" timeout 10 python3 "$WORK/say.py" $IP_B 7013 "220 banner" "held while the others die" >"$WORK/dead-c" 2>&1 &
TC=$!
holder=
for i in $(seq 30); do
    holder=$(ip netns exec "$NS_B" ss -tnpH state established "( sport = :7013 )" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    [ -n "$holder" ] && break
    sleep 0.05
done
killed=0
for w in $(pgrep -P "$DEADSRV"); do
    [ "$w" != "$holder" ] && kill -9 "$w" && killed=$((killed + 1))
done
r=$(ip netns exec "$NS_B" timeout 10 python3 "$WORK/say.py" 127.0.0.1 7013 "220 banner" "from B meanwhile" 2>/dev/null)
timeout 15 tail --pid="$TC" -f /dev/null
order=$(sed -n 's/^CONN [0-9]* //p' "$WORK/echo-dead.log" | tr '\n' ' ')
if [ -n "$holder" ] && [ "$killed" = 2 ] && [ "$r" = EXACT ] && [ "$(cat "$WORK/dead-c")" = EXACT ] && [ "$order" = "127.0.0.1 $IP_C " ]; then
    ok "10 colo run -- python3 (workers killed -9 in a blocking accept): the holder no longer leaves the queue to them (B's client first, then the held one, both byte-exact)"
else
    bad "10 colo run -- python3 (workers killed in accept): holder '$holder', $killed killed, B's client '$r', held client '$(cat "$WORK/dead-c")', accepted in order '$order'"
fi
kill -9 "$DEADSRV" $(pgrep -P "$DEADSRV") 2>/dev/null

# A held connection's socket lives above the shim's floor, as its other descriptors, not at the
# low number the kernel gave (the application's next descriptor takes that); handed over, it
# gets the lowest number free, as the kernel's accept gives. A plain client of C connects and
# stays silent (held for up to 3 s); the server's sockets are listed meanwhile; then it sends a
# line and gets it back.
cat >"$WORK/fdnum.py" <<'PY'
import signal, socket
signal.alarm(60)  # watchdog
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7010)); s.listen()
print("READY", flush=True)
c, _ = s.accept()
print("FD", c.fileno(), flush=True)
got = b""
while not got.endswith(b"\n"):
    b = c.recv(100)
    if not b:
        break
    got += b
c.sendall(got)
PY
ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_NETNS_DIR="$DIR" COLO_NETNS_WAIT_MS=3000 "$COLO" run -- \
    python3 "$WORK/fdnum.py" >"$WORK/fdnum.log" 2>&1 </dev/null &
PIDS+=($!)
for i in $(seq 100); do grep -qs READY "$WORK/fdnum.log" && ls "$DIR"/colo-*-7010.live >/dev/null 2>&1 && break; sleep 0.1; done
ip netns exec "$NS_C" timeout 20 python3 -c "
import socket, time
s = socket.create_connection(('$IP_B', 7010), timeout=9)
time.sleep(1.5)
s.sendall(b'after the hold\n')
got = b''
while not got.endswith(b'\n'):
    b = s.recv(100)
    if not b:
        break
    got += b
print('EXACT' if got == b'after the hold\n' else 'DIFFERENT %r' % got)" >"$WORK/fdnum-c" 2>&1 &
FC=$!
sleep 0.8
held_fd=$(ip netns exec "$NS_B" ss -tnpH state established "( sport = :7010 )" | grep -o 'fd=[0-9]*' | head -1 | cut -d= -f2)
timeout 20 tail --pid="$FC" -f /dev/null
app_fd=$(sed -n 's/^FD //p' "$WORK/fdnum.log")
if [ "${held_fd:-0}" -ge 64 ] && [ -n "$app_fd" ] && [ "$app_fd" -lt 64 ] && grep -q EXACT "$WORK/fdnum-c"; then
    ok "10 colo run -- python3: a held connection's socket above the shim's floor (fd $held_fd), handed over at a low number (fd $app_fd), byte-exact"
else
    bad "10 colo run -- python3: held at fd '${held_fd:-?}', handed over at fd '${app_fd:-?}', client '$(tr '\n' ' ' <"$WORK/fdnum-c")'"
fi

# A one-shot registration of the listener reports it once per arming, whether the kernel's
# queue or a held connection (its wait 1 s) made it readable first: the server, told of the
# listener, waits 0.6 s more without re-arming and counts any other report (DOUBLE), then
# accepts all it can and re-arms. A held connection resolves while a client of B's own
# namespace arrives (each order once); every client gets its line back.
cat >"$WORK/oneshot.py" <<'PY'
import select, signal, socket
signal.alarm(60)  # watchdog
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7011)); s.listen(); s.setblocking(False)
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
print("READY", flush=True)
served = 0
while served < 4:
    if not any(fd == s.fileno() for fd, _ in ep.poll()):
        continue
    if any(fd == s.fileno() for fd, _ in ep.poll(0.6)):
        print("DOUBLE", flush=True)
    while True:
        try:
            c, _ = s.accept()
        except BlockingIOError:
            break
        c.setblocking(True); c.settimeout(10)
        got = b""
        while not got.endswith(b"\n"):
            b = c.recv(100)
            if not b:
                break
            got += b
        c.sendall(got)
        c.close()
        served += 1
    ep.modify(s.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
print("SERVED", served, flush=True)
PY
# Connects after $3 s, sends a line after $4 s more, prints EXACT if it comes back.
cat >"$WORK/late.py" <<'PY'
import socket, sys, time
host, port, before, quiet = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
time.sleep(before)
s = socket.create_connection((host, port), timeout=15)
time.sleep(quiet)
s.sendall(b"one shot\n")
got = b""
while not got.endswith(b"\n"):
    b = s.recv(100)
    if not b:
        break
    got += b
print("EXACT" if got == b"one shot\n" else "DIFFERENT %r" % got)
PY
ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_NETNS_DIR="$DIR" COLO_NETNS_WAIT_MS=1000 "$COLO" run -- \
    python3 "$WORK/oneshot.py" >"$WORK/oneshot.log" 2>&1 </dev/null &
PIDS+=($!)
for i in $(seq 100); do grep -qs READY "$WORK/oneshot.log" && ls "$DIR"/colo-*-7011.live >/dev/null 2>&1 && break; sleep 0.1; done
ip netns exec "$NS_C" timeout 30 python3 "$WORK/late.py" $IP_B 7011 0 2 >"$WORK/oneshot-c1" 2>&1 &
OC=$!
ip netns exec "$NS_B" timeout 30 python3 "$WORK/late.py" 127.0.0.1 7011 1.3 0 >"$WORK/oneshot-b1" 2>&1 &
ip netns exec "$NS_C" timeout 30 python3 "$WORK/late.py" $IP_B 7011 3 2 >"$WORK/oneshot-c2" 2>&1 &
ip netns exec "$NS_B" timeout 30 python3 "$WORK/late.py" 127.0.0.1 7011 4.9 0 >"$WORK/oneshot-b2" 2>&1 &
OB=$!
timeout 35 tail --pid="$OC" -f /dev/null
timeout 35 tail --pid="$OB" -f /dev/null
for i in $(seq 50); do grep -qs SERVED "$WORK/oneshot.log" && break; sleep 0.1; done
r=$(cat "$WORK"/oneshot-c1 "$WORK"/oneshot-b1 "$WORK"/oneshot-c2 "$WORK"/oneshot-b2 | tr '\n' ' ')
if [ "$r" = "EXACT EXACT EXACT EXACT " ] && grep -q "^SERVED 4" "$WORK/oneshot.log" && ! grep -q DOUBLE "$WORK/oneshot.log"; then
    ok "10 colo run -- python3 (one-shot epoll): the listener is reported once per arming, held connections and others alike, all byte-exact"
else
    bad "10 colo run -- python3 (one-shot epoll): clients '$r', server '$(grep -v '^colo' "$WORK/oneshot.log" | tr '\n' ' ')'"
fi

# Held, then given to the application as plain TCP when its wait (the default 50 ms) ends: a
# client of C that waits for the server's banner before it speaks, byte-exact; and a colo one.
ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_CLIENTS=10.231.0.0/16 COLO_NETNS_DIR="$DIR" "$COLO" run -- \
    python3 "$WORK/echo.py" 7007 "220 banner" block >"$WORK/echo-banner.log" 2>&1 </dev/null &
PIDS+=($!)
for i in $(seq 100); do grep -qs READY "$WORK/echo-banner.log" && ls "$DIR"/colo-*-7007.live >/dev/null 2>&1 && break; sleep 0.1; done
r1=$(ip netns exec "$NS_C" timeout 10 python3 "$WORK/say.py" $IP_B 7007 "220 banner" "server-first" 2>/dev/null)
r2=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 10 "$COLO" run -- python3 "$WORK/say.py" $IP_B 7007 "220 banner" "colo, server-first" 2>/dev/null)
n=$(grep -c "accelerated (shared memory, other namespace)" "$WORK/echo-banner.log")
if [ "$r1" = EXACT ] && [ "$r2" = EXACT ] && [ "$n" = 1 ]; then
    ok "10 colo run -- python3: a plain server-first client held, then handed over byte-exact; a colo one accelerated"
else
    bad "10 colo run -- python3 server-first: plain '$r1', colo '$r2', $n accelerated"
fi

# 8. Separate pid and mount namespaces on both sides (SO_PEERCRED reports pid 0 across them).
ip netns exec "$NS_B" unshare -p -f -m --mount-proc env COLO_LOG=info COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16 "$COLO" run -- \
    redis-server --port 6390 "${REDIS_ARGS[@]}" >"$WORK/redis-pidns.log" 2>&1 </dev/null &
UNSHARE=$!
PIDS+=("$UNSHARE")
for i in $(seq 100); do ls "$DIR"/colo-*-6390.live >/dev/null 2>&1 && break; sleep 0.1; done
inner=$(pgrep -P "$UNSHARE" | head -1)
[ -n "$inner" ] && PIDS+=("$inner")
out=$(ip netns exec "$NS_A" unshare -p -f -m --mount-proc "${CENV[@]}" timeout 60 "$COLO" run -- \
    redis-benchmark -h $IP_B -p 6390 -c 5 -n 5000 -t get -q 2>/dev/null | tr '\r' '\n')
n=$(grep -c "other namespace" "$WORK/redis-pidns.log")
if echo "$out" | grep -q "^GET: .* requests per second" && [ "$n" -ge 5 ]; then
    ok "8 separate pid and mount namespaces: $n connections accelerated"
else
    bad "8 pid namespaces: $n accelerated; $out"
fi
[ -n "$inner" ] && kill -9 "$inner"

# 9. nginx with 2 workers (forked, running as nobody, their environment cleared by nginx) in B,
# curl and wrk under colo run in A.
if command -v nginx >/dev/null && command -v wrk >/dev/null; then
    mkdir -p "$WORK/ngx/www" "$WORK/ngx/logs"
    head -c 1024 /dev/zero | tr '\0' x >"$WORK/ngx/www/1k.txt"
    cat >"$WORK/ngx/nginx.conf" <<NGX
worker_processes 2;
daemon off;
pid $WORK/ngx/nginx.pid;
error_log $WORK/ngx/logs/error.log info;
events { worker_connections 1024; }
http { access_log off; server { listen 0.0.0.0:8080; root $WORK/ngx/www; } }
NGX
    ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_DIR="$NDIR" COLO_NETNS_CLIENTS=10.231.0.0/16 "$COLO" run -- \
        nginx -c "$WORK/ngx/nginx.conf" -p "$WORK/ngx" >"$WORK/ngx.log" 2>&1 </dev/null &
    NGINX=$!
    PIDS+=("$NGINX")
    for i in $(seq 100); do ls "$NDIR"/colo-*-8080.live >/dev/null 2>&1 && break; sleep 0.1; done
    sleep 0.3
    body=$(in_a curl -s http://$IP_B:8080/1k.txt 2>/dev/null)
    out=$(in_a wrk -c 10 -t 2 -d 2 http://$IP_B:8080/1k.txt 2>/dev/null)
    n=$(cat "$WORK/ngx.log" "$WORK/ngx/logs/error.log" 2>/dev/null | grep -c "accelerated (shared memory, other namespace)")
    if [ "$body" = "$(cat "$WORK/ngx/www/1k.txt")" ] && echo "$out" | grep -q "Requests/sec" && ! echo "$out" | grep -q "Non-2xx\|Socket errors" && [ "$n" -ge 11 ]; then
        ok "9 nginx (2 workers as nobody) across namespaces: curl byte-exact, wrk without errors, $n connections accelerated"
    else
        bad "9 nginx: body ${#body} bytes, $n accelerated, wrk: $(echo "$out" | grep -E "Requests|Non-2xx|errors")"
    fi
    kill "$NGINX"
    timeout 10 tail --pid="$NGINX" -f /dev/null
fi

# 11. Overlapping addresses: two pairs of namespaces with the same addresses (X 10.232.0.1 to Y
# 10.232.0.2), a redis in each Y under colo run with a directory of its own. Each X reaches its
# own Y's redis on shared memory; a client given the other pair's directory stays plain TCP,
# bytes intact (the ACCEPT names a rendezvous that directory does not serve, or one whose server
# never answered that nonce).
if pairs_up; then
    for k in 1 2; do
        mkdir -m 755 "$WORK/y$k"
        ip netns exec ${P}y$k env COLO_LOG=info COLO_NETNS_DIR="$WORK/y$k" COLO_NETNS_CLIENTS=$IP_X "$COLO" run -- \
            redis-server --port 6379 "${REDIS_ARGS[@]}" >"$WORK/redis-y$k.log" 2>&1 </dev/null &
        PIDS+=($!)
    done
    for k in 1 2; do
        for i in $(seq 100); do
            ls "$WORK/y$k"/colo-*-6379.live >/dev/null 2>&1 &&
                [ "$(ip netns exec ${P}y$k timeout 5 redis-cli -p 6379 ping 2>/dev/null)" = PONG ] && break
            sleep 0.1
        done
        ip netns exec ${P}y$k timeout 5 redis-cli -p 6379 set k "pair-$k" >/dev/null
    done
    in_x() { local k=$1 d=$2; shift 2; ip netns exec ${P}x$k env COLO_LOG=info COLO_NETNS_PEERS=$IP_Y=$d timeout 20 "$COLO" run -- "$@"; }
    acc_y() { grep -c "accelerated (shared memory, other namespace)" "$WORK/redis-y$1.log"; }
    r1=$(in_x 1 "$WORK/y1" redis-cli -h $IP_Y get k 2>/dev/null); r2=$(in_x 2 "$WORK/y2" redis-cli -h $IP_Y get k 2>/dev/null)
    a1=$(acc_y 1); a2=$(acc_y 2)
    if [ "$r1" = pair-1 ] && [ "$r2" = pair-2 ] && [ "$a1" -eq 1 ] && [ "$a2" -eq 1 ]; then
        ok "11 overlapping addresses in two namespace pairs: each client on its own pair's server, on shared memory"
    else
        bad "11 overlap: X1 got '$r1' ($a1 accelerated in Y1), X2 got '$r2' ($a2 in Y2)"
    fi
    r1=$(in_x 1 "$WORK/y2" redis-cli -h $IP_Y get k 2>"$WORK/x1-cross.err")
    if [ "$r1" = pair-1 ] && [ "$(acc_y 1)" -eq "$a1" ] && [ "$(acc_y 2)" -eq "$a2" ]; then
        ok "11 a client given the other pair's directory: plain TCP to its own server, bytes intact"
    else
        bad "11 cross-pair directory: got '$r1', accelerated Y1 $a1 -> $(acc_y 1), Y2 $a2 -> $(acc_y 2); $(tail -2 "$WORK/x1-cross.err")"
    fi
else
    bad "11 overlap: could not set up the namespace pairs"
fi

# 12. RST (close with SO_LINGER 0) of either end of an accelerated connection from A to a server
# under colo run in B: the other end sees what it sees over plain TCP (the same run with an
# unconfigured client).
ip netns exec "$NS_B" env COLO_LOG=info COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16 "$COLO" run -- \
    python3 "$HERE/nsprobe.py" rstserve 7300 >"$WORK/rst.out" 2>"$WORK/rst.log" </dev/null &
PIDS+=($!)
for i in $(seq 50); do grep -qs READY "$WORK/rst.out" && break; sleep 0.1; done
rst_case() { # $1: in_a or in_a_plain; prints the client's and the server's view
    local c s
    c=$($1 python3 "$HERE/nsprobe.py" rstclient $IP_B 7300 rst 2>/dev/null)
    $1 python3 "$HERE/nsprobe.py" rstclient $IP_B 7300 hold >/dev/null 2>&1
    for i in $(seq 50); do [ "$(grep -c . "$WORK/rst.out")" -gt "$2" ] && break; sleep 0.1; done
    s=$(tail -1 "$WORK/rst.out")
    echo "$c/$s"
}
tcp=$(rst_case in_a_plain 1)
before=$(grep -c "accelerated (shared memory, other namespace)" "$WORK/rst.log")
shm=$(rst_case in_a 2)
n=$(( $(grep -c "accelerated (shared memory, other namespace)" "$WORK/rst.log") - before ))
if [ "$tcp" = RESET/RESET ] && [ "$shm" = "$tcp" ] && [ "$n" -eq 2 ]; then
    ok "12 RST of either end across namespaces: the other end sees RESET, as over TCP (both connections accelerated)"
else
    bad "12 RST: plain TCP client/server saw $tcp, accelerated saw $shm ($n accelerated)"
fi

# 13. A relay in between (a sidecar that terminates TCP): socat under colo run in C, serving
# its own directory to A and dialing B's redis as a configured client. Each hop is accelerated
# on its own (the relay's log: from A; redis's: from C, the relay), never end to end around
# the relay (redis accepts nothing from A), and the bytes go through intact.
if command -v socat >/dev/null; then
    RDIR=$WORK/relay
    mkdir -m 755 "$RDIR"
    ip netns exec "$NS_C" env COLO_LOG=info COLO_NETNS_DIR="$RDIR" COLO_NETNS_CLIENTS=$IP_A COLO_NETNS_PEERS=$IP_B:6379 \
        COLO_NETNS_PEER_DIR="$DIR" timeout 60 "$COLO" run -- socat TCP-LISTEN:7400,fork,reuseaddr TCP:$IP_B:6379 >"$WORK/relay.log" 2>&1 </dev/null &
    PIDS+=($!)
    for i in $(seq 50); do ls "$RDIR"/colo-*-7400.live >/dev/null 2>&1 && break; sleep 0.1; done
    before=$(accepted)
    from_a=$(grep -c "accept $IP_A:.*accelerated (shared memory, other namespace)" "$WORK/redis.log")
    r=$(ip netns exec "$NS_A" env COLO_LOG=info COLO_NETNS_PEERS=$IP_C:7400=$RDIR timeout 20 "$COLO" run -- \
        sh -c "redis-cli -h $IP_C -p 7400 set relayed through-c >/dev/null && redis-cli -h $IP_C -p 7400 get relayed" 2>/dev/null)
    sleep 0.2
    hop1=$(grep -c "accept $IP_A:.*accelerated (shared memory, other namespace)" "$WORK/relay.log")
    hop2=$(grep -c "accept $IP_C:.*accelerated (shared memory, other namespace)" "$WORK/redis.log")
    around=$(( $(grep -c "accept $IP_A:.*accelerated (shared memory, other namespace)" "$WORK/redis.log") - from_a ))
    if [ "$r" = through-c ] && [ "$hop1" = 2 ] && [ "$hop2" -ge 2 ] && [ "$around" = 0 ] && [ $(( $(accepted) - before )) = 2 ]; then
        ok "13 a colo relay in between (socat in C): bytes intact, each hop accelerated (A to the relay $hop1, the relay to redis $hop2), none around it"
    else
        bad "13 relay: got '$r', A to the relay $hop1, the relay to redis $hop2, A to redis around it $around; $(grep -v "^colo.*accept on fd" "$WORK/relay.log" | tail -3)"
    fi
fi

# 5. Attacker C.
# (a) root in C behind a read-only bind mount of B's directory: no create, bind or unlink.
r=$(ip netns exec "$NS_C" unshare -m sh -c "
    mount --bind '$DIR' '$DIR' && mount -o remount,bind,ro '$DIR' || exit 9
    touch '$DIR/x' 2>/dev/null && echo CREATED
    python3 -c 'import socket; socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).bind(\"$DIR/colo-1-6379\")' 2>/dev/null && echo BOUND
    for f in '$DIR'/colo-*; do rm -f \"\$f\" 2>/dev/null && [ ! -e \"\$f\" ] && echo UNLINKED; done
    echo done")
if [ "$r" = done ]; then ok "5a root in C behind a read-only mount: cannot create, bind or unlink"; else bad "5a: $r"; fi
# (b) nobody in C without that mount: the directory's permissions refuse the same.
r=$(ip netns exec "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups sh -c "
    touch '$DIR/x' 2>/dev/null && echo CREATED
    python3 -c 'import socket; socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).bind(\"$DIR/colo-2-6379\")' 2>/dev/null && echo BOUND
    for f in '$DIR'/colo-*; do rm -f \"\$f\" 2>/dev/null && [ ! -e \"\$f\" ] && echo UNLINKED; done
    echo done")
if [ "$r" = done ]; then ok "5b nobody in C: cannot create, bind or unlink"; else bad "5b: $r"; fi
# (c) forged proofs from C (no TCP connection), three to every rendezvous in B's directory:
# refused at once (REJECT(NOT_CLAIMED) within the forger's 3 s) by every live server, redis
# under colo run with no connection under way among them (it left them unanswered before:
# TIMEOUT), and by the Rust API and Go listeners; a dead server's socket refuses connections.
r=$(ip netns exec "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 $PROBE forge "$DIR")
redis_rej=$(echo "$r" | grep -c "^FORGED REJECT(5) colo-$REDIS-6379$")
if [ "$redis_rej" = 3 ] && ! echo "$r" | grep -qv "^FORGED REJECT(5) \|^STALE"; then
    ok "5c forged nonces refused at once by every live server ($(echo "$r" | cut -d' ' -f1,2 | sort | uniq -c | tr -s ' ' | tr '\n' ' '))"
else
    bad "5c forged: redis (pid $REDIS) refused $redis_rej of 3 at once; $(echo "$r" | grep -v "^FORGED REJECT(5) \|^STALE" | sort | uniq -c | tr '\n' ' ')"
fi
# (g) root in C offers, as a HELLO's segment, a file of a FUSE mount it serves and whose reads
# never return: the server must check that a descriptor is a memfd before it reads it (or its
# accept hangs in that read), so A's connection made next is still accepted on shared memory.
ip netns exec "$NS_C" unshare -m --propagation private timeout 60 $PROBE fuseoffer "$DIR" 5 >"$WORK/fuse" 2>&1 &
FUSER=$!
PIDS+=("$FUSER")
for i in $(seq 50); do grep -qs "FUSEOFFER\|NOMOUNT" "$WORK/fuse" && break; sleep 0.1; done
before=$(accepted)
r=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 10 "$COLO" run -- redis-cli -h $IP_B -p 6379 ping 2>/dev/null)
n=$(( $(accepted) - before ))
timeout 20 tail --pid="$FUSER" -f /dev/null
if grep -q "^FUSEOFFER [1-9]" "$WORK/fuse" && grep -q "^READS 0$" "$WORK/fuse" && [ "$r" = PONG ] && [ "$n" -eq 1 ]; then
    ok "5g a FUSE file offered as a segment is never read; the next connection is accelerated ($(grep ANSWER "$WORK/fuse"))"
else
    bad "5g FUSE offer: client '$r', $n accelerated; $(tr '\n' ' ' <"$WORK/fuse")"
fi

# (d) a real holder of a TCP connection: its proof works once; a replay and a forged server
# nonce are refused.
r=$(in_a_plain $PROBE replay $IP_B 6379 "$DIR" | cut -d' ' -f1,2 | tr '\n' ' ')
if echo "$r" | grep -Eq "FIRST WELCOME REPLAY (REJECT\(5\)|TIMEOUT) FORGED (REJECT\(5\)|TIMEOUT)"; then
    ok "5d proof single-use: replay and forged server nonce refused"
else
    bad "5d replay: $r"
fi
# (e) nobody in C floods the rendezvous with silent and garbage connections: A still gets
# shared memory.
ip netns exec "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 30 $PROBE flood "$DIR" 500 8 >"$WORK/flood" 2>&1 &
FLOOD=$!
PIDS+=("$FLOOD")
sleep 1
before=$(accepted)
out=$(in_a redis-benchmark -h $IP_B -p 6379 -c 20 -n 5000 -t get -q 2>/dev/null | tr '\r' '\n')
n=$(( $(accepted) - before ))
wait "$FLOOD"
if echo "$out" | grep -q "^GET: .* requests per second" && [ "$n" -ge 20 ]; then
    ok "5e under a rendezvous flood from C ($(cat "$WORK/flood")): $n connections accelerated"
else
    bad "5e flood: $n accelerated, $out; $(cat "$WORK/flood")"
fi

# (f) another boot id (another host): DECLINE, and the same connection goes on as plain TCP.
r=$(in_a_plain $PROBE otherboot $IP_B 6379 | tr '\n' ' ')
if [ "$r" = "DECLINED 2 PONG " ]; then ok "5f another boot id: declined, then plain TCP on the same connection"; else bad "5f other boot: $r"; fi

# 6. kill -9 of either end.
"${BG_A[@]}" $PROBE hold $IP_B 6379 20 >"$WORK/hold2" 2>&1 &
victim=$!
PIDS+=("$victim")
for i in $(seq 50); do grep -qs PONG "$WORK/hold2" && break; sleep 0.1; done
clients() { ip netns exec "$NS_B" timeout 5 redis-cli -p 6379 info clients | tr -d '\r' | sed -n 's/^connected_clients://p'; }
c1=$(clients)
kill -9 "$victim"
for i in $(seq 50); do [ "$(clients)" -lt "$c1" ] && break; sleep 0.1; done
c2=$(clients)
if [ "$c2" -lt "$c1" ]; then ok "6 client killed -9: the server saw it go ($c1 -> $c2 clients)"; else bad "6 client kill: $c1 -> $c2"; fi
"${BG_A[@]}" $PROBE hold $IP_B 6379 20 >"$WORK/hold3" 2>&1 &
HOLD=$!
PIDS+=("$HOLD")
for i in $(seq 50); do grep -qs PONG "$WORK/hold3" && break; sleep 0.1; done
kill -9 "$REDIS"
timeout 10 tail --pid="$HOLD" -f /dev/null
end=$(tail -1 "$WORK/hold3")
if [ "$end" = EOF ] || [ "$end" = RESET ]; then ok "6 server killed -9: the client saw $end"; else bad "6 server kill: client saw '$end'"; fi

# 4. Plain servers in B (not colo), a configured client in A: byte-exact TCP, client-first and
# server-first. The killed redis left its rendezvous files behind: nobody serves them. Attackers
# in C lock its `.live` file as a reader can (root behind a read-only bind mount, and nobody):
# clients must still see no live listener, and send the plain server nothing of colo.
ls "$DIR"/colo-*-6379.live >/dev/null 2>&1 || bad "4 setup: the killed server's files are gone"
ip netns exec "$NS_C" unshare -m sh -c "mount --bind '$DIR' '$DIR' && mount -o remount,bind,ro '$DIR' || exit 9
    exec timeout 60 $PROBE squat '$DIR' 60" >"$WORK/squat-root" 2>&1 &
SQUATTERS=($!)
for i in $(seq 50); do grep -qs SQUAT "$WORK/squat-root" && break; sleep 0.1; done
ip netns exec "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 $PROBE squat "$DIR" 60 >"$WORK/squat-nobody" 2>&1 &
SQUATTERS+=($!)
PIDS+=("${SQUATTERS[@]}")
for i in $(seq 50); do grep -qs SQUAT "$WORK/squat-nobody" && break; sleep 0.1; done
squats="root: $(cat "$WORK/squat-root"); nobody: $(cat "$WORK/squat-nobody")"
if echo "$squats" | grep -q "flock-ex" && ! echo "$squats" | grep -q wrlck; then
    ok "4 attackers in C hold readers' locks on the dead server's files ($squats)"
else
    bad "4 squat: $squats"
fi
cat >"$WORK/plain.py" <<'EOF'
import signal, socket, sys
signal.alarm(120)  # watchdog
port, banner, log = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen()
print("READY", flush=True)
while True:
    c, _ = s.accept()
    if banner:
        c.sendall(banner)
    got = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
        c.sendall(b)
    open(log, "ab").write(got)
    c.close()
EOF
cat >"$WORK/talk.py" <<'EOF'
import socket, sys
host, port, banner, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4].encode()
s = socket.create_connection((host, port), timeout=10)
got = b""
while len(got) < len(banner):
    got += s.recv(65536)
s.sendall(payload)
want = banner + payload
while len(got) < len(want):
    b = s.recv(65536)
    if not b:
        break
    got += b
s.close()
print("EXACT" if got == want else "DIFFERENT %r" % got)
EOF
for case in "6379::client-first" "7002:220 banner here\r\n:server-first"; do
    port=${case%%:*}; rest=${case#*:}; banner=${rest%:*}; kind=${rest##*:}
    : >"$WORK/plain$port.log"
    ip netns exec "$NS_B" python3 "$WORK/plain.py" $port "$(printf "$banner")" "$WORK/plain$port.log" >"$WORK/plain$port.out" 2>&1 &
    PLAIN=$!
    PIDS+=("$PLAIN")
    for i in $(seq 50); do grep -q READY "$WORK/plain$port.out" && break; sleep 0.1; done
    payload="*1\r\n\$4\r\nPING\r\n-$kind"
    r=$(in_a python3 "$WORK/talk.py" $IP_B $port "$(printf "$banner")" "$(printf "$payload")" 2>/dev/null)
    sleep 0.2
    if [ "$r" = EXACT ] && [ "$(cat "$WORK/plain$port.log")" = "$(printf "$payload")" ]; then
        ok "4 plain server, $kind (port $port): byte-exact both ways"
    else
        bad "4 plain server, $kind: client $r, server got $(od -c "$WORK/plain$port.log" | head -3)"
    fi
    kill -9 "$PLAIN"; wait "$PLAIN" 2>/dev/null
done
kill "${SQUATTERS[@]}" 2>/dev/null  # timeout passes the TERM on to the squatter

# Measurement: redis -c 50 GET across the namespaces, colo against plain TCP over the veths.
if [ "${NETNS_BENCH:-1}" = 1 ]; then
    rm -f "$DIR"/colo-*
    ip netns exec "$NS_B" redis-server --port 6380 "${REDIS_ARGS[@]}" >/dev/null 2>&1 </dev/null &
    PIDS+=($!)
    start_redis
    sleep 0.5
    rps() { echo "$1" | tr '\r' '\n' | sed -n 's/^GET: \([0-9.]*\) requests per second.*/\1/p'; }
    plain=$(rps "$(in_a_plain redis-benchmark -h $IP_B -p 6380 -c 50 -n 300000 -t get -q 2>/dev/null)")
    colo=$(rps "$(in_a redis-benchmark -h $IP_B -p 6379 -c 50 -n 300000 -t get -q 2>/dev/null)")
    # The same server from its own namespace (the same-namespace path), for comparison.
    same=$(rps "$(ip netns exec "$NS_B" timeout 60 "$COLO" run -- redis-benchmark -h 127.0.0.1 -p 6379 -c 50 -n 300000 -t get -q 2>/dev/null)")
    ratio() { python3 -c "print(round($1 / $2, 2))" 2>/dev/null; }
    echo "bench redis -c 50 GET across namespaces: plain TCP $plain/s, colo $colo/s, ratio $(ratio "$colo" "$plain"); colo inside B's namespace $same/s (across/inside $(ratio "$colo" "$same"))"
    # Short-lived connections (a connection per request) from A: plain TCP over the veths, colo
    # by default (such connections go plain after a few), and colo made to accelerate each.
    ping() { echo "$1" | tr '\r' '\n' | sed -n 's/^PING_INLINE: \([0-9.]*\) requests per second.*/\1/p'; }
    splain=$(ping "$(in_a_plain redis-benchmark -h $IP_B -p 6380 -k 0 -c 10 -n 5000 -t ping_inline -q 2>/dev/null)")
    scolo=$(ping "$(in_a redis-benchmark -h $IP_B -p 6379 -k 0 -c 10 -n 5000 -t ping_inline -q 2>/dev/null)")
    sacc=$(ping "$(ip netns exec "$NS_A" "${CENV[@]}" COLO_SHORT_LIVED=accelerate timeout 60 "$COLO" run -- redis-benchmark -h $IP_B -p 6379 -k 0 -c 10 -n 2000 -t ping_inline -q 2>/dev/null)")
    echo "bench redis -k 0 -c 10 PING (a connection each) across namespaces: plain TCP $splain/s, colo $scolo/s (ratio $(ratio "$scolo" "$splain")), colo accelerating each $sacc/s (ratio $(ratio "$sacc" "$splain"))"
    # 64 B round trips through the Rust API, the echo server in B: from A, and from B itself.
    if [ -x "$PEER" ]; then
        ip netns exec "$NS_B" env COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16 "$PEER" server 0.0.0.0:7150 stream >"$WORK/peer-rtt.out" 2>&1 &
        PIDS+=($!)
        for i in $(seq 50); do grep -qs READY "$WORK/peer-rtt.out" && break; sleep 0.1; done
        across=$(ip netns exec "$NS_A" "${CENV[@]}" timeout 30 "$PEER" client $IP_B:7150 rtt 100000 2>/dev/null)
        inside=$(ip netns exec "$NS_B" timeout 30 "$PEER" client 127.0.0.1:7150 rtt 100000 2>/dev/null)
        echo "bench 64 B round trip, Rust API (RTT p50 p99 us transport): across namespaces '$across', inside B '$inside'"
    fi
fi

[ $FAILED = 0 ] && echo "tests/netns: all passed" || echo "tests/netns: FAILED"
exit $FAILED
