"""Mounting and unmounting the configurations under test.

A configuration is a file system served over a transport (``mem`` over
``dev``, ``passthrough`` over ``dev``, ...), or the optional peer ``bindfs``
(Debian's, a real FUSE mount that needs no shortfuse code). Each mount lives
in a fresh scratch directory; ``Mount.unmount`` always leaves the mount table
clean, falling back to a lazy unmount, and says when it had to.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRATCH_PREFIX = "shortfuse-test-"
SHORTFUSE_FS = ("mem", "passthrough")
PEERS = ("bindfs",)


class HarnessError(Exception):
    """The harness itself cannot go on (missing binary or tool)."""


def shortfuse_bin() -> Path:
    """The binary from SHORTFUSE_BIN, or target/debug/shortfuse (the Makefile builds it)."""
    raw = os.environ.get("SHORTFUSE_BIN")
    if raw:
        path = Path(raw)
    else:
        target = os.environ.get("CARGO_TARGET_DIR")
        path = (Path(target) if target else REPO / "target") / "debug" / "shortfuse"
    if not path.is_absolute():
        path = REPO / path
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise HarnessError(
            f"shortfuse binary not found at {path}: run `make build` (cargo build --workspace) "
            "or point SHORTFUSE_BIN at it"
        )
    return path


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise HarnessError(f"required tool `{name}` is not installed: run scripts/setup.sh")
    return path


def _unescape_mountinfo(field_: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field_):
        if field_[i] == "\\" and i + 3 < len(field_) and field_[i + 1 : i + 4].isdigit():
            out.append(chr(int(field_[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field_[i])
            i += 1
    return "".join(out)


@dataclass
class MountEntry:
    mountpoint: str
    fstype: str
    source: str


def mount_table() -> list[MountEntry]:
    entries = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            parts = left.split()
            rparts = right.split()
            entries.append(
                MountEntry(
                    mountpoint=_unescape_mountinfo(parts[4]),
                    fstype=rparts[0] if rparts else "",
                    source=_unescape_mountinfo(rparts[1]) if len(rparts) > 1 else "",
                )
            )
    return entries


def mounts_at(path: str | os.PathLike) -> list[MountEntry]:
    p = os.path.realpath(path)
    return [e for e in mount_table() if e.mountpoint == p]


def is_mounted(path: str | os.PathLike) -> bool:
    return bool(mounts_at(path))


def leaked_mounts() -> list[str]:
    """Mounts left in any scratch directory of this suite."""
    tmp = os.path.realpath(tempfile.gettempdir())
    return [e.mountpoint for e in mount_table() if e.mountpoint.startswith(os.path.join(tmp, SCRATCH_PREFIX))]


def wait_until(pred, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


def run(cmd: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    """Runs a command with a deadline; a hang becomes a clear failure, not a stuck CI job."""
    try:
        return subprocess.run(
            [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"command did not finish within {timeout}s: {' '.join(map(str, cmd))}") from e


def pids_of_daemon(binary: Path, mountpoint: str) -> list[int]:
    """Processes of `binary` whose command line names `mountpoint`."""
    found = []
    target = os.path.realpath(binary)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            exe = os.readlink(f"/proc/{entry}/exe")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if exe.removesuffix(" (deleted)") != target:
            continue
        if any(a and os.path.realpath(a.decode(errors="replace")) == mountpoint for a in argv):
            found.append(int(entry))
    return found


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@dataclass
class Config:
    fs: str
    transport: str

    @property
    def id(self) -> str:
        return self.fs if self.fs in PEERS else f"{self.fs}-{self.transport}"

    @property
    def is_shortfuse(self) -> bool:
        return self.fs not in PEERS

    @property
    def has_source(self) -> bool:
        return self.fs in ("passthrough", "bindfs")


def configs_from_env() -> list[Config]:
    """File systems from SHORTFUSE_FS (default mem,passthrough; `bindfs` may be added as a peer),
    transports from SHORTFUSE_TRANSPORTS (default dev)."""
    fss = [s for s in os.environ.get("SHORTFUSE_FS", ",".join(SHORTFUSE_FS)).split(",") if s]
    transports = [t for t in os.environ.get("SHORTFUSE_TRANSPORTS", "dev").split(",") if t]
    out = []
    for fs in fss:
        if fs in PEERS:
            out.append(Config(fs, "kernel"))
        else:
            out.extend(Config(fs, t) for t in transports)
    return out


@dataclass
class Mount:
    """One mounted configuration in its scratch directory `base`.

    `path` is the mount point, `source` the backing directory (passthrough,
    bindfs) or None; `unmount()` is idempotent.
    """

    config: Config
    base: Path
    path: Path
    source: Path | None
    options: list[str] = field(default_factory=list)
    daemon_pids: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def mount_command(self) -> list[str]:
        if self.config.fs == "bindfs":
            cmd = [require_tool("bindfs")]
            if self.options:
                cmd += ["-o", ",".join(self.options)]
            return cmd + [str(self.source), str(self.path)]
        cmd = [str(shortfuse_bin()), "mount", self.config.fs]
        if self.source is not None:
            cmd.append(str(self.source))
        cmd.append(str(self.path))
        if self.options:
            cmd += ["-o", ",".join(self.options)]
        cmd += ["--transport", self.config.transport]
        return cmd

    def mount(self) -> None:
        cmd = self.mount_command()
        r = run(cmd, timeout=30)
        if r.returncode != 0:
            raise AssertionError(
                f"mount failed (exit {r.returncode}): {' '.join(cmd)}\nstdout: {r.stdout}\nstderr: {r.stderr}"
            )
        # The CLI returns once mounted; allow a short grace for peers that do not.
        if not wait_until(lambda: is_mounted(self.path), 5):
            raise AssertionError(f"`{' '.join(cmd)}` exited 0 but {self.path} is not in /proc/self/mountinfo")
        if self.config.is_shortfuse:
            self.daemon_pids = pids_of_daemon(shortfuse_bin(), str(self.path))

    def umount_command(self, lazy: bool = False) -> list[str]:
        if self.config.is_shortfuse:
            return [str(shortfuse_bin()), "umount"] + (["-l"] if lazy else []) + [str(self.path)]
        return [require_tool("fusermount3"), "-u"] + (["-z"] if lazy else []) + [str(self.path)]

    def unmount(self) -> None:
        if not is_mounted(self.path):
            return
        r = run(self.umount_command(), timeout=30)
        if r.returncode != 0 or not wait_until(lambda: not is_mounted(self.path), 5):
            self.warnings.append(f"plain unmount failed (exit {r.returncode}): {r.stderr.strip()}")
            r = run(self.umount_command(lazy=True), timeout=30)
            if r.returncode != 0 or not wait_until(lambda: not is_mounted(self.path), 5):
                self.warnings.append(f"lazy unmount failed (exit {r.returncode}): {r.stderr.strip()}")
                # Last resort so that one broken CLI does not leak mounts into the next test.
                while is_mounted(self.path):
                    if run(["umount", "-l", str(self.path)], timeout=30).returncode != 0:
                        break

    def wait_daemon_exit(self, timeout: float = 10) -> list[int]:
        """Daemon pids still alive after `timeout` seconds."""
        wait_until(lambda: not any(pid_alive(p) for p in self.daemon_pids), timeout)
        return [p for p in self.daemon_pids if pid_alive(p)]

    def kill_daemons(self) -> None:
        for p in self.daemon_pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def new_scratch(tag: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{tag}-"))


def make_mount(config: Config, options: list[str] | None = None, layout: str = "flat") -> Mount:
    """Creates a scratch dir, source and mount point, and mounts.

    layout="flat": base/src and base/mnt. layout="split": base/a/src and
    base/m/mnt, so that the source's parent and the mount point's parent differ
    (escape tests tell them apart).
    """
    base = new_scratch(config.id)
    if layout == "split":
        src, mnt = base / "a" / "src", base / "m" / "mnt"
    else:
        src, mnt = base / "src", base / "mnt"
    mnt.mkdir(parents=True)
    source = None
    if config.has_source:
        src.mkdir(parents=True)
        source = src
    m = Mount(config=config, base=base, path=mnt, source=source, options=list(options or []))
    try:
        m.mount()
    except BaseException:
        m.unmount()
        remove_scratch(base)
        raise
    return m


def remove_scratch(base: Path) -> None:
    if leaked := [p for p in leaked_mounts() if p.startswith(str(base))]:
        raise AssertionError(f"refusing to remove {base}: still mounted at {leaked}")
    shutil.rmtree(base, ignore_errors=True)
