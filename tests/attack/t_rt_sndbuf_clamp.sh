#!/usr/bin/env bash
# Red team: a program's large SO_SNDBUF must not let a client that never reads hold more of the
# server's memory than over TCP. The kernel clamps SO_SNDBUF to net.core.wmem_max (then doubles
# it); the shim kept the value the program asked for (conn::options, and a SO_SNDBUF set on an
# accelerated connection) and let the server's outgoing ring grow to four times that, within the
# ring capacity the client chose (up to 64 MiB): the server's own bound (colo::default_ring)
# gives way to a program's SO_SNDBUF. nobody (py/big_ring.py) offers 64 MiB rings to root's echo
# server under colo run (py/sndbuf_echo.py: SO_SNDBUF of 256 MiB on its listener, or on each
# accepted socket), writes 96 MiB and reads nothing back. The server's unread bytes must stay
# within twice the send buffer the kernel gives such a socket (the ring stands for the sender's
# buffer and the receiver's, set_send_limit). Before: 64 MiB a connection (8 MiB over TCP here).
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/big_ring.py" "$HERE/py/sndbuf_echo.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
for where in listener accepted; do
  P=$(free_port)
  COLO_LOG=info timeout 200 "$COLO" run -- python3 "$WORK/sndbuf_echo.py" "$P" $((256 << 20)) "$where" \
    >"$WORK/srv.$where.log" 2>&1 & PIDS+=($!)
  wait_port "$P" || { bad "$where: the server never listened"; continue; }
  kernel=$(awk '/^KERNEL/ {print $2}' "$WORK/srv.$where.log")
  out=$WORK/$where.out
  as_nobody timeout 120 /usr/bin/python3 "$WORK/big_ring.py" "$P" 2 echo >"$out" 2>&1
  check "$where: nobody's connections were accelerated ($(grep -c WELCOME "$out") of 2)" test "$(grep -c WELCOME "$out")" = 2
  worst=$(awk '/^S2C/ {if ($3 > w) w = $3} END {print w + 0}' "$out")
  check "SO_SNDBUF on the $where: the server stopped at twice the kernel's send buffer ($worst bytes unread at most, kernel's buffer ${kernel:-?})" \
    test -n "$kernel" -a "$worst" -gt 0 -a "$worst" -le $((2 * ${kernel:-0}))
done
finish
