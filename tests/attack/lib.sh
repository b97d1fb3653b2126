# Shared helpers for tests/attack/t_*.sh (sourced after ../apps/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../apps/common.sh"
FAIL=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAIL=1; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
# as_nobody CMD...: runs CMD as the unprivileged user nobody:nogroup, with no supplementary groups.
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
COLO=$TARGET/release/colo
PEER=$TARGET/release/examples/peer
finish() { exit "$FAIL"; }
