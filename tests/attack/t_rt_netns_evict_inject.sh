#!/usr/bin/env bash
# Red team: a listed tenant must not make another tenant's PROPOSAL reach a Rust API server's
# application. Root's echo server (the peer example, COLO_NETNS_DIR and COLO_NETNS_CLIENTS
# 10.77.21.0/24) is busy between accepts (PEER_ACCEPT_DELAY_MS 200: a server that works before
# its next accept). nobody, listed, in a namespace of its own (py/netns_evict.py), fills the
# listener's set of waiting cross-namespace connections (256) with 254 in their HELLO wait, then
# queues 20 silent connections right behind root's victim client's (another namespace). The next
# accept takes the backlog in: the victim's connection, its whole PROPOSAL queued but not yet
# looked at, is the oldest waiting for its first bytes and is pushed out of the set. It went on
# with the stream untouched: the echo server sent the PROPOSAL back, the client took 112 bytes
# (the PROPOSAL and 72 bytes of its own data) for an answer, and its bytes came back wrong.
# Must hold: the pushed-out PROPOSAL is taken off the stream and answered DECLINE (the server's
# log says "declined: too many connections from other namespaces wait"); the victim's 100000
# bytes come back intact, over plain TCP.
source "$(dirname "$0")/lib.sh"
source "$HERE/netns_lib.sh"
ns_up atke 21 || { bad "could not make the namespaces"; finish; }
cp "$HERE/py/netns_evict.py" "$WORK/" && chmod 644 "$WORK/netns_evict.py"
D=$WORK/ns && mkdir "$D" && chmod 755 "$D"
GO=$WORK/go PORT=7001
"${IN_S[@]}" env COLO_LOG=info COLO_NETNS_DIR="$D" COLO_NETNS_CLIENTS="10.77.$N.0/24" PEER_ACCEPT_DELAY_MS=200 \
  timeout 60 "$PEER" server "$IP_S:$PORT" stream >"$WORK/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/server.log" && ls "$D"/*.live >/dev/null 2>&1 && break; sleep 0.05; done
grep -qs READY "$WORK/server.log" || { bad "the server did not start: $(cat "$WORK/server.log")"; finish; }
check "the server has its rendezvous in $D" sh -c "ls '$D'/colo-*-$PORT.live >/dev/null 2>&1"
"${IN_X[@]}" "${NOBODY[@]}" timeout 30 /usr/bin/python3 "$WORK/netns_evict.py" "$IP_S" "$PORT" "$GO" >"$WORK/evict.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do grep -qs "FILLED\|Error" "$WORK/evict.out" && break; sleep 0.05; done
check "nobody filled the set: both batches taken in ($(grep PHASE "$WORK/evict.out" | tr '\n' ' '))" \
  test "$(grep -c "^PHASE . b'ping\\\\n'" "$WORK/evict.out")" = 2
# The victim: root's colo client in its own namespace, 100000 bytes echoed and compared.
"${IN_C[@]}" env COLO_LOG=info COLO_NETNS_PEERS="$IP_S" COLO_NETNS_PEER_DIR="$D" \
  timeout 20 "$PEER" client "$IP_S:$PORT" stream 100000 >"$WORK/victim.out" 2>&1 &
VICTIM=$!; PIDS+=($VICTIM)
sleep 0.02; touch "$GO"
wait "$VICTIM"; rc=$?
for _ in $(seq 100); do grep -qs BEHIND "$WORK/evict.out" && break; sleep 0.05; done
check "nobody queued silent connections behind the victim's" grep -q "^BEHIND 20" "$WORK/evict.out"
check "the server pushed the victim's connection out and declined its PROPOSAL ($(grep -c "declined: too many connections from other namespaces wait" "$WORK/server.log") such)" \
  grep -q "accept $IP_C:[0-9]*: cross-namespace proposal declined: too many connections from other namespaces wait" "$WORK/server.log"
check "the victim's 100000 bytes came back intact over plain TCP (exit $rc: $(tr '\n' ' ' <"$WORK/victim.out" | tail -c 300))" \
  sh -c "[ $rc = 0 ] && grep -q '^OK 100000 tcp' '$WORK/victim.out'"
finish
