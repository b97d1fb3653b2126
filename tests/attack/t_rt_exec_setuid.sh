#!/usr/bin/env bash
# Red team: a connection handed to a program of another user must reach it as a TCP socket
# would, with nothing of the shared memory behind it. Root's inetd-like server under colo run
# (py/exec_nobody_server.py) accepts a connection from root's client (python under colo run),
# born inheritable (libc's accept), forks, drops to nobody and execs its service
# (py/exec_nobody_service.py), which nobody may then ptrace, or which is nobody's own program.
# Before, the shim handed the connection over across that exec as across any: the segment
# memfd and control socket stayed inheritable, and nobody's image got them (its shim left them
# alone, the handover file being root's). nobody then held root's client's rings, while the
# client's check of its peer (SO_PEERCRED of the control socket: root, who listened and
# accepted) said "same user": it claimed a whole ring of holes, and the client's reads of them
# through its mapping allocated them, charged to root's client (8 MiB, as long as nobody kept
# the memfd); and the service's writes to its socket (the TCP carrier) never reached the
# client. Now an exec under another uid than the connection was made by relays it over
# loopback TCP first (colo-preload service::handover::relay_inheritable), as for a connection
# the image cannot map: the service gets a socket and no segment, and its bytes arrive. The
# relay, which holds the segment, is not dumpable (a program that made itself dumpable again
# after its setuid, as nginx's workers, would have let nobody take its descriptors).
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/exec_nobody_server.py" "$HERE/py/exec_nobody_service.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
# run LABEL [DUMPABLE [EXEC]]: one connection served by nobody's service.
run() {
  local label=$1 out=$WORK/$1.server cout=$WORK/$1.client P alloc
  P=$(free_port)
  EXEC=${3:-execv} DUMPABLE=${2:-0} COLO_LOG=info timeout 60 $COLORUN /usr/bin/python3 "$WORK/exec_nobody_server.py" "$P" /usr/bin/python3 "$WORK/exec_nobody_service.py" "$P" >"$out" 2>&1 & local srv=$!
  for _ in $(seq 100); do grep -qs LISTENING "$out" && break; sleep 0.05; done
  COLO_LOG=info timeout 40 $COLORUN /usr/bin/python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', $P)); s.sendall(b'x'); got = b''
s.settimeout(30)
while True:
    b = s.recv(1 << 20)
    if not b: break
    got += b
print('CLIENT READ', len(got), 'GREETING' if got.endswith(b\"hello from nobody's service\n\") else 'NO GREETING', flush=True)
time.sleep(2); s.close()" >"$cout" 2>&1
  wait "$srv"
  cat "$out" "$cout" | grep -v '^colo' | sed 's/^/    /'
  grep -h 'colo.*\(exec\|relay\|inheritable\)' "$out" | head -5 | sed 's/^/    log: /'
  check "$label: nobody's service ran (as nobody)" grep -q '^INHERITED .* uid=65534' "$out"
  check "$label: nobody's service got no segment memfd of root's client's connection" grep -q '^INHERITED segment=None control=None' "$out"
  check "$label: nor could it write the memory or take the descriptors of a process that maps it" sh -c "! grep -q '^PROCESS .*\(opened\|taken\)' '$out'"
  alloc=$(awk '/^ALLOCATED/ {print $2}' "$out")
  check "$label: root's client allocated none of nobody's holes (${alloc:-0} MiB)" test "${alloc:-0}" -le 1
  check "$label: root's client got the service's bytes and its end of stream" grep -q '^CLIENT READ [0-9]* GREETING$' "$cout"
}
run "setuid then exec"
# nginx makes its workers dumpable again after their setuid: the relay forked before the exec
# (which holds the segment) must not be, or nobody takes its memfd with pidfd_getfd.
run "setuid, dumpable again, then exec" 1
# The exec the shim sees only as its system call (libc's execveat, syscall(SYS_execve)).
run "setuid then execveat" 0 execveat
run "setuid then syscall(SYS_execve)" 0 syscall
finish
