#!/usr/bin/env bash
# ZeroMQ REQ/REP (pyzmq: Debian python3-zmq), 20,000 round trips of 64 B, a REP server and a
# REQ client both under `colo run`, against both plain, in alternating runs (farm-bench prints
# the medians and the ratio). Not in `make test`: a measurement.
#   tests/apps/zmq_bench.sh [COLO]   (COLO: the colo binary; default rust/target/release/colo)
# With COLO_SPIN_US=0 in the environment, colo's waits do not spin.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
COLO=${1:-$HERE/../../rust/target/release/colo}
/usr/bin/python3 -c 'import zmq' || { echo "python3-zmq is not installed"; exit 1; }
PAIR=$(mktemp /tmp/zmq-pair.XXXXXX.sh)
trap 'rm -f "$PAIR"' EXIT
cat >"$PAIR" <<EOS
#!/bin/bash
# One run: a server and a client on a fresh port, both under "\$1" (empty: plain).
P=\$((20000 + RANDOM % 20000))
\$1 /usr/bin/python3 $HERE/py/zmq_reqrep.py server \$P & sp=\$!
sleep 0.3
timeout 60 \$1 /usr/bin/python3 $HERE/py/zmq_reqrep.py client \$P 20000 quit >/dev/null
wait \$sp
EOS
chmod +x "$PAIR"
farm-bench -n 6 --timeout 300 --vs "$PAIR ''" -- "$PAIR" "$COLO run --"
