#!/usr/bin/env bash
# Red team: a peer that leaves hostile values in the shared words of its segments and then does
# nothing must cost a server nothing: no thread spinning, no hang, everything back once it left.
# t_rt_scribble.sh scribbles continuously (the server must survive); here each of ~150 CARRIER
# connections of nobody gets one value left in one word (every word of both direction blocks,
# ring_size and the space_wake mark included, the waiting words, claim, parked, the *_written
# copies, with the server's end waiting to read or blocked writing into a full ring), one ring,
# then silence until the checks below are done (30 s at most). Meanwhile root's server must use less than a quarter of a core (a thread
# spinning on one of them uses a whole one), serve root's client, and after nobody left be back
# to its threads and descriptors.
#   1. the Rust API example server (a thread per connection);  2. the Go one (cmd/colo-peer);
#   3. redis under colo run (one event loop: a spin would take all of it);
#   4. nginx under colo run (one worker; edge-triggered epoll).
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/scribble_idle.py" "$HERE/doorbell_attacker.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
# Threads but jemalloc's background threads (redis): jemalloc starts one for an arena a new
# thread takes, and keeps it, so a colo thread that came and went (the orphan keeper, while
# nobody held bytes unread) leaves one of jemalloc's behind. Nor the orphan keeper itself: the
# bytes the server's closes left unread toward nobody are kept on its timers (spec/WIRE.md
# section 8; beyond 64 of them without a descriptor to see nobody hang up by), up to a minute,
# as TCP keeps an orphaned socket's (tests/attack/t_rt_orphan_bytes.sh checks they go).
threads() { local n=0 t c; for t in /proc/"$1"/task/*; do c=$(cat "$t/comm" 2>/dev/null); [ "$c" = jemalloc_bg_thd ] || [ "$c" = colo-orphans ] || n=$((n + 1)); done; echo "$n"; }
nfds() { ls "/proc/$1/fd" | wc -l; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in clock ticks
HZ=$(getconf CLK_TCK)
back_to() { # PID THREADS FDS: within 10 s
  local t f
  for _ in $(seq 100); do
    t=$(threads "$1"); f=$(nfds "$1")
    [ "$t" -le "$2" ] && [ "$f" -le "$3" ] && return 0
    sleep 0.1
  done
  echo "    pid $1: $t threads (baseline $2), $f descriptors (baseline $3)"
  ls -l "/proc/$1/fd" | sed 's/^/    /'; return 1
}
# attack LABEL PID SERVED-CMD...: the scribbling, the idle CPU measure, the checks. (The Go
# runtime keeps the threads it started: for Go only descriptors count, THREADS_SLACK.)
attack() {
  local label=$1 pid=$2; shift 2
  local t0 f0 c0 c1 used out=$WORK/$label.out
  # Twice: the shim's reaper thread starts at the second segment a process lets go.
  { "$@" && "$@"; } || { bad "$label: root's client before the attack"; return; }
  # WARM: a client after which the server keeps what it makes once for good (nginx's epoll set
  # gets its wake-up eventfd at its first sleep with a connection in it, which a quick client's
  # request may not make it take).
  [ -z "${WARM:-}" ] || $WARM || { bad "$label: root's warm-up client"; return; }
  sleep 1.5 # parked segments of that connection dropped
  t0=$(threads "$pid"); f0=$(nfds "$pid"); ls -l "/proc/$pid/fd" >"$WORK/$label.fd0"
  as_nobody env LEAVE="$out.leave" timeout 120 /usr/bin/python3 "$WORK/scribble_idle.py" "$P" 30 >"$out" 2>&1 &
  local att=$!; PIDS+=($!)
  for _ in $(seq 1200); do grep -qs "SCRIBBLED\|Traceback" "$out" && break; sleep 0.05; done
  check "$label: nobody's connections were set up ($(grep SCRIBBLED "$out"))" grep -q "SCRIBBLED [1-9][0-9]" "$out"
  sleep 1
  c0=$(ticks "$pid"); sleep 3; c1=$(ticks "$pid")
  used=$(( (c1 - c0) * 100 / HZ ))
  check "$label: the server idles while nobody holds its scribbled connections (${used} cs of CPU in 300 cs)" test "$used" -lt 75
  check "$label: root's client is served meanwhile" "$@"
  touch "$out.leave"
  for _ in $(seq 150); do kill -0 "$att" 2>/dev/null || break; sleep 0.1; done
  check "$label: the attacker finished ($(tail -1 "$out"))" grep -q "RESULT held=" "$out"
  check "$label: the server is alive" kill -0 "$pid"
  check "$label: root's client is served after" "$@"
  sleep 1.5
  check "$label: threads and descriptors back to baseline" back_to "$pid" "$((t0 + ${THREADS_SLACK:-0}))" "$f0"
}
P=$(free_port)
"$PEER" server "127.0.0.1:$P" stream >"$WORK/peer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || exit 1
rust_client() { timeout 10 "$PEER" client "127.0.0.1:$P" stream 100000 | grep -q "^OK 100000 "; }
attack rust "$SRV" rust_client
P=$(free_port)
"$GOPEER" server "127.0.0.1:$P" stream >"$WORK/gopeer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || exit 1
go_client() { timeout 10 "$GOPEER" client "127.0.0.1:$P" stream 100000 | grep -q "^OK 100000 "; }
THREADS_SLACK=1000 attack go "$SRV" go_client
P=$(free_port)
start_redis "$P" colo || exit 1
SRV=${PIDS[-1]}
redis_client() { [ "$(timeout 5 $COLORUN redis-cli -p "$P" ping 2>/dev/null)" = PONG ]; }
attack redis "$SRV" redis_client
P=$(free_port)
start_nginx "$P" 1 colo || exit 1
for _ in $(seq 100); do W=$(pgrep -P "${PIDS[-1]}" | head -1); [ -n "$W" ] && break; sleep 0.05; done
nginx_client() { [ "$(timeout 5 $COLORUN curl -s "http://127.0.0.1:$P/1k.txt" | wc -c)" = 1024 ]; }
# A request sent 0.3 s after the connect: the worker sleeps with the connection in its set.
nginx_slow() {
  timeout 5 $COLORUN python3 -c "
import socket, sys, time
s = socket.create_connection(('127.0.0.1', $P)); time.sleep(0.3)
s.sendall(b'GET /1k.txt HTTP/1.0\r\n\r\n'); d = b''
while True:
    b = s.recv(65536)
    if not b: break
    d += b
sys.exit(0 if d.startswith(b'HTTP/1.1 200') else 1)"
}
WARM=nginx_slow attack nginx "$W" nginx_client
finish
