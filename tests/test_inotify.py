"""inotify on mounts, compared event for event with a real directory:
`inotifywait -m` watching a directory of the mount while the program that
runs it and another program (another `shortfuse run`, another ring client
of a daemon) create, write, chmod, rename and delete there. On a mount with
a source directory the watch is the source's; on a `serve mem` daemon the
daemon replays each change on a kernel mirror of the watched directory.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from test_run import output, run, scratch, shortfuse  # noqa: F401 (fixtures)
from test_run_hazards import mount  # noqa: F401 (fixture)

EVENTS = "create,modify,attrib,moved_from,moved_to,delete,delete_self"

# $1: the directory holding the watched one; $2: where the events go; $3:
# a directory (outside any mount) for handshakes with the test.
WATCHER = r"""
d="$1/w"
mkdir "$d" && echo pre > "$d/old" && echo keep > "$d/kept" && mkdir "$d/gone"
inotifywait -m -e EVENTS --format '%w|%e|%f' "$d" $SELF > "$2" 2> "$3/err" &
w=$!
until grep -q established "$3/err"; do sleep 0.05; done
echo a > "$d/f"
chmod 600 "$d/f"
mv "$d/f" "$d/g"
echo more >> "$d/old"
touch "$d/kept"
mkdir "$d/sub"
rmdir "$d/sub"
rm "$d/g"
mv "$d/old" "$1/moved-out"
rmdir "$d/gone"
: > "$3/mine-done"
until [ -e "$3/other-done" ]; do sleep 0.05; done
mv "$1/moved-out" "$d/back"
mkdir "$d/zz-end"
until grep -q zz-end "$2"; do sleep 0.05; done
kill $w
""".replace("EVENTS", EVENTS)

# Another program's changes in the watched directory ($1/w).
OTHER = r"""
d="$1/w"
echo b > "$d/o"
chmod 640 "$d/o"
mv "$d/o" "$d/p"
echo c >> "$d/kept"
rm "$d/p"
mkdir "$d/od"
rmdir "$d/od"
"""


def wait_for(path: Path, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the watcher stopped early: {log.read_text() if log.exists() else ''}", pytrace=False)
        time.sleep(0.05)


def watch(scratch: Path, name: str, watcher_prefix: list[str], other_prefix: list[str], root: Path, gone: bool) -> str:
    """Runs the watcher and the other program on directory root: the
    events inotifywait printed, with root spelled ROOT."""
    sync = scratch / f"sync-{name}"
    sync.mkdir()
    events = scratch / f"events-{name}"
    (scratch / "watcher.sh").write_text(WATCHER)
    (scratch / "other.sh").write_text(OTHER)
    w = subprocess.Popen(
        [*watcher_prefix, "sh", str(scratch / "watcher.sh"), str(root), str(events), str(sync)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SELF": f"{root}/w/gone" if gone else ""},
    )
    try:
        wait_for(sync / "mine-done", w, sync / "err")
        o = run([*other_prefix, "sh", str(scratch / "other.sh"), str(root)])
        assert o.returncode == 0, output(o, str(root))
        (sync / "other-done").touch()
        out, _ = w.communicate(timeout=60)
    finally:
        if w.poll() is None:
            w.kill()
    assert w.returncode == 0, out.decode(errors="replace")
    return events.read_text().replace(str(root), "ROOT")


@pytest.mark.parametrize("mount", ["passthrough", "serve-passthrough", "serve-mem"], indirect=True)
def test_inotifywait_sees_the_events_of_a_real_directory(shortfuse, scratch, mount, request):
    spec, mp, _ = mount
    # The removal of a watched directory (IN_DELETE_SELF, IN_IGNORED) is
    # checked on mem: passthrough holds a descriptor of each directory it
    # served until the program forgets it, and the kernel says
    # IN_DELETE_SELF only when the last one goes.
    gone = request.node.callspec.params["mount"] == "serve-mem"
    native = scratch / "native"
    native.mkdir()
    n = watch(scratch, "native", [], [], native, gone)
    assert n.splitlines()[:3] == ["ROOT/w/|CREATE|f", "ROOT/w/|MODIFY|f", "ROOT/w/|ATTRIB|f"], n
    assert ("ROOT/w/gone/|DELETE_SELF|" in n) == gone
    sf = [str(shortfuse), "run", "-m", spec, "--"]
    s = watch(scratch, "shim", sf, sf, mp, gone)
    assert s.splitlines() == n.splitlines()
