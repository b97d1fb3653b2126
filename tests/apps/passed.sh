#!/usr/bin/env bash
# A connection the server's program passes to another process over a Unix socket (SCM_RIGHTS)
# instead of sharing it through fork: node's cluster module does so by default on Linux (the
# primary accepts every connection and hands it to a worker; pm2's cluster mode too), and so do
# servers that hand accepted sockets to workers they started (here python's socket.send_fds).
# Both sides under colo run: the first connection was accepted over shared memory before it was
# passed, and must be relayed (the worker's socket carries every byte both ways); the listener
# then serves plain TCP. Every request is answered with the right byte count, plain clients too,
# and the relay processes end with their connections. A listening socket passed so is served by
# its receiver.
source "$(dirname "$0")/common.sh"
FAIL=0
[ -n "${COLO_APPS_BUILT:-}" ] || build
head -c 100000 /dev/urandom | tr -d '\n' >"$WORK/body"; echo >>"$WORK/body"
N=$(stat -c %s "$WORK/body")
relays() { pgrep -f "$1" | wc -l; }

# python: a worker it forked gets each connection with send_fds.
P=$(free_port)
COLO_LOG=info $COLORUN python3 "$HERE/py/pass_fds.py" "$P" >"$WORK/py.out" 2>"$WORK/py.log" & PIDS+=($!)
wait_port "$P" || exit 1
for i in 1 2 3; do
  check "python hand-off, a client under colo run ($i): answered" sh -c \
    "COLO_LOG=info timeout 10 $COLORUN python3 -c \"import socket,sys; s=socket.create_connection(('127.0.0.1',$P)); s.sendall(open('$WORK/body','rb').read()); print(s.recv(100).decode().strip())\" 2>>'$WORK/pyc.err' | grep -qx 'worker got $N'"
done
check "python hand-off: the first connection was accelerated, then relayed" grep -q "passed to another process: relayed over loopback TCP" "$WORK/py.log"
check "... and the listener serves plain TCP since" grep -q "its connections are passed to other processes: plain TCP from now on" "$WORK/py.log"
check "python hand-off, a plain client: answered" sh -c "timeout 10 python3 -c \"import socket; s=socket.create_connection(('127.0.0.1',$P)); s.sendall(open('$WORK/body','rb').read()); print(s.recv(100).decode().strip())\" | grep -qx 'worker got $N'"
sleep 0.5
check "python hand-off: no relay process left (server and worker only)" test "$(relays "py/pass_fds.py $P")" -eq 2

# The worker answers and closes the relayed connection: the client's writes after that fare as
# over TCP (the first taken, then EPIPE). Before, the relay ended the connection with only its
# FIN, and every write was taken.
P=$(free_port)
COLO_LOG=info $COLORUN python3 "$HERE/py/pass_fds.py" "$P" >"$WORK/pc.out" 2>"$WORK/pc.log" & PIDS+=($!)
wait_port "$P" || exit 1
COLO_LOG=info timeout 20 $COLORUN python3 "$HERE/py/sends_after_close.py" "$P" >"$WORK/pcc.out" 2>"$WORK/pcc.err"
check "writes after the worker closed a relayed connection: taken once, then EPIPE ($(tr '\n' '/' <"$WORK/pcc.out"))" \
  test "$(cat "$WORK/pcc.out")" = "$(printf 'worker got 6\nend of stream\nsent BrokenPipeError BrokenPipeError')"
check "... the connection was relayed" grep -q "passed to another process: relayed over loopback TCP" "$WORK/pc.log"

# The same server run as another user than root (nobody, as a daemon that drops its privileges
# runs; dante's danted hands connections to its children so): the kernel may refuse socket
# filters to an unprivileged process, and the relay's loopback pair is made without one. The
# first connection, passed before the listener went plain, lost every byte when it could not be.
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
  P=$(free_port)
  (cd "$WORK" && exec $AS_NOBODY env COLO_LOG=info $COLORUN /usr/bin/python3 "$HERE/py/pass_fds.py" "$P") >"$WORK/pyn.out" 2>"$WORK/pyn.log" & PIDS+=($!)
  wait_port "$P" || exit 1
  for i in 1 2; do
    check "python hand-off as nobody, a client under colo run ($i): answered" sh -c \
      "COLO_LOG=info timeout 10 $COLORUN python3 -c \"import socket,sys; s=socket.create_connection(('127.0.0.1',$P)); s.sendall(open('$WORK/body','rb').read()); print(s.recv(100).decode().strip())\" 2>>'$WORK/pync.err' | grep -qx 'worker got $N'"
  done
  check "python hand-off as nobody: the first connection was accelerated, then relayed" grep -q "passed to another process: relayed over loopback TCP" "$WORK/pyn.log"

  # A connection from another user (nobody's client, root's server), handed to a program the
  # server executes with python's subprocess and pass_fds: the connection, born close-on-exec,
  # is made inheritable in the child. Its segment's memfd stays open for reads through it (a
  # peer of another user), yet the next image is not set to map it: it is relayed as any
  # connection born close-on-exec (before, the executed program's first read was reset).
  P=$(free_port)
  cp "$HERE/py/echo_check_client.py" "$WORK/" && chmod 644 "$WORK/echo_check_client.py"
  COLO_LOG=info $COLORUN python3 "$HERE/py/exec_pass_fds.py" "$P" >"$WORK/xp.out" 2>"$WORK/xp.log" & PIDS+=($!)
  wait_port "$P" || exit 1
  for i in 1 2; do
    check "a connection from another user handed to an executed program ($i): 4 MiB echoed intact" sh -c \
      "cd '$WORK' && $AS_NOBODY env COLO_LOG=info timeout 20 $COLORUN /usr/bin/python3 '$WORK/echo_check_client.py' $P 4 2>>'$WORK/xpc.err' | grep -qx OK"
  done
  # (wait_port's own connection, plain, is handed on as well.)
  check "... both accelerated, then relayed when made inheritable ($(grep -c 'made inheritable: relayed' "$WORK/xp.log") of 2)" \
    test "$(grep -c 'accept .*: accelerated (shared memory)' "$WORK/xp.log")" = 2 -a "$(grep -c 'made inheritable: relayed over loopback TCP' "$WORK/xp.log")" = 2
fi

# node's cluster module, round-robin (the default on Linux).
need node && {
cat >"$WORK/cluster.js" <<'JS'
const cluster = require('cluster'); const http = require('http');
if (cluster.isPrimary) { for (let i = 0; i < 2; i++) cluster.fork(); }
else { http.createServer((req, res) => { let n = 0; req.on('data', d => n += d.length);
  req.on('end', () => res.end(`worker got ${n}\n`)); }).listen(+process.argv[2], '127.0.0.1'); }
JS
P=$(free_port)
COLO_LOG=info $COLORUN node "$WORK/cluster.js" "$P" >"$WORK/node.log" 2>&1 & PIDS+=($!)
wait_port "$P" || exit 1
for i in 1 2 3 4; do
  check "node cluster, a client under colo run ($i): answered" sh -c \
    "COLO_LOG=info timeout 10 $COLORUN curl -sS -m 8 --data-binary @'$WORK/body' http://127.0.0.1:$P/ 2>>'$WORK/cli.err' | grep -qx 'worker got $N'"
done
check "node cluster: the first connection was accelerated, then relayed" grep -q "passed to another process: relayed over loopback TCP" "$WORK/node.log"
check "node cluster, a plain client: answered" sh -c "timeout 10 curl -sS -m 8 --data-binary @'$WORK/body' http://127.0.0.1:$P/ | grep -qx 'worker got $N'"
sleep 0.5
check "node cluster: no relay process left (primary and two workers)" test "$(relays "cluster.js $P")" -eq 3

# node's cluster module with scheduling "none": the primary passes its listening socket to the
# workers, which accept themselves. A listener received so is a colo listener of the worker's
# (it asks the primary, which holds the rendezvous, for its connections' offers).
P=$(free_port)
NODE_CLUSTER_SCHED_POLICY=none COLO_LOG=info $COLORUN node "$WORK/cluster.js" "$P" >"$WORK/node2.log" 2>&1 & PIDS+=($!)
wait_port "$P" || exit 1
: >"$WORK/cli2.err"
for i in 1 2 3 4; do
  check "node cluster (sched none), a client under colo run ($i): answered" sh -c \
    "COLO_LOG=info timeout 10 $COLORUN curl -sS -m 8 --data-binary @'$WORK/body' http://127.0.0.1:$P/ 2>>'$WORK/cli2.err' | grep -qx 'worker got $N'"
done
# (A worker's accept asks the primary for each offer: on a loaded host one may go plain after
# its client's bounded wait, named in its log.)
check "node cluster (sched none): client connections accelerated, by the workers ($(grep -c 'accept .*accelerated' "$WORK/node2.log") of 4)" \
  test "$(grep -c 'accept .*: accelerated (shared memory)' "$WORK/node2.log")" -ge 1
}
exit "$FAIL"
