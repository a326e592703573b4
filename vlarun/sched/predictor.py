"""Latency and energy of one placement of the stage DAG (EcoVLA's joint cost model).

For a placement pi: V -> {robot, edge}, start and end times are computed recursively over the
DAG in topological order:

    ready(v)  = max over parents w of  end(w) + tau(w, v)            (tau = 0 on one device)
    start(v)  = earliest time >= max(ready(v), a_d) + Q_d(v) where d = pi(v) is free of
                reservations for t(v, d)
    end(v)    = start(v) + t(v, d)
    T(pi)     = end(last) + tau(last, robot) + r(pi)

a_d is when device d is next available, Q_d(v) the work already queued for stage v on d, and
r(pi) a residual learned online per placement. tau(w, v) = link latency of the packet on that
edge; a graph input (camera frame, prompt) starts on the robot, and the actions must come back.

``Calibration`` (``calibration.py``) keeps the corrections that measurements feed back: a
multiplicative factor per (stage, role), an additive overhead per cut boundary, and the
residual per placement; its ``energy`` part what the energy model misses per plan and device.
The same recursion, vectorised over thousands of candidate plans, is in ``scoring.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vlarun.sched.bookings import Slot
from vlarun.sched.calibration import INPUT, OUTPUT, Calibration
from vlarun.sched.catalog import Device
from vlarun.sched.cost import StageWork, roofline, stage_seconds
from vlarun.sched.energy import (
    ENERGY_SOURCE,
    RadioPower,
    StageSpend,
    actions_per_joule,
    request_energy,
    stage_energy,
    stage_joules,
)
from vlarun.sched.link import Link

ROBOT, EDGE = "robot", "edge"


# ---------------------------------------------------------------------------------------------
# Whole model on one device (`vlarun predict`)


def predict_device(
    works: Sequence[StageWork],
    device: Device,
    dtype: str = "bfloat16",
    actions: int = 1,
    profile=None,
    model: str = "",
    batch: int = 1,
    text_tokens: int = 24,
) -> dict:
    """Per-stage and end-to-end latency and energy of the whole model on ``device``."""
    stages, total_s, total_j = [], 0.0, 0.0
    for work in works:
        roof = roofline(work, device, dtype)
        seconds, source = stage_seconds(work, device, dtype, profile, model, batch, text_tokens)
        util = roof.utilisation if source == "roofline" else 1.0
        joules = stage_energy(device, seconds, util)
        stages.append(
            {
                "name": work.name,
                "latency_ms": seconds * 1e3,
                "energy_j": joules,
                "latency_source": source,
                "bound": _bound(roof),
                "utilisation": util,
                "power_w": joules / seconds if seconds > 0 else 0.0,
            }
        )
        total_s, total_j = total_s + seconds, total_j + joules
    return {
        "latency_ms": total_s * 1e3,
        "energy_j": total_j,
        "energy_source": ENERGY_SOURCE,
        "actions": actions * batch,
        "actions_per_joule": actions_per_joule(actions * batch, total_j),
        "stages": stages,
    }


def _bound(roof) -> str:
    if roof.overhead_s > max(roof.compute_s, roof.memory_s):
        return "overhead"
    return "compute" if roof.compute_s >= roof.memory_s else "memory"


# ---------------------------------------------------------------------------------------------
# Edge occupancy: reservations (the edge's forecast slots) and queues


@dataclass
class DeviceState:
    """What the predictor knows of a device's load: when it is next free, per-stage queued
    work (seconds), the slots of the edge's committed schedule (``queue_model.reservations``:
    [start, end) on the scheduler's clock, and the deadline of the work each holds, since the
    edge serves earliest deadline first), and the slowdown other tenants cause (the edge
    reports its background utilisation rho; a stage sharing the device by time-slicing takes
    1 / (1 - rho) as long)."""

    available_at: float = 0.0
    slowdown: float = 1.0
    queued_s: dict[str, float] = field(default_factory=dict)
    reservations: list[Slot] = field(default_factory=list)

    def earliest_fit(self, ready: float, seconds: float) -> float:
        """First start >= ready such that [start, start + seconds) overlaps no reservation."""
        start = ready
        for r in sorted(self.reservations, key=lambda r: r.start):
            if start < r.end and start + seconds > r.start:
                start = r.end
        return start


# ---------------------------------------------------------------------------------------------
# One placement


@dataclass(frozen=True)
class StageTimes:
    name: str
    device: str  # role: robot or edge
    start: float
    end: float
    transfer_in_s: float
    energy_j: float


@dataclass(frozen=True)
class Prediction:
    """Predicted outcome of one plan. Invariant: ``latency_s`` >= the last stage's end minus
    ``now``; ``energy_j`` covers the control cycle (see energy.py)."""

    latency_s: float
    energy_j: float
    actions_per_joule: float
    stages: tuple[StageTimes, ...]
    transfer_s: float
    bytes_sent: int


def _stage_time(work, role, devices, dtype, cal, measured=None) -> tuple[float, float]:
    """Calibrated stage seconds and utilisation; a measured median replaces the roofline."""
    dev = devices[role]
    roof = roofline(work, dev, dtype)
    base, util = roof.seconds, roof.utilisation
    if measured and (work.name, dev.id) in measured:
        base, util = measured[(work.name, dev.id)], 1.0
    return base * cal.factor(work.name, role), util


def _arrival(work, role, placement, end, now, link, cal, radio):
    """When all of a stage's input packets are on its device: (ready time, slowest incoming
    transfer, bytes sent, robot radio seconds sending, receiving). The first stage's inputs
    come from the robot's sensors; a packet crossing between robot and edge pays the link and
    the boundary term."""
    sources = [(p, placement[p], end[p]) for p in work.parents] or [(INPUT, ROBOT, now)]
    ready, tau_in, sent, tx_s, rx_s = now, 0.0, 0, 0.0, 0.0
    for parent, src_role, t_end in sources:
        tau = 0.0
        if src_role != role:
            wire = link.transfer_s(work.in_bytes)
            tau = wire + cal.boundary(parent, work.name)
            sent += work.in_bytes
            if src_role == ROBOT:
                tx_s += wire
            else:
                rx_s += wire
        ready, tau_in = max(ready, t_end + tau), max(tau_in, tau)
    return ready, tau_in, sent, tx_s, rx_s


def predict_placement(
    works: Sequence[StageWork],
    placement: Mapping[str, str],
    devices: Mapping[str, Device],
    link: Link,
    *,
    now: float = 0.0,
    state: Mapping[str, DeviceState] | None = None,
    cal: Calibration | None = None,
    dtype: str = "bfloat16",
    actions: int = 1,
    period_s: float = 0.0,
    radio: RadioPower | None = None,
    measured: Mapping[tuple[str, str], float] | None = None,
) -> Prediction:
    """Latency and energy of running ``works`` with ``placement`` (stage -> robot/edge).

    ``devices`` maps the roles robot and edge to catalog devices; ``state`` gives each role's
    availability, queues and reservations; ``period_s`` is the control period the robot idles
    through (0: count only the inference itself); ``measured`` maps (stage, device id) to a
    profiled median that overrides the roofline (only valid for the works it was measured on).
    """
    cal, radio = cal or Calibration(), radio or RadioPower()
    state = state or {}
    end: dict[str, float] = {}
    out: list[StageTimes] = []
    transfer_total, sent, tx_s, rx_s = 0.0, 0, 0.0, 0.0
    spends: list[StageSpend] = []
    robot, edge = devices[ROBOT], devices.get(EDGE, devices[ROBOT])
    for work in works:
        role = placement[work.name]
        dev_state = state.get(role, DeviceState())
        ready, tau_in, nbytes, tx, rx = _arrival(work, role, placement, end, now, link, cal, radio)
        sent, tx_s, rx_s = sent + nbytes, tx_s + tx, rx_s + rx
        # Energy is charged for the device's own work (busy); the wall time also includes
        # the slowdown from other tenants time-sharing the device.
        busy, util = _stage_time(work, role, devices, dtype, cal, measured)
        seconds = busy * dev_state.slowdown
        ready = max(ready, dev_state.available_at) + dev_state.queued_s.get(work.name, 0.0)
        start = dev_state.earliest_fit(ready, seconds)
        end[work.name] = start + seconds
        spend = StageSpend(ROBOT if role == ROBOT else EDGE, busy, util)
        spends.append(spend)
        transfer_total += tau_in
        joules = stage_joules(robot, edge, spend)
        out.append(StageTimes(work.name, role, start, end[work.name], tau_in, joules))
    last = works[-1]
    finish = end[last.name]
    if placement[last.name] != ROBOT:  # the actions return to the robot
        back = link.transfer_s(last.out_bytes) + cal.boundary(last.name, OUTPUT)
        finish += back
        transfer_total += back
        rx_s += back
    placement_key = tuple(placement[w.name] for w in works)
    latency = finish - now + cal.residual(placement_key)
    energy = request_energy(
        robot,
        edge,
        spends,
        latency_s=latency,
        period_s=period_s,
        tx_s=tx_s,
        rx_s=rx_s,
        radio=radio,
    )
    return Prediction(
        latency, energy, actions_per_joule(actions, energy), tuple(out), transfer_total, sent
    )
