#!/usr/bin/env bash
# A relay that copies 1 KiB at a time (servers/relay1k.c, as microsocks does) between curl and
# python's http.server: curl fetches 100 MB through it 3 times, in ROUNDS (default 6) alternating
# rounds of everything plain TCP and of all three under `colo run`. A round whose connections
# were not all accelerated, or whose sizes are wrong, is reported and left out of the medians.
# Prints each round's wall and CPU seconds (every process), then the medians.
# `tests/apps/relay_bench.sh REV` adds the same three under REV's shim (common.sh's build_rev).
# Not in `make test`: a measurement.
source "$(dirname "$0")/common.sh"
build
need curl || exit 1
REV=${1:-}; ROUNDS=${ROUNDS:-6}
gcc -O2 -pthread -o "$WORK/relay1k" "$HERE/servers/relay1k.c" || exit 1
head -c 100000000 /dev/urandom >"$WORK/file100m"
[ -n "$REV" ] && build_rev "$REV"
# One round ($1: the colo-run prefix, empty for plain TCP): the server, the relay, 3 fetches.
cat >"$WORK/one.sh" <<EOS
#!/bin/bash
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up() { for _ in \$(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/\$1) 2>/dev/null && return; sleep 0.05; done; }
P=\$(port); Q=\$(port)
\$1 python3 -m http.server -b 127.0.0.1 -d $WORK \$P >/dev/null 2>&1 & sp=\$!
up \$P
\$1 $WORK/relay1k \$Q \$P & rp=\$!
up \$Q
for _ in 1 2 3; do timeout 60 \$1 curl -s -o /dev/null -w '%{size_download}\n' http://127.0.0.1:\$Q/file100m; done
kill \$sp \$rp; wait \$sp \$rp 2>/dev/null
EOS
declare -A WALL CPU
kinds=(tcp colo); [ -n "$REV" ] && kinds+=(rev)
for r in $(seq "$ROUNDS"); do
  for k in "${kinds[@]}"; do
    case $k in tcp) pre="" ;; colo) pre="env COLO_LOG=info $COLORUN" ;; rev) pre="env COLO_LOG=info $OLDRUN" ;; esac
    out=$( { /usr/bin/time -f "T %e %U %S" bash "$WORK/one.sh" "$pre" ; } 2>&1 )
    read -r wall cpu < <(echo "$out" | awk '/^T /{print $2, $3 + $4}')
    good=1
    [ "$(echo "$out" | grep -c '^100000000$')" = 3 ] || good=0
    [ "$k" = tcp ] || [ "$(echo "$out" | grep -c 'plain TCP')" = 0 ] || good=0
    echo "$out" >"$WORK/round-$k-$r.out"
    echo "$k round $r: wall $wall s, cpu $cpu s$([ $good = 1 ] || echo ' (left out: a wrong size or plain TCP)')"
    [ $good = 1 ] && { WALL[$k]+="$wall "; CPU[$k]+="$cpu "; }
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR] = $1} END {print (NR ? a[int((NR + 1) / 2)] : "-")}'; }
for k in "${kinds[@]}"; do
  echo "$k: median wall $(echo "${WALL[$k]:-}" | median) s, cpu $(echo "${CPU[$k]:-}" | median) s ($(echo "${WALL[$k]:-}" | wc -w) rounds)"
done
