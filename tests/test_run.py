"""`shortfuse run`: unmodified programs with mounts served inside their own
process by the preload shim (no FUSE, no kernel mount), each compared with
the same run on native ext4: same output, same exit status, same files
afterwards.

The multi-process programs (shell scripts, coreutils) run on passthrough:
each process image builds its own instance of a mount, and only passthrough
shares its state (through its source directory). A `mem` mount lives in one
process image, so it serves programs where one process does everything
(python3 below, the POSIX scenarios).

The POSIX behaviour suite (test_posix.SCENARIOS) runs as a program too: a
small python3 driver runs one scenario against the mount path under
`shortfuse run` and prints its observations as JSON; the same driver runs
natively on ext4 for the reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import sfmount
import test_posix

TESTS = Path(__file__).resolve().parent

# Scenarios that cannot match native on one file system, each with the
# reason; everything else must match ext4 on both.
EXCLUDED = {
    ("locks", "mem"): "the scenario locks from a second program, which builds its own, empty, mem mount",
    ("locks", "sftp"): "the scenario locks from a second program: in process, sftp locks hold within one process image and its forked children",
}


@pytest.fixture(scope="module")
def shortfuse() -> Path:
    try:
        bin_ = sfmount.shortfuse_bin()
    except sfmount.HarnessError as e:
        pytest.fail(str(e), pytrace=False)
    # The shim every process loads, and the one built with sftp that run
    # loads for an sftp mount.
    for name in ("libshortfuse_preload.so", "libshortfuse_preload_sftp.so"):
        shim = bin_.parent / name
        assert shim.is_file(), f"{shim} not built: run make build (cargo build --workspace)"
    return bin_


@pytest.fixture
def scratch():
    d = sfmount.new_scratch("run")
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, timeout=120, **kw)


def under(shortfuse: Path, mounts: list[str], argv: list[str], **kw) -> subprocess.CompletedProcess:
    cmd = [str(shortfuse), "run"]
    for m in mounts:
        cmd += ["-m", m]
    return run(cmd + ["--", *argv], **kw)


def output(p: subprocess.CompletedProcess, root: str) -> str:
    text = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
    return text.replace(root, "ROOT")


def tree(root: Path) -> dict:
    """Every entry below root: type, permission bits, size, content hash or link target."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            st = p.lstat()
            entry = {"mode": oct(stat.S_IMODE(st.st_mode)), "nlink": st.st_nlink}
            if stat.S_ISLNK(st.st_mode):
                entry["link"] = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                entry["sha"] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
                entry["size"] = st.st_size
            else:
                entry["type"] = stat.S_IFMT(st.st_mode)
            out[str(p.relative_to(root))] = entry
    return out


# ------------------------------------------------------------ real programs

SCRIPT = r"""
set -e
R=$1
cd "$R"
mkdir -p a/b/c
echo one > a/f1
echo two >> a/f1
{ echo x; echo y; } > a/f2
(cd a/b && echo sub > s && pwd | sed "s|$R|ROOT|")
printf '%s\n' 3 1 2 | sort > a/sorted
cat a/f1 a/f2 | tr a-z A-Z > a/upper
ls a | wc -l
cat a/sorted a/upper
( echo out; echo err >&2 ) > a/both 2>&1
cat a/both
cp -a a a2
mv a2/f1 a2/g1
ln -s ../a/f1 a2/lnk
ln a/f2 a/hard
cat a2/lnk
ls -lR --time-style=+ . | grep -v '^total'
find . | sort
find . -name 'f*' -type f | sort
du -a --apparent-size . | sort -k2
sha256sum a/f1 a/upper a2/g1
stat -c '%n %s %F %a %h' a/f1 a2/lnk a a/hard
touch -d '2020-01-01 00:00' a/f1
stat -c '%y' a/f1
chmod 600 a/f2
stat -c '%a' a/hard
rm -r a2
ls
tar cf t.tar a
tar tf t.tar | sort
mkdir x
tar xf t.tar -C x
rm t.tar
diff -r a x/a && echo same
while read l; do echo "L:$l"; done < a/f2
df -B1 --output=size,itotal . | tail -1
rm x/a/sorted
ls x/a
"""


def test_bash_coreutils_and_tar_on_passthrough_match_ext4(shortfuse, scratch):
    native = scratch / "native"
    src = scratch / "src"
    native.mkdir()
    src.mkdir()
    # Not on disk (its parent is: df walks up with `..` to find the mount).
    mp = str(scratch / "mnt")
    script = scratch / "s.sh"
    script.write_text(SCRIPT)
    n = run(["bash", str(script), str(native)])
    s = under(shortfuse, [f"{mp}=passthrough:{src}"], ["bash", str(script), mp])
    assert n.returncode == 0, output(n, str(native))
    assert output(s, mp) == output(n, str(native))
    assert s.returncode == n.returncode
    assert not Path(mp).exists(), "the mount point must not appear on disk"
    assert tree(src) == tree(native)
    # The tarballs hold the same members with the same contents.
    assert "same\n" in output(s, mp)


# Test set-up of the same shape as the PY of tests/test_sftp.py and
# crates/shortfuse-preload/tests/programs.rs: kept apart so each test reads on
# its own.
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
os.link(root + "/d/g.txt", root + "/d/h.txt")
print(sorted(os.listdir(root + "/d")), os.readlink(root + "/d/lnk"), os.stat(root + "/d/g.txt").st_nlink)
os.chdir(root + "/d")
print(os.getcwd().replace(root, "ROOT"), open("lnk").readline(), end="")
with open("big", "wb") as f:
    for i in range(300):
        f.write(bytes([i % 251]) * 4099)
print(os.path.getsize("big"), sum(open("big", "rb").read()) % 1000003)
fd = os.open("g.txt", os.O_RDWR)
fd2 = os.dup(fd)
os.lseek(fd, 6, 0)
print(os.read(fd2, 6), os.lseek(fd, 0, 1), os.preadv(fd, [bytearray(3), bytearray(2)], 1))
os.ftruncate(fd, 4)
os.close(fd)
os.close(fd2)
os.chmod("g.txt", 0o600)
st = os.stat("g.txt")
print(st.st_size, oct(st.st_mode), os.statvfs(".").f_namemax)
for dirpath, dirs, files in os.walk(root):
    print(dirpath.replace(root, "ROOT"), sorted(dirs), sorted(files))
os.unlink("g.txt")
os.rmdir("e")
os.chdir("/")
print(sorted(os.listdir(root + "/d")))
for bad in (lambda: os.rmdir(root + "/nonexist"), lambda: os.mkdir(root + "/d"), lambda: open(root + "/d/x/y")):
    try:
        bad()
    except OSError as e:
        print("err", e.errno)
"""


def test_python_on_mem_matches_ext4(shortfuse, scratch):
    native = scratch / "native"
    native.mkdir()
    script = scratch / "t.py"
    script.write_text(PY)
    mp = str(scratch / "m")
    n = run([sys.executable, str(script), str(native)])
    s = under(shortfuse, [f"{mp}=mem"], [sys.executable, str(script), mp])
    assert n.returncode == 0, output(n, str(native))
    assert output(s, mp) == output(n, str(native))
    assert s.returncode == n.returncode
    assert not Path(mp).exists()


def test_programs_that_never_touch_the_mount_run_unchanged(shortfuse, scratch):
    src = scratch / "src"
    src.mkdir()
    mounts = [f"{scratch}/m=mem", f"{scratch}/p=passthrough:{src}"]
    def low_limit():
        # Below the hard limit: the in-process passthrough must not raise it for the program.
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, hard), hard))

    for argv in (
        ["sh", "-c", "echo hi; ls / >/dev/null; umask; ulimit -Sn; exit 3"],
        ["bash", "-c", "cd /; pwd; ulimit -n; for i in 1 2 3; do echo $i; done | sort -r; exit 5"],
        [sys.executable, "-c", "import os,sys; print(os.getcwd(), sorted(os.listdir('/etc'))[:3]); sys.exit(4)"],
        ["ls", "/nonexistent"],
    ):
        n = run(argv, cwd=str(scratch), preexec_fn=low_limit)
        s = under(shortfuse, mounts, argv, cwd=str(scratch), preexec_fn=low_limit)
        assert (s.returncode, output(s, "")) == (n.returncode, output(n, "")), argv


def test_mem_is_per_process_image_and_passthrough_is_shared(shortfuse, scratch):
    src = scratch / "src"
    src.mkdir()
    mem, pt = f"{scratch}/m", f"{scratch}/p"
    # `read` is a bash builtin (the mount of bash's own image); cat and sh are other images.
    script = f"echo a > {mem}/f && read l < {mem}/f && echo $l && echo b > {pt}/f && cat {pt}/f; sh -c 'cat {mem}/f; cat {pt}/f'"
    s = under(shortfuse, [f"{mem}=mem", f"{pt}=passthrough:{src}"], ["bash", "-c", script])
    # The child sh builds its own, empty, mem mount; passthrough shows the file.
    assert s.stdout.decode().splitlines() == ["a", "b", "b"], s
    assert s.stderr.decode().replace(str(scratch), "ROOT").splitlines() == ["cat: ROOT/m/f: No such file or directory"]
    assert (src / "f").read_text() == "b\n"


def traced_images(shortfuse: Path, scratch: Path, trace: str, script: str):
    """`bash -c script` under `run` with a passthrough mount at
    `scratch`/p of a source holding f ("x\n"), traced by strace for the
    calls `trace` names besides execve and execveat. Returns the run, the
    trace's lines as (pid, call), and each process image (a pid's calls from
    one exec that succeeded to the next; the shim runs a vfork child's exec
    as execveat) as its program's path and its calls."""
    src = scratch / "src"
    src.mkdir()
    (src / "f").write_text("x\n")
    log = scratch / "strace.log"
    argv = ["strace", "-f", "-qq", "-o", str(log), "-e", f"trace=execve,execveat,{trace}"]
    argv += [str(shortfuse), "run", "-m", f"{scratch}/p=passthrough:{src}", "--", "bash", "-c", script]
    r = subprocess.run(argv, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    lines = []
    for line in log.read_text().splitlines():
        pid, _, call = line.partition(" ")
        lines.append((pid, call.lstrip()))  # strace pads short pids
    images: list[tuple[str, list[str]]] = []
    current: dict[str, int] = {}
    for pid, call in lines:
        if call.startswith(("execve(", "execveat(")) and not call.endswith("= -1 ENOENT (No such file or directory)"):
            images.append((call.split('"')[1], []))
            current[pid] = len(images) - 1
        elif pid in current:
            images[current[pid]][1].append(call)
    return r, lines, images


def test_short_processes_pay_only_for_what_they_inherit(shortfuse, scratch):
    """What the shim does as each process starts, as strace sees it. No
    image reads /proc/self/maps: a rewritten page gets its protection back
    from the loaded object's program headers. Only an image that may have
    inherited a descriptor of a mount looks at /proc/self/fd to adopt it: the
    first image of the run, and one exec'd while a mount descriptor is open
    across exec; a /bin/true exec'd with none skips it (and still sees the
    mount)."""
    mp = f"{scratch}/p"
    script = f"/bin/true; test -e {mp}/f && /bin/true; exec 3< {mp}/f; /bin/true"
    _, _, images = traced_images(shortfuse, scratch, "openat", script)
    # Per process image: its program and the /proc files it opened. (An
    # O_PATH open of /proc/self/fd is passthrough's handle for reopening its
    # descriptors, which lists nothing.)
    shimmed = [
        (prog, {c.split('"')[1] for c in calls if c.startswith("openat(") and '"/proc/self/' in c and "O_PATH" not in c})
        for prog, calls in images
        if not prog.endswith("/shortfuse")
    ]
    assert [os.path.basename(p) for p, _ in shimmed] == ["bash", "true", "true", "true"], images
    assert all("/proc/self/maps" not in opened for _, opened in shimmed), shimmed
    assert ["/proc/self/fd" in opened for _, opened in shimmed] == [True, False, False, True], shimmed


def test_short_processes_ask_the_kernel_little_at_start_up(shortfuse, scratch):
    """The calls the shim makes as a short process starts, counted per
    process image by strace. /bin/true itself makes neither kind. The
    signal actions in place before the shim's constructor are read when a
    call is first served, not at start-up (/bin/true has none served), and
    then from /proc/self/status, not with 64 rt_sigaction calls, one a
    signal; the descriptors that keep the file systems' own above the
    program's numbers while they are built, where that is needed (not for
    passthrough: see the next test), are taken by passing copies of one
    over a socket pair, not by one fcntl each (about a hundred)."""
    mp = f"{scratch}/p"
    script = f"/bin/true; test -e {mp}/f && /bin/true; cat {mp}/f"
    r, _, traced = traced_images(shortfuse, scratch, "rt_sigaction,fcntl", script)
    assert r.stdout == b"x\n", r
    # Per process image: its program, its rt_sigaction calls and its
    # descriptor-copying fcntl calls.
    images = [
        [
            os.path.basename(prog),
            sum(c.startswith("rt_sigaction(") for c in calls),
            sum(c.startswith("fcntl(") and "F_DUPFD" in c for c in calls),
        ]
        for prog, calls in traced
    ]
    trues = [i for i in images if i[0] == "true"]
    assert len(trues) == 2, images
    # (One: the shim's own SIGSYS handler, for Syscall User Dispatch.)
    assert all(sigactions <= 1 for _, sigactions, _ in trues), images
    assert all(dups < 8 for _, _, dups in trues), images
    # cat has a call served (its open of the mount's file): the actions
    # are read then, in one read of /proc/self/status.
    cats = [i for i in images if i[0] == "cat"]
    assert len(cats) == 1 and cats[0][1] <= 1, images


def test_a_passthrough_mount_is_built_without_probes_a_short_process_does_not_need(shortfuse, scratch):
    """Every process image under `run` builds its passthrough mount again,
    so what it asks the kernel for then is paid by each of a build's short
    processes. Counted per image by strace, for commands a shell forks
    (bash) and spawns with vfork (dash):
    - RLIMIT_NOFILE is read once (the inode descriptors' budget) and left
      as it is: a daemon raises it (reading fs.nr_open), in process it is
      the program's;
    - whether file handles work on the source is probed when the first
      inode below the root is looked up, not at start (name_to_handle_at,
      a reopen through /proc/self/fd);
    - an image spawned with vfork by a process with no descriptor of a
      mount, whose child opened none, does not look for inherited ones
      (/proc/self/fd, a readlink each);
    - the file system places the descriptors it keeps above the program's
      low numbers itself, so the shim does not hold them while it is built
      (a socket pair passing about a hundred copies of one descriptor)."""
    mp = f"{scratch}/p"
    # dash runs its commands through vfork; bash forks.
    script = f"cd {mp} && /bin/true; sh -c '/bin/true; /bin/true'; cat f"
    trace = "vfork,clone,openat,readlink,readlinkat,prlimit64,name_to_handle_at,socketpair"
    r, lines, traced = traced_images(shortfuse, scratch, trace, script)
    assert r.stdout == b"x\n", r
    vforks = sum(c.startswith("vfork(") or c.startswith("clone(") and "CLONE_VFORK" in c for _, c in lines)
    # Per process image: its program, then its RLIMIT_NOFILE calls, reads
    # of fs.nr_open, file-handle probes, looks at /proc/self/fd and socket
    # pairs.
    images = [
        [
            os.path.basename(prog),
            sum(c.startswith("prlimit64(") and "RLIMIT_NOFILE" in c for c in calls),
            sum("/proc/sys/fs/nr_open" in c for c in calls),
            sum(c.startswith("name_to_handle_at(") for c in calls),
            sum("/proc/self/fd" in c for c in calls),
            sum(c.startswith("socketpair(") for c in calls),
        ]
        for prog, calls in traced
    ]
    assert vforks >= 2, images
    trues = [i for i in images if i[0] == "true"]
    assert len(trues) == 3, images
    assert all(i[1:] == [1, 0, 0, 0, 0] for i in trues), images
    cats = [i for i in images if i[0] == "cat"]
    assert len(cats) == 1 and cats[0][1:3] == [1, 0] and cats[0][5] == 0, images


def test_the_shim_loads_no_unwinder_library_nor_libm(shortfuse, scratch):
    """Every process started under `run` loads the shim and what it needs.
    The shim carries its unwinder (libgcc_eh) inside: loading libgcc_s.so.1
    runs its constructor, whose cpuid instructions trap to the hypervisor in
    a virtual machine, in every short process of a build."""
    src = scratch / "src"
    src.mkdir()
    r = under(shortfuse, [f"{scratch}/p=passthrough:{src}"], ["cat", "/proc/self/maps"])
    assert r.returncode == 0, r.stderr.decode()
    maps = r.stdout.decode()
    assert "libshortfuse_preload.so" in maps, maps
    assert "libgcc_s" not in maps, maps
    # Nor libm: the two functions of it the shim's dependencies use are
    # bound when first called (cat calls neither).
    assert "/libm.so" not in maps, maps


MMAP_MIN_ADDR = Path("/proc/sys/vm/mmap_min_addr")


def test_run_leaves_mmap_min_addr_alone_unless_asked(shortfuse, scratch):
    """By default `run` does not touch vm.mmap_min_addr: root serves through
    the rewritten path anyway (CAP_SYS_RAWIO maps page 0), another user
    with Syscall User Dispatch alone, and says so. --zero-page and
    SHORTFUSE_ZERO_PAGE=1 set it to 0 and say so."""
    before = MMAP_MIN_ADDR.read_text()
    os.chmod(scratch, 0o777)
    mem = f"{scratch}/m"
    # `read` is a bash builtin: the mem mount of bash's own process image.
    script = f"echo hi > {mem}/f && read l < {mem}/f && read m < {MMAP_MIN_ADDR} && echo $l $m"
    try:
        MMAP_MIN_ADDR.write_text("65536")
        s = under(shortfuse, [f"{mem}=mem"], ["bash", "-c", script])
        assert s.returncode == 0 and s.stdout.decode().split() == ["hi", "65536"], s
        assert s.stderr.decode() == "", s.stderr
        assert MMAP_MIN_ADDR.read_text().strip() == "65536", "run changed vm.mmap_min_addr"
        # Another user, on a passthrough mount of a directory it owns.
        src = scratch / "src"
        src.mkdir()
        shutil.chown(src, "nobody")
        argv = [str(shortfuse), "run", "-m", f"{mem}=passthrough:{src}", "--", "bash", "-c", script]
        s = run(["runuser", "-u", "nobody", "--", *argv])
        assert s.returncode == 0 and s.stdout.decode().split() == ["hi", "65536"], s
        assert (src / "f").read_text() == "hi\n"
        assert "Syscall User Dispatch alone" in s.stderr.decode(), s.stderr
        assert MMAP_MIN_ADDR.read_text().strip() == "65536", "run changed vm.mmap_min_addr"

        s = run([str(shortfuse), "run", "--zero-page", "-m", f"{mem}=mem", "--", "bash", "-c", script])
        assert s.returncode == 0 and s.stdout.decode().split() == ["hi", "0"], s
        assert "set vm.mmap_min_addr from 65536 to 0" in s.stderr.decode(), s.stderr
        MMAP_MIN_ADDR.write_text("65536")
        s = under(shortfuse, [f"{mem}=mem"], ["bash", "-c", script], env={**os.environ, "SHORTFUSE_ZERO_PAGE": "1"})
        assert s.returncode == 0 and s.stdout.decode().split() == ["hi", "0"], s
    finally:
        MMAP_MIN_ADDR.write_text(before)


def test_read_only_mount_refuses_changes(shortfuse, scratch):
    src = scratch / "src"
    src.mkdir()
    (src / "f").write_text("data\n")
    mp = f"{scratch}/p"
    script = f"cat {mp}/f; echo x > {mp}/g; mkdir {mp}/d; rm -f {mp}/f; touch {mp}/f; ls {mp}"
    s = run([str(shortfuse), "run", "-m", f"{mp}=passthrough:{src}", "-o", "ro", "--", "bash", "-c", script])
    assert s.stdout.decode().splitlines() == ["data", "f"], s
    errors = s.stderr.decode().splitlines()
    assert sum("Read-only file system" in l for l in errors) == 4, errors
    assert sorted(os.listdir(src)) == ["f"]
    # The same script on a read-write mount changes the source.
    s = under(shortfuse, [f"{mp}=passthrough:{src}"], ["bash", "-c", script])
    assert sorted(os.listdir(src)) == ["d", "f", "g"], output(s, mp)


def test_bad_mounts_are_refused_before_the_program_runs(shortfuse, scratch):
    marker = scratch / "ran"
    for args, says in (
        (["-m", "/x=nosuchfs"], "unknown file system"),
        (["-m", f"/x=passthrough:{scratch}/missing"], "missing"),
        (["-m", "/x=passthrough"], "needs a SOURCE"),
        (["-m", "/x=mem:/tmp"], "takes no SOURCE"),
        (["-m", "/x=mem", "-o", "allow_other"], "meaningless"),
        (["-m", "/x=mem", "-m", "/x/=mem"], "two mounts"),
        (["-m", "/=mem"], "every file"),
    ):
        p = run([str(shortfuse), "run", *args, "--", "touch", str(marker)])
        assert p.returncode == 2, (args, p)
        assert says in p.stderr.decode(), (args, p.stderr)
        assert not marker.exists()
    p = run([str(shortfuse), "run", "-m", "/x=mem", "--", str(scratch / "no-such-program")])
    assert p.returncode == 127


def programs_on(src: Path) -> None:
    """A script and an ELF program in `src`, each printing its arguments."""
    (src / "hello.sh").write_text('#!/bin/sh\necho "script says $*"\n')
    (src / "hello.sh").chmod(0o755)
    shutil.copy2(shutil.which("echo"), src / "echo-elf")


def check_programs_on_mount(shortfuse: Path, mounts: list[str], mp: Path, cwd: Path) -> None:
    """Each program of `programs_on` on the mount at `mp` runs as the very
    program `shortfuse run` starts: named by absolute path, by a path
    relative to the current directory, and by bare name through PATH."""
    rel = os.path.relpath(mp, cwd)
    env = dict(os.environ, PATH=f"{mp}:{os.environ['PATH']}")
    for prog, args, out in (
        ("hello.sh", ["one", "two"], b"script says one two\n"),
        ("echo-elf", ["elf", "runs"], b"elf runs\n"),
    ):
        for argv, kw in (
            ([f"{mp}/{prog}", *args], {}),
            ([f"{rel}/{prog}", *args], {"cwd": cwd}),
            ([prog, *args], {"env": env}),
        ):
            p = under(shortfuse, mounts, argv, **kw)
            assert (p.returncode, p.stdout) == (0, out), (argv, p)

def test_a_program_on_the_mount_runs_as_the_first_program(shortfuse, scratch):
    src, mp = scratch / "src", scratch / "mnt"
    src.mkdir()
    programs_on(src)
    check_programs_on_mount(shortfuse, [f"{mp}=passthrough:{src}"], mp, scratch)
    # A fresh mem mount is empty: the program is not there, whatever the
    # kernel has under the mount point, which the mount hides.
    mp.mkdir()
    programs_on(mp)
    for argv in ([f"{mp}/hello.sh"], [f"{mp}/echo-elf", "hidden"]):
        p = under(shortfuse, [f"{mp}=mem"], argv)
        assert p.returncode == 127 and p.stdout == b"", (argv, p)
        assert b"No such file or directory" in p.stderr, p.stderr



# A Rust program (std installs a small signal stack on its main thread and
# on each thread it spawns) that copies programs into a mount, reads them
# back, and runs them from there: spawned (posix_spawn), forked (a
# pre_exec hook makes std fork), from a spawned thread, or exec'd in place.
# "min" replaces std's signal stack with one of the kernel's minimum
# (AT_MINSIGSTKSZ, the size of its signal frame) and a little more, as
# sigaltstack(2) allows: the shim's SIGSYS handler must move off it at once.
RUST_EXEC = r"""
use std::os::unix::process::CommandExt;
use std::process::Command;

#[repr(C)]
struct StackT { sp: *mut u8, flags: i32, size: usize }
extern "C" {
    fn getauxval(t: u64) -> u64;
    fn sigaltstack(ss: *const StackT, old: *mut StackT) -> i32;
    fn mmap(addr: *mut u8, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut u8;
    fn mprotect(addr: *mut u8, len: usize, prot: i32) -> i32;
}

/// A signal stack right above an inaccessible page, as std's: a handler
/// that overflows it faults.
fn min_signal_stack() {
    const AT_MINSIGSTKSZ: u64 = 51;
    const PAGE: usize = 4096;
    let size = ((unsafe { getauxval(AT_MINSIGSTKSZ) } as usize).max(2048) + 256 + 15) & !15;
    let pages = (size + PAGE - 1) / PAGE;
    // PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
    let base = unsafe { mmap(std::ptr::null_mut(), (pages + 1) * PAGE, 3, 0x22, -1, 0) };
    assert!(base as isize > 0);
    assert_eq!(unsafe { mprotect(base, PAGE, 0) }, 0);
    let sp = unsafe { base.add(PAGE) };
    let st = StackT { sp, flags: 0, size };
    assert_eq!(unsafe { sigaltstack(&st, std::ptr::null_mut()) }, 0);
}

fn run_all(mnt: &str, how: &str, stack: &str) -> String {
    if stack == "min" {
        min_signal_stack();
    }
    let mut out = String::new();
    for (prog, arg) in [("hello.sh", "script"), ("echo-elf", "elf")] {
        let mut c = Command::new(format!("{mnt}/{prog}"));
        c.arg(arg);
        if how == "fork" {
            // SAFETY: the hook does nothing.
            unsafe { c.pre_exec(|| Ok(())) };
        }
        let o = c.output().expect(prog);
        assert!(o.status.success(), "{prog}: {:?}", o.status);
        out += &String::from_utf8(o.stdout).unwrap();
    }
    out
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (progs, mnt, how, stack) = (&a[1], &a[2], &a[3], a[4].clone());
    for prog in ["hello.sh", "echo-elf"] {
        let want = std::fs::read(format!("{progs}/{prog}")).unwrap();
        std::fs::write(format!("{mnt}/{prog}"), &want).unwrap();
        assert_eq!(std::fs::read(format!("{mnt}/{prog}")).unwrap(), want, "{prog}");
        let mode = std::fs::metadata(format!("{progs}/{prog}")).unwrap().permissions();
        std::fs::set_permissions(format!("{mnt}/{prog}"), mode).unwrap();
    }
    match how.as_str() {
        "thread" => {
            let mnt = mnt.clone();
            print!("{}", std::thread::spawn(move || run_all(&mnt, "spawn", &stack)).join().unwrap());
        }
        "exec" => {
            if stack == "min" {
                min_signal_stack();
            }
            let e = Command::new(format!("{mnt}/hello.sh")).arg("exec").exec();
            panic!("exec: {e}");
        }
        _ => print!("{}", run_all(mnt, how, &stack)),
    }
}
"""


@pytest.fixture(scope="module")
def rust_exec(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rust-exec")
    (d / "main.rs").write_text(RUST_EXEC)
    rustc = shutil.which("rustc") or str(Path.home() / ".cargo/bin/rustc")
    p = subprocess.run(
        [rustc, "--edition", "2021", "-o", str(d / "rust-exec"), str(d / "main.rs")], capture_output=True, timeout=300
    )
    assert p.returncode == 0, p.stderr.decode()
    return d / "rust-exec"


@pytest.mark.parametrize("intercept", ["both", "sud"])
@pytest.mark.parametrize("fs", ["passthrough", "mem"])
def test_a_rust_program_runs_programs_on_the_mount(shortfuse, scratch, rust_exec, fs, intercept):
    progs, src, mp = scratch / "progs", scratch / "src", scratch / "mnt"
    progs.mkdir()
    src.mkdir()
    programs_on(progs)
    spec = f"{mp}=passthrough:{src}" if fs == "passthrough" else f"{mp}=mem"
    env = dict(os.environ, SHORTFUSE_INTERCEPT=intercept)
    want = {"spawn": b"script says script\nelf\n", "exec": b"script says exec\n"}
    # posix_spawn's child runs with Syscall User Dispatch too, its SIGSYS
    # frame on the small signal stack of the thread that spawned it.
    for how in ["fork", "exec", "spawn", "thread"]:
        for stack in ("std", "min"):
            p = under(shortfuse, [spec], [str(rust_exec), str(progs), str(mp), how, stack], env=env)
            assert (p.returncode, p.stdout) == (0, want.get(how, want["spawn"])), (how, stack, p)


# ------------------------------------------------------------ POSIX scenarios

DRIVER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import sfmount, test_posix
fn = {f.__name__: f for f in test_posix.SCENARIOS}[sys.argv[2]]
# argv[4]: the configuration whose declared limits both runs follow; argv[5]: "native" for the reference run.
unsupported = sfmount.FILE_SYSTEMS[sys.argv[4]].unsupported if len(sys.argv) > 4 else {}
obs = test_posix.run_scenario(fn, sys.argv[3], unsupported, reference=len(sys.argv) > 5 and sys.argv[5] == "native")

def enc(v):
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": bytes(v).hex()}
    if isinstance(v, (list, tuple)):
        return [enc(x) for x in v]
    if isinstance(v, dict):
        return {str(k): enc(x) for k, x in v.items()}
    return v

print(json.dumps([[label, enc(v)] for label, v in obs]))
"""

SCENARIO_NAMES = [f.__name__ for f in test_posix.SCENARIOS]


def test_exclusions_name_real_scenarios():
    assert {n for n, _ in EXCLUDED} <= set(SCENARIO_NAMES), EXCLUDED


def observe(cmd: list[str], root: str) -> list:
    p = run(cmd)
    assert p.returncode == 0, output(p, root)
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


@pytest.mark.parametrize(
    "name,fs", [(n, fs) for fs in ("passthrough", "mem", "sftp") for n in SCENARIO_NAMES if (n, fs) not in EXCLUDED]
)
def test_posix_scenario_under_run(shortfuse, scratch, name, fs):
    native = scratch / "native"
    native.mkdir()
    native.chmod(0o755)
    argv = [sys.executable, "-c", DRIVER, str(TESTS), name]
    # sftp: what SFTP v3 cannot carry (sfmount.FILE_SYSTEMS) is declared to both runs.
    limits = [fs] if fs == "sftp" else []
    want = observe(argv + [str(native)] + limits + ["native"] * bool(limits), str(native))
    assert want, f"{name} observed nothing on native"
    mp = str(scratch / "mnt")
    opts = []
    if fs == "passthrough":
        src = scratch / "src"
        src.mkdir()
        src.chmod(0o755)
        spec = f"{mp}=passthrough:{src}"
    elif fs == "sftp":
        src = scratch / "src"
        src.mkdir()
        src.chmod(0o755)
        server = sfmount.sshd_server()
        spec = f"{mp}=sftp:{server.target(src)}"
        opts = ["-o", ",".join(server.options())]
    else:
        spec = f"{mp}=mem"
    got = observe([str(shortfuse), "run", "-m", spec, *opts, "--", *argv, mp, *limits], mp)
    diff = test_posix.compare([tuple(o) for o in want], [tuple(o) for o in got])
    assert diff is None, f"{name} under `shortfuse run` on {fs} differs from native ext4:\n{diff}"


MAPPED_PY = r"""
import hashlib, os, sys
root = sys.argv[1]
data = bytes(range(256)) * 12289  # 3 MiB and change: over several stripes
p = os.path.join(root, "big")
with open(p, "wb") as f:
    f.write(data)
with open(p, "r+b") as f:
    f.seek(1 << 20)
    f.write(b"X" * 5000)
    f.truncate(3 << 20)
os.rename(p, os.path.join(root, "moved"))
with open(os.path.join(root, "small"), "w") as f:
    f.write("tiny\n")
for name in sorted(os.listdir(root)):
    q = os.path.join(root, name)
    with open(q, "rb") as f:
        print(name, os.stat(q).st_size, hashlib.sha256(f.read()).hexdigest())
"""


@pytest.mark.parametrize("fs", ["stripe", "pack"])
def test_python_on_mapped_file_systems_matches_ext4(shortfuse, scratch, fs):
    """The 1-to-M (stripe) and M-to-1 (pack) maps of DeFUSE, served in
    process: results match ext4, the data lands in the backing files, and a
    later run finds it."""
    native = scratch / "native"
    native.mkdir()
    script = scratch / "t.py"
    script.write_text(MAPPED_PY)
    n = run([sys.executable, str(script), str(native)])
    assert n.returncode == 0, output(n, str(native))
    mp = str(scratch / "m")
    if fs == "stripe":
        dirs = [scratch / "s0", scratch / "s1", scratch / "s2"]
        source = ",".join(map(str, dirs))
    else:
        dirs = [scratch / "pk"]
        dirs[0].mkdir()
        source = str(dirs[0])
    mount = f"{mp}={fs}:{source}"  # stripe: the default 1 MiB stripes
    s = under(shortfuse, [mount], [sys.executable, str(script), mp])
    assert s.returncode == 0, output(s, mp)
    assert output(s, mp) == output(n, str(native))
    backing = sum(f.stat().st_size for d in dirs for f in d.rglob("*") if f.is_file())
    assert backing >= 3 << 20, f"{backing} bytes in the backing files"
    if fs == "stripe":
        # Every directory holds part of the 3 MiB file.
        for d in dirs:
            assert sum(f.stat().st_size for f in (d / "data").iterdir()) >= 1 << 20, d
    again = under(shortfuse, [mount], ["ls", mp])
    assert again.stdout.decode().split() == ["moved", "small"], output(again, mp)
