"""A real OpenSSH server on loopback for the `sftp` configurations.

Generated host and client keys in a scratch directory, a free port,
`internal-sftp`, login by key only (root by key, as the suites run as root).
One server serves the whole pytest session (started on first use by
`server()`, stopped by `stop()` at the end of the session); every mount
names its own directory on it, so mounts stay apart.

sshd's per-connection session processes call setsid(), so killing the
listener does not take them along: `kill_sessions()` kills the session
processes (as a crashed server would), `stop()` the listener and every
session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


class SshdError(Exception):
    """The server cannot run (missing sshd, no port, it exits)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out


def _descendants(pid: int) -> list[int]:
    out = []
    for c in _children(pid):
        out.append(c)
        out += _descendants(c)
    return out


class Sshd:
    def __init__(self, prefix: str):
        if not os.path.exists(SSHD):
            raise SshdError(f"{SSHD} is missing: the sftp configurations need openssh-server (scripts/setup.sh)")
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        # sshd refuses to start without its privilege-separation directory.
        os.makedirs("/run/sshd", exist_ok=True)
        for key in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key, "-f", str(self.dir / key)],
                check=True,
                capture_output=True,
                timeout=30,
            )
        shutil.copy(self.dir / "client_key.pub", self.dir / "authorized_keys")
        (self.dir / "sshd_config").write_text(
            f'HostKey "{self.dir}/host_key"\nListenAddress 127.0.0.1\nPidFile none\n'
            f'AuthorizedKeysFile "{self.dir}/authorized_keys"\nPermitRootLogin prohibit-password\n'
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxStartups 100\nMaxSessions 100\nSubsystem sftp internal-sftp\nLogLevel ERROR\n"
        )
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def key(self) -> Path:
        return self.dir / "client_key"

    def start(self) -> None:
        """Starts the listener (again, on the same port) and waits until it accepts."""
        assert self.proc is None or self.proc.poll() is not None, "sshd already running"
        deadline = time.monotonic() + 15
        while True:
            self.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config"), "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=open(self.dir / "sshd.log", "ab"),
            )
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return
                except OSError:
                    time.sleep(0.02)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                raise SshdError(f"sshd did not listen on 127.0.0.1:{self.port} within 15 s")
            # The previous listener's port can linger a moment after a kill.
            if time.monotonic() >= deadline:
                log = (self.dir / "sshd.log").read_text(errors="replace")
                raise SshdError(f"sshd exited with {self.proc.returncode}: {log[-2000:]}")
            time.sleep(0.1)

    def sessions(self) -> list[int]:
        """Pids of the processes serving connections (the listener's descendants)."""
        return _descendants(self.proc.pid) if self.proc and self.proc.poll() is None else []

    def kill_sessions(self) -> list[int]:
        """SIGKILLs every session process; the listener stays. Returns their pids."""
        pids = self.sessions()
        for p in reversed(pids):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def stop_listener(self) -> None:
        """Kills the listener alone: sessions live on, new connections are refused."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        pids = self.sessions()
        self.stop_listener()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def target(self, path: str | os.PathLike) -> str:
        """The `[user@]host:path` of a local directory, for `shortfuse mount sftp`."""
        return f"root@127.0.0.1:{os.path.realpath(path)}"

    def options(self) -> list[str]:
        """Port, key and a known_hosts file of the server's own (trusted on first use)."""
        return [
            f"port={self.port}",
            f"identity={self.key}",
            f"UserKnownHostsFile={self.dir / 'known_hosts'}",
            "StrictHostKeyChecking=accept-new",
        ]


_SERVER: Sshd | None = None


def server(prefix: str = "shortfuse-sshd-") -> Sshd:
    """The session's server, started on first use (again if it died)."""
    global _SERVER
    if _SERVER is None:
        _SERVER = Sshd(prefix)
    elif _SERVER.proc is None or _SERVER.proc.poll() is not None:
        _SERVER.start()
    return _SERVER


def stop() -> None:
    global _SERVER
    if _SERVER is not None:
        _SERVER.stop()
        _SERVER = None
