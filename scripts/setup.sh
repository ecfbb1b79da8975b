#!/usr/bin/env bash
# Installs what building and testing shortfuse need, only what is missing,
# so that a second run returns at once. Debian/Ubuntu, run as root (or with
# sudo available). Used by `make test`, `make demo` and .ci/run.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

# command -> Debian package that provides it
declare -A CMD_PKG=(
    [fusermount3]=fuse3
    [fio]=fio
    [bindfs]=bindfs
    [sshd]=openssh-server
    [sshfs]=sshfs
    # Unmodified FUSE daemons served over the rings (tests/test_foreign.py).
    [squashfuse]=squashfuse
    [mksquashfs]=squashfs-tools
    [setfattr]=attr
    [pkg-config]=pkg-config
    [cc]=build-essential
    [python3]=python3
    [git]=git
    [sqlite3]=sqlite3
    [make]=make
    # bench programs: rsync -a of a tree (tar, find and xargs are essential).
    [rsync]=rsync
    # distfs scale-out: metadata and leases on etcd; etcd-client's build
    # runs protoc.
    [etcd]=etcd-server
    [protoc]=protobuf-compiler
    # The scale-out tests' network namespaces (tests/netns.py).
    [ip]=iproute2
    [nsenter]=util-linux
    # The shim's tests build a Go program linked against glibc.
    [go]=golang-go
    # The POSIX battery's reference: a fresh ext4 image, loop-mounted.
    [mkfs.ext4]=e2fsprogs
    # test_namespace_maps counts the system calls of in-process lookups;
    # test_run what the shim does at a process's start.
    [strace]=strace
    # The inotify tests compare inotifywait's events with a real directory's.
    [inotifywait]=inotify-tools
)
missing=()
for cmd in "${!CMD_PKG[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${CMD_PKG[$cmd]}")
done
# The bench's plots are labelled with DejaVu Sans.
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
# protoc's well-known types (google/protobuf/*.proto), which etcd-client's
# protos import.
[ -e /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
# libfuse3-dev has no command: the header tells.
[ -e /usr/include/fuse3/fuse_lowlevel.h ] || missing+=(libfuse3-dev)
# pytest for whichever python3 is first on PATH.
need_pytest=0
python3 -c 'import pytest' >/dev/null 2>&1 || need_pytest=1
if [ "$need_pytest" = 1 ] && [ "$(command -v python3 || true)" = /usr/bin/python3 ]; then
    missing+=(python3-pytest)
    need_pytest=0
fi
# The metrics tests parse scrapes with the Prometheus client's own parser.
if ! python3 -c 'import prometheus_client' >/dev/null 2>&1; then
    if [ "$(command -v python3 || true)" = /usr/bin/python3 ]; then
        missing+=(python3-prometheus-client)
    else
        need_prometheus=1
    fi
fi

if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$need_pytest" = 1 ]; then
    echo "setup: installing pytest with pip for $(command -v python3)"
    python3 -m pip install -q pytest || python3 -m pip install -q --break-system-packages pytest
fi

if [ "${need_prometheus:-0}" = 1 ]; then
    python3 -m pip install -q prometheus_client || python3 -m pip install -q --break-system-packages prometheus_client
fi

if [ ! -e /dev/fuse ]; then
    echo "setup: /dev/fuse is missing; loading the fuse module" >&2
    $SUDO modprobe fuse
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    echo "setup: cargo not found: install Rust with rustup (https://rustup.rs)" >&2
    exit 1
fi
