# The Go module colo.dev/colo as `go get` fetches it once published: the module's files (those git
# tracks under go/), served by a file-based module proxy in the proxy protocol's layout, fetched by
# `go get colo.dev/colo@vVERSION` into a new module that dials itself through shared memory.
# (Resolving colo.dev/colo to this repository is the go-import meta tag in go/README.md.)
# Sourced by run.sh.
GM=$WORK/gomod
GVER=v$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/rust/Cargo.toml" | head -n 1)
check "go.mod names colo.dev/colo" grep -qx "module colo.dev/colo" "$ROOT/go/go.mod"
mkgoproxy() {
  local d=$GM/proxy/colo.dev/colo/@v
  mkdir -p "$d" || return 1
  echo "$GVER" >"$d/list"
  echo "{\"Version\":\"$GVER\",\"Time\":\"2026-01-01T00:00:00Z\"}" >"$d/$GVER.info"
  cp "$ROOT/go/go.mod" "$d/$GVER.mod"
  (cd "$ROOT" && git ls-files -z go) | python3 -c "
import sys, zipfile
files = [f for f in sys.stdin.buffer.read().decode().split('\0') if f]
with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:
    for f in files:
        z.write('$ROOT/' + f, 'colo.dev/colo@$GVER/' + f[len('go/'):])
" "$d/$GVER.zip"
}
check "a module proxy tree for colo.dev/colo@$GVER" mkgoproxy
mkdir -p "$GM/app"
cat >"$GM/app/main.go" <<'GO'
package main

import (
	"fmt"
	"io"

	"colo.dev/colo"
)

func main() {
	ln, err := colo.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	c, err := colo.Dial("tcp", ln.Addr().String())
	if err != nil {
		panic(err)
	}
	c.Write([]byte("hello"))
	c.CloseWrite()
	b, _ := io.ReadAll(c)
	fmt.Println(string(b), c.Transport())
}
GO
# A module cache of its own (a shared one would keep an earlier run's colo.dev/colo@$GVER); the
# dependencies come from the shared cache's download directory (a module proxy itself), else the proxy.
goenv() {
  env GOMODCACHE="$GM/modcache" GOPROXY="file://$GM/proxy,file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)" \
    GONOSUMDB=colo.dev GOFLAGS="-mod=mod -modcacherw" GOWORK=off "$@"
}
goget() {
  (cd "$GM/app" && go mod init example.com/app >/dev/null 2>&1 &&
    goenv timeout 300 go get "colo.dev/colo@$GVER") >"$WORK/goget.out" 2>&1 || { cat "$WORK/goget.out"; return 1; }
}
check "go get colo.dev/colo@$GVER into a new module" goget
out=$(cd "$GM/app" && goenv timeout 300 go run . 2>&1)
check "the new module's echo went through shared memory ($out)" test "$out" = "hello colo"
