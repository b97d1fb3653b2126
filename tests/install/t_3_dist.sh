# `make dist`: the tarball, unpacked in an empty directory, holds what it promises, needs no more
# than glibc (and libgcc_s, in every Debian's base), and runs `colo bench --quick` and an
# accelerated `colo run -- redis-cli ping` with a bare environment; its colo.pc is relocatable.
# Sourced by run.sh.
DU=$WORK/dist
check "make dist" sh -c "make -s -C '$ROOT' dist >'$WORK/dist.out' 2>&1"
TGZ=$(tail -n 1 "$WORK/dist.out"); case $TGZ in /*) ;; *) TGZ=$ROOT/$TGZ ;; esac
VER=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/rust/Cargo.toml" | head -n 1)
check "the tarball is named for the version: $(basename "$TGZ")" test "$(basename "$TGZ")" = "colo-$VER-$(uname -m)-linux.tar.gz"
mkdir -p "$DU" && chmod 755 "$DU" && tar -C "$DU" -xzf "$TGZ"
D=$DU/colo-$VER-$(uname -m)-linux
for f in bin/colo lib/colo/libcolo_preload.so lib/libcolo.so.0 lib/libcolo.so lib/libcolo.a include/colo.h \
         lib/pkgconfig/colo.pc README.md LICENSE-MIT LICENSE-APACHE share/doc/colo/colo-help.txt; do
  check "the tarball holds $f" test -e "$D/$f"
done
needs_only_glibc() {
  local f bad=0
  for f in "$D/bin/colo" "$D/lib/colo/libcolo_preload.so" "$D/lib/libcolo.so.0"; do
    [ -f "$f" ] || { echo "$f is missing"; return 1; }
    for n in $(objdump -p "$f" | awk '$1 == "NEEDED" {print $2}'); do
      case $n in libc.so.6|libm.so.6|libgcc_s.so.1|ld-linux*.so.*|libpthread.so.0|libdl.so.2|librt.so.1|libutil.so.1) ;;
        *) echo "$f needs $n"; bad=1 ;; esac
    done
  done
  echo "newest glibc symbol version used: $(objdump -T "$D/bin/colo" "$D/lib/colo/libcolo_preload.so" "$D/lib/libcolo.so.0" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -n 1)"
  return $bad
}
check "the binaries need only glibc and libgcc_s" needs_only_glibc
BARE="env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=$DU"
check "colo --version names $VER" sh -c "cd '$DU' && $BARE '$D/bin/colo' --version | grep -q ' $VER\$'"
check "colo bench --quick" sh -c "cd '$DU' && timeout 300 $BARE '$D/bin/colo' bench --quick >'$WORK/dist-bench.out' 2>&1 &&
  grep -q colo '$WORK/dist-bench.out'"
P=$(free_port)
(cd "$DU" && exec $BARE COLO_LOG=info "$D/bin/colo" run -- redis-server --port "$P" --save '' --appendonly no --dir "$DU" >"$WORK/dist-redis.log" 2>&1) &
PIDS+=($!); wait_port "$P"
out=$(cd "$DU" && timeout 10 $BARE COLO_LOG=debug "$D/bin/colo" run -- redis-cli -p "$P" ping 2>"$WORK/dist-cli.err")
check "tarball colo run -- redis-cli ping: PONG" test "$out" = PONG
check "the client was accelerated" grep -q "connect 127.0.0.1:$P: accelerated (shared memory)" "$WORK/dist-cli.err"
check "the server accepted accelerated" grep -q ": accelerated (shared memory)" "$WORK/dist-redis.log"
mkdir -p "$DU/c" && cp "$ROOT/examples/c/echo.c" "$DU/c/"
check "the relocated colo.pc builds and runs the C echo program" sh -c "cd '$DU/c' &&
  cc -o echo echo.c \$(PKG_CONFIG_PATH='$D/lib/pkgconfig' pkg-config --cflags --libs colo) -lpthread &&
  LD_LIBRARY_PATH='$D/lib' timeout 30 ./echo | grep -qx 'stream echo: hello from C (over shared memory)'"
