#!/usr/bin/env bash
# Red team: a peer that moves our own tail and then exits must still be seen gone by an
# edge-triggered waiter. nobody opens CARRIER connections to root's edge-triggered echo server
# (c/et_echo.c under colo run: read until EAGAIN, close at end of stream, waiting on its epoll
# set or on an outer set it is registered in), sends 10 bytes (read and echoed), then sets the
# server's ring_tail of that direction back by one, or to 2^64-1, rings once and exits
# (py/scribble_idle.py). The shared words then show a byte unread, so a look at the connection
# never asked the control socket whether the peer was gone, and its hang-up was never an edge:
# the server never read the end of stream and kept the connection for good; and each drain of
# the hung-up control socket shut it down again, a new edge-triggered event, so its epoll_wait
# returned at once forever, a whole core. Now a hang-up any drain learns is the connection's
# (`Conn::known_gone`), and a drain after it leaves the control socket alone.
source "$(dirname "$0")/lib.sh"
gcc -O2 -o "$WORK/et_echo" "$HERE/c/et_echo.c" || { bad "gcc"; finish; }
cp "$HERE/py/scribble_idle.py" "$HERE/doorbell_attacker.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in clock ticks
# The TCP connections process $1 holds on port $2 (its listener aside): those it never closed.
# (Not its descriptor count: the shim keeps some it makes on first need, a wake-up eventfd of a
# thread's first sleep, which a loaded run may first need during nobody's connections.)
held() { ss -Htanp "( sport = :$2 )" 2>/dev/null | grep -v LISTEN | grep -c "pid=$1,"; }
closed_all() { for _ in $(seq 200); do [ "$(held "$1" "$2")" = 0 ] && return 0; sleep 0.05; done; echo "pid $1 holds $(held "$1" "$2") connections"; return 1; }
HZ=$(getconf CLK_TCK)
for mode in flat nested; do
  P=$(free_port)
  COLO_LOG=info $COLORUN "$WORK/et_echo" "$P" "$mode" >"$WORK/$mode.log" 2>&1 & SRV=$!; PIDS+=($!)
  wait_port "$P" || { bad "$mode: the server never listened"; continue; }
  client() { [ "$(timeout 10 $COLORUN /usr/bin/python3 -c "
import socket; s = socket.create_connection(('127.0.0.1', $P)); s.sendall(b'ping'); print(s.recv(4).decode())")" = ping ]; }
  check "$mode: root's client is echoed" client
  sleep 0.5
  as_nobody env SCRIBBLE_STATES=read SCRIBBLE_ONLY='^c2s\.tail#[02]$' timeout 60 /usr/bin/python3 "$WORK/scribble_idle.py" "$P" 1 >"$WORK/$mode.out" 2>&1
  check "$mode: nobody's connections were set up and left ($(head -1 "$WORK/$mode.out"))" grep -q "RESULT held=2" "$WORK/$mode.out"
  check "$mode: the server closed them once nobody had gone" closed_all "$SRV" "$P"
  c0=$(ticks "$SRV"); sleep 2; c1=$(ticks "$SRV")
  used=$(( (c1 - c0) * 100 / HZ ))
  check "$mode: the server idles after ($used cs of CPU in 200 cs)" test "$used" -lt 50
  check "$mode: root's client is echoed after" client
done
finish
