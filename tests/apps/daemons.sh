#!/usr/bin/env bash
# More unmodified servers and their own clients, every one under `colo run`: varnish and
# haproxy in front of lighttpd, memcached, mosquitto (MQTT), an rsync daemon (a tree pulled and
# one pushed), nghttpd with h2load (HTTP/2). Each gives the bytes it gives over plain TCP
# (compared with the file it served), its connections are accelerated (the shim's log lines),
# and the load runs end with no error and the server's descriptors back where they were. Every
# step has a timeout.
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0
# wait_long PORT: a server that takes seconds to start (varnish compiles its VCL).
wait_long() { for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened"; return 1; }
# same URL FILE [curl options]: curl under colo run gets exactly FILE.
same() { local u=$1 f=$2; shift 2; timeout 20 $COLORUN curl -sS "$@" "$u" -o "$WORK/got" && cmp -s "$WORK/got" "$f"; }
head -c 1000000 /dev/urandom >"$WORK/1m.bin"

# lighttpd, the backend of the two proxies below.
if need lighttpd; then
  L=$(free_port); mkdir -p "$WORK/www"; cp "$WORK/1m.bin" "$WORK/www/"; head -c 1024 /dev/zero | tr '\0' x >"$WORK/www/1k.txt"
  printf 'server.document-root = "%s"\nserver.port = %s\nserver.bind = "127.0.0.1"\nserver.modules = ()\n' "$WORK/www" "$L" >"$WORK/lighttpd.conf"
  COLO_LOG=info timeout 120 $COLORUN lighttpd -D -f "$WORK/lighttpd.conf" >"$WORK/lighttpd.log" 2>&1 & PIDS+=($!)
  wait_port "$L"
  check "lighttpd: 1 MB, the same bytes" same "http://127.0.0.1:$L/1m.bin" "$WORK/1m.bin"
  check "... accepted over shared memory" grep -q "accept .* -> 127.0.0.1:$L: accelerated (shared memory)" "$WORK/lighttpd.log"
fi

# varnish waits for its non-blocking backend connect with poll(POLLWRNORM) alone: a connection
# that never reports POLLWRNORM fails every fetch after connect_timeout (a 503).
if need varnishd && [ -n "${L:-}" ]; then
  V=$(free_port)
  printf 'vcl 4.1;\nbackend default { .host = "127.0.0.1"; .port = "%s"; .connect_timeout = 2s; }\n' "$L" >"$WORK/v.vcl"
  COLO_LOG=info timeout 120 $COLORUN varnishd -F -a "127.0.0.1:$V" -f "$WORK/v.vcl" -n "$WORK/varnish" -s malloc,32m -T none \
    >"$WORK/varnish.log" 2>&1 & PIDS+=($!)
  wait_long "$V"
  check "varnish -> lighttpd: 1 MB, the same bytes (no 503)" same "http://127.0.0.1:$V/1m.bin" "$WORK/1m.bin"
  check "... a second time, from its cache" same "http://127.0.0.1:$V/1m.bin" "$WORK/1m.bin"
  check "... its backend connection over shared memory" grep -q "connect 127.0.0.1:$L: accelerated (shared memory)" "$WORK/varnish.log"
fi

if need haproxy && [ -n "${L:-}" ]; then
  H=$(free_port)
  cat >"$WORK/haproxy.cfg" <<CFG
defaults
  mode http
  timeout connect 5s
  timeout client 10s
  timeout server 10s
frontend f
  bind 127.0.0.1:$H
  default_backend b
backend b
  http-reuse always
  server s1 127.0.0.1:$L
CFG
  COLO_LOG=info timeout 120 $COLORUN haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 & PIDS+=($!)
  wait_port "$H"
  check "haproxy -> lighttpd: 1 MB, the same bytes" same "http://127.0.0.1:$H/1m.bin" "$WORK/1m.bin"
  out=$(timeout 30 $COLORUN wrk -t1 -c20 -d2s "http://127.0.0.1:$H/1k.txt" 2>&1)
  check "... wrk -c20 through it: requests, no socket errors, no non-2xx" sh -c "echo '$out' | grep -q Requests/sec && ! echo '$out' | grep -qE 'Socket errors|Non-2xx'"
  check "... accepted and connected over shared memory" sh -c "grep -q 'accept .* -> 127.0.0.1:$H: accelerated (shared memory)' '$WORK/haproxy.log' &&
    grep -q 'connect 127.0.0.1:$L: accelerated (shared memory)' '$WORK/haproxy.log'"
fi

if need memcached && need memcslap; then
  M=$(free_port)
  # memcached sets both of its descriptor limits to its connection limit (-c, 1024 by default):
  # the shim keeps a higher hard limit for its own descriptors (api/nofile.rs), so that every
  # connection is accelerated, and memcached sees the limits it set.
  COLO_LOG=info timeout 120 $COLORUN memcached -u nobody -l 127.0.0.1 -p "$M" -U 0 -t 2 >"$WORK/memcached.log" 2>&1 & MT=$!; PIDS+=($MT)
  wait_port "$M"; MP=$(pgrep -P "$MT" -x memcached)
  cat >"$WORK/mc.py" <<'PY'
import socket, sys, os
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = s.makefile("rb")
v = os.urandom(500000)
s.sendall(b"set big 0 0 %d\r\n" % len(v) + v + b"\r\n")
assert f.readline() == b"STORED\r\n"
for _ in range(3):
    s.sendall(b"get big\r\n")
    assert f.readline() == b"VALUE big 0 %d\r\n" % len(v)
    assert f.read(len(v) + 2) == v + b"\r\n"
    assert f.readline() == b"END\r\n"
print("ok")
PY
  check "memcached: a 500 KB value set, then got 3 times, the same bytes" sh -c "timeout 20 $COLORUN python3 '$WORK/mc.py' $M | grep -qx ok"
  base=$(fds "$MP")
  check "... memcslap, 16 connections" sh -c "timeout 60 $COLORUN memcslap --servers=127.0.0.1:$M --concurrency=16 --execute-number=2000 >'$WORK/memcslap.out' 2>&1"
  check "... accepted over shared memory ($(grep -c ': accelerated (shared memory)' "$WORK/memcached.log") connections)" \
    test "$(grep -c ': accelerated (shared memory)' "$WORK/memcached.log")" -ge 17
  # (+1: a listener whose clients' connections were short-lived binds a marker for them, once.)
  check "... its descriptors come back to $base (+1)" fds_back "$MP" "$((base + 1))"
fi

if need mosquitto && need mosquitto_pub; then
  Q=$(free_port)
  printf 'listener %s 127.0.0.1\nallow_anonymous true\nlog_type information\nlog_type subscribe\n' "$Q" >"$WORK/mosquitto.conf"
  COLO_LOG=info timeout 120 $COLORUN mosquitto -c "$WORK/mosquitto.conf" >"$WORK/mosquitto.log" 2>&1 & PIDS+=($!)
  wait_port "$Q"
  head -c 10000000 /dev/urandom >"$WORK/10m.bin"
  # sub TOPIC COUNT OUT: a subscriber under colo run in the background (its pid in SP), its
  # subscription logged by the broker before this returns; then the publisher.
  sub() {
    timeout 30 $COLORUN mosquitto_sub -p "$Q" -t "$1" -C "$2" -N >"$3" 2>&1 & SP=$!
    for _ in $(seq 200); do grep -qE " [012] $1\$" "$WORK/mosquitto.log" && break; sleep 0.05; done
  }
  sub lines 1000 "$WORK/lines.out"
  seq 1000 | timeout 30 $COLORUN mosquitto_pub -p "$Q" -t lines -l -q 1; wait $SP
  check "mosquitto: 1000 lines at QoS 1, all, in order" sh -c "seq 1000 | tr -d '\n' | cmp -s - '$WORK/lines.out'"
  sub big 1 "$WORK/big.out"
  timeout 30 $COLORUN mosquitto_pub -p "$Q" -t big -f "$WORK/10m.bin" -q 1; wait $SP
  check "... one 10 MB message, the same bytes" cmp -s "$WORK/big.out" "$WORK/10m.bin"
  check "... over shared memory" test "$(grep -c 'accept .*: accelerated (shared memory)' "$WORK/mosquitto.log")" -ge 4
fi

if need rsync; then
  R=$(free_port); mkdir -p "$WORK/tree/sub" "$WORK/pulled"
  cp "$WORK/1m.bin" "$WORK/tree/"; for i in $(seq 20); do head -c $((i * 3001)) /dev/urandom >"$WORK/tree/sub/f$i"; done
  mkdir -p "$WORK/pushed"
  printf 'use chroot = no\nuid = root\ngid = root\n[m]\npath = %s\nread only = yes\n[up]\npath = %s\nread only = no\n' \
    "$WORK/tree" "$WORK/pushed" >"$WORK/rsyncd.conf"
  COLO_LOG=info timeout 120 $COLORUN rsync --daemon --no-detach --address=127.0.0.1 --port="$R" --config="$WORK/rsyncd.conf" \
    >"$WORK/rsyncd.log" 2>&1 & RP=$!; PIDS+=($RP)
  wait_port "$R"; RP=$(pgrep -P "$RP" -x rsync)
  check "rsync daemon: a tree pulled, the same files" sh -c "timeout 30 env COLO_LOG=info $COLORUN rsync -a rsync://127.0.0.1:$R/m/ '$WORK/pulled/' 2>'$WORK/rsync.err' &&
    diff -r '$WORK/tree' '$WORK/pulled'"
  check "... over shared memory" grep -q "connect 127.0.0.1:$R: accelerated (shared memory)" "$WORK/rsync.err"
  # The other way: a tree pushed into a writable module (the daemon's forked child receives it).
  # (The baseline after the pull: the daemon's first fork opened what its forks share.)
  rb=$(fds "$RP")
  check "rsync daemon: a tree pushed, the same files" sh -c "timeout 30 env COLO_LOG=info $COLORUN rsync -a '$WORK/tree/' rsync://127.0.0.1:$R/up/ 2>'$WORK/rsyncp.err' &&
    diff -r '$WORK/tree' '$WORK/pushed'"
  check "... over shared memory" grep -q "connect 127.0.0.1:$R: accelerated (shared memory)" "$WORK/rsyncp.err"
  check "... the daemon's descriptors come back to $rb" fds_back "$RP" "$rb"
fi

if need nghttpd && need h2load; then
  N=$(free_port)
  COLO_LOG=info timeout 120 $COLORUN nghttpd --no-tls -d "$WORK/www" "$N" >"$WORK/nghttpd.log" 2>&1 & PIDS+=($!)
  wait_port "$N"
  check "nghttpd (HTTP/2): 1 MB, the same bytes" sh -c "timeout 20 $COLORUN nghttp 'http://127.0.0.1:$N/1m.bin' >'$WORK/h2.got' && cmp -s '$WORK/h2.got' '$WORK/1m.bin'"
  out=$(timeout 60 $COLORUN h2load -n 20000 -c 10 -m 10 "http://127.0.0.1:$N/1k.txt" 2>&1)
  check "... h2load -n 20000 -c 10 -m 10: 20000 succeeded, none failed" sh -c "echo '$out' | grep -q 'requests: 20000 total, 20000 started, 20000 done, 20000 succeeded, 0 failed, 0 errored, 0 timeout'"
  check "... over shared memory" test "$(grep -c 'accept .*: accelerated (shared memory)' "$WORK/nghttpd.log")" -ge 11
fi

[ $FAIL = 0 ] && echo "tests/apps/daemons.sh: all passed" || echo "tests/apps/daemons.sh: FAILURES"
exit $FAIL
