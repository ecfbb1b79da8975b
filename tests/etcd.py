"""A real single-member etcd on loopback for the distfs scale-out tests.

Debian's `etcd-server` (scripts/setup.sh), free client and peer ports, its
data in a scratch directory; `Etcd.url` is what `shortfuse dist up --etcd`
takes. The Rust tests have the same fixture (shortfuse_dist::testutil::TestEtcd).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# etcd answers its health check about a second after start; a loaded CI
# machine takes several.
READY_WITHIN = 30.0


class EtcdError(Exception):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.settimeout(2)
            s.sendall(f"GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            body = b""
            while chunk := s.recv(4096):
                body += chunk
    except OSError:
        return False
    return b'"health":"true"' in body


class Etcd:
    """etcd started at construction, stopped (data removed) by `stop`."""

    def __init__(self, prefix: str = "shortfuse-etcd-"):
        binary = shutil.which("etcd")
        if binary is None:
            raise EtcdError("etcd is not installed: run scripts/setup.sh (Debian package etcd-server)")
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.port, peer = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.proc = subprocess.Popen(
            [
                binary,
                "--name=test",
                f"--data-dir={self.dir / 'data'}",
                f"--listen-client-urls={self.url}",
                f"--advertise-client-urls={self.url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--logger=zap",
                "--log-level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "etcd.log", "ab"),
        )
        deadline = time.monotonic() + READY_WITHIN
        while not _healthy(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "etcd.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise EtcdError(f"etcd did not become healthy on {self.url}: {log}")
            time.sleep(0.05)

    def freeze(self) -> None:
        """Stops etcd (SIGSTOP) as a stalled disk or a long GC pause would:
        connections stay open, nothing is answered until `thaw`."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def wait_healthy(self, within: float = READY_WITHIN) -> None:
        """Waits until etcd answers its health check (a read through raft,
        so what was queued before it, during a freeze, has been served)."""
        deadline = time.monotonic() + within
        while not _healthy(self.port):
            if time.monotonic() > deadline:
                raise EtcdError(f"etcd on {self.url} not healthy within {within:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.thaw()
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
