"""The user-space caches (`-o cache=on`), forced on over `passthrough`
(whose `auto` leaves them off): the daemon's write-back tier under a
`dev` mount and a `serve` daemon, and the shim's write-through tier under
`shortfuse run`. Each checks data against the source directory, that a
change made in the source directly shows after a reopen (close-to-open),
that no dirty data is lost when the daemon stops, and that the statistics
move.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sfmount
import test_ring
import test_run

shortfuse = test_run.shortfuse
scratch = test_run.scratch

# Small pages and read-ahead so that a few hundred KiB cross many pages.
OPTS = "cache=on,page_size=16K,page_cache_size=1M,readahead=4"


def cache_stats(mp: Path) -> dict:
    p = subprocess.run(
        [str(sfmount.shortfuse_bin()), "stats", "--json", str(mp)], capture_output=True, timeout=30
    )
    assert p.returncode == 0, p.stderr.decode()
    stats = json.loads(p.stdout)
    assert "cache" in stats, f"no cache counters: {stats}"
    return stats["cache"]


def settle() -> None:
    """Lets the files just written age past the cache's racy window (an
    mtime within a clock tick of the look cannot vouch for the pages)."""
    time.sleep(0.1)


def touch_later(path: Path) -> None:
    """An mtime the cache cannot have seen (a change made elsewhere)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


# Writes 1000 bytes at 0 and keeps the file open until told to close it.
HOLDER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, b"B" * 1000, 0)
print("written", flush=True)
sys.stdin.readline()
os.close(fd)
"""


@pytest.fixture
def cached_mount(mount_factory):
    return mount_factory(sfmount.Config("passthrough", "dev"), [OPTS])


def test_daemon_cache_reads_writes_and_truncates_like_the_source(cached_mount):
    m = cached_mount
    data = os.urandom(300_000)
    (m.path / "f").write_bytes(data)
    assert (m.source / "f").read_bytes() == data, "written back at close"
    settle()
    for _ in range(2):
        assert (m.path / "f").read_bytes() == data
    with open(m.path / "f", "r+b") as f:
        f.seek(20_000)
        f.write(b"x" * 50_000)
        f.seek(400_000)
        f.write(b"tail")
    want = bytearray(data)
    want[20_000:70_000] = b"x" * 50_000
    want += bytes(100_000) + b"tail"
    assert (m.path / "f").read_bytes() == want
    assert (m.source / "f").read_bytes() == want
    os.truncate(m.path / "f", 33_333)
    assert (m.path / "f").read_bytes() == want[:33_333]
    os.truncate(m.path / "f", 50_000)
    assert (m.path / "f").read_bytes() == want[:33_333] + bytes(50_000 - 33_333)
    assert (m.source / "f").read_bytes() == want[:33_333] + bytes(50_000 - 33_333)
    c = cache_stats(m.path)
    assert c["hits"] > 0 and c["misses"] > 0, c
    assert c["bytes_out"] >= 300_000 and c["invalidations"] > 0, c


def test_daemon_cache_holds_writes_until_close_and_sees_changes_after_reopen(cached_mount):
    m = cached_mount
    (m.path / "g").write_bytes(b"A" * 40_000)
    # The writer is a process of its own: every child this test starts
    # (`shortfuse stats`) would close its copy of our descriptor, and each
    # close sends FLUSH, which writes the pages back.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(m.path / "g")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"written\n"
        assert (m.source / "g").read_bytes()[:1] == b"A", "write-back: not in the source before close"
        assert cache_stats(m.path)["dirty_bytes"] >= 1000
    finally:
        holder.communicate(b"close\n", timeout=30)
    assert holder.returncode == 0
    assert (m.source / "g").read_bytes()[:1000] == b"B" * 1000
    assert cache_stats(m.path)["dirty_bytes"] == 0
    assert (m.path / "g").read_bytes()[:1] == b"B"
    # Changed in the source behind the daemon, same size: the next open
    # sees another mtime and drops the cached pages.
    with open(m.source / "g", "r+b") as f:
        f.write(b"C" * 40_000)
    touch_later(m.source / "g")
    before = cache_stats(m.path)["invalidations"]
    assert (m.path / "g").read_bytes() == b"C" * 40_000
    assert cache_stats(m.path)["invalidations"] > before


def test_write_only_partial_page_writes_of_uncached_files(cached_mount):
    # The rest of the page must be read from the file: the cache opens
    # write-only files for reading too, as the kernel's write-back cache does.
    m = cached_mount
    (m.source / "w").write_bytes(b"a" * 40_000)
    fd = os.open(m.path / "w", os.O_WRONLY)
    try:
        assert os.pwrite(fd, b"b" * 1000, 100) == 1000
    finally:
        os.close(fd)
    assert (m.source / "w").read_bytes() == b"a" * 100 + b"b" * 1000 + b"a" * 38_900
    assert (m.path / "w").read_bytes() == b"a" * 100 + b"b" * 1000 + b"a" * 38_900


def test_sigterm_loses_no_dirty_data(cached_mount):
    m = cached_mount
    fd = os.open(m.path / "h", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"D" * 70_000)
        assert (m.source / "h").read_bytes() == b"", "write-back: nothing in the source yet"
        for pid in m.daemon_pids:
            os.kill(pid, signal.SIGTERM)
        # The daemon detaches the mount and serves the open file until closed.
        assert sfmount.wait_until(lambda: not sfmount.is_mounted(m.path), 10)
    finally:
        os.close(fd)
    assert m.wait_daemon_exit(10) == []
    assert (m.source / "h").read_bytes() == b"D" * 70_000


def test_serve_shares_one_cache_between_kernel_and_ring_clients(shortfuse, scratch):
    src, mp = scratch / "src", scratch / "mnt"
    src.mkdir()
    mp.mkdir()
    d = test_ring.Daemon(shortfuse, scratch, ["passthrough", str(src), str(mp), "--transport", "dev", "-o", OPTS], mp)
    try:
        data = os.urandom(100_000)
        (mp / "k").write_bytes(data)
        p = test_run.under(shortfuse, [str(mp)], [sys.executable, "-c", f"import sys; sys.stdout.buffer.write(open('{mp}/k','rb').read())"])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout == data
        c = cache_stats(mp)
        assert c["hits"] > 0 and c["bytes_out"] >= 100_000, c
        assert "user-space cache on" in d.log.read_text()
    finally:
        d.stop()
    assert (src / "k").read_bytes() == data


PROGRAM = r"""
import os, sys, time
mp, src = sys.argv[1], sys.argv[2]
data = os.urandom(300_000)
with open(mp + "/f", "wb") as f:
    f.write(data)
assert open(src + "/f", "rb").read() == data, "write-through"
time.sleep(0.1)  # past the racy window: see settle()
for _ in range(2):
    assert open(mp + "/f", "rb").read() == data
with open(mp + "/f", "r+b") as f:
    f.seek(70_000); f.write(b"y" * 40_000)
    f.seek(500_000); f.write(b"end")
want = bytearray(data); want[70_000:110_000] = b"y" * 40_000; want += bytes(200_000) + b"end"
assert open(mp + "/f", "rb").read() == want
os.truncate(mp + "/f", 12_345)
assert open(mp + "/f", "rb").read() == want[:12_345]
with open(mp + "/f", "r+b") as f:
    f.truncate(20_000)
    assert f.read() == want[:12_345] + bytes(20_000 - 12_345)
assert open(src + "/f", "rb").read() == want[:12_345] + bytes(20_000 - 12_345)
# Changed in the source behind the cache, same size, later mtime.
with open(mp + "/g", "wb") as f:
    f.write(b"A" * 50_000)
assert open(mp + "/g", "rb").read() == b"A" * 50_000
with open(src + "/g", "r+b") as f:
    f.write(b"B" * 50_000)
st = os.stat(src + "/g")
os.utime(src + "/g", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
assert open(mp + "/g", "rb").read() == b"B" * 50_000
print("ok")
"""


def test_shim_cache_under_run(shortfuse, scratch):
    src = scratch / "src"
    src.mkdir()
    stats = scratch / "stats.jsonl"
    p = test_run.run(
        [str(shortfuse), "run", "-m", f"/cm={'passthrough'}:{src}", "-o", OPTS, "--stats", str(stats), "--",
         sys.executable, "-c", PROGRAM, "/cm", str(src)]
    )
    assert p.returncode == 0 and p.stdout == b"ok\n", p.stderr.decode()
    assert "user-space cache on" in p.stderr.decode()
    lines = [json.loads(l) for l in stats.read_text().splitlines()]
    mine = [l for l in lines if l["mountpoint"] == "/cm" and l["cache"]["bytes_out"] > 0]
    assert len(mine) == 1, lines
    c = mine[0]["cache"]
    assert c["hits"] > 0 and c["misses"] > 0 and c["invalidations"] > 0, c
    assert c["bytes_in"] > 0 and c["dirty_bytes"] == 0, c


def test_a_config_file_sets_the_cache_and_options_override_it(mount_factory, tmp_path):
    conf = tmp_path / "cache.toml"
    conf.write_text('cache = true\npage_size = 65536\ncache_policy = "lru"\nmeta_cache_size = 100\n')
    m = mount_factory(sfmount.Config("passthrough", "dev"), [f"config={conf},page_size=32K"])
    (m.path / "f").write_bytes(b"z" * 100_000)
    assert (m.path / "f").read_bytes() == b"z" * 100_000
    assert cache_stats(m.path)["bytes_out"] >= 100_000
    bad = tmp_path / "bad.toml"
    bad.write_text("cache = true\npage_sise = 4096\n")
    r = subprocess.run(
        [str(sfmount.shortfuse_bin()), "mount", "mem", str(tmp_path / "nowhere"), "-o", f"config={bad}"],
        capture_output=True,
        timeout=30,
    )
    assert r.returncode != 0 and b"page_sise" in r.stderr, r.stderr


def test_a_config_file_under_run_reaches_every_process(shortfuse, scratch):
    # run reads the file once and hands the processes its values: the shim
    # they load links no parser and would refuse a config= left in.
    src = scratch / "src"
    src.mkdir()
    (src / "f").write_bytes(b"q" * 100_000)
    conf = scratch / "cache.toml"
    conf.write_text('cache = true\npage_size = 65536\ncache_policy = "lru"\n')
    stats = scratch / "stats.jsonl"
    # The program reads from a child with another working directory.
    child = "import sys; sys.exit(len(open('/cm/f', 'rb').read()) != 100_000)"
    program = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {child!r}], cwd='/').returncode)"
    p = test_run.run(
        [str(shortfuse), "run", "-m", f"/cm=passthrough:{src}", "-o", f"config={conf},page_size=32K",
         "--stats", str(stats), "--", sys.executable, "-c", program]
    )
    assert p.returncode == 0, p.stderr.decode()
    assert "pages of 32 KiB (lru)" in p.stderr.decode(), p.stderr.decode()
    lines = [json.loads(l) for l in stats.read_text().splitlines()]
    assert any(l["mountpoint"] == "/cm" and l["cache"]["bytes_in"] >= 100_000 for l in lines), lines
    bad = scratch / "bad.toml"
    bad.write_text("cache = true\npage_sise = 4096\n")
    p = test_run.run([str(shortfuse), "run", "-m", f"/cm=passthrough:{src}", "-o", f"config={bad}", "--", "true"])
    assert p.returncode != 0 and b"page_sise" in p.stderr, p.stderr
