#!/usr/bin/env bash
# Red team: a producer of another user that punches its ring's pages while we read them. A page
# of a memfd read through a shared mapping after the peer gave it back (MADV_REMOVE,
# fallocate(PUNCH_HOLE)) is allocated anew by our read, charged to our memory cgroup for as long
# as the peer keeps the file; a check before the copy (mincore) races with a punch after it. A
# side whose peer is another user reads the bytes at 0..128 KiB of its ring through the mapping
# and the rest with pread of the memfd (colo::segment::MAPPED_WINDOW, while one of the process's
# 64 windows, colo::segment::FOREIGN_WINDOWS, is free; past them all with pread), so what such a
# peer can make us allocate is the pages under that window, 128 KiB a connection, given back at
# our last close (TCP's default receive buffer, tcp_rmem's middle value, lets a peer make us
# hold as much while we do not read). nobody (py/punch_reads.py) opens 2 CARRIER connections to
# root's redis (colo run), sends one command whose 16 MiB bulk argument it claims through a
# 256 KiB ring (64 laps) while a thread of its punches every data page of the ring over and
# over, then one last lap of holes. Checked: redis read every claimed byte; its reads allocated
# no page above the window (a whole 256 KiB ring read through the mapping has up to 128 KiB a
# connection there) and at most the window's pages below it; redis still serves.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/punch_reads.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
need redis-server || finish
WINDOW=$((128 << 10)) CLAIM=$((16 << 20)) N=2
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || finish
out=$WORK/punch.out
as_nobody timeout 120 /usr/bin/python3 "$WORK/punch_reads.py" "$P" "$N" "$CLAIM" "*1\\r\\n\$$CLAIM\\r\\n" "$WINDOW" >"$out" 2>&1
read -r below beyond < <(awk '/^ALLOCATED/ {print $2, $3}' "$out")
want=$((N * (CLAIM + ${#CLAIM} + 7)))
check "redis read the 2 connections' claims ($(grep '^READ' "$out" || tail -1 "$out"), want $want)" grep -q "^READ $want by $N" "$out"
check "no page above the window allocated by redis's reads (${beyond:-?} bytes)" test "${beyond:-1}" -eq 0
check "at most the window's pages below it ($((${below:-0} >> 10)) KiB of at most $((N * WINDOW >> 10)))" test "${below:-999999999}" -le $((N * WINDOW))
check "redis still serves" test "$(timeout 5 $COLORUN redis-cli -p "$P" ping 2>/dev/null)" = PONG
finish
