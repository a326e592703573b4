"""Real-time chunking's delay d from the executed plan: ceil of the predicted latency (plus a
p95 margin) over the control period, clipped to the overlap, recomputed per request."""

import math
from statistics import NormalDist

import pytest

from vlarun.accel.rtc import P95_Z, frozen_steps, guidance_weights
from vlarun.sched.contract import ExecutionPlan

PERIOD = 0.05  # a 50 ms control period (20 Hz)
H, S = 16, 4  # overlap H - s = 12 steps


def _plan(where: str, latency_s: float) -> ExecutionPlan:
    placement = {"vision": where, "prefill": where, "head": where}
    return ExecutionPlan(
        placement=placement,
        settings={},
        relative_success=None,
        latency_s=latency_s,
        residual_s=0.0,
        energy_j=1.0,
        actions_per_joule=1.0,
        feasible=True,
        slo_s=1.0,
        stage_start={},
        stage_end={},
    )


def test_d_follows_a_plan_change_within_one_request():
    # The scheduler replans for the same request (the link drops, the robot goes local): the
    # edge plan predicts 120 ms, the robot plan 400 ms; d is taken from whichever is executed.
    plans = [_plan("edge", 0.120), _plan("robot", 0.400), _plan("edge", 0.120)]
    ds = [frozen_steps(p.latency_s, PERIOD, H, S) for p in plans]
    assert ds == [3, 8, 3]  # ceil(2.4) and ceil(8.0): the robot plan freezes 5 more steps
    # Each d is a valid schedule for the same chunk, and the frozen prefix grows with it.
    assert [int(guidance_weights(H, d, S).eq(1).sum()) for d in ds] == [3, 8, 3]


def test_the_spread_adds_a_p95_margin():
    # 120 ms + 1.645 * 20 ms = 152.9 ms -> 3.058 periods -> 4 steps (3 without the margin).
    assert frozen_steps(0.120, PERIOD, H, S) == 3
    assert frozen_steps(0.120, PERIOD, H, S, sigma_s=0.020) == 4
    assert abs(P95_Z - NormalDist().inv_cdf(0.95)) < 1e-3  # the one-sided 95% quantile
    # A different tail: z = 0 ignores the spread.
    assert frozen_steps(0.120, PERIOD, H, S, sigma_s=0.020, tail_z=0.0) == 3


@pytest.mark.parametrize(
    "latency,d",
    [(0.0, 0), (0.001, 1), (0.05, 1), (0.0500001, 2), (0.15, 3), (0.6, 12), (0.61, 12), (5.0, 12)],
)
def test_ceil_on_step_boundaries_and_the_clip_to_the_overlap(latency, d):
    assert frozen_steps(latency, PERIOD, H, S) == d


def test_no_room_to_freeze_when_the_chunk_executes_whole():
    assert frozen_steps(0.4, PERIOD, 8, 8) == 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"period_s": 0.0}, "period_s"),
        ({"period_s": -0.05}, "period_s"),
        ({"latency_s": -0.1}, ">= 0"),
        ({"sigma_s": -0.01}, ">= 0"),
        ({"latency_s": math.nan}, "finite"),
        ({"latency_s": math.inf}, "finite"),
        ({"horizon": 0}, "horizon"),
        ({"execution_horizon": 0}, "execution horizon"),
        ({"execution_horizon": 17}, "execution horizon"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(kwargs, match):
    args = {"latency_s": 0.1, "period_s": PERIOD, "horizon": H, "execution_horizon": S} | kwargs
    with pytest.raises(ValueError, match=match):
        frozen_steps(**args)
