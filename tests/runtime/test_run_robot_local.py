"""`vlarun run-robot --edge local`: the command starts its own edge process on loopback, the
robot's plans use it, and the process is gone when the command returns. The edge speaks
CurveZMQ with keys made for the run: another local process (plain TCP, or a key of its own)
gets no answer."""

from __future__ import annotations

import os

import pytest
import zmq

from vlarun.apps.runtime import RunRobotOptions, cmd_run_robot
from vlarun.cli import build_parser, parse_into


@pytest.fixture(autouse=True)
def _headless(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))


def test_a_local_edge_serves_the_run_and_stops_with_it(monkeypatch):
    from vlarun.runtime.robot.client import LinkDown, ping
    from vlarun.runtime.testbed import procs
    from vlarun.runtime.transport import KeyPair, Security, load_keys

    started, strangers = [], []
    spawn = procs.start_edge

    def record(*args, **kwargs):
        started.append(spawn(*args, **kwargs))
        endpoint, keys = started[-1][1], kwargs["keys"]
        edge_public = load_keys(f"{keys}/edge.key").public
        stranger = KeyPair(*zmq.curve_keypair())  # a key the edge was not given
        for sec in (Security(insecure=True), Security(own=stranger, server_public=edge_public)):
            try:  # the edge answers neither: the ping times out
                ping(endpoint, sec, count=1, timeout_s=1.0)
                strangers.append("answered")
            except LinkDown:
                strangers.append("refused")
        return started[-1]

    monkeypatch.setattr(procs, "start_edge", record)
    argv = [
        "--edge",
        "local",
        "--task",
        "reach-v3",
        "--episodes",
        "1",
        "--max-steps",
        "12",
        "--strategy",
        "edge-only",
        # Room for a busy machine: at 200 ms, beside two CPU burners, every answer came late
        # and ran here; what this checks is that the run's own edge serves it, not how fast.
        "--slo-ms",
        "2000",
    ]
    o = parse_into(RunRobotOptions, build_parser("run-robot", RunRobotOptions).parse_args(argv))
    out = cmd_run_robot(o)
    infs = [r for e in out["episodes"] for r in e["inferences"]]
    assert infs and any("@edge" in r["ran"] for r in infs)  # the local edge answered
    ((proc, endpoint),) = started
    assert endpoint.startswith("tcp://127.0.0.1:")  # loopback only
    assert strangers == ["refused", "refused"]  # keyed: only the run's own robot is served
    assert proc.poll() is not None  # stopped when the command returned
