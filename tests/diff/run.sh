#!/usr/bin/env bash
# The differential suite: every scenario program here (*.c) runs on plain TCP and with both ends
# under `colo run`, and the two transcripts are compared scenario by scenario. A scenario whose
# transcripts differ fails the suite unless allowlist.txt names it (each entry with its reason,
# mirrored in docs/LIMITS.md). The colo run must be accelerated: the shim's log
# (COLO_LOG=info) must name, for each connection the program says it made, an accelerated connect
# and an accelerated accept. `tests/diff/run.sh [NAME.c ...]` runs some programs only.
# solo/*.c check what colo keeps and kernel TCP does not always (two processes writing to one
# connection: a TCP send that waits for buffer space lets another writer in): they run under
# `colo run` only, and their transcript must equal solo/NAME.expect.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/rust/target}
COLORUN="$TARGET/release/examples/colo-run --"
(cd "$ROOT/rust" && cargo build --release -q -p colo-preload && cargo build --release -q -p colo-run --example colo-run) || exit 1
WORK=$(mktemp -d /tmp/colo-diff.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$HERE"
progs=("$@")
[ ${#progs[@]} -eq 0 ] && progs=(*.c solo/*.c)
fail=0
# accelerated NAME: the shim's log names an accelerated connect and accept per connection made.
accelerated() {
  local name=$1 made dialed accepted
  made=$(awk '/^connections / {print $2}' "$WORK/$name.colo")
  dialed=$(grep -c 'connect .*: accelerated (shared memory)' "$WORK/$name.log")
  accepted=$(grep -c 'accept .*: accelerated (shared memory)' "$WORK/$name.log")
  if [ -z "$made" ] || [ "$dialed" != "$made" ] || [ "$accepted" != "$made" ]; then
    echo "FAIL $name: ${made:-?} connections made, $dialed connects and $accepted accepts accelerated"
    sed 's/^/  log: /' "$WORK/$name.log" | grep -v 'accelerated (shared memory)\|serving colo offers' | head -20
    return 1
  fi
}
for src in "${progs[@]}"; do
  name=$(basename "$src" .c)
  case $src in solo/*) solo=1 ;; *) solo=0 ;; esac
  gcc -O1 -Wall -Werror -pthread -o "$WORK/$name" "$HERE/$src" || { echo "FAIL $name: does not compile"; fail=1; continue; }
  if [ $solo = 1 ]; then
    COLO_LOG=info COLO_SHORT_LIVED=accelerate timeout 300 $COLORUN "$WORK/$name" >"$WORK/$name.colo" 2>"$WORK/$name.log"
    accelerated "$name" || fail=1
    if diff "$HERE/solo/$name.expect" "$WORK/$name.colo" >"$WORK/$name.diff"; then echo "ok   $name (colo only)"
    else echo "FAIL $name: under colo, not what solo/$name.expect says:"; sed 's/^/    /' "$WORK/$name.diff"; fail=1; fi
    continue
  fi
  # Each scenario has its own watchdog (alarm); this one bounds the whole program.
  timeout 300 "$WORK/$name" >"$WORK/$name.plain" 2>"$WORK/$name.plain.err"
  COLO_LOG=info COLO_SHORT_LIVED=accelerate timeout 300 $COLORUN "$WORK/$name" >"$WORK/$name.colo" 2>"$WORK/$name.log"
  accelerated "$name" || fail=1
  # A scenario that could not set itself up on plain TCP (no port free: `DIED listen`) shows
  # nothing, and its colo run dies the same way: that is no pass.
  if grep -q '^  DIED ' "$WORK/$name.plain"; then
    echo "FAIL $name: a scenario died on plain TCP:"; grep -B1 '^  DIED ' "$WORK/$name.plain" | sed 's/^/    /'; fail=1
  fi
  python3 - "$name" "$WORK/$name.plain" "$WORK/$name.colo" "$HERE/allowlist.txt" <<'PY' || fail=1
import sys
name, plain, colo, allow = sys.argv[1:]
def blocks(path):
    out, cur = {}, None
    for line in open(path):
        line = line.rstrip('\n')
        if line.startswith('== '):
            cur = line[3:]
            out[cur] = []
        elif cur is not None:
            out[cur].append(line)
    return out
allowed = set()
for line in open(allow):
    line = line.split('#', 1)[0].split()
    if line:
        allowed.add((line[0], line[1]))
p, c = blocks(plain), blocks(colo)
bad = 0
for sc in p:
    if p[sc] == c.get(sc):
        if (name, sc) in allowed:
            print(f"note {name} {sc}: allowlisted but now equal (remove it from allowlist.txt)")
        continue
    tag = "allowed" if (name, sc) in allowed else "FAIL"
    print(f"{tag} {name} {sc}: plain TCP and colo differ")
    for a, b in zip(p[sc] + [''] * 99, (c.get(sc) or []) + [''] * 99):
        if a == '' and b == '':
            break
        print(f"    {'  ' if a == b else '!='} {a:50s} | {b}")
    bad += tag == "FAIL"
for sc in c:
    if sc not in p:
        print(f"FAIL {name} {sc}: only under colo"); bad += 1
if bad == 0:
    print(f"ok   {name}: {len(p)} scenarios")
sys.exit(1 if bad else 0)
PY
done
[ $fail -eq 0 ] && echo "differential suite passed" || echo "differential suite FAILED"
exit $fail
