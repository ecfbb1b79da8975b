"""/dev/fuse readers start on demand (crates/shortfuse/src/session/pool.rs):
one reader at first, more while requests keep waiting, up to --threads.
Under --transport uring the rings serve requests and the /dev/fuse reader
stays alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sfmount import wait_until

# Keeps the mount busy until the file `stop` (outside the mount) appears,
# or for a minute at most.
LOAD = r"""
import os, sys, time
d, stop = sys.argv[1], sys.argv[2]
end = time.time() + 60
i = 0
while time.time() < end and not os.path.exists(stop):
    p = os.path.join(d, f"f{os.getpid()}-{i % 50}")
    with open(p, "w") as f:
        f.write("x")
    os.stat(p)
    os.unlink(p)
    i += 1
"""


def readers(pid: int) -> list[str]:
    names = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass
    return sorted(n for n in names if n.startswith("shortfuse-dev-"))


def one_reader_mount(config, mount_factory, threads: int):
    """A fresh mount of up to `threads` readers, and its daemon's pid, once
    its first reader has answered a request (the mount command may return
    before that thread has started)."""
    m = mount_factory(config, options=[f"threads={threads}"])
    assert m.daemon_pids, "no daemon found"
    pid = m.daemon_pids[0]
    os.stat(m.path)
    assert readers(pid) == ["shortfuse-dev-0"], "a fresh mount must start with one reader"
    return m, pid


@pytest.mark.shortfuse_only
@pytest.mark.fs("mem", "passthrough")
def test_readers_grow_under_parallel_load(config, mount_factory):
    m, pid = one_reader_mount(config, mount_factory, 3)
    stop = m.base / "stop"
    procs = [subprocess.Popen([sys.executable, "-c", LOAD, str(m.path), str(stop)]) for _ in range(4)]
    try:
        if config.transport == "dev":
            # The load goes on until the readers have grown; the bound is
            # against a hang only.
            grown = wait_until(lambda: len(readers(pid)) == 3, 50)
            assert grown, f"4 programs in parallel for 50 s, readers: {readers(pid)}"
        else:
            time.sleep(3)
        stop.touch()
        for p in procs:
            assert p.wait(30) == 0
        if config.transport != "dev":
            assert readers(pid) == ["shortfuse-dev-0"], "the rings serve requests; the /dev/fuse reader stays alone"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    # Never more than asked for.
    assert len(readers(pid)) <= 3
    assert os.listdir(m.path) == []


# One program, one thread: creates files, then unlinks them, as `shortfuse
# bench latency` does. Each unlink's inode leaves a FORGET behind, which
# the kernel lets the program's next request overtake.
LONE = r"""
import os, sys
d = sys.argv[1]
names = [os.path.join(d, f"u{i}") for i in range(1000)]
for p in names:
    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
for p in names:
    os.unlink(p)
"""


@pytest.mark.shortfuse_only
@pytest.mark.fs("passthrough", "passthrough+kp")
def test_a_lone_programs_unlinks_start_no_second_reader(config, mount_factory):
    m, pid = one_reader_mount(config, mount_factory, 2)
    for _ in range(2):
        subprocess.run([sys.executable, "-c", LONE, str(m.path)], check=True, timeout=120)
    # A second reader would answer this program's requests in turn with the
    # first, each from a cold thread: slower, and nothing runs in parallel.
    assert readers(pid) == ["shortfuse-dev-0"], "one program, one caller at a time: no second reader"
    assert os.listdir(m.path) == []
