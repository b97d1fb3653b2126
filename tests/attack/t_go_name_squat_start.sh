#!/usr/bin/env bash
# Red team: a name squatted for a moment must not keep a Go API server off shared memory. nobody
# binds root's Go server's rendezvous name for a second around its start (a restart): the
# listener finds the name taken and serves plain TCP until it is free, then binds it at a TCP
# accept (at most once a second; spec/WIRE.md section 2), as t_rt_api_name_squat_start.sh
# checks of the Rust API listener: root's client dialing after nobody left is on shared memory.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
attack() { # LABEL SERVER...
  local label=$1 P; shift
  P=$(free_port)
  as_nobody timeout 20 /usr/bin/python3 -c "
import socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(b'\0colo/1/127.0.0.1:$P'); s.listen(8); print('SQUAT', flush=True); time.sleep(1.5)" >"$WORK/$label.squat" 2>&1 & local sq=$!
  for _ in $(seq 100); do grep -qs SQUAT "$WORK/$label.squat" && break; sleep 0.05; done
  "$@" server "127.0.0.1:$P" stream >"$WORK/$label.srv" 2>&1 & PIDS+=($!)
  wait_port "$P"
  wait "$sq"
  # The first connection after: plain TCP (no rendezvous yet), which the server accepts.
  timeout 20 "$PEER" client "127.0.0.1:$P" halfclose >/dev/null 2>&1
  local r; r=$(timeout 20 "$PEER" client "127.0.0.1:$P" halfclose 2>&1)
  check "$label: root's client is on shared memory once nobody let go of the name ($r)" sh -c "echo '$r' | grep -q '^OK' && ! echo '$r' | grep -qi tcp"
}
attack "Go API server" "$GOPEER"
finish
