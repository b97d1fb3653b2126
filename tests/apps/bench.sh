#!/usr/bin/env bash
# Same-run comparison: plain TCP loopback vs both sides under `colo run`.
# redis-benchmark -t get,set -n 200000 -P 1 with -c 50 and -c 1, and -c 10 with a connection per
# request (-k 0); nginx (1 KiB file) with wrk -c 50, and with `Connection: close`. The
# connection-heavy rows are alternating rounds (ROUNDS, default 16; CLOSE_DUR for wrk's, 2s).
# ONLY=connection-heavy runs those rows alone.
source "$(dirname "$0")/common.sh"
build
N=${N:-200000}
rb() { # $1 port, $2 clients (and more options), $3 prefix ("" or colo run), $4 requests
  $3 redis-benchmark -p "$1" -t get,set -n "${4:-$N}" -c $2 -P 1 -q 2>/dev/null | tr '\r' '\n' |
    awk '/requests per second/ {sub(":","",$1); printf "%s=%s ", $1, $2}'
}
ratio() { python3 -c "print(f'{float($2)/float($1):.2f}x')"; }
P=$(free_port); start_redis "$P" "" --unixsocket "$WORK/redis.sock" --unixsocketperm 700
Q=$(free_port); start_redis "$Q" colo
keepalive() { [ "${ONLY:-}" != connection-heavy ]; }
for c in 50 1; do
  keepalive || break
  tcp=$(rb "$P" $c ""); colo=$(rb "$Q" $c "$COLORUN"); unix=$(rb "$P" "$c -s $WORK/redis.sock" "")
  for op in SET GET; do
    t=$(echo "$tcp" | tr ' ' '\n' | grep "^$op=" | cut -d= -f2); k=$(echo "$colo" | tr ' ' '\n' | grep "^$op=" | cut -d= -f2)
    u=$(echo "$unix" | tr ' ' '\n' | grep "^$op=" | cut -d= -f2)
    printf "redis %-3s -c %-2s  tcp %10s  unix %10s  colo %10s  ratio %s (x unix %s)\n" "$op" "$c" "$t" "$u" "$k" "$(ratio "$t" "$k")" "$(ratio "$u" "$k")"
  done
done
# Connection-heavy rows differ from TCP by a few percent at most, less than this host's drift
# between placements over a few seconds: ROUNDS (default 16) alternating rounds, each side first
# in every other one, the median of each side and of the rounds' ratios.
# `alternate LABEL TCP-COMMAND COLO-COMMAND` (each prints one rate).
alternate() {
  local t="" k="" i a b
  for i in $(seq "${ROUNDS:-16}"); do
    if [ $((i % 2)) = 1 ]; then a=$($2); b=$($3); else b=$($3); a=$($2); fi
    t="$t $a"; k="$k $b"
  done
  python3 - "$1" "$t" "$k" <<'PY'
import statistics as st, sys
label, t, k = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
r = sorted(b / a for a, b in zip(t, k))
ahead = sum(x >= 1 for x in r)
print(f"{label}  tcp {st.median(t):10.0f}  colo {st.median(k):10.0f}  ratio {st.median(r):.2f}x (rounds {r[0]:.2f}-{r[-1]:.2f}, colo ahead in {ahead} of {len(r)} alternating)")
PY
}
rb_get() { rb "$1" "10 -k 0" "${*:2}" 20000 | tr ' ' '\n' | grep "^GET=" | cut -d= -f2; }
# Connection-heavy: a new connection per request.
alternate "redis GET -c 10 -k 0 (connection per request)" "rb_get $P" "rb_get $Q $COLORUN"
w() { $2 wrk -t1 -c50 -d${DUR:-5s} ${3:+-H "$3"} "http://127.0.0.1:$1/1k.txt" 2>/dev/null | awk '/Requests\/sec/ {print $2}'; }
wc_close() { DUR=${CLOSE_DUR:-2s} w "$1" "${*:2}" "Connection: close"; }
for workers in 1 2; do
  A=$(free_port); start_nginx "$A" $workers ""
  B=$(free_port); start_nginx "$B" $workers colo
  keepalive && t=$(w "$A" "") && k=$(w "$B" "$COLORUN") &&
  printf "nginx %sw  wrk -c50  tcp %10s  colo %10s  ratio %s\n" "$workers" "$t" "$k" "$(ratio "$t" "$k")"
  # Connection-heavy: a connection per request.
  alternate "nginx ${workers}w  wrk -c50 Connection: close" "wc_close $A" "wc_close $B $COLORUN"
done
# nginx as a reverse proxy (kept-alive upstream connections) in front of nginx with 2 workers.
keepalive || exit 0
A=$(free_port); start_nginx "$A" 2 ""; A2=$(free_port); start_nginx "$A2" 1 "" "$A"
B=$(free_port); start_nginx "$B" 2 colo; B2=$(free_port); start_nginx "$B2" 1 colo "$B"
t=$(w "$A2" ""); k=$(w "$B2" "$COLORUN")
printf "nginx proxy -> nginx 2w  wrk -c50  tcp %10s  colo %10s  ratio %s\n" "$t" "$k" "$(ratio "$t" "$k")"
