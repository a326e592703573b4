"""The fleet's robots as processes (bench.fleet_robots): a robot that cannot start is named and
nothing is left running; bad arguments are refused before anything loads."""

from __future__ import annotations

import pytest

from vlarun.bench import fleet_robots
from vlarun.bench.fleet_robots import RobotFleet
from vlarun.runtime.emulate import merge_reports
from vlarun.runtime.robot.agent import AgentConfig


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
    args = {
        "--policy": "tiny-ar",
        "--config": "{}",
        "--edge": "tcp://127.0.0.1:9",
        "--index": "0",
        "--robots": "2",
        "--requests": "1",
        "--period-s": "0.5",
        "--rows": "/nonexistent/rows.jsonl",
    }
    args.update(dict(zip(bad[::2], bad[1::2], strict=True)))
    with pytest.raises(SystemExit):
        fleet_robots.main([x for kv in args.items() for x in kv])
    assert "--index" in capsys.readouterr().err


def test_emulator_reports_are_merged_stage_by_stage():
    def stage(n, v, worst):
        return {"executions": n, "violations": v, "worst_overrun_ms": worst}

    a = {
        "executions": 3,
        "emulation_violations": 1,
        "worst_overrun_ms": 5.0,
        "by_stage": {"vision": stage(3, 1, 5.0)},
    }
    b = {
        "executions": 2,
        "emulation_violations": 0,
        "worst_overrun_ms": 0.0,
        "by_stage": {"vision": stage(1, 0, 0.0), "decode": stage(1, 0, 0.0)},
    }
    m = merge_reports([a, b])
    assert (m["executions"], m["emulation_violations"], m["worst_overrun_ms"]) == (5, 1, 5.0)
    assert m["by_stage"]["vision"] == {"executions": 4, "violations": 1, "worst_overrun_ms": 5.0}
    assert m["by_stage"]["decode"]["executions"] == 1


def test_two_robot_processes_run_their_requests_against_one_edge():
    """The fleet's path end to end, small: two robots, each a process (policy loaded, warmed,
    started on one clock), two requests each against an edge in this process; every row comes
    back, and each robot's own peak RSS (this process is made 1 GiB larger first: a robot's
    ``ru_maxrss``, which Linux carries across exec from the parent, reported this process's)."""
    import numpy as np

    from vlarun.policy import Policy
    from vlarun.runtime.edge.server import EdgeServer, ServerConfig
    from vlarun.runtime.testbed.procs import status_kb
    from vlarun.runtime.transport import Security

    ballast = np.ones(1 << 27)  # 1 GiB, written: resident
    own_peak_mb = status_kb("self", "VmHWM") / 1024
    with EdgeServer(Policy.load("tiny-ar"), Security(insecure=True), ServerConfig()) as edge:
        cfg = AgentConfig(0.5, "vlarun")
        with RobotFleet("tiny-ar", cfg, edge.address, robots=2, requests=2, period_s=0.3) as f:
            del ballast
            assert len(f.procs) == 2
            rows = f.run()
    assert len(rows) == 4 and all(r["latency_ms"] > 0 and r["ran"] for r in rows)
    assert 50 < f.peak_rss_mb < own_peak_mb - 512, (f.peak_rss_mb, own_peak_mb)
    assert f.emulation is None and f.procs == []
