#!/usr/bin/env bash
# Red team: a peer's segment memfd, which root's server keeps open (and inheritable) for a
# connection it accepted inheritable, must never be taken by an image root execs for one of the
# shim's own inheritable files (`colo-relayed`, `colo-handover`, `colo-nofile`, `colo-holders`):
# service::handover::take_back finds those by the memfd's name alone, and the name is the
# peer's choice. nobody (py/memfd_name_spoof.py) offers a CARRIER segment named `colo-relayed`
# whose header page holds relayed-names records for the inode the server's next accepted socket
# gets (allocated when accept(2) is entered: one plain probe connection before says which), with
# 10.9.9.9 as the peer. root's inetd-style server (c/inetd_peername.c, under colo run) execs its
# handler with the connection on 0 and 1; the handler tells the secret only to 10.9.9.9.
# Before: getpeername(0) answered 10.9.9.9:4242 in the handler, which sent the secret (6 of 6).
# Then a memfd named `colo-nofile` whose first bytes nobody rewrites after the server attached
# it: the handler's getrlimit reported a hard limit of 5 (2 of 3 in a first try: a race with
# the exec, which nobody does not otherwise control).
source "$(dirname "$0")/lib.sh"
COLORUN=${ATTACK_COLORUN:-$COLORUN}
cp "$HERE/py/memfd_name_spoof.py" "$HERE/py/memfd_name_nofile.py" "$HERE/doorbell_attacker.py" "$WORK/" && chmod 644 "$WORK"/*.py
gcc -O2 -o "$WORK/inetd_peername" "$HERE/c/inetd_peername.c" || { bad "gcc"; finish; }
P=$(free_port)
COLO_LOG=info timeout 120 $COLORUN "$WORK/inetd_peername" "$P" >"$WORK/server.log" 2>&1 &
PIDS+=($!)
wait_port "$P" || { bad "the server did not start"; finish; }
# An honest client first: its handler sees the real address.
check "an honest client is denied" sh -c "timeout 5 $COLORUN python3 -c \"import socket; s=socket.create_connection(('127.0.0.1',$P)); print(s.recv(100))\" | grep -q denied"
for i in 1 2 3 4 5 6; do
  as_nobody timeout 20 /usr/bin/python3 "$WORK/memfd_name_spoof.py" "$P" 10.9.9.9 >>"$WORK/attack.out" 2>&1
done
echo "--- the attacker"; sed 's/^/    /' "$WORK/attack.out"
echo "--- root's handlers"; grep HANDLER "$WORK/server.log" | sed 's/^/    /'
check "nobody's connections were accepted" grep -q "welcome" "$WORK/attack.out"
check "no handler answered getpeername with the forged address" sh -c "! grep -q 'getpeername(0) = 10.9.9.9' '$WORK/server.log'"
check "nobody was never told the secret" sh -c "! grep -q ROOT-ONLY-SECRET '$WORK/attack.out'"
# The same with a memfd named `colo-nofile`: the handler's getrlimit must not report nobody's 5.
for i in 1 2 3 4 5 6; do
  as_nobody timeout 20 /usr/bin/python3 "$WORK/memfd_name_nofile.py" "$P" 5 >>"$WORK/nofile.out" 2>&1
done
grep "getrlimit" "$WORK/server.log" | sort | uniq -c | sed 's/^/    /'
check "no handler saw nobody's hard limit of open files" sh -c "! grep -q 'hard 5$' '$WORK/server.log'"
finish
