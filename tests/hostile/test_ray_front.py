"""The scale-out front's cleanup and loopback check, quick (no Ray started): the listener
table read from /proc, what counts as loopback, and the reaper that stops a dead front's
Ray processes and removes its folder (here a stand-in front, SIGKILLed, with one child that
looks like Ray's and one that does not)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vlarun.runtime.scaleout import proctree
from vlarun.runtime.scaleout.proctree import is_loopback

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux /proc")
ROOT = Path(__file__).resolve().parents[2]


def test_listeners_are_read_from_proc_with_their_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        mine = [x for x in proctree.listeners([os.getpid()]) if x.port == port]
    assert len(mine) == 1 and mine[0].host == "127.0.0.1" and mine[0].loopback
    assert mine[0].pid == os.getpid()
    assert not any(x.port == port for x in proctree.listeners([os.getpid()]))  # closed


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.7", False),
        ("::ffff:192.0.2.7", False),
    ],
)
def test_what_counts_as_loopback(host, loopback):
    assert proctree.Listener(1, "x", host, 1).loopback is loopback


def test_is_loopback_for_the_ray_host_flag():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("edge.example") and not is_loopback("")


# A stand-in front: starts a reaper for FOLDER, a child whose command line carries MARK (as
# Ray's processes carry Ray's folder) with a grandchild of its own, and a child without it;
# prints their pids; then waits to be killed.
FRONT = r"""
import subprocess, sys, time
from vlarun.runtime.scaleout.reaper import Reaper
mark, folder = sys.argv[1], sys.argv[2]
reaper = Reaper(folder, mark, poll_s=0.1)
sleeper = "import sys, time; time.sleep(float(sys.argv[1]))"
parent = ("import subprocess, sys, time; "
          "subprocess.Popen([sys.executable, '-c', %r, '60']); time.sleep(60)" % sleeper)
ray_like = subprocess.Popen([sys.executable, "-c", parent, mark])
other = subprocess.Popen([sys.executable, "-c", sleeper, "60"])
time.sleep(1.0)  # the reaper notes them (it looks every 0.1 s)
print(ray_like.pid, other.pid, reaper.proc.pid, flush=True)
time.sleep(60)
"""


def test_a_killed_fronts_ray_processes_and_folder_are_removed(tmp_path):
    mark = f"/fake/ray-{os.getpid()}"
    folder = Path(tempfile.mkdtemp(prefix="vlarun-front-", dir=tmp_path))
    (folder / "worker-1").write_text("")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    front = subprocess.Popen(
        [sys.executable, "-c", FRONT, mark, str(folder)], stdout=subprocess.PIPE, text=True, env=env
    )
    other = None
    try:
        ray_like, other, reaper = map(int, front.stdout.readline().split())
        below = proctree.descendants(front.pid)
        grandchild = set(proctree.descendants(ray_like))
        assert len(grandchild) == 1 and ray_like in below and other in below
        front.send_signal(signal.SIGKILL)
        front.wait(10)
        ray_procs = {p: s for p, s in below.items() if p == ray_like or p in grandchild}
        end = time.monotonic() + 15
        while time.monotonic() < end and (proctree.alive(ray_procs) or folder.exists()):
            time.sleep(0.05)
        assert proctree.alive(ray_procs) == [] and not folder.exists()
        assert proctree.alive({other: below[other]}) == [other]  # not Ray's: left alone
        reaper_proc = {reaper: below[reaper]}
        end = time.monotonic() + 10
        while time.monotonic() < end and proctree.alive(reaper_proc):
            time.sleep(0.05)
        assert proctree.alive(reaper_proc) == []  # the reaper is done too
    finally:
        front.kill()
        front.wait(10)
        front.stdout.close()
        for pid in proctree.alive(proctree.descendants(front.pid)):
            os.kill(pid, signal.SIGKILL)
        if other is not None and proctree.start_time(other) is not None:
            os.kill(other, signal.SIGKILL)
