"""Passthrough must never reach outside its source through the daemon.

Layout (split, so the source's parent and the mount point's parent differ):

    base/a/SECRET_NAME      sentinel outside the source ("SECRET")
    base/a/outside/         an empty directory outside the source
    base/a/src/             the source
    base/m/mnt/             the mount point

The kernel resolves `..` and symlink targets itself in the caller's
namespace; the daemon must not add a path of its own. With the default
`symlinks=raw` readlink returns the stored target unchanged; with
`symlinks=beneath` reading through a link never lands outside the source.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.fs("passthrough")

SECRET_NAME = "sentinel-outside"
SECRET = b"SECRET: outside the source"


def populate(base: Path) -> dict:
    """Creates the tree around and inside the (not yet mounted) source; returns
    in-source file contents by relative path."""
    a, src = base / "a", base / "a" / "src"
    (a / SECRET_NAME).write_bytes(SECRET)
    (a / "outside").mkdir()
    (src / "sub").mkdir()
    inside = {
        "file": b"inside: file",
        "sub/file2": b"inside: sub/file2",
        # Where a clamped "../sentinel-outside" from the source root lands.
        SECRET_NAME: b"inside: decoy at the source root",
        "sub/" + SECRET_NAME: b"inside: decoy in sub",
    }
    for rel, data in inside.items():
        (src / rel).write_bytes(data)
    links = {
        "abs": str(a / SECRET_NAME),
        "rel": "../" + SECRET_NAME,
        "sub/rel2": "../../" + SECRET_NAME,
        "sub/deep": "../../../../../../../../" + str(a / SECRET_NAME).lstrip("/"),
        "dotdot": "..",
        "absdir": str(a),
        "abs-dangling": str(a / "created-through-link"),
        "inlink": "file",
    }
    for rel, target in links.items():
        os.symlink(target, src / rel)
    return {"inside": inside, "links": links}


def outside_snapshot(base: Path) -> dict:
    """Everything outside the source and the mount point, with contents."""
    snap = {}
    for root, dirs, files in os.walk(base):
        rootp = Path(root)
        dirs[:] = [d for d in dirs if rootp / d not in (base / "a" / "src", base / "m" / "mnt")]
        for name in dirs + files:
            p = rootp / name
            snap[str(p.relative_to(base))] = p.read_bytes() if p.is_file() and not p.is_symlink() else "dir"
    return snap


@pytest.fixture(params=["raw", "beneath"])
def escape_mount(request, config, mount_factory):
    """A passthrough mount over a populated source, in symlinks=raw or beneath mode."""
    mode = request.param
    m = mount_factory(config, options=[f"symlinks={mode}"] if mode != "raw" else [], layout="split")
    # make_mount created an empty source; fill it through the source side (not the mount).
    info = populate(m.base)
    m.mode = mode
    m.info = info
    return m


def test_dotdot_at_mount_root_is_the_mountpoints_parent(escape_mount):
    m = escape_mount
    st = os.stat(m.path / "..")
    parent = os.stat(m.path.parent)
    src_parent = os.stat(m.source.parent)
    assert (st.st_dev, st.st_ino) == (parent.st_dev, parent.st_ino), "mnt/.. is not the mount point's parent"
    assert (st.st_dev, st.st_ino) != (src_parent.st_dev, src_parent.st_ino), "mnt/.. reached the source's parent"
    assert SECRET_NAME not in os.listdir(m.path / "..")
    assert os.path.realpath(m.path / "sub" / ".." / "..") == str(m.path.parent)


def test_lookup_does_not_follow_links(escape_mount):
    """The daemon answers LOOKUP with the link itself, never with what it points at."""
    m = escape_mount
    for rel, target in m.info["links"].items():
        st = os.lstat(m.path / rel)
        assert st.st_mode & 0o170000 == 0o120000, f"{rel}: lstat through the mount is not a symlink"
    for rel, data in m.info["inside"].items():
        assert (m.path / rel).read_bytes() == data


def test_readlink(escape_mount):
    m = escape_mount
    if m.mode == "beneath":
        # Targets that point out may be rewritten; a link that stays inside is not.
        assert os.readlink(m.path / "inlink") == "file"
        for rel in m.info["links"]:
            assert os.readlink(m.path / rel), f"{rel}: empty target"
        return
    for rel, target in m.info["links"].items():
        got = os.readlink(m.path / rel)
        assert got == os.readlink(m.source / rel) == target, f"{rel}: readlink {got!r}, stored {target!r}"
        assert os.lstat(m.path / rel).st_size == len(os.fsencode(target))


def check_beneath_reads(m) -> None:
    allowed = set(m.info["inside"].values())
    for rel in ("abs", "rel", "sub/rel2", "sub/deep", "inlink"):
        try:
            data = (m.path / rel).read_bytes()
        except OSError as e:
            assert e.errno in (errno.ENOENT, errno.ELOOP, errno.EXDEV, errno.EACCES, errno.EPERM), (
                f"{rel}: unexpected error {errno.errorcode.get(e.errno)}"
            )
            continue
        assert data != SECRET, f"symlinks=beneath: reading {rel} reached the sentinel outside the source"
        assert data in allowed, f"symlinks=beneath: reading {rel} returned {data!r}, not an in-source file"
    for rel in ("dotdot", "absdir"):
        try:
            names = os.listdir(m.path / rel)
        except OSError:
            continue
        assert "src" not in names and "outside" not in names, f"{rel} listed the source's parent: {names}"
    assert (m.path / "inlink").read_bytes() == m.info["inside"]["file"], "in-source link broken by beneath"


def test_beneath_reads_stay_inside(escape_mount):
    if escape_mount.mode == "beneath":
        check_beneath_reads(escape_mount)
    else:
        # raw: the kernel follows the stored target like on any file system.
        assert (escape_mount.path / "abs").read_bytes() == SECRET
        assert (escape_mount.path / "inlink").read_bytes() == escape_mount.info["inside"]["file"]


def test_writes_stay_inside(escape_mount):
    m = escape_mount
    before = outside_snapshot(m.base)
    p = m.path
    (p / "new").write_bytes(b"n")
    (p / "newdir").mkdir()
    (p / "newdir" / "x").write_bytes(b"x")
    os.rename(p / "new", p / "sub" / "moved")
    os.link(p / "sub" / "moved", p / "hard")
    os.symlink("../../outside/evil", p / "sub" / "newlink")
    os.mknod(p / "fifo", 0o600 | 0o010000)
    with open(p / "inlink", "ab") as f:
        f.write(b"+appended")
    if m.mode == "beneath":
        # Writing through links that point out must not create or change anything outside.
        for rel in ("abs", "rel", "abs-dangling", "sub/deep"):
            try:
                with open(p / rel, "ab") as f:
                    f.write(b"escaped?")
            except OSError:
                pass
        for rel in ("dotdot", "absdir"):
            try:
                (p / rel / "made-through-link").write_bytes(b"escaped?")
            except OSError:
                pass
    after = outside_snapshot(m.base)
    assert after == before, f"outside of the source changed: {set(after.items()) ^ set(before.items())}"
    assert (m.source / "sub" / "moved").read_bytes() == b"n"
    assert (m.source / "newdir" / "x").read_bytes() == b"x"
    assert (m.source / "file").read_bytes() == m.info["inside"]["file"] + b"+appended"


def test_directory_swapped_for_symlink_behind_the_daemon(escape_mount):
    """A directory the kernel already knows is replaced, in the source, by a
    symlink to a directory outside. Creating through the old directory's
    inode must not follow the new symlink (a path-based daemon would)."""
    m = escape_mount
    (m.source / "d").mkdir()
    dfd = os.open(m.path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(m.source / "d", m.source / "d-old")
        os.symlink(str(m.base / "a" / "outside"), m.source / "d")
        for name in ("created", "made-dir", "made-link"):
            try:
                if name == "created":
                    os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dfd))
                elif name == "made-dir":
                    os.mkdir(name, dir_fd=dfd)
                else:
                    os.symlink("x", name, dir_fd=dfd)
            except OSError as e:
                # Refusing is fine (ENOENT, ESTALE); escaping is not.
                assert e.errno in (errno.ENOENT, errno.ESTALE, errno.EXDEV, errno.ELOOP), errno.errorcode[e.errno]
        assert os.listdir(m.base / "a" / "outside") == [], "files were created outside the source"
        assert set(os.listdir(m.source / "d-old")) <= {"created", "made-dir", "made-link"}
    finally:
        os.close(dfd)
