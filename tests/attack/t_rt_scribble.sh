#!/usr/bin/env bash
# Red team: a peer that scribbles on its live segments must harm only its own connections.
# nobody opens 20 CARRIER connections to root's redis under colo run and, for 8 s, writes random
# and adversarial values into every shared word the server reads (ring and message counters,
# flags, waiting words, the claim word), ringing and waking the server after each round, while
# root's redis-benchmark under colo run keeps honest traffic going. redis must stay up and keep
# answering (colo and plain clients), the benchmark must finish, and once nobody has left redis's
# threads and descriptors must be back to where they were.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/scribbler.py" "$HERE/doorbell_attacker.py" "$WORK/"
threads() { awk '/^Threads:/ {print $2}' "/proc/$1/status"; }
nfds() { ls "/proc/$1/fd" | wc -l; }
back_to() { # PID THREADS FDS: within 10 s
  local t f
  for _ in $(seq 100); do
    t=$(threads "$1"); f=$(nfds "$1")
    [ "$t" -le "$2" ] && [ "$f" -le "$3" ] && return 0
    sleep 0.1
  done
  echo "    pid $1: $t threads (baseline $2), $f descriptors (baseline $3)"; return 1
}
pong() { [ "$(timeout 5 "$@" 2>/dev/null)" = PONG ]; }
P=$(free_port)
start_redis "$P" colo || exit 1
REDIS=${PIDS[-1]}
# Warm-up (the shim's threads, the hang-up watcher among them, start at first use).
timeout 60 env COLO_SHORT_LIVED=accelerate $COLORUN redis-benchmark -p "$P" -c 4 -n 2000 -t set,get -q >/dev/null 2>&1
pong $COLORUN redis-cli -p "$P" ping
sleep 0.5
T0=$(threads "$REDIS"); F0=$(nfds "$REDIS")
as_nobody timeout 60 /usr/bin/python3 "$WORK/scribbler.py" "$P" 20 8 >"$WORK/scribble.out" 2>&1 &
SCRIBBLER=$!; PIDS+=($!)
for _ in $(seq 100); do grep -qs welcomed "$WORK/scribble.out" && break; sleep 0.05; done
check "nobody's connections were accepted ($(head -1 "$WORK/scribble.out"))" grep -q "welcomed [1-9]" "$WORK/scribble.out"
timeout 60 env COLO_SHORT_LIVED=accelerate $COLORUN redis-benchmark -p "$P" -c 4 -n 20000 -t set,get -q >"$WORK/bench.out" 2>&1
check "root's redis-benchmark under colo run finished during the scribbling" grep -q "GET: " "$WORK/bench.out"
check "redis answers a colo client during the scribbling" pong $COLORUN redis-cli -p "$P" ping
check "... and a plain one" pong redis-cli -p "$P" ping
wait "$SCRIBBLER"
check "the scribbler ran ($(tail -1 "$WORK/scribble.out"))" grep -q "RESULT welcomed=[1-9]" "$WORK/scribble.out"
check "redis is alive" kill -0 "$REDIS"
check "redis answers after the scribbling" pong $COLORUN redis-cli -p "$P" ping
check "threads and descriptors back to baseline" back_to "$REDIS" "$T0" "$F0"
grep -c "EPROTO\|corrupt" "$WORK/redis-$P.log" | sed 's/^/     connections reset as corrupt: /'
finish
