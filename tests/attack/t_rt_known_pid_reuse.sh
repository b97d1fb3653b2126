#!/usr/bin/env bash
# Red team: a DIRECT client does not wait for the answer of a listener that welcomed it before,
# known by rendezvous name and server pid (spec/WIRE.md section 3, "The backlog"); a listener of
# another uid must be waited for (its answer, likely NEED_CARRIER, comes before bytes go into
# the ring; a late REJECT would reset the connection). A pid is no proof of who serves: root's
# server on a port exits (a restart), nobody takes the port and its rendezvous with a process
# that has the same pid (pids are reused, pid_max is often 32768: nobody can cycle through them;
# here root sets ns_last_pid to spare the time) and claims a whole ring of holes toward the
# client (py/hole_server.py). Root's Rust and Go API clients, which dialed the first server,
# dial again: they took nobody's listener for the known one and went pending without an answer
# (no SO_PASSCRED, no answer read: strace). Their ring was still read through the memfd (the
# rendezvous's SO_PEERCRED says nobody: Shm::new, Go's peer check), which this test holds too.
source "$(dirname "$0")/lib.sh"
[ -w /proc/sys/kernel/ns_last_pid ] || { bad "cannot write /proc/sys/kernel/ns_last_pid (run as root)"; finish; }
REDIAL=$WORK/redial_client
(cd "$ROOT/go" && go build -o "$REDIAL" ../tests/attack/go/redial_client.go) || bad "go build redial_client"
cp "$HERE/py/hole_server.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
attack() { # LABEL CLIENT... (@P: the port, @G: the gate file)
  local label=$1 out=$WORK/$1.out cout=$WORK/$1.client gate=$WORK/$1.gate P srv st hostile=0 a; shift
  P=$(free_port)
  "$PEER" server "127.0.0.1:$P" stream >"$WORK/$label.peer" 2>&1 & srv=$!
  wait_port "$P"
  # Each recvmsg 5 ms late (strace), root's server answers the first HELLO after the client is ready to
  # read who sent the answer (SO_PASSCRED): a WELCOME of the client's uid, in time, which makes
  # the listener known.
  strace -f -qq -o /dev/null -e trace=recvmsg -e inject=recvmsg:delay_enter=5000 -p "$srv" & st=$!
  sleep 0.5
  local args=(); for a in "$@"; do a=${a//@P/$P}; args+=("${a//@G/$gate}"); done
  timeout 60 "${args[@]}" >"$cout" 2>&1 & local cl=$!
  for _ in $(seq 200); do grep -qs FIRST "$cout" && break; sleep 0.05; done
  check "$label: the first connection was echoed by root's server" grep -q FIRST "$cout"
  kill "$st" "$srv"; wait "$st" "$srv" 2>/dev/null
  # nobody's server with the pid root's had.
  for _ in $(seq 50); do
    echo $((srv - 1)) >/proc/sys/kernel/ns_last_pid
    setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$WORK/hole_server.py" "$P" >"$out" 2>&1 & hostile=$!
    [ "$hostile" = "$srv" ] && break
    kill "$hostile" 2>/dev/null; wait "$hostile" 2>/dev/null
  done
  check "$label: nobody's server has the pid root's had ($hostile)" test "$hostile" = "$srv"
  for _ in $(seq 100); do grep -qs LISTENING "$out" && break; sleep 0.05; done
  # How the client reads its ring: pread64 of the memfd, or through its mapping (no call).
  strace -f -qq -e trace=pread64,sendmsg,recvmsg,setsockopt -o "$WORK/$label.strace" -p "$(pgrep -P "$cl")" & st=$!
  sleep 0.5
  sleep 1.5 # (the segment the first connection parked is let go meanwhile)
  touch "$gate"
  wait "$cl"
  wait "$hostile" "$st"
  check "$label: the client read nobody's holes ($(grep -o 'READ [0-9]* of [0-9]*' "$out"))" awk '/^READ/ && $2 == $4 && $4 >= 1048576 {ok = 1} END {exit !ok}' "$out"
  check "$label: it waited for the answer of nobody's listener before it wrote (SO_PASSCRED on, the answer read)" grep -q "SCM_CREDENTIALS.*uid=65534" "$WORK/$label.strace"
  local preads; preads=$(grep -c "pread64(" "$WORK/$label.strace")
  check "$label: it read nobody's ring with pread of the memfd, not through its mapping ($preads pread64 calls)" test "$preads" -ge 1
}
attack "Rust API client" "$PEER" client 127.0.0.1:@P redial @G
attack "Go API client" "$REDIAL" 127.0.0.1:@P @G
finish
