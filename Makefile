# shortfuse: `make build`, `make test` (installs missing tools first).

SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

CARGO ?= cargo
PYTHON ?= python3
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
export SHORTFUSE_BIN ?= $(TARGET_DIR)/debug/shortfuse

.PHONY: build test setup test-rust test-mounted demo

setup:
	./scripts/setup.sh

build:
	$(CARGO) build --workspace

test: setup build test-rust test-mounted

# The library crates' docs build without a warning (broken links, missing
# docs): a cheap check beside the tests.
test-rust:
	$(CARGO) test --workspace
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -p shortfuse -p shortfuse-abi

# The mounted suites (tests/): every configuration x transport, as root.
# SHORTFUSE_FS / SHORTFUSE_TRANSPORTS narrow the run, e.g.
# `make test-mounted SHORTFUSE_FS=mem SHORTFUSE_TRANSPORTS=dev`; the
# configurations (and what each legitimately does not support) are declared
# in tests/sfmount.py, FILE_SYSTEMS. No -x: one failing configuration must
# not hide the others; -rfE lists every failure at the end.
# NAME@TRANSPORT pins a configuration to one transport. sftp and dist run
# on both (the README shows them over uring): their 72 uring cases took
# 8 minutes at load 14 on a 2-core machine, most of it the two
# readdir_10000_concurrent cases. dist-etcd (distfs through an agent on
# etcd) runs the behaviour suite (tests/test_posix.py) on dev: 20 cases,
# 4 minutes at load 21 on 2 cores (dist's 36 cases: 3). pytest's summary
# lists the configurations run and those left out.
export SHORTFUSE_FS ?= mem,passthrough,passthrough+kp,stripe,pack,sftp,dist,dist-etcd@dev
export SHORTFUSE_TRANSPORTS ?= dev,uring
test-mounted: build
	$(PYTHON) -m pytest -q -rfE -p no:cacheprovider --durations=15 tests/

# The main job: native ext4 against shortfuse (passthrough over /dev/fuse
# base/default/optimized, kernel passthrough, io_uring, the preload shim in
# process and over rings) and the peers bindfs and libfuse's passthrough_ll,
# in one run, as ratios to native; then real programs (git, make, tar,
# find|grep, rsync, python3, sqlite3) at the sizes of `bench programs
# --quick` on native, the shim in process and over rings, dev and uring.
# The shim (libshortfuse_preload.so) is
# built in release too: the release shortfuse looks for it beside itself.
# The demo mounts no sftp in process, so the shim built with sftp
# (shortfuse-preload-sftp) is left to `make build`.
# The bench exits with a failure when any configuration did not complete.
DEMO_OUT ?= $(CURDIR)/bench-out
demo: setup
	$(CARGO) build --release -p shortfuse-cli -p shortfuse-preload
	$(TARGET_DIR)/release/shortfuse bench --quick latency fio programs --out $(DEMO_OUT)
