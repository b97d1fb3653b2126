#!/usr/bin/env bash
# Red team: a descriptor a client passes must not stop root's Go server whatever file it is.
# Every close of a file calls its file system's flush; a FUSE file's waits for its FUSE server's
# answer, and any user may mount a FUSE file system of its own (in a user namespace of its own:
# `unshare -U -r -m`, no fusermount needed). nobody (py/fuse_gift.py) serves one whose FLUSH it
# never answers and passes its file as the segment of DIRECT HELLOs to root's Go server
# (go/cmd/colo-peer). The Go listener refused the first (REJECT(NEED_CARRIER): another uid) and
# closed the descriptor in its rendezvous loop, which waited there for as long as nobody held
# the FLUSH: no later HELLO was answered, and root's own Go client, pending on an unanswered
# HELLO, hung (killed by the watchdog). Now such a descriptor is closed by a closer goroutine
# (go/gift.go, closePassed; at most 64 at once). Must hold: every HELLO of nobody's answered,
# root's Go client served over shared memory while nobody holds the FLUSHes, the server alive.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/fuse_gift.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
mkdir "$WORK/mnt" && chmod 777 "$WORK/mnt"
as_nobody unshare -U -r -m true || { bad "nobody cannot make a user namespace here (the attack needs one)"; finish; }
P=$(free_port)
COLO_DEBUG=1 $GOPEER server "127.0.0.1:$P" stream >"$WORK/go-server.log" 2>&1 & SRV=$!; PIDS+=($SRV)
wait_port "$P" || exit 1
go_client() { COLO_LOG=info timeout 20 "$GOPEER" client "127.0.0.1:$P" stream 100000 2>&1 | tail -1; }
r=$(go_client)
check "root's Go client served over shared memory before the attack ($r)" grep -q "^OK 100000 colo" <<<"$r"
as_nobody unshare -U -r -m timeout 60 /usr/bin/python3 "$WORK/fuse_gift.py" "$P" 3 30 "$WORK/mnt" >"$WORK/att.out" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do grep -qs "^ANSWERS" "$WORK/att.out" && break; sleep 0.05; done
echo "     nobody: $(tr '\n' ' ' <"$WORK/att.out")"
check "nobody mounted its FUSE file system and sent its HELLOs" grep -q "^SENT 3" "$WORK/att.out"
check "every HELLO of nobody's answered" grep -q "^ANSWERS REJECT(NEED_CARRIER)$" "$WORK/att.out"
r=$(go_client)
check "root's Go client served over shared memory while nobody holds the FLUSHes ($r)" grep -q "^OK 100000 colo" <<<"$r"
check "root's Go server alive" kill -0 "$SRV"
echo "     server threads while nobody holds them: $(awk '/^Threads/ {print $2}' /proc/$SRV/status)"
finish
