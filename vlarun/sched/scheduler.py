"""SLO-constrained energy-priority scheduler (EcoVLA), held to an on-time target.

    Core rule:  pi* = argmax_pi  actions_per_joule(pi)   subject to  P(T(pi) > T_SLO) <= a_t
                if no plan fits:  pi* = argmax_pi P(T(pi) <= T_SLO)  (ties: actions per joule)

EcoVLA's rule is "the energy-optimal plan within the SLO-feasible region", with T <= T_SLO.
A deadline met 99% of the time is a share of requests, and devices stall, so here a plan's
chance of meeting the deadline is read from the tail its placement really showed (each
placement's recorded ratios of measured to predicted time, ``Calibration.on_time_prob``,
blended with a prior that fades as the record grows), and ``a_t`` is what the on-time target's
miss budget allows this request (``MissBudget``: 1 - target plus what punctual requests saved,
less what risky ones overspent), so a cheap plan that is late 2% of the time and a punctual one
mix at the target. No decision picks a plan another feasible one beats on both counts.
A safety net keeps the rule from losing to a fixed split: every fixed strategy (device-only,
edge-only, the split after vision, at the identity setting) is a candidate, and the rule
deviates from the best feasible one only when the predicted gain in actions per joule exceeds
the measured energy prediction error (and that one is as punctual); when a window of
deviations realised less than the fixed strategy was predicted to give, it holds to the fixed
strategy for a window (``SafetyNet``). And a placement never run, or a setting never timed, is
tried now and then (bounded exploration, ``Decider._exploration``) when the cost model's own error
could make it feasible and it would save energy, while the miss budget is not in debt:
otherwise a plan the model mis-predicts as too slow would never be run, and so never
corrected.

over every executable, accuracy-eligible candidate (placement x accelerator setting). T_SLO =
chunk / control rate: one inference must deliver its chunk of actions before the previous
chunk runs out. The edge's load comes in as reservations (``DeviceState``): the edge's own
forecast over what is queued and the plans other robots booked (``queue_model``: the one
reservation mechanism, the runtime's edge and the fleet simulator's alike); the scheduler
keeps no ledger of its own.

``Scheduler`` is the one object callers hold, composed of three parts, each in its own module:
``scoring.py`` (``Candidates``: the plan space as candidates and their modelled stage costs;
``Scorer``: the recursion of ``predictor.py`` vectorised over all candidates with numpy, so a
decision over thousands of plans takes well under a millisecond of Python, and each plan's
on-time probability), ``decision.py`` (``Decider``: the rule above, the miss budget, the
safety net, exploration) and ``feedback.py`` (``Feedback``: what warm-up runs and outcomes
teach, and the mid-request handoff). The parts share one ``Calibration``: feedback writes it,
scoring reads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from vlarun.sched.calibration import Calibration
from vlarun.sched.catalog import Device
from vlarun.sched.contract import ExecutionPlan, Outcome, StageOutcome
from vlarun.sched.decision import Decider, MissBudget, SafetyNet, dominated, plan_row
from vlarun.sched.energy import RadioPower
from vlarun.sched.feedback import Feedback, Handoff
from vlarun.sched.link import Link
from vlarun.sched.plans import PlanSpace
from vlarun.sched.predictor import DeviceState
from vlarun.sched.scoring import MAX_EDGE_BATCH, Candidates, Scorer, Scores

# Names importable from here before the split into scoring / decision / feedback: callers
# keep importing them from this module.
__all__ = [
    "DEFAULT_ON_TIME",
    "MAX_EDGE_BATCH",
    "Handoff",
    "MissBudget",
    "SafetyNet",
    "Scheduler",
    "Scores",
    "plan_row",
]

DEFAULT_ON_TIME = 0.99  # the share of requests that must meet the deadline (``--on-time``)


class _Part:
    """An attribute of ``Scheduler`` that one of its parts owns: read and written there, so
    each value has one home (``sched.period_s = x`` sets what scoring reads)."""

    def __init__(self, part: str) -> None:
        self.part = part

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Scheduler | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: Scheduler, value: Any) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class Scheduler:
    """Scores all candidates of a ``PlanSpace`` and applies the core rule: the scorer, the
    decider and the feedback path over one calibration, behind one object."""

    # The plan space as candidates and their modelled costs (``scoring.Candidates``).
    space = _Part("cands")
    devices = _Part("cands")
    dtype = _Part("cands")
    k = _Part("cands")
    p = _Part("cands")
    edge = _Part("cands")
    allowed = _Part("cands")
    k0 = _Part("cands")
    t_rob = _Part("cands")
    u_rob = _Part("cands")
    t_edge = _Part("cands")
    u_edge = _Part("cands")
    e_edge = _Part("cands")
    in_bytes = _Part("cands")
    out_bytes = _Part("cands")
    p_rob_dyn = _Part("cands")
    # What scoring prices with (``scoring.Scorer``).
    slo_s = _Part("scorer")
    period_s = _Part("scorer")
    cal = _Part("scorer")
    radio = _Part("scorer")
    # The rule's targets and state (``decision.Decider``).
    target = _Part("decider")
    deadline_s = _Part("decider")
    actions = _Part("decider")
    budget = _Part("decider")
    net = _Part("decider")
    fixed = _Part("decider")
    explore_every = _Part("decider")

    dominated = staticmethod(dominated)

    def __init__(
        self,
        space: PlanSpace,
        devices: dict[str, Device],
        slo_s: float,
        *,
        dtype: str = "bfloat16",
        radio: RadioPower | None = None,
        cal: Calibration | None = None,
        actions: int | None = None,
        measured: dict[tuple[str, str], float] | None = None,
        explore_every: int = 0,
        deadline_s: float | None = None,
        on_time: float = DEFAULT_ON_TIME,
    ) -> None:
        if not 0.0 < on_time <= 1.0:
            raise ValueError(f"the on-time target must lie in (0, 1], got {on_time}")
        self.cands = Candidates(space, devices, dtype, measured)
        self.scorer = Scorer(self.cands, slo_s, cal or Calibration(), radio or RadioPower())
        self.decider = Decider(
            self.scorer,
            # actions executed per inference (the chunk)
            actions=actions or space.actions,
            # The deadline requests are judged by; ``slo_s`` may plan with headroom below it
            # (the fleet's guard).
            deadline_s=deadline_s or slo_s,
            on_time=on_time,
            explore_every=explore_every,
        )
        self.feedback = Feedback(self.scorer, self.decider)

    # -- scoring ---------------------------------------------------------------------------------

    def score(self, link: Link, now: float = 0.0, edge_state: DeviceState | None = None) -> Scores:
        """The predictor's recursion for every candidate at once (``Scorer.score``)."""
        return self.scorer.score(link, now, edge_state)

    def on_time_probabilities(self, sc: Scores, deadline_s: float | None = None) -> np.ndarray:
        """Each candidate's probability of ending by ``deadline_s`` (default ``slo_s``):
        ``Scorer.on_time_probabilities``."""
        return self.scorer.on_time_probabilities(sc, deadline_s)

    # -- the rule --------------------------------------------------------------------------------

    def decide(
        self, link: Link, now: float = 0.0, edge_state: DeviceState | None = None, top: int = 5
    ) -> ExecutionPlan:
        """Apply the core rule (``Decider.decide``); raises if no candidate is executable and
        eligible."""
        return self.decider.decide(link, now, edge_state, top)

    # -- the plan contract ------------------------------------------------------------------------

    def setting_index(self, plan: ExecutionPlan) -> int:
        """Which of this scheduler's settings ``plan`` runs (its knobs name it)."""
        return self.cands.setting_k(plan.settings)

    def candidate_index(self, plan: ExecutionPlan) -> int:
        """The candidate (setting, placement) ``plan`` is, for re-scoring it."""
        return self.cands.candidate_index(plan)

    # -- feedback --------------------------------------------------------------------------------

    def prime(self, robot_s: dict[str, float], edge_s: dict[str, float]) -> None:
        """Start calibrated from stage times measured at batch 1 on the identity setting."""
        self.feedback.prime(robot_s, edge_s)

    def prime_setting(self, settings: dict, robot_s: dict[str, float]) -> None:
        """Stage times measured on the robot under the setting ``settings``, at batch 1."""
        self.feedback.prime_setting(settings, robot_s)

    def observe(self, plan: ExecutionPlan, outcome: Outcome) -> None:
        """The one feedback path (``Feedback.observe``)."""
        self.feedback.observe(plan, outcome)

    def observe_stages(self, settings: dict | None, stages: Iterable[StageOutcome]) -> None:
        """Each stage's measured time teaches the factor of the device it ran on."""
        self.feedback.observe_stages(settings, stages)

    def settle(self, plan: ExecutionPlan, outcome: Outcome) -> None:
        """The miss budget learns whether the request met the deadline it was judged by."""
        self.feedback.settle(plan, outcome)

    def robot_times(self, settings: dict | None = None) -> dict[str, float]:
        """Each stage's calibrated time on the robot at batch 1 under ``settings`` (None: the
        identity), for the stages the robot has run (``Feedback.robot_times``)."""
        return self.feedback.robot_times(settings)

    def handoff(
        self,
        settings: dict | None,
        done: int,
        elapsed_s: float,
        link: Link,
        edge_state: DeviceState | None = None,
    ) -> Handoff | None:
        """Whether the rest of a request now running here should go to the edge after all
        (``Feedback.handoff``)."""
        return self.feedback.handoff(settings, done, elapsed_s, link, edge_state)
