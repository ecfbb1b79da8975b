"""POSIX permissions and ownership on every path, against ext4.

tests/programs/posix_battery.c runs scenarios in the families of a POSIX
conformance suite for file systems (chmod, chown, link, mkdir, mkfifo,
mknod, open, rename, rmdir, symlink, truncate, ftruncate, unlink,
utimensat, sticky and set-group-ID directories, clearing of the set-id
bits, ENAMETOOLONG/ENOTDIR/ELOOP/EEXIST, opens of FIFOs and device
nodes), root setting up and forked
children switched to other users and groups (uid 65534 with supplementary
groups 65532 and 65531, uid 65533 with none, uid 65530 in group 65532)
making the calls. It prints one line per outcome. The reference is its
output on a freshly made ext4 (a loop-mounted image, whatever /tmp is);
every path must print the same lines, except those a path declares in
LIMITS (also in the README's table of limits).

The paths: kernel mounts over /dev/fuse and FUSE-over-io_uring (mem,
passthrough, passthrough with kernel passthrough, distfs), the preload shim
in process (`run -m MP=passthrough:SRC`, `run -m MP=mem`) and over the
rings (`serve passthrough|mem -o allow_other` + `run -m MP`).
"""

from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path

import pytest

import sfmount
import test_creds
import test_ring
import test_run

PROGRAM = Path(__file__).resolve().parent / "programs" / "posix_battery.c"

shortfuse = test_run.shortfuse
scratch = test_ring.scratch

# What a path cannot give as ext4 does, by scenario line ("scenario: what");
# the README's limits say the same.
_FORKED_MEM = (
    "an in-process mem mount is private to each process image: a forked child's "
    "changes stay in the child, so another child does not see the file the first made"
)
_MEM_DEVICE = (
    "an in-process mem mount has no daemon to make the kernel device node standing for its "
    "node, and a process without CAP_MKNOD (one that dropped root) cannot make one: EPERM"
)
LIMITS: dict[str, dict[str, str]] = {
    "in-process mem": {
        "sticky: v unlinks u's new file": _FORKED_MEM,
        "special: 0666 device O_WRONLY": _MEM_DEVICE,
        "special: device of a supplementary group O_RDWR": _MEM_DEVICE,
        "special: write to the device": _MEM_DEVICE,
    },
}


@pytest.fixture(scope="module")
def battery(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("battery") / "posix_battery"
    p = subprocess.run(["cc", "-O1", "-Wall", "-o", str(out), str(PROGRAM)], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return out


def run_battery(argv_prefix: list[str], battery: Path, where: Path) -> str:
    """The battery's output in `where` (root's, mode 0755), run under argv_prefix."""
    p = subprocess.run([*argv_prefix, str(battery), str(where)], capture_output=True, timeout=120)
    assert p.returncode == 0, f"the battery failed (exit {p.returncode}):\n{p.stdout.decode()}\n{p.stderr.decode()}"
    return p.stdout.decode()


@pytest.fixture(scope="module")
def ext4(battery) -> str:
    """The battery's output on a fresh ext4."""
    base = sfmount.new_scratch("ext4")
    image, mp = base / "ext4.img", base / "mnt"
    mp.mkdir()
    try:
        with open(image, "wb") as f:
            f.truncate(64 << 20)
        for cmd in (["mkfs.ext4", "-q", "-F", "-b", "4096", str(image)], ["mount", "-o", "loop", str(image), str(mp)]):
            p = subprocess.run(cmd, capture_output=True, timeout=60)
            assert p.returncode == 0, f"{cmd}: {p.stderr.decode()}"
        try:
            base.chmod(0o755)
            mp.chmod(0o755)
            d = mp / "b"
            d.mkdir(mode=0o755)
            return run_battery([], battery, d)
        finally:
            subprocess.run(["umount", str(mp)], capture_output=True, timeout=60)
    finally:
        sfmount.remove_scratch(base)


def compare(path: str, want: str, got: str) -> None:
    limits = LIMITS.get(path, {})
    labels = {line.rsplit(": ", 1)[0] for line in want.splitlines()}
    assert not set(limits) - labels, f"LIMITS names lines the battery no longer prints: {set(limits) - labels}"

    def kept(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.rsplit(": ", 1)[0] not in limits]

    w, g = kept(want), kept(got)
    if w != g:
        diff = "\n".join(difflib.unified_diff(w, g, "ext4", path, n=1, lineterm=""))
        pytest.fail(f"{path} differs from ext4:\n{diff}", pytrace=False)


KERNEL = ["mem-dev", "passthrough-dev", "passthrough-uring", "passthrough+kp-dev", "dist-dev"]


@pytest.mark.parametrize("path", KERNEL)
def test_kernel_mount(path, battery, ext4, mount_factory):
    name, transport = path.rsplit("-", 1)
    # Without allow_other the kernel lets no other user in at all; `dev`:
    # device nodes open as on the ext4 (mounted with its defaults).
    m = mount_factory(sfmount.Config(name, transport), ["allow_other", "dev"])
    m.base.chmod(0o755)
    m.path.chmod(0o755)
    d = m.path / "b"
    d.mkdir(mode=0o755)
    compare(path, ext4, run_battery([], battery, d))


@pytest.mark.parametrize("fs", ["passthrough", "mem"])
def test_in_process(fs, shortfuse, battery, ext4, scratch):
    mp, mount = test_creds.in_process(scratch, fs)
    compare(f"in-process {fs}", ext4, run_battery([str(shortfuse), "run", "-m", mount, "--"], battery, mp))


@pytest.mark.parametrize("fs", ["passthrough", "mem"])
def test_serve(fs, shortfuse, battery, ext4, scratch):
    mp, args = test_creds.served(scratch, fs)
    daemon = test_ring.Daemon(shortfuse, scratch, [*args, "-o", "allow_other"], mp)
    try:
        got = run_battery([str(shortfuse), "run", "-m", str(mp), "--"], battery, mp)
    finally:
        daemon.stop()
    compare(f"serve {fs}", ext4, got)
