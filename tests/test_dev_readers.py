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


@pytest.mark.shortfuse_only
@pytest.mark.fs("mem", "passthrough")
def test_readers_grow_under_parallel_load(config, mount_factory):
    m = mount_factory(config, options=["threads=3"])
    assert m.daemon_pids, "no daemon found"
    pid = m.daemon_pids[0]
    # One request answered: the first reader is running (the mount command
    # may return before its thread has started).
    os.stat(m.path)
    assert readers(pid) == ["shortfuse-dev-0"], "a fresh mount must start with one reader"
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
