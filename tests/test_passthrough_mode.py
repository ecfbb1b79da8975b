"""Kernel passthrough (`shortfuse mount passthrough SRC MNT -o passthrough`):
after open, the kernel reads and writes the source file itself, so no READ
or WRITE request may reach the daemon, and everything must still behave as
on the source: read, write, mmap (shared and private), truncate, and several
processes holding the same inode open in different modes at once (the kernel
refuses mixed modes on one inode with EIO/EBUSY/ETXTBSY unless the library
keeps its rules).

Each test also counts the daemon's requests with `shortfuse stats --json`;
the control test shows the same I/O on a mount without `-o passthrough` does
produce READ and WRITE requests, so a zero here means something.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import subprocess
import sys

import pytest

from sfmount import Config, run, shortfuse_bin
from test_posix import pattern

pytestmark = [pytest.mark.fs("passthrough+kp"), pytest.mark.shortfuse_only]

KIB = 1024


@pytest.fixture
def mnt(config, mount_factory):
    """Every open passed through, readers too: the mount's default reader
    cache would serve read-only opens from its page cache (test_options.py)."""
    return mount_factory(config, ["no_reader_cache"])


def daemon_counts(mountpoint) -> dict[str, int]:
    r = run([shortfuse_bin(), "stats", "--json", mountpoint], timeout=30)
    assert r.returncode == 0, f"shortfuse stats --json {mountpoint} failed: {r.stderr}"
    return {op["name"]: op["count"] for op in json.loads(r.stdout)["ops"]}


def reset_counts(mountpoint) -> None:
    r = run([shortfuse_bin(), "stats", "--reset", mountpoint], timeout=30)
    assert r.returncode == 0, f"shortfuse stats --reset {mountpoint} failed: {r.stderr}"


def assert_data_skipped_daemon(mountpoint, what: str) -> None:
    counts = daemon_counts(mountpoint)
    assert counts.get("OPEN", 0) + counts.get("CREATE", 0) > 0, (
        f"{what}: the daemon saw no OPEN or CREATE, so these are not the counters of this mount: {counts}"
    )
    data = {op: counts.get(op, 0) for op in ("READ", "WRITE")}
    assert data == {"READ": 0, "WRITE": 0}, f"{what}: data requests reached the daemon: {data} (all: {counts})"


def read_all(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def exercise_read_write_truncate(mnt_path, src_path) -> None:
    """Read, write and truncate through the mount, each checked against the source file."""
    f, s = mnt_path / "rw", src_path / "rw"
    data = bytearray(pattern(3 * 1024 * KIB + 17, 1))
    fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.write(fd, data) == len(data)
        for off, n in ((0, 1), (4095, 2), (1_000_003, 128 * KIB), (len(data) - 10, 100)):
            assert os.pread(fd, n, off) == bytes(data[off : off + n]), f"pread {off}+{n}"
        for off, chunk in ((3, b"abc"), (65_530, pattern(70_000, 2)), (len(data) + 5000, b"past EOF")):
            assert os.pwrite(fd, chunk, off) == len(chunk)
            end = off + len(chunk)
            data.extend(bytes(max(0, end - len(data))))
            data[off:end] = chunk
        assert read_all(s) == data, "the source file differs from what was written through the mount"
        assert os.fstat(fd).st_size == len(data)
        os.ftruncate(fd, 100_000)
        del data[100_000:]
        assert os.fstat(fd).st_size == 100_000 and os.stat(s).st_size == 100_000
        assert os.pread(fd, 200_000, 0) == data
        os.ftruncate(fd, 300_000)
        data.extend(bytes(200_000))
        assert os.pread(fd, 16, 250_000) == bytes(16), "grown range must read as zeros"
        os.truncate(f, 4096)
        del data[4096:]
        assert os.pread(fd, 10_000, 0) == data
        assert os.fstat(fd).st_size == 4096
    finally:
        os.close(fd)
    assert read_all(f) == data == read_all(s)
    # The other way: a write to the source (same size) is seen through the mount at once,
    # since the mount reads the source file itself.
    with open(s, "r+b") as fh:
        fh.write(b"from-the-source")
    data[:15] = b"from-the-source"
    assert read_all(f) == data


def test_read_write_truncate(mnt):
    reset_counts(mnt.path)
    exercise_read_write_truncate(mnt.path, mnt.source)
    assert_data_skipped_daemon(mnt.path, "read/write/truncate")


def test_control_without_passthrough_data_reaches_daemon(config, mount_factory):
    """The same I/O without `-o passthrough` is served by the daemon: the counters can tell."""
    plain = mount_factory(Config("passthrough", config.transport))
    reset_counts(plain.path)
    exercise_read_write_truncate(plain.path, plain.source)
    counts = daemon_counts(plain.path)
    assert counts.get("READ", 0) > 0 and counts.get("WRITE", 0) > 0, counts


def test_mmap_shared_and_private(mnt):
    size = 256 * KIB
    base = pattern(size, 3)
    (mnt.source / "m").write_bytes(base)
    reset_counts(mnt.path)
    f, s = mnt.path / "m", mnt.source / "m"

    # MAP_SHARED: stores reach the source file; the mapping sees pwrites to the file.
    fd = os.open(f, os.O_RDWR)
    try:
        with mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE) as m:
            assert m[:] == base, "a shared mapping must show the file's contents"
            m[10:20] = b"SHARED-MAP"
            m[size - 4 :] = b"TAIL"
            m.flush()
            os.pwrite(fd, b"pwrite-seen", 100_000)
            assert m[100_000:100_011] == b"pwrite-seen", "the shared mapping missed a write(2) to the file"
    finally:
        os.close(fd)
    want = bytearray(base)
    want[10:20] = b"SHARED-MAP"
    want[size - 4 :] = b"TAIL"
    want[100_000:100_011] = b"pwrite-seen"
    assert read_all(s) == want, "writes through MAP_SHARED did not reach the source file"
    assert read_all(f) == want

    # MAP_PRIVATE: stores stay in the mapping, copy-on-write.
    fd = os.open(f, os.O_RDWR)
    try:
        with mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE) as m:
            assert m[:] == want
            m[0:12] = b"PRIVATE-ONLY"
            m.flush()
            assert m[0:12] == b"PRIVATE-ONLY"
            assert os.pread(fd, 12, 0) == bytes(want[:12]), "a private mapping's store is visible through read(2)"
    finally:
        os.close(fd)
    assert read_all(s) == want, "a MAP_PRIVATE store reached the source file"
    assert read_all(f) == want

    # Read-only shared mapping of a file opened O_RDONLY (what loaders do).
    fd = os.open(f, os.O_RDONLY)
    try:
        with mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as m:
            assert m[:] == want
    finally:
        os.close(fd)
    assert_data_skipped_daemon(mnt.path, "mmap")


# One child per open mode. Each opens the file, says "open", waits for "go"
# (so that all hold the inode open at the same time), does its I/O, prints a
# JSON result and waits for "close" before closing.
CHILD = r"""
import hashlib, json, os, sys
path, mode, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])
flags = {"rdonly": os.O_RDONLY, "wronly": os.O_WRONLY, "rdwr": os.O_RDWR, "append": os.O_WRONLY | os.O_APPEND}[mode]
try:
    fd = os.open(path, flags)
except OSError as e:
    print(json.dumps({"open_error": e.errno}), flush=True)
    sys.exit(0)
print("open", flush=True)
assert sys.stdin.readline().strip() == "go"
out = {"errors": []}
REGION = 64 * 1024
try:
    if mode == "rdonly":
        # Region 2 is never written: read it again and again while the others write.
        out["region2_sha"] = sorted({hashlib.sha256(os.pread(fd, REGION, 2 * REGION)).hexdigest() for _ in range(50)})
    elif mode == "wronly":
        for _ in range(20):
            os.pwrite(fd, b"W" * REGION, 0)
    elif mode == "rdwr":
        for i in range(20):
            os.pwrite(fd, b"R" * REGION, REGION)
            got = os.pread(fd, REGION, REGION)
            if got != b"R" * REGION:
                out["errors"].append(f"rdwr read back {got[:16]!r} at round {i}")
    elif mode == "append":
        for i in range(16):
            rec = f"[append {arg} #{i:02d}]".encode().ljust(4096, b".")
            n = os.write(fd, rec)
            if n != len(rec):
                out["errors"].append(f"short append {n}")
except OSError as e:
    out["errors"].append(f"{type(e).__name__} errno {e.errno}: {e}")
print(json.dumps(out), flush=True)
sys.stdin.readline()
os.close(fd)
"""


def test_processes_open_one_inode_in_different_modes(mnt):
    region = 64 * KIB
    base = pattern(3 * region, 4)
    (mnt.source / "shared").write_bytes(base)
    reset_counts(mnt.path)
    f = mnt.path / "shared"
    roles = [("rdonly", 0), ("wronly", 0), ("rdwr", 0), ("append", 1), ("append", 2), ("rdonly", 1)]
    children = []
    try:
        for mode, arg in roles:
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", CHILD, str(f), mode, str(arg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        opened = [c.stdout.readline().strip() for c in children]
        assert opened == ["open"] * len(roles), f"opens of one inode in modes {roles}: {opened}"
        # Every child holds the inode open now; also mmap it here, shared, as a seventh user.
        fd = os.open(f, os.O_RDWR)
        try:
            with mmap.mmap(fd, 3 * region) as m:
                for c in children:
                    c.stdin.write("go\n")
                    c.stdin.flush()
                results = [json.loads(c.stdout.readline()) for c in children]
                mapped_region2 = m[2 * region : 3 * region]
        finally:
            os.close(fd)
        for c in children:
            c.stdin.write("close\n")
            c.stdin.flush()
        for c in children:
            assert c.wait(30) == 0
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    for (mode, arg), res in zip(roles, results):
        assert res.get("errors") == [], f"{mode} child {arg}: {res}"
    untouched = bytes(base[2 * region :])
    for (mode, arg), res in zip(roles, results):
        if mode == "rdonly":
            assert res["region2_sha"] == [hashlib.sha256(untouched).hexdigest()], f"rdonly child {arg} read changing data"
    assert mapped_region2 == untouched
    got = read_all(f)
    assert got == read_all(mnt.source / "shared"), "the mount and the source disagree"
    assert got[:region] == b"W" * region, "O_WRONLY writes lost"
    assert got[region : 2 * region] == b"R" * region, "O_RDWR writes lost"
    assert got[2 * region : 3 * region] == untouched, "a region nobody wrote changed"
    tail = got[3 * region :]
    assert len(tail) == 32 * 4096, f"32 appended records of 4096 bytes expected, the tail has {len(tail)} bytes"
    records = sorted(tail[i : i + 4096] for i in range(0, len(tail), 4096))
    want = sorted(f"[append {a} #{i:02d}]".encode().ljust(4096, b".") for a in (1, 2) for i in range(16))
    assert records == want, "O_APPEND records torn, lost or overwritten"
    assert_data_skipped_daemon(mnt.path, "concurrent opens in different modes")
