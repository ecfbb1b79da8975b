"""Two distfs agents (`shortfuse dist up --etcd`) serving one file system
from one etcd, a client mounted on each: the consistency checker across the
two in each mode (`lease` and `writethrough` pass, `weak` is caught), so
that leases hold across agents (revocations travel through etcd); and an
agent killed and restarted (its client's lease and cached writes survive:
the lease state is in etcd)."""

from __future__ import annotations

import os
import signal

import pytest

import sfmount
from etcd import Etcd
from test_dist import Clients, Server, assert_checker_passes, assert_weak_is_caught, free_port


@pytest.fixture
def agents():
    base = sfmount.new_scratch("dist-agents")
    etcd = Etcd()
    started: list[Server] = []
    clients: list[Clients] = []

    # Every agent's blocks under one `base / "data"` until they move to S3.
    def start(listen: str = "127.0.0.1:0") -> tuple[Server, Clients]:
        agent = Server(base, listen, extra=("--etcd", etcd.url))
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
    assert_checker_passes([one.mount("a", f"consistency={mode}"), two.mount("b", f"consistency={mode}")], mode)


@pytest.mark.deadline(150)
def test_weak_is_caught_across_agents(agents):
    _, one = agents()
    _, two = agents()
    assert_weak_is_caught([one.mount("a", "consistency=weak"), two.mount("b", "consistency=weak")])


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
