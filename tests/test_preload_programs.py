"""The programs people really run, under `shortfuse run` (preload part 2),
each compared with the same run on native ext4 where the outcome is
deterministic: descriptors across fork and exec, git, sqlite3, gcc + make,
python3 imports, fio with verification, a pipeline of appending processes,
a library loaded with dlopen() after start (its system calls reach the shim
through Syscall User Dispatch only), shared and private maps, locks between
processes, threads.

Multi-process programs run on passthrough (its regular files are
kernel-backed descriptors: offsets, locks and maps are the kernel's);
single-process ones run on mem too. Both kinds run over the rings as well
(`ring`: a `shortfuse serve mem` daemon that every process of the program
reaches, with open file descriptions and locks shared through it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from test_ring import Daemon
from test_run import output, run, scratch, shortfuse, tree, under  # noqa: F401 (fixtures)

# Daemons started by the running test (see `both`), stopped after it.
DAEMONS: list[Daemon] = []


@pytest.fixture(autouse=True)
def stop_daemons():
    yield
    while DAEMONS:
        DAEMONS.pop().stop()


def both(shortfuse: Path, scratch: Path, argv_for, fs: str = "passthrough", env=None):
    """Runs argv_for(root) natively on a real directory and under `shortfuse
    run` with root a mount of `fs` (`ring`: a mem daemon's); returns
    (native, shim, native dir, mount point, source dir or None)."""
    native = scratch / "native"
    native.mkdir()
    mp = str(scratch / "mnt")
    if fs == "passthrough":
        src = scratch / "src"
        src.mkdir()
        spec = f"{mp}={fs}:{src}"
    elif fs == "ring":
        src = None
        DAEMONS.append(Daemon(shortfuse, scratch, ["mem", mp], Path(mp)))
        spec = mp
    else:
        src = None
        spec = f"{mp}=mem"
    kw = {"env": {**os.environ, **(env or {})}}
    n = run(argv_for(str(native)), **kw)
    s = under(shortfuse, [spec], argv_for(mp), **kw)
    assert n.returncode == 0, output(n, str(native))
    return n, s, native, mp, src


def same(shortfuse, scratch, argv_for, fs="passthrough", env=None):
    n, s, native, mp, src = both(shortfuse, scratch, argv_for, fs, env)
    assert output(s, mp) == output(n, str(native))
    assert s.returncode == n.returncode
    if src is not None:
        assert tree(src) == tree(native)
    return output(s, mp)


FORK_EXEC = r"""
set -e
cd "$1"
{ echo a; /bin/echo b; echo c; sh -c 'echo d'; } > f
cat f
( echo 1; sh -c "echo 2"; echo 3 ) >> f
wc -l < f
exec 5> k
echo x >&5; sh -c 'echo y >&5'; echo z >&5
exec 5>&-
cat k
python3 - <<'EOF'
import os, sys
# Offsets shared between parent and child (fork), and across exec.
fd = os.open("o", os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
os.write(fd, b"ab")
pid = os.fork()
if pid == 0:
    os.write(fd, b"cd")
    os._exit(0)
os.waitpid(pid, 0)
os.write(fd, b"ef")
subprocess_code = "import os,sys; os.write(int(sys.argv[1]), b'gh'); print(os.lseek(int(sys.argv[1]), 0, 1))"
import subprocess
subprocess.run([sys.executable, "-c", subprocess_code, str(fd)], pass_fds=[fd], check=True)
os.write(fd, b"ij")
print(os.lseek(fd, 0, os.SEEK_CUR), open("o").read())
# O_CLOEXEC descriptors close at exec; the others stay.
c = os.open("f", os.O_RDONLY | os.O_CLOEXEC)
k = os.open("f", os.O_RDONLY)
os.set_inheritable(k, True)
probe = "import os,sys\nfor fd in map(int, sys.argv[1:]):\n try:\n  os.fstat(fd); print(fd > 0, 'open')\n except OSError as e:\n  print(fd > 0, 'closed', e.errno)"
r = subprocess.run([sys.executable, "-c", probe, str(c), str(k)], close_fds=False, capture_output=True, text=True)
print(r.stdout, end="")
# A child reads on from where the parent stopped.
os.lseek(k, 2, 0)
r = subprocess.run(["head", "-c", "4"], stdin=k, capture_output=True, text=True)
print(repr(r.stdout), os.lseek(k, 0, 1))
EOF
"""


@pytest.mark.parametrize("fs", ["passthrough", "ring"])
def test_descriptors_across_fork_and_exec(shortfuse, scratch, fs):
    script = scratch / "s.sh"
    script.write_text(FORK_EXEC)
    out = same(shortfuse, scratch, lambda root: ["bash", str(script), root], fs=fs)
    assert "10 abcdefghij" in out


PIPELINE = r"""
cd "$1"
{
  for j in 1 2 3; do
    ( for i in $(seq 1 200); do echo "p$j $i"; done ) &
  done
  seq 1 300 | sed 's/^/s /' &
  for i in $(seq 1 50); do /bin/echo "e $i"; done &
  wait
} >> log
wc -l < log
sort log | md5sum
for p in p1 p2 p3 s e; do grep "^$p " log | cut -d' ' -f2 | sort -n -c && echo "$p in order"; done
"""


@pytest.mark.parametrize("fs", ["passthrough", "ring"])
def test_pipeline_of_processes_appending_through_inherited_descriptors(shortfuse, scratch, fs):
    script = scratch / "p.sh"
    script.write_text(PIPELINE)
    n, s, native, mp, _ = both(shortfuse, scratch, lambda root: ["bash", str(script), root], fs=fs)
    # The interleaving differs from run to run; the lines, their count and
    # each writer's order do not.
    assert output(s, mp) == output(n, str(native))
    assert output(s, mp).startswith("950\n")


GIT = r"""
set -e
cd "$1"
git init -q -b main repo
cd repo
git config user.email t@example.com
git config user.name tester
mkdir -p src docs
for i in $(seq 1 30); do echo "line $i" > src/f$i.c; done
echo readme > docs/README
git add .
git commit -q -m first
echo change >> src/f1.c
rm src/f2.c
echo new > src/new.c
git status --short
git add -A
git commit -q -m second
git mv docs/README docs/README.md
git commit -q -m rename
git log --format='%H %s' --stat
git gc -q
git count-objects -v | grep -E '^(count|in-pack|packs|garbage)'
git fsck --full 2>&1
git status --short
git diff HEAD~2 --stat
git checkout -q HEAD~1
cat src/f1.c | tail -1
git checkout -q main
"""


@pytest.mark.parametrize("fs", ["passthrough", "ring"])
def test_git_in_a_repository_on_the_mount(shortfuse, scratch, fs):
    script = scratch / "g.sh"
    script.write_text(GIT)
    # Fixed dates: commit hashes then match the native run's.
    env = {
        "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    n, s, native, mp, src = both(shortfuse, scratch, lambda root: ["bash", str(script), root], fs=fs, env=env)
    assert output(s, mp) == output(n, str(native))
    assert s.returncode == 0
    if src is not None:
        # The same objects and refs on disk (the index records inode numbers and times, which differ).
        strip = lambda t: {k: v for k, v in t.items() if not k.endswith("repo/.git/index")}
        assert strip(tree(src)) == strip(tree(native))


SQL = "\n".join(
    ["CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);", "CREATE INDEX tb ON t(b);"]
    + [
        "BEGIN;\n"
        + "\n".join(f"INSERT INTO t(b, c) VALUES('row {k * 1000 + i}', {i} * 0.5);" for i in range(1000))
        + "\nCOMMIT;"
        for k in range(10)
    ]
    + [
        "UPDATE t SET c = c + 1 WHERE a % 7 = 0;",
        "DELETE FROM t WHERE a % 11 = 0;",
        "PRAGMA integrity_check;",
        "SELECT count(*), sum(a), round(sum(c), 1) FROM t;",
        "VACUUM;",
        "PRAGMA integrity_check;",
    ]
)


# WAL needs its -shm file mapped MAP_SHARED, which mem in process (no
# backing file) refuses with ENODEV; a mem daemon lends a memfd.
@pytest.mark.parametrize(
    "fs,journal",
    [("passthrough", "delete"), ("passthrough", "wal"), ("mem", "delete"), ("ring", "delete"), ("ring", "wal")],
)
def test_sqlite3_ten_thousand_inserts(shortfuse, scratch, fs, journal):
    sql = scratch / "t.sql"
    sql.write_text(f"PRAGMA journal_mode={journal};\n" + SQL)
    out = same(shortfuse, scratch, lambda root: ["sh", "-c", f'sqlite3 "$1/db" < "$2"', "sh", root, str(sql)], fs=fs)
    assert out.count("ok\n") == 2 and "\n9091|" in out, out


MAKE_PROJECT = r"""
set -e
cd "$1"
mkdir -p proj/src proj/include
cd proj
cat > include/calc.h <<'EOF'
int add(int a, int b);
int mul(int a, int b);
EOF
cat > src/add.c <<'EOF'
#include "calc.h"
int add(int a, int b) { return a + b; }
EOF
cat > src/mul.c <<'EOF'
#include "calc.h"
int mul(int a, int b) { int r = 0; for (int i = 0; i < b; i++) r = add(r, a); return r; }
EOF
cat > src/main.c <<'EOF'
#include <stdio.h>
#include "calc.h"
int main(int argc, char **argv) { printf("%d %d %s\n", add(2, 3), mul(6, 7), argc > 1 ? argv[1] : "-"); return 0; }
EOF
cat > Makefile <<'EOF'
CFLAGS = -O1 -Iinclude
OBJ = build/add.o build/mul.o build/main.o
all: bin/calc lib/libcalc.so
build/%.o: src/%.c include/calc.h
	@mkdir -p build
	$(CC) $(CFLAGS) -fPIC -c -o $@ $<
bin/calc: $(OBJ)
	@mkdir -p bin
	$(CC) -o $@ $^
lib/libcalc.so: build/add.o build/mul.o
	@mkdir -p lib
	$(CC) -shared -o $@ $^
clean:
	rm -rf build bin lib
EOF
make -s -j2 CC=gcc
./bin/calc here
"$1/proj/bin/calc" there
make -s CC=gcc && echo up-to-date
touch src/mul.c && make CC=gcc | grep -c mul.o
cat > use.c <<'EOF'
#include <stdio.h>
int mul(int, int);
int main(void) { printf("%d\n", mul(3, 4)); return 0; }
EOF
gcc -o bin/use use.c -Llib -lcalc -Wl,-rpath,'$ORIGIN/../lib'
./bin/use
make -s clean && ls
"""


def test_gcc_and_make_build_and_run_a_project_on_the_mount(shortfuse, scratch):
    script = scratch / "m.sh"
    script.write_text(MAKE_PROJECT)
    n, s, native, mp, src = both(shortfuse, scratch, lambda root: ["bash", str(script), root])
    assert output(s, mp) == output(n, str(native))
    assert "5 42 here\n5 42 there\n" in output(s, mp)
    assert "12\n" in output(s, mp)


PY_IMPORT = r"""
import importlib, os, sys
root = sys.argv[1]
os.makedirs(root + "/lib/pkg/sub")
open(root + "/lib/pkg/__init__.py", "w").write("from .sub.mod import f\nX = 40\n")
open(root + "/lib/pkg/sub/__init__.py", "w").write("")
open(root + "/lib/pkg/sub/mod.py", "w").write("def f(x):\n    return x + 2\n")
open(root + "/lib/data.json", "w").write('{"k": [1, 2, 3]}')
sys.path.insert(0, root + "/lib")
import pkg
print(pkg.f(pkg.X), pkg.__file__.replace(root, "ROOT"))
import json
print(json.load(open(root + "/lib/data.json")))
open(root + "/lib/pkg/sub/mod.py", "w").write("def f(x):\n    return x * 2\n")
importlib.invalidate_caches()
sys.modules.pop("pkg.sub.mod")
import pkg.sub.mod as m
print(m.f(21))
import zipfile
with zipfile.ZipFile(root + "/lib/z.zip", "w") as z:
    z.writestr("zmod.py", "V = 'from zip'\n")
sys.path.insert(0, root + "/lib/z.zip")
import zmod
print(zmod.V)
"""


@pytest.mark.parametrize("fs", ["passthrough", "mem", "ring"])
def test_python3_imports_a_package_from_the_mount(shortfuse, scratch, fs):
    script = scratch / "i.py"
    script.write_text(PY_IMPORT)
    n, s, native, mp, _ = both(shortfuse, scratch, lambda root: [sys.executable, str(script), root], fs=fs)
    assert output(s, mp) == output(n, str(native))
    assert output(s, mp).startswith("42 ROOT/lib/pkg/__init__.py\n")


def test_fio_verify_crc32c_two_jobs(shortfuse, scratch):
    src = scratch / "src"
    src.mkdir()
    mp = str(scratch / "mnt")
    argv = [
        "fio", "--name=v", f"--directory={mp}", "--size=4m", "--bs=4k", "--rw=randwrite",
        "--verify=crc32c", "--verify_fatal=1", "--numjobs=2", "--ioengine=psync", "--do_verify=1",
        "--group_reporting", "--minimal", "--verify_state_save=0",
    ]
    s = under(shortfuse, [f"{mp}=passthrough:{src}"], argv)
    assert s.returncode == 0, output(s, mp)
    assert "verify" not in s.stderr.decode().lower(), output(s, mp)
    # fio's terse line: field 5 is the group's error count.
    assert s.stdout.decode().strip().split(";")[4] == "0", output(s, mp)
    assert sorted(p.name for p in src.iterdir()) == ["v.0.0", "v.1.0"]
    # Also with memory-mapped I/O on the mount.
    s = under(shortfuse, [f"{mp}=passthrough:{src}"], [a.replace("psync", "mmap") for a in argv])
    assert s.returncode == 0, output(s, mp)


DLOPEN_PROG = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    /* argv: library built outside, directory (the mount). */
    char lib[4096], path[4096], line[256];
    snprintf(lib, sizeof lib, "%s/libput.so", argv[2]);
    FILE *in = fopen(argv[1], "rb"), *out = fopen(lib, "wb");
    if (!in || !out) { perror("copy"); return 1; }
    size_t n; char buf[65536];
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    fclose(in); fclose(out);
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    long (*put)(const char *, const char *) = (long (*)(const char *, const char *))dlsym(h, "put");
    snprintf(path, sizeof path, "%s/written", argv[2]);
    for (int i = 0; i < 3; i++) {
        char text[64];
        snprintf(text, sizeof text, "through the library %d\n", i);
        long r = put(path, text);
        if (r < 0) { fprintf(stderr, "put: %ld\n", r); return 1; }
    }
    FILE *f = fopen(path, "r");
    if (!f) { perror("fopen"); return 1; }
    while (fgets(line, sizeof line, f)) fputs(line, stdout);
    fclose(f);
    return 0;
}
"""

DLOPEN_LIB = r"""
/* Raw `syscall` instructions of its own: loaded after start-up, they are
   not rewritten and reach the shim through Syscall User Dispatch. */
static long sys3(long nr, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
static long sys4(long nr, long a, long b, long c, long d) {
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
long put(const char *path, const char *text) {
    long len = 0;
    while (text[len]) len++;
    long fd = sys4(257, -100, (long)path, 02 | 0100 | 02000, 0644); /* openat(O_WRONLY|O_CREAT|O_APPEND) */
    if (fd < 0) return fd;
    long r = sys3(1, fd, (long)text, len);
    sys3(3, fd, 0, 0);
    return r;
}
"""


@pytest.mark.parametrize("fs", ["passthrough", "mem", "ring"])
def test_a_dlopened_library_writes_through_the_mount(shortfuse, scratch, fs):
    build = scratch / "build"
    build.mkdir()
    (build / "prog.c").write_text(DLOPEN_PROG)
    (build / "put.c").write_text(DLOPEN_LIB)
    for args in (
        ["cc", "-O1", "-o", str(build / "prog"), str(build / "prog.c"), "-ldl"],
        ["cc", "-O1", "-shared", "-fPIC", "-o", str(build / "libput.so"), str(build / "put.c")],
    ):
        c = run(args)
        assert c.returncode == 0, c.stderr.decode()
    out = same(shortfuse, scratch, lambda root: [str(build / "prog"), str(build / "libput.so"), root], fs=fs)
    assert out == "".join(f"through the library {i}\n" for i in range(3))


MMAP = r"""
import mmap, os, sys
root, fs = sys.argv[1], sys.argv[2]
p = root + "/m"
with open(p, "wb") as f:
    f.write(b"a" * 8192)
fd = os.open(p, os.O_RDWR)
priv = mmap.mmap(fd, 8192, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
priv[0:5] = b"PRIVA"
print("private sees", bytes(priv[:6]), "file keeps", open(p, "rb").read(6))
try:
    shared = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
except OSError as e:
    print("shared map", e.errno)
    sys.exit(0)
pid = os.fork()
if pid == 0:
    shared[100:106] = b"CHILD!"
    shared.flush()
    os._exit(0)
os.waitpid(pid, 0)
print("parent sees", bytes(shared[100:106]))
os.lseek(fd, 100, 0)
print("read sees", os.read(fd, 6))
shared.close()
os.close(fd)
print("size", os.path.getsize(p))
"""


@pytest.mark.parametrize("fs", ["passthrough", "mem", "ring"])
def test_mmap_private_everywhere_shared_where_there_is_a_kernel_file(shortfuse, scratch, fs):
    script = scratch / "mm.py"
    script.write_text(MMAP)
    n, s, native, mp, _ = both(shortfuse, scratch, lambda root: [sys.executable, str(script), root, fs], fs=fs)
    assert s.returncode == 0, output(s, mp)
    if fs != "mem":
        # A mem daemon (`ring`) lends the memfd it moved the file into.
        assert output(s, mp) == output(n, str(native))
    else:
        # mem in process has no file the kernel could write shared pages
        # back to.
        assert output(s, mp) == output(n, str(native)).split("parent sees")[0] + "shared map 19\n"


THREADS = r"""
import os, sys, threading
root = sys.argv[1]
os.makedirs(root + "/t")
def work(k):
    for i in range(40):
        p = f"{root}/t/{k}-{i}"
        with open(p, "w") as f:
            f.write(f"{k} {i}\n" * 50)
        with open(p) as f:
            assert f.read() == f"{k} {i}\n" * 50
        os.rename(p, p + ".done")
    with open(root + "/t/shared", "a") as f:
        for i in range(100):
            f.write(f"{k}:{i}\n")
threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
for t in threads: t.start()
for t in threads: t.join()
print(len(os.listdir(root + "/t")), sorted(open(root + "/t/shared").read().splitlines()) == sorted(f"{k}:{i}" for k in range(6) for i in range(100)))
if sys.argv[2] == "mem":
    # A forked child has its own copy of a mem mount: nothing to compare.
    sys.exit(0)
# A multi-threaded program that forks: the child uses the mount and an inherited descriptor.
fd = os.open(root + "/t/fork", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
stop = threading.Event()
def spin():
    while not stop.is_set():
        os.stat(root + "/t/shared")
bg = threading.Thread(target=spin); bg.start()
pids = []
for k in range(3):
    pid = os.fork()
    if pid == 0:
        os.write(fd, f"child {k} {len(open(root + '/t/shared').readlines())}\n".encode())
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
stop.set(); bg.join()
os.close(fd)
print(sorted(open(root + "/t/fork").read().splitlines()))
"""


@pytest.mark.parametrize("fs", ["passthrough", "mem", "ring"])
def test_threads_doing_io_at_once_and_a_threaded_program_that_forks(shortfuse, scratch, fs):
    script = scratch / "th.py"
    script.write_text(THREADS)
    n, s, native, mp, _ = both(shortfuse, scratch, lambda root: [sys.executable, str(script), root, fs], fs=fs)
    assert output(s, mp) == output(n, str(native))
    assert output(s, mp).startswith("241 True\n")


LOCKS = r"""
import fcntl, os, subprocess, sys
p = sys.argv[1] + "/lockfile"
open(p, "w").write("x" * 100)
fd = os.open(p, os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
fcntl.flock(fd, fcntl.LOCK_SH)
probe = r'''
import fcntl, os, sys, struct
fd = os.open(sys.argv[1], os.O_RDWR)
for name, f in (("posix", lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)),
                ("posix-other-range", lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 50)),
                ("flock-sh", lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                ("flock-ex", lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)),
                ("ofd", lambda: fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 5, 0)))):
    try:
        f(); print(name, "got")
    except OSError as e:
        print(name, "busy", e.errno)
'''
print(subprocess.run([sys.executable, "-c", probe, p], capture_output=True, text=True).stdout, end="")
# The same from a forked child (sharing our open file description).
pid = os.fork()
if pid == 0:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print("forked flock got", flush=True)
    except OSError as e:
        print("forked flock busy", e.errno, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("fs", ["passthrough", "ring"])
def test_locks_are_consistent_among_the_processes_of_the_tree(shortfuse, scratch, fs):
    script = scratch / "lk.py"
    script.write_text(LOCKS)
    same(shortfuse, scratch, lambda root: [sys.executable, str(script), root], fs=fs)


EXEC = r"""
import os, subprocess, sys
root = sys.argv[1]
data = open("/bin/echo", "rb").read()
with open(root + "/e", "wb") as f:
    f.write(data)
os.chmod(root + "/e", 0o755)
with open(root + "/s.sh", "w") as f:
    f.write("#!/bin/sh\necho script says $1\n")
os.chmod(root + "/s.sh", 0o755)
with open(root + "/noexec", "wb") as f:
    f.write(data)
def run(argv):
    # A vfork child (subprocess), which the shim serves on a small stack.
    r = subprocess.run(argv, capture_output=True, text=True)
    print(r.stdout, end="")
run([root + "/e", "spawned"])
run([root + "/s.sh", "x"])
os.chdir(root)
run(["./e", "relative"])
try:
    subprocess.run([root + "/noexec"])
except OSError as e:
    print("noexec", e.errno)
r, w = os.pipe()
pid = os.posix_spawn(root + "/e", ["e", "posix_spawn"], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
os.close(w)
print(os.read(r, 100).decode(), end="")
os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:
    os.execv(root + "/e", ["e", "from fork"])
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("fs", ["passthrough", "mem", "ring"])
def test_execve_of_programs_and_scripts_on_the_mount(shortfuse, scratch, fs):
    script = scratch / "ex.py"
    script.write_text(EXEC)
    out = same(shortfuse, scratch, lambda root: [sys.executable, str(script), root, fs], fs=fs)
    assert out == "spawned\nscript says x\nrelative\nnoexec 13\nposix_spawn\nfrom fork\n"


INOTIFY = r"""
import ctypes, os, struct, sys
root = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_NONBLOCK)
os.mkdir(root + "/w")
wd = libc.inotify_add_watch(fd, (root + "/w").encode(), 0x100 | 0x200 | 0x8)  # CREATE|DELETE|CLOSE_WRITE
print("watch", wd > 0 or ctypes.get_errno())
with open(root + "/w/a", "w") as f:
    f.write("x")
os.unlink(root + "/w/a")
buf = os.read(fd, 4096) if wd > 0 else b""
events = []
while buf:
    _, mask, _, n = struct.unpack_from("iIII", buf)
    events.append((hex(mask), buf[16:16 + n].rstrip(b"\0").decode()))
    buf = buf[16 + n:]
print(events)
"""


def test_inotify_on_a_passthrough_path_watches_its_source(shortfuse, scratch):
    script = scratch / "in.py"
    script.write_text(INOTIFY)
    out = same(shortfuse, scratch, lambda root: [sys.executable, str(script), root])
    assert "('0x100', 'a')" in out and "('0x200', 'a')" in out, out
    # A mount without a source has no kernel object to watch.
    mp = str(scratch / "m")
    s = under(shortfuse, [f"{mp}=mem"], [sys.executable, str(script), mp])
    assert output(s, mp).startswith(f"watch {38}\n"), output(s, mp)
