"""Programs that used to crash, hang or write outside the mount under
`shortfuse run`: a Go program whose goroutines (stacks of a few
kilobytes) do file I/O at once, a fork while another thread has a
system-call site rewritten, `git clone` on a passthrough mount (a
multi-threaded program that forks), shells and a statically linked
program (which the shim never reaches) after `cd` into a mount; and
threads that used to spin waiting for each other (threads made while
calls are served, threads trapping on the same sites at once); and the
vector registers a program keeps across its system calls, and the
signals of a program with a handler, blocked only around served calls.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import sfmount
from test_ring import Daemon
from test_run import output, run, scratch, shortfuse, under  # noqa: F401 (fixtures)

PROGRAMS = Path(__file__).resolve().parent / "programs"


def cc(scratch: Path, name: str, *flags: str) -> Path:
    exe = scratch / name
    p = run(["gcc", "-O2", "-Wall", "-o", str(exe), str(PROGRAMS / f"{name}.c"), *flags])
    assert p.returncode == 0, p.stderr.decode()
    return exe


def traced_calls(log: Path) -> list[str]:
    """The calls in strace's `log`, without Syscall User Dispatch's SIGSYS
    reports."""
    return [line.split(None, 1)[1] for line in log.read_text().splitlines() if "SIGSYS" not in line]


def markers(calls: list[str]) -> list[int]:
    """Where the program's getppid markers are among `calls`."""
    return [i for i, call in enumerate(calls) if call.startswith("getppid(")]


@pytest.fixture(scope="module")
def gofs():
    """tests/programs/gofs built with cgo (dynamically linked against glibc,
    so LD_PRELOAD reaches it), offline, its caches in a temporary directory."""
    d = Path(tempfile.mkdtemp(prefix="shortfuse-gofs-"))
    env = {
        **os.environ,
        "GOCACHE": str(d / "cache"),
        "GOPATH": str(d / "gopath"),
        "GOPROXY": "off",
        "GOFLAGS": "",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "1",
    }
    exe = d / "gofs"
    p = subprocess.run(
        ["go", "build", "-o", str(exe), "."],
        cwd=PROGRAMS / "gofs",
        env=env,
        capture_output=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr.decode()
    assert b"program interpreter" in run(["readelf", "-l", str(exe)]).stdout
    yield exe
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("intercept", ["both", "sud"])
@pytest.mark.parametrize("fs", ["mem", "passthrough"])
def test_go_program_with_many_goroutines_doing_file_io(shortfuse, scratch, gofs, fs, intercept):
    # The hook used to run on the goroutine's stack and overflow it
    # (fatal error: unknown caller pc, SIGSEGV, SIGBUS). With Syscall User
    # Dispatch alone (what a user without page 0 gets) every call is a
    # SIGSYS, whose frame went on goroutine stacks: sigaltstack reported
    # a thread without a signal stack as having one of size 0, which the
    # Go runtime adopted (fatal error: traceback did not unwind completely).
    native = scratch / "native"
    native.mkdir()
    assert run([str(gofs), str(native)]).stdout == b"640\n"
    mp = scratch / "mnt"
    src = scratch / "src"
    src.mkdir()
    spec = f"{mp}=mem" if fs == "mem" else f"{mp}=passthrough:{src}"
    env = {**os.environ, "SHORTFUSE_INTERCEPT": intercept}
    for _ in range(4):
        p = under(shortfuse, [spec], [str(gofs), str(mp)], env=env)
        assert p.returncode == 0, output(p, str(scratch))
        assert p.stdout == b"640\n"
    if fs == "passthrough":
        assert sorted(os.listdir(src)) == sorted(os.listdir(native))
        assert (src / "g15-39").read_text() == "goroutine 15 file 39\n"


def test_forks_while_another_thread_rewrites_sites(shortfuse, scratch):
    # A child forked while the rewrite lock was held used to wait for it
    # for ever (the thread holding it stayed in the parent).
    exe = cc(scratch, "fork_while_rewriting", "-pthread")
    assert run([str(exe), "50"]).returncode == 0
    p = under(shortfuse, [f"{scratch}/mnt=mem"], [str(exe), "1500"])
    assert p.returncode == 0, output(p, str(scratch))
    assert p.stdout == b"hung 0\n"



def has_avx512() -> bool:
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    return {"avx512f", "avx512bw"} <= set(flags.split())


@pytest.mark.skipif(not has_avx512(), reason="the program fills AVX-512 registers")
@pytest.mark.parametrize("intercept", ["both", "zpoline", "sud"])
def test_served_and_passed_calls_leave_every_vector_and_mask_register_as_it_was(shortfuse, scratch, intercept):
    # The kernel keeps all of zmm0-31, k0-7 and MXCSR across a system call,
    # with the upper halves of zmm0-15 in use and not; the hook's own code
    # (glibc's string functions: zmm16-31 and the masks) must too. The
    # mount point does not exist outside the shim, so the calls on it were
    # served.
    exe = cc(scratch, "vector_registers", "-mavx512f", "-mavx512bw")
    mp = scratch / "mnt"
    p = under(shortfuse, [f"{mp}=mem"], [str(exe), str(mp)], env={**os.environ, "SHORTFUSE_INTERCEPT": intercept})
    assert p.returncode == 0, output(p, str(scratch))
    assert p.stdout == b"ok\n"
    assert not mp.exists()


def test_calls_that_reach_the_kernel_unchanged_block_no_signals_in_a_program_with_a_handler(shortfuse, scratch):
    # Once a program has a handler, served calls run with its signals
    # blocked (the handler removes a lock file on the mount, and must not
    # run inside one). Reads, seeks and listings of kernel descriptors of
    # backing files, a pipe's write and read and an anonymous mmap are not
    # served: they used to pay the same two rt_sigprocmask calls each.
    exe = cc(scratch, "calls_with_a_handler")
    src = scratch / "src"
    src.mkdir()
    (src / "data").write_text("some data\n")
    (src / "lock").write_text("")
    log = scratch / "strace.log"
    trace = [sfmount.require_tool("strace"), "-f", "-qq", "-e", "trace=rt_sigprocmask,getppid", "-o", str(log)]
    cmd = [*trace, str(shortfuse), "run", "-m", f"{scratch}/mnt=passthrough:{src}", "--"]
    p = run([*cmd, str(exe), f"{scratch}/mnt", "20"])
    assert p.returncode == 0, output(p, str(scratch))
    assert p.stdout == b"gone\n"
    assert sorted(os.listdir(src)) == ["data"]
    calls = traced_calls(log)
    marks = markers(calls)
    assert len(marks) == 2, calls
    between = [call.split(",")[0] for call in calls[marks[0] + 1 : marks[1]]]
    # The one served call, the fstat, still has its pair.
    assert between == ["rt_sigprocmask(SIG_BLOCK", "rt_sigprocmask(SIG_SETMASK"]


@pytest.mark.parametrize("intercept", ["both", "sud"])
def test_pages_a_program_passes_paths_from_again_and_again_are_checked_once(shortfuse, scratch, intercept):
    # Before reading a path the shim checks that its page is mapped (a futex
    # operation, which gives EFAULT instead of a fault), and remembers pages
    # found so. Six paths on six pages, and the stat structure on the stack,
    # taken in turn: a memory of four pages used to forget each before its
    # next use, and every call checked its page again.
    exe = cc(scratch, "paths_on_many_pages")
    src = scratch / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}").write_text("")
    log = scratch / "strace.log"
    trace = [sfmount.require_tool("strace"), "-f", "-qq", "-e", "trace=futex,getppid", "-o", str(log)]
    cmd = [*trace, str(shortfuse), "run", "-m", f"{scratch}/mnt=passthrough:{src}", "--"]
    p = run([*cmd, str(exe), f"{scratch}/mnt", "20"], env={**os.environ, "SHORTFUSE_INTERCEPT": intercept})
    assert p.returncode == 0, output(p, str(scratch))
    assert p.stdout == b"ok\n"
    calls = traced_calls(log)
    marks = markers(calls)
    assert len(marks) == 2, calls
    futexes = [call for call in calls[marks[0] + 1 : marks[1]] if call.startswith("futex(")]
    # 120 stats; one check per page at most.
    assert len(futexes) <= 7, futexes


def test_threads_made_while_calls_are_served_leave_the_calls_running(shortfuse, scratch):
    # A clone that makes a thread copies nothing: served calls of other
    # threads need not wait for it. They used to spin in sched_yield
    # (counted with strace from the program's marker on, not timed).
    exe = cc(scratch, "threads_while_serving", "-pthread")
    (scratch / "src").mkdir()
    (scratch / "src" / "f").write_bytes(b"x")
    log = scratch / "strace.log"
    trace = [sfmount.require_tool("strace"), "-f", "-qq", "-e", "trace=sched_yield,getppid", "-o", str(log)]
    cmd = [*trace, str(shortfuse), "run", "-m", f"{scratch}/mnt=passthrough:{scratch}/src", "--"]
    p = run([*cmd, str(exe), f"{scratch}/mnt/f", "50"])
    assert p.returncode == 0, output(p, str(scratch))
    assert p.stdout == b"served during\n"
    calls = traced_calls(log)
    marks = markers(calls)
    assert len(marks) == 1, calls
    assert [call for call in calls[marks[0] :] if call.startswith("sched_yield(")] == []


def test_threads_trapping_on_the_same_sites_do_not_wait_for_each_other(shortfuse, scratch):
    # While one thread rewrites a site, the others trapping on it are
    # served through Syscall User Dispatch instead of spinning in
    # sched_yield until the rewrite lock is free (counted, not timed).
    exe = cc(scratch, "threads_trap_together", "-pthread")
    log = scratch / "strace.log"
    trace = [sfmount.require_tool("strace"), "-f", "-qq", "-e", "trace=sched_yield", "-o", str(log)]
    p = run([*trace, str(shortfuse), "run", "-m", f"{scratch}/mnt=mem", "--", str(exe), "4", "200"])
    assert p.returncode == 0, output(p, str(scratch))
    assert p.stdout == b"bad 0\n"
    calls = traced_calls(log)
    assert [call for call in calls if call.startswith("sched_yield(")] == []


GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def test_git_clone_no_local_onto_a_passthrough_mount_repeated(shortfuse, scratch):
    # git clone --no-local runs upload-pack and index-pack as children of a
    # threaded git: the fork race above, met by a real program.
    env = {**os.environ, **GIT_ENV}
    repo = scratch / "repo"
    for d in range(10):
        (repo / f"d{d}").mkdir(parents=True)
        for f in range(30):
            (repo / f"d{d}" / f"f{f}").write_text(f"dir {d} file {f}\n" * (f + 1))
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "files"]):
        assert run(["git", "-C", str(repo), *cmd], env=env).returncode == 0
    head = run(["git", "-C", str(repo), "rev-parse", "HEAD"], env=env).stdout
    src = scratch / "src"
    src.mkdir()
    mp = scratch / "mnt"
    for k in range(10):
        p = under(
            shortfuse,
            [f"{mp}=passthrough:{src}"],
            ["git", "clone", "-q", "--no-local", str(repo), f"{mp}/c{k}"],
            env=env,
        )
        assert p.returncode == 0, output(p, str(scratch))
        clone = src / f"c{k}"
        assert run(["git", "-C", str(clone), "rev-parse", "HEAD"], env=env).stdout == head
        assert run(["git", "-C", str(clone), "status", "--porcelain"], env=env).stdout == b""
        assert (clone / "d9" / "f29").read_text() == "dir 9 file 29\n" * 30


@pytest.fixture
def mount(shortfuse, scratch, request):
    """(spec for run -m, mount point, source directory or None) of one
    kind: in-process passthrough or mem, or a `serve` daemon over
    passthrough or mem reached through the rings."""
    kind = request.param
    mp = scratch / "mnt"
    src = scratch / "src"
    src.mkdir()
    daemon = None
    if kind == "passthrough":
        spec = f"{mp}=passthrough:{src}"
    elif kind == "mem":
        spec, src = f"{mp}=mem", None
    else:
        fs = kind.removeprefix("serve-")
        args = [fs, str(src), str(mp)] if fs == "passthrough" else [fs, str(mp)]
        daemon = Daemon(shortfuse, scratch, args, mp)
        spec = str(mp)
        if fs != "passthrough":
            src = None
    yield spec, mp, src
    if daemon:
        daemon.stop()


def listing(shortfuse, spec, mp, src, rel=""):
    """The names in directory rel of the mount, as its source has them or
    as a program under the shim sees them."""
    if src is not None:
        return sorted(os.listdir(src / rel))
    p = under(shortfuse, [spec], ["ls", "-A", f"{mp}/{rel}"])
    assert p.returncode == 0, p.stderr.decode()
    return sorted(p.stdout.decode().split())


SHELLS = [
    # dash: `touch` used to run in the directory `run` started in.
    ("sh", "-c", "cd MP && touch a"),
    # A nested shell's later `cd`: x used to land in the mount's root.
    ("bash", "-c", 'cd MP && sh -c "mkdir d; cd d; touch x"'),
]


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough", "serve-mem"], indirect=True)
def test_shells_after_cd_into_the_mount_create_files_there(shortfuse, scratch, mount):
    spec, mp, src = mount
    start = scratch / "start"
    start.mkdir()
    for argv in SHELLS:
        p = under(shortfuse, [spec], [a.replace("MP", str(mp)) for a in argv], cwd=start)
        assert p.returncode == 0, output(p, str(scratch))
    assert os.listdir(start) == []
    assert listing(shortfuse, spec, mp, src) == ["a", "d"]
    assert listing(shortfuse, spec, mp, src, "d") == ["x"]


@pytest.fixture(scope="module")
def static_touch():
    d = Path(tempfile.mkdtemp(prefix="shortfuse-static-"))
    exe = d / "static_touch"
    p = run(["gcc", "-static", "-O2", "-o", str(exe), str(PROGRAMS / "static_touch.c")])
    assert p.returncode == 0, p.stderr.decode()
    assert b"program interpreter" not in run(["readelf", "-l", str(exe)]).stdout
    yield exe
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough", "mem", "serve-mem"], indirect=True)
def test_programs_the_shim_cannot_reach_never_write_outside_the_mount(shortfuse, scratch, mount, static_touch):
    # The kernel's current directory used to stay where `run` started: a
    # static program (LD_PRELOAD never reaches it) or one whose environment
    # lost the shim, after `cd` into the mount, wrote there.
    spec, mp, src = mount
    start = scratch / "start"
    start.mkdir()
    script = (
        f"cd {mp} && {static_touch} s1; mkdir -p e && cd e && {static_touch} s2; "
        f"env -i /bin/sh -c 'echo x > t'; echo done"
    )
    p = under(shortfuse, [spec], ["sh", "-c", script], cwd=start)
    assert p.returncode == 0 and p.stdout.endswith(b"done\n"), output(p, str(scratch))
    # Python's subprocess with cwd= (a vfork child's chdir).
    code = (
        "import subprocess\n"
        "try:\n"
        f"    subprocess.run([{str(static_touch)!r}, 's3'], cwd={str(mp)!r})\n"
        "except PermissionError as e:\n"
        "    print('refused', e.errno)\n"
    )
    q = under(shortfuse, [spec], ["python3", "-c", code], cwd=start)
    assert q.returncode == 0, output(q, str(scratch))
    # A static program given a path in the mount, from outside it.
    r = under(shortfuse, [spec], [str(static_touch), f"{mp}/s4"], cwd=start)
    assert os.listdir(start) == []
    if src is not None:
        # The kernel's directory is the backing one (a daemon tells its
        # clients its source): both work there.
        assert sorted(os.listdir(src)) == ["e", "s1", "s3"]
        assert sorted(os.listdir(src / "e")) == ["s2", "t"]
    else:
        # Refused, with the reason. (On an in-process mem mount, `mkdir`
        # made e in a mount of its own, so `cd e` failed and s2 never ran.)
        own_mem = spec.endswith("=mem")
        err = p.stderr.decode()
        assert err.count("refused: the program is statically linked") == (1 if own_mem else 2), err
        assert "refused: the program runs without LD_PRELOAD or SHORTFUSE_MOUNTS" in err, err
        assert q.stdout == b"refused 13\n", output(q, str(scratch))
        if not own_mem:
            assert listing(shortfuse, spec, mp, src, "e") == []
    assert r.returncode != 0
    assert b"refused: the program is statically linked" in r.stderr
    assert f"its argument {mp}/s4 is in a mount".encode() in r.stderr


@pytest.fixture(scope="module")
def spawn_on_mount():
    d = Path(tempfile.mkdtemp(prefix="shortfuse-spawn-"))
    yield cc(d, "spawn_on_mount", "-pthread")
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("intercept", ["both", "sud"])
@pytest.mark.parametrize("mount", ["passthrough", "mem", "serve-passthrough", "serve-mem"], indirect=True)
def test_posix_spawn_children_reach_the_mount(shortfuse, scratch, mount, intercept, spawn_on_mount):
    # A posix_spawn child runs without the parent's tables until its exec:
    # its calls used to reach the kernel unserved wherever no site was
    # rewritten for it: every call with Syscall User Dispatch alone (the
    # exec of a program on the mount failed with ENOENT), and the open of
    # posix_spawn_file_actions_addopen once the parent had a second thread
    # (that site can only be rewritten while a process has one). On a
    # mount without a source directory that open failed with ENOENT.
    spec, mp, src = mount
    env = {**os.environ, "SHORTFUSE_INTERCEPT": intercept}
    own_mem = spec.endswith("=mem")
    if src is not None:
        shutil.copy("/bin/echo", src / "echo")
        (src / "f").write_text("file on the mount\n")
    elif not own_mem:
        p = under(shortfuse, [spec], ["sh", "-c", f"cp /bin/echo {mp}/echo && echo file on the mount > {mp}/f"])
        assert p.returncode == 0, output(p, str(scratch))
    for i in range(3):
        if not own_mem:
            p = under(shortfuse, [spec], [str(spawn_on_mount), "run", f"{mp}/echo"], env=env)
            assert p.returncode == 0, output(p, str(scratch))
            assert p.stdout == b"spawned\n"
        # The parent of an in-process mem mount writes the file in its own
        # mount first: the child gets a copy of it.
        text = ["file on the mount\n"] if own_mem else []
        p = under(shortfuse, [spec], [str(spawn_on_mount), "open", f"{mp}/f", *text], env=env)
        assert p.returncode == 0, output(p, str(scratch))
        assert p.stdout == b"file on the mount\n"
        if own_mem:
            # Writing there would reach no file: refused.
            p = under(shortfuse, [spec], [str(spawn_on_mount), "write", f"{mp}/w"], env=env)
            assert p.returncode == 100 + errno.EACCES, output(p, str(scratch))
            continue
        # What the child writes through the opened descriptor is in the
        # file, for the next program of the mount.
        p = under(shortfuse, [spec], [str(spawn_on_mount), "write", f"{mp}/w{i}"], env=env)
        assert p.returncode == 0, output(p, str(scratch))
        p = under(shortfuse, [spec], ["cat", f"{mp}/w{i}"])
        assert p.returncode == 0, output(p, str(scratch))
        assert p.stdout == b"spawned\n"
