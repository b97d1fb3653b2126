#!/usr/bin/env bash
# Each peer segment a server maps is one of the vm.max_map_count mappings (65,530 by default)
# the kernel allows it; beyond them its own mmap and malloc fail. So a server maps at most
# COLO_MAX_SEGMENTS peer segments at once (default a quarter of vm.max_map_count). Here the
# bound is set to 50 (the default's 16k mappings need more descriptors than this host gives),
# nobody sends 200 DIRECT HELLOs to root's Rust echo server (then the Go one) and keeps the
# welcomed connections open: the server maps at most 50 segments (memfd mappings), of which one
# uid holds a quarter (12), its mapping count grows by the welcomed connections' share only, the
# HELLOs beyond nobody's share get REJECT(NO_RESOURCES) with a log line naming the limit, and
# root's client is still accelerated (nobody's segments leave root's share free). Then the same
# through the shim (redis-server under `colo run`, its attacker a program under `colo run`).
source "$(dirname "$0")/lib.sh"
CAP=50 N=200 SHARE=12
# against PEER_BIN LABEL: the checks, prefixed LABEL
against() {
local PEER=$1 L=$2
port=$(free_port)
COLO_MAX_SEGMENTS=$CAP COLO_DIRECT_ANY_UID=1 COLO_LOG=info COLO_DEBUG=1 "$PEER" server "127.0.0.1:$port" stream >"$WORK/server-$L.log" 2>&1 &
SRV=$!; PIDS+=($SRV)
wait_port "$port" || { bad "$L: server did not start"; return; }
maps() { wc -l <"/proc/$SRV/maps"; }
segs() { grep -c "/memfd:colo-seg" "/proc/$SRV/maps"; }
legit() { local o; o=$(COLO_LOG=info timeout 20 "$PEER" client "127.0.0.1:$port" stream 100000 2>&1); grep -q "^OK 100000" <<<"$o" || { echo "client: $o"; return 1; }; }
# Two connections first: the server's lasting threads (a reaper) and pools are up by then.
check "$L: legit client before" legit
check "$L: legit client before (2)" legit
M0=$(maps)
setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$HERE/colo_attack.py" segment_flood "$port" "$N" 15 \
  >"$WORK/attacker-$L.out" 2>&1 &
ATT=$!; PIDS+=($ATT)
for _ in $(seq 1800); do grep -q RESULT "$WORK/attacker-$L.out" && break; sleep 0.1; done # a watchdog, generous for a loaded host
out=$(grep RESULT "$WORK/attacker-$L.out")
M1=$(maps) S1=$(segs)
echo "$L attacker: $out   server mappings $M0 -> $M1, of them segments $S1"
check "$L: server maps at most $CAP peer segments ($S1)" test "$S1" -le "$CAP"
# Each welcomed connection costs its segment and, in the Rust server, its thread's stack, guard
# page and (for a while) malloc arena: bounded by the segments' bound, not by the HELLOs.
check "$L: server mappings grew by at most 6 x $CAP + 30 ($((M1 - M0)))" test $((M1 - M0)) -le $((6 * CAP + 30))
count() { grep -o "$1=[0-9]*" <<<"$out" | cut -d= -f2 || echo 0; }
W=$(count WELCOME) R=$(count "REJECT(NO_RESOURCES)")
# nobody's share welcomed (the legit clients' connections are root's), every other HELLO
# refused with NO_RESOURCES.
check "$L: nobody's quarter of the $CAP segments welcomed, no more ($W)" test "${W:-0}" -le "$SHARE" -a "${W:-0}" -ge $((SHARE - 2))
check "$L: the others answered REJECT(NO_RESOURCES) ($R)" test $((${W:-0} + ${R:-0})) -eq "$N"
check "$L: the refusal's log line names the limit" grep -q "COLO_MAX_SEGMENTS=$CAP reached" "$WORK/server-$L.log"
legit_colo() { local o; o=$(COLO_LOG=info timeout 20 "$PEER" client "127.0.0.1:$port" stream 100000 2>&1); grep -q "^OK 100000 colo$" <<<"$o" || { echo "client: $o"; return 1; }; }
check "$L: legit client accelerated during the attack" legit_colo
kill "$ATT" 2>/dev/null; wait "$ATT" 2>/dev/null
check "$L: server alive" kill -0 "$SRV"
check "$L: no panic in the server" bash -c "! grep -q panicked '$WORK/server-$L.log'"
# The attacker has gone: its segments are unmapped (bounded wait) and accelerated again.
for _ in $(seq 100); do [ "$(maps)" -le $((M0 + 30)) ] && break; sleep 0.1; done
check "$L: legit client accelerated after ($(maps) mappings)" legit_colo
kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
}
# The shim: nobody's program under `colo run` opens 200 connections to root's redis under the
# shim and keeps them; its CARRIER offers beyond the bound are refused and those connections are
# plain TCP (each served all the same).
against_shim() {
local L=redis
port=$(free_port)
export COLO_MAX_SEGMENTS=$CAP; start_redis "$port" colo || { bad "$L: redis did not start"; return; }; unset COLO_MAX_SEGMENTS
SRV=${PIDS[-1]}
maps() { wc -l <"/proc/$SRV/maps"; }
segs() { grep -c "/memfd:colo-seg" "/proc/$SRV/maps"; }
pong() { [ "$("$@" 2>&1 | tail -1)" = PONG ]; }
check "$L: legit client before" pong $COLORUN redis-cli -p "$port" ping
check "$L: legit client before (2)" pong $COLORUN redis-cli -p "$port" ping
M0=$(maps)
COLO_LOG=debug setpriv --reuid=nobody --regid=nogroup --clear-groups $COLORUN /usr/bin/python3 -c '
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
held = []
for i in range(int(sys.argv[2])):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.sendall(b"PING\r\n")
    if s.recv(100) == b"+PONG\r\n":
        held.append(s)
print("RESULT answered=%d" % len(held), flush=True)
time.sleep(15)
' "$port" "$N" >"$WORK/attacker-$L.out" 2>&1 &
ATT=$!; PIDS+=($ATT)
for _ in $(seq 1800); do grep -q RESULT "$WORK/attacker-$L.out" && break; sleep 0.1; done # a watchdog, generous for a loaded host
M1=$(maps) S1=$(segs)
A=$(grep -c "accelerated (shared memory)" "$WORK/attacker-$L.out") R=$(grep -c "server refused: out of descriptors or memory" "$WORK/attacker-$L.out")
echo "$L attacker: $(grep RESULT "$WORK/attacker-$L.out"), $A accelerated, $R refused   server mappings $M0 -> $M1, of them segments $S1"
check "$L: every connection answered" grep -q "RESULT answered=$N$" "$WORK/attacker-$L.out"
check "$L: server maps at most $CAP peer segments ($S1)" test "$S1" -le "$CAP"
check "$L: server mappings grew by at most $CAP + 30 ($((M1 - M0)))" test $((M1 - M0)) -le $((CAP + 30))
check "$L: nobody's quarter of the $CAP segments accelerated, no more ($A)" test "$A" -le "$SHARE"
check "$L: the others refused with NO_RESOURCES, plain TCP ($R)" test "$R" -ge $((N - SHARE))
check "$L: the refusal's log line names the limit" grep -q "COLO_MAX_SEGMENTS=$CAP reached" "$WORK/redis-$port.log"
colo_pong() { local o; o=$(COLO_LOG=info $COLORUN redis-cli -p "$port" ping 2>&1); grep -q "accelerated (shared memory)" <<<"$o" && grep -q "^PONG$" <<<"$o" || { echo "client: $o"; return 1; }; }
check "$L: legit client accelerated during the attack" colo_pong
kill "$ATT" 2>/dev/null; wait "$ATT" 2>/dev/null
for _ in $(seq 100); do [ "$(segs)" -eq 0 ] && break; sleep 0.1; done
check "$L: legit client accelerated after" colo_pong
check "$L: server alive" kill -0 "$SRV"
}
if [ -n "${ATTACK_PEER:-}" ]; then
  against "$ATTACK_PEER" "$(basename "$ATTACK_PEER")"
else
  against "$PEER" rust
  GOPEER=$WORK/colo-peer-go
  if (cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer); then against "$GOPEER" go
  else bad "go: cannot build go/cmd/colo-peer"; fi
  if need redis-server; then against_shim; fi
fi
finish
