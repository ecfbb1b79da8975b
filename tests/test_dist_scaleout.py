"""distfs deployed across network namespaces (tests/netns.py): a storage
namespace with the S3 server and either the one distfs server (metadata
and leases under its data directory) or etcd with an agent on every host
(the scale-out deployment), blocks in S3 either way; two host namespaces
whose clients reach storage over veth links. Clients on different hosts pass the
consistency checker (lease, writethrough; weak is caught), a killed
client's fsync'd data survives, a server restart loses no lease, and a
host cut off by a partition keeps its lease to its soft timeout, then
fails its writes (storage is out of reach too) and never overwrites what
the host given the lease wrote."""

from __future__ import annotations

import errno
import os
import time

import pytest

import netns
import sfmount
from test_dist import assert_checker_passes, assert_killed_writer_loses_only_unsynced, assert_weak_is_caught


@pytest.fixture
def dep():
    d = netns.Deployment(hosts=2)
    try:
        d.start_server()
        yield d
    finally:
        d.close()


# Fewer operations than on loopback: every one crosses a veth link.
CHECK_OPS = 100


def s3_objects(dep) -> list[str]:
    root = dep.base / "s3" / netns.BUCKET
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]


@pytest.mark.deadline(240)
def test_checker_across_hosts(dep):
    h0, h1 = dep.hosts
    for mode in ("lease", "writethrough"):
        mounts = [h0.mount(f"{mode}0", f"consistency={mode}"), h1.mount(f"{mode}1", f"consistency={mode}")]
        assert_checker_passes(mounts, mode, CHECK_OPS)
    assert_weak_is_caught([h0.mount("weak0", "consistency=weak"), h1.mount("weak1", "consistency=weak")], CHECK_OPS)
    # The checker removes the files it made (and the server their blocks,
    # once the last close reached it: after the checker exits), so a file
    # written and fsync'd here is what shows where blocks go: to the S3
    # server, not to the distfs server's disk.
    assert sfmount.wait_until(lambda: not s3_objects(dep), 10), s3_objects(dep)
    data = os.urandom(256 * 1024)
    fd = os.open(mounts[0] / "kept", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert (mounts[1] / "kept").read_bytes() == data
    assert s3_objects(dep)
    assert not (dep.base / "server" / "blocks").exists()


@pytest.mark.deadline(120)
def test_files_across_hosts(dep):
    a = dep.hosts[0].mount("a")
    b = dep.hosts[1].mount("b")
    (a / "d").mkdir()
    big = os.urandom(300_000)
    (a / "d" / "f").write_bytes(big)
    assert (b / "d" / "f").read_bytes() == big
    with open(b / "d" / "f", "r+b") as f:
        f.truncate(1000)
        f.seek(5000)
        f.write(b"tail")
    assert (a / "d" / "f").read_bytes() == big[:1000] + bytes(4000) + b"tail"
    os.rename(a / "d" / "f", a / "d" / "g")
    os.symlink("g", a / "d" / "s")
    os.link(a / "d" / "g", a / "d" / "h")
    assert sorted(os.listdir(b / "d")) == ["g", "h", "s"]
    assert os.readlink(b / "d" / "s") == "g"
    assert os.stat(b / "d" / "h").st_nlink == 2
    assert (b / "d" / "s").read_bytes()[-4:] == b"tail"
    os.unlink(b / "d" / "g")
    os.unlink(b / "d" / "h")
    os.unlink(b / "d" / "s")
    os.rmdir(a / "d")
    assert os.listdir(b) == []
    # The last name went: its blocks are removed from S3 too.
    assert sfmount.wait_until(lambda: not s3_objects(dep), 10), s3_objects(dep)


@pytest.mark.deadline(120)
def test_killed_client_keeps_fsynced_data(dep):
    h0, h1 = dep.hosts
    a = h0.mount("a")
    b = h1.mount("b")
    # Its fsync'd bytes are in S3, what it only cached is lost.
    assert_killed_writer_loses_only_unsynced(a, b, lambda: h0.daemon_pids(a))


@pytest.mark.deadline(120)
def test_server_restart_keeps_leases(dep):
    h0, h1 = dep.hosts
    a = h0.mount("a")
    fd = os.open(a / "f", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"only in a's cache", 0)
        dep.restart_server()
        # The restarted server still knows a's write lease: b's read
        # revokes it, a (reconnected, session resumed) writes back first.
        b = h1.mount("b")
        assert (b / "f").read_bytes() == b"only in a's cache"
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.deadline(150)
# The embedded server cut off from a client is covered by the Rust fault
# tests (a cut-off client); here the scale-out deployment, whose agent
# loses etcd and S3 with the link.
def test_partitioned_host_loses_its_lease_to_the_other(etcd_dep):
    dep = etcd_dep
    h0, h1 = dep.hosts
    a = h0.mount("a")
    b = h1.mount("b")
    fd = os.open(a / "f", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"a-synced", 0)
        os.fsync(fd)
        h0.set_link(False)
        # Cut off, a keeps its write lease until its soft timeout: writes
        # are cached and answered.
        os.pwrite(fd, b"a-cached", 0)
        # b asks for the lease; the server cannot revoke it from a and
        # grants it once a's session has expired.
        with open(b / "f", "r+b") as f:
            f.write(b"b-wins!!")
            os.fsync(f.fileno())
        # By then a's own clock has run out: past its soft timeout it writes
        # through, and storage is out of its reach: its writes fail.
        failed = None
        deadline = time.monotonic() + 30
        while failed is None and time.monotonic() < deadline:
            try:
                os.pwrite(fd, b"a-late!!", 0)
            except OSError as e:
                failed = e
            time.sleep(0.2)
        assert failed is not None and failed.errno in (errno.EIO, errno.ENOTCONN, errno.ETIMEDOUT), failed
        h0.set_link(True)
        # Back on the network, a's writes from under the lost lease do not
        # reach storage, and a's next fsync says so (EIO) rather than
        # report them durable; b's data is what everyone reads.
        with pytest.raises(OSError) as lost:
            os.fsync(fd)
        assert lost.value.errno == errno.EIO, lost.value
        assert (b / "f").read_bytes() == b"b-wins!!"
        assert (a / "f").read_bytes() == b"b-wins!!"
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


@pytest.fixture
def etcd_dep():
    d = netns.Deployment(hosts=2)
    try:
        d.start_etcd()
        yield d
    finally:
        d.close()


@pytest.mark.deadline(240)
def test_agents_on_etcd_across_hosts(etcd_dep):
    """The scale-out deployment: an agent per host, metadata and leases in
    etcd, blocks in S3."""
    h0, h1 = etcd_dep.hosts
    a, b = h0.mount("a"), h1.mount("b")
    (a / "f").write_bytes(b"from host 0")
    assert (b / "f").read_bytes() == b"from host 0"
    for mode in ("lease", "writethrough"):
        mounts = [h0.mount(f"{mode}0", f"consistency={mode}"), h1.mount(f"{mode}1", f"consistency={mode}")]
        assert_checker_passes(mounts, mode, CHECK_OPS)
    assert s3_objects(etcd_dep)

