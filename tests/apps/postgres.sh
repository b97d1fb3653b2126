#!/usr/bin/env bash
# postgres under `colo run` (a backend forked per connection: the accepted connection's shared
# memory must reach the child), run unprivileged from a cluster initdb made in a temporary
# directory, with clients under `colo run`: pgbench's set-up, select-only, TPC-B-like and a
# connection per transaction (-C) with no failed transaction, and a 50 MB COPY through psql in
# and back out with the same sha256. The long-lived clients' connections must be accelerated
# (the shim's log lines for connect and accept; the fallback lines say "not accelerated" or
# "plain TCP"). Needs the Debian package postgresql; as root the server runs as nobody (postgres
# refuses root). Every step has a timeout; the server is stopped and its files removed on exit,
# also on failure.
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0

if [ -n "$PG_AS" ] && ! { id nobody >/dev/null 2>&1 && $PG_AS test -r "$SHIM"; }; then
  echo "FAIL postgres: run as root, the server needs a user nobody that can read $SHIM"; exit 1
fi
P=$(free_port)
start_postgres "$P" colo || { echo "FAIL postgres: the server did not start"; exit 1; }
PGLOG=$WORK/pg$P/postgres.log
PGH=(-h 127.0.0.1 -p "$P" -U postgres)
# client NAME CMD...: CMD under colo run (COLO_LOG=info), its output in $WORK/NAME.out and .err.
client() { local n=$1; shift; timeout 120 env COLO_LOG=info $COLORUN "$@" >"$WORK/$n.out" 2>"$WORK/$n.err"; }
accelerated() { grep -c "connect 127.0.0.1:$P: accelerated (shared memory)" "$WORK/$1.err"; }
# all_accelerated NAME MIN: at least MIN connections of NAME's run accelerated, none left on TCP.
all_accelerated() {
  local n; n=$(accelerated "$1")
  [ "$n" -ge "$2" ] && ! grep -q "connect 127.0.0.1:$P: .*plain TCP" "$WORK/$1.err" ||
    { echo "$1: $n accelerated connections (at least $2 expected)"; grep "connect 127.0.0.1:$P" "$WORK/$1.err" | sort | uniq -c; return 1; }
}
# mostly_accelerated NAME MIN: at least MIN connections of NAME's run accelerated, at least 9 in
# 10 of its transactions' connections (pgbench -C: one each), and a plain one only for the
# documented reason of a server that accepts late (postmaster forks a backend per connection; a
# loaded host delays its accept past the bounded wait of a client that holds other connections,
# which then goes plain, as do its next connections there for a second).
mostly_accelerated() {
  local n tx plain late; n=$(accelerated "$1")
  tx=$(awk '/^number of transactions actually processed:/ {print $NF}' "$WORK/$1.out")
  plain=$(grep -c "connect 127.0.0.1:$P: .*plain TCP" "$WORK/$1.err")
  late=$(grep -Ec "connect 127.0.0.1:$P: (its server's program is not accepting|not accelerated: no answer within)" "$WORK/$1.err")
  [ "$n" -ge "$2" ] && [ "$plain" = "$late" ] && [ $((n * 10)) -ge $((${tx:-0} * 9)) ] ||
    { echo "$1: $n accelerated connections of ${tx:-?} (at least $2 and 9 in 10 expected), $plain lines of plain TCP ($late for a late accept)"; grep "connect 127.0.0.1:$P" "$WORK/$1.err" | sort | uniq -c; return 1; }
}
# pgbench_ok NAME: it exited 0 having processed transactions, none failed.
pgbench_ok() {
  grep -q '^number of failed transactions: 0 ' "$WORK/$1.out" &&
    [ "$(awk '/^number of transactions actually processed:/ {print $NF}' "$WORK/$1.out")" -gt 0 ] ||
    { cat "$WORK/$1.out" "$WORK/$1.err"; return 1; }
}

check "pgbench -i under colo run" client init "$PGBIN/pgbench" -i -s 2 "${PGH[@]}" postgres
check "... over shared memory" all_accelerated init 1
# Long-lived connections (4 clients, and pgbench's own first connection): every one accelerated.
check "pgbench -S -T2 -c4 (select-only, both under colo run)" client select "$PGBIN/pgbench" -S -T2 -c4 -j2 "${PGH[@]}" postgres
check "... no failed transaction" pgbench_ok select
check "... all 5 connections over shared memory" all_accelerated select 5
check "pgbench -T2 -c4 (TPC-B-like, both under colo run)" client tpcb "$PGBIN/pgbench" -T2 -c4 -j2 "${PGH[@]}" postgres
check "... no failed transaction" pgbench_ok tpcb
check "... all 5 connections over shared memory" all_accelerated tpcb 5
# A connection per transaction: after a few the shim sends them over plain TCP (short-lived),
# so this asserts the outcome only; with COLO_SHORT_LIVED=accelerate every one is accelerated.
check "pgbench -S -C -T2 -c4 (a connection per transaction)" client conn "$PGBIN/pgbench" -S -C -T2 -c4 -j2 "${PGH[@]}" postgres
check "... no failed transaction" pgbench_ok conn
check "pgbench -S -C -T2 -c4 with COLO_SHORT_LIVED=accelerate" client conn_acc env COLO_SHORT_LIVED=accelerate "$PGBIN/pgbench" -S -C -T2 -c4 -j2 "${PGH[@]}" postgres
check "... no failed transaction" pgbench_ok conn_acc
check "... its connections over shared memory (9 in 10 at least; the rest accepted late)" mostly_accelerated conn_acc 5

# 50 MB through COPY FROM STDIN and back out with COPY TO STDOUT (rows in insertion order:
# one writer, a fresh heap, synchronize_seqscans off).
head -c 37500000 /dev/urandom | base64 -w 100 >"$WORK/copy.in"
timeout 30 "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "${PGH[@]}" postgres -c "CREATE TABLE bulk (line text)" || bad "create the COPY table"
check "psql COPY 50 MB FROM STDIN under colo run" client copy_in sh -c \
  "exec '$PGBIN/psql' -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $P -U postgres postgres -c 'COPY bulk FROM STDIN' <'$WORK/copy.in'"
check "... over shared memory" all_accelerated copy_in 1
check "psql COPY TO STDOUT under colo run" client copy_out "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "${PGH[@]}" postgres -c "COPY bulk TO STDOUT"
check "... over shared memory" all_accelerated copy_out 1
mv "$WORK/copy_out.out" "$WORK/copy.out"
sum_in=$(sha256sum <"$WORK/copy.in" | cut -d' ' -f1); sum_out=$(sha256sum <"$WORK/copy.out" | cut -d' ' -f1)
check "... the same $(stat -c %s "$WORK/copy.in") bytes back out (sha256 ${sum_in:0:16}..., out ${sum_out:0:16}..., $(stat -c %s "$WORK/copy.out") bytes)" \
  test "$sum_in" = "$sum_out"
# The server's Unix socket, which the shim leaves to the kernel, still works beside it.
check "psql over postgres's Unix socket under colo run" test \
  "$(timeout 30 $COLORUN "$PGBIN/psql" -X -At -h "$WORK/pg$P" -p "$P" -U postgres postgres -c 'SELECT count(*) FROM bulk')" = 500000
# Every connection a client saw accelerated was accepted over shared memory by the server.
n_client=$(cat "$WORK"/*.err | grep -c "connect 127.0.0.1:$P: accelerated (shared memory)")
n_server=$(grep -c "accept .* -> 127.0.0.1:$P: accelerated (shared memory)" "$PGLOG")
check "the server accepted over shared memory ($n_server) every connection its clients saw accelerated ($n_client)" \
  test "$n_server" -ge "$n_client"

[ $FAIL = 0 ] && echo "postgres.sh: all passed" || { echo "postgres.sh: FAILURES (server log: tail below)"; tail -20 "$PGLOG"; }
exit $FAIL
