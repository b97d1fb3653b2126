#!/usr/bin/env bash
# Red team: a moment's squat of a rendezvous name must not cost a SO_REUSEPORT guest its offers
# for good (spec/WIRE.md section 3, "Offers for another process's listener"). Root runs, under
# colo run, two SO_REUSEPORT listeners on one port: a holder of the rendezvous that never
# accepts and a guest that accepts every connection (py/reuseport_listener.py). The holder is
# restarted; in between, nobody binds the free rendezvous name for a moment, while a connection
# from an odd port reaches the guest, whose ASK finds the name held by another uid. nobody lets
# go, the restarted holder takes the name, and root's clients under colo run connect: the guest
# had stopped asking for good ("never asks again"), so every connection the kernel gave it
# stayed plain TCP while the holder held their offers. A holder of another uid is no answer for
# this connection only; the guest asks again for the next.
source "$(dirname "$0")/lib.sh"
[ -e "$SHIM" ] || { echo "FAIL $SHIM not built (run tests/attack/run.sh)"; exit 1; }
cp "$HERE/py/reuseport_listener.py" "$WORK/"
S=$(free_port)
ready() { for _ in $(seq 100); do grep -qs "$2" "$1" && return 0; sleep 0.05; done; return 1; }
COLO_LOG=info $COLORUN python3 "$WORK/reuseport_listener.py" "$S" hold >"$WORK/holder1.out" 2>"$WORK/holder1.err" & H=$!; PIDS+=($!)
ready "$WORK/holder1.out" READY
COLO_LOG=debug $COLORUN python3 "$WORK/reuseport_listener.py" "$S" accept >"$WORK/guest.out" 2>"$WORK/guest.err" & PIDS+=($!)
ready "$WORK/guest.out" READY
# nobody binds the name the moment it is free, and holds it for two seconds.
as_nobody timeout 20 /usr/bin/python3 -c "
import socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
while True:
    try:
        s.bind(b'\0colo/1/127.0.0.1:$S'); break
    except OSError:
        time.sleep(0.001)
s.listen(8); print('SQUAT', flush=True); time.sleep(2)" >"$WORK/squat.out" 2>&1 & SQ=$!; PIDS+=($!)
kill "$H"; wait "$H" 2>/dev/null
check "nobody squats the rendezvous name of the restarting holder" ready "$WORK/squat.out" SQUAT
# A connection from an odd port, which the guest (the only listener now) accepts and asks for.
timeout 10 python3 -c "
import socket, random, time
for _ in range(100):
    c = socket.socket()
    try:
        c.bind(('127.0.0.1', random.randrange(20001, 60000, 2))); break
    except OSError:
        c.close()
c.connect(('127.0.0.1', $S)); time.sleep(0.5)"
check "the guest's ASK found the name held by nobody" grep -q "uid 65534" "$WORK/guest.err"
wait "$SQ"
COLO_LOG=info $COLORUN python3 "$WORK/reuseport_listener.py" "$S" hold >"$WORK/holder2.out" 2>"$WORK/holder2.err" & PIDS+=($!)
ready "$WORK/holder2.out" READY
check "the restarted holder serves the rendezvous" ready "$WORK/holder2.err" "serving colo offers"
before=$(grep -c "accelerated" "$WORK/guest.err")
timeout 20 env COLO_CARRIER_TIMEOUT_MS=300 COLO_SHORT_LIVED=accelerate $COLORUN python3 -c "
import socket, time
cs = []
for i in range(16):
    c = socket.socket(); c.setblocking(False)
    try: c.connect(('127.0.0.1', $S))
    except BlockingIOError: pass
    cs.append(c); time.sleep(0.05)
time.sleep(2)
" 2>>"$WORK/clients.err"
took=$(( $(grep -c "accelerated" "$WORK/guest.err") - before ))
check "the guest got offers again once root's holder was back ($took accelerated)" test "$took" -ge 1
finish
