"""The shared episode loop hands the environment the policy's actions as they are: bounding
them is the environment's business (MetaWorldEnv clips to its Box), not the loop's."""

import numpy as np
import pytest

from vlarun.runtime.robot.episode import run_loop


class RecordingEnv:
    """An environment in a robot's own units: it records what it is asked to do."""

    def __init__(self, steps: int) -> None:
        self.steps, self.t, self.actions = steps, 0, []

    def reset(self, seed=None):
        self.t = 0
        return {"image": np.zeros((8, 8, 3), np.uint8)}, {}

    def step(self, action):
        self.actions.append(np.array(action))
        self.t += 1
        done = self.t >= self.steps
        return {"image": np.zeros((8, 8, 3), np.uint8)}, 0.0, done, False, {"success": done}


@pytest.mark.parametrize("control_hz", [None, 200.0])
def test_the_loop_does_not_clip_actions(control_hz):
    chunk = np.array([[4.2, -3.0, 0.5, 1.7], [-4.2, 3.0, -0.5, -1.7]], np.float32)
    env = RecordingEnv(steps=2)
    r = run_loop(lambda obs, prior: (chunk, None), env, seed=0, horizon=2, control_hz=control_hz)
    assert r["success"] and r["steps"] == 2
    np.testing.assert_array_equal(np.stack(env.actions), chunk)


def test_metaworld_env_clips_to_its_own_bounds():
    pytest.importorskip("metaworld")
    from vlarun.sim.env import MetaWorldEnv

    far, bounded = MetaWorldEnv("reach-v3", render=False), MetaWorldEnv("reach-v3", render=False)
    far.reset(seed=3)
    bounded.reset(seed=3)
    a, _, _, _, _ = far.step(np.array([5.0, -5.0, 0.0, 4.2], np.float32))
    b, _, _, _, _ = bounded.step(np.array([1.0, -1.0, 0.0, 1.0], np.float32))
    np.testing.assert_array_equal(a["state"], b["state"])
    np.testing.assert_array_equal(far.raw_obs, bounded.raw_obs)


def test_a_wall_clock_budget_ends_the_episode_at_the_next_step():
    """A benchmark's budget (``stop_at``): a policy slower than its chunk stalls every step,
    and the episode still ends on time instead of after ``max_steps`` inferences."""
    import time

    chunk = np.zeros((2, 4), np.float32)

    def slow(obs, prior):
        time.sleep(0.05)  # longer than the chunk's 2 ticks at 200 Hz: a stall each chunk
        return chunk, None

    env = RecordingEnv(steps=10_000)
    t0 = time.perf_counter()
    r = run_loop(
        slow, env, 0, 2, control_hz=200.0, asynchronous=True, max_steps=10_000, stop_at=t0 + 0.3
    )
    took = time.perf_counter() - t0
    assert not r["success"] and 0 < r["steps"] < 200 and took < 0.3 + 0.2
