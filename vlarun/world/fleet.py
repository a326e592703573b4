"""Fleet simulation: N robots share one edge through a link whose bandwidth may drop mid-run,
while other tenants load the edge (light / medium / heavy). Device-Only, Edge-Only, Fixed Split
and vlarun's scheduler (over placements; jointly over placements and accelerator settings) are
compared on actions per joule and SLO satisfaction.

The simulator is the "world" and keeps its truth from the scheduler:
- stage times are measured ones. Each draw resamples the per-stage times `vlarun profile`
  recorded on one host (``fleet_samples.json``: the tiny preset of each family on a 2-core CPU;
  a 7B forward on that CPU takes minutes), so the jitter has the measured shape, not a
  lognormal one. A recorded stage s is carried to the simulated shape on a target device by

      t = sample_s x roofline(stage s of the shape, device) / roofline(recorded s, host) x c

  The roofline ratio is what the catalog knows about moving a stage to another shape and device.
  ``c`` is one factor per device (for a given shape), calibrated so that the median total of the
  truth equals the catalog's roofline total there: the host, running tiny models on two cores,
  sits far from its roofline, and carrying that absolute inefficiency to an Orin or a 4090
  would be a guess. What the measurement contributes is the jitter shape and each stage's
  departure from the roofline relative to the others: a per-stage bias the scheduler's prior
  does not know. The scheduler sees only its own predictions and the times it observes after
  each request, from which it calibrates (stage factors, placement residual, link EWMA).
- background edge load: other tenants time-share the edge at the load level's utilisation
  rho. A robot stage of t seconds is stretched by the background work that arrives while it
  runs (Poisson arrivals, exponential sizes, sampled as a busy period: t / (1 - rho) on
  average). The edge reports rho (edge workload sensing); the individual jobs stay hidden.
- the link: bandwidth trace (``bw_before`` -> ``bw_after`` at ``drop_at``, or a trace file
  repeated, ``--trace``), per-transfer lognormal jitter (NOT measured); each robot has its own
  link, and its link monitor's probes of an idle link (every 0.25 s the link carried nothing,
  each at its moment's bandwidth, folded in before the next decision) as the runtime's
  monitor does.
- ``--world``: a world file is the truth instead of the samples (its stage curves under each
  setting's own ratios, its jitter and stalls, its powers for the meter), the same file an
  emulated run of real processes pads its stages to; the scheduler plans from its catalog.
- the clock: the scheduler's calibration and the links forget by simulated time (a run is
  reproducible: the same config gives the same records).
- admission: the edge refuses an edge segment it cannot finish before the request's deadline,
  as the runtime's edge server does (the same model over what runs and waits when it arrives;
  here it knows the true service times, not what will arrive later); the robot then
  runs that segment and everything after it itself, as the robot agent does: a fallback.
- the edge's queues: the one queue model (``sched.queue_model``), the worker's own rule: the
  stage queue whose oldest request is due first, earliest deadline first within it, never
  preempted, never idle while a request waits. The run is discrete-event: robots release
  requests every period, a request runs until its next edge segment reaches the edge, and the
  scheduler plans from what it has learnt of the requests finished by then.
Energy is modelled from the true times with the catalog's power figures (or the world's).
Simplifications: the recorded samples are of batch 1, so the simulated edge runs one request
per batch and vlarun plans with batching off here; a robot's own requests never wait for each
other on the robot.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Generator, Hashable
from dataclasses import dataclass, field, replace

import numpy as np

from vlarun.config import items, opt
from vlarun.sched import strategy
from vlarun.sched.bookings import Booking, Slot
from vlarun.sched.calibration import Calibration
from vlarun.sched.catalog import Device
from vlarun.sched.contract import ExecutionPlan, Outcome, StageOutcome
from vlarun.sched.cost import StageWork, roofline
from vlarun.sched.energy import RadioPower, StageSpend, request_energy_by_device
from vlarun.sched.execution import give_up_at, segments
from vlarun.sched.link import Link
from vlarun.sched.plans import PlanSpace
from vlarun.sched.predictor import DeviceState
from vlarun.sched.queue_model import (
    THIS,
    EdgeQueue,
    Ledger,
    Pending,
    StageTimes,
    finish,
    plan_bookings,
    play,
    reservations,
)
from vlarun.sched.records import summarise as summarise_records
from vlarun.sched.scheduler import Scheduler
from vlarun.sched.settings_table import IDENTITY
from vlarun.sched.strategy import STRATEGIES
from vlarun.world.traces import bandwidth_at, load_trace
from vlarun.world.truth import Truth, WorldTruth, load_samples, make_truth, world_truth

# The strategies of the co-inference matrix, real processes and simulator alike.
# Background edge utilisation by other tenants: our definition (the paper names the levels
# but gives no numbers).
LOADS = {"none": 0.0, "light": 0.2, "medium": 0.5, "heavy": 0.8}
BACKGROUND_JOB_S = 0.02  # mean service time of one background job
# EcoVLA's five models (its section 7.1); openvla-oft and cogact run with --matrix-models.
MATRIX_MODELS = ("openvla-7b", "pi0", "pi05", "smolvla", "rdt-1b")


# Decisions between two tried never-run plans (the runtime's ``costview.EXPLORE_EVERY``): a
# catalog that prices the robot 1.4x too slow is corrected by the first robot plan tried.
EXPLORE_EVERY = 10
WARM_RUNS = 3  # warm-up runs of every stage before the first request (``World.warm_up``)


@dataclass(frozen=True)
class FleetConfig:
    """N robots, one edge, a bandwidth drop and background edge load; the matrix strategies
    compared on actions per joule (modelled energy) and SLO satisfaction. ``--matrix`` runs
    every (model, bandwidth, robots, strategy) cell instead (bench/fleet_matrix.py)."""

    model: str = opt("openvla-7b", "model preset")
    chunk: int = opt(20, "actions executed per inference")
    # The flags are the names every command gives these (--robot-device / --edge-device, the
    # link --link-mbps / --link-rtt-ms); the fields keep theirs, which the matrix, the studies
    # and recorded results read.
    robot: str = opt(
        "orin-agx-32gb", "robot's catalog device id", flag="--robot-device", deprecated=("--robot",)
    )
    edge: str = opt(
        "rtx4090", "edge's catalog device id", flag="--edge-device", deprecated=("--edge",)
    )
    robots: int = opt(2, "robots sharing the edge")
    slo_hz: float = opt(20.0, "action rate to sustain (T_SLO = chunk / slo_hz)")
    duration_s: float = opt(120.0, "simulated seconds")
    bw_before: float = opt(
        200.0,
        "link bandwidth (before the drop), Mbit/s",
        flag="--link-mbps",
        deprecated=("--bw-before",),
    )
    bw_after: float = opt(
        50.0,
        "link bandwidth after the drop, Mbit/s",
        flag="--link-mbps-after",
        deprecated=("--bw-after",),
    )
    trace: str | None = opt(
        None,
        "instead of the drop: a bandwidth trace (wifi-drive | steps | FILE, world/traces.py)"
        ", repeated for --duration-s",
    )
    drop_at: float = opt(0.5, "when the bandwidth drops, as a fraction of the run")
    rtt_ms: float = opt(
        5.0, "link round-trip time, ms", flag="--link-rtt-ms", deprecated=("--rtt-ms",)
    )
    loads: tuple[str, ...] = opt(("light", "medium", "heavy"), "background edge load levels")
    link_jitter_sigma: float = opt(0.05, "per-transfer jitter of the link (lognormal sigma)")
    samples: str | None = opt(
        None, "recorded per-stage samples (a `vlarun profile` file; default: fleet_samples.json)"
    )
    world: str | None = opt(
        None,
        "instead of the samples: a world (catalog | published | adversarial | FILE) as "
        "the truth: its stage curves, settings' own ratios, jitter, stalls and powers (the "
        "scheduler still plans from its catalog)",
    )
    settings: str | None = opt(
        None,
        "accuracy-cost table of the joint plan space (settings.json format; default: the "
        "shipped one)",
    )
    settings_proxy: bool = opt(
        False,
        "carry the table's accuracy costs, measured on the shipped MT10 policies, to "
        "the simulated model as a proxy (as `bench coinfer --emulate` does; notes say so)",
    )
    guard: float = opt(0.9, "share of T_SLO vlarun plans to (headroom for jitter)")
    on_time: float = opt(
        0.99, "the share of requests vlarun's planners hold to the deadline (their miss budget)"
    )
    accuracy_floor: float = opt(
        0.95,
        "the floor the 95% lower bound of a setting's measured relative success must "
        "clear (settings with an unmeasured cost are never admitted)",
    )
    unmeasured_accelerators: bool = opt(
        False, "drop the accuracy floor: allow settings whose accuracy cost is unmeasured"
    )
    seed: int = opt(0, "random seed of the world")
    powers: str = opt(
        "",
        "scale catalog powers, ROLE.TERM=FACTOR,... with TERM idle|busy for robot and edge, "
        "tx|rx for radio (e.g. edge.busy=2): one variant of the power sweep",
    )
    matrix: bool = opt(False, "run the condition matrix (models x bandwidths x robots)")
    hindsight: bool = opt(
        False,
        "instead: every strategy and every static plan on the same requests, per "
        "deadline and seed; joint over the best static plan in hindsight and its share of the "
        "per-request oracle (bench/fleet_study.py)",
    )
    deadlines: tuple[float, ...] = opt(
        (0.6, 0.8, 1.0, 1.2, 1.4),
        "--hindsight: deadlines as multiples of Device-Only's median time in the world",
    )
    seeds: int = opt(3, "--hindsight: seeds (repeats) per deadline, from --seed")
    world_sweep: int = opt(
        0,
        "instead: draw this many worlds from the grid around the catalog (world.derive.GRID, "
        "seed --seed) and run the hindsight cells in each, steady link and wifi-drive "
        "(bench/fleet_grid.py)",
    )
    sweep_robots: tuple[int, ...] = opt((1, 4), "--world-sweep: robot counts")
    sweep_workers: int = opt(1, "--world-sweep: worker processes")
    power_sweep: bool = opt(
        False,
        "run the matrix at every power x0.5 and x2 (bench/power_sweep.py): which "
        "rankings of the strategies survive",
    )
    matrix_models: tuple[str, ...] = opt(MATRIX_MODELS, "models of the matrix")
    matrix_bandwidths: tuple[str, ...] = opt(
        ("200", "50", "10", "200-50"), "bandwidths of the matrix, Mbit/s (200-50: a drop)"
    )
    matrix_robots: tuple[int, ...] = opt((1, 4, 16, 32), "robot counts of the matrix")
    matrix_load: str = opt("medium", "background edge load of the matrix")
    matrix_duration_s: float = opt(60.0, "simulated seconds per matrix cell")
    compare_with: str | None = opt(
        None,
        "a `vlarun bench coinfer --matrix --json` result: per cell of its first load "
        "level and each strategy, actions/J over Fixed Split here and there, and the difference",
    )
    out: str | None = opt(None, "write the JSON result here")
    plot: str | None = opt(None, "write a PNG plot here")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if not 0 < self.on_time <= 1:
            raise ValueError(f"--on-time must lie in (0, 1], got {self.on_time}")
        if self.robots < 1 or self.duration_s <= 0 or self.chunk < 1 or self.slo_hz <= 0:
            raise ValueError("robots, duration, chunk and slo_hz must be positive")
        bad = [x for x in [*self.load_levels, self.matrix_load] if x not in LOADS]
        if bad:
            raise ValueError(f"unknown load levels {bad}; choose from {list(LOADS)}")
        if not 0 < self.guard <= 1:
            raise ValueError("guard must lie in (0, 1]")
        if self.link_jitter_sigma < 0 or self.matrix_duration_s <= 0:
            raise ValueError("link_jitter_sigma must be >= 0 and matrix_duration_s > 0")

    @property
    def load_levels(self) -> list[str]:
        return items(self.loads)

    @property
    def slo_s(self) -> float:
        return self.chunk / self.slo_hz

    @property
    def first_mbps(self) -> float:
        """The link's bandwidth at the start (what each robot's estimate starts from)."""
        return float(_trace(self.trace)["bandwidth_mbps"][0][1]) if self.trace else self.bw_before


@functools.lru_cache(maxsize=16)
def _trace(spec: str) -> dict:
    return load_trace(spec)


# ---------------------------------------------------------------------------------------------
# The world


# The robot's link monitor probes an idle link (runtime/robot/monitor.py: 96 KiB when no request
# used the link for 0.25 s): before each decision, the simulated robot's link takes the probes
# made since its link last carried a request, each at the bandwidth of its moment.
PROBE_BYTES = 96 * 1024
PROBE_EVERY_S = 0.25
PROBES_KEPT = 8  # the link's 2 s window holds no more of them

# The recorded samples are of batch 1 and nothing measured says what a batch of k costs, so
# the simulated edge serves one request per batch: batching here would only be the model's
# conservative k x the per-request time, every member ending with the batch.
SIM_MAX_BATCH = 1


@dataclass(frozen=True)
class Arrival:
    """An edge segment reaching the edge at ``at``: its ``stages``, their true wall seconds
    there (other tenants' load included), due at ``deadline``."""

    at: float
    deadline: float
    stages: tuple[str, ...]
    seconds: tuple[float, ...]


class SimEdge:
    """The simulated edge: the one queue model (``queue_model.EdgeQueue``, the worker's rule)
    stepped batch by batch as simulated time reaches each, with the runtime edge's ledger and
    admission. What a robot plans against is what the runtime's edge sends: the forecast
    (``forecast``) over the batch running, the queued requests and the plans robots booked
    (``queue_model.Ledger``), each stage at the per-request time measured on the batches it
    ran (``StageTimes``; 0 before a stage first ran, as on an edge without warm-up). A segment
    is refused on arrival when, with the bookings, it would finish after its deadline. Unlike
    the runtime's, it knows the true service times of what has arrived; like it, it does not
    know what will arrive later."""

    def __init__(self, max_batch: int = SIM_MAX_BATCH) -> None:
        self.queue = EdgeQueue(max_batch)
        self.ledger = Ledger()
        self.times = StageTimes()
        self.running: list[Slot] = []  # the batch started last (until it ends)

    def book(self, bookings: tuple[Booking, ...], origin: str, now: float) -> None:
        """Hold a plan's edge segments (``queue_model.plan_bookings``) for robot ``origin``."""
        for b in bookings:
            self.ledger.book(replace(b, origin=origin), now)

    def _booked(self, queue: EdgeQueue, now: float) -> EdgeQueue:
        """``queue`` with every booking held at ``now`` added, at the measured stage times."""
        for p in self.ledger.pending(now, self.times.seconds):
            queue.add(p)
        return queue

    def forecast(self, now: float, limit: int = 64) -> list[Slot]:
        """The edge's schedule at ``now``, as the runtime's edge forecasts it."""
        running = [s for s in self.running if s.end > now]
        return running + play(self._booked(self.queue.copy(self.times.seconds), now), limit)

    def finish(self, a: Arrival) -> float:
        """When ``a``, arriving now, would finish."""
        q = self._booked(self.queue.copy(), a.at)
        q.add(
            Pending(
                ready=a.at,
                deadline=a.deadline,
                origin=THIS,
                stages=a.stages,
                seconds=a.seconds,
                key=THIS,
            )
        )
        end = finish(q, THIS)
        return a.at if end is None else end

    def admit(self, a: Arrival, origin: str, key: Hashable) -> bool:
        """Queue ``a`` (``key``: the caller's handle, on each of its slots) unless it would
        finish after its deadline; whether it was. Its booking, if it made one, is claimed
        first either way (it has arrived)."""
        self.ledger.claim(origin, a.stages, a.at)
        if self.finish(a) > a.deadline:
            return False
        self.queue.add(
            Pending(
                ready=a.at,
                deadline=a.deadline,
                origin=origin,
                stages=a.stages,
                seconds=a.seconds,
                key=key,
            )
        )
        return True

    def next_at(self) -> float | None:
        """When the next batch starts (None: nothing queued)."""
        return self.queue.next_at()

    def run(self, now: float) -> list[tuple[Pending, Slot]]:
        """Start the batch due at ``now`` (every arrival up to ``now`` admitted first); empty
        when none is due yet. The batch's time is measured, as the runtime's worker does."""
        due = self.queue.next_at()
        batch = self.queue.step() if due is not None and due <= now else []
        if batch:
            slot = batch[0][1]
            self.times.measured(slot.stage, slot.end - slot.start, len(batch), now)
            self.running = [s for _, s in batch]
        return batch


@dataclass
class World:
    """One world per seed, the same at every load level: separate random streams for stage
    times, link jitter and the other tenants' load, so that a policy that never touches the
    edge (Device-Only) lives through exactly the same times at every load."""

    cfg: FleetConfig
    devices: dict[str, Device]
    truth: Truth | WorldTruth
    rng: np.random.Generator  # the other tenants' background load
    stage_rng: np.random.Generator
    link_rng: np.random.Generator
    _scale: dict = field(default_factory=dict)  # (work, role) -> (scale, utilisation)

    def draw(self, works, rng: np.random.Generator | None = None) -> list:
        """One draw per stage, before anything is placed, so the stream is consumed alike
        whatever runs where: a recorded sample (host seconds), or a world's jitter draw.
        ``rng``: another stream than the requests' (the warm-up's)."""
        rng = self.stage_rng if rng is None else rng
        if isinstance(self.truth, WorldTruth):
            return self.truth.draw(rng, works)
        return [float(rng.choice(self.truth.samples.seconds[w.name])) for w in works]

    def seconds(self, work: StageWork, role: str, draw, knobs: dict) -> float:
        """The true compute seconds of ``work`` (under the setting ``knobs``) on ``role``."""
        if isinstance(self.truth, WorldTruth):
            return self.truth.seconds(work.name, role, draw, knobs)
        return draw * self.scale(work, role)[0]

    def warm_up(self, sched: Scheduler, space: PlanSpace, seed: int) -> None:
        """What a runtime robot's warm-up gives its planner before the first request
        (``RobotAgent.warmup``): every stage run once on the robot at full compute and under
        each setting the planner may choose, and the edge's own estimate of each stage at full
        compute. Drawn from a stream of their own, so the requests' draws, which every plan
        shares, stay as they are."""
        rng = np.random.default_rng((seed, 7919))
        k0 = _identity_index(space)
        works = space.works[k0]
        knobs0 = space.settings[k0].as_dict()
        # Three runs, each a sample of the factors' medians: one stalled run is outvoted.
        for _ in range(WARM_RUNS):
            draws = self.draw(works, rng)
            sched.prime(
                {
                    w.name: self.seconds(w, "robot", d, knobs0)
                    for w, d in zip(works, draws, strict=True)
                },
                {
                    w.name: self.seconds(w, "edge", d, knobs0)
                    for w, d in zip(works, draws, strict=True)
                },
            )
            for k, setting in enumerate(space.settings):
                if k == k0 or not space.eligible[k]:
                    continue
                knobs = setting.as_dict()
                robot = {
                    w.name: self.seconds(w, "robot", d, knobs)
                    for w, d in zip(space.works[k], draws, strict=True)
                }
                sched.prime_setting(knobs, robot)

    def utilisation(self, work: StageWork, role: str) -> float:
        """What the meter prices a stage at: the roofline's utilisation under the catalog's
        powers, or 1 (the world's busy power is what the device draws running it)."""
        return 1.0 if isinstance(self.truth, WorldTruth) else self.scale(work, role)[1]

    @property
    def meter(self) -> tuple[dict[str, Device], RadioPower | None]:
        """The devices and radio energy is metered with (None: the run's own radio)."""
        if isinstance(self.truth, WorldTruth):
            return self.truth.meter, self.truth.radio
        return self.devices, None

    def model_utilisation(self, work: StageWork, role: str) -> float:
        """The utilisation the catalog's account (the scheduler's) prices ``work`` at on
        ``role``: the roofline's, on the catalog device."""
        key = (work, role, "model")
        if key not in self._scale:
            self._scale[key] = roofline(work, self.devices[role]).utilisation
        return self._scale[key]

    def scale(self, work: StageWork, role: str) -> tuple[float, float]:
        """Host seconds -> true seconds of ``work`` on ``role``, and the roofline utilisation
        the energy account prices it at."""
        key = (work, role)
        if key not in self._scale:
            roof = roofline(work, self.devices[role])
            k = roof.seconds / self.truth.host_s[work.name] * self.truth.calib[role]
            self._scale[key] = (k, roof.utilisation)
        return self._scale[key]

    def stretch(self, seconds: float, load: float) -> float:
        """Wall time of ``seconds`` of edge work while other tenants time-share the edge: add
        the background work that arrives meanwhile, and the work arriving during that, ..."""
        total, pending = seconds, seconds
        rate = load / BACKGROUND_JOB_S
        while pending > 1e-6 and load > 0:
            n = self.rng.poisson(rate * pending)
            pending = float(self.rng.exponential(BACKGROUND_JOB_S, n).sum())
            total += pending
        return total

    def bandwidth(self, t: float) -> float:
        c = self.cfg
        if c.trace:  # repeated for as long as the run lasts
            trace = _trace(c.trace)
            return bandwidth_at(trace, t % float(trace["seconds"]))
        return c.bw_before if t < c.drop_at * c.duration_s else c.bw_after

    def wire_s(self, nbytes: float, t: float) -> float:
        """``nbytes``' one-way time at ``t`` without jitter (it draws nothing, so every
        strategy's requests see the same link jitter draws): what a monitor probe takes, and
        what the robot's link monitor expects a transfer to take."""
        return self.cfg.rtt_ms * 1e-3 / 2 + nbytes * 8 / (self.bandwidth(t) * 1e6)

    def probe_s(self, t: float) -> float:
        """A monitor probe's one-way time at ``t``."""
        return self.wire_s(PROBE_BYTES, t)

    def transfer_s(self, nbytes: float, t: float) -> float:
        wire = self.wire_s(nbytes, t)
        return wire * float(self.link_rng.lognormal(0.0, self.cfg.link_jitter_sigma))


@dataclass(frozen=True)
class Setup:
    """What every run of one fleet config shares: the plan spaces (placement: the identity
    setting only; joint: placements x the settings the accuracy floor admits), the devices
    and the truth."""

    placement: PlanSpace
    joint: PlanSpace
    devices: dict[str, Device]
    truth: Truth | WorldTruth
    radio: RadioPower = field(default_factory=RadioPower)


POWER_TERMS = ("robot.idle", "robot.busy", "edge.idle", "edge.busy", "radio.tx", "radio.rx")


def scale_powers(
    spec: str, devices: dict[str, Device], radio: RadioPower
) -> tuple[dict[str, Device], RadioPower]:
    """``devices`` and ``radio`` with the powers ``spec`` names scaled ("edge.busy=2,radio.tx=
    0.5"); a term not in POWER_TERMS, a factor that is not a positive number, or a scaling that
    leaves a device idling above its busy power is refused, naming it."""
    from dataclasses import replace

    devices, watts = dict(devices), {"tx_w": radio.tx_w, "rx_w": radio.rx_w}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        term, _, factor = part.partition("=")
        try:
            f = float(factor)
        except ValueError:
            f = -1.0
        if term not in POWER_TERMS or not f > 0:
            raise ValueError(
                f"power {part!r}: want TERM=FACTOR, TERM one of "
                f"{', '.join(POWER_TERMS)} and FACTOR > 0"
            )
        role, kind = term.split(".")
        if role == "radio":
            watts[f"{kind}_w"] *= f
            continue
        dev = devices[role]
        idle = dev.idle_w * (f if kind == "idle" else 1.0)
        busy = dev.busy_w * (f if kind == "busy" else 1.0)
        if idle > busy:
            raise ValueError(
                f"power {part!r}: {dev.id} would idle ({idle:g} W) above its busy "
                f"power ({busy:g} W)"
            )
        scaled = replace(dev, idle_w=idle, busy_w=busy)
        devices[role] = scaled
    return devices, RadioPower(**watts)


def make_world(cfg: FleetConfig, setup: Setup, seed: int) -> World:
    load_seq, stage_seq, link_seq = np.random.SeedSequence(seed).spawn(3)
    return World(
        cfg,
        setup.devices,
        setup.truth,
        np.random.default_rng(load_seq),
        np.random.default_rng(stage_seq),
        np.random.default_rng(link_seq),
    )


# ---------------------------------------------------------------------------------------------
# Running one request


@dataclass(frozen=True)
class Executed:
    latency_s: float
    energy_j: float
    stage_s: dict[str, float]  # true compute seconds per stage
    transfers: list[tuple[int, float]]  # (bytes, seconds) of every transfer
    placement: tuple[str, ...]  # where each stage ran (after any fallback)
    fallback: str | None  # why stages planned for the edge ran on the robot (None: as planned)
    # energy_j per device as a world's meter read it, and the same execution in the catalog's
    # account (the scheduler's): empty when the world is the catalog (no meter to learn from).
    metered_by_device: dict[str, float] = field(default_factory=dict)
    modelled_by_device: dict[str, float] = field(default_factory=dict)


def execute(
    world: World,
    works,
    roles,
    release: float,
    radio: RadioPower,
    load: float,
    knobs: dict | None = None,
) -> Generator[Arrival, dict[str, float] | None, Executed]:
    """Run one request (under the setting ``knobs``) through the world: true latency and
    modelled energy. A generator, as the edge is shared: it yields each edge segment as it
    reaches the edge and is sent back when each of the segment's stages ends there (None:
    refused on arrival).

    The robot splits the plan and waits for an edge segment by the runtime's executor's rules
    (``sched.execution``: ``segments``, ``give_up_at``): until the deadline less the local
    time of the robot stages after it and the margin (an answer costs no time to read here).
    The edge is given that, less the answer's way back, as its own
    deadline (so it refuses work it could only finish too late), and an answer that would
    come back later is given up on: the robot runs the segment itself from then, so a silent
    or slow edge costs at most the deadline plus one local run (the edge's work is spent
    all the same)."""
    names = [w.name for w in works]
    draws = world.draw(works)
    deadline = release + world.cfg.slo_s
    roles = list(roles)
    end: dict[str, float] = {}
    stage_s, transfers, spent = {}, [], []  # spent: (work, StageSpend) per execution
    tx_s = rx_s = 0.0
    fallback = None
    give_up: dict[int, float] = {}  # an edge segment's first stage -> when the robot gives up

    def segment(k: int) -> range:  # the segment stage k is in, as the roles are now
        return next(run for run in segments(roles) if k in run)

    def local(k: int) -> float:
        return world.seconds(works[k], "robot", draws[k], knobs)

    def run_here(seg: list[int], start: float) -> float:
        """The segment run on the robot from ``start``; when it ends."""
        t = start
        for k in seg:
            t += (sec := local(k))
            end[names[k]] = t
            spent.append((works[k], StageSpend("robot", sec, world.utilisation(works[k], "robot"))))
        return t

    i = 0
    while i < len(works):
        work = works[i]
        ready = release
        back = 0.0
        if roles[i] == "edge" and work.name not in end:  # an edge segment starts here
            seg = segment(i)
            later = sum(local(k) for k in range(seg[-1] + 1, len(works)) if roles[k] == "robot")
            give_up[i] = give_up_at(deadline, later)
            nxt = seg[-1] + 1  # what comes back: the next stage's input, or the actions
            back_bytes = works[nxt].in_bytes if nxt < len(works) else works[seg[-1]].out_bytes
        for p in work.parents or ("",):  # the first stage's input comes from the robot
            prole = roles[names.index(p)] if p else "robot"
            t = end.get(p, release)
            if prole == "robot" and i in give_up:  # this edge segment's input leaves now
                back = world.wire_s(back_bytes, t)
                if give_up[i] - t - world.wire_s(work.in_bytes, t) - back <= 0:
                    # The link leaves the edge no time: the robot does not send, it runs the
                    # segment here (the runtime's executor refuses to send it too).
                    fallback = "edge: the link leaves the edge no time"  # as the executor says it
                    del give_up[i]
                    for k in segment(i):
                        roles[k] = "robot"
            if prole != roles[i]:
                tau = world.transfer_s(work.in_bytes, t)
                # the edge segment this input comes back from (its first stage's index)
                first = None
                if prole == "edge":
                    first = max((k for k in give_up if k <= names.index(p)), default=None)
                if first is not None and t + tau > give_up[first]:
                    # The answer would come after the robot gave up: it ran the segment here.
                    fallback = "edge: no answer in time"
                    t = run_here(segment(first), give_up[first])
                    ready = max(ready, t)
                    continue
                transfers.append((work.in_bytes, tau))
                if prole == "robot":
                    tx_s += tau
                else:
                    rx_s += tau
                t += tau
            ready = max(ready, t)
        if roles[i] == "edge" and work.name not in end:  # the segment reaches the edge
            seg = segment(i)
            walls = tuple(
                world.stretch(world.seconds(works[k], "edge", draws[k], knobs), load) for k in seg
            )
            due = min(give_up[i] - (back or world.wire_s(back_bytes, ready)), deadline)
            ends = yield Arrival(ready, due, tuple(names[k] for k in seg), walls)
            if ends is None:
                # Refused at once; this stage and every later one run on the robot.
                fallback = "edge: cannot finish before the deadline"
                del give_up[i]
                roles[i:] = ["robot"] * (len(works) - i)
                ready += world.cfg.rtt_ms * 1e-3 / 2
            else:
                end.update(ends)
        seconds = world.seconds(work, roles[i], draws[i], knobs)
        util = world.utilisation(work, roles[i])
        if roles[i] == "robot" and work.name not in end:
            end[work.name] = ready + seconds
        stage_s[work.name] = seconds
        spent.append((work, StageSpend(roles[i], seconds, util)))
        i += 1
    finish = end[works[-1].name]
    if roles[-1] == "edge":
        tau = world.transfer_s(works[-1].out_bytes, finish)
        seg_first = max(give_up)
        if finish + tau > give_up[seg_first]:
            fallback = "edge: no answer in time"
            finish = run_here(segment(seg_first), give_up[seg_first])
        else:
            transfers.append((works[-1].out_bytes, tau))
            rx_s += tau
            finish += tau
    latency = finish - release
    devices, meter_radio = world.meter
    listen = sum(s for n, s in stage_s.items() if roles[names.index(n)] == "edge")
    account = dict(
        latency_s=latency, period_s=world.cfg.slo_s, tx_s=tx_s, rx_s=rx_s, listen_s=listen
    )
    metered = request_energy_by_device(
        devices["robot"],
        devices["edge"],
        [sp for _, sp in spent],
        radio=meter_radio or radio,
        **account,
    )
    modelled = {}
    if isinstance(world.truth, WorldTruth):  # a meter apart from the model: price it both ways
        priced = [replace(sp, utilisation=world.model_utilisation(w, sp.role)) for w, sp in spent]
        modelled = request_energy_by_device(
            world.devices["robot"], world.devices["edge"], priced, radio=radio, **account
        )
    return Executed(
        latency,
        sum(metered.values()),
        stage_s,
        transfers,
        tuple(roles),
        fallback,
        metered if modelled else {},
        modelled,
    )


# ---------------------------------------------------------------------------------------------
# Policies


def fixed_roles(policy: str, stages: tuple[str, ...]) -> tuple[str, ...]:
    return strategy.fixed_roles(policy, len(stages))


def _identity_index(space: PlanSpace) -> int:
    for k, s in enumerate(space.settings):
        if all(v == IDENTITY[n] for n, v in s.knobs):
            return k
    raise ValueError("the plan space has no identity setting")


@dataclass(eq=False)
class _Request:
    """One request in flight in the simulation (compared by identity: it keys its slots)."""

    robot: int
    release: float
    setting: int
    works: tuple
    plan: ExecutionPlan | None  # the scheduler's (None: a fixed strategy)
    run: Generator[Arrival, dict[str, float] | None, Executed]
    ends: dict[str, float] = field(default_factory=dict)  # its edge segment's stage ends


def run_policy(
    cfg: FleetConfig,
    setup: Setup,
    policy: str,
    load: str,
    seed: int,
    static: tuple[tuple[str, ...], int] | None = None,
) -> list[dict]:
    """All requests of all robots under one policy and load level, as one discrete-event run:
    robots release requests every period, each request runs until its next edge segment
    reaches the edge, the edge serves batches under the worker's rule, and a request goes on
    when its segment ends there. A plan is made from what the scheduler has learnt from the
    requests finished by its release. ``static``: (roles, setting index of the joint space)
    run for every request instead (``policy`` is then only its label)."""
    world = make_world(cfg, setup, seed)
    space = setup.joint if policy == "vlarun-joint" or static else setup.placement
    edge, rho = SimEdge(), LOADS[load]
    radio, period = setup.radio, cfg.slo_s
    # The edge reports its background utilisation; the predictor stretches edge stages by it.
    scheds: list[Scheduler] = []
    slowdown, links = 1 / (1 - rho), []
    now = [0.0]  # the simulated time: what the scheduler's and the links' memories age by

    def clock() -> float:
        return now[0]

    if static is None and policy in ("vlarun-placement", "vlarun-joint"):
        # One planner per robot, as on real robots (each ``RobotAgent`` owns its planner and
        # learns from its own requests only); they meet only in the edge's booked schedule.
        for _ in range(cfg.robots):
            sched = Scheduler(
                space,
                setup.devices,
                cfg.slo_s * cfg.guard,
                actions=cfg.chunk,
                radio=radio,
                cal=Calibration(clock=clock),
                deadline_s=cfg.slo_s,
                on_time=cfg.on_time,
                explore_every=EXPLORE_EVERY,
            )
            sched.period_s = period
            world.warm_up(sched, space, seed)
            scheds.append(sched)
        links = [Link(cfg.first_mbps, cfg.rtt_ms, clock=clock) for _ in range(cfg.robots)]
    used = [-math.inf] * cfg.robots  # when each robot's link last carried a request
    k_id = _identity_index(space)
    events: list[tuple] = []  # (time, is an edge batch, order, kind, what)
    order = itertools.count()

    def at(t: float, kind: str, what: object = None) -> None:
        # At one instant, arrivals and finished segments come before the edge picks a batch.
        heapq.heappush(events, (t, kind == "batch", next(order), kind, what))

    for n in range(int(cfg.duration_s / period)):
        for i in range(cfg.robots):
            at(i * period / cfg.robots + n * period, "release", i)
    records = []

    def advance(req: _Request, sent: dict[str, float] | None) -> None:
        try:
            at((arrival := req.run.send(sent)).at, "arrive", (req, arrival))
        except StopIteration as stop:
            out: Executed = stop.value
            if req.plan is not None:
                _learn(scheds[req.robot], links[req.robot], req.plan, req.works, out)
                if out.transfers:
                    used[req.robot] = now[0]
            records.append(_record(cfg, req, out))

    while events:
        t, _, _, kind, what = heapq.heappop(events)
        now[0] = t
        if kind == "release":
            d = None
            if static is not None:
                roles, k = static
            elif not scheds:
                k, roles = k_id, fixed_roles(policy, space.stages)
            else:
                # The monitor probed the idle link every PROBE_EVERY_S since it last carried a
                # request (the last 2 s of them: the link's window), each at that moment's rate.
                idle = t - used[what]
                n = int(min(idle / PROBE_EVERY_S, PROBES_KEPT))
                for j in range(n, 0, -1):
                    links[what].observe_transfer(
                        PROBE_BYTES, world.probe_s(t - (j - 1) * PROBE_EVERY_S)
                    )
                # The edge's schedule now, with every plan booked so far: the load it plans
                # against, as a runtime robot reads it from the edge (``costview.edge_state``).
                booked = reservations(edge.forecast(t), t)
                state = DeviceState(slowdown=slowdown, reservations=booked)
                d = scheds[what].decide(links[what], t, state, top=0)
                edge.book(plan_bookings(d, cfg.slo_s, t), str(what), t)
                k, roles = scheds[what].setting_index(d), tuple(d.placement.values())
            works = space.works[k]
            run = execute(world, works, roles, t, radio, rho, space.settings[k].as_dict())
            advance(_Request(what, t, k, works, d, run), None)
        elif kind == "arrive":
            req, arrival = what
            if edge.admit(arrival, str(req.robot), req):
                at(edge.next_at(), "batch")
            else:
                advance(req, None)
        elif kind == "batch":
            batch = edge.run(t)  # empty for a second call at one instant: nothing is due
            for p, slot in batch:
                p.key.ends[slot.stage] = slot.end
                if len(p.stages) == 1:  # its segment is done: the request goes on then
                    at(slot.end, "done", p.key)
            if batch and (nxt := edge.next_at()) is not None:
                at(nxt, "batch")
        else:  # "done"
            ends, what.ends = what.ends, {}
            advance(what, ends)
    return sorted(records, key=lambda r: (r["release"], r["robot"]))


def _record(cfg: FleetConfig, req: _Request, out: Executed) -> dict:
    return {
        "robot": req.robot,
        "release": req.release,
        "latency_s": out.latency_s,
        "latency_ms": out.latency_s * 1e3,
        "energy_j": out.energy_j,
        # what the plan predicted (None: a fixed strategy's request, planned by no scheduler)
        "predicted_energy_j": None if req.plan is None else req.plan.energy_j,
        # the share the scheduler counted the most punctual steady plan to reach then
        "on_time_reach": None if req.plan is None else req.plan.on_time_reach,
        "slo_met": out.latency_s <= cfg.slo_s,
        "placement": "/".join(r[0].upper() for r in out.placement),
        "ran": " ".join(f"{w.name}@{r}" for w, r in zip(req.works, out.placement, strict=True)),
        "fallback": out.fallback,
        "setting": req.setting,
        "phase": "trace"
        if cfg.trace
        else "before"
        if req.release < cfg.drop_at * cfg.duration_s
        else "after",
    }


def _learn(sched: Scheduler, link: Link, d, works, out: Executed) -> None:
    """Feed the observed request back through the plan contract: the link's EWMA from the
    transfers, then ``Scheduler.observe`` (stage factors, placement residual)."""
    for nbytes, seconds in out.transfers:
        link.observe_transfer(nbytes, seconds)
    if out.fallback is not None and out.transfers:
        # The edge refused a segment its transfer made late: the runtime's robot would have
        # given up waiting and bounded the link at what moved (``Link.bound``); the slowest
        # transfer's rate caps the estimate now, as that bound does.
        nbytes, seconds = max(out.transfers, key=lambda x: x[1])
        link.bound(nbytes, seconds)
    stages = tuple(
        StageOutcome(w.name, role, out.stage_s[w.name])
        for w, role in zip(works, out.placement, strict=True)
    )
    # As the runtime's learner does: an outcome that fell back says so (it teaches the stage
    # times it measured, not the plan's residual).
    sched.observe(
        d,
        Outcome(
            stages,
            out.latency_s,
            out.fallback,
            energy_j=out.energy_j,
            energy_by_device=out.metered_by_device,
            modelled_by_device=out.modelled_by_device,
        ),
    )


# ---------------------------------------------------------------------------------------------
# The experiment


def summarise(records: list[dict], actions: int) -> dict:
    """The one summariser of run records (``records.summarise``) over the run and over each
    phase of the bandwidth drop, with the placements the requests ran."""
    out = summarise_records(records, actions)
    out["placements"] = dict(sorted(Counter(r["placement"] for r in records).items()))
    for phase in ("before", "after"):
        part = [r for r in records if r["phase"] == phase]
        if part:
            out[f"{phase}_drop"] = summarise_records(part, actions)
    return out


def simulate(cfg: FleetConfig, setup: Setup) -> dict:
    results, traces = {}, {}
    for load in cfg.load_levels:
        results[load] = {}
        for policy in STRATEGIES:  # one world (cfg.seed) at every load level
            recs = run_policy(cfg, setup, policy, load, cfg.seed)
            results[load][policy] = summarise(recs, cfg.chunk)
            traces[(load, policy)] = [
                (r["release"], r["latency_s"]) for r in recs if r["robot"] == 0
            ]
    gain = {
        load: r["vlarun-joint"]["actions_per_joule"] / r["fixed-split"]["actions_per_joule"]
        for load, r in results.items()
    }
    return {"results": results, "vlarun_vs_fixed_split": gain, "traces": traces}


def plot(cfg: FleetConfig, sim: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    load = "medium" if "medium" in sim["results"] else cfg.load_levels[0]
    for policy in STRATEGIES:
        t, lat = zip(*sim["traces"][(load, policy)], strict=True)
        ax1.plot(t, np.array(lat) * 1e3, label=policy, lw=1)
    ax1.axhline(cfg.slo_s * 1e3, color="k", ls="--", lw=0.8, label="T_SLO")
    ax1.axvline(cfg.drop_at * cfg.duration_s, color="grey", ls=":", lw=0.8)
    ax1.set(
        xlabel="time (s)",
        ylabel="latency of robot 0 (ms)",
        yscale="log",
        title=f"{load} edge load; {cfg.bw_before:g} -> {cfg.bw_after:g} Mbps at the dotted line",
    )
    ax1.legend(fontsize=8)
    loads = list(sim["results"])
    width = 0.8 / len(STRATEGIES)
    for i, policy in enumerate(STRATEGIES):
        vals = [sim["results"][x][policy]["actions_per_joule"] for x in loads]
        slo = [sim["results"][x][policy]["slo_met_fraction"] for x in loads]
        bars = ax2.bar(np.arange(len(loads)) + i * width, vals, width, label=policy)
        for b, s in zip(bars, slo, strict=True):
            ax2.annotate(
                f"{100 * s:.0f}%",
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax2.set_xticks(np.arange(len(loads)) + 0.4 - width / 2, loads)
    ax2.set(ylabel="actions per joule (modelled)", title="actions/J (labels: SLO met)")
    ax2.legend(fontsize=8)
    fig.suptitle(
        f"{cfg.model}, {cfg.robots} robots {cfg.robot} + edge {cfg.edge}, chunk {cfg.chunk} at "
        f"{cfg.slo_hz:g} Hz (measured per-stage samples, scaled; modelled energy)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_setup(cfg: FleetConfig) -> Setup:
    """The plan spaces, devices and truth of a fleet config (accuracy floor applied)."""
    from vlarun.models.presets import get_preset
    from vlarun.sched.catalog import get_device
    from vlarun.sched.cost import stage_works
    from vlarun.sched.plans import build_space
    from vlarun.sched.settings_table import carried_to, load_settings
    from vlarun.stages.families import Workload

    model = get_preset(cfg.model)
    devices = {"robot": get_device(cfg.robot), "edge": get_device(cfg.edge)}
    devices, radio = scale_powers(cfg.powers, devices, RadioPower())
    w = Workload()
    base = stage_works(model, w)
    floor = None if cfg.unmeasured_accelerators else cfg.accuracy_floor
    rows = None
    if cfg.settings or cfg.settings_proxy:
        rows = load_settings(cfg.settings)
        if cfg.settings_proxy:
            rows = carried_to(rows, model.name)
    placement = build_space(model, base, devices, w, floor, accelerators=False)
    joint = build_space(model, base, devices, w, floor, rows)
    if cfg.world:
        truth = world_truth(cfg.world, cfg.model, devices)
    else:
        truth = make_truth(load_samples(cfg.model, cfg.samples), base, devices)
    return Setup(placement, joint, devices, truth, radio)


def run_fleet(cfg: FleetConfig) -> dict:
    setup = make_setup(cfg)
    sim = simulate(cfg, setup)
    if cfg.plot:
        plot(cfg, sim, cfg.plot)
    return {
        "config": {f: getattr(cfg, f) for f in cfg.__dataclass_fields__ if f != "json"},
        "slo_ms": cfg.slo_s * 1e3,
        "load_utilisation": {x: LOADS[x] for x in cfg.load_levels},
        "results": sim["results"],
        "vlarun_vs_fixed_split": sim["vlarun_vs_fixed_split"],
        "plot": cfg.plot,
        "ground_truth": setup.truth.label,
        "energy_source": "modelled",
        "notes": list(setup.joint.notes),
    }


def format_fleet(r: dict) -> str:
    c = r["config"]
    lines = [
        f"{c['model']}: {c['robots']} robots ({c['robot']}) + {c['edge']}, chunk {c['chunk']} at "
        f"{c['slo_hz']:g} Hz (SLO {r['slo_ms']:.0f} ms), {c['bw_before']:g} -> {c['bw_after']:g} "
        f"Mbps at {c['drop_at']:.0%} of {c['duration_s']:g} s"
    ]
    for load, res in r["results"].items():
        lines.append(f"  {load} edge load ({r['load_utilisation'][load]:.0%} background):")
        for policy, s in res.items():
            slo = 100 * s["slo_met_fraction"]
            phases = " | ".join(
                f"{ph} drop {s[ph + '_drop']['actions_per_joule']:.3f} act/J "
                f"{100 * s[ph + '_drop']['slo_met_fraction']:.1f}%"
                for ph in ("before", "after")
                if ph + "_drop" in s
            )
            lines.append(
                f"    {policy:<16} {s['actions_per_joule']:7.3f} act/J  SLO {slo:6.2f}%"
                f"  mean {s['latency_mean_ms']:7.1f} ms  p99 {s['latency_p99_ms']:7.1f} ms  "
                f"{s['placements']}"
            )
            lines.append(f"    {'':<16} {phases}")
        gain = r["vlarun_vs_fixed_split"][load]
        lines.append(f"    vlarun-joint / fixed-split actions/J: {gain:.2f}x")
    lines.append(f"  ground truth: {r['ground_truth']}; energy {r['energy_source']}")
    if r["plot"]:
        lines.append(f"  plot: {r['plot']}")
    return "\n".join(lines)
