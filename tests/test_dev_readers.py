"""/dev/fuse readers start on demand (crates/shortfuse/src/session/pool.rs):
one reader at first, more while requests keep waiting, up to --threads.
Under --transport uring the rings serve requests and the /dev/fuse reader
stays alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sfmount import wait_until

LOAD = r"""
import os, sys, time
d = sys.argv[1]
end = time.time() + 3
i = 0
while time.time() < end:
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
    assert readers(pid) == ["shortfuse-dev-0"], "a fresh mount must start with one reader"
    procs = [subprocess.Popen([sys.executable, "-c", LOAD, str(m.path)]) for _ in range(4)]
    try:
        if config.transport == "dev":
            grown = wait_until(lambda: len(readers(pid)) == 3, 15)
            assert grown, f"4 programs in parallel for seconds, readers: {readers(pid)}"
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
