#!/usr/bin/env bash
# Red team: a server of another user that leaves hostile values in the shared words of its
# segments and then does nothing must cost root's clients nothing: no thread spinning, no hang.
# t_rt_scribble_idle.sh is the server's side; here nobody runs a colo server on a port of its own
# (py/scribble_server.py: its TCP listener and rendezvous, so root's clients trust it as TCP
# would reach it) that welcomes each connection, answers nothing, and leaves one value in one
# word of each (every word of both direction blocks, the waiting words, claim, parked, the
# *_written copies; a full ring of bytes claimed at each space_wake mark), once the client waits
# both to read and to write into the full ring it filled; then it rings once and is silent 8 s.
# Root's clients, one connection per scribble: the Rust API example client (a process each:
# writer and reader threads), a Go API client (go/many_client.go: a writer and a reader
# goroutine a connection) and python under colo run (a writer and a reader thread a
# connection). Their CPU meanwhile must stay under a quarter of a core. (No failure found:
# a regression test for the client side.)
source "$(dirname "$0")/lib.sh"
MANY=$WORK/many_client
(cd "$ROOT/go" && go build -o "$MANY" ../tests/attack/go/many_client.go) || bad "go build many_client"
cp "$HERE/py/scribble_server.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
N=$(cd "$WORK" && python3 -c "
import sys; sys.argv = ['', '0', '0', '0', '0']; __file__ = 'scribble_server.py'
exec(open(__file__).read().split('LIBC =')[0]); print(len(SCRIBBLES))")
tick() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null; }
HZ=$(getconf CLK_TCK)
# attack LABEL: starts nobody's server on $P; the caller then starts the clients (pids in CL).
serve() {
  P=$(free_port); OUT=$WORK/$1.srv
  as_nobody timeout 120 /usr/bin/python3 "$WORK/scribble_server.py" "$P" "$N" 0.5 8 >"$OUT" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do grep -qs LISTENING "$OUT" && break; sleep 0.05; done
}
measure() { # LABEL: once every connection is scribbled, the clients' CPU over 3 s
  local used
  for _ in $(seq 600); do grep -qs "^ALL\|Traceback" "$OUT" && break; sleep 0.1; done
  check "$1: nobody scribbled on every connection ($(grep '^ALL' "$OUT"), of $N)" grep -q "^ALL $N$" "$OUT"
  sleep 1
  # Summed over the clients alive at both looks (a client its connection's error ended is done).
  local -A t0; local p t1 d=0
  for p in "${CL[@]}"; do t0[$p]=$(tick "$p"); done
  sleep 3
  for p in "${CL[@]}"; do t1=$(tick "$p"); [ -n "$t1" ] && [ -n "${t0[$p]}" ] && d=$((d + t1 - t0[$p])); done
  used=$(( d * 100 / HZ ))
  check "$1: root's clients idle while nobody holds them (${used} cs of CPU in 300 cs)" test "$used" -lt 75
  kill "${CL[@]}" 2>/dev/null
}
serve rust; CL=()
for _ in $(seq "$N"); do "$PEER" client "127.0.0.1:$P" stream 100000000 >/dev/null 2>&1 & CL+=($!); PIDS+=($!); sleep 0.02; done
measure rust
serve go; CL=()
"$MANY" "127.0.0.1:$P" "$N" 100000000 30 >"$WORK/go.out" 2>&1 & CL+=($!); PIDS+=($!)
measure go
serve shim; CL=()
$COLORUN python3 -c "
import socket, sys, threading, time
def w(s):
    try: s.sendall(b'x' * (64 << 20))
    except OSError: pass
def r(s):
    try:
        while s.recv(1 << 16): pass
    except OSError: pass
keep = []
for i in range($N):
    s = socket.create_connection(('127.0.0.1', $P)); keep.append(s)
    threading.Thread(target=w, args=(s,), daemon=True).start()
    threading.Thread(target=r, args=(s,), daemon=True).start()
    time.sleep(0.02)
time.sleep(30)" >"$WORK/shim.out" 2>&1 & CL+=($!); PIDS+=($!)
measure shim
finish
