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
# `toggle`: whether messages are held is read from a word the peer writes (its free_head), so a
# side must decide from one read: nobody's c/toggle_word flips it, on 8 connections (4 rounds),
# between "all released" and "one held" while root's server closes and keeps them, then nobody hangs up;
# within 14 s of that nothing may be left (a decision from two reads that disagreed kept the
# pool and unmapped the segment, or kept nothing and left the pool: charged to root for as long
# as nobody keeps its memfds).
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/pool_pages.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
gcc -O2 -o "$WORK/toggle_word" "$HERE/c/toggle_word.c" || { bad "gcc toggle_word"; finish; }
chmod 755 "$WORK/toggle_word"
N=2 SLOTS=64
declare -A PORT
for L in rust go; do
  bin=$PEER; [ "$L" = go ] && bin=$GOPEER
  PORT[$L]=$(free_port)
  "$bin" server "127.0.0.1:${PORT[$L]}" msg >"$WORK/srv-$L.log" 2>&1 & PIDS+=($!)
  wait_port "${PORT[$L]}" || bad "$L: server did not start"
done
# last OUT: the KiB of the servers' pools left in nobody's memfds at the last line printed to
# OUT, or 999999 if none.
last() { awk '/^S2C_POOL/ {k = $2} END {print (k == "" ? 999999 : k)}' "$1"; }
# attack L MODE SECONDS [N SLOTS ROUNDS]: nobody's attack on L's server, run in the background (output
# $WORK/L-MODE.out, pid in ATT[L-MODE]).
declare -A ATT
attack() {
  as_nobody env TOGGLER="$WORK/toggle_word" TOGGLE=6 ROUNDS="${6:-1}" timeout $(($3 + 60)) /usr/bin/python3 "$WORK/pool_pages.py" "${PORT[$1]}" "${4:-$N}" "${5:-$SLOTS}" "$2" "$3" >"$WORK/$1-$2.out" 2>&1 &
  ATT[$1-$2]=$!
  PIDS+=($!)
}
for L in rust go; do attack "$L" fin 95; done
for L in rust go; do attack "$L" hangup 13; done
for L in rust go; do
  out=$WORK/$L-hangup.out
  wait "${ATT[$L-hangup]}"
  check "$L: root's server echoed nobody's $((N * SLOTS)) messages ($(head -1 "$out"))" grep -q "^ECHOED $((N * SLOTS)) of" "$out"
  k=$(last "$out")
  check "$L: its pool's pages in nobody's memfds given back after nobody hung up (${k} KiB left of $((N * SLOTS * 64)))" test "$k" -le $((N * 8))
done
# One language at a time: the toggler spins a core for 6 s a round, R rounds of NT connections.
NT=8 ST=8 R=4
for L in rust go; do
  out=$WORK/$L-toggle.out
  attack "$L" toggle 14 "$NT" "$ST" "$R"
  wait "${ATT[$L-toggle]}"
  check "$L: root's server echoed nobody's $((NT * ST)) messages in each of $R rounds ($(grep -c "^ECHOED $((NT * ST)) of" "$out"))" test "$(grep -c "^ECHOED $((NT * ST)) of" "$out")" -eq "$R"
  check "$L: nobody toggled free_head while root's server closed, then hung up ($(grep -c "^HUNG UP" "$out") rounds)" test "$(grep -c "^HUNG UP" "$out")" -eq "$R"
  k=$(last "$out")
  check "$L: nothing of its pools left in nobody's memfds 14 s after nobody toggled free_head and hung up (${k} KiB left of $((R * NT * ST * 64)))" test "$k" -le $((R * NT * 8))
done
for L in rust go; do
  out=$WORK/$L-fin.out
  check "$L: root's server echoed nobody's $((N * SLOTS)) messages ($(head -1 "$out"))" grep -q "^ECHOED $((N * SLOTS)) of" "$out"
  check "$L: the pool stays while nobody may read the messages it holds" grep -q "^S2C_POOL $((N * SLOTS * 64))$" "$out"
done
for L in rust go; do
  # nobody holds them for 95 s from its FIN: the orphan's idle time (60 s) and a look (5 s) passed.
  wait "${ATT[$L-fin]}"
  k=$(last "$WORK/$L-fin.out")
  check "$L: given back once nobody held them 60 s without releasing one (${k} KiB left)" test "$k" -le $((N * 8))
  o=$(timeout 20 "$PEER" client "127.0.0.1:${PORT[$L]}" msg 200 5000 2>&1)
  check "$L: root's message client gets its messages over shared memory ($(tail -1 <<<"$o"))" grep -q "^OK 200 colo$" <<<"$o"
done
finish
