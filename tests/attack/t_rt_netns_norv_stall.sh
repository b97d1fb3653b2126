#!/usr/bin/env bash
# Red team: a listed tenant's silent connections must not hold up the accepts of a Rust API
# listener that serves other namespaces but has no rendezvous (its COLO_NETNS_DIR refused the
# bind: here a read-only bind mount in the server's mount namespace; a worker that dropped
# privileges or the stale `.live` of t_rt_netns_live_readlock.sh are others). Such a listener
# took each listed connection's PROPOSAL off in accept itself, waiting up to COLO_NETNS_WAIT_MS
# (50 ms) for its first bytes: nobody, listed, in a namespace of its own (py/silent_conns.py),
# opened 100 connections that send nothing and held every other client's accept ~5 s.
# Must hold: a plain client of the server's own namespace (py/timed_echo.py) gets its bytes
# back, under the attack within 2 s (or 20 times the same client's time measured before the
# attack, if more: the control; without the attack it is milliseconds).
source "$(dirname "$0")/lib.sh"
source "$HERE/netns_lib.sh"
ns_up atkn 23 || { bad "could not make the namespaces"; finish; }
cp "$HERE/py/silent_conns.py" "$HERE/py/timed_echo.py" "$WORK/" && chmod 644 "$WORK/silent_conns.py" "$WORK/timed_echo.py"
D=$WORK/ns && mkdir "$D" && chmod 755 "$D"
PORT=7031
# The server's own mount namespace sees the directory read-only: the bind of its rendezvous fails.
"${IN_S[@]}" timeout 60 unshare -m --propagation private sh -c 'mount --bind -o ro "$0" "$0" && exec "$@"' "$D" \
  env COLO_LOG=info COLO_NETNS_DIR="$D" COLO_NETNS_CLIENTS="10.77.$N.0/24" "$PEER" server "$IP_S:$PORT" stream >"$WORK/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/server.log" && break; sleep 0.05; done
grep -qs READY "$WORK/server.log" || { bad "the server did not start: $(cat "$WORK/server.log")"; finish; }
check "the server has no rendezvous ($(grep -h "namespace only" "$WORK/server.log"))" grep -q "Read-only file system.*serving this namespace only" "$WORK/server.log"
# echo_ms: a local client's time (ms) to get "ping\n" back; empty if the bytes did not come back whole.
echo_ms() {
  local r; r=$("${IN_S[@]}" timeout 20 /usr/bin/python3 "$WORK/timed_echo.py" "$IP_S" "$PORT")
  [[ "$r" =~ ^ECHO\ ([0-9]+)\ b\'ping\\n\'$ ]] && echo "${BASH_REMATCH[1]}"
}
ctl=$(echo_ms)
check "control: the local client got its bytes back (${ctl:-no echo} ms)" test -n "$ctl"
"${IN_X[@]}" "${NOBODY[@]}" timeout 60 /usr/bin/python3 "$WORK/silent_conns.py" "$IP_S" "$PORT" 100 60 >"$WORK/silent.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do grep -qs "SILENT\|Error" "$WORK/silent.out" && break; sleep 0.05; done
check "nobody holds 100 silent connections ($(tr '\n' ' ' <"$WORK/silent.out"))" grep -q "^SILENT 100$" "$WORK/silent.out"
ms=$(echo_ms)
bound=$((20 * ${ctl:-0})); [ "$bound" -ge 2000 ] || bound=2000
check "the local client got its bytes back under the attack in ${ms:-no echo} ms (bound $bound ms)" \
  test -n "$ms" -a "${ms:-0}" -lt "$bound"
finish
