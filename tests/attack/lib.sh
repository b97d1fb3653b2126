# Shared helpers for tests/attack/t_*.sh (sourced after ../apps/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../apps/common.sh"
FAIL=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAIL=1; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
# as_nobody CMD...: runs CMD as the unprivileged user nobody:nogroup, with no supplementary groups.
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
COLO=$TARGET/release/colo
PEER=$TARGET/release/examples/peer
finish() { exit "$FAIL"; }
# api_colo: root's Rust API client reaches the echo server on port P over shared memory.
api_colo() { local o; o=$(COLO_LOG=info timeout 20 "$PEER" client "127.0.0.1:$P" stream 100000 2>&1); grep -q "^OK 100000 colo$" <<<"$o" || { echo "    client: $(tail -1 <<<"$o")"; return 1; }; }
# against_api_servers ATTACK: runs `ATTACK L` against root's Rust API echo server (the peer
# example, L=rust), then Go's colo-peer (L=go), each under `ulimit -n 1024` on port P (pid SRV,
# log $WORK/srv-L.log). ATTACK starts nobody's attacker (its pid in ATT) and makes its checks;
# root's client is checked accelerated before and after them, the server alive at the end.
against_api_servers() {
  local bin L gopeer=$WORK/colo-peer-go
  (cd "$ROOT/go" && go build -o "$gopeer" ./cmd/colo-peer) || bad "go: cannot build go/cmd/colo-peer"
  for L in rust go; do
    bin=$PEER; [ "$L" = go ] && bin=$gopeer
    [ -x "$bin" ] || continue
    P=$(free_port)
    ( ulimit -n 1024 && exec env COLO_LOG=info "$bin" server "127.0.0.1:$P" stream ) >"$WORK/srv-$L.log" 2>&1 & SRV=$!; PIDS+=($SRV)
    wait_port "$P" || { bad "$L: server did not start"; continue; }
    check "$L: root's client accelerated before" api_colo
    ATT=""
    "$1" "$L"
    check "$L: root's client accelerated while nobody holds them" api_colo
    if [ -n "$ATT" ]; then kill "$ATT" 2>/dev/null; wait "$ATT" 2>/dev/null; fi
    check "$L: server alive" kill -0 "$SRV"
    kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
  done
}
