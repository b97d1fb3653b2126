#!/usr/bin/env bash
# Red team: another local user must not make a relay's set-up hang the program it relays for.
# A connection handed on as standard I/O across exec (socat EXEC:...,nofork; inetd-style
# servers), passed over SCM_RIGHTS or made inheritable is relayed over a loopback TCP pair the
# shim makes (service/stdio.rs, `loopback_pair`): a listener with a backlog of 1, then a
# blocking connect to it. Any user can see that listener in /proc/net/tcp and connect to it
# first: two such connections fill its queue, the kernel drops the shim's SYN, and the connect
# waits out its SYN retries (about two minutes) in the exec'd program's start (root's `cat`
# under socat), its client unanswered meanwhile. nobody (py/relay_pair_squat.py) watches for
# new loopback listeners and connects to each four times. The race is between root's `listen`
# and its `connect`, microseconds apart unless root's thread is preempted there: strace delays
# each connect of root's server by 300 ms, to stand in for that preemption and make the test
# deterministic. Root's client must get its bytes back, and nobody must have reached the relay's
# listener (else the test proves nothing). Before: the client waited its whole timeout.
source "$(dirname "$0")/lib.sh"
need strace || finish
need socat || finish
cp "$HERE/py/relay_pair_squat.py" "$WORK/" && chmod 644 "$WORK/relay_pair_squat.py"
for fam in 4 6; do
  if [ $fam = 4 ]; then host=127.0.0.1; listen="TCP-LISTEN"; else host="[::1]"; listen="TCP6-LISTEN"; fi
  P=$(free_port)
  COLO_LOG=info timeout 120 strace -f -qq -T -e trace=connect -e inject=connect:delay_enter=300000 \
    -o "$WORK/strace.$fam" "$COLO" run -- socat "$listen:$P,bind=$host,reuseaddr,fork" EXEC:cat,nofork \
    >"$WORK/srv.$fam.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do ss -tln | grep -q "$host:$P " && break; sleep 0.1; done
  setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 /usr/bin/python3 "$WORK/relay_pair_squat.py" 40 \
    >"$WORK/squat.$fam.out" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do grep -q WATCHING "$WORK/squat.$fam.out" && break; sleep 0.05; done
  timeout 30 "$COLO" run -- python3 -c "
import socket
s = socket.create_connection(('${host//[\[\]]/}', $P)); s.sendall(b'hello\n'); s.shutdown(socket.SHUT_WR)
got = b''
while True:
    d = s.recv(65536)
    if not d: break
    got += d
print(got == b'hello\n')" >"$WORK/rt.$fam" 2>&1
  check "IPv$fam: root's client got its bytes back through the relay while nobody raced to its listener" \
    sh -c "grep -qx True '$WORK/rt.$fam' && grep -q 'exec: .*relayed over loopback TCP' '$WORK/srv.$fam.log'"
  # The relay's listener: where the exec'd program's end connected (strace), which nobody hit.
  rport=$(grep -o 'connect([0-9]*, {sa_family=AF_INET6\?, sin6\?_port=htons([0-9]*)' "$WORK/strace.$fam" | grep -o 'htons([0-9]*' | tail -1 | tr -dc 0-9)
  check "IPv$fam: nobody connected to the relay's listener ($rport) before root's end did" grep -qx "HIT $rport" "$WORK/squat.$fam.out"
done
finish
