#!/usr/bin/env bash
# Red team: `colo run` trusts its cached copy of the embedded shim (/tmp/colo-<uid>/
# libcolo_preload-<hash>.so) by the directory's and the file's owner and mode and the file's
# length, without reading it. A victim (a uid of its own, VIC) leaves its cache directory
# writable by everyone for a while; nobody renames over the cached copy a library of its own,
# padded to the right length, read-only, whose constructor records its effective uid. Once the
# directory is closed again, VIC's `colo run -- true` must not load it: the copy is replaced by
# VIC's own (VIC's, 0444, the bytes `colo` wrote first).
source "$(dirname "$0")/lib.sh"
VIC=4242
while getent passwd "$VIC" >/dev/null || [ -e "/tmp/colo-$VIC" ]; do VIC=$((VIC + 1)); done
CACHE=/tmp/colo-$VIC
INST=$WORK/inst && mkdir -p "$INST/bin" && chmod 755 "$INST" "$INST/bin"
cp "$COLO" "$INST/bin/colo"   # alone: no shim beside it, so the embedded copy is used
as_vic() { setpriv --reuid="$VIC" --regid="$VIC" --clear-groups env -u HOME -u XDG_RUNTIME_DIR -u XDG_CACHE_HOME -u COLO_PRELOAD -u CARGO_TARGET_DIR "$@"; }
MARK=$WORK/owned && : >"$MARK" && chmod 666 "$MARK"
cat >"$WORK/evil.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void pwn(void) {
    const char *m = getenv("EVIL_MARK");
    FILE *f = m ? fopen(m, "a") : NULL;
    if (f) { fprintf(f, "euid=%d\n", (int)geteuid()); fclose(f); }
}
C
chmod 644 "$WORK/evil.c"
(cd "$WORK" && as_vic COLO_LOG=debug timeout 20 "$INST/bin/colo" run -- /bin/true 2>"$WORK/first.err")
SHIM=$(sed -n 's/^colo run: shim //p' "$WORK/first.err")
case $SHIM in
  "$CACHE"/libcolo_preload-*.so) ok "the victim's first run wrote $SHIM" ;;
  *) bad "the victim's first run did not use $CACHE: $(cat "$WORK/first.err")"; rm -rf "$CACHE"; finish ;;
esac
GOOD=$(sha256sum <"$SHIM") SIZE=$(stat -c %s "$SHIM")
# The window: the victim's directory is writable by everyone; nobody plants, then it closes.
as_vic chmod 777 "$CACHE"
if as_nobody timeout 60 sh -c "gcc -shared -fPIC -o '$CACHE/.evil.so' '$WORK/evil.c' && truncate -s $SIZE '$CACHE/.evil.so' &&
    chmod 444 '$CACHE/.evil.so' && mv -f '$CACHE/.evil.so' '$SHIM'"; then
  ok "nobody put its library of the right length, 0444, under the cached name"
else
  bad "nobody could not plant its library (the attack did not run)"
fi
as_vic chmod 755 "$CACHE"
# The plant is loadable (the attack is real): preloaded directly, its constructor runs.
timeout 20 env LD_PRELOAD="$SHIM" EVIL_MARK="$MARK" /bin/true
check "the planted library runs when preloaded directly" grep -q "euid=0" "$MARK"
: >"$MARK"
(cd "$WORK" && as_vic EVIL_MARK="$MARK" COLO_LOG=debug timeout 20 "$INST/bin/colo" run -- /bin/true 2>"$WORK/run.err")
if grep -q "euid=$VIC" "$MARK"; then
  bad "the victim's colo run loaded nobody's library"
else
  ok "the victim's colo run did not load nobody's library"
fi
check "the victim's colo run still used $SHIM" grep -qx "colo run: shim $SHIM" "$WORK/run.err"
check "the copy is the victim's again, 0444, with the bytes colo wrote first" \
  test "$(stat -c %u:%a "$SHIM") $(sha256sum <"$SHIM")" = "$VIC:444 $GOOD"
rm -rf "$CACHE"
finish
