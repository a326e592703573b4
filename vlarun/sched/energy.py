"""Power and energy model (modelled, not metered, unless a meter in ``meters.py`` was read).

Power of a device running a stage lies between its idle and busy power by utilisation:
    P(v, d) = idle_d + (busy_d - idle_d) * u(v, d),     e(v, d) = P(v, d) * t(v, d)
Per inference (EcoVLA counts the whole control cycle, idle included, because a robot that
finishes early still waits for the next control period):
    E = sum over robot stages of (P - idle_robot) * t  +  idle_robot * cycle
      + sum over edge stages of P * t / batch           (a batched stage's energy is shared)
      + radio energy of every transfer the robot sends or receives
with cycle = max(T, control period). The edge's idle power between requests is not charged to
any one robot: it is shared infrastructure, and charging it would only add a constant.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlarun.sched.catalog import Device

ENERGY_SOURCE = "modelled"  # every output carries this label unless a meter was read


@dataclass(frozen=True)
class RadioPower:
    """Robot-side network interface power while sending and receiving, in watts.

    Defaults are an assumption (U): the order of magnitude of a Wi-Fi module's draw while
    active; override them with a measured figure for the robot's actual link.
    """

    tx_w: float = 1.5
    rx_w: float = 1.0

    def __post_init__(self) -> None:
        if self.tx_w < 0 or self.rx_w < 0:
            raise ValueError("radio power must be non-negative")


def stage_power(device: Device, utilisation: float) -> float:
    u = min(max(utilisation, 0.0), 1.0)
    return device.idle_w + (device.busy_w - device.idle_w) * u


def stage_energy(device: Device, seconds: float, utilisation: float) -> float:
    return stage_power(device, utilisation) * seconds


def dynamic_energy(device: Device, seconds: float, utilisation: float) -> float:
    """Energy above idle: what a stage adds on a device whose idle power is counted anyway."""
    return (stage_power(device, utilisation) - device.idle_w) * seconds


def actions_per_joule(actions: int, joules: float) -> float:
    return actions / joules if joules > 0 else float("inf")
