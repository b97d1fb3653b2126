#!/usr/bin/env bash
# Finding 8: half-handshakes must not hold a listener's descriptors. nobody opens 3000
# rendezvous connections to root's Rust echo server without ever sending a HELLO, and 1000
# CARRIER offers never followed by their TCP connection, and keeps its ends open. The server
# keeps at most its bounds (REJECT(NO_RESOURCES) beyond) and lets go of everything on its own
# timer (5 s; the Go listener keeps offers 10 s): its descriptors are back to the baseline
# without any further connection arriving.
# Then a legitimate client is still served. (ATTACK_PEER=path runs only that server.)
source "$(dirname "$0")/lib.sh"
# against PEER_BIN (the Rust example server, then the Go one, cmd/colo-peer), checks prefixed LABEL
against() {
local PEER=$1 L=$2
port=$(free_port)
COLO_LOG=info COLO_DEBUG=1 "$PEER" server "127.0.0.1:$port" stream >"$WORK/server.log" 2>&1 &
SRV=$!; PIDS+=($SRV)
wait_port "$port" || { bad "$L: server did not start"; return; }
fds() { ls "/proc/$SRV/fd" 2>/dev/null | wc -l; }
legit() { local o; o=$(COLO_LOG=info timeout 20 "$PEER" client "127.0.0.1:$port" stream 100000 2>&1); grep -q "^OK 100000 colo$" <<<"$o" || { echo "client: $o"; return 1; }; }
check "$L: legit client before" legit
sleep 1
F0=$(fds)
HOLD=20
setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$HERE/colo_attack.py" half_handshakes "$port" 3000 1000 $HOLD \
  >"$WORK/attacker.out" 2>&1 &
ATT=$!; PIDS+=($ATT)
for _ in $(seq 600); do grep -qs RESULT "$WORK/attacker.out" && break; sleep 0.1; done
START=$SECONDS
out=$(grep RESULT "$WORK/attacker.out")
# The server works through its rendezvous backlog, keeps what its bounds allow and must let go
# of it on its own timer: sample its descriptors until they are back (15 s at most).
PEAK=0; back=""
while [ $((SECONDS - START)) -lt 15 ]; do
  n=$(fds); [ "$n" -gt "$PEAK" ] && PEAK=$n
  [ $((SECONDS - START)) -ge 2 ] && [ "$n" -le $((F0 + 2)) ] && { back=$((SECONDS - START)); break; }
  sleep 0.1
done
echo "$L attacker: $out   server fds: baseline $F0, peak $PEAK"
# Bounds: 256 silent connections (1 descriptor each) and 256 offers (4 each) of one uid, and margin.
check "$L: server held at most its bounds of half-open handshakes (peak $PEAK fds)" test "$PEAK" -le $((F0 + 256 + 4 * 256 + 64))
check "$L: rendezvous clients beyond the bounds were refused (the server's log)" grep -Eq "refused a (rendezvous client|CARRIER offer)" "$WORK/server.log"
# The attacker still holds its ends: only the server's timer can have released them.
check "$L: attacker still connected while the server let go" kill -0 "$ATT"
if [ -n "$back" ]; then ok "$L: server fds back to $(fds) (baseline $F0) within ${back}s, no connection needed"
else bad "$L: server still holds $(fds) fds (baseline $F0) 15 s after the half-handshakes"; fi
kill "$ATT" 2>/dev/null; wait "$ATT" 2>/dev/null
check "$L: server alive" kill -0 "$SRV"
check "$L: legit client after" legit
kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
}
if [ -n "${ATTACK_PEER:-}" ]; then
  against "$ATTACK_PEER" "$(basename "$ATTACK_PEER")"
else
  against "$PEER" rust
  GOPEER=$WORK/colo-peer-go
  if (cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer); then against "$GOPEER" go
  else bad "go: cannot build go/cmd/colo-peer"; fi
fi
finish
