#!/usr/bin/env bash
# Interleaved A/B of the shim against an earlier revision, for effects smaller than this host's
# drift: `tests/apps/ab.sh REV [ROUNDS] [SECS]` builds REV's shim in a git worktree, then runs
# nginx (1 worker) with `wrk -c50 -H 'Connection: close'` in rounds of: both sides under this
# shim, both under REV's, the client alone under each, plain TCP; and prints each case's median
# against the mean of the TCP rounds around it. WORKERS, HDR ("" for keep-alive) adjust it.
source "$(dirname "$0")/common.sh"
REV=${1:?usage: tests/apps/ab.sh REV [ROUNDS] [SECS]}; ROUNDS=${2:-10}; SECS=${3:-2}
build
build_rev "$REV"
W=${WORKERS:-1}; HDR=${HDR-Connection: close}
A=$(free_port); start_nginx "$A" "$W" ""
B=$(free_port); start_nginx "$B" "$W" colo
NEWRUN=$COLORUN; COLORUN=$OLDRUN; C=$(free_port); start_nginx "$C" "$W" colo; COLORUN=$NEWRUN
w() { $2 wrk -t1 -c50 -d"$SECS" ${HDR:+-H "$HDR"} "http://127.0.0.1:$1/1k.txt" 2>/dev/null | awk '/Requests\/sec/ {print $2}'; }
prev=$(w "$A" ""); rows=""
for _ in $(seq "$ROUNDS"); do
  nb=$(w "$B" "$NEWRUN"); ob=$(w "$C" "$OLDRUN"); nc=$(w "$A" "$NEWRUN"); oc=$(w "$A" "$OLDRUN"); t=$(w "$A" "")
  rows="$rows $prev,$t,$nb,$ob,$nc,$oc"; prev=$t
done
python3 - "$REV" $rows <<'PY'
import statistics as st, sys
rev, rows = sys.argv[1], [[float(x) for x in a.split(',')] for a in sys.argv[2:]]
print(f"TCP median {st.median(r[1] for r in rows):.0f} requests/s, {len(rows)} rounds")
for k, name in enumerate(['both, this shim', f'both, {rev}', 'client alone, this shim', f'client alone, {rev}']):
    v = sorted(r[2 + k] / ((r[0] + r[1]) / 2) for r in rows)
    print(f"{name:28s} {st.median(v):.3f}x TCP (quartiles {v[len(v) // 4]:.3f}-{v[3 * len(v) // 4]:.3f})")
PY
