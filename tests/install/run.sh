#!/usr/bin/env bash
# The ways a user installs colo, each from its result alone in a fresh directory: `cargo install`
# (the colo binary carries its shim), `make install` (C through pkg-config only), `make dist` (the
# tarball), `make wheel` (pip into a fresh venv), the Go module (go get through a module proxy), and
# README.md's examples as written there, with its Go and Rust lines (t_6_readme.sh).
# Each check has a timeout; any failure exits 1. As root, clients also run as `nobody`.
# Usage: tests/install/run.sh [t_N_name.sh ...]   (all by default)
source "$(dirname "$0")/../apps/common.sh"
FAIL=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAIL=1; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
unset COLO_PRELOAD
# Arguments: the t_*.sh scripts to run (all by default).
[ $# -gt 0 ] && set -- "${@/#/$HERE/}" || set -- "$HERE"/t_*.sh
for t in "$@"; do
  source "$t"
done
[ $FAIL = 0 ] && echo "install: all passed" || echo "install: FAILED"
exit $FAIL
