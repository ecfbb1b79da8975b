"""Where `shortfuse mount passthrough` asks the kernel to check permissions
(`default_permissions`): only where a caller's rights can differ from the
daemon's, since the daemon acts on the source with its own rights and the
source checks them.

- An unprivileged user's own mount (no allow_other): every caller is that
  user, so the source's checks are the callers' and the kernel's cost only
  a round trip: with them, each create or unlink makes the kernel ask the
  daemon for the directory's attributes again (GETATTR) before its next
  check. The same calls must still be refused as on the source.
- A root daemon's mount keeps them: a root process that gave up its
  capabilities is refused another user's file as on the source, though the
  daemon itself could open it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
from pathlib import Path

import pytest

from sfmount import is_mounted, real_up_to_last, require_tool, run, shortfuse_bin
from test_faults import scratch, unprivileged  # noqa: F401 (scratch is a fixture)

pytestmark = pytest.mark.shortfuse_only

USER = "nobody"
# A Python the user can run (the tests' own may live in root's home).
PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"

# Creates and unlinks N files, one after the other, in DIR.
CHURN = """
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    p = os.path.join(d, f"f{i}")
    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    os.unlink(p)
"""

# What the caller may do under BASE, as a list of (call, outcome) pairs.
PROBE = """
import errno, json, os, sys
base = sys.argv[1]
out = []
def probe(name, fn):
    try:
        r = fn()
        out.append((name, "ok" if r is None or isinstance(r, int) else r))
    except OSError as e:
        out.append((name, errno.errorcode[e.errno]))
j = lambda *p: os.path.join(base, *p)
probe("read root's 0600 file", lambda: open(j("secret"), "rb").read().decode())
probe("access(R_OK) of it", lambda: str(os.access(j("secret"), os.R_OK)))
probe("write root's 0644 file", lambda: os.open(j("rootdir", "f"), os.O_WRONLY))
probe("create in root's 0755 directory", lambda: os.open(j("rootdir", "new"), os.O_CREAT | os.O_WRONLY, 0o644))
probe("unlink in root's 0755 directory", lambda: os.unlink(j("rootdir", "f")))
probe("list root's 0700 directory", lambda: str(os.listdir(j("private"))))
probe("stat beneath root's 0700 directory", lambda: os.stat(j("private", "inside")) and None)
probe("unlink root's file in a sticky directory", lambda: os.unlink(j("sticky", "g")))
probe("chmod root's file", lambda: os.chmod(j("rootdir", "f"), 0o666))
probe("chown own file to root", lambda: os.chown(j("mine"), 0, -1))
probe("write own 0400 file", lambda: os.open(j("mine"), os.O_WRONLY))
probe("read own 0400 file", lambda: open(j("mine"), "rb").read().decode())
print(json.dumps(out))
"""


def super_options(mp: Path) -> set[str]:
    """The mount's super-block options (mountinfo's last field)."""
    p = real_up_to_last(mp)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if left.split()[4] == p:
                return set(right.split()[2].split(","))
    raise AssertionError(f"{mp} is not mounted")


def make(path: Path, data: bytes, mode: int, owner: str = "root") -> None:
    """A file of `owner` (and of their primary group)."""
    path.write_bytes(data)
    pw = pwd.getpwnam(owner)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    path.chmod(mode)


def make_tree(src: Path) -> None:
    """Root's files in a source of USER's, as the probe expects them."""
    make(src / "secret", b"root only", 0o600)
    (src / "rootdir").mkdir()
    make(src / "rootdir" / "f", b"f", 0o644)
    (src / "private").mkdir(mode=0o700)
    make(src / "private" / "inside", b"i", 0o644)
    (src / "sticky").mkdir()
    (src / "sticky").chmod(0o1777)
    make(src / "sticky" / "g", b"g", 0o666)
    make(src / "mine", b"mine", 0o400, owner=USER)


def as_user(*cmd: str) -> list[str]:
    return ["runuser", "-u", USER, "--", *cmd]


def getattrs(as_user_shortfuse: list[str], mp: Path) -> int:
    r = run(as_user_shortfuse + ["stats", "--json", str(mp)], timeout=30)
    assert r.returncode == 0, r.stderr
    return sum(op["count"] for op in json.loads(r.stdout)["ops"] if op["name"] == "GETATTR")


def test_an_unprivileged_users_own_mount_leaves_the_checks_to_the_source(scratch):
    n = 100
    src = scratch / "src"
    src.mkdir()
    pw = pwd.getpwnam(USER)
    os.chown(src, pw.pw_uid, pw.pw_gid)
    make_tree(src)
    with unprivileged(USER, scratch) as (mp, sf):
        r = run(sf + ["mount", "passthrough", str(src), str(mp)], timeout=30)
        assert r.returncode == 0, f"unprivileged mount failed: {r.stderr}"
        assert "default_permissions" not in super_options(mp), super_options(mp)

        r = run(as_user("mkdir", str(mp / "d")), timeout=30)
        assert r.returncode == 0, r.stderr
        before = getattrs(sf, mp)
        r = run(as_user(PYTHON, "-c", CHURN, str(mp / "d"), str(n)), timeout=60)
        assert r.returncode == 0, r.stderr
        asked = getattrs(sf, mp) - before
        # With the kernel's checks: one for each create and each unlink.
        assert asked < n // 10, f"{asked} GETATTRs for {n} creates and {n} unlinks"

        # The source still refuses what it refuses to the user directly.
        native = run(as_user(PYTHON, "-c", PROBE, str(src)), timeout=30)
        mounted = run(as_user(PYTHON, "-c", PROBE, str(mp)), timeout=30)
        assert native.returncode == 0 and mounted.returncode == 0, native.stderr + mounted.stderr
        native, mounted = json.loads(native.stdout), json.loads(mounted.stdout)
        allowed = [name for name, outcome in native if outcome not in ("EACCES", "EPERM", "False")]
        assert allowed == ["read own 0400 file"], f"the probe's tree is not as meant: {native}"
        assert mounted == native

        r = run(sf + ["umount", str(mp)], timeout=30)
        assert r.returncode == 0, r.stderr


def test_a_root_daemons_mount_lets_the_kernel_check_a_root_caller_without_capabilities(scratch):
    setpriv = require_tool("setpriv")
    src, mp = scratch / "src", scratch / "mnt"
    src.mkdir()
    mp.mkdir()
    make(src / "theirs", b"another user's", 0o600, owner=USER)
    drop = [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "cat"]
    r = run([str(shortfuse_bin()), "mount", "passthrough", str(src), str(mp)], timeout=30)
    assert r.returncode == 0, r.stderr
    try:
        assert "default_permissions" in super_options(mp), super_options(mp)
        native = run(drop + [str(src / "theirs")], timeout=30)
        assert native.returncode != 0 and "Permission denied" in native.stderr, "the capabilities were not dropped"
        mounted = run(drop + [str(mp / "theirs")], timeout=30)
        assert (mounted.returncode, mounted.stdout) == (native.returncode, ""), mounted.stdout + mounted.stderr
        assert "Permission denied" in mounted.stderr, mounted.stderr
    finally:
        run([str(shortfuse_bin()), "umount", str(mp)], timeout=30)
        assert not is_mounted(mp)
