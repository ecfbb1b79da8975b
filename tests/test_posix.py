"""POSIX behaviour: each scenario runs on native ext4 and on the mount, and
the two observation lists must be equal (results, contents, stat fields,
errno names).

A scenario is a function of a Rec (rooted at an empty directory) that
performs system calls through it. Add one by decorating it with @scenario.

Features a file system refuses by design are declared once, in
sfmount.FILE_SYSTEMS; a scenario makes such calls with `r.attempt(feature,
...)` (the mount must answer the declared errno) and skips what depends on
them with `r.supports(feature)`, on the native run too.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from observe import (
    FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE,
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    Rec,
    compare,
    fallocate,
    renameat2,
)

SCENARIOS = []


def scenario(fn):
    SCENARIOS.append(fn)
    return fn


def write_file(path: str, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def pattern(n: int, seed: int = 0) -> bytes:
    """Deterministic non-repeating-looking bytes (a misplaced block shows up)."""
    out = bytearray(n)
    x = (seed * 2654435761 + 12345) & 0xFFFFFFFF
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out[i] = (x >> 16) & 0xFF
    return bytes(out)


# ---------------------------------------------------------------- open flags


@scenario
def open_flags(r: Rec):
    f = r.p("f")
    fd = r.quiet("create O_EXCL", os.open, f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    r.call("write", os.write, fd, b"hello world")
    os.close(fd)
    r.stat("stat after create", "f")
    r.call("O_EXCL on existing", os.open, f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    fd = r.quiet("O_CREAT on existing", os.open, f, os.O_RDWR | os.O_CREAT, 0o600)
    r.call("content kept", os.pread, fd, 100, 0)
    r.fstat("mode unchanged by O_CREAT", fd)
    os.close(fd)
    fd = r.quiet("O_TRUNC", os.open, f, os.O_WRONLY | os.O_TRUNC)
    r.fstat("size after O_TRUNC", fd)
    r.call("write after trunc", os.write, fd, b"abc")
    os.close(fd)
    fd = r.quiet("O_APPEND", os.open, f, os.O_WRONLY | os.O_APPEND)
    os.lseek(fd, 0, os.SEEK_SET)
    r.call("append write", os.write, fd, b"DEF")
    r.call("offset after append", os.lseek, fd, 0, os.SEEK_CUR)
    r.call("pwrite ignores offset with O_APPEND", os.pwrite, fd, b"gh", 0)
    os.close(fd)
    r.content("content after append", "f")
    r.call("O_DIRECTORY on file", os.open, f, os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir(r.p("d"))
    fd = r.quiet("O_DIRECTORY on dir", os.open, r.p("d"), os.O_RDONLY | os.O_DIRECTORY)
    if fd is not None:
        os.close(fd)
    r.call("O_WRONLY on dir", os.open, r.p("d"), os.O_WRONLY)
    r.call("O_CREAT on dir", os.open, r.p("d"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.symlink("f", r.p("l"))
    r.call("O_NOFOLLOW on symlink", os.open, r.p("l"), os.O_RDONLY | os.O_NOFOLLOW)
    fd = r.quiet("O_PATH|O_NOFOLLOW on symlink", os.open, r.p("l"), os.O_PATH | os.O_NOFOLLOW)
    if fd is not None:
        os.close(fd)
    fd = r.quiet("open through symlink", os.open, r.p("l"), os.O_RDONLY)
    r.call("read through symlink", os.read, fd, 100)
    os.close(fd)
    r.call("open missing", os.open, r.p("missing"), os.O_RDONLY)
    r.call("open below a file", os.open, r.p("f", "x"), os.O_RDONLY)
    fd = os.open(f, os.O_RDONLY)
    r.call("write on O_RDONLY", os.write, fd, b"x")
    r.call("ftruncate on O_RDONLY", os.ftruncate, fd, 0)
    os.close(fd)
    fd = os.open(f, os.O_WRONLY)
    r.call("read on O_WRONLY", os.read, fd, 1)
    os.close(fd)
    fd = r.quiet("O_CREAT|O_EXCL new name", os.open, r.p("fresh"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    if fd is not None:
        os.close(fd)
    os.symlink("target-of-dangling", r.p("dl"))
    r.call("O_CREAT|O_EXCL on dangling symlink", os.open, r.p("dl"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    fd = r.quiet("O_CREAT through dangling symlink", os.open, r.p("dl"), os.O_CREAT | os.O_WRONLY, 0o600)
    if fd is not None:
        os.close(fd)
    r.stat("created symlink target", "target-of-dangling")
    r.listing("listing")


@scenario
def create_modes(r: Rec):
    for mode in (0o600, 0o644, 0o755, 0o4755, 0o2750, 0o1777, 0o000):
        name = f"f{mode:o}"
        fd = os.open(r.p(name), os.O_WRONLY | os.O_CREAT, mode)
        os.close(fd)
        r.stat(f"file mode {mode:o} (umask 022)", name)
        os.mkdir(r.p("d" + name), mode)
        r.stat(f"dir mode {mode:o}", "d" + name)
    r.attempt("special_files", "mkfifo", os.mkfifo, r.p("fifo"), 0o640)
    r.stat("fifo", "fifo")
    r.attempt("special_files", "mknod chr", os.mknod, r.p("null"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    r.stat("chr", "null")
    r.call("mknod reg", os.mknod, r.p("plain"), 0o640 | stat.S_IFREG)
    r.stat("mknod reg", "plain")
    r.call("mknod existing", os.mknod, r.p("plain"), 0o640 | stat.S_IFREG)
    r.call("access R_OK", os.access, r.p("f600"), os.R_OK)
    r.call("access missing", os.access, r.p("nope"), os.F_OK)
    r.call("access X_OK on 644 (root)", os.access, r.p("f644"), os.X_OK)
    r.call("access X_OK on 755 (root)", os.access, r.p("f755"), os.X_OK)
    r.listing("listing")


# ------------------------------------------------------------ read and write


@scenario
def read_write_offsets(r: Rec):
    f = r.p("f")
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    data = pattern(200_000, 1)
    r.call("write big", os.write, fd, data)
    for off, n in ((0, 1), (1, 4095), (4095, 2), (4097, 8191), (65535, 70000), (199_999, 10), (200_000, 5), (300_000, 5)):
        r.call(f"pread {off}+{n}", os.pread, fd, n, off)
    for off, chunk in ((3, b"abc"), (4094, b"XYZW"), (65537, pattern(5000, 2)), (199_998, b"tail-extends")):
        r.call(f"pwrite {off}", os.pwrite, fd, chunk, off)
    r.fstat("after pwrites", fd)
    r.call("pwrite beyond EOF leaves hole", os.pwrite, fd, b"far", 300_001)
    r.fstat("after far pwrite", fd)
    r.call("hole reads zeros", os.pread, fd, 32, 250_000)
    r.call("read across hole end", os.pread, fd, 16, 299_995)
    os.lseek(fd, 7, os.SEEK_SET)
    r.call("read at 7", os.read, fd, 9)
    r.call("offset after read", os.lseek, fd, 0, os.SEEK_CUR)
    r.call("write at 16", os.write, fd, b"0123456789")
    r.call("offset after write", os.lseek, fd, 0, os.SEEK_CUR)
    r.call("SEEK_END", os.lseek, fd, -3, os.SEEK_END)
    r.call("read last 3", os.read, fd, 10)
    r.call("read at EOF", os.read, fd, 10)
    r.call("lseek negative", os.lseek, fd, -1, os.SEEK_SET)
    os.close(fd)
    r.content("whole file", "f")
    fd = os.open(r.p("odd"), os.O_RDWR | os.O_CREAT, 0o644)
    big = pattern(3 * 1024 * 1024 + 17, 3)
    r.call("3 MiB + 17 write", os.write, fd, big)
    r.call("pread 1 MiB at odd offset", os.pread, fd, 1 << 20, 1_000_003)
    os.fsync(fd)
    os.close(fd)
    r.content("odd file", "odd")
    fd = os.open(r.p("odd"), os.O_RDONLY)
    r.quiet("fsync on O_RDONLY", os.fsync, fd)
    os.close(fd)


@scenario
def truncate_up_down(r: Rec):
    write_file(r.p("f"), pattern(10_000, 4))
    for size in (5000, 4096, 4095, 1, 0, 3, 12_345, 1 << 20, 100):
        r.call(f"truncate {size}", os.truncate, r.p("f"), size)
        r.stat(f"stat {size}", "f")
        r.content(f"content {size}", "f")
    fd = os.open(r.p("f"), os.O_RDWR)
    os.pwrite(fd, b"abcdefgh", 96)
    r.call("ftruncate 98", os.ftruncate, fd, 98)
    r.call("ftruncate up 8192", os.ftruncate, fd, 8192)
    r.call("read after shrink+grow is zeros", os.pread, fd, 8, 96)
    r.call("ftruncate negative", os.ftruncate, fd, -1)
    os.close(fd)
    r.content("final", "f")
    r.call("truncate missing", os.truncate, r.p("missing"), 0)
    os.mkdir(r.p("d"))
    r.call("truncate dir", os.truncate, r.p("d"), 0)


def generic_seek(fd: int, off: int, whence: int) -> int:
    """lseek SEEK_DATA/SEEK_HOLE of a file system without hole information:
    all data up to EOF, one hole at EOF."""
    size = os.fstat(fd).st_size
    if off < 0 or off >= size:
        raise OSError(errno.ENXIO, os.strerror(errno.ENXIO))
    return off if whence == os.SEEK_DATA else size


def seek(r: Rec, label: str, fd: int, off: int, whence: int):
    return r.attempt("seek_hole", label, os.lseek, fd, off, whence, expect=lambda: generic_seek(fd, off, whence))


@scenario
def holes_and_seek(r: Rec):
    mib = 1 << 20
    fd = os.open(r.p("sparse"), os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"A" * 4096, 0)
    os.pwrite(fd, b"B" * 4096, mib)
    os.ftruncate(fd, 2 * mib)
    os.fsync(fd)
    r.fstat("sparse", fd)
    for off in (0, 100, 4096, 8192, mib - 1, mib, mib + 4096, 2 * mib - 1, 2 * mib, 3 * mib):
        seek(r, f"SEEK_DATA {off}", fd, off, os.SEEK_DATA)
        seek(r, f"SEEK_HOLE {off}", fd, off, os.SEEK_HOLE)
    r.call("read in hole", os.pread, fd, 16, 500_000)
    r.call("read at data B", os.pread, fd, 4, mib + 4092)
    r.attempt("fallocate", "punch 0..4096", fallocate, fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096)
    os.fsync(fd)
    seek(r, "SEEK_DATA 0 after punch", fd, 0, os.SEEK_DATA)
    seek(r, "SEEK_HOLE 0 after punch", fd, 0, os.SEEK_HOLE)
    r.call("punched reads zeros", os.pread, fd, 8, 0)
    os.close(fd)
    fd = os.open(r.p("empty"), os.O_RDWR | os.O_CREAT, 0o644)
    seek(r, "SEEK_DATA on empty", fd, 0, os.SEEK_DATA)
    seek(r, "SEEK_HOLE on empty", fd, 0, os.SEEK_HOLE)
    os.close(fd)
    write_file(r.p("dense"), pattern(10_000, 5))
    fd = os.open(r.p("dense"), os.O_RDONLY)
    seek(r, "dense SEEK_DATA 5", fd, 5, os.SEEK_DATA)
    seek(r, "dense SEEK_HOLE 5", fd, 5, os.SEEK_HOLE)
    os.close(fd)


@scenario
def fallocate_modes(r: Rec):
    fd = os.open(r.p("f"), os.O_RDWR | os.O_CREAT, 0o644)
    r.call("posix_fallocate 0+100000", os.posix_fallocate, fd, 0, 100_000)
    r.fstat("size after posix_fallocate", fd)
    r.call("zeros", os.pread, fd, 16, 50_000)
    os.pwrite(fd, pattern(100_000, 6), 0)
    r.attempt("fallocate", "KEEP_SIZE beyond EOF", fallocate, fd, FALLOC_FL_KEEP_SIZE, 100_000, 50_000)
    r.fstat("size kept", fd)
    r.attempt("fallocate", "fallocate grows", fallocate, fd, 0, 90_000, 30_000)
    r.fstat("size grown", fd)
    punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    r.attempt("fallocate", "punch 4096+8192", fallocate, fd, punch, 4096, 8192)
    r.attempt("fallocate", "punch unaligned 20001+333", fallocate, fd, punch, 20_001, 333)
    r.call("punch without KEEP_SIZE", fallocate, fd, FALLOC_FL_PUNCH_HOLE, 0, 10)
    r.call("invalid length", fallocate, fd, 0, 0, 0)
    r.call("negative offset", fallocate, fd, 0, -1, 10)
    r.fstat("after punches", fd)
    os.close(fd)
    r.content("content", "f")
    fd = os.open(r.p("f"), os.O_RDONLY)
    r.call("fallocate on O_RDONLY", fallocate, fd, 0, 0, 10)
    os.close(fd)


@scenario
def copy_file_range_and_sync(r: Rec):
    write_file(r.p("src"), pattern(300_000, 7))
    fin = os.open(r.p("src"), os.O_RDONLY)
    fout = os.open(r.p("dst"), os.O_RDWR | os.O_CREAT, 0o644)
    total = 0
    while total < 250_000:
        n = os.copy_file_range(fin, fout, 250_000 - total, 1000 + total, 10 + total)
        if n == 0:
            break
        total += n
    r.note("copied", total)
    r.quiet("fdatasync", os.fdatasync, fout)
    r.quiet("fsync", os.fsync, fout)
    os.close(fin)
    os.close(fout)
    r.content("dst", "dst")
    r.stat("dst stat", "dst")


# -------------------------------------------------------------------- rename


@scenario
def rename_files(r: Rec):
    write_file(r.p("a"), b"AAA")
    write_file(r.p("b"), b"BBBB")
    r.call("file over file", os.rename, r.p("a"), r.p("b"))
    r.stat("a gone", "a")
    r.content("b has a's content", "b")
    r.stat("b", "b")
    r.call("rename to itself", os.rename, r.p("b"), r.p("b"))
    if r.supports("hardlink") and r.supports("hardlink_inode"):
        os.link(r.p("b"), r.p("b2"))
        r.call("rename between hard links of one inode", os.rename, r.p("b"), r.p("b2"))
        r.listing("both links stay", "")
        r.stat("nlink stays 2", "b")
    else:
        write_file(r.p("b2"), b"AAA")
    r.call("rename missing", os.rename, r.p("missing"), r.p("x"))
    os.mkdir(r.p("d"))
    r.call("into dir", os.rename, r.p("b"), r.p("d", "b"))
    r.listing("d", "d")
    r.call("into missing dir", os.rename, r.p("b2"), r.p("nodir", "b2"))
    r.call("below a file", os.rename, r.p("b2"), r.p("b2", "x"))
    open_fd = os.open(r.p("b2"), os.O_RDONLY)
    r.call("rename open file", os.rename, r.p("b2"), r.p("c"))
    r.call("open fd still reads", os.pread, open_fd, 10, 0)
    os.close(open_fd)
    r.content("renamed content", "c")
    r.listing("listing", "")
    r.listing("listing d", "d")


@scenario
def rename_dirs(r: Rec):
    for d in ("e1", "e2", "full", "full/sub", "src", "src/inner"):
        os.mkdir(r.p(d))
    write_file(r.p("full", "x"), b"x")
    write_file(r.p("file"), b"file")
    r.call("dir over empty dir", os.rename, r.p("e1"), r.p("e2"))
    r.stat("e1 gone", "e1")
    r.call("dir over non-empty dir", os.rename, r.p("e2"), r.p("full"))
    r.call("file over dir", os.rename, r.p("file"), r.p("e2"))
    r.call("dir over file", os.rename, r.p("e2"), r.p("file"))
    r.call("dir into own subdir", os.rename, r.p("src"), r.p("src", "inner", "moved"))
    r.call("dir onto own child", os.rename, r.p("src"), r.p("src", "inner"))
    r.call("dir with trailing slash", os.rename, r.p("src") + "/", r.p("src2") + "/")
    r.call("file with trailing slash", os.rename, r.p("file") + "/", r.p("file2"))
    r.call("move dir elsewhere", os.rename, r.p("src2"), r.p("full", "sub", "src3"))
    r.stat("full nlink", "full")
    r.stat("sub nlink (got a subdir)", "full/sub")
    r.stat("root nlink", ".")
    r.listing("inner moved along", "full/sub/src3")
    r.call("rename root-level . ", os.rename, r.p("."), r.p("dot"))
    r.call("rename onto ..", os.rename, r.p("full", "x"), r.p("full", ".."))
    r.listing("listing", "")


@scenario
def rename_flags(r: Rec):
    write_file(r.p("a"), b"AAA")
    write_file(r.p("b"), b"BBBB")
    os.mkdir(r.p("d"))
    write_file(r.p("d", "in"), b"in")
    r.call("NOREPLACE onto existing", renameat2, r.p("a"), r.p("b"), RENAME_NOREPLACE)
    r.content("b intact", "b")
    r.call("NOREPLACE to new", renameat2, r.p("a"), r.p("a2"), RENAME_NOREPLACE)
    r.stat("a gone", "a")
    r.attempt("rename_exchange", "EXCHANGE files", renameat2, r.p("a2"), r.p("b"), RENAME_EXCHANGE)
    r.content("a2 now", "a2")
    r.content("b now", "b")
    r.attempt("rename_exchange", "EXCHANGE file and dir", renameat2, r.p("b"), r.p("d"), RENAME_EXCHANGE)
    r.stat("b is dir", "b")
    r.stat("d is file", "d")
    r.content("d content", "d")
    r.listing("b listing", "b")
    r.call("EXCHANGE with missing", renameat2, r.p("a2"), r.p("missing"), RENAME_EXCHANGE)
    r.call("EXCHANGE|NOREPLACE", renameat2, r.p("a2"), r.p("d"), RENAME_EXCHANGE | RENAME_NOREPLACE)
    os.mkdir(r.p("b", "sub"))
    r.call("EXCHANGE dir with its child", renameat2, r.p("b"), r.p("b", "sub"), RENAME_EXCHANGE)
    r.attempt("rename_exchange", "EXCHANGE across dirs", renameat2, r.p("a2"), r.p("b", "in"), RENAME_EXCHANGE)
    r.content("a2 after cross exchange", "a2")
    r.content("b/in after cross exchange", "b/in")
    r.listing("listing", "")


# --------------------------------------------------------- links and symlinks


@scenario
def hard_links(r: Rec):
    write_file(r.p("f"), b"shared")
    r.stat("nlink 1", "f")
    os.mkdir(r.p("d"))
    os.symlink("target", r.p("sl"))
    # Errors the VFS decides before asking the file system: the same with or without hard links.
    r.call("link a dir", os.link, r.p("d"), r.p("d2"))
    r.call("link missing", os.link, r.p("missing"), r.p("x"))
    write_file(r.p("other"), b"other")
    r.call("link onto existing", os.link, r.p("f"), r.p("other"))
    r.attempt("hardlink", "link", os.link, r.p("f"), r.p("g"))
    r.attempt("hardlink", "link into dir", os.link, r.p("f"), r.p("d", "h"))
    r.attempt("hardlink", "link a symlink", os.link, r.p("sl"), r.p("sl2"), follow_symlinks=False)
    r.listing("listing after links", "")
    if r.supports("hardlink") and r.supports("hardlink_inode"):
        r.stat("nlink 3", "f")
        r.stat("nlink 3 via g", "g")
        with open(r.p("g"), "ab") as fh:
            fh.write(b"+more")
        r.content("write via g seen via f", "f")
        r.content("and via d/h", "d/h")
        r.call("unlink f", os.unlink, r.p("f"))
        r.stat("nlink 2", "g")
        fd = os.open(r.p("g"), os.O_RDONLY)
        r.call("unlink g", os.unlink, r.p("g"))
        r.call("unlink d/h", os.unlink, r.p("d", "h"))
        r.fstat("open unlinked file: nlink 0", fd)
        r.call("read unlinked", os.pread, fd, 100, 0)
        os.close(fd)
        r.stat("symlink nlink 2", "sl", follow=False)
    else:
        r.stat("nlink still 1", "f")
        fd = os.open(r.p("f"), os.O_RDONLY)
        r.call("unlink f", os.unlink, r.p("f"))
        r.fstat("open unlinked file: nlink 0", fd)
        r.call("read unlinked", os.pread, fd, 100, 0)
        os.close(fd)
    write_file(r.p("w"), b"")
    fd = os.open(r.p("w"), os.O_RDWR)
    os.unlink(r.p("w"))
    r.call("write to unlinked", os.pwrite, fd, b"still here", 0)
    r.call("read back unlinked", os.pread, fd, 100, 0)
    r.fstat("unlinked stat", fd)
    os.close(fd)
    r.listing("listing", "")


@scenario
def symlinks(r: Rec):
    os.makedirs(r.p("a", "b"))
    write_file(r.p("a", "file"), b"target content")
    r.call("relative symlink", os.symlink, "../file", r.p("a", "b", "up"))
    r.call("readlink", os.readlink, r.p("a", "b", "up"))
    r.stat("lstat", "a/b/up", follow=False)
    r.stat("stat follows", "a/b/up")
    r.content("read through", "a/b/up")
    r.call("dir symlink", os.symlink, "a/b", r.p("ab"))
    r.call("readlink dir symlink", os.readlink, r.p("ab"))
    r.content("path through dir symlink", "ab/up")
    r.listing("listing through dir symlink", "ab")
    long_target = "x/" * 1000 + "end"
    r.call("long target", os.symlink, long_target, r.p("long"))
    r.call("readlink long", os.readlink, r.p("long"))
    r.stat("lstat long", "long", follow=False)
    weird = "  spaces\tand\nnewline/../ü"
    r.call("odd bytes target", os.symlink, weird, r.p("weird"))
    r.call("readlink odd", os.readlink, r.p("weird"))
    r.call("dangling", os.symlink, "nowhere", r.p("dangling"))
    r.stat("stat dangling", "dangling")
    r.stat("lstat dangling", "dangling", follow=False)
    os.symlink("loop2", r.p("loop1"))
    os.symlink("loop1", r.p("loop2"))
    r.stat("loop", "loop1")
    r.call("readlink regular file", os.readlink, r.p("a", "file"))
    r.call("readlink missing", os.readlink, r.p("missing"))
    r.call("symlink onto existing", os.symlink, "x", r.p("ab"))
    r.call("empty target", os.symlink, "", r.p("empty"))
    r.call("unlink symlink keeps target", os.unlink, r.p("a", "b", "up"))
    r.stat("target still there", "a/file")
    r.call("rmdir dir symlink", os.rmdir, r.p("ab"))
    r.listing("listing", "")


# --------------------------------------------------------------- attributes


@scenario
def chmod_chown_utimens(r: Rec):
    write_file(r.p("f"), b"data")
    os.mkdir(r.p("d"))
    os.symlink("f", r.p("l"))
    for mode in (0o600, 0o4755, 0o2711, 0o1777, 0o000, 0o7777):
        r.call(f"chmod {mode:o}", os.chmod, r.p("f"), mode)
        r.stat(f"mode {mode:o}", "f")
    r.call("chmod dir", os.chmod, r.p("d"), 0o1750)
    r.stat("dir mode", "d")
    r.call("chown", os.chown, r.p("f"), 1234, 5678)
    r.stat("owner", "f")
    r.call("chown uid only", os.chown, r.p("f"), 4321, -1)
    r.stat("owner 2", "f")
    r.call("chown gid only", os.chown, r.p("f"), -1, 8765)
    r.stat("owner 3", "f")
    r.call("lchown symlink", os.chown, r.p("l"), 42, 43, follow_symlinks=False)
    r.stat("symlink owner", "l", follow=False)
    r.stat("target owner unchanged", "f")
    r.call("chmod via symlink", os.chmod, r.p("l"), 0o640)
    r.stat("target mode via symlink", "f")
    r.call("utimensat ns", os.utime, r.p("f"), ns=(1_000_000_123, 2_000_000_456))
    r.stat("times", "f", times=True)
    r.call("utimensat old", os.utime, r.p("d"), ns=(5, 86_400 * 365 * 10**9 + 999_999_999))
    r.stat("dir times", "d", times=True)
    r.call("lutimes symlink", os.utime, r.p("l"), ns=(3_000_000_001, 4_000_000_002), follow_symlinks=False)
    r.stat("symlink times", "l", follow=False, times=True)
    r.stat("target times unchanged", "f", times=True)
    fd = os.open(r.p("f"), os.O_RDWR)
    r.call("futimens", os.utime, fd, ns=(7_000_000_007, 8_000_000_008))
    r.fstat("futimens times", fd, times=True)
    r.call("fchmod", os.fchmod, fd, 0o604)
    r.call("fchown", os.fchown, fd, 0, 0)
    r.fstat("after fchmod/fchown", fd, times=True)
    st0 = os.fstat(fd)
    time.sleep(0.02)
    os.pwrite(fd, b"x", 100)
    st1 = os.fstat(fd)
    r.note("write advances mtime", st1.st_mtime_ns > st0.st_mtime_ns)
    r.note("write advances ctime", st1.st_ctime_ns > st0.st_ctime_ns)
    time.sleep(0.02)
    os.fchmod(fd, 0o600)
    st2 = os.fstat(fd)
    if r.supports("fine_times"):
        r.note("chmod advances ctime", st2.st_ctime_ns > st1.st_ctime_ns)
    r.note("chmod keeps mtime", st2.st_mtime_ns == st1.st_mtime_ns)
    os.close(fd)
    dst0 = os.stat(r.p("d"))
    time.sleep(0.02)
    write_file(r.p("d", "new"), b"")
    dst1 = os.stat(r.p("d"))
    r.note("create advances dir mtime", dst1.st_mtime_ns > dst0.st_mtime_ns)
    r.call("chmod missing", os.chmod, r.p("missing"), 0o644)
    r.call("utime missing", os.utime, r.p("missing"), ns=(1, 1))


@scenario
def xattrs(r: Rec):
    write_file(r.p("f"), b"data")
    os.mkdir(r.p("d"))
    os.symlink("f", r.p("l"))

    def user_list(path, **kw):
        return sorted(n for n in os.listxattr(path, **kw) if n.startswith("user."))

    if not r.supports("xattr"):
        r.attempt("xattr", "set", os.setxattr, r.p("f"), "user.a", b"alpha")
        r.attempt("xattr", "get", os.getxattr, r.p("f"), "user.a")
        r.attempt("xattr", "list", os.listxattr, r.p("f"))
        r.attempt("xattr", "remove", os.removexattr, r.p("f"), "user.a")
        r.attempt("xattr", "dir set", os.setxattr, r.p("d"), "user.dir", b"on a dir")
        return
    r.call("list empty", user_list, r.p("f"))
    r.call("set a", os.setxattr, r.p("f"), "user.a", b"alpha")
    r.call("set empty value", os.setxattr, r.p("f"), "user.empty", b"")
    r.call("set big", os.setxattr, r.p("f"), "user.big", bytes(range(256)) * 15)
    r.call("get a", os.getxattr, r.p("f"), "user.a")
    r.call("get empty", os.getxattr, r.p("f"), "user.empty")
    r.call("get big", os.getxattr, r.p("f"), "user.big")
    r.call("list", user_list, r.p("f"))
    r.call("get missing", os.getxattr, r.p("f"), "user.missing")
    r.call("CREATE existing", os.setxattr, r.p("f"), "user.a", b"x", os.XATTR_CREATE)
    r.call("REPLACE missing", os.setxattr, r.p("f"), "user.nope", b"x", os.XATTR_REPLACE)
    r.call("REPLACE existing", os.setxattr, r.p("f"), "user.a", b"ALPHA2", os.XATTR_REPLACE)
    r.call("get replaced", os.getxattr, r.p("f"), "user.a")
    r.call("CREATE new", os.setxattr, r.p("f"), "user.b", b"beta", os.XATTR_CREATE)
    r.call("remove a", os.removexattr, r.p("f"), "user.a")
    r.call("remove missing", os.removexattr, r.p("f"), "user.a")
    r.call("list after remove", user_list, r.p("f"))
    r.call("dir set", os.setxattr, r.p("d"), "user.dir", b"on a dir")
    r.call("dir get", os.getxattr, r.p("d"), "user.dir")
    r.call("via symlink follows", os.getxattr, r.p("l"), "user.b")
    r.call("user.* on symlink itself", os.setxattr, r.p("l"), "user.x", b"x", follow_symlinks=False)
    r.call("list symlink itself", user_list, r.p("l"), follow_symlinks=False)
    r.call("unknown namespace", os.setxattr, r.p("f"), "bogus.x", b"x")
    r.call("name too long", os.setxattr, r.p("f"), "user." + "n" * 300, b"x")
    r.call("value too big", os.setxattr, r.p("f"), "user.huge", b"v" * 70_000)
    r.call("get on missing file", os.getxattr, r.p("missing"), "user.a")
    fd = os.open(r.p("f"), os.O_RDONLY)
    r.call("fgetxattr", os.getxattr, fd, "user.b")
    r.call("fsetxattr", os.setxattr, fd, "user.c", b"gamma")
    r.call("flistxattr", user_list, fd)
    os.close(fd)
    write_file(r.p("g"), b"")
    os.setxattr(r.p("g"), "user.k", b"v")
    os.rename(r.p("g"), r.p("h"))
    r.call("xattr follows rename", os.getxattr, r.p("h"), "user.k")
    os.link(r.p("h"), r.p("h2"))
    r.call("xattr shared by hard link", os.getxattr, r.p("h2"), "user.k")


# ------------------------------------------------------------------- readdir


@scenario
def readdir_basics(r: Rec):
    os.mkdir(r.p("d"))
    os.mkdir(r.p("d", "sub"))
    write_file(r.p("d", "file"), b"")
    os.symlink("file", r.p("d", "link"))
    r.attempt("special_files", "mkfifo", os.mkfifo, r.p("d", "fifo"))
    entries = sorted((e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False), e.is_symlink())
                     for e in os.scandir(r.p("d")))
    r.note("scandir types", entries)
    r.note("scandir stat via entry", sorted((e.name, e.stat(follow_symlinks=False).st_size if not e.is_dir() else -1)
                                           for e in os.scandir(r.p("d"))))
    r.listing("empty dir lists nothing", "d/sub")
    r.call("listdir a file", os.listdir, r.p("d", "file"))
    r.call("listdir missing", os.listdir, r.p("missing"))
    names = [f"n{i:04d}-" + "x" * (i % 200) for i in range(600)]
    for n in names:
        write_file(r.p("d", "sub", n), b"")
    got = os.listdir(r.p("d", "sub"))
    r.note("600 entries, no dups", (len(got), len(set(got)), sorted(got) == sorted(names)))
    for n in names[::2]:
        os.unlink(r.p("d", "sub", n))
    got = os.listdir(r.p("d", "sub"))
    r.note("after removing half", (len(got), sorted(got) == sorted(names[1::2])))
    fd = os.open(r.p("d"), os.O_RDONLY | os.O_DIRECTORY)
    r.call("read on dir fd", os.read, fd, 10)
    os.close(fd)
    r.call("rmdir non-empty", os.rmdir, r.p("d", "sub"))
    for n in names[1::2]:
        os.unlink(r.p("d", "sub", n))
    r.call("rmdir now empty", os.rmdir, r.p("d", "sub"))
    r.stat("d nlink after rmdir", "d")


@scenario
def readdir_10000_concurrent(r: Rec):
    """10,000 entries listed while another thread creates and removes files:
    every entry that existed before the listing began and was not removed
    appears exactly once; nothing appears twice; nothing unknown appears."""
    d = r.p("big")
    os.mkdir(d)
    keep = [f"keep-{i:05d}" for i in range(10_000)]
    doomed = [f"doomed-{i:04d}" for i in range(1000)]
    for n in keep + doomed:
        os.close(os.open(os.path.join(d, n), os.O_WRONLY | os.O_CREAT, 0o644))
    created: list[str] = []
    stop = threading.Event()
    started = threading.Event()
    errors: list[str] = []

    def churn():
        i = 0
        try:
            while not stop.is_set():
                name = f"new-{i:06d}"
                created.append(name)  # before creating: a listing may see it at once
                os.close(os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT, 0o644))
                if i < len(doomed):
                    os.unlink(os.path.join(d, doomed[i]))
                i += 1
                if i == 50:
                    started.set()
        except OSError as e:
            errors.append(repr(e))
            started.set()

    t = threading.Thread(target=churn)
    t.start()
    results = []
    try:
        started.wait(30)
        for _ in range(3):
            listed = [e.name for e in os.scandir(d)]
            known = set(keep) | set(doomed) | set(created)
            dups = len(listed) - len(set(listed))
            missing = len(set(keep) - set(listed))
            unknown = sorted(set(listed) - known)[:5]
            results.append((dups, missing, unknown))
    finally:
        stop.set()
        t.join(60)
    r.note("churn thread errors", errors)
    r.note("listings (dups, missing keep, unknown)", results)
    r.note("churn thread ran", len(created) >= 50)
    final = os.listdir(d)
    r.note("final listing exact", sorted(final) == sorted(keep + doomed[len(created):] + created))


# ------------------------------------------------------------- statfs, locks


@scenario
def statfs(r: Rec):
    sv = os.statvfs(r.root)
    r.note("f_bsize > 0", sv.f_bsize > 0)
    r.note("f_frsize > 0", sv.f_frsize > 0)
    r.note("f_namemax", sv.f_namemax)
    r.note("f_blocks >= f_bfree >= f_bavail", sv.f_blocks >= sv.f_bfree >= sv.f_bavail)
    r.note("f_files >= f_ffree", sv.f_files >= sv.f_ffree)
    write_file(r.p("f"), b"")
    fd = os.open(r.p("f"), os.O_RDONLY)
    r.note("fstatvfs namemax", os.fstatvfs(fd).f_namemax)
    os.close(fd)
    r.call("statvfs missing", os.statvfs, r.p("missing"))


LOCK_HOLDER = r"""
import fcntl, os, sys
path, kind = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
if kind == "flock":
    fcntl.flock(fd, fcntl.LOCK_EX)
else:
    fcntl.lockf(fd, fcntl.LOCK_EX, 100, 10)
print("locked", flush=True)
sys.stdin.readline()
os.close(fd)
print("released", flush=True)
sys.stdin.readline()
"""


def _getlk(fd: int, start: int, length: int):
    # struct flock on x86_64/aarch64: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid.
    fmt = "hhqqi4x"
    buf = struct.pack(fmt, fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
    out = fcntl.fcntl(fd, fcntl.F_GETLK, buf)
    typ, _, lstart, llen, pid = struct.unpack(fmt, out)
    return typ, lstart, llen, pid


@scenario
def locks(r: Rec):
    write_file(r.p("f"), b"x" * 1000)
    f = r.p("f")
    # flock is per open file description: two opens in one process conflict.
    fd1, fd2 = os.open(f, os.O_RDWR), os.open(f, os.O_RDWR)
    r.call("flock EX fd1", fcntl.flock, fd1, fcntl.LOCK_EX)
    r.call("flock EX|NB fd2 conflicts", fcntl.flock, fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
    r.call("flock SH|NB fd2 conflicts", fcntl.flock, fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)
    os.close(fd1)
    r.call("after close fd1, fd2 gets it", fcntl.flock, fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
    r.call("unlock", fcntl.flock, fd2, fcntl.LOCK_UN)
    os.close(fd2)
    for kind in ("flock", "lockf"):
        child = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, f, kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            r.note(f"{kind} child", child.stdout.readline().strip())
            fd = os.open(f, os.O_RDWR)
            if kind == "flock":
                r.call("flock conflict with other process", fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                r.call("lockf conflict in range", fcntl.lockf, fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 105)
                r.call("lockf outside range ok", fcntl.lockf, fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 200)
                r.call("lockf shared in range conflicts", fcntl.lockf, fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 109)
                typ, lstart, llen, pid = _getlk(fd, 0, 0)
                r.note("F_GETLK sees child's lock", (typ == fcntl.F_WRLCK, lstart, llen, pid == child.pid))
                typ, *_ = _getlk(fd, 500, 10)
                r.note("F_GETLK elsewhere unlocked", typ == fcntl.F_UNLCK)
            child.stdin.write("\n")
            child.stdin.flush()
            r.note(f"{kind} child", child.stdout.readline().strip())
            if kind == "flock":
                r.call("flock after release", fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                r.call("lockf after release", fcntl.lockf, fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 105)
            os.close(fd)
            child.stdin.write("\n")
            child.stdin.flush()
            r.note(f"{kind} child exit", child.wait(30))
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    # POSIX locks go away when any fd of the process on the file is closed.
    fd1, fd2 = os.open(f, os.O_RDWR), os.open(f, os.O_RDWR)
    fcntl.lockf(fd1, fcntl.LOCK_EX, 0, 0)
    os.close(fd2)
    child = subprocess.run(
        [sys.executable, "-c",
         "import fcntl,os,sys\nfd=os.open(sys.argv[1],os.O_RDWR)\n"
         "try:\n fcntl.lockf(fd,fcntl.LOCK_EX|fcntl.LOCK_NB)\n print('got')\n"
         "except OSError as e:\n print('busy', e.errno in (11, 13))", f],
        capture_output=True, text=True, timeout=30,
    )
    r.note("closing another fd drops POSIX lock", child.stdout.strip())
    os.close(fd1)


# ------------------------------------------------------------------ errors


@scenario
def error_paths(r: Rec):
    os.mkdir(r.p("d"))
    write_file(r.p("d", "f"), b"")
    write_file(r.p("file"), b"")
    r.stat("ENOENT stat", "missing")
    r.stat("ENOENT stat nested", "missing/x")
    r.call("ENOENT unlink", os.unlink, r.p("missing"))
    r.call("ENOENT rmdir", os.rmdir, r.p("missing"))
    r.call("ENOENT mkdir nested", os.mkdir, r.p("missing", "x"))
    r.call("ENOENT open in missing dir", os.open, r.p("missing", "f"), os.O_CREAT | os.O_WRONLY, 0o644)
    r.call("EEXIST mkdir", os.mkdir, r.p("d"))
    r.call("EEXIST mkdir over file", os.mkdir, r.p("file"))
    r.call("EEXIST symlink", os.symlink, "x", r.p("file"))
    r.call("EEXIST mkfifo", os.mkfifo, r.p("d"))
    r.call("ENOTEMPTY rmdir", os.rmdir, r.p("d"))
    r.call("EISDIR unlink dir", os.unlink, r.p("d"))
    r.call("EISDIR open dir for write", os.open, r.p("d"), os.O_RDWR)
    r.call("ENOTDIR rmdir file", os.rmdir, r.p("file"))
    r.call("ENOTDIR stat below file", os.stat, r.p("file", "x"))
    r.call("ENOTDIR mkdir below file", os.mkdir, r.p("file", "x"))
    r.call("ENOTDIR listdir file", os.listdir, r.p("file"))
    r.call("ENOTDIR trailing slash", os.stat, r.p("file") + "/")
    r.call("EINVAL rmdir .", os.rmdir, r.p("d", "."))
    r.call("ENOTEMPTY rmdir ..", os.rmdir, r.p("d", ".."))
    n255, n256 = "a" * 255, "a" * 256
    fd = r.quiet("255-byte name ok", os.open, r.p(n255), os.O_CREAT | os.O_WRONLY, 0o644)
    if fd is not None:
        os.close(fd)
    r.stat("255-byte name stat", n255)
    r.call("ENAMETOOLONG create", os.open, r.p(n256), os.O_CREAT | os.O_WRONLY, 0o644)
    r.call("ENAMETOOLONG stat", os.stat, r.p(n256))
    r.call("ENAMETOOLONG mkdir", os.mkdir, r.p("b" * 256))
    r.call("ENAMETOOLONG symlink name", os.symlink, "x", r.p("c" * 256))
    r.call("ENAMETOOLONG rename target", os.rename, r.p("file"), r.p("d" * 256))
    r.call("ENAMETOOLONG link", os.link, r.p("file"), r.p("e" * 256))
    r.call("ENAMETOOLONG setxattr name", os.setxattr, r.p("file"), "user." + "x" * 251, b"")
    r.call("ENAMETOOLONG path", os.stat, r.p("/".join(["abcdefgh"] * 600)))
    r.call("unlink 255", os.unlink, r.p(n255))
    r.listing("listing", "")


@scenario
def mkdir_rmdir_nlink(r: Rec):
    r.stat("root", ".")
    for i in range(5):
        os.mkdir(r.p(f"d{i}"))
    r.stat("root after 5 mkdir", ".")
    os.makedirs(r.p("d0", "a", "b", "c"))
    r.stat("d0", "d0")
    r.stat("d0/a/b/c", "d0/a/b/c")
    write_file(r.p("d1", "f"), b"")
    r.stat("d1 with a file", "d1")
    for i in range(2, 5):
        os.rmdir(r.p(f"d{i}"))
    r.stat("root after rmdir", ".")
    r.call("rmdir deep chain", os.removedirs, r.p("d0", "a", "b", "c"))
    r.stat("d0 gone with its chain", "d0")
    os.mkdir(r.p("cwdtest"))
    old = os.getcwd()
    try:
        os.chdir(r.p("cwdtest"))
        r.call("rmdir cwd", os.rmdir, r.p("cwdtest"))
        r.call("getcwd in removed dir", lambda: os.path.basename(os.getcwd()))
        r.call("create in removed cwd", os.open, "x", os.O_CREAT | os.O_WRONLY, 0o644)
    finally:
        os.chdir(old)
    r.listing("listing", "")


# ------------------------------------------------------------------ runner


def run_scenario(fn, root: Path, unsupported: dict | None = None, reference: bool = False) -> list:
    """Observations of fn on root. An exception the scenario did not expect
    ends the run with one last observation, so the diff shows where it diverged."""
    rec = Rec(str(root), unsupported, reference)
    try:
        fn(rec)
    except OSError as e:
        rec.obs.append(("<scenario aborted by unexpected error>", f"{type(e).__name__} E:{errno.errorcode.get(e.errno)}"))
    return rec.obs


@pytest.mark.parametrize("scenario_fn", SCENARIOS, ids=[f.__name__ for f in SCENARIOS])
def test_posix(scenario_fn, mnt, native_dir):
    unsupported = mnt.config.unsupported
    native = run_scenario(scenario_fn, native_dir, unsupported, reference=True)
    assert native, f"{scenario_fn.__name__} observed nothing on native"
    mounted = run_scenario(scenario_fn, mnt.path, unsupported)
    diff = compare(native, mounted)
    assert diff is None, f"{scenario_fn.__name__} on {mnt.config.id} differs from native ext4:\n{diff}"


def test_scenarios_observe_errors_natively(native_dir):
    """Guards the suite itself: the reference run must reach the error paths
    it claims to test, so an all-success typo cannot pass vacuously."""
    obs = dict(run_scenario(error_paths, native_dir))
    for label, want in (
        ("ENOENT unlink", "E:ENOENT"),
        ("EEXIST mkdir", "E:EEXIST"),
        ("ENOTEMPTY rmdir", "E:ENOTEMPTY"),
        ("EISDIR unlink dir", "E:EISDIR"),
        ("ENOTDIR rmdir file", "E:ENOTDIR"),
        ("ENAMETOOLONG create", "E:ENAMETOOLONG"),
    ):
        assert obs[label] == want, (label, obs[label])
