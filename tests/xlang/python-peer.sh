#!/usr/bin/env bash
# The Python peer (rust/colo-py/tests/peer.py) for tests/xlang/run.sh. Uses $COLO_PYTHON, else
# build/venv/bin/python (scripts/test-c-py.sh installs the colo package there).
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY="${COLO_PYTHON:-$ROOT/build/venv/bin/python}"
if ! "$PY" -c 'import colo' 2>/dev/null; then
    echo "python peer: the colo package is not installed for $PY (run scripts/test-c-py.sh)" >&2
    exit 1
fi
exec "$PY" "$ROOT/rust/colo-py/tests/peer.py" "$@"
