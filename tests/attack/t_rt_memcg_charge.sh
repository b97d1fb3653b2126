#!/usr/bin/env bash
# Red team: a peer must not leave memory charged to the server's memory cgroup after every
# connection is gone. The server writes into the peer's memfd (the S2C ring); each page it
# touches first is charged to the server's cgroup (shmem charges the faulting process) and stays
# charged as long as the page exists, i.e. as long as the peer keeps its memfd. nobody pushes
# 64 MiB through each of 4 CARRIER connections to root's echo server (in a cgroup of its own),
# reads every byte, closes them and keeps the memfds. Pages left allocated there would stay
# charged to the server's cgroup until nobody exits (repeated: any limit the cgroup has, OOM in
# root's service), so a side that lets go of a connection gives back the pages of the ring it
# wrote but those of bytes the peer has yet to read (all of them once the peer hung up):
# colo::Segment's drop, Go's Conn.outgoingFree.
# Run: bash tests/attack/t_rt_memcg_charge.sh (as root, cgroup v1 memory or v2).
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$HERE/../.." && pwd); TARGET=${CARGO_TARGET_DIR:-$ROOT/rust/target}; PEER=$TARGET/release/examples/peer
mkdir -p "$WORK/py" && cp "$HERE/py/memcharge.py" "$WORK/py/" && cp "$HERE/colo_attack.py" "$WORK/"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  CG=/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)/rt-memcg-$$; USAGE=memory.current
else
  CG=/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)/rt-memcg-$$; USAGE=memory.usage_in_bytes
fi
mkdir "$CG" || { bad "cannot make a memory cgroup at $CG"; finish; }
trap 'cleanup; sleep 0.3; rmdir "$CG" 2>/dev/null' EXIT
P=$(free_port)
$PEER server "127.0.0.1:$P" stream >"$WORK/server.log" 2>&1 & SRV=$!; PIDS+=($!)
echo "$SRV" > "$CG/cgroup.procs"
wait_port "$P"
mib() { echo $(( $(cat "$CG/$USAGE") / 1048576 )); }
before=$(mib)
as_nobody timeout 120 /usr/bin/python3 "$WORK/py/memcharge.py" "$P" 4 $((64 << 20)) 30 >"$WORK/att.out" 2>&1 & ATT=$!; PIDS+=($!)
for _ in $(seq 120); do grep -qs HOLDING "$WORK/att.out" && break; sleep 0.5; done
check "nobody pushed 64 MiB through each of 4 connections and closed them" grep -q "HOLDING 4" "$WORK/att.out"
for _ in $(seq 40); do grep -qs SERVER_PAGES "$WORK/att.out" && break; sleep 0.25; done
held=$(mib)
check "the server's cgroup is back near where it was once they are closed ($before -> $held MiB)" test "$held" -le $((before + 4))
# The same pages as the attacker sees them (where the cgroup does not account shmem, the check
# above sees nothing): what the server wrote into nobody's memfds, still allocated.
pages=$(awk '/^SERVER_PAGES/ {print $2}' "$WORK/att.out")
check "the server's rings in nobody's memfds are given back once it closed (${pages:-?} MiB left)" test "${pages:-999}" -le 1
sed "s/^/    /" "$WORK/att.out"
finish
