#!/usr/bin/env bash
# Many connections under `colo run` (redis-server and redis-benchmark, both preloaded): every
# connection accelerated, and the descriptors each one costs on each side. Run alone or from
# run.sh (COLO_APPS_BUILT=1 skips the build). Any failure exits 1.
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAIL=1; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }

# fds PID: how many descriptors PID holds.
fds() { ls /proc/"$1"/fd 2>/dev/null | wc -l; }

# scale N LIMIT: redis-benchmark -c N against redis-server, both under `ulimit -n LIMIT` (soft =
# hard: the shim's descriptors share the application's limit). Every connection accelerated on
# both sides, no line saying one went to TCP; the descriptors both processes hold with the N
# connections open, against the same run over plain TCP, are at most 3 per connection beyond it.
scale() {
  local n=$1 limit=$2 P
  P=$(free_port)
  (ulimit -n "$limit" && cd "$WORK" && exec env COLO_LOG=info $COLORUN redis-server --port "$P" --save '' --appendonly no --dir "$WORK") \
    >"$WORK/scale-$n.srv" 2>&1 &
  local SRV=$!; PIDS+=($SRV); wait_port "$P" || { bad "redis-server on $P"; return; }
  local base_s; base_s=$(fds $SRV)
  # Long enough to sample: the benchmark holds its N connections for the whole run.
  (ulimit -n "$limit" && exec env COLO_LOG=info $COLORUN redis-benchmark -p "$P" -c "$n" -n $((n * 400)) -t get -q) \
    >"$WORK/scale-$n.out" 2>"$WORK/scale-$n.cli" &
  local CLI=$! peak_s=0 peak_c=0 s c
  PIDS+=($CLI)
  while kill -0 $CLI 2>/dev/null; do
    s=$(fds $SRV); c=$(fds $CLI)
    [ "$s" -gt "$peak_s" ] && peak_s=$s
    [ "$c" -gt "$peak_c" ] && peak_c=$c
    sleep 0.2
  done
  wait $CLI
  local acc_c acc_s
  acc_c=$(grep -c ': accelerated (shared memory)' "$WORK/scale-$n.cli")
  acc_s=$(grep -c ': accelerated (shared memory)' "$WORK/scale-$n.srv")
  echo "     -c $n, ulimit -n $limit: client accelerated $acc_c, server $acc_s; descriptors at peak: server $peak_s (idle $base_s), client $peak_c"
  check "redis-benchmark -c $n (limit $limit) ran" grep -q 'per second' "$WORK/scale-$n.out"
  # One connection more than -c: the benchmark's first asks the server's configuration.
  check "-c $n: every client connection accelerated" test "$acc_c" -ge "$n"
  check "-c $n: every server connection accelerated" test "$acc_s" -ge "$n"
  check "-c $n: no connection left on TCP" sh -c "! grep -q 'plain TCP\|left on TCP' '$WORK/scale-$n.cli' '$WORK/scale-$n.srv'"
  # redis-benchmark itself holds about as many descriptors as connections plus a few; the server
  # its idle count plus one per connection (plain TCP): at most 2 more per connection each.
  check "-c $n: server descriptors $peak_s <= $base_s + 3 x $n" test "$peak_s" -le $((base_s + 3 * n))
  check "-c $n: client descriptors $peak_c <= 16 + 3 x $n" test "$peak_c" -le $((16 + 3 * n))
  kill $SRV 2>/dev/null; wait $SRV 2>/dev/null
}

scale 64 20000
scale 1000 20000
# The shim's band at the top of a fixed limit of 16384 holds 1024 numbers: 1000 connections need
# the upper half too.
scale 1000 16384

[ $FAIL = 0 ] && echo "tests/apps/scale.sh: all passed" || echo "tests/apps/scale.sh: FAILURES"
exit $FAIL
