#!/usr/bin/env bash
# Red team: a fork child that drops to nobody must not hand nobody its parent's holders file.
# Root's program (colo run, py/holders_victim.py) holds a colo connection to root's echo server
# and forks a child that closes its copy, drops to nobody and makes itself dumpable again, as a
# server's worker does for core dumps (by the raw system call through syscall(), then by
# prctl()). The child still maps the holders file it shares with its parent
# (conn/holders_file.rs), writable, with the page of the parent's connection: nobody
# (py/holders_scribble.py) writes into it through /proc/CHILD/mem, giving the connection's
# turns to itself, and the parent's next send waited as long as nobody lived. The parent's
# round trips must finish while nobody runs. Watchdog: 20 s for the round trips.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/holders_victim.py" "$HERE/py/holders_scribble.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
"$PEER" server "127.0.0.1:$P" stream >"$WORK/srv.log" 2>&1 & PIDS+=($!)
wait_port "$P" || { bad "the echo server did not start"; finish; }
COLO_LOG=info timeout 60 "$COLO" run -- python3 "$WORK/holders_victim.py" "$P" "$WORK/go" 20 >"$WORK/victim.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -q READY "$WORK/victim.out" && break; sleep 0.1; done
check "root's program is accelerated" grep -q "connect 127.0.0.1:$P: accelerated" "$WORK/victim.out"
CHILD=$(awk '/^CHILD/ {print $2}' "$WORK/victim.out")
echo "    child: $(grep CHILD "$WORK/victim.out")"
if [ -z "$CHILD" ]; then bad "root's program did not fork its child: $(tail -2 "$WORK/victim.out")"; finish; fi
check "the child's raw syscall(SYS_prctl, PR_SET_DUMPABLE, 1) is refused (EPERM)" grep -q "^CHILD .* raw=-1 1$" "$WORK/victim.out"
as_nobody timeout 60 /usr/bin/python3 "$WORK/holders_scribble.py" "$CHILD" 3 >"$WORK/att.out" 2>&1 & ATT=$!; PIDS+=($ATT)
for _ in $(seq 100); do grep -q "WROTE\|NOMAP\|DENIED" "$WORK/att.out" && break; sleep 0.1; done
echo "    nobody: $(tr '\n' ' ' <"$WORK/att.out")"
touch "$WORK/go"
for _ in $(seq 200); do grep -q DONE "$WORK/victim.out" && break; sleep 0.1; done
check "root's round trips finished while nobody runs" grep -q "DONE 20" "$WORK/victim.out"
check "nobody wrote nothing into root's holders file" sh -c "! grep -q WROTE '$WORK/att.out'"
kill "$ATT" 2>/dev/null
finish
