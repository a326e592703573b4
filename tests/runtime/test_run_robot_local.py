"""`vlarun run-robot --edge local`: the command starts its own edge process on loopback, the
robot's plans use it, and the process is gone when the command returns."""

from __future__ import annotations

import os

import pytest

from vlarun.apps.runtime import RunRobotOptions, cmd_run_robot
from vlarun.cli import build_parser, parse_into


@pytest.fixture(autouse=True)
def _headless(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))


def test_a_local_edge_serves_the_run_and_stops_with_it(monkeypatch):
    from vlarun.runtime import procs

    started = []
    spawn = procs.start_edge

    def record(*args, **kwargs):
        started.append(spawn(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(procs, "start_edge", record)
    argv = ["--edge", "local", "--task", "reach-v3", "--episodes", "1", "--max-steps", "12",
            "--strategy", "edge-only"]  # fmt: skip
    o = parse_into(RunRobotOptions, build_parser("run-robot", RunRobotOptions).parse_args(argv))
    out = cmd_run_robot(o)
    infs = [r for e in out["episodes"] for r in e["inferences"]]
    assert infs and any("@edge" in r["ran"] for r in infs)  # the local edge answered
    ((proc, endpoint),) = started
    assert endpoint.startswith("tcp://127.0.0.1:")  # loopback only (it is plain TCP)
    assert proc.poll() is not None  # stopped when the command returned
