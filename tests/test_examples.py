"""The examples run as a user would run them (`python examples/NAME.py`), bounded in time."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _own_robot(*extra: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "examples" / "own_robot.py"), "--ticks", "30", *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_own_robot_runs_a_two_camera_policy_against_a_local_edge():
    """The default is the shipped mt10p-ar (two 128 px views and a hand state). Where each
    request ran is the scheduler's choice; the line says how many used the edge and why the
    others did not."""
    line = _own_robot()
    assert line.startswith("30 actions at 10 Hz from ") and "edge up:" in line, line
    assert "requests used it; the others:" in line, line


def test_own_robot_on_the_edge_uses_it():
    line = _own_robot("--strategy", "edge-only", "--policy", "mt10p-oft")
    used = int(line.split("edge up: ")[1].split(" requests")[0])
    assert used > 0, line
