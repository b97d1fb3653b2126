#!/usr/bin/env bash
# The cross-language matrix: every client peer against every server peer (tests/xlang/PEER.md),
# as separate processes. Peers that are not built are skipped; the run fails if any pairing fails
# or if fewer than one peer exists.
#
# Peers found:
#   go    go/bin/colo-peer (built here when `go` is on PATH)
#   rust  rust/target/release/examples/peer (cargo build --release --example peer)
#   any   tests/xlang/peers/NAME: an executable (or wrapper script) taking the PEER.md arguments
#   COLO_PEERS="name=/path/to/peer ..." adds more.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

declare -A PEER
if command -v go >/dev/null 2>&1 && [ -d "$ROOT/go" ]; then
    if (cd "$ROOT/go" && go build -o bin/colo-peer ./cmd/colo-peer); then
        PEER[go]="$ROOT/go/bin/colo-peer"
    else
        echo "xlang: building the Go peer failed" >&2
        exit 1
    fi
fi
[ -x "$ROOT/rust/target/release/examples/peer" ] && PEER[rust]="$ROOT/rust/target/release/examples/peer"
if [ -d "$ROOT/tests/xlang/peers" ]; then
    for f in "$ROOT"/tests/xlang/peers/*; do
        [ -f "$f" ] && [ -x "$f" ] && PEER[$(basename "$f")]="$f"
    done
fi
for kv in ${COLO_PEERS:-}; do PEER[${kv%%=*}]="${kv#*=}"; done

if [ ${#PEER[@]} -eq 0 ]; then
    echo "xlang: no peers found" >&2
    exit 1
fi
echo "xlang: peers: ${!PEER[*]}"

pass=0
fail=0
FAILED=()

# start_server NAME MODE -> sets ADDR and SPID
start_server() {
    local out="$TMP/server-$1-$2.out"
    rm -f "$out"  # the redirection below truncates it only once the child runs
    "${PEER[$1]}" server 127.0.0.1:0 "$2" >"$out" 2>"$TMP/server-$1-$2.err" &
    SPID=$!
    PIDS+=("$SPID")
    ADDR=""
    for _ in $(seq 1 200); do
        if { read -r word addr <"$out"; } 2>/dev/null && [ "$word" = READY ]; then
            ADDR=$addr
            return 0
        fi
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.05
    done
    return 1
}

# check LABEL EXPECTED_COUNT CMD... : runs a client, expects "OK <count> colo"
check() {
    local label=$1 want=$2
    shift 2
    local out
    out=$(timeout 120 "$@" 2>"$TMP/client.err")
    local rc=$?
    if [ $rc -eq 0 ] && [ "$out" = "OK $want colo" ]; then
        pass=$((pass + 1))
        echo "ok   $label"
    else
        fail=$((fail + 1))
        FAILED+=("$label")
        echo "FAIL $label: exit $rc, stdout '$out', stderr: $(head -c 500 "$TMP/client.err")"
    fi
}

for srv in "${!PEER[@]}"; do
    for mode in stream msg; do
        if ! start_server "$srv" "$mode"; then
            fail=$((fail + 1))
            FAILED+=("$srv server $mode: no READY")
            echo "FAIL $srv server $mode: no READY line; stderr: $(head -c 500 "$TMP/server-$srv-$mode.err")"
            continue
        fi
        for cli in "${!PEER[@]}"; do
            c="${PEER[$cli]}"
            if [ "$mode" = stream ]; then
                check "$cli client -> $srv server: stream 1 B" 1 "$c" client "$ADDR" stream 1
                check "$cli client -> $srv server: stream 1 MB" 1000000 "$c" client "$ADDR" stream 1000000
                check "$cli client -> $srv server: stream 64 MiB" 67108864 "$c" client "$ADDR" stream 67108864
                check "$cli client -> $srv server: halfclose" 5 "$c" client "$ADDR" halfclose
                # Write-before-read (the rings grow): the peers that implement the mode.
                case "$cli" in
                go | rust)
                    check "$cli client -> $srv server: 4 MiB written before reading" 4194304 "$c" client "$ADDR" writefirst 4194304
                    ;;
                esac
            else
                check "$cli client -> $srv server: msg 2000 x 64 B" 2000 "$c" client "$ADDR" msg 2000 64
                check "$cli client -> $srv server: msg 200 x 1 MiB" 200 "$c" client "$ADDR" msg 200 1048576
            fi
        done
        if ! kill -0 "$SPID" 2>/dev/null; then
            fail=$((fail + 1))
            FAILED+=("$srv server $mode died")
            echo "FAIL $srv server $mode died; stderr: $(head -c 500 "$TMP/server-$srv-$mode.err")"
        fi
        kill "$SPID" 2>/dev/null
        wait "$SPID" 2>/dev/null
    done
done

# Peer death, both ways, as separate processes:
#  - the server is killed during a large transfer: the client must fail (exit 1) promptly, not hang;
#  - the client is killed during a large transfer: the server must go on serving others.
record() { # LABEL OK?
    if [ "$2" = 1 ]; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); FAILED+=("$1"); echo "FAIL $1"; fi
}
for srv in "${!PEER[@]}"; do
    for cli in "${!PEER[@]}"; do
        c="${PEER[$cli]}"
        if start_server "$srv" stream; then
            timeout 30 "$c" client "$ADDR" stream 100000000000 >/dev/null 2>"$TMP/death.err" &
            CPID=$!
            sleep 0.5
            kill -9 "$SPID"
            wait "$CPID" 2>/dev/null
            rc=$?
            wait "$SPID" 2>/dev/null
            ok=0; [ $rc -ne 0 ] && [ $rc -ne 124 ] && ok=1
            record "$cli client -> $srv server: server killed mid-transfer, client fails (exit $rc)" $ok
        else
            record "$srv server stream: no READY" 0
        fi
        if start_server "$srv" stream; then
            "$c" client "$ADDR" stream 100000000000 >/dev/null 2>&1 &
            CPID=$!
            sleep 0.5
            kill -9 "$CPID"
            wait "$CPID" 2>/dev/null
            check "$cli client -> $srv server: server serves on after a client was killed" 1000000 "$c" client "$ADDR" stream 1000000
            kill "$SPID" 2>/dev/null
            wait "$SPID" 2>/dev/null
        fi
    done
done

echo "xlang: $pass passed, $fail failed"
for f in "${FAILED[@]}"; do echo "  failed: $f"; done
[ $fail -eq 0 ]
