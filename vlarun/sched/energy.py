"""Power and energy model (modelled, not metered, unless a meter in ``meters.py`` was read).

Power of a device running a stage lies between its idle and busy power by utilisation:
    P(v, d) = idle_d + (busy_d - idle_d) * u(v, d),     e(v, d) = P(v, d) * t(v, d)
Per inference (EcoVLA counts the whole control cycle, idle included, because a robot that
finishes early still waits for the next control period): :func:`request_energy`, the one
account, whose docstring holds the formula; the scheduler's vectorised copy is tested equal to
the predictor, which calls it. The edge's idle power between requests is not charged to
any one robot: it is shared infrastructure, and charging it would only add a constant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vlarun.sched.catalog import Device

ENERGY_SOURCE = "modelled"  # every output carries this label unless a meter was read
# The devices one request's energy is split over (``request_energy_by_device``), each read by its
# own meter: the robot (idle cycle, its stages, its radio) and the edge (its stages' share).
ENERGY_DEVICES = ("robot", "edge")


@dataclass(frozen=True)
class RadioPower:
    """Robot-side network interface power while sending and receiving, in watts.

    Defaults are an assumption (U): the order of magnitude of a Wi-Fi module's draw while
    active; override them with a measured figure for the robot's actual link.
    """

    tx_w: float = 1.5
    rx_w: float = 1.0
    # Listening for an answer while the edge computes: 0 in the catalog (the account has
    # priced no listening state); a world's meter charges its own figure.
    listen_w: float = 0.0

    def __post_init__(self) -> None:
        if self.tx_w < 0 or self.rx_w < 0 or self.listen_w < 0:
            raise ValueError("radio power must be non-negative")


def stage_power(device: Device, utilisation: float) -> float:
    u = min(max(utilisation, 0.0), 1.0)
    return device.idle_w + (device.busy_w - device.idle_w) * u


def stage_energy(device: Device, seconds: float, utilisation: float) -> float:
    return stage_power(device, utilisation) * seconds


def dynamic_energy(device: Device, seconds: float, utilisation: float) -> float:
    """Energy above idle: what a stage adds on a device whose idle power is counted anyway."""
    return (stage_power(device, utilisation) - device.idle_w) * seconds


@dataclass(frozen=True)
class StageSpend:
    """One stage of one request, as the energy account needs it.

    role: "robot" or "edge" (the device that ran it); busy_s: the seconds that device computed
    (calibrated prediction, or measured; on the edge, the whole batch's time); utilisation:
    0..1 (the roofline's estimate, 1.0 when only a measured time is known); batch: requests
    that shared this execution (edge batching): each is charged ``1 / batch`` of it."""

    role: str
    busy_s: float
    utilisation: float = 1.0
    batch: int = 1

    def __post_init__(self) -> None:
        if self.role not in ("robot", "edge"):
            raise ValueError(f"stage role must be robot or edge, got {self.role!r}")
        if self.busy_s < 0 or self.batch < 1:
            raise ValueError(f"bad stage spend: busy_s={self.busy_s}, batch={self.batch}")


def request_energy(robot: Device, edge: Device, stages: Iterable[StageSpend], **account) -> float:
    """The energy of one request, in joules: :func:`request_energy_by_device` summed (its
    docstring holds the formula; ``account`` its keyword arguments)."""
    return sum(request_energy_by_device(robot, edge, stages, **account).values())


def request_energy_by_device(
    robot: Device,
    edge: Device,
    stages: Iterable[StageSpend],
    *,
    latency_s: float,
    period_s: float,
    tx_s: float = 0.0,
    rx_s: float = 0.0,
    radio: RadioPower | None = None,
    listen_s: float = 0.0,
) -> dict[str, float]:
    """The energy of one request, in joules, per device that spends it: the one account every
    part of vlarun uses (scheduler, predictor, fleet simulator, runtime), for plans and
    outcomes alike:

        robot = idle_robot * max(latency, period)                   robot idles the whole cycle
              + sum over robot stages of (P_robot(u) - idle_robot) * t  what computing adds
              + tx_w * tx_s + rx_w * rx_s + listen_w * listen_s      the robot's radio
        edge  = sum over edge stages of P_edge(u) * t / batch        this request's batch share

    with P(u) = idle + (busy - idle) * u. Time and power must belong to the same device: a
    stage timed on this CPU is priced with this CPU's powers (catalog ``this-cpu``), never
    with a GPU's. Each device's own meter reads its part, so a wrong power figure of one
    device is learnt for that device (``EnergyCalibration.observe_power``), not for one kind of
    plan."""
    radio = radio or RadioPower()
    stages = list(stages)
    robot_j = robot.idle_w * max(latency_s, period_s)
    robot_j += sum(stage_joules(robot, edge, st) for st in stages if st.role == "robot")
    robot_j += radio.tx_w * tx_s + radio.rx_w * rx_s + radio.listen_w * listen_s
    edge_j = sum(stage_joules(robot, edge, st) for st in stages if st.role == "edge")
    return {"robot": robot_j, "edge": edge_j}


def stage_joules(robot: Device, edge: Device, st: StageSpend) -> float:
    """One stage's term of :func:`request_energy` (for per-stage breakdowns)."""
    if st.role == "robot":
        return dynamic_energy(robot, st.busy_s, st.utilisation)
    return stage_energy(edge, st.busy_s, st.utilisation) / st.batch


def actions_per_joule(actions: int, joules: float) -> float:
    return actions / joules if joules > 0 else float("inf")
