"""Mounting and unmounting the configurations under test.

A configuration is a named file system setup (``FILE_SYSTEMS``: the CLI's
file system, its sources and mount options, and what it legitimately does
not support) served over a transport (``mem`` over ``dev``,
``passthrough+kp`` over ``uring``, ...), or the optional peer ``bindfs``
(Debian's, a real FUSE mount that needs no shortfuse code). Each mount lives
in a fresh scratch directory; ``Mount.unmount`` always leaves the mount table
clean, falling back to a lazy unmount, and says when it had to.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import sshd
from etcd import Etcd, EtcdError

REPO = Path(__file__).resolve().parent.parent
# The pid keeps concurrent pytest runs (engineers, CI) out of each other's
# scratch dirs, and the leak check to this run's own mounts.
SCRATCH_PREFIX = f"shortfuse-test-{os.getpid()}-"
PEERS = ("bindfs",)


@dataclass(frozen=True)
class Unsupported:
    """A feature a file system refuses by design, and the errno it answers with."""

    errno: str
    reason: str


@dataclass(frozen=True)
class FsSpec:
    """How to mount one configuration with the CLI.

    `sources`: 0 (no source), 1 (one directory) or K (K directories passed
    comma-separated, as stripe takes them). `unsupported` maps a feature name
    (see observe.FEATURES) to the refusal the suites expect instead of ext4's
    behaviour; everything not listed must match ext4. `fsx_ops` overrides the
    length of the fsx run (None: SHORTFUSE_FSX_OPS), `fio_mib` the size of each
    fio verify job.
    """

    fs: str
    sources: int = 0
    options: tuple[str, ...] = ()
    unsupported: dict[str, Unsupported] = field(default_factory=dict)
    fsx_ops: int | None = None
    fio_mib: int = 32
    # The source is the data directory of a `shortfuse dist up` server that
    # the harness runs (see dist_server); the mount gets the server's address.
    dist_server: bool = False
    # With dist_server: the server is an agent of the scale-out mode, its
    # metadata and leases on an etcd of its own (tests/etcd.py).
    dist_etcd: bool = False
    # The test modules (file names under tests/) that mount it; empty: all.
    suites: tuple[str, ...] = ()
    # Its tests' deadline in seconds when longer than the default.
    deadline: float = 0
    # The source is served by the session's loopback sshd (tests/sshd.py);
    # the mount gets `root@127.0.0.1:SOURCE` and the server's port and key.
    sshd_server: bool = False


# stripe and pack share their namespace code (crates/shortfuse-fs/src/pack/metafs.rs),
# and with it the list of what they do not do: nothing the suites test.
_METAFS_UNSUPPORTED: dict[str, Unsupported] = {}

# What distfs does not do, embedded or on etcd.
_DIST_UNSUPPORTED = {
    "xattr": Unsupported("EOPNOTSUPP", "no extended attributes (ENOSYS; the kernel reports EOPNOTSUPP)"),
    "fallocate": Unsupported("EOPNOTSUPP", "no FALLOCATE (ENOSYS; the kernel reports EOPNOTSUPP)"),
    "seek_hole": Unsupported("", "no LSEEK: the kernel's generic llseek reports the whole file as data"),
}

# Every configuration the suites know, in one place. SHORTFUSE_FS picks among them.
FILE_SYSTEMS: dict[str, FsSpec] = {
    "mem": FsSpec("mem"),
    # The daemon serves file data: kernel passthrough, `shortfuse mount passthrough`'s
    # default as root, is turned off so that READ and WRITE reach the daemon.
    "passthrough": FsSpec("passthrough", sources=1, options=("no_passthrough",)),
    # Kernel passthrough: after open, READ/WRITE go from the kernel to the source file directly
    # (the mount's default as root; said here so that the configuration does not hang on it).
    "passthrough+kp": FsSpec("passthrough", sources=1, options=("passthrough",), fsx_ops=30_000),
    # 64 KiB stripes over 3 directories: the suites' files (up to a few MiB) cross every chunk boundary.
    "stripe": FsSpec("stripe", sources=3, options=("stripe_size=64K",), unsupported=_METAFS_UNSUPPORTED, fsx_ops=30_000),
    "pack": FsSpec("pack", sources=1, unsupported=_METAFS_UNSUPPORTED, fsx_ops=30_000),
    # distfs in its default (lease) mode, one embedded server per scratch dir.
    "dist": FsSpec(
        "dist",
        sources=1,
        dist_server=True,
        unsupported=_DIST_UNSUPPORTED,
        fsx_ops=30_000,
    ),
    # The same through an agent on etcd (`dist up --etcd`): every metadata
    # operation an etcd transaction, leases and sessions on etcd. The
    # behaviour suite only: the data path (fsx, fio) and the mount's
    # lifetime are the embedded configuration's code. Each create costs
    # three etcd requests in a row (the kernel's LOOKUP, the create, the
    # directory's GETATTR), so readdir_10000_concurrent takes three to four
    # times as long as on dist (168 s against 57 s at load 21 on 2 cores,
    # 174 s against 44 s at load 23): hence its longer deadline.
    "dist-etcd": FsSpec(
        "dist",
        sources=1,
        dist_server=True,
        dist_etcd=True,
        unsupported=_DIST_UNSUPPORTED,
        fsx_ops=10_000,
        suites=("test_posix.py",),
        deadline=360,
    ),
    # The source directory over SFTP v3 from a real OpenSSH server on
    # loopback, with what the protocol cannot carry.
    "sftp": FsSpec(
        "sftp",
        sources=1,
        sshd_server=True,
        unsupported={
            "hardlink_inode": Unsupported(
                "",
                "hard links are made (hardlink@openssh.com), but SFTP v3 carries no inode number or link count: "
                "each name is an inode of its own (nlink 1), whose cached attributes do not see writes through another",
            ),
            "fine_times": Unsupported("", "SFTP v3 carries atime and mtime in whole seconds, and no ctime (shown as mtime)"),
            "special_files": Unsupported("EPERM", "SFTP v3 makes files, directories and symbolic links only"),
            "rename_exchange": Unsupported("EINVAL", "SFTP has no atomic exchange of two names"),
            "xattr": Unsupported("EOPNOTSUPP", "SFTP v3 carries no extended attributes (ENOSYS; the kernel reports EOPNOTSUPP)"),
            "fallocate": Unsupported("EOPNOTSUPP", "SFTP v3 has no preallocation (ENOSYS; the kernel reports EOPNOTSUPP)"),
            "seek_hole": Unsupported("", "SFTP v3 cannot ask for holes: the kernel's generic llseek reports the whole file as data"),
        },
        fsx_ops=5_000,
        # Random 4 KiB writes over loopback SFTP run at a few MB/s (a page
        # the cache has not got is read before it is written): 8 MiB per job
        # takes the same paths as 32 in a quarter of the time.
        fio_mib=8,
    ),
}
DEFAULT_FS = ("mem", "passthrough")
# The transports a configuration can be mounted on.
TRANSPORTS = ("dev", "uring")


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


# Embedded distfs servers by data directory: started on first mount of a
# scratch dir, stopped by remove_scratch and at the end of the session.
_DIST_SERVERS: dict[str, tuple[subprocess.Popen, str, Etcd | None]] = {}


def _die_with_parent() -> None:
    # A pytest stopped hard (the deadline's faulthandler exit) runs no
    # finalizer: the server goes with it rather than outliving the run.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def dist_server(data: Path, etcd: bool = False) -> str:
    """The address of the `shortfuse dist up` server over `data` (an agent on
    an etcd of its own with `etcd`), started if needed."""
    key = os.path.realpath(data)
    store = None
    if key in _DIST_SERVERS:
        proc, addr, store = _DIST_SERVERS[key]
        if proc.poll() is None:
            return addr
    extra = []
    if etcd:
        if store is None:
            try:
                store = Etcd(prefix=f"{SCRATCH_PREFIX}etcd-")
            except EtcdError as e:
                raise HarnessError(str(e)) from e
        extra = ["--etcd", store.url]
    proc = subprocess.Popen(
        [str(shortfuse_bin()), "dist", "up", "--listen", "127.0.0.1:0", "--data", key, *extra],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=_die_with_parent,
    )
    # The server says "... on ADDR" once it listens, or exits (EOF).
    line = proc.stdout.readline() if proc.stdout else ""
    if " on " not in line:
        proc.kill()
        proc.wait()
        if store is not None:
            store.stop()
        raise HarnessError(f"`shortfuse dist up --data {key}` did not start: {line!r}")
    addr = line.rsplit(" on ", 1)[1].strip()
    _DIST_SERVERS[key] = (proc, addr, store)
    return addr


def stop_dist_servers(under: str | os.PathLike | None = None) -> None:
    """Stops the servers whose data directory is under `under` (all without it)."""
    prefix = os.path.realpath(under) + os.sep if under is not None else ""
    for key in [k for k in _DIST_SERVERS if k.startswith(prefix)]:
        proc, _, store = _DIST_SERVERS.pop(key)
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if store is not None:
            store.stop()


def sshd_server() -> "sshd.Sshd":
    """The session's loopback sshd (tests/sshd.py), started on first use."""
    try:
        return sshd.server(f"{SCRATCH_PREFIX}sshd-")
    except sshd.SshdError as e:
        raise HarnessError(str(e)) from e


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


def real_up_to_last(path: str | os.PathLike) -> str:
    """`path` made absolute, with symbolic links resolved in every component
    but the last, which is never looked at: a mount point's own inode is
    the mounted file system's root, and looking at it (as `realpath`'s
    lstat does) is a request to that file system's daemon, which waits as
    long as the daemon does. The harness asks which mounts and daemons
    exist without asking any daemon."""
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(head), tail) if tail else head


def mounts_at(path: str | os.PathLike) -> list[MountEntry]:
    p = real_up_to_last(path)
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
    """Runs a command with a deadline; a hang becomes a clear failure, not a stuck CI job.

    A command past its deadline is killed and waited for a few seconds at
    most: one stuck in a FUSE request its daemon never answers cannot die
    (the kernel waits for the answer once the daemon has read the
    request), and `subprocess.run` would wait for it for ever."""
    args = [str(c) for c in cmd]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        p.kill()
        try:
            p.wait(timeout=5)
            state = "killed"
        except subprocess.TimeoutExpired:
            state = "unkillable: stuck in the kernel"
        raise AssertionError(f"command did not finish within {timeout}s ({state}): {' '.join(args)}") from e
    finally:
        for f in (p.stdout, p.stderr):
            f.close()
    return subprocess.CompletedProcess(args, p.returncode, out, err)


def pids_of_daemon(binary: Path, mountpoint: str) -> list[int]:
    """Processes of `binary` whose command line names `mountpoint`.

    Arguments are compared as written (made absolute against the process's
    working directory), never looked up: an argument may be the mount point
    of another daemon, one that is stuck or stopped, and a lookup would wait
    for it (see `real_up_to_last`)."""
    found = []
    target = os.path.realpath(binary)
    want = real_up_to_last(mountpoint)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            # The executable first: reading a command line takes the
            # process's memory map lock, which a process faulting on a
            # stuck mount's pages can hold for as long; only the binary's
            # own processes are read.
            if os.readlink(f"/proc/{entry}/exe").removesuffix(" (deleted)") != target:
                continue
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a and os.path.normpath(os.path.join(cwd, a.decode(errors="replace"))) == want for a in argv):
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
    """`name` is a key of FILE_SYSTEMS (or a peer), `transport` dev or uring."""

    name: str
    transport: str

    @property
    def spec(self) -> FsSpec:
        return FILE_SYSTEMS[self.name] if self.name in FILE_SYSTEMS else FsSpec(self.name, sources=1)

    @property
    def fs(self) -> str:
        """The file system as the CLI names it (`passthrough` for `passthrough+kp`)."""
        return self.spec.fs

    @property
    def id(self) -> str:
        return self.name if self.name in PEERS else f"{self.name}-{self.transport}"

    @property
    def is_shortfuse(self) -> bool:
        return self.name not in PEERS

    @property
    def has_source(self) -> bool:
        return self.spec.sources > 0

    @property
    def options(self) -> list[str]:
        return list(self.spec.options)

    @property
    def unsupported(self) -> dict[str, Unsupported]:
        return dict(self.spec.unsupported)

    def make_sources(self, base: Path) -> list[Path]:
        """Creates the source directories of this configuration under `base`."""
        n = self.spec.sources
        dirs = [base / "src"] if n == 1 else [base / f"src{i}" for i in range(n)]
        for d in dirs:
            d.mkdir(parents=True)
        return dirs

    def mount_args(self, sources: list[Path], mountpoint: Path, *extra_options: str) -> list[str]:
        """`mount FS [SOURCE] MNT [-o ...] --transport T` for the shortfuse CLI (without the binary)."""
        args = ["mount", self.fs]
        opts = self.options + list(extra_options)
        if sources and self.spec.sshd_server:
            server = sshd_server()
            args.append(server.target(sources[0]))
            opts = server.options() + opts
        elif sources and self.spec.dist_server:
            args.append(dist_server(sources[0], self.spec.dist_etcd))
        elif sources:
            args.append(",".join(str(s) for s in sources))
        args.append(str(mountpoint))
        if opts:
            args += ["-o", ",".join(opts)]
        return args + ["--transport", self.transport]


def configs_from_env() -> list[Config]:
    """Configurations from SHORTFUSE_FS (names in FILE_SYSTEMS, default mem,passthrough;
    `bindfs` may be added as a peer) times SHORTFUSE_TRANSPORTS (default dev). A name
    given as NAME@TRANSPORT runs on that transport alone (slow file systems whose
    transport code is the same as everyone's: `sftp@dev`)."""
    names = [s for s in os.environ.get("SHORTFUSE_FS", ",".join(DEFAULT_FS)).split(",") if s]
    transports = [t for t in os.environ.get("SHORTFUSE_TRANSPORTS", "dev").split(",") if t]
    given = [n.partition("@")[::2] for n in names]
    unknown = [n for n, _ in given if n not in FILE_SYSTEMS and n not in PEERS]
    if unknown:
        raise HarnessError(f"SHORTFUSE_FS: unknown configuration {unknown}; known: {list(FILE_SYSTEMS) + list(PEERS)}")
    out = []
    for name, pinned in given:
        if name in PEERS:
            out.append(Config(name, "kernel"))
        else:
            out.extend(Config(name, t) for t in ([pinned] if pinned else transports))
    return out


@dataclass
class Mount:
    """One mounted configuration in its scratch directory `base`.

    `path` is the mount point, `sources` the backing directories (one for
    passthrough, pack and bindfs, K for stripe, none for mem), `options` the
    test's mount options on top of the configuration's; `unmount()` is
    idempotent.
    """

    config: Config
    base: Path
    path: Path
    sources: list[Path] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    daemon_pids: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def source(self) -> Path | None:
        """The one backing directory (passthrough, pack, bindfs); None without one."""
        if len(self.sources) > 1:
            raise HarnessError(f"{self.config.id} has {len(self.sources)} sources; use Mount.sources")
        return self.sources[0] if self.sources else None

    def mount_command(self) -> list[str]:
        if self.config.name == "bindfs":
            cmd = [require_tool("bindfs")]
            if self.options:
                cmd += ["-o", ",".join(self.options)]
            return cmd + [str(self.source), str(self.path)]
        return [str(shortfuse_bin())] + self.config.mount_args(self.sources, self.path, *self.options)

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
    sources = config.make_sources(src.parent) if config.has_source else []
    m = Mount(config=config, base=base, path=mnt, sources=sources, options=list(options or []))
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
    stop_dist_servers(base)
    shutil.rmtree(base, ignore_errors=True)
