"""More inodes in the kernel's caches than the passthrough daemon may hold
descriptors (`-o path_fds=N`): the daemon gives descriptors up for file
handles and reopens them on use, so a tree larger than its descriptor limit
stays usable (before, the daemon failed with EMFILE at RLIMIT_NOFILE inodes).
"""

from __future__ import annotations

import os

import pytest

BUDGET = 64
FILES = 1500


def daemon_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.fs("passthrough", "passthrough+kp")
@pytest.mark.shortfuse_only
def test_tree_larger_than_the_descriptor_budget(config, mount_factory):
    m = mount_factory(config, options=[f"path_fds={BUDGET}"])
    assert m.daemon_pids, "no daemon found for the mount"
    idle = daemon_fds(m.daemon_pids[0])
    d = m.path / "many"
    d.mkdir()
    for i in range(FILES):
        (d / f"f{i:05d}").write_bytes(f"file {i}\n".encode())
    # The kernel keeps every dentry (and so every node) cached.
    names = sorted(os.listdir(d))
    assert len(names) == FILES
    for i, name in enumerate(names):
        assert (d / name).read_bytes() == f"file {i}\n".encode(), name
        assert os.stat(d / name).st_size == len(f"file {i}\n")
    held = daemon_fds(m.daemon_pids[0])
    assert held <= idle + BUDGET * 5 // 4 + 8, f"daemon holds {held} descriptors (idle {idle}, budget {BUDGET})"
    # The source saw exactly what was written.
    src = m.source / "many"
    assert sorted(os.listdir(src)) == names
    assert (src / names[-1]).read_bytes() == f"file {FILES - 1}\n".encode()
    # Renames and unlinks of nodes whose descriptor was given up.
    os.rename(d / names[0], d / "first")
    assert (d / "first").read_bytes() == b"file 0\n"
    for name in names[1:100]:
        os.unlink(d / name)
    assert len(os.listdir(d)) == FILES - 99
