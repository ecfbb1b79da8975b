"""Recording what a scenario observes, in a form that compares across file systems.

A scenario calls system calls through a `Rec`; each call leaves one
observation: its normalized result, or the errno *name* it failed with.
Only what a file system must reproduce is kept: file type, permission bits,
link count, size (not for directories), owner, device number of device
nodes, times only when the scenario set them. Never inode numbers or st_dev.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import difflib
import errno
import hashlib
import os
import stat

_TYPES = {
    stat.S_IFREG: "reg",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "lnk",
    stat.S_IFIFO: "fifo",
    stat.S_IFCHR: "chr",
    stat.S_IFBLK: "blk",
    stat.S_IFSOCK: "sock",
}


def summarize_stat(st: os.stat_result, times: bool = False) -> dict:
    kind = _TYPES.get(stat.S_IFMT(st.st_mode), oct(stat.S_IFMT(st.st_mode)))
    out = {"type": kind, "mode": oct(stat.S_IMODE(st.st_mode)), "nlink": st.st_nlink, "uid": st.st_uid, "gid": st.st_gid}
    if kind != "dir":
        out["size"] = st.st_size
    if kind in ("chr", "blk"):
        out["rdev"] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if times:
        out["atime_ns"] = st.st_atime_ns
        out["mtime_ns"] = st.st_mtime_ns
    return out


def normalize(v):
    if isinstance(v, os.stat_result):
        return summarize_stat(v)
    if isinstance(v, (bytes, bytearray)):
        if len(v) <= 64:
            return bytes(v)
        return f"<{len(v)} bytes sha1={hashlib.sha1(v).hexdigest()[:16]}>"
    if isinstance(v, os.statvfs_result):
        return "statvfs"
    if isinstance(v, (list, tuple)):
        return type(v)(normalize(x) for x in v)
    return v


def errname(e: OSError) -> str:
    return "E:" + errno.errorcode.get(e.errno, str(e.errno))


# Features a file system may declare unsupported (sfmount.FsSpec.unsupported).
# `hardlink_inode`: links are made, but each name is an inode of its own
# (no st_nlink: both runs drop it; scenarios skip what needs one inode);
# `special_files`: fifos and device nodes cannot be made; `fine_times`:
# times in whole seconds (both runs drop the nanoseconds) and no ctime of
# its own.
FEATURES = (
    "hardlink",
    "rename_exchange",
    "xattr",
    "fallocate",
    "seek_hole",
    "hardlink_inode",
    "special_files",
    "fine_times",
)


class Rec:
    """Observations of one scenario run rooted at `root`.

    `unsupported` is the file system under test's declaration (feature ->
    sfmount.Unsupported); both the reference run and the mounted run get it,
    so that scenarios take the same path on both. `reference` marks the
    native run: there, a call of an unsupported feature is not made and the
    declared errno is recorded instead, so the mount must refuse with exactly
    that errno (and, like the native run, change nothing).
    """

    def __init__(self, root: str, unsupported: dict | None = None, reference: bool = False):
        self.root = root
        self.obs: list[tuple[str, object]] = []
        self.unsupported = dict(unsupported or {})
        self.reference = reference
        if unknown := set(self.unsupported) - set(FEATURES):
            raise ValueError(f"unknown features declared unsupported: {sorted(unknown)}; known: {FEATURES}")

    def supports(self, feature: str) -> bool:
        assert feature in FEATURES, feature
        return feature not in self.unsupported

    def attempt(self, feature: str, label: str, fn, *args, expect=None, **kw):
        """Like call, for a call that the file system itself answers with
        `feature` (not one the VFS decides before asking it). Where the
        feature is unsupported, the reference run records the declared errno,
        or, when the file system falls back to a documented behaviour instead
        of failing, what `expect()` (a model of that behaviour, evaluated on
        the reference side) returns or raises."""
        if self.supports(feature) or not self.reference:
            return self.call(label, fn, *args, **kw)
        if expect is None:
            # errname's spelling: ENOTSUP and EOPNOTSUPP are one number on Linux.
            self.obs.append((label, "E:" + errno.errorcode[getattr(errno, self.unsupported[feature].errno)]))
            return None
        return self.call(label, expect)

    def p(self, *names: str) -> str:
        return os.path.join(self.root, *names)

    def note(self, label: str, value) -> None:
        self.obs.append((label, normalize(value)))

    def call(self, label: str, fn, *args, **kw):
        """Calls fn, records its result or errno name; returns the result (None on error)."""
        try:
            v = fn(*args, **kw)
        except OSError as e:
            self.obs.append((label, errname(e)))
            return None
        self.obs.append((label, normalize(v)))
        return v

    def quiet(self, label: str, fn, *args, **kw):
        """Like call, but records only success or the errno name (for results that
        legitimately differ, like file descriptor numbers or byte counts already checked)."""
        try:
            v = fn(*args, **kw)
        except OSError as e:
            self.obs.append((label, errname(e)))
            return None
        self.obs.append((label, "ok"))
        return v

    def stat(self, label: str, name: str, follow: bool = True, times: bool = False):
        try:
            st = os.stat(self.p(name), follow_symlinks=follow)
        except OSError as e:
            self.obs.append((label, errname(e)))
            return None
        self.obs.append((label, self._summary(st, times)))
        return st

    def _summary(self, st: os.stat_result, times: bool) -> dict:
        out = summarize_stat(st, times)
        if not self.supports("hardlink_inode"):
            del out["nlink"]
        if times and not self.supports("fine_times"):
            for k in ("atime_ns", "mtime_ns"):
                out[k] -= out[k] % 1_000_000_000
        return out

    def fstat(self, label: str, fd: int, times: bool = False):
        try:
            st = os.fstat(fd)
        except OSError as e:
            self.obs.append((label, errname(e)))
            return None
        self.obs.append((label, self._summary(st, times)))
        return st

    def content(self, label: str, name: str):
        def read():
            with open(self.p(name), "rb") as f:
                return f.read()

        return self.call(label, read)

    def listing(self, label: str, name: str = ""):
        def ls():
            return sorted(os.listdir(self.p(name)))

        return self.call(label, ls)


def compare(native: list, mounted: list) -> str | None:
    """None if equal, else a readable diff (label: native vs mount)."""
    if native == mounted:
        return None
    lines = []
    by_label_n = dict(native)
    by_label_m = dict(mounted)
    if [l for l, _ in native] == [l for l, _ in mounted]:
        for (label, a), (_, b) in zip(native, mounted):
            if a != b:
                lines.append(f"  {label}:\n    native: {a!r}\n    mount:  {b!r}")
    else:
        for label in dict.fromkeys([l for l, _ in native] + [l for l, _ in mounted]):
            a, b = by_label_n.get(label, "<absent>"), by_label_m.get(label, "<absent>")
            if a != b:
                lines.append(f"  {label}:\n    native: {a!r}\n    mount:  {b!r}")
        lines.append("  (observation sequences differ:)")
        lines.extend(
            "    " + l
            for l in difflib.unified_diff(
                [f"{l}={v!r}" for l, v in native], [f"{l}={v!r}" for l, v in mounted], "native", "mount", lineterm=""
            )
        )
    return "\n".join(lines)


# ---- system calls Python's os module does not offer ----

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_libc.renameat2.restype = ctypes.c_int
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
_libc.fallocate.restype = ctypes.c_int

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


def _check(ret: int, what: str) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return ret


def renameat2(old: str, new: str, flags: int) -> None:
    _check(_libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags), "renameat2")


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    _check(_libc.fallocate(fd, mode, offset, length), "fallocate")
