"""The harness says what a run covered: a plain `pytest tests/` mounts only
some configurations, and its summary names those it ran and those it left
out (conftest.pytest_terminal_summary)."""

from __future__ import annotations

import os
import subprocess
import sys
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
