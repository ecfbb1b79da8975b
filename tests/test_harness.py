"""The harness says what a run covered: a plain `pytest tests/` mounts only
some configurations, and its summary names those it ran and those it left
out (conftest.pytest_terminal_summary)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_summary_names_configurations_run_and_left_out():
    env = dict(os.environ, SHORTFUSE_FS="mem", SHORTFUSE_TRANSPORTS="dev")
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "test_dev_readers.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.splitlines()
    ran = [l for l in lines if l.startswith("ran: ")]
    left = [l for l in lines if l.startswith("not run")]
    assert ran == ["ran: mem-dev"], p.stdout[-3000:]
    assert len(left) == 1, p.stdout[-3000:]
    names = set(left[0].split(": ", 1)[1].split(", "))
    assert {"mem-uring", "passthrough-dev", "sftp-uring", "dist-dev", "dist-etcd-dev"} <= names, names
    assert "mem-dev" not in names


WEDGED = r'''
import os, signal, subprocess, tempfile
import pytest
import sfmount


@pytest.mark.deadline(2)
def test_wedged():
    mp = tempfile.mkdtemp(prefix="sf-wedge-")
    subprocess.run([str(sfmount.shortfuse_bin()), "mount", "mem", mp], check=True, timeout=30,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = sfmount.pids_of_daemon(sfmount.shortfuse_bin(), mp)
    assert pids
    # The outer test cleans up after a run that this harness failed to free.
    with open(os.environ["WEDGED_LEFT"], "w") as f:
        f.write(mp + "\n" + "\n".join(map(str, pids)))
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        os.stat(os.path.join(mp, "x"))
    finally:
        for p in pids:
            os.kill(p, signal.SIGKILL)
        subprocess.run(["umount", "-l", mp], timeout=30)
        os.rmdir(mp)
'''


def test_a_test_wedged_in_a_fuse_wait_fails_and_the_run_goes_on(tmp_path):
    # The daemon is stopped, so the stat waits in the kernel where SIGALRM
    # cannot reach it: the run must end with this one test failed (its FUSE
    # connection aborted), not hang or exit without a summary.
    (tmp_path / "test_wedged.py").write_text(WEDGED)
    left = tmp_path / "left"
    env = dict(os.environ, PYTHONPATH=str(TESTS), SHORTFUSE_TEST_GRACE="1", WEDGED_LEFT=str(left))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest"]
    cmd += ["--rootdir", str(tmp_path), str(tmp_path / "test_wedged.py")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = p.communicate(timeout=60)
    finally:
        # A run this harness did not free waits on the stopped daemon, even
        # for SIGKILL: the daemon goes first.
        if left.exists():
            mp, *pids = left.read_text().split("\n")
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)
        p.kill()
        p.wait()
    out = stdout + stderr
    assert p.returncode == 1, out[-3000:]
    assert "1 failed" in stdout, out[-3000:]
    assert "aborted FUSE connection" in out, out[-3000:]


def test_finding_mounts_and_daemons_asks_no_daemon(tmp_path):
    """Which mounts and daemons exist is read from the kernel's tables and
    the daemons' command lines, never asked of a daemon: with one daemon
    stopped (as a stuck one would be), the harness still tells that its
    mount is there and finds another mount's daemon. A lookup of the
    stopped mount's root would wait in the kernel for as long as the daemon
    is stopped, as teardown once did behind a slow distfs daemon."""
    import sfmount

    binary = sfmount.shortfuse_bin()
    stopped, other = tmp_path / "stopped", tmp_path / "other"
    mounted = []
    for mp in (stopped, other):
        mp.mkdir()
        # attr_timeout=0: every lookup of the root reaches the daemon.
        r = sfmount.run([binary, "mount", "mem", mp, "-o", "attr_timeout=0,entry_timeout=0"])
        assert r.returncode == 0, r.stderr
        mounted.append(mp)
    pids = sfmount.pids_of_daemon(binary, str(stopped))
    assert pids, "no daemon found for the first mount"
    found: dict[str, object] = {}

    def look() -> None:
        found["mounted"] = sfmount.is_mounted(stopped)
        found["other"] = sfmount.pids_of_daemon(binary, str(other))

    for p in pids:
        os.kill(p, signal.SIGSTOP)
    looker = threading.Thread(target=look, daemon=True)
    try:
        looker.start()
        looker.join(20)
        answered_while_stopped = not looker.is_alive()
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
        looker.join(30)
        for mp in mounted:
            sfmount.run([binary, "umount", mp])
    assert answered_while_stopped, "the harness waited for a stopped daemon"
    assert found["mounted"] is True
    assert found["other"] and not set(found["other"]) & set(pids), found


def defined_twice(source: str) -> list[str]:
    """Top-level names a module binds more than once (def, class or a plain
    assignment): the later one silently replaces the first for every test
    above it that uses the name."""
    import ast
    import collections

    seen: collections.Counter[str] = collections.Counter()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            seen[node.name] += 1
        elif isinstance(node, ast.Assign):
            seen.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return sorted(name for name, n in seen.items() if n > 1)


def test_no_test_module_binds_a_top_level_name_twice():
    # Two tests once each defined a STAT_MISSING script; the second
    # replaced the first, and the first test ran the wrong program.
    assert defined_twice("A = 1\ndef f(): pass\nA = 2\n") == ["A"]
    twice = {p.name: d for p in sorted(TESTS.glob("*.py")) if (d := defined_twice(p.read_text()))}
    assert twice == {}
