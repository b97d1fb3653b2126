# README.md's examples, copied out of README.md as a user would, each used the way the README
# says: the Python server run by a Python with the colo package, the C client built with
# `pkg-config --cflags --libs colo` against a `make install`, the Go program in a new module that
# takes colo through the README's `go mod edit -replace` line, the Rust program in a new crate
# made with its `cargo add` line. Each must say it went through shared memory. The examples'
# fixed ports are replaced with free ones. Sourced by run.sh (after t_4_wheel.sh, whose venv has
# the colo package; run alone, build/venv from `make test-c-py`).
RM=$WORK/readme
mkdir -p "$RM" && chmod 755 "$RM"
# block LANG: the first fenced block of LANG under README's "## Examples", ports made free.
P7000=$(free_port); P8080=$(free_port)
block() {
  python3 - "$ROOT/README.md" "$1" <<'PY' | sed -e "s/7000/$P7000/g" -e "s/8080/$P8080/g"
import re, sys
text = open(sys.argv[1]).read()
examples = text[text.index("\n## Examples\n"):]
examples = examples[:examples.index("\n## ", 1)]
m = re.search(r"^```" + re.escape(sys.argv[2]) + r"\n(.*?)^```$", examples, re.S | re.M)
sys.stdout.write(m.group(1) if m else "")
PY
}
# line PATTERN: the command line of README's Install block that starts with PATTERN.
line() { sed -n '/^## Install/,/^## Examples/p' "$ROOT/README.md" | grep -m1 "^$1" | sed 's/ *#.*//' | grep .; }

# Python: the server; C: its client.
RPY=${WV:+$WV/venv/bin/python}
[ -x "${RPY:-}" ] || RPY=$ROOT/build/venv/bin/python
check "a Python with the colo package ($RPY)" "$RPY" -c 'import colo'
block python >"$RM/server.py"; block c >"$RM/client.c"
check "README has a Python and a C example" test -s "$RM/server.py" -a -s "$RM/client.c"
check "make install PREFIX (for the C example)" make -s -C "$ROOT" install PREFIX="$RM/prefix" >/dev/null
check "cc client.c \$(pkg-config --cflags --libs colo)" sh -c "cd '$RM' &&
  cc client.c \$(PKG_CONFIG_PATH='$RM/prefix/lib/pkgconfig' pkg-config --cflags --libs colo) -o client"
(cd "$RM" && exec timeout 30 "$RPY" server.py >"$RM/server.out" 2>&1) &
PIDS+=($!)
# Waits for the listening socket without connecting to it: the server serves one connection.
for _ in $(seq 200); do [ -n "$(ss -Hltn "sport = :$P7000")" ] && break; sleep 0.05; done
out=$(cd "$RM" && LD_LIBRARY_PATH=$RM/prefix/lib timeout 30 ./client 2>&1)
check "the C example against the Python example: 'ping over colo' ($out)" test "$out" = "ping over colo"

# Go: a new module, colo through the README's line with this checkout's path.
GOLINE=$(line "go mod edit -replace" | sed "s|/path/to/colo|$ROOT|") || bad "README's Install has no go mod edit line"
mkdir -p "$RM/go" && block go >"$RM/go/main.go"
check "go mod init; $GOLINE" sh -c "cd '$RM/go' && go mod init example.com/readme >/dev/null 2>&1 &&
  GOFLAGS=-modcacherw timeout 300 sh -c '$GOLINE' >'$RM/go.out' 2>&1 || { cat '$RM/go.out'; exit 1; }"
out=$(cd "$RM/go" && timeout 300 go run . 2>&1)
check "the Go example: 'hello over colo' ($out)" test "$out" = "hello over colo"

# Rust: a new crate, colo through the README's line; the example (also a doctest) as its main.
RSLINE=$(line "cargo add colo" | sed "s|/path/to/colo|$ROOT|") || bad "README's Install has no cargo add line"
check "cargo new; $RSLINE" sh -c "cd '$RM' && cargo new -q --vcs none rs && cd rs && $RSLINE -q"
block rust >"$RM/rs/src/main.rs"
out=$(cd "$RM/rs" && CARGO_TARGET_DIR=$TARGET timeout 900 cargo run -q 2>&1)
check "the Rust example: 'colo' ($out)" test "$out" = colo

# C's server, examples/c/echo.c (README: "A server and zero-copy messages in C"), built as its
# header says: the README's C client and then its own client, bytes and a message, each served.
cp "$ROOT/examples/c/echo.c" "$RM/"
check "cc echo.c \$(pkg-config --cflags --libs colo) -lpthread" sh -c "cd '$RM' &&
  cc echo.c \$(PKG_CONFIG_PATH='$RM/prefix/lib/pkgconfig' pkg-config --cflags --libs colo) -lpthread -o echo"
(cd "$RM" && LD_LIBRARY_PATH=$RM/prefix/lib exec timeout 60 ./echo server "127.0.0.1:$P7000" >"$RM/echo.out" 2>&1) &
PIDS+=($!)
for _ in $(seq 200); do [ -n "$(ss -Hltn "sport = :$P7000")" ] && break; sleep 0.05; done
out=$(cd "$RM" && LD_LIBRARY_PATH=$RM/prefix/lib timeout 30 ./client 2>&1)
check "the C example against echo.c's server: 'ping over colo' ($out)" test "$out" = "ping over colo"
out=$(cd "$RM" && LD_LIBRARY_PATH=$RM/prefix/lib timeout 30 ./echo client "127.0.0.1:$P7000" hi 2>&1 | tr '\n' '|')
check "then echo.c's client: bytes and a message echoed ($out)" \
  test "$out" = "stream echo: hi (over shared memory)|message echo: hi|"
