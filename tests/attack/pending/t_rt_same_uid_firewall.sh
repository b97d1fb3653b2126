#!/usr/bin/env bash
# Red team (pending: a design decision, not run by CI): a firewall rule that refuses a user's
# TCP connections to a port must refuse that user's colo connections too, when the listener is
# that same user's. Root adds an iptables OUTPUT rule that rejects uid 0's TCP connections to
# 127.0.0.1:P, where root's Rust API example server listens. A plain TCP connect is refused;
# root's Rust and Go API clients connect anyway: a listener takes DIRECT from its own uid, and
# no netfilter, cgroup BPF (systemd IPAddressDeny=) or Landlock rule ever sees a DIRECT
# connection. README says "a firewall rule for one user ... stops that user's colo connections
# as it stops its TCP ones": true only for a user other than the listener's.
# Run: bash tests/attack/pending/t_rt_same_uid_firewall.sh (as root, after tests/attack/run.sh).
source "$(dirname "$0")/../lib.sh"
# common.sh placed the tree one level too high from here.
ROOT=$(cd "$HERE/../../.." && pwd); TARGET=${CARGO_TARGET_DIR:-$ROOT/rust/target}; PEER=$TARGET/release/examples/peer
command -v iptables >/dev/null || { bad "iptables is not installed"; finish; }
GOPEER=$WORK/colo-peer
(cd "$ROOT/go" && go build -o "$GOPEER" ./cmd/colo-peer) || bad "go build colo-peer"
P=$(free_port)
$PEER server "127.0.0.1:$P" stream >"$WORK/server.log" 2>&1 & PIDS+=($!)
wait_port "$P"
RULE=(OUTPUT -p tcp -d 127.0.0.1 --dport "$P" -m owner --uid-owner 0 -j REJECT --reject-with tcp-reset)
iptables -I "${RULE[@]}" || { bad "iptables -I"; finish; }
trap 'iptables -D "${RULE[@]}" 2>/dev/null; cleanup' EXIT
check "the rule refuses root's plain TCP connection" sh -c "! timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$P' 2>/dev/null"
out=$(timeout 10 $PEER client "127.0.0.1:$P" stream 1000 2>&1 | tail -1)
check "... and root's Rust API client too (got: $out)" sh -c "! echo '$out' | grep -q '^OK'"
[ -n "$out" ] || bad "the Rust client printed nothing"
out=$(timeout 10 $GOPEER client "127.0.0.1:$P" stream 1000 2>&1 | tail -1)
check "... and root's Go API client too (got: $out)" sh -c "! echo '$out' | grep -q '^OK'"
finish
