#!/usr/bin/env bash
# Red team: another local user must not make the standard-I/O relay's work grow with its own
# descriptors. When a relayed program (socat EXEC:...,nofork under colo run) ends, its relay
# asks whether a process the program left behind holds its end (service/downward.rs,
# `others_have`), looking through processes' descriptors. nobody, who need not even connect,
# keeps 100,000 descriptors open in 10 processes: the readlink calls root's server makes for one
# relayed connection of root's client (strace) must not grow by a tenth of them, and the
# client's bytes come back intact both times.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/fd_hog.py" "$WORK/" && chmod 644 "$WORK/fd_hog.py"
P=$(free_port)
COLO_LOG=info timeout 300 "$COLO" run -- socat TCP-LISTEN:$P,reuseaddr,fork EXEC:cat,nofork >"$WORK/srv.log" 2>&1 & TO=$!
PIDS+=($TO)
for _ in $(seq 50); do SRV=$(pgrep -P "$TO" -x socat) && ss -tln | grep -q ":$P " && break; sleep 0.1; done
[ -n "${SRV:-}" ] || { bad "socat did not start"; finish; }
one() { # TAG: the readlink calls of the server's processes for one relayed round trip
  local out=$WORK/strace.$1
  timeout 120 strace -f -qq -c -e trace=readlink,readlinkat -o "$out" -p "$SRV" & local st=$!
  sleep 1
  timeout 60 "$COLO" run -- python3 -c "
import socket
s = socket.create_connection(('127.0.0.1', $P)); s.sendall(b'hello\n'); s.shutdown(socket.SHUT_WR)
got = b''
while True:
    d = s.recv(65536)
    if not d: break
    got += d
print(got == b'hello\n')" >"$WORK/rt.$1" 2>&1
  sleep 1; kill -INT "$st"; wait "$st" 2>/dev/null
  awk '/readlink/ {s += $4} END {print s + 0}' "$out"
}
base=$(one base)
setsid setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$WORK/fd_hog.py" 10 10000 200 >"$WORK/hog.out" 2>&1 & HOG=$!
PIDS+=($HOG)
for _ in $(seq 100); do grep -q HOGGING "$WORK/hog.out" && break; sleep 0.2; done
hog=$(one hog)
kill -- -"$HOG" 2>/dev/null
check "the relayed round trips were intact, over shared memory" sh -c "grep -qx True '$WORK/rt.base' && grep -qx True '$WORK/rt.hog' && grep -q 'exec: .*relay' '$WORK/srv.log'"
if grep -q HOGGING "$WORK/hog.out" && [ $((hog - base)) -le 10000 ]; then
  ok "the relay's work does not grow with nobody's descriptors (readlink calls: $base alone, $hog beside nobody's 100,000)"
else
  bad "the relay walks nobody's descriptors (readlink calls: $base alone, $hog beside nobody's 100,000; $(cat "$WORK/hog.out"))"
fi
finish
