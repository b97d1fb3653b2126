#!/usr/bin/env bash
# Red team: a client that never reads must not keep an event-driven server busy. The client
# chooses the ring capacity (up to 64 MiB a direction); a server's outgoing ring grows only to
# the server's own bound (colo::default_ring), but the shim told pollers the connection was
# writable while its unread bytes were below the capacity (Conn::send_room), so once the ring
# was full at the bound, every epoll_wait of root's redis reported it writable, every write
# took nothing (EAGAIN), and redis polled again at once: a full core for one connection of
# nobody's (py/noread_redis.py: 64 MiB rings, a 40 MiB answer asked for, nothing read).
source "$(dirname "$0")/lib.sh"
need redis-server || finish
cp "$HERE/py/noread_redis.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in clock ticks
HZ=$(getconf CLK_TCK)
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || { bad "redis never listened"; finish; }
SRV=$(pgrep -f "redis-server 127.0.0.1:$P" | head -1)
as_nobody timeout 60 /usr/bin/python3 "$WORK/noread_redis.py" "$P" 8 >"$WORK/nobody.out" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do grep -q READY "$WORK/nobody.out" && break; sleep 0.1; done
check "nobody's connection was accelerated and the server's writing stalled ($(tr '\n' ' ' <"$WORK/nobody.out"))" \
  sh -c "grep -q 'answer WELCOME' '$WORK/nobody.out' && grep -q READY '$WORK/nobody.out'"
c0=$(ticks "$SRV"); sleep 2; c1=$(ticks "$SRV")
used=$(( (c1 - c0) * 100 / HZ ))
check "root's redis idles while nobody holds its answer unread ($used cs of CPU in 200 cs)" test "$used" -lt 50
check "root's redis answers a client meanwhile" sh -c "timeout 10 redis-cli -p $P ping | grep -qx PONG"
finish
