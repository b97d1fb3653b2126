#!/usr/bin/env bash
# Red team: a client of another user must not keep memory charged to a server for as long as
# it keeps its connections open. A memfd's page nobody wrote is a hole; reading it through a
# shared mapping makes the kernel allocate it, charged to the reader's memory cgroup.
# t_rt_hole_reads.sh made the server's last close give those pages back; while the connection
# lived nothing did (an honest producer shrinks its ring when quiet and gives its pages back
# itself, a hostile one never does, and the consumer cannot punch a page the producer may be
# writing into). nobody opens 4 CARRIER connections to root's redis (colo run) with 64 MiB
# rings, claims 60 MB of holes in each as the bulk argument of one command (redis reads it,
# answers, and frees its own query buffer), and keeps the connections idle. Before, about
# 228 MiB stayed allocated, charged to root's redis (its RssShmem), up to the per-uid mapped
# budget with more connections. Now a consumer whose peer is another user reads the ring with
# pread of the segment's memfd (colo::Segment::read_through_memfd), which gives zeros for a
# hole and allocates nothing.
source "$(dirname "$0")/lib.sh"
need redis-server || finish
cp "$HERE/py/idle_holes.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || finish
RP=${PIDS[-1]}
shmem() { awk '/^RssShmem/ {print int($2 / 1024)}' "/proc/$RP/status"; }
before=$(shmem)
as_nobody timeout 120 /usr/bin/python3 "$WORK/idle_holes.py" "$P" 4 60000000 '*1\r\n$60000000\r\n' 3 >"$WORK/att.out" 2>&1 & ATT=$!
for _ in $(seq 600); do grep -qs '^READ' "$WORK/att.out" && break; sleep 0.1; done
sleep 1; during=$(shmem)
wait "$ATT"
check "redis read the 4 connections' claims ($(grep '^READ' "$WORK/att.out"))" grep -q "^READ 240000060 by 4" "$WORK/att.out"
check "redis still serves" test "$(timeout 5 $COLORUN redis-cli -p "$P" ping 2>/dev/null)" = PONG
allocated=$(awk '/^ALLOCATED/ {print $2}' "$WORK/att.out")
# Over TCP, bytes read hold nothing once read: allow 4 MiB a connection.
check "idle connections whose bytes were read hold at most 16 MiB of redis's memory (${allocated:-?} MiB allocated, redis's RssShmem ${before} -> ${during} MiB)" test "${allocated:-999}" -le 16
finish
