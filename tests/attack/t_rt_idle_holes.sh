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
# hole and allocates nothing, but for the ring's first 128 KiB, read through the mapping
# (colo::segment::MAPPED_WINDOW: at most those pages a connection, t_rt_punch_reads.sh). The
# same against a Go API server (go/sink_server.go, which reads every connection to its end),
# which held 228 MiB before it read through the memfd too
# (Conn.readThrough).
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/idle_holes.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
SINK=$WORK/sink_server
(cd "$ROOT/go" && go build -o "$SINK" ../tests/attack/go/sink_server.go) || bad "go build sink_server"
# attack LABEL PID PORT PREFIX WANT: nobody's 4 connections to the server PID on PORT, 60 MB of
# holes each after PREFIX; WANT is the bytes the server must have read of them all.
attack() {
  local label=$1 pid=$2 P=$3 prefix=$4 want=$5 out=$WORK/$1.out before during allocated
  shmem() { awk '/^RssShmem/ {print int($2 / 1024)}' "/proc/$pid/status"; }
  before=$(shmem)
  as_nobody timeout 120 /usr/bin/python3 "$WORK/idle_holes.py" "$P" 4 60000000 "$prefix" 3 >"$out" 2>&1 & local att=$!
  for _ in $(seq 600); do grep -qs '^READ' "$out" && break; sleep 0.1; done
  sleep 1; during=$(shmem)
  wait "$att"
  check "$label read the 4 connections' claims ($(grep '^READ' "$out"))" grep -q "^READ $want by 4" "$out"
  allocated=$(awk '/^ALLOCATED/ {print $2}' "$out")
  # Over TCP, bytes read hold nothing once read: allow 4 MiB a connection.
  check "$label: idle connections whose bytes were read hold at most 16 MiB of its memory (${allocated:-?} MiB allocated, its RssShmem ${before} -> ${during} MiB)" test "${allocated:-999}" -le 16
}
if need redis-server; then
  P=$(free_port)
  if start_redis "$P" colo --bind 127.0.0.1; then
    attack redis "${PIDS[-1]}" "$P" '*1\r\n$60000000\r\n' 240000060
    check "redis still serves" test "$(timeout 5 $COLORUN redis-cli -p "$P" ping 2>/dev/null)" = PONG
  fi
fi
P=$(free_port)
"$SINK" "127.0.0.1:$P" >"$WORK/sink.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/sink.out" && break; sleep 0.05; done
attack "Go server" "${PIDS[-1]}" "$P" x 240000004
check "the Go server still runs" kill -0 "${PIDS[-1]}"
finish
