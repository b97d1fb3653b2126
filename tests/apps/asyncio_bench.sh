#!/usr/bin/env bash
# Stdlib asyncio streams, bulk both ways on one connection (tests/apps/py/asyncio_bulk.py), a
# server and a client both under `colo run` against both plain, in ROUNDS (default 5)
# alternating rounds per case; prints each case's median MB/s and the ratio. Not in `make test`:
# a measurement.   tests/apps/asyncio_bench.sh [COLO]   (default rust/target/release/colo)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
COLO=${1:-$HERE/../../rust/target/release/colo}
ROUNDS=${ROUNDS:-5}
one() { # PREFIX MODE CHUNK MB: prints MB/s
  local out port sp
  out=$(mktemp)
  $1 /usr/bin/python3 "$HERE/py/asyncio_bulk.py" server >"$out" &
  sp=$!
  for _ in $(seq 100); do [ -s "$out" ] && break; sleep 0.05; done
  port=$(head -1 "$out")
  timeout 120 $1 /usr/bin/python3 "$HERE/py/asyncio_bulk.py" client "$port" "$2" "$3" "$4" || echo 0
  kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null || true
  rm -f "$out"
}
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
for c in "up 1024 50" "up 65536 200" "down 4096 200" "down 65536 200"; do
  read -r mode chunk mb <<<"$c"
  tcp=() colo=()
  for _ in $(seq "$ROUNDS"); do
    tcp+=("$(one "" "$mode" "$chunk" "$mb")")
    colo+=("$(one "$COLO run --" "$mode" "$chunk" "$mb")")
  done
  t=$(printf '%s\n' "${tcp[@]}" | median) k=$(printf '%s\n' "${colo[@]}" | median)
  echo "asyncio $mode, writes of $chunk B, $mb MiB: tcp $t MB/s, colo $k MB/s, colo/tcp $(python3 -c "print(f'{$k / max($t, 1):.2f}')")x"
done
