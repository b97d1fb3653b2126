#!/usr/bin/env bash
# Finding 5: a peer that clears the FUTEX bit of the server's waiting word and hangs up must not
# leave server threads in FUTEX_WAIT. nobody opens DIRECT connections to root's Rust echo server
# ($PEER), waits until each server thread sleeps on its futex, stores 0 into every server_waiting
# word and hangs up: within a few seconds the server's threads and descriptors are back to what
# they were, and a legitimate client is still served. (ATTACK_PEER=path runs another build.) The
# Go implementation never sleeps on a futex (docs/SAFETY.md item 13): Rust only.
source "$(dirname "$0")/lib.sh"
PEER=${ATTACK_PEER:-$PEER}
N=${N:-50}
port=$(free_port)
COLO_DIRECT_ANY_UID=1 COLO_LOG=info COLO_DEBUG=1 "$PEER" server "127.0.0.1:$port" stream >"$WORK/server.log" 2>&1 &
SRV=$!; PIDS+=($SRV)
wait_port "$port" || { bad "server did not start"; finish; }
threads() { ls "/proc/$SRV/task" 2>/dev/null | wc -l; }
fds() { ls "/proc/$SRV/fd" 2>/dev/null | wc -l; }
# Returns when threads and fds are at most the baseline (plus the hang-up watcher's thread and
# its two descriptors, which end after their idle time), or after $1 seconds.
settle() {
  local end=$((SECONDS + $1))
  while [ $SECONDS -lt $end ]; do
    [ "$(threads)" -le $((T0 + 1)) ] && [ "$(fds)" -le $((F0 + 2)) ] && return 0
    sleep 0.2
  done
  return 1
}
legit() { local o; o=$(COLO_LOG=info timeout 20 "$PEER" client "127.0.0.1:$port" stream 100000 2>&1); grep -q "^OK 100000 colo$" <<<"$o" || { echo "client: $o"; return 1; }; }
check "legit client before" legit
sleep 1
T0=$(threads); F0=$(fds)
out=$(timeout 60 setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$HERE/colo_attack.py" hangup_futex "$port" "$N")
echo "attacker: $out"
check "attacker's $N connections were welcomed and their server threads slept on the futex" \
  grep -q "RESULT welcomed=$N asleep=$N" <<<"$out"
if settle 5; then ok "threads $(threads) (baseline $T0) and fds $(fds) (baseline $F0) back within 5 s"
else bad "server still holds $(threads) threads (baseline $T0) and $(fds) fds (baseline $F0) 5 s after the attacker hung up"; fi
check "server alive" kill -0 "$SRV"
check "legit client after" legit
finish
