#!/usr/bin/env bash
# Red team: ASK (spec/WIRE.md section 3, "Offers for another process's listener") hands a held
# offer to a process that listens on the same address with SO_REUSEPORT. It must hand it only to
# a process of the holder's own user. Root runs, under colo run, a server that holds the port's
# rendezvous and never accepts, and, without colo, a second SO_REUSEPORT listener that accepts
# every connection the kernel gives it (accepted there, so never claimed: their offers stay held
# until their clients hang up). Root's clients under colo run connect. nobody asks the
# rendezvous for every connection to the port it sees in /proc/net/tcp: it must get no
# descriptor. Root asking the same way afterwards is the control: it gets offers.
source "$(dirname "$0")/lib.sh"
[ -e "$SHIM" ] || { echo "FAIL $SHIM not built (run tests/attack/run.sh)"; exit 1; }
cp "$HERE/py/ask_thief.py" "$HERE/py/reuseport_listener.py" "$WORK/"
S=$(free_port)
COLO_LOG=info $COLORUN python3 "$WORK/reuseport_listener.py" "$S" hold >"$WORK/holder.out" 2>"$WORK/holder.err" & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/holder.out" && break; sleep 0.05; done
python3 "$WORK/reuseport_listener.py" "$S" accept >"$WORK/plain.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/plain.out" && break; sleep 0.05; done
clients() { # $1: how many, each a connection held for 3 s (non-blocking connects: the holder never accepts)
  timeout 20 env COLO_CARRIER_TIMEOUT_MS=300 COLO_SHORT_LIVED=accelerate $COLORUN python3 -c "
import socket, time
cs = []
for i in range($1):
    c = socket.socket(); c.setblocking(False)
    try: c.connect(('127.0.0.1', $S))
    except BlockingIOError: pass
    cs.append(c); time.sleep(0.05)
time.sleep(3)
" 2>>"$WORK/clients.err"
}
T=$WORK/thief; mkdir -p "$T"; chown nobody:nogroup "$T"
as_nobody timeout 20 /usr/bin/python3 "$WORK/ask_thief.py" "$S" 4 "$T/log" 2>"$T/err" & THIEF=$!; PIDS+=($!)
sleep 0.2
clients 12
wait $THIEF
check "nobody asked for connections to the port" grep -q "^ASKED 127.0.0.1:[0-9]*|127.0.0.1:$S" "$T/log"
check "... and was answered" grep -q "^ANSWER b'\\\\x00\\\\x00'" "$T/log"
check "nobody got no descriptor" sh -c "! grep -q STOLE '$T/log'"
timeout 20 /usr/bin/python3 "$WORK/ask_thief.py" "$S" 4 "$WORK/root.log" 2>"$WORK/root.err" & ROOT=$!; PIDS+=($!)
sleep 0.2
clients 12
wait $ROOT
check "root, the holder's own user, got offers the same way (the control)" grep -q "^STOLE 2 descriptors" "$WORK/root.log"
check "the holder still serves its rendezvous" test -n "$(grep -c 'serving colo offers' "$WORK/holder.err")"
finish
