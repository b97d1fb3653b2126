#!/usr/bin/env bash
# Finding 9: `colo stat` must never crash on a hostile segment. nobody holds an unsealed memfd
# named colo-seg with a valid-looking header and keeps shrinking and growing it, while root runs
# `colo stat` (table and JSON) 60 times: every run exits 0 (a mapping of that file would fault,
# SIGBUS, when the file shrinks under it), and the file is reported as not a segment.
# (ATTACK_COLO=path runs another build.)
source "$(dirname "$0")/lib.sh"
COLO=${ATTACK_COLO:-$COLO}
setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$HERE/colo_attack.py" resize_loop 60 \
  >"$WORK/attacker.out" 2>&1 &
ATT=$!; PIDS+=($ATT)
sleep 0.5
crashes=0; runs=0; reported=0
for i in $(seq 30); do
  for json in "" --json; do
    timeout 20 "$COLO" stat $json >"$WORK/stat.out" 2>&1
    rc=$?
    runs=$((runs + 1))
    [ $rc -ne 0 ] && { crashes=$((crashes + 1)); echo "colo stat $json exited $rc"; }
    grep -q "not sealed against resizing" "$WORK/stat.out" && reported=$((reported + 1))
  done
done
check "attacker kept resizing throughout" kill -0 "$ATT"
check "colo stat never crashed ($crashes of $runs runs did)" test "$crashes" -eq 0
check "the hostile file is reported as not a segment ($reported of $runs runs)" test "$reported" -eq "$runs"
finish
