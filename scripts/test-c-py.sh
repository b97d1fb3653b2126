#!/usr/bin/env bash
# Builds and tests colo's C ABI and Python package:
#   1. libcolo (cargo, release) and the Rust test peer
#   2. the C tests, example and peer (make -C tests/c), run under AddressSanitizer
#   3. a venv in build/venv with maturin and pytest from PyPI; the colo package (maturin develop)
#   4. pytest rust/colo-py/tests (real separate processes)
#   5. the cross-language matrix tests/xlang/run.sh with the C and Python peers added
# Needs: rustup Rust, Python >= 3.9 with venv and pip, gcc, make, pkg-config; Go is optional (the
# matrix includes the Go peer when `go` is on PATH). Set PYTHON to choose the interpreter.
# Exits non-zero if any stage fails; every stage runs regardless. SKIP_XLANG=1 leaves out stage 5
# (for a caller that runs tests/xlang/run.sh itself; then pass
# COLO_PEERS="python=tests/xlang/python-peer.sh" to it for the Python peer).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
VENV="$ROOT/build/venv"
passed=0
failed=0
FAILED=()

stage() {
    local name=$1
    shift
    echo "=== $name"
    local t0=$SECONDS
    if "$@"; then
        passed=$((passed + 1))
        echo "=== $name: ok ($((SECONDS - t0)) s)"
    else
        failed=$((failed + 1))
        FAILED+=("$name")
        echo "=== $name: FAILED ($((SECONDS - t0)) s)"
    fi
}

build_rust() {
    (cd rust && cargo build --release -p colo-ffi && cargo build --release -p colo --example peer)
}

c_tests() {
    # The checked-in header must match the Rust source (.ci/run installs cbindgen).
    command -v cbindgen >/dev/null 2>&1 || { echo "the colo.h check needs cbindgen: cargo install cbindgen --locked"; return 1; }
    (cd rust/colo-ffi && cbindgen --quiet --config cbindgen.toml --crate colo-ffi --output "$ROOT/build/colo.h.check") &&
        diff -u rust/colo-ffi/include/colo.h "$ROOT/build/colo.h.check" || { echo "colo.h is stale: make -C tests/c header"; return 1; }
    make -C tests/c -j"$(nproc)" all && timeout 300 make -C tests/c test
}

python_env() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV" || return 1
    fi
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.5,<2" "pytest>=7" || return 1
    (cd rust/colo-py && VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" maturin develop --release -q) || return 1
    "$VENV/bin/python" -c 'import colo; print("colo", colo.__version__, "from", colo.__file__)'
}

pytests() {
    timeout 600 "$VENV/bin/python" -m pytest -q -p no:cacheprovider rust/colo-py/tests
}

matrix() {
    COLO_PEERS="python=$ROOT/tests/xlang/python-peer.sh ${COLO_PEERS:-}" timeout 1200 bash tests/xlang/run.sh
}

stage "build: libcolo and the Rust peer" build_rust
stage "C tests (ASan)" c_tests
stage "Python package (venv, maturin)" python_env
stage "pytest" pytests
if [ "${SKIP_XLANG:-0}" != 1 ]; then
    stage "cross-language matrix" matrix
fi

echo "test-c-py: $passed passed, $failed failed"
for f in "${FAILED[@]}"; do echo "  failed: $f"; done
[ "$failed" -eq 0 ]
