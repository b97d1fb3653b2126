#!/usr/bin/env bash
# Red team: a server of another user must not hold up a root client's fork. Before fork the shim
# decides each connection still waiting for its server's answer (a pending connection has no
# holders page: each process's copy would be decided on its own), waiting for the answer as the
# first read or write would, within the connect's deadline; but a connection whose server had
# moved the claim word to CLAIMED (a word of the segment the server maps: any server can) waited
# 2 s more for its WELCOME, one connection after another. nobody's server on 127.0.0.1:$P
# (py/claim_silent.py: its TCP listener and rendezvous are its own, so root's client trusts it,
# as it trusts whoever would receive its TCP connections) claims each offer and never answers;
# root's client under colo run (COLO_CARRIER_TIMEOUT_MS=100) opens 8 connections and forks: its
# fork must return before its watchdog (8 s) fires, where over TCP it returns at once. Before:
# 2 s a connection, the watchdog fired. Now an answer still due after the claim is taken off the
# control socket whenever it comes (Shm::answer_due), as a pending connection's is.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/claim_silent.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
as_nobody timeout 60 /usr/bin/python3 "$WORK/claim_silent.py" "$P" 40 >"$WORK/nobody.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -q LISTENING "$WORK/nobody.out" && break; sleep 0.05; done
COLO_LOG=info COLO_CARRIER_TIMEOUT_MS=100 timeout 30 "$COLO" run -- python3 -c "
import os, signal, socket
signal.alarm(8)
socks = [socket.create_connection(('127.0.0.1', $P)) for _ in range(8)]
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print('FORKED')" >"$WORK/client.out" 2>"$WORK/client.log"
check "nobody's server claimed root's offers ($(grep -c CLAIMED "$WORK/nobody.out") of 8)" test "$(grep -c CLAIMED "$WORK/nobody.out")" = 8
check "root's client forked before its watchdog fired" grep -qx FORKED "$WORK/client.out"
finish
