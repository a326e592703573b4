"""The contract between the scheduler and whoever executes its plans (the runtime's agent, the
fleet simulator): plain frozen data both sides read, as vLLM v1's ``SchedulerOutput`` is.

  ExecutionPlan  what to run where, with which accelerator setting, and what the scheduler
                 predicted for it (per stage and end to end, latency and energy);
  Outcome        what happened when it ran: per stage where it ran, its measured execution
                 time and batch size, each edge call's time off the edge (the boundaries'
                 transfers), the end-to-end latency, the fallback and why.

``Scheduler.observe(plan, outcome)`` is the only feedback path. Neither side holds an index into
the other's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("robot", "edge")


@dataclass(frozen=True)
class ExecutionPlan:
    """The scheduler's output for one request.

    Invariant: ``feasible`` is True iff the plan's predicted probability of meeting ``slo_s``
    (``on_time_p``) reaches the on-time target; a plan below it may still be chosen, as the
    cheap half of a mix the miss budget pays for, the fallback's choice or an ``explored`` one.
    ``latency_s`` includes ``residual_s`` (the learned end-to-end correction of this
    placement). Times are on the scheduler's clock; ``stage_predicted_s`` is each stage's
    calibrated time on its device."""

    placement: dict[str, str]
    settings: dict
    relative_success: float | None
    latency_s: float
    residual_s: float
    energy_j: float
    actions_per_joule: float
    feasible: bool
    slo_s: float
    stage_start: dict[str, float]
    stage_end: dict[str, float]
    stage_predicted_s: dict[str, float] = field(default_factory=dict)
    # The learned spread (one sigma) of this placement's latency around ``latency_s``; 0 while
    # never measured. latency_s + 1.645 sigma is the plan's p95 (what real-time chunking's
    # delay and the chunk queue's lead are sized by).
    sigma_s: float = 0.0
    # Chosen by bounded exploration (a never-run plan the rule rejected for want of evidence),
    # not by the core rule.
    explored: bool = False
    # The best feasible fixed strategy's predicted actions per joule when this plan was chosen
    # (None: none was feasible): what the safety net holds the realised actions/J against.
    fixed_actions_per_joule: float | None = None
    # The safety net chose the fixed strategy over the core rule's plan (gain within the
    # measured prediction error, or the realised window fell below the fixed strategy).
    held_to_fixed: bool = False
    energy_source: str = "modelled"
    # The learned realised / predicted energy of this kind of plan, already in ``energy_j``
    # (``EnergyCalibration.factor``; 1: never measured).
    energy_factor: float = 1.0
    # The model's energy of this plan per device before any learnt factor (``robot``, ``edge``;
    # ``energy_j`` is their sum with each device's power factor, times ``energy_factor``), and
    # the devices this plan uses whose power no meter has read yet: their figure is the
    # catalog's alone (flagged, as a never-timed setting is).
    energy_by_device: dict[str, float] = field(default_factory=dict)
    power_unmetered: tuple[str, ...] = ()
    # The predicted probability that this request meets ``slo_s`` (its placement's recorded
    # tail, the cost model's prior where it has none; None: not planned by a scheduler), the
    # on-time target it was planned for, and the miss probability the target's budget allowed
    # this request when it was planned (``decision.MissBudget``).
    on_time_p: float | None = None
    on_time_target: float | None = None
    miss_allowance: float | None = None
    # The on-time share the most punctual plan held for every request would deliver, as the
    # scheduler estimates it now (``decision.Decider._reach``): below the target, the target is
    # out of reach of any plan or mix of plans, and the scheduler holds to within half a point
    # of it.
    on_time_reach: float | None = None
    alternatives: list[dict] = field(default_factory=list)
    candidates: int = 0
    eligible: int = 0

    def __post_init__(self) -> None:
        bad = {s: r for s, r in self.placement.items() if r not in ROLES}
        if bad:
            raise ValueError(f"placement roles must be {ROLES}, got {bad}")


@dataclass(frozen=True)
class StageOutcome:
    """One stage as it ran: where, how long its execution took (the whole batch's compute
    time, which this request waited for), and how many requests shared that execution."""

    name: str
    role: str
    seconds: float
    batch: int = 1

    def __post_init__(self) -> None:
        if self.role not in ROLES or self.seconds < 0 or self.batch < 1:
            raise ValueError(f"bad stage outcome {self}")


@dataclass(frozen=True)
class TransferOutcome:
    """One call to the edge as the robot saw it: the edge ran stages ``into`` .. ``out_of``,
    and ``seconds`` is the call's wall time minus the edge's own time (queueing + compute),
    i.e. both transfers with their encoding, dispatch and decoding; the bytes each way."""

    into: str
    out_of: str
    seconds: float
    sent_bytes: int
    recv_bytes: int

    def __post_init__(self) -> None:
        if self.seconds < 0 or self.sent_bytes < 0 or self.recv_bytes < 0:
            raise ValueError(f"bad transfer outcome {self}")


@dataclass(frozen=True)
class Outcome:
    """What one executed request measured; ``fallback`` says why stages planned for the edge
    ran on the robot (None: as planned)."""

    stages: tuple[StageOutcome, ...]
    latency_s: float
    fallback: str | None = None
    energy_j: float | None = None
    energy_source: str = "modelled"
    transfers: tuple[TransferOutcome, ...] = ()
    # ``energy_j`` per device as its meter read it (a world's meter when emulated), and the
    # same execution (the same stage times, batches and latency) priced by the scheduler's
    # own account: their ratio is each device's power error alone, apart from any time error.
    # Empty: no per-device reading (only ``energy_j`` teaches, per placement).
    energy_by_device: dict[str, float] = field(default_factory=dict)
    modelled_by_device: dict[str, float] = field(default_factory=dict)

    @property
    def ran(self) -> dict[str, str]:
        return {s.name: s.role for s in self.stages}
