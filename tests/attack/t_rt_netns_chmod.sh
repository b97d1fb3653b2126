#!/usr/bin/env bash
# Red team: a server must never change the mode of a file other than its own rendezvous socket
# in COLO_NETNS_DIR (spec/WIRE.md section 11). Root's servers run with COLO_NETNS_DIR set to a
# directory nobody may write to; nobody (py/netns_swap.py) watches it with inotify and, the moment
# a server binds its socket `colo-<pid>-<port>`, renames the socket away and puts a symbolic link
# to a root-only file (mode 0600) under that name. A server that sets the socket's mode 0666 by
# its name (chmod(2) follows links) makes root's file writable by everyone. The servers run at the
# idle scheduling class on the attacker's CPU, so that the attacker's wake-up comes between the
# bind and the chmod every time (the window is a few microseconds otherwise: rarer, not closed).
# Each server must still start and serve; root's file must keep mode 0600.
#   1. the Rust API example server;  2. the Go one (cmd/colo-peer);  3. redis under colo run.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/netns_swap.py" "$WORK/" && chmod 644 "$WORK/netns_swap.py"
D=$WORK/ns && mkdir "$D" && chmod 0777 "$D" # writable by nobody, not sticky
SECRET=$WORK/secret && echo "root's" >"$SECRET" && chmod 0600 "$SECRET"
as_nobody timeout 120 taskset -c 0 /usr/bin/python3 "$WORK/netns_swap.py" "$D" "$SECRET" 110 >"$WORK/swap.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -qs "READY\|NOINOTIFY" "$WORK/swap.out" && break; sleep 0.05; done
grep -qs READY "$WORK/swap.out" || { bad "the attacker did not start: $(cat "$WORK/swap.out")"; finish; }
mode() { stat -c %a "$SECRET"; }
# serve LABEL PORT CMD...: runs CMD (a server on PORT) at the idle class on CPU 0 with
# COLO_NETNS_DIR=$D, waits for the port and the attacker's swap, checks root's file.
serve() {
  local label=$1 port=$2; shift 2
  local before; before=$(grep -c SWAPPED "$WORK/swap.out")
  COLO_NETNS_DIR=$D COLO_LOG=info taskset -c 0 chrt --idle 0 "$@" >"$WORK/$label.log" 2>&1 &
  PIDS+=($!)
  wait_port "$port" || { bad "$label: did not start: $(cat "$WORK/$label.log")"; return; }
  for _ in $(seq 40); do [ "$(grep -c SWAPPED "$WORK/swap.out")" -gt "$before" ] && break; sleep 0.05; done
  check "$label: the attacker swapped the socket for a link ($(grep -c SWAPPED "$WORK/swap.out") swaps)" \
    test "$(grep -c SWAPPED "$WORK/swap.out")" -gt "$before"
  check "$label: root's file kept mode 0600 (now $(mode))" test "$(mode)" = 600
  chmod 0600 "$SECRET"
}
P=$(free_port); serve rust "$P" "$PEER" server "127.0.0.1:$P" stream
check "rust: still serves" sh -c "timeout 10 '$PEER' client 127.0.0.1:$P stream 1000 | grep -q '^OK 1000 '"
P=$(free_port); serve go "$P" "$GOPEER" server "127.0.0.1:$P" stream
check "go: still serves" sh -c "timeout 10 '$GOPEER' client 127.0.0.1:$P stream 1000 | grep -q '^OK 1000 '"
P=$(free_port); serve redis "$P" $COLORUN redis-server --port "$P" --save '' --appendonly no --dir "$WORK"
check "redis: still serves" sh -c "[ \"\$(timeout 5 redis-cli -p $P ping)\" = PONG ]"
finish
