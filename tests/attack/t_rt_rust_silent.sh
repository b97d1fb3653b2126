#!/usr/bin/env bash
# Red team: silent rendezvous connections must not make every TCP accept of a Rust listener
# cost work in proportion to them. nobody holds 200 rendezvous connections to root's Rust API
# example server that never send a HELLO (renewed before the 5 s timeout); the listener looked
# at each of them (epoll_ctl twice and a recvmsg) for every TCP connection it accepted, from an
# even port too (where no offer can come from), so any local user could make each accept cost
# ~600 system calls. Counted with strace over 40 plain TCP clients (20 from odd ports, 20 from
# even ones): the server must make far fewer such calls than one per silent connection and
# client.
source "$(dirname "$0")/lib.sh"
command -v strace >/dev/null || { bad "strace is not installed (tests/apps/packages.txt)"; finish; }
cp "$HERE/py/silent_rendezvous.py" "$HERE/py/odd_even_rtt.py" "$WORK/"
P=$(free_port)
$PEER server "127.0.0.1:$P" stream >"$WORK/server.log" 2>&1 & SRV=$!; PIDS+=($!)
wait_port "$P"
as_nobody timeout 60 /usr/bin/python3 "$WORK/silent_rendezvous.py" "$P" 200 40 >"$WORK/silent.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs HELD "$WORK/silent.out" && break; sleep 0.05; done
check "nobody holds 200 silent rendezvous connections" grep -q "HELD 200" "$WORK/silent.out"
sleep 0.5
timeout 60 strace -f -qq -e trace=recvmsg,epoll_ctl -o "$WORK/strace.out" -p "$SRV" & ST=$!
sleep 1
r=$(timeout 60 python3 "$WORK/odd_even_rtt.py" "$P" 20)
check "the 40 TCP clients were answered ($r)" grep -q RESULT <<<"$r"
kill -INT "$ST"; wait "$ST" 2>/dev/null
n=$(grep -c "recvmsg\|epoll_ctl" "$WORK/strace.out")
check "the server made $n recvmsg/epoll_ctl calls for 40 accepts (at most 400)" test "$n" -le 400
finish
