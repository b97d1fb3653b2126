#!/usr/bin/env bash
# Red team: a peer of another user must not keep a closed connection's unread bytes charged to
# us for as long as it likes. A server writes into its client's memfd (the S2C ring); each page
# it touches first is charged to the server's memory cgroup, and a last close gives back all but
# the pages of the bytes the client has yet to read, which a client that stays connected and
# never reads would keep for as long as it keeps the memfd (TCP drops an orphaned socket's
# unsent bytes on a timer). nobody opens 16 CARRIER connections to root's server that writes
# 768 KiB to each and closes, never reads, and keeps everything open. The server's side keeps
# such a segment while the peer reads, and drops the unread bytes of one whose peer read none
# for a minute (colo::orphan, Go's keepOrphan): ring_flags RESET and DROPPED, so the peer reads
# a reset, never zeros, and the pages go. Against root's python server under colo run (the
# shim, Rust core), a program it execs with the connection as its standard output (the shim's
# relay process writes for it, and lingers until the bytes are read or lost: its exit would
# leave them) and a Go API server. The first connection's bytes are read 40 s after the
# close: all of them, and FIN.
# Run: bash tests/attack/t_rt_orphan_bytes.sh (as root). About 2 minutes.
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/orphan.py" "$HERE/py/write_close_server.py" "$HERE/py/exec_write_server.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
GOSRV=$WORK/write_close_server
(cd "$ROOT/go" && go build -o "$GOSRV" ../tests/attack/go/write_close_server.go) || bad "go build write_close_server"
K=16; N=$((768 << 10)); RING=$((1 << 20))
# attack LABEL PORT: nobody's K connections to the server on PORT, held unread for up to 150 s,
# in the background (the three servers are attacked at once); judge LABEL reads its outcome.
ATTACKERS=()
attack() {
  as_nobody timeout 240 /usr/bin/python3 "$WORK/orphan.py" "$2" "$K" "$N" "$RING" 150 >"$WORK/$1.out" 2>&1 &
  ATTACKERS+=($!); PIDS+=($!)
}
judge() {
  local label=$1 out=$WORK/$1.out
  local closed
  closed=$(grep '^CLOSED' "$out")
  check "$label wrote $N bytes to each of $K connections and closed them ($closed)" \
    grep -q "^CLOSED $K HELD .* HEAD $((K * N))\$" "$out"
  local held
  held=$(awk '/^CLOSED/ {print $4}' "$out")
  check "$label: the unread bytes were held at first (${held:-?} KiB)" test "${held:-0}" -ge $((K * N / 1024 / 2))
  check "$label: its pages of the unread bytes go while nobody keeps the connections ($(grep -E '^(FREED|STILL)' "$out"))" \
    grep -q '^FREED' "$out"
  local flags
  flags=$(awk '/^FLAGS/ {print $2}' "$out")
  check "$label: the rings say RESET and DROPPED, so nobody reads no zeros as bytes (flags ${flags:-?})" \
    test $(( 0x${flags:-0} & 10 )) -eq 10
  check "$label: a peer that reads its bytes 40 s after the close gets them all, and no reset ($(grep -E '^(LATE|FLAGS)' "$out" | tr '\n' ' '))" \
    grep -q "^LATE [0-9]* $N intact" "$out"
  check "$label: ... and its ring says FIN, not RESET" grep -q 'LATE_FLAGS 5$' "$out"
  sed "s/^/    /" "$out" | grep -v '^    HELD [0-9]* ' | head -5
}
P=$(free_port)
$COLORUN /usr/bin/python3 "$WORK/write_close_server.py" "$P" "$N" >"$WORK/py.out" 2>&1 & PIDS+=($!)
wait_port "$P"
attack "root's python server (colo run)" "$P"
P=$(free_port)
$COLORUN /usr/bin/python3 "$WORK/exec_write_server.py" "$P" "$N" >"$WORK/exec.out" 2>&1 & PIDS+=($!)
wait_port "$P"
attack "root's relayed program (colo run, an exec'd image)" "$P"
P=$(free_port)
"$GOSRV" "127.0.0.1:$P" "$N" >"$WORK/go.out" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs READY "$WORK/go.out" && break; sleep 0.05; done
attack "root's Go server" "$P"
wait "${ATTACKERS[@]}"
judge "root's python server (colo run)"
judge "root's relayed program (colo run, an exec'd image)"
judge "root's Go server"
finish
