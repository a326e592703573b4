"""The own-robot API: one action per control tick from the chunk queue, each inference planned
by the robot agent; the edge is used while it answers and given up on when it stops."""

import time

import numpy as np
import pytest

from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.robot.control import Robot
from vlarun.runtime.transport import Security

INSTRUCTION = "open the drawer"  # as conftest.py (not importable: several conftests)


def _frame(policy, t: int) -> np.ndarray:
    size = policy.model.cfg.image_size
    frame = np.full((size, size, 3), 40, np.uint8)
    frame[8:24, 4 * t % (size - 16) :][:, :16] = 230
    return frame


def _ticks(robot: Robot, policy, n: int, instruction: str = INSTRUCTION) -> list[np.ndarray]:
    out = []
    for t in range(n):
        out.append(robot.act(_frame(policy, t), instruction))
        time.sleep(robot.tick_s)
    return out


def test_actions_come_from_the_edge_then_locally_once_it_is_gone(policy):
    horizon = policy.model.cfg.horizon
    server = EdgeServer(policy, Security(insecure=True), ServerConfig()).start()
    stopped = False
    robot = Robot(
        policy, server.address, control_hz=40, slo_s=2.0, strategy="edge-only", insecure=True
    )
    try:
        end = time.monotonic() + 10
        while not robot.edge_up and time.monotonic() < end:
            time.sleep(0.05)
        robot.warmup(_frame(policy, 0), INSTRUCTION)
        actions = _ticks(robot, policy, 3 * horizon)
        assert all(a.shape == (policy.action_size,) and np.isfinite(a).all() for a in actions)
        assert robot.inferences and all(i.fallback is None for i in robot.inferences)
        assert all(set(i.ran.values()) == {"edge"} for i in robot.inferences)
        server.stop()
        stopped = True
        before = len(robot.inferences)
        actions = _ticks(robot, policy, 4 * horizon)  # the robot keeps acting
        assert len(actions) == 4 * horizon
        later = robot.inferences[before:]
        assert later and set(later[-1].ran.values()) == {"robot"}
        # Told by a request that failed (a fallback) or by the link monitor first (the plan
        # made with the edge down is robot-only, though the strategy is edge-only): which one
        # comes first is a race a busy machine can decide either way.
        assert any(i.fallback or set(i.planned.values()) == {"robot"} for i in later)
        assert robot.summary()["inferences"] == len(robot.inferences)
    finally:
        robot.close()
        if not stopped:
            server.stop()


def test_without_an_edge_everything_runs_here_and_a_new_instruction_is_a_new_episode(policy):
    with Robot(policy, control_hz=50, setting="full") as robot:
        _ticks(robot, policy, 2)
        stream = robot.agent.stream
        _ticks(robot, policy, 2, "close the drawer")
        assert robot.agent.stream != stream  # a new episode: a new stream of hook state
        assert all(set(i.ran.values()) == {"robot"} for i in robot.inferences)
        assert robot.summary()["fallbacks"] == 0
    with pytest.raises(ValueError, match="control_hz"):
        Robot(policy, control_hz=0)
