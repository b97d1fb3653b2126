#!/usr/bin/env bash
# Event-loop servers under `colo run` release the connections a load generator under `colo run`
# made and ended, and keep serving (issue 22): Node.js (libuv, which closes its descriptors with
# syscall(SYS_close), past libc's close) and Python's asyncio (close(2)). After wrk's 50
# connections end, the server's open descriptors come back to what they were before (polled,
# with a deadline), a plain and an accelerated curl both get 200, and the server answered every
# request wrk counted and at most one more per connection (a request wrk sent as its run ended).
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0
code() { timeout 10 "$@" -s -o /dev/null -w '%{http_code}' "$URL"; }

load() { # $1 name, then the server's command (the port is appended)
  local name=$1; shift
  local p; p=$(free_port); URL=http://127.0.0.1:$p/
  COLO_LOG=info timeout 120 $COLORUN "$@" "$p" >"$WORK/$name.log" 2>&1 & PIDS+=($!)
  local pid=
  for _ in $(seq 200); do pid=$(awk '/^READY/{print $2}' "$WORK/$name.log"); [ -n "$pid" ] && break; sleep 0.05; done
  [ -n "$pid" ] || { bad "$name: the server never started"; return; }
  # The baseline after one request of each kind (what the shim and the runtime make once).
  code curl >/dev/null; code $COLORUN curl >/dev/null; sleep 0.5
  local base; base=$(fds "$pid")
  local out; out=$(timeout 60 $COLORUN wrk -t1 -c50 -d3s "$URL" 2>&1)
  local n; n=$(echo "$out" | awk '/requests in/{print $1}')
  check "$name: wrk under colo run (${n:-no} requests), no socket errors" sh -c "[ -n '$n' ] && ! echo '$out' | grep -q 'Socket errors'"
  check "$name: the server accelerated wrk's connections" test "$(grep -c ': accelerated (shared memory)' "$WORK/$name.log")" -ge 50
  check "$name: its open descriptors come back to $base (after wrk: $(fds "$pid"))" fds_back "$pid" "$((base + 2))"
  check "$name: a plain curl then gets 200" test "$(code curl)" = 200
  check "$name: a curl under colo run gets 200" test "$(code $COLORUN curl)" = 200
  local served; served=$(timeout 10 curl -s "${URL}count")
  # Served: 2 curls before, wrk's, 2 curls after.
  check "$name: the server answered wrk's $n requests and at most 50 more (served ${served:-?} - 4)" \
    sh -c "[ -n '$served' ] && [ -n '$n' ] && [ $((${served:-0} - 4)) -ge ${n:-1} ] && [ $((${served:-0} - 4)) -le $((${n:-0} + 50)) ]"
  check "$name: no descriptor was closed past the shim unseen" sh -c "! grep -q 'closed past the shim' '$WORK/$name.log'"
}

if command -v node >/dev/null; then load node node "$HERE/servers/http_count.js"; else bad "node is not installed (tests/apps/packages.txt)"; fi
load asyncio python3 "$HERE/servers/http_count.py"

# close_range(2) lets go of the connections in its range, as close does.
check "python: a connection closed by close_range ends for the peer, no descriptor left" sh -c "
  timeout 30 env COLO_LOG=info $COLORUN python3 '$HERE/py/close_range.py' 2>'$WORK/cr.err' && grep -q 'accept.*: accelerated (shared memory)' '$WORK/cr.err'"

[ $FAIL = 0 ] && echo "tests/apps/release.sh: all passed" || echo "tests/apps/release.sh: FAILURES"
exit $FAIL
