"""Fixtures shared by the mounted test suites.

Every test that takes `mnt` runs once per configuration (file system x
transport, see sfmount.configs_from_env), each time on a fresh mount. Run as
root: `python3 -m pytest tests/` after `cargo build`.

Environment:
  SHORTFUSE_BIN         the binary (default target/debug/shortfuse)
  SHORTFUSE_FS          configurations, comma-separated, from sfmount.FILE_SYSTEMS:
                        mem, passthrough, passthrough+kp, stripe, pack, dist, sftp (default
                        mem,passthrough; `bindfs` adds Debian's bindfs as a peer);
                        NAME@TRANSPORT runs one on that transport only (sftp@dev)
  SHORTFUSE_TRANSPORTS  transports, comma-separated (default dev)
  SHORTFUSE_TEST_DEADLINE  default per-test deadline in seconds (default 180; a configuration
                        may declare a longer one, sfmount.FsSpec.deadline)
  SHORTFUSE_TEST_GRACE  seconds past its deadline after which a test still stuck has the FUSE
                        connections it made aborted (default 30)
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sfmount  # noqa: E402
import sshd  # noqa: E402

DEFAULT_DEADLINE = float(os.environ.get("SHORTFUSE_TEST_DEADLINE", "180"))
GRACE = float(os.environ.get("SHORTFUSE_TEST_GRACE", "30"))


def pytest_configure(config):
    config.addinivalue_line("markers", "deadline(seconds): fail the test if it runs longer than this")
    config.addinivalue_line("markers", "fs(*names): run only on these configurations (names in sfmount.FILE_SYSTEMS)")
    config.addinivalue_line("markers", "shortfuse_only: needs the shortfuse CLI (not a peer like bindfs)")
    if os.geteuid() != 0:
        raise pytest.UsageError("the mounted test suite runs as root (it mounts file systems)")
    # Both sides of every comparison run in this process; a fixed umask keeps modes predictable.
    os.umask(0o022)


def _wanted(item_or_fn, cfg: sfmount.Config) -> bool:
    suites = cfg.spec.suites
    if suites and Path(str(item_or_fn.fspath)).name not in suites:
        return False
    fs_marker = item_or_fn.get_closest_marker("fs")
    if fs_marker and cfg.name not in fs_marker.args:
        return False
    if item_or_fn.get_closest_marker("shortfuse_only") and not cfg.is_shortfuse:
        return False
    return True


def pytest_generate_tests(metafunc):
    if "config" in metafunc.fixturenames:
        cfgs = [c for c in sfmount.configs_from_env() if _wanted(metafunc.definition, c)]
        metafunc.parametrize("config", cfgs, ids=[c.id for c in cfgs], scope="function")


def pytest_collection_modifyitems(config, items):
    # A test restricted (fs marker, shortfuse_only) to configurations that are
    # not selected gets an empty parameter set, which pytest reports as a
    # skip. It was not skipped on a configuration it should run on: report
    # it as deselected instead, so that every skip in a run means something.
    dropped = [
        i for i in items if any(str(m.kwargs.get("reason", "")).startswith("got empty parameter set") for m in i.iter_markers("skip"))
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


_CONFIGS_RUN: set[str] = set()


def pytest_runtest_setup(item):
    cs = getattr(item, "callspec", None)
    if cs is not None and isinstance(cs.params.get("config"), sfmount.Config):
        _CONFIGS_RUN.add(cs.params["config"].id)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # A plain `pytest tests/` mounts only the default configurations on
    # /dev/fuse: say which ran and which were left out, so that a green run
    # is not read as covering what it never mounted.
    known = [f"{name}-{t}" for name in sfmount.FILE_SYSTEMS for t in sfmount.TRANSPORTS]
    ran = [c for c in known if c in _CONFIGS_RUN] + sorted(_CONFIGS_RUN - set(known))
    left = [c for c in known if c not in _CONFIGS_RUN]
    terminalreporter.write_sep("-", "shortfuse configurations")
    terminalreporter.write_line(f"ran: {', '.join(ran) or 'none'}")
    terminalreporter.write_line(
        f"not run (widen with SHORTFUSE_FS=NAME[@TRANSPORT],... SHORTFUSE_TRANSPORTS=dev,uring): {', '.join(left) or 'none'}"
    )


def _deadline(item) -> float:
    m = item.get_closest_marker("deadline")
    limit = float(m.args[0]) if m else DEFAULT_DEADLINE
    cs = getattr(item, "callspec", None)
    cfg = cs.params.get("config") if cs is not None else None
    if isinstance(cfg, sfmount.Config):
        limit = max(limit, cfg.spec.deadline)
    return limit


class DeadlineExceeded(Exception):
    pass


FUSECTL = Path("/sys/fs/fuse/connections")


def _fuse_connections() -> set[str]:
    """The kernel's FUSE connections, by the fusectl file system (mounted if absent)."""
    if not os.path.ismount(FUSECTL):
        subprocess.run(["mount", "-t", "fusectl", "none", str(FUSECTL)], capture_output=True)
    try:
        return set(os.listdir(FUSECTL))
    except OSError:
        return set()


def _abort_new_connections(item, before: set[str], limit: float) -> None:
    # A test wedged in a FUSE wait cannot take SIGALRM (the kernel waits
    # killably, not interruptibly, once a request is sent). Aborting the
    # connections the test made fails those waits with ENOTCONN, so this test
    # fails with its traceback and the run goes on to the next one.
    sys.stderr.write(f"\n{item.nodeid}: still running {limit:.0f}s after its deadline; stacks:\n")
    faulthandler.dump_traceback(all_threads=True)
    for conn in sorted(_fuse_connections() - before):
        try:
            (FUSECTL / conn / "abort").write_text("1")
            sys.stderr.write(f"{item.nodeid}: aborted FUSE connection {conn}\n")
        except OSError as e:
            sys.stderr.write(f"{item.nodeid}: could not abort FUSE connection {conn}: {e}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Setup and teardown are covered too (they mount and unmount).
    limit = _deadline(item)
    grace = GRACE
    watchdog = threading.Timer(limit + grace, _abort_new_connections, (item, _fuse_connections(), limit + grace))
    watchdog.daemon = True
    watchdog.start()
    # Hard stop: if even that does not free the test, dump every thread's
    # stack and exit rather than hang CI.
    faulthandler.dump_traceback_later(limit + 120, exit=True)
    try:
        yield
    finally:
        watchdog.cancel()
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # Soft stop: SIGALRM turns a slow test into a failure with a traceback.
    limit = _deadline(item)

    def on_alarm(signum, frame):
        raise DeadlineExceeded(f"test exceeded its deadline of {limit:.0f}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _harness(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except sfmount.HarnessError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def mount_factory():
    """Mounts configurations on demand; unmounts whatever is left at the end
    and fails the test if a plain unmount did not work or a daemon outlived
    its mount."""
    made: list[sfmount.Mount] = []

    def make(config: sfmount.Config, options=None, layout="flat") -> sfmount.Mount:
        m = _harness(sfmount.make_mount, config, options, layout)
        made.append(m)
        return m

    yield make
    problems = []
    for m in made:
        was_mounted = sfmount.is_mounted(m.path)
        m.unmount()
        if was_mounted and m.warnings:
            problems.append(f"{m.path}: " + "; ".join(m.warnings))
        if left := m.wait_daemon_exit(10):
            problems.append(f"{m.path}: daemon pids {left} still alive 10s after unmount")
            m.kill_daemons()
        sfmount.remove_scratch(m.base)
    if problems:
        pytest.fail("teardown: " + "\n".join(problems), pytrace=False)


@pytest.fixture
def mnt(config, mount_factory) -> sfmount.Mount:
    """A fresh mount of `config` (default options)."""
    return mount_factory(config)


@pytest.fixture
def native_dir():
    """A fresh directory on the native file system (ext4 /tmp) for the reference run."""
    d = sfmount.new_scratch("native")
    d.chmod(0o755)  # like a freshly made source or mount root, not mkdtemp's 0700
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_mounts():
    before = set(sfmount.leaked_mounts())
    try:
        yield
        leaked = [p for p in sfmount.leaked_mounts() if p not in before]
        for p in leaked:
            sfmount.run(["umount", "-l", p], timeout=30)
    finally:
        # distfs servers the harness started (sfmount.dist_server), after their clients.
        sfmount.stop_dist_servers()
        # The loopback sshd of the sftp configurations (sfmount.sshd_server).
        sshd.stop()
    assert not leaked, f"mounts left behind after the session (now lazily unmounted): {leaked}"
