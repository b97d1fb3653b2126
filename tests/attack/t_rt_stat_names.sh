#!/usr/bin/env bash
# Red team: another user must not write to root's terminal through `colo stat`, nor hide colo
# listeners and connections from it, through the names it shows. Names come from files whose
# bytes another user chooses: /proc/net/unix (any abstract socket's name: nobody binds
# colo/1/<escape sequences>), /proc/PID/comm (nobody's own program name) and root's server's
# /proc/PID/maps (which names each mapped memfd as its maker, nobody, called it). Before: the
# escape sequences reached root's terminal as they were (clear the screen, set its title, move
# the cursor over other lines), and a file that was not UTF-8 was read as nothing: one abstract
# socket of nobody's named with a byte 0xff hid every listener, and one connection of nobody's
# whose segment memfd was so named hid every connection of root's server (py/stat_names.py).
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/stat_names.py" "$HERE/doorbell_attacker.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
"$PEER" server "127.0.0.1:$P" stream >"$WORK/peer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || finish
setpriv --reuid=nobody --regid=nogroup --clear-groups timeout 60 /usr/bin/python3 "$WORK/stat_names.py" "$P" 30 \
  >"$WORK/att.out" 2>&1 & PIDS+=($!)
for _ in $(seq 200); do grep -q "READY\|Traceback" "$WORK/att.out" && break; sleep 0.05; done
check "nobody's connections were welcomed ($(grep -c welcome "$WORK/att.out") of 2)" test "$(grep -c "'welcome'" "$WORK/att.out")" = 2
timeout 20 "$COLO" stat >"$WORK/stat.txt" 2>&1
timeout 20 "$COLO" stat --json >"$WORK/stat.json" 2>&1
check "no control character of nobody's reaches the terminal" sh -c "! grep -q \"\$(printf '[\033\007]')\" '$WORK/stat.txt'"
check "nobody's names are shown escaped" grep -qF '\u{1b}[2J\u{1b}[H\u{1b}]0;owned\u{7}127.0.0.1:22' "$WORK/stat.txt"
check "root's listener is listed beside nobody's names" grep -q "^LISTEN *127.0.0.1:$P *$SRV " "$WORK/stat.txt"
n=$(python3 -c "import json,sys; print(sum(1 for c in json.load(open(sys.argv[1]))['connections'] if c['pid'] == $SRV))" "$WORK/stat.json" 2>&1)
check "root's server's connections are listed (2 expected, $n)" test "$n" = 2
finish
