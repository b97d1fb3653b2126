#!/usr/bin/env bash
# Red team: `colo stat` run by root must not hang on a file of another user that only looks like
# a segment. nobody holds a FIFO whose /proc/PID/fd link reads "/memfd:colo-seg" (made in a user
# and mount namespace of its own, py/fifo_seg.py); a plain open(2) of a FIFO waits for a writer.
# `colo stat` must finish and list the FIFO as not a segment, never having opened it to read
# (it opens such a file with O_PATH first, which acts on nothing: a device's open can). (Before
# the first fix it blocked in open(2) for as long as the FIFO was held; before the second its
# non-blocking open let the holder's waiting writer through.)
source "$(dirname "$0")/lib.sh"
[ -x "$COLO" ] || { echo "FAIL $COLO not built (run tests/attack/run.sh)"; exit 1; }
cp "$HERE/py/fifo_seg.py" "$WORK/fifo_seg.py"
mkdir "$WORK/nb" && chown nobody:nogroup "$WORK/nb"
(cd "$WORK" && exec setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 /usr/bin/python3 "$WORK/fifo_seg.py" "$WORK/nb/ns" 50) >"$WORK/fifo.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -qs "READY\|NOUSERNS" "$WORK/fifo.out" && break; sleep 0.05; done
if grep -qs NOUSERNS "$WORK/fifo.out"; then
  # No user namespaces here: root makes the mount namespace, the holder then runs as nobody.
  (cd "$WORK" && exec timeout 60 /usr/bin/python3 "$WORK/fifo_seg.py" "$WORK/nb/ns" 50 root) >"$WORK/fifo.out" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do grep -qs READY "$WORK/fifo.out" && break; sleep 0.05; done
fi
read -r _ FPID FFD < "$WORK/fifo.out" || true
if ! grep -qs READY "$WORK/fifo.out"; then
  bad "the attacker could not make its FIFO: $(cat "$WORK/fifo.out")"; finish
fi
check "the attacker's FIFO reads as a colo segment to root" test "$(readlink "/proc/$FPID/fd/$FFD")" = "/memfd:colo-seg"
timeout 20 $COLO stat >"$WORK/stat.out" 2>&1
rc=$?
check "colo stat finishes while the FIFO is held (rc $rc)" test "$rc" = 0
check "... and lists it as not a segment" grep -q "/proc/$FPID/fd/$FFD .*not a regular file" "$WORK/stat.out"
sleep 0.2
check "... without ever opening it to read (the holder's writer is still waiting)" sh -c "! grep -q OPENED '$WORK/fifo.out'"
finish
