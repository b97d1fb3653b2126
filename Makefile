# colo: the two commands of the README.
#   make demo   builds colo and runs `colo bench` on this machine (about a minute)
#   make test   runs every test: Rust (unit, loom, multi-process), Go, C, Python, cross-language, apps
.PHONY: demo test build test-rust test-loom test-go test-c-py test-xlang test-apps test-attack test-fuzz test-diff bench-apps clean

CARGO ?= cargo
RUST := rust

build:
	cd $(RUST) && $(CARGO) build --release -p colo-cli -p colo-preload -p colo-ffi && $(CARGO) build --release -p colo --example peer

demo: build
	mkdir -p build
	$(RUST)/target/release/colo bench --plot build/bench.png

test: test-rust test-loom test-go test-c-py test-xlang test-apps test-attack test-fuzz test-diff
	@echo "all tests passed"

test-rust:
	cd $(RUST) && $(CARGO) test --workspace --exclude colo-py -- --test-threads=2
	cd $(RUST) && $(CARGO) test -p colo --features tokio --test tokio

test-loom:
	cd $(RUST) && RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) test -p colo-ring --test loom --release

test-go:
	go/test.sh

test-c-py:
	SKIP_XLANG=1 scripts/test-c-py.sh

# Every client x server pairing of Rust, Go, C and Python peers (needs test-c-py's venv and C peer).
test-xlang: build test-c-py
	COLO_PEERS="python=$(CURDIR)/tests/xlang/python-peer.sh" tests/xlang/run.sh

test-apps:
	tests/apps/run.sh

# An unprivileged user (nobody) against root's servers, one script per attack class (needs root).
test-attack:
	tests/attack/run.sh

# Every fuzz target (Rust cargo-fuzz, Go native) for a bounded time each; fails on a crash.
test-fuzz:
	scripts/test-fuzz.sh

# Each scenario of tests/diff on plain TCP and under `colo run` (accelerated, asserted); fails on
# any difference tests/diff/allowlist.txt does not name.
test-diff:
	tests/diff/run.sh

bench-apps:
	tests/apps/bench.sh

clean:
	cd $(RUST) && $(CARGO) clean
	rm -rf build
