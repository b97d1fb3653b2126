#!/usr/bin/env bash
# Same-run comparison: plain TCP loopback vs both sides under `colo run`.
# redis-benchmark -t get,set -n 200000 -P 1 with -c 50 and -c 1, and -c 10 with a connection per
# request (-k 0); nginx (1 KiB file) with wrk -c 50.
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
for c in 50 1; do
  tcp=$(rb "$P" $c ""); colo=$(rb "$Q" $c "$COLORUN"); unix=$(rb "$P" "$c -s $WORK/redis.sock" "")
  for op in SET GET; do
    t=$(echo "$tcp" | tr ' ' '\n' | grep "^$op=" | cut -d= -f2); k=$(echo "$colo" | tr ' ' '\n' | grep "^$op=" | cut -d= -f2)
    u=$(echo "$unix" | tr ' ' '\n' | grep "^$op=" | cut -d= -f2)
    printf "redis %-3s -c %-2s  tcp %10s  unix %10s  colo %10s  ratio %s (x unix %s)\n" "$op" "$c" "$t" "$u" "$k" "$(ratio "$t" "$k")" "$(ratio "$u" "$k")"
  done
done
# Connection-heavy: a new connection per request.
tcp=$(rb "$P" "10 -k 0" "" 20000); colo=$(rb "$Q" "10 -k 0" "$COLORUN" 20000)
t=$(echo "$tcp" | tr ' ' '\n' | grep "^GET=" | cut -d= -f2); k=$(echo "$colo" | tr ' ' '\n' | grep "^GET=" | cut -d= -f2)
printf "redis GET -c 10 -k 0 (connection per request)  tcp %10s  colo %10s  ratio %s\n" "$t" "$k" "$(ratio "$t" "$k")"
w() { $2 wrk -t1 -c50 -d${DUR:-5s} ${3:+-H "$3"} "http://127.0.0.1:$1/1k.txt" 2>/dev/null | awk '/Requests\/sec/ {print $2}'; }
for workers in 1 2; do
  A=$(free_port); start_nginx "$A" $workers ""
  B=$(free_port); start_nginx "$B" $workers colo
  t=$(w "$A" ""); k=$(w "$B" "$COLORUN")
  printf "nginx %sw  wrk -c50  tcp %10s  colo %10s  ratio %s\n" "$workers" "$t" "$k" "$(ratio "$t" "$k")"
  # Connection-heavy: a connection per request.
  t=$(w "$A" "" "Connection: close"); k=$(w "$B" "$COLORUN" "Connection: close")
  printf "nginx %sw  wrk -c50 Connection: close  tcp %10s  colo %10s  ratio %s\n" "$workers" "$t" "$k" "$(ratio "$t" "$k")"
done
# nginx as a reverse proxy (kept-alive upstream connections) in front of nginx with 2 workers.
A=$(free_port); start_nginx "$A" 2 ""; A2=$(free_port); start_nginx "$A2" 1 "" "$A"
B=$(free_port); start_nginx "$B" 2 colo; B2=$(free_port); start_nginx "$B2" 1 colo "$B"
t=$(w "$A2" ""); k=$(w "$B2" "$COLORUN")
printf "nginx proxy -> nginx 2w  wrk -c50  tcp %10s  colo %10s  ratio %s\n" "$t" "$k" "$(ratio "$t" "$k")"
