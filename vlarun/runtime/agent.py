"""The robot agent: per request a plan, local stages here, remote segments on the edge,
and local fallback whenever the edge would make the robot miss its deadline.

One inference (``RobotAgent.infer``):
  1. plan: the scheduler's decision for this request (strategy "vlarun"), or a fixed
     placement (device-only, edge-only, fixed-split: vision here, the rest on the edge);
  2. walk the plan's segments: a robot segment runs here; an edge segment is one request that
     waits until  deadline - (local time of every stage still to run) - margin,  so that if
     the edge is silent, running the rest here still ends by the deadline; when that leaves
     the edge less than twice its usual time, it waits up to that, at most until the
     deadline itself: a step is never later than its deadline plus one local run of the
     remaining stages;
  3. a dropped link (send refused, or no reply in time) marks the edge down: every later
     request runs here until the background monitor hears the edge again (monitor.py);
  4. feed back what was measured: stage times (edge times come in the reply), transfers and
     round trips (link EWMA), and the end-to-end latency (placement residual).

Accelerator settings run on whichever side each stage runs: the plan's setting (or the
configured one, for the fixed strategies) becomes hooks here (``AccelSetting.hooks``) and
travels with each edge request (``meta.setting``), where the edge keeps the same hooks for this
robot's stream. Hook state that carries across control steps (the token policy's KV cache,
the Jacobi decoder's generator) lives on the side that last ran its stage; when a stage moves,
its state on the new side is reset first (``meta.fresh`` on the edge), so a move costs one full
recompute, never a reuse of stale state. ``reset()`` starts a new episode (a new stream).

A robot slower than this host can be stood in for by ``robot_slowdown``: each local stage
sleeps (slowdown - 1) times its measured duration, and every result says so.

Real-time chunking (``AgentConfig.rtc``): a request made while actions are still queued
(``chunks.Prior``) carries them with d = ceil(p95 / period) from the plan chosen for it
(predicted latency + 1.645 sigma, network included; ``accel.rtc.RTCRequest``), so the head
freezes the new chunk's first d actions to them on whichever side it runs. When the edge fails
and the rest of a request runs here, d is recomputed before the head runs: the time already
spent plus the local stages left.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import zmq

from vlarun.accel.rtc import P95_Z, RTCRequest, frozen_steps
from vlarun.models.device import settle
from vlarun.policy.base import Policy
from vlarun.policy.setting import AccelSetting
from vlarun.runtime import planning
from vlarun.runtime.chunks import Prior
from vlarun.runtime.client import EdgeClient, LinkDown, check_packet, reply_limits
from vlarun.runtime.emulate import Emulation, StageEmulator, world_meter
from vlarun.runtime.monitor import LinkMonitor
from vlarun.runtime.segments import segments, wanted
from vlarun.runtime.transport import Security
from vlarun.sched.contract import TransferOutcome
from vlarun.sched.link import Link
from vlarun.sched.strategy import FIXED, fixed_roles
from vlarun.stages.families import RTC_FAMILIES, RTC_INPUTS, refuse_fast_freeze, rtc_inputs
from vlarun.stages.packet import Packet
from vlarun.stages.wire import Codec

# The agent's names: vlarun-placement is "vlarun" here (sched.strategy names both).
STRATEGIES = ("vlarun", "vlarun-joint", *FIXED)


@dataclass(frozen=True)
class AgentConfig:
    """How the robot runs its policy. ``slo_s``: deadline of one inference (chunk / control
    rate); ``margin_s``: kept in hand when deciding to give up on the edge; ``setting``: the
    accelerator setting every request runs (the scheduler plans its placement under it)."""

    slo_s: float = 0.5
    strategy: str = "vlarun"
    robot_slowdown: float = 1.0
    codec: Codec = Codec()
    margin_s: float = 0.003
    robot_device: str = "this-cpu"
    edge_device: str = "this-cpu"
    bandwidth_mbps: float = 1000.0  # initial link estimate; measured transfers refine it
    rtt_ms: float = 1.0
    setting: AccelSetting = AccelSetting()
    # vlarun-joint: the settings table the plan space reads (None: the shipped one) and the
    # accuracy floor its settings must clear (plans.NO_LOSS, a number, or "none").
    settings_file: str | None = None
    accuracy_floor: float | str = "no-loss"
    # With ``emulate``: the table's accuracy costs, measured on the shipped deep policies, are
    # carried to the emulated model as a proxy (its plan space's notes say so; no real-size
    # model was run for them). False: only rows that name the emulated model count.
    settings_proxy: bool = False
    # A power meter on the robot (RAPL, NVML, Jetson INA rails) read around every request:
    # "auto" (the first readable one; none on a machine without), "none", or its name.
    meter: str = "auto"
    # The robot device this side stands for, by padding each local stage to the emulated
    # device's time for the real model's stage (runtime.emulate), and the edge device the
    # edge server stands for (its ServerConfig.emulate); the plan is then costed for the real
    # model on both. None: this host as it is.
    emulate: Emulation | None = None
    edge_emulate: Emulation | None = None
    # Real-time chunking: each request freezes its chunk's first d actions to the ones still
    # queued, d from the executed plan's p95 latency and the control period (module docstring).
    rtc: bool = False

    def __post_init__(self) -> None:
        if self.emulate is not None and self.robot_slowdown > 1:
            raise ValueError("emulate and robot_slowdown both stand in for the robot: use one")
        if (self.emulate is None) != (self.edge_emulate is None):
            raise ValueError("emulate the robot and the edge together, or neither")
        if self.emulate is not None and self.edge_emulate is not None:
            a, b = self.emulate, self.edge_emulate
            if a.model != b.model or a.time_scale != b.time_scale:
                raise ValueError(
                    f"robot and edge emulate one model at one time scale, got {a.model} x"
                    f"{a.time_scale:g} and {b.model} x{b.time_scale:g}"
                )
            if a.world != b.world:
                raise ValueError(f"robot and edge live in one world, got {a.world} and {b.world}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.setting.weights != "native":
            # Both sides would have to hold the quantised model and the plan space to name it;
            # refused rather than run (and timed) as the float model.
            raise ValueError(
                f"weights={self.setting.weights} is not run by the robot / edge runtime yet "
                "(Policy.with_setting applies it in process)"
            )
        if self.slo_s <= 0 or self.robot_slowdown < 1:
            raise ValueError("slo_s must be positive and robot_slowdown >= 1")
        if self.robot_slowdown > 1 and self.robot_device != "this-cpu":
            raise ValueError(
                "robot_slowdown stands in for a slower robot by sleeping on this CPU, a named "
                f"robot device ({self.robot_device}) by converting this CPU's times: use one"
            )


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
    world: str | None = None  # emulated under this world, whose powers priced energy_j

    @property
    def late_s(self) -> float:
        return self.latency_s - self.slo_s

    @property
    def predicted_p95_s(self) -> float | None:
        """The plan's p95 latency (predicted + 1.645 sigma, network included); None without
        a plan (the fixed strategies, or the edge down)."""
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
            "energy_source": self.energy_source,
        }


@dataclass
class _Trace:
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


class RobotAgent:
    """Runs ``policy`` on this robot, with the edge at ``edge`` (None: robot only)."""

    def __init__(
        self,
        policy: Policy,
        cfg: AgentConfig | None = None,
        edge: str | None = None,
        sec: Security | None = None,
        ctx: zmq.Context | None = None,
        meter=None,
    ) -> None:
        """``meter``: a ``sched.meters.WindowMeter`` to read instead of ``cfg.meter``'s."""
        self.policy, self.cfg = policy, cfg or AgentConfig()
        family = policy.model.cfg.family
        if self.cfg.rtc and family not in RTC_FAMILIES:
            raise ValueError(
                f"real-time chunking needs a {', '.join(RTC_FAMILIES)} policy, not {family}"
            )
        if self.cfg.rtc:  # before any request, not at the first one that finds a queue
            refuse_fast_freeze(policy.model.cfg)
        from vlarun.sched.meters import window_meter

        self.meter = meter if meter is not None else window_meter(self.cfg.meter)
        model = policy.model
        self.dtype = "bfloat16" if model.dtype == torch.bfloat16 else "float32"
        # An emulated run's clock is 1 / time_scale slower than the emulated devices': the
        # link's memory and the monitor's intervals stretch with it, as every emulated time.
        stretch = 1.0 if self.cfg.emulate is None else 1.0 / self.cfg.emulate.time_scale
        self.link = Link(self.cfg.bandwidth_mbps, self.cfg.rtt_ms,
                         window_s=Link.window_s * stretch, cap_s=Link.cap_s * stretch,
                         rtt_window_s=Link.rtt_window_s * stretch)  # fmt: skip
        self.local_s: dict[str, float] = {}  # EWMA of each stage run here (slowdown included)
        emulate = self.cfg.emulate
        self.emulator = StageEmulator.build(emulate) if emulate is not None else None
        self._world_meter = world_meter(self.cfg)
        self._reply_bytes: dict[tuple[str, ...], int] = {}  # last answer's size per segment
        # Reading, decoding and checking an answer once it is on the socket: a slow peak,
        # decaying 10% per answer (16 agents sharing a core's GIL took up to 37 ms for it).
        self._answer_s = 0.0
        # setting key -> the policy under this side's hooks for it (its graphs, its state)
        self._policies: dict[tuple, Policy] = {}
        self._where: dict[tuple, dict[str, str]] = {}  # setting key -> stateful stage -> side
        self.stream = secrets.randbits(62)  # this episode's id on the edge
        self._instruction: str | None = None
        self._last_setting: tuple | None = None
        self._scheds: dict[int, object] = {}
        self._factors: dict[int, dict] = {}
        self._utilisation: dict[int, dict] = {}  # text tokens -> role -> stage -> roofline u
        # (when, the edge's schedule then: ``records.ScheduleSlot``s)
        self._schedule: tuple[float, tuple] = (0.0, ())
        self.client = self.monitor = None
        if edge is not None:
            sec = sec or Security(insecure=True)
            ctx = ctx or zmq.Context.instance()
            self.client = EdgeClient(edge, sec, ctx, reply_limits(policy, self.emulator))
            self.monitor = LinkMonitor(edge, sec, ctx, clock_scale=stretch)
            self.monitor.start(wait_s=2.0)

    @property
    def edge_up(self) -> bool:
        return self.monitor is not None and self.monitor.up.is_set()

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.client is not None:
            self.client.close()

    # -- graph and plan ------------------------------------------------------------------------

    def reset(self) -> None:
        """A new episode: a new stream on the edge and fresh hook state here."""
        self.stream = secrets.randbits(62)
        for policy in self._policies.values():
            policy.reset()
        self._where.clear()

    def _under(self, setting: AccelSetting) -> Policy:
        """The policy under ``setting`` on this side: exactly the hooks the edge makes from it
        (none for the identity), so a stage computes the same wherever it runs."""
        if setting.key not in self._policies:
            hooks = setting.hooks(self.policy.model.cfg.family, self.policy.calibration)
            self._policies[setting.key] = dataclasses.replace(self.policy, hooks=hooks)
        return self._policies[setting.key]

    def graph(self, text_tokens: int, setting: AccelSetting | None = None, rtc: bool = False):
        """The stage graph for a prompt of ``text_tokens`` under ``setting`` (default: the
        configured one), bound to this side's hooks for it (``rtc``: its head reads a
        real-time chunk's freeze)."""
        return self._under(setting or self.cfg.setting).graph(text_tokens, rtc)

    def factors(self, text_tokens: int) -> dict:
        """Measured-here to named-device time factors (``planning.stand_in_factors``)."""
        if text_tokens not in self._factors:
            cfg = self.policy.model.cfg
            self._factors[text_tokens] = planning.stand_in_factors(
                cfg, self.cfg, text_tokens, self.dtype
            )
        return self._factors[text_tokens]

    def scheduler(self, text_tokens: int):
        if text_tokens not in self._scheds:
            sched = planning.make_scheduler(
                self.policy.model.cfg, self.cfg, text_tokens, self.dtype
            )
            health = self.monitor.health if self.monitor is not None else {}
            planning.prime(
                sched, self.local_s, health.get("stage_ms") or {}, self.factors(text_tokens)
            )
            self._scheds[text_tokens] = sched
        return self._scheds[text_tokens]

    def plan(self, text_tokens: int):
        """(placement, decision or None, setting). The edge being down forces the robot-only
        plan; the fixed strategies run the configured setting, the scheduler its plan's."""
        names = [s.name for s in self.graph(text_tokens).stages]
        setting = self.cfg.setting
        if not self.edge_up:
            return dict.fromkeys(names, "robot"), None, setting
        if self.cfg.strategy in FIXED:
            roles = fixed_roles(self.cfg.strategy, len(names))
            return dict(zip(names, roles, strict=True)), None, setting

        sched = self.scheduler(text_tokens)
        health = self.monitor.health if self.monitor else {}
        schedule, age = self._edge_schedule(health)
        d = planning.decide(sched, self.link, health, schedule, age)
        setting = AccelSetting.from_knobs(d.settings, self.cfg.setting.token_method)
        self._book(d, text_tokens, setting)
        return dict(d.placement), d, setting

    def _book(self, d, text_tokens: int, setting: AccelSetting) -> None:
        """Announce the plan's edge segments to the edge the moment it is chosen, so another
        robot deciding before this request's bytes land already sees the work (a booking
        ``StageQueues.forecast`` places like queued work). Each segment arrives when the robot
        stage before it is predicted to end and is due when the rest of the plan needs it."""
        if not self.edge_up:
            return
        ends = [0.0]
        for seg in segments(self.graph(text_tokens, setting), d.placement):
            if seg.role == "edge":
                after = max(d.latency_s - d.stage_end[seg.stages[-1]], 0.0)  # residual < 0
                try:
                    self.client.book(seg.stages, ends[-1], self.cfg.slo_s - after)
                except LinkDown:
                    return  # the request will find the link down too, and run here
            ends.append(d.stage_end[seg.stages[-1]])

    def _edge_schedule(self, health: dict) -> tuple[tuple | None, float]:
        """The edge's committed schedule (other robots' reservations included) and its age:
        the freshest of the last reply, the monitor's last health reply and the ledger the
        edge last pushed (``LinkMonitor.ledger``)."""
        now = time.monotonic()
        at, schedule = self._schedule
        m = self.monitor
        if m is not None and m.health_at > at and "schedule" in health:
            at, schedule = m.health_at, health["schedule"]
        if m is not None and m.ledger_at > at:
            with m.lock:
                at, schedule = m.ledger_at, m.ledger
        return (schedule, now - at) if at else (None, 0.0)

    # -- one inference ------------------------------------------------------------------------

    def warmup(self, image: np.ndarray, instruction: str, runs: int = 2) -> None:
        """Local runs that fill the per-stage local time estimates (and one-time allocations),
        then ``prepare``: the scheduler starts primed with the times just measured."""
        state = self._zero_state()
        ids = self.policy.text_ids(instruction, state)
        graph = self.graph(len(ids))
        for _ in range(runs):
            pool = dict(self.policy.inputs(image, instruction, state, 0)[0].tensors)
            for st in graph.stages:
                self._local(st, pool, {})
        self.reset()  # the warm-up's hook state is not the episode's
        self.prepare(instruction)
        if self.cfg.strategy == "vlarun-joint":
            self.warm_settings(image, instruction)

    def warm_settings(self, image: np.ndarray, instruction: str) -> None:
        """Time every setting the scheduler may choose on the robot, once (its second step: a
        token policy's first step has nothing to reuse), so the scheduler plans each with what
        it really costs here rather than with what the model says it saves. Settings on the
        edge are planned with slack until their first run there (``Scheduler.decide``)."""
        text_tokens = len(self.policy.text_ids(instruction, self._zero_state()))

        sched = self.scheduler(text_tokens)
        state, kept = self._zero_state(), dict(self.local_s)  # the identity's estimates stay
        for plan_setting in sched.space.settings:
            setting = AccelSetting.from_knobs(plan_setting.as_dict(), self.cfg.setting.token_method)
            if setting.identity:
                continue
            graph = self.graph(text_tokens, setting)
            for _ in range(2):
                pool, times = dict(self.policy.inputs(image, instruction, state, 0)[0].tensors), {}
                for st in graph.stages:
                    times[st.name] = self._local(st, pool, {}, setting)
            self.reset()
            robot = planning.convert(times, self.factors(text_tokens)["robot"])
            sched.prime_setting(plan_setting.as_dict(), robot)
        self.local_s = kept

    def prepare(self, instruction: str) -> None:
        """Build, before any request, what the first request for ``instruction`` would
        otherwise build inside its deadline: the stage graph, the stand-in factors and, for
        the scheduler's strategies, the scheduler itself (primed with ``local_s`` and the
        edge's health as they are now). Built lazily, this one-time cost (tens of ms)
        would land in the first request's latency, which the scheduler would then learn as
        its placement's residual and spread."""
        n = len(self.policy.text_ids(instruction, self._zero_state()))
        self.graph(n)
        self.factors(n)
        if self.cfg.strategy in ("vlarun", "vlarun-joint"):
            self.scheduler(n)

    def _zero_state(self) -> np.ndarray | None:
        """A zero robot state for a policy that reads one (in its prompt, prefix or expert)."""
        size = self.policy.state_size
        return np.zeros(size, dtype=np.float32) if size else None

    def infer(
        self,
        image: np.ndarray,
        instruction: str,
        state=None,
        seed: int = 0,
        prior: Prior | None = None,
    ) -> Inference:
        """One request. ``prior``: what the chunk queue still holds; under ``cfg.rtc`` its
        actions are frozen into the new chunk (module docstring)."""
        t0, t0_wall = time.perf_counter(), time.monotonic()
        reading = self.meter.start() if self.meter is not None else None
        if instruction != self._instruction:  # a new task: hook state of the old one is stale
            self.reset()
            self._instruction = instruction
        self._refresh_link()
        link_mbps = self.link.bandwidth_mbps
        # The policy's own input packet (its resize and state normalisation) and prompt ids.
        packet, ids = self.policy.inputs(image, instruction, state, seed)
        pool = dict(packet.tensors)
        placement, decision, setting = self.plan(len(ids))
        rtc = self._freeze(prior, decision, placement)
        graph = self.graph(len(ids), setting, rtc is not None)
        refreeze = None
        if rtc is not None:
            pool.update(rtc_inputs(self.policy.model.cfg, rtc))

            def refreeze(stages: list[str]) -> None:  # the rest runs here: d from its time now
                left = time.perf_counter() - t0 + sum(self.local_s.get(n, 0.0) for n in stages)
                h, s = rtc.horizon, rtc.execution_horizon
                pool["rtc_delay"] = torch.tensor([frozen_steps(left, prior.period_s, h, s)])

        handoff = None
        if rtc is None and setting.identity and self.cfg.strategy in ("vlarun", "vlarun-joint"):

            def handoff(done: int):  # at a boundary of the request running here
                return self._handoff(len(ids), decision, done, t0, link_mbps)

        tr = self._execute(
            graph, placement, pool, len(ids), t0 + self.cfg.slo_s, setting, refreeze, handoff
        )
        latency = time.perf_counter() - t0
        measured = self.meter.stop(reading) if reading is not None else None
        inf = Inference(
            actions=self.policy.unnormalize(pool["actions"][0]),
            planned=placement,
            ran=tr.ran,
            latency_s=latency,
            slo_s=self.cfg.slo_s,
            fallback=tr.fallback,
            predicted_s=None if decision is None else decision.latency_s,
            energy_j=self._energy(len(ids), tr.ran, tr.stage_s, tr.edge_s, latency, tr.wasted_s),
            stage_ms={k: v * 1e3 for k, v in tr.stage_s.items()},
            remote_overhead_ms=tr.overheads_ms,
            bytes_sent=tr.sent,
            link_mbps=link_mbps,
            setting=str(setting),
            edge_batch=dict(tr.batch),
            measured_robot_j=measured,
            meter=None if self.meter is None else f"{self.meter.meter.name} ({self.meter.how})",
            explored=decision is not None and decision.explored,
            predicted_j=None if decision is None else decision.energy_j,
            late_edge=tr.late_edge,
            started_s=t0_wall,
            predicted_sigma_s=None if decision is None else decision.sigma_s,
            model_actions=pool["actions"][0].float().cpu().numpy(),
            rtc_delay=int(pool["rtc_delay"][0]) if rtc is not None else None,
            edge_at_s=tr.edge_at,
            handoff=tr.handoff,
            world=None if self._world_meter is None else self._world_meter[0],
        )
        if decision is not None:
            sched, factors = self.scheduler(len(ids)), self.factors(len(ids))
            # A handed-off request did not run its plan: its stages and transfers teach, its
            # latency and energy are not the plan's (as after a fallback).
            out = planning.outcome(inf, tr.stage_s, tr.batch, factors, tr.transfers)
            if tr.handoff is not None and out.fallback is None:
                out = dataclasses.replace(out, fallback=f"handoff: {tr.handoff}")
            sched.observe(decision, out)
        return inf

    def _freeze(self, prior: Prior | None, decision, placement: dict) -> RTCRequest | None:
        """The real-time chunk request for this plan (None: RTC off, or nothing queued), under
        any setting: a token decoder (Jacobi, early exit) takes the freeze's forced prefix as
        greedy decoding does (``accel.jacobi.jacobi_decode``). Its latency: the plan's
        prediction and spread; without a plan, the measured local stages when everything runs
        here, else the latency the queue leads by."""
        if not self.cfg.rtc or prior is None or prior.model is None or not len(prior.model):
            return None
        sigma = 0.0
        if decision is not None:
            latency, sigma = decision.latency_s, decision.sigma_s
        elif set(placement.values()) == {"robot"} and set(placement) <= set(self.local_s):
            latency = sum(self.local_s[n] for n in placement)
        elif prior.latency_s is not None:
            latency = prior.latency_s
        else:
            latency = self.cfg.slo_s  # nothing measured yet: the deadline bounds it
        h = self.policy.model.cfg.horizon
        return RTCRequest.build(prior.model, h, latency, prior.period_s, sigma)

    def _execute(
        self,
        graph,
        placement,
        pool: dict,
        text_tokens: int,
        deadline: float,
        setting: AccelSetting,
        refreeze=None,
        handoff=None,
    ) -> _Trace:
        """Run the plan's segments; after the first edge failure, everything left runs here
        (``refreeze(stages left)`` first, when the request carries a real-time freeze).
        ``handoff(stages done)``: asked before each robot stage after the first while the rest
        runs here; a ``sched.scheduler.Handoff`` it returns sends the rest to the edge
        (``_hand_off``), tried once per request."""
        tr = _Trace()
        segs = segments(graph, placement)
        stateful = setting.stateful_stages(self.policy.model.cfg.family)
        if self._last_setting not in (None, setting.key):  # switched: its old state is stale
            self._where.pop(setting.key, None)
        self._last_setting = setting.key
        where = self._where.setdefault(setting.key, {})
        hooks = self._under(setting).hooks
        for i, seg in enumerate(segs):
            remote = seg.role == "edge" and tr.fallback is None
            if remote:
                extra = {}  # the plain path needs no setting, stream or resets
                if not setting.identity:
                    fresh = [stateful[n] for n in seg.stages
                             if n in stateful and where.get(n) != "edge"]  # fmt: skip
                    extra = {"setting": setting.to_meta(), "stream": self.stream, "fresh": fresh}
                if self._try_remote(
                    graph, placement, segs, i, pool, text_tokens, deadline, tr, extra
                ):
                    continue
            if refreeze is not None and tr.fallback is not None:
                refreeze([n for later in segs[i:] for n in later.stages])
                refreeze = None
            for name in seg.stages:
                if handoff is not None and tr.ran and self._rest_here(segs, i, tr):
                    h = handoff(len(tr.ran))  # at every boundary, until one is tried
                    if h is not None:
                        handoff = None
                        if self._hand_off(graph, h, pool, text_tokens, deadline, tr):
                            break
                if name in stateful and where.get(name) != "robot":
                    hooks.reset(stateful[name])  # its state here is stale (or none yet)
                tr.stage_s[name] = self._local(graph.stage(name), pool, tr.ran, setting)
            if tr.handoff is not None:
                break
        for name in stateful:
            if name in tr.ran:
                where[name] = tr.ran[name]
        return tr

    @staticmethod
    def _rest_here(segs, i: int, tr: _Trace) -> bool:
        """Whether everything from segment ``i`` on runs here: the plan's own robot segments
        to the end, or a fallback."""
        if any(role != "robot" for role in tr.ran.values()):
            return False  # the edge already took part: not a request running here
        return tr.fallback is not None or all(s.role == "robot" for s in segs[i:])

    def _handoff(self, text_tokens: int, decision, done: int, t0: float, link_mbps):
        """The scheduler's handoff for a request running here with ``done`` stages run, or
        None. Asked only once the link looks back since the request was planned (the edge
        was down then, the request fell back, or the bandwidth estimate has since doubled):
        a request the plan keeps here on a steady link is not re-planned at every stage."""
        if self.monitor is None or not self.edge_up:
            return None
        self._refresh_link()
        steady = link_mbps is not None and self.link.bandwidth_mbps < 2.0 * link_mbps
        if decision is not None and steady:
            return None

        sched = self.scheduler(text_tokens)
        schedule, age = self._edge_schedule(self.monitor.health)
        state = planning.edge_state(self.monitor.health, schedule, age)
        return sched.handoff(
            None if decision is None else decision.settings, done,
            time.perf_counter() - t0, self.link, state,
        )  # fmt: skip

    def _hand_off(self, graph, h, pool, text_tokens: int, deadline: float, tr: _Trace) -> bool:
        """Send the rest of a request running here to the edge (``h``: from ``h.start`` on,
        as an edge request like any other, waited for until the deadline); False, with every
        stage run here kept, if the edge does not answer in time."""
        segs = segments(graph, h.placement)
        i = next(k for k, s in enumerate(segs) if s.role == "edge")
        order = list(tr.ran)
        redo = {n: tr.stage_s.pop(n) for n in segs[i].stages if tr.ran.get(n) == "robot"}
        for n in redo:
            del tr.ran[n]
        fallback, tr.fallback = tr.fallback, None
        if self._try_remote(graph, h.placement, segs, i, pool, text_tokens, deadline, tr, {}):
            tr.fallback = fallback
            tr.wasted_s.update(redo)
            tr.handoff = (
                f"{'+'.join(segs[i].stages)} to the edge at "
                f"{1e3 * (h.local_finish_s - h.finish_s):.0f} ms predicted gain"
            )
            return True
        tr.stage_s.update(redo)
        tr.ran = {n: "robot" for n in order}
        return False

    def _try_remote(
        self, graph, placement, segs, i, pool, text_tokens, deadline, tr, extra
    ) -> bool:
        """One edge segment into ``pool``; False (with the reason in ``tr``) to run it here.
        ``extra``: the setting's part of the request meta (setting, stream, fresh)."""
        if not self.edge_up:
            tr.fallback = "link: edge down"
            return False
        try:
            rep = self._remote(
                graph, placement, segs[i], pool, text_tokens, deadline, segs[i:], extra
            )
        except LinkDown as e:
            tr.fallback = f"link: {e}"
            self.monitor.mark_down()
            self._bound_bandwidth(e)
            # Abandon the transfer: a fresh socket drops the request's bytes still queued for
            # the link, which would otherwise delay every later request (and a restored link's
            # first) behind megabytes nobody waits for. Its late reply could not be used anyway.
            self.client.reset()
            return False
        except RuntimeError as e:  # the edge refused, ran out of time, or answered nonsense
            tr.fallback = f"edge: {e}"
            return False
        pool.update(rep.packet.tensors)  # checked in _remote: names, shapes, finite values
        tr.late_edge = tr.late_edge or rep.late
        if not rep.late and tr.edge_at is None:
            tr.edge_at = time.monotonic() - rep.wall_s
        for t in rep.timings:
            tr.ran[t.stage] = "edge"
            # Energy: this request's share of the batch; calibration: the execution itself.
            tr.edge_s[t.stage] = t.share_s
            tr.stage_s[t.stage] = t.compute_s
            tr.batch[t.stage] = t.batch
        tr.overheads_ms.append((rep.wall_s - rep.server_s) * 1e3)
        seg = segs[i].stages
        tr.transfers.append(TransferOutcome(seg[0], seg[-1], max(rep.wall_s - rep.server_s, 0.0),
                                            rep.sent_bytes, rep.recv_bytes))  # fmt: skip
        tr.sent += rep.sent_bytes
        self._observe_transfer(rep)
        return True

    def _local(self, stage, pool: dict, ran: dict, setting: AccelSetting | None = None) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            out = stage(Packet({s.name: pool[s.name] for s in stage.inputs}))
        settle(out.tensors)
        own = time.perf_counter() - start
        if self.cfg.robot_slowdown > 1:  # stand in for a slower robot computer
            time.sleep(own * (self.cfg.robot_slowdown - 1))
        if self.emulator is not None:  # stand in for a named device running the real model
            knobs = None if setting is None or setting.identity else setting.knobs()
            self.emulator.pad(stage.name, start, knobs=knobs)
        seconds = time.perf_counter() - start
        old = self.local_s.get(stage.name)
        self.local_s[stage.name] = seconds if old is None else 0.7 * old + 0.3 * seconds
        pool.update(out.tensors)
        ran[stage.name] = "robot"
        return seconds

    def _remote(self, graph, placement, seg, pool, text_tokens, deadline, rest, extra):
        """One edge segment, waited for no longer than the robot stages after it allow.

        The robot waits until ``deadline`` less the local time of the robot segments that
        follow and the time it takes to read and check an answer (its recent slow peak, at
        least ``margin_s``); the edge gets that wait less the packet's way there and the
        answer's way back as its own deadline, so an answer it sends arrives in time to finish
        the request by the deadline, and work it could only finish later is refused there
        (``RuntimeError``) instead of being done for nothing. A silent edge costs at most the
        deadline plus one local run of this segment. An answer that reached the socket too
        late for the robot stages after it to end by the deadline is recorded as late
        (``Inference.late_edge``), never as an edge answer in time; one in time that the
        robot's own reading or later stages make late is the robot's lateness."""
        left = deadline - time.perf_counter()
        later = sum(self.local_s.get(n, 0.0)
                    for s in rest[1:] if s.role == "robot" for n in s.stages)  # fmt: skip
        wait = left - later - max(self.cfg.margin_s, self._answer_s)
        if wait <= 0:
            raise RuntimeError("no time left for the edge")
        want = wanted(graph, placement, seg)
        packet = Packet({n: pool[n] for n in seg.needs})
        emu = self.emulator  # an emulated robot sends the real model's packet size
        pad = 0 if emu is None else emu.pad_bytes(seg.stages, "in", packet.nbytes)
        up = self.link.transfer_s(packet.nbytes + pad)
        down = self.link.transfer_s(self._reply_bytes.get(seg.stages, 0))
        budget = wait - up - down
        if budget <= 0:
            raise RuntimeError("the link leaves the edge no time")
        meta = {"batch": 1, "text_tokens": text_tokens, **extra}
        if any(n in RTC_INPUTS for n in seg.needs):  # the head runs there: it freezes there
            meta["rtc"] = True
        self.monitor.last_remote = time.monotonic()
        rep = self.client.run(seg.stages, packet, want, budget, wait, meta, self.cfg.codec, pad)
        # Nothing from the edge reaches the pool (and the robot) unchecked: a wrong name,
        # shape or a NaN is a fallback here, never an action. Accelerated streams may change
        # intermediate sizes, so their shapes are checked by rank and batch only.
        specs = {s.name: s for st in graph.stages for s in st.outputs if s.name in want}
        exact = not extra or want == tuple(s.name for s in graph.stages[-1].outputs)
        check_packet(rep.packet, specs, exact)
        self._schedule = (time.monotonic(), rep.schedule)
        self._reply_bytes[seg.stages] = rep.recv_bytes
        read = time.perf_counter() - rep.arrived_s
        self._answer_s = max(read, 0.9 * self._answer_s)
        rep.late = rep.arrived_s + later > deadline
        return rep

    # -- measurements -----------------------------------------------------------------------------

    def _refresh_link(self) -> None:
        self.link.refresh()  # a timeout's bound expires with time, with or without new samples
        if self.monitor is not None:
            self.monitor.feed(self.link)
        # No socket reset when the edge returns: the DEALER reconnects by itself, IMMEDIATE
        # kept nothing queued for the dead link, and late replies are dropped by request id.

    def _bound_bandwidth(self, e: LinkDown) -> None:
        """A request that timed out moved its bytes slower than bytes / wait: cap the estimate
        there at once (for ``Link.cap_s`` seconds, or until a faster sample). Without this a
        congested link teaches nothing (no reply, no sample), and every request keeps trying
        it, queueing yet more bytes behind the last."""
        self.link.bound(e.sent_bytes, e.waited_s)

    def _observe_transfer(self, rep) -> None:
        """Both directions lumped: bytes moved over the time not spent computing on the edge."""
        self.link.observe_transfer(
            rep.sent_bytes + rep.recv_bytes, max(rep.wall_s - rep.server_s, 1e-6)
        )

    def _energy(self, text_tokens, ran, stage_s, edge_times, latency, wasted=None) -> float:
        """The modelled energy of what ran, each stage at the roofline utilisation the
        scheduler prices it at on the device it ran on (the one account, every strategy).
        Emulated under a world other than the catalog, the world is the meter: the same
        account with the world's powers (busy while a stage runs) on the emulated times, so
        a power the scheduler has wrong is not priced its way."""

        if self._world_meter is not None:
            _, devices, radio = self._world_meter
            ones = {"robot": {}, "edge": {}}
            return planning.modelled_energy(self.cfg, ran, stage_s, edge_times, latency, ones,
                                   radio=radio, wasted=wasted, devices=devices)  # fmt: skip

        factors = self.factors(text_tokens)
        if text_tokens not in self._utilisation:
            self._utilisation[text_tokens] = planning.roofline_utilisation(
                self.policy.model.cfg, self.cfg, text_tokens, self.dtype
            )
        return planning.modelled_energy(self.cfg, ran, stage_s, edge_times, latency, factors,
                               utilisation=self._utilisation[text_tokens],
                               wasted=wasted)  # fmt: skip
