#!/bin/bash
# C against Rust, same cases, alternating: N rounds of `build/c/bench SECS CASE` (the round trip
# through libcolo) and `colo bench --only "64 B,CASE"` (the Rust API), each a separate pair of
# processes, then the median p50 of each and their ratio. Alternating rounds put both under the
# same mix of this VM's fast and slow vCPU placements.
#
#   tests/c/compare.sh [rounds] [seconds]      (after `make build` and `make -C tests/c bench`)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-7} secs=${2:-1}
median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
for case in "colo" "colo msg"; do
  c=() r=()
  for _ in $(seq "$rounds"); do
    c+=("$(build/c/bench "$secs" "$case")")
    # The Rust row of exactly this case (`--only` matches substrings: "colo" also names others).
    r+=("$(rust/target/release/colo bench --only "64 B,$case" --seconds "$secs" |
      awk -v c="$case" '$1 == "64" && $2 == "B" { n = $0; sub(/^ *64 B +/, "", n); split(n, f, /  +/); if (f[1] == c) { print f[2]; exit } }')")
    [[ -n ${r[-1]} && -n ${c[-1]} ]] || { echo "compare.sh: no result for \"$case\"" >&2; exit 1; }
  done
  cm=$(printf '%s\n' "${c[@]}" | median) rm=$(printf '%s\n' "${r[@]}" | median)
  printf '%-9s C p50 %s us (%s)   Rust p50 %s us (%s)   C/Rust %sx\n' "$case" "$cm" "${c[*]}" "$rm" "${r[*]}" \
    "$(awk -v a="$cm" -v b="$rm" 'BEGIN { printf "%.2f", a / b }')"
done
