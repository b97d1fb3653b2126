#!/usr/bin/env bash
# Red team: a moment's squat of a rendezvous name must not cost an API listener shared memory
# for its whole life. nobody binds root's server's rendezvous name (colo/1/127.0.0.1:P) just
# before root's Rust API example server starts (a restart: any user may bind a free abstract
# name, even for a port below 1024 it could never listen on), and lets go of it a second later.
# The listener found the name taken at its bind and served plain TCP for good: root's own
# clients dialing after nobody left stayed on TCP ("OK 5 tcp"). Now a listener whose name was
# taken binds it at a TCP accept once it is free (looking at most once a second,
# colo::Listener::take_over_vacant, as the shim's guests do): the first connection after is
# plain, the next on shared memory. The same for Go's ListenColo (Listener.takeOverVacant).
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
attack "Rust API server" "$PEER"
attack "Go API server" "$GOPEER"
finish
