#!/usr/bin/env bash
# Red team: a peer must not make a blocked zero-copy Recv or Loan (spec/WIRE.md section 7) spin
# by scribbling on the message queues' counters. A blocked Recv waits for C2S `msg_head` to
# differ from our `msg_tail`, a Loan for S2C `free_head` to differ from our `free_tail`: both
# tails are ours to write but lie in the peer's segment, so the wait must compare with the
# copies we hold (Go: poolState.msgTailSeen, freeTailSeen), or a condition that holds at every
# look and finds nothing to do spins a core. nobody (py/msg_words.py) opens 4 CARRIER
# connections with a pool to root's Go message echo server (cmd/colo-peer ... msg), sets one
# of them one past the other, rings once and goes silent; the server must stay idle. The Rust API example server (peer ... msg) keeps its counters private already:
# a regression test. Root's client is served throughout; descriptors are back once nobody left.
source "$(dirname "$0")/lib.sh"
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
cp "$HERE/py/msg_words.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
nfds() { ls "/proc/$1/fd" | wc -l; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in clock ticks
HZ=$(getconf CLK_TCK)
back_to() { for _ in $(seq 100); do [ "$(nfds "$1")" -le "$2" ] && return 0; sleep 0.1; done; echo "    $(nfds "$1") descriptors, baseline $2"; return 1; }
# attack LABEL PID MODE SERVED-CMD...
attack() {
  local label=$1 pid=$2 mode=$3 f0 c0 c1 used out=$WORK/$1-$3.out; shift 3
  "$@" || bad "$label $mode: root's client before"
  sleep 1.5
  f0=$(nfds "$pid")
  as_nobody env LEAVE="$out.leave" timeout 60 /usr/bin/python3 "$WORK/msg_words.py" "$P" "$mode" 4 30 >"$out" 2>&1 &
  local att=$!; PIDS+=($!)
  for _ in $(seq 400); do grep -qs "SET\|Traceback" "$out" && break; sleep 0.05; done
  check "$label $mode: nobody's connections were set ($(grep SET "$out"))" grep -q "SET $mode 4" "$out"
  sleep 0.5
  c0=$(ticks "$pid"); sleep 3; c1=$(ticks "$pid")
  used=$(( (c1 - c0) * 100 / HZ ))
  check "$label $mode: the server idles while nobody holds them (${used} cs of CPU in 300 cs)" test "$used" -lt 75
  check "$label $mode: root's client is served meanwhile" "$@"
  touch "$out.leave"
  for _ in $(seq 150); do kill -0 "$att" 2>/dev/null || break; sleep 0.1; done
  check "$label $mode: the attacker finished ($(tail -1 "$out"))" grep -q "RESULT held=4" "$out"
  check "$label $mode: the server is alive" kill -0 "$pid"
  check "$label $mode: root's client is served after" "$@"
  check "$label $mode: descriptors back to baseline" back_to "$pid" "$f0"
}
P=$(free_port)
"$PEER" server "127.0.0.1:$P" msg >"$WORK/peer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || exit 1
rust_client() { timeout 10 "$PEER" client "127.0.0.1:$P" msg 100 64 | grep -q "^OK 100 "; }
attack rust "$SRV" recv rust_client
attack rust "$SRV" loan rust_client
P=$(free_port)
"$GOPEER" server "127.0.0.1:$P" msg >"$WORK/gopeer.log" 2>&1 & PIDS+=($!); SRV=$!
wait_port "$P" || exit 1
go_client() { timeout 10 "$GOPEER" client "127.0.0.1:$P" msg 100 64 | grep -q "^OK 100 "; }
attack go "$SRV" recv go_client
attack go "$SRV" loan go_client
finish
