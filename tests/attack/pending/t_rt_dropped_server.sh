#!/usr/bin/env bash
# Red team (pending: fails today): a server that listens as root and serves as another user
# (nginx with `user nobody;`: the master listens, each worker setuid's, and nginx makes its
# workers dumpable again for core dumps) is that user's to touch: nobody may take any
# descriptor of it (pidfd_getfd) or write its memory. Root's clients judge it by SO_PEERCRED of
# their control socket, which is the rendezvous listener's, taken at the listen, as root: "same
# user", so they read its ring through their mapping (colo::Segment::read_through_memfd is for
# peers of another uid). nobody takes the worker's connection's segment memfd and control socket
# (py/dropped_thief.py; py/dropped_server.py stands for the worker), claims a whole ring of
# holes toward root's client (python under colo run), and the client's reads allocate them,
# charged to root's client for as long as nobody keeps the memfd (8 MiB a connection: the ring
# the client chose). TCP would have charged root's client nothing for a server that sent
# nothing.
# Fix directions: the client must learn the uid of the process that serves it now, not the one
# that listened: e.g. SO_PASSCRED on the client's control socket, and the server's answer
# (WELCOME, the claim's answer) judged by its SCM_CREDENTIALS (the sender's uid at its send,
# which the kernel vouches for), the connection read through the memfd if it is another uid
# (Rust: colo::shm read_through_if_foreign after the answer; the shim's CARRIER client; Go:
# Conn.peerUID); or the shim's server side, in a process whose uid changed since its listener's
# rendezvous was made, marks the connection so that its client reads through the memfd.
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$HERE/../../.." && pwd); TARGET=${CARGO_TARGET_DIR:-$ROOT/rust/target}; COLORUN="$TARGET/release/examples/colo-run --"
cp "$HERE/../py/dropped_server.py" "$HERE/../py/dropped_thief.py" "$HERE/../colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
COLO_LOG=info timeout 60 $COLORUN /usr/bin/python3 "$WORK/dropped_server.py" "$P" 15 >"$WORK/server.out" 2>&1 & srv=$!
for _ in $(seq 100); do grep -qs LISTENING "$WORK/server.out" && break; sleep 0.05; done
COLO_LOG=info timeout 40 $COLORUN /usr/bin/python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', $P)); s.sendall(b'x'); n = 0
s.settimeout(30)
while True:
    b = s.recv(1 << 20)
    if not b: break
    n += len(b)
print('CLIENT READ', n, flush=True); time.sleep(3); s.close()" >"$WORK/client.out" 2>&1 & cli=$!
for _ in $(seq 100); do grep -qs ACCEPTED "$WORK/server.out" && break; sleep 0.1; done
spid=$(awk '/^ACCEPTED/ {print $2}' "$WORK/server.out")
as_nobody timeout 40 /usr/bin/python3 "$WORK/dropped_thief.py" "${spid:-0}" >"$WORK/thief.out" 2>&1
kill "$srv" 2>/dev/null; wait "$cli" "$srv" 2>/dev/null
sed 's/^/    /' "$WORK/thief.out" "$WORK/client.out"
check "root's server accepted the connection accelerated" grep -q 'accept .*accelerated' "$WORK/server.out"
alloc=$(awk '/^ALLOCATED/ {print $2}' "$WORK/thief.out")
check "root's client allocated none of the holes of a server that is nobody's now (${alloc:-?} MiB)" test "${alloc:-99}" -le 1
finish
