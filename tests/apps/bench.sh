#!/usr/bin/env bash
# Same-run comparison: plain TCP loopback vs both sides under `colo run` (and the program's Unix
# socket where it has one). redis-benchmark -t get,set -n 200000 -P 1 with -c 50 and -c 1, and
# -c 10 with a connection per request (-k 0); nginx (1 KiB file) with wrk -c 50, and with
# `Connection: close`. The connection-heavy rows are alternating rounds (ROUNDS, default 16;
# CLOSE_DUR for wrk's, 2s). Bulk rows (redis-benchmark -P 64 -d 65536, redis-cli --pipe of 8.8 MB),
# postgres rows (pgbench -S and TPC-B-like at scale 4 with -c 4 -j 2, pgbench -S -C -c 8 -j 2, a
# 50 MB psql COPY in and out) and the short-lived rows with COLO_SHORT_LIVED=accelerate are
# FEW_ROUNDS (default 4) alternating rounds, pgbench's of PG_T seconds (default 1). The postgres
# servers run without durability (fsync off): the rows measure the connection, not the disk.
# ONLY=connection-heavy, ONLY=bulk or ONLY=postgres runs those rows alone.
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
keepalive() { [ -z "${ONLY:-}" ]; }
only() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
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
# `alternate LABEL TCP-COMMAND COLO-COMMAND [UNIX-COMMAND]` (each prints one rate); the order
# rotates by one each round (with two commands, TCP's first in odd rounds).
alternate() {
  local t="" k="" u="" i j c cmds=("$2" "$3") out=()
  [ -n "${4:-}" ] && cmds+=("$4")
  for i in $(seq "${ROUNDS:-16}"); do
    for j in $(seq 0 $((${#cmds[@]} - 1))); do
      c=$(((i - 1 + j) % ${#cmds[@]}))
      out[$c]=$(${cmds[$c]})
    done
    t="$t ${out[0]}"; k="$k ${out[1]}"; u="$u ${out[2]:-}"
  done
  python3 - "$1" "$t" "$k" "$u" <<'PY'
import statistics as st, sys
label, t, k = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
u = [float(x) for x in sys.argv[4].split()]
r = sorted(b / a for a, b in zip(t, k))
ahead = sum(x >= 1 for x in r)
f = lambda x: f"{x:10.0f}" if x >= 1000 else f"{x:10.1f}"
line = f"{label}  tcp {f(st.median(t))}  colo {f(st.median(k))}  ratio {st.median(r):.2f}x (rounds {r[0]:.2f}-{r[-1]:.2f}, colo ahead in {ahead} of {len(r)} alternating)"
if u:
    ru = sorted(b / a for a, b in zip(u, k))
    line += f"  unix {f(st.median(u))}  x unix {st.median(ru):.2f}x ({ru[0]:.2f}-{ru[-1]:.2f})"
print(line)
PY
}
rb_get() { rb "$1" "10 -k 0" "${*:2}" "${KN:-20000}" | tr ' ' '\n' | grep "^GET=" | cut -d= -f2; }
# Connection-heavy: a new connection per request; also with the shim's short-lived rule off.
only connection-heavy && alternate "redis GET -c 10 -k 0 (connection per request)" "rb_get $P" "rb_get $Q $COLORUN"
only connection-heavy && KN=5000 ROUNDS=${FEW_ROUNDS:-4} alternate "redis GET -c 10 -k 0 -n 5000, COLO_SHORT_LIVED=accelerate" \
  "rb_get $P" "rb_get $Q env COLO_SHORT_LIVED=accelerate $COLORUN"
w() { $2 wrk -t1 -c50 -d${DUR:-5s} ${3:+-H "$3"} "http://127.0.0.1:$1/1k.txt" 2>/dev/null | awk '/Requests\/sec/ {print $2}'; }
wc_close() { DUR=${CLOSE_DUR:-2s} w "$1" "${*:2}" "Connection: close"; }
for workers in 1 2; do
  only connection-heavy || break
  A=$(free_port); start_nginx "$A" $workers ""
  B=$(free_port); start_nginx "$B" $workers colo
  keepalive && t=$(w "$A" "") && k=$(w "$B" "$COLORUN") &&
  printf "nginx %sw  wrk -c50  tcp %10s  colo %10s  ratio %s\n" "$workers" "$t" "$k" "$(ratio "$t" "$k")"
  # Connection-heavy: a connection per request.
  alternate "nginx ${workers}w  wrk -c50 Connection: close" "wc_close $A" "wc_close $B $COLORUN"
done
# nginx as a reverse proxy (kept-alive upstream connections) in front of nginx with 2 workers.
if keepalive; then
  A=$(free_port); start_nginx "$A" 2 ""; A2=$(free_port); start_nginx "$A2" 1 "" "$A"
  B=$(free_port); start_nginx "$B" 2 colo; B2=$(free_port); start_nginx "$B2" 1 colo "$B"
  t=$(w "$A2" ""); k=$(w "$B2" "$COLORUN")
  printf "nginx proxy -> nginx 2w  wrk -c50  tcp %10s  colo %10s  ratio %s\n" "$t" "$k" "$(ratio "$t" "$k")"
fi
FEW=${FEW_ROUNDS:-4}
# mbps BYTES COMMAND...: runs COMMAND, prints BYTES per second of its run in MB/s (so a ratio of
# these is TCP's time / colo's).
mbps() {
  local bytes=$1 s e; shift
  s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N)
  python3 -c "print(f'{$bytes * 1000 / ($e - $s):.1f}')"
}
# to PORT-OR-SOCKET: redis's client option for a TCP port or a Unix socket's path.
to() { case $1 in /*) echo "-s $1" ;; *) echo "-p $1" ;; esac; }

# Bulk: redis pipelining 64 requests of 64 KiB values, and redis-cli --pipe of 8.8 MB of SETs.
if only bulk; then
  rbig() { # $1 SET or GET, $2 port or socket, then the prefix: one rate
    local t=$1 dest=$2; shift 2
    $* redis-benchmark $(to "$dest") -P 64 -d 65536 -t "$t" -n "${BULK_N:-6000}" -c 10 -q 2>/dev/null |
      tr '\r' '\n' | awk '/requests per second/ {print $2}'
  }
  # The GET rows read a 64 KiB value (redis-benchmark's key), as the SET rows leave it.
  head -c 65536 /dev/zero | tr '\0' 'v' >"$WORK/64k"
  for port in "$P" "$Q"; do timeout 10 redis-cli -p "$port" -x set key:__rand_int__ <"$WORK/64k" >/dev/null; done
  for op in SET GET; do
    ROUNDS=$FEW alternate "redis $op -P 64 -d 65536 -c 10" "rbig $op $P" "rbig $op $Q $COLORUN" "rbig $op $WORK/redis.sock"
  done
  python3 "$HERE/py/redis_pipe.py" 200000 >"$WORK/pipe.resp"
  PIPE_BYTES=$(stat -c %s "$WORK/pipe.resp")
  pipe() { # $1 port or socket, then the prefix: MB/s of redis-cli --pipe into an emptied redis
    local dest=$1; shift
    timeout 30 redis-cli $(to "$dest") flushall >/dev/null
    mbps "$PIPE_BYTES" sh -c "exec timeout 60 $* redis-cli $(to "$dest") --pipe <'$WORK/pipe.resp'"
  }
  ROUNDS=$FEW alternate "redis-cli --pipe 200000 SETs ($PIPE_BYTES B), MB/s" "pipe $P" "pipe $Q $COLORUN" "pipe $WORK/redis.sock"
fi

# postgres: a plain server (TCP and its Unix socket) and one under colo run, pgbench's tables at scale 4.
if only postgres; then
  PT=$(free_port); start_postgres "$PT" "" 4 || exit 1
  PC=$(free_port); start_postgres "$PC" colo 4 || exit 1
  pgb() { # $1 port, $2 host (127.0.0.1 or the socket's directory), then the prefix; PGB_ARGS: tps
    local port=$1 host=$2; shift 2
    $* timeout 60 "$PGBIN/pgbench" -h "$host" -p "$port" -U postgres $PGB_ARGS -T "${PG_T:-1}" postgres 2>/dev/null |
      awk '/^tps/ {print $3}'
  }
  pg_row() { # $1 label, then pgbench's options: TCP, colo and the Unix socket
    PGB_ARGS="${*:2}" ROUNDS=$FEW alternate "$1" "pgb $PT 127.0.0.1" "pgb $PC 127.0.0.1 $COLORUN" "pgb $PT $WORK/pg$PT"
  }
  pg_row "postgres pgbench -S -c 4 -j 2 (select-only), tps" -S -c 4 -j 2
  pg_row "postgres pgbench -c 4 -j 2 (TPC-B-like), tps" -c 4 -j 2
  # A connection per transaction; the second row with the shim's short-lived rule off.
  PGB_ARGS="-S -C -c 8 -j 2" ROUNDS=$FEW alternate "postgres pgbench -S -C -c 8 -j 2, tps" \
    "pgb $PT 127.0.0.1" "pgb $PC 127.0.0.1 $COLORUN"
  PGB_ARGS="-S -C -c 8 -j 2" ROUNDS=$FEW alternate "postgres pgbench -S -C -c 8 -j 2, COLO_SHORT_LIVED=accelerate, tps" \
    "pgb $PT 127.0.0.1" "pgb $PC 127.0.0.1 env COLO_SHORT_LIVED=accelerate $COLORUN"
  # 50 MB through psql's COPY FROM STDIN (into an emptied table) and COPY TO STDOUT.
  head -c 37500000 /dev/urandom | base64 -w 100 >"$WORK/copy.in"
  COPY_BYTES=$(stat -c %s "$WORK/copy.in")
  psql_() { local port=$1; shift; timeout 60 "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres postgres "$@"; }
  for port in "$PT" "$PC"; do psql_ "$port" -c "CREATE TABLE bulk (line text)"; done
  copy() { # $1 FROM or TO, $2 port, $3 host, then the prefix: MB/s
    local dir=$1 port=$2 host=$3 io="" std=STDOUT; shift 3
    if [ "$dir" = FROM ]; then
      psql_ "$port" -c "TRUNCATE bulk" && psql_ "$port" -c CHECKPOINT || return 1
      io="<'$WORK/copy.in'" std=STDIN
    fi
    mbps "$COPY_BYTES" sh -c "exec timeout 60 $* '$PGBIN/psql' -X -q -v ON_ERROR_STOP=1 -h '$host' -p $port -U postgres postgres -c 'COPY bulk $dir $std' $io"
  }
  for dir in FROM TO; do
    ROUNDS=$FEW alternate "postgres psql COPY $dir ($COPY_BYTES B), MB/s" "copy $dir $PT 127.0.0.1" "copy $dir $PC 127.0.0.1 $COLORUN" "copy $dir $PT $WORK/pg$PT"
  done
fi
