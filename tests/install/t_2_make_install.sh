# `make install PREFIX=... DESTDIR=...` and `make uninstall`: the files land under DESTDIR+PREFIX
# and colo.pc names PREFIX; a C program built with `pkg-config --cflags --libs colo` alone runs
# against the installed copy; the installed colo runs accelerated; uninstall leaves nothing.
# Sourced by run.sh.
MI=$WORK/mi; PFX=$WORK/prefix
check "make install DESTDIR" make -s -C "$ROOT" install DESTDIR="$MI/stage" PREFIX=/opt/colo >/dev/null
for f in bin/colo lib/colo/libcolo_preload.so lib/libcolo.so.0 lib/libcolo.so lib/libcolo.a include/colo.h \
         lib/pkgconfig/colo.pc share/doc/colo/README.md share/doc/colo/LICENSE-MIT share/doc/colo/colo-help.txt; do
  check "DESTDIR holds /opt/colo/$f" test -e "$MI/stage/opt/colo/$f"
done
check "colo.pc names PREFIX, not DESTDIR" sh -c "grep -qx 'prefix=/opt/colo' '$MI/stage/opt/colo/lib/pkgconfig/colo.pc' &&
  ! grep -q '$MI' '$MI/stage/opt/colo/lib/pkgconfig/colo.pc'"
check "make uninstall DESTDIR leaves no files" sh -c "make -s -C '$ROOT' uninstall DESTDIR='$MI/stage' PREFIX=/opt/colo >/dev/null &&
  test -z \"\$(find '$MI/stage' -type f -o -type l)\""

check "make install PREFIX" make -s -C "$ROOT" install PREFIX="$PFX" >/dev/null
export PKG_CONFIG_PATH=$PFX/lib/pkgconfig
check "pkg-config: colo version is the workspace's" test "$(pkg-config --modversion colo)" = \
  "$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/rust/Cargo.toml" | head -n 1)"
check "libcolo.so exports only colo_* (its symbol map), soname libcolo.so.0" sh -c "
  test -z \"\$(nm -D --defined-only '$PFX/lib/libcolo.so.0' | awk '\$2 ~ /^[TDBRV]\$/ && \$3 !~ /^colo_/')\" &&
  objdump -p '$PFX/lib/libcolo.so.0' | grep -q 'SONAME *libcolo.so.0'"
mkdir -p "$MI/c" && cp "$ROOT/examples/c/echo.c" "$MI/c/"
check "cc echo.c \$(pkg-config --cflags --libs colo)" sh -c \
  "cd '$MI/c' && cc -o echo echo.c \$(pkg-config --cflags --libs colo) -lpthread"
(cd "$MI/c" && LD_LIBRARY_PATH=$PFX/lib timeout 30 ./echo >"$WORK/mi-echo.out" 2>&1)
check "the C echo program runs against the installed libcolo, over shared memory" sh -c "
  grep -qx 'stream echo: hello from C (over shared memory)' '$WORK/mi-echo.out' &&
  grep -qx 'message echo: hello from C' '$WORK/mi-echo.out'"
check "it loaded the installed copy" sh -c "LD_LIBRARY_PATH='$PFX/lib' ldd '$MI/c/echo' | grep -q '$PFX/lib/libcolo.so.0'"
unset PKG_CONFIG_PATH
P=$(free_port)
(cd "$MI" && exec env COLO_LOG=info "$PFX/bin/colo" run -- redis-server --port "$P" --save '' --appendonly no --dir "$MI" >"$WORK/mi-redis.log" 2>&1) &
PIDS+=($!); wait_port "$P"
out=$(cd "$MI" && timeout 10 env COLO_LOG=debug "$PFX/bin/colo" run -- redis-cli -p "$P" ping 2>"$WORK/mi-cli.err")
check "installed colo run -- redis-cli ping: PONG, accelerated" sh -c "test '$out' = PONG && grep -q 'connect 127.0.0.1:$P: accelerated' '$WORK/mi-cli.err'"
check "it preloaded the installed shim" grep -q "colo run: shim $PFX/lib/colo/libcolo_preload.so" "$WORK/mi-cli.err"
check "make uninstall PREFIX leaves no files" sh -c "make -s -C '$ROOT' uninstall PREFIX='$PFX' >/dev/null &&
  test -z \"\$(find '$PFX' -type f -o -type l)\""
