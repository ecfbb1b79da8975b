"""Programs that used to crash, hang or write outside the mount under
`shortfuse run`: a Go program whose goroutines (stacks of a few
kilobytes) do file I/O at once, a fork while another thread has a
system-call site rewritten, `git clone` on a passthrough mount (a
multi-threaded program that forks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from test_run import output, run, scratch, shortfuse, under  # noqa: F401 (fixtures)

PROGRAMS = Path(__file__).resolve().parent / "programs"


def cc(scratch: Path, name: str, *flags: str) -> Path:
    exe = scratch / name
    p = run(["gcc", "-O2", "-Wall", "-o", str(exe), str(PROGRAMS / f"{name}.c"), *flags])
    assert p.returncode == 0, p.stderr.decode()
    return exe


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


@pytest.mark.parametrize("fs", ["mem", "passthrough"])
def test_go_program_with_many_goroutines_doing_file_io(shortfuse, scratch, gofs, fs):
    # The hook used to run on the goroutine's stack and overflow it
    # (fatal error: unknown caller pc, SIGSEGV, SIGBUS).
    native = scratch / "native"
    native.mkdir()
    assert run([str(gofs), str(native)]).stdout == b"640\n"
    mp = scratch / "mnt"
    src = scratch / "src"
    src.mkdir()
    spec = f"{mp}=mem" if fs == "mem" else f"{mp}=passthrough:{src}"
    for _ in range(4):
        p = under(shortfuse, [spec], [str(gofs), str(mp)])
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
