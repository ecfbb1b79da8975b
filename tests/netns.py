"""A distfs deployment across network namespaces, for the scale-out tests.

One "storage" namespace runs the S3 server (shortfuse-s3) and either the
one distfs server (`start_server`) or etcd (`start_etcd`, with an agent in
every host namespace); each "host" namespace runs client mounts. Every host
has a point-to-point veth link to the storage namespace; the storage side
answers on one address, STORAGE_IP, on its loopback, so every host names
storage the same way. Addresses and link names live inside the namespaces
only (the links are created in them, never in the root namespace), so
concurrent runs do not collide; namespace names carry the pytest pid.

`ip netns exec` would also give each command a mount namespace of its own,
which hides a FUSE mount from the test: commands run under `nsenter
--net=/run/netns/NAME` instead, which changes the network namespace only.

`Deployment.close()` tears everything down in order (mounts, then the
processes we started, then the namespaces with their links), and is safe to
call after a partial start.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import sfmount

STORAGE_IP = "10.77.0.1"
S3_PORT = 8014
ETCD_PORT = 2379
AGENT_PORT = 7420
S3_KEY, S3_SECRET = "distfs", "distfs-secret"
BUCKET = "distfs"


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    r = sfmount.run(cmd, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"`{' '.join(map(str, cmd))}` failed (exit {r.returncode}): {r.stderr.strip()}")
    return r


def sibling_bin(name: str) -> Path:
    """A workspace binary next to the shortfuse binary (cargo build --workspace builds both)."""
    path = sfmount.shortfuse_bin().parent / name
    if not os.access(path, os.X_OK):
        raise sfmount.HarnessError(f"{path} not found: run `cargo build --workspace` (or -p {name})")
    return path


class Netns:
    """A network namespace named `name`, with its loopback up."""

    def __init__(self, name: str):
        self.name = name
        _run(["ip", "netns", "add", name])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def cmd(self, argv: list) -> list[str]:
        """`argv` run in this network namespace only (the mount namespace stays ours)."""
        return ["nsenter", f"--net={self.path}", "--", *map(str, argv)]

    def ip(self, *args: str) -> None:
        _run(["ip", "-n", self.name, *args])

    def delete(self) -> None:
        sfmount.run(["ip", "netns", "del", self.name], timeout=30)


class Proc:
    """A long-running server started in a namespace; it prints one line once it serves."""

    def __init__(self, ns: Netns, argv: list, ready: str | None, log: Path):
        self.argv = [str(a) for a in argv]
        self.log = log
        self.out = open(log, "w")
        self.proc = subprocess.Popen(
            ns.cmd(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if ready else self.out,
            stderr=self.out,
            text=True,
            preexec_fn=sfmount._die_with_parent,
        )
        self.line = ""
        if ready:
            self.line = self.proc.stdout.readline()
            if ready not in self.line:
                self.stop()
                raise AssertionError(f"{' '.join(self.argv)} did not start: {self.line!r} {log.read_text()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.stdout:
                self.proc.stdout.close()
            self.out.close()


class Host:
    """A host namespace: its link to storage, its agent (if any) and its mounts."""

    def __init__(self, dep: "Deployment", index: int):
        self.dep, self.index = dep, index
        self.ns = Netns(f"{dep.prefix}h{index}")
        self.ip = f"10.77.{index + 1}.2"
        self.agent: Proc | None = None
        self.mounts: list[Path] = []

    def link(self) -> None:
        # Both ends are made inside the namespaces: nothing appears in ours.
        st = self.dep.storage
        st.ip("link", "add", f"h{self.index}", "type", "veth", "peer", "name", "st", "netns", self.ns.name)
        st.ip("addr", "add", f"10.77.{self.index + 1}.1/30", "dev", f"h{self.index}")
        st.ip("link", "set", f"h{self.index}", "up")
        self.ns.ip("addr", "add", f"{self.ip}/30", "dev", "st")
        self.ns.ip("link", "set", "st", "up")
        self.ns.ip("route", "add", f"{STORAGE_IP}/32", "via", f"10.77.{self.index + 1}.1")

    def set_link(self, up: bool) -> None:
        """Cuts (or restores) this host's only link: a network partition."""
        self.ns.ip("link", "set", "st", "up" if up else "down")
        if up:
            # A link set down loses its routes.
            self.ns.ip("route", "replace", f"{STORAGE_IP}/32", "via", f"10.77.{self.index + 1}.1")

    def server_addr(self) -> str:
        return f"127.0.0.1:{AGENT_PORT}" if self.agent else self.dep.server_addr

    def start_agent(self) -> None:
        """This host's agent: metadata and leases in the storage namespace's
        etcd, blocks in its S3 server."""
        self.agent = self.dep.start(
            self.ns,
            [
                sfmount.shortfuse_bin(),
                "dist",
                "up",
                "--etcd",
                f"http://{STORAGE_IP}:{ETCD_PORT}",
                "--s3",
                self.dep.s3_url,
                "--data",
                self.dep.base / f"agent{self.index}",
                "--listen",
                f"127.0.0.1:{AGENT_PORT}",
            ],
            " on ",
            f"agent{self.index}",
        )

    def mount(self, name: str, *options: str) -> Path:
        """`shortfuse mount dist` run in this host's namespace; the mount is in ours."""
        mp = self.dep.base / f"h{self.index}-{name}"
        mp.mkdir()
        argv = [sfmount.shortfuse_bin(), "mount", "dist", self.server_addr(), mp]
        for o in options:
            argv += ["-o", o]
        r = sfmount.run(self.ns.cmd(argv), timeout=30)
        assert r.returncode == 0, f"{' '.join(map(str, argv))}: {r.stderr}"
        assert sfmount.wait_until(lambda: sfmount.is_mounted(mp), 5), mp
        self.mounts.append(mp)
        return mp

    def daemon_pids(self, mp: Path) -> list[int]:
        return sfmount.pids_of_daemon(sfmount.shortfuse_bin(), str(mp))

    def unmount_all(self) -> list[str]:
        problems = []
        for mp in self.mounts:
            pids = self.daemon_pids(mp)
            if sfmount.is_mounted(mp):
                try:
                    sfmount.run([str(sfmount.shortfuse_bin()), "umount", str(mp)], timeout=20)
                except AssertionError as e:
                    problems.append(f"{mp}: {e}")
                if sfmount.is_mounted(mp):
                    # A daemon that cannot write back (its agent or storage
                    # gone) holds the unmount: it goes, the mount is detached.
                    for p in pids:
                        try:
                            os.kill(p, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    sfmount.run(["umount", "-l", str(mp)], timeout=20)
            if not sfmount.wait_until(lambda: not any(sfmount.pid_alive(p) for p in pids), 10):
                problems.append(f"{mp}: daemon outlived its mount")
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.mounts.clear()
        return problems


class Deployment:
    """The storage namespace (S3, etcd, the server) and `hosts` host namespaces."""

    def __init__(self, hosts: int = 2):
        for tool in ("ip", "nsenter"):
            sfmount.require_tool(tool)
        self.base = sfmount.new_scratch("netns")
        self.prefix = f"sf{os.getpid()}-"
        self.procs: list[Proc] = []
        self.hosts: list[Host] = []
        self.storage: Netns | None = None
        self.server: Proc | None = None
        self.server_addr = ""
        try:
            self.storage = Netns(f"{self.prefix}st")
            self.storage.ip("addr", "add", f"{STORAGE_IP}/32", "dev", "lo")
            for i in range(hosts):
                h = Host(self, i)
                self.hosts.append(h)
                h.link()
            self.s3 = self.start(
                self.storage,
                [
                    sibling_bin("shortfuse-s3"),
                    self.base / "s3",
                    "--listen",
                    f"0.0.0.0:{S3_PORT}",
                    "--bucket",
                    BUCKET,
                    "--access-key",
                    S3_KEY,
                    "--secret-key",
                    S3_SECRET,
                ],
                "serving",
                "s3",
            )
        except BaseException:
            self.close()
            raise

    @property
    def s3_url(self) -> str:
        return f"http://{S3_KEY}:{S3_SECRET}@{STORAGE_IP}:{S3_PORT}/{BUCKET}"

    def start(self, ns: Netns, argv: list, ready: str | None, tag: str) -> Proc:
        p = Proc(ns, argv, ready, self.base / f"{tag}.log")
        self.procs.append(p)
        return p

    def start_etcd(self) -> None:
        """etcd in the storage namespace, and an agent on every host."""
        url = f"http://{STORAGE_IP}:{ETCD_PORT}"
        peer = "http://127.0.0.1:2380"
        self.start(
            self.storage,
            [
                "etcd",
                "--name=storage",
                f"--data-dir={self.base / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=storage={peer}",
                "--log-level=warn",
                "--logger=zap",
            ],
            None,
            "etcd",
        )
        for h in self.hosts:
            # The agent connects at start: retried until etcd listens.
            deadline = time.monotonic() + 20
            while True:
                try:
                    h.start_agent()
                    break
                except AssertionError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.3)

    def start_server(self) -> str:
        """The one distfs server in the storage namespace: metadata and
        leases under its data directory, blocks in S3 (the deployment until
        metadata moves to etcd)."""
        self.server = self.start(
            self.storage,
            [
                sfmount.shortfuse_bin(),
                "dist",
                "up",
                "--data",
                self.base / "server",
                "--listen",
                f"0.0.0.0:{AGENT_PORT}",
                "--s3",
                self.s3_url,
            ],
            " on ",
            "server",
        )
        self.server_addr = f"{STORAGE_IP}:{AGENT_PORT}"
        return self.server_addr

    def restart_server(self) -> None:
        assert self.server is not None
        self.server.stop(signal.SIGKILL)
        self.procs.remove(self.server)
        self.start_server()

    def close(self) -> None:
        problems = []
        for h in self.hosts:
            # A partitioned daemon must reach storage again to write back
            # and exit; a link never made is no problem here.
            try:
                h.set_link(True)
            except AssertionError:
                pass
            try:
                problems += h.unmount_all()
            except AssertionError as e:
                problems.append(str(e))
        for p in reversed(self.procs):
            try:
                p.stop()
            except subprocess.TimeoutExpired:
                problems.append(f"{p.argv[0]} did not stop")
        self.procs.clear()
        for h in self.hosts:
            h.ns.delete()
        if self.storage:
            self.storage.delete()
        left = [n for n in _netns_names() if n.startswith(self.prefix)]
        if not sfmount.leaked_mounts():
            shutil.rmtree(self.base, ignore_errors=True)
        assert not left, f"namespaces left behind: {left}"
        assert not problems, "; ".join(problems)


def _netns_names() -> list[str]:
    try:
        return os.listdir("/run/netns")
    except FileNotFoundError:
        return []


def wait_for(pred, timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(step)
