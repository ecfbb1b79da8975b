"""Permissions of other users, each scenario run on native ext4 and on the
mount, the observations compared as in test_posix.

The root process prepares files; a forked child then drops to uid and gid
65534 with the supplementary groups 65532 and 65531 (setgroups, setresgid,
setresuid), works in the scenario's directory (entered before dropping
root: the scratch directories above it are root's, mode 0700) and sends
back what it observed. File systems that keep owners and check
permissions run these: mem and distfs check them themselves, passthrough
through the source file system with the caller's identity.
"""

from __future__ import annotations

import errno
import os
import pickle
import stat

import pytest

from observe import Rec, compare, errname

USER = 65534
GROUPS = [65532, 65531]

pytestmark = pytest.mark.fs("mem", "passthrough", "passthrough+kp", "dist")

SCENARIOS = []


def scenario(fn):
    SCENARIOS.append(fn)
    return fn


def as_user(r: Rec, fn) -> None:
    """Runs fn(rec) in a child as USER with GROUPS, in r.root, and appends
    the child's observations to r's (an unexpected error ends them, as
    test_posix's runner does)."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        code = 0
        child = Rec(".", r.unsupported, r.reference)
        try:
            os.chdir(r.root)
            os.setgroups(GROUPS)
            os.setresgid(USER, USER, USER)
            os.setresuid(USER, USER, USER)
            try:
                fn(child)
            except OSError as e:
                child.obs.append(("<scenario aborted by unexpected error>", errname(e)))
            with os.fdopen(wr, "wb") as out:
                pickle.dump(child.obs, out)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(wr)
    with os.fdopen(rd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "the child that switched users failed"
    r.obs.extend(pickle.loads(data))


def make(path: str, data: bytes, mode: int, owner: tuple[int, int] = (0, 0)) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chown(path, *owner)
    # After chown, which clears set-id bits.
    os.chmod(path, mode)


def mode_of(fd: int) -> str:
    return oct(stat.S_IMODE(os.fstat(fd).st_mode))


SETID_MODES = (0o4777, 0o2777, 0o6777, 0o2767)


def write_and_fstat(r: Rec, name: str) -> None:
    fd = r.quiet(f"open {name} for writing", os.open, name, os.O_WRONLY)
    if fd is not None:
        r.quiet(f"write {name}", os.write, fd, b"changed")
        r.call(f"mode of {name} after the write", mode_of, fd)
        os.close(fd)


@scenario
def setid_bits_go_at_another_users_write(r: Rec):
    for mode in SETID_MODES:
        make(r.p(f"f{mode:o}"), b"program", mode)
    as_user(r, lambda c: [write_and_fstat(c, f"f{mode:o}") for mode in SETID_MODES])
    for mode in SETID_MODES:
        r.stat(f"f{mode:o} seen by root", f"f{mode:o}")


@scenario
def setid_bits_go_at_another_users_write_while_root_has_it_open(r: Rec):
    """Under kernel passthrough the first open decides how an inode's
    opens are served: here root's comes first."""
    held = []
    for mode in SETID_MODES:
        make(r.p(f"f{mode:o}"), b"program", mode)
        held.append(os.open(r.p(f"f{mode:o}"), os.O_RDWR))
    try:
        as_user(r, lambda c: [write_and_fstat(c, f"f{mode:o}") for mode in SETID_MODES])
        for fd, mode in zip(held, SETID_MODES):
            r.call(f"f{mode:o} through root's descriptor", mode_of, fd)
    finally:
        for fd in held:
            os.close(fd)


@scenario
def setid_bits_stay_at_roots_write(r: Rec):
    for mode in SETID_MODES:
        make(r.p(f"f{mode:o}"), b"program", mode)
        fd = os.open(r.p(f"f{mode:o}"), os.O_WRONLY)
        try:
            os.write(fd, b"changed")
            r.call(f"mode of f{mode:o} after root's write", mode_of, fd)
        finally:
            os.close(fd)


@scenario
def supplementary_groups(r: Rec):
    make(r.p("mine"), b"x", 0o644, (USER, GROUPS[0]))
    make(r.p("group-readable"), b"for the group", 0o640, (0, GROUPS[1]))
    make(r.p("others"), b"x", 0o644, (0, 0))

    def child(c: Rec):
        c.call("chown to a supplementary group", os.chown, "mine", -1, GROUPS[1])
        c.stat("after", "mine")
        c.call("chown to the other supplementary group", os.chown, "mine", -1, GROUPS[0])
        c.call("chown to the primary group", os.chown, "mine", -1, USER)
        c.call("chown to a group not held", os.chown, "mine", -1, 65530)
        c.call("chown of another's file", os.chown, "others", -1, GROUPS[1])
        c.stat("after the refusals", "mine")
        c.content("read through a supplementary group", "group-readable")
        c.call("write through a supplementary group's missing bit", os.open, "group-readable", os.O_WRONLY)
        c.call("chmod g+s keeps the bit in a held group", os.chmod, "mine", 0o2755)
        c.stat("after chmod g+s", "mine")

    # Twice: a check that remembered something from the first round (a
    # cache of the caller's groups, say) shows in the second.
    as_user(r, child)
    make(r.p("mine"), b"x", 0o644, (USER, GROUPS[0]))
    as_user(r, child)


def run_scenario(fn, root: str, reference: bool) -> list:
    rec = Rec(root, None, reference)
    try:
        fn(rec)
    except OSError as e:
        rec.obs.append(("<scenario aborted by unexpected error>", errname(e)))
    return rec.obs


@pytest.mark.shortfuse_only
@pytest.mark.parametrize("scenario_fn", SCENARIOS, ids=[f.__name__ for f in SCENARIOS])
def test_permissions(scenario_fn, config, mount_factory, native_dir):
    # Without allow_other the kernel lets no other user in at all.
    mnt = mount_factory(config, ["allow_other"])
    os.chmod(native_dir, 0o777)
    os.chmod(mnt.path, 0o777)
    native = run_scenario(scenario_fn, str(native_dir), True)
    assert native, f"{scenario_fn.__name__} observed nothing on native"
    mounted = run_scenario(scenario_fn, str(mnt.path), False)
    diff = compare(native, mounted)
    assert diff is None, f"{scenario_fn.__name__} on {mnt.config.id} differs from native ext4:\n{diff}"


def test_the_child_really_is_another_user(native_dir):
    """Guards the suite: the scenarios' child is refused what only root
    may do, and holds the groups it claims."""
    r = Rec(str(native_dir))
    make(os.path.join(native_dir, "root-only"), b"x", 0o600)
    as_user(r, lambda c: (c.call("ids", lambda: (os.getuid(), os.getgid(), sorted(os.getgroups()))), c.content("root's file", "root-only")))
    assert r.obs == [("ids", (USER, USER, sorted(GROUPS))), ("root's file", "E:" + errno.errorcode[errno.EACCES])]
