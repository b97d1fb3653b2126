#!/usr/bin/env bash
# Finding 6: one user must not fill a server's address space with segments. nobody sends
# thousands of DIRECT HELLOs to root's Rust echo server, all handing over one sparse, sealed memfd
# of the largest geometry a server takes (256 MiB), and keeps the welcomed connections open. The
# server's VmSize stays within its per-uid budget (COLO_MAX_MAPPED_PER_UID_MB, default 64 GiB)
# plus a margin, the HELLOs beyond it get REJECT(NO_RESOURCES) with a log line naming the limit,
# the server does not panic and a legitimate client is still served over shared memory. A
# segment over 256 MiB is refused outright.
source "$(dirname "$0")/lib.sh"
# against PEER_BIN (the Rust example server, then the Go one, cmd/colo-peer), checks prefixed LABEL
against() {
local PEER=$1 L=$2
N=${N:-2000}
port=$(free_port)
COLO_DIRECT_ANY_UID=1 COLO_LOG=info COLO_DEBUG=1 "$PEER" server "127.0.0.1:$port" stream >"$WORK/server.log" 2>&1 &
SRV=$!; PIDS+=($SRV)
wait_port "$port" || { bad "$L: server did not start"; return; }
vm_kb() { awk '/^VmSize:/ {print $2}' "/proc/$SRV/status"; }
legit() { local o; o=$(COLO_LOG=info timeout 20 "$PEER" client "127.0.0.1:$port" stream 100000 2>&1); grep -q "^OK 100000 colo$" <<<"$o" || { echo "client: $o"; return 1; }; }
check "$L: legit client before" legit
out=$(timeout 30 setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$HERE/colo_attack.py" oversize "$port")
check "$L: a segment over 256 MiB is refused ($out)" grep -q "answer=REJECT(BAD_SEGMENT)" <<<"$out"
V0=$(vm_kb)
setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$HERE/colo_attack.py" segment_flood "$port" "$N" 15 \
  >"$WORK/attacker.out" 2>&1 &
ATT=$!; PIDS+=($ATT)
for _ in $(seq 1800); do grep -q RESULT "$WORK/attacker.out" && break; sleep 0.1; done # a watchdog, generous for a loaded host
out=$(grep RESULT "$WORK/attacker.out")
echo "$L attacker: $out   server VmSize ${V0} kB -> $(vm_kb) kB"
V1=$(vm_kb)
LIMIT_KB=$(( (64 * 1024 + 1024) * 1024 ))  # the default per-uid share, plus 1 GiB for threads and slack
check "$L: server VmSize grew by at most the per-uid share ($(( (V1 - V0) / 1024 )) MiB)" test $((V1 - V0)) -le $LIMIT_KB
check "$L: HELLOs beyond the budget answered REJECT(NO_RESOURCES)" grep -q "REJECT(NO_RESOURCES)=" <<<"$out"
check "$L: some HELLOs were welcomed (within the budget)" grep -q "WELCOME=" <<<"$out"
check "$L: the refusal's log line names the limit" grep -q "COLO_MAX_MAPPED_PER_UID_MB" "$WORK/server.log"
check "$L: legit client during the attack" legit
kill "$ATT" 2>/dev/null; wait "$ATT" 2>/dev/null
check "$L: server alive" kill -0 "$SRV"
check "$L: no panic in the server" bash -c "! grep -q panicked '$WORK/server.log'"
sleep 2
check "$L: legit client after" legit

# The same flood against a server whose address space runs out first (a `ulimit -v` below its
# budgets): mmap and thread creation fail, each failure costs that connection only.
kill "$SRV"; wait "$SRV" 2>/dev/null
port=$(free_port)
(ulimit -v 3000000; COLO_DIRECT_ANY_UID=1 COLO_LOG=info \
  exec "$PEER" server "127.0.0.1:$port" stream >"$WORK/server2.log" 2>&1) &
SRV=$!; PIDS+=($SRV)
wait_port "$port" || { bad "$L: server under ulimit -v did not start"; return; }
threads() { awk '/^Threads:/ {print $2}' "/proc/$SRV/status"; }
T0=$(( $(threads) + 1 ))
out=$(timeout 120 setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$HERE/colo_attack.py" segment_flood "$port" 40 1 3000)
echo "$L attacker (ulimit -v server): $out"
check "$L: under ulimit -v: refused with REJECT(NO_RESOURCES)" grep -q "REJECT(NO_RESOURCES)=" <<<"$out"
check "$L: under ulimit -v: server alive" kill -0 "$SRV"
check "$L: under ulimit -v: no panic" bash -c "! grep -q panicked '$WORK/server2.log'"
legit_any() { local o; o=$(COLO_LOG=info timeout 20 "$PEER" client "127.0.0.1:$port" stream 100000 2>&1); grep -q "^OK 100000" <<<"$o" || { echo "client: $o"; tail -5 "$WORK/server2.log"; return 1; }; }
# The attacker has gone: wait (bounded) for the server to let go of its connections' threads
# and mappings before asking for a new one, which needs a thread and address space of its own.
for _ in $(seq 300); do [ "$(threads)" -le "$T0" ] && break; sleep 0.1; done
echo "$L: server threads after the attacker left: $(threads)"
check "$L: under ulimit -v: legit client served" legit_any
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
