"""The fleet simulator's ground truth: per-stage times recorded on one host by `vlarun
profile`, carried to a simulated model shape on a target device.

A recorded stage s becomes, on a device,

    t = sample_s x roofline(stage s of the shape, device) / roofline(recorded s, host) x c

with ``sample_s`` resampled from the recording (the jitter keeps its measured shape) and ``c``
one factor per device, calibrated so that the median total equals the catalog's roofline total
(fleet.py's docstring says why). The recording is a `vlarun profile` file that carries the
host's measured peaks; ``fleet_samples.json`` holds the tiny preset of each family.

``WorldTruth`` is the other truth: a world file (``vlarun.world``), the same one an emulated
run of real processes pads its stages to (``vlarun fleet --world``). Stage times are the
world's curves under each setting's own ratios, with its jitter and stalls; energy is metered
with the world's powers (stages at busy power), never the catalog's, so a power the scheduler
has wrong is not priced its way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlarun.sched.catalog import Device, this_cpu_device
from vlarun.sched.cost import StageWork, roofline
from vlarun.sched.energy import RadioPower

SAMPLES_FILE = Path(__file__).with_name("fleet_samples.json")
# The recorded preset that stands in for each real shape: same family, same stage names.
RECORDED_AS = {
    "openvla-7b": "tiny-openvla",
    "openvla-oft": "tiny-openvla-oft",
    "cogact": "tiny-cogact",
    "pi0": "tiny-pi0",
    "pi05": "tiny-pi0",
    "smolvla": "tiny-smolvla",
    # No tiny RDT runs (vlarun builds no executable RDT): CogACT's DiT-headed chain has the
    # same stage names, and only each stage's jitter shape is taken from it.
    "rdt-1b": "tiny-cogact",
}


@dataclass(frozen=True)
class StageSamples:
    """Per-stage compute seconds of one model shape as `vlarun profile` recorded them on one
    host (warm-up excluded, batch 1). Invariant: every stage has at least one sample, all > 0."""

    model: str
    dtype: str
    host: Device  # the recording machine, priced with its measured peaks
    threads: int
    when: str
    seconds: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        bad = [s for s, x in self.seconds.items() if len(x) == 0 or np.any(x <= 0)]
        if not self.seconds or bad:
            raise ValueError(f"{self.model}: stages without positive samples: {bad}")

    @property
    def source(self) -> str:
        return f"{self.model} on {self.host.id} ({self.threads} threads, {self.when})"


def load_samples(model: str, path: str | Path | None = None) -> StageSamples:
    """The recorded samples that stand in for ``model``: its own if it was recorded, else
    those of its ``RECORDED_AS`` stand-in. The file must carry the host's peaks."""
    data = json.loads(Path(path or SAMPLES_FILE).read_text())
    recorded = sorted({e["model"] for e in data["entries"]})
    name = model if model in recorded else RECORDED_AS.get(model)
    if name not in recorded:
        raise ValueError(
            f"no recorded samples for {model!r}: recorded {recorded}, stand-ins {RECORDED_AS}"
        )
    if "device_peaks" not in data:
        raise ValueError(f"{path}: no host peaks; record it with `vlarun profile`")
    rows = [e for e in data["entries"] if e["model"] == name and e["batch"] == 1]
    return StageSamples(
        name,
        rows[0]["dtype"],
        this_cpu_device(data["device_peaks"]),
        data["threads"],
        data["when"],
        {e["stage"]: np.asarray(e["samples"], dtype=float) * 1e-3 for e in rows},
    )


@dataclass(frozen=True)
class Truth:
    """What the world draws stage times from: the recorded samples, the host roofline of each
    recorded stage, and the calibrated factor ``c`` of each role (see the module docstring)."""

    samples: StageSamples
    host_s: dict[str, float]  # roofline seconds of each recorded stage on the host
    calib: dict[str, float]  # role -> c

    @property
    def label(self) -> str:
        return (
            f"measured: per-stage samples of {self.samples.source}, resampled; scaled to the "
            "simulated shape on each device by the catalog roofline ratio per stage and one "
            "factor per device (median total = roofline total); link jitter lognormal (not "
            "measured)"
        )


def make_truth(samples: StageSamples, base: tuple[StageWork, ...], devices: dict) -> Truth:
    """Calibrate ``c`` per role so that the identity works ``base`` of the simulated shape have
    a median total equal to their roofline total on that role's device."""
    from vlarun.models.presets import get_preset
    from vlarun.sched.cost import stage_works
    from vlarun.stages.families import Workload

    recorded = stage_works(get_preset(samples.model), Workload(dtype=samples.dtype))
    host_s = {w.name: float(roofline(w, samples.host, samples.dtype).seconds) for w in recorded}
    missing = [w.name for w in base if w.name not in samples.seconds or w.name not in host_s]
    if missing:
        raise ValueError(f"stages {missing} have no recorded samples in {samples.model}")
    calib = {}
    for role, dev in devices.items():
        roof = {w.name: roofline(w, dev).seconds for w in base}
        scaled = sum(np.median(samples.seconds[s]) * t / host_s[s] for s, t in roof.items())
        calib[role] = float(sum(roof.values()) / scaled)
    return Truth(samples, host_s, calib)


@dataclass(frozen=True)
class WorldTruth:
    """A world file as the fleet's truth: ``devices`` (role -> the world's device), and what
    the meter prices with: ``meter`` (role -> the catalog device with the world's busy / idle
    power) and ``radio`` (the robot's radio powers in the world, listening included)."""

    world: object  # vlarun.world.model.World
    devices: dict
    meter: dict[str, Device]
    radio: RadioPower

    @property
    def label(self) -> str:
        return (
            f"world {self.world.label()}: its stage curves, each setting's own ratios, "
            "its jitter and stalls; energy metered with its powers (modelled, no meter)"
        )

    @staticmethod
    def draw(rng: np.random.Generator, works) -> list[tuple[float, float]]:
        """Per stage a standard normal and a uniform, drawn before anything is placed (the
        jitter and the stall of whichever device runs it), so the stream is consumed alike
        whatever runs where."""
        return [(float(rng.standard_normal()), float(rng.random())) for _ in works]

    def seconds(self, name: str, role: str, draw: tuple[float, float], knobs: dict) -> float:
        dev = self.devices[role]
        z, u = draw
        j = dev.jitter
        factor = float(np.exp(j.sigma * z)) * (j.stall_factor if u < j.stall_p else 1.0)
        return dev.stage_s(name, 1, knobs) * factor


def world_meter(world, devices: dict[str, Device]) -> tuple[dict[str, Device], RadioPower]:
    """What a world's meter prices with, for the roles' catalog ``devices``: each device its
    catalog entry with the world's ``busy_w`` / ``idle_w`` (stages priced at utilisation 1:
    the world's busy power is what the device draws running them), and the robot's radio
    powers in the world, listening included. The emulated runtime's meter
    (``runtime.emulate.world_meter``) and the fleet's (``world_truth``) are this one."""
    import dataclasses

    meter = {}
    for role, d in devices.items():
        power = world.device(d.id).power
        meter[role] = dataclasses.replace(d, busy_w=power.busy_w, idle_w=power.idle_w)
    p = world.device(devices["robot"].id).power
    return meter, RadioPower(p.tx_w, p.rx_w, p.listen_w)


def world_truth(spec: str, model: str, devices: dict[str, Device]) -> WorldTruth:
    """The world ``spec`` (``catalog``, a shipped name or a file) for ``model`` on the roles'
    catalog ``devices``; WorldError names what is missing."""
    from vlarun.world.load import load_world

    world = load_world(spec, model, tuple(d.id for d in devices.values()))
    found = {role: world.device(d.id) for role, d in devices.items()}
    meter, radio = world_meter(world, devices)
    return WorldTruth(world, found, meter, radio)
