"""Two distfs agents (`shortfuse dist up --etcd`) serving one file system
from one etcd, a client mounted on each: the consistency checker across the
two in each mode (`lease` and `writethrough` pass, `weak` is caught), so
that leases hold across agents (revocations travel through etcd); an
agent killed and restarted (its client's lease and cached writes survive:
the lease state is in etcd); and etcd stalled (SIGSTOP) while clients
work: shorter than the bound an agent waits for etcd (the lease TTL, 10 s)
it only delays them, longer it fails what waits with EIO, and the mount
works again once etcd does."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time

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

    start.etcd = etcd
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


# Shorter than the 10 s an agent waits for etcd (its lease TTL), with room
# for the backlog etcd answers once it goes on; longer than an etcd request
# was given before (5 s for the lease manager's).
SHORT_STALL = 8.0


@pytest.mark.deadline(240)
def test_a_stalling_etcd_delays_operations_but_fails_none(agents):
    _, one = agents()
    _, two = agents()
    mounts = [one.mount("a", "consistency=lease"), two.mount("b", "consistency=writethrough")]
    etcd = agents.etcd
    cmd = [str(sfmount.shortfuse_bin()), "dist", "check", *map(str, mounts), "--ops", "60", "--seed", "1"]
    checker = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stalls = 0
    try:
        # etcd stalls again and again while the checker runs: the first
        # stall starts as it starts. Between stalls, etcd serves what was
        # queued (a request must not wait through two), then runs a while.
        while checker.poll() is None:
            etcd.freeze()
            stalls += 1
            time.sleep(SHORT_STALL)
            etcd.thaw()
            etcd.wait_healthy()
            time.sleep(1.0)
        out, err = checker.communicate(timeout=30)
    finally:
        etcd.thaw()
        if checker.poll() is None:
            checker.kill()
            checker.wait()
    assert checker.returncode == 0, f"{out}{err}"
    assert ": no violation" in out, out
    assert stalls >= 1


@pytest.mark.deadline(180)
def test_an_etcd_stalled_past_the_bound_fails_operations_with_eio(agents):
    _, one = agents()
    a = one.mount("a")
    (a / "kept").write_bytes(b"before")
    fd = os.open(a / "f", os.O_CREAT | os.O_RDWR, 0o644)
    outcome: list[OSError | None] = []

    def fsync():
        try:
            os.fsync(fd)
            outcome.append(None)
        except OSError as e:
            outcome.append(e)

    try:
        os.pwrite(fd, b"cached", 0)
        agents.etcd.freeze()
        # The cached write goes to storage, whose size etcd records: the
        # agent waits for etcd, then fails it (no hang). Run aside so that
        # a hang fails here rather than at the test's deadline.
        t = threading.Thread(target=fsync)
        t.start()
        t.join(timeout=90)
        assert not t.is_alive(), "fsync hung on the stalled etcd"
        assert outcome[0] is not None and outcome[0].errno == errno.EIO, outcome
        agents.etcd.thaw()
        # etcd is back, and so is the mount: the session outlived the
        # stall with its leases and cache.
        assert (a / "kept").read_bytes() == b"before"
        os.fsync(fd)
        assert (a / "f").read_bytes() == b"cached"
    finally:
        agents.etcd.thaw()
        os.close(fd)
