"""What a scale-out front leaves if it dies without stopping: its local Ray cluster's processes
and its private folder. A small process started beside the front (before Ray) cleans both up
however the front ends, SIGKILL included.

The front holds the write end of the reaper's stdin; the kernel closes it when the front exits
for any reason, and the reaper reads end-of-file. While the front lives the reaper notes, every
second, the front's children that are Ray's (their command line names Ray's package folder)
and everything below them; at end-of-file it looks below those once more (a worker Ray
restarted since), sends SIGTERM, then SIGKILL to any still running after ``grace_s``, and
removes the folder. Processes are matched by pid and start time, so a pid reused meanwhile
is never signalled; nothing else the front started (a test's own subprocesses) is touched.

    python -m vlarun.runtime.scaleout.reaper --pid FRONT --mark RAY_PACKAGE_DIR --dir FOLDER
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from vlarun.runtime.scaleout import proctree


def marked(front: int, mark: str, known: dict[int, int] | None = None) -> dict[int, int]:
    """The front's children whose command line contains ``mark`` and every process below
    them, with ``known`` ones and every process below those: pid -> start time."""
    tree = proctree.children()
    out = dict(known or {})
    me = os.getpid()  # the reaper's own command line names the mark too
    out.update(
        (pid, start)
        for pid, start in tree.get(front, [])
        if pid != me and mark in proctree.cmdline(pid)
    )
    out.update(proctree.descendants(*out, tree=tree))
    return out


def reap(procs: dict[int, int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM ``procs`` still running, SIGKILL those left after ``grace_s``; the pids that
    had to be killed."""
    for pid in proctree.alive(procs):
        _signal(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and proctree.alive(procs):
        time.sleep(0.05)
    stubborn = proctree.alive(procs)
    for pid in stubborn:
        _signal(pid, signal.SIGKILL)
    return stubborn


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):  # gone meanwhile
        os.kill(pid, sig)


def watch(front: int, mark: str, folder: str, poll_s: float = 1.0, grace_s: float = 3.0) -> None:
    """Note the front's Ray processes until stdin closes (or the front is gone); then stop
    them and remove ``folder``."""
    born = proctree.start_time(front)
    known: dict[int, int] = {}
    fd = sys.stdin.fileno()
    while born is not None:
        known = marked(front, mark, known)
        ready, _, _ = select.select([fd], [], [], poll_s)
        if ready and not os.read(fd, 4096):
            break  # end of file: the front is gone (or done with its own orderly stop)
        if proctree.start_time(front) != born:
            break  # gone, and something else holds the pipe open
    known = marked(-1, mark, known)
    reap(known, grace_s)
    shutil.rmtree(folder, ignore_errors=True)


class Reaper:
    """The reaper process for one front; ``close()`` after the front's own orderly stop lets
    it check that nothing is left and exit."""

    def __init__(self, folder: str, mark: str, poll_s: float = 1.0) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vlarun.runtime.scaleout.reaper",
                "--pid",
                str(os.getpid()),
                "--mark",
                mark,
                "--dir",
                folder,
                "--poll-s",
                str(poll_s),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the front does not reach it
            env={**os.environ, "PYTHONPATH": _pythonpath()},
        )

    def close(self, timeout_s: float = 10.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _pythonpath() -> str:
    """This vlarun's folder first, so the reaper runs the same code as the front."""
    here = str(Path(__file__).resolve().parents[2])
    rest = os.environ.get("PYTHONPATH", "")
    return here + (os.pathsep + rest if rest else "")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m vlarun.runtime.scaleout.reaper")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--mark", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--poll-s", type=float, default=1.0)
    a = ap.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    watch(a.pid, a.mark, a.dir, a.poll_s)


if __name__ == "__main__":
    main()
