"""Emulated devices: this machine's stages take the time the real model's take on a named device.

Co-inference can only show its worth where the robot is slow and the edge fast for the model at
hand (an Orin running OpenVLA-7B beside an RTX 4090), and neither is here: a 2-core CPU plays
both. So each side runs the small model for real (real actions, real tensors on the real wire)
and then waits until the stage has taken what the *real* model's stage takes on the *emulated*
device: the catalog's roofline of ``model``'s stage work on ``device`` (at the batch it ran in),
times a multiplicative jitter drawn per execution, divided by ``time_scale`` (to fit a long
matrix into hours, every emulated time and deadline may be scaled down together; bandwidths go
up by the same factor). A stage whose own compute already took longer than its target is an
*emulation violation*: it is counted, and a run with more than 1% of them says nothing about the
emulated device (the CPU was too slow or too busy for the scale chosen).

Both the robot agent (``AgentConfig.robot`` / ``.edge``, each a ``StandIn``) and the edge
server (``ServerConfig.emulate``) take an ``Emulation``; the robot's stands in for the robot
device, the edge's for the edge one.
Packets are padded to the real model's sizes (``pad_bytes``: a zero frame the wire drops on
receipt), so the link moves the real bytes; with a ``time_scale`` the bench multiplies every
bandwidth by it too, so a transfer keeps its share of the scaled deadline.
Energy stays the modelled account priced on the emulated devices, labelled "modelled".
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from dataclasses import dataclass, field

from vlarun.sched.catalog import Device, get_device

# Share of executions allowed to overrun their target before a run is invalid.
MAX_VIOLATION_SHARE = 0.01


@dataclass(frozen=True)
class Emulation:
    """Which device this side stands for, running which model's stages.

    model: a preset with the real shape (``openvla-7b``, ``pi0``, ...): its stage work is
        costed, never run; the policy actually running must have the same stage names.
    device: a catalog id (``orin-agx-32gb``, ``rtx4090``, ...).
    dtype: the dtype the emulated device runs the model in.
    time_scale: every emulated time is divided by this (>= 1 speeds the run up).
    jitter: sigma of the lognormal factor each execution's target is multiplied by under the
        ``catalog`` world (other worlds carry their own jitter and stalls; 0 = none).
    seed: seeds the jitter, so two runs draw the same factors.
    world: where the emulated device's truth comes from (``vlarun.world``): ``catalog`` (the
        scheduler's own cost model: tests queueing and the link only), ``published``,
        ``adversarial`` or a world file. The scheduler never reads it.
    """

    model: str
    device: str
    dtype: str = "bfloat16"
    time_scale: float = 1.0
    jitter: float = 0.03
    seed: int = 0
    world: str = "catalog"

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")

    @classmethod
    def parse(
        cls, spec: str, time_scale: float = 1.0, seed: int = 0, world: str = "catalog"
    ) -> Emulation:
        """``MODEL:DEVICE`` (e.g. ``openvla-7b:orin-agx-32gb``)."""
        model, sep, device = spec.partition(":")
        if not sep or not model or not device:
            raise ValueError(f"emulation takes MODEL:DEVICE, got {spec!r}")
        return cls(model, device, time_scale=time_scale, seed=seed, world=world)


@dataclass(frozen=True)
class StandIn:
    """What one side's computer stands for in a run: the one typed model of every stand-in.

      StandIn()                               this host, as it is
      StandIn(device="orin-agx-32gb")         a catalog device: this host's measured times are
                                              converted to it for costs and energy; nothing waits
      StandIn(slowdown=4.0)                   a computer 4x slower than this host: each local
                                              stage sleeps the difference (the robot's side only)
      StandIn.emulating(Emulation(...))       an emulated device: each stage padded to the real
                                              model's time on it (``StageEmulator``)

    One at a time: a slowdown sleeps on this CPU's clock while a named device converts this
    CPU's times, so the two together would count the same slowness twice."""

    device: str = "this-cpu"
    slowdown: float = 1.0
    emulation: Emulation | None = None

    def __post_init__(self) -> None:
        if not self.slowdown >= 1:
            raise ValueError(f"a stand-in's slowdown must be >= 1, got {self.slowdown}")
        if self.slowdown > 1 and (self.device != "this-cpu" or self.emulation is not None):
            raise ValueError(
                f"a slowdown ({self.slowdown:g}x) stands in for a slower computer by sleeping on "
                f"this CPU; a named device ({self.device}) or an emulation converts or pads its "
                "times: use one"
            )
        if self.emulation is not None and self.device != self.emulation.device:
            raise ValueError(
                f"the stand-in's device ({self.device}) is not the one it emulates "
                f"({self.emulation.device}): use StandIn.emulating(emulation)"
            )

    @classmethod
    def emulating(cls, emulation: Emulation | None, device: str = "this-cpu") -> StandIn:
        """``emulation``'s device, emulated; without one, ``device`` as a catalog stand-in."""
        if emulation is None:
            return cls(device=device)
        return cls(device=emulation.device, emulation=emulation)


def emulated_device(emulation: Emulation) -> Device:
    """The catalog device as the emulated run sees it: every rate ``time_scale`` times higher
    (so the cost model predicts the scaled times the emulation pads to), memory and power as
    they are (energy then scales with time, and every ratio between plans is unchanged)."""
    dev = get_device(emulation.device)
    s = emulation.time_scale
    return dataclasses.replace(
        dev,
        bf16_tflops=dev.bf16_tflops * s,
        int8_tops=dev.int8_tops * s,
        fp32_tflops=dev.fp32_tflops * s,
        mem_bw_gbs=dev.mem_bw_gbs * s,
        layer_overhead_ms=dev.layer_overhead_ms / s,
    )


@dataclass
class StageEmulator:
    """Pads stage executions to their emulated targets and counts what could not be padded."""

    emulation: Emulation
    targets: dict[str, object]  # stage name -> StageWork of the real model (packet sizes)
    works: tuple = ()  # every stage's StageWork, in order
    world: object = None  # vlarun.world.World: the truth the stages are padded to
    device: object = None  # its DeviceWorld for this side's device
    # knob -> executions that ran under it while the world has no table for it (full time)
    undescribed: dict = field(default_factory=dict)
    # stage -> [executions, violations, worst overrun s]; the totals below are its sums
    by_stage: dict = field(default_factory=dict)
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def build(cls, emulation: Emulation, stages: tuple[str, ...] = ()) -> StageEmulator:
        """Cost ``emulation.model``'s stages; every name in ``stages`` (default: all of them)
        must be one of them."""
        from vlarun.models.presets import get_preset
        from vlarun.sched.cost import stage_works

        works = {w.name: w for w in stage_works(get_preset(emulation.model))}
        missing = [s for s in stages if s not in works]
        if missing:
            raise ValueError(
                f"cannot emulate {emulation.model}: it has no stage {missing} "
                f"(its stages: {', '.join(works)}); run a policy of the same family"
            )
        get_device(emulation.device)  # an unknown id fails here, listing the valid ones
        from vlarun.world import load_world
        from vlarun.world.model import Jitter

        world = load_world(emulation.world, emulation.model, (emulation.device,))
        device = world.device(emulation.device)
        if world.tests_only_the_link:  # the catalog world keeps the emulation's own jitter
            device = dataclasses.replace(device, jitter=Jitter(emulation.jitter))
        emu = cls(
            emulation,
            {s: works[s] for s in stages or tuple(works)},
            tuple(works.values()),
            world=world,
            device=device,
        )
        emu._rng.seed(emulation.seed)
        return emu

    def target_s(self, stage: str, batch: int = 1, knobs: dict | None = None) -> float:
        """The emulated device's time for ``stage`` over ``batch`` requests (no jitter), under
        the accelerator setting ``knobs`` (the plan space's knob map, ``AccelSetting.knobs``;
        None: full compute), as the world has it, divided by the time scale."""
        if stage not in self.targets:
            raise ValueError(
                f"cannot emulate stage {stage!r}: {self.emulation.model} has "
                f"{', '.join(self.targets)}; run a policy of the same family"
            )
        return self.device.stage_s(stage, batch, knobs) / self.emulation.time_scale

    def pad(self, stage: str, started: float, batch: int = 1, knobs: dict | None = None) -> float:
        """Sleep until ``stage`` (begun at ``perf_counter`` time ``started``) has taken its
        target (under the setting ``knobs``); return the seconds it took in all."""
        with self._lock:
            factor = self.device.jitter.factor(self._rng)
            for knob in self.device.setting_ratio(stage, knobs)[1]:
                self.undescribed[knob] = self.undescribed.get(knob, 0) + 1
        target = self.target_s(stage, batch, knobs) * factor
        own = time.perf_counter() - started
        with self._lock:
            mine = self.by_stage.setdefault(stage, [0, 0, 0.0])
            mine[0] += 1
            if own > target:
                mine[1] += 1
                mine[2] = max(mine[2], own - target)
        if own < target:
            time.sleep(target - own)
        return time.perf_counter() - started

    def clear_counts(self) -> None:
        """Forget the executions and violations counted so far (a warm-up's, run while other
        processes start beside it, are not the run's)."""
        with self._lock:
            self.by_stage, self.undescribed = {}, {}

    @property
    def executions(self) -> int:
        return sum(n for n, _, _ in self.by_stage.values())

    @property
    def violations(self) -> int:
        return sum(v for _, v, _ in self.by_stage.values())

    def pad_bytes(self, stages: tuple[str, ...], direction: str, nbytes: int) -> int:
        """Zero bytes to add to a packet of ``nbytes`` so the link carries what the real model's
        would: a request for ``stages`` carries its first stage's input packet ("in"), the
        answer the last stage's output ("out"). 0 where the small model's packet is larger."""
        if direction not in ("in", "out"):
            raise ValueError(f"direction is 'in' or 'out', got {direction!r}")
        stage = stages[0] if direction == "in" else stages[-1]
        work = self.targets.get(stage)
        if work is None:
            raise ValueError(
                f"cannot emulate stage {stage!r}: {self.emulation.model} has "
                f"{', '.join(self.targets)}"
            )
        real = work.in_bytes if direction == "in" else work.out_bytes
        return max(int(real) - int(nbytes), 0)

    def report(self) -> dict:
        # which stage could not be padded: its own compute against its target
        stages = {
            s: {"executions": n, "violations": v, "worst_overrun_ms": w * 1e3}
            for s, (n, v, w) in self.by_stage.items()
        }
        return {
            "emulated": f"{self.emulation.model} on {self.emulation.device}",
            "world": self.world.label(),
            "undescribed_settings": dict(self.undescribed),
            "time_scale": self.emulation.time_scale,
            **merge_reports([{"by_stage": stages}]),
        }


def merge_reports(reports: list[dict]) -> dict:
    """Counts of several emulators (``report()`` or its counts) as one: executions and
    violations summed, per stage too, the worst overrun the worst of all, and whether the
    whole is valid (at most ``MAX_VIOLATION_SHARE`` overran). A report without ``by_stage``
    (an edge's counters over a run) adds its totals only."""
    stages: dict[str, dict] = {}
    runs = bad = 0
    worst = 0.0
    for r in reports:
        per = r.get("by_stage")
        if per is None:
            per = {}
            runs += int(r["executions"])
            bad += int(r["emulation_violations"])
            worst = max(worst, float(r.get("worst_overrun_ms", 0.0)))
        for name, x in per.items():
            t = stages.setdefault(name, {"executions": 0, "violations": 0, "worst_overrun_ms": 0.0})
            t["executions"] += int(x["executions"])
            t["violations"] += int(x["violations"])
            t["worst_overrun_ms"] = max(t["worst_overrun_ms"], float(x["worst_overrun_ms"]))
    runs += sum(t["executions"] for t in stages.values())
    bad += sum(t["violations"] for t in stages.values())
    worst = max([worst, *(t["worst_overrun_ms"] for t in stages.values())])
    share = bad / runs if runs else 0.0
    return {
        "executions": runs,
        "emulation_violations": bad,
        "violation_share": share,
        "worst_overrun_ms": worst,
        "by_stage": stages,
        "valid": share <= MAX_VIOLATION_SHARE,
    }


def world_meter(robot: StandIn, edge: StandIn) -> tuple[str, dict, object] | None:
    """(world name, role -> Device with the world's powers, RadioPower) for the two sides'
    stand-ins emulated under a world other than the catalog; None otherwise (the catalog's
    powers are the scheduler's own: today's modelled account prices them).

    Each device keeps its catalog entry with the world's ``busy_w`` / ``idle_w``; stages are
    then priced at utilisation 1 (the world's busy power is what the device draws running
    them) by the one energy account, ``sched.energy.request_energy``."""
    emulation = robot.emulation
    if emulation is None or emulation.world == "catalog":
        return None
    from vlarun.world import load_world
    from vlarun.world.truth import world_meter as meter_of

    world = load_world(emulation.world, emulation.model, (robot.device, edge.device))
    devices, radio = meter_of(
        world, {"robot": get_device(robot.device), "edge": get_device(edge.device)}
    )
    return world.name, devices, radio
