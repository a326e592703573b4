"""The servers a newcomer starts: a busy port fails in one line naming it, and a running server
stops on SIGTERM / SIGINT at once (issue 45, 1: serve-policy printed nothing, ignored SIGTERM
and needed SIGKILL; serve-edge exited with a ZeroMQ traceback)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

VLARUN = [sys.executable, "-m", "vlarun"]


@pytest.fixture
def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "key"
    path.write_text("a-test-api-key-of-enough-length\n")
    path.chmod(0o600)
    return path


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*VLARUN, *argv], capture_output=True, text=True, timeout=300, env=env)


def test_serve_policy_on_a_busy_port_fails_in_one_line(busy_port, key_file):
    r = _run(
        [
            "serve-policy",
            "--protocol",
            "openpi",
            "--policy",
            "tiny-ar",
            "--port",
            str(busy_port),
            "--api-key-file",
            str(key_file),
        ]
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f":{busy_port}" in lines[0] and "in use" in lines[0], r.stderr


def test_serve_edge_on_a_busy_port_fails_in_one_line(busy_port):
    r = _run(["serve-edge", "--policy", "tiny-ar", "--port", str(busy_port), "--insecure"])
    assert r.returncode == 2, r.stderr
    errors = [x for x in r.stderr.strip().splitlines() if not x.startswith("WARNING")]
    assert len(errors) == 1 and f":{busy_port}" in errors[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_policy_stops_on_a_signal_once_serving(key_file, sig):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            *VLARUN,
            "serve-policy",
            "--protocol",
            "openpi",
            "--policy",
            "tiny-ar",
            "--port",
            "0",
            "--api-key-file",
            str(key_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()  # the event: the server says it is serving
        assert line.startswith("serving"), (line, proc.stderr.read() if proc.poll() else "")
        t0 = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=30)  # generous for a loaded CI machine; the time is checked below
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()
    assert took < 5.0, f"took {took:.1f} s to stop"
