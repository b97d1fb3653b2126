#!/usr/bin/env bash
# Issue 21, finding 4: a peer must not hang a server through a doorbell. nobody connects to
# root's servers with a hand-made colo client (doorbell_attacker.py): the doorbells of older
# wires (a socket pair's end, eventfds) must be refused; through the control socket, which is
# the doorbell, it does everything it can (makes its end blocking, fills the server's queue with
# rings, sends descriptors along, reads the server's rings, sends a datagram that is no ring,
# shuts its end down) while it makes the server ring it. Root's other clients must keep getting answers, and once the attacker has
# left the server's threads and descriptors must be back to where they were.
#   1. CARRIER, as the shim's client path does it, against `colo run -- redis-server`;
#   2. DIRECT (CARRIER if the listener asks for it) against the Rust API example server.
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3 # nobody cannot run a python under /root
ATTACKER=$WORK/doorbell_attacker.py
cp "$HERE/doorbell_attacker.py" "$ATTACKER" && chmod 644 "$ATTACKER"

threads() { awk '/^Threads:/ {print $2}' "/proc/$1/status"; }
nfds() { ls "/proc/$1/fd" | wc -l; }
# back_to PID THREADS FDS: within 10 s the process has at most THREADS threads and FDS descriptors.
back_to() {
  local t f
  for _ in $(seq 100); do
    t=$(threads "$1"); f=$(nfds "$1")
    [ "$t" -le "$2" ] && [ "$f" -le "$3" ] && return 0
    sleep 0.1
  done
  echo "    pid $1: $t threads (baseline $2), $f descriptors (baseline $3)"
  return 1
}
# attack PORT MODE REQUEST EXPECTED: runs the attacker as nobody in the background (log in $WORK).
attack() {
  as_nobody timeout 60 "$PY" "$ATTACKER" "$1" "$2" "$3" "$4" 6 >"$WORK/attack-$1.log" 2>&1 &
  ATTACK=$!
  # Until the attacker's connection is up and its doorbells are spoiled.
  for _ in $(seq 100); do grep -q "doorbell made blocking\|no connection" "$WORK/attack-$1.log" && break; sleep 0.05; done
  sleep 0.5
}
attacked() { # PORT: the attacker's connection was accepted (so the attack really ran)
  grep -q "doorbells: ('welcome'" "$WORK/attack-$1.log" || { sed 's/^/    /' "$WORK/attack-$1.log"; return 1; }
}
answered() { # PORT EXPECTED: the server answered the attacker's first request (and so rang it)
  grep -q "reply 0: b'$2" "$WORK/attack-$1.log" || { sed 's/^/    /' "$WORK/attack-$1.log"; return 1; }
}
left() { # waits for the attacker to finish
  for _ in $(seq 300); do kill -0 "$ATTACK" 2>/dev/null || break; sleep 0.1; done
  ! kill -0 "$ATTACK" 2>/dev/null && sed 's/^/    /' "$WORK/attack-$1.log"
}
pong() { [ "$(timeout 5 "$@" 2>/dev/null)" = PONG ]; }

# 1. CARRIER against root's redis under the shim.
PORT=$(free_port)
start_redis "$PORT" colo || exit 1
REDIS=${PIDS[-1]}
# The shim's threads and descriptors, before the baseline: two connections, as its reaper
# thread starts at the second segment a process lets go.
pong $COLORUN redis-cli -p "$PORT" ping
pong $COLORUN redis-cli -p "$PORT" ping
sleep 0.5
T0=$(threads "$REDIS"); F0=$(nfds "$REDIS")
attack "$PORT" carrier 'PING\r\n' '+PONG'
check "redis: the attacker's CARRIER connection was accepted" attacked "$PORT"
check "redis: a plain TCP client gets answers during the attack" pong redis-cli -p "$PORT" ping
check "redis: a colo client gets answers during the attack" pong $COLORUN redis-cli -p "$PORT" ping
check "redis: the attacker is done within 30 s" left "$PORT"
check "redis: the attacker's request was answered" answered "$PORT" '+PONG'
check "redis: a plain TCP client gets answers after the attack" pong redis-cli -p "$PORT" ping
check "redis: a colo client gets answers after the attack" pong $COLORUN redis-cli -p "$PORT" ping
check "redis: threads and descriptors back to baseline" back_to "$REDIS" "$T0" "$F0"

# 2. DIRECT against the Rust API example server (a thread per connection).
PORT=$(free_port)
"$PEER" server "127.0.0.1:$PORT" stream >"$WORK/peer.log" 2>&1 &
PIDS+=($!); PEERPID=$!
wait_port "$PORT" || exit 1
served() { timeout 10 "$PEER" client "127.0.0.1:$PORT" stream 100000 | grep -q "^OK 100000 "; }
served # the listener's threads and descriptors, before the baseline
sleep 1.5 # parked segments of that connection dropped
T0=$(threads "$PEERPID"); F0=$(nfds "$PEERPID")
attack "$PORT" direct 'hello' 'hello'
check "peer: the attacker's connection was accepted" attacked "$PORT"
check "peer: another client is served during the attack" served
check "peer: the attacker is done within 30 s" left "$PORT"
check "peer: the attacker's request was answered" answered "$PORT" hello
check "peer: another client is served after the attack" served
sleep 1.5 # that client's parked segment dropped
check "peer: threads and descriptors back to baseline" back_to "$PEERPID" "$T0" "$F0"
finish
