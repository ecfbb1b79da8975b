"""Two distfs agents (`shortfuse dist up --etcd`) serving one file system
from one etcd, a client mounted on each: the consistency checker across the
two in each mode (`lease` and `writethrough` pass, `weak` is caught), so
that leases hold across agents (revocations travel through etcd); and an
agent killed and restarted (its client's lease and cached writes survive:
the lease state is in etcd)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

import sfmount
from etcd import Etcd
from test_dist import Clients, check, free_port


class Agent:
    """`shortfuse dist up --etcd` (blocks under `blocks`, shared by every
    agent until they move to S3), stopped on close."""

    def __init__(self, etcd: Etcd, blocks: Path, listen: str = "127.0.0.1:0"):
        cmd = [str(sfmount.shortfuse_bin()), "dist", "up", "--etcd", etcd.url, "--data", str(blocks)]
        self.proc = subprocess.Popen(
            cmd + ["--listen", listen], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()
        if " on " not in line:
            self.proc.kill()
            raise AssertionError(f"agent did not start: {line!r} {self.proc.stderr.read()}")
        self.addr = line.rsplit(" on ", 1)[1].strip()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def agents():
    base = sfmount.new_scratch("dist-agents")
    etcd = Etcd()
    started: list[Agent] = []
    clients: list[Clients] = []

    def start(listen: str = "127.0.0.1:0") -> tuple[Agent, Clients]:
        agent = Agent(etcd, base / "blocks", listen)
        started.append(agent)
        c = Clients(base, agent.addr)
        clients.append(c)
        return agent, c

    try:
        yield start
    finally:
        for c in clients:
            c.close()
        for a in started:
            a.close()
        etcd.stop()
        sfmount.remove_scratch(base)


@pytest.mark.deadline(150)
@pytest.mark.parametrize("mode", ["lease", "writethrough"])
def test_strong_modes_pass_the_checker_across_agents(agents, mode):
    _, one = agents()
    _, two = agents()
    mounts = [one.mount("a", f"consistency={mode}"), two.mount("b", f"consistency={mode}")]
    r = check(mounts, 1)
    assert r.returncode == 0, f"{mode}: {r.stdout}{r.stderr}"
    assert "0 violation(s)" in r.stdout, r.stdout


@pytest.mark.deadline(150)
def test_weak_is_caught_across_agents(agents):
    _, one = agents()
    _, two = agents()
    mounts = [one.mount("a", "consistency=weak"), two.mount("b", "consistency=weak")]
    outputs = []
    for seed in (1, 2, 3):
        r = check(mounts, seed)
        if r.returncode != 0:
            assert "consistency violated" in r.stderr, r.stderr
            assert "stale" in r.stdout or "initial" in r.stdout, r.stdout
            return
        outputs.append(r.stdout)
    raise AssertionError(f"weak was never caught: {outputs}")


@pytest.mark.deadline(120)
def test_an_agent_killed_and_restarted_keeps_its_clients_leases(agents):
    addr = f"127.0.0.1:{free_port()}"
    one, clients_one = agents(addr)
    _, clients_two = agents()
    a = clients_one.mount("a")
    b = clients_two.mount("b")
    fd = os.open(a / "f", os.O_CREAT | os.O_RDWR, 0o644)
    os.pwrite(fd, b"only in a's cache", 0)
    one.proc.send_signal(signal.SIGKILL)
    one.proc.wait(timeout=30)
    # Restarted on the same address: a reconnects by itself and resumes
    # its session, whose write lease is still in etcd; b's read through the
    # other agent revokes it, and a writes back before b may read.
    agents(addr)
    assert (b / "f").read_bytes() == b"only in a's cache"
    os.fsync(fd)
    os.close(fd)
