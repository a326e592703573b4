"""The world schema: per device, stage times measured against batch size, jitter with stalls,
power by state, and each accelerator setting's own effect on each stage's time.

A world file (JSON; every number carries a ``source``)::

    {"world": "published", "model": "openvla-7b", "about": "...",
     "devices": {
       "orin-agx-32gb": {
         "source": "...",
         "stages": {"vision":  {"batch": [1], "seconds": [0.0645], "source": "..."}, ...},
         "jitter": {"sigma": 0.015, "stall_p": 0.0, "stall_factor": 1.0, "source": "..."},
         "power":  {"busy_w": 10, "idle_w": 5, "tx_w": 1.5, "rx_w": 1.0, "listen_w": 0.5,
                    "source": "..."},
         "settings": [{"knob": "token_budget", "values": [1.0, 0.34],
                       "ratios": {"prefill": [1.0, 0.731], "decode": [1.0, 0.975]},
                       "source": "..."}]}}}

A stage's time at batch ``b`` is interpolated linearly between the measured batch sizes (past
the last point: extrapolated from the last two; with one point, ``b`` times it: no batching
gain is assumed where none was measured). A setting multiplies it by each of its knobs' ratios
(interpolated over the listed values, held at the end values beyond them; a stage a table does
not list keeps 1.0); a knob the device lists no table for is *undescribed*: it runs at full
time and the emulator counts it. Each execution is multiplied by ``exp(N(0, sigma))`` and, with
probability ``stall_p``, by ``stall_factor``. Power: ``busy_w`` while a stage runs, ``idle_w``
otherwise, the robot's radio ``tx_w`` / ``rx_w`` while moving bytes and ``listen_w`` while it
waits for the edge's stages.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORLDS_DIR = Path(__file__).with_name("worlds")
IDENTITY_VALUES = {
    "token_budget": 1.0,
    "layers_kept": 1.0,
    "cache_interval": 1,
    "early_exit_sigma": None,
    "weights": "native",
}


class WorldError(ValueError):
    """A world file that is not valid: the message names the file and the key."""


def _interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear through (xs, ys), xs ascending; held at the end values."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


@dataclass(frozen=True)
class StageCurve:
    """One stage's measured seconds at the batch sizes measured (ascending)."""

    batch: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.batch or len(self.batch) != len(self.seconds):
            raise WorldError("a stage needs as many seconds as batch sizes (at least one)")
        if list(self.batch) != sorted(set(self.batch)) or self.batch[0] < 1:
            raise WorldError(f"batch sizes must be ascending and >= 1, got {self.batch}")
        if any(not (s > 0 and math.isfinite(s)) for s in self.seconds):
            raise WorldError(f"stage seconds must be positive, got {self.seconds}")

    def at(self, batch: int) -> float:
        if len(self.batch) == 1:
            return self.seconds[0] * batch / self.batch[0]
        if batch > self.batch[-1]:
            (b0, b1), (s0, s1) = self.batch[-2:], self.seconds[-2:]
            return s1 + (batch - b1) * (s1 - s0) / (b1 - b0)
        return _interp(tuple(map(float, self.batch)), self.seconds, float(batch))


@dataclass(frozen=True)
class Jitter:
    sigma: float = 0.03
    stall_p: float = 0.0
    stall_factor: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        if not (0 <= self.sigma < 1 and 0 <= self.stall_p <= 1 and self.stall_factor >= 1):
            raise WorldError("jitter needs 0 <= sigma < 1, 0 <= stall_p <= 1, stall_factor >= 1")

    def factor(self, rng: random.Random) -> float:
        f = math.exp(rng.gauss(0.0, self.sigma))
        return f * self.stall_factor if rng.random() < self.stall_p else f


@dataclass(frozen=True)
class Power:
    busy_w: float
    idle_w: float
    tx_w: float = 1.5
    rx_w: float = 1.0
    listen_w: float = 0.5
    source: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.idle_w <= self.busy_w or min(self.tx_w, self.rx_w, self.listen_w) < 0:
            raise WorldError("power needs 0 <= idle_w <= busy_w and non-negative radio powers")


@dataclass(frozen=True)
class SettingTable:
    """What one knob does to each stage's time, measured at ``values``."""

    knob: str
    values: tuple[float, ...]
    ratios: dict[str, tuple[float, ...]]
    source: str = ""

    def __post_init__(self) -> None:
        if self.knob not in IDENTITY_VALUES:
            raise WorldError(f"unknown knob {self.knob!r}; knobs: {', '.join(IDENTITY_VALUES)}")
        if not self.values or any(len(r) != len(self.values) for r in self.ratios.values()):
            raise WorldError(f"{self.knob}: every stage needs one ratio per value")
        if any(r <= 0 for rs in self.ratios.values() for r in rs):
            raise WorldError(f"{self.knob}: ratios must be positive")

    def ratio(self, stage: str, value: Any) -> float:
        ys = self.ratios.get(stage)
        if ys is None:
            return 1.0
        order = sorted(range(len(self.values)), key=lambda i: self.values[i])
        xs = tuple(float(self.values[i]) for i in order)
        return _interp(xs, tuple(ys[i] for i in order), float(value))


@dataclass(frozen=True)
class DeviceWorld:
    """One device as the world has it."""

    id: str
    stages: dict[str, StageCurve]
    power: Power
    jitter: Jitter = field(default_factory=Jitter)
    settings: tuple[SettingTable, ...] = ()
    source: str = ""

    def stage_s(self, stage: str, batch: int = 1, knobs: dict | None = None) -> float:
        """Seconds of ``stage`` over ``batch`` requests under ``knobs`` (no jitter)."""
        curve = self.stages.get(stage)
        if curve is None:
            raise WorldError(
                f"the world has no stage {stage!r} on {self.id} (it has {', '.join(self.stages)})"
            )
        return curve.at(batch) * self.setting_ratio(stage, knobs)[0]

    def setting_ratio(self, stage: str, knobs: dict | None) -> tuple[float, tuple[str, ...]]:
        """(the product of the knobs' ratios for ``stage``, knobs this device has no table for)."""
        ratio, undescribed = 1.0, []
        tables = {t.knob: t for t in self.settings}
        for knob, value in (knobs or {}).items():
            if value == IDENTITY_VALUES.get(knob):
                continue
            table = tables.get(knob)
            if table is None or not isinstance(value, int | float):
                undescribed.append(knob)
                continue
            ratio *= table.ratio(stage, value)
        return ratio, tuple(undescribed)


@dataclass(frozen=True)
class World:
    """Devices running one model, as they really behave (for emulation and its meter)."""

    name: str
    model: str
    devices: dict[str, DeviceWorld]
    about: str = ""
    path: str = ""

    @property
    def tests_only_the_link(self) -> bool:
        """True for the catalog world: its truth is the scheduler's own model."""
        return self.name == "catalog"

    def device(self, device_id: str) -> DeviceWorld:
        found = self.devices.get(device_id)
        if found is None:
            raise WorldError(
                f"world {self.name!r} has no device {device_id!r} "
                f"(it has {', '.join(self.devices)})"
            )
        return found

    def label(self) -> str:
        if self.tests_only_the_link:
            return "catalog (the scheduler's own model: tests queueing and the link only)"
        return f"{self.name} ({self.path})" if self.path else self.name


def parse_world(data: dict, where: str = "world") -> World:
    """A World from its JSON object; WorldError names the file and the key."""

    def need(obj: dict, key: str, at: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise WorldError(f"{where}: {at} has no {key!r}")
        return obj[key]

    try:
        devices = {}
        for dev_id, d in need(data, "devices", "the file").items():
            at = f"devices.{dev_id}"
            stages = {
                name: StageCurve(
                    tuple(int(b) for b in need(s, "batch", f"{at}.stages.{name}")),
                    tuple(float(x) for x in need(s, "seconds", f"{at}.stages.{name}")),
                    s.get("source", ""),
                )
                for name, s in need(d, "stages", at).items()
            }
            p = need(d, "power", at)
            power = Power(
                float(need(p, "busy_w", f"{at}.power")),
                float(need(p, "idle_w", f"{at}.power")),
                float(p.get("tx_w", 1.5)),
                float(p.get("rx_w", 1.0)),
                float(p.get("listen_w", 0.5)),
                p.get("source", ""),
            )
            j = d.get("jitter", {})
            jitter = Jitter(
                float(j.get("sigma", 0.03)),
                float(j.get("stall_p", 0.0)),
                float(j.get("stall_factor", 1.0)),
                j.get("source", ""),
            )
            settings = tuple(
                SettingTable(
                    need(t, "knob", f"{at}.settings"),
                    tuple(float(v) for v in need(t, "values", f"{at}.settings")),
                    {
                        k: tuple(float(r) for r in v)
                        for k, v in need(t, "ratios", f"{at}.settings").items()
                    },
                    t.get("source", ""),
                )
                for t in d.get("settings", [])
            )
            devices[dev_id] = DeviceWorld(
                dev_id, stages, power, jitter, settings, d.get("source", "")
            )
        return World(
            need(data, "world", "the file"),
            need(data, "model", "the file"),
            devices,
            data.get("about", ""),
            where,
        )
    except WorldError as e:
        if str(e).startswith(where):
            raise
        raise WorldError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise WorldError(f"{where}: {e}") from None
