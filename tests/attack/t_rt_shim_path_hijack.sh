#!/usr/bin/env bash
# Red team: `colo run` must not preload a library another user can plant. Before its embedded
# copy it looks for libcolo_preload.so next to the binary, in ../lib, ../lib/colo and the parent
# directory: a colo binary kept in a directory of its own under /tmp (/tmp/X/colo) or in /tmp
# itself would load /tmp/libcolo_preload.so or /tmp/lib/libcolo_preload.so, which any user may
# create. PUB stands in for /tmp (mode 1777); root's colo is PUB/rel/colo (PUB/rel root's, 0755)
# and PUB/colo; nobody plants a library whose constructor records its effective uid in each
# place looked at, and root runs `colo run -- true`: the library must not run as root.
source "$(dirname "$0")/lib.sh"
PUB=$WORK/pub && mkdir -p "$PUB/rel" && chmod 1777 "$PUB" && chmod 755 "$PUB/rel"
cp "$COLO" "$PUB/rel/colo" && cp "$COLO" "$PUB/colo"
MARK=$WORK/owned
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
# try BINARY WHERE: nobody plants PUB/WHERE/libcolo_preload.so; root runs BINARY.
try() {
  rm -rf "$PUB/lib" "$PUB/libcolo_preload.so"
  if ! as_nobody sh -c "mkdir -p '$PUB/$2' && gcc -shared -fPIC -o '$PUB/$2/libcolo_preload.so' '$WORK/evil.c'"; then
    bad "nobody could not plant $PUB/$2/libcolo_preload.so (the attack did not run)"
    return
  fi
  : >"$MARK" && chmod 666 "$MARK"
  EVIL_MARK=$MARK timeout 20 "$1" run -- /bin/true 2>"$WORK/run.err"
  if grep -q "euid=0" "$MARK"; then
    bad "root's $1 run loaded nobody's $PUB/$2/libcolo_preload.so"
  elif grep -q "ignoring .*owned by uid 65534" "$WORK/run.err"; then
    ok "$1: nobody's $2/libcolo_preload.so not loaded (named and ignored)"
  else
    bad "$1: nobody's $2/libcolo_preload.so not loaded, but not named either: $(cat "$WORK/run.err")"
  fi
}
for where in lib . lib/colo; do try "$PUB/rel/colo" "$where"; done
try "$PUB/colo" .
finish
