#!/usr/bin/env bash
# Bulk transfers through redis, both sides under `colo run` (a full ring with a reader slower
# than its writer): redis-cli --pipe of 200,000 SETs (8.8 MB of protocol) answered with no error
# and every reply, the keys all there; redis-benchmark pipelining 64 requests of 64 KiB values
# (-P 64 -d 65536) completes, the value is 65536 bytes. Outcomes, not speed (bench.sh has the
# rates). Every step has a timeout.
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0

P=$(free_port); start_redis "$P" colo
cli() { timeout 10 redis-cli -p "$P" "$@"; }
# accelerated NAME MIN: at least MIN of NAME's connections accelerated, none left on TCP.
accelerated() {
  local n; n=$(grep -c "connect 127.0.0.1:$P: accelerated (shared memory)" "$WORK/$1.err")
  [ "$n" -ge "$2" ] && ! grep -q "connect 127.0.0.1:$P: .*plain TCP" "$WORK/$1.err" ||
    { echo "$1: $n accelerated connections (at least $2 expected)"; cat "$WORK/$1.err"; return 1; }
}

# 200,000 SETs in redis's protocol, k:000000 -> v000000000 and on (44 bytes each).
python3 "$HERE/py/redis_pipe.py" 200000 >"$WORK/pipe.resp"
check "redis-cli --pipe of 200000 SETs ($(stat -c %s "$WORK/pipe.resp") bytes, both under colo run)" sh -c \
  "timeout 60 env COLO_LOG=info $COLORUN redis-cli -p $P --pipe <'$WORK/pipe.resp' >'$WORK/pipe.out' 2>'$WORK/pipe.err'"
check "... 0 errors, 200000 replies" grep -qx "errors: 0, replies: 200000" "$WORK/pipe.out"
check "... over shared memory" accelerated pipe 1
check "... DBSIZE 200000" test "$(cli dbsize)" = 200000
check "... the first, a middle and the last key's values" test \
  "$(cli mget k:000000 k:123456 k:199999 | tr '\n' ' ')" = "v000000000 v000123456 v000199999 "

cli flushall >/dev/null
check "redis-benchmark -P 64 -d 65536 -t set,get -n 2000 -c 10 (both under colo run)" sh -c \
  "timeout 60 env COLO_LOG=info $COLORUN redis-benchmark -p $P -P 64 -d 65536 -t set,get -n 2000 -c 10 -q >'$WORK/rb.out' 2>'$WORK/rb.err'"
check "... SET and GET each report a rate" sh -c \
  "tr '\r' '\n' <'$WORK/rb.out' | grep -q '^SET: .* requests per second' && tr '\r' '\n' <'$WORK/rb.out' | grep -q '^GET: .* requests per second'"
check "... its 10 connections per test over shared memory" accelerated rb 20
check "... the value set is 65536 bytes" test "$(cli strlen key:__rand_int__)" = 65536

[ $FAIL = 0 ] && echo "redis_bulk.sh: all passed" || echo "redis_bulk.sh: FAILURES"
exit $FAIL
