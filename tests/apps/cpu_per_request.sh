#!/usr/bin/env bash
# CPU time per request, which this host's drift between placements disturbs far less than
# requests per second: nginx (WORKERS, default 1) serving 1 KiB with wrk -c50
# `Connection: close` (HDR="" for keep-alive), in ROUNDS (default 8) alternating 2 s rounds of
# plain TCP and of both sides under `colo run`. Prints the medians of the client's (wrk: user +
# system) and the server's (nginx, all processes) CPU microseconds per request, and their ratio.
source "$(dirname "$0")/common.sh"
build
W=${WORKERS:-1}; HDR=${HDR-Connection: close}
A=$(free_port); start_nginx "$A" "$W" ""
B=$(free_port); start_nginx "$B" "$W" colo
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
for _ in $(seq "${ROUNDS:-8}"); do rows="$rows $(round "$A" ""):$(round "$B" "$COLORUN")"; done
python3 - "$W" $rows <<'PY'
import statistics as st, sys
w, rows = sys.argv[1], [[list(map(float, side.split(','))) for side in r.split(':')] for r in sys.argv[2:]]
med = lambda xs: st.median(xs)
for i, name in enumerate(['client (wrk)', f'server (nginx, {w} worker(s))']):
    t, c = med(r[0][i] for r in rows), med(r[1][i] for r in rows)
    print(f"{name:26s} tcp {t:7.2f} us/request  colo {c:7.2f}  ratio {c / t:.3f}")
t, c = med(r[0][0] + r[0][1] for r in rows), med(r[1][0] + r[1][1] for r in rows)
print(f"{'both':26s} tcp {t:7.2f} us/request  colo {c:7.2f}  ratio {c / t:.3f}  ({len(rows)} alternating rounds)")
PY
