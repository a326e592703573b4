"""The fleet's robots as processes (bench.fleet_robots): a robot that cannot start is named and
nothing is left running; bad arguments are refused before anything loads."""

from __future__ import annotations

import pytest

from vlarun.bench import fleet_robots
from vlarun.bench.fleet_robots import RobotFleet
from vlarun.runtime.agent import AgentConfig


def test_a_robot_that_cannot_start_is_named_and_none_is_left_running():
    fleet = RobotFleet("no-such-policy", AgentConfig(0.5), "tcp://127.0.0.1:9", 2, 1)
    with pytest.raises(RuntimeError, match=r"fleet robot \d of 2 did not start"):
        fleet.__enter__()
    assert fleet.procs == [] and fleet._dir is None


def test_a_fleet_needs_a_robot_and_a_request():
    with pytest.raises(ValueError, match="1 robot"):
        RobotFleet("tiny-ar", AgentConfig(0.5), "tcp://127.0.0.1:9", 0, 1)


@pytest.mark.parametrize("bad", [["--index", "2"], ["--requests", "0"], ["--period-s", "0"]])
def test_robot_arguments_are_checked_before_anything_loads(bad, capsys):
    args = {"--policy": "tiny-ar", "--config": "{}", "--edge": "tcp://127.0.0.1:9",
            "--index": "0", "--robots": "2", "--requests": "1", "--period-s": "0.5",
            "--rows": "/nonexistent/rows.jsonl"}  # fmt: skip
    args.update(dict(zip(bad[::2], bad[1::2], strict=True)))
    with pytest.raises(SystemExit):
        fleet_robots.main([x for kv in args.items() for x in kv])
    assert "--index" in capsys.readouterr().err
