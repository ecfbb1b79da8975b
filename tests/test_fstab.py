"""mount(8) and /etc/fstab: util-linux's own `mount` reads an fstab file
(`mount -T FILE MOUNTPOINT`, `mount -a -T FILE`) and runs the helper
`/sbin/mount.fuse.shortfuse-NAME` that `shortfuse install-helpers` links to
the binary under test; `findmnt -t fuse.shortfuse-NAME` finds the mount.
And readiness for systemd: `READY=1` on NOTIFY_SOCKET once the mount is live.

mount(8) looks for helpers in /sbin only (not in PATH), so each case runs in
a private mount namespace (`unshare -m`) where an overlay puts the helpers
of this build over /usr/sbin: the real /sbin and other engineers' runs are
untouched, and the mounts made in there stay in there. systemd is not PID 1
here, so its fstab generator cannot be run; the units it generates for such
lines run this same `mount` command.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

import sfmount
from sfmount import run, shortfuse_bin
from test_faults import scratch  # noqa: F401 (the fixture)

pytestmark = pytest.mark.shortfuse_only

# Options fstab and systemd put in the fourth field, all accepted.
FSTAB_NOISE = "nofail,_netdev,x-systemd.automount,x-systemd.mount-timeout=30,users,auto_unmount,nonempty,kernel_cache,rw"


def in_namespace(scratch: Path, fstab: str, script: str) -> subprocess.CompletedProcess:
    """Writes `fstab` to a file, installs the helpers into a directory laid
    over /usr/sbin in a new mount namespace, and runs `script` (bash, set
    -e) there with $FSTAB naming the file; every shortfuse mount left in
    the namespace is unmounted at the end."""
    helpers = scratch / "helpers"
    helpers.mkdir()
    r = run([str(shortfuse_bin()), "install-helpers", "--dir", str(helpers)], timeout=30)
    assert r.returncode == 0, r.stderr
    assert (helpers / "mount.fuse.shortfuse-passthrough").resolve() == shortfuse_bin().resolve()
    (scratch / "fstab").write_text(fstab)
    prologue = (
        f"export FSTAB={scratch / 'fstab'}\n"
        "cleanup() { findmnt -rn -o TARGET -t " + ",".join(f"fuse.shortfuse-{n}" for n in ("passthrough", "mem", "sftp", "null"))
        + f" | grep '^{scratch}/' | xargs -r -n1 umount -l; }}\ntrap cleanup EXIT\n"
        f"mount -t overlay overlay -o lowerdir={helpers}:/usr/sbin /usr/sbin\nset -e\n"
    )
    return run(["unshare", "-m", "--propagation", "private", "bash", "-c", prologue + script], timeout=90)


def test_fstab_line_mounts_passthrough_with_mount_8(scratch):
    src, mnt = scratch / "src", scratch / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "f").write_text("from the source\n")
    r = in_namespace(
        scratch,
        f"{src} {mnt} fuse.shortfuse-passthrough defaults,nofail 0 0\n",
        f"""mount -T "$FSTAB" {mnt}
findmnt -n -o FSTYPE,SOURCE -t fuse.shortfuse-passthrough {mnt}
cat {mnt}/f
echo written > {mnt}/g
umount {mnt}
echo unmounted
""",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"fuse.shortfuse-passthrough {src}", "from the source", "unmounted"], r.stdout
    assert (src / "g").read_text() == "written\n"


def test_mount_a_honours_noauto_and_accepts_fstab_options(scratch):
    """`mount -a -T FILE`: a mem line and a passthrough line carrying the
    options fstab and systemd use are mounted; a noauto line is not."""
    src, a, b, c = (scratch / n for n in ("src", "a", "b", "c"))
    for d in (src, a, b, c):
        d.mkdir()
    r = in_namespace(
        scratch,
        f"mem {a} fuse.shortfuse-mem defaults 0 0\n"
        f"{src} {b} fuse.shortfuse-passthrough {FSTAB_NOISE},ro 0 0\n"
        f"mem {c} fuse.shortfuse-mem noauto 0 0\n",
        f"""mount -a -T "$FSTAB"
# The namespace starts with a copy of every mount, other runs' included.
findmnt -rn -o TARGET,FSTYPE -t fuse.shortfuse-mem,fuse.shortfuse-passthrough | grep '^{scratch}/' | sort
echo in mem > {a}/x && cat {a}/x
touch {b}/y 2>/dev/null && echo writable || echo read-only
""",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{a} fuse.shortfuse-mem",
        f"{b} fuse.shortfuse-passthrough",
        "in mem",
        "read-only",
    ], r.stdout
    assert not (src / "y").exists()


def test_fstab_line_mounts_sftp(scratch):
    """`me@host:/path` as the source and sftp's options in the fourth field,
    as for sshfs; the session's loopback sshd serves a local directory."""
    server = sfmount.sshd_server()
    src, mnt = scratch / "src", scratch / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "remote").write_text("over ssh\n")
    opts = ",".join([*server.options(), "nofail", "_netdev"])
    r = in_namespace(
        scratch,
        f"{server.target(src)} {mnt} fuse.shortfuse-sftp {opts} 0 0\n",
        f"""mount -T "$FSTAB" {mnt}
findmnt -n -o FSTYPE -t fuse.shortfuse-sftp {mnt}
cat {mnt}/remote
umount {mnt}
""",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["fuse.shortfuse-sftp", "over ssh"], r.stdout


def test_a_failing_helper_fails_mount_8(scratch):
    mnt = scratch / "mnt"
    mnt.mkdir()
    r = in_namespace(
        scratch,
        f"{scratch}/missing {mnt} fuse.shortfuse-passthrough defaults 0 0\n",
        f'mount -T "$FSTAB" {mnt} || echo "mount failed with $?"\nfindmnt {mnt} || echo not mounted\n',
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["mount failed with 32", "not mounted"], r.stdout
    assert "mount.fuse.shortfuse-passthrough" in r.stderr and "missing" in r.stderr, r.stderr


def notify_socket(scratch: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(scratch / "notify"))
    s.settimeout(30)
    return s


def test_ready_is_sent_to_systemd_once_mounted(scratch):
    """With NOTIFY_SOCKET set (systemd's Type=notify), the daemon sends
    READY=1 and its pid once the mount is live: in the foreground, the
    process systemd started; in the background, the daemon that serves."""
    mnt = scratch / "mnt"
    mnt.mkdir()
    env = {**os.environ, "NOTIFY_SOCKET": str(scratch / "notify")}
    with notify_socket(scratch) as s:
        fg = subprocess.Popen([str(shortfuse_bin()), "mount", "mem", str(mnt), "-f"], env=env, stderr=subprocess.PIPE)
        try:
            msg = s.recv(4096).decode()
            mounted = sfmount.is_mounted(mnt)
        finally:
            fg.terminate()
            fg.wait(timeout=30)
        assert msg.splitlines() == ["READY=1", f"MAINPID={fg.pid}"], msg
        assert mounted, "READY=1 came before the mount was live"

        r = run([str(shortfuse_bin()), "mount", "mem", str(mnt)], env=env, timeout=30)
        assert r.returncode == 0, r.stderr
        try:
            msg = s.recv(4096).decode()
            pids = sfmount.pids_of_daemon(shortfuse_bin(), str(mnt))
            assert msg.splitlines() == ["READY=1", f"MAINPID={pids[0]}"], (msg, pids)
        finally:
            assert run([str(shortfuse_bin()), "umount", str(mnt)], timeout=30).returncode == 0
    # Without the variable nothing is sent and nothing is said.
    r = run([str(shortfuse_bin()), "mount", "mem", str(mnt)], timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert run([str(shortfuse_bin()), "umount", str(mnt)], timeout=30).returncode == 0
