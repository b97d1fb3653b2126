#!/usr/bin/env bash
# Red team: silent rendezvous connections must not make every accept of a multi-worker server
# under colo run cost work in proportion to them. nobody holds 200 rendezvous connections to
# root's nginx (2 workers, colo run) that never send a HELLO (renewed before the 5 s timeout).
# A worker that accepts asks the listening process's offer service, which read every one of
# them (a recvmsg each) for every request, and again at each of its own wake-ups. Counted with
# strace on the listening process over 40 plain HTTP clients: far fewer recvmsg calls than one
# per silent connection and client.
source "$(dirname "$0")/lib.sh"
command -v strace >/dev/null || { bad "strace is not installed (tests/apps/packages.txt)"; finish; }
[ -e "$SHIM" ] || { echo "FAIL $SHIM not built (run tests/attack/run.sh)"; exit 1; }
cp "$HERE/py/silent_rendezvous.py" "$HERE/py/odd_even_rtt.py" "$WORK/"
P=$(free_port)
start_nginx "$P" 2 colo || exit 1
MASTER=${PIDS[-1]}
as_nobody timeout 60 /usr/bin/python3 "$WORK/silent_rendezvous.py" "$P" 200 40 >"$WORK/silent.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs HELD "$WORK/silent.out" && break; sleep 0.05; done
check "nobody holds 200 silent rendezvous connections" grep -q "HELD 200" "$WORK/silent.out"
sleep 0.5
timeout 60 strace -f -qq -e trace=recvmsg -o "$WORK/strace.out" -p "$MASTER" & ST=$!
sleep 1
r=$(timeout 60 python3 "$WORK/odd_even_rtt.py" "$P" 20 'GET /1k.txt HTTP/1.0\r\n\r\n')
check "the 40 HTTP clients were answered ($r)" grep -q RESULT <<<"$r"
kill -INT "$ST"; wait "$ST" 2>/dev/null
n=$(grep -c "recvmsg" "$WORK/strace.out")
check "nginx's listening process made $n recvmsg calls meanwhile (at most 400)" test "$n" -le 400
finish
