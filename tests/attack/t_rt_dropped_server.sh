#!/usr/bin/env bash
# Red team: a server that listens as root and serves as another user (nginx with `user
# nobody;`: the master listens, each worker setuid's, and nginx makes its workers dumpable again
# for core dumps) is that user's to touch: nobody may take any descriptor of it (pidfd_getfd) or
# write its memory. nobody takes the worker's connection's segment memfd and control socket
# (py/dropped_thief.py; py/dropped_server.py stands for the worker), claims a whole ring of holes
# toward root's client and FIN, and the client's reads allocate them, charged to root's client
# for as long as nobody keeps the memfd (8 MiB a connection: the ring the client chose), where
# TCP would have charged root's client nothing for a server that sent nothing. Root's clients
# judged the server by SO_PEERCRED of their control socket, which is the rendezvous listener's,
# taken at the listen, as root: "same user", so they read its ring through their mapping
# (colo::Segment::read_through_memfd is for peers of another uid). Now a client judges who
# answers its HELLO: SO_PASSCRED on its control socket while it waits, the answer's
# SCM_CREDENTIALS (the sender's uid at its send, which the kernel vouches for), its ring read
# through the memfd when that is another uid or not said (spec/WIRE.md section 3, "Who
# answers"). Clients: python under colo run (the shim's CARRIER client) and a Go API client
# (go/drain_client.go: DIRECT, refused NEED_CARRIER, then CARRIER).
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$HERE/../.." && pwd); TARGET=${CARGO_TARGET_DIR:-$ROOT/rust/target}; COLORUN="$TARGET/release/examples/colo-run --"
cp "$HERE/py/dropped_server.py" "$HERE/py/dropped_thief.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
DRAIN=$WORK/drain_client
(cd "$ROOT/go" && go build -o "$DRAIN" ../tests/attack/go/drain_client.go) || bad "go build drain_client"
attack() { # LABEL CLIENT... (@P: the port)
  local label=$1 out=$WORK/$1 P; shift
  P=$(free_port)
  COLO_LOG=info timeout 60 $COLORUN /usr/bin/python3 "$WORK/dropped_server.py" "$P" 15 >"$out.server" 2>&1 & local srv=$!
  for _ in $(seq 100); do grep -qs LISTENING "$out.server" && break; sleep 0.05; done
  COLO_LOG=info timeout 40 "${@//@P/$P}" >"$out.client" 2>&1 & local cli=$!
  for _ in $(seq 100); do grep -qs ACCEPTED "$out.server" && break; sleep 0.1; done
  local spid; spid=$(awk '/^ACCEPTED/ {print $2}' "$out.server")
  as_nobody timeout 40 /usr/bin/python3 "$WORK/dropped_thief.py" "${spid:-0}" >"$out.thief" 2>&1
  kill "$srv" 2>/dev/null; wait "$cli" "$srv" 2>/dev/null
  sed 's/^/    /' "$out.thief" "$out.client"
  check "$label: root's server accepted the connection accelerated" grep -q 'accept .*accelerated' "$out.server"
  local alloc; alloc=$(awk '/^ALLOCATED/ {print $2}' "$out.thief")
  check "$label: root's client allocated under 1 MiB of the holes of a server that is nobody's now (${alloc:-?} MiB: the window's pages at most)" test "${alloc:-99}" -eq 0
}
attack shim $COLORUN /usr/bin/python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', @P)); s.sendall(b'x'); n = 0
s.settimeout(30)
while True:
    b = s.recv(1 << 20)
    if not b: break
    n += len(b)
print('CLIENT READ', n, flush=True); time.sleep(3); s.close()"
attack go "$DRAIN" 127.0.0.1:@P
finish
