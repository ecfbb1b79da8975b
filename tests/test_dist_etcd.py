"""distfs scale-out through the CLI: agents (`shortfuse dist up --etcd`) on one
real etcd serve one name space; a client of each sees the other's changes at
once (the kernel caches no names or attributes here: entry_timeout=0,
attr_timeout=0). Blocks are under one shared --data directory.

Leases are on etcd too: a client's cached write is revoked (flushed) when a
client of the other agent reads."""

from __future__ import annotations

import os

import pytest

import sfmount
from etcd import Etcd
from test_dist import Clients, Server

FRESH = ("entry_timeout=0", "attr_timeout=0", "negative_timeout=0")


@pytest.fixture
def two_agents():
    base = sfmount.new_scratch("dist-etcd")
    etcd = Etcd(prefix=f"{sfmount.SCRATCH_PREFIX}etcd-")
    servers, clients = [], []
    try:
        for _ in range(2):
            servers.append(Server(base, extra=("--etcd", etcd.url)))
            clients.append(Clients(base, servers[-1].addr))
        mounts = [c.mount(f"m{i}", *FRESH) for i, c in enumerate(clients)]
        yield servers, mounts
    finally:
        for c in clients:
            c.close()
        for s in servers:
            s.close()
        etcd.stop()
        sfmount.remove_scratch(base)


def test_two_agents_serve_one_name_space(two_agents):
    servers, (a, b) = two_agents
    # Created through one agent, seen through the other.
    (a / "d").mkdir()
    (a / "d" / "f").write_bytes(b"hello")
    assert sorted(os.listdir(b / "d")) == ["f"]
    assert (b / "d" / "f").read_bytes() == b"hello"
    ino = os.stat(a / "d" / "f").st_ino
    assert os.stat(b / "d" / "f").st_ino == ino, "one inode number on every agent"
    # Renamed through one, the old name is gone and the new one there on the other.
    os.rename(b / "d" / "f", b / "g")
    assert not (a / "d" / "f").exists()
    assert os.stat(a / "g").st_ino == ino
    assert (a / "g").read_bytes() == b"hello"
    os.rename(a / "d", a / "e")
    assert sorted(os.listdir(b)) == ["e", "g"]
    # A name made at both at once: one of them gets EEXIST.
    os.mkdir(a / "e" / "x")
    with pytest.raises(FileExistsError):
        os.mkdir(b / "e" / "x")
    # Links, symlinks, removal.
    os.link(a / "g", a / "e" / "h")
    assert os.stat(b / "g").st_nlink == 2
    os.symlink("../g", b / "e" / "s")
    assert os.readlink(a / "e" / "s") == "../g"
    with pytest.raises(OSError) as err:
        os.rmdir(b / "e")
    assert err.value.errno == 39  # ENOTEMPTY
    os.rmdir(a / "e" / "x")
    for n in ("h", "s"):
        os.unlink(b / "e" / n)
    os.rmdir(a / "e")
    os.unlink(b / "g")
    assert os.listdir(a) == [] and os.listdir(b) == []


def test_an_agent_restart_keeps_the_name_space(two_agents):
    servers, (a, b) = two_agents
    (a / "kept").write_bytes(b"x" * 10_000)
    with open(a / "kept", "rb") as f:
        os.fsync(f.fileno())
    addr = servers[0].addr
    base = a.parent
    servers[0].close()
    servers[0] = Server(base, addr, extra=("--etcd", servers[1].proc.args[-1]))
    # The client of the restarted agent reconnects; the name space is etcd's.
    assert sfmount.wait_until(lambda: os.path.exists(a / "kept"), 20)
    assert (b / "kept").read_bytes() == b"x" * 10_000
    assert (a / "kept").read_bytes() == b"x" * 10_000
