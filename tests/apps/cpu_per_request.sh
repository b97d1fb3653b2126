#!/usr/bin/env bash
# CPU time per request, which this host's drift between placements disturbs far less than
# requests per second: nginx (WORKERS, default 1) serving 1 KiB with wrk -c50
# `Connection: close` (HDR="" for keep-alive), in ROUNDS (default 8) alternating 2 s rounds of
# plain TCP and of both sides under `colo run`. Prints the medians of the client's (wrk: user +
# system) and the server's (nginx, all processes) CPU microseconds per request, and their ratio.
# `tests/apps/cpu_per_request.sh REV` adds a third server and client under REV's shim, built in a
# git worktree (common.sh's build_rev), to the same rounds.
source "$(dirname "$0")/common.sh"
build
REV=${1:-}
W=${WORKERS:-1}; HDR=${HDR-Connection: close}
A=$(free_port); start_nginx "$A" "$W" ""
B=$(free_port); start_nginx "$B" "$W" colo
if [ -n "$REV" ]; then
  build_rev "$REV"
  NEWRUN=$COLORUN; COLORUN=$OLDRUN; C=$(free_port); start_nginx "$C" "$W" colo; COLORUN=$NEWRUN
fi
TICK=$(getconf CLK_TCK)
server_ticks() { # $1 port: utime + stime of its nginx master and workers
  local master t=0 p
  master=$(pgrep -f "ngx$1/nginx.conf" | head -1)
  for p in $master $(pgrep -P "$master"); do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}
round() { # $1 port, $2 prefix: prints "client_us server_us" per request
  local s0 s1 out
  s0=$(server_ticks "$1")
  out=$( { /usr/bin/time -f "CPU %U %S" $2 wrk -t1 -c50 -d2 ${HDR:+-H "$HDR"} "http://127.0.0.1:$1/1k.txt"; } 2>&1 )
  s1=$(server_ticks "$1")
  python3 -c "
import re, sys
out = sys.argv[1]
n = int(re.search(r'(\d+) requests in', out).group(1))
u, s = map(float, re.search(r'CPU ([\d.]+) ([\d.]+)', out).groups())
print(f'{(u + s) * 1e6 / n:.2f},{($s1 - $s0) / $TICK * 1e6 / n:.2f}')" "$out"
}
rows=""
for _ in $(seq "${ROUNDS:-8}"); do
  row="$(round "$A" ""):$(round "$B" "$COLORUN")"
  [ -n "$REV" ] && row="$row:$(round "$C" "$OLDRUN")"
  rows="$rows $row"
done
python3 - "$W" "$REV" $rows <<'PY'
import statistics as st, sys
w, rev, rows = sys.argv[1], sys.argv[2], [[list(map(float, side.split(','))) for side in r.split(':')] for r in sys.argv[3:]]
med = lambda xs: st.median(xs)
cols = [(1, 'colo')] + ([(2, rev)] if rev else [])
for i, name in enumerate(['client (wrk)', f'server (nginx, {w} worker(s))', 'both']):
    part = (lambda side: side[0] + side[1]) if i == 2 else (lambda side, i=i: side[i])
    line = f"{name:30s} tcp {med(part(r[0]) for r in rows):7.2f} us/request"
    for j, label in cols:
        line += f"  {label} {med(part(r[j]) for r in rows):7.2f} ({med(part(r[j]) / part(r[0]) for r in rows):.3f}x)"
    print(line)
print(f"({len(rows)} alternating rounds; each ratio is the median of the rounds' ratios)")
PY
