#!/usr/bin/env bash
# Red team: the short-lived marker's program tag (spec/WIRE.md section 2) must not make root's
# server do work in proportion to what another user chooses. root's accept() under colo run reads
# each new client process's /proc/PID/cmdline whole, in the application's thread
# (service::server::markers::client_tag, from accept.rs), caching 64 pids. nobody (py/bigcmd.py)
# runs with a 6 MB command line (`ulimit -s unlimited`) and forks a child per CARRIER connection
# (a new pid each). Asserted by the bytes root's redis reads (/proc/PID/io rchar) per attacker
# connection, not by time. Before: about 6 MB per connection (2.4 MB when the child exits
# at once), redis-benchmark -c 1 GET 41.6k -> 6.6k requests/s, max latency 98 ms (by hand).
source "$(dirname "$0")/lib.sh"
COLORUN=${ATTACK_COLORUN:-$COLORUN}
cp "$HERE/py/bigcmd.py" "$HERE/doorbell_attacker.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
start_redis "$P" colo || exit 1
REDIS=$(pgrep -f "redis-server \*:$P" | head -1)
rchar() { awk '/^rchar/ {print $2}' "/proc/$REDIS/io"; }
R0=$(rchar)
as_nobody bash -c "ulimit -s unlimited; cd '$WORK' && exec timeout 60 /usr/bin/python3 bigcmd.py $P 3 \$(head -c 6000000 /dev/zero | tr '\0' a | fold -w 120000)" >"$WORK/atk.out" 2>&1
R1=$(rchar)
cat "$WORK/atk.out" | sed 's/^/    /'
N=$(awk '/^connections/ {print $4}' "$WORK/atk.out")
check "nobody's connections were answered ($N)" test "${N:-0}" -gt 10
PER=$(( (R1 - R0) / ${N:-1} ))
echo "    redis read $((R1 - R0)) bytes: $PER a connection"
check "root's redis read at most 64 KiB per attacker connection" test "$PER" -le 65536
check "redis answers" sh -c "[ \"\$(timeout 5 redis-cli -p $P ping)\" = PONG ]"
finish
