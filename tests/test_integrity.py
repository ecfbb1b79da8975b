"""Data integrity: an fsx-style random run against an in-memory shadow, and
fio with crc32c verification over several threads.

The fsx run is reproducible: the seed is in every failure message and
SHORTFUSE_FSX_SEED / SHORTFUSE_FSX_OPS override it and the length (without
SHORTFUSE_FSX_OPS: 100,000 operations, or the configuration's fsx_ops in
sfmount.FILE_SYSTEMS).
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import random
import shutil
import time
from collections import deque

import pytest

from observe import FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, fallocate
from sfmount import run

FSX_OPS_ENV = os.environ.get("SHORTFUSE_FSX_OPS")
FSX_OPS = 100_000
FSX_SEED = int(os.environ.get("SHORTFUSE_FSX_SEED", "20250601"))
MAX_SIZE = 1 << 20


class FsxFailure(AssertionError):
    pass


class FileState:
    def __init__(self, path: str):
        self.path = path
        self.shadow = bytearray()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        # A second open file description: reads through it must see writes made through the first.
        self.fd2 = os.open(path, os.O_RDONLY)

    def reopen(self) -> None:
        os.close(self.fd)
        os.close(self.fd2)
        self.fd = os.open(self.path, os.O_RDWR)
        self.fd2 = os.open(self.path, os.O_RDONLY)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.fd2)


class Fsx:
    """Random operations on a few files, each checked against a shadow copy."""

    # Per 10,000 operations. fsync and msync are rare: on ext4 (and so on a
    # passthrough mount) each costs a journal commit, and the run must stay fast.
    WEIGHTS = {
        "pwrite": 2600,
        "pread": 2600,
        "write_seq": 800,
        "read_seq": 800,
        "truncate": 500,
        "fallocate_keep": 300,
        "fallocate_grow": 300,
        "punch": 400,
        "mmap_read": 300,
        "mmap_write": 198,
        "mmap_write_msync": 2,
        "fsync": 2,
        "reopen": 300,
        "stat": 498,
    }

    def __init__(self, root: str, seed: int, nfiles: int = 3, fallocate_optional: bool = False):
        self.seed = seed
        # Peers (bindfs) and configurations that declare it unsupported may lack fallocate.
        self.fallocate_optional = fallocate_optional
        self.fallocate_works = True
        self.rng = random.Random(seed)
        self.files = [FileState(os.path.join(root, f"fsx{i}")) for i in range(nfiles)]
        self.log: deque[str] = deque(maxlen=25)
        self.opno = 0
        names = list(self.WEIGHTS)
        self.names = names
        self.cum = []
        total = 0
        for n in names:
            total += self.WEIGHTS[n]
            self.cum.append(total)

    def fail(self, msg: str) -> None:
        raise FsxFailure(
            f"fsx seed={self.seed} op #{self.opno}: {msg}\n"
            f"reproduce: SHORTFUSE_FSX_SEED={self.seed} SHORTFUSE_FSX_OPS={self.opno + 1}\n"
            "last operations:\n  " + "\n  ".join(self.log)
        )

    def _len(self) -> int:
        r = self.rng.random()
        if r < 0.5:
            return self.rng.randint(1, 4096)
        if r < 0.9:
            return self.rng.randint(1, 32768)
        return self.rng.randint(1, 200_000)

    def _check(self, f: FileState, off: int, n: int, got: bytes, what: str) -> None:
        want = bytes(f.shadow[off : off + n])
        if got != want:
            first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
            self.fail(
                f"{what} on {os.path.basename(f.path)} at {off} len {n}: got {len(got)} bytes, want {len(want)}; "
                f"first difference at +{first} (file offset {off + first}): "
                f"got {got[first:first + 16].hex()} want {want[first:first + 16].hex()}"
            )

    def _read_full(self, fd: int, n: int, off: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = os.pread(fd, n - len(out), off + len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def _write_shadow(self, f: FileState, off: int, data: bytes) -> None:
        end = off + len(data)
        if end > len(f.shadow):
            f.shadow.extend(bytes(end - len(f.shadow)))
        f.shadow[off:end] = data

    def _resize_shadow(self, f: FileState, size: int) -> None:
        if size < len(f.shadow):
            del f.shadow[size:]
        else:
            f.shadow.extend(bytes(size - len(f.shadow)))

    def step(self) -> None:
        rng = self.rng
        op = self.names[_bisect(self.cum, rng.randrange(self.cum[-1]))]
        f = rng.choice(self.files)
        name = os.path.basename(f.path)
        size = len(f.shadow)
        if op == "pwrite":
            n = self._len()
            off = rng.randrange(0, MAX_SIZE - n) if n < MAX_SIZE else 0
            data = rng.randbytes(n)
            self.log.append(f"#{self.opno} pwrite {name} off={off} len={n}")
            done = os.pwrite(f.fd, data, off)
            if done != n:
                self.fail(f"short pwrite {done} of {n}")
            self._write_shadow(f, off, data)
        elif op == "pread":
            n = self._len()
            off = rng.randrange(0, size + 4096)
            fd = f.fd if rng.random() < 0.5 else f.fd2
            self.log.append(f"#{self.opno} pread {name} off={off} len={n} fd={'1' if fd == f.fd else '2'}")
            self._check(f, off, n, self._read_full(fd, n, off), "pread")
        elif op == "write_seq":
            n = self._len()
            off = rng.randrange(0, min(size, MAX_SIZE - n) + 1) if n < MAX_SIZE else 0
            data = rng.randbytes(n)
            self.log.append(f"#{self.opno} lseek+write {name} off={off} len={n}")
            os.lseek(f.fd, off, os.SEEK_SET)
            done = os.write(f.fd, data)
            if done != n:
                self.fail(f"short write {done} of {n}")
            pos = os.lseek(f.fd, 0, os.SEEK_CUR)
            if pos != off + n:
                self.fail(f"file offset {pos} after write, want {off + n}")
            self._write_shadow(f, off, data)
        elif op == "read_seq":
            n = self._len()
            off = rng.randrange(0, size + 1)
            self.log.append(f"#{self.opno} lseek+read {name} off={off} len={n}")
            os.lseek(f.fd2, off, os.SEEK_SET)
            got = bytearray()
            while len(got) < n:
                chunk = os.read(f.fd2, n - len(got))
                if not chunk:
                    break
                got += chunk
            self._check(f, off, n, bytes(got), "read")
        elif op == "truncate":
            new = rng.choice([0, rng.randrange(0, MAX_SIZE), rng.randrange(0, size + 1), size + rng.randrange(1, 9000)])
            new = min(new, MAX_SIZE)
            self.log.append(f"#{self.opno} ftruncate {name} {size}->{new}")
            os.ftruncate(f.fd, new)
            self._resize_shadow(f, new)
        elif op in ("fallocate_keep", "fallocate_grow", "punch"):
            n = self._len()
            off = rng.randrange(0, MAX_SIZE - n)
            mode = {
                "fallocate_keep": FALLOC_FL_KEEP_SIZE,
                "fallocate_grow": 0,
                "punch": FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            }[op]
            if not self.fallocate_works:
                return
            self.log.append(f"#{self.opno} fallocate({op}) {name} off={off} len={n}")
            try:
                fallocate(f.fd, mode, off, n)
            except OSError as e:
                if self.fallocate_optional and e.errno == errno.EOPNOTSUPP:
                    self.fallocate_works = False
                    return
                self.fail(f"fallocate mode={mode:#x} off={off} len={n}: {errno.errorcode.get(e.errno, e.errno)}")
            if op == "fallocate_grow" and off + n > size:
                self._resize_shadow(f, off + n)
            elif op == "punch" and off < size:
                end = min(off + n, size)
                f.shadow[off:end] = bytes(end - off)
        elif op == "mmap_read":
            if size == 0:
                return
            off = rng.randrange(0, size)
            n = min(self._len(), size - off)
            self.log.append(f"#{self.opno} mmap read {name} off={off} len={n}")
            with mmap.mmap(f.fd2, size, prot=mmap.PROT_READ) as m:
                got = m[off : off + n]
            self._check(f, off, n, got, "mmap read")
        elif op in ("mmap_write", "mmap_write_msync"):
            if size == 0:
                return
            off = rng.randrange(0, size)
            n = min(self._len(), size - off)
            data = rng.randbytes(n)
            self.log.append(f"#{self.opno} {op.replace('_', ' ')} {name} off={off} len={n}")
            with mmap.mmap(f.fd, size) as m:
                m[off : off + n] = data
                if op == "mmap_write_msync":
                    m.flush()
            self._write_shadow(f, off, data)
        elif op == "fsync":
            self.log.append(f"#{self.opno} fsync {name}")
            os.fsync(f.fd)
        elif op == "reopen":
            self.log.append(f"#{self.opno} close+reopen {name}")
            f.reopen()
        elif op == "stat":
            self.log.append(f"#{self.opno} fstat/stat {name}")
            for st in (os.fstat(f.fd), os.stat(f.path)):
                if st.st_size != size:
                    self.fail(f"size {st.st_size}, shadow {size}")

    def verify_all(self, what: str) -> None:
        for f in self.files:
            self.log.append(f"#{self.opno} verify whole {os.path.basename(f.path)} ({what})")
            if os.stat(f.path).st_size != len(f.shadow):
                self.fail(f"{what}: size {os.stat(f.path).st_size}, shadow {len(f.shadow)}")
            with open(f.path, "rb") as fh:
                got = fh.read()
            self._check(f, 0, max(len(got), len(f.shadow)), got, f"{what} whole-file read")
            if len(got) != len(f.shadow):
                self.fail(f"{what}: read {len(got)} bytes, shadow {len(f.shadow)}")

    def run(self, ops: int) -> None:
        try:
            for self.opno in range(ops):
                self.step()
                if self.opno % 10_000 == 9_999:
                    self.verify_all("periodic check")
            for f in self.files:
                os.fsync(f.fd)
            self.verify_all("final check")
            for f in self.files:
                f.close()
            self.verify_all("after close")
        except OSError as e:
            self.fail(f"unexpected {type(e).__name__}: {e}")


def _bisect(cum: list[int], x: int) -> int:
    lo, hi = 0, len(cum)
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def test_fsx_harness_on_native(native_dir):
    """The harness itself agrees with ext4 (a harness bug must not show up as a file-system bug)."""
    Fsx(str(native_dir), FSX_SEED).run(20_000)


def _fsx(mnt, ops: int) -> None:
    no_fallocate = not mnt.config.is_shortfuse or "fallocate" in mnt.config.unsupported
    fsx = Fsx(str(mnt.path), FSX_SEED, fallocate_optional=no_fallocate)
    fsx.run(ops)
    assert fsx.opno == ops - 1


@pytest.mark.deadline(240)
def test_fsx(mnt):
    _fsx(mnt, int(FSX_OPS_ENV) if FSX_OPS_ENV else (mnt.config.spec.fsx_ops or FSX_OPS))


# -o writeback_cache: the kernel keeps written pages, size and mtime, and
# writes back later (the README's `optimized` profile turns it on).
WRITEBACK = pytest.mark.fs("mem", "passthrough")


@WRITEBACK
@pytest.mark.shortfuse_only
@pytest.mark.deadline(240)
def test_fsx_writeback_cache(config, mount_factory):
    _fsx(mount_factory(config, ["writeback_cache"]), int(FSX_OPS_ENV) if FSX_OPS_ENV else 10_000)


@WRITEBACK
@pytest.mark.shortfuse_only
@pytest.mark.deadline(600)
def test_fio_verify_writeback_cache(config, mount_factory):
    _fio_verify(mount_factory(config, ["writeback_cache"]))


@pytest.mark.fs("passthrough")
@pytest.mark.shortfuse_only
def test_writeback_cache_size_and_mtime_after_close(config, mount_factory):
    """The kernel keeps size and mtime of a file it caches writes of; at
    close the daemon's file (the source, on passthrough) has both."""
    m = mount_factory(config, ["writeback_cache"])
    f = m.path / "f"
    f.write_bytes(b"a" * 5000)
    old = os.stat(f)
    time.sleep(0.02)  # a later mtime than the first write's, on any clock
    with open(f, "r+b") as h:
        h.seek(10_000)
        h.write(b"b" * 3000)
    after = os.stat(f)
    assert after.st_size == 13_000
    assert after.st_mtime_ns > old.st_mtime_ns, (old.st_mtime_ns, after.st_mtime_ns)
    src = os.stat(m.source / "f")
    assert (src.st_size, src.st_mtime_ns) == (after.st_size, after.st_mtime_ns)
    assert (m.source / "f").read_bytes() == b"a" * 5000 + bytes(5000) + b"b" * 3000
    assert f.read_bytes() == (m.source / "f").read_bytes()
    # A write-only descriptor's partial page (the kernel reads the rest of
    # the page first) and appends (the kernel decides where the end is).
    fd = os.open(f, os.O_WRONLY)
    try:
        assert os.pwrite(fd, b"W" * 10, 100) == 10
    finally:
        os.close(fd)
    with open(f, "ab") as h:
        h.write(b"c" * 100)
        h.write(b"d" * 100)
    want = b"a" * 100 + b"W" * 10 + b"a" * 4890 + bytes(5000) + b"b" * 3000 + b"c" * 100 + b"d" * 100
    assert f.read_bytes() == want
    assert (m.source / "f").read_bytes() == want


def _fio(directory, *args: str, timeout: float = 600) -> dict:
    fio = shutil.which("fio")
    assert fio, "fio is not installed: run scripts/setup.sh"
    # No verify state files: they would land in the working directory.
    cmd = [fio, f"--directory={directory}", "--output-format=json", "--verify_state_save=0", *args]
    r = run(cmd, timeout=timeout, cwd=directory)
    text = r.stdout
    start = text.find("{")
    assert r.returncode == 0, f"fio exited {r.returncode}: {' '.join(cmd)}\n{r.stderr[-3000:]}\n{text[-3000:]}"
    assert start >= 0, f"fio printed no JSON: {text[-2000:]} {r.stderr[-2000:]}"
    report = json.loads(text[start:])
    for job in report["jobs"]:
        assert job["error"] == 0, f"fio job {job['jobname']} error {job['error']}: {r.stderr[-2000:]}"
    return report


@pytest.mark.deadline(600)
def test_fio_verify(mnt):
    _fio_verify(mnt)


def _fio_verify(mnt) -> None:
    size = mnt.config.spec.fio_mib << 20
    report = _fio(
        mnt.path,
        "--name=randwrite-verify",
        "--rw=randwrite",
        "--bs=4k",
        f"--size={size}",
        "--numjobs=4",
        "--ioengine=psync",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--fsync_on_close=1",
    )
    jobs = report["jobs"]
    assert len(jobs) == 4
    for job in jobs:
        assert job["write"]["io_bytes"] == size, job["write"]["io_bytes"]
        assert job["read"]["io_bytes"] == size, f"verify phase read {job['read']['io_bytes']} bytes of {size}"
    report = _fio(
        mnt.path,
        "--name=seq-verify",
        "--rw=write",
        "--bs=1M",
        f"--size={size}",
        "--numjobs=2",
        "--ioengine=psync",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    )
    for job in report["jobs"]:
        assert job["read"]["io_bytes"] == size
