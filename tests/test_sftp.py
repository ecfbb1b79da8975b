"""The `sftp` file system against a real OpenSSH server on loopback
(tests/sshd.py, one server for the session), beyond the behaviour suites
that `SHORTFUSE_FS=sftp` runs over the kernel transports:

- real programs under `shortfuse run` with sftp served in process (cat, cp,
  python3, a shell pipeline, a forking program), with the user-space cache
  on and off, each compared with the same program on the served directory;
- cache correctness in process and in the daemon: write then read,
  truncate, a change made on the server side seen after reopen;
- directory listings kept by the kernel as long as it trusts names: a
  second listing right after the first sends no READDIR; with
  `entry_timeout=1` a name made behind the mount shows after a second, one
  made through it at once; with the mount's defaults (sshfs's 20 s) a
  second `ls -lR` more than a second after the first needs nothing of the
  server (it works while the server is stopped);
- close-to-open under those defaults: a file grown on the server since the
  kernel last saw it shows its new size and contents at the next open;
- a dropped connection (the session's sshd process killed): with
  `-o reconnect` later calls work, open files included; without it they
  fail with ENOTCONN; nothing hangs;
- the command line's errors (unreachable host, bad key, missing path).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sfmount
import sshd

CACHE_MODES = ("cache=on", "cache=off")


@pytest.fixture(scope="module")
def server() -> sshd.Sshd:
    try:
        return sfmount.sshd_server()
    except sfmount.HarnessError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def shortfuse() -> Path:
    try:
        bin_ = sfmount.shortfuse_bin()
    except sfmount.HarnessError as e:
        pytest.fail(str(e), pytrace=False)
    assert (bin_.parent / "libshortfuse_preload_sftp.so").is_file(), "the preload shim with sftp is not built: make build"
    return bin_


@pytest.fixture
def scratch():
    d = sfmount.new_scratch("sftp")
    d.chmod(0o755)
    (d / "remote").mkdir()
    yield d
    for leaked in [p for p in sfmount.leaked_mounts() if p.startswith(str(d))]:
        sfmount.run(["umount", "-l", leaked])
    sfmount.remove_scratch(d)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)


def under(shortfuse: Path, server: sshd.Sshd, remote: Path, mp: str, argv: list, options=(), **kw):
    """`argv` under `shortfuse run` with `remote` served over sftp at `mp`."""
    opts = ",".join(server.options() + list(options))
    return run([shortfuse, "run", "-m", f"{mp}=sftp:{server.target(remote)}", "-o", opts, "--", *argv], **kw)


def text(p: subprocess.CompletedProcess, root: str) -> str:
    out = p.stdout + p.stderr
    # run's own notes (page zero, the cache line) are not the program's output.
    out = "".join(l for l in out.splitlines(True) if not l.startswith("shortfuse run:"))
    return out.replace(root, "ROOT")


def tree(root: Path) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            st = p.lstat()
            entry = {"mode": oct(st.st_mode)}
            if p.is_file() and not p.is_symlink():
                entry["sha"] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            out[str(p.relative_to(root))] = entry
    return out


# ------------------------------------------------------------ programs in process

# Descriptors of an in-process sftp mount belong to one process image (like
# `mem`'s): an exec'd program does not inherit them, so programs open their
# files themselves (tee, sort -o, cp) and only builtins redirect onto the
# mount; pipes are the kernel's and work as usual.
PIPELINE = r"""
set -e
R=$1
mkdir -p "$R/a/b"
seq 1 60000 | tee "$R/a/rand" > /dev/null
printf '%s\n' 3 1 2 | sort -o "$R/a/sorted"
cat "$R/a/sorted" | tr 0-9 a-j | tee "$R/a/b/letters" > /dev/null
cp "$R/a/rand" "$R/a/b/rand2"
cmp "$R/a/rand" "$R/a/b/rand2" && echo same
cat "$R/a/b/letters"
ln -s ../sorted "$R/a/b/lnk"
cat "$R/a/b/lnk"
mv "$R/a/b/letters" "$R/a/moved"
ls "$R/a" "$R/a/b" | sed "s|$R|ROOT|"
wc -c "$R/a/rand" | sed "s|$R|ROOT|"
( cd "$R/a" && pwd | sed "s|$R|ROOT|" && ls )
echo appended >> "$R/a/moved"
while read l; do echo "L:$l"; done < "$R/a/moved"
tail -n 2 "$R/a/moved"
find "$R" | sort | sed "s|$R|ROOT|"
rm -r "$R/a/b"
ls "$R/a"
"""

FORKING = r"""
import os, sys
r = sys.argv[1]
with open(r + "/shared", "w") as f:
    f.write("from the parent\n")
fd = os.open(r + "/shared", os.O_RDONLY)
print("parent", os.read(fd, 5))
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        # The inherited descriptor, a new file, then a grandchild.
        print("child", i, os.pread(fd, 9, 5), flush=True)
        with open(f"{r}/child{i}", "w") as f:
            f.write(f"child {i}\n")
        g = os.fork()
        if g == 0:
            print("grandchild", i, open(f"{r}/child{i}").read().strip(), flush=True)
            os._exit(0)
        os._exit(os.waitpid(g, 0)[1])
    os.waitpid(pid, 0)
    print("parent after child", i, os.pread(fd, 4, 0), flush=True)
print("parent end", sorted(os.listdir(r)), os.read(fd, 100))
r2 = os.fork()
if r2 == 0:
    os.execvp("cat", ["cat", r + "/child1"])
os.waitpid(r2, 0)
"""

# Test set-up of the same shape as the PY of tests/test_run.py: kept apart so
# each test reads on its own.
PY = r"""
import os, sys
root = sys.argv[1]
os.makedirs(root + "/d/e", exist_ok=True)
with open(root + "/d/f.txt", "w") as f:
    f.write("hello\n" * 3)
with open(root + "/d/f.txt", "a") as f:
    f.write("more\n")
print(open(root + "/d/f.txt").read(), end="")
os.rename(root + "/d/f.txt", root + "/d/g.txt")
os.symlink("g.txt", root + "/d/lnk")
print(sorted(os.listdir(root + "/d")), os.readlink(root + "/d/lnk"))
with open(root + "/d/big", "wb") as f:
    for i in range(300):
        f.write(bytes([i % 251]) * 4099)
print(os.path.getsize(root + "/d/big"), sum(open(root + "/d/big", "rb").read()) % 1000003)
fd = os.open(root + "/d/g.txt", os.O_RDWR)
os.lseek(fd, 6, 0)
print(os.read(fd, 6), os.pread(fd, 3, 1))
os.ftruncate(fd, 4)
os.close(fd)
print(open(root + "/d/g.txt").read())
os.unlink(root + "/d/g.txt")
os.rmdir(root + "/d/e")
print(sorted(os.listdir(root + "/d")))
for bad in (lambda: os.rmdir(root + "/nonexist"), lambda: os.mkdir(root + "/d"), lambda: open(root + "/d/x/y")):
    try:
        bad()
    except OSError as e:
        print("err", e.errno)
"""


@pytest.mark.parametrize("cache", CACHE_MODES)
@pytest.mark.parametrize(
    "name,argv",
    [
        ("pipeline", ["bash", "-c", PIPELINE, "sh"]),
        ("forking", [sys.executable, "-c", FORKING]),
        ("python", [sys.executable, "-c", PY]),
    ],
)
def test_programs_in_process_match_the_served_directory(shortfuse, server, scratch, name, argv, cache):
    """The program's output and the tree it leaves are those of the same
    program run on the served directory itself."""
    native = scratch / "native"
    native.mkdir()
    n = run(argv + [native])
    assert n.returncode == 0, n.stderr
    mp = str(scratch / "mnt")
    s = under(shortfuse, server, scratch / "remote", mp, argv + [mp], [cache])
    assert s.returncode == 0, text(s, mp)
    assert text(s, mp) == text(n, str(native))
    assert not Path(mp).exists(), "the mount point must not appear on disk"
    assert tree(scratch / "remote") == tree(native)


def test_cat_and_cp_in_process(shortfuse, server, scratch):
    remote = scratch / "remote"
    data = os.urandom(3 << 20)
    (remote / "big").write_bytes(data)
    mp = str(scratch / "mnt")
    s = under(shortfuse, server, remote, mp, ["sh", "-c", f"cat {mp}/big | sha256sum; cp {mp}/big {mp}/copy"])
    assert s.returncode == 0, text(s, mp)
    assert s.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert (remote / "copy").read_bytes() == data


# ------------------------------------------------------------ cache correctness

CACHE_PY = r"""
import os, sys
r = sys.argv[1]
p = r + "/f"
with open(p, "wb") as f:
    f.write(b"A" * 100000)
print(open(p, "rb").read() == b"A" * 100000)          # write, then read through the cache
with open(p, "r+b") as f:
    f.seek(4096 * 3 + 5)
    f.write(b"B" * 10)                               # overwrite inside a cached page
print(open(p, "rb").read(4096 * 4)[-4096 + 5:-4096 + 15])
os.truncate(p, 5000)                                 # shrink: no stale page past the end
with open(p, "rb") as f:
    print(len(f.read()), os.path.getsize(p))
os.truncate(p, 9000)                                 # grow: zeros, not old bytes
with open(p, "rb") as f:
    print(f.read()[5000:] == b"\0" * 4000)
sys.stdout.flush()
input()                                              # the test changes the file on the server
with open(p, "rb") as f:
    print(f.read())                                  # close-to-open: the new contents
print(os.stat(p).st_size)
"""


@pytest.mark.parametrize("where", ["in-process", "daemon"])
def test_cache_write_read_truncate_and_server_side_change(shortfuse, server, scratch, where):
    remote = scratch / "remote"
    script = scratch / "c.py"
    script.write_text(CACHE_PY)
    if where == "in-process":
        mp = str(scratch / "mnt")
        opts = ",".join(server.options() + ["cache=on"])
        cmd = [shortfuse, "run", "-m", f"{mp}=sftp:{server.target(remote)}", "-o", opts, "--"]
    else:
        mnt = scratch / "mnt"
        mnt.mkdir()
        opts = ",".join(server.options() + ["cache=on"])
        r = run([shortfuse, "mount", "sftp", server.target(remote), mnt, "-o", opts])
        assert r.returncode == 0, r.stderr
        mp, cmd = str(mnt), []
    try:
        p = subprocess.Popen(
            [str(c) for c in cmd + [sys.executable, script, mp]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = [p.stdout.readline() for _ in range(4)]
        assert lines == ["True\n", "b'BBBBBBBBBB'\n", "5000 5000\n", "True\n"], (lines, p.stderr.read() if p.poll() else "")
        # Behind the cache's back, with a different size and mtime.
        (remote / "f").write_bytes(b"changed on the server")
        os.utime(remote / "f", (1_000_000, 1_000_000))
        out, err = p.communicate("\n", timeout=60)
        assert p.returncode == 0, err
        assert out.splitlines() == ["b'changed on the server'", "21"], err
    finally:
        if where == "daemon":
            assert run([shortfuse, "umount", scratch / "mnt"]).returncode == 0


def requests(shortfuse: Path, mp: Path) -> dict:
    """Requests of each kind the daemon serving `mp` got so far."""
    p = run([shortfuse, "stats", "--json", mp])
    assert p.returncode == 0, p.stderr
    return {o["name"]: o["count"] for o in json.loads(p.stdout)["ops"]}


def listings(shortfuse: Path, mp: Path) -> int:
    """READDIR and READDIRPLUS requests the daemon serving `mp` got so far."""
    r = requests(shortfuse, mp)
    return r.get("READDIR", 0) + r.get("READDIRPLUS", 0)


def mount_sftp(shortfuse: Path, server: sshd.Sshd, remote: Path, mnt: Path, options=()) -> None:
    mnt.mkdir()
    r = run([shortfuse, "mount", "sftp", server.target(remote), mnt, "-o", ",".join(server.options() + list(options))])
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("cache", CACHE_MODES)
def test_a_listing_is_reused_by_the_kernel_as_long_as_names(shortfuse, server, scratch, cache):
    remote = scratch / "remote"
    (remote / "d").mkdir()
    names = sorted(f"f{i:03}" for i in range(250))
    for n in names:
        (remote / "d" / n).write_bytes(b"")
    mnt = scratch / "mnt"
    # Names trusted for a second (the mount's default is longer).
    mount_sftp(shortfuse, server, remote, mnt, [cache, "entry_timeout=1", "attr_timeout=1"])
    d = mnt / "d"
    try:
        # A second listing right after the first comes from the kernel's
        # cache. (Tried again if this busy machine took most of the second
        # between the two, when the daemon rightly lists afresh.)
        for _ in range(5):
            started = time.monotonic()
            assert sorted(os.listdir(d)) == names
            first = listings(shortfuse, mnt)
            assert sorted(os.listdir(d)) == names
            second = listings(shortfuse, mnt)
            if time.monotonic() - started < 0.8:
                break
        else:
            pytest.fail("no two listings within 0.8 s on this machine")
        assert first > 0
        assert second == first, (first, second)
        # A name made behind the mount shows once the listing is a second old.
        (remote / "d" / "behind").write_bytes(b"")
        time.sleep(1.2)
        assert "behind" in os.listdir(d)
        # Through the mount, at once.
        (d / "through").write_bytes(b"")
        assert "through" in os.listdir(d)
        os.unlink(d / "f000")
        assert sorted(os.listdir(d)) == sorted(names[1:] + ["behind", "through"])
    finally:
        assert run([shortfuse, "umount", mnt]).returncode == 0


@pytest.mark.parametrize("cache", CACHE_MODES)
def test_a_second_walk_a_while_later_is_answered_by_the_kernel(shortfuse, server, scratch, cache):
    remote = scratch / "remote"
    for d in range(3):
        (remote / "tree" / f"d{d}").mkdir(parents=True)
        for f in range(40):
            (remote / "tree" / f"d{d}" / f"f{f:02}").write_bytes(b"x" * f)
    mnt = scratch / "mnt"
    # A request the server does not answer fails within 2 s (EIO).
    mount_sftp(shortfuse, server, remote, mnt, [cache, "timeout=2"])
    stopped = []
    try:
        walk = ["ls", "-lR", mnt / "tree"]
        first = run(walk)
        assert first.returncode == 0, first.stderr
        # Past a second: what a slow first walk, or a user, leaves between two.
        time.sleep(1.5)
        # The server answers nothing now: the walk must not need it.
        stopped = server.sessions()
        assert stopped, "no sshd session serves the mount"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        second = run(walk)
        assert second.returncode == 0, second.stderr
        assert second.stdout == first.stdout
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        assert run([shortfuse, "umount", "-l", mnt]).returncode == 0


@pytest.mark.parametrize("cache", CACHE_MODES)
def test_a_file_grown_on_the_server_shows_whole_at_the_next_open(shortfuse, server, scratch, cache):
    remote = scratch / "remote"
    (remote / "f").write_bytes(b"first")
    mnt = scratch / "mnt"
    mount_sftp(shortfuse, server, remote, mnt, [cache])
    try:
        assert (mnt / "f").read_bytes() == b"first"
        assert os.stat(mnt / "f").st_size == 5
        # Another client makes it longer, with another mtime, while the
        # kernel still trusts the size it has.
        grown = b"grown on the server, longer than before"
        (remote / "f").write_bytes(grown)
        os.utime(remote / "f", (1_000_000, 1_000_000))
        assert (mnt / "f").read_bytes() == grown
        assert os.stat(mnt / "f").st_size == len(grown)
    finally:
        assert run([shortfuse, "umount", mnt]).returncode == 0


def aes_in_hardware() -> bool:
    """Whether this processor has AES and carry-less multiply instructions."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            flags |= set(line.split(":", 1)[1].split())
    return {"aes", "pclmulqdq"} <= flags or {"aes", "pmull"} <= flags


def test_the_session_uses_the_cipher_the_processor_does_fast(shortfuse, server, scratch):
    (scratch / "remote" / "f").write_bytes(b"data")
    mnt = scratch / "mnt"
    mount_sftp(shortfuse, server, scratch / "remote", mnt)
    try:
        assert (mnt / "f").read_bytes() == b"data"
        log = run([shortfuse, "logs", mnt])
        assert log.returncode == 0, log.stderr
        # The server offers OpenSSH's defaults, ChaCha20-Poly1305 first.
        want = "aes128-gcm@openssh.com" if aes_in_hardware() else "chacha20-poly1305@openssh.com"
        assert f"cipher {want}" in log.stdout, log.stdout
    finally:
        assert run([shortfuse, "umount", mnt]).returncode == 0


# ------------------------------------------------------------ connection loss

def test_reconnect_after_the_session_is_killed_daemon(shortfuse, server, scratch):
    remote = scratch / "remote"
    data = bytes(range(256)) * 4096  # 1 MiB: the reads after the loss are past what the kernel read ahead
    for reconnect in (True, False):
        (remote / "f").write_bytes(data)
        mnt = scratch / ("mr" if reconnect else "mn")
        mnt.mkdir()
        opts = server.options() + ["cache=off"] + (["reconnect"] if reconnect else [])
        r = run([shortfuse, "mount", "sftp", server.target(remote), mnt, "-o", ",".join(opts)])
        assert r.returncode == 0, r.stderr
        try:
            fd = os.open(mnt / "f", os.O_RDWR)
            assert os.pread(fd, 4, 0) == data[:4]
            before = set(server.sessions())
            assert before, "no sshd session serves the mount"
            server.kill_sessions()
            assert sfmount.wait_until(lambda: not (set(server.sessions()) & before), 10)
            if reconnect:
                # The open file is opened again on the new session.
                assert os.pread(fd, 4, 900_000) == data[900_000:900_004]
                os.pwrite(fd, b"ab", 1000)
                os.fsync(fd)
                assert (remote / "f").read_bytes()[998:1004] == data[998:1000] + b"ab" + data[1002:1004]
                assert sorted(os.listdir(mnt)) == ["f"]
                (mnt / "new").write_text("after\n")
                assert (remote / "new").read_text() == "after\n"
                (remote / "new").unlink()
            else:
                for call in (lambda: os.pread(fd, 4, 900_000), lambda: os.listdir(mnt), lambda: os.stat(mnt / "g")):
                    with pytest.raises(OSError) as e:
                        call()
                    assert e.value.errno == 107, e.value  # ENOTCONN
            os.close(fd)
            # The daemon's log says what happened, with a timestamp.
            log = run([shortfuse, "logs", mnt]).stdout
            lost = [l for l in log.splitlines() if "connection to root@127.0.0.1" in l and " lost" in l]
            assert lost and lost[0][:2] == "20", log
            if reconnect:
                assert "reconnected to root@127.0.0.1" in log, log
            else:
                assert "without -o reconnect every call now fails with ENOTCONN" in log, log
        finally:
            assert run([shortfuse, "umount", mnt]).returncode == 0


def test_a_stopped_server_fails_calls_with_eio_within_the_timeout(shortfuse, server, scratch):
    """A server that is stopped (SIGSTOP), not dead, keeps its connection
    open but answers nothing: a call fails with EIO once `timeout=` passes
    without a reply, rather than waiting for ever."""
    remote = scratch / "remote"
    (remote / "f").write_bytes(b"x" * 100_000)
    (remote / "g").write_bytes(b"y")
    mnt = scratch / "mt"
    mnt.mkdir()
    opts = server.options() + ["cache=off", "timeout=1"]
    r = run([shortfuse, "mount", "sftp", server.target(remote), mnt, "-o", ",".join(opts)])
    assert r.returncode == 0, r.stderr
    stopped = []
    try:
        fd = os.open(mnt / "f", os.O_RDONLY)
        assert os.pread(fd, 4, 0) == b"xxxx"
        stopped = server.sessions()
        assert stopped, "no sshd session serves the mount"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            # A name the kernel has not looked up yet: one LOOKUP, in
            # flight when the timeout passes. (A read is retried by the
            # kernel after its read-ahead failed, and that retry, a later
            # call, finds the session given up: ENOTCONN.)
            os.stat(mnt / "g")
        waited = time.monotonic() - t0
        assert e.value.errno == errno.EIO, (e.value, waited)
        # Not before the timeout (the server is alive and connected), and
        # before the default timeout (10 s) would have passed: it is the
        # option's.
        assert 1 <= waited < 10, waited
        # Without `reconnect`, later calls fail at once.
        with pytest.raises(OSError) as e:
            os.pread(fd, 4, 90_000)
        assert e.value.errno == errno.ENOTCONN, e.value
        os.close(fd)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        assert run([shortfuse, "umount", "-l", mnt]).returncode == 0


LOSS_PY = r"""
import os, sys
r = sys.argv[1]
fd = os.open(r + "/f", os.O_RDONLY)
print(os.pread(fd, 4, 0), flush=True)
input()                                              # the test kills the session here
for what, call in (("pread", lambda: os.pread(fd, 4, 6)), ("list", lambda: sorted(os.listdir(r))),
                   ("create", lambda: open(r + "/g", "w").write("x"))):
    try:
        print(what, call(), flush=True)
    except OSError as e:
        print(what, "errno", e.errno, flush=True)
"""


@pytest.mark.parametrize("reconnect", [True, False])
def test_reconnect_after_the_session_is_killed_in_process(shortfuse, server, scratch, reconnect):
    remote = scratch / "remote"
    (remote / "f").write_bytes(b"0123456789")
    script = scratch / "loss.py"
    script.write_text(LOSS_PY)
    mp = str(scratch / "mnt")
    opts = ",".join(server.options() + ["cache=off"] + (["reconnect"] if reconnect else []))
    before = set(server.sessions())
    p = subprocess.Popen(
        [str(shortfuse), "run", "-m", f"{mp}=sftp:{server.target(remote)}", "-o", opts, "--", sys.executable, str(script), mp],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline() == "b'0123'\n", p.stderr.read() if p.poll() is not None else ""
        mine = set(server.sessions()) - before
        assert mine, "no sshd session serves the program"
        server.kill_sessions()
        assert sfmount.wait_until(lambda: not (set(server.sessions()) & mine), 10)
        out, err = p.communicate("\n", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    if reconnect:
        assert out.splitlines() == ["pread b'6789'", "list ['f']", "create 1"], err
        assert (remote / "g").read_text() == "x"
    else:
        assert out.splitlines() == ["pread errno 107", "list errno 107", "create errno 107"], err
        assert not (remote / "g").exists()


# ------------------------------------------------------------ command line

def test_mount_errors_are_clear(shortfuse, server, scratch):
    mnt = scratch / "mnt"
    mnt.mkdir()
    remote = scratch / "remote"
    opts = server.options()
    bad_key = scratch / "other_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", bad_key])
    cases = [
        # Nothing listens on port 1.
        (server.target(remote), [o for o in opts if not o.startswith("port=")] + ["port=1", "ConnectTimeout=5"], "cannot connect"),
        ("root@name.invalid:/x", opts, "cannot connect"),
        (server.target(remote), [o for o in opts if not o.startswith("identity=")] + [f"identity={bad_key}"], "authentication failed"),
        (server.target(remote), [o for o in opts if not o.startswith("identity=")] + [f"identity={scratch}/nokey"], "authentication failed"),
        (f"root@127.0.0.1:{scratch}/missing", opts, "no such file or directory"),
        ("nocolon", opts, "is not [user@]host:[path]"),
    ]
    (remote / "file").write_text("x")
    cases.append((f"root@127.0.0.1:{remote}/file", opts, "is not a directory"))
    for target, o, says in cases:
        r = run([shortfuse, "mount", "sftp", target, mnt, "-o", ",".join(o)])
        assert r.returncode != 0 and says in r.stderr, (target, r.stderr)
        assert not sfmount.is_mounted(mnt)
        # The same mistakes stop `run` before the program starts.
        marker = scratch / "ran"
        r = run([shortfuse, "run", "-m", f"{scratch}/m=sftp:{target}", "-o", ",".join(o), "--", "touch", marker])
        assert r.returncode == 2 and says in r.stderr, (target, r.stderr)
        assert not marker.exists()


def as_sshfs_user(home: Path, extra_env: dict | None = None) -> dict:
    """An environment whose HOME is `home` (its ~/.ssh is what ssh would
    read) and without an agent unless `extra_env` names one."""
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env["HOME"] = str(home)
    env.update(extra_env or {})
    return env


def mount_as(shortfuse: Path, target: str, mnt: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return sfmount.run([str(shortfuse), "mount", "sftp", target, str(mnt), *args], env=env, timeout=60)


def test_ssh_config_alias_tilde_and_new_host_key(shortfuse, server, scratch):
    """As sshfs does: `myhost:` names a Host of ~/.ssh/config (HostName,
    User, Port, IdentityFile with ~), the host key is learnt into
    ~/.ssh/known_hosts and that is said on stderr, once; `-p PORT` and
    `-o IdentityFile=~/...` work too."""
    home = scratch / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "test_key"
    key.write_bytes(server.key.read_bytes())
    key.chmod(0o600)
    (home / ".ssh" / "config").write_text(
        f"Host myhost\n    HostName 127.0.0.1\n    User root\n    Port {server.port}\n    IdentityFile ~/.ssh/test_key\n"
    )
    (scratch / "remote" / "f").write_text("via the alias\n")
    mnt = scratch / "mnt"
    mnt.mkdir()
    env = as_sshfs_user(home)
    r = mount_as(shortfuse, f"myhost:{scratch / 'remote'}", mnt, env)
    assert r.returncode == 0, r.stderr
    try:
        assert (mnt / "f").read_text() == "via the alias\n"
        known = (home / ".ssh" / "known_hosts").read_text()
        assert f"[127.0.0.1]:{server.port}" in known, known
        assert "added the host key of 127.0.0.1" in r.stderr and "known_hosts" in r.stderr, r.stderr
    finally:
        assert sfmount.run([str(shortfuse), "umount", str(mnt)]).returncode == 0
    # Known now: nothing to say. sshfs's spellings, no config file.
    (home / ".ssh" / "config").unlink()
    r = mount_as(
        shortfuse, f"root@127.0.0.1:{scratch / 'remote'}", mnt, env, "-p", str(server.port), "-o", "IdentityFile=~/.ssh/test_key"
    )
    assert r.returncode == 0, r.stderr
    try:
        assert "added the host key" not in r.stderr, r.stderr
        assert (mnt / "f").read_text() == "via the alias\n"
    finally:
        assert sfmount.run([str(shortfuse), "umount", str(mnt)]).returncode == 0


def test_ssh_agent(shortfuse, server, scratch):
    """With no key file at all, the key an ssh-agent holds (SSH_AUTH_SOCK)
    logs in; without the agent the mount fails saying why."""
    home = scratch / "home"
    (home / ".ssh").mkdir(parents=True)
    (scratch / "remote" / "g").write_text("via the agent\n")
    mnt = scratch / "mnt"
    mnt.mkdir()
    opts = ["-o", f"port={server.port},UserKnownHostsFile={server.dir / 'known_hosts'}"]
    target = f"root@127.0.0.1:{scratch / 'remote'}"
    r = mount_as(shortfuse, target, mnt, as_sshfs_user(home), *opts)
    assert r.returncode != 0 and "SSH_AUTH_SOCK" in r.stderr, r.stderr
    sock = scratch / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert sfmount.wait_until(sock.exists, 10), "ssh-agent did not start"
        env = as_sshfs_user(home, {"SSH_AUTH_SOCK": str(sock)})
        r = sfmount.run(["ssh-add", str(server.key)], env=env, timeout=30)
        assert r.returncode == 0, r.stderr
        r = mount_as(shortfuse, target, mnt, env, *opts)
        assert r.returncode == 0, r.stderr
        try:
            assert (mnt / "g").read_text() == "via the agent\n"
        finally:
            assert sfmount.run([str(shortfuse), "umount", str(mnt)]).returncode == 0
    finally:
        agent.terminate()
        agent.wait(timeout=30)
