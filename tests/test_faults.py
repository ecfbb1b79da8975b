"""Faults and the CLI's edges: unmount while busy, kill -9 of the daemon,
SIGTERM, mistakes on the command line, and `shortfuse stats`.

Every wait is bounded: a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import sfmount
from sfmount import Config, is_mounted, mounts_at, pid_alive, run, shortfuse_bin, wait_until

pytestmark = pytest.mark.shortfuse_only

# Errno name of os.stat on `path`, or "ok", measured in a child process with a
# deadline so that a hung mount fails the test instead of wedging pytest.
STAT_PROBE = "import os,errno,sys\ntry:\n os.stat(sys.argv[1]); print('ok')\nexcept OSError as e:\n print(errno.errorcode[e.errno])"


def probe_stat(path, timeout: float = 10) -> str:
    try:
        r = subprocess.run([sys.executable, "-c", STAT_PROBE, str(path)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"HANG (no answer within {timeout}s)"
    return r.stdout.strip() or r.stderr.strip()


def sf(*args, timeout: float = 30) -> subprocess.CompletedProcess:
    return run([shortfuse_bin(), *map(str, args)], timeout=timeout)


def test_mount_detaches_from_stdio(config, mount_factory):
    """`out=$(shortfuse mount ...)` must return: the background daemon may
    not keep the caller's stdout/stderr pipes open."""
    base = sfmount.new_scratch("stdio")
    try:
        mnt = base / "mnt"
        mnt.mkdir()
        args = [shortfuse_bin(), *config.mount_args(config.make_sources(base), mnt)]
        p = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            p.communicate(timeout=20)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
            p.kill()
            p.communicate()
        mounted = is_mounted(mnt)
        if mounted:
            sfmount.Mount(config, base, mnt).unmount()
        assert not hung, "shortfuse mount kept stdout/stderr open after returning: command substitution would hang"
        assert p.returncode == 0 and mounted
    finally:
        sfmount.remove_scratch(base)


def test_umount_busy_open_file(mnt):
    f = mnt.path / "held"
    f.write_bytes(b"still readable")
    fd = os.open(f, os.O_RDONLY)
    try:
        r = sf("umount", mnt.path)
        assert r.returncode != 0, "umount of a mount with an open file succeeded"
        assert "busy" in (r.stderr + r.stdout).lower(), f"no 'busy' in the message: {r.stderr!r}"
        assert is_mounted(mnt.path), "failed umount still removed the mount"
        r = sf("umount", "-l", mnt.path)
        assert r.returncode == 0, f"umount -l failed: {r.stderr}"
        assert wait_until(lambda: not is_mounted(mnt.path), 5), "umount -l left the mount in the table"
        # Lazily detached: the open file keeps the file system alive and served.
        assert os.pread(fd, 100, 0) == b"still readable"
    finally:
        os.close(fd)
    assert not mnt.wait_daemon_exit(10), "daemon still running 10s after the last user left a lazily unmounted fs"


def test_umount_busy_cwd(mnt):
    (mnt.path / "d").mkdir()
    sleeper = subprocess.Popen(["sleep", "60"], cwd=mnt.path / "d")
    try:
        r = sf("umount", mnt.path)
        assert r.returncode != 0, "umount succeeded while a process had its cwd inside"
        assert "busy" in (r.stderr + r.stdout).lower(), f"no 'busy' in the message: {r.stderr!r}"
        assert is_mounted(mnt.path)
    finally:
        sleeper.kill()
        sleeper.wait()
    r = sf("umount", mnt.path)
    assert r.returncode == 0, f"umount after the user left failed: {r.stderr}"
    assert not is_mounted(mnt.path)
    assert not mnt.wait_daemon_exit(10), "daemon outlived its unmount"


def test_kill9_gives_enotconn_and_umount_l_cleans(mnt):
    (mnt.path / "f").write_bytes(b"x")
    assert mnt.daemon_pids, f"no shortfuse daemon process found serving {mnt.path}"
    for pid in mnt.daemon_pids:
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not any(pid_alive(p) for p in mnt.daemon_pids), 10), "daemon survived SIGKILL"
    assert probe_stat(mnt.path / "f") == "ENOTCONN"
    assert probe_stat(mnt.path) == "ENOTCONN"
    r = sf("umount", "-l", mnt.path)
    assert r.returncode == 0, f"umount -l of a dead mount failed: {r.stderr}"
    assert wait_until(lambda: not is_mounted(mnt.path), 5), "dead mount still listed after umount -l"
    assert probe_stat(mnt.path) == "ok", "mount point unusable after cleaning"


def test_umount_of_dead_daemon(mnt):
    """`shortfuse umount` (not lazy) also works when the daemon died, as its help says."""
    for pid in mnt.daemon_pids:
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not any(pid_alive(p) for p in mnt.daemon_pids), 10)
    r = sf("umount", mnt.path)
    assert r.returncode == 0, f"umount of a dead mount failed: {r.stderr}"
    assert not is_mounted(mnt.path)


@pytest.mark.shortfuse_only
def test_mount_again_right_after_umount(config, mnt):
    """A new mount at the place of one just unmounted gets the old
    connection's device numbers; the old daemon, exiting late, must not take
    it for its own and unmount it."""
    old = list(mnt.daemon_pids)
    for _ in range(3):
        r = sf("umount", mnt.path)
        assert r.returncode == 0, r.stderr
        r = run([shortfuse_bin(), *config.mount_args(mnt.sources, mnt.path)], timeout=30)
        assert r.returncode == 0, f"mount again failed: {r.stderr}"
        (mnt.path / "probe").write_bytes(b"x")
        assert wait_until(lambda: not any(pid_alive(p) for p in old), 10), "the old daemon did not exit"
        assert is_mounted(mnt.path), "the new mount vanished when the old daemon exited"
        assert (mnt.path / "probe").read_bytes() == b"x"
        old = sfmount.pids_of_daemon(shortfuse_bin(), str(mnt.path))
    mnt.daemon_pids = old


def test_sigterm_unmounts(mnt):
    assert mnt.daemon_pids, f"no shortfuse daemon process found serving {mnt.path}"
    for pid in mnt.daemon_pids:
        os.kill(pid, signal.SIGTERM)
    assert wait_until(lambda: not is_mounted(mnt.path), 10), "SIGTERM did not unmount within 10s"
    assert not mnt.wait_daemon_exit(10), "daemon still alive 10s after SIGTERM"


def test_foreground_mount_and_sigint(config):
    base = sfmount.new_scratch("fg")
    mnt = base / "mnt"
    mnt.mkdir()
    args = [shortfuse_bin(), *config.mount_args(config.make_sources(base), mnt), "-f"]
    p = subprocess.Popen([str(a) for a in args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: is_mounted(mnt) or p.poll() is not None, 15), "-f mount never appeared"
        assert p.poll() is None, f"foreground daemon exited: {p.stderr.read()}"
        assert is_mounted(mnt)
        (mnt / "x").write_bytes(b"fg")
        assert (mnt / "x").read_bytes() == b"fg"
        p.send_signal(signal.SIGINT)
        p.wait(15)
        assert p.returncode == 0, f"foreground daemon exit status {p.returncode} after SIGINT: {p.stderr.read()}"
        assert not is_mounted(mnt), "SIGINT did not unmount"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if is_mounted(mnt):
            run(["umount", "-l", str(mnt)])
        sfmount.remove_scratch(base)


@pytest.fixture
def scratch():
    base = sfmount.new_scratch("cli")
    yield base
    for m in sfmount.leaked_mounts():
        if m.startswith(str(base)):
            run(["umount", "-l", m])
    sfmount.remove_scratch(base)


def _expect_refusal(args, mountpoint: Path, *hints: str) -> str:
    r = sf(*args, timeout=20)
    msg = (r.stderr + r.stdout).strip()
    assert r.returncode != 0, f"`shortfuse {' '.join(map(str, args))}` succeeded; output: {msg!r}"
    assert msg, "refused without any message"
    assert any(h.lower() in msg.lower() for h in hints), f"message {msg!r} mentions none of {hints}"
    return msg


def test_cli_mountpoint_missing(config, scratch):
    mp = scratch / "nope"
    _expect_refusal(config.mount_args(config.make_sources(scratch), mp), mp, str(mp), "no such", "not exist")
    assert not mounts_at(scratch)


def test_cli_mountpoint_is_file(config, scratch):
    mp = scratch / "file"
    mp.write_bytes(b"")
    _expect_refusal(config.mount_args(config.make_sources(scratch), mp), mp, "not a directory", str(mp))
    assert not is_mounted(mp)


def test_cli_already_mounted(config, mnt):
    _expect_refusal(config.mount_args(mnt.sources, mnt.path), mnt.path, "already", "mounted")
    assert len(mounts_at(mnt.path)) == 1, "a second mount was stacked on the first"
    assert probe_stat(mnt.path) == "ok", "the first mount stopped working"


@pytest.mark.fs("passthrough")
def test_cli_passthrough_source_missing(config, scratch):
    mp = scratch / "mnt"
    mp.mkdir()
    missing = scratch / "no-source"
    _expect_refusal(["mount", "passthrough", missing, mp], mp, str(missing), "source", "no such")
    assert not is_mounted(mp)


def test_cli_unknown_fs_and_option(config, scratch):
    mp = scratch / "mnt"
    mp.mkdir()
    _expect_refusal(["mount", "no-such-fs", mp], mp, "no-such-fs", "unknown")
    args = config.mount_args(config.make_sources(scratch), mp, "bogus_option_xyz")
    _expect_refusal(args, mp, "bogus_option_xyz")
    assert not is_mounted(mp)


def test_cli_umount_not_mounted(scratch):
    r = sf("umount", scratch)
    assert r.returncode != 0 and (r.stderr + r.stdout).strip()


def test_stats(mnt):
    d = mnt.path
    for i in range(20):
        (d / f"f{i}").write_bytes(b"data" * 100)
    for i in range(20):
        os.stat(d / f"f{i}")
        (d / f"f{i}").read_bytes()
    os.listdir(d)
    r = sf("stats", mnt.path)
    assert r.returncode == 0, f"stats failed: {r.stderr}"
    counts = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isupper() and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    # With kernel passthrough the kernel writes the source itself: no WRITE
    # may reach the daemon (test_passthrough_mode.py). The files are read
    # after their writer closed, through the mount's reader cache: READs.
    kernel_data = "passthrough" in mnt.config.options
    for op in ("LOOKUP", "GETATTR", "CREATE", "WRITE", "OPEN", "READ", "RELEASE"):
        if kernel_data and op == "WRITE":
            assert counts.get(op, 0) == 0, f"{op} reached the daemon of a passthrough mount:\n{r.stdout}"
        else:
            assert counts.get(op, 0) > 0, f"{op} missing or zero in stats:\n{r.stdout}"
    assert counts["LOOKUP"] >= 20, f"20 new names looked up, LOOKUP count {counts['LOOKUP']}"
    r = sf("stats", "--json", mnt.path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by_name = {op["name"]: op for op in doc["ops"]}
    assert by_name["CREATE"]["count"] >= 20
    assert all(op["max_nanos"] >= op["p50_nanos"] > 0 for op in doc["ops"] if op["count"])


@pytest.mark.shortfuse_only
def test_background_daemon_logs_beside_its_socket(mnt):
    """A background daemon's stderr goes to a log file, not to /dev/null:
    SIGUSR1's statistics table must appear there."""
    (mnt.path / "logged").write_bytes(b"x")
    assert mnt.daemon_pids, "no daemon found for the mount"
    log = Path(os.readlink(f"/proc/{mnt.daemon_pids[0]}/fd/2"))
    assert log.parent == Path("/run/shortfuse") and log.suffix == ".log", f"daemon stderr is {log}"
    before = log.read_text() if log.exists() else ""
    for pid in mnt.daemon_pids:
        os.kill(pid, signal.SIGUSR1)
    assert wait_until(lambda: "CREATE" in log.read_text()[len(before) :], 10), (
        f"SIGUSR1's table did not reach {log}:\n{log.read_text()[-2000:]}"
    )


def test_stats_refuses_non_shortfuse_dir(scratch):
    r = sf("stats", scratch)
    assert r.returncode != 0 and (r.stderr + r.stdout).strip()


@contextlib.contextmanager
def unprivileged(user: str, scratch: Path):
    """A mount point in `scratch` that `user` owns, /dev/fuse usable by
    everyone (Debian's udev rule makes it 0666; this machine ships it 0600)
    for the duration, and the mount undone after. Yields (mountpoint, the
    command that runs shortfuse as `user` without XDG_RUNTIME_DIR)."""
    mp = scratch / "mnt"
    mp.mkdir()
    os.chmod(scratch, 0o777)
    shutil.chown(mp, user)
    mode = os.stat("/dev/fuse").st_mode & 0o777
    try:
        os.chmod("/dev/fuse", 0o666)
        yield mp, ["runuser", "-u", user, "--", "env", "XDG_RUNTIME_DIR=", str(shortfuse_bin())]
    finally:
        os.chmod("/dev/fuse", mode)
        if is_mounted(mp):
            run(["umount", "-l", str(mp)], timeout=30)


def test_unprivileged_mount_through_fusermount3(scratch):
    """A user without privileges mounts through the setuid fusermount3 (as
    libfuse does), writes to the mount it owns, reads its statistics and
    unmounts it."""
    user = "nobody"
    with unprivileged(user, scratch) as (mp, as_user):
        r = run(as_user + ["mount", "mem", str(mp)], timeout=30)
        assert r.returncode == 0, f"unprivileged mount failed: {r.stderr}"
        info = mounts_at(mp)
        assert len(info) == 1 and info[0].fstype == "fuse.shortfuse-mem", info
        r = run(["runuser", "-u", user, "--", "stat", "-c", "%u %a", str(mp)], timeout=30)
        assert r.stdout.split() == [str(pwd.getpwnam(user).pw_uid), "755"], f"the mount's root is not its owner's: {r.stdout}"
        r = run(["runuser", "-u", user, "--", "sh", "-c", f"echo hi > {mp}/f && cat {mp}/f"], timeout=30)
        assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
        r = run(as_user + ["stats", str(mp)], timeout=30)
        assert r.returncode == 0 and "CREATE" in r.stdout, r.stderr
        # Nobody else may enter it, not even root (no allow_other).
        r = run(["runuser", "-u", "daemon", "--", "ls", str(mp)], timeout=30)
        assert r.returncode != 0, "a mount without allow_other was readable by another user"
        with pytest.raises(PermissionError):
            os.listdir(mp)
        r = run(as_user + ["umount", str(mp)], timeout=30)
        assert r.returncode == 0, f"unprivileged umount failed: {r.stderr}"
        assert not is_mounted(mp)


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def test_runtime_dir_attack_of_another_user_fails(scratch):
    """Without XDG_RUNTIME_DIR the daemon's directory is /tmp/shortfuse-UID,
    which any user can create first. An attacker (`daemon`) makes it 0777
    and links the victim's (`nobody`'s) future log to a file of the victim:
    the mount is refused with a clear error and the file is untouched. A
    symbolic link in the victim's own 0700 directory is not followed either.
    Without an attacker the directory is made 0700 and the mount works."""
    victim, attacker = "nobody", "daemon"
    uid = pwd.getpwnam(victim).pw_uid
    rundir = Path(f"/tmp/shortfuse-{uid}")
    target = scratch / "precious"
    target.write_text("precious\n")
    shutil.chown(target, victim)
    shutil.rmtree(rundir, ignore_errors=True)
    try:
        with unprivileged(victim, scratch) as (mp, as_user):
            log = rundir / f"mnt-{fnv1a(bytes(mp)):016x}.log"
            plant = f"umask 0; mkdir -m 0777 {rundir} && ln -s {target} {log}"
            r = run(["runuser", "-u", attacker, "--", "sh", "-c", plant], timeout=30)
            assert r.returncode == 0, r.stderr
            r = run(as_user + ["mount", "mem", str(mp)], timeout=30)
            assert r.returncode != 0 and not is_mounted(mp), "mounted through another user's runtime directory"
            assert "refusing the runtime directory" in r.stderr and "uid" in r.stderr, r.stderr
            assert target.read_text() == "precious\n"

            # The victim's own private directory, a link where the log goes.
            shutil.rmtree(rundir)
            r = run(["runuser", "-u", victim, "--", "sh", "-c", f"mkdir -m 0700 {rundir} && ln -s {target} {log}"], timeout=30)
            assert r.returncode == 0, r.stderr
            r = run(as_user + ["mount", "mem", str(mp)], timeout=30)
            assert r.returncode != 0 and not is_mounted(mp), "mounted with its log a symbolic link"
            assert "symbolic links" in r.stderr, r.stderr
            assert target.read_text() == "precious\n"

            shutil.rmtree(rundir)
            r = run(as_user + ["mount", "mem", str(mp)], timeout=30)
            assert r.returncode == 0, r.stderr
            st = rundir.lstat()
            assert (st.st_uid, st.st_mode & 0o7777) == (uid, 0o700), (st.st_uid, oct(st.st_mode))
            assert log.is_file() and not log.is_symlink()
            r = run(as_user + ["umount", str(mp)], timeout=30)
            assert r.returncode == 0, r.stderr
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def listing() -> dict[str, list[str]]:
    """`shortfuse list` as {mount point: [fs, source, transport, pid, log]}."""
    r = sf("list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["MOUNTPOINT", "FS", "SOURCE", "TRANSPORT", "PID", "LOG"], r.stdout
    return {cols[0]: cols[1:] for cols in (l.split() for l in lines[1:])}


def test_list_shows_mounts_and_daemons(scratch):
    """Background mounts (dev and uring), a `serve` daemon with rings alone,
    and a mount whose daemon was killed, each with its file system, source,
    transport, pid and log."""
    src, mem, pt, rings, dead = (scratch / n for n in ("src", "mem", "pt", "rings", "dead"))
    for d in (src, mem, pt, rings, dead):
        d.mkdir()
    assert sf("mount", "mem", mem).returncode == 0
    assert sf("mount", "passthrough", src, pt, "--transport", "uring").returncode == 0
    assert sf("mount", "mem", dead).returncode == 0
    serve = subprocess.Popen([str(shortfuse_bin()), "serve", "mem", str(rings)], stderr=subprocess.PIPE, text=True)
    try:
        assert "shortfuse serve" in serve.stderr.readline()
        for pid in sfmount.pids_of_daemon(shortfuse_bin(), str(dead)):
            os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: listing().get(str(dead), [""] * 4)[3] == "-", 10), listing()
        got = listing()
        for mp, fs, source in ((mem, "mem", "mem"), (pt, "passthrough", str(src))):
            (pid,) = sfmount.pids_of_daemon(shortfuse_bin(), str(mp))
            log = os.readlink(f"/proc/{pid}/fd/2")
            assert log.endswith(".log") and Path(log).is_file()
            assert got[str(mp)][:2] == [fs, source] and got[str(mp)][3:] == [str(pid), log], got
        assert got[str(mem)][2] == "dev"
        # uring falls back to dev where the kernel's switch cannot be turned on.
        assert got[str(pt)][2] in ("uring", "dev"), got
        # Its stderr is the test's pipe: the foreground's "log".
        assert got[str(rings)][:4] == ["mem", "mem", "rings", str(serve.pid)], got
        assert got[str(rings)][4].startswith("pipe:"), got
        assert got[str(dead)][:2] == ["mem", "mem"] and got[str(dead)][2:] == ["-", "-", "-"], got
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        for mp in (mem, pt, dead):
            sf("umount", "-l", mp)
    # A lazy unmount returns before the daemon has gone; it leaves the list
    # once it has.
    gone = lambda: not {str(rings), str(mem)} & set(listing())
    assert wait_until(gone, 10), listing()


def test_version_names_the_commit():
    r = sf("--version")
    head = subprocess.run(["git", "-C", str(sfmount.REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("shortfuse "), r
    if head.returncode == 0:
        assert f"commit {head.stdout[:12]}" in r.stdout or head.stdout[:12] in r.stdout, (r.stdout, head.stdout)
    else:
        # Built outside a git checkout: the crate version alone.
        assert "commit" not in r.stdout, r.stdout


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_metrics_parse(scratch):
    """`stats --prometheus` and a scrape of `-o metrics=ADDR:PORT` are read
    by the Prometheus client's own text parser: request counts by
    transport, a latency histogram per operation whose count matches the
    requests made, and the cache's counters."""
    from prometheus_client.parser import text_string_to_metric_families

    mnt = scratch / "mnt"
    mnt.mkdir()
    port = free_tcp_port()
    r = sf("mount", "mem", mnt, "-o", f"metrics=127.0.0.1:{port},cache=on")
    assert r.returncode == 0, r.stderr
    try:
        for i in range(7):
            (mnt / f"f{i}").write_bytes(b"x")
        stats = json.loads(sf("stats", "--json", mnt).stdout)
        creates = next(op["count"] for op in stats["ops"] if op["name"] == "CREATE")
        texts = [sf("stats", "--prometheus", mnt).stdout]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            texts.append(resp.read().decode())
        for text in texts:
            families = {f.name: f for f in text_string_to_metric_families(text)}
            hist = families["shortfuse_request_duration_seconds"]
            assert hist.type == "histogram"
            samples = [s for s in hist.samples if s.labels.get("op") == "CREATE" and s.labels["mountpoint"] == str(mnt)]
            count = next(s.value for s in samples if s.name.endswith("_count"))
            assert count == creates, (count, creates)
            buckets = [s for s in samples if s.name.endswith("_bucket")]
            assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == count
            assert all(a.value <= b.value for a, b in zip(buckets, buckets[1:])), "buckets not cumulative"
            requests = families["shortfuse_requests"]
            assert requests.type == "counter"
            assert sum(s.value for s in requests.samples if s.labels.get("transport") == "dev") >= creates
            assert "shortfuse_cache_hits" in families and families["shortfuse_cache_dirty_bytes"].type == "gauge"
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    finally:
        assert sf("umount", mnt).returncode == 0
    # A taken port is refused before anything is mounted.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = sf("mount", "mem", mnt, "-o", f"metrics=127.0.0.1:{s.getsockname()[1]}")
    assert r.returncode != 0 and "metrics=" in r.stderr and not is_mounted(mnt), r.stderr


TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z +[A-Z]+ ")


def test_logs_debug_and_rust_log(scratch):
    """`-o debug` logs each request and its reply, as libfuse's -d does;
    every line has a timestamp; `shortfuse logs` prints the daemon's log;
    RUST_LOG chooses what is logged; -d stays in the foreground and logs to
    stderr."""
    mnt = scratch / "mnt"
    mnt.mkdir()
    assert sf("mount", "mem", mnt, "-o", "debug").returncode == 0
    try:
        (mnt / "f").write_text("x")
        (pid,) = sfmount.pids_of_daemon(shortfuse_bin(), str(mnt))
        os.kill(pid, signal.SIGUSR1)
        assert wait_until(lambda: "statistics (SIGUSR1)" in sf("logs", mnt).stdout, 10)
        log = sf("logs", mnt).stdout
        assert re.search(r"opcode: CREATE \(35\), nodeid: 1, .*\n.*   unique: \d+, success, outsize: \d+", log), log
        assert re.search(r"opcode: LOOKUP .*\n.*   unique: \d+, error: -2 \(No such file or directory\)", log), log
        lines = [l for l in log.splitlines() if l.startswith("20")]
        assert lines and all(TIMESTAMPED.match(l) for l in lines), log
    finally:
        assert sf("umount", mnt).returncode == 0
    # RUST_LOG alone turns the request lines on, without -o debug.
    r = run([shortfuse_bin(), "mount", "mem", str(mnt)], env={**os.environ, "RUST_LOG": "shortfuse=debug"}, timeout=30)
    assert r.returncode == 0, r.stderr
    try:
        (mnt / "g").write_text("y")
        log = sf("logs", mnt).stdout
        assert "opcode: CREATE" in log.split("opcode: INIT")[-1], "RUST_LOG=shortfuse=debug did not log requests"
    finally:
        assert sf("umount", mnt).returncode == 0
    p = subprocess.Popen([str(shortfuse_bin()), "mount", "mem", str(mnt), "-d"], stderr=subprocess.PIPE, text=True)
    try:
        first = p.stderr.readline()
        assert TIMESTAMPED.match(first) and "opcode: INIT" in first, first
        assert is_mounted(mnt)
    finally:
        p.terminate()
        p.wait(timeout=30)
    r = sf("logs", scratch)
    assert r.returncode != 0 and "no log" in r.stderr, r.stderr
