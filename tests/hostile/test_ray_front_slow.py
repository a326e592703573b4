"""`serve-edge --workers 1` as its own process (marked slow: it starts a local Ray cluster,
~15 s each on a 2-core machine). Every TCP socket the front and its cluster listen on is on
loopback; after SIGTERM, SIGINT or SIGKILL of the front nothing of it is left: no process it
started, no /tmp/vlarun-front-* folder. TMPDIR points at a folder of the test's own, so the
check sees this front's folder and Ray session only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vlarun.runtime.robot.client import ping
from vlarun.runtime.scaleout import proctree
from vlarun.runtime.transport import Security

pytest.importorskip("ray")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux /proc"),
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def front():
    """A `vlarun serve-edge --workers 1` process on loopback: (process, endpoint, its
    processes (pid -> start time), its TMPDIR)."""
    tmp = tempfile.mkdtemp(prefix="vh-", dir="/tmp")  # short: Ray's socket paths live below
    env = dict(os.environ, TMPDIR=tmp, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "vlarun.cli",
        "serve-edge",
        "--workers",
        "1",
        "--insecure",
        "--port",
        "0",
        "--threads",
        "1",
        "--json",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    below: dict[int, int] = {}
    try:
        line = proc.stdout.readline()
        assert line.startswith("{"), proc.stderr.read()[-2000:] if proc.poll() is not None else ""
        below = proctree.descendants(proc.pid)
        yield proc, json.loads(line)["endpoint"], below, Path(tmp)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)
        for pid in proctree.alive(below | proctree.descendants(proc.pid)):
            os.kill(pid, signal.SIGKILL)  # only if the test failed: it asserts none is left
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_the_fronts_cluster_listens_on_loopback_and_stops_with_it(front, sig):
    proc, endpoint, below, tmp = front
    r = ping(endpoint, Security(insecure=True), count=2, timeout_s=10.0)
    assert r["health"]["capacity"] == 1
    socks = proctree.listeners([proc.pid, *below])
    names = {x.name for x in socks}
    assert {"gcs_server", "raylet"} <= names, socks  # Ray's own services are seen ...
    assert [str(x) for x in socks if not x.loopback] == []  # ... and none beyond loopback
    assert [p.name for p in tmp.glob("vlarun-front-*")] != []

    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    if sig != signal.SIGKILL:  # an orderly stop
        assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    end = time.monotonic() + 30
    while time.monotonic() < end and (proctree.alive(below) or list(tmp.glob("vlarun-front-*"))):
        time.sleep(0.1)
    left = {pid: proctree.cmdline(pid)[:60] for pid in proctree.alive(below)}
    assert left == {}, left
    assert list(tmp.glob("vlarun-front-*")) == []
    print(f"{signal.Signals(sig).name}: all gone {time.monotonic() - t0:.1f} s after the signal")
