#!/usr/bin/env bash
# Memory at scale, compared fairly (TCP's buffers live in the kernel, outside PSS): redis-server and
# redis-benchmark -c 1000 -d 1000 (every ring page written), plainly and both under `colo run`;
# sampled every 0.5 s, the peak of both processes' PSS plus the kernel's TCP memory
# (/proc/net/sockstat `mem`, in pages), and how many connections were accelerated. A benchmark:
# it prints numbers and a ratio, it asserts nothing. N (default 1000000) requests per test.
source "$(dirname "$0")/common.sh"
build
N=${N:-1000000}
pss() { awk '/^Pss:/ {s += $2} END {print s + 0}' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }
run() { # $1 "colo" or "": prints "PEAK_KIB PSS_KIB SOCK_KIB ACCELERATED"
  local port; port=$(free_port)
  start_redis "$port" "$1" --maxclients 5000 || exit 1
  local server=${PIDS[-1]} pre=""; [ "$1" = colo ] && pre=$COLORUN
  COLO_LOG=info $pre redis-benchmark -p "$port" -c 1000 -d 1000 -n "$N" -t set,get -q >"$WORK/bench-$1.out" 2>"$WORK/bench-$1.log" &
  local bench=$! peak=0 at=""
  sleep 2
  while kill -0 "$bench" 2>/dev/null; do
    local b; b=$(pgrep -P "$bench" redis-benchmark || echo "$bench")
    local p=$(( $(pss "$server") + $(pss "$b") )) sk; sk=$(awk '/^TCP:/ {print $NF * 4}' /proc/net/sockstat)
    [ $((p + sk)) -gt "$peak" ] && peak=$((p + sk)) && at="$p $sk"
    sleep 0.5
  done
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1
  echo "$peak $at $(grep -c 'accelerated (shared' "$WORK/bench-$1.log")"
}
read -r tp tpss tsk _ <<<"$(run "")"
read -r cp cpss csk acc <<<"$(run colo)"
echo "redis -c 1000 -d 1000, peak PSS (both processes) + kernel TCP memory: tcp ${tp} KiB (PSS $tpss, TCP $tsk), colo ${cp} KiB (PSS $cpss, TCP $csk), $acc of 2000 connections accelerated"
python3 -c "print(f'colo / tcp: {$cp / $tp:.2f}x')"
