"""One robot request's records, typed: what it carries while it runs (``RequestContext``: the
plan, the deadline, the tensor pool, the trace, the real-time freeze and whether it may still
be handed to the edge) and what it leaves (``Trace`` as it ran, ``Inference`` as it is
reported, built by keyword from the plan and the trace).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from vlarun.accel.rtc import P95_Z, RTCRequest, frozen_steps
from vlarun.runtime.robot.chunks import Prior
from vlarun.runtime.robot.planner import Plan


@dataclass
class Trace:
    """What one request's execution did: where each stage ran and for how long, etc."""

    ran: dict[str, str] = field(default_factory=dict)
    stage_s: dict[str, float] = field(default_factory=dict)
    edge_s: dict[str, float] = field(default_factory=dict)  # edge compute per request
    batch: dict[str, int] = field(default_factory=dict)  # edge batch size per stage
    fallback: str | None = None
    overheads_ms: list[float] = field(default_factory=list)
    sent: int = 0
    transfers: list = field(default_factory=list)  # contract.TransferOutcome per edge call
    late_edge: bool = False  # an edge answer came too late for the deadline
    # When the first edge answer in time was sent for (time.monotonic()); None: none was.
    edge_at: float | None = None
    # The rest of the request went to the edge mid-way (``Scheduler.handoff``): why, and the
    # robot stages whose work that threw away (their time still costs energy).
    handoff: str | None = None
    wasted_s: dict[str, float] = field(default_factory=dict)
    # The request's energy per device, metered and as the scheduler's account prices the same
    # execution (``CostView.energy``): what teaches each device's power factor.
    energy_metered: dict[str, float] = field(default_factory=dict)
    energy_modelled: dict[str, float] = field(default_factory=dict)


@dataclass
class Freeze:
    """A real-time chunk's freeze (``accel.rtc.RTCRequest``) riding on a request. When the edge
    fails and the rest runs here, ``refit`` recomputes d once, before the head runs: the time
    already spent plus the local stages left, over the control period."""

    rtc: RTCRequest
    period_s: float
    refit_done: bool = False

    def refit(self, pool: dict, t0: float, local_left_s: float) -> None:
        if self.refit_done:
            return
        self.refit_done = True
        left = time.perf_counter() - t0 + local_left_s
        h, s = self.rtc.horizon, self.rtc.execution_horizon
        pool["rtc_delay"] = torch.tensor([frozen_steps(left, self.period_s, h, s)])


@dataclass
class RequestContext:
    """One request while it runs: its plan and graph, when it began (``time.perf_counter()``)
    and its deadline, the tensor pool its stages read and write, what it did so far, its
    real-time freeze (None: none), and whether the rest may still be handed to the edge
    (asked at each stage boundary while the rest runs here, tried at most once)."""

    plan: Plan
    graph: object  # stages.graph.StageGraph
    pool: dict
    t0: float
    deadline: float
    freeze: Freeze | None = None
    may_hand_off: bool = False
    trace: Trace = field(default_factory=Trace)

    @property
    def text_tokens(self) -> int:
        return self.plan.text_tokens


@dataclass(kw_only=True)
class Inference:
    """One request as it happened. ``late_s`` > 0 means the deadline was missed;
    ``fallback`` says why stages planned for the edge ran here (None: as planned)."""

    actions: np.ndarray
    planned: dict[str, str]
    ran: dict[str, str]
    latency_s: float
    slo_s: float
    fallback: str | None
    predicted_s: float | None
    energy_j: float
    stage_ms: dict[str, float] = field(default_factory=dict)
    remote_overhead_ms: list[float] = field(default_factory=list)
    bytes_sent: int = 0
    link_mbps: float | None = None  # the bandwidth estimate the plan was made with
    setting: str = "full"  # the accelerator setting it ran (AccelSetting's text form)
    edge_batch: dict[str, int] = field(default_factory=dict)  # batch each edge stage ran in
    # What the robot's meter read over this request (None: no meter); energy_j stays the
    # modelled account the plan was priced with, so prediction and outcome compare.
    measured_robot_j: float | None = None
    meter: str | None = None
    explored: bool = False  # the plan was tried by bounded exploration, not the core rule
    predicted_j: float | None = None  # the plan's modelled energy as the scheduler priced it
    late_edge: bool = False  # an edge answer came, but too late for the deadline
    started_s: float = 0.0  # time.monotonic() when the request began (to place it on a timeline)
    predicted_sigma_s: float | None = None  # the plan's learned latency spread (0: unmeasured)
    model_actions: np.ndarray | None = field(default=None, repr=False)  # the chunk, model space
    rtc_delay: int | None = None  # real-time chunking: the actions frozen (None: no freeze)
    edge_at_s: float | None = None  # time.monotonic() the first edge answer in time was sent for
    handoff: str | None = None  # the rest went to the edge mid-way when the link came back
    planner: str | None = None  # who chose the plan: the strategy, or "edge down"
    world: str | None = None  # emulated under this world, whose powers priced energy_j

    @classmethod
    def from_run(
        cls,
        ctx: RequestContext,
        *,
        actions: np.ndarray,
        latency_s: float,
        slo_s: float,
        energy_j: float,
        started_s: float,
        measured_robot_j=None,
        meter: str | None = None,
        world: str | None = None,
    ) -> Inference:
        """The record of a request that ran ``ctx.plan`` as ``ctx.trace`` says."""
        plan, tr, pool = ctx.plan, ctx.trace, ctx.pool
        return cls(
            actions=actions,
            planned=plan.placement,
            ran=tr.ran,
            latency_s=latency_s,
            slo_s=slo_s,
            fallback=tr.fallback,
            predicted_s=plan.predicted_s,
            energy_j=energy_j,
            stage_ms={k: v * 1e3 for k, v in tr.stage_s.items()},
            remote_overhead_ms=tr.overheads_ms,
            bytes_sent=tr.sent,
            link_mbps=plan.link_mbps,
            setting=str(plan.setting),
            edge_batch=dict(tr.batch),
            measured_robot_j=measured_robot_j,
            meter=meter,
            explored=plan.explored,
            predicted_j=plan.predicted_j,
            late_edge=tr.late_edge,
            started_s=started_s,
            predicted_sigma_s=plan.sigma_s,
            model_actions=pool["actions"][0].float().cpu().numpy(),
            rtc_delay=None if ctx.freeze is None else int(pool["rtc_delay"][0]),
            edge_at_s=tr.edge_at,
            handoff=tr.handoff,
            planner=plan.planner,
            world=world,
        )

    @property
    def late_s(self) -> float:
        return self.latency_s - self.slo_s

    @property
    def predicted_p95_s(self) -> float | None:
        """The plan's p95 latency (predicted + 1.645 sigma, network included); None without
        a prediction (the fixed strategies, or the edge down)."""
        if self.predicted_s is None:
            return None
        return self.predicted_s + P95_Z * (self.predicted_sigma_s or 0.0)

    @property
    def energy_source(self) -> str:
        if self.world is not None:
            return f"modelled: the {self.world} world's powers x the emulated times (no meter)"
        return "modelled" if self.meter is None else f"modelled; robot measured by {self.meter}"

    def row(self) -> dict:
        return {
            "plan": "/".join(f"{s}@{r}" for s, r in self.planned.items()),
            "ran": "/".join(f"{s}@{r}" for s, r in self.ran.items()),
            "latency_ms": self.latency_s * 1e3,
            "deadline_ms": self.slo_s * 1e3,
            "slo_met": self.latency_s <= self.slo_s,
            "fallback": self.fallback,
            "predicted_ms": None if self.predicted_s is None else self.predicted_s * 1e3,
            "energy_j": self.energy_j,
            "predicted_j": self.predicted_j,
            "stage_ms": self.stage_ms,
            "remote_overhead_ms": self.remote_overhead_ms,
            "bytes_sent": self.bytes_sent,
            "link_mbps": self.link_mbps,
            "setting": self.setting,
            "edge_batch": self.edge_batch,
            "measured_robot_j": self.measured_robot_j,
            "explored": self.explored,
            "late_edge": self.late_edge,
            "started_s": self.started_s,
            "predicted_p95_ms": None if self.predicted_s is None else self.predicted_p95_s * 1e3,
            "rtc_delay": self.rtc_delay,
            "edge_at_s": self.edge_at_s,
            "handoff": self.handoff,
            "planner": self.planner,
            "energy_source": self.energy_source,
        }


def freeze_for(
    rtc_on: bool, prior: Prior | None, plan: Plan, local_s: dict, slo_s: float, horizon: int
) -> Freeze | None:
    """The real-time chunk freeze for ``plan`` (None: RTC off, or nothing queued), under any
    setting: a token decoder (Jacobi, early exit) takes the freeze's forced prefix as greedy
    decoding does (``accel.jacobi.jacobi_decode``). Its latency: the plan's prediction and
    spread; without one, the measured local stages when everything runs here, else the
    latency the queue leads by, else the deadline."""
    if not rtc_on or prior is None or prior.model is None or not len(prior.model):
        return None
    placement, sigma = plan.placement, plan.sigma_s or 0.0
    if plan.predicted_s is not None:
        latency = plan.predicted_s
    elif set(placement.values()) == {"robot"} and set(placement) <= set(local_s):
        latency = sum(local_s[n] for n in placement)
    elif prior.latency_s is not None:
        latency = prior.latency_s
    else:
        latency = slo_s  # nothing measured yet: the deadline bounds it
    return Freeze(
        RTCRequest.build(prior.model, horizon, latency, prior.period_s, sigma), prior.period_s
    )
