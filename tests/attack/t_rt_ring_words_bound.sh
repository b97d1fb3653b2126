#!/usr/bin/env bash
# Red team: the words a client writes must not lift a server's bound on its outgoing ring. A
# server's ring toward its client grows at most to the server's own default (t_rt_big_ring.sh),
# but its producer took the ring's size from the shared `ring_size` word, which the client can
# write: set in the segment it offers (`preset`: the server's ring starts at 64 MiB), or set
# once answered along with the server's `s2c_written` copy, which sends the producer back to
# the shared words (`scribble`, the path of another holder of the end: a fork, an exec). The
# bound only stopped growth, so the server then filled the whole 64 MiB toward a client that
# never read (py/big_ring.py), where TCP holds at most tcp_wmem's maximum. Servers: root's
# Rust API example (echo), Go colo-peer (echo) and python's http.server under colo run.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/big_ring.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
# colo::default_ring: twice tcp_wmem's maximum (within 128 KiB ..= 32 MiB) rounded up to a power of two.
BOUND=$(awk '{m = $3; if (m < 131072) m = 131072; if (m > 33554432) m = 33554432; p = 1; while (p < m) p *= 2; print 2 * p}' /proc/sys/net/ipv4/tcp_wmem)
attack() { # LABEL MODE PORT
  for words in preset scribble; do
    local out=$WORK/$1.$words.out
    as_nobody timeout 120 /usr/bin/python3 "$WORK/big_ring.py" "$3" 2 "$2" 1 $words >"$out" 2>&1
    check "$1, $words: nobody's connections were accelerated ($(grep -c WELCOME "$out") of 2)" test "$(grep -c WELCOME "$out")" = 2
    local worst
    worst=$(awk '/^S2C/ {if ($3 > w) w = $3} END {print w + 0}' "$out")
    check "$1, $words: the server stopped at its own bound ($worst bytes unread at most, bound $BOUND)" \
      test "$worst" -gt 0 -a "$worst" -le "$BOUND"
  done
}
P=$(free_port)
"$PEER" server "127.0.0.1:$P" stream >"$WORK/peer.log" 2>&1 & PIDS+=($!)
wait_port "$P" && attack "Rust API server" echo "$P"
P=$(free_port)
"$GOPEER" server "127.0.0.1:$P" stream >"$WORK/gopeer.log" 2>&1 & PIDS+=($!)
wait_port "$P" && attack "Go server" echo "$P"
mkdir -p "$WORK/www" && head -c 300000000 /dev/zero >"$WORK/www/big" && chmod -R a+rX "$WORK/www"
P=$(free_port)
(cd "$WORK/www" && exec "$COLO" run -- python3 -m http.server "$P" --bind 127.0.0.1) >"$WORK/http.log" 2>&1 & PIDS+=($!)
wait_port "$P" && attack "python http.server under colo run" http "$P"
finish
