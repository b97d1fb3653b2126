#!/usr/bin/env bash
# Runs the Go package's checks: go vet and the whole test suite under the race detector.
# Needs only a Go toolchain; modules come from the Go module proxy (go.mod/go.sum are committed).
set -euo pipefail
cd "$(dirname "$0")"
go vet ./...
# Every test has its own watchdog; this bounds the whole run.
timeout 600 go test -race -count=1 -timeout 300s ./...
