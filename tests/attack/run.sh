#!/usr/bin/env bash
# The adversarial suite: an unprivileged local user (nobody, through setpriv) attacks root's colo
# servers and clients, one script per attack class (t_*.sh). Each script prints "ok ..." or
# "FAIL ..." lines and exits non-zero on any failure; every step has a timeout.
# Needs root (to run the attacker as another user): without it the suite fails, it never skips.
source "$(dirname "$0")/../apps/common.sh"
if [ "$(id -u)" != 0 ]; then
  echo "FAIL tests/attack needs root: it runs attackers as nobody against root's servers"
  exit 1
fi
build
(cd "$ROOT/rust" && cargo build --release -q -p colo-cli && cargo build --release -q -p colo --example peer) || exit 1
FAIL=0
for t in "$HERE"/t_*.sh; do
  [ -e "$t" ] || continue
  echo "=== $(basename "$t")"
  started=$SECONDS
  timeout 300 bash "$t" || { echo "FAIL $(basename "$t")"; FAIL=1; }
  echo "=== $(basename "$t"): $((SECONDS - started)) s"
done
[ "$FAIL" = 0 ] && echo "attack suite: all passed"
exit "$FAIL"
