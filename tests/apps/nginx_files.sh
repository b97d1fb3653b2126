#!/usr/bin/env bash
# nginx serving static files (sendfile on) in its usual deployment: the master as root, one worker
# as USER_AS (default nobody: `user nobody nogroup;`, a client of another user than its server;
# root: the same user). `ab -k -c 20 -n N` (default 20000; fewer for files above 100 KB, N x
# 100 KB in all) of each size in SIZES (default 10k 100k 1m), in ROUNDS (default 5) alternating
# rounds of plain TCP and of both sides under `colo run`. Prints
# for each the medians of the client's CPU seconds (ab: user + system), the worker's, and the
# requests per second, and colo's requests per second over TCP's.
# `tests/apps/nginx_files.sh REV` adds a server and client under REV's shim (common.sh's build_rev)
# to the same rounds.
source "$(dirname "$0")/common.sh"
build
need nginx && need ab || exit 1
REV=${1:-}; USR=${USER_AS:-nobody}; N=${N:-20000}; ROUNDS=${ROUNDS:-5}; SIZES=${SIZES:-10k 100k 1m}
mkdir -p "$WORK/www"
declare -A REQS
for s in $SIZES; do
  b=$(numfmt --from=si "${s^^}"); head -c "$b" /dev/urandom >"$WORK/www/$s"
  REQS[$s]=$(( b > 100000 ? N * 100000 / b : N ))
done
chmod -R a+rX "$WORK"
start_files() { # $1 port, $2 the colo-run prefix ("" for plain TCP)
  local d=$WORK/files$1 grp=root
  [ "$USR" = nobody ] && grp=nogroup
  mkdir -p "$d/logs"; chmod 777 "$d"
  cat >"$d/nginx.conf" <<NGX
user $USR $grp;
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
events { worker_connections 1024; }
http { access_log off; sendfile on; client_body_temp_path $d/cb; proxy_temp_path $d/pt;
  fastcgi_temp_path $d/ft; uwsgi_temp_path $d/ut; scgi_temp_path $d/st;
  server { listen 127.0.0.1:$1; root $WORK/www; } }
NGX
  $2 nginx -c "$d/nginx.conf" -p "$d" >"$d/out.log" 2>&1 &
  PIDS+=($!); wait_port "$1"
}
worker_of() { pgrep -f "nginx: worker" -P "$(pgrep -f "files$1/nginx.conf" | head -1)" | head -1; }
TICK=$(getconf CLK_TCK)
NAMES=(tcp colo); RUNS=("" "$COLORUN")
if [ -n "$REV" ]; then build_rev "$REV"; NAMES+=("$REV"); RUNS+=("$OLDRUN"); fi
PORTS=()
for i in "${!NAMES[@]}"; do p=$(free_port); start_files "$p" "${RUNS[$i]}"; PORTS+=("$p"); done
for i in "${!NAMES[@]}"; do w=$(worker_of "${PORTS[$i]}"); [ -n "$w" ] || { echo "no worker for ${NAMES[$i]}"; exit 1; }; done
OUT=$WORK/rounds
for _ in $(seq "$ROUNDS"); do
  for s in $SIZES; do
    for i in "${!NAMES[@]}"; do
      w=$(worker_of "${PORTS[$i]}"); w0=$(awk '{print $14 + $15}' "/proc/$w/stat")
      out=$( { /usr/bin/time -f "CPU %U %S" ${RUNS[$i]} ab -q -k -c 20 -n "${REQS[$s]}" "http://127.0.0.1:${PORTS[$i]}/$s"; } 2>&1 )
      w1=$(awk '{print $14 + $15}' "/proc/$w/stat")
      echo "$out" | awk -v k="$s ${NAMES[$i]}" -v w=$((w1 - w0)) -v t="$TICK" \
        '/^CPU/ {c = $2 + $3} /^Requests per second/ {r = $4} /^Failed requests/ {f = $3}
         END {print k, c, w / t, r, f}' >>"$OUT"
    done
  done
done
python3 - "$OUT" "$SIZES" "${NAMES[@]}" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
sizes, names = sys.argv[2].split(), sys.argv[3:]
failed = sum(int(r[5]) for r in rows)
for s in sizes:
    med = {n: [st.median(float(r[i]) for r in rows if r[0] == s and r[1] == n) for i in (2, 3, 4)] for n in names}
    for n in names:
        c, w, r = med[n]
        print(f"{s:>5} {n:>12}  client {c:.3f} s  worker {w:.3f} s  {r:9.0f} req/s  {r / med['tcp'][2]:.2f}x TCP")
print(f"failed requests: {failed}")
PY
