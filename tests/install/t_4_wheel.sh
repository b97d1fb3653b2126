# `make wheel`: the built wheel, installed with pip into a fresh venv, gives `import colo` (two
# processes connect over shared memory) and the `colo` command, whose `colo run -- python3 -c ...`
# is accelerated. Sourced by run.sh. maturin: $MATURIN, or build/venv's (make test-c-py), or pip.
WV=$WORK/wheel
MATURIN=${MATURIN:-$ROOT/build/venv/bin/maturin}
if [ ! -x "$MATURIN" ]; then
  python3 -m venv "$WV/tools" && "$WV/tools/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" && MATURIN=$WV/tools/bin/maturin
fi
rm -rf "$ROOT/build/wheels"
check "make wheel" sh -c "make -s -C '$ROOT' wheel MATURIN='$MATURIN' >'$WORK/wheel.out' 2>&1" || tail -n 20 "$WORK/wheel.out"
WHL=$(ls "$ROOT"/build/wheels/colo-*.whl 2>/dev/null | head -n 1)
check "the wheel is tagged manylinux: $(basename "${WHL:-none}")" sh -c "echo '$WHL' | grep -q 'manylinux_2_[0-9]*_$(uname -m)\.whl\$'"
check "a fresh venv" python3 -m venv "$WV/venv"
check "pip install the wheel" "$WV/venv/bin/pip" install -q --disable-pip-version-check --no-index "$WHL"
mkdir -p "$WV/fresh" && chmod 755 "$WV" "$WV/fresh"
VPY=$WV/venv/bin/python
cat >"$WV/fresh/server.py" <<'PY'
import colo, sys
with colo.listen("127.0.0.1:0") as ln:
    print(ln.getsockname()[1], flush=True)
    c, _ = ln.accept()
    data = c.recv(100)
    c.sendall(data.upper() + b" " + c.transport.encode())
    c.close()
PY
P=$(cd "$WV/fresh" && "$VPY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(cd "$WV/fresh" && exec timeout 30 "$VPY" server.py >"$WV/server.out" 2>&1) &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WV/server.out" ] && break; sleep 0.05; done
SP=$(head -n 1 "$WV/server.out")
out=$(cd "$WV/fresh" && timeout 30 "$VPY" -c "
import colo
c = colo.connect(('127.0.0.1', $SP))
c.sendall(b'hi')
print(c.recv(100).decode(), c.transport)" 2>&1)
check "import colo in two processes: echoed over shared memory ($out)" test "$out" = "HI colo colo"
# The colo command from the venv's scripts directory; its redis server and a Python client.
check "the venv has the colo command" test -x "$WV/venv/bin/colo"
(cd "$WV/fresh" && exec env -u COLO_PRELOAD COLO_LOG=info "$WV/venv/bin/colo" run -- redis-server --port "$P" --save '' \
  --appendonly no --dir "$WV/fresh" >"$WORK/wheel-redis.log" 2>&1) &
PIDS+=($!); wait_port "$P"
out=$(cd "$WV/fresh" && timeout 10 env -u COLO_PRELOAD COLO_LOG=debug "$WV/venv/bin/colo" run -- python3 -c "
import socket
s = socket.create_connection(('127.0.0.1', $P))
s.sendall(b'PING\r\n')
print(s.recv(100).decode().strip())" 2>"$WORK/wheel-cli.err")
check "venv colo run -- python3 (a socket client): +PONG" test "$out" = "+PONG"
check "the Python client was accelerated" grep -q "connect 127.0.0.1:$P: accelerated (shared memory)" "$WORK/wheel-cli.err"
check "with the shim the binary carries" grep -qE "colo run: shim /tmp/colo-$(id -u)/libcolo_preload-[0-9a-f]{16}\.so" "$WORK/wheel-cli.err"
