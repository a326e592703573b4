"""The ``catalog`` world: the scheduler's own cost model taken as the truth.

Stage times are the catalog roofline of the real model's stage work on each device (at the
batch it ran in), settings are applied through the plan space's own transform, jitter is 3%
lognormal with no stalls, powers are the catalog's. Every prediction the scheduler makes is
right by construction here, so a run under this world tests queueing, the link, fallbacks and
the protocol, never the cost model or the claim that placement saves energy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlarun.models.presets import get_preset
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import at_batch, roofline, stage_works
from vlarun.sched.energy import RadioPower
from vlarun.sched.plans import Setting, apply_setting
from vlarun.stages.families import Workload
from vlarun.world.model import DeviceWorld, Jitter, Power, StageCurve, World

CATALOG_JITTER = Jitter(0.03, 0.0, 1.0, "the emulator's jitter before worlds: 3% lognormal")


@dataclass(frozen=True)
class CatalogDevice(DeviceWorld):
    """A device whose stage time is the roofline of the (setting-transformed) stage work."""

    model: str = ""
    dtype: str = "bfloat16"
    _under: dict = field(default_factory=dict, compare=False, repr=False)

    def stage_s(self, stage: str, batch: int = 1, knobs: dict | None = None) -> float:
        works = self._works(knobs)
        if stage not in works:
            return super().stage_s(stage, batch, knobs)  # the error naming the stages
        return roofline(at_batch(works[stage], batch), get_device(self.id), self.dtype).seconds

    def setting_ratio(self, stage: str, knobs: dict | None) -> tuple[float, tuple[str, ...]]:
        return self.stage_s(stage, 1, knobs) / self.stage_s(stage, 1, None), ()

    def _works(self, knobs: dict | None) -> dict:
        key = tuple(sorted((knobs or {}).items()))
        if key not in self._under:
            cfg = get_preset(self.model)
            works = stage_works(cfg)
            if key:
                works = apply_setting(works, cfg, Workload(), Setting(key, None))
            self._under[key] = {w.name: w for w in works}
        return self._under[key]


def catalog_world(model: str, devices: tuple[str, ...], dtype: str = "bfloat16") -> World:
    """The catalog world of ``model`` on ``devices`` (catalog ids)."""
    works = stage_works(get_preset(model))
    radio = RadioPower()
    out = {}
    for dev_id in devices:
        dev = get_device(dev_id)
        curves = {
            w.name: StageCurve((1,), (roofline(w, dev, dtype).seconds,), "catalog roofline")
            for w in works
        }
        power = Power(dev.busy_w, dev.idle_w, radio.tx_w, radio.rx_w, 0.0, "the catalog's")
        out[dev_id] = CatalogDevice(
            dev_id, curves, power, CATALOG_JITTER, (), "catalog", model=model, dtype=dtype
        )
        out[dev_id]._works(None)  # costed now, not inside the first stage it pads
    return World("catalog", model, out, __doc__.split("\n\n")[1].replace("\n", " "))
