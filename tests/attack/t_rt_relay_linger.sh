#!/usr/bin/env bash
# Red team: a silent peer must not keep a relay process of root's for good. A connection the
# server's program passes to another process over SCM_RIGHTS is relayed by a process forked from
# it (service/relay.rs; tests/apps/passed.sh). Root's server under colo run (tests/apps/py/
# pass_fds.py: it accepts, hands the connection to its worker with send_fds; the worker answers
# one line and closes) serves nobody's client under colo run, which reads the answer and the end
# of stream and then holds its connection, silent. The relay passed the worker's FIN on and
# waited for the peer's next bytes or end of stream, with nothing left to read them: it lived as
# long as nobody held its end (a root process, its pages and page tables), where kernel TCP keeps
# a closed socket (FIN_WAIT2) for tcp_fin_timeout (60 s) at most. Now a relay whose program sent
# its end of stream looks whether any process still holds the program's end (sock_diag: an
# orphaned socket has no inode) and ends once none does. Must hold: within 5 s of the client's
# end of stream, only the server and its worker are left; root's next client is answered.
source "$(dirname "$0")/lib.sh"
cp "$ROOT/tests/apps/py/pass_fds.py" "$WORK/" && chmod 644 "$WORK/pass_fds.py"
P=$(free_port)
COLO_LOG=info $COLORUN python3 "$WORK/pass_fds.py" "$P" >"$WORK/srv.out" 2>"$WORK/srv.log" & PIDS+=($!)
wait_port "$P" || exit 1
procs() { pgrep -f "pass_fds.py $P" | wc -l; } # the server, its worker, relays
as_nobody env COLO_LOG=info timeout 60 $COLORUN /usr/bin/python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', $P)); s.sendall(b'abc\n'); d = b''
while True:
    b = s.recv(100)
    if not b: break
    d += b
print('EOF after', d, flush=True); time.sleep(20)" >"$WORK/cl.out" 2>"$WORK/cl.log" & PIDS+=($!)
for _ in $(seq 100); do grep -qs EOF "$WORK/cl.out" && break; sleep 0.1; done
check "nobody's client got its answer and end of stream ($(cat "$WORK/cl.out"))" grep -q "EOF after b'worker got 4" "$WORK/cl.out"
check "its connection was accelerated, then relayed when passed" grep -q "passed to another process: relayed over loopback TCP" "$WORK/srv.log"
gone() { for _ in $(seq 50); do [ "$(procs)" -le 2 ] && return 0; sleep 0.1; done; echo "    $(procs) processes: $(pgrep -f "pass_fds.py $P" | tr '\n' ' ')"; return 1; }
check "the relay ended while nobody holds its silent connection" gone
check "root's next client is answered" sh -c "timeout 10 $COLORUN python3 -c \"import socket; s=socket.create_connection(('127.0.0.1',$P)); s.sendall(b'x\n'); print(s.recv(100).decode().strip())\" | grep -qx 'worker got 2'"
finish
