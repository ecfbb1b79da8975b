"""distfs through the CLI: `shortfuse dist up`, several `shortfuse mount dist`
daemons (separate processes, one lease session each) and the consistency
checker `shortfuse dist check` across them, for each consistency mode; a
client daemon killed with SIGKILL (its fsync'd data stays, its leases go);
and the server killed with SIGKILL and restarted (no lease is lost: a
client's cached writes reach the next reader)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import sfmount


class Server:
    """`shortfuse dist up` on a free loopback port, stopped on close; `extra`
    arguments after the data directory (`--etcd URL`: an agent)."""

    def __init__(self, base: Path, listen: str = "127.0.0.1:0", extra: tuple[str, ...] = ()):
        # Its log in a file: a pipe nobody reads would fill up and stall it.
        fd, log = tempfile.mkstemp(prefix="dist-up-", suffix=".log", dir=base)
        self.log = Path(log)
        with os.fdopen(fd, "w") as err:
            self.proc = subprocess.Popen(
                [str(sfmount.shortfuse_bin()), "dist", "up", "--data", str(base / "data"), "--listen", listen, *extra],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        line = self.proc.stdout.readline()
        if " on " not in line:
            self.proc.kill()
            raise AssertionError(f"dist up did not start: {line!r} {self.log.read_text()}")
        self.addr = line.rsplit(" on ", 1)[1].strip()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


class Clients:
    """Mounts of one server under `base`, unmounted on close."""

    def __init__(self, base: Path, addr: str):
        self.base, self.addr, self.paths = base, addr, []

    def mount(self, name: str, *options: str) -> Path:
        mp = self.base / name
        mp.mkdir()
        cmd = [str(sfmount.shortfuse_bin()), "mount", "dist", self.addr, str(mp)]
        for o in options:
            cmd += ["-o", o]
        r = sfmount.run(cmd, timeout=30)
        assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}"
        assert sfmount.wait_until(lambda: sfmount.is_mounted(mp), 5), mp
        self.paths.append(mp)
        return mp

    def close(self) -> None:
        for mp in self.paths:
            if not sfmount.is_mounted(mp):
                continue
            # Found before the unmount, so that a daemon left running by a
            # lazy unmount (one that would not let go) is stopped rather
            # than outliving the test.
            pids = sfmount.pids_of_daemon(sfmount.shortfuse_bin(), str(mp))
            r = sfmount.run([str(sfmount.shortfuse_bin()), "umount", str(mp)], timeout=30)
            if r.returncode != 0:
                sfmount.run([str(sfmount.shortfuse_bin()), "umount", "-l", str(mp)], timeout=30)
            if not sfmount.wait_until(lambda: not any(sfmount.pid_alive(p) for p in pids), 10):
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


@pytest.fixture
def dist():
    base = sfmount.new_scratch("dist")
    server = Server(base)
    clients = Clients(base, server.addr)
    try:
        yield clients
    finally:
        clients.close()
        server.close()
        sfmount.remove_scratch(base)


def check(mounts: list[Path], seed: int, ops: int = 150) -> subprocess.CompletedProcess:
    cmd = [str(sfmount.shortfuse_bin()), "dist", "check", *map(str, mounts), "--ops", str(ops), "--seed", str(seed)]
    return sfmount.run(cmd, timeout=120)


def assert_checker_passes(mounts: list[Path], mode: str, ops: int = 150) -> None:
    r = check(mounts, 1, ops)
    assert r.returncode == 0, f"{mode}: {r.stdout}{r.stderr}"
    assert ": no violation" in r.stdout, r.stdout


def assert_weak_is_caught(mounts: list[Path], ops: int = 150) -> None:
    """Any violation is a proof; a run without one is possible in theory,
    so up to three runs."""
    outputs = []
    for seed in (1, 2, 3):
        r = check(mounts, seed, ops)
        if r.returncode != 0:
            assert "consistency violated" in r.stderr, r.stderr
            assert "stale" in r.stdout or "initial" in r.stdout, r.stdout
            # Said in words, not in the checker's internal types.
            assert "broke the rule" in r.stdout and "Value(" not in r.stdout and "Read(" not in r.stdout, r.stdout
            return
        outputs.append(r.stdout)
    raise AssertionError(f"weak was never caught: {outputs}")


def assert_killed_writer_loses_only_unsynced(a: Path, b: Path, daemon_pids) -> None:
    """The client daemon of mount `a` is killed with data fsync'd and more
    only cached; the client of `b` reads the former, not the latter, and
    writes on (the dead client's lease went with its connection: b does
    not wait for the lease TTL)."""
    fd = os.open(a / "f", os.O_CREAT | os.O_RDWR, 0o644)
    os.pwrite(fd, b"synced", 0)
    os.fsync(fd)
    os.pwrite(fd, b" and cached", 6)
    # The write-back cache holds the tail: b's read would revoke a's lease
    # and get it, so a dies first.
    pids = daemon_pids()
    assert pids, "no daemon found for the first mount"
    for p in pids:
        os.kill(p, signal.SIGKILL)
    assert sfmount.wait_until(lambda: not any(sfmount.pid_alive(p) for p in pids), 10)
    try:
        os.close(fd)
    except OSError:
        pass  # the daemon is gone: ENOTCONN
    assert (b / "f").read_bytes() == b"synced"
    with open(b / "f", "r+b") as f:
        f.seek(6)
        f.write(b"!")
    assert (b / "f").read_bytes() == b"synced!"


@pytest.mark.deadline(150)
@pytest.mark.parametrize("mode", ["lease", "writethrough"])
def test_strong_modes_pass_the_checker(dist, mode):
    assert_checker_passes([dist.mount(f"m{i}", f"consistency={mode}") for i in range(3)], mode)


@pytest.mark.deadline(150)
def test_weak_is_caught_by_the_checker(dist):
    assert_weak_is_caught([dist.mount(f"m{i}", "consistency=weak") for i in range(3)])


def listing(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.deadline(120)
def test_checker_leaves_existing_files_alone(dist):
    """The checker works in a directory of its own and removes it: files
    with the names it uses stay as they were, and nothing is left behind.
    Directories outside distfs are refused unless --force."""
    a, b = dist.mount("a"), dist.mount("b")
    for name in ("check-0", "check-1", "notes"):
        (a / name).write_bytes(f"the user's {name}\n".encode())
    (a / "sub").mkdir()
    (a / "sub" / "check-0").write_bytes(b"deeper\n")
    before = listing(a)
    r = check([a, b], 1, ops=60)
    assert r.returncode == 0 and ": no violation" in r.stdout, f"{r.stdout}{r.stderr}"
    assert listing(a) == before and listing(b) == before, "the checker touched or left files"

    plain = dist.base / "plain"
    plain.mkdir()
    (plain / "check-0").write_bytes(b"mine\n")
    r = check([plain, plain], 1, ops=20)
    assert r.returncode != 0 and "not in a distfs mount" in r.stderr and "--force" in r.stderr, r.stderr
    r = sfmount.run([str(sfmount.shortfuse_bin()), "dist", "check", str(plain), str(plain), "--ops", "20", "--force"], timeout=60)
    assert r.returncode == 0 and ": no violation" in r.stdout, f"{r.stdout}{r.stderr}"
    assert listing(plain) == {"check-0": b"mine\n"}


def hold_round(a: Path, b: Path, name: str, write_for: float) -> dict:
    """Mount `a` writes a counter into `name` in a loop, under its write
    lease, for `write_for` seconds after its grant (at most until mount
    `b`'s read of it returned); `b` reads it once while `a` writes. What
    the two saw, on one clock."""
    (a / name).write_bytes(b"%08d" % 0)
    fd_b = os.open(b / name, os.O_RDONLY)
    fd_a = os.open(a / name, os.O_RDWR)
    granted, b_done = threading.Event(), threading.Event()
    seen: dict = {}

    def writer():
        os.pwrite(fd_a, b"%08d" % 1, 0)  # takes the write lease back from nothing
        start = time.monotonic()
        granted.set()
        k = 1
        while time.monotonic() - start < write_for and not b_done.is_set():
            k += 1
            seen["last_write_began"] = time.monotonic()
            os.pwrite(fd_a, b"%08d" % k, 0)
        seen["last"], seen["writer_ended"] = k, time.monotonic()
        seen["writer_stopped_by_read"] = b_done.is_set()

    t = threading.Thread(target=writer)
    try:
        t.start()
        assert granted.wait(30), "the writer's first write did not return"
        time.sleep(0.03)
        seen["read_began"] = time.monotonic()
        got = os.pread(fd_b, 8, 0)
        # Empty: what the server had before the writer's first write.
        seen["read"] = int(got) if got else 0
        seen["read_ended"] = time.monotonic()
        b_done.set()
        t.join(60)
        assert not t.is_alive(), "the writer hangs"
    finally:
        b_done.set()
        os.close(fd_a)
        os.close(fd_b)
    return seen


@pytest.mark.deadline(120)
def test_lease_hold_keeps_a_revoked_lease_while_its_holder_uses_it(dist):
    """`-o lease_hold=MS`: a revoked lease stays with a holder that keeps
    using it (no pause of MS/20), at most MS after its grant. With 1000:
    a writer busy for 0.3 s after its grant keeps its write lease through
    a reader's request made meanwhile, so the reader waits and sees the
    writer's last write (with the default of 2 ms it sees an early one,
    and the writer writes on after it); a writer that does not stop still
    gives the lease up to the reader, once the hold is over."""
    a = dist.mount("a", "lease_hold=1000", "direct_spell=0")
    b = dist.mount("b", "lease_hold=1000", "direct_spell=0")
    # A writer the machine stops for 50 ms (a loaded machine) paused: its
    # lease may go early then. One round of three must show the hold.
    rounds = []
    for i in range(3):
        r = hold_round(a, b, f"held-{i}", write_for=0.3)
        rounds.append(r)
        assert r["read_began"] < r["last_write_began"], f"the read began after the writes: {r}"
        if r["read"] == r["last"] and r["read_ended"] >= r["writer_ended"]:
            break
    else:
        raise AssertionError(f"the reader never waited for the busy writer's lease: {rounds}")
    # The hold ends 1 s after the grant however busy the writer: the read
    # returns while the writer still writes (it writes until then, or 20 s),
    # with what the writer wrote back when it gave the lease up (not what
    # the server had before: a lease the manager took back from a holder
    # that kept it past the lease TTL).
    r = hold_round(a, b, "capped", write_for=20)
    assert r["writer_stopped_by_read"], f"the reader waited for the writer: {r}"
    assert r["read"] > 1, f"the reader did not get the writer's data: {r}"


def test_unknown_consistency_is_refused(dist):
    mp = dist.base / "bad"
    mp.mkdir()
    r = sfmount.run([str(sfmount.shortfuse_bin()), "mount", "dist", dist.addr, str(mp), "-o", "consistency=eventual"])
    assert r.returncode != 0 and "lease, writethrough or weak" in r.stderr, r.stderr
    assert not sfmount.is_mounted(mp)


@pytest.mark.deadline(120)
def test_killed_client_keeps_fsynced_data_only(dist):
    a = dist.mount("a")
    b = dist.mount("b")
    assert_killed_writer_loses_only_unsynced(a, b, lambda: sfmount.pids_of_daemon(sfmount.shortfuse_bin(), str(a)))


@pytest.mark.deadline(60)
def test_unmount_writes_back_what_the_cache_holds(dist):
    """A lease client's writes without fsync reach storage at umount (the
    kernel sends no DESTROY for a plain FUSE mount: the session's end must
    write back), and the next client reads them."""
    a = dist.mount("a")
    (a / "f").write_bytes(b"cached only")
    r = sfmount.run([str(sfmount.shortfuse_bin()), "umount", str(a)], timeout=30)
    assert r.returncode == 0, r.stderr
    b = dist.mount("b")
    assert (b / "f").read_bytes() == b"cached only"


@pytest.mark.deadline(90)
@pytest.mark.parametrize("transport", ["none", "dev"])
def test_a_ring_daemon_writes_back_what_it_holds_when_it_stops(dist, transport):
    """`shortfuse serve dist`, with and without a kernel mount beside the
    rings: what a program on the rings wrote without fsync reaches storage
    when SIGTERM stops the daemon."""
    mp = dist.base / "r"
    mp.mkdir()
    log = dist.base / "serve.log"
    d = subprocess.Popen(
        [str(sfmount.shortfuse_bin()), "serve", "dist", dist.addr, str(mp), "--transport", transport],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    try:
        assert sfmount.wait_until(lambda: "shortfuse serve:" in log.read_text(), 30), log.read_text()
        r = sfmount.run(
            [str(sfmount.shortfuse_bin()), "run", "-m", str(mp), "--", "sh", "-c", f"printf 'ring only' > {mp}/f"],
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
    finally:
        d.send_signal(signal.SIGTERM)
        d.wait(timeout=30)
    assert d.returncode == 0, log.read_text()
    b = dist.mount("b")
    assert (b / "f").read_bytes() == b"ring only"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Restartable:
    """A server on a fixed port, so that its clients reconnect to it when
    it is started again over the same data, and those clients."""

    def __init__(self, tag: str):
        self.base = sfmount.new_scratch(tag)
        self.addr = f"127.0.0.1:{free_port()}"
        self.server = Server(self.base, self.addr)
        self.clients = Clients(self.base, self.addr)

    def restart(self) -> None:
        self.server = Server(self.base, self.addr)

    def close(self) -> None:
        self.clients.close()
        self.server.close()
        sfmount.remove_scratch(self.base)


@pytest.fixture
def restartable(request):
    r = Restartable(request.node.name.split("[")[0].removeprefix("test_")[:20])
    yield r
    r.close()


@pytest.mark.deadline(120)
def test_server_killed_and_restarted_keeps_leases(restartable):
    r = restartable
    a = r.clients.mount("a")
    fd = os.open(a / "f", os.O_CREAT | os.O_RDWR, 0o644)
    os.pwrite(fd, b"only in a's cache", 0)
    r.server.proc.send_signal(signal.SIGKILL)
    r.server.proc.wait(timeout=30)
    r.restart()
    # b's read revokes a's lease, which the restarted server still
    # knows; a reconnects by itself, resumes its session and writes
    # back before b may read.
    b = r.clients.mount("b")
    assert (b / "f").read_bytes() == b"only in a's cache"
    os.fsync(fd)
    os.close(fd)


@pytest.mark.deadline(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_server_stopped_by_signal_exits_zero(sig, restartable):
    """SIGTERM (a service manager's stop) and SIGINT (Ctrl-C) shut the
    server down: exit status 0, not death by the signal, and a server
    started again over the same data serves its name space to a new
    client. The client is gone before the stop: a client that outlives
    its server is test_server_killed_and_restarted_keeps_leases's matter."""
    r = restartable
    a = r.clients.mount("a")
    (a / "d").mkdir()
    u = sfmount.run([str(sfmount.shortfuse_bin()), "umount", str(a)], timeout=30)
    assert u.returncode == 0, u.stderr
    r.server.proc.send_signal(sig)
    assert r.server.proc.wait(timeout=30) == 0, r.server.log.read_text()
    r.restart()
    b = r.clients.mount("b")
    assert (b / "d").is_dir()


def kill(r: "Restartable") -> str:
    """SIGKILLs the server; returns what it logged."""
    r.server.proc.send_signal(signal.SIGKILL)
    r.server.proc.wait(timeout=30)
    return r.server.log.read_text()


@pytest.mark.deadline(150)
def test_a_call_waits_for_a_restarting_server_and_both_sides_log_it(restartable):
    """A server that is down is waited for (boundedly) instead of failing
    the call at once: a mkdir made while it is down completes once it is
    back. The client's log says the connection was lost and restored, the
    server's who connected and that the session was resumed; a server away
    longer than the wait fails the call with ENOTCONN, and that is logged."""
    a = restartable.clients.mount("a")
    addr = restartable.addr
    (a / "before").write_bytes(b"x")
    assert "connected from" in kill(restartable)
    mkdir = "import os, sys\nos.mkdir(sys.argv[1])\nprint('made')"
    probe = subprocess.Popen([sys.executable, "-c", mkdir, str(a / "during")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The mkdir is on its way while nothing listens.
    time.sleep(1)
    restartable.restart()
    out, err = probe.communicate(timeout=60)
    assert out.strip() == "made", err
    log = sfmount.run([str(sfmount.shortfuse_bin()), "logs", str(a)]).stdout
    assert f"connection to the server at {addr} lost" in log and "reconnected to the server" in log, log
    stats = sfmount.run([str(sfmount.shortfuse_bin()), "stats", "--json", str(a)], timeout=30)
    assert json.loads(stats.stdout)["lease"]["reconnections"] >= 1, stats.stdout

    assert "session resumed" in kill(restartable)
    r = sfmount.run([sys.executable, "-c", mkdir, str(a / "too-late")], timeout=60)
    assert "Transport endpoint is not connected" in r.stderr, r.stderr
    log = sfmount.run([str(sfmount.shortfuse_bin()), "logs", str(a)]).stdout
    assert "is unreachable" in log and "fails with ENOTCONN" in log, log
    restartable.restart()


@pytest.mark.deadline(120)
def test_a_file_closed_while_the_client_reconnects_holds_nothing_up(restartable):
    """A client that holds a lease reconnects by itself when its server
    goes, holding its connection's slot while it retries, and the new
    session reads the client's table of open files. A file closed
    meanwhile is released without holding that table while it asks for
    the connection: once the server is back, calls go on (before, the
    release and the reconnection waited for each other for ever, and
    every later call with them)."""
    r = restartable
    a = r.clients.mount("a")
    # A cached write: a lease kept after the close, so the client
    # reconnects by itself.
    (a / "kept").write_bytes(b"x" * 10_000)
    fd = os.open(a / "kept", os.O_RDONLY)
    kill(r)
    # The reconnecting thread retries (every 200 ms, for up to 10 s).
    time.sleep(1)
    os.close(fd)
    time.sleep(0.5)
    r.restart()
    stat = "import os, sys\nprint(os.stat(sys.argv[1]).st_size)"
    probe = sfmount.run([sys.executable, "-c", stat, str(a / "kept")], timeout=60)
    assert probe.stdout.strip() == "10000", probe.stderr


def lease_figures(text: str, mp: Path) -> dict:
    """The `shortfuse_lease_*` samples of `mp` in a Prometheus text, by
    name, parsed by the Prometheus client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        if f.name.startswith("shortfuse_lease_")
        for s in f.samples
        if s.labels.get("mountpoint") == str(mp)
    }


@pytest.mark.deadline(90)
def test_metrics_show_lease_figures(dist):
    """`stats --prometheus` and a scrape of `-o metrics=ADDR:PORT` of a
    distfs mount show its leases: a writer whose file another client
    reads has its write lease revoked and writes its data back, and both
    show in the counts."""
    import urllib.request

    port = free_port()
    a = dist.mount("a", f"metrics=127.0.0.1:{port}")
    b = dist.mount("b")
    (a / "f").write_bytes(b"written under a write lease")
    # b's read needs a read lease, which revokes a's write lease.
    assert (b / "f").read_bytes() == b"written under a write lease"

    def scrape() -> list[dict]:
        r = sfmount.run([str(sfmount.shortfuse_bin()), "stats", "--prometheus", str(a)], timeout=30)
        assert r.returncode == 0, r.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return [lease_figures(r.stdout, a), lease_figures(resp.read().decode(), a)]

    # The write-back's count is added once the server has the data, which
    # b's read may see first.
    assert sfmount.wait_until(
        lambda: all(f.get("shortfuse_lease_revocation_write_backs_total", 0) >= 1 for f in scrape()), 10
    ), scrape()
    for figures in scrape():
        assert figures["shortfuse_lease_granted_write_total"] >= 1, figures
        assert figures["shortfuse_lease_revocations_total"] >= 1, figures
        assert figures["shortfuse_lease_reconnections_total"] == 0, figures
        assert "shortfuse_lease_granted_direct_total" in figures and "shortfuse_lease_direct_spells_total" in figures
    # b was never revoked; its table shows its lease line too.
    r = sfmount.run([str(sfmount.shortfuse_bin()), "stats", str(b)], timeout=30)
    assert r.returncode == 0 and "lease: granted_read=" in r.stdout, r.stdout
    assert "revocations=0" in r.stdout, r.stdout


def read_requests(mp: Path) -> int:
    """How many READ requests the daemon of `mp` has served."""
    r = sfmount.run([str(sfmount.shortfuse_bin()), "stats", "--json", str(mp)], timeout=30)
    assert r.returncode == 0, r.stderr
    return sum(op["count"] for op in json.loads(r.stdout)["ops"] if op["name"] == "READ")


def cached_pages(path: Path) -> int:
    """Pages of `path` in the kernel's page cache (fincore)."""
    r = sfmount.run(["fincore", "--bytes", "--noheadings", "--output", "PAGES", str(path)], timeout=30)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[0])


@pytest.mark.deadline(150)
def test_page_cache_serves_rereads_and_drops_pages_before_a_lease_goes(dist):
    """`-o page_cache`: a read-only open reads through the kernel's page
    cache, so a second read of the same data sends no READ; when another
    client writes the file, the reader's lease is revoked and the pages go
    first: the next read sees the new data at once (not the cached
    pages), read from the daemon again."""
    a = dist.mount("a", "page_cache")
    b = dist.mount("b", "page_cache")
    size = 256 << 10
    (b / "f").write_bytes(b"1" * size)
    fd = os.open(a / "f", os.O_RDONLY)
    try:
        assert os.pread(fd, size, 0) == b"1" * size
        assert cached_pages(a / "f") == size // 4096, "the pages were not cached"
        before = read_requests(a)
        assert os.pread(fd, size, 0) == b"1" * size
        assert read_requests(a) == before, "the second read was not served from the page cache"

        with open(b / "f", "r+b") as w:
            w.write(b"2" * size)
        # The write returned: a's lease went, and its pages with it.
        assert cached_pages(a / "f") == 0, "the reader's pages outlived its lease"
        assert os.pread(fd, size, 0) == b"2" * size
        assert read_requests(a) > before
    finally:
        os.close(fd)


@pytest.mark.deadline(300)
@pytest.mark.parametrize("mode", ["lease", "writethrough"])
def test_page_cache_passes_the_checker(dist, mode):
    """Reads through the page cache are still strongly consistent: the
    checker, whose reads go through read-only opens, finds no stale read
    over several seeds of 1,000 operations per client, on two mounts, one
    of them with a single worker thread (whose changes that drop pages go
    on from another thread)."""
    mounts = [
        dist.mount("m0", "page_cache", f"consistency={mode}", "threads=1"),
        dist.mount("m1", "page_cache", f"consistency={mode}"),
    ]
    for seed in range(1, 5):
        r = check(mounts, seed, ops=1000)
        assert r.returncode == 0 and ": no violation" in r.stdout, f"{mode}, seed {seed}: {r.stdout}{r.stderr}"


def test_page_cache_needs_leases(dist):
    mp = dist.base / "weak"
    mp.mkdir()
    r = sfmount.run(
        [str(sfmount.shortfuse_bin()), "mount", "dist", dist.addr, str(mp), "-o", "consistency=weak", "-o", "page_cache"]
    )
    assert r.returncode != 0 and "page_cache needs leases" in r.stderr, r.stderr
    assert not sfmount.is_mounted(mp)


def stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (SIGSTOP)."""
    tasks = Path(f"/proc/{pid}/task")
    return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks.iterdir())


def fuse_connection(mp: Path) -> Path:
    """The kernel's control directory (fusectl) of the FUSE connection of `mp`."""
    return Path("/sys/fs/fuse/connections") / str(os.minor(os.stat(mp).st_dev))


@pytest.mark.deadline(120)
@pytest.mark.parametrize("change", ["write", "truncate"])
def test_page_cache_one_worker_changes_a_file_behind_a_read_of_it(dist, change):
    """`-o page_cache` with one worker thread: a write (or a truncation)
    that must give back the client's read lease, whose pages the kernel
    must drop first, is taken before a READ of the same file that the
    kernel sent after it and whose page it holds locked until answered.
    Dropping the pages waits for that READ, so the change is answered
    later, from another thread, while the worker serves the READ: both
    finish, and the reader then sees the change."""
    a = dist.mount("a", "page_cache", "threads=1")
    b = dist.mount("b")
    size = 1 << 20
    data = bytes(range(256)) * (size // 256)
    (b / "f").write_bytes(data)
    ctl = fuse_connection(a)
    waiting = lambda: int((ctl / "waiting").read_text())  # noqa: E731
    r = os.open(a / "f", os.O_RDONLY)
    w = os.open(a / "f", os.O_WRONLY)
    try:
        # a's read lease, with the first page in the kernel's cache and
        # not the last (no read-ahead).
        os.posix_fadvise(r, 0, 0, os.POSIX_FADV_RANDOM)
        assert os.pread(r, 4096, 0) == data[:4096]
        assert cached_pages(a / "f") == 1
        # Before a truncation the kernel asks for security.capability
        # (GETXATTR), unless told once that distfs keeps no attributes.
        try:
            os.getxattr(a / "f", "security.capability")
        except OSError:
            pass
        pids = sfmount.pids_of_daemon(sfmount.shortfuse_bin(), str(a))
        assert pids, "no daemon found for the mount"
        outcome: dict = {}

        def run(name, call):
            try:
                outcome[name] = call()
            except OSError as e:
                outcome[name] = e

        if change == "write":
            changing = threading.Thread(target=run, args=("change", lambda: os.pwrite(w, b"x" * 10, 0)))
        else:
            changing = threading.Thread(target=run, args=("change", lambda: os.ftruncate(w, size // 2)))
        reading = threading.Thread(target=run, args=("read", lambda: os.pread(r, 4096, size - 4096)))
        # The daemon stopped while the kernel queues the change, then the
        # READ: its only worker takes them in that order. (Briefly: the
        # client's leases must stay valid on its clock.)
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        try:
            # Stopped, it answers nothing: the count only grows.
            assert sfmount.wait_until(lambda: all(stopped(p) for p in pids), 5), "the daemon did not stop"
            before = waiting()
            changing.start()
            assert sfmount.wait_until(lambda: waiting() == before + 1, 5, step=0.005), "the change was not sent"
            reading.start()
            assert sfmount.wait_until(lambda: waiting() == before + 2, 5, step=0.005), "the READ was not sent"
        finally:
            for p in pids:
                os.kill(p, signal.SIGCONT)
        changing.join(20)
        reading.join(20)
        hung = changing.is_alive() or reading.is_alive()
        if hung:
            # Fails the waits (ENOTCONN) so that the threads end.
            (ctl / "abort").write_text("1")
            changing.join(10)
            reading.join(10)
        assert not hung, f"the worker waited for the kernel while the kernel waited for it: {outcome}"
        assert outcome["read"] in (data[size - 4096 :], b""), outcome
        if change == "write":
            assert outcome["change"] == 10, outcome
            assert os.pread(r, 16, 0) == b"x" * 10 + data[10:16], "the reader's page outlived its lease"
        else:
            assert outcome["change"] is None, outcome
            assert os.fstat(r).st_size == size // 2
            assert os.pread(r, 4096, size - 4096) == b""
        assert (b / "f").read_bytes()[:16] == (b"x" * 10 + data[10:16] if change == "write" else data[:16])
    finally:
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass  # the connection was aborted
