"""Credentials under the preload shim: every request carries the caller's
current fsuid, fsgid and supplementary groups, the checks are the kernel's
(ext4's results), and other users reach a root daemon only when it allows
them.

- crates/shortfuse-preload/tests/c/perm_drop.c builds a tree as root, then drops to uid/gid 65534 with
  supplementary groups 65532 and 65531 (setgroups, setresgid, setresuid)
  and prints what opens, creates, removes, renames, chmod, chown, truncate
  and utimensat give, who owns what it made, and whether chmod, link,
  rename and utimensat move the inode's ctime. Its output on each path
  must be the one it gives natively on ext4: in-process passthrough and
  mem, `serve passthrough` and `serve mem` (-o allow_other, the daemon's
  permission to serve users other than its own, which a program that drops
  root becomes) and `serve mem -o default_permissions,allow_other`.
- Without allow_other, a program that dropped root is another user to a
  root daemon: its calls fail with EACCES, as on a kernel mount without
  allow_other.
- A program started as another user finds root's daemon, is refused with a
  clear error (exit status 2, before the program runs), and with `serve -o
  allow_other` is served with its own credentials.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import sfmount
import test_ring
import test_run

PROGRAM = Path(__file__).resolve().parent.parent / "crates/shortfuse-preload/tests/c/perm_drop.c"

shortfuse = test_run.shortfuse
scratch = test_ring.scratch


@pytest.fixture(scope="module")
def perm(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("perm") / "perm_drop"
    p = subprocess.run(
        ["cc", "-O1", "-Wall", "-o", str(out), str(PROGRAM)], capture_output=True, timeout=120
    )
    assert p.returncode == 0, p.stderr.decode()
    # Other users run it too.
    out.parent.chmod(0o755)
    return out


def native(perm: Path, scratch: Path) -> str:
    d = scratch / "native"
    d.mkdir(mode=0o755)
    p = subprocess.run([str(perm), str(d)], capture_output=True, timeout=60)
    assert p.returncode == 0, p
    return p.stdout.decode()


def run_under(shortfuse: Path, mount: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(shortfuse), "run", "-m", mount, "--", *argv], capture_output=True, timeout=120)


def in_process(scratch: Path, fs: str) -> tuple[Path, str]:
    """The mount point and `run -m` argument of an in-process `fs`
    (passthrough over scratch/src, or mem)."""
    mp = scratch / "mp"
    if fs == "passthrough":
        src = scratch / "src"
        src.mkdir(mode=0o755)
        return mp, f"{mp}=passthrough:{src}"
    return mp, f"{mp}=mem"


def served(scratch: Path, fs: str) -> tuple[Path, list[str]]:
    """The mount point and `serve` arguments (without options) of `fs`
    (passthrough over scratch/src, or mem)."""
    mp = scratch / "mp"
    args = [fs]
    if fs == "passthrough":
        src = scratch / "src"
        src.mkdir(mode=0o755)
        args.append(str(src))
    return mp, [*args, str(mp)]


@pytest.mark.parametrize("fs", ["passthrough", "mem"])
def test_a_program_that_drops_root_gets_ext4_results_in_process(shortfuse, perm, scratch, fs):
    want = native(perm, scratch)
    mp, mount = in_process(scratch, fs)
    p = run_under(shortfuse, mount, [str(perm), str(mp)])
    assert p.returncode == 0, p
    assert p.stdout.decode() == want, p.stderr.decode()


@pytest.mark.parametrize(
    "fs,options",
    [
        ("passthrough", "allow_other"),
        ("mem", "allow_other"),
        ("mem", "default_permissions,allow_other"),
    ],
)
def test_a_program_that_drops_root_gets_ext4_results_over_the_ring(shortfuse, perm, scratch, fs, options):
    want = native(perm, scratch)
    mp, args = served(scratch, fs)
    daemon = test_ring.Daemon(shortfuse, scratch, [*args, "-o", options], mp)
    try:
        p = run_under(shortfuse, str(mp), [str(perm), str(mp)])
    finally:
        daemon.stop()
    assert p.returncode == 0, p
    assert p.stdout.decode() == want, p.stderr.decode()


def test_without_allow_other_a_program_that_dropped_root_is_refused(shortfuse, perm, scratch):
    mp = scratch / "mp"
    daemon = test_ring.Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
    try:
        p = run_under(shortfuse, str(mp), [str(perm), str(mp)])
    finally:
        daemon.stop()
    assert p.returncode == 0, p
    out = p.stdout.decode()
    # Made as root, refused once it is uid 65534: even reading its own files.
    assert "open own dir 0600 read-only: EACCES" in out, out
    assert "open rootfile for reading: EACCES" in out, out
    assert "create in own dir: EACCES" in out, out


def run_as_nobody(shortfuse: Path, mp: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """`shortfuse run -m MP -- ARGV` started as uid/gid 65534."""
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(shortfuse), "run", "-m", str(mp), "--"]
    return subprocess.run(cmd + argv, capture_output=True, timeout=120)


def test_another_user_reaches_a_root_daemon_only_with_allow_other(shortfuse, scratch):
    mp = scratch / "mp"
    marker = scratch / "ran"
    scratch.chmod(0o777)
    daemon = test_ring.Daemon(shortfuse, scratch, ["mem", str(mp)], mp)
    try:
        p = run_as_nobody(shortfuse, mp, ["touch", str(marker)])
    finally:
        daemon.stop()
    assert p.returncode == 2, p
    err = p.stderr.decode()
    assert "serves only its own user's programs" in err and "-o allow_other" in err, err
    assert not marker.exists()
    # With allow_other: served, as itself.
    (scratch / "serve.log").unlink()
    daemon = test_ring.Daemon(shortfuse, scratch, ["mem", str(mp), "-o", "allow_other"], mp)
    try:
        setup = f"mkdir -m 777 {mp}/pub && echo root > {mp}/rootfile"
        assert run_under(shortfuse, str(mp), ["sh", "-c", setup]).returncode == 0
        script = (
            f"touch {mp}/pub/mine && stat -c %u:%g {mp}/pub/mine && "
            f"(echo x > {mp}/rootfile) 2>&1; cat {mp}/rootfile; mkdir {mp}/d 2>&1; echo done"
        )
        p = run_as_nobody(shortfuse, mp, ["sh", "-c", script])
    finally:
        daemon.stop()
    assert p.returncode == 0, p
    out = p.stdout.decode()
    # mem's root directory is the daemon's (root's), mode 0755.
    assert out.splitlines()[0] == "65534:65534", out
    assert "Permission denied" in out and "root" in out.splitlines(), out
    assert out.count("Permission denied") == 2 and out.endswith("done\n"), out


def test_another_users_program_reads_the_descriptor_it_inherited_at_exec(shortfuse, scratch):
    """A node that only an inherited open file description holds (`exec cat
    < f`: cat looked nothing up) is named by the new image's connection once
    it has shown the daemon that description: another user's program too,
    which the daemon otherwise lets name only the nodes it looked up."""
    mp = scratch / "mp"
    scratch.chmod(0o777)
    daemon = test_ring.Daemon(shortfuse, scratch, ["mem", str(mp), "-o", "allow_other"], mp)
    try:
        assert run_under(shortfuse, str(mp), ["mkdir", "-m", "777", f"{mp}/pub"]).returncode == 0
        p = run_as_nobody(shortfuse, mp, ["sh", "-c", f"echo hello > {mp}/pub/f && exec cat < {mp}/pub/f"])
    finally:
        daemon.stop()
    assert p.returncode == 0, p
    assert p.stdout.decode() == "hello\n", p
