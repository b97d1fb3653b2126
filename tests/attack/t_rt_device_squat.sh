#!/usr/bin/env bash
# Red team: a listener another user bound to a network device must not be proof for a loopback
# dial. Any user may set SO_BINDTODEVICE: nobody listens on 0.0.0.0:P bound to a device other
# than lo (a loopback connection never comes in on it: root's TCP connect to 127.0.0.1:P is
# refused) and binds colo/1/0.0.0.0:P. root's Rust API client dialing 127.0.0.1:P must be
# refused as its TCP connect is, and send nobody nothing. Before: the client's peer check found
# nobody's wildcard listener in the kernel's table, trusted it, and sent its HELLO, segment and
# bytes. (The Go client reads /proc/net/tcp, which does not show the device:
# t_rt_device_squat_go.sh.)
source "$(dirname "$0")/lib.sh"
[ -n "${CLIENT_NAME:-}" ] || { CLIENT_NAME="Rust API"; CLIENT=("$PEER" client); }
mkdir -p "$WORK/py" && cp "$HERE/py/v6only_squatter.py" "$WORK/py/" && cp "$HERE/colo_attack.py" "$WORK/"
DEV=$(ls /sys/class/net | grep -vx lo | head -1)
[ -n "$DEV" ] || { bad "no network device but lo"; finish; }
P=$(free_port)
as_nobody timeout 30 /usr/bin/python3 "$WORK/py/v6only_squatter.py" "$P" 12 "$DEV" >"$WORK/squat.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/squat.out" && break; sleep 0.05; done
check "nobody listens on 0.0.0.0:$P bound to $DEV, with its rendezvous" grep -q READY "$WORK/squat.out"
check "root's plain TCP connect to 127.0.0.1:$P is refused" sh -c "! timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$P' 2>/dev/null"
out=$(timeout 15 env COLO_LOG=info COLO_DEBUG=1 "${CLIENT[@]}" "127.0.0.1:$P" stream 1000 2>"$WORK/client.err")
check "root's $CLIENT_NAME client is refused too (got: ${out:-nothing}; $(tail -1 "$WORK/client.err"))" sh -c "! echo '$out' | grep -q '^OK'"
sleep 0.5
check "nobody got no HELLO, no descriptor ($(grep -c HELLO "$WORK/squat.out"))" sh -c "! grep -q HELLO '$WORK/squat.out'"
check "... and no byte ($(grep -c GOT "$WORK/squat.out"))" sh -c "! grep -q GOT '$WORK/squat.out'"
finish
