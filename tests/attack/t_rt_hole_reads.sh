#!/usr/bin/env bash
# Red team: a client must not leave pages charged to a server by making it read bytes it never
# wrote. A memfd's page that no one wrote is a hole; a read of it through a shared mapping makes
# the kernel allocate it, charged to the reader's memory cgroup, and the page lives as long as
# the memfd does. nobody (py/hole_reads.py) claims 60 MB in its ring toward root's server
# without writing them, as the bulk argument of one redis command (redis under colo run reads
# it all) or as bytes for root's Rust API and Go echo servers (which read what their echo can
# hold), and keeps its memfd after the connection ended: the server's reads had left up to
# 57 MiB allocated in it (counted in that direction's block), charged to root's server, at no
# cost to nobody, for as long as it liked. Now a server's last close gives the pages of the
# direction it read back (colo::Segment, give_back_incoming; Go's Conn.Close), and a server
# reads a peer of another user with pread of the memfd, which allocates nothing for a hole
# (Segment::read_through_memfd, Go's Conn.readThrough; t_rt_idle_holes.sh). (The pages a
# server writes toward its client: t_rt_memcg_charge.sh.)
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/hole_reads.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
attack() { # LABEL PORT PREFIX MAX_MIB_ALLOCATED_WHILE_CONNECTED
  local out=$WORK/$1.out
  setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 /usr/bin/python3 "$WORK/hole_reads.py" "$2" 60000000 "$3" >"$out" 2>&1
  local during after
  read -r during after < <(awk '/^ALLOCATED/ {print $2, $3}' "$out")
  check "$1: the server read nobody's holes ($(grep -o 'READ [0-9]*' "$out"))" awk '/^READ/ && $2 >= 8388608 {ok = 1} END {exit !ok}' "$out"
  check "$1: at most $4 MiB of them allocated while connected (${during:-?} MiB)" test "${during:-99}" -le "$4"
  check "$1: nothing of them stays allocated once the connection ended (${after:-?} MiB)" test "${after:-99}" -le 1
}
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || finish
attack "redis under colo run" "$P" '*1\r\n$60000000\r\n' 1
check "redis still serves" test "$(timeout 5 $COLORUN redis-cli -p "$P" ping 2>/dev/null)" = PONG
P=$(free_port)
"$PEER" server "127.0.0.1:$P" stream >"$WORK/peer.log" 2>&1 & PIDS+=($!)
wait_port "$P" && attack "Rust API echo server" "$P" '' 1
P=$(free_port)
"$GOPEER" server "127.0.0.1:$P" stream >"$WORK/gopeer.log" 2>&1 & PIDS+=($!)
wait_port "$P" && attack "Go echo server" "$P" '' 1
finish
