# colo: the two commands of the README.
#   make demo   builds colo and runs `colo bench` on this machine (about a minute)
#   make test   runs every test: Rust (unit, loom, multi-process), Go, C, Python, cross-language, apps
#   make install PREFIX=/usr/local DESTDIR=   colo, its shim, libcolo, colo.h, colo.pc (make uninstall)
#   make dist   build/colo-VERSION-ARCH-linux.tar.gz: the same files, relocatable, with README and licenses
#   make wheel  build/wheels/colo-*.whl: the Python module and the colo command (needs maturin)
.PHONY: demo test build prebuild test-clippy test-rust test-loom test-go test-c-py test-xlang test-apps test-attack test-fuzz test-install test-diff test-netns bench-apps clean install uninstall dist wheel

CARGO ?= cargo
RUST := rust
OUT  := $(RUST)/target/release
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' $(RUST)/Cargo.toml | head -n 1)
ARCH := $(shell uname -m)
MATURIN ?= maturin
# The glibc the binaries need (GLIBC_2.34 symbols, Debian 12 and later).
MANYLINUX ?= manylinux_2_34

# Install locations (GNU conventions); DESTDIR stages them elsewhere, colo.pc names PREFIX's.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DOCDIR     ?= $(PREFIX)/share/doc/colo
# What colo.pc says; make dist makes them relative to the .pc file's own directory.
PC_PREFIX     ?= $(PREFIX)
PC_LIBDIR     ?= $(LIBDIR)
PC_INCLUDEDIR ?= $(INCLUDEDIR)
# -s: install the binaries stripped (make dist does).
INSTALL_STRIP ?=

build:
	cd $(RUST) && $(CARGO) build --release -p colo-cli -p colo-preload -p colo-ffi && $(CARGO) build --release -p colo --example peer

demo: build
	mkdir -p build
	$(RUST)/target/release/colo bench --plot build/bench.png

test: test-clippy test-rust test-go test-c-py test-xlang test-apps prebuild test-attack test-loom test-fuzz test-install test-diff test-netns
	@echo "all tests passed ($$(date -u +%T))"

# Lints, with docs/SAFETY.md's undocumented_unsafe_blocks among them (workspace [lints]); any warning fails.
test-clippy:
	@echo "=== make $@: $$(date -u +%T)"
	cd $(RUST) && $(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust:
	@echo "=== make $@: $$(date -u +%T)"
	cd $(RUST) && $(CARGO) test --workspace --exclude colo-py -- --test-threads=2
	cd $(RUST) && $(CARGO) test -p colo --features tokio --test tokio
	cd $(RUST) && $(CARGO) test -p colo --features tokio --lib tokio::tests

LOOM_ENV := RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom
test-loom:
	@echo "=== make $@: $$(date -u +%T)"
	@$(PREBUILD_NOW)
	cd $(RUST) && $(LOOM_ENV) $(CARGO) test -p colo-ring --test loom --release

# make test: the loom and fuzz builds start in the background (a process group of their own,
# build/prebuild.pgid while it runs), at the idle CPU and I/O priority, before test-attack, whose
# scripts mostly wait: they compile on cores nothing else wants. test-loom and test-fuzz, which
# come after, put what is left of it back to normal priority (PREBUILD_NOW), wait on cargo's
# lock of the same build directories and find them built (each still builds what it runs; a
# failed build fails there, again).
PREBUILD_PGID := $(CURDIR)/build/prebuild.pgid
prebuild:
	@mkdir -p build
	cd $(RUST) && setsid nice -n 19 ionice -c 3 chrt -i 0 sh -c 'echo $$$$ >$(PREBUILD_PGID); \
	  $(LOOM_ENV) $(CARGO) test -q -p colo-ring --test loom --release --no-run; \
	  $(CARGO) +nightly fuzz build --fuzz-dir fuzz -a; rm -f $(PREBUILD_PGID)' </dev/null >$(CURDIR)/build/prebuild.log 2>&1 &
PREBUILD_NOW = g=$$(cat $(PREBUILD_PGID) 2>/dev/null) && for p in $$(pgrep -g "$$g"); do \
	  chrt -a -o -p 0 "$$p"; renice -n 0 -p "$$p"; ionice -c 2 -n 4 -p "$$p"; done >/dev/null 2>&1; true

# The Rust peer first: TestRecycleWithRustPeer (Go client, Rust server) needs it.
test-go: build
	@echo "=== make $@: $$(date -u +%T)"
	COLO_REQUIRE_RUST_PEER=1 go/test.sh

test-c-py:
	@echo "=== make $@: $$(date -u +%T)"
	SKIP_XLANG=1 scripts/test-c-py.sh

# Every client x server pairing of Rust, Go, C and Python peers (needs test-c-py's venv and C peer).
test-xlang: build test-c-py
	@echo "=== make $@: $$(date -u +%T)"
	COLO_PEERS="python=$(CURDIR)/tests/xlang/python-peer.sh" tests/xlang/run.sh

test-apps:
	@echo "=== make $@: $$(date -u +%T)"
	tests/apps/run.sh

# colo across network namespaces (containers, pods): namespaces, veths, iptables (needs root).
test-netns: build
	@echo "=== make $@: $$(date -u +%T)"
	tests/netns/run.sh

# An unprivileged user (nobody) against root's servers, one script per attack class (needs root).
test-attack:
	@echo "=== make $@: $$(date -u +%T)"
	tests/attack/run.sh

# Every fuzz target (Rust cargo-fuzz, Go native) for a bounded time each; fails on a crash.
test-fuzz:
	@echo "=== make $@: $$(date -u +%T)"
	@$(PREBUILD_NOW)
	scripts/test-fuzz.sh

# Each scenario of tests/diff on plain TCP and under `colo run` (accelerated, asserted); fails on
# any difference tests/diff/allowlist.txt does not name.
test-diff:
	@echo "=== make $@: $$(date -u +%T)"
	tests/diff/run.sh

# cargo install, make install, make dist, make wheel and the Go module (through a module proxy),
# each used from its result alone in a fresh directory; README.md's examples as written there.
test-install: build
	@echo "=== make $@: $$(date -u +%T)"
	tests/install/run.sh

# The shim goes in LIBDIR/colo, where `colo run` looks (../lib/colo from the binary); colo also
# carries its own copy. libcolo.so exports only colo_* (rust/colo-ffi/colo.map), soname libcolo.so.0.
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/colo $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(DOCDIR)
	install $(INSTALL_STRIP) -m 755 $(OUT)/colo $(DESTDIR)$(BINDIR)/colo
	install $(INSTALL_STRIP) -m 755 $(OUT)/libcolo_preload.so $(DESTDIR)$(LIBDIR)/colo/libcolo_preload.so
	install $(INSTALL_STRIP) -m 755 $(OUT)/libcolo.so $(DESTDIR)$(LIBDIR)/libcolo.so.0
	ln -sf libcolo.so.0 $(DESTDIR)$(LIBDIR)/libcolo.so
	install -m 644 $(OUT)/libcolo.a $(DESTDIR)$(LIBDIR)/libcolo.a
	install -m 644 $(RUST)/colo-ffi/include/colo.h $(DESTDIR)$(INCLUDEDIR)/colo.h
	sed -e 's|@PREFIX@|$(PC_PREFIX)|' -e 's|@LIBDIR@|$(PC_LIBDIR)|' -e 's|@INCLUDEDIR@|$(PC_INCLUDEDIR)|' \
	  -e 's|@VERSION@|$(VERSION)|' $(RUST)/colo-ffi/colo.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/colo.pc
	chmod 644 $(DESTDIR)$(LIBDIR)/pkgconfig/colo.pc
	install -m 644 README.md LICENSE-MIT LICENSE-APACHE $(DESTDIR)$(DOCDIR)/
	{ $(OUT)/colo --help; for c in run bench stat; do echo; echo "colo $$c --help"; $(OUT)/colo $$c --help; done; } \
	  > $(DESTDIR)$(DOCDIR)/colo-help.txt
	chmod 644 $(DESTDIR)$(DOCDIR)/colo-help.txt

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/colo $(DESTDIR)$(LIBDIR)/colo/libcolo_preload.so $(DESTDIR)$(LIBDIR)/libcolo.so.0 \
	  $(DESTDIR)$(LIBDIR)/libcolo.so $(DESTDIR)$(LIBDIR)/libcolo.a $(DESTDIR)$(INCLUDEDIR)/colo.h \
	  $(DESTDIR)$(LIBDIR)/pkgconfig/colo.pc
	rm -f $(addprefix $(DESTDIR)$(DOCDIR)/,README.md LICENSE-MIT LICENSE-APACHE colo-help.txt)
	-rmdir $(DESTDIR)$(LIBDIR)/colo $(DESTDIR)$(DOCDIR) 2>/dev/null

# A relocatable tree (colo.pc finds its files from its own directory), packed with README and
# licenses; the binaries without debug information.
DIST := colo-$(VERSION)-$(ARCH)-linux
dist: build
	rm -rf build/dist && mkdir -p build/dist
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/build/dist/$(DIST) PREFIX= DOCDIR=/share/doc/colo INSTALL_STRIP=-s \
	  PC_PREFIX='$$$${pcfiledir}/../..' PC_LIBDIR='$$$${prefix}/lib' PC_INCLUDEDIR='$$$${prefix}/include'
	cp README.md LICENSE-MIT LICENSE-APACHE build/dist/$(DIST)/
	tar -C build/dist --owner=0 --group=0 --sort=name -czf build/$(DIST).tar.gz $(DIST)
	@echo build/$(DIST).tar.gz

# A Python wheel (build/wheels) with the module and the colo command (the binary, which carries
# its shim, inside the package; the `colo` script executes it).
wheel: build
	@command -v $(MATURIN) >/dev/null || { echo "make wheel needs maturin: pip install 'maturin>=1.5,<2' (or make wheel MATURIN=/path/to/maturin)" >&2; exit 1; }
	mkdir -p $(RUST)/colo-py/python/colo/_bin build/wheels
	install -s -m 755 $(OUT)/colo $(RUST)/colo-py/python/colo/_bin/colo
	cd $(RUST)/colo-py && $(MATURIN) build --release --strip --compatibility $(MANYLINUX) --out $(CURDIR)/build/wheels

bench-apps:
	tests/apps/bench.sh

clean:
	cd $(RUST) && $(CARGO) clean
	rm -rf build
