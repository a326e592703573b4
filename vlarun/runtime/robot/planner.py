"""The robot's planners: where each stage of a request runs, and under which accelerator
setting. This is the file to change how a plan is chosen.

Every planner returns a ``Plan`` for every request (never None), so the executor runs one kind
of thing and the learner learns from one kind of thing:

  FixedPlanner      device-only, edge-only, fixed-split (``sched.strategy.fixed_roles``, the
                    one rule) at the configured setting; a fixed placement with a fixed setting
                    is one more FixedPlanner, not a branch;
  ScheduledPlanner  vlarun (placement under the configured setting) and vlarun-joint
                    (placement and setting together): the scheduler for the request's prompt
                    length decides against the link and the edge's committed schedule, and
                    its plan's edge segments are booked on the edge the moment it is chosen.

Every planner owns one scheduler per prompt length, whose calibration is the one learner of
each stage's time here: every executed request teaches it (``learn``), and ``robot_s`` reads
it back in this host's seconds for the executor (how long the robot stages after an edge
segment take) and the real-time chunk's freeze. With the edge down every planner's plan is
the robot-only one at the configured setting ("edge down"). A scheduler's plan holds the
contract plan (``ExecutionPlan``: placement and predictions, what its outcome teaches); a plan
no scheduler made holds its placement alone, and predicts nothing (``predicted_s`` ... None).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlarun.policy.setting import AccelSetting
from vlarun.runtime.robot import costview
from vlarun.sched.bookings import Booking
from vlarun.sched.contract import ExecutionPlan, Outcome
from vlarun.sched.link import Link
from vlarun.sched.queue_model import plan_bookings
from vlarun.sched.scheduler import Handoff, Scheduler
from vlarun.sched.strategy import SCHEDULED, canonical, fixed_roles


@dataclass(frozen=True)
class EdgeView:
    """The edge as the robot knows it when it plans: up or not, its last health reply, and
    its committed schedule (``bookings.Slot``s, ``age_s`` old; None: never heard)."""

    up: bool
    health: dict
    schedule: tuple | None = None
    age_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one request will run where, under which setting, as the robot runs it: the
    scheduler's ``contract`` (placement, predictions; what the outcome teaches) or, for a plan
    no scheduler made (a fixed strategy's, edge down), its ``fixed`` placement, and beside
    either what only the robot needs. Invariant: exactly one of ``contract`` and ``fixed``."""

    text_tokens: int  # the prompt's length (which scheduler planned it)
    setting: AccelSetting  # what runs: the contract's settings as this robot runs them
    planner: str  # the strategy that chose it; "edge down" when the edge was
    link_mbps: float  # the link's bandwidth estimate when it was chosen
    contract: ExecutionPlan | None = None
    fixed: dict[str, str] | None = None  # stage -> role, when no scheduler planned it
    bookings: tuple[Booking, ...] = ()  # the contract's edge segments, announced to the edge

    def __post_init__(self) -> None:
        if (self.contract is None) == (self.fixed is None):
            raise ValueError("a plan is a scheduler's contract or a fixed placement, one of them")

    @property
    def placement(self) -> dict[str, str]:
        """Stage -> role (robot or edge)."""
        return self.fixed if self.contract is None else self.contract.placement

    @property
    def predicted_s(self) -> float | None:
        """End-to-end latency (None: not predicted)."""
        return None if self.contract is None else self.contract.latency_s

    @property
    def sigma_s(self) -> float | None:
        """The latency's learned spread (0: never measured; None: not predicted)."""
        return None if self.contract is None else self.contract.sigma_s

    @property
    def predicted_j(self) -> float | None:
        return None if self.contract is None else self.contract.energy_j

    @property
    def explored(self) -> bool:
        """A never-run plan tried by bounded exploration."""
        return self.contract is not None and self.contract.explored


class Planner:
    """The fixed strategies' planner, and the base of the scheduled one."""

    hands_off = False  # whether ``handoff`` may ever move a request (asked at stage bounds)

    def __init__(
        self, strategy: str, setting: AccelSetting, costs: costview.CostView, slo_s: float
    ) -> None:
        self.strategy, self.setting = strategy, setting
        self.costs, self.slo_s = costs, slo_s
        self._scheds: dict[int, Scheduler] = {}
        self._edge_primed: set[int] = set()  # prompt lengths primed with the edge's estimates
        self.text_tokens: int | None = None  # the last prompt length prepared or planned

    def scheduler(
        self, text_tokens: int, robot_s: dict | None = None, health: dict | None = None
    ) -> Scheduler:
        """The scheduler of prompts of ``text_tokens``, built once. Primed with stage times
        measured here (``robot_s``, this host's seconds: the warm-up's) whenever given, and
        with the edge's per-stage estimates the first time a health reply carries them: a
        scheduler built while the edge was down (an edge-down request's stage times teach
        it) is primed for the edge once the edge is heard."""
        sched = self._scheds.get(text_tokens)
        if sched is None:
            sched = self._scheds[text_tokens] = self.costs.scheduler(text_tokens)
        if robot_s:
            costview.prime(sched, robot_s, {}, self.costs.factors(text_tokens))
        edge_ms = (health or {}).get("stage_ms") or {}
        if edge_ms and text_tokens not in self._edge_primed:
            costview.prime(sched, {}, edge_ms, self.costs.factors(text_tokens))
            self._edge_primed.add(text_tokens)
        return sched

    def prepare(
        self, text_tokens: int, robot_s: dict | None = None, health: dict | None = None
    ) -> None:
        """Build before any request what planning a prompt of ``text_tokens`` needs."""
        self.text_tokens = text_tokens
        self.scheduler(text_tokens, robot_s, health)

    def robot_s(self, text_tokens: int, settings: dict | None = None) -> dict[str, float]:
        """Each stage's time here in this host's seconds, under ``settings`` (a plan's knobs;
        None: the configured setting), as every run here has taught the scheduler
        (``Scheduler.robot_times``, converted back from the named device). Stages never timed
        here are left out."""
        named = self.scheduler(text_tokens).robot_times(settings)
        factors = self.costs.factors(text_tokens)["robot"]
        return {name: t / factors.get(name, 1.0) for name, t in named.items()}

    def plan_robot_s(self, plan: Plan) -> dict[str, float]:
        """``robot_s`` under the setting ``plan`` runs."""
        return self.robot_s(plan.text_tokens, plan.contract.settings if plan.contract else None)

    def plan(self, text_tokens: int, graph, edge: EdgeView, link: Link) -> Plan:
        self.text_tokens = text_tokens
        names = [s.name for s in graph.stages]
        if not edge.up:
            return Plan(
                text_tokens=text_tokens,
                fixed=dict.fromkeys(names, "robot"),
                setting=self.setting,
                planner="edge down",
                link_mbps=link.bandwidth_mbps,
            )
        return self._choose(text_tokens, graph, edge, link)

    def _choose(self, text_tokens: int, graph, edge: EdgeView, link: Link) -> Plan:
        roles = fixed_roles(self.strategy, len(graph.stages))
        placement = dict(zip((s.name for s in graph.stages), roles, strict=True))
        return Plan(
            text_tokens=text_tokens,
            fixed=placement,
            setting=self.setting,
            planner=self.strategy,
            link_mbps=link.bandwidth_mbps,
        )

    def handoff(
        self, plan: Plan, done: int, elapsed_s: float, link: Link, edge: EdgeView
    ) -> Handoff | None:
        """Whether the rest of a request running here goes to the edge after all: a fixed
        strategy never moves a request."""
        return None

    def learn(self, plan: Plan, outcome: Outcome) -> None:
        """What a fixed strategy learns from an outcome: its stages' times (where it runs
        and under which setting are fixed; how long a stage takes here is not)."""
        self.scheduler(plan.text_tokens).observe_stages(None, outcome.stages)


FixedPlanner = Planner


class ScheduledPlanner(Planner):
    """The scheduler's plans, one scheduler per prompt length (primed, when built, with the
    stage times measured so far here and on the edge)."""

    hands_off = True

    def _choose(self, text_tokens: int, graph, edge: EdgeView, link: Link) -> Plan:
        sched = self.scheduler(text_tokens)  # built by ``prepare``
        d = costview.decide(sched, link, edge.health, edge.schedule, edge.age_s)
        setting = AccelSetting.from_knobs(d.settings, self.setting.token_method)
        return Plan(
            text_tokens=text_tokens,
            setting=setting,
            planner=self.strategy,
            link_mbps=link.bandwidth_mbps,
            contract=d,
            bookings=plan_bookings(d, self.slo_s),
        )

    def handoff(
        self, plan: Plan, done: int, elapsed_s: float, link: Link, edge: EdgeView
    ) -> Handoff | None:
        """The scheduler's handoff for a request running here with ``done`` stages run.
        Asked only once the link looks back since the request was planned (the edge was down
        then, the request fell back, or the bandwidth estimate has since doubled): a request
        the plan keeps here on a steady link is not re-planned at every stage."""
        if not edge.up:
            return None
        steady = link.bandwidth_mbps < 2.0 * plan.link_mbps
        if plan.contract is not None and steady:
            return None
        sched = self.scheduler(plan.text_tokens)
        state = costview.edge_state(edge.health, edge.schedule, edge.age_s)
        settings = None if plan.contract is None else plan.contract.settings
        return sched.handoff(settings, done, elapsed_s, link, state)

    def learn(self, plan: Plan, outcome: Outcome) -> None:
        """The scheduler learns from the outcome of a plan it made; a robot-only plan made
        because the edge was down is nobody's plan: only its stages' times teach."""
        if plan.contract is None:
            super().learn(plan, outcome)
        else:
            self.scheduler(plan.text_tokens).observe(plan.contract, outcome)


def make_planner(
    strategy: str, setting: AccelSetting, costs: costview.CostView, slo_s: float
) -> Planner:
    """The planner for ``strategy`` (``sched.strategy``'s names; "vlarun" is the placement)."""
    if canonical(strategy) in SCHEDULED:
        return ScheduledPlanner(strategy, setting, costs, slo_s)
    return FixedPlanner(strategy, setting, costs, slo_s)
