"""`shortfuse serve -- COMMAND`: unmodified FUSE daemons (Debian's bindfs,
a raw /dev/fuse loop written here) served over the shared-memory rings to
programs under `shortfuse run -m MOUNTPOINT`, their kernel mount kept.

- Files written, read, renamed, listed and removed through the rings are
  what the kernel mount of the same daemon and its source show, and the
  other way round; the requests went over the rings (the daemon's stats).
- kill -9 of the daemon: the ring clients' calls fail with ENOTCONN, never
  hang.
- A malformed reply from the daemon fails that call (EIO), and the next
  calls on the same rings are served.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

import sfmount
import test_posix
import test_run
from test_ring import Agent, Daemon, under

TESTS = Path(__file__).resolve().parent

shortfuse = test_run.shortfuse


@pytest.fixture
def scratch():
    d = sfmount.new_scratch("foreign")
    d.chmod(0o755)
    yield d
    for m in sfmount.mounts_at(d / "mnt"):
        sfmount.run(["umount", "-l", m.mountpoint])
    sfmount.remove_scratch(d)


def bindfs(shortfuse: Path, base: Path) -> tuple[Daemon, Path, Path]:
    src, mp = base / "src", base / "mnt"
    src.mkdir()
    mp.mkdir()
    d = Daemon(shortfuse, base, ["--", sfmount.require_tool("bindfs"), "-f", str(src), str(mp)], mp)
    assert sfmount.is_mounted(mp), "the daemon's kernel mount is not there"
    return d, src, mp


def daemon_pid(serve: int) -> int:
    """The daemon `shortfuse serve` started (its one child)."""
    kids = Path(f"/proc/{serve}/task/{serve}/children").read_text().split()
    assert len(kids) == 1, kids
    return int(kids[0])


WORK = r"""
import os, sys
mp = sys.argv[1]
os.mkdir(f"{mp}/dir")
with open(f"{mp}/dir/a", "w") as f:
    f.write("through the rings\n")
with open(f"{mp}/dir/a") as f:
    assert f.read() == "through the rings\n"
with open(f"{mp}/gone", "w") as f:
    f.write("x")
os.unlink(f"{mp}/gone")
os.rename(f"{mp}/dir/a", f"{mp}/dir/b")
with open(f"{mp}/dir/b", "a") as f:
    f.write("appended\n")
print(sorted(os.listdir(mp)), sorted(os.listdir(f"{mp}/dir")), open(f"{mp}/from-kernel").read())
"""


def test_bindfs_over_the_rings_is_one_file_system_with_its_kernel_mount(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        (mp / "from-kernel").write_text("written through the kernel mount\n")
        before = d.count("LOOKUP")
        p = under(shortfuse, mp, [sys.executable, "-c", WORK, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().strip() == (
            "['dir', 'from-kernel'] ['b'] written through the kernel mount\n"
        ).strip()
        # The program's calls went over the rings to the daemon.
        assert d.count("CREATE") >= 2 and d.count("LOOKUP") > before
        assert d.stats()["transports"]["ring"] > 0
        # The kernel mount and the source show what the program did.
        for root in (mp, src):
            assert sorted(os.listdir(root)) == ["dir", "from-kernel"]
            assert os.listdir(root / "dir") == ["b"]
            assert (root / "dir" / "b").read_text() == "through the rings\nappended\n"
    finally:
        d.stop()
    assert not sfmount.is_mounted(mp), "SIGTERM to serve left the daemon's kernel mount behind"


def test_kill_9_of_the_daemon_fails_ring_calls_with_enotconn(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    (src / "f").write_text("data\n")
    b = Agent(shortfuse, mp)
    try:
        assert b("read", f"{mp}/f")["ok"] == "data\n"
        os.kill(daemon_pid(d.proc.pid), signal.SIGKILL)
        t0 = time.monotonic()
        got = b("stat", f"{mp}/other")
        waited = time.monotonic() - t0
        assert got.get("err") == "ENOTCONN", got
        # An anti-hang bound, not a speed figure.
        assert waited < 30, f"the call took {waited:.2f}s to fail"
        assert b("read", f"{mp}/f").get("err") == "ENOTCONN"
        # serve exits with the daemon, saying how it ended.
        d.proc.wait(timeout=30)
        assert d.proc.returncode != 0
        assert "killed by signal 9" in d.log.read_text()
    finally:
        b.close()
        d.stop()


# A FUSE daemon of its own /dev/fuse loop (as root: open, mount(2), then
# read requests and write replies), answering a LOOKUP of "bad" with a
# reply whose header claims more bytes than it carries.
RAW_DAEMON = r"""
import ctypes, os, struct, sys, errno
mp = sys.argv[1]
fd = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
if libc.mount(b"rawfuse", mp.encode(), b"fuse.rawfuse", 6, opts) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))
def attr(ino, mode, size):
    # fuse_attr: ino size blocks atime mtime ctime (u64) atimensec mtimensec ctimensec mode nlink uid gid rdev blksize flags (u32)
    return struct.pack("<QQQQQQIIIIIIIIII", ino, size, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)
def entry(ino, mode, size):
    return struct.pack("<QQQQII", ino, 0, 1, 1, 0, 0) + attr(ino, mode, size)
def reply(unique, body=b"", err=0, claim=None):
    n = 16 + len(body)
    os.write(fd, struct.pack("<IiQ", claim or n, -err, unique) + body)
while True:
    try:
        req = os.read(fd, 1 << 21)
    except OSError as e:
        if e.errno in (errno.EINTR, errno.ENOENT):
            continue
        break
    ln, op, unique, node = struct.unpack_from("<IIQQ", req)
    body = req[40:]
    if op == 26:  # INIT
        major, minor = struct.unpack_from("<II", body)
        out = struct.pack("<IIIIHHIIHHI", 7, 31, 0, 0, 0, 0, 1 << 17, 1, 0, 0, 0) + b"\0" * 28
        reply(unique, out)
    elif op == 3:  # GETATTR
        if node == 1:
            reply(unique, struct.pack("<QII", 1, 0, 0) + attr(1, 0o40755, 0))
        else:
            reply(unique, struct.pack("<QII", 1, 0, 0) + attr(node, 0o100644, 5))
    elif op == 1:  # LOOKUP
        name = body.split(b"\0")[0]
        if name == b"good":
            reply(unique, entry(2, 0o100644, 5))
        elif name == b"bad":
            reply(unique, entry(3, 0o100644, 5)[:20], claim=16 + 128)
        else:
            reply(unique, err=errno.ENOENT)
    elif op in (2, 42):  # FORGET, BATCH_FORGET
        pass
    elif op == 38:  # DESTROY
        reply(unique)
        break
    else:
        reply(unique, err=errno.ENOSYS)
"""


def test_a_malformed_reply_fails_that_call_only(shortfuse, scratch):
    mp = scratch / "mnt"
    mp.mkdir()
    d = Daemon(shortfuse, scratch, ["--", sys.executable, "-c", RAW_DAEMON, str(mp)], mp)
    b = Agent(shortfuse, mp)
    try:
        assert b("stat", f"{mp}/good")["ok"]["size"] == 5
        assert b("stat", f"{mp}/bad").get("err") == "EIO"
        # The rings, the client and the daemon go on.
        assert b("stat", f"{mp}/missing").get("err") == "ENOENT"
        assert b("stat", f"{mp}/good")["ok"]["ino"] == 2
        # The kernel mount of the same daemon is served too.
        assert os.stat(mp / "good").st_size == 5
        assert d.proc.poll() is None
    finally:
        b.close()
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])
