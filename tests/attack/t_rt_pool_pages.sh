#!/usr/bin/env bash
# Red team: a peer must not keep the pages of the messages we sent it charged to us after our
# close, for as long as it keeps its memfd. A zero-copy message (spec/WIRE.md section 7) lives in
# a slot of the sender's pool, in the client's memfd, read in place by its receiver until that
# releases it; each page the sender writes there is charged to the sender's memory cgroup. A
# side's last close gave back the rings but never the pool it sent from: nobody, a client whose
# pool has 64 slots of 64 KiB, sends a message in every slot and never releases any slot root's
# echo server (the Rust API example, Go's colo-peer, `msg`) sends back in its own pool, then
# either hangs up (`hangup`) or sets FIN and stays connected holding them (`fin`), and keeps
# its memfds (mapped: a memfd costs nobody no descriptor, so a loop of such connections left
# root's cgroup charged without bound, 4 MiB a connection here, up to 63 MiB with 256 MiB
# segments). Now the pool goes at the last close once every slot sent came back or the peer is
# gone, and messages a peer of another user holds are kept as unread bytes are (colo::orphan,
# Go's orphan.go: a peer that releases none for 60 s loses them). Checked, for 2 connections:
# what the server wrote into nobody's memfds (SEEK_DATA over its pool) is given back within
# 12 s of the hang-up, and within 90 s of the FIN (the orphan's idle time, 60 s, and a look of
# 5 s), at most 8 KiB a connection left (the pool's first and last partial pages); root's
# message client still gets its messages over shared memory.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/pool_pages.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
N=2 SLOTS=64
declare -A PORT
for L in rust go; do
  bin=$PEER; [ "$L" = go ] && bin=$GOPEER
  PORT[$L]=$(free_port)
  "$bin" server "127.0.0.1:${PORT[$L]}" msg >"$WORK/srv-$L.log" 2>&1 & PIDS+=($!)
  wait_port "${PORT[$L]}" || bad "$L: server did not start"
done
# left OUT SECONDS: the KiB of the servers' pools left in nobody's memfds once SECONDS passed
# (the last line printed by then), or 999999 if none.
left() {
  local i
  for i in $(seq "$2"); do sleep 1; done
  awk '/^S2C_POOL/ {k = $2} END {print (k == "" ? 999999 : k)}' "$1"
}
# attack L MODE SECONDS: nobody's attack on L's server, run in the background (output $WORK/L-MODE.out).
attack() {
  as_nobody timeout $(($3 + 60)) /usr/bin/python3 "$WORK/pool_pages.py" "${PORT[$1]}" "$N" "$SLOTS" "$2" "$3" >"$WORK/$1-$2.out" 2>&1 &
  PIDS+=($!)
}
for L in rust go; do attack "$L" fin 95; done
for L in rust go; do attack "$L" hangup 15; done
sleep 3
for L in rust go; do
  out=$WORK/$L-hangup.out
  check "$L: root's server echoed nobody's $((N * SLOTS)) messages ($(head -1 "$out"))" grep -q "^ECHOED $((N * SLOTS)) of" "$out"
  k=$(left "$out" 10)
  check "$L: its pool's pages in nobody's memfds given back after nobody hung up (${k} KiB left of $((N * SLOTS * 64)))" test "$k" -le $((N * 8))
done
for L in rust go; do
  out=$WORK/$L-fin.out
  check "$L: root's server echoed nobody's $((N * SLOTS)) messages ($(head -1 "$out"))" grep -q "^ECHOED $((N * SLOTS)) of" "$out"
  check "$L: the pool stays while nobody may read the messages it holds" grep -q "^S2C_POOL $((N * SLOTS * 64))$" "$out"
done
k=$(left "$WORK/go-fin.out" 77)
for L in rust go; do
  k=$(awk '/^S2C_POOL/ {k = $2} END {print (k == "" ? 999999 : k)}' "$WORK/$L-fin.out")
  check "$L: given back once nobody held them 60 s without releasing one (${k} KiB left)" test "$k" -le $((N * 8))
  o=$(timeout 20 "$PEER" client "127.0.0.1:${PORT[$L]}" msg 200 5000 2>&1)
  check "$L: root's message client gets its messages over shared memory ($(tail -1 <<<"$o"))" grep -q "^OK 200 colo$" <<<"$o"
done
finish
