"""Unix plumbing under the preload shim, compared with the same commands
on native ext4: FIFOs between processes, the current directory and file
actions of vfork and posix_spawn children (python's subprocess with
`cwd=`, `python3 -m venv`, `pip install`), one identity per file however it
was opened (`cat f >> f`), and the kernel's links in /proc that name a
mount's files.

Each runs on an in-process passthrough mount (`run -m MP=passthrough:SRC`)
and on `shortfuse serve` daemons over passthrough and over mem reached with
`run -m MP`, where the behaviour applies there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_ring import Daemon
from test_run import output, run, scratch, shortfuse, under  # noqa: F401 (fixtures)

MOUNTS = ["passthrough", "serve-passthrough", "serve-mem"]


class Mounted:
    """A mount point served one way, with the spec `run -m` takes."""

    def __init__(self, shortfuse: Path, base: Path, kind: str):
        self.mp = str(base / "mnt")
        self.daemon = None
        self.src = None
        if kind == "passthrough":
            self.src = base / "src"
            self.src.mkdir()
            self.spec = f"{self.mp}=passthrough:{self.src}"
        elif kind == "serve-passthrough":
            self.src = base / "src"
            self.src.mkdir()
            Path(self.mp).mkdir()
            self.daemon = Daemon(shortfuse, base, ["passthrough", str(self.src), self.mp], Path(self.mp))
            self.spec = self.mp
        else:
            Path(self.mp).mkdir()
            self.daemon = Daemon(shortfuse, base, ["mem", self.mp], Path(self.mp))
            self.spec = self.mp

    def stop(self):
        if self.daemon is not None:
            self.daemon.stop()


@pytest.fixture(params=MOUNTS)
def mounted(request, shortfuse, scratch):
    m = Mounted(shortfuse, scratch, request.param)
    m.kind = request.param
    yield m
    m.stop()


def native_and_shim(shortfuse, scratch, mounted, argv_for, **kw):
    """argv_for(dir) natively in a fresh directory and under the shim on
    the mount: (native output, shim output), mount paths as ROOT."""
    native = scratch / "native"
    native.mkdir()
    n = run(argv_for(str(native)), **kw)
    s = under(shortfuse, [mounted.spec], argv_for(mounted.mp), **kw)
    assert n.returncode == 0, output(n, str(native))
    assert s.returncode == n.returncode, output(s, mounted.mp)
    return output(n, str(native)), output(s, mounted.mp)


# ------------------------------------------------------------------ FIFOs

FIFO_SCRIPT = r"""
cd "$1"
mkfifo ff
seq 3 > ff &
cat ff
wait
ls -l ff | cut -c1
# A writer and a reader that are both external programs, the reader first.
cat ff > got &
sleep 0.2
echo hello > ff
wait
cat got
python3 - <<'EOF'
import errno, os, stat
print("fifo", stat.S_ISFIFO(os.stat("ff").st_mode))
try:
    os.open("ff", os.O_WRONLY | os.O_NONBLOCK)
    print("nonblocking writer opened")
except OSError as e:
    print("nonblocking writer:", errno.errorcode[e.errno])
r = os.open("ff", os.O_RDONLY | os.O_NONBLOCK)
w = os.open("ff", os.O_WRONLY | os.O_NONBLOCK)
os.write(w, b"through\n")
print(os.read(r, 100))
try:
    os.lseek(r, 0, os.SEEK_SET)
except OSError as e:
    print("lseek:", errno.errorcode[e.errno])
os.close(w)
print("eof", os.read(r, 100))
EOF
"""


def test_fifo_between_processes_as_on_ext4(shortfuse, scratch, mounted):
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: ["bash", "-c", FIFO_SCRIPT, "fifo", d])
    assert "1\n2\n3\n" in n and "hello" in n and "ENXIO" in n
    assert s == n


def test_fifo_in_process_mem_between_forked_processes(shortfuse, scratch):
    script = r"""
import errno, os, sys
p = os.path.join(sys.argv[1], "ff")
os.mkfifo(p)
try:
    os.open(p, os.O_WRONLY | os.O_NONBLOCK)
except OSError as e:
    print("nonblocking writer:", errno.errorcode[e.errno])
pid = os.fork()
if pid == 0:
    with open(p, "w") as w:
        w.write("from the child\n")
    os._exit(0)
with open(p) as r:
    print(r.read(), end="")
os.waitpid(pid, 0)
"""
    native = scratch / "native"
    native.mkdir()
    n = run([sys.executable, "-c", script, str(native)])
    mp = str(scratch / "mnt")
    s = under(shortfuse, [f"{mp}=mem"], [sys.executable, "-c", script, mp])
    assert n.returncode == 0 and s.returncode == 0, output(s, mp)
    assert output(s, mp) == output(n, str(native)) == "nonblocking writer: ENXIO\nfrom the child\n"


def test_a_reader_waiting_on_a_fifo_is_killed_by_sigterm(shortfuse, scratch, mounted):
    """The open waits for a writer with the program's signals deliverable,
    and in the program: a daemon keeps serving (and stops when told)."""
    script = r"""
cd "$1"
mkfifo ff
cat ff &
pid=$!
sleep 0.5
kill -TERM $pid
wait $pid
echo "status $?"
echo later > f && cat f
"""
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: ["bash", "-c", script, "sig", d])
    assert n == "status 143\nlater\n"
    assert s == n
    if mounted.daemon is not None:
        # No daemon thread waits in the FIFO's open: SIGTERM stops it.
        mounted.daemon.proc.send_signal(signal.SIGTERM)
        try:
            mounted.daemon.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("shortfuse serve did not stop on SIGTERM")


# ------------------------------------- vfork and posix_spawn children

SUBPROCESS = r"""
import os, subprocess, sys
root = sys.argv[1]
os.makedirs(os.path.join(root, "sub"))
with open(os.path.join(root, "sub", "prog.sh"), "w") as f:
    f.write("#!/bin/sh\necho prog in $(pwd)\n")
os.chmod(os.path.join(root, "sub", "prog.sh"), 0o755)
sub = os.path.join(root, "sub")
print(subprocess.run(["pwd"], cwd=sub, capture_output=True, text=True).stdout, end="")
print(subprocess.run(["sh", "-c", "echo made > f; cat f; ls"], cwd=sub, capture_output=True, text=True).stdout, end="")
print(subprocess.run(["./prog.sh"], cwd=sub, capture_output=True, text=True).stdout, end="")
print(subprocess.run(["ls", "sub"], cwd=root, capture_output=True, text=True).stdout, end="")
try:
    subprocess.run(["pwd"], cwd=os.path.join(root, "missing"))
except FileNotFoundError as e:
    print("missing:", e.errno)
print(os.path.exists(os.path.join(sub, "f")))
"""


def test_subprocess_with_cwd_on_the_mount(shortfuse, scratch, mounted):
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: [sys.executable, "-c", SUBPROCESS, d])
    assert "ROOT/sub\nmade\n" in n and "prog in ROOT/sub" in n
    assert s == n


WHEEL = r"""
import sys, zipfile
with zipfile.ZipFile(sys.argv[1] + "/tinypkg-1.0-py3-none-any.whl", "w") as z:
    z.writestr("tinypkg/__init__.py", "VALUE = 42\n")
    z.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
    z.writestr(
        "tinypkg-1.0.dist-info/WHEEL",
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    )
    z.writestr("tinypkg-1.0.dist-info/RECORD", "")
"""

VENV = r"""
set -e
cd "$1"
python3 -m venv v
python3 -c "$2" .
v/bin/pip install --no-index -q ./tinypkg-1.0-py3-none-any.whl
v/bin/python -c "import sys, tinypkg; print(tinypkg.VALUE, sys.prefix)"
v/bin/pip list --no-index 2>/dev/null | grep tinypkg
"""


def test_python_venv_and_pip_install_on_the_mount(shortfuse, scratch, mounted):
    """venv runs ensurepip in a subprocess; pip's script names the venv's
    python on the mount in its `#!` line."""
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: ["bash", "-c", VENV, "venv", d, WHEEL])
    assert "42 ROOT/v\n" in n and "tinypkg" in n
    assert s == n


SPAWN_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
extern char **environ;
int main(int argc, char **argv) {
    /* argv[1]: the directory to spawn in; argv[2]: "open" also sends the
       child's output to a file there, opened by a file action ("openabs":
       by its absolute path). */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, argv[1]);
    char out[4096];
    snprintf(out, sizeof out, "%s/out", argv[1]);
    if (strcmp(argv[2], "open") == 0 || strcmp(argv[2], "openabs") == 0)
        posix_spawn_file_actions_addopen(&fa, 1, argv[2][4] ? out : "out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char *args[] = {"sh", "-c", "pwd; echo spawned; ls", NULL};
    pid_t pid;
    int r = posix_spawn(&pid, "/bin/sh", &fa, NULL, args, environ);
    if (r != 0) { printf("posix_spawn: %s\n", strerror(r)); return 1; }
    int st;
    waitpid(pid, &st, 0);
    printf("status %d\n", WEXITSTATUS(st));
    return 0;
}
"""


def compile_c(tmp_path_factory, name: str, source: str):
    """Builds the C program `source` as `name` in a fresh directory."""
    d = tmp_path_factory.mktemp(name)
    (d / f"{name}.c").write_text(source)
    p = subprocess.run(["gcc", "-O1", "-o", str(d / name), str(d / f"{name}.c")], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return d / name


@pytest.fixture(scope="module")
def spawn_prog(tmp_path_factory):
    return compile_c(tmp_path_factory, "spawn", SPAWN_C)


def spawn_in_sub(shortfuse, scratch, mounted, spawn_prog, action):
    script = f'cd "$1" && mkdir sub && echo x > sub/file && {spawn_prog} "$1/sub" {action} && cat sub/out 2>/dev/null; true'
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: ["bash", "-c", script, "spawn", d])
    assert "ROOT/sub\nspawned\nfile\n" in n
    assert s == n


def test_posix_spawn_changes_directory_on_the_mount(shortfuse, scratch, mounted, spawn_prog):
    spawn_in_sub(shortfuse, scratch, mounted, spawn_prog, "chdir")


@pytest.mark.parametrize("kind", ["passthrough", "serve-passthrough"])
@pytest.mark.parametrize("action", ["open", "openabs"])
def test_posix_spawn_opens_a_file_of_a_passthrough_mount(shortfuse, scratch, spawn_prog, kind, action):
    """addopen of a mount path, relative or absolute: the child gets the
    backing file (a daemon over passthrough tells its source). glibc's
    `syscall` there sits on the last byte of a cache line: it is rewritten
    while the process has one thread. (A mem daemon's file cannot be
    opened by a spawn child, which may not touch the parent's tables.)"""
    m = Mounted(shortfuse, scratch, kind)
    try:
        spawn_in_sub(shortfuse, scratch, m, spawn_prog, action)
    finally:
        m.stop()


# ------------------------------------------------ the kernel's /proc links

PROC_LINKS = r"""
import os, sys
root = sys.argv[1]
os.chdir(root)
os.mkdir("d")
with open("f", "w") as f:
    f.write("x")
fd = os.open("f", os.O_RDONLY)
d = os.open("d", os.O_RDONLY | os.O_DIRECTORY)
print(os.readlink(f"/proc/self/fd/{fd}"))
print(os.readlink(f"/dev/fd/{d}"))
print(os.readlink("/proc/self/cwd"), os.readlink(f"/proc/{os.getpid()}/cwd"))
os.chdir("d")
print(os.readlink("/proc/thread-self/cwd"))
os.unlink("../f")
print(os.readlink(f"/proc/self/fd/{fd}"))
sys.stdout.flush()
os.system("readlink /proc/self/cwd")
"""


def test_proc_links_name_the_mount(shortfuse, scratch, mounted):
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: [sys.executable, "-c", PROC_LINKS, d])
    assert n == "ROOT/f\nROOT/d\nROOT ROOT\nROOT/d\nROOT/f (deleted)\nROOT/d\n"
    assert s == n


# ------------------------------------------------- one identity per file

IDENTITY = r"""
cd "$1"
echo hello > f
timeout 20 cat f >> f
echo "cat status $?"
wc -c < f
exec 3>>f
python3 -c 'import os; a = os.fstat(3); b = os.stat("f"); print(a.st_dev == b.st_dev, a.st_ino == b.st_ino)'
readlink /proc/self/fd/3 | sed "s|^$1|ROOT|"
"""


def test_a_file_has_one_identity_however_it_was_opened(shortfuse, scratch, mounted):
    """A descriptor a shell opened and passed across exec, and the same
    file opened by name in the new program: cat refuses to copy a file
    onto itself (it ran away, filling the disk)."""
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: ["bash", "-c", IDENTITY, "identity", d])
    assert "input file is output file" in n and "cat status 1\n6\nTrue True\nROOT/f\n" in n
    assert s == n


# ------------------------------------------------ copies in one call

COPIES = r"""
import os, sys
os.chdir(sys.argv[1])
data = bytes(range(256)) * 4096  # 1 MiB
with open("src", "wb") as f:
    f.write(data)
s = os.open("src", os.O_RDONLY)
d = os.open("sent", os.O_WRONLY | os.O_CREAT, 0o644)
print("sendfile", os.sendfile(d, s, None, len(data)), os.lseek(s, 0, os.SEEK_CUR))
c = os.open("copied", os.O_WRONLY | os.O_CREAT, 0o644)
print("copy_file_range", os.copy_file_range(s, c, len(data), 0, 0))
print("at the end", os.sendfile(d, s, None, 100))
for name in ("sent", "copied"):
    with open(name, "rb") as f:
        print(name, f.read() == data)
r, w = os.pipe()
os.write(w, b"short")
print("from a pipe", os.splice(r, d, len(data)))
"""


def test_sendfile_and_copy_file_range_move_a_mebibyte_in_one_call(shortfuse, scratch, mounted):
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: [sys.executable, "-c", COPIES, d])
    assert "sendfile 1048576 1048576\ncopy_file_range 1048576\n" in n
    assert s == n


# ------------------------------------------------------------- O_TMPFILE

TMPFILE_C = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static int entries(void) {
    int n = 0;
    DIR *d = opendir(".");
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}
int main(int argc, char **argv) {
    if (chdir(argv[1])) return 2;
    int fd = open(".", O_TMPFILE | O_RDWR, 0600);
    if (fd < 0) { printf("open: %s\n", strerror(errno)); return 1; }
    char buf[16] = {0};
    ssize_t w = write(fd, "unnamed\n", 8);
    printf("wrote %zd, read %zd ", w, pread(fd, buf, sizeof buf, 0));
    printf("%s", buf);
    printf("entries %d\n", entries());
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    int r = linkat(AT_FDCWD, p, AT_FDCWD, "named", AT_SYMLINK_FOLLOW);
    printf("linkat %s, entries %d\n", r ? strerror(errno) : "ok", entries());
    r = open("named", O_TMPFILE | O_RDWR, 0600);
    printf("in a file: %s\n", r < 0 ? strerror(errno) : "opened");
    return 0;
}
"""


@pytest.fixture(scope="module")
def tmpfile_prog(tmp_path_factory):
    return compile_c(tmp_path_factory, "tmpfile", TMPFILE_C)


def test_o_tmpfile(shortfuse, scratch, mounted, tmpfile_prog):
    """An unnamed file on every mount; on passthrough (in process or a
    daemon's) the kernel's own, which linkat names in the mount. (A file
    system without TMPFILE in the trait gets a file removed at once, which
    keeps no name to link again.)"""
    n, s = native_and_shim(shortfuse, scratch, mounted, lambda d: [str(tmpfile_prog), d])
    assert n == "wrote 8, read 8 unnamed\nentries 0\nlinkat ok, entries 1\nin a file: Not a directory\n"
    if mounted.kind in ("passthrough", "serve-passthrough"):
        assert s == n
    else:
        assert s == n.replace("linkat ok, entries 1\nin a file: Not a directory", "linkat No such file or directory, entries 0\nin a file: No such file or directory")
