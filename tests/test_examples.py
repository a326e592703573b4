"""The examples run as a user would run them (`python examples/NAME.py`), bounded in time."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_own_robot_runs_against_a_local_edge():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "examples" / "own_robot.py"), "--ticks", "30"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    # Where each request ran is the scheduler's choice (on one machine the edge may not pay);
    # that the edge was there to choose is the example's point.
    assert line.startswith("30 actions at 10 Hz from ") and "edge up:" in line, line
