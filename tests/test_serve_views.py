"""What a program needs the kernel to see of a mount, on in-process
passthrough and on `serve` daemons (passthrough and mem) reached through
the rings: shared memory maps coherent among the programs of a daemon
(sqlite3's WAL index, Python's mmap), inotify watches, libraries the
dynamic loader finds through `$ORIGIN` and LD_LIBRARY_PATH before the shim
runs. Each is compared with the same program on a real directory.
"""

from __future__ import annotations

import os
import socket
import sys

import pytest

from test_run import output, run, scratch, shortfuse, under  # noqa: F401 (fixtures)
from test_run_hazards import mount  # noqa: F401 (fixture)

SHARED_MAPS = r"""
import mmap, os, subprocess, sys
root = sys.argv[1]
p = root + "/m"
with open(p, "wb") as f:
    f.write(b"a" * 8192)
fd = os.open(p, os.O_RDWR)
try:
    m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
except OSError as e:
    print("shared map", e.errno)
    sys.exit(0)
m[0:6] = b"PARENT"
# Another program (a new image: its own connection to a daemon) reads
# what the map holds, maps the file itself and writes through its map and
# through write().
child = '''
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
print("child reads", os.pread(fd, 6, 0))
m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
print("child maps", bytes(m[0:6]))
m[100:105] = b"CHILD"
os.pwrite(fd, b"WRITE", 200)
print("child map sees its write", bytes(m[200:205]))
'''
subprocess.run([sys.executable, "-c", child, p], check=True)
print("parent map sees", bytes(m[100:105]), bytes(m[200:205]))
print("parent reads", os.pread(fd, 5, 100))
ro = os.open(p, os.O_RDONLY)
try:
    mmap.mmap(ro, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
except OSError as e:
    print("writable map of a read-only open", e.errno)
r = mmap.mmap(ro, 8192, mmap.MAP_SHARED, mmap.PROT_READ)
print("read-only map", bytes(r[0:6]))
m.close()
r.close()
print("size", os.path.getsize(p))
"""


def native_and_shim(shortfuse, scratch, spec, mp, argv_for):
    native = scratch / "native"
    native.mkdir()
    n = run(argv_for(str(native)))
    assert n.returncode == 0, output(n, str(native))
    s = under(shortfuse, [spec], argv_for(str(mp)))
    assert s.returncode == 0, output(s, str(mp))
    return output(n, str(native)), output(s, str(mp))


def python_both(shortfuse, scratch, mount, code):
    """Runs Python `code` (given the directory) natively and on the mount:
    (native output, shim output, the mount's source or None)."""
    spec, mp, src = mount
    script = scratch / "prog.py"
    script.write_text(code)
    n, s = native_and_shim(shortfuse, scratch, spec, mp, lambda root: [sys.executable, str(script), root])
    return n, s, src


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough", "serve-mem"], indirect=True)
def test_shared_maps_are_coherent_among_the_programs_of_a_mount(shortfuse, scratch, mount):
    # A daemon's mem file has no backing file: mem moves a mapped file into
    # a memfd, which the daemon lends as passthrough lends its backing file
    # (it failed with ENODEV).
    n, s, _ = python_both(shortfuse, scratch, mount, SHARED_MAPS)
    assert "parent map sees b'CHILD' b'WRITE'" in n
    assert s == n


WAL = """PRAGMA journal_mode=wal;
CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);
BEGIN;
""" + "\n".join(f"INSERT INTO t(b) VALUES('row {i}');" for i in range(2000)) + """
COMMIT;
PRAGMA integrity_check;
"""


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough", "serve-mem"], indirect=True)
def test_sqlite3_wal_with_a_reader_in_another_program(shortfuse, scratch, mount):
    # The WAL index (db-shm) is mapped MAP_SHARED by every connection: the
    # reader, another process, must see the writer's commits through it.
    spec, mp, src = mount
    sql = scratch / "w.sql"
    sql.write_text(WAL)
    script = (
        'sqlite3 "$1/db" < "$2" && sqlite3 "$1/db" "PRAGMA journal_mode; SELECT count(*), max(b) FROM t;" '
        '&& ls "$1" | sort'
    )
    n, s = native_and_shim(shortfuse, scratch, spec, mp, lambda root: ["sh", "-c", script, "sh", root, str(sql)])
    assert "wal\nok\nwal\n2000|row 999\n" in n
    assert s == n


INOTIFY = r"""
import ctypes, os, select, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
IN_MODIFY, IN_CREATE, IN_DELETE = 0x2, 0x100, 0x200
wd = libc.inotify_add_watch(fd, d.encode(), IN_CREATE | IN_MODIFY | IN_DELETE)
if wd < 0:
    print("watch errno", ctypes.get_errno())
    sys.exit(0)
with open(d + "/new", "w") as f:
    f.write("x")
os.unlink(d + "/new")
events = []
while len(events) < 3 and select.select([fd], [], [], 10)[0]:
    buf = os.read(fd, 4096)
    i = 0
    while i < len(buf):
        _, mask, _, n = struct.unpack_from("iIII", buf, i)
        events.append((hex(mask), buf[i + 16 : i + 16 + n].rstrip(b"\0").decode()))
        i += 16 + n
print(events)
"""


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough", "serve-mem"], indirect=True)
def test_inotify_watches_a_directory_of_the_mount(shortfuse, scratch, mount):
    # A daemon's mem directory has no source: the daemon replays the
    # program's changes on a kernel mirror of it (it said ENOSYS).
    n, s, _ = python_both(shortfuse, scratch, mount, INOTIFY)
    assert n == "[('0x100', 'new'), ('0x2', 'new'), ('0x200', 'new')]\n"
    assert s == n


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough"], indirect=True)
def test_the_dynamic_loader_finds_libraries_in_the_mount(shortfuse, scratch, mount):
    # The loader maps a program's libraries before the shim runs: through
    # `$ORIGIN`, `LD_LIBRARY_PATH=.` and LD_LIBRARY_PATH naming the mount.
    spec, mp, src = mount
    (scratch / "foo.c").write_text("int foo(void) { return 42; }\n")
    (scratch / "prog.c").write_text('#include <stdio.h>\nint foo(void);\nint main(void) { printf("%d\\n", foo()); }\n')
    for args in (
        ["-shared", "-fPIC", "-o", f"{src}/libfoo.so", str(scratch / "foo.c")],
        ["-o", f"{src}/prog", str(scratch / "prog.c"), f"-L{src}", "-lfoo"],
        ["-o", f"{src}/progo", str(scratch / "prog.c"), f"-L{src}", "-lfoo", "-Wl,-rpath,$ORIGIN"],
    ):
        c = run(["gcc", *args])
        assert c.returncode == 0, c.stderr.decode()
    script = (
        f'cd "{mp}" && ./progo && LD_LIBRARY_PATH=. ./prog && LD_LIBRARY_PATH=/nowhere:"{mp}" ./prog '
        f"&& LD_LIBRARY_PATH=/nowhere:{mp} sh -c 'echo $LD_LIBRARY_PATH ${{SHORTFUSE_LD_LIBRARY_PATH-unset}}'"
    )
    p = under(shortfuse, [spec], ["sh", "-c", script], cwd=scratch)
    # The program sees the value it set, not the loader's.
    assert output(p, str(mp)) == "42\n42\n42\n/nowhere:ROOT unset\n"
    assert p.returncode == 0


SOCKETS = r"""
import os, socket, stat, sys
d = sys.argv[1]
os.chdir(d)
for name in ("rel.sock", d + "/abs.sock"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(name)
    except OSError as e:
        print("bind", e.errno)
        continue
    s.listen(1)
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(name)
    a, _ = s.accept()
    c.sendall(b"hi")
    print("bound, connected", a.recv(2), stat.S_ISSOCK(os.stat(name).st_mode))
os.mknod("nod.sock", stat.S_IFSOCK | 0o644)
print("mknod", stat.S_ISSOCK(os.stat("nod.sock").st_mode), sorted(os.listdir(".")))
"""

BIND_C = r"""
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <errno.h>
int main(int argc, char **argv) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, argv[1]);
    int s = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (bind(s, (struct sockaddr *)&a, sizeof a)) { printf("bind %d\n", errno); return 0; }
    int c = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) || write(c, "ok", 2) != 2) { printf("connect %d\n", errno); return 1; }
    char buf[3] = {0};
    printf("datagram %zd %s\n", read(s, buf, 2), buf);
    return 0;
}
"""


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough", "serve-mem"], indirect=True)
def test_unix_sockets_bound_in_the_mount(shortfuse, scratch, mount):
    spec, mp, src = mount
    exe = scratch / "bind"
    (scratch / "bind.c").write_text(BIND_C)
    c = run(["gcc", "-O1", "-o", str(exe), str(scratch / "bind.c")])
    assert c.returncode == 0, c.stderr.decode()
    if src is None:
        # The mount point is a real directory too: nothing may land there.
        mp.mkdir()
    script = scratch / "sock.py"
    script.write_text(SOCKETS)
    start = scratch / "start"
    start.mkdir()
    n, s = native_and_shim(shortfuse, scratch, spec, mp, lambda root: [sys.executable, str(script), root])
    assert n == "bound, connected b'hi' True\n" * 2 + "mknod True ['abs.sock', 'nod.sock', 'rel.sock']\n"
    c = under(shortfuse, [spec], [str(exe), f"{mp}/c.sock"], cwd=start)
    assert c.returncode == 0, output(c, str(mp))
    assert os.listdir(start) == []
    if src is None:
        # No kernel directory holds a socket of a mem mount: refused.
        assert s == "bind 95\nbind 95\nmknod True ['nod.sock']\n"
        assert c.stdout == b"bind 95\n"
        assert os.listdir(mp) == []
    else:
        assert s == n
        assert c.stdout == b"datagram 2 ok\n"
        # In the source: a program without the shim connects there.
        assert sorted(os.listdir(src)) == ["abs.sock", "c.sock", "nod.sock", "rel.sock"]
        x = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with pytest.raises(ConnectionRefusedError):
            x.connect(str(src / "abs.sock"))


DEVICES = r"""
import os, stat, sys
d = sys.argv[1]
for kind, name, mode in (("chr", "null", stat.S_IFCHR), ("blk", "blk", stat.S_IFBLK)):
    os.mknod(d + "/" + name, mode | 0o666, os.makedev(1, 3))
    st = os.stat(d + "/" + name)
    print(kind, oct(stat.S_IFMT(st.st_mode)), os.major(st.st_rdev), os.minor(st.st_rdev))
with open(d + "/null", "w") as f:
    print("write to null", f.write("xyz"))
with open(d + "/null") as f:
    print("read null", repr(f.read()))
"""


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough", "mem", "serve-mem"], indirect=True)
def test_device_nodes_made_and_opened_in_the_mount(shortfuse, scratch, mount):
    # As root on ext4: mknod of a character or block device, then an open
    # of the character device reaches the device (here /dev/null's).
    n, s, _ = python_both(shortfuse, scratch, mount, DEVICES)
    assert n == "chr 0o20000 1 3\nblk 0o60000 1 3\nwrite to null 3\nread null ''\n"
    assert s == n
