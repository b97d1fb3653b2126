#!/usr/bin/env bash
# Red team: a peer's closed connections must not use up a server's limit of open files. A
# connection closed with bytes a peer of another user has yet to read is kept (colo::orphan, Go's
# keepOrphan) up to a minute without a byte read, ten with one read now and then; each kept one
# held a descriptor (its control socket, to see the peer's hang-up by, or its memfd), bounded
# only by the uid's quarter of COLO_MAX_SEGMENTS (4095 here). nobody (a python client under
# colo run) opens 1100 connections to root's echo server (the Rust API's peer example, then Go's
# colo-peer) under `ulimit -n 1024`, sends 32 KiB on each and shuts down writing, and never reads:
# the server echoes, reads the end and closes. Before: the server held 1,000 descriptors of
# orphans (1018 open of its 1024) and its accepts failed with EMFILE, where over TCP an orphaned
# socket holds no descriptor of its program's. Now at most 64 kept segments hold a descriptor,
# the others go by the timers alone. Must hold: the server's descriptors back within 64 + 40 of
# its baseline while nobody holds everything, no EMFILE, root's client accelerated. About 30 s.
source "$(dirname "$0")/lib.sh"
N=1100
# orphans L: nobody's N connections to the server on P, closed by it unread.
orphans() {
local L=$1 base; base=$(fds "$SRV")
as_nobody env COLO_LOG=info timeout 120 $COLORUN /usr/bin/python3 -c '
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (15000, 15000))
held = []
for i in range(int(sys.argv[2])):
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
        s.sendall(b"x" * 32768); s.shutdown(socket.SHUT_WR)
        held.append(s)
    except OSError as e:
        print("ERR", i, e, flush=True); break
print("RESULT held=%d" % len(held), flush=True)
time.sleep(60)' "$P" "$N" >"$WORK/att-$L.out" 2>&1 & ATT=$!; PIDS+=($ATT)
for _ in $(seq 1200); do grep -q RESULT "$WORK/att-$L.out" && break; sleep 0.1; done
local acc; acc=$(grep -c "accelerated (shared memory)" "$WORK/att-$L.out")
check "$L: nobody holds $N connections ($(grep RESULT "$WORK/att-$L.out"), $acc accelerated)" grep -q "RESULT held=$N$" "$WORK/att-$L.out"
fds_back "$SRV" $((base + 64 + 40)) >/dev/null
check "$L: the server's descriptors: at most $((base + 64 + 40)) ($(fds "$SRV"), baseline $base)" test "$(fds "$SRV")" -le $((base + 64 + 40))
check "$L: no accept failed with EMFILE" bash -c "! grep -q 'Too many open files' '$WORK/srv-$L.log'"
}
against_api_servers orphans
finish
