#!/usr/bin/env bash
# Red team: a server must not leave pages charged to a client by making it read bytes it never
# wrote (t_rt_hole_reads.sh, the other way round). The segment is the client's memfd, which the
# server holds; a page of it nobody wrote is a hole, and the client's read of it makes the
# kernel allocate it, charged to the client's memory cgroup, for as long as the memfd lives.
# nobody runs a colo server of its own on a port (its TCP listener and its rendezvous: root's
# clients trust it, as TCP would reach it; py/hole_server.py) that claims a whole ring of bytes
# toward its client (8 MiB here: twice tcp_wmem's maximum) without writing them, then FIN, and keeps the memfd once the client
# has read them and closed. Root's clients: a python program under colo run and a Go API client
# (go/drain_client.go, DIRECT: its clean close parks the segment first), which close and live
# on, and the Rust API example client (DIRECT, parked too), which closes and exits at once.
# Before, 8 MiB stayed allocated, charged to root, for as long as nobody liked (only a server's
# close gave back the direction it read); now a client's last close gives its incoming
# direction back too (colo::Segment::give_back_incoming; Go's Conn.incomingPages, parked or
# not), and the Rust core does at `exit` what its background unmapper and parking had not done
# yet (reaper::at_exit). (A process that exits without closing still leaves them, and so does
# a Go client that exits right after its close: docs/LIMITS.md.) And while connected: a
# client whose server is another user reads its ring with pread of the memfd, which allocates
# nothing for a hole (colo::Segment::read_through_memfd; Go's Conn.readThrough: the Go client
# held 8 MiB while connected before), but for the first 128 KiB of the ring's data, which a
# Rust or shimmed client reads through the mapping (colo::segment::MAPPED_WINDOW): at most the
# pages under it (132 KiB with the part of the block's first page, which holds the ring's words).
source "$(dirname "$0")/lib.sh"
DRAIN=$WORK/drain_client
(cd "$ROOT/go" && go build -o "$DRAIN" ../tests/attack/go/drain_client.go) || bad "go build drain_client"
cp "$HERE/py/hole_server.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
attack() { # LABEL CLIENT... (@P: the port)
  local label=$1 out=$WORK/$1.out P; shift
  P=$(free_port)
  as_nobody timeout 60 /usr/bin/python3 "$WORK/hole_server.py" "$P" >"$out" 2>&1 & local srv=$!
  for _ in $(seq 100); do grep -qs LISTENING "$out" && break; sleep 0.05; done
  local args=() a; for a in "$@"; do args+=("${a//@P/$P}"); done
  timeout 30 "${args[@]}" >"$WORK/$label.client" 2>&1
  wait "$srv"
  local during after
  read -r during after < <(awk '/^ALLOCATED/ {print $2, $3}' "$out")
  # Reading a hole allocates it: the client's reads (its ring_tail) are what allocated them (a
  # client that exits at once may have given them back before the server looked).
  check "$label: the client read nobody's holes ($(grep -o 'READ [0-9]* of [0-9]*' "$out"), ${during:-?} KiB seen allocated)" awk '/^READ/ && $2 == $4 && $4 >= 1048576 {ok = 1} END {exit !ok}' "$out"
  # A client reading a ring of another user's reads it with pread of the memfd, which gives
  # zeros for a hole and allocates nothing, but for the window's pages (Go: none).
  check "$label: its reads allocated at most the window's pages of them while connected (${during:-?} KiB of at most 132)" test "${during:-99999}" -le 132
  check "$label: nothing of them but the block's first page stays allocated once the client closed (${after:-?} KiB)" test "${after:-99999}" -le 4
}
attack "python under colo run" $COLORUN /usr/bin/python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', @P)); s.sendall(b'x'); n = 0
while True:
    b = s.recv(1 << 20)
    if not b: break
    n += len(b)
print('client read', n, flush=True); time.sleep(1.5); s.close(); time.sleep(4)"
attack "Go API client" "$DRAIN" "127.0.0.1:@P"
# Its error message prints all it read.
attack "Rust API client, exiting at once" sh -c "$PEER client 127.0.0.1:@P halfclose 2>&1 | head -c 200"
finish
