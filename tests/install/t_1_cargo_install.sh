# `cargo install --path rust/colo-cli`: the installed colo alone, in an empty directory, runs a
# redis server and client accelerated with no COLO_PRELOAD and no shim on disk beside it.
# Sourced by run.sh. Shares the tree's target directory, so only what differs is rebuilt.
INST=$WORK/cargo-root
check "cargo install --locked --path rust/colo-cli" timeout 900 env CARGO_TARGET_DIR="$TARGET" \
  cargo install --quiet --locked --path "$ROOT/rust/colo-cli" --root "$INST"
check "the installed copy is alone in its bin directory" test "$(ls "$INST/bin")" = colo
FRESH=$WORK/fresh; mkdir -p "$FRESH"; chmod 755 "$WORK" "$INST" "$INST/bin" "$FRESH"
P=$(free_port)
(cd "$FRESH" && exec env -u COLO_PRELOAD COLO_LOG=info "$INST/bin/colo" run -- \
  redis-server --port "$P" --save '' --appendonly no --dir "$FRESH" >"$WORK/ci-redis.log" 2>&1) &
PIDS+=($!); wait_port "$P"
out=$(cd "$FRESH" && timeout 10 env -u COLO_PRELOAD COLO_LOG=debug "$INST/bin/colo" run -- redis-cli -p "$P" ping 2>"$WORK/ci-cli.err")
check "installed colo run -- redis-cli ping answers PONG" test "$out" = PONG
check "the client was accelerated" grep -q "connect 127.0.0.1:$P: accelerated (shared memory)" "$WORK/ci-cli.err"
check "the client's shim is the embedded copy in the per-user cache" \
  grep -qE "colo run: shim /tmp/colo-$(id -u)/libcolo_preload-[0-9a-f]{16}\.so" "$WORK/ci-cli.err"
check "the server accepted accelerated" grep -q ": accelerated (shared memory)" "$WORK/ci-redis.log"
if [ "$(id -u)" = 0 ]; then
  # Another user gets its own cache directory, 0755 and owned by it, the file read-only.
  out=$(cd "$FRESH" && timeout 10 setpriv --reuid=nobody --regid=nogroup --clear-groups \
    env -u COLO_PRELOAD HOME=/nonexistent COLO_LOG=debug "$INST/bin/colo" run -- redis-cli -p "$P" ping 2>"$WORK/ci-nobody.err")
  check "as nobody: PONG" test "$out" = PONG
  check "as nobody: accelerated" grep -q "connect 127.0.0.1:$P: accelerated (shared memory)" "$WORK/ci-nobody.err"
  d=/tmp/colo-$(id -u nobody)
  check "as nobody: $d is nobody's, 0755, the shim 0444" sh -c \
    "test \"\$(stat -c %U:%a $d)\" = nobody:755 && stat -c %U:%a $d/libcolo_preload-*.so | grep -qx nobody:444"
fi
# COLO_PRELOAD still names the shim.
out=$(cd "$FRESH" && timeout 10 env COLO_PRELOAD="$TARGET/release/libcolo_preload.so" COLO_LOG=debug "$INST/bin/colo" run -- redis-cli -p "$P" ping 2>"$WORK/ci-env.err")
check "COLO_PRELOAD overrides the carried shim" sh -c "test '$out' = PONG && grep -q 'colo run: shim $(readlink -f "$TARGET/release/libcolo_preload.so")\$' '$WORK/ci-env.err'"
if [ "$(id -u)" = 0 ]; then
  # A /tmp/colo-<uid> that someone else owns is refused; the next candidate (~/.cache/colo) is used.
  d=/tmp/colo-$(id -u nobody); saved=
  [ -e "$d" ] && { saved=$WORK/saved-nobody-cache; mv "$d" "$saved"; }
  mkdir -m 755 "$d"   # root's, in nobody's name
  mkdir -p "$WORK/nobody-home" && chown nobody "$WORK/nobody-home"
  out=$(cd "$FRESH" && timeout 10 setpriv --reuid=nobody --regid=nogroup --clear-groups \
    env -u COLO_PRELOAD -u XDG_RUNTIME_DIR -u XDG_CACHE_HOME HOME="$WORK/nobody-home" COLO_LOG=debug \
    "$INST/bin/colo" run -- redis-cli -p "$P" ping 2>"$WORK/ci-squat.err")
  check "a squatted /tmp/colo-<uid> is refused for ~/.cache/colo; still PONG, accelerated" sh -c "test '$out' = PONG &&
    grep -qE 'colo run: shim $WORK/nobody-home/.cache/colo/libcolo_preload-[0-9a-f]{16}\.so' '$WORK/ci-squat.err' &&
    grep -q 'connect 127.0.0.1:$P: accelerated' '$WORK/ci-squat.err' && test -z \"\$(ls -A '$d')\""
  rmdir "$d"; [ -n "$saved" ] && mv "$saved" "$d"
fi
