"""Mount options whose promise only shows on a real mount: `allow_other`
lets another user in, passthrough's `one_file_system` stops at mount points
below the source, and the user-space cache's `meta_timeout` and
close-to-open consistency when a file changes behind the daemon."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import sfmount
import test_cache

PASSTHROUGH = sfmount.Config("passthrough", "dev")


class MountDefaults(sfmount.Config):
    """A configuration mounted with none of the suites' options: what
    `shortfuse mount FS SOURCE MNT` does by itself (the suites' `passthrough`
    turns kernel passthrough off, to test the daemon's own data path)."""

    @property
    def options(self) -> list[str]:
        return []


PASSTHROUGH_DEFAULTS = MountDefaults("passthrough", "dev")


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("allow_other", [False, True], ids=["default", "allow_other"])
def test_allow_other_lets_another_user_in(mount_factory, allow_other):
    m = mount_factory(sfmount.Config("mem", "dev"), ["allow_other"] if allow_other else None)
    # The way to the mount point is open to everyone (mkdtemp makes 0700).
    m.base.chmod(0o755)
    (m.path / "f").write_text("root's\n")
    ls = as_user("nobody", "ls", str(m.path))
    cat = as_user("nobody", "cat", str(m.path / "f"))
    if allow_other:
        assert ls.returncode == 0 and ls.stdout == "f\n", ls
        assert cat.returncode == 0 and cat.stdout == "root's\n", cat
        # The file modes still apply (no write bit for others).
        w = as_user("nobody", "sh", "-c", f"echo x >> {m.path / 'f'}")
        assert w.returncode != 0 and "Permission denied" in w.stderr, w
    else:
        # The kernel refuses any user but the one who mounted.
        assert ls.returncode != 0 and "Permission denied" in ls.stderr, ls
        assert cat.returncode != 0, cat


@pytest.mark.parametrize("one_fs", [False, True], ids=["default", "one_file_system"])
def test_one_file_system_stops_at_mount_points_below_the_source(mount_factory, one_fs):
    m = mount_factory(PASSTHROUGH, ["one_file_system"] if one_fs else None)
    inner = m.source / "inner"
    inner.mkdir()
    (m.source / "here").write_text("same fs\n")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(inner)], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    try:
        (inner / "there").write_text("other fs\n")
        assert (m.path / "here").read_text() == "same fs\n"
        if one_fs:
            with pytest.raises(OSError) as e:
                os.listdir(m.path / "inner")
            assert e.value.errno == errno.EXDEV, e.value
            with pytest.raises(OSError) as e:
                (m.path / "inner" / "there").read_text()
            assert e.value.errno == errno.EXDEV, e.value
        else:
            assert os.listdir(m.path / "inner") == ["there"]
            assert (m.path / "inner" / "there").read_text() == "other fs\n"
    finally:
        m.unmount()
        subprocess.run(["umount", "-l", str(inner)], timeout=30)


def test_meta_timeout_shows_a_change_made_elsewhere_after_the_timeout_not_before(mount_factory):
    # The kernel keeps no attributes, so every stat reaches the daemon's
    # cache, which trusts what it cached for meta_timeout seconds.
    timeout = 4
    m = mount_factory(PASSTHROUGH, [f"cache=on,meta_timeout={timeout},attr_timeout=0,entry_timeout=0"])
    (m.source / "f").write_text("x")
    os.chmod(m.source / "f", 0o644)
    t0 = time.monotonic()
    assert os.stat(m.path / "f").st_mode & 0o7777 == 0o644
    os.chmod(m.source / "f", 0o600)
    seen = None
    deadline = t0 + timeout + 60
    while time.monotonic() < deadline:
        now = time.monotonic()
        if os.stat(m.path / "f").st_mode & 0o7777 == 0o600:
            seen = now
            break
        time.sleep(0.1)
    assert seen is not None, "the change made in the source never showed"
    # Cached at the first stat, after t0: not trusted past the timeout, and
    # not dropped before it.
    assert seen - t0 >= timeout, f"the change showed {seen - t0:.2f}s after the look that cached it"


def test_close_to_open_sees_a_same_size_change_in_the_same_second(mount_factory):
    m = mount_factory(PASSTHROUGH, [test_cache.OPTS])
    src = m.source / "g"
    for attempt in range(20):
        (m.path / "g").write_bytes(b"A" * 40_000)
        assert (m.path / "g").read_bytes() == b"A" * 40_000  # now cached
        before = os.stat(src).st_mtime_ns
        # Behind the daemon, the same size, within the same second of the
        # mtime the cache saw (retried when the second ticked over).
        with open(src, "r+b") as f:
            f.write(b"C" * 40_000)
        if os.stat(src).st_mtime_ns // 10**9 == before // 10**9:
            break
    else:
        pytest.fail("could not change the file within one second of its last write")
    assert os.stat(src).st_size == 40_000
    assert (m.path / "g").read_bytes() == b"C" * 40_000


def daemon_counts(mp) -> dict[str, int]:
    """The daemon's requests so far, by name (`shortfuse stats --json`)."""
    p = subprocess.run([str(sfmount.shortfuse_bin()), "stats", "--json", str(mp)], capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr.decode()
    counts: dict[str, int] = {}
    for o in json.loads(p.stdout)["ops"]:
        counts[o["name"]] = counts.get(o["name"], 0) + o["count"]
    return counts


def lookups(mp) -> int:
    return daemon_counts(mp).get("LOOKUP", 0)


@pytest.mark.parametrize("opts", [None, ["negative_timeout=0"]], ids=["default", "negative_timeout=0"])
def test_passthrough_caches_missing_names_until_the_mount_creates_them(mount_factory, opts):
    m = mount_factory(PASSTHROUGH, opts)
    missing = m.path / "missing"
    before = lookups(m.path)
    for _ in range(50):
        with pytest.raises(FileNotFoundError):
            os.stat(missing)
    asked = lookups(m.path) - before
    if opts is None:
        # One LOOKUP, then the kernel's cached miss (one more per second the
        # loop might take on a loaded machine).
        assert asked < 25, asked
    else:
        # The user's negative_timeout=0 wins over the default: every stat asks.
        assert asked == 50, asked
    # A name created through the mount replaces the cached miss at once.
    missing.write_text("made here\n")
    assert os.stat(missing).st_size == 10
    assert (m.source / "missing").read_text() == "made here\n"
    os.unlink(missing)
    with pytest.raises(FileNotFoundError):
        os.stat(missing)
    assert not (m.source / "missing").exists()


@pytest.mark.parametrize("opts", [None, ["no_passthrough"]], ids=["default", "no_passthrough"])
def test_passthrough_default_keeps_file_data_away_from_the_daemon(mount_factory, opts):
    """As root, `shortfuse mount passthrough` hands open files to the kernel
    (FUSE_PASSTHROUGH): their reads and writes go to the source file without
    a READ or WRITE reaching the daemon. `-o no_passthrough` brings them back."""
    m = mount_factory(PASSTHROUGH_DEFAULTS, opts)
    data = os.urandom(256 * 1024)
    # Written in the source, so that nothing of it is in the mount's page cache.
    (m.source / "old").write_bytes(data)
    before = daemon_counts(m.path)
    # Read while a writer holds the file: the reader joins the writer's
    # passthrough open instead of filling the mount's page cache.
    with open(m.path / "old", "r+b") as w:
        assert (m.path / "old").read_bytes() == data
        w.write(b"x")
    with open(m.path / "new", "wb") as f:
        f.write(data[:100_000])
    assert (m.source / "new").read_bytes() == data[:100_000]
    counts = daemon_counts(m.path)
    asked = {op: counts.get(op, 0) - before.get(op, 0) for op in ("OPEN", "CREATE", "READ", "WRITE")}
    assert asked["OPEN"] >= 1 and asked["CREATE"] >= 1, asked
    if opts is None:
        assert asked["READ"] == 0 and asked["WRITE"] == 0, asked
    else:
        assert asked["READ"] > 0 and asked["WRITE"] > 0, asked


def data_requests(m, before: dict[str, int]) -> dict[str, int]:
    counts = daemon_counts(m.path)
    return {op: counts.get(op, 0) - before.get(op, 0) for op in ("OPEN", "READ", "WRITE")}


@pytest.mark.parametrize("opts", [None, ["no_reader_cache"]], ids=["default", "no_reader_cache"])
def test_passthrough_default_reads_unchanged_files_from_the_page_cache(mount_factory, opts):
    """By default a read-only open of a file that no open passes through is
    served from the mount's page cache (a cached read then costs one copy,
    not the passthrough path's two files): the first read of the data
    reaches the daemon, later opens of the unchanged file keep the pages and
    send no READ. `-o no_reader_cache` passes readers through: no READ."""
    m = mount_factory(PASSTHROUGH_DEFAULTS, opts)
    data = os.urandom(256 * 1024)
    (m.source / "f").write_bytes(data)
    before = daemon_counts(m.path)
    assert (m.path / "f").read_bytes() == data
    first = data_requests(m, before)
    before = daemon_counts(m.path)
    for _ in range(3):
        assert (m.path / "f").read_bytes() == data
    again = data_requests(m, before)
    assert first["OPEN"] == 1 and again["OPEN"] == 3, (first, again)
    assert again["READ"] == 0, f"an unchanged file was read again from the daemon: {again}"
    if opts is None:
        assert first["READ"] > 0, f"a reader was passed through: {first}"
    else:
        assert first["READ"] == 0, first


@pytest.mark.parametrize("opts", [None, ["reader_cache_max=8M"]], ids=["default", "reader_cache_max=8M"])
def test_passthrough_default_passes_large_files_through_to_readers(mount_factory, opts):
    """The reader cache takes files of up to 1 MiB by default: a larger one
    is passed through to its readers, so its reads reach neither the daemon
    nor the mount's page cache (big reads copy faster from the source's large
    folios). `-o reader_cache_max=8M` takes it into the cache again."""
    m = mount_factory(PASSTHROUGH_DEFAULTS, opts)
    small, large = os.urandom(64 * 1024), os.urandom(4 << 20)
    (m.source / "small").write_bytes(small)
    (m.source / "large").write_bytes(large)
    before = daemon_counts(m.path)
    assert (m.path / "large").read_bytes() == large
    asked = data_requests(m, before)
    assert asked["OPEN"] == 1, asked
    if opts is None:
        assert asked["READ"] == 0, f"a 4 MiB file was read through the daemon: {asked}"
    else:
        assert asked["READ"] > 0, f"a 4 MiB file was passed through under reader_cache_max=8M: {asked}"
    # A small file still fills the mount's page cache.
    before = daemon_counts(m.path)
    assert (m.path / "small").read_bytes() == small
    assert data_requests(m, before)["READ"] > 0


def test_reader_cache_sees_every_change(mount_factory):
    """The pages a reader cached are never served stale: not after a change
    made in the source behind the mount (same size), nor after a write
    through the mount's passthrough, nor while a reader holds the file open
    during a write through the mount (the writer then goes through the
    daemon and the page cache). Sizes and times match the source."""
    m = mount_factory(PASSTHROUGH_DEFAULTS)
    f, s = m.path / "f", m.source / "f"
    size = 64 * 1024
    s.write_bytes(b"a" * size)
    assert f.read_bytes() == b"a" * size
    assert f.read_bytes() == b"a" * size  # cached, kept
    # Behind the mount, same size.
    with open(s, "r+b") as h:
        h.write(b"b" * size)
    assert f.read_bytes() == b"b" * size
    # Through the mount, nothing else open: passed through, the page cache
    # the readers filled is left behind and must not be served.
    before = daemon_counts(m.path)
    with open(f, "r+b") as h:
        h.write(b"c" * 100)
    assert data_requests(m, before)["WRITE"] == 0
    assert f.read_bytes() == b"c" * 100 + b"b" * (size - 100)
    assert s.read_bytes() == f.read_bytes()
    # A reader holds the file while a writer grows it through the mount.
    fd = os.open(f, os.O_RDONLY)
    try:
        assert os.pread(fd, 4, 0) == b"cccc"
        before = daemon_counts(m.path)
        with open(f, "r+b") as h:
            h.seek(size)
            h.write(b"d" * 5000)
            h.seek(0)
            h.write(b"e" * 10)
        assert data_requests(m, before)["WRITE"] > 0, "the writer did not join the reader's page-cache mode"
        assert os.pread(fd, 12, 0) == b"e" * 10 + b"cc"
        assert os.pread(fd, 10, size - 2) == b"bb" + b"d" * 8
    finally:
        os.close(fd)
    want = b"e" * 10 + b"c" * 90 + b"b" * (size - 100) + b"d" * 5000
    assert f.read_bytes() == want and s.read_bytes() == want
    # Sizes and times are the source's, as a new opener sees them.
    with open(f, "rb") as h:
        got = os.fstat(h.fileno())
    src = os.stat(s)
    assert (got.st_size, got.st_mtime_ns) == (src.st_size, src.st_mtime_ns) == (len(want), src.st_mtime_ns)


@pytest.mark.parametrize("opts", [None, ["no_passthrough"]], ids=["default", "no_passthrough"])
def test_closing_a_file_on_a_local_source_sends_no_flush(mount_factory, opts):
    """A FLUSH at close(2) lets a source that defers write errors (NFS)
    report them; a local source (ext4, tmpfs, ...) has none to report, so
    no open of it, for writing or not, costs a FLUSH at close."""
    m = mount_factory(PASSTHROUGH_DEFAULTS, opts)
    (m.source / "old").write_bytes(b"x" * 10)
    before = daemon_counts(m.path)
    for i in range(5):
        with open(m.path / f"made{i}", "wb") as f:  # CREATE
            f.write(b"made")
        for mode in (os.O_WRONLY, os.O_RDWR | os.O_APPEND, os.O_RDONLY):  # OPEN
            os.close(os.open(m.path / "old", mode))
    counts = daemon_counts(m.path)
    asked = {op: counts.get(op, 0) - before.get(op, 0) for op in ("OPEN", "CREATE", "RELEASE", "FLUSH")}
    assert asked["CREATE"] == 5 and asked["OPEN"] == 15 and asked["RELEASE"] >= 1, asked
    assert asked["FLUSH"] == 0, asked
    assert all((m.source / f"made{i}").read_bytes() == b"made" for i in range(5))


@pytest.mark.parametrize("opts", [["writeback_cache"], ["optimized"]], ids=["writeback_cache", "optimized"])
def test_a_write_back_mount_of_a_local_source_stops_flush_at_close(mount_factory, opts):
    """Under write-back the kernel sends FLUSH on every close(2), read-only
    or not, and waits for it. On a local source it has nothing to do (the
    kernel writes the dirty pages back before it), so the daemon answers the
    first with ENOSYS and the kernel sends no more: open+close costs one
    round trip, as on a default mount. What was written still reaches the
    source by the time close returns."""
    m = mount_factory(PASSTHROUGH_DEFAULTS, opts)
    (m.source / "old").write_bytes(b"x" * 10)
    before = daemon_counts(m.path)
    for i in range(5):
        with open(m.path / f"made{i}", "wb") as f:  # CREATE
            f.write(b"made")
        assert (m.source / f"made{i}").read_bytes() == b"made"
        for mode in (os.O_WRONLY, os.O_RDWR | os.O_APPEND, os.O_RDONLY):  # OPEN
            os.close(os.open(m.path / "old", mode))
    with open(m.path / "old", "r+b") as f:
        f.write(b"y" * 4)
    assert (m.source / "old").read_bytes() == b"y" * 4 + b"x" * 6
    counts = daemon_counts(m.path)
    asked = {op: counts.get(op, 0) - before.get(op, 0) for op in ("OPEN", "CREATE", "RELEASE", "FLUSH")}
    assert asked["CREATE"] == 5 and asked["OPEN"] == 16 and asked["RELEASE"] >= 1, asked
    assert asked["FLUSH"] <= 1, asked


class DaemonStrace:
    """strace attached to a daemon while the block runs; `read` gets its
    output once it has detached."""

    def __init__(self, pid: int, log: Path, args: list[str]):
        self.pid, self.log, self.args = pid, log, args

    def __enter__(self):
        self.err = open(self.log.with_suffix(".err"), "w+")
        cmd = [sfmount.require_tool("strace"), "-f", "-p", str(self.pid), *self.args, "-o", str(self.log)]
        self.proc = subprocess.Popen(cmd, stderr=self.err)

        def attached() -> bool:
            # "Process N attached with T threads", once all are.
            self.err.seek(0)
            return " attached" in self.err.read()

        assert sfmount.wait_until(attached, 30), "strace did not attach to the daemon"
        return self

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)
        self.err.close()
        self.read(self.log.read_text())

    def read(self, text: str) -> None:
        raise NotImplementedError


class BackingIoctls(DaemonStrace):
    """The /dev/fuse backing-file ioctls a daemon makes while the block
    runs, as strace sees them: FUSE_DEV_IOC_BACKING_OPEN registers a source
    file with the kernel for passthrough, FUSE_DEV_IOC_BACKING_CLOSE drops
    the registration."""

    # strace prints the names, or the raw request numbers when it does not
    # know them.
    OPEN = re.compile(r"ioctl\(\d+, (FUSE_DEV_IOC_BACKING_OPEN|_IOC\(_IOC_WRITE, 0xe5, 0x1, 0x10\))")
    CLOSE = re.compile(r"ioctl\(\d+, (FUSE_DEV_IOC_BACKING_CLOSE|_IOC\(_IOC_WRITE, 0xe5, 0x2, 0x4\))")

    def __init__(self, pid: int, log: Path):
        super().__init__(pid, log, ["-e", "trace=ioctl"])
        self.opens = self.closes = 0

    def read(self, text: str) -> None:
        self.opens = len(self.OPEN.findall(text))
        self.closes = len(self.CLOSE.findall(text))


class DaemonSyscalls(DaemonStrace):
    """How many times a daemon made each system call of `names` while the
    block runs, as `strace -c` counts them."""

    ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")

    def __init__(self, pid: int, log: Path, names: tuple[str, ...]):
        super().__init__(pid, log, ["-c", "-e", "trace=" + ",".join(names)])
        self.calls: dict[str, int] = {}

    def read(self, text: str) -> None:
        for line in text.splitlines():
            row = self.ROW.match(line)
            if row and row.group(2) != "total":
                self.calls[row.group(2)] = int(row.group(1))


def wait_for_requests(mp, before: dict[str, int], ops: tuple[str, ...], at_least: int) -> dict[str, int]:
    """Waits until the daemon has served `at_least` more requests of `ops`
    than `before` (RELEASE and FORGET come after close(2) returns)."""
    seen: dict[str, int] = {}

    def done() -> bool:
        nonlocal seen
        seen = daemon_counts(mp)
        return sum(seen.get(op, 0) - before.get(op, 0) for op in ops) >= at_least

    assert sfmount.wait_until(done, 30, 0.05), (ops, before, seen)
    return seen


def test_passthrough_registers_a_file_once_for_all_its_opens(mount_factory, tmp_path):
    """Kernel passthrough needs the source file registered with the kernel
    (an ioctl pair on /dev/fuse). A file opened again after its last close
    keeps its second registration for every later open until the kernel
    forgets the inode; the next open after that registers it again and
    works."""
    m = mount_factory(PASSTHROUGH_DEFAULTS)
    data = os.urandom(64 * 1024)
    (m.source / "f").write_bytes(data)
    os.stat(m.path / "f")
    [pid] = m.daemon_pids

    before = daemon_counts(m.path)
    with BackingIoctls(pid, tmp_path / "opens.log") as calls:
        for i in range(20):
            with open(m.path / "f", "rb" if i % 2 else "r+b") as f:
                assert f.read() == data
        wait_for_requests(m.path, before, ("RELEASE",), 20)
    # The first close drops the first registration; the second is kept.
    assert (calls.opens, calls.closes) == (2, 1), "backing-file registrations and closes over 20 opens"

    # Evicting the kernel's unused inodes sends FORGET: the registration
    # goes with it.
    before = daemon_counts(m.path)
    with BackingIoctls(pid, tmp_path / "forget.log") as calls:
        Path("/proc/sys/vm/drop_caches").write_text("2\n")
        wait_for_requests(m.path, before, ("FORGET", "BATCH_FORGET"), 1)
    assert (calls.opens, calls.closes) == (0, 1), "registrations and closes at FORGET"

    # The file is looked up, registered and served again.
    before = daemon_counts(m.path)
    with BackingIoctls(pid, tmp_path / "again.log") as calls:
        with open(m.path / "f", "r+b") as f:
            assert f.read() == data
            f.seek(0)
            f.write(b"again")
        wait_for_requests(m.path, before, ("RELEASE",), 1)
    assert (calls.opens, calls.closes) == (1, 1), "registrations and closes of the reopened file"
    assert (m.source / "f").read_bytes() == b"again" + data[5:]


def test_passthrough_opens_and_looks_up_a_known_file_with_few_system_calls(mount_factory, tmp_path):
    """The daemon's part of an open+close and of a lookup, counted in system
    calls: the first read-only open reopens the source file, and later
    ones share that descriptor (no open, no close); each reads its status
    once (the check of the open's data map gives what the page-cache check
    needs), with no getpid(2) for the /proc directory it reopens through;
    a lookup of a name whose inode the daemon holds already is one stat,
    without opening and closing a second descriptor of it."""
    stats = ("newfstatat", "fstat", "statx")
    names = ("getpid", "openat", "openat2", "close") + stats

    def mount_with_a_file(options=None):
        m = mount_factory(PASSTHROUGH_DEFAULTS, options)
        (m.path / "f").write_bytes(b"x" * 4096)
        os.stat(m.path / "f")
        [pid] = m.daemon_pids
        return m, pid, daemon_counts(m.path)

    m, pid, before = mount_with_a_file()
    with DaemonSyscalls(pid, tmp_path / "opens.log", names) as opens:
        for _ in range(20):
            os.close(os.open(m.path / "f", os.O_RDONLY))
        seen = wait_for_requests(m.path, before, ("RELEASE",), 20)
    asked = {op: seen.get(op, 0) - before.get(op, 0) for op in ("OPEN", "RELEASE")}
    assert asked == {"OPEN": 20, "RELEASE": 20}, asked
    calls = opens.calls
    assert calls.get("getpid", 0) == 0, calls
    assert sum(calls.get(n, 0) for n in stats) <= 20 + 1, calls
    # Read-only opens share one descriptor of the file, opened once.
    assert calls.get("openat", 0) <= 1 and calls.get("close", 0) <= 1, calls

    # entry_timeout=0: each stat asks the daemon to look the name up again.
    m, pid, before = mount_with_a_file(["entry_timeout=0"])
    with DaemonSyscalls(pid, tmp_path / "lookups.log", names) as lookups:
        for _ in range(20):
            assert os.stat(m.path / "f").st_size == 4096
    looked_up = daemon_counts(m.path).get("LOOKUP", 0) - before.get("LOOKUP", 0)
    assert looked_up >= 20, looked_up
    calls = lookups.calls
    assert calls.get("openat2", 0) == 0, calls
    assert sum(calls.get(n, 0) for n in stats) <= 2 * looked_up, calls
