#!/usr/bin/env bash
# Red team: what the shim hands on across exec in inheritable memfds (`colo-handover`: the
# accelerated connections and their descriptors; `colo-nofile`: the hard limit of open files
# the program set; `colo-relayed`: the addresses of relayed standard I/O; `colo-holders`: the
# holders pages of the process's connections, which the next image writes) must not be writable
# by a program of another uid that inherits them. A child started with posix_spawn (no fork
# handler of the shim's runs, so it gets the parent's own files) through setpriv without the
# shim runs as nobody and holds them. root's program (py/spawn_unshimmed.py, under colo run,
# an accelerated inheritable connection to root's redis and its limit lowered to 64) spawns
# nobody's py/forge_inherited.py, then a shell under the shim. Before: the memfds were mode
# 0777 and inherited read-write; nobody appended a handover record naming descriptors 0, 1, 2
# and the connection's socket, which the shell's shim took as a connection's and closed (the
# shell's output was lost), and wrote 5 as the hard limit the shell then reported. Now the
# next image inherits a read-only descriptor of a file of mode 0600 (both writes refused), and
# the shim takes only descriptors of a connection's kinds, each for one record at most.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/forge_inherited.py" "$HERE/py/spawn_unshimmed.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
start_redis "$P" colo --bind 127.0.0.1 || exit 1
COLO_LOG=info timeout 30 $COLORUN python3 "$WORK/spawn_unshimmed.py" "$P" "$WORK/forge_inherited.py" >"$WORK/out" 2>&1
echo "--- what the programs said"; grep -v '^colo\[' "$WORK/out"
check "the connection was accelerated" grep -q "accelerated (shared memory)" "$WORK/out"
check "nobody found the handover file" grep -q "handover" "$WORK/out"
check "nobody could not write the handover file" sh -c "! grep -q 'FORGED handover' '$WORK/out'"
check "nobody could not write the limit file" sh -c "! grep -q 'FORGED nofile' '$WORK/out'"
check "nobody found the holders file" grep -q "REFUSED holders" "$WORK/out"
check "nobody could not write the holders file" sh -c "! grep -q 'FORGED holders' '$WORK/out'"
check "the shell spawned after kept its standard output and the limit its parent set" grep -q "^CHILD hard limit 64$" "$WORK/out"
check "the parent's connection still answers" grep -q "^PARENT +PONG$" "$WORK/out"
finish
