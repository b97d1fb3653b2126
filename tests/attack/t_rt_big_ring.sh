#!/usr/bin/env bash
# Red team: a client that never reads must hold no more of a server's memory than over TCP. The
# client makes the segment and chooses its geometry, rings of up to 64 MiB a direction included;
# a server's outgoing ring grew, while its reader fell behind, up to that capacity, and the
# pages it grows into are the server's (it writes them first: its memory cgroup pays). nobody
# (py/big_ring.py) offers 64 MiB rings on two CARRIER connections to each of root's servers,
# asks for more than that and reads nothing: root's Rust API example server and Go colo-peer
# (echo) and python's http.server under colo run (a 300 MB file) each filled 64 MiB a
# connection, where over TCP the server's socket holds at most tcp_wmem's maximum (4 MiB by
# default). Now a server's ring grows at most to its own default (colo::default_ring: twice
# tcp_wmem's maximum, as for a connection it dials), unless the program set SO_SNDBUF. The
# words a client writes must not lift that bound either: the producer took the ring's size from
# the shared `ring_size` word, set in the segment the client offers (`preset`: the server's ring
# starts at 64 MiB) or once answered along with the server's `s2c_written` copy, which sends the
# producer back to the shared words (`scribble`, the path of another holder of the end: a fork,
# an exec). A producer keeps its bound (Producer::set_bound; Go's Conn.ringBound) whatever the
# words say.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/big_ring.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
# colo::default_ring: twice tcp_wmem's maximum (within 128 KiB ..= 32 MiB) rounded up to a power of two.
BOUND=$(awk '{m = $3; if (m < 131072) m = 131072; if (m > 33554432) m = 33554432; p = 1; while (p < m) p *= 2; print 2 * p}' /proc/sys/net/ipv4/tcp_wmem)
attack() { # LABEL MODE PORT
  local words
  for words in plain preset scribble; do
    local out=$WORK/$1.$words.out arg=$words
    [ "$words" = plain ] && arg=
    as_nobody timeout 120 /usr/bin/python3 "$WORK/big_ring.py" "$3" 2 "$2" $arg >"$out" 2>&1
    check "$1, $words: nobody's connections were accelerated ($(grep -c WELCOME "$out") of 2)" test "$(grep -c WELCOME "$out")" = 2
    local worst
    worst=$(awk '/^S2C/ {if ($3 > w) w = $3} END {print w + 0}' "$out")
    check "$1, $words: the server wrote toward nobody and stopped at its own bound ($worst bytes unread at most, bound $BOUND)" \
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
