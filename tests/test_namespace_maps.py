"""Namespace maps: a file system whose tree is a 1-to-1 image of a backing
directory (passthrough) lets the shim serve reading path calls (stat,
access, readlink) in the kernel beneath that directory, in process
(`shortfuse run -m MP=passthrough:SRC`) and over the rings (`shortfuse
serve passthrough` + `run -m MP`, for clients of the daemon's own user).

- The map is used: a daemon sees no LOOKUP for paths beneath the mount,
  and in process the file system's per-name lookups (openat2 with
  RESOLVE_NO_SYMLINKS, one per component) do not reach the kernel.
- Opens, creates, unlink, mkdir, rmdir and rename beneath the mount are
  the kernel's too: the program holds the backing file's own descriptor,
  which still looks like the mount's (fstat, /proc/self/fd), and the file
  system (a daemon) sees none of these calls.
- It is not used where the file system did not declare one
  (`-o symlinks=beneath`, whose READLINK rewrites targets) nor with
  SHORTFUSE_NAMES=off.
- What a program sees does not change: the mount's device number and the
  backing inode numbers; symbolic links leading out of the mount followed
  as the walk follows them; a directory the program renames is seen at
  once; a program that drops root gets the kernel's EACCES.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import sfmount
import test_ring
import test_run

shortfuse = test_run.shortfuse
Daemon = test_ring.Daemon

DEEP = "a/b/c/d/e"


@pytest.fixture
def tree():
    base = sfmount.new_scratch("nsmap")
    base.chmod(0o755)
    src = base / "src"
    (src / DEEP).mkdir(parents=True)
    (src / DEEP / "f").write_text("deep\n")
    (base / "m" / "outside").mkdir(parents=True)
    (base / "m" / "outside" / "g").write_text("out\n")
    # From the mount point's a/ (base/m/mnt/a): ../../outside is
    # base/m/outside; from the source's a/ it would be base/outside,
    # which does not exist.
    (src / "a" / "up").symlink_to("../../outside")
    (src / "a" / "rel").symlink_to("b")
    (src / "abs").symlink_to("/etc")
    yield base
    sfmount.remove_scratch(base)


# Stats paths and answers one JSON line: per path the (dev, ino) or errno.
PROBE = r"""
import errno, json, os, sys
out = {}
for p in sys.argv[1:]:
    if p.startswith("rename:"):
        a, b = p[7:].split(",")
        os.rename(a, b)
        continue
    if p.startswith("drop:"):
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        continue
    try:
        st = os.stat(p)
        out[p] = [st.st_dev, st.st_ino]
    except OSError as e:
        out[p] = errno.errorcode[e.errno]
print(json.dumps(out))
"""


def mounted(shortfuse: Path, base: Path, transport: str, opts: list[str]):
    """The mount point, the mount arguments of `run`, and the daemon (for
    the ring)."""
    mp = base / "m" / "mnt"
    if transport == "preload":
        spec = ["-m", f"{mp}=passthrough:{base / 'src'}"]
        if opts:
            spec += ["-o", ",".join(opts)]
        return mp, spec, None
    args = ["passthrough", str(base / "src"), str(mp)]
    if opts:
        args += ["-o", ",".join(opts)]
    return mp, ["-m", str(mp)], Daemon(shortfuse, base, args, mp)


def probe(shortfuse: Path, spec: list[str], paths: list[str], env=None, prefix=()) -> dict:
    p = subprocess.run(
        [*prefix, str(shortfuse), "run", *spec, "--", sys.executable, "-c", PROBE, *paths],
        capture_output=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return json.loads(p.stdout.decode().splitlines()[-1])


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_paths_beneath_the_map_look_as_through_the_file_system(shortfuse, tree, transport):
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    try:
        paths = [
            f"{mp}",
            f"{mp}/{DEEP}/f",
            f"{mp}/{DEEP}/missing",
            f"{mp}/a/rel/c",
            f"{mp}/a/up/g",
            f"{mp}/abs/hostname",
            f"{mp}/{DEEP}/f/x",
            # The program renames a directory it has been through: the old
            # path is gone and the new one is there, at once.
            f"rename:{mp}/a/b,{mp}/a/B",
            f"{mp}/{DEEP}/f",
            f"{mp}/a/B/c/d/e/f",
            f"{mp}/a/rel/c",
        ]
        got = probe(shortfuse, spec, paths)
        src = tree / "src"
        dev = got[str(mp)][0]
        assert got[str(mp)][1] == src.stat().st_ino
        # One identity: the mount's device, the backing inode.
        assert got[f"{mp}/a/B/c/d/e/f"] == [dev, (src / "a/B/c/d/e/f").stat().st_ino]
        assert got[f"{mp}/{DEEP}/missing"] == "ENOENT"
        assert got[f"{mp}/{DEEP}/f/x"] == "ENOTDIR"
        # After the rename (the dictionary keeps the last answer per path).
        assert got[f"{mp}/{DEEP}/f"] == "ENOENT"
        assert got[f"{mp}/a/rel/c"] == "ENOENT"
        # Links that lead out of the mount, followed from the mount point.
        g = tree / "m" / "outside" / "g"
        assert got[f"{mp}/a/up/g"] == [g.stat().st_dev, g.stat().st_ino]
        h = Path("/etc/hostname")
        assert got[f"{mp}/abs/hostname"] == [h.stat().st_dev, h.stat().st_ino]
        if daemon:
            # The kernel renamed it beneath the map: not the daemon.
            assert daemon.count("RENAME") == 0
    finally:
        if daemon:
            daemon.stop()


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_a_program_that_drops_root_gets_the_kernels_eacces(shortfuse, tree, transport):
    (tree / "src" / "a" / "b").chmod(0o700)
    mp, spec, daemon = mounted(shortfuse, tree, transport, ["allow_other"] if transport == "ring" else [])
    try:
        f = f"{mp}/{DEEP}/f"
        got = probe(shortfuse, spec, [f, "drop:", f, f"{mp}/a/rel/c", f"{mp}/a/rel"])
        assert got[f] == "EACCES"
        assert got[f"{mp}/a/rel/c"] == "EACCES"
        # b itself needs no search of b.
        assert got[f"{mp}/a/rel"][1] == (tree / "src/a/b").stat().st_ino
    finally:
        if daemon:
            daemon.stop()


def lookups_in_process(shortfuse: Path, spec: list[str], paths: list[str], base: Path, env=None) -> list[str]:
    """The openat2 calls of the in-process passthrough's lookups (one per
    name, RESOLVE_NO_SYMLINKS) that reached the kernel while `paths` were
    stat'ed, from strace."""
    log = base / "strace.log"
    probe(shortfuse, spec, paths, env=env, prefix=["strace", "-f", "-qq", "-e", "trace=openat2", "-o", str(log)])
    return [l for l in log.read_text().splitlines() if "RESOLVE_NO_SYMLINKS" in l and '"e"' in l]


def test_in_process_the_file_system_sees_no_lookup_beneath_the_map(shortfuse, tree):
    mp, spec, _ = mounted(shortfuse, tree, "preload", [])
    paths = [f"{mp}/{DEEP}/f"] * 3
    assert lookups_in_process(shortfuse, spec, paths, tree) == []
    # Where the map is not used, the same stats walk name by name.
    env = dict(os.environ, SHORTFUSE_NAMES="off")
    assert lookups_in_process(shortfuse, spec, paths, tree, env=env)
    _, beneath, _ = mounted(shortfuse, tree, "preload", ["symlinks=beneath"])
    assert lookups_in_process(shortfuse, beneath, paths, tree)


def test_over_the_ring_the_daemon_sees_no_lookup_beneath_the_map(shortfuse, tree):
    mp, spec, daemon = mounted(shortfuse, tree, "ring", [])
    try:
        paths = [f"{mp}/{DEEP}/f", f"{mp}/{DEEP}/missing", f"{mp}/a/rel/c/d"]
        got = probe(shortfuse, spec, paths)
        assert got[f"{mp}/{DEEP}/missing"] == "ENOENT"
        assert got[f"{mp}/a/rel/c/d"][1] == (tree / "src/a/b/c/d").stat().st_ino
        assert daemon.count("LOOKUP") == 0
        probe(shortfuse, spec, paths, env=dict(os.environ, SHORTFUSE_NAMES="off"))
        assert daemon.count("LOOKUP") > 0
    finally:
        daemon.stop()
    # A file system that did not declare a map sees every name.
    mp, spec, daemon = mounted(shortfuse, tree, "ring", ["symlinks=beneath"])
    try:
        probe(shortfuse, spec, [f"{mp}/{DEEP}/f"])
        assert daemon.count("LOOKUP") >= 6
    finally:
        daemon.stop()


# File calls beneath the mount, one JSON line of what the program saw.
# What the scripts below start with: `e` gives a call's result or errno name.
SCRIPT_START = r"""
import errno, fcntl, json, os, stat, sys
out = {}
def e(f):
    try:
        return f()
    except OSError as x:
        return errno.errorcode[x.errno]
"""

CHANGES = SCRIPT_START + r"""
mp, src = sys.argv[1], sys.argv[2]
d = f"{mp}/a/b/c"
out["mount"] = os.stat(mp).st_dev
fd = os.open(f"{d}/new", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
os.write(fd, b"hello")
st = os.fstat(fd)
out["fstat"] = [st.st_dev, st.st_ino, st.st_size, stat.S_IMODE(st.st_mode)]
out["fd_link"] = os.readlink(f"/proc/self/fd/{fd}")
out["status_flags"] = fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_NOFOLLOW | os.O_ACCMODE)
out["excl_again"] = e(lambda: os.open(f"{d}/new", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
os.close(fd)
fd = os.open(f"{d}/new", os.O_WRONLY | os.O_TRUNC)
out["truncated"] = os.fstat(fd).st_size
os.close(fd)
out["missing"] = e(lambda: os.open(f"{d}/nope", os.O_RDONLY))
out["missing_dir"] = e(lambda: os.open(f"{mp}/a/nope/x", os.O_RDONLY))
out["not_a_dir"] = e(lambda: os.open(f"{d}/new/x", os.O_RDONLY))
# A directory the usual way has been through (its cwd): renamed beneath
# the map, the old name is gone for the walk at once, the new one there.
os.chdir(f"{mp}/a/b")
os.rename(f"{mp}/a/b", f"{mp}/a/B")
out["chdir_old"] = e(lambda: os.chdir(f"{mp}/a/b"))
os.chdir(f"{mp}/a/B/c")
out["listing"] = sorted(os.listdir("."))
os.mkdir(f"{mp}/a/B/c/sub", 0o750)
out["mkdir_again"] = e(lambda: os.mkdir(f"{mp}/a/B/c/sub"))
os.rename(f"{mp}/a/B/c/new", f"{mp}/a/B/c/sub/moved")
out["moved"] = open(f"{mp}/a/B/c/sub/moved").read()
out["rmdir_full"] = e(lambda: os.rmdir(f"{mp}/a/B/c/sub"))
os.unlink(f"{mp}/a/B/c/sub/moved")
out["unlink_again"] = e(lambda: os.unlink(f"{mp}/a/B/c/sub/moved"))
os.rmdir(f"{mp}/a/B/c/sub")
out["listing_after"] = sorted(os.listdir("."))
os.chdir("/")
print(json.dumps(out))
"""


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_opens_and_changes_beneath_the_map_are_the_kernels(shortfuse, tree, transport):
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    src = tree / "src"
    try:
        p = subprocess.run(
            [str(shortfuse), "run", *spec, "--", sys.executable, "-c", CHANGES, str(mp), str(src)],
            capture_output=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        got = json.loads(p.stdout.decode().splitlines()[-1])
        moved = src / "a/B/c"
        dev = got["mount"]
        assert dev != src.stat().st_dev
        # The backing file, made with the program's umask (022) and mode;
        # fstat of the kernel's descriptor shows the mount's device.
        assert got["fstat"][0] == dev and got["fstat"][2:] == [5, 0o640]
        assert got["fd_link"] == f"{mp}/a/b/c/new"
        # The status flags the program opened with, nothing of the shim's.
        assert got["status_flags"] == os.O_WRONLY
        assert got["excl_again"] == "EEXIST"
        assert got["truncated"] == 0
        assert got["missing"] == "ENOENT" and got["missing_dir"] == "ENOENT"
        assert got["not_a_dir"] == "ENOTDIR"
        assert got["chdir_old"] == "ENOENT"
        assert got["listing"] == ["d", "new"]
        assert got["mkdir_again"] == "EEXIST"
        assert got["moved"] == ""
        assert got["rmdir_full"] == "ENOTEMPTY"
        assert got["unlink_again"] == "ENOENT"
        assert got["listing_after"] == ["d"]
        assert sorted(os.listdir(moved)) == ["d"]
        assert not (src / "a/b").exists()
        if daemon:
            for op in ["CREATE", "OPEN", "UNLINK", "MKDIR", "RMDIR", "RENAME"]:
                assert daemon.count(op) == 0, op
    finally:
        if daemon:
            daemon.stop()


def test_a_file_made_in_the_source_is_seen_by_the_next_open(shortfuse, tree):
    """Changes made in the source directory, behind the file system's back,
    are seen by the next open beneath the map (the kernel's answer), also
    for a name the program found missing a moment before."""
    mp, spec, _ = mounted(shortfuse, tree, "preload", [])
    src = tree / "src"
    script = (
        "import os, sys\n"
        "p = sys.argv[1] + '/a/b/late'\n"
        "try:\n    open(p)\nexcept FileNotFoundError:\n    print('missing')\n"
        "open(sys.argv[2] + '/a/b/late', 'w').write('made outside')\n"
        "print(open(p).read())\n"
        "os.unlink(sys.argv[2] + '/a/b/late')\n"
        "print(os.path.exists(p))\n"
    )
    # The program writes the source by its own path, which is not the
    # mount's: the kernel's, unseen by the file system.
    p = subprocess.run(
        [str(shortfuse), "run", *spec, "--", sys.executable, "-c", script, str(mp), str(src)],
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert p.stdout.decode().split() == ["missing", "made", "outside", "False"]


# Directory descriptors beneath the mount, one JSON line of what the
# program saw: listings, `*at` calls from the descriptor, fchdir, `..`.
DIRS = SCRIPT_START + r"""
mp = sys.argv[1]
fd = os.open(f"{mp}/a/b", os.O_RDONLY | os.O_DIRECTORY)
st = os.fstat(fd)
out["fstat"] = [st.st_dev, st.st_ino]
out["fd_link"] = os.readlink(f"/proc/self/fd/{fd}")
# getdents64 on the descriptor: the names and the inode numbers.
out["entries"] = sorted([x.name, x.inode()] for x in os.scandir(fd))
s = os.stat("c", dir_fd=fd, follow_symlinks=False)
out["stat_at"] = [s.st_dev, s.st_ino]
out["deep_at"] = os.stat("c/d/e/f", dir_fd=fd).st_ino
out["missing_at"] = e(lambda: os.stat("nope", dir_fd=fd))
sub = os.open("c", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
out["sub_fstat"] = os.fstat(sub).st_ino
out["sub_entries"] = sorted(x.name for x in os.scandir(sub))
up = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=sub)
out["dotdot"] = [os.fstat(up).st_dev, os.fstat(up).st_ino]
os.mkdir("made", dir_fd=sub)
f = os.open("made/x", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=sub)
os.close(f)
out["made"] = sorted(os.listdir(f"{mp}/a/b/c/made"))
os.unlink("made/x", dir_fd=sub)
os.rmdir("made", dir_fd=sub)
# A file is no directory to start from.
f = os.open(f"{mp}/{'a/b/c/d/e/f'}", os.O_RDONLY)
out["from_file"] = e(lambda: os.stat("x", dir_fd=f))
os.close(f)
os.fchdir(sub)
out["cwd"] = os.getcwd()
out["rel"] = os.stat("d/e/f").st_ino
os.chdir("/")
# The program renames the directory it holds: the descriptor follows.
os.rename(f"{mp}/a/b", f"{mp}/a/B")
out["after_rename"] = os.stat("c/d/e/f", dir_fd=fd).st_ino
# Moved from under the path it was opened by: `..` and fchdir take it
# where it is now.
os.rename(f"{mp}/a/B/c", f"{mp}/c2")
top = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=sub)
out["moved_up"] = os.fstat(top).st_ino
os.close(top)
os.fchdir(sub)
out["moved_cwd"] = os.getcwd()
os.chdir("/")
os.close(sub)
os.close(up)
os.close(fd)
print(json.dumps(out))
"""


def listings_read(log: Path) -> list[int]:
    """The descriptors of the getdents64 calls in an strace log: the
    program's are small numbers, the in-process file system's (the
    shim's) from 100 up."""
    return [int(l.split("getdents64(")[1].split(",")[0]) for l in log.read_text().splitlines() if "getdents64(" in l]


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_directories_beneath_the_map_are_the_kernels(shortfuse, tree, transport):
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    src = tree / "src"
    try:
        log = tree / "strace.log"
        trace = ["strace", "-f", "-qq", "-e", "trace=getdents64", "-o", str(log)]
        out = subprocess.check_output(
            [*trace, str(shortfuse), "run", *spec, "--", sys.executable, "-c", DIRS, str(mp)], timeout=120
        )
        got = json.loads(out.decode().splitlines()[-1])
        dev = got["fstat"][0]
        b = src / "a/B"
        assert dev != src.stat().st_dev
        assert got["fstat"][1] == b.stat().st_ino
        assert got["fd_link"] == f"{mp}/a/b"
        assert got["entries"] == [["c", (src / "c2").stat().st_ino]]
        assert got["stat_at"] == [dev, (src / "c2").stat().st_ino]
        assert got["deep_at"] == (src / "c2/d/e/f").stat().st_ino
        assert got["missing_at"] == "ENOENT"
        assert got["sub_fstat"] == got["stat_at"][1]
        assert got["sub_entries"] == ["d"]
        assert got["dotdot"] == [dev, b.stat().st_ino]
        assert got["made"] == ["x"]
        assert got["from_file"] == "ENOTDIR"
        assert got["cwd"] == f"{mp}/a/b/c"
        assert got["rel"] == got["deep_at"]
        assert got["after_rename"] == got["deep_at"]
        assert got["moved_up"] == src.stat().st_ino
        assert got["moved_cwd"] == f"{mp}/c2"
        # Every listing was read by the program's own descriptor.
        fds = listings_read(log)
        assert fds and all(fd < 100 for fd in fds), fds
        if daemon:
            # No listing reached the daemon; one directory was opened the
            # usual way: the root, as `..` of the moved directory, which
            # the walk takes (the root is no name beneath the map).
            assert daemon.count("READDIR") == 0 and daemon.count("READDIRPLUS") == 0
            assert daemon.count("OPENDIR") == 1
    finally:
        if daemon:
            daemon.stop()


# What find, coreutils and tar make of a tree: what they print first
# (native and through the shim alike), then what they change.
LISTINGS = r"""
set -e
cd "$1"
find . -printf '%p %i %y %s %m %n %U %G %T@\n'
ls -liR --time-style=full-iso .
du -a .
tar cf - . | sha256sum
"""
CHANGES_TREE = r"""
set -e
cd "$1"
cp -a a copy
rm -rf copy a/b/c
find . | sort
"""


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_listings_beneath_the_map_match_native(shortfuse, tree, transport):
    src = tree / "src"
    for i in range(300):
        (src / "a/b" / f"f{i}").write_text("x" * i)
    native = subprocess.run(["sh", "-c", LISTINGS, "sh", str(src)], capture_output=True, timeout=120)
    assert native.returncode == 0, native.stderr.decode()
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    log = tree / "strace.log"
    run = [str(shortfuse), "run", *spec, "--", "sh", "-c"]
    try:
        p = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=getdents64", "-o", str(log), *run, LISTINGS, "sh", str(mp)],
            capture_output=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        changed = subprocess.run([*run, CHANGES_TREE, "sh", str(mp)], capture_output=True, timeout=120)
        assert changed.returncode == 0, changed.stderr.decode()[-3000:]
        if daemon:
            for op in ["OPENDIR", "READDIR", "READDIRPLUS"]:
                assert daemon.count(op) == 0, op
    finally:
        if daemon:
            daemon.stop()
    # Byte for byte: names, order, inode numbers, sizes, modes, times.
    assert p.stdout.decode() == native.stdout.decode()
    # Every listing was the program's own (in process, the file system's
    # reads of a directory are on the shim's descriptors, from 100 up).
    fds = listings_read(log)
    assert len(fds) > 20 and all(fd < 100 for fd in fds), fds
    listed = changed.stdout.decode().split()
    assert "./a/b/f299" in listed and "./a/b/c" not in listed and "./copy" not in listed
    assert not (src / "a/b/c").exists() and not (src / "copy").exists()


# What programs do to a tree's names, modes, owners, times and extended
# attributes (coreutils, attr): printed as they see it, native and through
# the shim alike. Only names inside the tree; times the scripts set. Paths
# are absolute (a process started in the mount finds its working directory
# by a walk) and printed relative to the tree.
MAKES = r"""
set -eo pipefail
R=$1
{
mkdir $R/d
echo hi > $R/d/f
echo x > $R/d/g
ln $R/d/f $R/d/hard
ln -s f $R/d/soft
ln -s missing $R/d/dangling
mkfifo $R/d/fifo
truncate -s 1000 $R/d/g
truncate -s 3 $R/d/hard
python3 -c 'import os, stat, sys; os.truncate(sys.argv[1] + "/d/g", 700); os.mknod(sys.argv[1] + "/d/sock", 0o600 | stat.S_IFSOCK)' $R
python3 -c 'import ctypes, os, sys; c = ctypes.CDLL(None, use_errno=True); fd = os.open(sys.argv[1], os.O_RDONLY); print("utimensat AT_EMPTY_PATH", c.utimensat(fd, b"", None, 0x1000), ctypes.get_errno())' $R/d/g
touch -d '2001-02-03 04:05:06.789' $R/d/f
touch -h -d '2002-02-03 04:05:06' $R/d/soft
touch -d '2003-02-03 04:05:06' -m $R/d/g
chmod -R go-rwx $R/d
chmod 4755 $R/d/g
chown 1234:2345 $R/d/g
chown -h 1234:2345 $R/d/soft
setfattr -n user.a -v hello $R/d/f
setfattr -n user.b -v 0x00ff $R/d/g
setfattr -n user.c -v gone $R/d/g
setfattr -x user.c $R/d/g
ls -l --time-style=+%Y $R/d
} 2>&1 | sed -e "s|$R|.|g" -e "s|${R#/}|.|g"
"""

# What the programs above made, copied and shown.
COPIES = r"""
set -eo pipefail
R=$1
{
cp -a $R/d $R/e
ls -lR --time-style=+%Y $R
stat -c '%n %s %a %u %g %h %F %y' $R/d/f $R/d/g $R/d/soft $R/e/f $R/e/g $R/e/soft
stat -c '%n %s %a %u %g %h %F' $R/e/fifo
getfattr -R -h -d --absolute-names $R | sort
getfattr -h -n user.a $R/d/hard
readlink $R/d/soft $R/e/soft $R/e/dangling
cat $R/e/hard
} 2>&1 | sed -e "s|$R|.|g" -e "s|${R#/}|.|g"
"""

# What the same programs are refused (the messages name the paths), and
# what is the walk's beneath the map: `mkfifo -m` changes the mode through
# an O_PATH descriptor, a name followed through a symbolic link.
REFUSALS = r"""
R=$1
export T='import os, sys; os.truncate(sys.argv[1], 1)'
for c in 'ln d/f d/hard' 'ln d d/dirlink' 'ln -s x d/f' 'mkfifo d/fifo' 'truncate -s 5 d/nope/x' \
         'truncate -s 5 d' 'truncate -s 1 d/fifo' 'chmod 700 d/f/' 'chmod 600 d/nope' 'chown 1:1 d/nope' \
         'touch -c -d 2001-01-01 d/f/' 'setfattr -n user.z -v 1 d/fifo' 'getfattr -n user.nope d/f' \
         'setfattr -h -n user.z -v 1 d/soft' 'ln -s x d/nope/y' 'ln d/f d/nope/y' \
         'python3 -c "$T" d' 'python3 -c "$T" d/fifo' 'python3 -c "$T" d/nope' \
         'mkfifo -m 600 d/fifo2' 'stat -c "%n %a %F" d/fifo2' 'getfattr -n user.a d/soft' 'chmod 640 d/soft' \
         'stat -c "%n %a %F" d/f'; do
  echo "== $c"
  (cd $R && sh -c "$c" 2>&1)
  echo "rc=$?"
done
"""


# Changes through a path that leaves the mount by a symbolic link.
OUTSIDE = r"""
set -e
truncate -s 2 "$1"
chmod 604 "$1"
setfattr -n user.o -v out "$1"
touch -m -d '2001-02-03 04:05:06' "$1"
"""


def passthrough_lookups(log: Path) -> list[str]:
    """The in-process passthrough's lookups (openat2 O_PATH with
    RESOLVE_NO_SYMLINKS, one per name) in an strace log."""
    return [l for l in log.read_text().splitlines() if "RESOLVE_NO_SYMLINKS" in l and "O_PATH" in l]


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_name_and_attribute_changes_beneath_the_map_match_native(shortfuse, tree, transport):
    native_dir = tree / "native"
    native_dir.mkdir()
    (tree / "src" / "work").mkdir()
    native = subprocess.run(["bash", "-c", MAKES, "sh", str(native_dir)], capture_output=True, timeout=120)
    assert native.returncode == 0, native.stderr.decode()
    native_copies = subprocess.run(["bash", "-c", COPIES, "sh", str(native_dir)], capture_output=True, timeout=120)
    assert native_copies.returncode == 0, native_copies.stderr.decode()
    native_refused = subprocess.run(["bash", "-c", REFUSALS, "sh", str(native_dir)], capture_output=True, timeout=120)
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    log = tree / "strace.log"
    run = [str(shortfuse), "run", *spec, "--", "bash", "-c"]
    trace = ["strace", "-f", "-qq", "-e", "trace=openat2", "-o", str(log)] if not daemon else []
    try:
        p = subprocess.run([*trace, *run, MAKES, "sh", f"{mp}/work"], capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        if daemon:
            ops = ["LOOKUP", "LINK", "SYMLINK", "MKNOD", "SETATTR", "READLINK"]
            # (Each process's start-up sends one GETATTR, of the root.)
            ops += ["GETXATTR", "LISTXATTR", "SETXATTR", "REMOVEXATTR"]
            seen = {op: daemon.count(op) for op in ops}
            assert seen == dict.fromkeys(ops, 0)
        else:
            assert passthrough_lookups(log) == []
        copies = subprocess.run([*run, COPIES, "sh", f"{mp}/work"], capture_output=True, timeout=120)
        assert copies.returncode == 0, copies.stderr.decode()[-3000:]
        if daemon:
            # cp's own calls on names: the kernel's.
            ops = ["LINK", "SYMLINK", "MKNOD", "SETATTR", "GETXATTR", "LISTXATTR", "SETXATTR", "REMOVEXATTR"]
            ops += ["READLINK"]
            assert {op: daemon.count(op) for op in ops} == dict.fromkeys(ops, 0)
        refused = subprocess.run([*run, REFUSALS, "sh", f"{mp}/work"], capture_output=True, timeout=120)
        # Through a symbolic link that leaves the mount (a/up is
        # ../../outside): followed from the mount point, as the mount
        # follows it, never from the backing directory.
        out = subprocess.run([*run, OUTSIDE, "sh", f"{mp}/a/up/g"], capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr.decode()[-3000:]
    finally:
        if daemon:
            daemon.stop()
    # Byte for byte: names, link counts, sizes, modes, owners, times, types, attributes.
    assert p.stdout.decode() == native.stdout.decode()
    assert copies.stdout.decode() == native_copies.stdout.decode()
    g = tree / "m" / "outside" / "g"
    st = g.stat()
    assert (st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime) == (2, 0o604, 981173106)
    assert os.getxattr(g, "user.o") == b"out"
    assert refused.stdout.decode() == native_refused.stdout.decode()


# Directory opens spelled with a trailing slash, as git's untracked-file
# scan spells them (opendir("sub/")), then what each gives: the names, or
# the errno. `link/` follows a symbolic link to a directory even with
# O_NOFOLLOW; `file/` is ENOTDIR.
SLASHED = r"""
import errno, json, os, sys
os.chdir(sys.argv[1])
out = {}
for p in ["a/", "a/b//", "a/rel/", "missing/", "a/b/c/d/e/f/"]:
    for nofollow in (0, os.O_NOFOLLOW):
        try:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | nofollow)
            out[f"{p} {nofollow}"] = sorted(x.name for x in os.scandir(fd))
            os.close(fd)
        except OSError as e:
            out[f"{p} {nofollow}"] = errno.errorcode[e.errno]
print(json.dumps(out))
"""

GIT_STATUS = r"""
set -e
cd "$1"
git status --porcelain=v1 --untracked-files=all
"""


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_directory_opens_with_a_trailing_slash_are_the_kernels(shortfuse, tree, transport):
    src = tree / "src"
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tree)}
    repo = src / "repo"
    for d in ["x", "y/z", "new/deep"]:
        (repo / d).mkdir(parents=True)
    for f in ["x/1", "y/z/2", "top"]:
        (repo / f).write_text(f)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True, env=env)
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, "commit", "-qm", "one"], check=True, env=env)
    (repo / "new/deep/3").write_text("3")
    (repo / "x/1").write_text("changed")
    native = {
        "slashed": subprocess.check_output([sys.executable, "-c", SLASHED, str(src)], timeout=60).decode(),
        "git": subprocess.check_output(["sh", "-c", GIT_STATUS, "sh", str(repo)], env=env, timeout=60).decode(),
    }
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    log = tree / "strace.log"
    trace = ["strace", "-f", "-qq", "-e", "trace=getdents64", "-o", str(log)]
    try:
        got = {
            "slashed": subprocess.check_output(
                [*trace, str(shortfuse), "run", *spec, "--", sys.executable, "-c", SLASHED, str(mp)], timeout=120
            ).decode(),
        }
        # The link opened as `a/rel/` takes the walk (it may lead anywhere).
        ops = ["OPENDIR", "READDIR", "READDIRPLUS"]
        before = [daemon.count(op) for op in ops] if daemon else []
        # git's run alone, with the in-process passthrough's own lookups.
        trace = ["strace", "-f", "-qq", "-e", "trace=getdents64,openat2", "-o", str(log)]
        got["git"] = subprocess.check_output(
            [*trace, str(shortfuse), "run", *spec, "--", "sh", "-c", GIT_STATUS, "sh", str(mp / "repo")],
            env=env,
            timeout=120,
        ).decode()
        assert got == native
        assert " M x/1" in got["git"] and "?? new/deep/3" in got["git"]
        # git's listings were read by the program's own descriptors.
        fds = listings_read(log)
        assert fds and all(fd < 100 for fd in fds), fds
        # and no name below the repository was looked up by the file system
        # in process (the shell's and git's chdir into it take the walk).
        assert [l for l in passthrough_lookups(log) if '"repo"' not in l] == []
        if daemon:
            # No directory git opened or listed reached the daemon.
            assert [daemon.count(op) for op in ops] == before
    finally:
        if daemon:
            daemon.stop()


# O_PATH opens and calls that follow a last symbolic link, beneath the
# mount: what each gives, with paths and device numbers made relative to
# the root the script was given (the mount point, or the source natively).
FOLLOWED = SCRIPT_START + r"""
r = sys.argv[1]
dev = os.stat(r + "/a").st_dev
def rel(p):
    return p[len(r):] if p.startswith(r + "/") else p
def st(s):
    return [s.st_ino, stat.S_IFMT(s.st_mode), s.st_size, s.st_dev == dev]
def fd_link(fd):
    return rel(os.readlink(f"/proc/self/fd/{fd}"))
for p in ["lnk", "a/b/c/d/e/back", "a/b/c/d/e/back/c/d/e/f", "dang", "loop", "a/rel", "a/b/c/d/e/f"]:
    out[f"stat {p}"] = e(lambda: st(os.stat(f"{r}/{p}")))
    out[f"access {p}"] = e(lambda: os.access(f"{r}/{p}", os.R_OK))
    if "back/" in p:
        continue
    out[f"open {p}"] = e(lambda: (lambda fd: [fd_link(fd), st(os.fstat(fd))])(os.open(f"{r}/{p}", os.O_RDONLY)))
    for nf in (0, os.O_NOFOLLOW):
        def opath():
            fd = os.open(f"{r}/{p}", os.O_PATH | nf)
            got = [fd_link(fd), st(os.fstat(fd)), fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_PATH | os.O_NOFOLLOW | os.O_ACCMODE)]
            got.append(e(lambda: os.read(fd, 1)))
            got.append(e(lambda: st(os.stat("", dir_fd=fd, follow_symlinks=False))))
            got.append(e(lambda: os.readlink("", dir_fd=fd)))
            os.close(fd)
            return got
        out[f"opath {nf} {p}"] = e(opath)
# An O_PATH directory: a walk from it, fchdir to it.
fd = os.open(f"{r}/lnkdir", os.O_PATH | os.O_DIRECTORY)
out["at"] = [fd_link(fd), st(os.stat("e/f", dir_fd=fd))]
g = os.open("e/f", os.O_RDONLY, dir_fd=fd)
out["at_read"] = os.read(g, 10).decode()
os.close(g)
os.fchdir(fd)
out["fchdir"] = rel(os.getcwd())
out["cwd_stat"] = st(os.stat("e/f"))
os.chdir("/")
os.close(fd)
# mkfifo -m: a mode set through the O_PATH descriptor's /proc link.
os.mkfifo(f"{r}/fifo", 0o644)
fd = os.open(f"{r}/fifo", os.O_PATH | os.O_NOFOLLOW)
os.chmod(f"/proc/self/fd/{fd}", 0o600)
os.close(fd)
out["fifo"] = oct(stat.S_IMODE(os.stat(f"{r}/fifo").st_mode))
os.unlink(f"{r}/fifo")
print(json.dumps(out))
"""


def run_traced(shortfuse: Path, spec: list[str], script: str, root: Path, log: Path | None):
    """`script` under `run` with `root` as its argument; with `log`, its
    openat2 calls traced there (the in-process passthrough's lookups)."""
    trace = ["strace", "-f", "-qq", "-e", "trace=openat2", "-o", str(log)] if log else []
    p = subprocess.run(
        [*trace, str(shortfuse), "run", *spec, "--", sys.executable, "-c", script, str(root)],
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return p


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_o_path_opens_and_links_followed_beneath_the_map_match_native(shortfuse, tree, transport):
    src = tree / "src"
    # Links that stay beneath the map: the walk need not follow them.
    (src / "lnk").symlink_to("a/b/c/d/e/f")
    (src / "lnkdir").symlink_to("a/b/c/d")
    (src / DEEP / "back").symlink_to("../../../../rel")
    (src / "dang").symlink_to("a/nope")
    (src / "loop").symlink_to("loop")
    native = subprocess.run([sys.executable, "-c", FOLLOWED, str(src)], capture_output=True, timeout=60)
    assert native.returncode == 0, native.stderr.decode()
    # Names trusted for longer than the script can take on a loaded
    # machine: the count of lookups below is then the walk's alone, not
    # also the cache's entries expiring (one second by default) mid-run.
    mp, spec, daemon = mounted(shortfuse, tree, transport, ["entry_timeout=60", "attr_timeout=60"])
    log = tree / "strace.log"
    try:
        p = run_traced(shortfuse, spec, FOLLOWED, mp, log if not daemon else None)
        got = json.loads(p.stdout.decode().splitlines()[-1])
        assert got == json.loads(native.stdout.decode())
        assert got["opath 0 lnk"][0] == "/a/b/c/d/e/f" and got["opath 0 lnk"][1][3]
        assert got["opath 131072 lnk"][0] == "/lnk" and got["opath 131072 lnk"][5] == "a/b/c/d/e/f"
        assert got["stat dang"] == "ENOENT" and got["stat loop"] == "ELOOP"
        if daemon:
            # No open reached the daemon, and of the names only what the
            # walk still finds: the link that loops (1) and, for getcwd,
            # the place in the mount of the directory fchdir went to (4:
            # a, b, c, d). The FIFO's mode set through its /proc link is the
            # kernel's.
            assert daemon.count("LOOKUP") <= 5 and daemon.count("OPEN") == 0
        # Links out of the mount still lead where the mount leads them.
        escapes = probe(shortfuse, spec, [f"{mp}/a/up", f"{mp}/abs"])
        assert escapes[f"{mp}/a/up"][1] == (tree / "m" / "outside").stat().st_ino
        assert escapes[f"{mp}/abs"][1] == Path("/etc").stat().st_ino
    finally:
        if daemon:
            daemon.stop()
    if not daemon:
        # The in-process passthrough looked up no directory's name on the
        # way (the shim names them as one path, or a last name alone).
        lookups = [l for l in passthrough_lookups(log) if any(f'"{d}"' in l for d in "abcde")]
        # (fchdir's place in the mount is still the walk's: a, b, c, d.)
        assert len(lookups) <= 4 and not [l for l in lookups if '"e"' in l], lookups


# Directories opened without O_DIRECTORY (as `open(dir, O_RDONLY)` does):
# what the program does from the descriptor, printed in terms of the tree
# (no device numbers), the same natively and through the shim.
PLAIN_OPENS = SCRIPT_START + r"""
root = sys.argv[1]
fd = os.open(f"{root}/a/b", os.O_RDONLY)
out["stat_at"] = e(lambda: stat.S_IFMT(os.stat("c/d/e/f", dir_fd=fd).st_mode))
out["open_at"] = e(lambda: os.read(os.open("c/d/e/f", os.O_RDONLY, dir_fd=fd), 10).decode())
up = os.open("..", os.O_RDONLY, dir_fd=fd)
out["up_entries"] = sorted(os.listdir(up))
sub = os.open(f"{root}/a/b/c", os.O_RDONLY)
os.fchdir(sub)
out["cwd"] = os.getcwd()[len(root):]
out["rel"] = e(lambda: os.stat("d/e/f").st_size)
os.chdir("/")
out["fd_link"] = os.readlink(f"/proc/self/fd/{sub}")[len(root):]
out["fstat_type"] = stat.S_IFMT(os.fstat(sub).st_mode) == stat.S_IFDIR
f = os.open(f"{root}/a/b/c/d/e/f", os.O_RDONLY)
out["from_file"] = e(lambda: os.stat("x", dir_fd=f))
out["fchdir_file"] = e(lambda: os.fchdir(f))
print(json.dumps(out))
"""


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_directories_opened_without_o_directory_beneath_the_map_match_native(shortfuse, tree, transport):
    """An open beneath the map does not ask the kernel what it opened: a
    directory opened without O_DIRECTORY is found to be one when a call
    first starts from it (a path relative to it, fchdir)."""
    native = subprocess.run(
        [sys.executable, "-c", PLAIN_OPENS, str(tree / "src")], capture_output=True, timeout=60, check=True
    )
    want = json.loads(native.stdout.decode().splitlines()[-1])
    assert want["rel"] == 5 and want["from_file"] == "ENOTDIR", want
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    try:
        r = subprocess.run(
            [str(shortfuse), "run", *spec, "--", sys.executable, "-c", PLAIN_OPENS, str(mp)],
            capture_output=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        assert json.loads(r.stdout.decode().splitlines()[-1]) == want
    finally:
        if daemon:
            daemon.stop()


def calls_of(log: Path, image: str) -> dict[str, int]:
    """How many calls of each name the processes running `image` made, in
    an strace -f log."""
    counts: dict[str, int] = {}
    running: set[str] = set()
    for line in log.read_text().splitlines():
        pid, _, call = line.partition(" ")
        call = call.lstrip()
        name = call.split("(")[0]
        if name == "execve" and not call.endswith("ENOENT (No such file or directory)"):
            if os.path.basename(call.split('"')[1]) == image:
                running.add(pid)
            else:
                running.discard(pid)
        elif pid in running:
            counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_grep_beneath_the_map_asks_the_kernel_no_more_than_natively(shortfuse, tree, transport):
    """grep opens, stats and reads every file it is given. Beneath the map
    the shim adds no system call per file to the program's own: the open
    does not stat what it opened, and the stat struct the program's fstat
    fills is not probed again (its page is remembered as writable). Counted
    per file: the calls of a grep of 90 files less those of one of 30, so
    that what the shim makes at start-up cancels out."""
    d = tree / "src" / "many"
    d.mkdir()
    for i in range(90):
        (d / f"f{i:02}").write_text(f"line {i}\n" + ("needle\n" if i % 3 == 0 else ""))
    calls = "trace=fstat,newfstatat,statx,futex"

    def counted(cwd: Path, prefix: list[str], files: int) -> dict[str, int]:
        names = [f"many/f{i:02}" for i in range(files)]
        log = tree / "grep.log"
        r = subprocess.run(
            ["strace", "-f", "-qq", "-o", str(log), "-e", f"{calls},execve", *prefix, "grep", "-l", "needle", *names],
            cwd=cwd,
            capture_output=True,
            timeout=120,
        )
        assert r.stdout.decode().split() == [n for i, n in enumerate(names) if i % 3 == 0], r
        return calls_of(log, "grep")

    def per_60_files(cwd: Path, prefix: list[str]) -> dict[str, int]:
        few, many = counted(cwd, prefix, 30), counted(cwd, prefix, 90)
        stats = lambda c: c.get("fstat", 0) + c.get("newfstatat", 0) + c.get("statx", 0)
        return {"stats": stats(many) - stats(few), "futex": many.get("futex", 0) - few.get("futex", 0)}

    native = per_60_files(tree / "src", [])
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    try:
        run = [str(shortfuse), "run", *spec, "--", "bash", "-c", f'cd {mp} && exec "$@"', "--"]
        shim = per_60_files(Path("/"), run)
    finally:
        if daemon:
            daemon.stop()
    # Before, the shim made 60 stats and 60 futex probes more for the 60
    # files; a probe of a new page of grep's arguments now and then remains.
    assert shim["stats"] <= native["stats"] + 3, (native, shim)
    assert shim["futex"] <= native["futex"] + 10, (native, shim)


# rsync's open of each file it sends: first as a directory, without
# following a link (O_PATH|O_DIRECTORY|O_NOFOLLOW, ENOTDIR for a file),
# then to read it, both from a directory descriptor of its own; then the
# answers for links, with and without a trailing slash.
RSYNC_OPENS = SCRIPT_START + r"""
root, n = sys.argv[1], int(sys.argv[2])
d = os.open(f"{root}/many", os.O_PATH | os.O_DIRECTORY)
probe = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
for i in range(n):
    out[f"f{i:02}"] = e(lambda: os.open(f"f{i:02}", probe, dir_fd=d))
    fd = os.open(f"f{i:02}", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=d)
    os.read(fd, 100)
    os.close(fd)
links = os.open(f"{root}/a", os.O_PATH | os.O_DIRECTORY)
for name in ["rel", "rel/"]:
    for flags in [probe, os.O_DIRECTORY | os.O_NOFOLLOW, os.O_PATH | os.O_DIRECTORY]:
        fd = e(lambda: os.open(name, flags, dir_fd=links))
        out[f"{name} {flags:o}"] = fd if isinstance(fd, str) else e(lambda: os.stat("c", dir_fd=fd).st_ino)
print(json.dumps(out))
"""


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_a_file_opened_as_a_directory_beneath_the_map_is_the_kernels_enotdir(shortfuse, tree, transport):
    """rsync opens every file it sends with O_DIRECTORY|O_NOFOLLOW first, to
    tell a file from a directory: the kernel's ENOTDIR is the answer, as
    natively, unless the program's path ended in a slash (a link to a
    directory is then followed). Before, the shim took every such ENOTDIR
    to the walk: a readlink of /proc/self/fd, three stats and an open more
    per file in process, a LOOKUP per file over the rings. Counted per file:
    the calls of 90 files less those of 30."""
    d = tree / "src" / "many"
    d.mkdir()
    for i in range(90):
        (d / f"f{i:02}").write_text(f"line {i}\n")
    calls = "trace=openat,openat2,fstat,newfstatat,statx,readlink,readlinkat"
    image = os.path.basename(sys.executable)

    def counted(root: Path, prefix: list[str], files: int) -> tuple[dict, dict[str, int]]:
        log = tree / "opens.log"
        r = subprocess.run(
            ["strace", "-f", "-qq", "-o", str(log), "-e", f"{calls},execve", *prefix]
            + [sys.executable, "-c", RSYNC_OPENS, str(root), str(files)],
            capture_output=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        return json.loads(r.stdout.decode().splitlines()[-1]), calls_of(log, image)

    def per_60_files(root: Path, prefix: list[str]) -> tuple[dict, int]:
        (_, few), (answers, many) = counted(root, prefix, 30), counted(root, prefix, 90)
        return answers, sum(many.values()) - sum(few.values())

    want, native = per_60_files(tree / "src", [])
    probe = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
    assert want["f00"] == "ENOTDIR" and want[f"rel {probe:o}"] == "ENOTDIR" and isinstance(want[f"rel/ {probe:o}"], int), want
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    try:
        lookups = daemon.count("LOOKUP") if daemon else 0
        answers, shim = per_60_files(mp, [str(shortfuse), "run", *spec, "--"])
        lookups = (daemon.count("LOOKUP") if daemon else 0) - lookups
    finally:
        if daemon:
            daemon.stop()
    assert answers == want
    # Native: two opens per file, 120 for the 60.
    assert shim <= native + 3, (native, shim)
    # Over the rings the two runs looked up the directories of the paths,
    # never one of the 120 files.
    assert lookups < 30, lookups


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_tar_xf_beneath_the_map_asks_the_kernel_no_more_than_natively(shortfuse, tree, transport):
    """tar xf makes each file by its path below the current directory, then
    sets its owner and mode through the descriptor (fchown, fchmod). Those
    are of a file, which guards no directory: the directory kept for the
    next file's open stays. Before, each forgot every kept directory, and
    each file's open found its directory again: an openat2, two fcntl and
    two closes more per file. Counted per file: the calls of extracting 90
    files less those of 30."""
    archives = {}
    for files in (30, 90):
        d = tree / f"t{files}" / "tree" / "d"
        d.mkdir(parents=True)
        for i in range(files):
            (d / f"f{i:02}").write_text(f"line {i}\n")
        archives[files] = tree / f"t{files}.tar"
        subprocess.run(["tar", "cf", str(archives[files]), "-C", str(tree / f"t{files}"), "tree"], check=True)
    calls = "trace=openat,openat2,fcntl,close,newfstatat,fstat,statx"

    def counted(prefix: list[str], root: Path, files: int) -> dict[str, int]:
        log = tree / "tar.log"
        into = root / f"x{files}"
        r = subprocess.run(
            ["strace", "-f", "-qq", "-o", str(log), "-e", f"{calls},execve", *prefix]
            + ["bash", "-c", 'mkdir "$0" && cd "$0" && exec "$@"', str(into), "tar", "xf", str(archives[files])],
            capture_output=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        return calls_of(log, "tar")

    def per_60_files(prefix: list[str], root: Path) -> int:
        few, many = counted(prefix, root, 30), counted(prefix, root, 90)
        return sum(many.values()) - sum(few.values())

    native = per_60_files([], tree / "src")
    for files in (30, 90):
        subprocess.run(["rm", "-rf", str(tree / "src" / f"x{files}")], check=True)
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    try:
        shim = per_60_files([str(shortfuse), "run", *spec, "--"], mp)
        assert len(list((tree / "src" / "x90" / "tree" / "d").iterdir())) == 90
    finally:
        if daemon:
            daemon.stop()
    assert shim <= native + 5, (native, shim)


# Stats one file in each of the first N directories below the root.
STATS_IN_DIRECTORIES = r"""
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    os.stat(f"{root}/d{i:02}/f")
"""


def flag_reads_of_opened(log: Path, image: str) -> tuple[int, int]:
    """In an strace -f log of openat2 and fcntl calls: how many openat2
    calls the processes running `image` made, and how many fcntl F_GETFD
    calls they made on the descriptor such an openat2 had just returned."""
    opens = reads = 0
    running: set[str] = set()
    made: dict[str, str] = {}
    for line in log.read_text().splitlines():
        pid, _, call = line.partition(" ")
        call = call.lstrip()
        if call.startswith("execve(") and not call.endswith("ENOENT (No such file or directory)"):
            if os.path.basename(call.split('"')[1]) == image:
                running.add(pid)
            else:
                running.discard(pid)
        elif pid not in running:
            continue
        elif call.startswith("openat2("):
            opens += 1
            made[pid] = call.rpartition("= ")[2]
        elif call.startswith("fcntl("):
            fd, _, cmd = call[len("fcntl(") :].partition(")")[0].partition(", ")
            reads += cmd == "F_GETFD" and fd == made.get(pid)
    return opens, reads


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_a_directory_kept_beneath_the_map_is_not_asked_for_its_flags(shortfuse, tree, transport):
    """A stat of a name in a directory not seen before keeps that directory:
    an openat2 of it, moved above the program's numbers (fcntl
    F_DUPFD_CLOEXEC, close). The open said O_CLOEXEC, so the move asks the
    kernel nothing more; before, an fcntl F_GETFD of each new descriptor
    asked whether it was close-on-exec. Counted for stats in 60
    directories."""
    for i in range(60):
        (tree / "src" / f"d{i:02}").mkdir()
        (tree / "src" / f"d{i:02}" / "f").write_text("x\n")
    image = os.path.basename(sys.executable)
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    log = tree / "stats.log"
    try:
        r = subprocess.run(
            ["strace", "-f", "-qq", "-o", str(log), "-e", "trace=openat2,fcntl,execve", str(shortfuse), "run", *spec]
            + ["--", sys.executable, "-c", STATS_IN_DIRECTORIES, str(mp), "60"],
            capture_output=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr.decode()[-3000:]
    finally:
        if daemon:
            daemon.stop()
    opens, reads = flag_reads_of_opened(log, image)
    assert opens >= 60, opens
    assert reads == 0, (opens, reads)


# O_PATH opens of a path the client's cache holds whole (a walk went
# through it: a `..` in a path is never the kernel's beneath the map).
CACHED_O_PATH = SCRIPT_START + r"""
r = sys.argv[1]
os.stat(f"{r}/a/b/../b/c/d/e/f")
for i in range(3):
    fd = os.open(f"{r}/a/b/c/d/e/f", os.O_PATH)
    s = os.fstat(fd)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_PATH | os.O_ACCMODE)
    link = os.readlink(f"/proc/self/fd/{fd}")[len(r):]
    out[f"opath {i}"] = [link, s.st_ino, stat.S_IFMT(s.st_mode), flags, e(lambda: os.read(fd, 1))]
    out[f"at {i}"] = e(lambda: os.stat("", dir_fd=fd, follow_symlinks=False).st_ino)
    os.close(fd)
print(json.dumps(out))
"""


def test_o_path_opens_of_a_path_the_ring_clients_cache_holds_make_no_system_call(shortfuse, tree):
    native = subprocess.run([sys.executable, "-c", CACHED_O_PATH, str(tree / "src")], capture_output=True, timeout=60)
    assert native.returncode == 0, native.stderr.decode()
    mp, spec, daemon = mounted(shortfuse, tree, "ring", [])
    log = tree / "strace.log"
    try:
        p = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=openat,openat2", "-o", str(log)]
            + [str(shortfuse), "run", *spec, "--", sys.executable, "-c", CACHED_O_PATH, str(mp)],
            capture_output=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        # (An O_PATH open is no OPEN of the file system.)
        assert daemon.count("OPEN") == 0
    finally:
        daemon.stop()
    assert json.loads(p.stdout.decode().splitlines()[-1]) == json.loads(native.stdout.decode())
    # The cache answered the opens: the kernel opened nothing named f.
    opened = [l for l in log.read_text().splitlines() if '"f"' in l or 'e/f"' in l]
    assert opened == [], opened


# What the kernel makes beneath the mount for calls the shim used to walk
# for: O_CREAT through a last symbolic link, O_TMPFILE files and the names
# linkat gives them, fchdir to a directory's descriptor (O_PATH or read),
# and chmod through a descriptor's /proc link. Paths and device numbers are
# made relative to the root the script was given; everything it makes it
# removes, so that the native run and the mount's start alike.
MADE = SCRIPT_START + r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
r = sys.argv[1]
dev = os.stat(r + "/a").st_dev
def rel(p):
    return p[len(r):] if p.startswith(r + "/") else p
def st(s):
    return [stat.S_IFMT(s.st_mode), oct(stat.S_IMODE(s.st_mode)), s.st_size, s.st_nlink, s.st_dev == dev]
def fd_link(fd):
    return rel(os.readlink(f"/proc/self/fd/{fd}"))
os.umask(0o022)
opens = [
    ("mk", os.O_CREAT | os.O_WRONLY),
    ("mk", os.O_CREAT | os.O_WRONLY | os.O_TRUNC),
    ("mk", os.O_CREAT | os.O_EXCL | os.O_WRONLY),
    ("mk", os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW),
    ("mkdeep", os.O_CREAT | os.O_RDWR),
    ("mknodir", os.O_CREAT | os.O_WRONLY),
]
for i, (name, flags) in enumerate(opens):
    def made():
        fd = os.open(f"{r}/{name}", flags, 0o640)
        os.write(fd, b"made")
        got = [fd_link(fd), st(os.fstat(fd))]
        os.close(fd)
        return got
    out[f"creat {i} {name}"] = e(made)
out["made"] = [e(lambda: st(os.stat(f"{r}/{p}"))) for p in ["a/new1", "a/b/c/new2", "mk", "mkdeep"]]
def unnamed(d, how):
    fd = os.open(f"{r}/{d}", os.O_TMPFILE | os.O_RDWR, 0o604)
    os.write(fd, b"unnamed")
    s = os.fstat(fd)
    got = [st(s), fd_link(fd).split("#")[0], fd_link(fd).endswith(" (deleted)")]
    # link(2) of the /proc link itself, then linkat(AT_SYMLINK_FOLLOW) of
    # what it leads to.
    got.append(e(lambda: os.link(f"/proc/self/fd/{fd}", f"{r}/{d}/t1")))
    n = libc.linkat(-100, f"/proc/self/fd/{fd}".encode(), -100, f"{r}/{d}/t1".encode(), 0x400)
    got.append(n if n == 0 else errno.errorcode[ctypes.get_errno()])
    # linkat(fd, "", AT_FDCWD, name, AT_EMPTY_PATH)
    n = libc.linkat(fd, b"", -100, f"{r}/a/t2".encode(), 0x1000)
    got.append(n if n == 0 else errno.errorcode[ctypes.get_errno()])
    n = libc.linkat(-100, f"/proc/self/fd/{fd}".encode(), -100, f"{r}/a/t2".encode(), 0x400)
    got.append(n if n == 0 else errno.errorcode[ctypes.get_errno()])
    for name in [f"{d}/t1", "a/t2"]:
        got.append(e(lambda: [st(os.stat(f"{r}/{name}")), os.stat(f"{r}/{name}").st_ino == s.st_ino]))
        got.append(e(lambda: open(f"{r}/{name}").read()))
    got.append(st(os.fstat(fd)))
    os.close(fd)
    for name in [f"{d}/t1", "a/t2"]:
        e(lambda: os.unlink(f"{r}/{name}"))
    return got
out["tmpfile"] = e(lambda: unnamed("a/b", os.O_RDWR))
out["tmpfile_through_link"] = e(lambda: unnamed("lnkdir", os.O_RDWR))
out["tmpfile_rdonly"] = e(lambda: os.open(f"{r}/a", os.O_TMPFILE | os.O_RDONLY, 0o600))
out["tmpfile_missing"] = e(lambda: os.open(f"{r}/a/nope", os.O_TMPFILE | os.O_RDWR, 0o600))
out["tmpfile_in_file"] = e(lambda: os.open(f"{r}/a/b/c/d/e/f", os.O_TMPFILE | os.O_RDWR, 0o600))
# fchdir to a directory's descriptor, and what is seen from there.
for how in (os.O_PATH, os.O_RDONLY):
    fd = os.open(f"{r}/a/b", how | os.O_DIRECTORY)
    os.fchdir(fd)
    got = [rel(os.getcwd()), rel(os.readlink("/proc/self/cwd")), sorted(os.listdir("."))]
    got.append(st(os.stat("c/d/e/f")))
    got.append(open("c/d/e/f").read())
    # Renamed while it is the current directory: getcwd follows it.
    os.rename(f"{r}/a/b", f"{r}/a/B")
    got.append(rel(os.getcwd()))
    got.append(sorted(os.listdir(".")))
    os.rename(f"{r}/a/B", f"{r}/a/b")
    got.append(rel(os.getcwd()))
    os.chdir("/")
    os.close(fd)
    out[f"fchdir {how}"] = got
os.mkdir(f"{r}/a/gone")
fd = os.open(f"{r}/a/gone", os.O_PATH | os.O_DIRECTORY)
os.fchdir(fd)
os.rmdir(f"{r}/a/gone")
out["fchdir_removed"] = [e(os.getcwd), e(lambda: os.listdir(".")), e(lambda: os.open("x", os.O_CREAT | os.O_WRONLY))]
os.chdir("/")
os.close(fd)
# chmod through the /proc link of an O_PATH descriptor (mkfifo -m), and
# of a descriptor opened for reading.
os.mkfifo(f"{r}/a/fifo", 0o644)
fd = os.open(f"{r}/a/fifo", os.O_PATH | os.O_NOFOLLOW)
os.chmod(f"/proc/self/fd/{fd}", 0o600)
out["fifo"] = st(os.fstat(fd))
os.close(fd)
fd = os.open(f"{r}/a/b/c/d/e/f", os.O_RDONLY)
os.chmod(f"/proc/self/fd/{fd}", 0o640)
out["file"] = [st(os.fstat(fd)), st(os.stat(f"{r}/a/b/c/d/e/f"))]
os.chmod(f"/proc/self/fd/{fd}", 0o644)
os.close(fd)
fd = os.open(f"{r}/lnk", os.O_PATH | os.O_NOFOLLOW)
# fchmodat(AT_FDCWD, link, mode, AT_SYMLINK_NOFOLLOW) of the link itself.
n = libc.fchmodat(-100, f"/proc/self/fd/{fd}".encode(), 0o600, 0x100)
out["link"] = n if n == 0 else errno.errorcode[ctypes.get_errno()]
os.close(fd)
out["fifo_after"] = st(os.stat(f"{r}/a/fifo"))
for p in ["a/fifo", "a/new1", "a/b/c/new2"]:
    os.unlink(f"{r}/{p}")
print(json.dumps(out))
"""

# `..` from a directory entered by fchdir of its descriptor.
UP_FROM_FCHDIR = SCRIPT_START + r"""
r = sys.argv[1]
fd = os.open(f"{r}/a/b/c", os.O_PATH | os.O_DIRECTORY)
os.fchdir(fd)
out["up"] = [os.stat("..").st_ino == os.stat(f"{r}/a/b").st_ino, sorted(os.listdir("../.."))]
out["up_file"] = open("../c/d/e/f").read()
os.chdir("d")
out["cwd"] = os.getcwd()[len(r):]
print(json.dumps(out))
"""


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_unnamed_files_links_created_through_fchdir_and_proc_chmod_beneath_the_map_are_the_kernels(
    shortfuse, tree, transport
):
    src = tree / "src"
    (src / "lnk").symlink_to("a/b/c/d/e/f")
    (src / "lnkdir").symlink_to("a/b")
    (src / "mk").symlink_to("a/new1")
    (src / "mkdeep").symlink_to("lnkdir/c/new2")
    (src / "mknodir").symlink_to("a/nope/x")
    native = subprocess.run([sys.executable, "-c", MADE, str(src)], capture_output=True, timeout=60)
    assert native.returncode == 0, native.stderr.decode()
    native_up = subprocess.run([sys.executable, "-c", UP_FROM_FCHDIR, str(src)], capture_output=True, timeout=60)
    assert native_up.returncode == 0, native_up.stderr.decode()
    want = json.loads(native.stdout.decode())
    # (The script removed what it made.)
    assert not (src / "a" / "new1").exists() and want["creat 0 mk"][0] == "/a/new1"
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    log = tree / "strace.log"
    try:
        p = run_traced(shortfuse, spec, MADE, mp, log if not daemon else None)
        if daemon:
            # The file system heard of none of it: no name looked up (the
            # walk's way to a directory, a link's target, a descriptor's
            # place), made, linked or changed.
            ops = ["LOOKUP", "READLINK", "CREATE", "OPEN", "MKNOD", "LINK", "SETATTR"]
            assert {op: daemon.count(op) for op in ops} == dict.fromkeys(ops, 0)
        up = subprocess.run(
            [str(shortfuse), "run", *spec, "--", sys.executable, "-c", UP_FROM_FCHDIR, str(mp)],
            capture_output=True,
            timeout=120,
        )
        assert up.returncode == 0, up.stderr.decode()[-3000:]
    finally:
        if daemon:
            daemon.stop()
    got = json.loads(p.stdout.decode().splitlines()[-1])
    assert got == want
    assert json.loads(up.stdout.decode().splitlines()[-1]) == json.loads(native_up.stdout.decode())
    if not daemon:
        # The in-process file system looked up no name on the way (the
        # program's own O_PATH opens of b, gone, fifo and lnk look alike).
        names = ["a", "c", "mk", "mkdeep", "new1", "new2", "lnkdir", "t1", "t2"]
        lookups = [l for l in passthrough_lookups(log) if any(f'"{d}"' in l for d in names)]
        assert lookups == [], lookups



def test_a_process_started_in_a_directory_beneath_the_map_asks_the_daemon_nothing(shortfuse, tree):
    """Beneath the map nothing of a build's images' start (make's shells,
    gcc, cc1, as, ld) reaches the daemon: each image sets the mount up
    from what `run` was told, without connecting (no INIT, no root
    GETATTR), takes up the directory it was started in from the kernel's
    current directory, which exec kept (no LOOKUP, ACCESS or FORGET), and
    a shell's `cd` and getcwd are the kernel's. Counted with the daemon's
    request counts over a shell that enters a directory and starts
    programs there that read a file by a relative path and print where
    they are."""
    mp, spec, daemon = mounted(shortfuse, tree, "ring", [])
    (tree / "src" / DEEP / "g").mkdir()
    (tree / "src" / DEEP / "g" / "h").write_text("there\n")
    script = f"cd {mp}/{DEEP} && cat f && /bin/pwd && cd g && cat h && sh -c 'cat ../f; pwd; exec /bin/pwd'"
    try:
        before = {o["name"]: o["count"] for o in daemon.stats()["ops"]}
        r = subprocess.run([str(shortfuse), "run", *spec, "--", "sh", "-c", script], capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        here = f"{mp}/{DEEP}"
        assert r.stdout.decode().splitlines() == ["deep", here, "there", "deep", f"{here}/g", f"{here}/g"]
        asked = {o["name"]: o["count"] - before.get(o["name"], 0) for o in daemon.stats()["ops"]}
        asked = {op: n for op, n in asked.items() if n}
    finally:
        daemon.stop()
    assert asked == {}, asked


# Relative paths from a current directory entered beneath the map, then
# the directory renamed and another made in its place by the program:
# where each path leads (the file's text or the errno) and getcwd.
FROM_CWD = SCRIPT_START + r"""
mp = sys.argv[1]
os.chdir(f"{mp}/a/b")
for _ in range(20):
    text = open("c/d/e/f").read()
out["first"] = [text, os.getcwd()[len(mp):]]
os.rename(f"{mp}/a/b", f"{mp}/a/B")
os.makedirs(f"{mp}/a/b/c/d/e")
with open(f"{mp}/a/b/c/d/e/f", "w") as f:
    f.write("new\n")
out["moved"] = [open("c/d/e/f").read(), os.getcwd()[len(mp):]]
os.chdir(f"{mp}/a/b")
out["again"] = [open("c/d/e/f").read(), os.getcwd()[len(mp):]]
os.chdir("c")
out["down"] = [e(lambda: open("d/e/f").read()), e(lambda: open("../c/d/e/f").read()), os.getcwd()[len(mp):]]
out["not_a_dir"] = e(lambda: os.chdir("d/e/f"))
out["missing"] = e(lambda: os.chdir("nope"))
os.chdir("/")
print(json.dumps(out))
"""


@pytest.mark.parametrize("transport", ["preload", "ring"])
def test_relative_paths_follow_a_current_directory_entered_beneath_the_map(shortfuse, tree, transport):
    """A current directory entered by chdir beneath the map is the
    kernel's, entered without a lookup: paths relative to it start there
    and find their directory once (a file read 20 times by `c/d/e/f`), and
    when the program moves it, they follow it as they would natively (the
    directories kept for them are dropped)."""
    native = subprocess.run(
        [sys.executable, "-c", FROM_CWD, str(tree / "src")], capture_output=True, timeout=60
    )
    assert native.returncode == 0, native.stderr.decode()
    want = json.loads(native.stdout)
    subprocess.run(["rm", "-rf", str(tree / "src" / "a" / "b")], check=True)
    subprocess.run(["mv", str(tree / "src" / "a" / "B"), str(tree / "src" / "a" / "b")], check=True)
    mp, spec, daemon = mounted(shortfuse, tree, transport, [])
    log = tree / "strace.log"
    trace = ["strace", "-f", "-qq", "-e", "trace=openat2", "-o", str(log)]
    try:
        p = subprocess.run(
            [*trace, str(shortfuse), "run", *spec, "--", sys.executable, "-c", FROM_CWD, str(mp)],
            capture_output=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        assert json.loads(p.stdout.decode().splitlines()[-1]) == want
        assert want["moved"] == ["deep\n", "/a/B"]
        # No name was looked up by the file system for the chdirs.
        if daemon:
            assert [daemon.count("LOOKUP"), daemon.count("ACCESS")] == [0, 0]
        else:
            assert passthrough_lookups(log) == []
        # The directory of c/d/e/f, once per current directory.
        dirs = [l for l in log.read_text().splitlines() if "O_DIRECTORY" in l and 'c/d/e"' in l]
        assert len(dirs) <= 5, dirs
    finally:
        if daemon:
            daemon.stop()
