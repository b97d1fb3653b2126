# Shared helpers for the scripts in tests/apps (sourced).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/rust/target}
build() {
  (cd "$ROOT/rust" && cargo build --release -q -p colo-preload && cargo build --release -q -p colo-run --example colo-run) || exit 1
}
# build_rev REV: builds REV's shim in a git worktree (its own target directory, OLD_TARGET to
# choose one) and sets OLDRUN to its `colo run --`; `cleanup` removes the worktree.
build_rev() {
  local old=$WORK/old oldtarget=${OLD_TARGET:-$TARGET/ab-old}
  git -C "$ROOT" worktree add -q --detach "$old" "$1" || exit 1
  (cd "$old/rust" && CARGO_TARGET_DIR=$oldtarget cargo build --release -q -p colo-preload &&
    CARGO_TARGET_DIR=$oldtarget cargo build --release -q -p colo-run --example colo-run) || exit 1
  OLDRUN="$oldtarget/release/examples/colo-run --"
}
SHIM=$TARGET/release/libcolo_preload.so
COLORUN="$TARGET/release/examples/colo-run --"
WORK=$(mktemp -d /tmp/colo-apps.XXXXXX); chmod 755 "$WORK"
PIDS=()
PG_PIDS=()
cleanup() {
  # postgres: a fast shutdown (SIGINT) ends its sessions too; SIGTERM would wait for them.
  for p in "${PG_PIDS[@]}"; do kill -INT "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null
  [ -d "$WORK/old" ] && git -C "$ROOT" worktree remove --force "$WORK/old"
  rm -rf "$WORK"
}
trap cleanup EXIT
# Reporting: each script sets FAIL=0 and ends with its count of `bad`s.
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAIL=1; }
# check NAME CMD...: ok or FAIL for NAME by CMD's status; a check of 5 s or more says how long it took.
check() {
  local name=$1 started=$SECONDS; shift
  if ! "$@"; then bad "$name"; return 0; fi
  if [ $((SECONDS - started)) -ge 5 ]; then ok "$name ($((SECONDS - started)) s)"; else ok "$name"; fi
}
need() { command -v "$1" >/dev/null || { bad "$1 is not installed (tests/apps/packages.txt)"; return 1; }; }
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
# fds_back PID MAX: the count falls to MAX or below within 10 s.
fds_back() { for _ in $(seq 200); do [ "$(fds "$1")" -le "$2" ] && return 0; sleep 0.05; done; echo "pid $1 holds $(fds "$1") descriptors"; return 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened"; return 1; }
start_redis() { # $1 port, $2 "colo" or "", then more redis-server options
  local port=$1 how=$2; shift 2
  if [ "$how" = colo ]; then COLO_LOG=info $COLORUN redis-server --port "$port" --save '' --appendonly no --dir "$WORK" "$@" >"$WORK/redis-$port.log" 2>&1 &
  else redis-server --port "$port" --save '' --appendonly no --dir "$WORK" "$@" >"$WORK/redis-$port.log" 2>&1 & fi
  PIDS+=($!); wait_port "$port"
}
start_nginx() { # $1 port, $2 workers, $3 "colo" or "", $4 (optional) upstream port to proxy to
  mkdir -p "$WORK/ngx$1/www" "$WORK/ngx$1/logs"
  local PROXY="server { listen 127.0.0.1:$1; root $WORK/ngx$1/www; }"
  # A reverse proxy with kept-alive upstream connections, registered in epoll before connect.
  [ -n "${4:-}" ] && PROXY="upstream up { server 127.0.0.1:$4; keepalive 64; }
    server { listen 127.0.0.1:$1; location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_read_timeout 10s; } }"
  head -c 1024 /dev/zero | tr '\0' 'x' > "$WORK/ngx$1/www/1k.txt"
  cat > "$WORK/ngx$1/nginx.conf" <<NGX
worker_processes $2;
daemon off;
pid $WORK/ngx$1/nginx.pid;
error_log $WORK/ngx$1/logs/error.log warn;
events { worker_connections 1024; }
http { access_log off; $PROXY }
NGX
  if [ "$3" = colo ]; then COLO_LOG=info $COLORUN nginx -c "$WORK/ngx$1/nginx.conf" -p "$WORK/ngx$1" >"$WORK/ngx$1/out.log" 2>&1 &
  else nginx -c "$WORK/ngx$1/nginx.conf" -p "$WORK/ngx$1" >"$WORK/ngx$1/out.log" 2>&1 & fi
  PIDS+=($!); wait_port "$1"
}
# postgres: Debian keeps the server's programs off PATH, in /usr/lib/postgresql/VERSION/bin.
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
AS_NOBODY="setpriv --reuid=nobody --regid=nogroup --clear-groups"
# postgres refuses to run as root: root runs it as nobody, another user as itself.
PG_AS=""; [ "$(id -u)" != 0 ] || PG_AS=$AS_NOBODY
# start_postgres PORT "colo"|"" [SCALE]: initdb as PG_AS in $WORK/pgPORT,
# then postgres on 127.0.0.1:PORT and its Unix socket in $WORK/pgPORT (no durability: the tests
# measure the connection, not the disk), ready to accept; with SCALE, pgbench's tables at SCALE.
# cleanup stops it; rm -rf $WORK removes its files.
start_postgres() {
  local port=$1 how=$2 d=$WORK/pg$1 pre=""
  [ -x "$PGBIN/postgres" ] || { echo "no postgres under /usr/lib/postgresql (Debian package postgresql)"; return 1; }
  mkdir -p "$d" && { [ -z "$PG_AS" ] || chown nobody:nogroup "$d"; } || return 1
  $PG_AS "$PGBIN/initdb" -D "$d/data" -U postgres --auth=trust --no-locale -E UTF8 -N >"$d/initdb.log" 2>&1 ||
    { cat "$d/initdb.log"; return 1; }
  [ "$how" = colo ] && pre="env COLO_LOG=info $COLORUN"
  (cd "$d" && exec $PG_AS $pre "$PGBIN/postgres" -D "$d/data" -p "$port" -c listen_addresses=127.0.0.1 \
    -c unix_socket_directories="$d" -c max_connections=100 -c fsync=off -c synchronous_commit=off \
    -c full_page_writes=off -c synchronize_seqscans=off) >"$d/postgres.log" 2>&1 &
  PIDS+=($!); PG_PIDS+=($!)
  for _ in $(seq 200); do "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$port" && break; sleep 0.05; done
  "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$port" || { echo "postgres on $port never became ready"; cat "$d/postgres.log"; return 1; }
  [ -z "${3:-}" ] || timeout 120 "$PGBIN/pgbench" -q -i -s "$3" -h 127.0.0.1 -p "$port" -U postgres postgres >"$d/init.log" 2>&1 ||
    { cat "$d/init.log"; return 1; }
}
