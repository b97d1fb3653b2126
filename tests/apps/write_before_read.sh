#!/usr/bin/env bash
# Write before read: a client that writes all of an N MiB request to an echo server before
# reading anything, then reads the N MiB back and checks every byte (py/write_before_read.py).
# It completes only if the path buffers what the server echoes while the client is still
# writing; over TCP loopback that is the kernel's socket buffers (tcp_wmem/tcp_rmem maxima).
# Measured here over plain TCP: the largest N of 4, 6, 8, 10, 12 that passes (printed). Checked
# with both sides under `colo run`: N=4, and that largest N, pass over shared memory. A
# connection that stops moving for STALL seconds (default 20) fails the check; every run also has
# a timeout.
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0
PY=$HERE/py/write_before_read.py
STALL=${STALL:-20}

# server NAME "colo"|"": an echo server; sets PORT.
server() {
  PORT=$(free_port)
  if [ "$2" = colo ]; then COLO_LOG=info $COLORUN python3 "$PY" server "$PORT" >"$WORK/$1.out" 2>"$WORK/$1.err" &
  else python3 "$PY" server "$PORT" >"$WORK/$1.out" 2>"$WORK/$1.err" & fi
  PIDS+=($!)
  for _ in $(seq 100); do grep -qs ready "$WORK/$1.out" && return 0; sleep 0.05; done
  echo "the $1 echo server never started"; cat "$WORK/$1.err"; return 1
}
server plain "" || exit 1; TCP=$PORT
server colo colo || exit 1; COLO=$PORT

# Over plain TCP (a stall costs 5 s here).
largest=0
for n in 4 6 8 10 12; do
  if timeout 60 python3 "$PY" client "$TCP" "$n" 5 >"$WORK/tcp-$n.out" 2>&1; then largest=$n; r=passes; else r="fails ($(cat "$WORK/tcp-$n.out"))"; fi
  echo "plain TCP loopback, write $n MiB before reading: $r"
done
echo "largest N of 4 6 8 10 12 that passes over plain TCP loopback: $largest MiB (tcp_wmem $(cut -f3 /proc/sys/net/ipv4/tcp_wmem), tcp_rmem $(cut -f3 /proc/sys/net/ipv4/tcp_rmem))"

# colo_pass N: N MiB, both under colo run, every byte back, over shared memory.
colo_pass() {
  timeout 120 env COLO_LOG=info $COLORUN python3 "$PY" client "$COLO" "$1" "$STALL" >"$WORK/colo-$1.out" 2>"$WORK/colo-$1.err"
  local rc=$?
  [ $rc = 0 ] && grep -qx "OK $1" "$WORK/colo-$1.out" || { echo "exit $rc: $(cat "$WORK/colo-$1.out")"; return 1; }
  grep -q "connect 127.0.0.1:$COLO: accelerated (shared memory)" "$WORK/colo-$1.err" ||
    { echo "not over shared memory:"; cat "$WORK/colo-$1.err"; return 1; }
}
check "write 4 MiB before reading, both under colo run: every byte back, over shared memory" colo_pass 4
if [ "$largest" -gt 4 ]; then
  check "write $largest MiB (what plain TCP passes) before reading, both under colo run" colo_pass "$largest"
fi

[ $FAIL = 0 ] && echo "write_before_read.sh: all passed" || echo "write_before_read.sh: FAILURES"
exit $FAIL
