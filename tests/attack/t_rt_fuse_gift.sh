#!/usr/bin/env bash
# Red team: a descriptor a client passes must not stop root's Go server whatever file it is.
# Every close of a file calls its file system's flush; a FUSE file's waits for its FUSE server's
# answer, and any user may mount a FUSE file system of its own (in a user namespace of its own:
# `unshare -U -r -m`, no fusermount needed). nobody (py/fuse_gift.py) serves one whose FLUSH it
# never answers and passes its file as the segment of DIRECT HELLOs to root's API echo server
# (the Rust peer example, then Go's colo-peer). Each listener refused the first
# (REJECT(NEED_CARRIER): another uid) and closed the descriptor in its rendezvous loop (Rust: the
# thread that accepts), which waited there for as long as nobody held the FLUSH: no later HELLO
# was answered, and root's own client, pending on an unanswered HELLO, hung (killed by the
# watchdog). Now a segment that is not on tmpfs is refused before anything else (Rust:
# REJECT(BAD_SEGMENT)) and such a descriptor is closed by a closer thread
# (colo_sys::gift::close_passed, Go's closePassed; at most 64 at once). Must hold: every HELLO of nobody's answered, root's
# client served over shared memory while nobody holds the FLUSHes, the server alive.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/fuse_gift.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
as_nobody unshare -U -r -m true || { bad "nobody cannot make a user namespace here (the attack needs one)"; finish; }
for L in rust go; do
  bin=$PEER; [ "$L" = go ] && bin=$GOPEER
  mkdir "$WORK/mnt-$L" && chmod 777 "$WORK/mnt-$L"
  P=$(free_port)
  COLO_DEBUG=1 "$bin" server "127.0.0.1:$P" stream >"$WORK/srv-$L.log" 2>&1 & SRV=$!; PIDS+=($SRV)
  wait_port "$P" || { bad "$L: server did not start"; continue; }
  client() { COLO_LOG=info timeout 20 "$bin" client "127.0.0.1:$P" stream 100000 2>&1 | tail -1; }
  r=$(client)
  check "$L: root's client served over shared memory before the attack ($r)" grep -q "^OK 100000 colo" <<<"$r"
  as_nobody unshare -U -r -m timeout 60 /usr/bin/python3 "$WORK/fuse_gift.py" "$P" 3 30 "$WORK/mnt-$L" >"$WORK/att-$L.out" 2>&1 & ATT=$!; PIDS+=($ATT)
  for _ in $(seq 300); do grep -qs "^ANSWERS" "$WORK/att-$L.out" && break; sleep 0.05; done
  echo "     nobody: $(tr '\n' ' ' <"$WORK/att-$L.out")"
  check "$L: nobody mounted its FUSE file system and sent its HELLOs" grep -q "^SENT 3" "$WORK/att-$L.out"
  check "$L: every HELLO of nobody's answered" grep -qE "^ANSWERS REJECT\((NEED_CARRIER|BAD_SEGMENT)\)$" "$WORK/att-$L.out"
  r=$(client)
  check "$L: root's client served over shared memory while nobody holds the FLUSHes ($r)" grep -q "^OK 100000 colo" <<<"$r"
  check "$L: server alive" kill -0 "$SRV"
  echo "     $L server threads while nobody holds them: $(awk '/^Threads/ {print $2}' /proc/$SRV/status)"
  kill "$ATT" "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
done
finish
