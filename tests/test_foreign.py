"""`shortfuse serve -- COMMAND`: unmodified FUSE daemons (Debian's bindfs,
sshfs and squashfuse, a go-fuse and a fuser file system built here, a raw
/dev/fuse loop written here) served over the shared-memory rings to
programs under `shortfuse run -m MOUNTPOINT`, their kernel mount kept.

- Files written, read, renamed, listed and removed through the rings are
  what the kernel mount of the same daemon and its source show, and the
  other way round; the requests went over the rings (the daemon's stats).
- kill -9 of the daemon: the ring clients' calls fail with ENOTCONN, never
  hang.
- A malformed reply from the daemon fails that call (EIO), and the next
  calls on the same rings are served.
- The POSIX scenarios of test_posix on bindfs and on sshfs (against the
  session's loopback sshd) through the rings give what the same daemon
  gives through its kernel mount (or, where the kernel answers from its
  own cache, what ext4 gives); EXCLUDED lists the pairs that differ, and
  why.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
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


def bindfs(shortfuse: Path, base: Path, serve_opts: tuple[str, ...] = ()) -> tuple[Daemon, Path, Path]:
    src, mp = base / "src", base / "mnt"
    src.mkdir()
    mp.mkdir()
    d = Daemon(shortfuse, base, [*serve_opts, "--", sfmount.require_tool("bindfs"), "-f", str(src), str(mp)], mp)
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



# Through the rings: a file rewritten shorter, one removed, one made, one
# renamed, one chmod'ed.
CHANGES = r"""
import os, sys
mp = sys.argv[1]
with open(f"{mp}/a", "w") as f:
    f.write("2")
os.unlink(f"{mp}/b")
with open(f"{mp}/new", "w") as f:
    f.write("made")
os.rename(f"{mp}/c", f"{mp}/d")
os.chmod(f"{mp}/e", 0o600)
"""


def test_changes_through_the_rings_are_seen_on_the_kernel_mount_at_once(shortfuse, scratch):
    src, mp = scratch / "src", scratch / "mnt"
    src.mkdir()
    mp.mkdir()
    # Timeouts that would keep the kernel's names, attributes and pages
    # for the whole test unless it is told what changed.
    cmd = [sfmount.require_tool("bindfs"), "-f", "-o", "attr_timeout=60,entry_timeout=60,negative_timeout=60"]
    d = Daemon(shortfuse, scratch, ["--", *cmd, str(src), str(mp)], mp)
    try:
        for name in "abce":
            (mp / name).write_text("first")
        (mp / "e").chmod(0o644)
        # What the kernel mount now holds in its caches.
        assert (mp / "a").read_text() == "first" and os.stat(mp / "b").st_size == 5
        assert os.stat(mp / "c").st_size == 5 and os.stat(mp / "e").st_mode & 0o777 == 0o644
        for missing in ("new", "d"):
            assert not (mp / missing).exists()
        p = under(shortfuse, mp, [sys.executable, "-c", CHANGES, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        assert d.stats()["transports"]["ring"] > 0
        # At once, well within the timeouts.
        assert os.stat(mp / "a").st_size == 1 and (mp / "a").read_text() == "2"
        assert not (mp / "b").exists()
        assert (mp / "new").read_text() == "made"
        assert not (mp / "c").exists() and (mp / "d").read_text() == "first"
        assert os.stat(mp / "e").st_mode & 0o777 == 0o600
        assert sorted(os.listdir(mp)) == ["a", "d", "e", "new"]
    finally:
        d.stop()


# Reads a file twice, each in an open of its own, and prints both.
READ_TWICE = r"""
import sys
for _ in range(2):
    with open(sys.argv[1]) as f:
        print(f.read(), end="|")
"""


def settled_file(path: Path, data: str) -> str:
    """Writes `data` to `path`, dated long ago: old enough that a program's
    page cache trusts its size and mtime (a file changed too recently to
    tell is read again at every open). Returns `data`."""
    path.write_text(data)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    return data


def test_the_programs_page_cache_in_front_of_a_daemon(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        data = settled_file(src / "f", "x" * 300_000)

        def read_twice(*opts) -> str:
            p = subprocess.run(
                [str(shortfuse), "run", "-m", str(mp), *opts, "--", sys.executable, "-c", READ_TWICE, str(mp / "f")],
                capture_output=True,
                timeout=120,
            )
            assert p.returncode == 0, p.stderr.decode()
            return p.stdout.decode()

        before = d.count("READ")
        assert read_twice() == f"{data}|{data}|"
        uncached = d.count("READ") - before
        before = d.count("READ")
        assert read_twice("-o", "cache=on") == f"{data}|{data}|"
        cached = d.count("READ") - before
        # The second open reads from the program's pages, fetched ahead
        # in large requests: fewer than half the requests of reading it
        # through the daemon twice.
        assert 0 < cached and 2 * cached <= uncached, (cached, uncached)
        # A change made elsewhere is seen at the next open.
        (mp / "f").write_text("changed")
        assert read_twice("-o", "cache=on") == "changed|changed|"
    finally:
        d.stop()

def sshfs(shortfuse: Path, base: Path, *options: str) -> tuple[Daemon, Path, Path]:
    """sshfs of `base/src` from the session's loopback sshd, served at
    `base/mnt`, with more `-o` `options` if given."""
    src, mp = base / "src", base / "mnt"
    src.mkdir()
    src.chmod(0o755)
    mp.mkdir()
    more = [arg for o in options for arg in ("-o", o)]
    d = Daemon(shortfuse, base, ["--", *sshfs_command(src, mp)[:-1], *more, str(mp)], mp)
    assert sfmount.is_mounted(mp), "sshfs's kernel mount is not there"
    return d, src, mp


def run_under(shortfuse: Path, mp: Path, script: str, *args: str) -> str:
    p = subprocess.run(
        [str(shortfuse), "run", "-m", str(mp), "--", sys.executable, "-c", script, *args],
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode()


READ_ONCE = r"""
import sys
with open(sys.argv[1]) as f:
    print(f.read(), end="|")
"""

# Reads the file, reads it again, changes it on the server (the sshd's
# directory, outside the mount), and reads it a third time.
READ_CHANGE_READ = r"""
import sys
for i in range(3):
    with open(sys.argv[1]) as f:
        print(f.read(), end="|")
    if i == 1:
        with open(sys.argv[2], "w") as f:
            f.write(sys.argv[3])
"""


def test_a_remote_daemon_gets_the_programs_page_cache_by_default(shortfuse, scratch):
    d, src, mp = sshfs(shortfuse, scratch)
    try:
        data = settled_file(src / "f", "x" * 300_000)
        before = d.count("READ")
        assert run_under(shortfuse, mp, READ_ONCE, str(mp / "f")) == f"{data}|"
        once = d.count("READ") - before
        before = d.count("READ")
        assert run_under(shortfuse, mp, READ_TWICE, str(mp / "f")) == f"{data}|{data}|"
        twice = d.count("READ") - before
        # sshfs's mount is remote (a host:path source): without `-o
        # cache=...` the program keeps the pages it read, and reading the
        # unchanged file again sends no READ.
        assert once > 0 and twice == once, (once, twice)
        # A change made on the server is seen whole at the next open.
        changed = "changed on the server, and longer than one line\n" * 2_000
        out = run_under(shortfuse, mp, READ_CHANGE_READ, str(mp / "f"), str(src / "f"), changed)
        assert out == f"{data}|{data}|{changed}|", out[-200:]
    finally:
        d.stop()


# getxattr and listxattr of every name in a directory: what each answered.
XATTRS = r"""
import errno, os, sys
for name in sorted(os.listdir(sys.argv[1])):
    p = os.path.join(sys.argv[1], name)
    for call in (lambda: os.getxattr(p, "user.x"), lambda: os.listxattr(p)):
        try:
            print(call())
        except OSError as e:
            print(errno.errorcode[e.errno])
"""


def test_a_daemon_without_xattrs_is_asked_for_them_once(shortfuse, scratch):
    d, src, mp = sshfs(shortfuse, scratch)
    try:
        for i in range(20):
            (src / f"f{i}").write_text("x")
        kernel = subprocess.run(
            [sys.executable, "-c", XATTRS, str(mp)], capture_output=True, timeout=60, check=True
        ).stdout.decode()
        assert kernel.split() == ["ENOTSUP"] * 40, kernel
        before = d.count("GETXATTR"), d.count("LISTXATTR")
        assert run_under(shortfuse, mp, XATTRS, str(mp)) == kernel
        # sshfs answers both with ENOSYS: as the kernel's FUSE client does,
        # the program asks once and then knows.
        assert (d.count("GETXATTR") - before[0], d.count("LISTXATTR") - before[1]) == (1, 1)
    finally:
        d.stop()


def test_a_second_listing_finds_the_names_the_first_looked_up(shortfuse, scratch):
    # Timeouts long enough for a loaded machine (sshfs leaves libfuse's
    # 1 s): the second program starts well within them.
    d, src, mp = sshfs(shortfuse, scratch, "entry_timeout=60,attr_timeout=60")
    try:
        for i in range(4):
            (src / "tree" / f"d{i}").mkdir(parents=True)
            for j in range(25):
                (src / "tree" / f"d{i}" / f"f{j}").write_text("x" * j)
        ls = ["ls", "-lR", "--time-style=+%s", str(mp / "tree")]
        kernel = subprocess.run(ls, capture_output=True, timeout=60, check=True).stdout.decode()
        before = d.count("LOOKUP")
        first = under(shortfuse, mp, ls)
        assert first.returncode == 0 and first.stdout.decode() == kernel, first.stderr.decode()
        looked_up = d.count("LOOKUP") - before
        before = d.count("LOOKUP")
        second = under(shortfuse, mp, ls)
        assert second.returncode == 0 and second.stdout.decode() == kernel, second.stderr.decode()
        # The first program looked up every name; the second, a new
        # program, found them kept by the server from the first's lookups
        # (shared, with the listings), as the kernel finds its dentries:
        # only the directories it opens (the tree and its 4) are looked up
        # again, to be sent with their OPENDIR.
        assert (looked_up >= 104, d.count("LOOKUP") - before <= 5) == (True, True), (
            looked_up,
            d.count("LOOKUP") - before,
        )
        # A change made through the rings drops what was kept of the file:
        # the next program sees it, not the kept attributes.
        chmod = under(shortfuse, mp, ["chmod", "600", str(mp / "tree" / "d1" / "f3")])
        assert chmod.returncode == 0, chmod.stderr.decode()
        listed = under(shortfuse, mp, ["ls", "-l", str(mp / "tree" / "d1")]).stdout.decode()
        assert [line.split()[0] for line in listed.splitlines() if line.endswith(" f3")] == ["-rw-------"], listed
    finally:
        d.stop()


# Prints, one line each, the mode and size of every path (lstat), or the
# error's name.
STATS = r"""
import errno, os, sys
for p in sys.argv[1:]:
    try:
        s = os.lstat(p)
        print(oct(s.st_mode), s.st_size)
    except OSError as e:
        print(errno.errorcode[e.errno])
"""


def ring_messages(d: Daemon) -> int:
    """Every request the rings brought to serve so far."""
    return sum(o["count"] for o in d.stats()["ops"])


def test_a_program_stats_names_another_looked_up_without_a_ring_message(shortfuse, scratch):
    d, src, mp = sshfs(shortfuse, scratch, "entry_timeout=60,attr_timeout=60")
    try:
        for i in range(3):
            (src / "tree" / f"d{i}").mkdir(parents=True)
            for j in range(10):
                (src / "tree" / f"d{i}" / f"f{j}").write_text("x" * j)
        paths = [str(mp / "tree" / f"d{i}" / f"f{j}") for i in range(3) for j in range(10)]
        kernel = subprocess.run(
            [sys.executable, "-c", STATS, *paths], capture_output=True, timeout=60, check=True
        ).stdout.decode()
        first = run_under(shortfuse, mp, STATS, *paths)
        assert first == kernel
        # A second program stats the same 30 names (and their 4
        # directories): every one from serve's shared table, no lookup and
        # no other request on the rings but those of the program's start.
        before = d.count("LOOKUP"), d.count("GETATTR"), d.count("INIT")
        start = ring_messages(d)
        assert run_under(shortfuse, mp, STATS, *paths) == kernel
        stats = ring_messages(d) - start
        # Only the program's connection: its INIT and the root's GETATTR.
        after = d.count("LOOKUP"), d.count("GETATTR"), d.count("INIT")
        assert ([a - b for a, b in zip(after, before)], stats) == ([0, 1, 1], 2)
        # A change one program makes is seen by the next stat of another,
        # not what the table held.
        f3 = str(mp / "tree" / "d1" / "f3")
        p = under(shortfuse, mp, ["chmod", "600", f3])
        assert p.returncode == 0, p.stderr.decode()
        assert run_under(shortfuse, mp, STATS, f3) == "0o100600 3\n"
        p = under(shortfuse, mp, ["sh", "-c", f"echo longer than three > {f3}"])
        assert p.returncode == 0, p.stderr.decode()
        assert run_under(shortfuse, mp, STATS, f3) == "0o100600 18\n"
        p = under(shortfuse, mp, ["mv", f3, f3 + ".moved"])
        assert p.returncode == 0, p.stderr.decode()
        assert run_under(shortfuse, mp, STATS, f3, f3 + ".moved") == "ENOENT\n0o100600 18\n"
        p = under(shortfuse, mp, ["rm", "-r", str(mp / "tree" / "d2")])
        assert p.returncode == 0, p.stderr.decode()
        assert run_under(shortfuse, mp, STATS, paths[-1], str(mp / "tree" / "d2")) == "ENOENT\nENOENT\n"
    finally:
        d.stop()


# The daemon of RAW_PRELUDE (below) with names valid for a minute:
# file "f" (node 2) of 5 bytes. On SIGUSR1 the file grows to 9 bytes and
# the daemon sends INVAL_INODE of it; on SIGUSR2 the name goes and it
# sends INVAL_ENTRY. Each notification is noted in the log as "inval".
INVALIDATING = r"""
import signal
state = {"size": 5, "there": True}
def notify(code, body):
    try:
        os.write(fd, struct.pack("<IiQ", 16 + len(body), code, 0) + body)
    except OSError:
        pass  # the kernel had nothing cached
    note("inval")
def grow(*_):
    state["size"] = 9
    notify(2, struct.pack("<Qqq", 2, 0, 0))  # INVAL_INODE
def remove(*_):
    state["there"] = False
    notify(3, struct.pack("<QII", 1, 1, 0) + b"f\0")  # INVAL_ENTRY
signal.signal(signal.SIGUSR1, grow)
signal.signal(signal.SIGUSR2, remove)
def answer(req):
    ln, op, unique, node = struct.unpack_from("<IIQQ", req)
    if op == 1:  # LOOKUP
        note(f"{op} {'ring' if unique >> 63 else 'kernel'}")
        if req[40:].split(b"\0")[0] == b"f" and state["there"]:
            reply(unique, struct.pack("<QQQQII", 2, 0, 60, 60, 0, 0) + attr(2, 0o100644, state["size"]))
        else:
            reply(unique, err=errno.ENOENT)
    elif op == 3 and node == 2:  # GETATTR
        reply(unique, struct.pack("<QII", 60, 0, 0) + attr(2, 0o100644, state["size"]))
    else:
        return raw_answer(req)
    return True
serve_blocking()
"""


def test_an_invalidation_from_the_daemon_takes_the_name_out_of_the_shared_table(shortfuse, scratch):
    mp, log = scratch / "mnt", scratch / "requests.log"
    mp.mkdir()
    daemon = RAW_PRELUDE + "raw_answer = answer\n" + INVALIDATING
    d = Daemon(shortfuse, scratch, ["--", sys.executable, "-c", daemon, str(mp), str(log)], mp)
    pid = daemon_pid(d.proc.pid)

    def lookups() -> int:
        return log.read_text().splitlines().count("1 ring")

    def after_signal(sig: int):
        sent = log.read_text().count("inval")
        os.kill(pid, sig)
        deadline = time.monotonic() + 30
        while log.read_text().count("inval") == sent:
            assert time.monotonic() < deadline, "the daemon sent no invalidation"
            time.sleep(0.02)

    try:
        f = str(mp / "f")
        assert run_under(shortfuse, mp, STATS, f) == "0o100644 5\n"
        # The next program finds the name in the shared table.
        before = lookups()
        assert run_under(shortfuse, mp, STATS, f) == "0o100644 5\n"
        assert lookups() == before
        after_signal(signal.SIGUSR1)
        assert run_under(shortfuse, mp, STATS, f) == "0o100644 9\n"
        after_signal(signal.SIGUSR2)
        assert run_under(shortfuse, mp, STATS, f) == "ENOENT\n"
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


# A FUSE daemon of its own /dev/fuse loop (as root: open, mount(2)) and
# its answers: a root with file "good" of 5 bytes, and a LOOKUP of "bad"
# answered with a reply whose header claims more bytes than it carries.
# Each request is noted in the log file (last argument) as "OPCODE ring"
# or "OPCODE kernel" (the rings' requests have bit 63 of their unique
# set). `serve_blocking` reads requests and answers them until the
# session ends.
RAW_PRELUDE = r"""
import ctypes, errno, os, struct, sys
mp, log = sys.argv[-2], sys.argv[-1]
fd = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
if libc.mount(b"rawfuse", mp.encode(), b"fuse.rawfuse", 6, opts) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
def attr(ino, mode, size):
    # fuse_attr: ino size blocks atime mtime ctime (u64) atimensec mtimensec ctimensec mode nlink uid gid rdev blksize flags (u32)
    return struct.pack("<QQQQQQIIIIIIIIII", ino, size, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)
def entry(ino, mode, size):
    return struct.pack("<QQQQII", ino, 0, 1, 1, 0, 0) + attr(ino, mode, size)
def reply(unique, body=b"", err=0, claim=None):
    os.write(fd, struct.pack("<IiQ", claim or 16 + len(body), -err, unique) + body)
def answer(req):
    # False once the kernel ends the session.
    ln, op, unique, node = struct.unpack_from("<IIQQ", req)
    body = req[40:]
    note(f"{op} {'ring' if unique >> 63 else 'kernel'}")
    if op == 26:  # INIT
        reply(unique, struct.pack("<IIIIHHIIHHI", 7, 31, 0, 0, 0, 0, 1 << 17, 1, 0, 0, 0) + b"\0" * 28)
    elif op == 3:  # GETATTR
        reply(unique, struct.pack("<QII", 1, 0, 0) + attr(node, 0o40755 if node == 1 else 0o100644, 0 if node == 1 else 5))
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
        return False
    else:
        reply(unique, err=errno.ENOSYS)
    return True
def serve_blocking():
    while True:
        try:
            req = os.read(fd, 1 << 21)
        except OSError as e:
            if e.errno in (errno.EINTR, errno.ENOENT):
                continue
            return
        if not answer(req):
            return
"""

RAW_DAEMON = RAW_PRELUDE + "serve_blocking()\n"


def test_a_malformed_reply_fails_that_call_only(shortfuse, scratch):
    mp = scratch / "mnt"
    mp.mkdir()
    d = Daemon(shortfuse, scratch, ["--", sys.executable, "-c", RAW_DAEMON, str(mp), str(scratch / "requests.log")], mp)
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


# A daemon of its own /dev/fuse loop that serves file "f" by kernel
# passthrough, as libfuse 3.16's fuse_passthrough_open does: INIT agrees
# FUSE_PASSTHROUGH, OPEN registers the backing file with
# FUSE_DEV_IOC_BACKING_OPEN and answers FOPEN_PASSTHROUGH with its id,
# RELEASE closes the registration. It serves READ and WRITE too (a client
# that does not take the backing file still works), and logs every
# registration to argv[3].
PASSTHROUGH_DAEMON = r"""
import ctypes, errno, os, struct, sys
mp, backing, log = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
if libc.mount(b"ptfuse", mp.encode(), b"fuse.ptfuse", 6, opts) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))
BACKING_OPEN, BACKING_CLOSE = 0x4010E501, 0x4004E502
FOPEN_PASSTHROUGH, PASSTHROUGH2 = 1 << 7, 1 << 5  # PASSTHROUGH: flags2 bit 5
ioctl = libc.ioctl
ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
def attr(ino, mode, size):
    return struct.pack("<QQQQQQIIIIIIIIII", ino, size, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)
def file_attr():
    return attr(2, 0o100644, os.stat(backing).st_size)
def reply(unique, body=b"", err=0):
    os.write(fd, struct.pack("<IiQ", 16 + len(body), -err, unique) + body)
handles, next_fh = {}, 1
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
        major, minor, ra, flags = struct.unpack_from("<IIII", body)
        flags2 = struct.unpack_from("<I", body, 16)[0] if len(body) >= 20 else 0
        if not flags2 & PASSTHROUGH2:
            note("no passthrough offered")
        # major minor max_readahead flags max_background congestion max_write
        # time_gran max_pages map_alignment flags2 max_stack_depth, padding.
        out = struct.pack("<IIIIHHIIHHII", 7, 40, 0, 1 << 30, 16, 12, 1 << 17, 1, 32, 0, PASSTHROUGH2, 1)
        reply(unique, out + b"\0" * (64 - len(out)))
    elif op == 3:  # GETATTR
        a = attr(1, 0o40755, 0) if node == 1 else file_attr()
        reply(unique, struct.pack("<QII", 0, 0, 0) + a)
    elif op == 1:  # LOOKUP
        if body.split(b"\0")[0] == b"f":
            reply(unique, struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + file_attr())
        else:
            reply(unique, err=errno.ENOENT)
    elif op == 14:  # OPEN
        flags = struct.unpack_from("<I", body)[0]
        bfd = os.open(backing, flags & os.O_ACCMODE)
        arg = struct.pack("<iIQ", bfd, 0, 0)
        buf = ctypes.create_string_buffer(arg, len(arg))
        bid = ioctl(fd, BACKING_OPEN, ctypes.addressof(buf))
        if bid <= 0:
            note("BACKING_OPEN failed: " + os.strerror(ctypes.get_errno()))
            os.close(bfd)
            reply(unique, err=errno.EIO)
            continue
        note(f"registered {bid}")
        fh, next_fh = next_fh, next_fh + 1
        handles[fh] = (bfd, bid)
        reply(unique, struct.pack("<QIi", fh, FOPEN_PASSTHROUGH, bid))
    elif op == 18:  # RELEASE
        fh = struct.unpack_from("<Q", body)[0]
        bfd, bid = handles.pop(fh)
        idbuf = ctypes.create_string_buffer(struct.pack("<I", bid), 4)
        ioctl(fd, BACKING_CLOSE, ctypes.addressof(idbuf))
        os.close(bfd)
        reply(unique)
    elif op == 15:  # READ
        fh, off, size = struct.unpack_from("<QQI", body)
        reply(unique, os.pread(handles[fh][0], size, off))
    elif op == 16:  # WRITE
        fh, off, size = struct.unpack_from("<QQI", body)
        reply(unique, struct.pack("<II", os.pwrite(handles[fh][0], body[40:40 + size], off), 0))
    elif op == 25:  # FLUSH
        reply(unique)
    elif op in (2, 42):  # FORGET, BATCH_FORGET
        pass
    elif op == 38:  # DESTROY
        reply(unique)
        break
    else:
        reply(unique, err=errno.ENOSYS)
"""

PASSTHROUGH_WORK = r"""
import os, sys
fd = os.open(sys.argv[1] + "/f", os.O_RDWR)
os.pwrite(fd, b"through the backing file", 6)
print(os.pread(fd, 64, 0).decode(), os.fstat(fd).st_size)
os.close(fd)
"""


def test_kernel_passthrough_registrations_are_lent_to_the_rings(shortfuse, scratch):
    mp, backing, log = scratch / "mnt", scratch / "backing", scratch / "log"
    mp.mkdir()
    backing.write_bytes(b"hello " + b"." * 30)
    cmd = ["--", sys.executable, "-c", PASSTHROUGH_DAEMON, str(mp), str(backing), str(log)]
    d = Daemon(shortfuse, scratch, cmd, mp)
    try:
        # The kernel mount reads through the registration.
        assert (mp / "f").read_bytes() == b"hello " + b"." * 30
        assert "registered" in log.read_text(), log.read_text()
        p = under(shortfuse, mp, [sys.executable, "-c", PASSTHROUGH_WORK, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["hello", "through", "the", "backing", "file......", "36"]
        assert backing.read_bytes() == b"hello through the backing file......"
        # The open went over the rings, its data to the backing file: the
        # daemon served no READ or WRITE.
        assert d.count("OPEN") >= 1
        assert (d.count("READ"), d.count("WRITE")) == (0, 0)
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


# A daemon of its own /dev/fuse loop serving a directory of FILES files
# (nodes 2...) with entry and attribute timeouts of argv[3] seconds (60
# when not given), that agrees
# FUSE_DO_READDIRPLUS when offered, as libfuse 3 and go-fuse do. It logs to
# argv[2] every INIT, every lookup it hands out (LOOKUP, and each
# READDIRPLUS entry with a node) and every FORGET, so that a test can see
# which requests came and that every lookup was given back.
LISTING_DAEMON = r"""
import ctypes, errno, os, struct, sys
mp, log = sys.argv[1], sys.argv[2]
TTL = int(sys.argv[3]) if len(sys.argv) > 3 else 60
FILES = 50
fd = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
if libc.mount(b"lsfuse", mp.encode(), b"fuse.lsfuse", 6, opts) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))
DO_READDIRPLUS = 1 << 13
names = [f"f{i}".encode() for i in range(FILES)]
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
def attr(node):
    mode = 0o40755 if node == 1 else 0o100644
    return struct.pack("<QQQQQQIIIIIIIIII", node, 0, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)
def entry(node):
    return struct.pack("<QQQQII", node, 0, TTL, TTL, 0, 0) + attr(node)
def reply(unique, body=b"", err=0):
    os.write(fd, struct.pack("<IiQ", 16 + len(body), -err, unique) + body)
def listing(body, plus):
    _, offset, size = struct.unpack_from("<QQI", body)
    out = b""
    for i in range(offset, len(names) + 2):
        name = [b".", b".."][i] if i < 2 else names[i - 2]
        node = i if i >= 2 else 0
        rec = struct.pack("<QQII", node or 1, i + 1, len(name), 8 if node else 4) + name
        rec += b"\0" * (-len(rec) % 8)
        if plus:
            rec = (entry(node) if node else b"\0" * 128) + rec
        if len(out) + len(rec) > size:
            break
        if plus and node:
            note(f"LISTED {node}")
        out += rec
    return out
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
        flags = struct.unpack_from("<IIII", body)[3]
        note("INIT")
        out = struct.pack("<IIIIHHIIHHII", 7, 40, 0, flags & DO_READDIRPLUS, 16, 12, 1 << 17, 1, 32, 0, 0, 0)
        reply(unique, out + b"\0" * (64 - len(out)))
    elif op == 3:  # GETATTR
        reply(unique, struct.pack("<QII", TTL, 0, 0) + attr(node))
    elif op == 1:  # LOOKUP
        name = body.split(b"\0")[0]
        if node == 1 and name in names:
            child = names.index(name) + 2
            note(f"LOOKUP {child}")
            reply(unique, entry(child))
        else:
            reply(unique, err=errno.ENOENT)
    elif op == 27:  # OPENDIR
        note("OPENDIR")
        reply(unique, struct.pack("<QII", 7, 0, 0))
    elif op in (28, 44):  # READDIR, READDIRPLUS
        if op == 44:
            note("READDIRPLUS")
        reply(unique, listing(body, op == 44))
    elif op == 29:  # RELEASEDIR
        note("RELEASEDIR")
        reply(unique)
    elif op == 2:  # FORGET
        note(f"FORGET {node} {struct.unpack_from('<Q', body)[0]}")
    elif op == 42:  # BATCH_FORGET
        count = struct.unpack_from("<I", body)[0]
        for i in range(count):
            n, k = struct.unpack_from("<QQ", body, 8 + 16 * i)
            note(f"FORGET {n} {k}")
    elif op == 38:  # DESTROY
        reply(unique)
        break
    else:
        reply(unique, err=errno.ENOSYS)
"""

LS_L = r"""
import os, sys
mp = sys.argv[1]
print(sum(os.lstat(os.path.join(mp, n)).st_size == 0 for n in os.listdir(mp)))
"""


def listing_daemon(
    shortfuse: Path, base: Path, options: tuple[str, ...] = (), ttl: int = 60, daemon: str = LISTING_DAEMON
) -> tuple[Daemon, Path, Path]:
    mp, log = base / "mnt", base / "log"
    mp.mkdir()
    log.touch()
    cmd = [*options, "--", sys.executable, "-c", daemon, str(mp), str(log), str(ttl)]
    return Daemon(shortfuse, base, cmd, mp), mp, log


def held_lookups(log: Path) -> dict[int, int]:
    """Per node, the lookups the daemon handed out and was not given back."""
    held: dict[int, int] = {}
    for line in log.read_text().splitlines():
        word, *args = line.split()
        if word in ("LOOKUP", "LISTED"):
            held[int(args[0])] = held.get(int(args[0]), 0) + 1
        elif word == "FORGET":
            held[int(args[0])] = held.get(int(args[0]), 0) - int(args[1])
    return {n: c for n, c in held.items() if c != 0}


def test_a_listing_over_the_rings_brings_the_entries_of_a_readdirplus_daemon(shortfuse, scratch):
    # Names valid for 2 s: serve keeps a departed program's lookups of
    # listed names while they are valid, then gives them back.
    d, mp, log = listing_daemon(shortfuse, scratch, ttl=2)
    try:
        p = under(shortfuse, mp, [sys.executable, "-c", LS_L, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["50"]
        text = log.read_text().splitlines()
        # The listing brought every name's node and attributes: the stat
        # of each was answered from the program's cache, no LOOKUP.
        assert "READDIRPLUS" in text, text
        assert [line for line in text if line.startswith("LOOKUP")] == []
        assert len([line for line in text if line.startswith("LISTED")]) >= 50
        # The program has gone: every lookup its listing counted is given
        # back once the names timed out (the server forgets what a
        # departed client held, and what it kept of it).
        deadline = time.monotonic() + 10
        while held_lookups(log) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held_lookups(log) == {}
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


def test_readdirplus_no_keeps_the_ring_clients_on_readdir(shortfuse, scratch):
    d, mp, log = listing_daemon(shortfuse, scratch, ("-o", "readdirplus=no"))
    try:
        p = under(shortfuse, mp, [sys.executable, "-c", LS_L, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["50"]
        text = log.read_text().splitlines()
        assert "READDIRPLUS" not in text
        assert len([line for line in text if line.startswith("LOOKUP")]) == 50
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


# LISTING_DAEMON that, on SIGUSR1, gets a file "new" and tells the kernel
# with INVAL_INODE of the directory (noted as "inval" in its log).
GROWING_LISTING = LISTING_DAEMON.replace(
    "while True:",
    """import signal
def grow(*_):
    names.append(b"new")
    try:
        os.write(fd, struct.pack("<IiQ", 40, 2, 0) + struct.pack("<Qqq", 1, 0, 0))
    except OSError:
        pass  # the kernel had nothing cached
    note("inval")
signal.signal(signal.SIGUSR1, grow)
while True:""",
    1,
)

LIST = r"""
import os, sys
print(" ".join(sorted(os.listdir(sys.argv[1]))))
"""


def test_a_second_program_lists_from_the_shared_listing_until_the_daemon_invalidates_it(shortfuse, scratch):
    d, mp, log = listing_daemon(shortfuse, scratch, daemon=GROWING_LISTING)

    def count(prefix: str) -> int:
        return len([line for line in log.read_text().splitlines() if line.startswith(prefix)])

    try:
        p = under(shortfuse, mp, [sys.executable, "-c", LS_L, str(mp)])
        assert (p.returncode, p.stdout.decode().split()) == (0, ["50"]), p.stderr.decode()
        before = count("READDIRPLUS"), count("LOOKUP"), count("OPENDIR")
        p = under(shortfuse, mp, [sys.executable, "-c", LS_L, str(mp)])
        assert (p.returncode, p.stdout.decode().split()) == (0, ["50"]), p.stderr.decode()
        # A second program lists the directory from the listing serve
        # shares and stats each name from its shared table: the daemon
        # hears no READDIRPLUS and no LOOKUP (only the OPENDIR).
        after = count("READDIRPLUS"), count("LOOKUP"), count("OPENDIR")
        assert [a - b for a, b in zip(after, before)] == [0, 0, 1]
        # The daemon's invalidation of the directory takes the listing out:
        # the next listing is the daemon's, with the new name.
        sent = count("inval")
        os.kill(daemon_pid(d.proc.pid), signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while count("inval") == sent:
            assert time.monotonic() < deadline, "the daemon sent no invalidation"
            time.sleep(0.02)
        p = under(shortfuse, mp, [sys.executable, "-c", LIST, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        assert "new" in p.stdout.decode().split(), p.stdout.decode()
        assert count("READDIRPLUS") > after[0]
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


def test_a_change_through_the_rings_is_in_the_next_program_s_listing_of_sshfs(shortfuse, scratch):
    d, src, mp = sshfs(shortfuse, scratch, "entry_timeout=60,attr_timeout=60")
    try:
        (src / "tree").mkdir()
        for j in range(20):
            (src / "tree" / f"f{j:02}").write_text("x" * j)
        tree = str(mp / "tree")
        ls = ["ls", "-l", "--time-style=+%s", tree]

        def names() -> list[str]:
            p = under(shortfuse, mp, ls)
            assert p.returncode == 0, p.stderr.decode()
            return [line.split()[-1] for line in p.stdout.decode().splitlines()[1:]]

        want = [f"f{j:02}" for j in range(20)]
        # The first program's listing is shared (the directory's attributes
        # vouch for it), and the names it looked up are: the second lists
        # and stats without asking the daemon.
        assert names() == want
        before = d.count("READDIRPLUS"), d.count("LOOKUP")
        assert names() == want
        # Only the path to the tree is looked up again (to open it).
        after = d.count("READDIRPLUS"), d.count("LOOKUP")
        assert (after[0] - before[0], after[1] - before[1] <= 1) == (0, True), (before, after)
        # Another program's changes through the rings take the listing out
        # before they are answered: the next listing shows them.
        for argv in (["touch", tree + "/new"], ["rm", tree + "/f03"]):
            p = under(shortfuse, mp, argv)
            assert p.returncode == 0, p.stderr.decode()
        assert names() == sorted([n for n in want if n != "f03"] + ["new"])
    finally:
        d.stop()


# Lists the mount (a lookup of every name), keeps the directory open, and
# waits to be killed.
LIST_AND_HOLD = r"""
import os, sys, time
mp = sys.argv[1]
print(sum(os.lstat(os.path.join(mp, n)).st_size == 0 for n in os.listdir(mp)))
held = os.open(mp, os.O_RDONLY | os.O_DIRECTORY)
print("holding", flush=True)
time.sleep(600)
"""


def test_a_ring_client_killed_has_its_lookups_and_handles_given_back(shortfuse, scratch):
    d, mp, log = listing_daemon(shortfuse, scratch, ttl=2)
    try:
        before = log.read_text().count("RELEASEDIR")
        p = subprocess.Popen(
            [str(shortfuse), "run", "-m", str(mp), "--", sys.executable, "-c", LIST_AND_HOLD, str(mp)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert p.stdout.readline().split() == ["50"]
            assert p.stdout.readline().strip() == "holding"
            assert held_lookups(log), "the listing handed out no lookups"
        finally:
            p.kill()
            p.wait()
        # The daemon took the program's requests itself; serve gives back
        # what the program held once it is gone.
        assert d.stats()["daemon"]["taken"] > 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (held_lookups(log) or log.read_text().count("RELEASEDIR") == before):
            time.sleep(0.1)
        assert held_lookups(log) == {}
        assert log.read_text().count("RELEASEDIR") > before
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


# Stats each of the files named in argv[2:] (all in argv[1]).
STAT_EACH = r"""
import os, sys
print(sum(os.stat(os.path.join(sys.argv[1], n)).st_size for n in sys.argv[2:]))
"""


def test_the_daemon_takes_ring_requests_from_the_queues_itself(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        names = [f"f{i}" for i in range(200)]
        for n in names:
            (src / n).write_bytes(b"x")
        figures = d.stats()["daemon"]
        p = under(shortfuse, mp, [sys.executable, "-c", STAT_EACH, str(mp), *names])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["200"]
        after = d.stats()["daemon"]
        # A lookup per name, each taken by a daemon thread from the ring
        # client's queue and answered in its slot; serve's threads passed
        # on only what the daemon hands them (the program's releases and
        # forgets at its end), not a request per call.
        assert after["taken"] - figures["taken"] >= 200
        assert after["relayed"] - figures["relayed"] < 20, after
    finally:
        d.stop()


# Reads argv[1] whole in 1 MiB calls; prints its length and its SHA-256.
READ_WHOLE = r"""
import hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
h, n = hashlib.sha256(), 0
while True:
    b = os.read(fd, 1 << 20)
    if not b:
        break
    h.update(b)
    n += len(b)
os.close(fd)
print(n, h.hexdigest())
"""


def test_the_daemon_s_read_data_goes_from_its_buffers_to_the_program_s_slot(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        data = os.urandom(8 << 20)
        (src / "big").write_bytes(data)
        before = d.stats()
        p = under(shortfuse, mp, [sys.executable, "-c", READ_WHOLE, str(mp / "big")])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == [str(len(data)), hashlib.sha256(data).hexdigest()]
        after = d.stats()
        # The daemon's threads took the reads themselves, and their replies
        # went from bindfs's buffers into the program's slot: only the
        # replies serve must see too (the lookup, the open) were gathered
        # into a buffer on the way, never the 8 MiB the reads carried.
        reads = sum(o["count"] for o in after["ops"] if o.get("name") == "READ") - sum(
            o["count"] for o in before["ops"] if o.get("name") == "READ"
        )
        assert reads >= 8, after["ops"]
        assert after["daemon"]["taken"] - before["daemon"]["taken"] >= 8
        assert after["daemon"]["copied"] - before["daemon"]["copied"] < 64 << 10, after["daemon"]
    finally:
        d.stop()


# Writes argv[2] over the start of argv[1], opened for reading and writing.
OVERWRITE = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
os.pwrite(fd, sys.argv[2].encode(), 0)
os.close(fd)
"""


def test_bindfs_s_handles_declared_backing_files_serve_read_only_opens_without_it(shortfuse, scratch):
    src, mp = scratch / "src", scratch / "mnt"
    src.mkdir()
    mp.mkdir()
    bindfs = sfmount.require_tool("bindfs")
    d = Daemon(shortfuse, scratch, ["--backing-handles", "--", bindfs, "-f", str(src), str(mp)], mp)
    try:
        data = os.urandom(4 << 20)
        (src / "big").write_bytes(data)
        (src / "small").write_text("before")
        reads, opens = d.count("READ"), d.count("OPEN")
        p = under(shortfuse, mp, [sys.executable, "-c", READ_WHOLE, str(mp / "big")])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == [str(len(data)), hashlib.sha256(data).hexdigest()]
        # bindfs opened the file and kept its descriptor as the handle; the
        # program read that file itself: not one READ reached bindfs.
        assert d.count("OPEN") > opens
        assert d.count("READ") == reads
        # A writing open is bindfs's own, and the kernel mount sees the
        # change at once.
        assert (mp / "small").read_text() == "before"
        writes = d.count("WRITE")
        p = under(shortfuse, mp, [sys.executable, "-c", OVERWRITE, str(mp / "small"), "AFTER!"])
        assert p.returncode == 0, p.stderr.decode()
        assert d.count("WRITE") > writes
        assert (mp / "small").read_text() == "AFTER!"
    finally:
        d.stop()


# Stats the names argv[2:] (all in argv[1], none there): how many were missing.
STAT_MISSING = r"""
import os, sys
missing = 0
for n in sys.argv[2:]:
    try:
        os.stat(os.path.join(sys.argv[1], n))
    except FileNotFoundError:
        missing += 1
print(missing)
"""


def test_a_failed_lookup_the_daemon_took_is_not_sent_to_serve(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        names = [f"none{i}" for i in range(200)]
        figures = d.stats()["daemon"]
        p = under(shortfuse, mp, [sys.executable, "-c", STAT_MISSING, str(mp), *names])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["200"]
        after = d.stats()["daemon"]
        # The daemon answered each lookup itself; a failed one hands out
        # nothing a client could leave behind, so serve hears of none (only
        # of the program's own start: its libraries, its directory).
        assert after["taken"] - figures["taken"] >= 200
        assert after["told"] - figures["told"] < 50, (figures, after)
    finally:
        d.stop()


# Opens and closes argv[1], argv[2] times.
OPEN_CLOSE = r"""
import os, sys
for _ in range(int(sys.argv[2])):
    os.close(os.open(sys.argv[1], os.O_RDONLY))
"""


def test_an_open_and_close_sends_serve_one_message_at_most(shortfuse, scratch):
    # The word of an open is kept back until the daemon's next message or
    # until its reader sleeps. Its reader polls 1 ms for the next request,
    # so that the count does not depend on whether a quiet machine's CPUs
    # let the program's close arrive within the default 20 µs.
    d, src, mp = bindfs(shortfuse, scratch, ("--daemon-spin-us", "1000"))
    try:
        (src / "f").write_text("x")
        n = 300
        releases = d.count("RELEASE")
        figures = d.stats()["daemon"]
        p = under(shortfuse, mp, [sys.executable, "-c", OPEN_CLOSE, str(mp / "f"), str(n)])
        assert p.returncode == 0, p.stderr.decode()
        after = d.stats()["daemon"]
        # Each close still reached bindfs.
        assert d.count("RELEASE") - releases >= n
        # The release goes through serve (it checks who owns the handle),
        # and carries the word of the open kept back for it; with no lock
        # ever asked for, serve has nothing to do at the flush. Each
        # message wakes serve's reader and a job thread; an open and close
        # sent three.
        heard = after["heard"] - figures["heard"]
        assert heard < 1.5 * n, (figures, after)
    finally:
        d.stop()


# Stats a missing name argv[2] times in directory argv[1].
STAT_MISSING_AGAIN = r"""
import os, sys
for _ in range(int(sys.argv[2])):
    try:
        os.stat(os.path.join(sys.argv[1], "missing"))
    except FileNotFoundError:
        pass
"""


def test_daemon_spin_us_0_makes_the_daemon_s_reader_sleep_after_each_request(shortfuse, scratch):
    src, mp = scratch / "src", scratch / "mnt"
    src.mkdir()
    mp.mkdir()
    d = Daemon(
        shortfuse,
        scratch,
        ["--daemon-spin-us", "0", "--", sfmount.require_tool("bindfs"), "-f", str(src), str(mp)],
        mp,
    )
    try:
        n = 200
        figures = d.stats()["daemon"]
        p = under(shortfuse, mp, [sys.executable, "-c", STAT_MISSING_AGAIN, str(mp), str(n)])
        assert p.returncode == 0, p.stderr.decode()
        after = d.stats()["daemon"]
        # Each lookup finds the daemon asleep (it polled for none), so the
        # program's request wakes it; with the default window the next
        # lookup comes while it polls and wakes nothing.
        assert after["woken"] - figures["woken"] >= n // 4, (figures, after)
    finally:
        d.stop()


# Removes the files argv[2:] of directory argv[1].
UNLINK = r"""
import os, sys
for n in sys.argv[2:]:
    os.unlink(os.path.join(sys.argv[1], n))
"""


def test_an_unlink_is_handed_back_by_the_thread_that_read_it(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        names = [f"f{i}" for i in range(200)]
        for n in names:
            (src / n).write_text("x")
        figures = d.stats()["daemon"]
        p = under(shortfuse, mp, [sys.executable, "-c", UNLINK, str(mp), *names])
        assert p.returncode == 0, p.stderr.decode()
        after = d.stats()["daemon"]
        assert os.listdir(src) == [] and os.listdir(mp) == []
        # serve tells the kernel mount and the other programs of each
        # removal, and hands the answer back, on the thread that read it
        # from the daemon: no job thread is woken on the program's path.
        assert after["at_once"] - figures["at_once"] >= len(names), (figures, after)
    finally:
        d.stop()


# Looks at one file as root, drops root, then looks at a file only root
# may read.
DROP_ROOT = r"""
import os, sys
os.stat(sys.argv[2])
os.setgid(65534)
os.setuid(65534)
try:
    os.stat(sys.argv[1])
    print("served")
except PermissionError:
    print("refused")
"""


def test_a_ring_program_that_drops_root_is_another_user_to_the_daemon(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        (src / "secret").write_text("root's")
        (src / "secret").chmod(0o600)
        (src / "open").write_text("anybody's")
        # Without allow_other the daemon serves its own user alone, as
        # its kernel mount does: a program that left that user is refused
        # whichever thread takes its request.
        p = under(shortfuse, mp, [sys.executable, "-c", DROP_ROOT, str(mp / "secret"), str(mp / "open")])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["refused"]
        assert d.stats()["daemon"]["taken"] > 0
    finally:
        d.stop()


def a_tree_with_modes(root: Path):
    """Directories, files and a link with modes other than the defaults."""
    root.mkdir()
    for d, mode in [("d000", 0o750), ("d000/sub", 0o700), ("d001", 0o755), ("d002", 0o2775), ("d002/deep", 0o711)]:
        (root / d).mkdir()
        (root / d).chmod(mode)
    for f, mode in [("top", 0o644), ("d000/f", 0o640), ("d000/sub/x", 0o600), ("d001/run", 0o755), ("d002/deep/g", 0o444)]:
        (root / f).write_text(f"contents of {f}\n" * 3)
        (root / f).chmod(mode)
    (root / "d001" / "link").symlink_to("run")


def test_rsync_a_over_the_rings_copies_directories_and_modes_as_natively(shortfuse, scratch):
    rsync = sfmount.require_tool("rsync")
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        a_tree_with_modes(src / "tree")
        native = scratch / "native"
        native.mkdir()
        shutil.copytree(src / "tree", native / "tree", symlinks=True)
        p = subprocess.run([rsync, "-a", "tree/", "copy/"], cwd=native, capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        # rsync opens each directory it made for reading and fchmods it
        # (3.2.4 on): a directory's handle, served by bindfs.
        p = under(shortfuse, mp, [rsync, "-a", "tree/", "copy/"], cwd=mp)
        assert p.returncode == 0, p.stderr.decode()
        want = test_run.tree(native / "copy")
        assert want["d000"]["mode"] == "0o750" and want["d002"]["mode"] == "0o2775", want
        assert test_run.tree(mp / "copy") == want
        assert test_run.tree(src / "copy") == want
        assert d.stats()["transports"]["ring"] > 0
    finally:
        d.stop()


# Calls that change a file through a descriptor, or through the
# descriptor's /proc/self/fd link: a directory opened for reading, and
# O_PATH descriptors of a directory and a file (which glibc's
# lchmod/fchmodat(AT_SYMLINK_NOFOLLOW) opens and chmods through
# /proc/self/fd). Prints what each gave, the root as ROOT.
THROUGH_DESCRIPTORS = r"""
import os, stat, sys
root = sys.argv[1]
def show(what, f):
    try:
        r = f()
    except OSError as e:
        r = os.strerror(e.errno)
    print(what, str(r).replace(root, "ROOT"))
def mode(p):
    return oct(stat.S_IMODE(os.lstat(p).st_mode))
d, f = f"{root}/dir", f"{root}/file"
fd = os.open(d, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
show("fchmod dir", lambda: (os.fchmod(fd, 0o750), mode(d))[1])
show("fchown dir", lambda: os.fchown(fd, 0, 0))
show("futimens dir", lambda: (os.utime(fd, (1, 2)), os.stat(d).st_mtime)[1])
show("fstat dir", lambda: oct(os.fstat(fd).st_mode))
os.close(fd)
for p in (d, f):
    n = os.path.basename(p)
    fd = os.open(p, os.O_PATH | os.O_NOFOLLOW)
    for link in (f"/proc/self/fd/{fd}", f"/proc/thread-self/fd/{fd}", f"/dev/fd/{fd}"):
        l = link.replace(str(fd), "N")
        show(f"readlink {l} {n}", lambda: os.readlink(link))
        show(f"chmod {l} {n}", lambda: (os.chmod(link, 0o701), mode(p))[1])
        show(f"stat {l} {n}", lambda: oct(os.stat(link).st_mode))
        show(f"utime {l} {n}", lambda: (os.utime(link, (3, 4)), os.stat(p).st_mtime)[1])
        show(f"chown {l} {n}", lambda: os.chown(link, 0, 0))
    show(f"lchmod {n}", lambda: (os.chmod(p, 0o710, follow_symlinks=False), mode(p))[1])
    show(f"fchmod O_PATH {n}", lambda: os.fchmod(fd, 0o777))
    show(f"fchown O_PATH {n}", lambda: os.fchown(fd, 0, 0))
    show(f"futimens O_PATH {n}", lambda: os.utime(fd, (5, 6)))
    show(f"mode {n}", lambda: mode(p))
    os.close(fd)
"""


def test_changes_through_a_descriptor_or_its_proc_link_over_the_rings_are_as_natively(shortfuse, scratch):
    d, src, mp = bindfs(shortfuse, scratch)
    try:
        native = scratch / "native"
        for root in (native, src):
            root.mkdir(exist_ok=True)
            (root / "dir").mkdir()
            (root / "file").write_text("x")
        want = subprocess.run([sys.executable, "-c", THROUGH_DESCRIPTORS, str(native)], capture_output=True, timeout=60)
        assert want.returncode == 0, want.stderr.decode()
        p = under(shortfuse, mp, [sys.executable, "-c", THROUGH_DESCRIPTORS, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        lines = want.stdout.decode().splitlines()
        # What the kernel gives: the descriptor's own file through every
        # link, and EBADF for an O_PATH descriptor itself.
        assert "fchmod dir 0o750" in lines and "readlink /proc/self/fd/N dir ROOT/dir" in lines, lines
        assert "fchmod O_PATH file Bad file descriptor" in lines and "mode file 0o710" in lines, lines
        assert p.stdout.decode().splitlines() == lines
        assert stat.S_IMODE((src / "dir").stat().st_mode) == 0o710
    finally:
        d.stop()


def test_the_daemon_negotiates_init_once_for_its_kernel_mount_and_every_ring_client(shortfuse, scratch):
    d, mp, log = listing_daemon(shortfuse, scratch)
    try:
        assert sorted(os.listdir(mp))[:2] == ["f0", "f1"]
        for _ in range(3):
            p = under(shortfuse, mp, [sys.executable, "-c", LS_L, str(mp)])
            assert p.returncode == 0, p.stderr.decode()
            assert p.stdout.decode().split() == ["50"]
        assert d.count("INIT") >= 3, "the ring clients' INITs did not reach serve"
        assert log.read_text().splitlines().count("INIT") == 1
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


def test_shortfuse_passthrough_as_the_daemon_lends_files_the_rings_can_read_and_write(shortfuse, scratch):
    # shortfuse's own passthrough registers each inode once, through an
    # O_PATH descriptor (the kernel opens the backing file itself with
    # each open's flags): a ring client lent that descriptor could neither
    # read nor write through it.
    src, mp = scratch / "src", scratch / "mnt"
    src.mkdir()
    mp.mkdir()
    (src / "f").write_bytes(b"hello " + b"." * 30)
    cmd = ["--", str(shortfuse), "mount", "-f", "passthrough", str(src), str(mp)]
    d = Daemon(shortfuse, scratch, cmd, mp)
    try:
        assert (mp / "f").read_bytes() == b"hello " + b"." * 30
        p = under(shortfuse, mp, [sys.executable, "-c", PASSTHROUGH_WORK, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["hello", "through", "the", "backing", "file......", "36"]
        assert (src / "f").read_bytes() == b"hello through the backing file......"
        assert d.count("OPEN") >= 1
        assert (d.count("READ"), d.count("WRITE")) == (0, 0)
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


# The raw daemon, which waits (argv[1]: epoll, epoll-et, poll, ppoll with a
# signal mask, or select) until /dev/fuse or a pipe beside it is readable,
# then reads its /dev/fuse descriptor, made non-blocking as Python does it
# (ioctl FIONBIO), until EAGAIN ("drained").
WAITING_DAEMON = RAW_PRELUDE + r"""
import select, signal
how = sys.argv[1]
os.set_blocking(fd, False)
quiet, _ = os.pipe()
if how.startswith("epoll"):
    ep = select.epoll()
    ep.register(quiet, select.EPOLLIN)
    ep.register(fd, select.EPOLLIN | (select.EPOLLET if how == "epoll-et" else 0))
    wait = ep.poll
elif how == "poll":
    p = select.poll()
    p.register(quiet, select.POLLIN)
    p.register(fd, select.POLLIN)
    wait = p.poll
elif how == "ppoll":
    # struct pollfd { int fd; short events, revents; }, twice; glibc's sigset_t.
    fds = (ctypes.c_int * 4)()
    mask = (ctypes.c_uint64 * 16)(1 << (signal.SIGUSR1 - 1))
    def wait():
        fds[:] = [quiet, select.POLLIN, fd, select.POLLIN]
        if libc.ppoll(fds, 2, None, mask) < 0:
            sys.exit("ppoll: " + os.strerror(ctypes.get_errno()))
elif how == "select":
    wait = lambda: select.select([quiet, fd], [], [])
while True:
    wait()
    while True:
        try:
            req = os.read(fd, 1 << 21)
        except BlockingIOError:
            note("drained")
            break
        except OSError as e:
            if e.errno in (errno.EINTR, errno.ENOENT):
                continue
            sys.exit(0)
        if not answer(req):
            sys.exit(0)
"""

STAT_GOOD = "import os, sys\nprint(os.stat(sys.argv[1] + '/good').st_size, os.stat(sys.argv[1]).st_mode)\n"


@pytest.mark.parametrize("how", ["epoll", "epoll-et", "poll", "ppoll", "select"])
def test_a_daemon_that_waits_for_dev_fuse_to_be_readable_gets_the_rings_requests(shortfuse, scratch, how):
    # Without the rings' requests counted in the readiness of its /dev/fuse
    # descriptor, the daemon never wakes for them and the program hangs.
    mp, log = scratch / "mnt", scratch / "requests.log"
    mp.mkdir()
    d = Daemon(shortfuse, scratch, ["--", sys.executable, "-c", WAITING_DAEMON, how, str(mp), str(log)], mp)
    try:
        p = subprocess.run(
            [str(shortfuse), "run", "-m", str(mp), "--", sys.executable, "-c", STAT_GOOD, str(mp)],
            capture_output=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.split() == [b"5", b"16877"]
        lines = log.read_text().split("\n")
        assert "1 ring" in lines
        # Its reads come back empty-handed (EAGAIN), not blocking it, once
        # the rings' requests are read: it goes back to its wait.
        after = lines.index("1 ring")
        assert sfmount.wait_until(lambda: "drained" in log.read_text().split("\n")[after:], 30), (
            "the daemon's non-blocking read blocked"
        )
        # Its kernel mount is served as before.
        assert os.stat(mp / "good").st_size == 5
        assert d.proc.poll() is None
    finally:
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


# The raw daemon with a thread blocked reading /dev/fuse; on SIGUSR1 its
# main thread forks five children and notes "forked".
FORKING_DAEMON = RAW_PRELUDE + r"""
import signal, threading
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
threading.Thread(target=serve_blocking, daemon=True).start()
signal.sigwait({signal.SIGUSR1})
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
note("forked")
signal.sigwait({signal.SIGUSR1})
"""


def test_a_fork_in_the_daemon_does_not_wait_for_its_threads_waiting_for_requests(shortfuse, scratch):
    # A fork waits for the other threads' served calls to end (their locks
    # would stay held in the child), up to 100 ms, spinning on
    # sched_yield. A thread waiting for the next request holds none, and
    # the daemon's reading threads wait most of the time: a fork must not
    # wait for them. Counted (strace on the forking thread), not timed.
    mp, log = scratch / "mnt", scratch / "requests.log"
    mp.mkdir()
    d = Daemon(shortfuse, scratch, ["--", sys.executable, "-c", FORKING_DAEMON, str(mp), str(log)], mp)
    pid = daemon_pid(d.proc.pid)
    strace = None
    try:

        def reading() -> bool:
            # The reading thread in the shim's wait for the kernel and the rings.
            for t in Path(f"/proc/{pid}/task").iterdir():
                if t.name != str(pid) and (t / "syscall").read_text().split()[0] == "271":  # ppoll
                    return True
            return False

        assert sfmount.wait_until(reading, 30), "the daemon's thread does not wait for requests"
        trace, err = scratch / "strace.log", open(scratch / "strace.err", "w+")
        cmd = [sfmount.require_tool("strace"), "-p", str(pid), "-e", "trace=sched_yield", "-o", str(trace)]
        strace = subprocess.Popen(cmd, stderr=err)

        def attached() -> bool:
            err.seek(0)
            return " attached" in err.read()

        assert sfmount.wait_until(attached, 30), "strace did not attach to the daemon"
        os.kill(pid, signal.SIGUSR1)
        assert sfmount.wait_until(lambda: "forked" in log.read_text().split("\n"), 60)
        strace.send_signal(signal.SIGINT)
        strace.wait(timeout=30)
        yields = trace.read_text().count("sched_yield(")
        assert yields == 0, f"the forks waited for the reading thread ({yields} sched_yield calls)"
    finally:
        if strace is not None and strace.poll() is None:
            strace.kill()
            strace.wait()
        d.stop()
        for m in sfmount.mounts_at(mp):
            sfmount.run(["umount", "-l", m.mountpoint])


# ------------------------------------------------ the behaviour suite on them

DRIVER = "import os, sys\nos.mkdir(sys.argv[3])\n" + test_run.DRIVER


def sshfs_command(src: Path, mp: Path) -> list[str]:
    server = sfmount.sshd_server()
    opts = [f"port={server.port}", f"IdentityFile={server.key}"] + server.options()[2:]
    return [sfmount.require_tool("sshfs"), "-f", "-o", ",".join(opts), server.target(src), str(mp)]


@pytest.fixture(scope="module")
def served(request, shortfuse):
    base = sfmount.new_scratch(f"foreign-{request.param}")
    base.chmod(0o755)
    src, mp = base / "src", base / "mnt"
    src.mkdir()
    src.chmod(0o755)
    mp.mkdir()
    if request.param == "bindfs":
        cmd = [sfmount.require_tool("bindfs"), "-f", str(src), str(mp)]
    else:
        cmd = sshfs_command(src, mp)
    d = Daemon(shortfuse, base, ["--", *cmd], mp)
    yield request.param, d
    d.stop()
    for m in sfmount.mounts_at(mp):
        sfmount.run(["umount", "-l", m.mountpoint])
    sfmount.remove_scratch(base)


# Scenarios whose answers depend on whose cache answers, and when: the
# kernel mount keeps a hard link's nlink, another name's data and a chmod's
# ctime for the daemon's timeouts, the rings keep theirs, and sshfs keeps
# its own below both; and what is not the same yet.
EXCLUDED = {
    ("hard_links", "bindfs"): "the kernel mount's and the rings' caches of nlink and data under another name differ",
    ("hard_links", "sshfs"): "as for bindfs, and sshfs's own attribute cache below both",
    ("chmod_chown_utimens", "sshfs"): "sshfs's attribute cache answers both sides at different moments",
    ("mkdir_rmdir_nlink", "sshfs"): "sshfs's attribute cache answers both sides at different moments",
    ("create_modes", "bindfs"): "access(X_OK) as root: the kernel mount checks the mode (default_permissions), the rings ask bindfs",
    # 70 s on sshfs; bindfs runs it.
    ("readdir_10000_concurrent", "sshfs"): "slow over loopback SFTP: bindfs runs it",
}


def test_exclusions_name_real_scenarios():
    assert {n for n, _ in EXCLUDED} <= set(test_run.SCENARIO_NAMES), EXCLUDED


@pytest.mark.parametrize(
    "served,name",
    [(fs, n) for fs in ("bindfs", "sshfs") for n in test_run.SCENARIO_NAMES if (n, fs) not in EXCLUDED],
    indirect=["served"],
)
def test_posix_scenario_over_the_rings_matches_the_kernel_mount(shortfuse, served, name):
    which, d = served
    argv = [sys.executable, "-c", DRIVER, str(TESTS), name]
    kernel = f"{d.mp}/kernel-{name}"
    want = test_run.observe(argv + [kernel], kernel)
    assert want, f"{name} observed nothing through {which}'s kernel mount"
    rings = f"{d.mp}/rings-{name}"
    got = test_run.observe([str(shortfuse), "run", "-m", str(d.mp), "--", *argv, rings], rings)
    diff = test_posix.compare([tuple(o) for o in want], [tuple(o) for o in got])
    if diff is None:
        return
    # Where the kernel mount's answer is its own cache's (a hard link's
    # nlink, data written under another name, kept for the daemon's 1 s
    # timeouts) the rings may give the file system's: then they must give
    # what ext4 gives.
    native = Path(sfmount.new_scratch("foreign-native"))
    try:
        ref = test_run.observe(argv + [str(native / "s")], str(native / "s"))
    finally:
        sfmount.remove_scratch(native)
    also = test_posix.compare([tuple(o) for o in ref], [tuple(o) for o in got])
    assert also is None, (
        f"{name} on {which} over the rings differs from its kernel mount:\n{diff}\nand from ext4:\n{also}"
    )


# ------------------------------------------- daemons of other FUSE libraries

GO_FUSE = r"""
// A small go-fuse file system: one file in memory, and a directory in
// which files can be made, written and read.
package main

import (
	"context"
	"flag"
	"log"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

type root struct{ fs.Inode }

func (r *root) OnAdd(ctx context.Context) {
	f := &fs.MemRegularFile{Data: []byte("hello from go-fuse\n"), Attr: fuse.Attr{Mode: 0644}}
	r.AddChild("hello", r.NewPersistentInode(ctx, f, fs.StableAttr{Ino: 2}), false)
}

var _ = (fs.NodeOnAdder)((*root)(nil))

func main() {
	flag.Parse()
	server, err := fs.Mount(flag.Arg(0), &root{}, &fs.Options{})
	if err != nil {
		log.Fatalf("mount: %v", err)
	}
	server.Wait()
}
"""


def build_go_fuse(base: Path) -> Path:
    src = base / "gofuse"
    src.mkdir()
    (src / "main.go").write_text(GO_FUSE)
    (src / "go.mod").write_text("module gofusetest\n\ngo 1.18\n\nrequire github.com/hanwen/go-fuse/v2 v2.8.0\n")
    go = sfmount.require_tool("go")
    env = dict(os.environ, GOFLAGS="-mod=mod")
    for cmd in ([go, "mod", "tidy"], [go, "build", "-o", "gofusetest", "."]):
        p = sfmount.run(cmd, timeout=600, cwd=src, env=env)
        assert p.returncode == 0, f"{' '.join(cmd)}: {p.stderr}"
    return src / "gofusetest"


@pytest.mark.deadline(900)
def test_a_go_fuse_daemon_over_the_rings(shortfuse, scratch):
    daemon = build_go_fuse(scratch)
    mp = scratch / "mnt"
    mp.mkdir()
    d = Daemon(shortfuse, scratch, ["--", str(daemon), str(mp)], mp)
    try:
        p = under(shortfuse, mp, ["sh", "-c", f"ls {mp}; cat {mp}/hello"])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode() == "hello\nhello from go-fuse\n"
        assert d.count("LOOKUP") >= 1 and d.stats()["transports"]["ring"] > 0
        assert (mp / "hello").read_text() == "hello from go-fuse\n"
    finally:
        # go-fuse leaves SIGTERM to Go's default (exit, still mounted): the
        # scratch fixture unmounts.
        d.stop()


def test_squashfuse_over_the_rings(shortfuse, scratch):
    tree = scratch / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_bytes(b"squashed\n" * 1000)
    (tree / "top").write_text("top\n")
    image = scratch / "image.sqfs"
    p = sfmount.run([sfmount.require_tool("mksquashfs"), str(tree), str(image), "-quiet", "-noappend"], timeout=120)
    assert p.returncode == 0, p.stderr
    mp = scratch / "mnt"
    mp.mkdir()
    d = Daemon(shortfuse, scratch, ["--", sfmount.require_tool("squashfuse"), "-f", str(image), str(mp)], mp)
    try:
        script = f"import os; print(sorted(os.listdir('{mp}')), open('{mp}/sub/f').read() == 'squashed\\n' * 1000)"
        p = under(shortfuse, mp, [sys.executable, "-c", script])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode() == "['sub', 'top'] True\n"
        assert d.count("READ") >= 1 and d.stats()["transports"]["ring"] > 0
        # Read-only, as the image is.
        w = under(shortfuse, mp, ["sh", "-c", f"echo x > {mp}/new"])
        assert w.returncode != 0
        assert (mp / "top").read_text() == "top\n"
    finally:
        d.stop()


FUSER = r"""
//! A small fuser file system: one read-only file.
use fuser::{FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, Request};
use std::ffi::OsStr;
use std::time::{Duration, UNIX_EPOCH};

const TTL: Duration = Duration::from_secs(1);
const DATA: &[u8] = b"hello from fuser\n";

fn attr(ino: u64) -> FileAttr {
    let (kind, perm, size, nlink) = if ino == 1 { (FileType::Directory, 0o755, 0, 2) } else { (FileType::RegularFile, 0o644, DATA.len() as u64, 1) };
    FileAttr { ino, size, blocks: 1, atime: UNIX_EPOCH, mtime: UNIX_EPOCH, ctime: UNIX_EPOCH, crtime: UNIX_EPOCH, kind, perm, nlink, uid: 0, gid: 0, rdev: 0, flags: 0, blksize: 512 }
}

struct Hello;

impl Filesystem for Hello {
    fn lookup(&mut self, _req: &Request, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == 1 && name == "hello" { reply.entry(&TTL, &attr(2), 0) } else { reply.error(libc::ENOENT) }
    }
    fn getattr(&mut self, _req: &Request, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino <= 2 { reply.attr(&TTL, &attr(ino)) } else { reply.error(libc::ENOENT) }
    }
    fn read(&mut self, _req: &Request, ino: u64, _fh: u64, offset: i64, size: u32, _flags: i32, _lock: Option<u64>, reply: ReplyData) {
        if ino != 2 { return reply.error(libc::ENOENT) }
        let start = (offset as usize).min(DATA.len());
        reply.data(&DATA[start..(start + size as usize).min(DATA.len())]);
    }
    fn readdir(&mut self, _req: &Request, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
        if ino != 1 { return reply.error(libc::ENOENT) }
        let entries = [(1, FileType::Directory, "."), (1, FileType::Directory, ".."), (2, FileType::RegularFile, "hello")];
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(e.0, (i + 1) as i64, e.1, e.2) { break; }
        }
        reply.ok();
    }
}

fn main() {
    let mp = std::env::args().nth(1).expect("MOUNTPOINT");
    fuser::mount2(Hello, mp, &[MountOption::RO, MountOption::FSName("fusertest".into())]).unwrap();
}
"""

FUSER_TOML = """[package]
name = "fusertest"
version = "0.1.0"
edition = "2021"

[dependencies]
fuser = { version = "0.15", default-features = false, features = ["abi-7-31"] }
libc = "0.2"

[workspace]
"""


@pytest.mark.deadline(900)
def test_a_fuser_daemon_over_the_rings(shortfuse, scratch):
    crate = scratch / "fusertest"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(FUSER_TOML)
    (crate / "src" / "main.rs").write_text(FUSER)
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    p = sfmount.run([cargo, "build", "-q"], timeout=800, cwd=crate, env=dict(os.environ, CARGO_TARGET_DIR=str(crate / "target")))
    assert p.returncode == 0, p.stderr
    mp = scratch / "mnt"
    mp.mkdir()
    d = Daemon(shortfuse, scratch, ["--", str(crate / "target" / "debug" / "fusertest"), str(mp)], mp)
    try:
        p = under(shortfuse, mp, ["sh", "-c", f"ls {mp}; cat {mp}/hello"])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode() == "hello\nhello from fuser\n"
        assert d.count("READ") >= 1 and d.stats()["transports"]["ring"] > 0
        assert (mp / "hello").read_text() == "hello from fuser\n"
    finally:
        # fuser leaves SIGTERM to the default (exit, still mounted): the
        # scratch fixture unmounts.
        d.stop()
