"""`shortfuse serve` and `shortfuse run -m MOUNTPOINT`: programs under the
preload shim share one daemon over shared-memory rings.

- Two programs see each other's changes at once, although their caches
  would keep stale names and attributes for 30 s (the daemon's
  notifications invalidate them).
- A kernel mount of the same daemon (`--transport dev`) sees the ring
  clients' writes, and they see the kernel's.
- kill -9 of the daemon while a program is blocked in a read: the read
  fails with ENOTCONN within a bounded time; so does every later call.
- kill -9 of a client in the middle of its requests: the daemon gives back
  its open handles and lookups and serves the others as before.
- Locks between programs (and the kernel mount): lockf, flock and OFD
  locks conflict across programs; a blocked locker gets the lock when the
  holder exits, closes, or is killed with -9.
- A child made by a raw clone(2) system call (no libc fork handlers) is
  known to the daemon as itself: the parent hears of its changes.
- The POSIX scenarios of test_posix, driven as in test_run, over the ring
  (mem, and passthrough with its namespace map).

The fuzzed client (garbage written into its own ring) is in
crates/shortfuse-ring/tests/ring.rs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sfmount
import test_posix
import test_run

TESTS = Path(__file__).resolve().parent


# The binary under test, with the shim beside it.
shortfuse = test_run.shortfuse


class Daemon:
    """`shortfuse serve` in the background, its stderr in a log file."""

    def __init__(self, shortfuse: Path, base: Path, args: list[str], mp: Path):
        self.mp = mp
        self.log = base / "serve.log"
        self.proc = subprocess.Popen(
            [str(shortfuse), "serve", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        deadline = time.monotonic() + 30
        while "shortfuse serve:" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"shortfuse serve did not start: {self.log.read_text()}", pytrace=False)
            time.sleep(0.02)

    def stats(self) -> dict:
        p = subprocess.run(
            [str(sfmount.shortfuse_bin()), "stats", "--json", str(self.mp)], capture_output=True, timeout=30
        )
        assert p.returncode == 0, p.stderr.decode()
        return json.loads(p.stdout)

    def count(self, opname: str) -> int:
        return sum(o["count"] for o in self.stats()["ops"] if o.get("name") == opname)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def scratch():
    d = sfmount.new_scratch("ring")
    d.chmod(0o755)
    yield d
    sfmount.remove_scratch(d)


def under(shortfuse: Path, mp: Path, argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(shortfuse), "run", "-m", str(mp), "--", *argv], capture_output=True, timeout=120, **kw
    )


# A program under the shim that runs commands read from stdin, one JSON
# line each, and answers each with one JSON line: the result or the errno.
AGENT = r"""
import errno, json, os, sys, time
fds = {}
for line in sys.stdin:
    cmd = json.loads(line)
    op, path = cmd[0], cmd[1]
    t0 = time.monotonic()
    try:
        if op == "stat":
            st = os.stat(path)
            out = {"size": st.st_size, "ino": st.st_ino}
        elif op == "read":
            with open(path, "rb") as f:
                out = f.read().decode()
        elif op == "write":
            with open(path, cmd[2]) as f:
                f.write(cmd[3])
            out = True
        elif op == "open":
            fds[path] = os.open(path, os.O_RDONLY)
            out = True
        elif op == "pread":
            out = os.pread(fds[path], 100, 0).decode()
        elif op == "listdir":
            out = sorted(os.listdir(path))
        else:
            out = "unknown op " + op
        print(json.dumps({"ok": out}), flush=True)
    except OSError as e:
        print(json.dumps({"err": errno.errorcode.get(e.errno, str(e.errno)), "secs": time.monotonic() - t0}), flush=True)
"""


class Agent:
    def __init__(self, shortfuse: Path, mp: Path):
        self.proc = subprocess.Popen(
            [str(shortfuse), "run", "-m", str(mp), "--", sys.executable, "-c", AGENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def send(self, *cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"the agent died: {self.proc.stderr.read()}"
        return json.loads(line)

    def __call__(self, *cmd):
        self.send(*cmd)
        return self.recv()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_two_programs_see_each_others_changes_at_once(shortfuse, scratch):
    mp = scratch / "mnt"
    # Caches that would hold stale names and attributes for the whole test
    # without the daemon's notifications.
    d = Daemon(shortfuse, scratch, ["mem", str(mp), "-o", "attr_timeout=30,entry_timeout=30,negative_timeout=30"], mp)
    b = Agent(shortfuse, mp)
    try:
        assert b("stat", f"{mp}/f")["err"] == "ENOENT"
        assert b("write", f"{mp}/f", "w", "one")["ok"]
        first = b("stat", f"{mp}/f")["ok"]
        assert first["size"] == 3
        assert b("stat", f"{mp}/new")["err"] == "ENOENT"
        a = under(shortfuse, mp, ["sh", "-c", f"cat {mp}/f; printf two >> {mp}/f; echo x > {mp}/new"])
        assert a.returncode == 0, a.stderr.decode()
        assert a.stdout == b"one"
        # B cached f's size, and new as missing: both must be fresh.
        assert b("stat", f"{mp}/f")["ok"]["size"] == 6
        assert b("read", f"{mp}/f")["ok"] == "onetwo"
        assert b("stat", f"{mp}/new")["ok"]["size"] == 2
        a = under(shortfuse, mp, ["mv", f"{mp}/f", f"{mp}/g"])
        assert a.returncode == 0, a.stderr.decode()
        assert b("stat", f"{mp}/f")["err"] == "ENOENT"
        assert b("stat", f"{mp}/g")["ok"]["ino"] == first["ino"]
        # And the other way round.
        assert b("write", f"{mp}/g", "a", "three")["ok"]
        a = under(shortfuse, mp, ["cat", f"{mp}/g"])
        assert a.stdout == b"onetwothree", a.stderr.decode()
        # A forked child shares its parent's connection: each still sees the
        # other's changes.
        fork = (
            "import os, sys\n"
            f"p = '{mp}/g'\n"
            "before = os.stat(p).st_size\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    open(p, 'a').write('four')\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "print(before, os.stat(p).st_size)\n"
        )
        a = under(shortfuse, mp, [sys.executable, "-c", fork])
        assert a.stdout == b"11 15\n", a.stderr.decode()
        assert d.count("INIT") >= 4
    finally:
        b.close()
        d.stop()


def test_a_kernel_mount_of_the_daemon_sees_the_same_files(shortfuse, scratch):
    mp = scratch / "mnt"
    mp.mkdir()
    # Ring clients and the kernel mount would keep names and attributes for
    # 30 s without the daemon's notifications.
    d = Daemon(shortfuse, scratch, ["mem", str(mp), "--transport", "dev", "-o", "attr_timeout=30,entry_timeout=30,negative_timeout=30"], mp)
    b = Agent(shortfuse, mp)
    try:
        assert b("write", f"{mp}/from-ring", "w", "ring data")["ok"]
        assert (mp / "from-ring").read_text() == "ring data"
        assert b("write", f"{mp}/from-ring", "a", "+more")["ok"]
        assert (mp / "from-ring").read_text() == "ring data+more"
        # B caches the directory's attributes and the missing name; the
        # kernel's changes reach it at once all the same.
        assert b("stat", f"{mp}/from-kernel")["err"] == "ENOENT"
        size = b("stat", f"{mp}/from-ring")["ok"]["size"]
        (mp / "from-kernel").write_text("kernel data")
        with open(mp / "from-ring", "a") as f:
            f.write("+kernel")
        assert b("stat", f"{mp}/from-ring")["ok"]["size"] == size + 7
        assert b("read", f"{mp}/from-kernel")["ok"] == "kernel data"
        a = under(shortfuse, mp, ["cat", f"{mp}/from-kernel"])
        assert a.stdout == b"kernel data", a.stderr.decode()
        assert b("listdir", str(mp))["ok"] == ["from-kernel", "from-ring"]
        # The kernel keeps what it looked up: stats of a cached name ask nothing.
        (mp / "gone").write_text("x")
        (mp / "gone").stat()  # the write left the size to ask for once
        asked = d.count("GETATTR") + d.count("LOOKUP")
        for _ in range(5):
            assert (mp / "gone").stat().st_size == 1
        assert d.count("GETATTR") + d.count("LOOKUP") == asked
        assert not (mp / "late").exists()
        # A ring client's removals, new names and appends reach the kernel's
        # cache at once (through INVAL_ENTRY / INVAL_INODE).
        a = under(shortfuse, mp, ["sh", "-c", f"rm {mp}/gone; echo hi > {mp}/late; printf ++ >> {mp}/from-ring"])
        assert a.returncode == 0, a.stderr.decode()
        assert not (mp / "gone").exists()
        assert (mp / "late").read_text() == "hi\n"
        assert (mp / "from-ring").read_text() == "ring data+more+kernel++"
        # An open with O_TRUNC empties the file in that one request (both
        # sides agree on FUSE_ATOMIC_O_TRUNC): either side's truncation
        # reaches the other's cache, with no write after it.
        assert (mp / "from-ring").stat().st_size == len("ring data+more+kernel++")
        assert b("write", f"{mp}/from-ring", "w", "")["ok"]
        assert (mp / "from-ring").stat().st_size == 0
        assert (mp / "from-ring").read_text() == ""
        assert b("stat", f"{mp}/late")["ok"]["size"] == 3
        open(mp / "late", "w").close()
        assert b("stat", f"{mp}/late")["ok"]["size"] == 0
        # One daemon, one set of statistics: both paths counted.
        transports = d.stats()["transports"]
        assert transports["ring"] > 0 and transports["dev"] > 0, transports
    finally:
        b.close()
        d.stop()
    assert not mp.is_mount()


# Takes a lock on argv[1] (argv[2]: lockf, flock or ofd), says so, then
# waits for a line on stdin (or EOF) and exits; with argv[3] = "try" it only
# tries and prints the errno.
LOCKER = r"""
import fcntl, os, struct, sys
path, kind = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
try_only = len(sys.argv) > 3
nb = fcntl.LOCK_NB if try_only else 0
try:
    if kind == "lockf":
        fcntl.lockf(fd, fcntl.LOCK_EX | nb, 10, 0)
    elif kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX | nb)
    else:
        cmd = fcntl.F_OFD_SETLK if try_only else fcntl.F_OFD_SETLKW
        fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 10, 0))
except OSError as e:
    print("busy", e.errno, flush=True)
    sys.exit(0)
print("locked", flush=True)
sys.stdin.readline()
"""


def locker(shortfuse: Path, mp: Path, kind: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(shortfuse), "run", "-m", str(mp), "--", sys.executable, "-c", LOCKER, f"{mp}/lk", kind, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def first_line(p: subprocess.Popen) -> bytes:
    line = p.stdout.readline()
    assert line, p.stderr.read().decode()
    return line


@pytest.mark.parametrize("kind", ["lockf", "flock", "ofd"])
def test_locks_between_programs_and_a_blocked_locker_gets_the_lock(shortfuse, scratch, kind):
    mp = scratch / "mnt"
    mp.mkdir()
    d = Daemon(shortfuse, scratch, ["mem", str(mp), "--transport", "dev"], mp)
    procs = []
    try:
        holder = locker(shortfuse, mp, kind)
        procs.append(holder)
        assert first_line(holder) == b"locked\n"
        # Another program (and a program on the kernel mount) finds it taken.
        t = under(shortfuse, mp, [sys.executable, "-c", LOCKER, f"{mp}/lk", kind, "try"])
        assert t.stdout == b"busy 11\n", t.stderr.decode()
        k = subprocess.run([sys.executable, "-c", LOCKER, f"{mp}/lk", kind, "try"], capture_output=True, timeout=60)
        assert k.stdout == b"busy 11\n", k.stderr.decode()
        # A blocked locker waits while the holder lives, and gets the lock
        # once the holder exits; the next one once that one is killed -9.
        waiter = locker(shortfuse, mp, kind)
        procs.append(waiter)
        time.sleep(0.5)
        assert waiter.poll() is None
        holder.stdin.write(b"go\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
        assert first_line(waiter) == b"locked\n"
        last = locker(shortfuse, mp, kind)
        procs.append(last)
        time.sleep(0.5)
        assert last.poll() is None
        waiter.kill()
        waiter.wait()
        assert first_line(last) == b"locked\n"
        last.stdin.close()
        assert last.wait(timeout=60) == 0
        # Nothing holds it now.
        t = under(shortfuse, mp, [sys.executable, "-c", LOCKER, f"{mp}/lk", kind, "try"])
        assert t.stdout == b"locked\n", t.stderr.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        d.stop()


RAW_CLONE = r"""
import ctypes, os, sys, time
mp = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
with open(mp + "/f", "w") as f:
    f.write("12345")
print(os.stat(mp + "/f").st_size)
# clone(SIGCHLD) as a raw system call: libc's fork handlers do not run.
pid = libc.syscall(56, 17, 0, 0, 0, 0)
if pid == 0:
    fd = os.open(mp + "/f", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"678")
    os.close(fd)
    os._exit(0)
os.waitpid(pid, 0)
print(os.stat(mp + "/f").st_size)
"""


def test_a_raw_clone_child_is_a_process_of_its_own_to_the_daemon(shortfuse, scratch):
    mp = scratch / "mnt"
    # Attributes would be believed for 30 s without the daemon's notices.
    d = Daemon(shortfuse, scratch, ["mem", str(mp), "-o", "attr_timeout=30,entry_timeout=30"], mp)
    try:
        a = under(shortfuse, mp, [sys.executable, "-c", RAW_CLONE, str(mp)])
        assert a.stdout == b"5\n8\n", a.stderr.decode()
    finally:
        d.stop()


# Handles of a daemon's files go to the open file description only when it
# can reach another process (fork, exec, a descriptor sent over a socket):
# until then they are the opening process's. The program says where it is
# (a line) and waits for the test (a line back), which reads the daemon's
# RELEASE count meanwhile. Files are unlinked while open: mem frees one as
# soon as nothing uses it, so a handle released too early (with the lookups
# of a connection that ended) shows as a failed read.
LAZY = r"""
import os, socket, subprocess, sys, time
mp = sys.argv[1]
def step(name):
    print(name, flush=True)
    sys.stdin.readline()
def run(code, *args, fds=()):
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], pass_fds=fds, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()
if len(sys.argv) > 2:
    # exec'd by the first image below: the inherited description is adopted.
    fd = int(sys.argv[2])
    os.write(fd, b"zz")
    print("exec", os.pread(fd, 10, 0).decode(), flush=True)
    os.close(fd)
    step("exec-closed")
    sys.exit(0)
# A forked child goes on at the shared offset after the parent closed.
fd = os.open(mp + "/a", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"ab")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    os.write(fd, b"cd")
    os.lseek(fd, 0, 0)
    ok = os.read(fd, 10) == b"abcd"
    os.close(fd)
    os._exit(0 if ok else 1)
os.close(fd)
step("fork-parent-closed")
os.write(w, b"x")
print("fork", os.waitpid(pid, 0)[1], flush=True)
step("fork-child-closed")
# Sent over a Unix socket by a program that then ends; read by another one.
a, b = socket.socketpair()
run("import os, socket, sys; fd = os.open(sys.argv[1] + '/c', os.O_RDWR | os.O_CREAT, 0o644); "
    "os.write(fd, b'12'); os.unlink(sys.argv[1] + '/c'); "
    "socket.send_fds(socket.socket(fileno=int(sys.argv[2])), [b'x'], [fd])", mp, b.fileno(), fds=(b.fileno(),))
_, got, _, _ = socket.recv_fds(a, 1, 1)
print("sent", run("import os, sys; print(os.pread(int(sys.argv[1]), 10, 0).decode())", got[0], fds=(got[0],)), flush=True)
os.close(got[0])
step("sent-closed")
# A forked child that ends without closing, while the connection lives on.
pid = os.fork()
if pid == 0:
    os.write(os.open(mp + "/e", os.O_RDWR | os.O_CREAT, 0o644), b"e")
    os._exit(0)
os.waitpid(pid, 0)
step("child-ended")
# kill -9 of a program holding a file open, never forked.
k = subprocess.Popen([sys.executable, "-c", "import os, sys, time; os.open(sys.argv[1] + '/k', os.O_RDWR | os.O_CREAT, 0o644); "
                      "print('open', flush=True); time.sleep(60)", mp], stdout=subprocess.PIPE, text=True)
assert k.stdout.readline() == "open\n"
k.kill()
k.wait()
step("killed")
# exec without fork: the new image goes on with the description.
fd = os.open(mp + "/b", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"xy")
os.unlink(mp + "/b")
os.set_inheritable(fd, True)
os.execv(sys.executable, [sys.executable, sys.argv[0], mp, str(fd)])
"""


# A description passed over a Unix socket, then handed to a new image: by
# fork and exec, and by subprocess (vfork). The receiving process never
# used it, so only the new image's look at its descriptors finds it.
PASSED_ON = r"""
import os, socket, subprocess, sys
mp = sys.argv[1]
READ = "import os, sys; print(os.pread(int(sys.argv[1]), 10, 0).decode())"
a, b = socket.socketpair()
subprocess.run([sys.executable, "-c", "import os, socket, sys; fd = os.open(sys.argv[1] + '/c', os.O_RDWR | os.O_CREAT, 0o644); "
                "os.write(fd, b'12'); socket.send_fds(socket.socket(fileno=int(sys.argv[2])), [b'x'], [fd])",
                mp, str(b.fileno())], pass_fds=(b.fileno(),), check=True)
_, got, _, _ = socket.recv_fds(a, 1, 1)
fd = got[0]
os.set_inheritable(fd, True)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.dup2(w, 1)
    os.execv(sys.executable, [sys.executable, "-c", READ, str(fd)])
os.close(w)
forked = os.read(r, 100).decode().strip()
os.waitpid(pid, 0)
spawned = subprocess.run([sys.executable, "-c", READ, str(fd)], pass_fds=(fd,), capture_output=True, text=True).stdout.strip()
print(forked, spawned)
"""


def test_a_description_passed_over_a_socket_reaches_the_images_its_receiver_starts(shortfuse, scratch):
    mp = scratch / "mnt"
    d = Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
    try:
        p = under(shortfuse, mp, [sys.executable, "-c", PASSED_ON, str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["12", "12"]
    finally:
        d.stop()


def test_a_description_reaches_other_processes_with_its_handle(shortfuse, scratch):
    mp = scratch / "mnt"
    d = Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
    script = scratch / "lazy.py"
    script.write_text(LAZY)
    p = subprocess.Popen(
        [str(shortfuse), "run", "-m", str(mp), "--", sys.executable, str(script), str(mp)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    # RELEASEs expected by each step: none while a forked child still holds
    # the parent's description (a RELEASE would come at once, before the
    # step), then one per description once its last descriptor closed, or
    # its process ended (which the daemon learns a little later).
    releases = {
        "fork-parent-closed": 0,
        "fork-child-closed": 1,
        "sent-closed": 2,
        "child-ended": 3,
        "killed": 4,
        "exec-closed": 5,
    }
    try:
        base = d.count("RELEASE")
        said = []
        for line in p.stdout:
            line = line.strip()
            if line not in releases:
                said.append(line)
                continue
            want = releases[line]
            deadline = time.monotonic() + 10
            while (got := d.count("RELEASE") - base) < want and time.monotonic() < deadline:
                time.sleep(0.05)
            assert got == want, f"{got} RELEASEs at {line}, {want} expected"
            p.stdin.write("\n")
            p.stdin.flush()
        assert p.wait(timeout=60) == 0, p.stderr.read()
        assert said == ["fork 0", "sent 12", "exec xyzz"], p.stderr.read()
    finally:
        # The program and the children it left behind, should it fail.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        d.stop()


def traced_on_a_passthrough_mount(shortfuse, scratch, trace: str, shell: list[str], out: bytes) -> str:
    """The strace log (`-e trace=TRACE`, every process) of `shell` run under
    `shortfuse run` on a `serve passthrough` mount of `scratch/src` at
    `scratch/mnt` (`{mp}` in `shell` is replaced by it), which must print
    `out`."""
    src, mp = scratch / "src", scratch / "mnt"
    d = Daemon(shortfuse, scratch, ["passthrough", str(src), str(mp)], mp)
    try:
        log = scratch / "strace.log"
        argv = ["strace", "-f", "-qq", "-o", str(log), "-e", f"trace={trace}"]
        argv += [str(shortfuse), "run", "-m", str(mp), "--", *(a.replace("{mp}", str(mp)) for a in shell)]
        r = subprocess.run(argv, capture_output=True, timeout=120)
        assert (r.returncode, r.stdout) == (0, out), r.stderr.decode()
    finally:
        d.stop()
    return log.read_text()


def calls_of_true(text, program="/bin/true"):
    """The lines of `strace -f` output `text` that the /bin/true image (or
    the image of `program`) made: its pid's, after its exec."""
    true_pid, calls = None, []
    for line in text.splitlines():
        pid, _, call = line.partition(" ")
        call = call.lstrip()
        # The shim execs through execveat.
        if call.startswith(f'execve("{program}"') or call.startswith("execveat(") and f'"{program}", [' in call:
            true_pid = pid
        elif pid == true_pid:
            calls.append(call)
    assert true_pid is not None, text
    return calls


def test_a_new_image_looks_at_its_inherited_descriptors_once(shortfuse, scratch):
    """A new image under a daemon's mount that mirrors a directory looks at
    the descriptors it inherited (/proc/self/fd, a readlink each) for two
    things, the daemon's open file descriptions and the backing files
    (`cmd >> mnt/file`): one look serves both. Counted by strace in the
    /bin/true a shell runs while it holds a file of the mount open."""
    (scratch / "src").mkdir()
    (scratch / "src" / "f").write_text("x\n")
    text = traced_on_a_passthrough_mount(
        shortfuse, scratch, "execve,openat,readlink", ["bash", "-c", "exec 3< {mp}/f; /bin/true; cat <&3"], b"x\n"
    )
    calls = calls_of_true(text)
    listings = [c for c in calls if c.startswith("openat(") and '"/proc/self/fd"' in c and "O_PATH" not in c]
    links = [c.split('"')[1] for c in calls if c.startswith('readlink("/proc/self/fd/')]
    # It does look (fd 3 is the mount's), and at each descriptor once.
    assert "/proc/self/fd/3" in links, calls
    assert (len(listings), len(links)) == (1, len(set(links))), calls


def test_an_image_under_a_mirroring_daemon_does_not_read_the_mount_table(shortfuse, scratch):
    """Whether a daemon's files are remote (so that a program's page cache
    goes in front of it by default) is read from its kernel mount in the
    mount table; a daemon that mirrors a directory of this machine is
    local, and a new image under its mount starts without that read.
    Counted by strace over every image of a shell running /bin/true."""
    (scratch / "src").mkdir()
    text = traced_on_a_passthrough_mount(
        shortfuse, scratch, "execve,execveat,openat", ["sh", "-c", "cd {mp} && /bin/true && echo ok"], b"ok\n"
    )
    # The shim execs through execveat.
    assert '"/bin/true", ["/bin/true"]' in text, text
    reads = [line for line in text.splitlines() if "/proc/self/mountinfo" in line]
    assert reads == [], reads


def test_an_image_that_never_uses_the_mount_does_not_connect_to_the_daemon(shortfuse, scratch):
    """A new image sets the daemon's mount up from what `run` (or the image
    that exec'd it) was told by the daemon's welcome, and connects at its
    first request: one that never makes any, here a /bin/true started in a
    directory beneath the namespace map, opens no socket, says no hello,
    and leaves the daemon nothing to set up or clean after. Counted by
    strace in that /bin/true."""
    (scratch / "src").mkdir()
    text = traced_on_a_passthrough_mount(
        shortfuse,
        scratch,
        "execve,execveat,socket,socketpair,sendmsg,connect",
        ["sh", "-c", "cd {mp} && /bin/true && echo ok"],
        b"ok\n",
    )
    calls = [c.split("(")[0] for c in calls_of_true(text) if c[:1].isalpha()]
    assert calls == [], calls


def test_an_image_connects_at_its_first_request_without_fencing_the_low_descriptor_numbers(shortfuse, scratch):
    """An image connects to the daemon at its first request, inside the
    program's call, when the program expects the low descriptor numbers
    free. The ring client puts the descriptors it keeps (its socket, the
    namespace map's root) above them itself, so nothing fences them (a
    socket pair and about a hundred descriptors passed over it and closed
    again). Counted by strace in a python3 whose stat of the mount point
    (the root is not beneath the map: a GETATTR) connects; its next open
    still gets the lowest number."""
    (scratch / "src").mkdir()
    mp = scratch / "mnt"
    first_open = f"import os; os.stat('{mp}'); print(os.open('/dev/null', os.O_RDONLY))"
    text = traced_on_a_passthrough_mount(
        shortfuse,
        scratch,
        "execve,socketpair,sendmsg,connect",
        ["sh", "-c", f'exec /usr/bin/python3 -c "{first_open}"'],
        b"3\n",
    )
    calls = [c.split("(")[0] for c in calls_of_true(text, "/usr/bin/python3") if c[:1].isalpha()]
    # It does connect, and sends its hello, and nothing else.
    assert calls == ["connect", "sendmsg"], calls


# Descriptions made late (at the first fork, exec, SCM_RIGHTS or lock):
# what the program sees of a descriptor must not change when its
# placeholder is swapped for the shared description, whichever thread
# is using it meanwhile. Prints one JSON object of findings.
SWAP = r"""
import fcntl, json, os, sys, threading
mp = sys.argv[1]
if len(sys.argv) > 2:
    # exec'd below: the dup'd number without FD_CLOEXEC came along, at
    # its offset; the original (FD_CLOEXEC) did not.
    fd, gone = int(sys.argv[2]), int(sys.argv[3])
    try:
        os.fstat(gone)
        closed = False
    except OSError:
        closed = True
    at = os.lseek(fd, 0, os.SEEK_CUR)
    os.write(fd, b"!")
    print(json.dumps({"exec": [at, os.pread(fd, 10, 0).decode(), closed]}), flush=True)
    sys.exit(0)
out = {}
def flags(fd):
    return [os.get_inheritable(fd), os.lseek(fd, 0, os.SEEK_CUR)]
# dup'd copies with their own FD_CLOEXEC, one offset, across the swap a
# fork makes; the child moves the offset, the parent sees it.
fd = os.open(mp + "/a", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
os.write(fd, b"ab")
fd2 = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
fd3 = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 20)
os.lseek(fd2, 1, os.SEEK_SET)
before = [flags(fd), flags(fd2), flags(fd3), fcntl.fcntl(fd, fcntl.F_GETFL)]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps([flags(fd), flags(fd2), flags(fd3), fcntl.fcntl(fd, fcntl.F_GETFL)]).encode())
    os.write(fd3, b"XY")
    os._exit(0)
os.waitpid(pid, 0)
out["child"] = json.loads(os.read(r, 4096))
out["before"] = before
out["parent"] = [flags(fd), flags(fd2), flags(fd3), fcntl.fcntl(fd, fcntl.F_GETFL), os.fstat(fd).st_size]
out["data"] = [os.read(fd, 10).decode(), os.pread(fd2, 10, 0).decode()]
# O_APPEND across the swap.
fd = os.open(mp + "/b", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b"1")
pid = os.fork()
if pid == 0:
    os.write(fd, b"2")
    os._exit(0)
os.waitpid(pid, 0)
os.lseek(fd, 0, os.SEEK_SET)
os.write(fd, b"3")
out["append"] = [open(mp + "/b").read(), fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND == os.O_APPEND]
os.close(fd)
# A thread reads and seeks each description while a fork swaps it.
data = bytes(range(256)) * 16
bad = []
for i in range(20):
    fd = os.open(f"{mp}/t{i}", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, data)
    stop = threading.Event()
    def reader(fd=fd, stop=stop):
        n = 0
        while not stop.is_set() or n < 50:
            try:
                os.lseek(fd, 0, os.SEEK_SET)
                got = os.read(fd, len(data))
            except OSError as e:
                bad.append(repr(e))
                return
            if got != data:
                bad.append(f"read {len(got)} bytes")
                return
            n += 1
    t = threading.Thread(target=reader)
    t.start()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if os.pread(fd, 4, 0) == data[:4] else 1)
    out.setdefault("forks", []).append(os.waitpid(pid, 0)[1])
    stop.set()
    t.join()
    os.close(fd)
out["threads"] = bad
print(json.dumps(out), flush=True)
# exec: the inherited copy goes on at the shared offset.
fd = os.open(mp + "/c", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
os.write(fd, b"xyz")
os.dup2(fd, 50)
os.lseek(50, 2, os.SEEK_SET)
os.execv(sys.executable, [sys.executable, sys.argv[0], mp, "50", str(fd)])
"""


def test_late_descriptions_keep_what_the_program_sees(shortfuse, scratch):
    mp = scratch / "mnt"
    d = Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
    script = scratch / "swap.py"
    script.write_text(SWAP)
    try:
        p = under(shortfuse, mp, [sys.executable, str(script), str(mp)])
        assert p.returncode == 0, p.stderr.decode()
        out, exe = [json.loads(l) for l in p.stdout.decode().splitlines()]
        rdwr = os.O_RDWR | os.O_LARGEFILE
        # [inheritable, offset] of fd, fd2 (dup), fd3 (F_DUPFD_CLOEXEC); F_GETFL.
        assert out["before"] == [[False, 1], [True, 1], [False, 1], rdwr], out
        assert out["child"] == out["before"], out
        assert out["parent"] == [[False, 3], [True, 3], [False, 3], rdwr, 3], out
        assert out["data"] == ["", "aXY"], out
        assert out["append"] == ["123", True], out
        assert out["forks"] == [0] * 20 and out["threads"] == [], out
        assert exe == {"exec": [2, "xy!", True]}, exe
    finally:
        d.stop()


def stopped(pid: int):
    """Waits until every thread of `pid` has stopped (SIGSTOP reaches each
    thread on its own; a spinning worker could still serve meanwhile)."""
    deadline = time.monotonic() + 10
    tasks = Path(f"/proc/{pid}/task")
    while not all((t / "stat").read_text().split(") ")[1][0] == "T" for t in tasks.iterdir()):
        assert time.monotonic() < deadline, "the daemon did not stop"
        time.sleep(0.01)


# O_CREAT opens of names this program never looked up (others made them):
# the shim first tries an exclusive CREATE without a LOOKUP, and must then
# fall back to what the kernel does.
CREATES = r"""
import errno, os, sys
mp = sys.argv[1]
fd = os.open(f"{mp}/theirs", os.O_CREAT | os.O_RDWR, 0o600)
assert os.read(fd, 10) == b"kept", "an existing file was replaced"
os.close(fd)
try:
    os.open(f"{mp}/theirs", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    raise SystemExit("O_EXCL opened an existing file")
except FileExistsError:
    pass
fd = os.open(f"{mp}/link", os.O_CREAT | os.O_WRONLY, 0o600)
os.write(fd, b"via link")
os.close(fd)
assert os.path.islink(f"{mp}/link")
assert open(f"{mp}/target", "rb").read() == b"via link"
try:
    os.open(f"{mp}/sub", os.O_CREAT | os.O_WRONLY, 0o600)
    raise SystemExit("O_CREAT opened a directory for writing")
except IsADirectoryError:
    pass
for i in range(20):
    os.close(os.open(f"{mp}/n{i}", os.O_CREAT | os.O_WRONLY, 0o640))
print(oct(os.stat(f"{mp}/n0").st_mode & 0o777))
"""


def test_creates_of_unknown_names_skip_the_lookup_and_keep_existing_files(shortfuse, scratch):
    mp = scratch / "mnt"
    d = Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
    try:
        made = under(
            shortfuse, mp, ["sh", "-c", f"printf kept > {mp}/theirs && ln -s target {mp}/link && mkdir {mp}/sub"]
        )
        assert made.returncode == 0, made.stderr.decode()
        lookups, creates = d.count("LOOKUP"), d.count("CREATE")
        p = under(shortfuse, mp, [sys.executable, "-c", CREATES, str(mp)], env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        assert p.returncode == 0, p.stderr.decode()
        # The umask (022) applies to a create without a LOOKUP too.
        assert p.stdout.decode().split() == ["0o640"]
        # One CREATE for each of the 20 new names, one that failed for each
        # of `theirs`, `link` and `sub` (then looked up: `theirs` is cached
        # for the O_EXCL open), and one for `target`, found through `link`.
        assert d.count("CREATE") - creates == 20 + 3 + 1
        assert d.count("LOOKUP") - lookups < 20
    finally:
        d.stop()


def test_kill_9_of_the_daemon_fails_a_blocked_read_with_enotconn(shortfuse, scratch):
    mp = scratch / "mnt"
    d = Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
    b = Agent(shortfuse, mp)
    try:
        # Written by another program, so that none of it is cached in B.
        a = under(shortfuse, mp, ["sh", "-c", f"echo data > {mp}/f"])
        assert a.returncode == 0, a.stderr.decode()
        assert b("open", f"{mp}/f")["ok"]
        # The daemon stops answering: the read waits (spins, then sleeps).
        d.proc.send_signal(signal.SIGSTOP)
        stopped(d.proc.pid)
        b.send("pread", f"{mp}/f")
        time.sleep(0.5)
        assert b.proc.poll() is None
        t0 = time.monotonic()
        d.proc.kill()
        d.proc.wait()
        got = b.recv()
        waited = time.monotonic() - t0
        assert got["err"] == "ENOTCONN", got
        # Bounds against a hang only: how soon (the README's 50 ms) is
        # measured by `shortfuse bench rings` (test_bench_rings_measures_...).
        assert waited < 30, f"the blocked read took {waited:.2f}s to fail"
        # Later calls fail too, without waiting on the dead daemon.
        again = b("stat", f"{mp}/f")
        assert again["err"] == "ENOTCONN" and again["secs"] < 30, again
        # A new daemon takes over the sockets the dead one left behind (and
        # removes them when it stops).
        d = Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
        a = under(shortfuse, mp, ["ls", str(mp)])
        assert a.returncode == 0 and a.stdout == b"", a.stderr.decode()
    finally:
        b.close()
        d.stop()


CLIENT_LOOP = r"""
import os, sys
mp = sys.argv[1]
fds = []
i = 0
while True:
    fd = os.open(f"{mp}/c{i % 50}", os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, b"x" * 1000)
    fds.append(fd)
    if len(fds) > 20:
        os.close(fds.pop(0))
    if i == 100:
        print("busy", flush=True)
    i += 1
"""


def test_kill_9_of_a_client_mid_request_gives_back_its_handles(shortfuse, scratch):
    mp = scratch / "mnt"
    d = Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
    try:
        c = subprocess.Popen(
            [str(shortfuse), "run", "-m", str(mp), "--", sys.executable, "-c", CLIENT_LOOP, str(mp)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert c.stdout.readline() == b"busy\n", c.stderr.read().decode()
        releases = d.count("RELEASE")
        forgets = d.count("BATCH_FORGET")
        c.kill()
        c.wait()
        # The kernel closes the ~20 open file descriptions the client held:
        # the daemon releases their handles; its connection's lookups are
        # forgotten in one BATCH_FORGET.
        deadline = time.monotonic() + 10
        while d.count("RELEASE") < releases + 20 or d.count("BATCH_FORGET") == forgets:
            assert time.monotonic() < deadline, "the killed client's handles or lookups were never given back"
            time.sleep(0.05)
        a = under(shortfuse, mp, ["sh", "-c", f"ls {mp} | wc -l; head -c 10 {mp}/c7"])
        assert a.returncode == 0, a.stderr.decode()
        assert a.stdout == b"50\nxxxxxxxxxx"
    finally:
        d.stop()


def test_bench_rows_over_the_ring(shortfuse, scratch):
    out = scratch / "bench"
    p = subprocess.run(
        [str(shortfuse), "bench", "transport", "meta", "--tiny", "--threads", "2"]
        + ["--configs", "null-ring,null-preload,ring", "--out", str(out)],
        capture_output=True,
        timeout=600,
    )
    report = json.loads((out / "report.json").read_text())
    rows = {(s["suite"], r["config"]): r for s in report["suites"] for r in s["results"]}
    for key in [("transport", "null-ring"), ("transport", "null-preload"), ("transport", "ring"), ("meta", "ring")]:
        assert rows[key]["error"] is None and rows[key]["figures"], (key, rows[key], p.stderr.decode()[-2000:])
    ops = {f["op"] for f in rows[("transport", "null-ring")]["figures"]}
    assert {"empty-create", "empty-stat-missing", "empty-open+close-root"} <= ops, ops
    # The bench's daemons are gone, and their sockets with them.
    assert not [l for l in Path("/proc/self/mounts").read_text().splitlines() if str(scratch) in l]
    left = subprocess.run(["pgrep", "-f", "shortfuse serve .*/run-(null-)?ring-"], capture_output=True)
    assert left.returncode == 1, left.stdout


def test_bench_rings_measures_enotconn_and_idle_cpu(shortfuse, scratch):
    out = scratch / "bench"
    p = subprocess.run(
        [str(shortfuse), "bench", "rings", "--tiny", "--out", str(out)], capture_output=True, timeout=300
    )
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    report = json.loads((out / "report.json").read_text())
    (row,) = [r for s in report["suites"] if s["suite"] == "rings" for r in s["results"]]
    assert row["error"] is None, row
    figs = {f["op"]: f for f in row["figures"]}
    assert set(figs) == {"enotconn after kill -9", "idle daemon CPU"}, figs
    for f in figs.values():
        # The median of several runs, each kept; every run measured something.
        assert len(f["runs"]) >= 3 and sorted(f["runs"])[len(f["runs"]) // 2] == f["value"], f
        assert all(v >= 0 for v in f["runs"]) and f["lower_is_better"], f
    assert figs["enotconn after kill -9"]["unit"] == "ms" and min(figs["enotconn after kill -9"]["runs"]) > 0
    assert "median" in (out / "report.md").read_text()
    left = subprocess.run(["pgrep", "-f", f"shortfuse serve mem {out}"], capture_output=True)
    assert left.returncode == 1, left.stdout


DRIVER = "import os, sys\nos.mkdir(sys.argv[3])\n" + test_run.DRIVER

# passthrough's daemon passes its namespace map to the client (stat,
# access and readlink served in the kernel beneath the source).
@pytest.fixture(scope="module", params=["mem", "passthrough"])
def posix_daemon(shortfuse, request):
    base = sfmount.new_scratch("ring-posix")
    base.chmod(0o755)
    mp = base / "mnt"
    if request.param == "passthrough":
        (base / "src").mkdir()
        d = Daemon(shortfuse, base, ["passthrough", str(base / "src"), str(mp)], mp)
    else:
        d = Daemon(shortfuse, base, ["mem", str(mp)], mp)
    yield d
    d.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("name", test_run.SCENARIO_NAMES)
def test_posix_scenario_over_the_ring(shortfuse, scratch, posix_daemon, name):
    native = scratch / "native"
    native.mkdir()
    native.chmod(0o755)
    argv = [sys.executable, "-c", DRIVER, str(TESTS), name]
    want = test_run.observe(argv + [str(native / "s")], str(native / "s"))
    root = f"{posix_daemon.mp}/{name}"
    got = test_run.observe([str(shortfuse), "run", "-m", str(posix_daemon.mp), "--", *argv, root], root)
    diff = test_posix.compare([tuple(o) for o in want], [tuple(o) for o in got])
    assert diff is None, f"{name} over the ring differs from native ext4:\n{diff}"


@pytest.mark.parametrize("fs", ["passthrough", "mem"])
def test_a_program_on_the_daemon_s_mount_runs_as_the_first_program(shortfuse, scratch, fs):
    mp = scratch / "mnt"
    src = scratch / "src"
    src.mkdir()
    test_run.programs_on(src)
    d = Daemon(shortfuse, scratch, [fs, str(src), str(mp)] if fs == "passthrough" else [fs, str(mp)], mp)
    try:
        if fs == "mem":
            p = under(shortfuse, mp, ["cp", "-p", f"{src}/hello.sh", f"{src}/echo-elf", str(mp)])
            assert p.returncode == 0, p.stderr.decode()
        test_run.check_programs_on_mount(shortfuse, [str(mp)], mp, scratch)
    finally:
        d.stop()


# Parent and forked children each map their own file of a passthrough
# daemon MAP_SHARED again and again (every map asks the daemon for the
# backing file over the socket the processes share) and check what they
# see; prints the count of wrong contents and failures.
FORKED_LENDS = r"""
import mmap, os, sys
mp, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n + 1):
    with open(f"{mp}/f{i}", "wb") as f:
        f.write((b"%08d" % i) * 512)
def work(i):
    bad = 0
    for _ in range(rounds):
        fd = os.open(f"{mp}/f{i}", os.O_RDONLY)
        try:
            with mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ) as m:
                bad += m[:8] != b"%08d" % i
        except OSError as e:
            bad += 1
            print(i, e, file=sys.stderr)
        os.close(fd)
    return bad
kids = []
for i in range(1, n + 1):
    pid = os.fork()
    if pid == 0:
        os._exit(min(work(i), 100))
    kids.append(pid)
bad = work(0)
for pid in kids:
    bad += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(bad)
"""


def test_forked_children_and_their_parent_ask_for_backing_files_at_once(shortfuse, scratch):
    mp, src = scratch / "mnt", scratch / "src"
    src.mkdir()
    d = Daemon(shortfuse, scratch, ["passthrough", str(src), str(mp)], mp)
    try:
        p = under(shortfuse, mp, [sys.executable, "-c", FORKED_LENDS, str(mp), "8", "4"])
        assert (p.returncode, p.stdout) == (0, b"0\n"), p.stderr.decode()
    finally:
        d.stop()


def test_run_without_a_daemon_stops_before_the_program(shortfuse, scratch):
    marker = scratch / "ran"
    p = subprocess.run(
        [str(shortfuse), "run", "-m", str(scratch / "nobody"), "--", "touch", str(marker)],
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 2, p
    assert "no shortfuse daemon" in p.stderr.decode() and "shortfuse serve" in p.stderr.decode(), p.stderr
    assert not marker.exists()
    # Options of the file system belong to the daemon.
    p = subprocess.run(
        [str(shortfuse), "run", "-m", str(scratch / "nobody"), "-o", "attr_timeout=5", "--", "true"],
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 2 and "give it to `shortfuse serve`" in p.stderr.decode(), p.stderr
