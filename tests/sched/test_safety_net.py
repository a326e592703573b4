"""The safety net: the rule leaves the best fixed strategy (device-only, edge-only, split after
vision, at the identity setting) only on a predicted gain beyond the measured prediction
error, and holds to it after a window of deviations that realised less."""

import pytest

from tests.sched.test_scheduler import DEVICES, space_for
from vlarun.sched.contract import Outcome
from vlarun.sched.link import Link
from vlarun.sched.scheduler import Scheduler

LINK = Link(200.0, 5.0)


def _deviating():
    """cogact at a 1 s deadline: the rule's best plan (an accelerated setting on the robot)
    beats the best fixed strategy by ~20% predicted actions/J."""
    sched = Scheduler(space_for("cogact"), DEVICES, slo_s=1.0, actions=20)
    sched.net.error = 0.0
    d = sched.decide(LINK)
    assert not d.held_to_fixed and d.fixed_actions_per_joule is not None
    gain = d.actions_per_joule / d.fixed_actions_per_joule - 1
    assert gain > 0.05
    return sched, d, gain


def _is_fixed(sched, d) -> bool:
    return bool(sched.fixed[sched.candidate_index(d)])


def test_a_gain_within_the_prediction_error_keeps_the_best_fixed_strategy():
    sched, d, gain = _deviating()
    assert not _is_fixed(sched, d)
    sched.net.error = gain + 0.02
    held = sched.decide(LINK)
    assert held.held_to_fixed and _is_fixed(sched, held)
    assert held.actions_per_joule == pytest.approx(d.fixed_actions_per_joule)
    sched.net.error = gain - 0.02
    again = sched.decide(LINK)
    assert not again.held_to_fixed and again.placement == d.placement


def test_the_error_is_learned_from_requests_that_ran_as_planned():
    sched, d, _ = _deviating()
    sched.net.error = 0.0
    for _ in range(20):  # realised energy 50% above the prediction, every time
        sched.observe(d, Outcome((), d.latency_s, None, 1.5 * d.energy_j))
    assert sched.net.error == pytest.approx(1 / 3, rel=0.05)  # |1 - 1.5| / 1.5
    sched.observe(d, Outcome((), d.latency_s, "link timeout", 10 * d.energy_j))
    assert sched.net.error == pytest.approx(1 / 3, rel=0.05)  # a fallback teaches no error


def test_a_window_that_realised_less_than_the_fixed_strategy_holds_to_it():
    sched, d, _ = _deviating()
    size = sched.net.size
    worse_j = 1.2 * sched.actions / d.fixed_actions_per_joule  # realised below the fixed plan
    for _ in range(size):
        plan = sched.decide(LINK)
        assert not plan.held_to_fixed
        sched.net.error = 0.0  # keep the gain rule out of it: only the window decides here
        sched.observe(plan, Outcome((), plan.latency_s, "edge refused", worse_j))
    held = [sched.decide(LINK) for _ in range(size)]
    assert all(p.held_to_fixed and _is_fixed(sched, p) for p in held)
    assert not sched.decide(LINK).held_to_fixed  # the hold lasts one window


def test_a_window_that_realised_more_keeps_deviating():
    sched, d, _ = _deviating()
    for _ in range(2 * sched.net.size):
        plan = sched.decide(LINK)
        assert not plan.held_to_fixed
        sched.observe(plan, Outcome((), plan.latency_s, "edge refused", plan.energy_j))
