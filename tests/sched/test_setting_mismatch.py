"""A mismatch only under a setting (issue 47, 4): the robot runs the token-budget settings
1.2x slower than the cost model says, while full compute is as modelled. With one factor per
stage the scheduler learnt it only by missing deadlines (three late requests in the audit's
run, 2026-12-04); a setting's correction is now its own and the warm-up times every setting
once, so it costs at most one late request."""

from __future__ import annotations

import numpy as np
import pytest

from vlarun.models.presets import get_preset
from vlarun.runtime.emulate import Emulation, StandIn
from vlarun.runtime.robot.agent import AgentConfig
from vlarun.runtime.robot.costview import make_scheduler
from vlarun.sched.contract import Outcome, StageOutcome
from vlarun.sched.link import Link
from vlarun.sched.plans import NO_LOSS
from vlarun.sched.settings_table import MEASURED_SETTINGS_FILE

SLOWER = 1.2


def _scheduler(slo_s: float):
    cfg = AgentConfig(
        slo_s,
        "vlarun-joint",
        robot=StandIn.emulating(Emulation("openvla-7b", "orin-agx-32gb")),
        edge=StandIn.emulating(Emulation("openvla-7b", "rtx4090")),
        settings_file=str(MEASURED_SETTINGS_FILE),
        settings_proxy=True,
        accuracy_floor=NO_LOSS,
    )  # a floor the MT10 TRIAGE rows clear: the setting mismatch is what is tested
    return make_scheduler(get_preset("tiny-openvla"), cfg, 12, "float32")


def _truth(sched, plan) -> dict[str, float]:
    """Each stage's real time: the model's, the robot 1.2x slower under any setting."""
    k = sched.setting_index(plan)
    out = {}
    for si, name in enumerate(sched.space.stages):
        if plan.placement[name] == "robot":
            out[name] = sched.t_rob[k, si] * (SLOWER if k != sched.k0 else 1.0)
        else:
            out[name] = sched.t_edge[k, si, 1]
    return out


def _warm(sched) -> None:
    """What the agent's warm-up measures: every stage on the robot at full compute and under
    every setting (RobotAgent._warm_settings), and the edge's stage estimates."""
    names = sched.space.stages
    sched.prime(
        {n: sched.t_rob[sched.k0, i] for i, n in enumerate(names)},
        {n: sched.t_edge[sched.k0, i, 1] for i, n in enumerate(names)},
    )
    for k, setting in enumerate(sched.space.settings):
        if k != sched.k0:
            slow = {n: sched.t_rob[k, i] * SLOWER for i, n in enumerate(names)}
            sched.prime_setting(setting.as_dict(), slow)


def _run(sched, requests: int = 30) -> list[tuple[str, float, float]]:
    link = Link(200.0, 2.0)
    late = []
    for _ in range(requests):
        plan = sched.decide(link)
        truth = _truth(sched, plan)
        off_compute = plan.latency_s - sum(plan.stage_predicted_s.values())
        latency = off_compute + sum(truth.values())
        stages = tuple(StageOutcome(n, plan.placement[n], t) for n, t in truth.items())
        sched.observe(plan, Outcome(stages, latency, energy_j=plan.energy_j))
        if latency > sched.slo_s:
            late.append((str(plan.settings), plan.latency_s, latency))
    return late


@pytest.mark.parametrize("slo_s", [0.95, 1.0, 1.05])
def test_a_mismatch_only_under_a_setting_costs_at_most_one_late_request(slo_s):
    sched = _scheduler(slo_s)
    _warm(sched)
    late = _run(sched)
    assert len(late) <= 1, late


def test_without_the_settings_warm_up_the_slack_still_holds_it_to_one():
    """Warmed at full compute only: a setting never timed on the robot needs its upper bound
    to meet the deadline, and its first run teaches its own factor."""
    sched = _scheduler(1.0)
    names = sched.space.stages
    sched.prime(
        {n: sched.t_rob[sched.k0, i] for i, n in enumerate(names)},
        {n: sched.t_edge[sched.k0, i, 1] for i, n in enumerate(names)},
    )
    late = _run(sched)
    assert len(late) <= 1, late


def test_a_setting_factor_does_not_reprice_full_compute():
    sched = _scheduler(1.0)
    _warm(sched)
    k = next(k for k in range(len(sched.space.settings)) if k != sched.k0)
    name = sched.space.stages[-1]
    assert sched.cal.factor(name, "robot") == pytest.approx(1.0)
    assert sched.cal.factor(name, "robot", k) == pytest.approx(SLOWER)
    assert np.isclose(sched.cal.factor(name, "edge", k), 1.0)


def test_the_old_calibration_misses_the_deadline_repeatedly_in_this_world():
    """The control: one factor per stage and side (each setting's time teaching the stage's
    only factor), no slack for untimed settings and the paper's feasibility (the mean meets
    the deadline: no tail, no miss budget), warmed at full compute as before. It runs the
    robot under a token budget predicted at 0.87-1.0 s and learns only from the misses (the
    audit's three late requests with the EWMA stage factor; one since factors are a windowed
    median, which the first 1.2x ratio moves halfway), so the tests above can fail."""
    sched = _scheduler(1.0)
    sched.cands.key_k = lambda k: None  # every setting shares the identity's factor
    sched.scorer.untimed_setting = lambda: np.zeros(len(sched.k), dtype=bool)
    sched.scorer.on_time_probabilities = lambda sc, deadline_s=None: (
        sc.latency <= (deadline_s or sched.slo_s)
    ).astype(float)
    names = sched.space.stages
    sched.prime(
        {n: sched.t_rob[sched.k0, i] for i, n in enumerate(names)},
        {n: sched.t_edge[sched.k0, i, 1] for i, n in enumerate(names)},
    )
    assert len(_run(sched)) >= 1
